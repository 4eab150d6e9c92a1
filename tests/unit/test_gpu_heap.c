/* The pinned pool's first-fit heap (plugin/gpu/agoq_gpu_heap.h): allocations inside the
 * buffer and never overlapping, the lowest hole first, release in any order with neighbours
 * merged, no head-of-line blocking (what a ring has), and double or foreign releases refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/agoq_gpu_heap.h"
#include "gpu/agoq_gpu_ring.h"

#define UNIT AGOQ_GPU_RING_ALIGN
static uint8_t buf[64 * 1024];

static void test_first_fit_and_merge(void** state) {
  (void)state;
  agoq_gpu_heap h;
  assert_true(agoq_gpu_heap_init(&h, buf, sizeof buf, 16));
  uint8_t* p[4];
  for (int i = 0; i < 4; i++) {
    assert_true(agoq_gpu_heap_get(&h, 16 * 1024, &p[i]));
    assert_ptr_equal(p[i], buf + (size_t)i * 16 * 1024);
  }
  uint8_t* q;
  assert_false(agoq_gpu_heap_get(&h, 1, &q)); /* full */
  /* Free the second and the fourth: two holes, the lowest one is taken first. */
  assert_true(agoq_gpu_heap_put(&h, p[1], 16 * 1024));
  assert_true(agoq_gpu_heap_put(&h, p[3], 16 * 1024));
  assert_int_equal(h.nfree, 2);
  assert_true(agoq_gpu_heap_get(&h, 100, &q));
  assert_ptr_equal(q, p[1]);
  assert_true(agoq_gpu_heap_put(&h, q, 100));
  /* Freeing the third merges all three holes into one of 48 KiB. */
  assert_true(agoq_gpu_heap_put(&h, p[2], 16 * 1024));
  assert_int_equal(h.nfree, 1);
  assert_int_equal(agoq_gpu_heap_largest(&h), 48 * 1024);
  assert_true(agoq_gpu_heap_put(&h, p[0], 16 * 1024));
  assert_int_equal(h.nfree, 1);
  assert_int_equal(h.free_bytes, sizeof buf);
  agoq_gpu_heap_fini(&h);
}

/* The ring's failure mode, shared across connections: one old allocation held, everything
 * after it released. The heap hands the released space out again at once. */
static void test_no_head_of_line_blocking(void** state) {
  (void)state;
  agoq_gpu_heap h;
  assert_true(agoq_gpu_heap_init(&h, buf, sizeof buf, 16));
  uint8_t *old, *p[3];
  assert_true(agoq_gpu_heap_get(&h, 1024, &old)); /* a receive whose data never comes */
  for (int round = 0; round < 100; round++) {
    for (int i = 0; i < 3; i++) assert_true(agoq_gpu_heap_get(&h, 20 * 1024, &p[i]));
    for (int i = 0; i < 3; i++) assert_true(agoq_gpu_heap_put(&h, p[i], 20 * 1024));
  }
  assert_true(agoq_gpu_heap_put(&h, old, 1024));
  assert_int_equal(h.free_bytes, sizeof buf);
  agoq_gpu_heap_fini(&h);
}

static void test_refusals(void** state) {
  (void)state;
  agoq_gpu_heap h;
  assert_true(agoq_gpu_heap_init(&h, buf, sizeof buf, 16));
  uint8_t *a, *b, *q;
  assert_false(agoq_gpu_heap_get(&h, sizeof buf + 1, &q));
  assert_true(agoq_gpu_heap_get(&h, 0, &a)); /* one unit */
  assert_true(agoq_gpu_heap_get(&h, UNIT + 1, &b));
  assert_ptr_equal(b, a + UNIT);
  assert_true(agoq_gpu_heap_put(&h, a, 0));
  assert_false(agoq_gpu_heap_put(&h, a, 0));          /* twice */
  assert_false(agoq_gpu_heap_put(&h, b, 4 * UNIT));   /* runs into free space */
  assert_false(agoq_gpu_heap_put(&h, b + 1, UNIT));   /* not an allocation's start */
  static uint8_t foreign[2 * UNIT];
  assert_false(agoq_gpu_heap_put(&h, foreign, UNIT)); /* not the heap's memory */
  assert_true(agoq_gpu_heap_put(&h, b, UNIT + 1));
  assert_int_equal(h.free_bytes, sizeof buf);
  agoq_gpu_heap_fini(&h);
}

/* Random gets and puts against a byte map: every allocation inside, none overlapping, the
 * free count exact, and a get fails only where no hole of that size exists. */
static void test_random_against_model(void** state) {
  (void)state;
  enum { MAXA = 64 };
  agoq_gpu_heap h;
  assert_true(agoq_gpu_heap_init(&h, buf, sizeof buf, MAXA + 1));
  static uint8_t owner[sizeof buf / UNIT]; /* 0 free, else allocation index + 1 */
  memset(owner, 0, sizeof owner);
  uint8_t* ptr[MAXA] = {0};
  size_t len[MAXA] = {0};
  uint32_t seed = 12345;
  for (int step = 0; step < 20000; step++) {
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 16) % MAXA);
    if (ptr[k] == NULL) {
      size_t want = (seed >> 8) % (12 * 1024);
      uint8_t* p;
      bool ok = agoq_gpu_heap_get(&h, want, &p);
      size_t units = agoq_gpu_heap_round(want) / UNIT;
      /* the model's lowest run of free units that holds it */
      size_t run = 0, at = SIZE_MAX;
      for (size_t u = 0; u < sizeof owner && at == SIZE_MAX; u++) {
        run = owner[u] ? 0 : run + 1;
        if (run == units) at = u + 1 - units;
      }
      assert_int_equal(ok, at != SIZE_MAX);
      if (!ok) continue;
      assert_ptr_equal(p, buf + at * UNIT);
      for (size_t u = 0; u < units; u++) owner[at + u] = (uint8_t)(k + 1);
      ptr[k] = p;
      len[k] = want;
    } else {
      assert_true(agoq_gpu_heap_put(&h, ptr[k], len[k]));
      size_t at = (size_t)(ptr[k] - buf) / UNIT, units = agoq_gpu_heap_round(len[k]) / UNIT;
      for (size_t u = 0; u < units; u++) {
        assert_int_equal(owner[at + u], k + 1);
        owner[at + u] = 0;
      }
      ptr[k] = NULL;
    }
    size_t free_units = 0;
    for (size_t u = 0; u < sizeof owner; u++) free_units += owner[u] == 0;
    assert_int_equal(h.free_bytes, free_units * UNIT);
  }
  agoq_gpu_heap_fini(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_fit_and_merge),
      cmocka_unit_test(test_no_head_of_line_blocking),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_random_against_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
