/* Codec round trips (kernels/agoq_codec.h) on every kernel table the CPU has:
 *  - bodies and decoded values equal, bit for bit, those of a transcription of the header's
 *    arithmetic and layout written here (fp32 operations in C, libm rounding, the format
 *    reference of codec_test_ref.h), on random data with special blocks mixed in;
 *  - error bounds per format, no Inf from a finite block, special blocks (zeros, NaN/Inf,
 *    denormals, values near the fp16 and fp32 maxima), every awkward length;
 *  - decode-accumulate, stochastic rounding (determinism, unbiasedness, index offsets),
 *    multi-threaded variants (same bytes), argument and body validation;
 *  - the relative L2 error of int8 block 128 on N(0,1) data (the project's figure). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "agoq_codec.h"
#include "agoq_fpconv.h" /* only for Philox, which test_codec_convert checks against known answers */
#include "codec_test_ref.h"

#if defined(__SANITIZE_THREAD__)
#define CODEC_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CODEC_TEST_TSAN 1
#endif
#endif
#ifndef CODEC_TEST_TSAN
#define CODEC_TEST_TSAN 0
#endif

static ref_format ref_bf16, ref_fp16, ref_e4m3, ref_e5m2;
static const uint32_t blocks[] = {32, 64, 128, 256, 512, 1024};
#define NBLOCKS (sizeof blocks / sizeof blocks[0])
static const char* const isas[] = {"portable", "avx2", "avx512"};
#define NISAS (sizeof isas / sizeof isas[0])

/* ---- random data ----------------------------------------------------------------------------- */

typedef struct {
  uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t* r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545f4914f6cdd1dull;
}

static double rng_unit(rng_t* r) {
  return (double)(rng_next(r) >> 11) * 0x1p-53;
}

static double rng_normal(rng_t* r) {
  double u1 = rng_unit(r), u2 = rng_unit(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static size_t esize_of(agoq_dtype t) {
  return t == AGOQ_DTYPE_FP32 ? 4 : 2;
}

static const ref_format* ref16(agoq_dtype t) {
  return t == AGOQ_DTYPE_BF16 ? &ref_bf16 : &ref_fp16;
}

/* Element i of an array of dtype t, widened exactly by the reference. */
static float elem_get(agoq_dtype t, const void* a, size_t i) {
  if (t == AGOQ_DTYPE_FP32) return ((const float*)a)[i];
  return ref_widen16(ref16(t), ((const uint16_t*)a)[i]);
}

/* Stores x (a float) as dtype t, rounding like the raw path. */
static void elem_set(agoq_dtype t, void* a, size_t i, float x) {
  if (t == AGOQ_DTYPE_FP32) ((float*)a)[i] = x;
  else ((uint16_t*)a)[i] = ref_narrow16(ref16(t), x, false);
}

static void elem_set_bits(agoq_dtype t, void* a, size_t i, uint32_t bits) {
  if (t == AGOQ_DTYPE_FP32) memcpy((float*)a + i, &bits, 4);
  else ((uint16_t*)a)[i] = (uint16_t)bits;
}

/* Fills n elements: Gaussian blocks at random magnitudes, and with `specials` a mix of
 * all-zero, NaN (quiet and signalling), Inf, denormal, near-max and constant blocks. */
static void fill(agoq_dtype t, void* a, size_t n, uint32_t block, rng_t* r, bool specials) {
  int kmax = t == AGOQ_DTYPE_FP16 ? 8 : 30;
  for (size_t b0 = 0; b0 < n; b0 += block) {
    size_t len = n - b0 < block ? n - b0 : block;
    unsigned mode = specials ? (unsigned)(rng_next(r) % 16) : 15;
    int k = (int)(rng_next(r) % (uint64_t)(2 * kmax + 1)) - kmax;
    for (size_t i = b0; i < b0 + len; i++) {
      switch (mode) {
        case 0: elem_set(t, a, i, (rng_next(r) & 1) ? -0.0f : 0.0f); break;
        case 1: /* subnormals of the type (fp32: and of fp16/bf16 magnitude) */
          if (t == AGOQ_DTYPE_FP32)
            elem_set_bits(t, a, i, ((uint32_t)rng_next(r) & 0x80000000u) |
                                       (((uint32_t)rng_next(r) & 0x7fffffu) >> (rng_next(r) % 20)));
          else
            elem_set_bits(t, a, i, (uint32_t)(rng_next(r) & (t == AGOQ_DTYPE_FP16 ? 0x83ffu : 0x807fu)));
          break;
        case 2: { /* near the largest finite value */
          float top = t == AGOQ_DTYPE_FP32 ? FLT_MAX : t == AGOQ_DTYPE_FP16 ? 65504.0f : 0x1.fep127f;
          float x = (float)((double)top * (1.0 - rng_unit(r) * 0.01));
          if (rng_next(r) % 4 == 0) x = top;
          elem_set(t, a, i, (rng_next(r) & 1) ? -x : x);
          break;
        }
        case 3: elem_set(t, a, i, 1.25f); break;
        default: elem_set(t, a, i, (float)ldexp(rng_normal(r), k)); break;
      }
    }
    /* Put a NaN or Inf into some blocks, which escapes them. */
    if (specials && rng_next(r) % 8 == 0) {
      size_t i = b0 + (size_t)(rng_next(r) % len);
      static const uint32_t f32[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffa5a5a5u};
      static const uint32_t b16[] = {0x7f80u, 0xff80u, 0x7fc0u, 0x7f81u, 0xffa5u};
      static const uint32_t h16[] = {0x7c00u, 0xfc00u, 0x7e00u, 0x7c01u, 0xfd55u};
      size_t w = (size_t)(rng_next(r) % 5);
      elem_set_bits(t, a, i, t == AGOQ_DTYPE_FP32 ? f32[w] : t == AGOQ_DTYPE_BF16 ? b16[w] : h16[w]);
    }
  }
}

/* ---- the reference codec: agoq_codec.h transcribed ---------------------------------------- */

static float format_m(agoq_format f) {
  return f == AGOQ_FORMAT_INT8 ? 127.0f : f == AGOQ_FORMAT_INT4 ? 7.0f : f == AGOQ_FORMAT_FP8E4M3 ? 448.0f : 57344.0f;
}

typedef struct {
  uint8_t* body;
  size_t len, escaped, nb, bitmap, codes;
} ref_body;

static void ref_quantize(const agoq_codec_params* p, const void* src, size_t n, ref_body* out) {
  size_t es = esize_of(p->dtype), B = p->block;
  if (p->format == AGOQ_FORMAT_NONE) { /* the raw elements */
    memset(out, 0, sizeof *out);
    out->body = malloc(n * es + 1);
    assert_non_null(out->body);
    memcpy(out->body, src, n * es);
    out->len = n * es;
    return;
  }
  size_t nb = (n + B - 1) / B, bitmap = (nb + 63) / 64 * 8;
  size_t codes = p->format == AGOQ_FORMAT_INT4 ? (n + 1) / 2 : n;
  size_t escaped = 0;
  for (size_t b = 0; b < nb; b++) {
    for (size_t i = b * B; i < n && i < (b + 1) * B; i++) {
      if (!isfinite(elem_get(p->dtype, src, i))) {
        escaped++;
        break;
      }
    }
  }
  size_t len = bitmap + 4 * nb + codes + escaped * B * es;
  uint8_t* body = calloc(len ? len : 1, 1);
  assert_non_null(body);
  uint8_t* sc = body + bitmap;
  uint8_t* cd = sc + 4 * nb;
  uint8_t* raw = cd + codes;
  size_t k = 0;
  float m = format_m(p->format);
  for (size_t b = 0; b < nb; b++) {
    size_t s0 = b * B, len_b = n - s0 < B ? n - s0 : B;
    bool esc = false;
    float amax = 0.0f;
    for (size_t i = s0; i < s0 + len_b; i++) {
      float x = elem_get(p->dtype, src, i);
      if (!isfinite(x)) esc = true;
      else if (fabsf(x) > amax) amax = fabsf(x);
    }
    if (esc) {
      body[b / 8] |= (uint8_t)(1u << (b % 8));
      memcpy(raw + k * B * es, (const uint8_t*)src + s0 * es, len_b * es);
      k++;
      continue;
    }
    float s = amax / m;
    memcpy(sc + 4 * b, &s, 4);
    if (s == 0.0f) continue;
    for (size_t i = s0; i < s0 + len_b; i++) {
      float v = elem_get(p->dtype, src, i) / s;
      uint32_t code;
      if (p->format == AGOQ_FORMAT_INT8 || p->format == AGOQ_FORMAT_INT4) {
        float q;
        if (p->stochastic) {
          float t = v + agoq_stochastic_u(p->seed, p->first_index + i);
          q = floorf(t);
        } else {
          q = rintf(v);
        }
        q = q > m ? m : q < -m ? -m : q;
        code = (uint32_t)(int32_t)q;
      } else {
        code = ref_fp8_encode(p->format == AGOQ_FORMAT_FP8E4M3 ? &ref_e4m3 : &ref_e5m2, (double)v);
      }
      if (p->format == AGOQ_FORMAT_INT4) cd[i / 2] |= (uint8_t)((code & 0xfu) << (4 * (i & 1)));
      else cd[i] = (uint8_t)code;
    }
  }
  out->body = body;
  out->len = len;
  out->escaped = escaped;
  out->nb = nb;
  out->bitmap = bitmap;
  out->codes = codes;
}

/* Decoded element i in fp32 before output rounding (y = sat(q * s)), or the raw value of an
 * escaped block (*raw set). */
static float ref_decode_elem(const agoq_codec_params* p, const ref_body* rb, size_t n, size_t i,
                             bool* raw) {
  size_t B = p->block, b = p->format == AGOQ_FORMAT_NONE ? 0 : i / B, es = esize_of(p->dtype);
  const uint8_t* sc = rb->body + rb->bitmap;
  const uint8_t* cd = sc + 4 * rb->nb;
  *raw = p->format == AGOQ_FORMAT_NONE || ((rb->body[b / 8] >> (b % 8)) & 1u);
  if (*raw) {
    size_t k = 0;
    for (size_t j = 0; j < b; j++) k += (rb->body[j / 8] >> (j % 8)) & 1u;
    const uint8_t* r = p->format == AGOQ_FORMAT_NONE ? rb->body + i * es
                                                     : cd + rb->codes + k * B * es + (i - b * B) * es;
    if (p->dtype == AGOQ_DTYPE_FP32) {
      float x;
      memcpy(&x, r, 4);
      return x;
    }
    uint16_t h;
    memcpy(&h, r, 2);
    return ref_widen16(ref16(p->dtype), h);
  }
  (void)n;
  float s, q;
  memcpy(&s, sc + 4 * b, 4);
  switch (p->format) {
    case AGOQ_FORMAT_INT8: q = (float)(int8_t)cd[i]; break;
    case AGOQ_FORMAT_INT4: {
      int nib = (cd[i / 2] >> (4 * (i & 1))) & 0xf;
      q = (float)(nib >= 8 ? nib - 16 : nib);
      break;
    }
    default: {
      bool nan, inf;
      q = (float)ref_decode(p->format == AGOQ_FORMAT_FP8E4M3 ? &ref_e4m3 : &ref_e5m2, cd[i], &nan, &inf);
      break;
    }
  }
  float y = q * s;
  if (isinf(y)) y = copysignf(FLT_MAX, y);
  return y;
}

/* The expected output bits of element i decoded to type out. */
static uint32_t ref_out_bits(const agoq_codec_params* p, const ref_body* rb, const void* src,
                             size_t n, size_t i, agoq_dtype out) {
  bool raw;
  float y = ref_decode_elem(p, rb, n, i, &raw);
  if (raw && out == p->dtype) { /* identical bits */
    if (out == AGOQ_DTYPE_FP32) return ref_bits_of(((const float*)src)[i]);
    return ((const uint16_t*)src)[i];
  }
  if (out == AGOQ_DTYPE_FP32) return ref_bits_of(y);
  return ref_narrow16(ref16(out), y, !raw);
}

/* ---- comparison helpers ---------------------------------------------------------------------- */

static uint32_t out_bits(agoq_dtype out, const void* a, size_t i) {
  if (out == AGOQ_DTYPE_FP32) return ref_bits_of(((const float*)a)[i]);
  return ((const uint16_t*)a)[i];
}

static bool set_isa(size_t k) {
  if (!agoq_codec_isa_available(isas[k])) return false;
  assert_int_equal(agoq_codec_set_isa(isas[k]), 0);
  assert_string_equal(agoq_codec_isa(), isas[k]);
  return true;
}

/* Quantizes with the library and compares with the reference: body bytes, every decode
 * type, and decode-accumulate. */
static void check_case(const agoq_codec_params* p, const void* src, size_t n, rng_t* r) {
  ref_body rb;
  ref_quantize(p, src, n, &rb);
  size_t cap = agoq_codec_body_size_max(p, n);
  assert_true(cap >= rb.len);
  uint8_t* body = malloc(cap + 1);
  assert_non_null(body);
  size_t len = 0, esc = 99;
  assert_int_equal(agoq_quantize(p, src, n, body, cap, &len, &esc), AGOQ_CODEC_OK);
  assert_int_equal(len, rb.len);
  assert_int_equal(esc, rb.escaped);
  assert_int_equal(agoq_codec_body_size(p, n, esc), len);
  if (len && memcmp(body, rb.body, len) != 0) {
    for (size_t i = 0; i < len; i++) {
      if (body[i] != rb.body[i]) {
        fprintf(stderr, "%s %s %s B=%u n=%zu stoch=%d: body byte %zu of %zu: 0x%02x want 0x%02x"
                " (bitmap %zu, scales %zu, codes %zu)\n",
                agoq_codec_isa(), agoq_format_name(p->format), agoq_dtype_name(p->dtype), p->block,
                n, p->stochastic, i, len, body[i], rb.body[i], rb.bitmap, 4 * rb.nb, rb.codes);
        break;
      }
    }
    fail();
  }
  /* A body exactly at capacity fits; one byte less does not. */
  if (len > 0) {
    size_t len2;
    assert_int_equal(agoq_quantize(p, src, n, body, len - 1, &len2, NULL), AGOQ_CODEC_ESPACE);
    assert_int_equal(agoq_quantize(p, src, n, body, len, &len2, NULL), AGOQ_CODEC_OK);
  }
  void* dst = malloc(n * 4 + 4);
  float* acc = malloc(n * 4 + 4);
  assert_non_null(dst);
  assert_non_null(acc);
  for (int out = 0; out < AGOQ_DTYPE_COUNT; out++) {
    memset(dst, 0xa5, n * 4 + 4);
    assert_int_equal(agoq_dequantize(p, body, len, n, (agoq_dtype)out, dst), AGOQ_CODEC_OK);
    for (size_t i = 0; i < n; i++) {
      uint32_t want = ref_out_bits(p, &rb, src, n, i, (agoq_dtype)out);
      if (out_bits((agoq_dtype)out, dst, i) != want) {
        fprintf(stderr, "%s %s %s->%s B=%u n=%zu: element %zu decodes to 0x%08x, want 0x%08x\n",
                agoq_codec_isa(), agoq_format_name(p->format), agoq_dtype_name(p->dtype),
                agoq_dtype_name((agoq_dtype)out), p->block, n, i, out_bits((agoq_dtype)out, dst, i), want);
        fail();
      }
    }
    /* Nothing written past n elements. */
    assert_int_equal(((uint8_t*)dst)[n * esize_of((agoq_dtype)out)], 0xa5);
  }
  for (size_t i = 0; i < n; i++) acc[i] = (float)ldexp(rng_normal(r), (int)(rng_next(r) % 9) - 4);
  float* want = malloc(n * 4 + 4);
  assert_non_null(want);
  for (size_t i = 0; i < n; i++) {
    bool raw;
    want[i] = acc[i] + ref_decode_elem(p, &rb, n, i, &raw);
  }
  assert_int_equal(agoq_dequantize_accumulate(p, body, len, n, acc), AGOQ_CODEC_OK);
  for (size_t i = 0; i < n; i++) {
    if (ref_bits_of(acc[i]) != ref_bits_of(want[i])) {
      fprintf(stderr, "%s %s %s B=%u n=%zu: acc[%zu] = %a, want %a\n", agoq_codec_isa(),
              agoq_format_name(p->format), agoq_dtype_name(p->dtype), p->block, n, i, (double)acc[i],
              (double)want[i]);
      fail();
    }
  }
  free(want);
  free(acc);
  free(dst);
  free(body);
  free(rb.body);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static int setup(void** state) {
  (void)state;
  bool ok = ref_init(&ref_bf16, 8, 7, 127, true) && ref_init(&ref_fp16, 5, 10, 15, true) &&
            ref_init(&ref_e4m3, 4, 3, 7, false) && ref_init(&ref_e5m2, 5, 2, 15, true);
  return ok ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  agoq_codec_set_isa(NULL);
  free(ref_bf16.value);
  free(ref_fp16.value);
  free(ref_e4m3.value);
  free(ref_e5m2.value);
  return 0;
}

/* Every table, format, type, block size and stochastic mode, at the awkward lengths. */
static void test_matches_reference(void** state) {
  (void)state;
  rng_t r = {0x1234567887654321ull};
  int tables = 0;
  for (size_t k = 0; k < NISAS; k++) {
    if (!set_isa(k)) continue;
    tables++;
    for (int f = AGOQ_FORMAT_NONE; f < AGOQ_FORMAT_COUNT; f++) {
      for (int t = 0; t < AGOQ_DTYPE_COUNT; t++) {
        for (size_t bi = 0; bi < NBLOCKS; bi++) {
          uint32_t B = blocks[bi];
          if (f == AGOQ_FORMAT_NONE && bi > 0) continue;
          /* The long length on every other block size keeps the run short under TSan. */
          size_t lens[] = {0, 1, 2, B - 1, B, B + 1, 3 * B + 7, bi % 2 ? 2 * B + 9 : 20 * B + 5};
          for (int st = 0; st < 2; st++) {
            if (st && f != AGOQ_FORMAT_INT8 && f != AGOQ_FORMAT_INT4) continue;
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
              size_t n = lens[li];
              agoq_codec_params p = {.format = (agoq_format)f, .dtype = (agoq_dtype)t, .block = B,
                                     .stochastic = st != 0, .seed = rng_next(&r),
                                     .first_index = st ? rng_next(&r) : 0};
              void* src = malloc(n * 4 + 4);
              assert_non_null(src);
              fill((agoq_dtype)t, src, n, B, &r, true);
              check_case(&p, src, n, &r);
              free(src);
            }
          }
        }
      }
    }
  }
  assert_true(tables >= 1);
  agoq_codec_set_isa(NULL);
}

/* Per-format error bounds on random data; no Inf from a finite block. */
static double error_bound(agoq_format f, bool stochastic, float s, float x) {
  double ax = fabs((double)x), sd = (double)s, slack = 0x1p-21 * (ax + sd);
  switch (f) {
    case AGOQ_FORMAT_INT8:
    case AGOQ_FORMAT_INT4: return (stochastic ? sd : sd / 2) + slack;
    case AGOQ_FORMAT_FP8E4M3: return fmax(ax * 0x1p-4, sd * 0x1p-10) * (1 + 0x1p-20) + slack;
    default: return fmax(ax * 0x1p-3, sd * 0x1p-17) * (1 + 0x1p-20) + slack;
  }
}

static double out_rounding(agoq_dtype out, double y) {
  switch (out) {
    case AGOQ_DTYPE_FP32: return 0.0;
    case AGOQ_DTYPE_BF16: return fmax(fabs(y) * 0x1p-8, 0x1p-134);
    default: return fmax(fabs(y) * 0x1p-11, 0x1p-25);
  }
}

static void check_bounds(const agoq_codec_params* p, const void* src, size_t n) {
  size_t cap = agoq_codec_body_size_max(p, n), len;
  uint8_t* body = malloc(cap + 1);
  float* y32 = malloc(n * 4 + 4);
  void* yo = malloc(n * 4 + 4);
  assert_true(body && y32 && yo);
  assert_int_equal(agoq_quantize(p, src, n, body, cap, &len, NULL), AGOQ_CODEC_OK);
  assert_int_equal(agoq_dequantize(p, body, len, n, AGOQ_DTYPE_FP32, y32), AGOQ_CODEC_OK);
  assert_int_equal(agoq_dequantize(p, body, len, n, p->dtype, yo), AGOQ_CODEC_OK);
  size_t nb = (n + p->block - 1) / p->block, bitmap = (nb + 63) / 64 * 8;
  for (size_t b = 0; b < nb; b++) {
    if ((body[b / 8] >> (b % 8)) & 1u) continue;
    float s, amax = 0.0f;
    memcpy(&s, body + bitmap + 4 * b, 4);
    size_t s0 = b * p->block, e = s0 + p->block < n ? s0 + p->block : n;
    for (size_t i = s0; i < e; i++) amax = fmaxf(amax, fabsf(elem_get(p->dtype, src, i)));
    assert_true(s == amax / format_m(p->format));
    for (size_t i = s0; i < e; i++) {
      float x = elem_get(p->dtype, src, i), y = y32[i], o = elem_get(p->dtype, yo, i);
      assert_true(isfinite(y) && isfinite(o));
      if (s == 0.0f) { /* amax 0 or underflow: +0 everywhere */
        assert_int_equal(ref_bits_of(y), 0);
        assert_int_equal(ref_bits_of(o), 0);
        continue;
      }
      if (s < FLT_MIN) continue; /* a subnormal scale is coarse; the reference test covers it */
      double err = fabs((double)x - (double)y), bound = error_bound(p->format, p->stochastic, s, x);
      if (err > bound) {
        fprintf(stderr, "%s %s B=%u: |x - y| = %g > %g (x %a, y %a, s %a)\n", agoq_format_name(p->format),
                agoq_dtype_name(p->dtype), p->block, err, bound, (double)x, (double)y, (double)s);
        fail();
      }
      double err_o = fabs((double)x - (double)o);
      assert_true(err_o <= bound + out_rounding(p->dtype, y));
    }
  }
  free(yo);
  free(y32);
  free(body);
}

static void test_error_bounds(void** state) {
  (void)state;
  rng_t r = {0xfeedface12345678ull};
  const size_t n = 20000;
  void* src = malloc(n * 4);
  assert_non_null(src);
  for (size_t k = 0; k < NISAS; k++) {
    if (!set_isa(k)) continue;
    for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++) {
      for (int t = 0; t < AGOQ_DTYPE_COUNT; t++) {
        for (size_t bi = 0; bi < NBLOCKS; bi += 2) {
          for (int st = 0; st < 2; st++) {
            if (st && f != AGOQ_FORMAT_INT8 && f != AGOQ_FORMAT_INT4) continue;
            agoq_codec_params p = {.format = (agoq_format)f, .dtype = (agoq_dtype)t,
                                   .block = blocks[bi], .stochastic = st != 0, .seed = 7};
            fill((agoq_dtype)t, src, n, blocks[bi], &r, true);
            check_bounds(&p, src, n);
          }
        }
      }
    }
  }
  free(src);
  agoq_codec_set_isa(NULL);
}

/* 10^6 + 3 elements for every block size (formats and types rotating with it): bounds, and
 * the multi-threaded variants give the same bytes and values as the single-threaded ones. */
static void test_large_and_mt(void** state) {
  (void)state;
  rng_t r = {0xabcdef0123456789ull};
  const size_t n = 1000003;
  void* src = malloc(n * 4);
  assert_non_null(src);
  const int threads[] = {0, 2, 3, 8};
  for (size_t bi = 0; bi < NBLOCKS; bi++) {
    agoq_format f = (agoq_format)(AGOQ_FORMAT_INT8 + bi % 4);
    agoq_dtype t = (agoq_dtype)(bi % AGOQ_DTYPE_COUNT);
    agoq_codec_params p = {.format = f, .dtype = t, .block = blocks[bi],
                           .stochastic = bi == 4, .seed = 99, .first_index = 1000};
    fill(t, src, n, blocks[bi], &r, true);
    check_bounds(&p, src, n);
    size_t cap = agoq_codec_body_size_max(&p, n), len1, len2, e1, e2;
    uint8_t* b1 = malloc(cap);
    uint8_t* b2 = malloc(cap);
    float* d1 = malloc(n * 4);
    float* d2 = malloc(n * 4);
    assert_true(b1 && b2 && d1 && d2);
    assert_int_equal(agoq_quantize(&p, src, n, b1, cap, &len1, &e1), AGOQ_CODEC_OK);
    assert_true(e1 > 0); /* the raw region is part of what must match */
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
      int nt = threads[ti];
      memset(b2, 0x5a, cap);
      assert_int_equal(agoq_quantize_mt(&p, src, n, b2, cap, &len2, &e2, nt), AGOQ_CODEC_OK);
      assert_int_equal(len1, len2);
      assert_int_equal(e1, e2);
      assert_memory_equal(b1, b2, len1);
      agoq_dtype out = (agoq_dtype)((bi + ti) % AGOQ_DTYPE_COUNT);
      assert_int_equal(agoq_dequantize(&p, b1, len1, n, out, d1), AGOQ_CODEC_OK);
      assert_int_equal(agoq_dequantize_mt(&p, b1, len1, n, out, d2, nt), AGOQ_CODEC_OK);
      assert_memory_equal(d1, d2, n * esize_of(out));
      for (size_t i = 0; i < n; i++) d1[i] = d2[i] = (float)(i % 1000) * 0.25f;
      assert_int_equal(agoq_dequantize_accumulate(&p, b1, len1, n, d1), AGOQ_CODEC_OK);
      assert_int_equal(agoq_dequantize_accumulate_mt(&p, b1, len1, n, d2, nt), AGOQ_CODEC_OK);
      assert_memory_equal(d1, d2, n * 4);
      /* Capacity checks hold for the threaded quantize too. */
      assert_int_equal(agoq_quantize_mt(&p, src, n, b2, len1 - 1, &len2, NULL, nt), AGOQ_CODEC_ESPACE);
    }
    free(d2);
    free(d1);
    free(b2);
    free(b1);
  }
  free(src);
}

/* Several threads (as the transport's progress threads would) run threaded calls at once:
 * they share the helper pool and each gets its own bytes. */
typedef struct {
  const void* src;
  size_t n;
  const uint8_t* want;
  size_t want_len;
  agoq_codec_params p;
  int failures;
} concurrent_arg;

static void* concurrent_main(void* v) {
  concurrent_arg* a = v;
  size_t cap = agoq_codec_body_size_max(&a->p, a->n), len;
  uint8_t* body = malloc(cap);
  float* y = malloc(a->n * 4);
  float* y2 = malloc(a->n * 4);
  if (body == NULL || y == NULL || y2 == NULL) {
    a->failures++;
  } else {
    for (int iter = 0; iter < 8; iter++) {
      if (agoq_quantize_mt(&a->p, a->src, a->n, body, cap, &len, NULL, 2 + iter % 3) != AGOQ_CODEC_OK ||
          len != a->want_len || memcmp(body, a->want, len) != 0)
        a->failures++;
      if (agoq_dequantize_mt(&a->p, body, len, a->n, AGOQ_DTYPE_FP32, y, 0) != AGOQ_CODEC_OK ||
          agoq_dequantize(&a->p, body, len, a->n, AGOQ_DTYPE_FP32, y2) != AGOQ_CODEC_OK ||
          memcmp(y, y2, a->n * 4) != 0)
        a->failures++;
    }
  }
  free(y2);
  free(y);
  free(body);
  return NULL;
}

static void test_mt_concurrent_callers(void** state) {
  (void)state;
  enum { NCALLERS = 4 };
  const size_t n = 300007;
  rng_t r = {77};
  concurrent_arg args[NCALLERS];
  pthread_t th[NCALLERS];
  for (int i = 0; i < NCALLERS; i++) {
    agoq_codec_params p = {.format = (agoq_format)(AGOQ_FORMAT_INT8 + i), .dtype = AGOQ_DTYPE_FP32,
                           .block = 64u << i, .stochastic = i == 1, .seed = 3};
    float* src = malloc(n * 4);
    assert_non_null(src);
    fill(AGOQ_DTYPE_FP32, src, n, p.block, &r, true);
    size_t cap = agoq_codec_body_size_max(&p, n);
    uint8_t* want = malloc(cap);
    assert_non_null(want);
    assert_int_equal(agoq_quantize(&p, src, n, want, cap, &args[i].want_len, NULL), AGOQ_CODEC_OK);
    args[i].src = src;
    args[i].n = n;
    args[i].want = want;
    args[i].p = p;
    args[i].failures = 0;
  }
  for (int i = 0; i < NCALLERS; i++) assert_int_equal(pthread_create(&th[i], NULL, concurrent_main, &args[i]), 0);
  for (int i = 0; i < NCALLERS; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(args[i].failures, 0);
    free((void*)args[i].want);
    free((void*)args[i].src);
  }
}

#if !CODEC_TEST_TSAN
/* A forked child has none of the parent's helper threads; threaded calls still work there
 * (and its exit does not wait for threads that do not exist). TSan forbids threads after
 * a fork of a threaded process, so this one runs in the other builds. */
static int count_tasks(void) {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  if (d == NULL) return -1;
  for (struct dirent* e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static void test_mt_after_fork(void** state) {
  (void)state;
  const size_t n = 400009;
  float* src = malloc(n * 4);
  assert_non_null(src);
  rng_t r = {5};
  fill(AGOQ_DTYPE_FP32, src, n, 128, &r, false);
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  size_t cap = agoq_codec_body_size_max(&p, n), len, len2;
  uint8_t* a = malloc(cap);
  uint8_t* b = malloc(cap);
  assert_true(a && b);
  assert_int_equal(agoq_quantize_mt(&p, src, n, a, cap, &len, NULL, 0), AGOQ_CODEC_OK); /* pool up */
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int ok = agoq_quantize_mt(&p, src, n, b, cap, &len2, NULL, 0) == AGOQ_CODEC_OK && len2 == len &&
             memcmp(a, b, len) == 0;
    /* The child started helpers of its own (the parent's do not exist here). */
    if (sysconf(_SC_NPROCESSORS_ONLN) > 1) ok = ok && count_tasks() >= 2;
    exit(ok ? 0 : 1); /* exit, not _exit: the library's destructor runs in the child */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  free(b);
  free(a);
  free(src);
}
#endif

/* Special blocks, explicitly. */
static void test_special_blocks(void** state) {
  (void)state;
  float src[256], y[256];
  uint8_t body[4096];
  size_t len, esc;
  /* +-0 blocks and amax = 0: scale +0, every element decodes to +0. */
  for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP32, .block = 32};
    for (int i = 0; i < 64; i++) src[i] = (i & 1) ? -0.0f : 0.0f;
    assert_int_equal(agoq_quantize(&p, src, 64, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(esc, 0);
    for (int i = 0; i < 64; i++) y[i] = -1.0f;
    assert_int_equal(agoq_dequantize(&p, body, len, 64, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    for (int i = 0; i < 64; i++) assert_int_equal(ref_bits_of(y[i]), 0);
    /* A scale that underflows: the block decodes to +0. */
    for (int i = 0; i < 64; i++) src[i] = (i & 1) ? -0x1p-149f : 0x1p-149f;
    assert_int_equal(agoq_quantize(&p, src, 64, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(&p, body, len, 64, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    for (int i = 0; i < 64; i++) assert_int_equal(ref_bits_of(y[i]), 0);
  }
  /* fp8 keeps -0 as -0 when the block is not all zero. */
  {
    agoq_codec_params p = {.format = AGOQ_FORMAT_FP8E4M3, .dtype = AGOQ_DTYPE_FP32, .block = 32};
    for (int i = 0; i < 32; i++) src[i] = i == 0 ? 1.0f : -0.0f;
    assert_int_equal(agoq_quantize(&p, src, 32, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(&p, body, len, 32, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    assert_true(y[0] == 1.0f);
    for (int i = 1; i < 32; i++) assert_int_equal(ref_bits_of(y[i]), 0x80000000u);
    /* ...and int formats make it +0. */
    p.format = AGOQ_FORMAT_INT8;
    assert_int_equal(agoq_quantize(&p, src, 32, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(&p, body, len, 32, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    for (int i = 1; i < 32; i++) assert_int_equal(ref_bits_of(y[i]), 0);
  }
  /* NaN / Inf blocks round-trip bit for bit, signalling NaNs included; neighbours do not. */
  for (int t = 0; t < AGOQ_DTYPE_COUNT; t++) {
    for (int f = AGOQ_FORMAT_NONE; f < AGOQ_FORMAT_COUNT; f++) {
      agoq_codec_params p = {.format = (agoq_format)f, .dtype = (agoq_dtype)t, .block = 64};
      uint8_t in[100 * 4], out[100 * 4];
      rng_t r = {(uint64_t)(t * 10 + f + 1)};
      fill((agoq_dtype)t, in, 100, 64, &r, false);
      static const uint32_t f32[] = {0x7f800001u, 0xffbfffffu, 0x7fc00001u, 0xff800000u};
      static const uint32_t h16[] = {0x7c01u, 0xfdffu, 0x7e01u, 0xfc00u};
      static const uint32_t b16[] = {0x7f81u, 0xffbfu, 0x7fc1u, 0xff80u};
      for (int j = 0; j < 4; j++)
        elem_set_bits((agoq_dtype)t, in, (size_t)(70 + 7 * j),
                      t == AGOQ_DTYPE_FP32 ? f32[j] : t == AGOQ_DTYPE_FP16 ? h16[j] : b16[j]);
      assert_int_equal(agoq_quantize(&p, in, 100, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
      assert_int_equal(esc, f == AGOQ_FORMAT_NONE ? 0 : 1);
      assert_int_equal(agoq_dequantize(&p, body, len, 100, (agoq_dtype)t, out), AGOQ_CODEC_OK);
      size_t es = esize_of((agoq_dtype)t);
      assert_memory_equal(in + 64 * es, out + 64 * es, 36 * es); /* the escaped (short) block */
      /* The escaped block's scale is +0 and its codes are 0. */
      if (f != AGOQ_FORMAT_NONE) {
        uint32_t s;
        memcpy(&s, body + 8 + 4, 4);
        assert_int_equal(s, 0);
        size_t c0 = f == AGOQ_FORMAT_INT4 ? 32 : 64, c1 = f == AGOQ_FORMAT_INT4 ? 50 : 100;
        for (size_t i = c0; i < c1; i++) assert_int_equal(body[8 + 8 + i], 0);
      }
    }
  }
  /* Values near the fp16 maximum decode to finite fp16 (saturating), for every format. */
  for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP16, .block = 32};
    uint16_t h[32], o[32];
    for (int i = 0; i < 32; i++) h[i] = (uint16_t)((i & 1 ? 0x8000u : 0) | (0x7bffu - (unsigned)(i / 4)));
    assert_int_equal(agoq_quantize(&p, h, 32, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(&p, body, len, 32, AGOQ_DTYPE_FP16, o), AGOQ_CODEC_OK);
    for (int i = 0; i < 32; i++) {
      assert_true((o[i] & 0x7fffu) < 0x7c00u);
      assert_int_equal(o[i] & 0x8000u, h[i] & 0x8000u);
    }
    assert_true((o[0] & 0x7fffu) >= 0x7b00u);
  }
  /* amax = FLT_MAX with int8: 127 * s overflows fp32; decoding saturates to FLT_MAX. */
  {
    agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 32};
    for (int i = 0; i < 32; i++) src[i] = i == 3 ? -FLT_MAX : (float)i;
    assert_int_equal(agoq_quantize(&p, src, 32, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(esc, 0);
    assert_int_equal(agoq_dequantize(&p, body, len, 32, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    assert_true(y[3] == -FLT_MAX);
    float acc[32] = {0};
    assert_int_equal(agoq_dequantize_accumulate(&p, body, len, 32, acc), AGOQ_CODEC_OK);
    assert_true(acc[3] == -FLT_MAX);
    uint16_t o[32];
    assert_int_equal(agoq_dequantize(&p, body, len, 32, AGOQ_DTYPE_BF16, o), AGOQ_CODEC_OK);
    assert_int_equal(o[3], 0xff7fu);
    assert_int_equal(agoq_dequantize(&p, body, len, 32, AGOQ_DTYPE_FP16, o), AGOQ_CODEC_OK);
    assert_int_equal(o[3], 0xfbffu);
  }
  /* fp32 denormal inputs with a representable scale keep their sign and rough size. */
  {
    agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 32};
    for (int i = 0; i < 32; i++) src[i] = (float)(i - 16) * 0x1p-130f;
    assert_int_equal(agoq_quantize(&p, src, 32, body, sizeof body, &len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(&p, body, len, 32, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    for (int i = 0; i < 32; i++) assert_true(fabsf(y[i] - src[i]) <= 0x1p-130f);
  }
}

/* Stochastic rounding: deterministic per (seed, index), unbiased, split-invariant. */
static void test_stochastic(void** state) {
  (void)state;
  const size_t n = 1 << 18;
  float* x = malloc(n * 4);
  float* y = malloc(n * 4);
  float* y2 = malloc(n * 4);
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128,
                         .stochastic = true, .seed = 0x1234, .first_index = 77};
  size_t cap = agoq_codec_body_size_max(&p, n), len, len2;
  uint8_t* b1 = malloc(cap);
  uint8_t* b2 = malloc(cap);
  assert_true(x && y && y2 && b1 && b2);
  /* Every block: amax 127 (s = 1) and values with fractional part 0.3: RNE is biased by -0.3,
   * stochastic rounding is not. */
  for (size_t i = 0; i < n; i++) x[i] = (i % 128 == 0) ? 127.0f : (float)((int)(i % 200) - 100) + 0.3f;
  for (int fi = 0; fi < 2; fi++) {
    p.format = fi ? AGOQ_FORMAT_INT4 : AGOQ_FORMAT_INT8;
    float scale = fi ? 127.0f / 7.0f : 1.0f; /* int4: s = 127 / 7 */
    assert_int_equal(agoq_quantize(&p, x, n, b1, cap, &len, NULL), AGOQ_CODEC_OK);
    assert_int_equal(agoq_quantize(&p, x, n, b2, cap, &len2, NULL), AGOQ_CODEC_OK);
    assert_memory_equal(b1, b2, len); /* deterministic */
    assert_int_equal(agoq_dequantize(&p, b1, len, n, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)y[i] - (double)x[i];
    double mean = sum / (double)n / scale;
    printf("stochastic %s: mean error %.5f s over %zu elements\n", fi ? "int4" : "int8", mean, n);
    assert_true(fabs(mean) < 0.005);
    /* RNE on the same data is visibly biased (the test can tell the two apart). */
    if (!fi) {
      agoq_codec_params q = p;
      q.stochastic = false;
      assert_int_equal(agoq_quantize(&q, x, n, b2, cap, &len2, NULL), AGOQ_CODEC_OK);
      assert_int_equal(agoq_dequantize(&q, b2, len2, n, AGOQ_DTYPE_FP32, y2), AGOQ_CODEC_OK);
      double s2 = 0;
      for (size_t i = 0; i < n; i++) s2 += (double)y2[i] - (double)x[i];
      assert_true(s2 / (double)n < -0.2);
    }
    /* Another seed gives other codes. */
    agoq_codec_params o = p;
    o.seed = 0x1235;
    assert_int_equal(agoq_quantize(&o, x, n, b2, cap, &len2, NULL), AGOQ_CODEC_OK);
    assert_true(memcmp(b1, b2, len) != 0);
    /* [0, n) in one call == [0, k) and [k, n) with first_index moved by k (k on a block). */
    size_t k = 128 * 777;
    agoq_codec_params a = p, b = p;
    b.first_index = p.first_index + k;
    size_t la, lb;
    assert_int_equal(agoq_quantize(&a, x, k, b2, cap, &la, NULL), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(&a, b2, la, k, AGOQ_DTYPE_FP32, y2), AGOQ_CODEC_OK);
    assert_int_equal(agoq_quantize(&b, x + k, n - k, b2, cap, &lb, NULL), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(&b, b2, lb, n - k, AGOQ_DTYPE_FP32, y2 + k), AGOQ_CODEC_OK);
    assert_memory_equal(y, y2, n * 4);
  }
  /* fp8 + stochastic is an argument error. */
  p.format = AGOQ_FORMAT_FP8E4M3;
  assert_int_equal(agoq_quantize(&p, x, n, b1, cap, &len, NULL), AGOQ_CODEC_EARG);
  free(b2);
  free(b1);
  free(y2);
  free(y);
  free(x);
}

/* The project's accuracy figure: int8, block 128, N(0,1). */
static void test_relative_l2(void** state) {
  (void)state;
  const size_t n = 1000003;
  rng_t r = {0x5eed5eed5eed5eedull};
  float* x = malloc(n * 4);
  float* y = malloc(n * 4);
  uint16_t* h = malloc(n * 2);
  uint16_t* ho = malloc(n * 2);
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  size_t cap = agoq_codec_body_size_max(&p, n), len;
  uint8_t* body = malloc(cap);
  assert_true(x && y && h && ho && body);
  for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(&r);
  assert_int_equal(agoq_quantize(&p, x, n, body, cap, &len, NULL), AGOQ_CODEC_OK);
  assert_int_equal(agoq_dequantize(&p, body, len, n, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)y[i] - (double)x[i];
    num += d * d;
    den += (double)x[i] * x[i];
  }
  double rel32 = sqrt(num / den);
  p.dtype = AGOQ_DTYPE_BF16;
  for (size_t i = 0; i < n; i++) h[i] = ref_narrow16(&ref_bf16, x[i], false);
  assert_int_equal(agoq_quantize(&p, h, n, body, cap, &len, NULL), AGOQ_CODEC_OK);
  assert_int_equal(agoq_dequantize(&p, body, len, n, AGOQ_DTYPE_BF16, ho), AGOQ_CODEC_OK);
  num = den = 0;
  for (size_t i = 0; i < n; i++) {
    double a = ref_widen16(&ref_bf16, h[i]), b = ref_widen16(&ref_bf16, ho[i]);
    num += (b - a) * (b - a);
    den += a * a;
  }
  double rel16 = sqrt(num / den);
  printf("int8 block 128, N(0,1), %zu elements: relative L2 error fp32 %.4f%%, bf16 %.4f%%\n", n,
         rel32 * 100, rel16 * 100);
  assert_true(rel32 <= 0.007);
  assert_true(rel16 <= 0.008);
  free(body);
  free(ho);
  free(h);
  free(y);
  free(x);
}

/* Argument and body validation, names. */
static void test_validation(void** state) {
  (void)state;
  float x[300] = {1.0f, 2.0f, -3.0f};
  uint8_t body[4096];
  float y[300];
  size_t len;
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  assert_int_equal(agoq_codec_params_check(&p), AGOQ_CODEC_OK);
  agoq_codec_params bad = p;
  bad.block = 100;
  assert_int_equal(agoq_quantize(&bad, x, 300, body, sizeof body, &len, NULL), AGOQ_CODEC_EARG);
  bad.block = 2048;
  assert_int_equal(agoq_codec_params_check(&bad), AGOQ_CODEC_EARG);
  bad = p;
  bad.format = AGOQ_FORMAT_COUNT;
  assert_int_equal(agoq_codec_params_check(&bad), AGOQ_CODEC_EARG);
  bad = p;
  bad.dtype = (agoq_dtype)7;
  assert_int_equal(agoq_codec_params_check(&bad), AGOQ_CODEC_EARG);
  assert_int_equal(agoq_codec_params_check(NULL), AGOQ_CODEC_EARG);
  assert_int_equal(agoq_quantize(&p, NULL, 3, body, sizeof body, &len, NULL), AGOQ_CODEC_EARG);
  assert_int_equal(agoq_quantize(&p, x, 300, body, sizeof body, NULL, NULL), AGOQ_CODEC_EARG);
  assert_int_equal(agoq_quantize(&p, x, 300, body, 10, &len, NULL), AGOQ_CODEC_ESPACE);
  assert_int_equal(agoq_quantize_mt(&p, x, 300, body, sizeof body, &len, NULL, -1), AGOQ_CODEC_EARG);
  /* Sizes: 3 blocks -> 8 bytes of bitmap, 12 of scales, 300 codes, + raw blocks of 512 bytes. */
  assert_int_equal(agoq_codec_nblocks(&p, 300), 3);
  assert_int_equal(agoq_codec_body_size(&p, 300, 0), 8 + 12 + 300);
  assert_int_equal(agoq_codec_body_size(&p, 300, 1), 8 + 12 + 300 + 512);
  assert_int_equal(agoq_codec_body_size_max(&p, 300), 8 + 12 + 300 + 3 * 512);
  assert_int_equal(agoq_codec_body_size(&p, 300, 4), SIZE_MAX);
  assert_int_equal(agoq_codec_body_size(&p, SIZE_MAX, 0), SIZE_MAX);
  agoq_codec_params p4 = p;
  p4.format = AGOQ_FORMAT_INT4;
  assert_int_equal(agoq_codec_body_size(&p4, 301, 0), 8 + 12 + 151);
  agoq_codec_params pn = {.format = AGOQ_FORMAT_NONE, .dtype = AGOQ_DTYPE_BF16};
  assert_int_equal(agoq_codec_body_size(&pn, 300, 0), 600);
  assert_int_equal(agoq_codec_nblocks(&pn, 300), 0);
  /* Bodies: a wrong length, a bit past the last block, a count that disagrees. */
  assert_int_equal(agoq_quantize(&p, x, 300, body, sizeof body, &len, NULL), AGOQ_CODEC_OK);
  assert_int_equal(len, 320);
  assert_int_equal(agoq_dequantize(&p, body, len, 300, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
  assert_int_equal(agoq_dequantize(&p, body, len - 1, 300, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_ECORRUPT);
  assert_int_equal(agoq_dequantize(&p, body, len + 1, 300, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_ECORRUPT);
  assert_int_equal(agoq_dequantize(&p, body, 5, 300, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_ECORRUPT);
  assert_int_equal(agoq_dequantize(&p, body, len, 299, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_ECORRUPT);
  assert_int_equal(agoq_dequantize(&p, body, len, 300, (agoq_dtype)5, y), AGOQ_CODEC_EARG);
  assert_int_equal(agoq_dequantize(&p, NULL, len, 300, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_EARG);
  body[0] |= 0x08; /* block 3 of 3 blocks */
  assert_int_equal(agoq_dequantize(&p, body, len, 300, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_ECORRUPT);
  assert_int_equal(agoq_dequantize_mt(&p, body, len, 300, AGOQ_DTYPE_FP32, y, 2), AGOQ_CODEC_ECORRUPT);
  body[0] = 0x01; /* claims block 0 escaped: the raw block is missing */
  assert_int_equal(agoq_dequantize_accumulate(&p, body, len, 300, y), AGOQ_CODEC_ECORRUPT);
  /* n = 0 is a valid, empty body. */
  assert_int_equal(agoq_quantize(&p, x, 0, NULL, 0, &len, NULL), AGOQ_CODEC_OK);
  assert_int_equal(len, 0);
  assert_int_equal(agoq_dequantize(&p, NULL, 0, 0, AGOQ_DTYPE_FP32, NULL), AGOQ_CODEC_OK);
  /* Names. */
  agoq_format f;
  agoq_dtype t;
  for (int i = 0; i < AGOQ_FORMAT_COUNT; i++) {
    assert_int_equal(agoq_format_from_name(agoq_format_name((agoq_format)i), &f), 0);
    assert_int_equal(f, i);
  }
  for (int i = 0; i < AGOQ_DTYPE_COUNT; i++) {
    assert_int_equal(agoq_dtype_from_name(agoq_dtype_name((agoq_dtype)i), &t), 0);
    assert_int_equal(t, i);
  }
  assert_int_equal(agoq_dtype_from_name("bfloat16", &t), 0);
  assert_int_equal(t, AGOQ_DTYPE_BF16);
  assert_int_equal(agoq_dtype_from_name("float32", &t), 0);
  assert_int_equal(agoq_dtype_from_name("float16", &t), 0);
  assert_int_equal(t, AGOQ_DTYPE_FP16);
  assert_int_equal(agoq_format_from_name("int3", &f), -1);
  assert_int_equal(agoq_dtype_from_name("fp64", &t), -1);
  assert_string_equal(agoq_format_name(AGOQ_FORMAT_FP8E5M2), "fp8e5m2");
  assert_int_equal(agoq_dtype_size(AGOQ_DTYPE_FP16), 2);
  assert_string_equal(agoq_codec_status_str(AGOQ_CODEC_ESPACE), "output buffer too small");
  /* ISA selection. */
  assert_true(agoq_codec_isa_available("portable"));
  assert_false(agoq_codec_isa_available("sse9"));
  assert_int_equal(agoq_codec_set_isa("sse9"), -1);
  assert_int_equal(agoq_codec_set_isa("portable"), 0);
  assert_string_equal(agoq_codec_isa(), "portable");
  assert_int_equal(agoq_codec_set_isa("auto"), 0);
  printf("codec ISA by default: %s\n", agoq_codec_isa());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_reference), cmocka_unit_test(test_error_bounds),
      cmocka_unit_test(test_special_blocks),    cmocka_unit_test(test_stochastic),
      cmocka_unit_test(test_large_and_mt),      cmocka_unit_test(test_relative_l2),
      cmocka_unit_test(test_validation),        cmocka_unit_test(test_mt_concurrent_callers),
#if !CODEC_TEST_TSAN
      cmocka_unit_test(test_mt_after_fork),
#endif
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
