/* The per-comm request pool: bounded, O(1), detects foreign and stale pointers; the TCP
 * transport's fifo of posted transfers keeps order and capacity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "net/agoq_request.h"
#include "transport/tcp/agoq_tcp.h"

static void test_pool_exhaustion_and_reuse(void** state) {
  (void)state;
  agoq_request_pool pool;
  assert_int_equal(agoq_request_pool_init(&pool, 32), ncclSuccess);
  agoq_request* reqs[32];
  for (int i = 0; i < 32; i++) {
    reqs[i] = agoq_request_alloc(&pool, AGOQ_REQ_SEND, NULL);
    assert_non_null(reqs[i]);
    assert_true(agoq_request_valid(&pool, reqs[i]));
    for (int j = 0; j < i; j++) assert_ptr_not_equal(reqs[i], reqs[j]);
  }
  assert_int_equal(agoq_request_in_use(&pool), 32);
  assert_null(agoq_request_alloc(&pool, AGOQ_REQ_SEND, NULL)); /* NCCL will retry */
  agoq_request_release(&pool, reqs[17]);
  assert_false(agoq_request_valid(&pool, reqs[17])); /* stale pointer detected */
  agoq_request* again = agoq_request_alloc(&pool, AGOQ_REQ_RECV, NULL);
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
  agoq_request* ra = agoq_request_alloc(&a, AGOQ_REQ_SEND, NULL);
  assert_false(agoq_request_valid(&b, ra));
  assert_false(agoq_request_valid(&a, (agoq_request*)((char*)ra + 1)));
  assert_false(agoq_request_valid(&a, NULL));
  agoq_request_pool_fini(&a);
  agoq_request_pool_fini(&b);
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
      cmocka_unit_test(test_fifo_order_and_capacity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
