/* The tuner: CollNet made cheapest for large AllReduce/ReduceScatter when compression is
 * on and CollNet is usable; NCCL's table untouched otherwise; never an error. Driven
 * through the exported v5/v6 tables (linked in) with NCCL's cost-table layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "abi/agoq_nccl_tuner_v6.h"
#include "core/agoq_params.h"

extern const ncclTuner_v5_t ncclTunerPlugin_v5;
extern const ncclTuner_v6_t ncclTunerPlugin_v6;

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

static void* tuner_open(int version, const char* format) {
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
                       ? ncclTunerPlugin_v5.init(&ctx, 42, 8, 2, NULL, &nvl, &constants)
                       : ncclTunerPlugin_v6.init(&ctx, 42, 8, 2, NULL, &nvl, &constants);
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

static void test_collnet_cheapest_above_threshold(void** state) {
  (void)state;
  for (int version = 5; version <= 6; version++) {
    void* ctx = tuner_open(version, "int8");
    const ncclFunc_t funcs[] = {ncclFuncAllReduce, ncclFuncReduceScatter};
    for (int i = 0; i < 2; i++) {
      float t[NA][NP];
      table_fill(t, true);
      get_info(version, ctx, funcs[i], 1 << 20, t);
      int a, p;
      table_pick(t, &a, &p);
      assert_int_equal(a, AGOQ_NCCL_ALGO_COLLNET_CHAIN);
      assert_int_equal(p, AGOQ_NCCL_PROTO_SIMPLE);
      /* Only that entry changed. */
      float ref[NA][NP];
      table_fill(ref, true);
      ref[AGOQ_NCCL_ALGO_COLLNET_CHAIN][AGOQ_NCCL_PROTO_SIMPLE] = 0.0f;
      assert_memory_equal(t, ref, sizeof t);
    }
    /* Chain unusable, direct usable: direct. */
    float t[NA][NP];
    table_fill(t, true);
    for (int p = 0; p < NP; p++) t[AGOQ_NCCL_ALGO_COLLNET_CHAIN][p] = AGOQ_NCCL_ALGO_PROTO_IGNORE;
    get_info(version, ctx, ncclFuncAllReduce, 64 << 20, t);
    int a, p;
    table_pick(t, &a, &p);
    assert_int_equal(a, AGOQ_NCCL_ALGO_COLLNET_DIRECT);
    assert_int_equal(p, AGOQ_NCCL_PROTO_SIMPLE);
    tuner_close(version, ctx);
  }
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
  /* v6 getChunkSize: no opinion, NCCL's value stays. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_collnet_cheapest_above_threshold),
      cmocka_unit_test(test_unchanged_otherwise),
      cmocka_unit_test(test_never_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
