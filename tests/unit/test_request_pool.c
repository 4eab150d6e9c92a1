/* The per-comm request pool: bounded, O(1), memory in blocks as used, detects foreign and
 * stale pointers; the TCP transport's fifo of posted transfers keeps order and capacity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "net/agoq_request.h"
#include "transport/tcp/agoq_tcp.h"

static agoq_request* take(agoq_request_pool* pool, agoq_request_kind kind) {
  agoq_request* req = (agoq_request*)1;
  assert_int_equal(agoq_request_alloc(pool, kind, NULL, &req), ncclSuccess);
  return req;
}

static void test_pool_exhaustion_and_reuse(void** state) {
  (void)state;
  agoq_request_pool pool;
  assert_int_equal(agoq_request_pool_init(&pool, 32), ncclSuccess);
  agoq_request* reqs[32];
  for (int i = 0; i < 32; i++) {
    reqs[i] = take(&pool, AGOQ_REQ_SEND);
    assert_non_null(reqs[i]);
    assert_true(agoq_request_valid(&pool, reqs[i]));
    for (int j = 0; j < i; j++) assert_ptr_not_equal(reqs[i], reqs[j]);
  }
  assert_int_equal(agoq_request_in_use(&pool), 32);
  assert_null(take(&pool, AGOQ_REQ_SEND)); /* NCCL will retry */
  agoq_request_release(&pool, reqs[17]);
  assert_false(agoq_request_valid(&pool, reqs[17])); /* stale pointer detected */
  agoq_request* again = take(&pool, AGOQ_REQ_RECV);
  assert_ptr_equal(again, reqs[17]);
  assert_int_equal(again->kind, AGOQ_REQ_RECV);
  /* The transport keeps its per-transfer state under the pool index. */
  assert_int_equal(again->xfer.index, again->pool_index);
  assert_true(again->xfer.index < 32);
  for (int i = 0; i < 32; i++) agoq_request_release(&pool, reqs[i]);
  assert_int_equal(agoq_request_in_use(&pool), 0);
  agoq_request_pool_fini(&pool);
}

static void test_pool_rejects_foreign_pointers(void** state) {
  (void)state;
  agoq_request_pool a, b;
  assert_int_equal(agoq_request_pool_init(&a, 4), ncclSuccess);
  assert_int_equal(agoq_request_pool_init(&b, 4), ncclSuccess);
  agoq_request* ra = take(&a, AGOQ_REQ_SEND);
  assert_false(agoq_request_valid(&b, ra));
  assert_false(agoq_request_valid(&a, (agoq_request*)((char*)ra + 1)));
  assert_false(agoq_request_valid(&a, NULL));
  agoq_request_pool_fini(&a);
  agoq_request_pool_fini(&b);
}

/* Memory follows the requests in use, not the pool's capacity: a connection of NCCL's
 * 256-request contract that keeps one request in flight holds one block. */
static void test_pool_allocates_blocks_on_use(void** state) {
  (void)state;
  agoq_request_pool pool;
  assert_int_equal(agoq_request_pool_init(&pool, AGOQ_REQUESTS_PER_COMM), ncclSuccess);
  for (uint32_t i = 0; i < AGOQ_REQUESTS_PER_COMM; i++) assert_null(agoq_request_at(&pool, i));
  for (int round = 0; round < 100; round++) {
    agoq_request* r = take(&pool, AGOQ_REQ_SEND);
    assert_int_equal(r->pool_index, 0);
    assert_ptr_equal(agoq_request_at(&pool, 0), r);
    agoq_request_release(&pool, r);
  }
  for (uint32_t i = AGOQ_REQUESTS_PER_COMM / AGOQ_REQUEST_BLOCKS_MAX; i < AGOQ_REQUESTS_PER_COMM; i++)
    assert_null(agoq_request_at(&pool, i));
  /* One more than a block in flight: the second block, and still no third. */
  enum { BLOCK = AGOQ_REQUESTS_PER_COMM / AGOQ_REQUEST_BLOCKS_MAX };
  agoq_request* held[BLOCK + 1];
  for (int i = 0; i <= BLOCK; i++) held[i] = take(&pool, AGOQ_REQ_RECV);
  assert_ptr_equal(agoq_request_at(&pool, BLOCK), held[BLOCK]);
  assert_true(agoq_request_valid(&pool, held[BLOCK]));
  assert_null(agoq_request_at(&pool, 2 * BLOCK));
  assert_null(agoq_request_at(&pool, AGOQ_REQUESTS_PER_COMM)); /* past the capacity */
  for (int i = 0; i <= BLOCK; i++) agoq_request_release(&pool, held[i]);
  agoq_request_pool_fini(&pool);
  /* A CollNet connection's pool of 16: a block per request, so one in flight is one. */
  assert_int_equal(agoq_request_pool_init(&pool, 16), ncclSuccess);
  agoq_request* one = take(&pool, AGOQ_REQ_SEND);
  assert_ptr_equal(agoq_request_at(&pool, 0), one);
  assert_null(agoq_request_at(&pool, 1));
  agoq_request* two = take(&pool, AGOQ_REQ_SEND);
  assert_ptr_equal(agoq_request_at(&pool, 1), two);
  assert_true(agoq_request_valid(&pool, two));
  assert_false(agoq_request_valid(&pool, (agoq_request*)((char*)two + 8)));
  agoq_request_release(&pool, one);
  agoq_request_release(&pool, two);
  agoq_request_pool_fini(&pool);
  /* A pool larger than the contract is an internal error, not an overflow. */
  assert_int_equal(agoq_request_pool_init(&pool, AGOQ_REQUESTS_PER_COMM + 1), ncclInternalError);
  assert_int_equal(agoq_request_pool_init(&pool, 0), ncclInternalError);
}

static void test_fifo_order_and_capacity(void** state) {
  (void)state;
  static agoq_xfer_fifo f;
  static agoq_xfer items[AGOQ_XFER_MAX_POSTED];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < AGOQ_REQUESTS_PER_COMM; i++) assert_true(agoq_fifo_push(&f, &items[i]));
    assert_false(agoq_fifo_push(&f, &items[0]));
    for (int i = 0; i < AGOQ_REQUESTS_PER_COMM; i++) {
      assert_ptr_equal(agoq_fifo_at(&f, 0), &items[i]);
      agoq_fifo_pop(&f);
    }
    assert_null(agoq_fifo_at(&f, 0));
    /* Leave the head mid-ring so the next round wraps around. */
    assert_true(agoq_fifo_push(&f, &items[0]));
    agoq_fifo_pop(&f);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_exhaustion_and_reuse),
      cmocka_unit_test(test_pool_rejects_foreign_pointers),
      cmocka_unit_test(test_pool_allocates_blocks_on_use),
      cmocka_unit_test(test_fifo_order_and_capacity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
