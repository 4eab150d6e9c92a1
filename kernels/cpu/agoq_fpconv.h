/*
 * Exact scalar conversions and rounding helpers shared by every CPU implementation of the
 * codec (portable kernels, the driver's raw paths, and the SIMD kernels' tails). The bits
 * these produce ARE the codec's bits: a SIMD or CUDA kernel must match them exactly.
 *
 * Rules that agoq_codec.h leaves implicit, fixed here (and followed by the portable kernels):
 *  - Raw path (escaped blocks, format NONE): plain IEEE round-to-nearest-even; a finite value
 *    beyond the target's range becomes Inf; Inf stays Inf; widening is exact, signalling NaNs
 *    included; a narrowed NaN keeps its sign and top payload bits and is made quiet
 *    (fp32->bf16: (bits >> 16) | 0x0040; fp32->fp16: sign | 0x7e00 | (mantissa >> 13),
 *    which is what F16C's vcvtps2ph produces).
 *  - Decode path (y = (float)q * s): y is saturated in fp32 first (agoq_fp32_sat: +-Inf
 *    becomes +-FLT_MAX; it can overflow, e.g. amax = FLT_MAX with int8 gives 127 * s = Inf),
 *    and that saturated y is what decode writes as fp32 and what decode-accumulate adds.
 *    bf16/fp16 outputs clamp y to +-max finite and then round (RNE), which equals "round,
 *    and a result beyond max finite becomes max finite". A NaN y (only possible from a NaN
 *    fp8 code, which no encoder writes) narrows as on the raw path.
 *  - fp8 decoding maps every NaN code to the quiet NaN 0x7fc00000 with the code's sign, and
 *    the e5m2 Inf codes to +-Inf.
 *  - fp8 encoding of a NaN (never reached: NaN blocks are escaped) gives sign | 0x7f.
 *
 * Everything here assumes fp32 arithmetic is IEEE binary32 with RNE, no FMA contraction
 * and no flush-to-zero (x86-64 SSE; compile with -ffp-contract=off).
 */
#ifndef AGOQ_FPCONV_H
#define AGOQ_FPCONV_H

#include <stdint.h>
#include <string.h>

#define AGOQ_FP32_MAX_BITS 0x7f7fffffu
#define AGOQ_BF16_MAX_BITS 0x7f7fu
#define AGOQ_FP16_MAX_BITS 0x7bffu
#define AGOQ_FP32_MAX_F 0x1.fffffep127f
#define AGOQ_BF16_MAX_F 0x1.fep127f /* 3.3895314e38 */
#define AGOQ_FP16_MAX_F 65504.0f
#define AGOQ_FP8E4M3_MAX_F 448.0f
#define AGOQ_FP8E5M2_MAX_F 57344.0f
/* 1.5 * 2^23: adding it to |v| <= 2^22 leaves the integer RNE(v) in the low mantissa bits. */
#define AGOQ_RNE_MAGIC_F 12582912.0f
#define AGOQ_RNE_MAGIC_BITS 0x4b400000u

/* fp8 decode tables (bit patterns of the fp32 values), defined in agoq_fpconv.c. */
extern const uint32_t agoq_fp8e4m3_fp32_bits[256];
extern const uint32_t agoq_fp8e5m2_fp32_bits[256];

static inline uint32_t agoq_fp32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float agoq_fp32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- widening: exact ---------------------------------------------------------------- */

static inline float agoq_bf16_to_fp32(uint16_t h) {
  return agoq_fp32_from_bits((uint32_t)h << 16);
}

static inline float agoq_fp16_to_fp32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return agoq_fp32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e != 0) return agoq_fp32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  /* Zero or subnormal: m * 2^-24, exact in fp32. */
  float v = (float)m * 0x1p-24f;
  return agoq_fp32_from_bits(sign | agoq_fp32_bits(v));
}

static inline float agoq_fp8e4m3_to_fp32(uint8_t c) {
  return agoq_fp32_from_bits(agoq_fp8e4m3_fp32_bits[c]);
}

static inline float agoq_fp8e5m2_to_fp32(uint8_t c) {
  return agoq_fp32_from_bits(agoq_fp8e5m2_fp32_bits[c]);
}

/* ---- narrowing: raw path (IEEE: overflow to Inf) --------------------------------------- */

static inline uint16_t agoq_fp32_to_bf16(float f) {
  uint32_t x = agoq_fp32_bits(f);
  uint32_t nan = (x >> 16) | 0x0040u;
  /* Carries into the exponent (and to Inf) are the correct rounding. */
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline uint16_t agoq_fp32_to_fp16(float f) {
  uint32_t x = agoq_fp32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
  if (a >= 0x38800000u) {                                   /* >= 2^-14: normal */
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
  }
  /* Subnormal (or rounds up to the smallest normal, code 0x400): RNE(|f| * 2^24), the
   * scaling is exact and the sum below rounds once, to an integer. */
  float t = agoq_fp32_from_bits(a) * 0x1p24f + AGOQ_RNE_MAGIC_F;
  return (uint16_t)(sign | (agoq_fp32_bits(t) - AGOQ_RNE_MAGIC_BITS));
}

/* ---- decode path: saturating ------------------------------------------------------------ */

static inline float agoq_fp32_clamp_abs(float y, float max) {
  /* Comparisons are false for NaN: a NaN passes through unchanged. */
  y = y > max ? max : y;
  return y < -max ? -max : y;
}

/* +-Inf becomes +-FLT_MAX; NaN and finite values are unchanged. */
static inline float agoq_fp32_sat(float y) {
  return agoq_fp32_clamp_abs(y, AGOQ_FP32_MAX_F);
}

static inline uint16_t agoq_fp32_to_bf16_sat(float y) {
  return agoq_fp32_to_bf16(agoq_fp32_clamp_abs(y, AGOQ_BF16_MAX_F));
}

static inline uint16_t agoq_fp32_to_fp16_sat(float y) {
  return agoq_fp32_to_fp16(agoq_fp32_clamp_abs(y, AGOQ_FP16_MAX_F));
}

/* ---- output range of a reduced value: overflow is Inf ----------------------------------- */

/* The smallest fp32 magnitude (as bits) whose RNE conversion to bf16 / fp16 is Inf: the
 * midpoint between the type's largest finite value and 2^(emax+1), a tie that rounds to the
 * even neighbour, which is Inf. For fp32 itself it is the Inf pattern: nothing changes. */
#define AGOQ_BF16_INF_FROM_BITS 0x7f7f8000u /* (2 - 2^-8) * 2^127 */
#define AGOQ_FP16_INF_FROM_BITS 0x477ff000u /* 65520 */
#define AGOQ_FP32_INF_FROM_BITS 0x7f800000u

/* A finite x whose RNE conversion to the output type overflows becomes +-Inf (sign kept);
 * NaN, Inf and every x the type can hold are unchanged. The owner of a CollNet slice applies
 * this to its fp32 sums before quantizing them, so a sum outside the output type's range
 * reaches every rank as Inf (its block travels raw), as NCCL's own reduction gives, instead
 * of decoding to the saturated maximum (fp16 loss scaling looks for that Inf). */
static inline float agoq_fp32_overflow_inf(float x, uint32_t inf_from_bits) {
  uint32_t u = agoq_fp32_bits(x);
  uint32_t a = u & 0x7fffffffu;
  uint32_t inf = (u & 0x80000000u) | 0x7f800000u;
  return agoq_fp32_from_bits(a >= inf_from_bits && a < 0x7f800000u ? inf : u);
}

/* ---- fp8 encoding: RNE, saturating to +-max finite, -0 kept ---------------------------- */

static inline uint8_t agoq_fp32_to_fp8e4m3(float v) {
  uint32_t x = agoq_fp32_bits(v);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 (and Inf): saturate */
  if (a >= 0x3c800000u) {                                /* >= 2^-6: normal */
    a += 0x7ffffu + ((a >> 20) & 1u);
    return (uint8_t)(sign | ((a >> 20) - (120u << 3)));
  }
  /* Subnormal: RNE(|v| * 2^9) in [0, 8]; 8 is the smallest normal's code. */
  float t = agoq_fp32_from_bits(a) * 0x1p9f + AGOQ_RNE_MAGIC_F;
  return (uint8_t)(sign | (agoq_fp32_bits(t) - AGOQ_RNE_MAGIC_BITS));
}

static inline uint8_t agoq_fp32_to_fp8e5m2(float v) {
  uint32_t x = agoq_fp32_bits(v);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (a >= 0x47600000u) return (uint8_t)(sign | 0x7bu); /* >= 57344 (and Inf): saturate */
  if (a >= 0x38800000u) {                                /* >= 2^-14: normal */
    a += 0xfffffu + ((a >> 21) & 1u);
    return (uint8_t)(sign | ((a >> 21) - (112u << 2)));
  }
  float t = agoq_fp32_from_bits(a) * 0x1p16f + AGOQ_RNE_MAGIC_F;
  return (uint8_t)(sign | (agoq_fp32_bits(t) - AGOQ_RNE_MAGIC_BITS));
}

/* ---- integer rounding -------------------------------------------------------------------- */

/* clamp(rne_to_integer(v), -m, m) for finite v and 0 < m <= 2^22. Clamping first is the same
 * (m is an integer) and keeps the magic-number sum inside [2^23, 2^24), where its ulp is 1. */
static inline int32_t agoq_rne_int_clamp(float v, float m) {
  v = agoq_fp32_clamp_abs(v, m);
  return (int32_t)(agoq_fp32_bits(v + AGOQ_RNE_MAGIC_F) - AGOQ_RNE_MAGIC_BITS);
}

/* clamp(floor(t), -m, m) for finite t: floor of the clamped value is the same. */
static inline int32_t agoq_floor_int_clamp(float t, float m) {
  t = agoq_fp32_clamp_abs(t, m);
  int32_t r = (int32_t)(agoq_fp32_bits(t + AGOQ_RNE_MAGIC_F) - AGOQ_RNE_MAGIC_BITS);
  return (float)r > t ? r - 1 : r;
}

/* ---- Philox4x32-10 (Salmon et al., Random123; the same as curand's Philox) --------------- */

static inline void agoq_philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                                      uint32_t out[4]) {
  uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
  uint32_t k0 = key_in[0], k1 = key_in[1];
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9e3779b9u;
      k1 += 0xbb67ae85u;
    }
    uint64_t p0 = (uint64_t)0xd2511f53u * c0;
    uint64_t p1 = (uint64_t)0xcd9e8d57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* The stochastic-rounding offset u in [0, 1) for global element index idx (agoq_codec.h). */
static inline float agoq_stochastic_u(uint64_t seed, uint64_t idx) {
  uint32_t ctr[4] = {(uint32_t)idx, (uint32_t)(idx >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint32_t r[4];
  agoq_philox4x32_10(ctr, key, r);
  return (float)(r[0] >> 8) * 0x1p-24f;
}

#endif
