/* The two-level CollNet schedule: agoq_coll_schedule.h says what it is. */
#include "collnet/agoq_coll_schedule.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char* agoq_coll_step_name(agoq_coll_step s) {
  switch (s) {
    case AGOQ_COLL_ROW_RS: return "row reduce-scatter";
    case AGOQ_COLL_COL_RS: return "column reduce-scatter";
    case AGOQ_COLL_COL_AG: return "column all-gather";
    case AGOQ_COLL_ROW_AG: return "row all-gather";
    case AGOQ_COLL_STEPS: break;
  }
  return "?";
}

static void agoq_coll_grid_set(agoq_coll_grid* g, int n, int a, int b) {
  g->n = n;
  g->a = a;
  g->b = b;
  g->last = n - a * (b - 1);
}

size_t agoq_coll_chunk_auto(const agoq_coll_grid* g) {
  return g->b > 1 ? AGOQ_COLL_CHUNK_GRID : AGOQ_COLL_CHUNK_MESH;
}

void agoq_coll_grid_auto(int n, agoq_coll_grid* g) {
  if (n <= AGOQ_COLL_GRID_DIRECT_MAX) {
    agoq_coll_grid_set(g, n, n > 0 ? n : 1, 1);
    return;
  }
  /* floor(sqrt(n)), in integers (n is at most a few tens of thousands). */
  int s = 1;
  while ((long long)(s + 1) * (s + 1) <= n) s++;
  /* The least divisor from ceil(sqrt(n)) up to 2*sqrt(n): an exact grid, every rank playing
   * one position, rows (the locality domains) no shorter than columns are tall. */
  int c = (long long)s * s == n ? s : s + 1;
  for (int d = c; d <= 2 * s; d++)
    if (n % d == 0) {
      agoq_coll_grid_set(g, n, d, n / d);
      return;
    }
  int a = c;
  agoq_coll_grid_set(g, n, a, (n + a - 1) / a);
}

int agoq_coll_grid_make(int n, int a, int b, agoq_coll_grid* g, char* why, size_t why_len) {
  if (n < 1) {
    snprintf(why, why_len, "a group of %d ranks", n);
    return -1;
  }
  if (a == 0 && b == 0) {
    agoq_coll_grid_auto(n, g);
    return 0;
  }
  if (a < 1 || b < 1 || (long long)a * b < n || (long long)a * (b - 1) >= n) {
    snprintf(why, why_len,
             "a grid of %d x %d does not hold %d ranks with a non-empty last row (it needs a*b >= n > a*(b-1))", a, b,
             n);
    return -1;
  }
  if (b > 1 && a > AGOQ_COLL_GRID_COLS_MAX) {
    snprintf(why, why_len, "a grid of %d x %d: at most %d columns with more than one row", a, b,
             AGOQ_COLL_GRID_COLS_MAX);
    return -1;
  }
  agoq_coll_grid_set(g, n, a, b);
  return 0;
}

int agoq_coll_grid_player(const agoq_coll_grid* g, int row, int col) {
  if (row < g->b - 1 || col < g->last) return row * g->a + col;
  return row * g->a + col % g->last;
}

int agoq_coll_grid_cols_of(const agoq_coll_grid* g, int rank, int* cols) {
  int row = agoq_coll_grid_row(g, rank), col = agoq_coll_grid_col(g, rank), k = 0;
  if (row < g->b - 1) {
    cols[0] = col;
    return 1;
  }
  for (int c = col; c < g->a; c += g->last) cols[k++] = c;
  return k;
}

/* Each message as one call: from `rank` to `to`, spans[0..nspans). */
static void agoq_coll_emit(agoq_coll_step step, int rank, int to, const agoq_coll_span* spans, int nspans,
                           agoq_coll_msg_fn fn, void* arg) {
  if (nspans == 0 || to == rank) return;
  agoq_coll_msg m = {.step = step, .from = rank, .to = to, .nspans = nspans, .spans = spans};
  fn(arg, &m);
}

void agoq_coll_schedule_sends(const agoq_coll_grid* g, int rank, agoq_coll_step step, agoq_coll_span* spans,
                              agoq_coll_msg_fn fn, void* arg) {
  const int R = agoq_coll_grid_row(g, rank), len = agoq_coll_grid_row_len(g, R), first = R * g->a;
  int cols[AGOQ_COLL_GRID_COLS_MAX];
  int k = agoq_coll_grid_cols_of(g, rank, cols);
  switch (step) {
    case AGOQ_COLL_ROW_RS:
      /* To each row peer, every column slice it plays, of this rank's contribution. */
      for (int q = first; q < first + len; q++) {
        if (q == rank) continue;
        int kq = agoq_coll_grid_cols_of(g, q, cols);
        for (int i = 0; i < kq; i++) spans[i] = (agoq_coll_span){.col = cols[i], .row = 0, .rows = g->b};
        agoq_coll_emit(step, rank, q, spans, kq, fn, arg);
      }
      return;
    case AGOQ_COLL_COL_RS:
    case AGOQ_COLL_COL_AG:
      /* Rows ascending, then columns: the players of full rows are r*a + c, ascending; the
       * last row's come after them. No two of this rank's spans go to one player. */
      for (int r = 0; r < g->b; r++) {
        if (r == R) continue;
        for (int i = 0; i < k; i++) {
          /* COL_RS: piece (c, r) of this row's fp32 sum; COL_AG: this rank's final (c, R). */
          spans[0] = (agoq_coll_span){.col = cols[i], .row = step == AGOQ_COLL_COL_RS ? r : R, .rows = 1};
          agoq_coll_emit(step, rank, agoq_coll_grid_player(g, r, cols[i]), spans, 1, fn, arg);
        }
      }
      return;
    case AGOQ_COLL_ROW_AG:
      /* To each row peer, one message: every column slice this rank holds final. */
      for (int i = 0; i < k; i++) spans[i] = (agoq_coll_span){.col = cols[i], .row = 0, .rows = g->b};
      for (int q = first; q < first + len; q++) agoq_coll_emit(step, rank, q, spans, k, fn, arg);
      return;
    case AGOQ_COLL_STEPS:
      return;
  }
}

typedef struct {
  int to;
  agoq_coll_msg_fn fn;
  void* arg;
} agoq_coll_recv_filter;

static void agoq_coll_recv_one(void* arg, const agoq_coll_msg* m) {
  const agoq_coll_recv_filter* f = arg;
  if (m->to == f->to) f->fn(f->arg, m);
}

void agoq_coll_schedule_recvs(const agoq_coll_grid* g, int rank, agoq_coll_step step, agoq_coll_span* spans,
                              agoq_coll_msg_fn fn, void* arg) {
  const int R = agoq_coll_grid_row(g, rank), len = agoq_coll_grid_row_len(g, R), first = R * g->a;
  agoq_coll_recv_filter f = {.to = rank, .fn = fn, .arg = arg};
  if (step == AGOQ_COLL_ROW_RS || step == AGOQ_COLL_ROW_AG) {
    for (int q = first; q < first + len; q++)
      if (q != rank) agoq_coll_schedule_sends(g, q, step, spans, agoq_coll_recv_one, &f);
    return;
  }
  if (step != AGOQ_COLL_COL_RS && step != AGOQ_COLL_COL_AG) return;
  /* The senders are the players of this rank's columns in the other rows, each once: a
   * full-row rank plays one column (one player per other row), a last-row rank's columns
   * have distinct players in the full rows. Ascending as in agoq_coll_schedule_sends. */
  int cols[AGOQ_COLL_GRID_COLS_MAX];
  int k = agoq_coll_grid_cols_of(g, rank, cols);
  for (int r = 0; r < g->b; r++) {
    if (r == R) continue;
    for (int i = 0; i < k; i++)
      agoq_coll_schedule_sends(g, agoq_coll_grid_player(g, r, cols[i]), step, spans, agoq_coll_recv_one, &f);
  }
}

int agoq_coll_schedule_peers(const agoq_coll_grid* g, int rank) {
  int cols[AGOQ_COLL_GRID_COLS_MAX];
  int k = agoq_coll_grid_cols_of(g, rank, cols);
  /* Row peers, and the players of its columns in the other rows: distinct (other rows, and
   * distinct columns in the full rows; a full-row rank has one column). */
  return agoq_coll_grid_row_len(g, agoq_coll_grid_row(g, rank)) - 1 + k * (g->b - 1);
}

bool agoq_coll_schedule_is_peer(const agoq_coll_grid* g, int rank, int p) {
  if (p == rank || p < 0 || p >= g->n) return false;
  int rr = agoq_coll_grid_row(g, rank), rp = agoq_coll_grid_row(g, p);
  if (rr == rp) return true;
  /* Other rows: peers when they play a common column. A full-row rank plays only its own
   * column, and two ranks of other rows are never both in the short last row. */
  if (rr < g->b - 1 && rp < g->b - 1) return agoq_coll_grid_col(g, rank) == agoq_coll_grid_col(g, p);
  if (rr < g->b - 1) return agoq_coll_grid_plays(g, p, agoq_coll_grid_col(g, rank));
  return agoq_coll_grid_plays(g, rank, agoq_coll_grid_col(g, p));
}

/* One dimension of "AxB": 1..65535 after optional blanks; *end past it. */
static int agoq_coll_grid_dim(const char* s, const char** end) {
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s)) return -1;
  long v = 0;
  while (isdigit((unsigned char)*s) && v <= 65535) v = v * 10 + (*s++ - '0');
  while (isspace((unsigned char)*s)) s++;
  *end = s;
  return v >= 1 && v <= 65535 ? (int)v : -1;
}

int agoq_coll_grid_parse(const char* text, int* a, int* b, char* why, size_t why_len) {
  const char* s = text != NULL ? text : "";
  while (isspace((unsigned char)*s)) s++;
  size_t len = strlen(s);
  while (len > 0 && isspace((unsigned char)s[len - 1])) len--;
  if (len == 4 && strncasecmp(s, "auto", 4) == 0) {
    *a = *b = 0;
    return 0;
  }
  const char* p = s;
  int va = agoq_coll_grid_dim(p, &p);
  int vb = -1;
  if (va > 0 && (*p == 'x' || *p == 'X')) vb = agoq_coll_grid_dim(p + 1, &p);
  if (va < 1 || vb < 1 || *p != '\0') {
    snprintf(why, why_len, "AGOQ_COLLNET_GRID=%.64s: expected auto or AxB (A columns per row, B rows, each 1 to 65535; "
             "e.g. 32x32)", text != NULL ? text : "");
    return -1;
  }
  *a = va;
  *b = vb;
  return 0;
}

void agoq_coll_grid_text(int a, int b, char* buf, size_t len) {
  if (a == 0 && b == 0) snprintf(buf, len, "auto");
  else snprintf(buf, len, "%dx%d", a, b);
}
