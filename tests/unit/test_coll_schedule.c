/* The two-level CollNet schedule (plugin/collnet/agoq_coll_schedule.h), run symbolically for
 * every rank of grids from 1 to 1024 ranks, exact, ragged and prime, chosen and given: every
 * piece of every chunk goes where the reduction needs it exactly once per step, every rank
 * ends holding every final piece exactly once, what the senders enumerate is what the
 * receivers enumerate, and the message and peer counts are the formulas the design states
 * (2(a+b-2) messages per rank per chunk on an exact grid, against 2(n-1) on the mesh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collnet/agoq_coll_schedule.h"

static void test_grid_choice(void** state) {
  (void)state;
  agoq_coll_grid g;
  char why[200];
  static const struct {
    int n, a, b, last;
  } want[] = {{1, 1, 1, 1},    {2, 2, 1, 2},     {16, 16, 1, 16},  {17, 5, 4, 2},     {18, 6, 3, 6},
              {64, 8, 8, 8},   {97, 10, 10, 7},  {100, 10, 10, 10}, {128, 16, 8, 16}, {250, 25, 10, 25},
              {256, 16, 16, 16}, {1000, 40, 25, 40}, {1024, 32, 32, 32}, {4096, 64, 64, 64}, {4093, 64, 64, 61}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    assert_int_equal(agoq_coll_grid_make(want[i].n, 0, 0, &g, why, sizeof why), 0);
    if (g.a != want[i].a || g.b != want[i].b || g.last != want[i].last)
      fail_msg("n %d: %d x %d (last %d), expected %d x %d (last %d)", want[i].n, g.a, g.b, g.last, want[i].a,
               want[i].b, want[i].last);
  }
  /* Given shapes: any that holds n with a non-empty last row. */
  assert_int_equal(agoq_coll_grid_make(64, 4, 16, &g, why, sizeof why), 0);
  assert_int_equal(g.last, 4);
  assert_int_equal(agoq_coll_grid_make(60, 8, 8, &g, why, sizeof why), 0);
  assert_int_equal(g.last, 4);
  assert_int_equal(agoq_coll_grid_make(5, 5, 1, &g, why, sizeof why), 0);
  static const int bad[][3] = {{64, 8, 7}, {64, 8, 9}, {64, 64, 2}, {5, 4, 1}, {0, 0, 0}, {8, -1, 8}, {8, 0, 8}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    assert_int_equal(agoq_coll_grid_make(bad[i][0], bad[i][1], bad[i][2], &g, why, sizeof why), -1);
    assert_true(strlen(why) > 0);
  }
  assert_int_equal(agoq_coll_grid_make(8193, 8193, 2, &g, why, sizeof why), -1); /* too many columns */
}

/* ---- the symbolic run --------------------------------------------------------------------- */

typedef struct {
  const agoq_coll_grid* g;
  /* ROW_RS: rs_row[(rank * a + c)]: contributions to column slice c played by `rank` (its
   * row's count when complete). */
  int* rs_row;
  /* COL_RS: partial sums of piece p that its owner got: b when complete (its own included). */
  int* rs_col;
  /* What each rank holds final: have[rank * pieces + p]. */
  unsigned char* have;
  long long msgs[AGOQ_COLL_STEPS], spans[AGOQ_COLL_STEPS];
  int* sent_by; /* messages sent per rank, all steps */
  int* recv_by;
  /* Messages seen by the receivers' enumeration, to compare with the senders'. */
  long long recv_msgs[AGOQ_COLL_STEPS];
  unsigned long long send_hash[AGOQ_COLL_STEPS], recv_hash[AGOQ_COLL_STEPS];
} run;

static unsigned long long msg_hash(const agoq_coll_msg* m) {
  unsigned long long h = 1469598103934665603ull;
  int v[4] = {m->step, m->from, m->to, m->nspans};
  for (int i = 0; i < 4; i++) h = (h ^ (unsigned)v[i]) * 1099511628211ull;
  for (int i = 0; i < m->nspans; i++) {
    h = (h ^ (unsigned)m->spans[i].col) * 1099511628211ull;
    h = (h ^ (unsigned)m->spans[i].row) * 1099511628211ull;
    h = (h ^ (unsigned)m->spans[i].rows) * 1099511628211ull;
  }
  return h * 0x9e3779b97f4a7c15ull; /* summed over messages: order-independent */
}

static void on_send(void* arg, const agoq_coll_msg* m) {
  run* x = arg;
  const agoq_coll_grid* g = x->g;
  int pieces = agoq_coll_grid_pieces(g);
  assert_true(m->from != m->to);
  assert_true(m->to >= 0 && m->to < g->n);
  assert_true(m->nspans >= 1 && m->nspans <= g->a);
  x->msgs[m->step]++;
  x->spans[m->step] += m->nspans;
  x->sent_by[m->from]++;
  x->send_hash[m->step] += msg_hash(m);
  int R = agoq_coll_grid_row(g, m->from);
  for (int i = 0; i < m->nspans; i++) {
    const agoq_coll_span* s = &m->spans[i];
    switch (m->step) {
      case AGOQ_COLL_ROW_RS:
        /* A column slice of the sender's contribution, to the player of (its row, c). */
        assert_int_equal(s->row, 0);
        assert_int_equal(s->rows, g->b);
        assert_int_equal(agoq_coll_grid_player(g, R, s->col), m->to);
        x->rs_row[(size_t)m->to * g->a + s->col]++;
        break;
      case AGOQ_COLL_COL_RS:
        /* Piece (c, r) of the sender's row sum, to the player of (r, c). */
        assert_true(agoq_coll_grid_plays(g, m->from, s->col));
        assert_int_equal(s->rows, 1);
        assert_true(s->row != R);
        assert_int_equal(agoq_coll_grid_player(g, s->row, s->col), m->to);
        x->rs_col[agoq_coll_grid_piece(g, s->col, s->row)]++;
        break;
      case AGOQ_COLL_COL_AG:
        /* The sender's final piece (c, R), to another player of column c. */
        assert_true(agoq_coll_grid_plays(g, m->from, s->col));
        assert_int_equal(s->row, R);
        assert_int_equal(s->rows, 1);
        assert_true(agoq_coll_grid_plays(g, m->to, s->col));
        x->have[(size_t)m->to * pieces + agoq_coll_grid_piece(g, s->col, s->row)]++;
        break;
      case AGOQ_COLL_ROW_AG:
        /* A column slice the sender holds final, to a row peer. */
        assert_int_equal(agoq_coll_grid_row(g, m->to), R);
        assert_true(agoq_coll_grid_plays(g, m->from, s->col));
        for (int r = s->row; r < s->row + s->rows; r++)
          x->have[(size_t)m->to * pieces + agoq_coll_grid_piece(g, s->col, r)]++;
        break;
      case AGOQ_COLL_STEPS:
        fail();
    }
  }
}

static void on_recv(void* arg, const agoq_coll_msg* m) {
  run* x = arg;
  x->recv_msgs[m->step]++;
  x->recv_by[m->to]++;
  x->recv_hash[m->step] += msg_hash(m);
}

typedef struct {
  unsigned char* seen;
  int me, distinct;
} peer_seen;

static void on_peer(void* arg, const agoq_coll_msg* m) {
  peer_seen* ps = arg;
  int other = m->from == ps->me ? m->to : m->from;
  assert_true(m->from == ps->me || m->to == ps->me);
  if (!ps->seen[other]) ps->distinct++;
  ps->seen[other] = 1;
}

static void check_grid(const agoq_coll_grid* g) {
  const int n = g->n, a = g->a, b = g->b, pieces = agoq_coll_grid_pieces(g);
  run x = {.g = g};
  x.rs_row = calloc((size_t)n * a, sizeof *x.rs_row);
  x.rs_col = calloc((size_t)pieces, sizeof *x.rs_col);
  x.have = calloc((size_t)n * pieces, 1);
  x.sent_by = calloc((size_t)n, sizeof(int));
  x.recv_by = calloc((size_t)n, sizeof(int));
  agoq_coll_span* spans = calloc((size_t)a, sizeof *spans);
  assert_non_null(x.rs_row);
  assert_non_null(x.have);
  /* Each position (r, c) is played by exactly one rank, of row r. */
  for (int r = 0; r < b; r++)
    for (int c = 0; c < a; c++) {
      int p = agoq_coll_grid_player(g, r, c);
      assert_true(p >= 0 && p < n);
      assert_int_equal(agoq_coll_grid_row(g, p), r);
    }
  for (agoq_coll_step st = AGOQ_COLL_ROW_RS; st < AGOQ_COLL_STEPS; st++) {
    for (int q = 0; q < n; q++) agoq_coll_schedule_sends(g, q, st, spans, on_send, &x);
    for (int q = 0; q < n; q++) agoq_coll_schedule_recvs(g, q, st, spans, on_recv, &x);
    assert_int_equal(x.recv_msgs[st], x.msgs[st]);
    assert_true(x.recv_hash[st] == x.send_hash[st]);
    if (st == AGOQ_COLL_ROW_RS) {
      /* Every player has its row's contributions to each column it plays (its own kept). */
      for (int q = 0; q < n; q++) {
        int R = agoq_coll_grid_row(g, q);
        for (int c = 0; c < a; c++) {
          int want = agoq_coll_grid_plays(g, q, c) ? agoq_coll_grid_row_len(g, R) - 1 : 0;
          if (x.rs_row[(size_t)q * a + c] != want)
            fail_msg("%d x %d: rank %d got %d contributions to column %d, expected %d", a, b, q,
                     x.rs_row[(size_t)q * a + c], c, want);
        }
      }
    }
    if (st == AGOQ_COLL_COL_RS)
      for (int p = 0; p < pieces; p++) assert_int_equal(x.rs_col[p], b - 1);
    if (st == AGOQ_COLL_COL_AG) {
      /* Each player of (R, c) holds column slice c final: the b-1 others got, its own made. */
      for (int q = 0; q < n; q++)
        for (int c = 0; c < a; c++)
          for (int r = 0; r < b; r++) {
            unsigned char* h = &x.have[(size_t)q * pieces + agoq_coll_grid_piece(g, c, r)];
            if (agoq_coll_grid_plays(g, q, c) && agoq_coll_grid_row(g, q) == r) {
              assert_int_equal(*h, 0);
              *h = 1; /* made here */
            }
          }
    }
  }
  /* Every rank holds every piece exactly once. */
  for (size_t i = 0; i < (size_t)n * pieces; i++)
    if (x.have[i] != 1)
      fail_msg("%d x %d (n %d): rank %zu holds piece %zu %d times", a, b, n, i / pieces, i % pieces, x.have[i]);
  /* Messages per rank per chunk: 2(a+b-2) on an exact grid (2(n-1) on the mesh); a short
   * last row's ranks send fewer row messages and more column ones. */
  unsigned char* seen = calloc((size_t)n, 1);
  for (int q = 0; q < n; q++) {
    if (g->last == a) assert_int_equal(x.sent_by[q], 2 * (a + b - 2));
    assert_int_equal(x.sent_by[q], x.recv_by[q]);
    /* Every peer it sends to or receives from, once each: its connections. */
    peer_seen ps = {.seen = seen, .me = q};
    for (agoq_coll_step st = AGOQ_COLL_ROW_RS; st < AGOQ_COLL_STEPS; st++) {
      agoq_coll_schedule_sends(g, q, st, spans, on_peer, &ps);
      agoq_coll_schedule_recvs(g, q, st, spans, on_peer, &ps);
    }
    assert_int_equal(ps.distinct, agoq_coll_schedule_peers(g, q));
    if (g->last == a) assert_int_equal(ps.distinct, a + b - 2);
    /* The peers setup connects (agoq_coll_schedule_is_peer) are exactly the ones messages
     * flow between: no connection missing, none idle. */
    for (int p = 0; p < n; p++)
      if (agoq_coll_schedule_is_peer(g, q, p) != (seen[p] != 0))
        fail_msg("%d x %d (n %d): is_peer(%d, %d) = %d, but messages say %d", a, b, n, q, p,
                 agoq_coll_schedule_is_peer(g, q, p), seen[p] != 0);
    memset(seen, 0, (size_t)n);
  }
  free(seen);
  if (g->last == a) {
    assert_int_equal(x.msgs[AGOQ_COLL_ROW_RS], (long long)n * (a - 1));
    assert_int_equal(x.msgs[AGOQ_COLL_COL_RS], (long long)n * (b - 1));
  }
  free(spans);
  free(x.rs_row);
  free(x.rs_col);
  free(x.have);
  free(x.sent_by);
  free(x.recv_by);
}

static void test_every_piece_once(void** state) {
  (void)state;
  static const int ns[] = {1, 2, 3, 5, 7, 16, 17, 18, 31, 64, 97, 100, 128, 250, 1024};
  agoq_coll_grid g;
  char why[200];
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
    assert_int_equal(agoq_coll_grid_make(ns[i], 0, 0, &g, why, sizeof why), 0);
    check_grid(&g);
  }
  /* Given shapes: tall, wide, ragged with a last row of one, the mesh as one row. */
  static const int shapes[][3] = {{64, 4, 16}, {64, 16, 4}, {61, 4, 16}, {33, 8, 5}, {13, 13, 1}, {40, 3, 14}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    assert_int_equal(agoq_coll_grid_make(shapes[i][0], shapes[i][1], shapes[i][2], &g, why, sizeof why), 0);
    check_grid(&g);
  }
}

/* AGOQ_COLLNET_GRID's text: auto or AxB, anything else refused naming the variable. */
static void test_grid_parse(void** state) {
  (void)state;
  int a = -1, b = -1;
  char why[200], text[32];
  static const struct {
    const char* text;
    int a, b;
  } good[] = {{"auto", 0, 0}, {" AUTO ", 0, 0}, {"8x8", 8, 8}, {"32X16", 32, 16}, {" 4 x 2 ", 4, 2},
              {"65535x1", 65535, 1}, {"1x65535", 1, 65535}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    assert_int_equal(agoq_coll_grid_parse(good[i].text, &a, &b, why, sizeof why), 0);
    assert_int_equal(a, good[i].a);
    assert_int_equal(b, good[i].b);
  }
  static const char* const bad[] = {"", "8", "8x", "x8", "0x8", "8x0", "65536x2", "8x8x8", "-8x8", "8*8", "autox",
                                    "8 8", "99999999999x2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    if (agoq_coll_grid_parse(bad[i], &a, &b, why, sizeof why) == 0) fail_msg("\"%s\" accepted", bad[i]);
    assert_non_null(strstr(why, "AGOQ_COLLNET_GRID"));
  }
  agoq_coll_grid_text(0, 0, text, sizeof text);
  assert_string_equal(text, "auto");
  agoq_coll_grid_text(32, 16, text, sizeof text);
  assert_string_equal(text, "32x16");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grid_choice),
      cmocka_unit_test(test_every_piece_once),
      cmocka_unit_test(test_grid_parse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
