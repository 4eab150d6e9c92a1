/*
 * SIMD codec kernels (AVX2, AVX-512) against the portable table: identical bits for the
 * scales, escape flags, codes, every decoded output type and decode-accumulate, on 10^7
 * random elements per format and input type, on every length 0 .. 2*1024+3 for two block
 * sizes, on partial block ranges, and on arbitrary (network-garbage) bodies. Also the
 * public API pinned to each ISA against the portable ISA.
 *
 * Sanitizer and unoptimised builds check 10^6 random elements instead of 10^7 and every
 * 7th small length, and shorter public-API arrays (the portable reference is scalar);
 * AGOQ_TEST_CODEC_SIMD_N overrides the random count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_codec.h"
#include "cpu/agoq_codec_cpu.h"
#include "cpu/agoq_fpconv.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SIMD_TEST_SLOW 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define SIMD_TEST_SLOW 1
#endif
#endif
#if !defined(SIMD_TEST_SLOW) && !defined(__OPTIMIZE__)
#define SIMD_TEST_SLOW 1
#endif
#ifdef SIMD_TEST_SLOW
#define SIMD_TEST_N_DEFAULT 1000000u
#define SIMD_TEST_API_N 50021u
#else
#define SIMD_TEST_N_DEFAULT 10000000u
#define SIMD_TEST_API_N 300007u
#endif

static const char* const simd_isas[] = {"avx2", "avx512"};
static const uint32_t simd_blocks[] = {32, 64, 128, 256, 512, 1024};
static const agoq_format simd_formats[] = {AGOQ_FORMAT_INT8, AGOQ_FORMAT_INT4, AGOQ_FORMAT_FP8E4M3,
                                           AGOQ_FORMAT_FP8E5M2};
static const agoq_dtype simd_dtypes[] = {AGOQ_DTYPE_FP32, AGOQ_DTYPE_BF16, AGOQ_DTYPE_FP16};

/* ---- deterministic random numbers ---------------------------------------------------- */

static uint64_t rng_next(uint64_t* s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static uint32_t rng_below(uint64_t* s, uint32_t n) {
  return (uint32_t)(rng_next(s) % n);
}

static size_t dtype_size(agoq_dtype t) {
  return t == AGOQ_DTYPE_FP32 ? 4 : 2;
}

/* Field layout of each input type: exponent bits, mantissa bits. */
typedef struct {
  int ebits, mbits;
} fp_layout;
static fp_layout layout_of(agoq_dtype t) {
  if (t == AGOQ_DTYPE_FP32)
    return (fp_layout){8, 23};
  if (t == AGOQ_DTYPE_BF16)
    return (fp_layout){8, 7};
  return (fp_layout){5, 10};
}

static void put_bits(agoq_dtype t, void* p, size_t i, uint32_t bits) {
  if (t == AGOQ_DTYPE_FP32) {
    memcpy((uint8_t*)p + 4 * i, &bits, 4);
  } else {
    uint16_t h = (uint16_t)bits;
    memcpy((uint8_t*)p + 2 * i, &h, 2);
  }
}

static uint32_t make_bits(agoq_dtype t, uint32_t sign, int e, uint32_t mant) {
  fp_layout l = layout_of(t);
  return (sign << (l.ebits + l.mbits)) | ((uint32_t)e << l.mbits) | (mant & ((1u << l.mbits) - 1));
}

/* An fp32 value known to be representable in t (ties construction), as t's bits. */
static uint32_t exact_bits(agoq_dtype t, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  if (t == AGOQ_DTYPE_FP32)
    return u;
  if (t == AGOQ_DTYPE_BF16)
    return u >> 16;
  uint32_t sign = u >> 31, a = u & 0x7FFFFFFFu;
  if (a == 0)
    return sign << 15;
  int e = (int)(a >> 23) - 127;
  return (sign << 15) | ((uint32_t)(e + 15) << 10) | ((a & 0x7FFFFFu) >> 13);
}

/* Fills one block of len elements of type t with one of several kinds of content: varied
 * magnitudes (denormals included), zero blocks, NaN / Inf, values next to the type's
 * largest finite, and exact rounding ties (x / s landing on k + 1/2 or an fp8 midpoint). */
static void fill_block(uint64_t* rng, agoq_format f, agoq_dtype t, void* p, size_t first,
                       size_t len) {
  const fp_layout l = layout_of(t);
  const int emax = (1 << l.ebits) - 1; /* all ones: Inf / NaN */
  uint32_t kind = rng_below(rng, 20);
  if (kind == 0) { /* zeros, both signs */
    for (size_t i = 0; i < len; i++)
      put_bits(t, p, first + i, make_bits(t, rng_below(rng, 2), 0, 0));
    return;
  }
  if (kind == 1 || kind == 2) { /* ties: s = 2^e exactly, amax = M * 2^e */
    const int e4 = f == AGOQ_FORMAT_FP8E4M3,
              fp8 = f == AGOQ_FORMAT_FP8E4M3 || f == AGOQ_FORMAT_FP8E5M2;
    const float m = f == AGOQ_FORMAT_INT8   ? 127.0f
                    : f == AGOQ_FORMAT_INT4 ? 7.0f
                    : e4                    ? 448.0f
                                            : 57344.0f;
    int lo = t == AGOQ_DTYPE_FP16 ? -8 : -60, hi = t == AGOQ_DTYPE_FP16 ? (fp8 ? -1 : 8) : 60;
    if (t == AGOQ_DTYPE_FP16 && !e4 && fp8)
      lo = -14, hi = -1; /* 57344 * 2^e within fp16 */
    float s = 1.0f;
    int e = lo + (int)rng_below(rng, (uint32_t)(hi - lo + 1));
    for (int k = 0; k < (e < 0 ? -e : e); k++)
      s = e < 0 ? s * 0.5f : s * 2.0f;
    for (size_t i = 0; i < len; i++) {
      float v;
      if (i == 0 || rng_below(rng, 64) == 0) {
        v = m;
      } else if (!fp8) {
        v = (float)rng_below(rng, (uint32_t)m) + 0.5f; /* k + 1/2: RNE tie */
      } else {
        /* Midpoint between adjacent fp8 values: mantissa with one extra bit set. */
        const int mb = e4 ? 3 : 2, minexp = e4 ? -6 : -14;
        int ex = minexp + (int)rng_below(rng, e4 ? 15 : 31);
        float mid = 1.0f + ((float)rng_below(rng, 1u << mb) + 0.5f) / (float)(1u << mb);
        v = mid;
        for (int k = 0; k < (ex < 0 ? -ex : ex); k++)
          v = ex < 0 ? v * 0.5f : v * 2.0f;
        if (v > m)
          v = m;
      }
      if (rng_below(rng, 2))
        v = -v;
      put_bits(t, p, first + i, exact_bits(t, v * s));
    }
    return;
  }
  /* Exponent around a per-block centre; an exponent of 0 gives denormals. */
  int centre;
  if (kind == 3)
    centre = emax - 1; /* next to the largest finite */
  else if (kind == 4)
    centre = 0; /* denormals only */
  else if (kind == 5)
    centre = 3; /* tiny: the scale may underflow */
  else
    centre = (int)rng_below(rng, (uint32_t)emax);
  const int spread = kind == 3 ? 1 : (int)rng_below(rng, 24) + 1;
  for (size_t i = 0; i < len; i++) {
    int e = centre - (int)rng_below(rng, (uint32_t)spread);
    if (e < 0)
      e = 0;
    uint32_t mant = (uint32_t)rng_next(rng);
    if (kind == 3 && rng_below(rng, 4) == 0)
      mant = ~0u; /* the largest finite itself */
    put_bits(t, p, first + i, make_bits(t, rng_below(rng, 2), e, mant));
  }
  if (kind == 6 && len > 0) { /* NaN (quiet or signalling, any payload) or Inf */
    int count = 1 + (int)rng_below(rng, 3);
    for (int k = 0; k < count; k++) {
      uint32_t mant = rng_below(rng, 3) == 0 ? 0 : (uint32_t)rng_next(rng) | 1u;
      put_bits(t, p, first + rng_below(rng, (uint32_t)len),
               make_bits(t, rng_below(rng, 2), emax, mant));
    }
  }
}

static void fill_input(uint64_t seed, agoq_format f, agoq_dtype t, uint32_t block, void* src,
                       size_t n) {
  uint64_t rng = seed;
  for (size_t b = 0; b * block < n; b++) {
    size_t first = b * block, len = n - first < block ? n - first : block;
    fill_block(&rng, f, t, src, first, len);
  }
}

/* Accumulators: finite, mixed magnitudes and signs. */
static void fill_acc(uint64_t seed, float* acc, size_t n) {
  uint64_t rng = seed;
  for (size_t i = 0; i < n; i++) {
    uint32_t bits = (uint32_t)rng_next(&rng);
    uint32_t e = 97 + rng_below(&rng, 60);
    bits = (bits & 0x807FFFFFu) | (e << 23);
    if (rng_below(&rng, 16) == 0)
      bits &= 0x80000000u;
    memcpy(&acc[i], &bits, 4);
  }
}

/* ---- one comparison of a SIMD table against the portable one ------------------------- */

typedef struct {
  size_t n, nb, code_bytes;
  float* scales;
  uint8_t* escaped;
  uint8_t* codes; /* codes_base + a shift: bodies put codes at any alignment */
  uint8_t* codes_base;
  void* out[AGOQ_DTYPE_COUNT];
  float* acc;
} kernel_result;

static void* xmalloc(size_t size) {
  void* p = malloc(size ? size : 1);
  assert_non_null(p);
  return p;
}

/* Exactly sized buffers, so a sanitizer sees any access past a tail. */
static void result_alloc_shifted(kernel_result* r, agoq_format f, size_t n, uint32_t block,
                                 size_t shift) {
  memset(r, 0, sizeof(*r));
  r->n = n;
  r->nb = (n + block - 1) / block;
  r->code_bytes = f == AGOQ_FORMAT_INT4 ? (n + 1) / 2 : n;
  r->scales = xmalloc(r->nb * sizeof(float));
  r->escaped = xmalloc(r->nb);
  r->codes_base = xmalloc(r->code_bytes + shift);
  r->codes = r->codes_base + shift;
  for (int o = 0; o < AGOQ_DTYPE_COUNT; o++)
    r->out[o] = xmalloc(n * dtype_size((agoq_dtype)o));
  r->acc = xmalloc(n * sizeof(float));
}

static void result_alloc(kernel_result* r, agoq_format f, size_t n, uint32_t block) {
  result_alloc_shifted(r, f, n, block, 0);
}

static void result_free(kernel_result* r) {
  free(r->scales);
  free(r->escaped);
  free(r->codes_base);
  for (int o = 0; o < AGOQ_DTYPE_COUNT; o++)
    free(r->out[o]);
  free(r->acc);
}

/* Decoders skip escaped blocks: prefill the outputs with a pattern both tables keep. */
static void prefill_outputs(kernel_result* r, uint64_t seed) {
  for (int o = 0; o < AGOQ_DTYPE_COUNT; o++)
    memset(r->out[o], 0x5A, r->n * dtype_size((agoq_dtype)o));
  fill_acc(seed, r->acc, r->n);
}

/* Quantizes src with k (scan + encode over [b0, b1) in `pieces` calls) and decodes the
 * codes to every type and into the accumulator. */
static void run_kernels(const agoq_cpu_kernels* k, const agoq_codec_params* p, const void* src,
                        kernel_result* r, size_t pieces, uint64_t acc_seed) {
  const size_t nb = r->nb;
  memset(r->scales, 0xA5, nb * sizeof(float));
  memset(r->escaped, 0xA5, nb);
  memset(r->codes, 0xA5, r->code_bytes);
  prefill_outputs(r, acc_seed);
  for (size_t piece = 0; piece < pieces; piece++) {
    size_t b0 = nb * piece / pieces, b1 = nb * (piece + 1) / pieces;
    k->scan(p->format, p->dtype, p->block, src, r->n, b0, b1, r->scales, r->escaped);
    k->encode(p, src, r->n, b0, b1, r->scales, r->escaped, r->codes);
    for (int o = 0; o < AGOQ_DTYPE_COUNT; o++)
      k->decode(p->format, (agoq_dtype)o, p->block, r->codes, r->n, b0, b1, r->scales, r->escaped,
                r->out[o]);
    k->decode_acc(p->format, p->block, r->codes, r->n, b0, b1, r->scales, r->escaped, r->acc);
  }
}

/* First differing byte, or -1. */
static long first_diff(const void* a, const void* b, size_t len) {
  const uint8_t *x = a, *y = b;
  if (memcmp(x, y, len) == 0)
    return -1;
  for (size_t i = 0; i < len; i++)
    if (x[i] != y[i])
      return (long)i;
  return -1;
}

static int compare_results(const char* isa, const agoq_codec_params* p, const kernel_result* ref,
                           const kernel_result* got, const char* what) {
  struct {
    const char* name;
    const void *a, *b;
    size_t len, unit;
  } parts[] = {
      {"scales", ref->scales, got->scales, ref->nb * sizeof(float), 4},
      {"escaped", ref->escaped, got->escaped, ref->nb, 1},
      {"codes", ref->codes, got->codes, ref->code_bytes, 1},
      {"decode fp32", ref->out[0], got->out[0], ref->n * 4, 4},
      {"decode bf16", ref->out[1], got->out[1], ref->n * 2, 2},
      {"decode fp16", ref->out[2], got->out[2], ref->n * 2, 2},
      {"decode_acc", ref->acc, got->acc, ref->n * 4, 4},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
    long d = first_diff(parts[i].a, parts[i].b, parts[i].len);
    if (d < 0)
      continue;
    size_t at = (size_t)d / parts[i].unit * parts[i].unit, w = parts[i].unit;
    uint32_t va = 0, vb = 0;
    memcpy(&va, (const uint8_t*)parts[i].a + at, w);
    memcpy(&vb, (const uint8_t*)parts[i].b + at, w);
    print_error("%s %s %s/%s block %u n %zu: %s differ at element %zu: portable 0x%x, %s 0x%x\n",
                what, isa, agoq_format_name(p->format), agoq_dtype_name(p->dtype), p->block, ref->n,
                parts[i].name, at / w, va, isa, vb);
    bad = 1;
  }
  return bad;
}

static const agoq_cpu_kernels* isa_table(const char* isa) {
  const agoq_cpu_kernels* k = agoq_cpu_kernels_by_name(isa);
  if (!k)
    print_message("(%s not available in this build or on this CPU: skipped)\n", isa);
  return k;
}

static size_t test_count(void) {
  const char* e = getenv("AGOQ_TEST_CODEC_SIMD_N");
  if (e && *e)
    return (size_t)strtoull(e, NULL, 10);
  return SIMD_TEST_N_DEFAULT;
}

/* ---- tests ------------------------------------------------------------------------------ */

/* 10^7 random elements for every format and input type; the block size rotates. */
static void test_simd_large_random(void** state) {
  (void)state;
  const agoq_cpu_kernels* ref_k = agoq_cpu_kernels_by_name("portable");
  assert_non_null(ref_k);
  const size_t n = test_count() + 3; /* a partial last block */
  int bad = 0, combo = 0;
  for (size_t fi = 0; fi < 4; fi++) {
    for (size_t ti = 0; ti < 3; ti++, combo++) {
      agoq_codec_params p = {
          .format = simd_formats[fi], .dtype = simd_dtypes[ti], .block = simd_blocks[combo % 6]};
      void* src = xmalloc(n * dtype_size(p.dtype));
      fill_input(0x1234 + (uint64_t)combo, p.format, p.dtype, p.block, src, n);
      kernel_result ref;
      result_alloc(&ref, p.format, n, p.block);
      run_kernels(ref_k, &p, src, &ref, 1, 77 + (uint64_t)combo);
      for (size_t ii = 0; ii < 2; ii++) {
        const agoq_cpu_kernels* k = agoq_cpu_kernels_by_name(simd_isas[ii]);
        if (!k)
          continue;
        kernel_result got;
        result_alloc(&got, p.format, n, p.block);
        /* Several pieces: the driver splits arrays by blocks over threads. */
        run_kernels(k, &p, src, &got, ii == 0 ? 1 : 7, 77 + (uint64_t)combo);
        bad |= compare_results(simd_isas[ii], &p, &ref, &got, "random");
        result_free(&got);
      }
      result_free(&ref);
      free(src);
    }
  }
  for (size_t ii = 0; ii < 2; ii++)
    (void)isa_table(simd_isas[ii]);
  assert_int_equal(bad, 0);
}

/* Lengths the small-length test covers: all of them normally; in slow builds the short
 * ones, the ones around the end and every 7th (7 is prime to 32: every tail shape still). */
static bool length_checked(size_t n, size_t max) {
#ifdef SIMD_TEST_SLOW
  return n < 200 || n + 40 > max || n % 7 == 0;
#else
  (void)n;
  (void)max;
  return true;
#endif
}

/* Every length 0 .. 2 * 1024 + 3 for a small and the largest block: every tail shape. */
static void test_simd_all_small_lengths(void** state) {
  (void)state;
  const agoq_cpu_kernels* ref_k = agoq_cpu_kernels_by_name("portable");
  assert_non_null(ref_k);
  const agoq_cpu_kernels* ks[2];
  for (size_t ii = 0; ii < 2; ii++)
    ks[ii] = isa_table(simd_isas[ii]);
  const uint32_t blocks[] = {32, 1024};
  int bad = 0;
  for (size_t bi = 0; bi < 2; bi++) {
    for (size_t fi = 0; fi < 4; fi++) {
      for (size_t ti = 0; ti < 3; ti++) {
        agoq_codec_params p = {
            .format = simd_formats[fi], .dtype = simd_dtypes[ti], .block = blocks[bi]};
        for (size_t n = 0; n <= 2 * 1024 + 3 && !bad; n++) {
          if (!length_checked(n, 2 * 1024 + 3))
            continue;
          void* src = xmalloc(n * dtype_size(p.dtype));
          fill_input(n * 131 + fi * 7 + ti, p.format, p.dtype, p.block, src, n);
          kernel_result ref;
          result_alloc(&ref, p.format, n, p.block);
          run_kernels(ref_k, &p, src, &ref, 1, n);
          for (size_t ii = 0; ii < 2; ii++) {
            if (!ks[ii])
              continue;
            kernel_result got;
            result_alloc_shifted(&got, p.format, n, p.block, 1 + n % 3);
            run_kernels(ks[ii], &p, src, &got, 1 + n % 3, n);
            bad |= compare_results(simd_isas[ii], &p, &ref, &got, "length");
            result_free(&got);
          }
          result_free(&ref);
          free(src);
        }
      }
    }
  }
  assert_int_equal(bad, 0);
}

/* Bodies as a network could deliver them: any code byte, any scale (negative, denormal,
 * huge, Inf, NaN). Every rank must still decode the same bits whatever its ISA. */
static void test_simd_arbitrary_bodies(void** state) {
  (void)state;
  const agoq_cpu_kernels* ref_k = agoq_cpu_kernels_by_name("portable");
  assert_non_null(ref_k);
  const size_t n = 200003;
  const uint32_t block = 64;
  const size_t nb = (n + block - 1) / block;
  uint64_t rng = 99;
  float* scales = xmalloc(nb * sizeof(float));
  uint8_t* escaped = xmalloc(nb);
  uint8_t* codes = xmalloc(n);
  for (size_t b = 0; b < nb; b++) {
    uint32_t bits = (uint32_t)rng_next(&rng);
    switch (rng_below(&rng, 8)) {
      case 0: bits &= 0x807FFFFFu; break;                       /* denormal or zero */
      case 1: bits = (bits & 0x807FFFFFu) | 0x7F000000u; break; /* huge */
      case 2: bits = (bits & 0x80000000u) | 0x7F800000u; break; /* Inf */
      case 3: bits |= 0x7F800001u; break;                       /* NaN */
      default: bits = (bits & 0x807FFFFFu) | ((90u + rng_below(&rng, 60)) << 23); break;
    }
    memcpy(&scales[b], &bits, 4);
    escaped[b] = rng_below(&rng, 10) == 0;
  }
  for (size_t i = 0; i < n; i++)
    codes[i] = (uint8_t)rng_next(&rng);
  int bad = 0;
  for (size_t ii = 0; ii < 2; ii++) {
    const agoq_cpu_kernels* k = isa_table(simd_isas[ii]);
    if (!k)
      continue;
    for (size_t fi = 0; fi < 4; fi++) {
      agoq_codec_params p = {.format = simd_formats[fi], .dtype = AGOQ_DTYPE_FP32, .block = block};
      kernel_result ref, got;
      result_alloc(&ref, p.format, n, block);
      result_alloc(&got, p.format, n, block);
      memcpy(ref.scales, scales, nb * sizeof(float));
      memcpy(got.scales, scales, nb * sizeof(float));
      memcpy(ref.escaped, escaped, nb);
      memcpy(got.escaped, escaped, nb);
      memcpy(ref.codes, codes, ref.code_bytes);
      memcpy(got.codes, codes, got.code_bytes);
      prefill_outputs(&ref, 5);
      prefill_outputs(&got, 5);
      const agoq_cpu_kernels* both[2] = {ref_k, k};
      kernel_result* res[2] = {&ref, &got};
      for (int w = 0; w < 2; w++) {
        for (int o = 0; o < AGOQ_DTYPE_COUNT; o++)
          both[w]->decode(p.format, (agoq_dtype)o, block, res[w]->codes, n, 0, nb, res[w]->scales,
                          res[w]->escaped, res[w]->out[o]);
        both[w]->decode_acc(p.format, block, res[w]->codes, n, 0, nb, res[w]->scales,
                            res[w]->escaped, res[w]->acc);
      }
      bad |= compare_results(simd_isas[ii], &p, &ref, &got, "arbitrary body");
      result_free(&ref);
      result_free(&got);
    }
  }
  free(scales);
  free(escaped);
  free(codes);
  assert_int_equal(bad, 0);
}

/* The public API with each ISA pinned gives the portable ISA's bodies and outputs. */
/* overflow_inf of every table against the element function: random bit patterns mixed
 * with the edges (the thresholds and their neighbours, the largest finite values, Inf, NaN,
 * both signs), every length from 0 to 70 at every start offset within a vector, and one
 * long array. A lane that should not change must keep its bits (NaN payloads too). */
static void test_simd_overflow_inf(void** state) {
  (void)state;
  const char* isas[] = {"portable", "avx2", "avx512"};
  const uint32_t froms[] = {0x7f7f8000u /* bf16 */, 0x477ff000u /* fp16 */};
  const uint32_t edges[] = {0x7f7f8000u, 0x7f7f7fffu, 0x7f7f8001u, 0x477ff000u, 0x477fefffu, 0x477ff001u,
                            0x7f7fffffu, 0x7f800000u, 0x7fc00001u, 0x7f800001u, 0x00000000u, 0x3f800000u,
                            0x477fe000u, 0x7f7f0000u};
  enum { LONG_N = 100003 };
  uint32_t* in = malloc((LONG_N + 16) * sizeof *in);
  uint32_t* want = malloc((LONG_N + 16) * sizeof *want);
  uint32_t* got = malloc((LONG_N + 16) * sizeof *got);
  assert_non_null(in);
  assert_non_null(want);
  assert_non_null(got);
  uint64_t seed = 0x0ef10;
  for (size_t i = 0; i < LONG_N + 16; i++) {
    uint32_t v = rng_below(&seed, 3) == 0 ? edges[rng_below(&seed, sizeof edges / sizeof edges[0])]
                                          : (uint32_t)rng_next(&seed);
    in[i] = v ^ (rng_below(&seed, 2) ? 0x80000000u : 0u);
  }
  int tables = 0;
  for (size_t t = 0; t < sizeof isas / sizeof isas[0]; t++) {
    const agoq_cpu_kernels* k = t == 0 ? agoq_cpu_kernels_by_name("portable") : isa_table(isas[t]);
    if (k == NULL) continue;
    tables++;
    for (size_t f = 0; f < 2; f++) {
      for (size_t step = 0; step <= 71; step++) {
        size_t n = step == 71 ? (size_t)LONG_N : step;
        for (size_t off = 0; off < (n == LONG_N ? 1 : 16); off++) {
          for (size_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, &in[off + i], sizeof v);
            v = agoq_fp32_overflow_inf(v, froms[f]);
            memcpy(&want[i], &v, sizeof v);
          }
          memcpy(got, in, (LONG_N + 16) * sizeof *got);
          k->overflow_inf((float*)(void*)(got + off), n, froms[f]);
          for (size_t i = 0; i < n; i++)
            if (got[off + i] != want[i])
              fail_msg("%s overflow_inf (from 0x%08x), n %zu, offset %zu, element %zu: 0x%08x gave 0x%08x, want 0x%08x",
                       k->name, froms[f], n, off, i, in[off + i], got[off + i], want[i]);
          for (size_t i = 0; i < off; i++) assert_int_equal(got[i], in[i]); /* nothing before */
          for (size_t i = off + n; i < off + n + 16 && i < LONG_N + 16; i++) assert_int_equal(got[i], in[i]);
        }
      }
    }
  }
  assert_true(tables >= 1);
  free(in);
  free(want);
  free(got);
}

static void test_simd_public_api(void** state) {
  (void)state;
  const size_t n = SIMD_TEST_API_N;
  int bad = 0;
  for (size_t fi = 0; fi < 4; fi++) {
    for (size_t ti = 0; ti < 3; ti++) {
      agoq_codec_params p = {.format = simd_formats[fi],
                             .dtype = simd_dtypes[ti],
                             .block = simd_blocks[(fi * 3 + ti + 2) % 6]};
      void* src = xmalloc(n * dtype_size(p.dtype));
      fill_input(4242 + fi * 3 + ti, p.format, p.dtype, p.block, src, n);
      const size_t cap = agoq_codec_body_size_max(&p, n);
      uint8_t* body[3];
      size_t len[3], esc[3];
      void* out[3];
      float* acc[3];
      for (int w = 0; w < 3; w++) {
        body[w] = xmalloc(cap);
        out[w] = xmalloc(n * dtype_size(p.dtype));
        acc[w] = xmalloc(n * sizeof(float));
        fill_acc(31, acc[w], n);
      }
      const char* isas[3] = {"portable", "avx2", "avx512"};
      for (int w = 0; w < 3; w++) {
        if (agoq_codec_set_isa(isas[w]) != 0) {
          assert_false(agoq_codec_isa_available(isas[w]));
          len[w] = 0;
          continue;
        }
        assert_string_equal(agoq_codec_isa(), isas[w]);
        assert_int_equal(agoq_quantize(&p, src, n, body[w], cap, &len[w], &esc[w]), AGOQ_CODEC_OK);
        assert_int_equal(agoq_dequantize(&p, body[w], len[w], n, p.dtype, out[w]), AGOQ_CODEC_OK);
        assert_int_equal(agoq_dequantize_accumulate(&p, body[w], len[w], n, acc[w]), AGOQ_CODEC_OK);
      }
      for (int w = 1; w < 3; w++) {
        if (len[w] == 0)
          continue;
        if (len[w] != len[0] || esc[w] != esc[0] || memcmp(body[w], body[0], len[0]) != 0 ||
            memcmp(out[w], out[0], n * dtype_size(p.dtype)) != 0 ||
            memcmp(acc[w], acc[0], n * sizeof(float)) != 0) {
          print_error("public API %s %s/%s block %u: differs from portable\n", isas[w],
                      agoq_format_name(p.format), agoq_dtype_name(p.dtype), p.block);
          bad = 1;
        }
      }
      for (int w = 0; w < 3; w++) {
        free(body[w]);
        free(out[w]);
        free(acc[w]);
      }
      free(src);
    }
  }
  assert_int_equal(agoq_codec_set_isa("portable"), 0);
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_simd_all_small_lengths),
      cmocka_unit_test(test_simd_arbitrary_bodies),
      cmocka_unit_test(test_simd_large_random),
      cmocka_unit_test(test_simd_overflow_inf),
      cmocka_unit_test(test_simd_public_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
