/* The CollNet core in one process: nranks "nodes" with their own contexts over loopback,
 * group creation from one thread per rank (connect blocks), then collectives driven from the
 * test thread. Exact results are checked bit for bit against a sequential rank-order
 * reduction written here from the types' definitions (codec_test_ref.h); quantized results
 * bit for bit against the codec applied by the documented slicing rule, and against fp64
 * within the error bound. Every rank must hold identical bits. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "agoq_frame.h"
#include "codec_test_ref.h"
#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_wire.h"
#include "collnet/agoq_collnet.h"
#include "core/agoq_log.h"
#include "core/agoq_params.h"

#define COMM_ID 0xc011c011c011c011ull
#define MAXR 4

#include "collnet_group.h"

static ref_format ref_bf16, ref_fp16, ref_e4m3, ref_e5m2;

/* ---- data and the exact reference ---- */

static size_t esz(int t) {
  static const size_t s[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return s[t];
}

static uint64_t rng_next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static double rng_unit(uint64_t* s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

static double rng_normal(uint64_t* s) {
  double u = rng_unit(s), v = rng_unit(s);
  return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static const ref_format* narrow_fmt(int t) {
  switch (t) {
    case ncclBfloat16: return &ref_bf16;
    case ncclFloat16: return &ref_fp16;
    case ncclFloat8e4m3: return &ref_e4m3;
    case ncclFloat8e5m2: return &ref_e5m2;
    default: return NULL;
  }
}

/* Finite values of every type; the floats span signs, zeros, small and large magnitudes. */
static void gen_exact(int t, void* buf, size_t count, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < count; i++) {
    uint64_t r = rng_next(&s);
    switch (t) {
      case ncclFloat32: {
        float v = (float)((rng_unit(&s) - 0.5) * ldexp(1.0, (int)(r % 40) - 20));
        if (r % 97 == 0) v = (r & 1) ? -0.0f : 0.0f;
        ((float*)buf)[i] = v;
        break;
      }
      case ncclFloat64: {
        double v = (rng_unit(&s) - 0.5) * ldexp(1.0, (int)(r % 60) - 30);
        if (r % 97 == 0) v = (r & 1) ? -0.0 : 0.0;
        ((double*)buf)[i] = v;
        break;
      }
      default: {
        const ref_format* f = narrow_fmt(t);
        if (f == NULL) {
          memcpy((uint8_t*)buf + i * esz(t), &r, esz(t));
          break;
        }
        /* A random finite code of the type (sign bit random). */
        uint32_t code = (uint32_t)(r % (uint64_t)f->ncodes);
        uint32_t sbit = 1u << (f->ebits + f->mbits);
        if (r & (1ull << 40)) code |= sbit;
        if (esz(t) == 1) ((uint8_t*)buf)[i] = (uint8_t)code;
        else ((uint16_t*)buf)[i] = (uint16_t)code;
      }
    }
  }
}

static float widen(int t, const void* p) {
  const ref_format* f = narrow_fmt(t);
  if (esz(t) == 2) return ref_widen16(f, *(const uint16_t*)p);
  bool nan, inf;
  return (float)ref_decode(f, *(const uint8_t*)p, &nan, &inf);
}

static void narrow(int t, float v, void* p) {
  const ref_format* f = narrow_fmt(t);
  if (esz(t) == 2) *(uint16_t*)p = ref_narrow16(f, v, false);
  else *(uint8_t*)p = (uint8_t)ref_fp8_encode(f, (double)v);
}

/* Max/Min as documented: NaN loses, -0 < +0, ties keep the earlier rank. */
static bool takes(int op, double a, double b) {
  if (isnan(b)) return false;
  if (isnan(a)) return true;
  if (a == b) return op == ncclMax ? (signbit(a) && !signbit(b)) : (!signbit(a) && signbit(b));
  return op == ncclMax ? b > a : b < a;
}

static bool is_signed_int(int t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

static void ref_exact(int t, int op, uint8_t* const* in, int n, size_t count, uint8_t* out) {
  size_t w = esz(t);
  for (size_t i = 0; i < count; i++) {
    const uint8_t* x0 = in[0] + i * w;
    uint8_t* o = out + i * w;
    if (t == ncclFloat32 || t == ncclFloat64) {
      double acc_d = 0;
      float acc_f = 0;
      if (t == ncclFloat64) memcpy(&acc_d, x0, 8);
      else memcpy(&acc_f, x0, 4);
      for (int k = 1; k < n; k++) {
        const uint8_t* x = in[k] + i * w;
        if (t == ncclFloat32) {
          float b;
          memcpy(&b, x, 4);
          if (op == ncclSum) acc_f = acc_f + b;
          else if (op == ncclProd) acc_f = acc_f * b;
          else if (takes(op, acc_f, b)) acc_f = b;
        } else {
          double b;
          memcpy(&b, x, 8);
          if (op == ncclSum) acc_d = acc_d + b;
          else if (op == ncclProd) acc_d = acc_d * b;
          else if (takes(op, acc_d, b)) acc_d = b;
        }
      }
      if (t == ncclFloat32) memcpy(o, &acc_f, 4);
      else memcpy(o, &acc_d, 8);
    } else if (narrow_fmt(t) != NULL) {
      if (op == ncclMax || op == ncclMin) {
        const uint8_t* best = x0;
        for (int k = 1; k < n; k++)
          if (takes(op, widen(t, best), widen(t, in[k] + i * w))) best = in[k] + i * w;
        memcpy(o, best, w);
      } else {
        float acc = widen(t, x0);
        for (int k = 1; k < n; k++) {
          float b = widen(t, in[k] + i * w);
          acc = op == ncclSum ? acc + b : acc * b;
        }
        narrow(t, acc, o);
      }
    } else {
      uint64_t mask = w == 8 ? ~0ull : (1ull << (8 * w)) - 1;
      uint64_t acc = 0;
      memcpy(&acc, x0, w);
      for (int k = 1; k < n; k++) {
        uint64_t b = 0;
        memcpy(&b, in[k] + i * w, w);
        if (op == ncclSum) {
          acc = (acc + b) & mask;
        } else if (op == ncclProd) {
          acc = (acc * b) & mask;
        } else {
          bool greater;
          if (is_signed_int(t)) {
            int shift = 64 - 8 * (int)w;
            int64_t sa = (int64_t)(acc << shift) >> shift, sb = (int64_t)(b << shift) >> shift;
            greater = sb > sa;
            if (op == ncclMin) greater = sb < sa;
          } else {
            greater = op == ncclMax ? b > acc : b < acc;
          }
          if (greater) acc = b;
        }
      }
      memcpy(o, &acc, w);
    }
  }
}

/* ---- driving allreduce on every rank ---- */

typedef struct {
  uint8_t* send[MAXR];
  uint8_t* recv[MAXR];
  uint8_t* ref;
  size_t bytes;
} bufs;

static void bufs_alloc(bufs* b, int n, size_t bytes) {
  b->bytes = bytes;
  for (int r = 0; r < n; r++) {
    b->send[r] = malloc(bytes + 64);
    b->recv[r] = malloc(bytes + 64);
    assert_non_null(b->send[r]);
    assert_non_null(b->recv[r]);
    memset(b->recv[r], 0xa5, bytes + 64);
  }
  b->ref = malloc(bytes + 64);
  assert_non_null(b->ref);
}

static void bufs_free(bufs* b, int n) {
  for (int r = 0; r < n; r++) {
    free(b->send[r]);
    free(b->recv[r]);
  }
  free(b->ref);
}

static void post_allreduce(group* g, int rank, void* send, void* recv, size_t count, int t, int op, void** req) {
  *req = NULL;
  double deadline = now_s() + 10;
  while (*req == NULL) {
    assert_int_equal(agoq_coll_iallreduce(g->comm[rank], send, recv, count, t, op, NULL, NULL, req), ncclSuccess);
    assert_true(now_s() < deadline);
  }
}

static void allreduce_all(group* g, bufs* b, size_t count, int t, int op) {
  void* reqs[MAXR];
  int sizes[MAXR];
  for (int r = 0; r < g->n; r++) post_allreduce(g, r, b->send[r], b->recv[r], count, t, op, &reqs[r]);
  wait_all(reqs, g->n, sizes, NULL, 60);
  for (int r = 0; r < g->n; r++) assert_int_equal(sizes[r], (int)(count * esz(t)));
}

static void check_identical(group* g, bufs* b, size_t bytes) {
  for (int r = 1; r < g->n; r++) assert_memory_equal(b->recv[0], b->recv[r], bytes);
  for (int r = 0; r < g->n; r++)
    for (size_t i = bytes; i < bytes + 64; i++) assert_int_equal(b->recv[r][i], 0xa5); /* nothing past the end */
}

static void run_exact(group* g, int t, int op, size_t count, uint64_t seed) {
  bufs b;
  size_t bytes = count * esz(t);
  bufs_alloc(&b, g->n, bytes);
  for (int r = 0; r < g->n; r++) gen_exact(t, b.send[r], count, seed * 131 + (uint64_t)r);
  allreduce_all(g, &b, count, t, op);
  ref_exact(t, op, b.send, g->n, count, b.ref);
  check_identical(g, &b, bytes);
  if (memcmp(b.recv[0], b.ref, bytes) != 0) {
    size_t i = 0;
    while (memcmp(b.recv[0] + i * esz(t), b.ref + i * esz(t), esz(t)) == 0) i++;
    fail_msg("exact allreduce of %zu x type %d, op %d, %d ranks differs from the reference at element %zu", count, t,
             op, g->n, i);
  }
  bufs_free(&b, g->n);
}

/* ---- the quantized reference: the codec applied by the documented slicing rule ---- */

static agoq_dtype codec_type(int t) {
  return t == ncclFloat32 ? AGOQ_DTYPE_FP32 : t == ncclBfloat16 ? AGOQ_DTYPE_BF16 : AGOQ_DTYPE_FP16;
}

/* acc[0..m) = sum over ranks, in order, of the decoded contributions of element range
 * [first, first + m); then, for allreduce, the re-quantized sum decoded into out. */
static void ref_quant_slice(int t, agoq_format fmt, uint32_t block, uint8_t* const* in, int n, size_t first, size_t m,
                            bool requantize, uint8_t* out) {
  agoq_codec_params p = {.format = fmt, .dtype = codec_type(t), .block = block};
  agoq_codec_params p32 = {.format = fmt, .dtype = AGOQ_DTYPE_FP32, .block = block};
  size_t cap = agoq_frame_size_max(&p32, m) + agoq_frame_size_max(&p, m);
  uint8_t* frame = malloc(cap);
  float* acc = malloc(m * sizeof(float) + 1);
  assert_non_null(frame);
  assert_non_null(acc);
  for (int k = 0; k < n; k++) {
    size_t len;
    assert_int_equal(agoq_frame_encode(&p, in[k] + first * esz(t), m, false, frame, cap, &len), AGOQ_CODEC_OK);
    if (k == 0) assert_int_equal(agoq_frame_decode(frame, len, AGOQ_DTYPE_FP32, acc, m), AGOQ_CODEC_OK);
    else assert_int_equal(agoq_frame_decode_accumulate(frame, len, acc, m), AGOQ_CODEC_OK);
  }
  if (requantize) {
    size_t len;
    agoq_codec_overflow_to_inf(codec_type(t), acc, m); /* overflow is Inf, as NCCL gives */
    assert_int_equal(agoq_frame_encode(&p32, acc, m, false, frame, cap, &len), AGOQ_CODEC_OK);
    assert_int_equal(agoq_frame_decode(frame, len, codec_type(t), out, m), AGOQ_CODEC_OK);
  } else {
    for (size_t i = 0; i < m; i++) {
      uint8_t* o = out + i * esz(t);
      if (t == ncclFloat32) memcpy(o, &acc[i], 4);
      else narrow(t, acc[i], o);
    }
  }
  free(frame);
  free(acc);
}

static void ref_quant_allreduce(int t, agoq_format fmt, uint32_t block, size_t chunk_bytes, uint8_t* const* in, int n,
                                size_t count, uint8_t* out) {
  size_t ce = agoq_coll_chunk_elems(chunk_bytes, esz(t), block);
  size_t bounds[MAXR + 1];
  for (size_t c0 = 0; c0 < count; c0 += ce) {
    size_t m = count - c0 < ce ? count - c0 : ce;
    agoq_coll_slices(m, n, block, bounds);
    for (int j = 0; j < n; j++) {
      size_t len = bounds[j + 1] - bounds[j];
      if (len > 0) ref_quant_slice(t, fmt, block, in, n, c0 + bounds[j], len, true, out + (c0 + bounds[j]) * esz(t));
    }
  }
}

typedef struct {
  double rel_l2, max_abs;
} err_stats;

/* Against the fp64 sum; also checks the per-element bound documented for int8 with the
 * global maxima (each contribution's error at most amax / 254, the sum's re-quantization
 * the same, plus the output type's rounding). */
static err_stats quant_error(int t, uint8_t* const* in, int n, size_t count, const uint8_t* out, bool check_bound) {
  double num = 0, den = 0, maxabs = 0, sum_amax = 0;
  for (int k = 0; k < n; k++) {
    double a = 0;
    for (size_t i = 0; i < count; i++) {
      const uint8_t* x = in[k] + i * esz(t);
      double v = t == ncclFloat32 ? (double)*(const float*)x : (double)widen(t, x);
      if (fabs(v) > a) a = fabs(v);
    }
    sum_amax += a;
  }
  double out_rel = t == ncclBfloat16 ? 0x1p-8 : t == ncclFloat16 ? 0x1p-11 : 0x1p-23;
  for (size_t i = 0; i < count; i++) {
    double s = 0;
    for (int k = 0; k < n; k++) {
      const uint8_t* x = in[k] + i * esz(t);
      s += t == ncclFloat32 ? (double)*(const float*)x : (double)widen(t, x);
    }
    const uint8_t* o = out + i * esz(t);
    double y = t == ncclFloat32 ? (double)*(const float*)o : (double)widen(t, o);
    double e = fabs(y - s);
    if (check_bound) {
      double bound = 2.02 * sum_amax / 254.0 + fabs(s) * out_rel * 1.01 + 1e-30;
      if (e > bound) fail_msg("element %zu: |%g - %g| = %g above the bound %g", i, y, s, e, bound);
    }
    num += e * e;
    den += s * s;
    if (e > maxabs) maxabs = e;
  }
  err_stats st = {den > 0 ? sqrt(num / den) : 0, maxabs};
  return st;
}

static void gen_normal(int t, void* buf, size_t count, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
  for (size_t i = 0; i < count; i++) {
    float v = (float)rng_normal(&s);
    uint8_t* o = (uint8_t*)buf + i * esz(t);
    if (t == ncclFloat32) memcpy(o, &v, 4);
    else narrow(t, v, o);
  }
}

/* Runs a quantized allreduce and checks it bit for bit against the reference. */
static err_stats run_quant(group* g, int t, agoq_format fmt, size_t chunk_bytes, size_t count, uint64_t seed,
                           bool check_bound) {
  bufs b;
  size_t bytes = count * esz(t);
  bufs_alloc(&b, g->n, bytes);
  for (int r = 0; r < g->n; r++) gen_normal(t, b.send[r], count, seed * 977 + (uint64_t)r);
  allreduce_all(g, &b, count, t, ncclSum);
  check_identical(g, &b, bytes);
  ref_quant_allreduce(t, fmt, 128, chunk_bytes, b.send, g->n, count, b.ref);
  if (memcmp(b.recv[0], b.ref, bytes) != 0) {
    size_t i = 0;
    while (memcmp(b.recv[0] + i * esz(t), b.ref + i * esz(t), esz(t)) == 0) i++;
    fail_msg("quantized allreduce (%zu x type %d, %d ranks) differs from the codec reference at element %zu", count,
             t, g->n, i);
  }
  err_stats st = quant_error(t, b.send, g->n, count, b.recv[0], check_bound);
  bufs_free(&b, g->n);
  return st;
}

/* ---- tests ---- */

static int setup(void** state) {
  (void)state;
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  setenv("AGOQ_SOCKET_FAMILY", "ipv4", 1);
  setenv("AGOQ_COLLNET_TIMEOUT_S", "20", 1);
  unsetenv("NCCL_COLLNET_ENABLE");
  assert_true(ref_init(&ref_bf16, 8, 7, 127, true));
  assert_true(ref_init(&ref_fp16, 5, 10, 15, true));
  assert_true(ref_init(&ref_e4m3, 4, 3, 7, false));
  assert_true(ref_init(&ref_e5m2, 5, 2, 15, true));
  env_set("int8", "64K", "1M");
  return 0;
}

static int teardown(void** state) {
  (void)state;
  free(ref_bf16.value);
  free(ref_fp16.value);
  free(ref_e4m3.value);
  free(ref_e5m2.value);
  return 0;
}

/* Runs first: init says nothing about NCCL_COLLNET_ENABLE (a program may enable CollNet
 * through ncclConfig_t.collnetEnable); the tuner warns when it knows (test_tuner). */
static void test_warns_once_when_collnet_disabled(void** state) {
  (void)state;
  capture_reset();
  void* c1 = NULL;
  void* c2 = NULL;
  assert_int_equal(agoq_coll_init(&c1, COMM_ID, capture_log), ncclSuccess);
  assert_int_equal(agoq_coll_init(&c2, COMM_ID, capture_log), ncclSuccess);
  assert_int_equal(log_warns, 0);
  assert_null(strstr(log_buf, "inactive"));
  int ndev = 0;
  assert_int_equal(agoq_coll_devices(&ndev), ncclSuccess);
  assert_true(ndev >= 1);
  assert_int_equal(agoq_coll_finalize(c1), ncclSuccess);
  assert_int_equal(agoq_coll_finalize(c2), ncclSuccess);
  assert_int_equal(agoq_coll_finalize(NULL), ncclSuccess);
  agoq_log_set_logger(NULL);
}

static void test_reduce_support(void** state) {
  (void)state;
  for (int t = 0; t < ncclNumTypes; t++) {
    for (int op = 0; op < 4; op++) {
      int s = -1;
      assert_int_equal(agoq_coll_reduce_support(t, op, &s), ncclSuccess);
      assert_int_equal(s, 1);
    }
    int s = -1;
    assert_int_equal(agoq_coll_reduce_support(t, ncclAvg, &s), ncclSuccess);
    assert_int_equal(s, 0);
  }
  int s = -1;
  assert_int_equal(agoq_coll_reduce_support(ncclNumTypes, ncclSum, &s), ncclSuccess);
  assert_int_equal(s, 0);
  assert_int_not_equal(agoq_coll_reduce_support(0, 0, NULL), ncclSuccess);
}

static void test_slicing_rule(void** state) {
  (void)state;
  size_t b[5];
  agoq_coll_slices(1000, 3, 0, b);
  assert_true(b[0] == 0 && b[1] == 333 && b[2] == 666 && b[3] == 1000);
  agoq_coll_slices(1000, 4, 128, b); /* 8 blocks: 2 each, the last short */
  assert_true(b[0] == 0 && b[1] == 256 && b[2] == 512 && b[3] == 768 && b[4] == 1000);
  agoq_coll_slices(100, 4, 128, b); /* one block: the last rank owns it */
  assert_true(b[0] == 0 && b[1] == 0 && b[2] == 0 && b[3] == 0 && b[4] == 100);
  assert_int_equal(agoq_coll_chunk_elems(1 << 20, 2, 128), 1 << 19);
  assert_int_equal(agoq_coll_chunk_elems(1000, 4, 128), 128);
  assert_int_equal(agoq_coll_chunk_elems(6, 4, 0), 1);
}

/* Every type x op on 1..4 ranks, sizes 0, 1, odd, not divisible by the rank count. */
static void test_exact_all_types_ops(void** state) {
  (void)state;
  env_set("int8", "64K", "1M");
  const size_t sizes[] = {0, 1, 1001, 4099};
  for (int n = 1; n <= MAXR; n++) {
    group g;
    group_open(&g, n);
    uint64_t seed = 1;
    for (int t = 0; t < ncclNumTypes; t++)
      for (int op = 0; op < 4; op++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) run_exact(&g, t, op, sizes[si], seed++);
    group_close(&g);
  }
}

/* Multi-chunk exact reductions (a few MiB through 16 KiB chunks), floats included. */
static void test_exact_large_pipelined(void** state) {
  (void)state;
  env_set("none", "0", "16K");
  group g;
  group_open(&g, 3);
  run_exact(&g, ncclFloat32, ncclSum, (3u << 20) / 4 + 5, 11);
  run_exact(&g, ncclBfloat16, ncclSum, (1u << 20) + 3, 12);
  run_exact(&g, ncclInt64, ncclProd, 100003, 13);
  run_exact(&g, ncclFloat8e5m2, ncclMax, 300007, 14);
  run_exact(&g, ncclFloat64, ncclMin, 200003, 15);
  group_close(&g);
}

/* NaN and Inf through the exact path: fp32 arithmetic as IEEE says, Max/Min by the rule. */
static void test_exact_non_finite(void** state) {
  (void)state;
  env_set("int8", "64K", "1M");
  group g;
  group_open(&g, 3);
  for (int op = 0; op < 4; op++) {
    bufs b;
    size_t count = 64;
    bufs_alloc(&b, 3, count * 4);
    for (int r = 0; r < 3; r++) {
      float* x = (float*)b.send[r];
      for (size_t i = 0; i < count; i++) x[i] = (float)(i % 7) - 3.0f + (float)r;
      x[(size_t)r * 5] = NAN;
      x[20 + (size_t)r] = r == 1 ? -INFINITY : INFINITY;
      x[30] = r == 0 ? -0.0f : 0.0f;
    }
    allreduce_all(&g, &b, count, ncclFloat32, op);
    ref_exact(ncclFloat32, op, b.send, 3, count, b.ref);
    check_identical(&g, &b, count * 4);
    assert_memory_equal(b.recv[0], b.ref, count * 4);
    bufs_free(&b, 3);
  }
  group_close(&g);
}

/* The quantized path on 1..4 ranks: bit-identical to the codec reference and across ranks,
 * within the error bound; sizes 1, odd, not a multiple of the block, not divisible by the
 * rank count, and a few MiB through 64 KiB chunks. */
static void test_quantized_sizes(void** state) {
  (void)state;
  env_set("int8", "0", "64K");
  const size_t sizes[] = {1, 1001, 128 * 5 + 3, 3 * 128 * 7 + 1, (3u << 20) / 2 + 5};
  const int types[] = {ncclBfloat16, ncclFloat32, ncclFloat16};
  for (int n = 1; n <= MAXR; n++) {
    group g;
    group_open(&g, n);
    for (size_t ti = 0; ti < 3; ti++)
      for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        if (n < MAXR && si == 4 && ti > 0) continue; /* the big size on every type once, at 4 ranks */
        (void)run_quant(&g, types[ti], AGOQ_FORMAT_INT8, 64 << 10, sizes[si], (uint64_t)(n * 100 + si), true);
      }
    group_close(&g);
  }
}

/* The figure: bf16 N(0,1), 4 ranks, int8 block 128, default chunk and threshold. */
static void test_quantized_error_figures(void** state) {
  (void)state;
  env_set("int8", "64K", "1M");
  group g;
  group_open(&g, 4);
  const int types[] = {ncclBfloat16, ncclFloat32, ncclFloat16};
  const char* names[] = {"bf16", "fp32", "fp16"};
  for (int ti = 0; ti < 3; ti++) {
    err_stats st = run_quant(&g, types[ti], AGOQ_FORMAT_INT8, 1 << 20, (size_t)(4u << 20) / esz(types[ti]) + 77,
                             (uint64_t)(40 + ti), true);
    print_message("quantized %s allreduce, 4 ranks, int8 block 128, 4 MiB: rel L2 %.4f%%, max abs %.4g\n", names[ti],
                  st.rel_l2 * 100, st.max_abs);
    assert_true(st.rel_l2 <= 0.012);
  }
  group_close(&g);
}

static void test_quantized_formats(void** state) {
  (void)state;
  const char* names[] = {"int4", "fp8e4m3", "fp8e5m2"};
  const agoq_format fmts[] = {AGOQ_FORMAT_INT4, AGOQ_FORMAT_FP8E4M3, AGOQ_FORMAT_FP8E5M2};
  for (int f = 0; f < 3; f++) {
    env_set(names[f], "0", "64K");
    group g;
    group_open(&g, 3);
    err_stats st = run_quant(&g, ncclBfloat16, fmts[f], 64 << 10, 100003, (uint64_t)(70 + f), false);
    print_message("quantized bf16 allreduce, 3 ranks, %s: rel L2 %.4f%%\n", names[f], st.rel_l2 * 100);
    group_close(&g);
  }
}

/* Blocks holding NaN or Inf travel raw: they come out non-finite, identical on all ranks. */
static void test_quantized_non_finite(void** state) {
  (void)state;
  env_set("int8", "0", "64K");
  group g;
  group_open(&g, 2);
  bufs b;
  size_t count = 1000;
  bufs_alloc(&b, 2, count * 4);
  for (int r = 0; r < 2; r++) {
    gen_normal(ncclFloat32, b.send[r], count, (uint64_t)r);
    ((float*)b.send[r])[10] = r ? NAN : 1.0f;
    ((float*)b.send[r])[500] = INFINITY;
  }
  allreduce_all(&g, &b, count, ncclFloat32, ncclSum);
  check_identical(&g, &b, count * 4);
  assert_true(isnan(((float*)b.recv[0])[10]));
  assert_true(isinf(((float*)b.recv[0])[500]));
  bufs_free(&b, 2);
  group_close(&g);
}

/* Overflow is Inf, as NCCL gives (fp16 loss scaling skips a step on it): an element whose
 * fp32 sum rounds to +-Inf in the output type must be +-Inf on every rank, on the quantized
 * path (where the decoder saturates finite blocks) as on the exact one. In every third block
 * the ranks contribute +-c (fp16: 30000 each, sums of +-3 c = +-90000 overflow; bf16: the
 * largest bf16 and 1.5 * 2^119, whose sum is finite in fp32 but beyond bf16's range); the
 * other blocks hold N(0,1) and must stay within the error bound. */
static void overflow_inputs(int t, uint8_t* const* send, int n, size_t count, uint64_t seed) {
  for (int r = 0; r < n; r++) {
    gen_normal(t, send[r], count, seed * 31 + (uint64_t)r);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)r + 1;
    for (size_t i = 0; i < count; i++) {
      if ((i / 128) % 3 != 1) continue;
      bool neg = rng_next(&s) & 1;
      uint16_t mag = t == ncclFloat16 ? 0x7753 /* 30000 */
                     : r == 0         ? 0x7f7f /* bf16 max */
                     : r == 1         ? 0x7b40 /* 1.5 * 2^119 */
                                      : 0;
      ((uint16_t*)send[r])[i] = (uint16_t)(mag | (neg && mag ? 0x8000u : 0u));
    }
  }
}

static void check_overflow(int t, uint8_t* const* send, int n, size_t count, const uint8_t* out, const char* path) {
  double max = t == ncclFloat16 ? 65504.0 : 0x1.fep127;
  double inf_from = t == ncclFloat16 ? 65520.0 : 0x1.ffp127;
  size_t infs = 0, finite_big = 0;
  for (size_t i = 0; i < count; i++) {
    double sum = 0;
    for (int r = 0; r < n; r++) sum += (double)widen(t, send[r] + 2 * i);
    uint16_t o = ((const uint16_t*)out)[i];
    double y = (double)widen(t, &o);
    if (fabs(sum) >= inf_from * 1.0001) {
      if (!(isinf(y) && signbit(y) == signbit(sum)))
        fail_msg("%s %s allreduce, %d ranks: element %zu sums to %g (beyond the type's range) but came out %g",
                 path, t == ncclFloat16 ? "fp16" : "bf16", n, i, sum, y);
      infs++;
    } else {
      if (!isfinite(y))
        fail_msg("%s %s allreduce, %d ranks: element %zu sums to %g (within range) but came out %g", path,
                 t == ncclFloat16 ? "fp16" : "bf16", n, i, sum, y);
      if (fabs(sum) > max / 4) finite_big++;
    }
  }
  assert_true(infs > 0);
  assert_true(finite_big > 0);
}

static void test_overflow_is_inf(void** state) {
  (void)state;
  const int types[] = {ncclFloat16, ncclBfloat16};
  const char* formats[] = {"int8", "none"};
  for (int f = 0; f < 2; f++) {
    env_set(formats[f], "0", "64K");
    group g;
    group_open(&g, 3);
    for (int ti = 0; ti < 2; ti++) {
      int t = types[ti];
      size_t count = 128 * 300 + 77, bytes = count * 2;
      bufs b;
      bufs_alloc(&b, 3, bytes);
      overflow_inputs(t, b.send, 3, count, (uint64_t)(90 + ti));
      allreduce_all(&g, &b, count, t, ncclSum);
      check_identical(&g, &b, bytes);
      check_overflow(t, b.send, 3, count, b.recv[0], formats[f]);
      if (f == 0) {
        ref_quant_allreduce(t, AGOQ_FORMAT_INT8, 128, 64 << 10, b.send, 3, count, b.ref);
      } else {
        ref_exact(t, ncclSum, b.send, 3, count, b.ref);
      }
      assert_memory_equal(b.recv[0], b.ref, bytes);
      bufs_free(&b, 3);
    }
    group_close(&g);
  }
}

/* 8 requests in flight on one group, mixed paths and types, then completed together. */
/* ---- test() moves the pipeline (AGOQ_COLLNET_ASSIST) ---- */

static void engines_hold(group* g, bool hold) {
  for (int r = 0; r < g->n; r++) agoq_coll_engine_hold(g->comm[r], hold);
}

/* With every engine thread held, only test() can move the requests: exact and quantized
 * calls complete, with the bits the engine gives (checked against the references). */
static void test_test_alone_moves_the_pipeline(void** state) {
  (void)state;
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 3);
  engines_hold(&g, true);
  run_exact(&g, ncclInt32, ncclSum, 100003, 91);
  (void)run_quant(&g, ncclBfloat16, AGOQ_FORMAT_INT8, 64 << 10, 300001, 92, false);
  engines_hold(&g, false);
  run_exact(&g, ncclInt32, ncclSum, 5000, 93); /* and the engine takes over again */
  group_close(&g);
}

/* With AGOQ_COLLNET_ASSIST=0 test() runs no pass: while the engines are held nothing
 * completes, however often it is called; released, the engines complete everything. */
static void test_no_assist_leaves_the_pipeline_to_the_engine(void** state) {
  (void)state;
  setenv("AGOQ_COLLNET_ASSIST", "0", 1);
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 3);
  engines_hold(&g, true);
  bufs b;
  size_t count = 200001;
  bufs_alloc(&b, 3, count * 2);
  void* reqs[MAXR];
  for (int r = 0; r < 3; r++) {
    gen_normal(ncclBfloat16, b.send[r], count, (uint64_t)(95 + r));
    post_allreduce(&g, r, b.send[r], b.recv[r], count, ncclBfloat16, ncclSum, &reqs[r]);
  }
  for (int pass = 0; pass < 2000; pass++) {
    for (int r = 0; r < 3; r++) {
      int done = -1, size = -1;
      assert_int_equal(agoq_coll_test(reqs[r], &done, &size), ncclSuccess);
      if (done) fail_msg("rank %d: a request completed through test() with AGOQ_COLLNET_ASSIST=0 and the engine held", r);
    }
  }
  engines_hold(&g, false);
  int sizes[MAXR];
  wait_all(reqs, 3, sizes, NULL, 60);
  check_identical(&g, &b, count * 2);
  ref_quant_allreduce(ncclBfloat16, AGOQ_FORMAT_INT8, 128, 64 << 10, b.send, 3, count, b.ref);
  assert_memory_equal(b.recv[0], b.ref, count * 2);
  bufs_free(&b, 3);
  group_close(&g);
  unsetenv("AGOQ_COLLNET_ASSIST");
  agoq_params_reset();
}

static void test_requests_in_flight(void** state) {
  (void)state;
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 4);
  enum { NREQ = 8 };
  const int types[NREQ] = {ncclBfloat16, ncclInt32, ncclFloat32, ncclUint8, ncclBfloat16, ncclFloat64, ncclFloat16, ncclInt8};
  const int ops[NREQ] = {ncclSum, ncclSum, ncclMax, ncclProd, ncclSum, ncclSum, ncclSum, ncclMin};
  const size_t counts[NREQ] = {300001, 5000, 70000, 12345, 1, 65536, 200000, 0};
  bufs b[NREQ];
  void* reqs[NREQ * MAXR];
  for (int q = 0; q < NREQ; q++) {
    bufs_alloc(&b[q], 4, counts[q] * esz(types[q]));
    for (int r = 0; r < 4; r++) {
      if (types[q] == ncclBfloat16 || types[q] == ncclFloat16) gen_normal(types[q], b[q].send[r], counts[q], (uint64_t)(q * 10 + r));
      else gen_exact(types[q], b[q].send[r], counts[q], (uint64_t)(q * 10 + r));
    }
  }
  for (int q = 0; q < NREQ; q++)
    for (int r = 0; r < 4; r++)
      post_allreduce(&g, r, b[q].send[r], b[q].recv[r], counts[q], types[q], ops[q], &reqs[q * MAXR + r]);
  int sizes[NREQ * MAXR];
  wait_all(reqs, NREQ * MAXR, sizes, NULL, 120);
  for (int q = 0; q < NREQ; q++) {
    size_t bytes = counts[q] * esz(types[q]);
    check_identical(&g, &b[q], bytes);
    bool quant = (types[q] == ncclBfloat16 || types[q] == ncclFloat16 || types[q] == ncclFloat32) &&
                 ops[q] == ncclSum && bytes >= (64 << 10);
    if (quant) ref_quant_allreduce(types[q], AGOQ_FORMAT_INT8, 128, 64 << 10, b[q].send, 4, counts[q], b[q].ref);
    else ref_exact(types[q], ops[q], b[q].send, 4, counts[q], b[q].ref);
    assert_memory_equal(b[q].recv[0], b[q].ref, bytes);
    bufs_free(&b[q], 4);
  }
  group_close(&g);
}

/* In place (send == recv), exact and quantized. */
static void test_in_place(void** state) {
  (void)state;
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 3);
  for (int pass = 0; pass < 2; pass++) {
    int t = pass ? ncclBfloat16 : ncclInt32;
    size_t count = 200003, bytes = count * esz(t);
    uint8_t* in[MAXR];
    uint8_t* io[MAXR];
    uint8_t* ref = malloc(bytes);
    for (int r = 0; r < 3; r++) {
      in[r] = malloc(bytes);
      io[r] = malloc(bytes);
      if (pass) gen_normal(t, in[r], count, (uint64_t)r + 5);
      else gen_exact(t, in[r], count, (uint64_t)r + 5);
      memcpy(io[r], in[r], bytes);
    }
    void* reqs[MAXR];
    for (int r = 0; r < 3; r++) post_allreduce(&g, r, io[r], io[r], count, t, ncclSum, &reqs[r]);
    wait_all(reqs, 3, NULL, NULL, 60);
    if (pass) ref_quant_allreduce(t, AGOQ_FORMAT_INT8, 128, 64 << 10, in, 3, count, ref);
    else ref_exact(t, ncclSum, in, 3, count, ref);
    for (int r = 0; r < 3; r++) {
      assert_memory_equal(io[r], ref, bytes);
      free(in[r]);
      free(io[r]);
    }
    free(ref);
  }
  group_close(&g);
}

/* ---- reducescatter and allgather over NCCL-style windows ---- */

typedef struct {
  size_t bpr, wo, wb;
} window;

/* Global input of rank r: n * bpr bytes; window [wo, wo + wb). */
static void run_reducescatter(group* g, int t, int op, window w, int nparts, bool quant, size_t chunk_bytes,
                              uint64_t seed) {
  int n = g->n;
  size_t e = esz(t), total = (size_t)n * w.bpr;
  uint8_t* global[MAXR];
  uint8_t* recv[MAXR];
  for (int r = 0; r < n; r++) {
    global[r] = malloc(total + 1);
    recv[r] = malloc(w.bpr + 64);
    if (quant) gen_normal(t, global[r], total / e, seed + (uint64_t)r);
    else gen_exact(t, global[r], total / e, seed + (uint64_t)r);
    memset(recv[r], 0xa5, w.bpr + 64);
  }
  void* reqs[MAXR];
  for (int r = 0; r < n; r++) {
    agoq_coll_sge parts[2];
    size_t split = nparts == 2 ? (w.wb / e / 3) * e : w.wb;
    parts[0] = (agoq_coll_sge){global[r] + w.wo, split, NULL};
    parts[1] = (agoq_coll_sge){global[r] + w.wo + split, w.wb - split, NULL};
    /* recv_data is where this rank's part of the window starts (NCCL offsets it the same). */
    size_t mb = (size_t)r * w.bpr, me = mb + w.bpr;
    size_t lo = w.wo > mb ? w.wo : mb;
    uint8_t* dst = recv[r] + (lo < me ? lo - mb : 0);
    reqs[r] = NULL;
    while (reqs[r] == NULL)
      assert_int_equal(agoq_coll_ireducescatter(g->comm[r], nparts, parts, dst, w.bpr, w.wo, w.wb, t, op, NULL, &reqs[r]),
                       ncclSuccess);
  }
  int sizes[MAXR];
  wait_all(reqs, n, sizes, NULL, 60);
  for (int r = 0; r < n; r++) {
    size_t mb = (size_t)r * w.bpr, me = mb + w.bpr;
    size_t lo = w.wo > mb ? w.wo : mb, hi = w.wo + w.wb < me ? w.wo + w.wb : me;
    size_t mine = hi > lo ? hi - lo : 0;
    assert_int_equal(sizes[r], (int)mine);
    if (mine == 0) continue;
    uint8_t* ref = malloc(mine);
    if (quant) {
      /* Chunk c holds elements [c * P, (c + 1) * P) of every rank's part of the window. */
      size_t pe = agoq_coll_chunk_elems(chunk_bytes / (size_t)n, e, 128), m = mine / e;
      for (size_t c0 = 0; c0 < m; c0 += pe)
        ref_quant_slice(t, AGOQ_FORMAT_INT8, 128, global, n, lo / e + c0, m - c0 < pe ? m - c0 : pe, false,
                        ref + c0 * e);
    } else {
      uint8_t* in[MAXR];
      for (int k = 0; k < n; k++) in[k] = global[k] + lo;
      ref_exact(t, op, in, n, mine / e, ref);
    }
    assert_memory_equal(recv[r] + (lo - mb), ref, mine);
    for (size_t i = 0; i < lo - mb; i++) assert_int_equal(recv[r][i], 0xa5);
    for (size_t i = hi - mb; i < w.bpr + 64; i++) assert_int_equal(recv[r][i], 0xa5);
    free(ref);
  }
  for (int r = 0; r < n; r++) {
    free(global[r]);
    free(recv[r]);
  }
}

static void run_allgather(group* g, window w, int nparts, uint64_t seed) {
  int n = g->n;
  size_t total = (size_t)n * w.bpr;
  uint8_t* mine[MAXR];
  uint8_t* out[MAXR];
  uint8_t* global = malloc(total + 1);
  for (int r = 0; r < n; r++) {
    mine[r] = malloc(w.bpr + 1);
    gen_exact(ncclUint8, mine[r], w.bpr, seed + (uint64_t)r);
    memcpy(global + (size_t)r * w.bpr, mine[r], w.bpr);
    out[r] = malloc(w.wb + 64);
    memset(out[r], 0xa5, w.wb + 64);
  }
  void* reqs[MAXR];
  for (int r = 0; r < n; r++) {
    agoq_coll_sge parts[2];
    size_t split = nparts == 2 ? w.wb / 2 + 1 : w.wb;
    if (split > w.wb) split = w.wb;
    parts[0] = (agoq_coll_sge){out[r], split, NULL};
    parts[1] = (agoq_coll_sge){out[r] + split, w.wb - split, NULL};
    size_t mb = (size_t)r * w.bpr;
    uint8_t* send = mine[r] + (w.wo > mb && w.wo < mb + w.bpr ? w.wo - mb : 0);
    reqs[r] = NULL;
    while (reqs[r] == NULL)
      assert_int_equal(agoq_coll_iallgather(g->comm[r], send, nparts, parts, w.bpr, w.wo, w.wb, NULL, &reqs[r]),
                       ncclSuccess);
  }
  int sizes[MAXR];
  wait_all(reqs, n, sizes, NULL, 60);
  for (int r = 0; r < n; r++) {
    assert_int_equal(sizes[r], (int)w.wb);
    assert_memory_equal(out[r], global + w.wo, w.wb);
    for (size_t i = w.wb; i < w.wb + 64; i++) assert_int_equal(out[r][i], 0xa5);
    free(mine[r]);
    free(out[r]);
  }
  free(global);
}

static void test_reducescatter(void** state) {
  (void)state;
  for (int n = 1; n <= MAXR; n++) {
    env_set("int8", "64K", "64K");
    group g;
    group_open(&g, n);
    size_t bpr = 4 * 50001; /* fp32/int32 elements: not a multiple of the block */
    window whole = {bpr, 0, (size_t)n * bpr};
    window part = {bpr, bpr / 2 - bpr / 2 % 4, 0}; /* starts inside rank 0's part */
    part.wb = bpr + 4 * 999 < (size_t)n * bpr - part.wo ? bpr + 4 * 999 : (size_t)n * bpr - part.wo;
    run_reducescatter(&g, ncclInt32, ncclSum, whole, 1, false, 64 << 10, 1);
    run_reducescatter(&g, ncclFloat32, ncclMax, part, 1, false, 64 << 10, 2);
    run_reducescatter(&g, ncclFloat32, ncclSum, whole, 2, true, 64 << 10, 3);
    run_reducescatter(&g, ncclFloat32, ncclSum, part, 1, true, 64 << 10, 4);
    window bf = {2 * 70001, 0, (size_t)n * 2 * 70001};
    run_reducescatter(&g, ncclBfloat16, ncclSum, bf, 1, true, 64 << 10, 5);
    window small = {2 * 3, 2, 2 * 3 * (size_t)n - 2}; /* below the threshold: exact */
    run_reducescatter(&g, ncclBfloat16, ncclSum, small, 1, false, 64 << 10, 6);
    group_close(&g);
  }
}

static void test_allgather(void** state) {
  (void)state;
  for (int n = 1; n <= MAXR; n++) {
    env_set("int8", "64K", "64K");
    group g;
    group_open(&g, n);
    size_t bpr = 300007;
    run_allgather(&g, (window){bpr, 0, (size_t)n * bpr}, 1, 1);
    run_allgather(&g, (window){bpr, bpr / 3, n > 1 ? bpr : bpr - bpr / 3}, 2, 2);
    run_allgather(&g, (window){bpr, 0, 0}, 1, 3);
    run_allgather(&g, (window){7, 3, (size_t)n * 7 - 3}, 1, 4);
    group_close(&g);
  }
}

/* A rank that disappears (its group closed, connections gone) makes the others' pending
 * requests fail within seconds, never hang; later calls fail at once. */
static void test_peer_loss_fails_pending(void** state) {
  (void)state;
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 3);
  size_t count = 1 << 20;
  bufs b;
  bufs_alloc(&b, 3, count * 4);
  for (int r = 0; r < 3; r++) gen_normal(ncclFloat32, b.send[r], count, (uint64_t)r);
  void* reqs[2];
  for (int r = 0; r < 2; r++) post_allreduce(&g, r, b.send[r], b.recv[r], count, ncclFloat32, ncclSum, &reqs[r]);
  double t0 = now_s();
  assert_int_equal(agoq_coll_close_coll(g.comm[2]), ncclSuccess);
  g.comm[2] = NULL;
  ncclResult_t results[2];
  wait_all(reqs, 2, NULL, results, 10);
  double took = now_s() - t0;
  print_message("pending requests failed %.3f s after the peer left\n", took);
  for (int r = 0; r < 2; r++) assert_int_not_equal(results[r], ncclSuccess);
  assert_true(took < 5);
  void* req = (void*)1;
  assert_int_not_equal(agoq_coll_iallreduce(g.comm[0], b.send[0], b.recv[0], 10, ncclFloat32, ncclSum, NULL, NULL, &req), ncclSuccess);
  bufs_free(&b, 3);
  group_close(&g);
}

/* Closing with requests in flight (never tested) is safe on every rank. */
static void test_close_with_requests_in_flight(void** state) {
  (void)state;
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 4);
  size_t count = 1 << 19;
  bufs b;
  bufs_alloc(&b, 4, count * 2);
  void* reqs[4];
  for (int r = 0; r < 4; r++) {
    gen_normal(ncclBfloat16, b.send[r], count, (uint64_t)r);
    post_allreduce(&g, r, b.send[r], b.recv[r], count, ncclBfloat16, ncclSum, &reqs[r]);
  }
  group_close(&g);
  bufs_free(&b, 4);
}

/* finalize before closeColl: the engine stops (pending requests fail), close frees. */
static void test_finalize_before_close(void** state) {
  (void)state;
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 2);
  bufs b;
  bufs_alloc(&b, 2, 4000);
  gen_exact(ncclInt32, b.send[0], 1000, 3);
  void* req;
  post_allreduce(&g, 0, b.send[0], b.recv[0], 1000, ncclInt32, ncclSum, &req); /* rank 1 never joins */
  for (int r = 0; r < 2; r++) assert_int_equal(agoq_coll_finalize(g.ctx[r]), ncclSuccess);
  ncclResult_t res;
  wait_all(&req, 1, NULL, &res, 5);
  assert_int_not_equal(res, ncclSuccess);
  for (int r = 0; r < 2; r++) assert_int_equal(agoq_coll_close_coll(g.comm[r]), ncclSuccess);
  bufs_free(&b, 2);
}

/* A peer that never connects: connect fails on its own after AGOQ_COLLNET_TIMEOUT_S. */
static void test_connect_timeout(void** state) {
  (void)state;
  setenv("AGOQ_COLLNET_TIMEOUT_S", "2", 1);
  env_set("int8", "64K", "1M");
  group g;
  double t0 = now_s();
  group_start(&g, 2, 1);
  double took = now_s() - t0;
  assert_int_not_equal(g.res[0], ncclSuccess);
  assert_null(g.comm[0]);
  assert_true(took >= 1.9 && took < 6);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(agoq_coll_close_listen(g.listen[r]), ncclSuccess);
    assert_int_equal(agoq_coll_finalize(g.ctx[r]), ncclSuccess);
  }
  setenv("AGOQ_COLLNET_TIMEOUT_S", "20", 1);
  agoq_params_reset();
}

/* Every rank of g (listening, handles in hptr) connects and is refused as invalid usage, each
 * with one WARN, captured in log_buf. */
static void connect_all_refused(group* g) {
  capture_reset();
  agoq_log_set_logger(capture_log);
  for (int r = 0; r < g->n; r++) {
    void* c = (void*)1;
    assert_int_equal(agoq_coll_connect(g->hptr, g->n, r, g->listen[r], &c), ncclInvalidUsage);
    assert_null(c);
  }
  agoq_log_set_logger(NULL);
  pthread_mutex_lock(&log_mu);
  assert_int_equal(log_warns, g->n);
  pthread_mutex_unlock(&log_mu);
}

/* Ranks with different settings fail alike, at once: the handles carry the settings, and
 * each rank's WARN names a differing peer, every differing variable and both values. Rank 0
 * runs int8 with 1M chunks, ranks 1 and 2 int4 with 2M: rank 0 sees two peers differ, ranks 1
 * and 2 only rank 0. */
static void test_mismatched_settings_fail_everywhere(void** state) {
  (void)state;
  group g;
  memset(&g, 0, sizeof g);
  g.n = 3;
  for (int r = 0; r < 3; r++) {
    env_set(r ? "int4" : "int8", "64K", r ? "2M" : "1M");
    assert_int_equal(agoq_coll_init(&g.ctx[r], COMM_ID, NULL), ncclSuccess);
    assert_int_equal(agoq_coll_listen(g.ctx[r], 0, g.handles[r], &g.listen[r]), ncclSuccess);
    g.hptr[r] = g.handles[r];
  }
  connect_all_refused(&g);
  pthread_mutex_lock(&log_mu);
  assert_non_null(strstr(log_buf, "CollNet group: rank 1 has AGOQ_FORMAT=int4 and AGOQ_COLLNET_CHUNK=2M (2097152 "
                                  "bytes), this rank (0) has AGOQ_FORMAT=int8 and AGOQ_COLLNET_CHUNK=1M (1048576 "
                                  "bytes); every rank must use the same values (1 more rank(s) differ from this "
                                  "rank too)\n"));
  for (int r = 1; r < 3; r++) {
    char want[512];
    snprintf(want, sizeof want,
             "CollNet group: rank 0 has AGOQ_FORMAT=int8 and AGOQ_COLLNET_CHUNK=1M (1048576 bytes), this rank (%d) "
             "has AGOQ_FORMAT=int4 and AGOQ_COLLNET_CHUNK=2M (2097152 bytes); every rank must use the same values\n",
             r);
    assert_non_null(strstr(log_buf, want));
  }
  /* The variables that agree are not named. */
  assert_null(strstr(log_buf, "AGOQ_MIN_BYTES"));
  assert_null(strstr(log_buf, "AGOQ_BLOCK"));
  pthread_mutex_unlock(&log_mu);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(agoq_coll_close_listen(g.listen[r]), ncclSuccess);
    assert_int_equal(agoq_coll_finalize(g.ctx[r]), ncclSuccess);
  }
  env_set("int8", "64K", "1M");
}

/* A handle whose rank block (its link rate, bytes [96, 128)) is corrupt fails group creation
 * on every rank, naming that rank: a rate nobody reported must not steer the schedule. And
 * the block a listen writes decodes. */
static void test_corrupt_rank_block_fails_everywhere(void** state) {
  (void)state;
  group g;
  memset(&g, 0, sizeof g);
  g.n = 3;
  env_set("int8", "64K", "1M");
  for (int r = 0; r < 3; r++) {
    assert_int_equal(agoq_coll_init(&g.ctx[r], COMM_ID, NULL), ncclSuccess);
    assert_int_equal(agoq_coll_listen(g.ctx[r], 0, g.handles[r], &g.listen[r]), ncclSuccess);
    uint32_t mbps;
    assert_true(agoq_coll_rank_decode(g.handles[r] + AGOQ_COLL_RANK_OFFSET, &mbps));
    g.hptr[r] = g.handles[r];
  }
  /* NCCL's copy of rank 1's handle, as every rank would receive it. */
  g.handles[1][AGOQ_COLL_RANK_OFFSET + 9] ^= 0x40;
  connect_all_refused(&g);
  pthread_mutex_lock(&log_mu);
  assert_non_null(strstr(log_buf, "CollNet connect: the rank block of rank 1's handle is corrupt"));
  pthread_mutex_unlock(&log_mu);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(agoq_coll_close_listen(g.listen[r]), ncclSuccess);
    assert_int_equal(agoq_coll_finalize(g.ctx[r]), ncclSuccess);
  }
}

static void test_memory_and_flush(void** state) {
  (void)state;
  env_set("int8", "64K", "1M");
  group g;
  group_open(&g, 1);
  void* mh = NULL;
  char buf[64];
  memset(buf, 0, sizeof buf);
  assert_int_equal(agoq_coll_reg_mr(g.comm[0], buf, sizeof buf, NCCL_PTR_HOST, &mh), ncclSuccess);
  assert_non_null(mh);
  assert_int_equal(agoq_coll_dereg_mr(g.comm[0], mh), ncclSuccess);
  assert_int_equal(agoq_coll_reg_mr_dmabuf(g.comm[0], buf, sizeof buf, NCCL_PTR_HOST, 0, -1, &mh), ncclSuccess);
  assert_int_equal(agoq_coll_dereg_mr(g.comm[0], mh), ncclSuccess);
  assert_int_not_equal(agoq_coll_reg_mr(g.comm[0], buf, sizeof buf, NCCL_PTR_CUDA, &mh), ncclSuccess);
  assert_int_not_equal(agoq_coll_reg_mr_dmabuf(g.comm[0], buf, sizeof buf, NCCL_PTR_DMABUF, 0, 3, &mh), ncclSuccess);
  assert_int_equal(agoq_coll_dereg_mr(g.comm[0], NULL), ncclSuccess);
  void* req = NULL;
  assert_int_not_equal(agoq_coll_iflush(g.comm[0], buf, 8, NULL, &req), ncclSuccess);
  /* Arguments NCCL never passes are refused, not crashed on. */
  assert_int_not_equal(agoq_coll_iallreduce(g.comm[0], buf, buf, 4, ncclNumTypes, ncclSum, NULL, NULL, &req), ncclSuccess);
  assert_int_not_equal(agoq_coll_iallreduce(g.comm[0], buf, buf, 4, ncclInt8, ncclAvg, NULL, NULL, &req), ncclSuccess);
  agoq_coll_sge part = {buf, 8, NULL};
  assert_int_not_equal(agoq_coll_iallgather(g.comm[0], buf, 1, &part, 4, 0, 8, NULL, &req), ncclSuccess);
  int done;
  assert_int_not_equal(agoq_coll_test(buf, &done, NULL), ncclSuccess);
  group_close(&g);
}

static void test_stats_line(void** state) {
  (void)state;
  setenv("AGOQ_STATS", "1", 1);
  env_set("int8", "64K", "64K");
  group g;
  group_open(&g, 2);
  capture_reset();
  agoq_log_set_logger(capture_log);
  run_quant(&g, ncclBfloat16, AGOQ_FORMAT_INT8, 64 << 10, 200000, 9, true);
  run_exact(&g, ncclInt32, ncclSum, 1000, 9);
  /* The lines themselves (written to stderr, not the logger) are test_stats' subject; the
   * group's registered counters outlive it. */
  agoq_stats_entry* st = ((agoq_coll_comm*)g.comm[0])->st;
  group_close(&g);
  agoq_log_set_logger(NULL);
  setenv("AGOQ_STATS", "0", 1);
  agoq_params_reset();
  assert_true(st->registered && atomic_load(&st->closed));
  assert_int_equal(agoq_stats_get(&st->path[AGOQ_STATS_QUANT].calls), 1);
  assert_int_equal(agoq_stats_get(&st->path[AGOQ_STATS_EXACT].calls), 1);
  assert_int_equal(agoq_stats_get(&st->exact[AGOQ_EXACT_TYPE]), 1);
  assert_int_equal(st->rank, 0);
  assert_int_equal(st->nranks, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warns_once_when_collnet_disabled),
      cmocka_unit_test(test_reduce_support),
      cmocka_unit_test(test_slicing_rule),
      cmocka_unit_test(test_exact_all_types_ops),
      cmocka_unit_test(test_exact_large_pipelined),
      cmocka_unit_test(test_exact_non_finite),
      cmocka_unit_test(test_quantized_sizes),
      cmocka_unit_test(test_quantized_error_figures),
      cmocka_unit_test(test_quantized_formats),
      cmocka_unit_test(test_quantized_non_finite),
      cmocka_unit_test(test_overflow_is_inf),
      cmocka_unit_test(test_requests_in_flight),
      cmocka_unit_test(test_test_alone_moves_the_pipeline),
      cmocka_unit_test(test_no_assist_leaves_the_pipeline_to_the_engine),
      cmocka_unit_test(test_in_place),
      cmocka_unit_test(test_reducescatter),
      cmocka_unit_test(test_allgather),
      cmocka_unit_test(test_peer_loss_fails_pending),
      cmocka_unit_test(test_close_with_requests_in_flight),
      cmocka_unit_test(test_finalize_before_close),
      cmocka_unit_test(test_connect_timeout),
      cmocka_unit_test(test_mismatched_settings_fail_everywhere),
      cmocka_unit_test(test_corrupt_rank_block_fails_everywhere),
      cmocka_unit_test(test_memory_and_flush),
      cmocka_unit_test(test_stats_line),
  };
  /* CMOCKA_TEST_FILTER=test_overflow_is_inf runs one test (the whole file takes minutes). */
  const char* filter = getenv("CMOCKA_TEST_FILTER");
  if (filter != NULL && filter[0] != '\0') cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, setup, teardown);
}
