/*
 * The CUDA codec's element arithmetic (agoq_codec_cuda_math.cuh), run on the host, against
 * the CPU codec's definition (kernels/cpu/agoq_fpconv.h) and against what this machine's
 * SSE does for NaN results. Needs no GPU: it is what can be checked of the CUDA codec here.
 * The device-only parts (hardware conversions, the kernels' indexing) are checked on a GPU
 * by tools/gpu/codec_gpu_check.
 *
 * Also cross-checks CA's fp8 / bf16 / fp16 narrowing with NVIDIA's host emulation of the
 * hardware conversions the fast paths use (cuda_fp8.hpp, cuda_bf16.hpp, cuda_fp16.hpp):
 * the codec is only bit-identical on a GPU if those agree for every value a fast path feeds
 * them.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_codec_cuda_math.cuh"

extern "C" {
#include "agoq_codec.h"
#include "cpu/agoq_fpconv.h"
}

using namespace agoq_cuda;

static long failures;

#define CHECK_EQ(what, got, want, arg)                                                       \
  do {                                                                                       \
    unsigned long long g_ = (unsigned long long)(got), w_ = (unsigned long long)(want);      \
    if (g_ != w_ && failures++ < 20)                                                          \
      fprintf(stderr, "%s(0x%08llx): got 0x%llx, want 0x%llx\n", what,                        \
              (unsigned long long)(arg), g_, w_);                                             \
  } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

/* Every high half with a spread of low halves: all exponents, signs, NaN payload shapes,
 * rounding ties and near-ties of every narrowing. */
static const uint32_t kLow[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001,
                                0xc000, 0xefff, 0xf000, 0xffff};
static const unsigned kLowRandom = 4;

static uint32_t sample_f32(uint32_t hi, unsigned k) {
  const unsigned nfixed = sizeof kLow / sizeof kLow[0];
  return (hi << 16) | (k < nfixed ? kLow[k] : (rnd() & 0xffffu));
}

static void test_narrowing(void) {
  for (uint32_t hi = 0; hi < 0x10000u; hi++)
  for (unsigned k = 0; k < sizeof kLow / sizeof kLow[0] + kLowRandom; k++) {
    const uint32_t u = sample_f32(hi, k);
    float f = u2f(u);
    CHECK_EQ("fp32_to_bf16", fp32_to_bf16(f), agoq_fp32_to_bf16(f), u);
    CHECK_EQ("fp32_to_fp16", fp32_to_fp16(f), agoq_fp32_to_fp16(f), u);
    CHECK_EQ("fp32_to_bf16_sat", fp32_to_bf16_sat(f), agoq_fp32_to_bf16_sat(f), u);
    CHECK_EQ("fp32_to_fp16_sat", fp32_to_fp16_sat(f), agoq_fp32_to_fp16_sat(f), u);
    CHECK_EQ("fp32_to_e4m3", fp32_to_e4m3(f), agoq_fp32_to_fp8e4m3(f), u);
    CHECK_EQ("fp32_to_e5m2", fp32_to_e5m2(f), agoq_fp32_to_fp8e5m2(f), u);
    CHECK_EQ("fp32_sat", f2u(fp32_sat(f)), agoq_fp32_bits(agoq_fp32_sat(f)), u);
    CHECK_EQ("overflow_inf bf16", f2u(fp32_overflow_inf(f, kBf16InfFromBits)),
             agoq_fp32_bits(agoq_fp32_overflow_inf(f, AGOQ_BF16_INF_FROM_BITS)), u);
    CHECK_EQ("overflow_inf fp16", f2u(fp32_overflow_inf(f, kFp16InfFromBits)),
             agoq_fp32_bits(agoq_fp32_overflow_inf(f, AGOQ_FP16_INF_FROM_BITS)), u);
    CHECK_EQ("overflow_inf fp32", f2u(fp32_overflow_inf(f, kFp32InfFromBits)), u, u);
    if (is_nan_bits(u)) continue;
    /* What the fast paths do on a GPU: min/max clamp (NaN excluded), then the hardware RNE
     * conversion, whose definition NVIDIA's host code emulates. */
    float cb = fminf(fmaxf(f, -kBf16MaxF), kBf16MaxF), ch = fminf(fmaxf(f, -kFp16MaxF), kFp16MaxF);
    __nv_bfloat16_raw br = __float2bfloat16_rn(cb);
    __half_raw hr = __float2half_rn(ch);
    CHECK_EQ("hw bf16 fast path", br.x, agoq_fp32_to_bf16_sat(f), u);
    CHECK_EQ("hw fp16 fast path", hr.x, agoq_fp32_to_fp16_sat(f), u);
    CHECK_EQ("fp32 fast sat", f2u(fminf(fmaxf(f, -kFp32MaxF), kFp32MaxF)),
             agoq_fp32_bits(agoq_fp32_sat(f)), u);
    CHECK_EQ("hw e4m3 satfinite", __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3),
             agoq_fp32_to_fp8e4m3(f), u);
    CHECK_EQ("hw e5m2 satfinite", __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2),
             agoq_fp32_to_fp8e5m2(f), u);
  }
}

static void test_widening(void) {
  for (uint32_t h = 0; h < 0x10000u; h++) {
    CHECK_EQ("bf16_to_fp32", f2u(bf16_to_fp32(h)), agoq_fp32_bits(agoq_bf16_to_fp32((uint16_t)h)), h);
    CHECK_EQ("fp16_to_fp32", f2u(fp16_to_fp32(h)), agoq_fp32_bits(agoq_fp16_to_fp32((uint16_t)h)), h);
    if ((h & 0x7fffu) < 0x7c00u) {
      float want = agoq_fp16_to_fp32((uint16_t)h);
      CHECK_EQ("fp16_mag_to_fp32", f2u(fp16_mag_to_fp32(h & 0x7fffu)),
               agoq_fp32_bits(want) & 0x7fffffffu, h);
    }
  }
  for (uint32_t c = 0; c < 256; c++) {
    CHECK_EQ("e4m3_to_fp32", f2u(e4m3_to_fp32(c)), agoq_fp8e4m3_fp32_bits[c], c);
    CHECK_EQ("e5m2_to_fp32", f2u(e5m2_to_fp32(c)), agoq_fp8e5m2_fp32_bits[c], c);
    CHECK_EQ("int8_code_to_fp32", f2u(int8_code_to_fp32(c)), agoq_fp32_bits((float)(int8_t)c), c);
    if (c < 16)
      CHECK_EQ("int4_code_to_fp32", f2u(int4_code_to_fp32(c)),
               agoq_fp32_bits((float)((int32_t)(c ^ 8u) - 8)), c);
    /* The decode fast path's fp8 formula, valid for every code it is used for. */
    uint32_t sign = (c & 0x80u) << 24;
    if ((c & 0x7fu) != 0x7fu)
      CHECK_EQ("e4m3 fast", f2u(mul_rn(u2f((c & 0x7fu) << 20), 0x1p120f)) | sign,
               agoq_fp8e4m3_fp32_bits[c], c);
    if ((c & 0x7cu) != 0x7cu)
      CHECK_EQ("e5m2 fast", f2u(mul_rn(u2f((c & 0x7fu) << 21), 0x1p112f)) | sign,
               agoq_fp8e5m2_fp32_bits[c], c);
  }
  /* The packed special-code tests against the per-byte definition. */
  for (int i = 0; i < 200000; i++) {
    uint32_t w = rnd() ^ (rnd() << 16);
    if (i < 256) w = (uint32_t)i * 0x01010101u;
    bool e4 = false, e5 = false;
    for (int k = 0; k < 4; k++) {
      uint32_t c = (w >> (8 * k)) & 0xffu;
      e4 |= (c & 0x7fu) == 0x7fu;
      e5 |= (c & 0x7cu) == 0x7cu;
    }
    CHECK_EQ("e4m3_any_special", e4m3_any_special(w), e4, w);
    CHECK_EQ("e5m2_any_special", e5m2_any_special(w), e5, w);
  }
}

static void test_int_rounding(void) {
  const float ms[] = {127.0f, 7.0f};
  for (int i = 0; i < 4000000; i++) {
    float m = ms[i & 1];
    /* Values around the integers and half-integers of [-2m, 2m], and anywhere. */
    float v;
    if (i % 3 == 0)
      v = u2f(rnd() ^ (rnd() << 16));
    else
      v = ((float)((int32_t)(rnd() % (uint32_t)(8 * m + 1)) - (int32_t)(4 * m)) / 2.0f) +
          (float)((int32_t)(rnd() % 5) - 2) * 0x1p-20f;
    if (!isfinite(v)) continue;
    CHECK_EQ("rne_int_clamp", (uint32_t)rne_int_clamp(v, m), (uint32_t)agoq_rne_int_clamp(v, m), f2u(v));
    CHECK_EQ("floor_int_clamp", (uint32_t)floor_int_clamp(v, m), (uint32_t)agoq_floor_int_clamp(v, m),
             f2u(v));
  }
}

static void test_philox(void) {
  /* Random123 known-answer vectors for philox4x32_10. */
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
       0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
      {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
       0x94fdccebu, 0x5001e420u, 0x24126ea1u},
  };
  for (int t = 0; t < 3; t++) {
    uint32_t out[4];
    philox4x32_10(kat[t], kat[t] + 4, out);
    for (int k = 0; k < 4; k++) CHECK_EQ("philox KAT", out[k], kat[t][6 + k], t * 4 + k);
  }
  for (int i = 0; i < 100000; i++) {
    uint64_t seed = ((uint64_t)rnd() << 32) ^ rnd(), idx = ((uint64_t)rnd() << 20) ^ rnd();
    CHECK_EQ("stochastic_u", f2u(stochastic_u(seed, idx)), agoq_fp32_bits(agoq_stochastic_u(seed, idx)),
             idx);
  }
}

/* x86_add / x86_mul must give what SSE gives: compare with the host's own operations on
 * operands the compiler cannot fold. */
static void test_x86_nan(void) {
  const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
                              0xff812345u, 0x7fbfffffu, 0x7fffffffu, 0x00000000u, 0x80000000u,
                              0x3f800000u, 0xbf800000u, 0x7f7fffffu, 0x00000001u};
  const int ns = sizeof special / sizeof special[0];
  for (int i = 0; i < ns; i++) {
    for (int j = 0; j < ns; j++) {
      volatile float a = u2f(special[i]), b = u2f(special[j]);
      float sum = a + b, prod = a * b;
      /* Both operands NaN: which one x86 returns depends on the operand order the compiler
       * chose; the codec never adds two NaNs in its checks. */
      if (is_nan_bits(special[i]) && is_nan_bits(special[j])) continue;
      CHECK_EQ("x86_add", f2u(x86_add(a, b)), f2u(sum), special[i] * 31u + special[j]);
      CHECK_EQ("x86_mul", f2u(x86_mul(a, b)), f2u(prod), special[i] * 31u + special[j]);
    }
  }
}

int main(void) {
  test_narrowing();
  test_widening();
  test_int_rounding();
  test_philox();
  test_x86_nan();
  if (failures) {
    fprintf(stderr, "test_codec_cuda_math: %ld mismatch(es)\n", failures);
    return 1;
  }
  printf("test_codec_cuda_math: all element operations match the CPU codec\n");
  return 0;
}
