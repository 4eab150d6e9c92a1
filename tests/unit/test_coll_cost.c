/* The CollNet cost model (plugin/collnet/agoq_coll_cost.h): its bytes and messages are the
 * schedule's, its limits are the clock model's, and its times stay within 15% of
 * agoq-collnet-sim's virtual times, or 10 us (data/coll_cost_sim.tsv, measured by
 * tools/collnet/sim-cost-table.sh) from 2 to 1024 ranks and 10 to 400 Gbit/s. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_cost.h"
#include "collnet/agoq_coll_internal.h"

#define MIB 1048576.0

static agoq_coll_profile prof;

/* The inputs, with the profile of n ranks on a x b in prof. */
static agoq_coll_cost_in cost_in(int n, int a, int b, double ratio, double partial, double gbps) {
  agoq_coll_cost_in in = {.chunk_bytes = MIB, .wire_ratio = ratio, .partial_ratio = partial,
                          .link_Bps = gbps * 1e9 / 8, .alpha_s = AGOQ_COLL_COST_ALPHA_S, .o_s = AGOQ_COLL_COST_O_S};
  char why[128];
  agoq_coll_grid g;
  assert_int_equal(agoq_coll_grid_make(n, a, b, &g, why, sizeof why), 0);
  assert_int_equal(agoq_coll_profile_make(&g, &prof), 0);
  return in;
}

static void cost_of(const agoq_coll_cost_in* in, agoq_coll_cost* c) { agoq_coll_cost_eval(&prof, in, c); }

/* Messages: 2(n-1) each way on the mesh, 2(a+b-2) on an exact grid; bytes: a reduce-scatter
 * and an all-gather of the frames, (n-1)/n of the chunk each, plus the grid's partial sums. */
static void test_bytes_and_messages_are_the_schedule(void** state) {
  (void)state;
  for (int n = 2; n <= 1024; n = n < 16 ? n + 1 : n * 2) {
    agoq_coll_cost c;
    agoq_coll_cost_in in = cost_in(n, n, 1, 0.5, 2.0, 100);
    cost_of(&in, &c);
    assert_float_equal(c.msgs, 4.0 * (n - 1), 0);
    assert_float_equal(c.tx_bytes, 2.0 * (n - 1) / n * MIB * 0.5, 1e-6 * MIB);
    assert_float_equal(c.rx_bytes, c.tx_bytes, 1e-6 * MIB);
    assert_int_equal(c.levels, n > 1 ? 2 : 0);
  }
  int grids[][2] = {{4, 4}, {8, 8}, {16, 8}, {32, 32}, {64, 64}};
  for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++) {
    int a = grids[i][0], b = grids[i][1];
    agoq_coll_cost c;
    agoq_coll_cost_in in = cost_in(a * b, a, b, 0.5, 2.0, 100);
    cost_of(&in, &c);
    assert_float_equal(c.msgs, 4.0 * (a + b - 2), 0);
    assert_int_equal(c.levels, 4);
    /* Row reduce-scatter and all-gather of frames, the column's fp32 partials and final pieces. */
    double want = 2.0 * (a - 1) / a * MIB * 0.5 + (b - 1.0) / b * MIB / a * 2.0 + (b - 1.0) / b * MIB / a * 0.5;
    assert_float_equal(c.tx_bytes, want, 1e-6 * MIB);
  }
}

/* With no latency and no CPU cost a chunk takes its bytes' time at the NIC, and one chunk
 * alone its steps' bytes in turn; with an infinitely fast link, its messages' CPU time. */
static void test_limits(void** state) {
  (void)state;
  agoq_coll_cost c;
  agoq_coll_cost_in in = cost_in(8, 8, 1, 0.5, 2.0, 10);
  in.alpha_s = in.o_s = 0;
  cost_of(&in, &c);
  assert_float_equal(c.chunk_s, c.tx_bytes / in.link_Bps, 1e-12);
  assert_float_equal(c.first_s, c.chunk_s, 1e-12);
  in = cost_in(64, 8, 8, 0.5, 2.0, 1e9);
  cost_of(&in, &c);
  assert_float_equal(c.chunk_s, AGOQ_COLL_COST_O_S * c.msgs, 1e-9);
  /* A codec on the CPU adds to the messages' time; on a GPU it overlaps them. */
  in.codec_Bps = 1e9;
  in.codec_on_cpu = true;
  cost_of(&in, &c);
  assert_float_equal(c.chunk_s, AGOQ_COLL_COST_O_S * c.msgs + 2 * MIB / 1e9, 1e-9);
  in.codec_on_cpu = false;
  cost_of(&in, &c);
  assert_float_equal(c.chunk_s, fmax(AGOQ_COLL_COST_O_S * c.msgs, 2 * MIB / 1e9), 1e-9);
  /* Time grows with the bytes; a pipeline of calls in flight is no slower than one at a time. */
  double prev = 0;
  for (double bytes = MIB; bytes <= 64 * MIB; bytes *= 2) {
    double t = agoq_coll_cost_seconds(&c, MIB, bytes, 2 * MIB, 8, AGOQ_COLL_SLOTS);
    assert_true(t > prev);
    assert_true(t <= agoq_coll_cost_seconds(&c, MIB, bytes, 2 * MIB, 1, AGOQ_COLL_SLOTS) + 1e-12);
    prev = t;
  }
}

/* AGOQ_COLLNET_IO_THREADS: k threads split the peers, so the busiest carries ceil(peers / k)
 * of them, and the messages leave the engine's CPU to the codec. */
static void test_io_threads(void** state) {
  (void)state;
  assert_float_equal(agoq_coll_cost_io_share(11, 0), 1.0, 0);
  assert_float_equal(agoq_coll_cost_io_share(11, 1), 1.0, 0);
  assert_float_equal(agoq_coll_cost_io_share(11, 3), 4.0 / 11.0, 1e-15);
  assert_float_equal(agoq_coll_cost_io_share(3, 2), 2.0 / 3.0, 1e-15);
  assert_float_equal(agoq_coll_cost_io_share(3, 16), 1.0 / 3.0, 1e-15);
  assert_float_equal(agoq_coll_cost_io_share(0, 4), 1.0, 0);
  agoq_coll_cost c;
  agoq_coll_cost_in in = cost_in(12, 12, 1, 0.5, 2.0, 1e9); /* the messages bind */
  in.codec_Bps = 1e9;
  in.codec_on_cpu = true;
  in.peers = 11;
  cost_of(&in, &c);
  double msgs_s = AGOQ_COLL_COST_O_S * c.msgs, codec_s = 2 * MIB / 1e9;
  assert_float_equal(c.chunk_s, msgs_s + codec_s, 1e-9); /* one CPU for both */
  in.io_threads = 3;
  cost_of(&in, &c);
  assert_float_equal(c.chunk_s, fmax(msgs_s * 4.0 / 11.0, codec_s), 1e-9);
  in.io_threads = 1; /* one thread: the messages off the engine, not spread */
  cost_of(&in, &c);
  assert_float_equal(c.chunk_s, fmax(msgs_s, codec_s), 1e-9);
}

/* The simulation's measured times. */
static void test_within_15_percent_of_the_simulation(void** state) {
  (void)state;
  FILE* f = fopen(AGOQ_COST_TABLE, "r");
  assert_non_null(f);
  char line[256];
  int rows = 0, nmax = 0, off = 0;
  double worst = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (line[0] == '#') continue;
    int n, a, b, inflight;
    char dtype[16], format[16];
    double bytes, call, gbps, vtime_us;
    if (sscanf(line, "%d %d %d %15s %15s %lf %lf %d %lf %lf", &n, &a, &b, dtype, format, &bytes, &call, &inflight,
               &gbps, &vtime_us) != 10)
      fail_msg("bad row: %s", line);
    bool bf16 = strcmp(dtype, "bf16") == 0, quant = strcmp(format, "none") != 0;
    assert_true(bf16 || strcmp(dtype, "fp32") == 0);
    assert_true(!quant || strcmp(format, "int8") == 0);
    double esz = bf16 ? 2 : 4;
    agoq_codec_params cp = {.format = AGOQ_FORMAT_INT8, .dtype = bf16 ? AGOQ_DTYPE_BF16 : AGOQ_DTYPE_FP32,
                            .block = 128};
    double wire = quant ? agoq_frame_wire_ratio(&cp, (size_t)(MIB / esz / n)) : 1.0;
    agoq_coll_cost_in in = cost_in(n, a, b, wire, bf16 ? 4.0 / esz : 1.0, gbps);
    agoq_coll_cost c;
    cost_of(&in, &c);
    double model_us = agoq_coll_cost_seconds(&c, MIB, bytes, call, inflight, AGOQ_COLL_SLOTS) * 1e6;
    /* Within 15%, or within 10 us: two steps' latency and CPU time (alpha + 2 o each), which a
     * call of two chunks that overlaps better than the steady state can save. */
    double err = fabs(vtime_us / model_us - 1.0);
    bool ok = err <= 0.15 || fabs(vtime_us - model_us) <= 10.0;
    if (!ok || getenv("AGOQ_COST_VERBOSE") != NULL)
      printf("%s n %d (%dx%d) %s %s, %.0f bytes, %d in flight, %.0f Gbit/s: simulated %.1f us, model %.1f us\n",
             ok ? "ok" : "OFF", n, a, b, dtype, format, bytes, inflight, gbps, vtime_us, model_us);
    off += !ok;
    if (fabs(vtime_us - model_us) > 10.0) worst = fmax(worst, err);
    nmax = n > nmax ? n : nmax;
    rows++;
  }
  fclose(f);
  assert_int_equal(off, 0);
  assert_true(rows >= 40);
  assert_true(nmax >= 256);
  printf("%d simulated runs up to %d ranks: the model within 15%% or 10 us of every one (%.1f%% at worst where "
         "more than 10 us apart)\n", rows, nmax, worst * 100);
}

static agoq_coll_pick_in pick_at(double gbps) {
  return (agoq_coll_pick_in){.format = AGOQ_FORMAT_INT8, .block = 128, .link_Bps = gbps * 1e9 / 8};
}

/* Who is a candidate: the mesh alone up to 16 ranks or where AGOQ_COLLNET_GRID names a grid;
 * above, the mesh (up to 64 ranks), the grid n alone gives (the rule, which runs without a
 * link rate), and every exact grid with rows no shorter than columns and at most 63 peers. */
static void test_candidates(void** state) {
  (void)state;
  agoq_coll_plans p;
  char why[128];
  double secs[AGOQ_COLL_PLANS_MAX];
  for (int n = 2; n <= 16; n++) {
    assert_int_equal(agoq_coll_plans_make(n, 0, 0, 0, &p, why, sizeof why), 0);
    assert_int_equal(p.count, 1);
    assert_int_equal(p.plan[0].grid.b, 1);
    assert_float_equal(p.plan[0].chunk_bytes, AGOQ_COLL_CHUNK_MESH, 0);
    agoq_coll_pick_in in = pick_at(400);
    assert_int_equal(agoq_coll_plans_pick(&p, &in, NULL), 0);
  }
  for (int n = 17; n <= 1100; n++) {
    assert_int_equal(agoq_coll_plans_make(n, 0, 0, 0, &p, why, sizeof why), 0);
    agoq_coll_grid rule;
    agoq_coll_grid_auto(n, &rule);
    assert_int_equal(p.plan[p.rule].grid.a, rule.a);
    assert_int_equal(p.plan[p.rule].grid.b, rule.b);
    assert_int_equal(p.plan[0].grid.b == 1, n <= AGOQ_COLL_MESH_AUTO_MAX);
    for (int i = 0; i < p.count; i++) {
      const agoq_coll_grid* g = &p.plan[i].grid;
      assert_float_equal(p.plan[i].chunk_bytes, g->b == 1 ? AGOQ_COLL_CHUNK_MESH : AGOQ_COLL_CHUNK_GRID, 0);
      if (i == p.rule) continue;
      assert_true(g->b == 1 || (g->a * g->b == n && g->a >= g->b && g->a + g->b - 2 <= 63));
      for (int j = 0; j < i; j++) /* each shape once */
        assert_false(p.plan[j].grid.a == g->a && p.plan[j].grid.b == g->b);
    }
    /* Without a rate, the rule. */
    agoq_coll_pick_in unknown = pick_at(0);
    assert_int_equal(agoq_coll_plans_pick(&p, &unknown, secs), p.rule);
    for (int i = 0; i < p.count; i++) assert_true(secs[i] < 0);
  }
  /* 64 ranks: the mesh, 8x8 (the rule), 32x2 and 16x4; 128: 16x8 and 32x4 (64x2 has 64
   * peers); 1024: 32x32 alone; a prime: its rule alone. */
  assert_int_equal(agoq_coll_plans_make(64, 0, 0, 0, &p, why, sizeof why), 0);
  assert_int_equal(p.count, 4);
  assert_int_equal(agoq_coll_plans_make(128, 0, 0, 0, &p, why, sizeof why), 0);
  assert_int_equal(p.count, 2);
  assert_int_equal(p.plan[1].grid.a, 32);
  assert_int_equal(agoq_coll_plans_make(1024, 0, 0, 0, &p, why, sizeof why), 0);
  assert_int_equal(p.count, 1);
  assert_int_equal(p.plan[0].grid.a, 32);
  assert_int_equal(agoq_coll_plans_make(97, 0, 0, 0, &p, why, sizeof why), 0);
  assert_int_equal(p.count, 1);
  /* Named: that grid and that chunk, at any rate. */
  assert_int_equal(agoq_coll_plans_make(32, 32, 1, 4 * MIB, &p, why, sizeof why), 0);
  assert_int_equal(p.count, 1);
  assert_float_equal(p.plan[0].chunk_bytes, 4 * MIB, 0);
  assert_int_equal(agoq_coll_plans_make(32, 4, 8, 0, &p, why, sizeof why), 0);
  assert_int_equal(p.count, 1);
  assert_int_equal(p.plan[0].grid.a, 4);
  agoq_coll_pick_in in = pick_at(25);
  assert_int_equal(agoq_coll_plans_pick(&p, &in, NULL), 0);
  assert_int_equal(agoq_coll_plans_make(32, 5, 5, 0, &p, why, sizeof why), -1);
  assert_true(strstr(why, "does not hold") != NULL);
}

/* An exact grid's profile in closed form is the schedule's own count. */
static void test_exact_profile_is_the_count(void** state) {
  (void)state;
  int shapes[][2] = {{2, 1}, {17, 1}, {64, 1}, {4, 2}, {8, 8}, {16, 4}, {32, 2}, {9, 3}, {12, 5}, {32, 32}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    agoq_coll_grid g;
    char why[128];
    assert_int_equal(agoq_coll_grid_make(shapes[i][0] * shapes[i][1], shapes[i][0], shapes[i][1], &g, why, sizeof why),
                     0);
    agoq_coll_profile closed, counted;
    assert_int_equal(agoq_coll_profile_make(&g, &closed), 0);
    assert_int_equal(agoq_coll_profile_count(&g, &counted), 0);
    for (int s = 0; s < AGOQ_COLL_STEPS; s++) {
      assert_float_equal(closed.tx[s], counted.tx[s], 1e-12);
      assert_float_equal(closed.rx[s], counted.rx[s], 1e-12);
      assert_float_equal(closed.msgs[s], counted.msgs[s], 0);
    }
  }
}

/* The choice against the simulation (data/coll_choice_sim.tsv, tools/collnet/sim-choice-
 * table.sh: the reference traffic, 8 calls of 4 MiB in flight): at every size, rate and
 * AGOQ_COLLNET_IO_THREADS simulated on every candidate, the simulated time of the pick is
 * within 5% of the fastest candidate's, with I/O threads too. At 64 ranks on the
 * engine alone that is the mesh at 10 Gbit/s, 32x2 at 25 and 100, 8x8 at 400; at 32, the
 * mesh or a grid of long rows up to 25 Gbit/s. I/O threads take the messages' CPU time off the
 * engine, so the choice moves to longer rows (fewer bytes, more messages): 64 ranks at 400
 * Gbit/s run 16x4 with 2 threads and 32x2 with 4, where the engine alone runs 8x8. */
static void test_choice_matches_the_simulation(void** state) {
  (void)state;
  FILE* f = fopen(AGOQ_CHOICE_TABLE, "r");
  assert_non_null(f);
  enum { MAXR = 512 };
  int rn[MAXR], ra[MAXR], rb[MAXR], rio[MAXR];
  double rg[MAXR], rt[MAXR];
  int rows = 0, calls = 0;
  double call_bytes = 0;
  char line[256];
  while (fgets(line, sizeof line, f) != NULL) {
    /* The traffic the table was measured on must be the model's reference traffic: a table
     * measured on other calls says nothing of the choice. */
    if (sscanf(line, "# traffic: %d calls of %lf bytes", &calls, &call_bytes) == 2) continue;
    if (line[0] == '#') continue;
    assert_true(rows < MAXR);
    rio[rows] = 0; /* the sixth column, AGOQ_COLLNET_IO_THREADS, where given */
    int got = sscanf(line, "%d %d %d %lf %lf %d", &rn[rows], &ra[rows], &rb[rows], &rg[rows], &rt[rows], &rio[rows]);
    if (got != 5 && got != 6) fail_msg("bad row: %s", line);
    rows++;
  }
  fclose(f);
  if (calls != AGOQ_COLL_COST_CALLS || call_bytes != AGOQ_COLL_PICK_CALL_BYTES)
    fail_msg("the table was measured on %d calls of %.0f bytes, the choice is costed on %d of %.0f (measure it again: "
             "tools/collnet/sim-choice-table.sh)", calls, call_bytes, AGOQ_COLL_COST_CALLS, AGOQ_COLL_PICK_CALL_BYTES);
  int cases = 0, not_best = 0, ns = 0, last_n = -1, last_io = -1, io_cases = 0;
  for (int i = 0; i < rows; i++) {
    if (rn[i] == last_n && rio[i] == last_io) continue;
    last_n = rn[i];
    last_io = rio[i];
    ns++;
    agoq_coll_plans p;
    char why[128];
    assert_int_equal(agoq_coll_plans_make(rn[i], 0, 0, 0, &p, why, sizeof why), 0);
    const double rates[] = {10, 25, 100, 400};
    for (int r = 0; r < 4; r++) {
      /* Every candidate's simulated time at this rate. */
      double t[AGOQ_COLL_PLANS_MAX], best = 0;
      for (int c = 0; c < p.count; c++) {
        t[c] = -1;
        for (int j = 0; j < rows; j++)
          if (rn[j] == rn[i] && rio[j] == rio[i] && rg[j] == rates[r] && ra[j] == p.plan[c].grid.a &&
              rb[j] == p.plan[c].grid.b)
            t[c] = rt[j];
        if (t[c] < 0)
          fail_msg("%d ranks, %dx%d at %.0f Gbit/s, %d I/O threads: not in the table", rn[i], p.plan[c].grid.a,
                   p.plan[c].grid.b, rates[r], rio[i]);
        if (c == 0 || t[c] < best) best = t[c];
      }
      agoq_coll_pick_in in = pick_at(rates[r]);
      in.io_threads = rio[i];
      double secs[AGOQ_COLL_PLANS_MAX];
      int k = agoq_coll_plans_pick(&p, &in, secs);
      /* Since the row lead (AGOQ_COLL_ROW_LEAD) the pick is the fastest in every case; before
       * it, it missed by up to 1.3% (64 ranks at 400 Gbit/s, 8x8 behind 16x4, and with 2
       * threads 128 and 48 ranks at 400). With 2 MiB calls the model had missed by 7.9% with
       * threads (64 ranks, 400 Gbit/s), where the threads' CPU time and the NIC's were close
       * and interleaved. */
      const double tol = 1.05;
      if (t[k] > best * tol)
        fail_msg("%d ranks at %.0f Gbit/s, %d I/O threads: the model picks %dx%d (%.1f us), simulated %.1f us; the "
                 "fastest simulated %.1f us", rn[i], rates[r], rio[i], p.plan[k].grid.a, p.plan[k].grid.b,
                 secs[k] * 1e6, t[k], best);
      not_best += t[k] > best;
      cases++;
      io_cases += rio[i] > 0;
      if (rn[i] == 64 && rates[r] == 400) assert_int_equal(p.plan[k].grid.a, rio[i] >= 4 ? 32 : rio[i] >= 2 ? 16 : 8);
      if (rio[i] != 0) continue;
      if (rn[i] == 64) {
        const int want_a[] = {64, 32, 32, 8};
        assert_int_equal(p.plan[k].grid.a, want_a[r]);
      }
      if (rn[i] == 32 && rates[r] <= 25) assert_true(p.plan[k].grid.b <= 2);
    }
  }
  assert_true(ns >= 6 && cases >= 24 && io_cases >= 8);
  printf("%d sizes and I/O thread counts x 4 rates simulated on every candidate: the pick within 5%% of the fastest "
         "in every case (%d of them with I/O threads), the fastest itself in %d\n", ns, io_cases, cases - not_best);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bytes_and_messages_are_the_schedule),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_io_threads),
      cmocka_unit_test(test_within_15_percent_of_the_simulation),
      cmocka_unit_test(test_candidates),
      cmocka_unit_test(test_exact_profile_is_the_count),
      cmocka_unit_test(test_choice_matches_the_simulation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
