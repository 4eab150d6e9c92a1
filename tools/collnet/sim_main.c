/*
 * agoq-collnet-sim: the plugin's CollNet setup and engine, unchanged, for N ranks in one
 * process over an in-process transport with a virtual clock (sim_transport.h): the real
 * schedule (the mesh, or a grid: AGOQ_COLLNET_GRID) and the real codec, no sockets.
 *
 * Per run: setup of N groups (one thread per rank, wall time reported), then for every
 * --gbps value the same all-reduce (every rank's engine stepped from this thread through
 * test(), as NCCL's proxy does with AGOQ_COLLNET_ASSIST; the engines' own threads held), the
 * clock moved to the next event whenever no rank can move. Printed per rate: the virtual
 * time, the bus bandwidth (2(n-1)/n x bytes / time, as nccl-tests) and its fraction of the
 * compressed floor (the NIC's rate over the bytes the format puts on the wire per input
 * byte, agoq_frame_wire_ratio), messages and bytes sent per rank per chunk, and connection
 * ends per rank; then whether every rank holds the same bits and the error against the fp64
 * sum (exact types: equal to the exact reduction).
 */
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agoq_args.h"
#include "agoq_frame.h"
#include "collnet/agoq_coll_cost.h"
#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_io.h"
#include "core/agoq_params.h"
#include "perf_dtype.h"
#include "sim_transport.h"

typedef struct {
  int n;
  const char* grid;
  ncclDataType_t dtype;
  const char* format;
  size_t bytes, call, chunk;
  int inflight;
  int link_gbps; /* 0: the NICs report no rate */
  int io_threads; /* AGOQ_COLLNET_IO_THREADS: each simulated thread has a CPU of its own */
  double alpha, o;
  double gbps[8];
  int ngbps;
  bool check; /* exit 1 unless the messages sent are the schedule's, every rank's bits equal */
  double model_tol; /* with check: and the cost model within this fraction of the time (< 0: not asked) */
  bool inplace;     /* NCCL's in-place all-reduce (PyTorch's): the result in the send buffer */
  int escape;       /* > 0: in 1 of this many blocks of each rank's input an Inf (blocks escape raw) */
  double spill_min; /* with check: at least this many messages spilled (< 0: not asked) */
  double staging_max; /* with check: every rank's slot staging at most this many bytes (< 0: not asked) */
  double timeline_us; /* > 0: print how busy the NICs and message CPUs were, per bin of this many us */
  int row_lead;       /* > 0: the groups' row lead instead of AGOQ_COLL_ROW_LEAD; 0: none */
} sim_opts;

static void sim_count_msg(void* arg, const agoq_coll_msg* m) {
  (void)m;
  (*(uint64_t*)arg)++;
}

/* Messages every rank together sends per chunk by the schedule (every piece non-empty). */
static uint64_t sim_schedule_msgs(const agoq_coll_grid* g) {
  uint64_t total = 0;
  agoq_coll_span* spans = calloc((size_t)g->a, sizeof *spans);
  if (spans == NULL) return 0;
  for (int r = 0; r < g->n; r++)
    for (int st = 0; st < AGOQ_COLL_STEPS; st++)
      agoq_coll_schedule_sends(g, r, (agoq_coll_step)st, spans, sim_count_msg, &total);
  free(spans);
  return total;
}

static void sim_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                       ...) {
  (void)flags;
  if (level != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "WARN %s:%d ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* Rank r's input: the usual values, and with --escape K an Inf at the start of 1 block in K
 * (rank r's blocks r mod K, r + K, ...), so frames outgrow their nominal size and spill. */
static void sim_fill(const sim_opts* o, uint8_t* buf, int r, uint32_t block) {
  size_t count = o->bytes / perf_dtype_size(o->dtype);
  perf_input_fill(o->dtype, buf, count, perf_rank_seed(7, r), o->n, 0);
  if (o->escape <= 0 || block == 0) return;
  for (size_t b = (size_t)(r % o->escape); b * block < count; b += (size_t)o->escape)
    perf_elem_set(o->dtype, buf, b * block, INFINITY);
}

static double sim_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
  int rank, n;
  void** handles;
  void* listen;
  void* comm;
  ncclResult_t res;
} sim_setup_arg;

static void* sim_setup_main(void* p) {
  sim_setup_arg* a = p;
  agoq_sim_rank = a->rank;
  a->res = agoq_coll_connect(a->handles, a->n, a->rank, a->listen, &a->comm);
  return NULL;
}

typedef struct {
  void* comm;
  uint8_t *send, *recv;
  void *smh, *rmh;
  void* req[32];
  size_t req_off[32];
  int head, count; /* outstanding calls, oldest first */
  size_t next_off;   /* next call's offset */
  size_t done_bytes;
} sim_rank;

/* Posts rank r's calls while fewer than inflight are outstanding. */
static int sim_post(const sim_opts* o, sim_rank* k, int r) {
  size_t esz = perf_dtype_size(o->dtype);
  while (k->count < o->inflight && k->next_off < o->bytes) {
    size_t len = o->bytes - k->next_off < o->call ? o->bytes - k->next_off : o->call;
    void* req = NULL;
    agoq_sim_rank = r;
    ncclResult_t res = agoq_coll_iallreduce(k->comm, k->send + k->next_off, k->recv + k->next_off, len / esz,
                                            (int)o->dtype, ncclSum, k->smh, k->rmh, &req);
    if (res != ncclSuccess) {
      fprintf(stderr, "rank %d: iallreduce failed (%d)\n", r, (int)res);
      return -1;
    }
    if (req == NULL) break; /* busy: again later */
    int slot = (k->head + k->count) % 32;
    k->req[slot] = req;
    k->req_off[slot] = len;
    k->count++;
    k->next_off += len;
  }
  return 0;
}

/* Steps rank r: posts its calls, tests them (test() runs a pass of its pipeline: assist).
 * *moved when a call completed; *finished when all of its calls have. */
static int sim_step(const sim_opts* o, sim_rank* k, int r, bool* moved, bool* finished) {
  if (sim_post(o, k, r) != 0) return -1;
  agoq_sim_rank = r;
  while (k->count > 0) {
    int done = 0, size = 0;
    ncclResult_t res = agoq_coll_test(k->req[k->head], &done, &size);
    if (res != ncclSuccess) {
      fprintf(stderr, "rank %d: test failed (%d)\n", r, (int)res);
      return -1;
    }
    if (!done) break;
    k->done_bytes += k->req_off[k->head];
    k->head = (k->head + 1) % 32;
    k->count--;
    *moved = true;
    if (sim_post(o, k, r) != 0) return -1;
  }
  *finished = k->done_bytes >= o->bytes;
  return 0;
}

/* One run at one rate: every rank's calls to completion; *vtime the virtual time. Only the
 * ranks an event concerns are stepped at its time, again while stepping them changes
 * anything (a pass's sends arrive later: only the rank itself can move further now). */
static int sim_run(const sim_opts* o, sim_rank* ranks, double* vtime) {
  int n = o->n, ndue = n, left = n;
  int* due = malloc((size_t)n * sizeof *due);
  unsigned char* finished = calloc((size_t)n, 1);
  if (due == NULL || finished == NULL) return -1;
  for (int r = 0; r < n; r++) {
    ranks[r].next_off = ranks[r].done_bytes = 0;
    ranks[r].head = ranks[r].count = 0;
    due[r] = r;
  }
  int rc = 0;
  while (left > 0) {
    for (;;) {
      uint64_t ev0 = agoq_sim_events();
      bool moved = false;
      for (int i = 0; i < ndue; i++) {
        bool fin = false;
        if (sim_step(o, &ranks[due[i]], due[i], &moved, &fin) != 0) {
          rc = -1;
          goto out;
        }
        if (fin && !finished[due[i]]) {
          finished[due[i]] = 1;
          left--;
        }
      }
      if (!moved && agoq_sim_events() == ev0) break;
    }
    if (left == 0) break;
    ndue = agoq_sim_advance(due);
    if (ndue < 0) {
      fprintf(stderr, "deadlock: nothing pending at virtual time %.9f s with %d ranks' calls outstanding\n",
              agoq_sim_now(), left);
      rc = -1;
      goto out;
    }
  }
  *vtime = agoq_sim_now();
out:
  free(due);
  free(finished);
  return rc;
}

static void sim_usage(const char* prog) {
  fprintf(stderr,
          "usage: %s [-N ranks] [--grid auto|AxB] [-d bf16|fp32|fp16|int32] [--format int8|int4|fp8e4m3|fp8e5m2|none]\n"
          "          [-b bytes per rank] [--call bytes per CollNet call (NCCL's: 2M)] [--chunk AGOQ_COLLNET_CHUNK (auto)]\n"
          "          [--inflight calls] [--gbps r1,r2,...] [--alpha-us a] [--o-us o] [--inplace] [--check]\n"
          "          [--model-tol fraction] [--staging-max bytes] [--escape K] [--spill-min messages]\n"
          "          [--link-gbps rate the NICs report (the automatic schedule weighs it; default: not known)]\n"
          "          [--io-threads K (AGOQ_COLLNET_IO_THREADS: K threads per rank do the messages, each on a CPU "
          "of its own in the clock model; default 0, the engine)]\n"
          "          [--timeline us (after each rate: every rank's NIC sides and message CPUs busy, per bin of "
          "virtual time)]\n"
          "          [--row-lead K (a grid's row sends wait for the chunk K before: AGOQ_COLL_ROW_LEAD; 0: never)]\n",
          prog);
  exit(2);
}

int main(int argc, char** argv) {
  const char* prog = argv[0];
  sim_opts o = {.n = 64, .grid = "auto", .dtype = ncclBfloat16, .format = "int8", .bytes = 4u << 20,
                .call = 2u << 20, .chunk = 0, .inflight = 8, .alpha = AGOQ_COLL_COST_ALPHA_S,
                .o = AGOQ_COLL_COST_O_S, .gbps = {25, 100, 400}, .ngbps = 3, .model_tol = -1,
                .staging_max = -1, .spill_min = -1, .row_lead = -1};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "--check") || !strcmp(a, "--inplace")) { /* the options without a value */
      if (a[2] == 'c') o.check = true;
      else o.inplace = true;
      continue;
    }
    if (i + 1 >= argc) sim_usage(prog);
    const char* v = argv[++i];
    if (!strcmp(a, "-N")) o.n = agoq_args_int_or_exit(prog, a, v, 1, AGOQ_COLL_MAX_RANKS);
    else if (!strcmp(a, "--grid")) o.grid = v;
    else if (!strcmp(a, "-d")) {
      if (perf_dtype_parse(v, &o.dtype) != 0) sim_usage(prog);
    } else if (!strcmp(a, "--format")) o.format = v;
    else if (!strcmp(a, "-b")) o.bytes = (size_t)agoq_args_ll_or_exit(prog, a, v, 4096, 1ll << 32);
    else if (!strcmp(a, "--call")) o.call = (size_t)agoq_args_ll_or_exit(prog, a, v, 4096, 1ll << 30);
    else if (!strcmp(a, "--chunk")) o.chunk = (size_t)agoq_args_ll_or_exit(prog, a, v, 4096, 268435456);
    else if (!strcmp(a, "--link-gbps")) o.link_gbps = agoq_args_int_or_exit(prog, a, v, 1, 100000);
    else if (!strcmp(a, "--io-threads")) o.io_threads = agoq_args_int_or_exit(prog, a, v, 0, AGOQ_COLL_IO_MAX);
    else if (!strcmp(a, "--inflight")) o.inflight = agoq_args_int_or_exit(prog, a, v, 1, 32);
    else if (!strcmp(a, "--model-tol")) {
      if (agoq_args_parse_double(v, 0, 10, &o.model_tol) != 0) sim_usage(prog);
    } else if (!strcmp(a, "--staging-max")) {
      if (agoq_args_parse_double(v, 0, 1e15, &o.staging_max) != 0) sim_usage(prog);
    } else if (!strcmp(a, "--row-lead")) {
      o.row_lead = agoq_args_int_or_exit(prog, a, v, 0, AGOQ_COLL_SLOTS);
    } else if (!strcmp(a, "--timeline")) {
      if (agoq_args_parse_double(v, 0.1, 1e6, &o.timeline_us) != 0) sim_usage(prog);
    } else if (!strcmp(a, "--spill-min")) {
      if (agoq_args_parse_double(v, 0, 1e15, &o.spill_min) != 0) sim_usage(prog);
    } else if (!strcmp(a, "--escape")) o.escape = agoq_args_int_or_exit(prog, a, v, 1, 1 << 20); else if (!strcmp(a, "--alpha-us")) o.alpha = agoq_args_ll_or_exit(prog, a, v, 0, 1000000) * 1e-6;
    else if (!strcmp(a, "--o-us")) {
      double us;
      if (agoq_args_parse_double(v, 0, 1e6, &us) != 0) sim_usage(prog);
      o.o = us * 1e-6;
    } else if (!strcmp(a, "--gbps")) {
      o.ngbps = 0;
      char buf[128];
      snprintf(buf, sizeof buf, "%s", v);
      for (char* t = strtok(buf, ","); t != NULL && o.ngbps < 8; t = strtok(NULL, ","))
        o.gbps[o.ngbps++] = (double)agoq_args_int_or_exit(prog, a, t, 1, 100000);
    } else sim_usage(prog);
  }
  size_t esz = perf_dtype_size(o.dtype);
  if (o.bytes % esz != 0 || o.call % esz != 0) sim_usage(prog);
  char chunk[32];
  if (o.chunk > 0) snprintf(chunk, sizeof chunk, "%zu", o.chunk);
  else snprintf(chunk, sizeof chunk, "auto");
  setenv("AGOQ_COLLNET_GRID", o.grid, 1);
  setenv("AGOQ_FORMAT", o.format, 1);
  setenv("AGOQ_COLLNET_CHUNK", chunk, 1);
  setenv("AGOQ_COLLNET_ASSIST", "1", 1);
  setenv("AGOQ_COLLNET_CODEC_THREADS", "1", 1);
  char io[16];
  snprintf(io, sizeof io, "%d", o.io_threads);
  setenv("AGOQ_COLLNET_IO_THREADS", io, 1);
  setenv("AGOQ_MIN_BYTES", "0", 1);
  setenv("AGOQ_GPU", "off", 1);
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* Thousands of threads (setup, held engines) would each get a malloc arena: one arena keeps
   * 512 ranks in 5.2 GB instead of 11.7. */
  mallopt(M_ARENA_MAX, 1);
  agoq_transport_override(&agoq_sim_transport);
  agoq_sim_link((uint32_t)o.link_gbps * 1000u);
  int n = o.n;
  if (agoq_sim_init(n) != 0) return 1;
  agoq_sim_model(false, 0, 0, 1);

  void** ctx = calloc((size_t)n, sizeof *ctx);
  void** handles = calloc((size_t)n, sizeof *handles);
  sim_setup_arg* sa = calloc((size_t)n, sizeof *sa);
  pthread_t* th = calloc((size_t)n, sizeof *th);
  sim_rank* ranks = calloc((size_t)n, sizeof *ranks);
  if (!ctx || !handles || !sa || !th || !ranks) return 1;
  for (int r = 0; r < n; r++) {
    agoq_sim_rank = r;
    handles[r] = calloc(1, NCCL_NET_HANDLE_MAXSIZE);
    if (agoq_coll_init(&ctx[r], 0x51u, sim_logger) != ncclSuccess ||
        agoq_coll_listen(ctx[r], 0, handles[r], &sa[r].listen) != ncclSuccess) {
      fprintf(stderr, "rank %d: CollNet init or listen failed\n", r);
      return 1;
    }
  }
  double t0 = sim_wall();
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  for (int r = 0; r < n; r++) {
    sa[r] = (sim_setup_arg){.rank = r, .n = n, .handles = handles, .listen = sa[r].listen};
    if (pthread_create(&th[r], &attr, sim_setup_main, &sa[r]) != 0) {
      fprintf(stderr, "cannot start setup thread %d\n", r);
      return 1;
    }
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  double setup_s = sim_wall() - t0;
  for (int r = 0; r < n; r++)
    if (sa[r].res != ncclSuccess) {
      fprintf(stderr, "rank %d: group creation failed (%d)\n", r, (int)sa[r].res);
      return 1;
    }
  agoq_coll_comm* g0 = sa[0].comm;
  size_t chunk_set = o.chunk; /* 0: auto */
  o.chunk = (size_t)g0->cfg.chunk_bytes; /* as the groups resolved it (auto: from the grid) */
  /* What the engine really cuts: a call smaller than a chunk is one chunk. */
  size_t eff_chunk = (size_t)agoq_coll_cost_chunk((double)o.chunk, (double)o.call, (double)o.bytes);
  uint64_t conns_max = 0;
  for (int r = 0; r < n; r++) {
    agoq_coll_engine_hold(sa[r].comm, true); /* this thread steps every engine */
    if (o.row_lead >= 0) /* an experiment on the engine's constant; 0: sends at admission, as before it */
      ((agoq_coll_comm*)sa[r].comm)->row_lead = o.row_lead > 0 ? (uint64_t)o.row_lead : UINT64_MAX / 2;
    uint64_t c = agoq_sim_stats(r)->conns;
    if (c > conns_max) conns_max = c;
  }
  printf("# %d ranks, %s (%d x %d, last row %d), %s %s, %zu bytes per rank in calls of %zu, chunks of %zu, "
         "%d calls in flight; alpha %.2f us, o %.2f us, I/O threads %d\n",
         n, g0->grid.b == 1 ? "one-level mesh" : "two-level grid", g0->grid.a, g0->grid.b, g0->grid.last,
         perf_dtype_name(o.dtype), o.format, o.bytes, o.call, eff_chunk, o.inflight, o.alpha * 1e6, o.o * 1e6,
         g0->cfg.io_threads);
  int bad = 0;
  {
    /* The automatic schedule's choice, recomputed from the same inputs: it must be the
     * groups' (the model's figures are what the INFO line of group creation gives). */
    agoq_coll_plans plans;
    char why[192];
    if (agoq_coll_plans_make(n, g0->cfg.grid_a, g0->cfg.grid_b, (double)chunk_set, &plans, why, sizeof why) != 0) {
      fprintf(stderr, "%s\n", why);
      return 1;
    }
    agoq_coll_pick_in pin = {.format = g0->cfg.format, .block = g0->cfg.block,
                             .frame_partials = g0->cfg.quant_partials, .link_Bps = o.link_gbps * 1e9 / 8,
                             .io_threads = g0->cfg.io_threads};
    double secs[AGOQ_COLL_PLANS_MAX];
    const agoq_coll_grid* pg = &plans.plan[agoq_coll_plans_pick(&plans, &pin, secs)].grid;
    if (plans.count > 1 && o.link_gbps > 0) {
      printf("# schedule chosen at %d Gbit/s (the NICs' rate); the model's time for %d calls of %.0f MiB:", o.link_gbps,
             AGOQ_COLL_COST_CALLS, AGOQ_COLL_PICK_CALL_BYTES / 1048576.0);
      for (int i = 0; i < plans.count; i++)
        printf(" %dx%d %.1f us%s", plans.plan[i].grid.a, plans.plan[i].grid.b, secs[i] * 1e6,
               i + 1 < plans.count ? "," : "\n");
    }
    if (pg->a != g0->grid.a || pg->b != g0->grid.b) {
      printf("# MISMATCH: the groups run %dx%d, the choice gives %dx%d\n", g0->grid.a, g0->grid.b, pg->a, pg->b);
      bad++;
    }
  }
  struct mallinfo2 mi = mallinfo2();
  printf("# setup: %.2f s wall for every rank; connection ends per rank: at most %llu (rank 0: %llu); heap in use "
         "%.1f MB\n", setup_s, (unsigned long long)conns_max, (unsigned long long)agoq_sim_stats(0)->conns,
         (double)(mi.uordblks + mi.hblkhd) / 1e6);

  for (int r = 0; r < n; r++) {
    sim_rank* k = &ranks[r];
    k->comm = sa[r].comm;
    k->send = malloc(o.bytes);
    k->recv = o.inplace ? k->send : malloc(o.bytes);
    if (!k->send || !k->recv) {
      fprintf(stderr, "out of memory for rank %d's buffers\n", r);
      return 1;
    }
    sim_fill(&o, k->send, r, g0->cfg.block);
    agoq_sim_rank = r;
    if (agoq_coll_reg_mr(k->comm, k->send, o.bytes, NCCL_PTR_HOST, &k->smh) != ncclSuccess)
      return 1;
    if (o.inplace) k->rmh = k->smh;
    else if (agoq_coll_reg_mr(k->comm, k->recv, o.bytes, NCCL_PTR_HOST, &k->rmh) != ncclSuccess)
      return 1;
  }
  agoq_format fmt = (agoq_format)agoq_param_int(AGOQ_PARAM_FORMAT);
  agoq_codec_params cp = {.format = fmt, .dtype = o.dtype == ncclFloat32 ? AGOQ_DTYPE_FP32
                                                  : o.dtype == ncclFloat16 ? AGOQ_DTYPE_FP16
                                                                           : AGOQ_DTYPE_BF16,
                          .block = g0->cfg.block};
  bool quant = fmt != AGOQ_FORMAT_NONE && perf_dtype_is_float(o.dtype) && o.dtype != ncclFloat64;
  double wire = quant ? agoq_frame_wire_ratio(&cp, eff_chunk / esz / (size_t)n) : 1.0;
  uint64_t sched = sim_schedule_msgs(&g0->grid);
  printf("# the schedule: %.1f messages per rank per chunk (2(n-1) = %d on the mesh, 2(a+b-2) = %d on an exact grid)\n",
         (double)sched / n, 2 * (n - 1), 2 * (g0->grid.a + g0->grid.b - 2));
  /* The cost model of the same run (agoq_coll_cost.h). */
  agoq_coll_profile prof;
  if (agoq_coll_profile_make(&g0->grid, &prof) != 0) return 1;
  agoq_coll_cost_in ci = {.chunk_bytes = (double)eff_chunk, .wire_ratio = wire,
                          .partial_ratio = agoq_coll_cost_partial_ratio((int)o.dtype, ncclSum, quant,
                                                                        g0->cfg.quant_partials, wire),
                          .alpha_s = o.alpha, .o_s = o.o, .io_threads = g0->cfg.io_threads,
                          .peers = agoq_coll_cost_peers(&g0->grid)};
  printf("#  Gbit/s  vtime(us)  busbw(GB/s)  floor(GB/s)  of_floor  msgs/rank/chunk  bytes/rank/chunk  "
         "wall(s)  model(us)  vtime/model\n");
  for (int gi = 0; gi < o.ngbps; gi++) {
    double bps = o.gbps[gi] * 1e9 / 8;
    uint64_t seq0 = ((agoq_coll_comm*)ranks[0].comm)->next_seq;
    agoq_sim_model(true, o.alpha, o.o, bps);
    agoq_sim_timeline(o.timeline_us * 1e-6);
    for (int r = 0; r < n && o.inplace && gi > 0; r++) /* the last run's result is in the input */
      sim_fill(&o, ranks[r].send, r, g0->cfg.block);
    double w0 = sim_wall(), vt = 0;
    if (sim_run(&o, ranks, &vt) != 0) return 1;
    double chunks = (double)(((agoq_coll_comm*)ranks[0].comm)->next_seq - seq0);
    double msgs = 0, bytes = 0;
    for (int r = 0; r < n; r++) {
      msgs += (double)agoq_sim_stats(r)->msgs_sent;
      bytes += (double)agoq_sim_stats(r)->bytes_sent;
    }
    if (msgs != (double)sched * chunks) {
      printf("# MISMATCH: %.0f messages sent for %.0f chunks, the schedule gives %llu per chunk\n", msgs, chunks,
             (unsigned long long)sched);
      bad++;
    }
    double busbw = (double)o.bytes / vt * 2.0 * (n - 1) / n;
    double floor_bw = bps / wire;
    agoq_coll_cost cost;
    ci.link_Bps = bps;
    agoq_coll_cost_eval(&prof, &ci, &cost);
    double model = agoq_coll_cost_seconds(&cost, (double)eff_chunk, (double)o.bytes, (double)o.call, o.inflight,
                                          AGOQ_COLL_SLOTS);
    printf("%9.0f %10.1f %12.3f %12.3f %9.3f %16.1f %17.0f %8.2f %10.1f %12.3f\n", o.gbps[gi], vt * 1e6,
           busbw / 1e9, floor_bw / 1e9, busbw / floor_bw, msgs / n / chunks, bytes / n / chunks, sim_wall() - w0,
           model * 1e6, vt / model);
    agoq_sim_timeline_print(stdout, o.io_threads > 0 ? o.io_threads : 1);
    if (o.model_tol >= 0 && fabs(vt / model - 1.0) > o.model_tol) {
      printf("# MODEL: the cost model is off by more than %.0f%% at %.0f Gbit/s\n", o.model_tol * 100, o.gbps[gi]);
      bad++;
    }
  }
  /* The row lead (AGOQ_COLL_ROW_LEAD): chunks whose row sends waited for an older chunk's row. */
  if (g0->grid.b > 1) {
    uint64_t held = 0;
    for (int r = 0; r < n; r++) held += ((const agoq_coll_comm*)ranks[r].comm)->lead_waits;
    if (g0->row_lead > AGOQ_COLL_SLOTS)
      printf("# row lead: none (row messages sent at admission)\n");
    else
      printf("# row lead: %.1f chunks per rank waited to send their row messages (lead %llu chunks)\n",
             (double)held / n, (unsigned long long)g0->row_lead);
  }
  /* Staging the slots grew to (every buffer, measured from the groups), and the spills. */
  size_t stage_max = 0, spill_peak = 0;
  uint64_t spills = 0, waits = 0;
  for (int r = 0; r < n; r++) {
    const agoq_coll_comm* g = ranks[r].comm;
    size_t b = agoq_coll_staging_bytes(g);
    if (b > stage_max) stage_max = b;
    if (g->spill_peak > spill_peak) spill_peak = g->spill_peak;
    spills += g->spill_msgs;
    waits += g->spill_waits;
  }
  printf("# staging: slot buffers per rank at most %zu bytes (rank 0: %zu) for %d slots; %llu messages spilled, a "
         "rank held at most %zu bytes of them; admission held back %llu times by the cap\n", stage_max,
         agoq_coll_staging_bytes(ranks[0].comm), AGOQ_COLL_SLOTS, (unsigned long long)spills, spill_peak,
         (unsigned long long)waits);
  if (o.spill_min >= 0 && (double)spills < o.spill_min) {
    printf("# SPILLS: %llu messages spilled, fewer than %.0f\n", (unsigned long long)spills, o.spill_min);
    bad++;
  }
  if (o.staging_max >= 0 && (double)stage_max > o.staging_max) {
    printf("# STAGING: a rank's slots hold %zu bytes, more than %.0f\n", stage_max, o.staging_max);
    bad++;
  }
  /* Bits: every rank's result equal to rank 0's; the error against the fp64 sum. */
  int diverged = 0;
  for (int r = 1; r < n; r++) diverged += memcmp(ranks[r].recv, ranks[0].recv, o.bytes) != 0;
  size_t count = o.bytes / esz;
  double* in = malloc((size_t)n * sizeof(double));
  double se = 0, sr = 0, worst = 0;
  for (size_t i = 0; i < count && in != NULL; i += 1 + count / 65536) {
    for (int r = 0; r < n; r++) perf_input_values(o.dtype, perf_rank_seed(7, r), n, i, 1, &in[r]);
    double ref = perf_reduce_f64(ncclSum, in, n), got = perf_elem_get(o.dtype, ranks[0].recv, i);
    se += (got - ref) * (got - ref);
    sr += ref * ref;
    if (fabs(got - ref) > worst) worst = fabs(got - ref);
  }
  printf("# bits: %d of %d ranks differ from rank 0; rel_l2 against the fp64 sum %.3e (max abs %.3e, sampled)\n",
         diverged, n, sr > 0 ? sqrt(se / sr) : 0.0, worst);
  free(in);
  /* Teardown as NCCL does it: memory, groups, listens, contexts. */
  for (int r = 0; r < n; r++) {
    sim_rank* k = &ranks[r];
    agoq_sim_rank = r;
    agoq_coll_engine_hold(k->comm, false);
    (void)agoq_coll_dereg_mr(k->comm, k->smh);
    if (!o.inplace) (void)agoq_coll_dereg_mr(k->comm, k->rmh);
    (void)agoq_coll_close_coll(k->comm);
    (void)agoq_coll_close_listen(sa[r].listen);
    (void)agoq_coll_finalize(ctx[r]);
    if (!o.inplace) free(k->recv);
    free(k->send);
    free(handles[r]);
  }
  free(ctx);
  free(handles);
  free(sa);
  free(th);
  free(ranks);
  agoq_sim_fini();
  return o.check && (diverged != 0 || bad != 0) ? 1 : 0;
}
