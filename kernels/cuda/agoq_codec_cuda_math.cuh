/*
 * Element arithmetic of the CUDA codec, callable from device code and from host code (the
 * host build of these functions is what test_codec_cuda_math checks against the CPU codec
 * without a GPU). Every function states the CPU function in kernels/cpu/agoq_fpconv.h whose
 * bits it reproduces; those are the codec's definition.
 *
 * Two things differ between CUDA and x86 and are handled here rather than in the kernels:
 *  - NaN results: CUDA's FADD/FMUL return the canonical NaN 0x7fffffff, SSE/AVX return the
 *    first NaN operand made quiet, or the "default NaN" 0xffc00000 for Inf - Inf and 0 * Inf.
 *    x86_add / x86_mul give the x86 bits on both (the CPU codec computes acc + y and q * s,
 *    acc and q first).
 *  - Conversions: the kernels' fast paths use hardware RNE conversions only for values where
 *    they equal the software ones here (finite, no NaN); anything else takes these.
 */
#ifndef AGOQ_CODEC_CUDA_MATH_CUH
#define AGOQ_CODEC_CUDA_MATH_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define AGOQ_HD __host__ __device__ __forceinline__
#else
#define AGOQ_HD static inline
#endif

namespace agoq_cuda {

/* Format maxima M (agoq_codec.h) and the fp32 RNE "magic" 1.5 * 2^23. */
constexpr float kInt8Max = 127.0f;
constexpr float kInt4Max = 7.0f;
constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
constexpr float kBf16MaxF = 3.38953139e38f; /* 0x7f7f0000 */
constexpr float kFp16MaxF = 65504.0f;
constexpr float kFp32MaxF = 3.40282347e38f; /* 0x7f7fffff */
constexpr float kRneMagicF = 12582912.0f;
constexpr uint32_t kRneMagicBits = 0x4b400000u;
constexpr uint32_t kX86DefaultNaN = 0xffc00000u;

/* ---- bit casts and IEEE operations ----------------------------------------------------- */

AGOQ_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

AGOQ_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/* One IEEE binary32 operation each, round to nearest even, never contracted into an FMA
 * (the host side is compiled with -ffp-contract=off). */
AGOQ_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

AGOQ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

AGOQ_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

AGOQ_HD bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* The x86 result for a NaN sum or product r of (a, b): a's NaN, else b's, made quiet; the
 * default NaN when neither operand was a NaN (Inf - Inf, 0 * Inf). */
AGOQ_HD float x86_nan(float a, float b) {
  uint32_t ua = f2u(a), ub = f2u(b);
  if (is_nan_bits(ua)) return u2f(ua | 0x00400000u);
  if (is_nan_bits(ub)) return u2f(ub | 0x00400000u);
  return u2f(kX86DefaultNaN);
}

AGOQ_HD float x86_add(float a, float b) {
  float r = add_rn(a, b);
  return r != r ? x86_nan(a, b) : r;
}

AGOQ_HD float x86_mul(float a, float b) {
  float r = mul_rn(a, b);
  return r != r ? x86_nan(a, b) : r;
}

/* ---- widening: exact (agoq_bf16_to_fp32, agoq_fp16_to_fp32) ------------------------------ */

AGOQ_HD float bf16_to_fp32(uint32_t h) { return u2f((h & 0xffffu) << 16); }

/* fp16 -> fp32 for finite or non-finite h, NaN payload kept (not made quiet). The magnitude
 * shifted into an fp32 pattern and scaled by 2^112 is exact for normals and subnormals alike
 * (an fp32 subnormal times a power of two, no flush to zero). */
AGOQ_HD float fp16_to_fp32(uint32_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t mag = h & 0x7fffu;
  if (mag >= 0x7c00u) return u2f(sign | 0x7f800000u | ((mag & 0x3ffu) << 13));
  return u2f(f2u(mul_rn(u2f(mag << 13), 0x1p112f)) | sign);
}

/* The same for a magnitude known to be finite (the quantize path: blocks with Inf or NaN
 * are escaped before any arithmetic). */
AGOQ_HD float fp16_mag_to_fp32(uint32_t mag) { return mul_rn(u2f(mag << 13), 0x1p112f); }

/* ---- narrowing, raw path: RNE, overflow to Inf (agoq_fp32_to_bf16 / _fp16) --------------- */

AGOQ_HD uint32_t fp32_to_bf16(float f) {
  uint32_t x = f2u(f);
  if (is_nan_bits(x)) return ((x >> 16) | 0x0040u) & 0xffffu;
  x += 0x7fffu + ((x >> 16) & 1u);
  return x >> 16;
}

AGOQ_HD uint32_t fp32_to_fp16(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) {
    a += 0xfffu + ((a >> 13) & 1u);
    return sign | ((a - 0x38000000u) >> 13);
  }
  float t = add_rn(mul_rn(u2f(a), 0x1p24f), kRneMagicF);
  return sign | (f2u(t) - kRneMagicBits);
}

/* ---- decode path: saturating (agoq_fp32_sat, agoq_fp32_clamp_abs, *_sat) ---------------- */

AGOQ_HD float fp32_sat(float y) {
  uint32_t x = f2u(y);
  if ((x & 0x7fffffffu) == 0x7f800000u) return u2f((x & 0x80000000u) | 0x7f7fffffu);
  return y;
}

/* NaN passes unchanged (comparisons are false), as on the CPU. */
AGOQ_HD float clamp_abs(float y, float max) {
  if (y > max) return max;
  if (y < -max) return -max;
  return y;
}

AGOQ_HD uint32_t fp32_to_bf16_sat(float y) { return fp32_to_bf16(clamp_abs(y, kBf16MaxF)); }
AGOQ_HD uint32_t fp32_to_fp16_sat(float y) { return fp32_to_fp16(clamp_abs(y, kFp16MaxF)); }

/* ---- output range of a reduced value (agoq_fp32_overflow_inf) ------------------------- */

/* The smallest magnitudes (fp32 bits) that round to Inf in bf16 / fp16; fp32: the Inf itself. */
constexpr uint32_t kBf16InfFromBits = 0x7f7f8000u;
constexpr uint32_t kFp16InfFromBits = 0x477ff000u;
constexpr uint32_t kFp32InfFromBits = 0x7f800000u;

/* A finite x whose RNE conversion to the output type is Inf becomes +-Inf; bits only. */
AGOQ_HD float fp32_overflow_inf(float x, uint32_t inf_from_bits) {
  uint32_t u = f2u(x);
  uint32_t a = u & 0x7fffffffu;
  return u2f(a >= inf_from_bits && a < 0x7f800000u ? (u & 0x80000000u) | 0x7f800000u : u);
}

/* ---- fp8 (agoq_fp32_to_fp8e4m3 / e5m2, agoq_fp8e4m3_fp32_bits / e5m2 tables) ------------ */

AGOQ_HD uint32_t fp32_to_e4m3(float v) {
  uint32_t x = f2u(v);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;
  if (a >= 0x43e00000u) return sign | 0x7eu;
  if (a >= 0x3c800000u) {
    a += 0x7ffffu + ((a >> 20) & 1u);
    return sign | ((a >> 20) - (120u << 3));
  }
  float t = add_rn(mul_rn(u2f(a), 0x1p9f), kRneMagicF);
  return sign | (f2u(t) - kRneMagicBits);
}

AGOQ_HD uint32_t fp32_to_e5m2(float v) {
  uint32_t x = f2u(v);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;
  if (a >= 0x47600000u) return sign | 0x7bu;
  if (a >= 0x38800000u) {
    a += 0xfffffu + ((a >> 21) & 1u);
    return sign | ((a >> 21) - (112u << 2));
  }
  float t = add_rn(mul_rn(u2f(a), 0x1p16f), kRneMagicF);
  return sign | (f2u(t) - kRneMagicBits);
}

/* The e4m3 code's magnitude bits put where fp32 keeps its own and scaled by 2^(127 - 7):
 * exact for normals and subnormals. 0x7f/0xff are NaN (no Inf in e4m3 "FN"). */
AGOQ_HD float e4m3_to_fp32(uint32_t c) {
  uint32_t sign = (c & 0x80u) << 24;
  if ((c & 0x7fu) == 0x7fu) return u2f(sign | 0x7fc00000u);
  return u2f(f2u(mul_rn(u2f((c & 0x7fu) << 20), 0x1p120f)) | sign);
}

/* Likewise with 2^(127 - 15); exponent 31 is Inf (mantissa 0) or NaN. */
AGOQ_HD float e5m2_to_fp32(uint32_t c) {
  uint32_t sign = (c & 0x80u) << 24;
  if ((c & 0x7cu) == 0x7cu) return u2f(sign | ((c & 3u) ? 0x7fc00000u : 0x7f800000u));
  return u2f(f2u(mul_rn(u2f((c & 0x7fu) << 21), 0x1p112f)) | sign);
}

/* Four bytes of w: does any hold a code the fast decode path does not cover (e4m3 NaN,
 * e5m2 Inf/NaN)? One carry per byte lands in its top bit exactly for those codes. */
AGOQ_HD bool e4m3_any_special(uint32_t w) {
  return (((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0;
}
AGOQ_HD bool e5m2_any_special(uint32_t w) {
  return (((w & 0x7c7c7c7cu) + 0x04040404u) & 0x80808080u) != 0;
}

/* ---- integer codes (agoq_rne_int_clamp, agoq_floor_int_clamp) ------------------------------ */

/* clamp(rne(v), -m, m) for finite v: rounding the clamped value is the same (m integral),
 * and 1.5 * 2^23 + v, |v| <= 2^22, rounds once at the units place. The code is the low
 * byte of the sum's bit pattern (two's complement). */
AGOQ_HD int32_t rne_int_clamp(float v, float m) {
  v = fminf(fmaxf(v, -m), m);
  return (int32_t)(f2u(add_rn(v, kRneMagicF)) - kRneMagicBits);
}

/* fp32 sum rounded towards -Inf, for finite operands whose sum does not overflow. The host
 * has no such operation without switching the rounding mode (which the optimiser may move
 * code across): it takes the RNE sum and steps down one ulp when that sum is above the exact
 * one, whose remainder TwoSum gives exactly. */
AGOQ_HD float add_rd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rd(a, b);
#else
  float s = a + b;
  float bb = s - a;
  float err = (a - (s - bb)) + (b - bb); /* a + b == s + err exactly */
  return err < 0.0f ? nextafterf(s, -INFINITY) : s;
#endif
}

/* clamp(floor(t), -m, m) for finite t: the clamped t plus 1.5 * 2^23 rounded towards -Inf
 * at the units place is 1.5 * 2^23 + floor(t). */
AGOQ_HD int32_t floor_int_clamp(float t, float m) {
  t = fminf(fmaxf(t, -m), m);
  return (int32_t)(f2u(add_rd(t, kRneMagicF)) - kRneMagicBits);
}

/* Integer code -> fp32, exact: 2^23 + 128 + q built as a bit pattern, minus 2^23 + 128. */
AGOQ_HD float int8_code_to_fp32(uint32_t byte) {
  return add_rn(u2f(0x4b000000u | ((byte & 0xffu) ^ 0x80u)), -8388736.0f);
}
AGOQ_HD float int4_code_to_fp32(uint32_t nib) {
  return add_rn(u2f(0x4b000000u | ((nib & 0xfu) ^ 0x8u)), -8388616.0f);
}

/* ---- Philox4x32-10 (agoq_philox4x32_10, agoq_stochastic_u) --------------------------------- */

AGOQ_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

AGOQ_HD void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9e3779b9u;
      k1 += 0xbb67ae85u;
    }
    uint32_t hi0 = mulhi32(0xd2511f53u, c0), lo0 = 0xd2511f53u * c0;
    uint32_t hi1 = mulhi32(0xcd9e8d57u, c2), lo1 = 0xcd9e8d57u * c2;
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* u = (philox(ctr = {idx lo, idx hi, 0, 0}, key = {seed lo, seed hi}).x >> 8) * 2^-24. */
AGOQ_HD float stochastic_u(uint64_t seed, uint64_t idx) {
  uint32_t ctr[4] = {(uint32_t)idx, (uint32_t)(idx >> 32), 0u, 0u};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint32_t r[4];
  philox4x32_10(ctr, key, r);
  /* A 24-bit integer is exact in fp32, and so is the power-of-two scaling. */
  return mul_rn((float)(r[0] >> 8), 0x1p-24f);
}

/* ---- one element of the codec ------------------------------------------------------------ */

/* Code of one finite input x in a block with scale s != 0 (agoq_cpu_kernels_portable.encode):
 * int8/int4 return the two's complement integer, fp8 the code byte. */
AGOQ_HD int32_t encode_int(float x, float s, float m) { return rne_int_clamp(div_rn(x, s), m); }
AGOQ_HD int32_t encode_int_stochastic(float x, float s, float m, uint64_t seed, uint64_t idx) {
  return floor_int_clamp(add_rn(div_rn(x, s), stochastic_u(seed, idx)), m);
}

/* y = sat(q * s) as the CPU decodes it, q already widened. */
AGOQ_HD float decode_y(float q, float s) { return fp32_sat(x86_mul(q, s)); }

}  // namespace agoq_cuda

#endif
