/* The staging ring of the GPU data path (plugin/gpu/agoq_gpu_ring.h): allocations never
 * overlap a live one and stay inside the buffer, space returns only from the oldest end,
 * out-of-order release, wrap-around, and what never fits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/agoq_gpu_ring.h"

static uint8_t buf[64 * 1024];

static void test_fill_release_in_order(void** state) {
  (void)state;
  agoq_gpu_ring r;
  assert_true(agoq_gpu_ring_init(&r, buf, sizeof buf, 64));
  uint8_t* p[4];
  int id[4];
  for (int i = 0; i < 4; i++) {
    id[i] = agoq_gpu_ring_get(&r, 16 * 1024, &p[i]);
    assert_true(id[i] >= 0);
    assert_ptr_equal(p[i], buf + (size_t)i * 16 * 1024);
  }
  uint8_t* q;
  assert_int_equal(agoq_gpu_ring_get(&r, 1, &q), -1); /* full */
  agoq_gpu_ring_put(&r, id[0]);
  /* The oldest is back: the next allocation wraps to the start. */
  int a = agoq_gpu_ring_get(&r, 8 * 1024, &q);
  assert_true(a >= 0);
  assert_ptr_equal(q, buf);
  assert_int_equal(agoq_gpu_ring_live(&r), 4);
  agoq_gpu_ring_fini(&r);
}

static void test_out_of_order_release_waits_for_the_oldest(void** state) {
  (void)state;
  agoq_gpu_ring r;
  assert_true(agoq_gpu_ring_init(&r, buf, sizeof buf, 64));
  uint8_t* p[4];
  int id[4];
  for (int i = 0; i < 4; i++) id[i] = agoq_gpu_ring_get(&r, 16 * 1024, &p[i]);
  agoq_gpu_ring_put(&r, id[2]);
  agoq_gpu_ring_put(&r, id[1]);
  uint8_t* q;
  /* 1 and 2 are back but 0 is not: nothing before 0 is free, and the end is taken. */
  assert_int_equal(agoq_gpu_ring_get(&r, 1, &q), -1);
  agoq_gpu_ring_put(&r, id[0]);
  int a = agoq_gpu_ring_get(&r, 48 * 1024, &q);
  assert_true(a >= 0);
  assert_ptr_equal(q, buf);
  agoq_gpu_ring_put(&r, id[3]);
  agoq_gpu_ring_put(&r, a);
  assert_int_equal(agoq_gpu_ring_live(&r), 0);
  /* Empty: the whole ring again. */
  a = agoq_gpu_ring_get(&r, sizeof buf, &q);
  assert_true(a >= 0);
  assert_ptr_equal(q, buf);
  agoq_gpu_ring_fini(&r);
}

static void test_never_fits_and_entry_limit(void** state) {
  (void)state;
  agoq_gpu_ring r;
  assert_true(agoq_gpu_ring_init(&r, buf, sizeof buf, 3));
  uint8_t* q;
  assert_false(agoq_gpu_ring_fits(&r, sizeof buf + 1));
  assert_int_equal(agoq_gpu_ring_get(&r, sizeof buf + 1, &q), -1);
  assert_true(agoq_gpu_ring_fits(&r, sizeof buf));
  /* Zero bytes still take one aligned piece; the entry table bounds the count. */
  int ids[3];
  for (int i = 0; i < 3; i++) {
    ids[i] = agoq_gpu_ring_get(&r, 0, &q);
    assert_true(ids[i] >= 0);
    assert_int_equal((uintptr_t)(q - buf) % AGOQ_GPU_RING_ALIGN, 0);
  }
  assert_int_equal(agoq_gpu_ring_get(&r, 0, &q), -1);
  for (int i = 0; i < 3; i++) agoq_gpu_ring_put(&r, ids[i]);
  agoq_gpu_ring_fini(&r);
}

/* A long random run against a model: live allocations never overlap, stay in bounds and are
 * aligned, and once everything is back the whole ring can be had. */
static void test_random_against_model(void** state) {
  (void)state;
  agoq_gpu_ring r;
  assert_true(agoq_gpu_ring_init(&r, buf, sizeof buf, 32));
  struct {
    int id;
    size_t off, len;
  } live[32];
  int nlive = 0;
  uint32_t x = 12345;
  for (int step = 0; step < 200000; step++) {
    x = x * 1103515245u + 12345u;
    bool take = (x >> 16) % 3 != 0 && nlive < 32;
    if (take) {
      size_t len = ((x >> 8) % 20000) + 1;
      uint8_t* q;
      int id = agoq_gpu_ring_get(&r, len, &q);
      if (id < 0) continue;
      size_t off = (size_t)(q - buf);
      assert_true(off + len <= sizeof buf);
      assert_int_equal(off % AGOQ_GPU_RING_ALIGN, 0);
      for (int i = 0; i < nlive; i++) assert_true(off + len <= live[i].off || live[i].off + live[i].len <= off);
      live[nlive].id = id;
      live[nlive].off = off;
      live[nlive].len = len;
      nlive++;
    } else if (nlive > 0) {
      int k = (int)((x >> 4) % (uint32_t)nlive);
      agoq_gpu_ring_put(&r, live[k].id);
      live[k] = live[--nlive];
    }
  }
  while (nlive > 0) agoq_gpu_ring_put(&r, live[--nlive].id);
  assert_int_equal(agoq_gpu_ring_live(&r), 0);
  uint8_t* q;
  assert_true(agoq_gpu_ring_get(&r, sizeof buf, &q) >= 0);
  agoq_gpu_ring_fini(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fill_release_in_order),
      cmocka_unit_test(test_out_of_order_release_waits_for_the_oldest),
      cmocka_unit_test(test_never_fits_and_entry_limit),
      cmocka_unit_test(test_random_against_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
