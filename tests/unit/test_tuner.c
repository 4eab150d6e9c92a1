/* The tuner: CollNet made cheapest for large AllReduce/ReduceScatter when compression is
 * on and CollNet is usable; NCCL's table untouched otherwise; never an error. Driven
 * through the exported v5/v6 tables (linked in) with NCCL's cost-table layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "abi/agoq_nccl_profiler_v6.h"
#include "abi/agoq_nccl_tuner_v6.h"
#include "collnet/agoq_collnet.h"
#include "core/agoq_log.h"
#include "core/agoq_params.h"
#include "net/agoq_net.h"
#include "tuner/agoq_tuner_cost.h"

extern const ncclTuner_v5_t ncclTunerPlugin_v5;
extern const ncclTuner_v6_t ncclTunerPlugin_v6;
extern const ncclProfiler_v5_t ncclProfiler_v5;
extern const ncclProfiler_v6_t ncclProfiler_v6;

/* ---- a logger that keeps the WARN lines ---- */
static char log_buf[8192];
static int log_warns;

static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                        const char* fmt, ...) __attribute__((format(printf, 5, 6)));
static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                        const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level != NCCL_LOG_WARN) return;
  log_warns++;
  size_t used = strlen(log_buf);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(log_buf + used, sizeof log_buf - used, fmt, ap);
  va_end(ap);
  used = strlen(log_buf);
  if (used + 1 < sizeof log_buf) strcat(log_buf, "\n");
}

static void capture_start(void) {
  log_buf[0] = '\0';
  log_warns = 0;
  agoq_log_set_logger(capture_log);
}

enum { NA = NCCL_NUM_ALGORITHMS_V5, NP = NCCL_NUM_PROTOCOLS_V5 };

/* A plausible NCCL table: every algorithm/protocol usable with positive times, CollNet
 * slower than ring so only the tuner can make NCCL pick it. */
static void table_fill(float t[NA][NP], bool collnet_usable) {
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++) t[a][p] = 100.0f + 10.0f * a + p;
  if (!collnet_usable)
    for (int p = 0; p < NP; p++) {
      t[AGOQ_NCCL_ALGO_COLLNET_CHAIN][p] = AGOQ_NCCL_ALGO_PROTO_IGNORE;
      t[AGOQ_NCCL_ALGO_COLLNET_DIRECT][p] = AGOQ_NCCL_ALGO_PROTO_IGNORE;
    }
}

/* What NCCL's topoGetAlgoInfo does with the table: the smallest non-negative time. */
static void table_pick(float t[NA][NP], int* algo, int* proto) {
  float best = -1.0f;
  *algo = *proto = -1;
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++)
      if (t[a][p] >= 0.0f && (best < 0.0f || t[a][p] < best)) {
        best = t[a][p];
        *algo = a;
        *proto = p;
      }
}

static void* tuner_open_nodes(int version, const char* format, size_t nnodes);

static void* tuner_open(int version, const char* format) { return tuner_open_nodes(version, format, 2); }

static void* tuner_open_nodes(int version, const char* format, size_t nnodes) {
  if (format != NULL)
    setenv("AGOQ_FORMAT", format, 1);
  else
    unsetenv("AGOQ_FORMAT");
  setenv("AGOQ_MIN_BYTES", "1M", 1);
  agoq_params_reset();
  void* ctx = NULL;
  ncclTunerConstants_v5_t constants;
  memset(&constants, 0, sizeof constants);
  ncclNvlDomainInfo_v5_t nvl = {1, 4, 4};
  ncclResult_t r = version == 5
                       ? ncclTunerPlugin_v5.init(&ctx, 42, 8 * nnodes / 2, nnodes, NULL, &nvl, &constants)
                       : ncclTunerPlugin_v6.init(&ctx, 42, 8 * nnodes / 2, nnodes, NULL, &nvl, &constants);
  assert_int_equal(r, ncclSuccess);
  assert_non_null(ctx);
  return ctx;
}

static void tuner_close(int version, void* ctx) {
  assert_int_equal(version == 5 ? ncclTunerPlugin_v5.finalize(ctx) : ncclTunerPlugin_v6.finalize(ctx),
                   ncclSuccess);
  unsetenv("AGOQ_FORMAT");
  unsetenv("AGOQ_MIN_BYTES");
  agoq_params_reset();
}

static void get_info(int version, void* ctx, ncclFunc_t f, size_t nbytes, float t[NA][NP]) {
  int nch = 0;
  ncclResult_t r =
      version == 5 ? ncclTunerPlugin_v5.getCollInfo(ctx, f, nbytes, 1, (float**)t, NA, NP, 0, &nch)
                   : ncclTunerPlugin_v6.getCollInfo(ctx, f, nbytes, 1, (float**)t, NA, NP, 0, &nch);
  assert_int_equal(r, ncclSuccess);
  assert_int_equal(nch, 0); /* the channel count stays NCCL's */
}

/* NCCL's table for one collective of nbytes on 8 ranks over links of `gbit`: ring and tree
 * at the link's time for the bytes a ring moves, CollNet's rows a fifth slower (as NCCL
 * models a CollNet network of the same speed), everything else unusable. */
static void table_link(float t[NA][NP], size_t nbytes, double gbit) {
  double ring = 2.0 * 7 / 8 * (double)nbytes * 8 / (gbit * 1e3); /* us */
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++) t[a][p] = AGOQ_NCCL_ALGO_PROTO_IGNORE;
  for (int p = 0; p < NP; p++) {
    t[AGOQ_NCCL_ALGO_RING][p] = (float)(ring * (p == AGOQ_NCCL_PROTO_SIMPLE ? 1.0 : 2.0 + p));
    t[AGOQ_NCCL_ALGO_TREE][p] = (float)(ring * (p == AGOQ_NCCL_PROTO_SIMPLE ? 1.1 : 2.5 + p));
  }
  t[AGOQ_NCCL_ALGO_COLLNET_CHAIN][AGOQ_NCCL_PROTO_SIMPLE] = (float)(ring * 1.2);
  t[AGOQ_NCCL_ALGO_COLLNET_DIRECT][AGOQ_NCCL_PROTO_SIMPLE] = (float)(ring * 1.25);
}

/* The decision for one collective: the entry NCCL then picks, and the CollNet entry's new
 * time checked against the model's own formula. */
static int decide(int version, void* ctx, ncclFunc_t f, size_t nbytes, double gbit, const char* mbps) {
  float t[NA][NP], ref[NA][NP];
  table_link(t, nbytes, gbit);
  table_link(ref, nbytes, gbit);
  get_info(version, ctx, f, nbytes, t);
  double ratio = agoq_tuner_wire_ratio(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16, 128, nbytes);
  /* agoq's schedule for the tuner's 2 nodes (tuner_open), at the rate NCCL's CollNet entry
   * implies: on 2 nodes the frames cross the link once, where NCCL's CollNet counts the
   * buffer twice. */
  agoq_tuner_sched sched;
  agoq_tuner_sched_setting(2, &sched);
  assert_true(sched.ok);
  double collnet = ref[AGOQ_NCCL_ALGO_COLLNET_CHAIN][AGOQ_NCCL_PROTO_SIMPLE];
  double net = agoq_tuner_network_us(&sched, f == ncclFuncAllReduce, AGOQ_DTYPE_BF16, ratio, (double)nbytes, collnet, NULL);
  double once = collnet * ratio / (f == ncclFuncAllReduce ? 2.0 : 4.0); /* a ReduceScatter: half */
  assert_true(net > once * 0.97 && net < once * 1.03);
  double want = net + agoq_tuner_codec_us(nbytes, strtod(mbps, NULL));
  assert_float_equal(t[AGOQ_NCCL_ALGO_COLLNET_CHAIN][AGOQ_NCCL_PROTO_SIMPLE], (float)want, want * 1e-6);
  /* Nothing outside CollNet changed. */
  for (int a = 0; a < NA; a++)
    if (a != AGOQ_NCCL_ALGO_COLLNET_CHAIN && a != AGOQ_NCCL_ALGO_COLLNET_DIRECT)
      assert_memory_equal(t[a], ref[a], sizeof t[a]);
  int a, p;
  table_pick(t, &a, &p);
  return a;
}

static void* tuner_open_codec(int version, const char* mbps) {
  setenv("AGOQ_CODEC_MBPS", mbps, 1);
  return tuner_open(version, "int8");
}

/* 64 MiB of gradients on 25 Gbit/s Ethernet with a GPU-speed codec: the wire saves more than
 * the codec costs, and NCCL picks agoq's CollNet (AllReduce and ReduceScatter). */
static void test_compresses_where_the_network_is_slow(void** state) {
  (void)state;
  for (int version = 5; version <= 6; version++) {
    void* ctx = tuner_open_codec(version, "20000");
    assert_int_equal(decide(version, ctx, ncclFuncAllReduce, 64u << 20, 25, "20000"), AGOQ_NCCL_ALGO_COLLNET_CHAIN);
    assert_int_equal(decide(version, ctx, ncclFuncReduceScatter, 64u << 20, 25, "20000"),
                     AGOQ_NCCL_ALGO_COLLNET_CHAIN);
    /* Chain unusable, direct usable: direct, rescaled the same way. */
    float t[NA][NP];
    table_link(t, 64u << 20, 25);
    float direct = t[AGOQ_NCCL_ALGO_COLLNET_DIRECT][AGOQ_NCCL_PROTO_SIMPLE];
    for (int p = 0; p < NP; p++) t[AGOQ_NCCL_ALGO_COLLNET_CHAIN][p] = AGOQ_NCCL_ALGO_PROTO_IGNORE;
    get_info(version, ctx, ncclFuncAllReduce, 64u << 20, t);
    int a, p;
    table_pick(t, &a, &p);
    assert_int_equal(a, AGOQ_NCCL_ALGO_COLLNET_DIRECT);
    assert_int_equal(p, AGOQ_NCCL_PROTO_SIMPLE);
    assert_true(t[AGOQ_NCCL_ALGO_COLLNET_DIRECT][AGOQ_NCCL_PROTO_SIMPLE] < direct);
    tuner_close(version, ctx);
  }
  unsetenv("AGOQ_CODEC_MBPS");
}

/* The estimate is agoq's schedule for the communicator's node count: on 64 nodes at 400
 * Gbit/s the one-level mesh (AGOQ_COLLNET_GRID=64x1) is bound by its 252 messages per chunk,
 * the automatic 8x8 grid by its 56, and either costs more than the same bytes on 2 nodes. */
static void test_estimate_follows_the_schedule(void** state) {
  (void)state;
  float t[NA][NP];
  double est[3];
  const char* grids[3] = {"auto", "64x1", "auto"};
  size_t nodes[3] = {2, 64, 64};
  for (int i = 0; i < 3; i++) {
    setenv("AGOQ_COLLNET_GRID", grids[i], 1);
    setenv("AGOQ_COLLNET_CHUNK", "1M", 1);
    setenv("AGOQ_CODEC_MBPS", "1000000", 1); /* the network's part decides */
    void* ctx = tuner_open_nodes(6, "int8", nodes[i]);
    table_link(t, 64u << 20, 400);
    get_info(6, ctx, ncclFuncAllReduce, 64u << 20, t);
    est[i] = t[AGOQ_NCCL_ALGO_COLLNET_CHAIN][AGOQ_NCCL_PROTO_SIMPLE];
    tuner_close(6, ctx);
  }
  unsetenv("AGOQ_COLLNET_GRID");
  unsetenv("AGOQ_COLLNET_CHUNK");
  unsetenv("AGOQ_CODEC_MBPS");
  agoq_params_reset();
  assert_true(est[1] > 3.0 * est[2]);
  assert_true(est[2] > est[0]);
}

/* Above 16 nodes the group runs the mesh or a grid by its link rate (agoq_coll_plans_pick),
 * and the estimate costs the one it would run at the rate NCCL's CollNet estimate implies:
 * 32 nodes, the mesh at 25 Gbit/s, the 16x2 grid at 400; a named grid at any rate. */
static void test_estimate_costs_the_schedule_the_rate_chooses(void** state) {
  (void)state;
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_tuner_sched sched;
  agoq_tuner_sched_setting(32, &sched);
  assert_true(sched.ok);
  assert_int_equal(sched.plans.count, 3); /* 32x1, 8x4, 16x2 */
  double ratio = agoq_tuner_wire_ratio(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16, 128, 64u << 20);
  double nbytes = 64.0 * 1048576;
  agoq_coll_grid grid;
  double slow = agoq_tuner_network_us(&sched, true, AGOQ_DTYPE_BF16, ratio, nbytes, 2 * nbytes / (25e9 / 8) * 1e6, &grid);
  assert_true(slow > 0);
  assert_int_equal(grid.a, 32);
  assert_int_equal(grid.b, 1);
  double fast = agoq_tuner_network_us(&sched, true, AGOQ_DTYPE_BF16, ratio, nbytes, 2 * nbytes / (400e9 / 8) * 1e6, &grid);
  assert_true(fast > 0 && fast < slow);
  assert_int_equal(grid.a, 16);
  assert_int_equal(grid.b, 2);
  /* 64 nodes at 400 Gbit/s: the square 8x8 on the engine alone (fewest messages); with 2 I/O
   * threads the messages cost half, so the longer rows of 16x4 (fewer bytes) win, and the
   * estimate is lower. */
  agoq_tuner_sched_setting(64, &sched);
  double engine = agoq_tuner_network_us(&sched, true, AGOQ_DTYPE_BF16, ratio, nbytes, 2 * nbytes / (400e9 / 8) * 1e6,
                                        &grid);
  assert_int_equal(grid.a, 8);
  setenv("AGOQ_COLLNET_IO_THREADS", "2", 1);
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_tuner_sched_setting(64, &sched);
  double threads = agoq_tuner_network_us(&sched, true, AGOQ_DTYPE_BF16, ratio, nbytes, 2 * nbytes / (400e9 / 8) * 1e6,
                                         &grid);
  assert_int_equal(grid.a, 16);
  assert_int_equal(grid.b, 4);
  assert_true(threads > 0 && threads < engine);
  unsetenv("AGOQ_COLLNET_IO_THREADS");
  setenv("AGOQ_COLLNET_GRID", "4x8", 1);
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_tuner_sched_setting(32, &sched);
  assert_int_equal(sched.plans.count, 1);
  (void)agoq_tuner_network_us(&sched, true, AGOQ_DTYPE_BF16, ratio, nbytes, 2 * nbytes / (25e9 / 8) * 1e6, &grid);
  assert_int_equal(grid.a, 4);
  unsetenv("AGOQ_COLLNET_GRID");
  agoq_params_reset();
}

/* Where the network is not the bottleneck (400 Gbit/s), or the codec is slow (a CPU at
 * 2 GB/s on 25 Gbit/s), compression would make the collective slower: NCCL's ring stands. */
static void test_keeps_nccl_where_compression_does_not_pay(void** state) {
  (void)state;
  void* ctx = tuner_open_codec(6, "20000");
  assert_int_equal(decide(6, ctx, ncclFuncAllReduce, 64u << 20, 400, "20000"), AGOQ_NCCL_ALGO_RING);
  tuner_close(6, ctx);
  ctx = tuner_open_codec(5, "2000");
  assert_int_equal(decide(5, ctx, ncclFuncAllReduce, 64u << 20, 25, "2000"), AGOQ_NCCL_ALGO_RING);
  assert_int_equal(decide(5, ctx, ncclFuncReduceScatter, 64u << 20, 25, "2000"), AGOQ_NCCL_ALGO_RING);
  tuner_close(5, ctx);
  unsetenv("AGOQ_CODEC_MBPS");
}

/* Unset, AGOQ_CODEC_MBPS is its fixed default on every rank: the model never takes this
 * process's measurement, which would differ between ranks and split NCCL's choice of
 * algorithm (decide() checks the CollNet entry against the formula at 5000 MB/s). At that
 * speed compression pays on 10 Gbit/s and not on 25 Gbit/s in this cost table. */
static void test_codec_speed_is_the_same_on_every_rank(void** state) {
  (void)state;
  unsetenv("AGOQ_CODEC_MBPS");
  void* ctx = tuner_open(6, "int8");
  assert_int_equal(decide(6, ctx, ncclFuncAllReduce, 64u << 20, 10, "5000"), AGOQ_NCCL_ALGO_COLLNET_CHAIN);
  assert_int_equal(decide(6, ctx, ncclFuncAllReduce, 64u << 20, 25, "5000"), AGOQ_NCCL_ALGO_RING);
  tuner_close(6, ctx);
  /* 0 no longer means "measure": it is invalid, reported by the loader, and the tuner then
   * steers nothing (NCCL's table unchanged). */
  setenv("AGOQ_CODEC_MBPS", "0", 1);
  ctx = tuner_open(6, "int8");
  float t[NA][NP], ref[NA][NP];
  table_link(t, 64u << 20, 10);
  table_link(ref, 64u << 20, 10);
  get_info(6, ctx, ncclFuncAllReduce, 64u << 20, t);
  assert_memory_equal(t, ref, sizeof t);
  tuner_close(6, ctx);
  unsetenv("AGOQ_CODEC_MBPS");
}

/* The wire ratios the model uses are the frame layout's: int8 with one fp32 scale per 128
 * elements is 8.25 bits per element, plus the escape bitmap (a bit per block) and one
 * header: 0.5161 of bf16, 0.2581 of fp32. */
static void test_wire_ratio(void** state) {
  (void)state;
  size_t n = 1u << 20;
  double bf16 = agoq_tuner_wire_ratio(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16, 128, n * 2);
  double fp32 = agoq_tuner_wire_ratio(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP32, 128, n * 4);
  assert_float_equal(bf16, (8.25 + 1.0 / 128) / 16, 1e-4);
  assert_float_equal(fp32, (8.25 + 1.0 / 128) / 32, 1e-4);
  assert_true(agoq_tuner_wire_ratio(AGOQ_FORMAT_INT4, AGOQ_DTYPE_BF16, 128, n * 2) < bf16);
  assert_float_equal(agoq_tuner_wire_ratio(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16, 128, 1), 1.0, 0); /* no element */
  assert_float_equal(agoq_tuner_codec_us(1000000, 1000), 2000.0, 1e-9);
  assert_true(agoq_tuner_codec_us(1, 0) > 1e300); /* no speed: never chosen */
}

/* The measurement is a rate over the clock it is given: 4 rounds of 1 MiB of bf16 (quantize
 * and dequantize) over 2 ms of that clock is 2097.152 MB/s, whatever this machine does. */
static double fake_t;
static double fake_clock(void) {
  double t = fake_t;
  fake_t += 0.002;
  return t;
}

static void test_codec_measured_with_the_clock_given(void** state) {
  (void)state;
  fake_t = 10.0;
  assert_float_equal(agoq_tuner_codec_mbps_measure(fake_clock, 4), 4.0 * 1048576 / 0.002 / 1e6, 1e-6);
  assert_float_equal(agoq_tuner_codec_mbps_measure(fake_clock, 0), 0.0, 0);
}

static void expect_unchanged(int version, void* ctx, ncclFunc_t f, size_t nbytes, bool usable) {
  float t[NA][NP], ref[NA][NP];
  table_fill(t, usable);
  table_fill(ref, usable);
  get_info(version, ctx, f, nbytes, t);
  assert_memory_equal(t, ref, sizeof t);
}

static void test_unchanged_otherwise(void** state) {
  (void)state;
  void* ctx = tuner_open(5, "int8");
  expect_unchanged(5, ctx, ncclFuncAllGather, 64 << 20, true);
  expect_unchanged(5, ctx, ncclFuncBroadcast, 64 << 20, true);
  expect_unchanged(5, ctx, ncclFuncReduce, 64 << 20, true);
  expect_unchanged(5, ctx, ncclFuncAllReduce, (1 << 20) - 1, true); /* below AGOQ_MIN_BYTES */
  expect_unchanged(5, ctx, ncclFuncAllReduce, 64 << 20, false);     /* CollNet unusable */
  expect_unchanged(5, ctx, ncclFuncReduceScatter, 64 << 20, false);
  /* A table without the SIMPLE column or the CollNet rows is left alone (bounds). */
  float small[2][2] = {{1, 2}, {3, 4}};
  int nch = 0;
  assert_int_equal(ncclTunerPlugin_v5.getCollInfo(ctx, ncclFuncAllReduce, 64 << 20, 1,
                                                  (float**)small, 2, 2, 0, &nch),
                   ncclSuccess);
  assert_true(small[0][0] == 1 && small[0][1] == 2 && small[1][0] == 3 && small[1][1] == 4);
  tuner_close(5, ctx);

  ctx = tuner_open(6, "none");
  expect_unchanged(6, ctx, ncclFuncAllReduce, 64 << 20, true);
  expect_unchanged(6, ctx, ncclFuncReduceScatter, 64 << 20, true);
  tuner_close(6, ctx);

  /* An invalid AGOQ_FORMAT disables steering; it does not fail the communicator. */
  ctx = tuner_open(5, "int9");
  expect_unchanged(5, ctx, ncclFuncAllReduce, 64 << 20, true);
  tuner_close(5, ctx);
}

static void test_never_fails(void** state) {
  (void)state;
  float t[NA][NP];
  table_fill(t, true);
  int nch = 0;
  assert_int_equal(ncclTunerPlugin_v5.getCollInfo(NULL, ncclFuncAllReduce, 64 << 20, 1,
                                                  (float**)t, NA, NP, 0, &nch),
                   ncclSuccess);
  void* ctx = tuner_open(6, "int8");
  assert_int_equal(ncclTunerPlugin_v6.getCollInfo(ctx, ncclFuncAllReduce, 64 << 20, 1, NULL, NA,
                                                  NP, 0, &nch),
                   ncclSuccess);
  /* v6 getChunkSize: not CollNetChain, NCCL's value stays (test_chunk_size_raised). */
  size_t chunk = 131072;
  assert_non_null(ncclTunerPlugin_v6.getChunkSize);
  assert_int_equal(ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 64 << 20,
                                                   AGOQ_NCCL_ALGO_RING, AGOQ_NCCL_PROTO_SIMPLE,
                                                   4, &chunk),
                   ncclSuccess);
  assert_int_equal(chunk, 131072);
  tuner_close(6, ctx);
  assert_int_equal(ncclTunerPlugin_v5.finalize(NULL), ncclSuccess);
  assert_string_equal(ncclTunerPlugin_v5.name, "AGOQ");
  assert_string_equal(ncclTunerPlugin_v6.name, "AGOQ");
}

/* v6 getChunkSize on CollNetChain, 4 GPUs per node (tuner_open: 8 ranks on 2 nodes): NCCL's
 * chunk doubled up to its step while each of the 8 channels keeps 8 chunks per GPU of the
 * chain (32); every other case keeps NCCL's value. */
static size_t chain_chunk(void* ctx, size_t nbytes, int algo, int proto, size_t nccl) {
  size_t chunk = nccl;
  assert_int_equal(ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, nbytes, algo, proto, 8, &chunk),
                   ncclSuccess);
  return chunk;
}

static void test_chunk_size_raised(void** state) {
  (void)state;
  const int chain = AGOQ_NCCL_ALGO_COLLNET_CHAIN, simple = AGOQ_NCCL_PROTO_SIMPLE;
  unsetenv("NCCL_BUFFSIZE");
  void* ctx = tuner_open(6, "int8");
  /* 256 MiB: 512 KiB (the step of NCCL's 4 MiB buffer) leaves 64 chunks per channel. */
  assert_int_equal(chain_chunk(ctx, 256u << 20, chain, simple, 131072), 524288);
  /* 64 MiB: 256 KiB leaves 32; 512 KiB would leave 16. */
  assert_int_equal(chain_chunk(ctx, 64u << 20, chain, simple, 131072), 262144);
  /* 8 MiB: already 16 chunks of NCCL's 64 KiB per channel; 128 KiB would leave 8. */
  assert_int_equal(chain_chunk(ctx, 8u << 20, chain, simple, 65536), 65536);
  /* Other algorithms and protocols: NCCL's. */
  assert_int_equal(chain_chunk(ctx, 256u << 20, AGOQ_NCCL_ALGO_COLLNET_DIRECT, simple, 131072), 131072);
  assert_int_equal(chain_chunk(ctx, 256u << 20, AGOQ_NCCL_ALGO_RING, simple, 131072), 131072);
  assert_int_equal(chain_chunk(ctx, 256u << 20, chain, AGOQ_NCCL_PROTO_SIMPLE - 1, 131072), 131072);
  tuner_close(6, ctx);
  /* NCCL_BUFFSIZE=8 MiB, read as NCCL reads it: steps of 1 MiB. */
  setenv("NCCL_BUFFSIZE", "0x800000", 1);
  ctx = tuner_open(6, "int8");
  assert_int_equal(chain_chunk(ctx, 1u << 30, chain, simple, 262144), 1048576);
  tuner_close(6, ctx);
  unsetenv("NCCL_BUFFSIZE");
  /* One node: no CollNet network to spare messages on. */
  ctx = tuner_open_nodes(6, "int8", 1);
  assert_int_equal(chain_chunk(ctx, 256u << 20, chain, simple, 131072), 131072);
  tuner_close(6, ctx);
}

/* ---- the "compression inactive" WARN: only when known true ---- */

#define COMM 42 /* tuner_open's communicator */

/* NCCL's profiler as ncclEnqueueCheck drives it: a CollApi event on the calling thread
 * before the tuner is asked at group end. */
static void* prof_open(uint64_t comm_id) {
  void* pctx = NULL;
  int mask = 0;
  assert_int_equal(ncclProfiler_v5.init(&pctx, comm_id, &mask, "c", 2, 8, 0, NULL), ncclSuccess);
  assert_non_null(pctx);
  return pctx;
}

static void coll_api(int version, void* pctx, const char* func, const char* dtype, size_t count) {
  void* h = (void*)&h;
  if (version == 5) {
    ncclProfilerEventDescr_v5_t d = {.type = ncclProfileCollApi};
    d.collApi.func = func;
    d.collApi.datatype = dtype;
    d.collApi.count = count;
    assert_int_equal(ncclProfiler_v5.startEvent(pctx, &h, &d), ncclSuccess);
  } else {
    ncclProfilerEventDescr_v6_t d = {.type = ncclProfileCollApi};
    d.collApi.func = func;
    d.collApi.datatype = dtype;
    d.collApi.count = count;
    assert_int_equal(ncclProfiler_v6.startEvent(pctx, &h, &d), ncclSuccess);
  }
  assert_null(h); /* nothing for NCCL to stop */
}

static void allreduce(int version, void* ctx, void* pctx, const char* dtype, size_t count,
                      size_t size, bool usable) {
  float t[NA][NP];
  coll_api(version, pctx, "AllReduce", dtype, count);
  table_fill(t, usable);
  get_info(version, ctx, ncclFuncAllReduce, count * size, t);
}

static void test_warns_once_for_float_allreduce_without_collnet(void** state) {
  (void)state;
  static const struct {
    const char* name;
    size_t size;
    const char* shown;
  } floats[] = {{"ncclFloat32", 4, "fp32"}, {"ncclBfloat16", 2, "bf16"}, {"ncclFloat16", 2, "fp16"}};
  unsetenv("NCCL_COLLNET_ENABLE");
  for (int version = 5; version <= 6; version++)
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
      void* pctx = prof_open(COMM);
      void* ctx = tuner_open(version, "int8");
      capture_start();
      allreduce(version, ctx, pctx, floats[i].name, (64u << 20) / floats[i].size, floats[i].size, false);
      assert_int_equal(log_warns, 1);
      assert_non_null(strstr(log_buf, "gradient compression is inactive"));
      assert_non_null(strstr(log_buf, floats[i].shown));
      assert_non_null(strstr(log_buf, "NCCL_COLLNET_ENABLE was unset")); /* the reason */
      assert_non_null(strstr(log_buf, "use_sharp=True"));                /* Megatron's way */
      assert_non_null(strstr(log_buf, "NCCL_COLLNET_ENABLE=1"));        /* the fix */
      assert_non_null(strstr(log_buf, "ncclConfig_t.collnetEnable=1"));
      assert_non_null(strstr(log_buf, "2 or more nodes"));
      /* Once per communicator. */
      allreduce(version, ctx, pctx, floats[i].name, (32u << 20) / floats[i].size, floats[i].size, false);
      allreduce(version, ctx, pctx, floats[i].name, (64u << 20) / floats[i].size, floats[i].size, false);
      assert_int_equal(log_warns, 1);
      tuner_close(version, ctx);
      /* Another communicator says it again. */
      ctx = tuner_open(version, "int8");
      allreduce(version, ctx, pctx, floats[i].name, (64u << 20) / floats[i].size, floats[i].size, false);
      assert_int_equal(log_warns, 2);
      tuner_close(version, ctx);
      assert_int_equal(ncclProfiler_v5.finalize(pctx), ncclSuccess);
    }
  /* The reason follows NCCL's reading of NCCL_COLLNET_ENABLE. */
  setenv("NCCL_COLLNET_ENABLE", "0", 1);
  void* pctx = prof_open(COMM);
  void* ctx = tuner_open(5, "int8");
  capture_start();
  allreduce(5, ctx, pctx, "ncclBfloat16", 1 << 24, 2, false);
  assert_int_equal(log_warns, 1);
  assert_non_null(strstr(log_buf, "NCCL_COLLNET_ENABLE=\"0\""));
  tuner_close(5, ctx);
  setenv("NCCL_COLLNET_ENABLE", " 1", 1); /* NCCL reads 1: CollNet was asked for */
  ctx = tuner_open(5, "int8");
  capture_start();
  allreduce(5, ctx, pctx, "ncclBfloat16", 1 << 24, 2, false);
  assert_int_equal(log_warns, 1);
  assert_non_null(strstr(log_buf, "NCCL did not set CollNet up"));
  tuner_close(5, ctx);
  /* NCCL reads the variable when it creates the communicator, which is when the tuner is
   * initialised; what the program does to it afterwards (Megatron-Core deletes it after
   * creating its data-parallel group) changes nothing for this communicator. */
  setenv("NCCL_COLLNET_ENABLE", "1", 1);
  ctx = tuner_open(5, "int8");
  unsetenv("NCCL_COLLNET_ENABLE");
  capture_start();
  allreduce(5, ctx, pctx, "ncclBfloat16", 1 << 24, 2, false);
  assert_int_equal(log_warns, 1);
  assert_non_null(strstr(log_buf, "NCCL did not set CollNet up"));
  assert_null(strstr(log_buf, "was unset"));
  tuner_close(5, ctx);
  ctx = tuner_open(5, "int8"); /* unset at creation, set later */
  setenv("NCCL_COLLNET_ENABLE", "1", 1);
  capture_start();
  allreduce(5, ctx, pctx, "ncclBfloat16", 1 << 24, 2, false);
  assert_int_equal(log_warns, 1);
  assert_non_null(strstr(log_buf, "NCCL_COLLNET_ENABLE was unset when NCCL created"));
  tuner_close(5, ctx);
  unsetenv("NCCL_COLLNET_ENABLE");
  assert_int_equal(ncclProfiler_v5.finalize(pctx), ncclSuccess);
  agoq_log_set_logger(NULL);
}

static void test_never_warns_unless_known_true(void** state) {
  (void)state;
  unsetenv("NCCL_COLLNET_ENABLE");
  void* pctx = prof_open(COMM);
  void* other = prof_open(COMM + 1);
  void* ctx = tuner_open(5, "int8");
  capture_start();
  allreduce(5, ctx, pctx, "ncclFloat32", 1 << 24, 4, true); /* CollNet available: steered */
  static const char* const ints[] = {"ncclInt8", "ncclInt32", "ncclUint32", "ncclInt64",
                                     "ncclUint64", "ncclFloat64", "ncclFloat8e4m3"};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    allreduce(5, ctx, pctx, ints[i], 1 << 20, 8, false); /* type not quantized */
  allreduce(5, ctx, pctx, "ncclFloat32", (1 << 20) / 4 - 1, 4, false); /* below AGOQ_MIN_BYTES */
  /* Type unknown to the tuner: no CollApi seen (another profiler), another communicator's
   * call, a size that matches no call, a non-AllReduce API call of that size. */
  float t[NA][NP];
  table_fill(t, false);
  get_info(5, ctx, ncclFuncAllReduce, 96 << 20, t);
  coll_api(5, other, "AllReduce", "ncclFloat32", 1 << 24);
  table_fill(t, false);
  get_info(5, ctx, ncclFuncAllReduce, (size_t)4 << 24, t);
  coll_api(5, pctx, "Broadcast", "ncclFloat32", 3 << 20);
  table_fill(t, false);
  get_info(5, ctx, ncclFuncAllReduce, (size_t)12 << 20, t);
  /* ReduceScatter: not the gradient AllReduce the WARN is about. */
  table_fill(t, false);
  get_info(5, ctx, ncclFuncReduceScatter, 64 << 20, t);
  assert_int_equal(log_warns, 0);
  tuner_close(5, ctx);
  /* Compression off: nothing is inactive. */
  ctx = tuner_open(6, "none");
  allreduce(6, ctx, pctx, "ncclBfloat16", 1 << 24, 2, false);
  assert_int_equal(log_warns, 0);
  tuner_close(6, ctx);
  assert_int_equal(ncclProfiler_v5.finalize(pctx), ncclSuccess);
  assert_int_equal(ncclProfiler_v5.finalize(other), ncclSuccess);
  agoq_log_set_logger(NULL);
}

/* Init (net and CollNet) does not guess: with NCCL_COLLNET_ENABLE unset a program may still
 * enable CollNet through ncclConfig_t.collnetEnable, so nothing is said there. */
static void test_init_does_not_warn(void** state) {
  (void)state;
  unsetenv("NCCL_COLLNET_ENABLE");
  unsetenv("AGOQ_FORMAT");
  agoq_params_reset();
  capture_start();
  void* net = NULL;
  void* coll = NULL;
  assert_int_equal(agoq_net_init(&net, COMM, NCCL_NET_TRAFFIC_CLASS_UNDEF, capture_log, NULL),
                   ncclSuccess);
  assert_int_equal(agoq_coll_init(&coll, COMM, capture_log), ncclSuccess);
  assert_int_equal(log_warns, 0);
  assert_null(strstr(log_buf, "inactive"));
  assert_int_equal(agoq_coll_finalize(coll), ncclSuccess);
  assert_int_equal(agoq_net_finalize(net), ncclSuccess);
  agoq_log_set_logger(NULL);
}

/* A type the profiler established as an integer goes exact on CollNet: NCCL's table holds. */
static void test_integer_allreduce_untouched(void** state) {
  (void)state;
  void* ctx = tuner_open_codec(6, "20000");
  void* pctx = prof_open(COMM);
  coll_api(6, pctx, "AllReduce", "ncclInt32", 16u << 20);
  float t[NA][NP], ref[NA][NP];
  table_link(t, 64u << 20, 25);
  table_link(ref, 64u << 20, 25);
  get_info(6, ctx, ncclFuncAllReduce, 64u << 20, t);
  assert_memory_equal(t, ref, sizeof t);
  assert_int_equal(ncclProfiler_v6.finalize(pctx), ncclSuccess);
  tuner_close(6, ctx);
  unsetenv("AGOQ_CODEC_MBPS");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_compresses_where_the_network_is_slow),
      cmocka_unit_test(test_keeps_nccl_where_compression_does_not_pay),
      cmocka_unit_test(test_estimate_follows_the_schedule),
      cmocka_unit_test(test_estimate_costs_the_schedule_the_rate_chooses),
      cmocka_unit_test(test_codec_speed_is_the_same_on_every_rank),
      cmocka_unit_test(test_wire_ratio),
      cmocka_unit_test(test_codec_measured_with_the_clock_given),
      cmocka_unit_test(test_integer_allreduce_untouched),
      cmocka_unit_test(test_unchanged_otherwise),
      cmocka_unit_test(test_never_fails),
      cmocka_unit_test(test_chunk_size_raised),
      cmocka_unit_test(test_warns_once_for_float_allreduce_without_collnet),
      cmocka_unit_test(test_never_warns_unless_known_true),
      cmocka_unit_test(test_init_does_not_warn),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
