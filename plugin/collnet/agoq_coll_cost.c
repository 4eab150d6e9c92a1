/* What a CollNet chunk costs on the schedule (agoq_coll_cost.h). */
#include "collnet/agoq_coll_cost.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_internal.h"

/* Per step, per rank: pieces out and in, messages out and in. */
typedef struct {
  double *tx, *rx, *m;
} agoq_cost_step;

static void agoq_cost_add(void* arg, const agoq_coll_msg* m) {
  agoq_cost_step* st = arg;
  double pieces = 0;
  for (int i = 0; i < m->nspans; i++) pieces += m->spans[i].rows;
  st->tx[m->from] += pieces;
  st->rx[m->to] += pieces;
  st->m[m->from] += 1;
  st->m[m->to] += 1;
}

static double agoq_cost_max(double a, double b) { return a > b ? a : b; }

int agoq_coll_profile_make(const agoq_coll_grid* g, agoq_coll_profile* p) {
  if (g->a * g->b != g->n) return agoq_coll_profile_count(g, p);
  /* An exact grid is the same at every rank: a-1 row peers, each sent (and sending) one
   * column slice of b pieces in each row step; b-1 column peers, one piece each. O(1), so the
   * automatic choice can weigh every shape of n (test_coll_cost holds it to the count). */
  memset(p, 0, sizeof *p);
  double a = g->a, b = g->b;
  p->tx[AGOQ_COLL_ROW_RS] = p->tx[AGOQ_COLL_ROW_AG] = (a - 1) / a;
  p->tx[AGOQ_COLL_COL_RS] = p->tx[AGOQ_COLL_COL_AG] = (b - 1) / (a * b);
  p->msgs[AGOQ_COLL_ROW_RS] = p->msgs[AGOQ_COLL_ROW_AG] = 2 * (a - 1);
  p->msgs[AGOQ_COLL_COL_RS] = p->msgs[AGOQ_COLL_COL_AG] = 2 * (b - 1);
  for (int s = 0; s < AGOQ_COLL_STEPS; s++) p->rx[s] = p->tx[s];
  return 0;
}

int agoq_coll_profile_count(const agoq_coll_grid* g, agoq_coll_profile* p) {
  memset(p, 0, sizeof *p);
  size_t un = (size_t)g->n;
  double* all = calloc(3 * un, sizeof *all);
  agoq_coll_span* spans = calloc((size_t)g->a, sizeof *spans);
  if (all == NULL || spans == NULL) {
    free(all);
    free(spans);
    return -1;
  }
  double pieces = (double)agoq_coll_grid_pieces(g);
  for (int s = 0; s < AGOQ_COLL_STEPS; s++) {
    memset(all, 0, 3 * un * sizeof *all);
    agoq_cost_step st = {.tx = all, .rx = all + un, .m = all + 2 * un};
    for (int r = 0; r < g->n; r++) agoq_coll_schedule_sends(g, r, (agoq_coll_step)s, spans, agoq_cost_add, &st);
    for (size_t r = 0; r < un; r++) {
      p->tx[s] = agoq_cost_max(p->tx[s], st.tx[r] / pieces);
      p->rx[s] = agoq_cost_max(p->rx[s], st.rx[r] / pieces);
      p->msgs[s] = agoq_cost_max(p->msgs[s], st.m[r]);
    }
  }
  free(all);
  free(spans);
  return 0;
}

double agoq_coll_cost_partial_ratio(int dtype, int op, bool quantized, bool frame_partials, double wire_ratio) {
  if (quantized && frame_partials) return wire_ratio;
  return (double)agoq_coll_partial_size(dtype, op) / (double)agoq_coll_type_size(dtype);
}

double agoq_coll_cost_io_share(int peers, int k) {
  if (k < 1 || peers < 1) return 1.0;
  int busiest = (peers + k - 1) / k;
  return (double)busiest / (double)peers;
}

void agoq_coll_cost_eval(const agoq_coll_profile* p, const agoq_coll_cost_in* in, agoq_coll_cost* out) {
  memset(out, 0, sizeof *out);
  double B = in->link_Bps, o = in->o_s;
  /* The messages' CPU time on the busiest thread that does them. */
  double share = agoq_coll_cost_io_share(in->peers, in->io_threads);
  out->codec_s = in->codec_Bps > 0 ? 2.0 * in->chunk_bytes / in->codec_Bps : 0.0;
  unsigned steps = in->steps != 0 ? in->steps : (1u << AGOQ_COLL_STEPS) - 1;
  out->levels = 0;
  for (int s = 0; s < AGOQ_COLL_STEPS; s++) {
    if (p->msgs[s] == 0 || !(steps & (1u << s))) continue;
    out->levels++;
    /* What travels: contributions and final pieces as frames (or the type itself), the
     * column reduce-scatter's partial sums as AGOQ_COLLNET_PARTIALS says. */
    double ratio = s == AGOQ_COLL_COL_RS ? in->partial_ratio : in->wire_ratio;
    double tx = p->tx[s] * in->chunk_bytes * ratio, rx = p->rx[s] * in->chunk_bytes * ratio;
    /* A step at its slowest rank: the latency, then its first send's CPU time, its bytes
     * through the busier NIC side and its last receive's CPU time; or all its messages'
     * CPU time, where that is longer. The next step waits for it (its sums need them). */
    out->first_s += in->alpha_s + agoq_cost_max(2.0 * o + agoq_cost_max(tx, rx) / B, o * p->msgs[s] * share);
    out->tx_bytes += tx;
    out->rx_bytes += rx;
    out->msgs += p->msgs[s];
  }
  out->first_s += out->codec_s;
  /* In the steady state each resource serves every step of some chunk at once: the NIC's
   * two sides, and the CPU (its messages, and the codec where it runs there). */
  double msgs_s = o * out->msgs * share, codec_cpu = in->codec_on_cpu ? out->codec_s : 0.0;
  /* On the engine alone the two share its CPU; I/O threads take the messages off it. */
  double cpu = in->io_threads > 0 ? agoq_cost_max(msgs_s, codec_cpu) : msgs_s + codec_cpu;
  out->chunk_s = agoq_cost_max(agoq_cost_max(agoq_cost_max(out->tx_bytes, out->rx_bytes) / B, cpu), out->codec_s);
}

/* Whole chunks or calls in x, rounded up (x > 0; no libm in the plugin). */
static double agoq_cost_ceil(double x) {
  double i = (double)(long long)x;
  return i < x ? i + 1 : i;
}

double agoq_coll_cost_seconds(const agoq_coll_cost* c, double chunk_bytes, double bytes, double call_bytes, int calls,
                              int slots) {
  if (bytes <= 0) return 0.0;
  if (call_bytes <= 0 || call_bytes > bytes) call_bytes = bytes;
  double per_call = agoq_cost_ceil(call_bytes / chunk_bytes);
  double ncalls = agoq_cost_ceil(bytes / call_bytes);
  double chunks = ncalls * per_call;
  if (calls < 1) calls = 1;
  /* Chunks that overlap: the pipeline's slots, or what the calls outstanding hold. */
  double overlap = (double)calls * per_call < slots ? (double)calls * per_call : (double)slots;
  if (overlap < 1) overlap = 1;
  double period = agoq_cost_max(c->chunk_s, c->first_s / overlap);
  if (calls == 1) /* each call drains the pipeline before the next is posted */
    return ncalls * (c->first_s + (per_call - 1) * period);
  return c->first_s + (chunks - 1) * period;
}

/* ---- the automatic schedule ------------------------------------------------------------ */

static int agoq_cost_plan(agoq_coll_plan* pl, const agoq_coll_grid* g, double chunk_bytes, char* why, size_t why_len) {
  pl->grid = *g;
  pl->chunk_bytes = chunk_bytes > 0 ? chunk_bytes : (double)agoq_coll_chunk_auto(g);
  if (agoq_coll_profile_make(g, &pl->prof) != 0) {
    snprintf(why, why_len, "out of memory costing a schedule of %d ranks", g->n);
    return AGOQ_COLL_PLANS_NO_MEMORY;
  }
  return 0;
}

int agoq_coll_plans_make(int n, int a, int b, double chunk_bytes, agoq_coll_plans* p, char* why, size_t why_len) {
  memset(p, 0, sizeof *p);
  agoq_coll_grid g;
  if (agoq_coll_grid_make(n, a, b, &g, why, why_len) != 0) return AGOQ_COLL_PLANS_BAD_GRID;
  /* A named grid, or the mesh's own range: one candidate. */
  if (a != 0 || b != 0 || n <= AGOQ_COLL_GRID_DIRECT_MAX) {
    p->count = 1;
    return agoq_cost_plan(&p->plan[0], &g, chunk_bytes, why, why_len);
  }
  agoq_coll_grid c[AGOQ_COLL_PLANS_MAX];
  int k = 0;
  if (n <= AGOQ_COLL_MESH_AUTO_MAX && agoq_coll_grid_make(n, n, 1, &c[k], why, why_len) == 0) k++;
  p->rule = k;
  c[k++] = g;
  /* Exact grids, squarest first; rows no shorter than columns are tall. */
  for (int rows = 2; (long long)rows * rows <= n && k < AGOQ_COLL_PLANS_MAX; rows++) {
    int cols = n / rows;
    if (cols * rows != n || cols + rows - 2 > AGOQ_COLL_MESH_AUTO_MAX - 1 || (cols == g.a && rows == g.b) ||
        agoq_coll_grid_make(n, cols, rows, &c[k], why, why_len) != 0)
      continue;
    k++;
  }
  for (int i = 0; i < k; i++)
    if (agoq_cost_plan(&p->plan[i], &c[i], chunk_bytes, why, why_len) != 0) return AGOQ_COLL_PLANS_NO_MEMORY;
  p->count = k;
  return 0;
}

double agoq_coll_plan_seconds(const agoq_coll_plan* pl, const agoq_coll_pick_in* in) {
  const double bytes = AGOQ_COLL_COST_CALLS * AGOQ_COLL_PICK_CALL_BYTES, esz = 2.0; /* bf16 */
  double chunk = agoq_coll_cost_chunk(pl->chunk_bytes, AGOQ_COLL_PICK_CALL_BYTES, bytes);
  bool quant = in->format != AGOQ_FORMAT_NONE;
  double ratio = 1.0;
  if (quant) {
    agoq_codec_params cp = {.format = in->format, .dtype = AGOQ_DTYPE_BF16, .block = in->block};
    ratio = agoq_frame_wire_ratio(&cp, (size_t)(chunk / esz / agoq_coll_grid_pieces(&pl->grid)));
  }
  agoq_coll_cost_in ci = {
      .chunk_bytes = chunk,
      .wire_ratio = ratio,
      .partial_ratio = agoq_coll_cost_partial_ratio(ncclBfloat16, ncclSum, quant, in->frame_partials, ratio),
      .link_Bps = in->link_Bps,
      .alpha_s = AGOQ_COLL_COST_ALPHA_S,
      .o_s = AGOQ_COLL_COST_O_S,
      .io_threads = in->io_threads,
      .peers = agoq_coll_cost_peers(&pl->grid),
  };
  agoq_coll_cost c;
  agoq_coll_cost_eval(&pl->prof, &ci, &c);
  return agoq_coll_cost_seconds(&c, chunk, bytes, AGOQ_COLL_PICK_CALL_BYTES, AGOQ_COLL_COST_CALLS, AGOQ_COLL_SLOTS);
}

int agoq_coll_plans_pick(const agoq_coll_plans* p, const agoq_coll_pick_in* in, double* secs) {
  for (int i = 0; secs != NULL && i < p->count; i++) secs[i] = -1.0;
  if (p->count < 2 || !(in->link_Bps > 0)) return p->rule;
  int best = -1;
  double best_s = 0;
  for (int i = 0; i < p->count; i++) {
    double t = agoq_coll_plan_seconds(&p->plan[i], in);
    if (secs != NULL) secs[i] = t;
    /* Fewer peers on a tie: fewer connections for the same time. */
    if (best < 0 || t < best_s ||
        (t == best_s && agoq_coll_cost_peers(&p->plan[i].grid) < agoq_coll_cost_peers(&p->plan[best].grid))) {
      best = i;
      best_s = t;
    }
  }
  return best;
}
