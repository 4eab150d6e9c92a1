/* The pinned pool of one GPU's links (plugin/gpu/agoq_gpu_pool.h), over the CUDA emulation:
 * it grows with links up to its cap and no further (128 links: 128 MiB at the defaults, where
 * a staging per link pinned 1 GiB), pieces never overlap and come back, a full pool refuses
 * without waiting, every chunk is registered once with each NIC its links are on and
 * deregistered when the last link leaves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/agoq_gpu_pool.h"

static int regs, deregs;
static int reg_dev[4096];

static ncclResult_t fake_reg(int net_dev, void* base, size_t size, void** key) {
  (void)base;
  (void)size;
  reg_dev[regs] = net_dev;
  *key = (void*)(uintptr_t)(++regs);
  return ncclSuccess;
}

static void fake_dereg(void* key) {
  assert_non_null(key);
  deregs++;
}

static const agoq_gpu_pool_ops ops = {fake_reg, fake_dereg};

static void test_grows_with_links_up_to_the_cap(void** state) {
  (void)state;
  /* The defaults: 8 MiB chunks, 256 KiB shares, 128 MiB per GPU. */
  enum { LINKS = 128 };
  const size_t chunk = 8u << 20, share = 256u << 10, cap = 128u << 20;
  agoq_gpu_pool_config cfg = {.chunk = chunk, .cap = cap, .share = share};
  agoq_gpu_pool* p[LINKS];
  agoq_gpu_pool_stats s;
  for (int i = 0; i < LINKS; i++) {
    assert_int_equal(agoq_gpu_pool_join(0, -1, &cfg, NULL, &p[i]), ncclSuccess);
    assert_ptr_equal(p[i], p[0]);
    agoq_gpu_pool_stats_get(0, &s);
    size_t shares = (size_t)(i + 1) * share;
    size_t fit = (cap - shares) / chunk;
    uint32_t want = (uint32_t)(i + 1) < fit ? (uint32_t)(i + 1) : (uint32_t)fit;
    assert_int_equal(s.chunks, want);
    assert_int_equal(s.links, i + 1);
    assert_int_equal(s.pinned_bytes, want * chunk + shares);
    assert_true(s.pinned_bytes <= cap);
  }
  /* 128 links: 32 MiB of shares and 12 chunks, 128 MiB in all (a staging each: 1 GiB). */
  agoq_gpu_pool_stats_get(0, &s);
  assert_int_equal(s.chunks, 12);
  assert_int_equal(s.pinned_bytes, 128u << 20);
  for (int i = 0; i < LINKS; i++) agoq_gpu_pool_leave(p[i], -1, share);
  agoq_gpu_pool_stats_get(0, &s);
  assert_int_equal(s.links, 0);
  assert_int_equal(s.pinned_bytes, 0);
}

/* A chunk with a piece out is not freed when the shares outgrow the cap; it goes once whole. */
static void test_shrinks_only_whole_chunks(void** state) {
  (void)state;
  agoq_gpu_pool_config cfg = {.chunk = 1u << 20, .cap = (2u << 20) + (128u << 10), .share = 64u << 10};
  agoq_gpu_pool *a, *b, *c;
  assert_int_equal(agoq_gpu_pool_join(3, -1, &cfg, NULL, &a), ncclSuccess);
  assert_int_equal(agoq_gpu_pool_join(3, -1, &cfg, NULL, &b), ncclSuccess);
  agoq_gpu_pool_stats s;
  agoq_gpu_pool_stats_get(3, &s);
  assert_int_equal(s.chunks, 2); /* 2 MiB + 128 KiB of shares: at the cap */
  agoq_gpu_pool_piece x, y;
  assert_true(agoq_gpu_pool_get(a, 1u << 20, &x));
  assert_true(agoq_gpu_pool_get(a, 1u << 20, &y));
  assert_int_equal(y.chunk, 1);
  assert_int_equal(agoq_gpu_pool_join(3, -1, &cfg, NULL, &c), ncclSuccess); /* past the cap, chunk 1 busy */
  agoq_gpu_pool_stats_get(3, &s);
  assert_int_equal(s.chunks, 2);
  agoq_gpu_pool_put(a, &y);
  agoq_gpu_pool_leave(c, -1, 64u << 10);
  assert_int_equal(agoq_gpu_pool_join(3, -1, &cfg, NULL, &c), ncclSuccess); /* now it goes */
  agoq_gpu_pool_stats_get(3, &s);
  assert_int_equal(s.chunks, 1);
  assert_true(s.pinned_bytes <= cfg.cap);
  agoq_gpu_pool_put(a, &x);
  agoq_gpu_pool_leave(c, -1, 64u << 10);
  agoq_gpu_pool_leave(b, -1, 64u << 10);
  agoq_gpu_pool_leave(a, -1, 64u << 10);
}

static void test_pieces_borrow_refuse_and_return(void** state) {
  (void)state;
  agoq_gpu_pool_config cfg = {.chunk = 1u << 20, .cap = 2u << 20};
  agoq_gpu_pool *a, *b, *c;
  assert_int_equal(agoq_gpu_pool_join(1, -1, &cfg, NULL, &a), ncclSuccess);
  assert_int_equal(agoq_gpu_pool_join(1, -1, &cfg, NULL, &b), ncclSuccess);
  assert_int_equal(agoq_gpu_pool_join(1, -1, &cfg, NULL, &c), ncclSuccess); /* capped at 2 chunks */
  agoq_gpu_pool_piece x[4];
  for (int i = 0; i < 4; i++) {
    assert_true(agoq_gpu_pool_get(a, 512u << 10, &x[i]));
    assert_true(agoq_gpu_pool_contains(a, x[i].ptr, 512u << 10));
    memset(x[i].ptr, i, 512u << 10); /* pinned host memory the CPU writes */
    for (int k = 0; k < i; k++)
      assert_true(x[k].ptr + (512u << 10) <= x[i].ptr || x[i].ptr + (512u << 10) <= x[k].ptr);
  }
  agoq_gpu_pool_piece y;
  assert_false(agoq_gpu_pool_get(b, 1, &y)); /* full: refused at once */
  assert_int_equal(y.chunk, -1);
  assert_false(agoq_gpu_pool_get(b, (1u << 20) + 1, &y)); /* larger than a chunk: never */
  agoq_gpu_pool_stats s;
  agoq_gpu_pool_stats_get(1, &s);
  assert_int_equal(s.borrows, 4);
  assert_int_equal(s.refusals, 2);
  assert_int_equal(s.borrowed_bytes, 2u << 20);
  agoq_gpu_pool_put(a, &x[1]);
  assert_true(agoq_gpu_pool_get(b, 300u << 10, &y)); /* another link reuses the hole at once */
  assert_ptr_equal(y.ptr, x[0].ptr + (512u << 10));
  agoq_gpu_pool_put(b, &y);
  agoq_gpu_pool_put(a, &x[0]);
  agoq_gpu_pool_put(a, &x[2]);
  agoq_gpu_pool_put(a, &x[3]);
  agoq_gpu_pool_stats_get(1, &s);
  assert_int_equal(s.borrowed_bytes, 0);
  assert_false(agoq_gpu_pool_contains(a, &s, sizeof s));
  agoq_gpu_pool_leave(c, -1, 0);
  agoq_gpu_pool_leave(b, -1, 0);
  agoq_gpu_pool_leave(a, -1, 0);
}

static void test_registered_once_per_nic(void** state) {
  (void)state;
  regs = deregs = 0;
  agoq_gpu_pool_config cfg = {.chunk = 1u << 20, .cap = 8u << 20};
  agoq_gpu_pool *a, *b, *c;
  assert_int_equal(agoq_gpu_pool_join(2, 0, &cfg, &ops, &a), ncclSuccess); /* chunk 0 on NIC 0 */
  assert_int_equal(regs, 1);
  assert_int_equal(agoq_gpu_pool_join(2, 0, &cfg, &ops, &b), ncclSuccess); /* chunk 1 on NIC 0 */
  assert_int_equal(regs, 2);
  assert_int_equal(agoq_gpu_pool_join(2, 3, &cfg, &ops, &c), ncclSuccess); /* NIC 3: both, then chunk 2 on both */
  assert_int_equal(regs, 2 + 2 + 2);
  agoq_gpu_pool_piece x, held[3];
  for (int i = 0; i < 3; i++) {
    assert_true(agoq_gpu_pool_get(a, 1u << 20, &x));
    assert_non_null(agoq_gpu_pool_key(a, &x, 0));
    assert_non_null(agoq_gpu_pool_key(a, &x, 3));
    assert_null(agoq_gpu_pool_key(a, &x, 1));
    assert_ptr_not_equal(agoq_gpu_pool_key(a, &x, 0), agoq_gpu_pool_key(a, &x, 3));
    agoq_gpu_pool_put(a, &x);
    assert_true(agoq_gpu_pool_get(a, 1u << 20, &held[i])); /* hold this chunk: the next get takes another */
    assert_int_equal(held[i].chunk, i);
  }
  for (int i = 0; i < 3; i++) agoq_gpu_pool_put(a, &held[i]);
  agoq_gpu_pool_leave(a, 0, 0);
  agoq_gpu_pool_leave(b, 0, 0);
  assert_int_equal(deregs, 0);
  agoq_gpu_pool_leave(c, 3, 0);
  assert_int_equal(deregs, regs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grows_with_links_up_to_the_cap),
      cmocka_unit_test(test_shrinks_only_whole_chunks),
      cmocka_unit_test(test_pieces_borrow_refuse_and_return),
      cmocka_unit_test(test_registered_once_per_nic),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
