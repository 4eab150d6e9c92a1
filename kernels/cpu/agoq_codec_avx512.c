/*
 * AVX-512 (F, BW, VL, DQ) + F16C codec kernels (see agoq_codec_cpu.h), the same
 * arithmetic as agoq_codec_avx2.c on 16 lanes. Compiled with -ffp-contract=off; no FMA
 * intrinsic is used, so every product and sum is its own IEEE fp32 operation.
 *
 * Exactness relies on the default MXCSR (round to nearest even, no DAZ/FTZ), which this
 * file never changes; conversions that take a rounding argument are given RNE explicitly.
 *
 * Work is done 32 elements at a time (two vectors of 16). Full blocks are multiples of 32;
 * the last, shorter block uses masked loads (zeros in the unused lanes, as if padded) and
 * masked stores, so a tail uses exactly the arithmetic of a full chunk.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "agoq_codec_cpu.h"

#define AVX512_INLINE static inline __attribute__((always_inline))
#define CHUNK 32u

/* ---- constants ---------------------------------------------------------------------- */

static float avx512_format_max(agoq_format f) {
  switch (f) {
    case AGOQ_FORMAT_INT8: return 127.0f;
    case AGOQ_FORMAT_INT4: return 7.0f;
    case AGOQ_FORMAT_FP8E4M3: return 448.0f;
    case AGOQ_FORMAT_FP8E5M2: return 57344.0f;
    default: return 0.0f;
  }
}

static size_t avx512_dtype_size(agoq_dtype t) {
  return t == AGOQ_DTYPE_FP32 ? 4u : 2u;
}

static size_t avx512_block_len(uint32_t block, size_t n, size_t b) {
  size_t start = b * (size_t)block;
  size_t left = n - start;
  return left < block ? left : block;
}

AVX512_INLINE size_t avx512_code_offset(agoq_format f, size_t i) {
  return f == AGOQ_FORMAT_INT4 ? i / 2u : i;
}
AVX512_INLINE size_t avx512_code_bytes(agoq_format f, size_t len) {
  return f == AGOQ_FORMAT_INT4 ? (len + 1u) / 2u : len;
}

/* Masks of the first min(r, 16) / min(r, 32) lanes. */
AVX512_INLINE __mmask16 avx512_mask16(size_t r) {
  return (__mmask16)(r >= 16 ? 0xFFFFu : (1u << r) - 1u);
}
AVX512_INLINE __mmask32 avx512_mask32(size_t r) {
  return (__mmask32)(r >= 32 ? 0xFFFFFFFFu : (1u << r) - 1u);
}

/* ---- scan: amax and NaN/Inf detection on magnitude bits ------------------------------- */

/* For non-negative IEEE values the integer order of the bits is the numeric order, and
 * NaN/Inf patterns sort above every finite one: one unsigned max gives both amax and the
 * escape decision. Masked-off lanes load as 0, which never raises the max. */
AVX512_INLINE uint32_t avx512_amax_bits32(const uint8_t* p, size_t len) {
  const __m512i mag = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; i + 64 <= len; i += 64) {
    const uint8_t* q = p + i * 4;
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(q + 0), mag));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(q + 64), mag));
    m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_loadu_si512(q + 128), mag));
    m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_loadu_si512(q + 192), mag));
  }
  for (; i < len; i += 16)
    m0 = _mm512_max_epu32(
        m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(avx512_mask16(len - i), p + i * 4), mag));
  return _mm512_reduce_max_epu32(
      _mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3)));
}

AVX512_INLINE uint32_t avx512_amax_bits16(const uint8_t* p, size_t len) {
  const __m512i mag = _mm512_set1_epi16(0x7FFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; i + 128 <= len; i += 128) {
    const uint8_t* q = p + i * 2;
    m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(q + 0), mag));
    m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(q + 64), mag));
    m2 = _mm512_max_epu16(m2, _mm512_and_si512(_mm512_loadu_si512(q + 128), mag));
    m3 = _mm512_max_epu16(m3, _mm512_and_si512(_mm512_loadu_si512(q + 192), mag));
  }
  for (; i < len; i += 32)
    m0 = _mm512_max_epu16(
        m0, _mm512_and_si512(_mm512_maskz_loadu_epi16(avx512_mask32(len - i), p + i * 2), mag));
  __m512i m = _mm512_max_epu16(_mm512_max_epu16(m0, m1), _mm512_max_epu16(m2, m3));
  __m256i h = _mm256_max_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
  __m128i v = _mm_max_epu16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  v = _mm_minpos_epu16(_mm_xor_si128(v, _mm_set1_epi32(-1))); /* max = ~min(~x) */
  return (~(uint32_t)_mm_cvtsi128_si32(v)) & 0xFFFFu;
}

AVX512_INLINE void avx512_scan_blocks(agoq_dtype t, float m, uint32_t block, const void* src,
                                      size_t n, size_t b0, size_t b1, float* scales,
                                      uint8_t* escaped) {
  const uint8_t* base = (const uint8_t*)src;
  const size_t es = avx512_dtype_size(t);
  for (size_t b = b0; b < b1; b++) {
    const size_t len = avx512_block_len(block, n, b);
    const uint8_t* p = base + b * (size_t)block * es;
    uint32_t bits;
    float amax;
    int esc;
    if (t == AGOQ_DTYPE_FP32) {
      bits = avx512_amax_bits32(p, len);
      esc = bits >= 0x7F800000u;
      memcpy(&amax, &bits, 4);
    } else if (t == AGOQ_DTYPE_BF16) {
      bits = avx512_amax_bits16(p, len);
      esc = bits >= 0x7F80u;
      bits <<= 16;
      memcpy(&amax, &bits, 4);
    } else {
      bits = avx512_amax_bits16(p, len);
      esc = bits >= 0x7C00u;
      amax = _cvtsh_ss((unsigned short)bits); /* exact widening, denormals included */
    }
    escaped[b] = (uint8_t)esc;
    scales[b] = esc ? 0.0f : amax / m;
  }
}

static void avx512_scan(agoq_format f, agoq_dtype t, uint32_t block, const void* src, size_t n,
                        size_t b0, size_t b1, float* scales, uint8_t* escaped) {
  const float m = avx512_format_max(f);
  switch (t) {
    case AGOQ_DTYPE_FP32:
      avx512_scan_blocks(AGOQ_DTYPE_FP32, m, block, src, n, b0, b1, scales, escaped);
      break;
    case AGOQ_DTYPE_BF16:
      avx512_scan_blocks(AGOQ_DTYPE_BF16, m, block, src, n, b0, b1, scales, escaped);
      break;
    case AGOQ_DTYPE_FP16:
      avx512_scan_blocks(AGOQ_DTYPE_FP16, m, block, src, n, b0, b1, scales, escaped);
      break;
    default: break;
  }
}

/* ---- widening loads (exact) --------------------------------------------------------- */

/* 16 elements; with `tail`, only the lanes in k are read and the others are 0. */
AVX512_INLINE __m512 avx512_load16(agoq_dtype t, const uint8_t* p, int tail, __mmask16 k) {
  if (t == AGOQ_DTYPE_FP32)
    return tail ? _mm512_maskz_loadu_ps(k, p) : _mm512_loadu_ps(p);
  __m256i h = tail ? _mm256_maskz_loadu_epi16(k, p) : _mm256_loadu_si256((const __m256i*)p);
  if (t == AGOQ_DTYPE_BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

/* ---- encode --------------------------------------------------------------------------- */

/* fp32 -> fp8 code, round to nearest even, saturating to +-max finite, sign kept (-0 too).
 * Normal results: round the fp32 mantissa to the fp8 width with the integer carry trick and
 * rebias. Subnormal results: one fp32 add of a constant whose ulp is the fp8 subnormal
 * quantum rounds to that grid (RNE); the bits above the constant are the code, and a
 * carry into the smallest normal gives that normal's code. */
AVX512_INLINE __m512i avx512_fp8_encode(agoq_format f, __m512 v) {
  const int e4 = f == AGOQ_FORMAT_FP8E4M3;
  const int shift = e4 ? 20 : 21;
  const int rebias = e4 ? (127 - 7) << 3 : (127 - 15) << 2;
  const int maxcode = e4 ? 0x7E : 0x7B;
  const int min_normal = e4 ? 0x3C800000 : 0x38800000; /* 2^-6, 2^-14 */
  const int magic = e4 ? 0x46800000 : 0x43000000;      /* 2^14, 2^7: ulp = quantum */
  __m512i bits = _mm512_castps_si512(v);
  __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, (unsigned)shift), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (shift - 1)) - 1)), odd);
  __m512i cn = _mm512_sub_epi32(_mm512_srli_epi32(r, (unsigned)shift), _mm512_set1_epi32(rebias));
  cn = _mm512_min_epi32(cn, _mm512_set1_epi32(maxcode));
  __m512 t = _mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(_mm512_set1_epi32(magic)));
  __m512i cs = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(magic));
  __mmask16 sub = _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(min_normal));
  return _mm512_or_si512(_mm512_mask_blend_epi32(sub, cn, cs), sign);
}

/* Codes of 16 elements as int32 lanes (int formats: -M..M; fp8: 0..255). */
AVX512_INLINE __m512i avx512_code16(agoq_format f, __m512 x, __m512 vs, __m512 vm) {
  __m512 v = _mm512_div_ps(x, vs);
  if (f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4) {
    /* Clamping before rounding equals clamping after: M is an integer, both monotone. */
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_sub_ps(_mm512_setzero_ps(), vm)), vm);
    return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  return avx512_fp8_encode(f, v);
}

/* 16 int32 codes -> 16 bytes (int codes are within -7..7 / -127..127: no saturation). */
AVX512_INLINE __m128i avx512_bytes16(__m512i c) {
  return _mm512_cvtepi32_epi8(c);
}

/* 32 elements (r of them with `tail`) at p -> codes at out. */
AVX512_INLINE void avx512_encode32(agoq_format f, agoq_dtype t, const uint8_t* p, __m512 vs,
                                   __m512 vm, uint8_t* out, int tail, size_t r) {
  const size_t es = avx512_dtype_size(t);
  __mmask16 k0 = tail ? avx512_mask16(r) : 0xFFFF,
            k1 = tail ? avx512_mask16(r > 16 ? r - 16 : 0) : 0xFFFF;
  __m128i lo = avx512_bytes16(avx512_code16(f, avx512_load16(t, p, tail, k0), vs, vm));
  __m128i hi = avx512_bytes16(avx512_code16(f, avx512_load16(t, p + 16 * es, tail, k1), vs, vm));
  __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  if (f != AGOQ_FORMAT_INT4) {
    if (tail)
      _mm256_mask_storeu_epi8(out, avx512_mask32(r), bytes);
    else
      _mm256_storeu_si256((__m256i*)out, bytes);
    return;
  }
  /* Byte pair (lo, hi) -> (lo & 15) | (hi << 4) in each 16-bit lane, then 16 -> 8 bits. */
  __m256i nib =
      _mm256_or_si256(_mm256_and_si256(bytes, _mm256_set1_epi16(0x000F)),
                      _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00F0)));
  __m128i packed = _mm256_cvtepi16_epi8(nib);
  if (tail)
    _mm_mask_storeu_epi8(out, avx512_mask16((r + 1) / 2), packed);
  else
    _mm_storeu_si128((__m128i*)out, packed);
}

AVX512_INLINE void avx512_encode_blocks(agoq_format f, agoq_dtype t, uint32_t block,
                                        const void* src, size_t n, size_t b0, size_t b1,
                                        const float* scales, const uint8_t* escaped,
                                        uint8_t* codes) {
  const size_t es = avx512_dtype_size(t);
  const __m512 vm = _mm512_set1_ps(avx512_format_max(f));
  for (size_t b = b0; b < b1; b++) {
    const size_t start = b * (size_t)block, len = avx512_block_len(block, n, b);
    const uint8_t* p = (const uint8_t*)src + start * es;
    uint8_t* out = codes + avx512_code_offset(f, start);
    const float s = scales[b];
    if (escaped[b] || s == 0.0f) {
      memset(out, 0, avx512_code_bytes(f, len));
      continue;
    }
    const __m512 vs = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + CHUNK <= len; i += CHUNK)
      avx512_encode32(f, t, p + i * es, vs, vm, out + avx512_code_offset(f, i), 0, CHUNK);
    if (i < len)
      avx512_encode32(f, t, p + i * es, vs, vm, out + avx512_code_offset(f, i), 1, len - i);
  }
}

#define AVX512_ENCODE_CASE(F, T)                                                  \
  case (F)*AGOQ_DTYPE_COUNT + (T):                                                \
    avx512_encode_blocks(F, T, p->block, src, n, b0, b1, scales, escaped, codes); \
    break

static void avx512_encode(const agoq_codec_params* p, const void* src, size_t n, size_t b0,
                          size_t b1, const float* scales, const uint8_t* escaped, uint8_t* codes) {
  switch ((int)p->format * AGOQ_DTYPE_COUNT + (int)p->dtype) {
    AVX512_ENCODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP32);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP16);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP32);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_BF16);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP16);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP32);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_BF16);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP16);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP32);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_BF16);
    AVX512_ENCODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP16);
    default: break;
  }
}

/* ---- decode --------------------------------------------------------------------------- */

/* fp8 code (int32 lanes, 0..255) -> fp32, exact: place exponent and mantissa under the
 * fp32 layout and multiply by the bias difference (a power of two; fp8 subnormals become
 * fp32 denormals first, which the multiply honours). Codes with the all-ones exponent
 * (e4m3 S.1111.111, e5m2 S.11111.xx) never come out of encode; they decode like
 * agoq_fpconv.h's tables: the quiet NaN 0x7FC00000 with the code's sign, e5m2 +-Inf. */
AVX512_INLINE __m512 avx512_fp8_decode(agoq_format f, __m512i c) {
  const int e4 = f == AGOQ_FORMAT_FP8E4M3;
  __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
  __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
  __m512 y = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, e4 ? 20u : 21u)),
                           _mm512_castsi512_ps(_mm512_set1_epi32(e4 ? 0x7B800000 : 0x77800000)));
  __m512i bits = _mm512_castps_si512(y);
  if (e4) {
    __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
    bits = _mm512_mask_mov_epi32(bits, nan, _mm512_set1_epi32(0x7FC00000));
  } else {
    /* S.11111.00 -> Inf; S.11111.mm (mm != 0) -> the quiet NaN 0x7FC00000. */
    __mmask16 special = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7B));
    __mmask16 isnan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7C));
    bits = _mm512_mask_mov_epi32(bits, special, _mm512_set1_epi32(0x7F800000));
    bits = _mm512_mask_mov_epi32(bits, isnan, _mm512_set1_epi32(0x7FC00000));
  }
  return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

/* 32 codes (r of them with `tail`; the rest read as 0) -> 2 x 16 fp32 values q. */
AVX512_INLINE void avx512_codes32(agoq_format f, const uint8_t* c, int tail, size_t r,
                                  __m512 q[2]) {
  if (f == AGOQ_FORMAT_INT4) {
    __m128i b = tail ? _mm_maskz_loadu_epi8(avx512_mask16((r + 1) / 2), c)
                     : _mm_loadu_si128((const __m128i*)c);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    /* 4-bit two's complement -> int8: (x ^ 8) - 8. */
    const __m128i eight = _mm_set1_epi8(8);
    __m128i e0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
    __m128i e1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
    q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e0));
    q[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e1));
    return;
  }
  for (int k = 0; k < 2; k++) {
    size_t rk = r > 16u * (size_t)k ? r - 16u * (size_t)k : 0;
    __m128i b = tail ? _mm_maskz_loadu_epi8(avx512_mask16(rk), c + 16 * k)
                     : _mm_loadu_si128((const __m128i*)(c + 16 * k));
    if (f == AGOQ_FORMAT_INT8)
      q[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    else
      q[k] = avx512_fp8_decode(f, _mm512_cvtepu8_epi32(b));
  }
}

/* y = q * s, one multiply. With both operands NaN (an fp8 NaN code, a NaN scale from a
 * corrupt body) the hardware keeps its first source, which the compiler may pick either
 * way: a NaN q is put back explicitly, as the portable `q * s` yields with q first. */
AVX512_INLINE __m512 avx512_scale16(agoq_format f, __m512 q, __m512 vs, int plain) {
  __m512 y = _mm512_mul_ps(q, vs);
  if ((f == AGOQ_FORMAT_FP8E4M3 || f == AGOQ_FORMAT_FP8E5M2) && !plain)
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q), q);
  return y;
}

/* A block whose scale is finite with |s| <= 2^110 gives |y| <= 57344 * 2^110 < 2^126 for
 * every finite q: the common case, decoded without the NaN / Inf fix-ups. */
AVX512_INLINE int avx512_plain_scale(float s) {
  uint32_t bits;
  memcpy(&bits, &s, 4);
  return (bits & 0x7FFFFFFFu) <= 0x76800000u;
}

/* Whether 32 decoded q (and so their y) take the plain path: a plain block, and for fp8 no
 * NaN / Inf code among them (fpclass 0x99: QNaN, SNaN, +Inf, -Inf). */
AVX512_INLINE int avx512_chunk_plain(agoq_format f, int plain_block, const __m512 q[2]) {
  if (!plain_block)
    return 0;
  if (f != AGOQ_FORMAT_FP8E4M3 && f != AGOQ_FORMAT_FP8E5M2)
    return 1;
  return (_mm512_fpclass_ps_mask(q[0], 0x99) | _mm512_fpclass_ps_mask(q[1], 0x99)) == 0;
}

/* +-Inf -> +-FLT_MAX (the bits just below), the fp32 saturation of y. */
AVX512_INLINE __m512 avx512_sat_fp32(__m512 y) {
  __m512i bits = _mm512_castps_si512(y);
  __mmask16 inf = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                          _mm512_set1_epi32(0x7F800000));
  return _mm512_castsi512_ps(_mm512_mask_sub_epi32(bits, inf, bits, _mm512_set1_epi32(1)));
}

/* fp32 -> bf16 bits, RNE, saturating: a result of Inf (a finite overflow, or y = Inf, which
 * the portable path saturates to FLT_MAX first) becomes the largest finite (0x7F7F). A NaN
 * keeps its top bits and is made quiet. */
AVX512_INLINE __m256i avx512_to_bf16(__m512 y) {
  __m512i bits = _mm512_castps_si512(y);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i h = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd), 16);
  __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                          _mm512_set1_epi32(0x7F800000));
  h = _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
  __m256i h16 = _mm512_cvtepi32_epi16(h);
  __mmask16 inf = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h16, _mm256_set1_epi16(0x7FFF)),
                                          _mm256_set1_epi16(0x7F80));
  return _mm256_mask_sub_epi16(h16, inf, h16, _mm256_set1_epi16(1));
}

/* fp32 -> fp16 bits, RNE (F16C), saturating: a result of Inf becomes 0x7BFF (sign kept).
 * vcvtps2ph narrows a NaN to sign | 0x7E00 | top payload bits, as agoq_fpconv.h does. */
AVX512_INLINE __m256i avx512_to_fp16(__m512 y) {
  __m256i h = _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
  __mmask16 inf = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                          _mm256_set1_epi16(0x7C00));
  return _mm256_mask_sub_epi16(h, inf, h, _mm256_set1_epi16(1));
}

/* fp32 -> bf16 bits, RNE only: for finite |y| <= 2^127, which cannot round to Inf. */
AVX512_INLINE __m256i avx512_to_bf16_plain(__m512 y) {
  __m512i bits = _mm512_castps_si512(y);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd), 16));
}

/* `plain`: y is finite with |y| <= 2^126 (avx512_chunk_plain), so no NaN, no fp32
 * saturation and no bf16 overflow can occur; fp16 can still overflow. */
AVX512_INLINE void avx512_store16(agoq_dtype out, __m512 y, uint8_t* dst, int tail, __mmask16 k,
                                  int plain) {
  if (out == AGOQ_DTYPE_FP32) {
    if (!plain)
      y = avx512_sat_fp32(y);
    if (tail)
      _mm512_mask_storeu_ps(dst, k, y);
    else
      _mm512_storeu_ps(dst, y);
    return;
  }
  __m256i h = out == AGOQ_DTYPE_BF16 ? (plain ? avx512_to_bf16_plain(y) : avx512_to_bf16(y))
                                     : avx512_to_fp16(y);
  if (tail)
    _mm256_mask_storeu_epi16(dst, k, h);
  else
    _mm256_storeu_si256((__m256i*)dst, h);
}

AVX512_INLINE void avx512_decode32(agoq_format f, agoq_dtype out, const uint8_t* c, __m512 vs,
                                   uint8_t* d, int tail, size_t r, int plain_block) {
  const size_t es = avx512_dtype_size(out);
  const __mmask16 k0 = avx512_mask16(r), k1 = avx512_mask16(r > 16 ? r - 16 : 0);
  __m512 q[2];
  avx512_codes32(f, c, tail, r, q);
  if (avx512_chunk_plain(f, plain_block, q)) {
    avx512_store16(out, avx512_scale16(f, q[0], vs, 1), d, tail, k0, 1);
    avx512_store16(out, avx512_scale16(f, q[1], vs, 1), d + 16 * es, tail, k1, 1);
  } else {
    avx512_store16(out, avx512_scale16(f, q[0], vs, 0), d, tail, k0, 0);
    avx512_store16(out, avx512_scale16(f, q[1], vs, 0), d + 16 * es, tail, k1, 0);
  }
}

AVX512_INLINE void avx512_decode_blocks(agoq_format f, agoq_dtype out, uint32_t block,
                                        const uint8_t* codes, size_t n, size_t b0, size_t b1,
                                        const float* scales, const uint8_t* escaped, void* dst) {
  const size_t es = avx512_dtype_size(out);
  for (size_t b = b0; b < b1; b++) {
    if (escaped[b])
      continue;
    const size_t start = b * (size_t)block, len = avx512_block_len(block, n, b);
    const uint8_t* c = codes + avx512_code_offset(f, start);
    uint8_t* d = (uint8_t*)dst + start * es;
    const __m512 vs = _mm512_set1_ps(scales[b]);
    const int plain = avx512_plain_scale(scales[b]);
    size_t i = 0;
    for (; i + CHUNK <= len; i += CHUNK)
      avx512_decode32(f, out, c + avx512_code_offset(f, i), vs, d + i * es, 0, CHUNK, plain);
    if (i < len)
      avx512_decode32(f, out, c + avx512_code_offset(f, i), vs, d + i * es, 1, len - i, plain);
  }
}

#define AVX512_DECODE_CASE(F, T)                                               \
  case (F)*AGOQ_DTYPE_COUNT + (T):                                             \
    avx512_decode_blocks(F, T, block, codes, n, b0, b1, scales, escaped, dst); \
    break

static void avx512_decode(agoq_format f, agoq_dtype out, uint32_t block, const uint8_t* codes,
                          size_t n, size_t b0, size_t b1, const float* scales,
                          const uint8_t* escaped, void* dst) {
  switch ((int)f * AGOQ_DTYPE_COUNT + (int)out) {
    AVX512_DECODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP32);
    AVX512_DECODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_BF16);
    AVX512_DECODE_CASE(AGOQ_FORMAT_INT8, AGOQ_DTYPE_FP16);
    AVX512_DECODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP32);
    AVX512_DECODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_BF16);
    AVX512_DECODE_CASE(AGOQ_FORMAT_INT4, AGOQ_DTYPE_FP16);
    AVX512_DECODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP32);
    AVX512_DECODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_BF16);
    AVX512_DECODE_CASE(AGOQ_FORMAT_FP8E4M3, AGOQ_DTYPE_FP16);
    AVX512_DECODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP32);
    AVX512_DECODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_BF16);
    AVX512_DECODE_CASE(AGOQ_FORMAT_FP8E5M2, AGOQ_DTYPE_FP16);
    default: break;
  }
}

AVX512_INLINE void avx512_acc32(agoq_format f, const uint8_t* c, __m512 vs, float* a, int tail,
                                size_t r, int plain_block) {
  __m512 q[2];
  avx512_codes32(f, c, tail, r, q);
  const int plain = avx512_chunk_plain(f, plain_block, q);
  for (int k = 0; k < 2; k++) {
    __m512 y =
        plain ? avx512_scale16(f, q[k], vs, 1) : avx512_sat_fp32(avx512_scale16(f, q[k], vs, 0));
    float* ak = a + 16 * k;
    if (tail) {
      __mmask16 m = avx512_mask16(r > 16u * (size_t)k ? r - 16u * (size_t)k : 0);
      _mm512_mask_storeu_ps(ak, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, ak), y));
    } else {
      _mm512_storeu_ps(ak, _mm512_add_ps(_mm512_loadu_ps(ak), y));
    }
  }
}

AVX512_INLINE void avx512_decode_acc_blocks(agoq_format f, uint32_t block, const uint8_t* codes,
                                            size_t n, size_t b0, size_t b1, const float* scales,
                                            const uint8_t* escaped, float* acc) {
  for (size_t b = b0; b < b1; b++) {
    if (escaped[b])
      continue;
    const size_t start = b * (size_t)block, len = avx512_block_len(block, n, b);
    const uint8_t* c = codes + avx512_code_offset(f, start);
    float* a = acc + start;
    const __m512 vs = _mm512_set1_ps(scales[b]);
    const int plain = avx512_plain_scale(scales[b]);
    size_t i = 0;
    for (; i + CHUNK <= len; i += CHUNK)
      avx512_acc32(f, c + avx512_code_offset(f, i), vs, a + i, 0, CHUNK, plain);
    if (i < len)
      avx512_acc32(f, c + avx512_code_offset(f, i), vs, a + i, 1, len - i, plain);
  }
}

static void avx512_decode_acc(agoq_format f, uint32_t block, const uint8_t* codes, size_t n,
                              size_t b0, size_t b1, const float* scales, const uint8_t* escaped,
                              float* acc) {
  switch (f) {
    case AGOQ_FORMAT_INT8:
      avx512_decode_acc_blocks(AGOQ_FORMAT_INT8, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    case AGOQ_FORMAT_INT4:
      avx512_decode_acc_blocks(AGOQ_FORMAT_INT4, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    case AGOQ_FORMAT_FP8E4M3:
      avx512_decode_acc_blocks(AGOQ_FORMAT_FP8E4M3, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    case AGOQ_FORMAT_FP8E5M2:
      avx512_decode_acc_blocks(AGOQ_FORMAT_FP8E5M2, block, codes, n, b0, b1, scales, escaped, acc);
      break;
    default: break;
  }
}

/* |x| (as bits) in [inf_from_bits, Inf) becomes +-Inf. A sum out of range is rare: the
 * pass reads, and writes only the lanes that change. */
static void avx512_overflow_inf(float* x, size_t n, uint32_t inf_from_bits) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i from = _mm512_set1_epi32((int)inf_from_bits);
  size_t i = 0;
  for (; i < n; i += 16) {
    __mmask16 lanes = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
    __m512i u = _mm512_maskz_loadu_epi32(lanes, x + i);
    __m512i a = _mm512_and_si512(u, abs_mask);
    __mmask16 over = _mm512_mask_cmpge_epu32_mask(lanes, a, from) & _mm512_cmplt_epu32_mask(a, inf);
    if (over == 0) continue;
    _mm512_mask_storeu_epi32(x + i, over, _mm512_or_si512(_mm512_andnot_si512(abs_mask, u), inf));
  }
}

const agoq_cpu_kernels agoq_cpu_kernels_avx512 = {
    .name = "avx512",
    .scan = avx512_scan,
    .encode = avx512_encode,
    .decode = avx512_decode,
    .decode_acc = avx512_decode_acc,
    .overflow_inf = avx512_overflow_inf,
};
