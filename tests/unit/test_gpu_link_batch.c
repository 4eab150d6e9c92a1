/* A GPU link's batches (plugin/gpu/agoq_gpu.h), over the CUDA emulation: only the slots that
 * have batch memory take them, within their item and result counts; a slot's table is taken
 * from its batch until a mark after it is seen done (its kernels may read the table until
 * then, and the emulation runs work only when asked, as late as a GPU may); slots are
 * independent; each item gets its result, and the counters say one call of k items. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "agoq_frame.h"
#include "gpu/agoq_gpu.h"

enum { SLOTS = 4, BATCH_FROM = 2, ITEMS = 3, PARTS = 4, N = 1000 };

static const agoq_codec_params params = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 32};

typedef struct {
  agoq_gpu_link* l;
  uint8_t *src, *frames;
  size_t cap;
  agoq_gpu_encode_item items[ITEMS + 1];
} env;

static void env_open(env* e) {
  memset(e, 0, sizeof *e);
  agoq_gpu_link_config lc = {.staging = 1u << 16, .slots = SLOTS, .parts = PARTS, .timed = 8,
                             .batch_from = BATCH_FROM, .batch_items = ITEMS, .batch_block = 32,
                             .batch_max_n = N, .pool_net_dev = -1};
  assert_int_equal(agoq_gpu_link_create(0, &lc, &e->l), ncclSuccess);
  e->cap = agoq_frame_size_max(&params, N);
  assert_int_equal(cudaMalloc((void**)&e->src, N * 2), cudaSuccess);
  assert_int_equal(cudaMemset(e->src, 0x3c, N * 2), cudaSuccess);
  assert_int_equal(cudaMalloc((void**)&e->frames, (ITEMS + 1) * 2 * e->cap), cudaSuccess);
}

static void env_close(env* e) {
  agoq_gpu_link_destroy(e->l);
  cudaFree(e->src);
  cudaFree(e->frames);
}

/* k items of N elements; set (0 or 1) picks one of two sets of frames. */
static const agoq_gpu_encode_item* items_of(env* e, size_t k, int set) {
  for (size_t i = 0; i < k; i++)
    e->items[i] = (agoq_gpu_encode_item){
        .src = e->src, .n = N, .frame = e->frames + ((size_t)set * (ITEMS + 1) + i) * e->cap, .cap = e->cap};
  return e->items;
}

static ncclResult_t encode(env* e, uint32_t slot, int part0, size_t k, int set) {
  return agoq_gpu_frame_encode_batch(e->l, slot, part0, &params, items_of(e, k, set), k);
}

static void poll_done(env* e, uint32_t slot) {
  bool done = false;
  for (int i = 0; i < 1000 && !done; i++) assert_int_equal(agoq_gpu_poll(e->l, slot, &done), ncclSuccess);
  assert_true(done);
}

static void test_only_batch_slots_within_their_sizes(void** state) {
  (void)state;
  env e;
  env_open(&e);
  assert_int_equal(encode(&e, BATCH_FROM - 1, 0, 2, 0), ncclInternalError); /* a slot without batch memory */
  assert_int_equal(encode(&e, SLOTS, 0, 2, 0), ncclInternalError);          /* no such slot */
  assert_int_equal(encode(&e, BATCH_FROM, 0, ITEMS + 1, 0), ncclInternalError);
  assert_int_equal(encode(&e, BATCH_FROM, PARTS - 1, 2, 0), ncclInternalError); /* results past the slot's */
  assert_int_equal(encode(&e, BATCH_FROM, 0, 0, 0), ncclInternalError);
  assert_int_equal(agoq_gpu_link_stats_get(e.l)->codec_calls, 0);
  env_close(&e);
}

static void test_a_slot_is_taken_until_its_mark_is_done(void** state) {
  (void)state;
  env e;
  env_open(&e);
  const uint32_t a = BATCH_FROM, b = BATCH_FROM + 1;
  assert_int_equal(encode(&e, a, 1, ITEMS, 0), ncclSuccess);
  /* The first batch's kernels may still read the slot's table. */
  assert_int_equal(encode(&e, a, 1, ITEMS, 1), ncclInternalError);
  /* Another slot has its own. */
  assert_int_equal(encode(&e, b, 0, 2, 1), ncclSuccess);
  assert_int_equal(agoq_gpu_mark(e.l, a), ncclSuccess);
  assert_int_equal(encode(&e, a, 1, ITEMS, 1), ncclInternalError); /* marked, not yet seen done */
  poll_done(&e, a);
  for (int i = 0; i < ITEMS; i++) {
    uint32_t status = 99;
    uint64_t len = 0;
    agoq_gpu_codec_result(e.l, a, 1 + i, &status, &len);
    assert_int_equal(status, AGOQ_CODEC_OK);
    assert_int_equal(len, agoq_codec_body_size(&params, N, 0));
  }
  assert_int_equal(encode(&e, a, 1, ITEMS, 1), ncclSuccess);
  /* Slot b, never marked, still refuses. */
  assert_int_equal(encode(&e, b, 0, 2, 0), ncclInternalError);
  const agoq_gpu_link_stats* st = agoq_gpu_link_stats_get(e.l);
  assert_int_equal(st->codec_calls, 3);
  assert_int_equal(st->encodes, 2 * ITEMS + 2);
  assert_int_equal(agoq_gpu_mark(e.l, a), ncclSuccess);
  assert_int_equal(agoq_gpu_mark(e.l, b), ncclSuccess);
  poll_done(&e, a);
  poll_done(&e, b);
  env_close(&e);
}

/* Several sums in one batch (agoq_gpu_dequantize_sums, a grid's row sums): each group's sum
 * lands in its own accumulator; more items than the slot holds, or no group, is refused. */
static void test_sums_land_in_their_own_accumulators(void** state) {
  (void)state;
  env e;
  env_open(&e);
  const uint32_t a = BATCH_FROM;
  assert_int_equal(encode(&e, a, 0, ITEMS, 0), ncclSuccess);
  assert_int_equal(agoq_gpu_mark(e.l, a), ncclSuccess);
  poll_done(&e, a);
  agoq_gpu_decode_item items[ITEMS];
  agoq_gpu_sum_group groups[ITEMS];
  float* acc = NULL;
  assert_int_equal(cudaMalloc((void**)&acc, ITEMS * N * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMemset(acc, 0xff, ITEMS * N * sizeof(float)), cudaSuccess);
  for (int i = 0; i < ITEMS; i++) {
    uint32_t status = 99;
    uint64_t len = 0;
    agoq_gpu_codec_result(e.l, a, i, &status, &len);
    assert_int_equal(status, AGOQ_CODEC_OK);
    items[i] = (agoq_gpu_decode_item){.body = e.items[i].frame + AGOQ_FRAME_HEADER_SIZE, .body_len = len, .n = N};
    groups[i] = (agoq_gpu_sum_group){.n = N, .acc = acc + (size_t)i * N};
  }
  assert_int_equal(agoq_gpu_dequantize_sums(e.l, a, 0, &params, items, 2, groups, 2), ncclInternalError);
  assert_int_equal(agoq_gpu_dequantize_sums(e.l, a, 0, &params, items, 1, groups, 0), ncclInternalError);
  assert_int_equal(agoq_gpu_dequantize_sums(e.l, a, 0, &params, items, 1, groups, ITEMS), ncclSuccess);
  assert_int_equal(agoq_gpu_mark(e.l, a), ncclSuccess);
  poll_done(&e, a);
  float* host = malloc(ITEMS * N * sizeof(float));
  assert_non_null(host);
  assert_int_equal(cudaMemcpy(host, acc, ITEMS * N * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  /* Every input element is bf16 0x3c3c: each sum of one body decodes to it. */
  for (size_t i = 0; i < (size_t)ITEMS * N; i++) {
    uint32_t bits;
    memcpy(&bits, &host[i], 4);
    if (bits != 0x3c3c0000u) fail_msg("element %zu of sum %zu: %#x, not 0x3c3c0000", i % N, i / N, bits);
  }
  free(host);
  cudaFree(acc);
  env_close(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_only_batch_slots_within_their_sizes),
      cmocka_unit_test(test_a_slot_is_taken_until_its_mark_is_done),
      cmocka_unit_test(test_sums_land_in_their_own_accumulators),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
