/*
 * AVX2 + F16C codec kernels (see agoq_codec_cpu.h). Compiled with -mavx2 -mf16c
 * -ffp-contract=off and never with FMA: every product and sum is its own IEEE fp32
 * operation, so the bits equal the portable table's.
 *
 * Exactness relies on the default MXCSR (round to nearest even, no DAZ/FTZ), which this
 * file never changes: _mm256_div_ps / _mm256_mul_ps / _mm256_add_ps round like the scalar
 * operators, _mm256_cvtps_epi32 rounds half to even, denormals are honoured.
 *
 * Work is done 32 elements at a time (one 32-byte vector of int8/fp8 codes). Full blocks
 * are multiples of 32; the last, shorter block goes through a zero-padded copy, so a tail
 * uses exactly the arithmetic of a full chunk (zero input gives zero codes).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "agoq_codec_cpu.h"

#define AVX2_INLINE static inline __attribute__((always_inline))
#define CHUNK 32u

/* ---- constants ---------------------------------------------------------------------- */

static float avx2_format_max(agoq_format f) {
  switch (f) {
    case AGOQ_FORMAT_INT8: return 127.0f;
    case AGOQ_FORMAT_INT4: return 7.0f;
    case AGOQ_FORMAT_FP8E4M3: return 448.0f;
    case AGOQ_FORMAT_FP8E5M2: return 57344.0f;
    default: return 0.0f;
  }
}

static size_t avx2_dtype_size(agoq_dtype t) {
  return t == AGOQ_DTYPE_FP32 ? 4u : 2u;
}

static size_t avx2_block_len(uint32_t block, size_t n, size_t b) {
  size_t start = b * (size_t)block;
  size_t left = n - start;
  return left < block ? left : block;
}

/* Byte offset of element i in the code array. */
AVX2_INLINE size_t avx2_code_offset(agoq_format f, size_t i) {
  return f == AGOQ_FORMAT_INT4 ? i / 2u : i;
}
AVX2_INLINE size_t avx2_code_bytes(agoq_format f, size_t len) {
  return f == AGOQ_FORMAT_INT4 ? (len + 1u) / 2u : len;
}

/* ---- scan: amax and NaN/Inf detection on magnitude bits ------------------------------- */

/* Horizontal max of unsigned 32-bit lanes. */
AVX2_INLINE uint32_t avx2_hmax_epu32(__m256i m) {
  __m128i v = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  v = _mm_max_epu32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm_max_epu32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return (uint32_t)_mm_cvtsi128_si32(v);
}

/* Horizontal max of unsigned 16-bit lanes: minpos over the complement. */
AVX2_INLINE uint32_t avx2_hmax_epu16(__m256i m) {
  __m128i v = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  v = _mm_minpos_epu16(_mm_xor_si128(v, _mm_set1_epi32(-1)));
  return (~(uint32_t)_mm_cvtsi128_si32(v)) & 0xFFFFu;
}

/* Largest magnitude bit pattern of a block. For non-negative IEEE values the integer order
 * of the bits is the numeric order, and NaN/Inf patterns sort above every finite one, so
 * one unsigned max gives both amax and the escape decision. */
AVX2_INLINE uint32_t avx2_amax_bits32(const uint8_t* p, size_t len) {
  const __m256i mag = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m256i* q = (const __m256i*)(p + i * 4);
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(q + 0), mag));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(q + 1), mag));
    m2 = _mm256_max_epu32(m2, _mm256_and_si256(_mm256_loadu_si256(q + 2), mag));
    m3 = _mm256_max_epu32(m3, _mm256_and_si256(_mm256_loadu_si256(q + 3), mag));
  }
  for (; i + 8 <= len; i += 8)
    m0 = _mm256_max_epu32(m0,
                          _mm256_and_si256(_mm256_loadu_si256((const __m256i*)(p + i * 4)), mag));
  uint32_t r =
      avx2_hmax_epu32(_mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3)));
  for (; i < len; i++) {
    uint32_t a;
    memcpy(&a, p + i * 4, 4);
    a &= 0x7FFFFFFFu;
    r = a > r ? a : r;
  }
  return r;
}

AVX2_INLINE uint32_t avx2_amax_bits16(const uint8_t* p, size_t len) {
  const __m256i mag = _mm256_set1_epi16(0x7FFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; i + 64 <= len; i += 64) {
    const __m256i* q = (const __m256i*)(p + i * 2);
    m0 = _mm256_max_epu16(m0, _mm256_and_si256(_mm256_loadu_si256(q + 0), mag));
    m1 = _mm256_max_epu16(m1, _mm256_and_si256(_mm256_loadu_si256(q + 1), mag));
    m2 = _mm256_max_epu16(m2, _mm256_and_si256(_mm256_loadu_si256(q + 2), mag));
    m3 = _mm256_max_epu16(m3, _mm256_and_si256(_mm256_loadu_si256(q + 3), mag));
  }
  for (; i + 16 <= len; i += 16)
    m0 = _mm256_max_epu16(m0,
                          _mm256_and_si256(_mm256_loadu_si256((const __m256i*)(p + i * 2)), mag));
  uint32_t r =
      avx2_hmax_epu16(_mm256_max_epu16(_mm256_max_epu16(m0, m1), _mm256_max_epu16(m2, m3)));
  for (; i < len; i++) {
    uint16_t a;
    memcpy(&a, p + i * 2, 2);
    a &= 0x7FFFu;
    r = a > r ? a : r;
  }
  return r;
}

AVX2_INLINE void avx2_scan_blocks(agoq_dtype t, float m, uint32_t block, const void* src, size_t n,
                                  size_t b0, size_t b1, float* scales, uint8_t* escaped) {
  const uint8_t* base = (const uint8_t*)src;
  const size_t es = avx2_dtype_size(t);
  for (size_t b = b0; b < b1; b++) {
    const size_t len = avx2_block_len(block, n, b);
    const uint8_t* p = base + b * (size_t)block * es;
    uint32_t bits;
    float amax;
    int esc;
    if (t == AGOQ_DTYPE_FP32) {
      bits = avx2_amax_bits32(p, len);
      esc = bits >= 0x7F800000u;
      memcpy(&amax, &bits, 4);
    } else if (t == AGOQ_DTYPE_BF16) {
      bits = avx2_amax_bits16(p, len);
      esc = bits >= 0x7F80u;
      bits <<= 16;
      memcpy(&amax, &bits, 4);
    } else {
      bits = avx2_amax_bits16(p, len);
      esc = bits >= 0x7C00u;
      amax = _cvtsh_ss((unsigned short)bits); /* exact widening, denormals included */
    }
    escaped[b] = (uint8_t)esc;
    scales[b] = esc ? 0.0f : amax / m;
  }
}

static void avx2_scan(agoq_format f, agoq_dtype t, uint32_t block, const void* src, size_t n,
                      size_t b0, size_t b1, float* scales, uint8_t* escaped) {
  const float m = avx2_format_max(f);
  switch (t) {
    case AGOQ_DTYPE_FP32:
      avx2_scan_blocks(AGOQ_DTYPE_FP32, m, block, src, n, b0, b1, scales, escaped);
      break;
    case AGOQ_DTYPE_BF16:
      avx2_scan_blocks(AGOQ_DTYPE_BF16, m, block, src, n, b0, b1, scales, escaped);
      break;
    case AGOQ_DTYPE_FP16:
      avx2_scan_blocks(AGOQ_DTYPE_FP16, m, block, src, n, b0, b1, scales, escaped);
      break;
    default: break;
  }
}

/* ---- widening loads (exact) --------------------------------------------------------- */

AVX2_INLINE __m256 avx2_load8(agoq_dtype t, const uint8_t* p) {
  if (t == AGOQ_DTYPE_FP32)
    return _mm256_loadu_ps((const float*)p);
  __m128i h = _mm_loadu_si128((const __m128i*)p);
  if (t == AGOQ_DTYPE_BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

/* ---- encode --------------------------------------------------------------------------- */

/* fp32 -> fp8 code, round to nearest even, saturating to +-max finite, sign kept (-0 too).
 * Normal results: round the fp32 mantissa to the fp8 width with the integer carry trick and
 * rebias. Subnormal results: one fp32 add of a constant whose ulp is the fp8 subnormal
 * quantum rounds to that grid (RNE); the bits above the constant are the code, and a
 * carry into the smallest normal gives that normal's code. */
AVX2_INLINE __m256i avx2_fp8_encode(agoq_format f, __m256 v) {
  const int e4 = f == AGOQ_FORMAT_FP8E4M3;
  const int shift = e4 ? 20 : 21;                           /* 23 - mantissa bits */
  const int rebias = e4 ? (127 - 7) << 3 : (127 - 15) << 2; /* fp32 exp -> fp8 exp, in code units */
  const int maxcode = e4 ? 0x7E : 0x7B;
  const int min_normal = e4 ? 0x3C800000 : 0x38800000; /* 2^-6, 2^-14 */
  const int magic = e4 ? 0x46800000 : 0x43000000;      /* 2^14, 2^7: ulp = quantum */
  __m256i bits = _mm256_castps_si256(v);
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  __m256i a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, shift), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (shift - 1)) - 1)), odd);
  __m256i cn = _mm256_sub_epi32(_mm256_srli_epi32(r, shift), _mm256_set1_epi32(rebias));
  cn = _mm256_min_epi32(cn, _mm256_set1_epi32(maxcode));
  __m256 t = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(_mm256_set1_epi32(magic)));
  __m256i cs = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(magic));
  __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(min_normal), a);
  return _mm256_or_si256(_mm256_blendv_epi8(cn, cs, sub), sign);
}

/* Codes of 8 elements as int32 lanes (int formats: -M..M; fp8: 0..255). */
AVX2_INLINE __m256i avx2_code8(agoq_format f, __m256 x, __m256 vs, __m256 vm) {
  __m256 v = _mm256_div_ps(x, vs);
  if (f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4) {
    /* Clamping before rounding equals clamping after: M is an integer, both monotone. */
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_sub_ps(_mm256_setzero_ps(), vm)), vm);
    return _mm256_cvtps_epi32(v);
  }
  return avx2_fp8_encode(f, v);
}

/* Four vectors of 8 int32 lanes (elements 0..31 in order) to 32 bytes in order. */
AVX2_INLINE __m256i avx2_pack32(agoq_format f, __m256i a, __m256i b, __m256i c, __m256i d) {
  __m256i r;
  if (f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4)
    r = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  else
    r = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
  return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2_INLINE void avx2_encode32(agoq_format f, agoq_dtype t, const uint8_t* p, __m256 vs, __m256 vm,
                               uint8_t* out) {
  const size_t es = avx2_dtype_size(t);
  __m256i a = avx2_code8(f, avx2_load8(t, p + 0 * 8 * es), vs, vm);
  __m256i b = avx2_code8(f, avx2_load8(t, p + 1 * 8 * es), vs, vm);
  __m256i c = avx2_code8(f, avx2_load8(t, p + 2 * 8 * es), vs, vm);
  __m256i d = avx2_code8(f, avx2_load8(t, p + 3 * 8 * es), vs, vm);
  __m256i bytes = avx2_pack32(f, a, b, c, d);
  if (f != AGOQ_FORMAT_INT4) {
    _mm256_storeu_si256((__m256i*)out, bytes);
    return;
  }
  /* Byte pair (lo, hi) -> (lo & 15) | (hi << 4) in each 16-bit lane, then 16 -> 8 bits. */
  __m256i nib =
      _mm256_or_si256(_mm256_and_si256(bytes, _mm256_set1_epi16(0x000F)),
                      _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00F0)));
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(nib, nib), _MM_SHUFFLE(3, 1, 2, 0));
  _mm_storeu_si128((__m128i*)out, _mm256_castsi256_si128(packed));
}

AVX2_INLINE void avx2_encode_blocks(agoq_format f, agoq_dtype t, uint32_t block, const void* src,
                                    size_t n, size_t b0, size_t b1, const float* scales,
                                    const uint8_t* escaped, uint8_t* codes) {
  const size_t es = avx2_dtype_size(t);
  const __m256 vm = _mm256_set1_ps(avx2_format_max(f));
  for (size_t b = b0; b < b1; b++) {
    const size_t start = b * (size_t)block, len = avx2_block_len(block, n, b);
    const uint8_t* p = (const uint8_t*)src + start * es;
    uint8_t* out = codes + avx2_code_offset(f, start);
    const float s = scales[b];
    if (escaped[b] || s == 0.0f) {
      memset(out, 0, avx2_code_bytes(f, len));
      continue;
    }
    const __m256 vs = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + CHUNK <= len; i += CHUNK)
      avx2_encode32(f, t, p + i * es, vs, vm, out + avx2_code_offset(f, i));
    if (i < len) {
      const size_t r = len - i;
      uint8_t in[CHUNK * 4] = {0}, tmp[CHUNK];
      memcpy(in, p + i * es, r * es);
      avx2_encode32(f, t, in, vs, vm, tmp);
      memcpy(out + avx2_code_offset(f, i), tmp, avx2_code_bytes(f, r));
    }
  }
}

#define AVX2_ENCODE_CASE(F, T)                                                  \
  case (F)*AGOQ_DTYPE_COUNT + (T):                                              \
    avx2_encode_blocks(F, T, p->block, src, n, b0, b1, scales, escaped, codes); \
    break

static void avx2_encode(const agoq_codec_params* p, const void* src, size_t n, size_t b0, size_t b1,
                        const float* scales, const uint8_t* escaped, uint8_t* codes) {
  switch ((int)p->format * AGOQ_DTYPE_COUNT + (int)p->dtype) {
    AVX2_ENCODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP32);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP16);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP32);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_BF16);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP16);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP32);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_BF16);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP16);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP32);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_BF16);
    AVX2_ENCODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP16);
    default: break;
  }
}

/* ---- decode --------------------------------------------------------------------------- */

/* fp8 code (int32 lanes, 0..255) -> fp32, exact: place exponent and mantissa under the
 * fp32 layout and multiply by the bias difference (a power of two; fp8 subnormals become
 * fp32 denormals first, which the multiply honours). Codes with the all-ones exponent
 * (e4m3 S.1111.111, e5m2 S.11111.xx) never come out of encode; they decode like
 * agoq_fpconv.h's tables: the quiet NaN 0x7FC00000 with the code's sign, e5m2 +-Inf. */
AVX2_INLINE __m256 avx2_fp8_decode(agoq_format f, __m256i c) {
  const int e4 = f == AGOQ_FORMAT_FP8E4M3;
  __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
  __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
  __m256 y = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, e4 ? 20 : 21)),
                           _mm256_castsi256_ps(_mm256_set1_epi32(e4 ? 0x7B800000 : 0x77800000)));
  __m256i bits = _mm256_castps_si256(y);
  if (e4) {
    __m256i nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7FC00000), nan);
  } else {
    /* S.11111.00 -> Inf; S.11111.mm (mm != 0) -> the quiet NaN 0x7FC00000. */
    __m256i special = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7B));
    __m256i isnan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7C));
    __m256i naninf = _mm256_or_si256(_mm256_set1_epi32(0x7F800000),
                                     _mm256_and_si256(isnan, _mm256_set1_epi32(0x00400000)));
    bits = _mm256_blendv_epi8(bits, naninf, special);
  }
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

/* 32 codes -> 32 fp32 values q (not yet scaled), in element order. */
AVX2_INLINE void avx2_codes32(agoq_format f, const uint8_t* c, __m256 q[4]) {
  if (f == AGOQ_FORMAT_INT4) {
    __m128i b = _mm_loadu_si128((const __m128i*)c);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    /* 4-bit two's complement -> int8: (x ^ 8) - 8. */
    const __m128i eight = _mm_set1_epi8(8);
    __m128i e0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
    __m128i e1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8)));
    return;
  }
  for (int k = 0; k < 4; k++) {
    __m128i b = _mm_loadl_epi64((const __m128i*)(c + 8 * k));
    if (f == AGOQ_FORMAT_INT8)
      q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    else
      q[k] = avx2_fp8_decode(f, _mm256_cvtepu8_epi32(b));
  }
}

/* fp32 -> bf16 bits (in the low half of int32 lanes), RNE, saturating: a result of Inf
 * (a finite overflow, or y = Inf, which the portable path saturates to FLT_MAX first)
 * becomes the largest finite (0x7F7F). A NaN keeps its top bits and is made quiet. */
AVX2_INLINE __m256i avx2_to_bf16(__m256 y) {
  __m256i bits = _mm256_castps_si256(y);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i h = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd), 16);
  __m256i inf =
      _mm256_cmpeq_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7FFF)), _mm256_set1_epi32(0x7F80));
  h = _mm256_add_epi32(h, inf);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)),
                                   _mm256_set1_epi32(0x7F800000));
  __m256i hn = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(h, hn, nan);
}

/* fp32 -> fp16 bits, RNE (F16C), saturating: a result of Inf becomes 0x7BFF (sign kept).
 * vcvtps2ph narrows a NaN to sign | 0x7E00 | top payload bits, as agoq_fpconv.h does. */
AVX2_INLINE __m128i avx2_to_fp16(__m256 y) {
  __m128i h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
  __m128i inf = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7C00));
  return _mm_add_epi16(h, inf);
}

/* y = q * s, one multiply. With both operands NaN (an fp8 NaN code, a NaN scale from a
 * corrupt body) the hardware keeps its first source, which the compiler may pick either
 * way: a NaN q is put back explicitly, as the portable `q * s` yields with q first. */
AVX2_INLINE void avx2_scale32(agoq_format f, __m256 q[4], __m256 vs, int plain) {
  const int fp8 = f == AGOQ_FORMAT_FP8E4M3 || f == AGOQ_FORMAT_FP8E5M2;
  for (int k = 0; k < 4; k++) {
    __m256 y = _mm256_mul_ps(q[k], vs);
    if (fp8 && !plain)
      y = _mm256_blendv_ps(y, q[k], _mm256_cmp_ps(q[k], q[k], _CMP_UNORD_Q));
    q[k] = y;
  }
}

/* +-Inf -> +-FLT_MAX (the bits just below), the fp32 saturation of y. */
AVX2_INLINE __m256 avx2_sat_fp32(__m256 y) {
  __m256i bits = _mm256_castps_si256(y);
  __m256i inf = _mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)),
                                   _mm256_set1_epi32(0x7F800000));
  return _mm256_castsi256_ps(_mm256_add_epi32(bits, inf));
}

/* fp32 -> bf16 bits, RNE only: for finite |y| <= 2^127, which cannot round to Inf. */
AVX2_INLINE __m256i avx2_to_bf16_plain(__m256 y) {
  __m256i bits = _mm256_castps_si256(y);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd),
                           16);
}

/* `plain`: every y is finite with |y| <= 2^126 (see avx2_plain_scale), so no NaN, no fp32
 * saturation and no bf16 overflow can occur; fp16 can still overflow. */
AVX2_INLINE void avx2_store32(agoq_dtype out, const __m256 y[4], uint8_t* dst, int plain) {
  if (out == AGOQ_DTYPE_FP32) {
    for (int k = 0; k < 4; k++)
      _mm256_storeu_ps((float*)(dst + 32 * k), plain ? y[k] : avx2_sat_fp32(y[k]));
  } else if (out == AGOQ_DTYPE_BF16) {
    for (int k = 0; k < 2; k++) {
      __m256i h = plain ? _mm256_packus_epi32(avx2_to_bf16_plain(y[2 * k]),
                                              avx2_to_bf16_plain(y[2 * k + 1]))
                        : _mm256_packus_epi32(avx2_to_bf16(y[2 * k]), avx2_to_bf16(y[2 * k + 1]));
      _mm256_storeu_si256((__m256i*)(dst + 32 * k),
                          _mm256_permute4x64_epi64(h, _MM_SHUFFLE(3, 1, 2, 0)));
    }
  } else {
    for (int k = 0; k < 4; k++)
      _mm_storeu_si128((__m128i*)(dst + 16 * k), avx2_to_fp16(y[k]));
  }
}

/* A block whose scale is finite with |s| <= 2^110 gives |y| <= 57344 * 2^110 < 2^126 for
 * every finite q: the common case, decoded without the NaN / Inf fix-ups. */
AVX2_INLINE int avx2_plain_scale(float s) {
  uint32_t bits;
  memcpy(&bits, &s, 4);
  return (bits & 0x7FFFFFFFu) <= 0x76800000u;
}

/* Whether any of 32 fp8 codes is a NaN / Inf code (exponent all ones; e4m3 has only NaN). */
AVX2_INLINE int avx2_fp8_special32(agoq_format f, const uint8_t* c) {
  __m256i m = _mm256_and_si256(_mm256_loadu_si256((const __m256i*)c), _mm256_set1_epi8(0x7F));
  __m256i sp = f == AGOQ_FORMAT_FP8E4M3 ? _mm256_cmpeq_epi8(m, _mm256_set1_epi8(0x7F))
                                        : _mm256_cmpgt_epi8(m, _mm256_set1_epi8(0x7B));
  return _mm256_movemask_epi8(sp) != 0;
}

/* Whether the 32 codes at c (full, or zero-padded) decode on the plain path. */
AVX2_INLINE int avx2_chunk_plain(agoq_format f, int plain_block, const uint8_t* c) {
  if (!plain_block)
    return 0;
  if (f == AGOQ_FORMAT_FP8E4M3 || f == AGOQ_FORMAT_FP8E5M2)
    return !avx2_fp8_special32(f, c);
  return 1;
}

AVX2_INLINE void avx2_decode32(agoq_format f, agoq_dtype out, const uint8_t* c, __m256 vs,
                               uint8_t* d, int plain_block) {
  __m256 y[4];
  avx2_codes32(f, c, y);
  if (avx2_chunk_plain(f, plain_block, c)) {
    avx2_scale32(f, y, vs, 1);
    avx2_store32(out, y, d, 1);
  } else {
    avx2_scale32(f, y, vs, 0);
    avx2_store32(out, y, d, 0);
  }
}

AVX2_INLINE void avx2_decode_blocks(agoq_format f, agoq_dtype out, uint32_t block,
                                    const uint8_t* codes, size_t n, size_t b0, size_t b1,
                                    const float* scales, const uint8_t* escaped, void* dst) {
  const size_t es = avx2_dtype_size(out);
  for (size_t b = b0; b < b1; b++) {
    if (escaped[b])
      continue;
    const size_t start = b * (size_t)block, len = avx2_block_len(block, n, b);
    const uint8_t* c = codes + avx2_code_offset(f, start);
    uint8_t* d = (uint8_t*)dst + start * es;
    const __m256 vs = _mm256_set1_ps(scales[b]);
    const int plain = avx2_plain_scale(scales[b]);
    size_t i = 0;
    for (; i + CHUNK <= len; i += CHUNK)
      avx2_decode32(f, out, c + avx2_code_offset(f, i), vs, d + i * es, plain);
    if (i < len) {
      const size_t r = len - i;
      uint8_t in[CHUNK] = {0}, tmp[CHUNK * 4];
      memcpy(in, c + avx2_code_offset(f, i), avx2_code_bytes(f, r));
      avx2_decode32(f, out, in, vs, tmp, plain);
      memcpy(d + i * es, tmp, r * es);
    }
  }
}

#define AVX2_DECODE_CASE(F, T)                                               \
  case (F)*AGOQ_DTYPE_COUNT + (T):                                           \
    avx2_decode_blocks(F, T, block, codes, n, b0, b1, scales, escaped, dst); \
    break

static void avx2_decode(agoq_format f, agoq_dtype out, uint32_t block, const uint8_t* codes,
                        size_t n, size_t b0, size_t b1, const float* scales, const uint8_t* escaped,
                        void* dst) {
  switch ((int)f * AGOQ_DTYPE_COUNT + (int)out) {
    AVX2_DECODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP32);
    AVX2_DECODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16);
    AVX2_DECODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP16);
    AVX2_DECODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP32);
    AVX2_DECODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_BF16);
    AVX2_DECODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP16);
    AVX2_DECODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP32);
    AVX2_DECODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_BF16);
    AVX2_DECODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP16);
    AVX2_DECODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP32);
    AVX2_DECODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_BF16);
    AVX2_DECODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP16);
    default: break;
  }
}

AVX2_INLINE void avx2_acc32(agoq_format f, const uint8_t* c, __m256 vs, float* acc,
                            int plain_block) {
  __m256 y[4];
  avx2_codes32(f, c, y);
  const int plain = avx2_chunk_plain(f, plain_block, c);
  if (plain) {
    avx2_scale32(f, y, vs, 1);
  } else {
    avx2_scale32(f, y, vs, 0);
    for (int k = 0; k < 4; k++)
      y[k] = avx2_sat_fp32(y[k]);
  }
  for (int k = 0; k < 4; k++)
    _mm256_storeu_ps(acc + 8 * k, _mm256_add_ps(_mm256_loadu_ps(acc + 8 * k), y[k]));
}

AVX2_INLINE void avx2_decode_acc_blocks(agoq_format f, uint32_t block, const uint8_t* codes,
                                        size_t n, size_t b0, size_t b1, const float* scales,
                                        const uint8_t* escaped, float* acc) {
  for (size_t b = b0; b < b1; b++) {
    if (escaped[b])
      continue;
    const size_t start = b * (size_t)block, len = avx2_block_len(block, n, b);
    const uint8_t* c = codes + avx2_code_offset(f, start);
    float* a = acc + start;
    const __m256 vs = _mm256_set1_ps(scales[b]);
    const int plain = avx2_plain_scale(scales[b]);
    size_t i = 0;
    for (; i + CHUNK <= len; i += CHUNK)
      avx2_acc32(f, c + avx2_code_offset(f, i), vs, a + i, plain);
    if (i < len) {
      const size_t r = len - i;
      uint8_t in[CHUNK] = {0};
      float tmp[CHUNK] = {0};
      memcpy(in, c + avx2_code_offset(f, i), avx2_code_bytes(f, r));
      memcpy(tmp, a + i, r * sizeof(float));
      avx2_acc32(f, in, vs, tmp, plain);
      memcpy(a + i, tmp, r * sizeof(float));
    }
  }
}

static void avx2_decode_acc(agoq_format f, uint32_t block, const uint8_t* codes, size_t n,
                            size_t b0, size_t b1, const float* scales, const uint8_t* escaped,
                            float* acc) {
  switch (f) {
    case AGOQ_FORMAT_INT8:
      avx2_decode_acc_blocks(AGOQ_FORMAT_INT8, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    case AGOQ_FORMAT_INT4:
      avx2_decode_acc_blocks(AGOQ_FORMAT_INT4, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    case AGOQ_FORMAT_FP8E4M3:
      avx2_decode_acc_blocks(AGOQ_FORMAT_FP8E4M3, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    case AGOQ_FORMAT_FP8E5M2:
      avx2_decode_acc_blocks(AGOQ_FORMAT_FP8E5M2, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    default: break;
  }
}

/* |x| (as bits, so a signed compare is an unsigned one) in [inf_from_bits, Inf) becomes
 * +-Inf. A sum out of range is rare: the pass reads, and writes only vectors that change. */
static void avx2_overflow_inf(float* x, size_t n, uint32_t inf_from_bits) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i from_less1 = _mm256_set1_epi32((int)(inf_from_bits - 1u));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_loadu_si256((const __m256i*)(x + i));
    __m256i a = _mm256_and_si256(u, abs_mask);
    __m256i over = _mm256_andnot_si256(_mm256_cmpgt_epi32(a, _mm256_sub_epi32(inf, _mm256_set1_epi32(1))),
                                       _mm256_cmpgt_epi32(a, from_less1)); /* a >= from && a < inf */
    if (_mm256_testz_si256(over, over)) continue;
    __m256i signed_inf = _mm256_or_si256(_mm256_andnot_si256(abs_mask, u), inf);
    _mm256_storeu_si256((__m256i*)(x + i), _mm256_blendv_epi8(u, signed_inf, over));
  }
  for (; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= inf_from_bits && a < 0x7f800000u) {
      u = (u & 0x80000000u) | 0x7f800000u;
      memcpy(&x[i], &u, sizeof u);
    }
  }
}

const agoq_cpu_kernels agoq_cpu_kernels_avx2 = {
    .name = "avx2",
    .scan = avx2_scan,
    .encode = avx2_encode,
    .decode = avx2_decode,
    .decode_acc = avx2_decode_acc,
    .overflow_inf = avx2_overflow_inf,
};
