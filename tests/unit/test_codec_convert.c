/* Exact conversions of the codec (kernels/cpu/agoq_fpconv.h) against the reference of
 * codec_test_ref.h, written from the format definitions alone. Exhaustive over all bf16 and fp16 bit patterns; fp32 narrowing on all halfway points,
 * their neighbours and a large random sample. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_codec.h"
#include "agoq_fpconv.h"
#include "codec_test_ref.h"

static ref_format ref_bf16, ref_fp16, ref_e4m3, ref_e5m2;

static int setup(void** state) {
  (void)state;
  bool ok = ref_init(&ref_bf16, 8, 7, 127, true) && ref_init(&ref_fp16, 5, 10, 15, true) &&
            ref_init(&ref_e4m3, 4, 3, 7, false) && ref_init(&ref_e5m2, 5, 2, 15, true);
  return ok ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  free(ref_bf16.value);
  free(ref_fp16.value);
  free(ref_e4m3.value);
  free(ref_e5m2.value);
  return 0;
}

#define bits_of ref_bits_of
#define float_of ref_float_of

/* Checks the library's fp8 encode of x and the decode of that code. */
static void check_fp8(float x, int fmt) {
  const ref_format* f = fmt == 0 ? &ref_e4m3 : &ref_e5m2;
  uint8_t got = fmt == 0 ? agoq_fp32_to_fp8e4m3(x) : agoq_fp32_to_fp8e5m2(x);
  uint32_t want = ref_fp8_encode(f, (double)x);
  if (got != want) {
    fprintf(stderr, "fp8 %s encode of %a (0x%08x): got 0x%02x want 0x%02x\n", fmt ? "e5m2" : "e4m3",
            (double)x, bits_of(x), got, want);
    fail();
  }
  bool nan, inf;
  double v = ref_decode(f, got, &nan, &inf);
  float back = fmt == 0 ? agoq_fp8e4m3_to_fp32(got) : agoq_fp8e5m2_to_fp32(got);
  assert_false(inf); /* saturating: never an Inf code */
  if (nan) {
    assert_true(isnan(back));
  } else {
    assert_true((double)back == v);
    assert_int_equal(signbit(back) != 0, (got & 0x80) != 0);
  }
}

/* ---- widening: exhaustive ------------------------------------------------------------------- */

static void test_bf16_all_patterns(void** state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    bool nan, inf;
    double v = ref_decode(&ref_bf16, h, &nan, &inf);
    float f = agoq_bf16_to_fp32((uint16_t)h);
    if (nan) {
      assert_true(isnan(f));
      assert_int_equal(bits_of(f), h << 16); /* payload and signalling bit kept */
    } else {
      assert_true((double)f == v);
      assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
    }
    /* Back to bf16 is the identity, NaNs excepted (made quiet). */
    uint16_t back = agoq_fp32_to_bf16(f);
    if (nan) assert_int_equal(back, h | 0x40);
    else assert_int_equal(back, h);
    check_fp8(f, 0);
    check_fp8(f, 1);
  }
}

static void test_fp16_all_patterns(void** state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    bool nan, inf;
    double v = ref_decode(&ref_fp16, h, &nan, &inf);
    float f = agoq_fp16_to_fp32((uint16_t)h);
    if (nan) {
      assert_true(isnan(f));
      assert_int_equal(bits_of(f), ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
    } else {
      assert_true((double)f == v);
      assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
    }
    uint16_t back = agoq_fp32_to_fp16(f);
    if (nan) assert_int_equal(back, h | 0x200);
    else assert_int_equal(back, h);
    check_fp8(f, 0);
    check_fp8(f, 1);
  }
}

/* Every fp8 code decodes to its defined value; NaN codes to the quiet NaN with their sign. */
static void test_fp8_decode_all_codes(void** state) {
  (void)state;
  for (int fmt = 0; fmt < 2; fmt++) {
    const ref_format* f = fmt == 0 ? &ref_e4m3 : &ref_e5m2;
    for (uint32_t c = 0; c < 256; c++) {
      bool nan, inf;
      double v = ref_decode(f, c, &nan, &inf);
      float got = fmt == 0 ? agoq_fp8e4m3_to_fp32((uint8_t)c) : agoq_fp8e5m2_to_fp32((uint8_t)c);
      if (nan) {
        assert_int_equal(bits_of(got), ((c & 0x80u) << 24) | 0x7fc00000u);
      } else {
        assert_true((double)got == v);
        assert_int_equal(signbit(got) != 0, (c & 0x80) != 0);
        /* A finite code re-encodes to itself. */
        uint8_t again = fmt == 0 ? agoq_fp32_to_fp8e4m3(got) : agoq_fp32_to_fp8e5m2(got);
        if (!inf) assert_int_equal(again, c);
      }
    }
  }
  /* Spot values from the format definitions. */
  assert_true(agoq_fp8e4m3_to_fp32(0x7e) == 448.0f);
  assert_true(agoq_fp8e4m3_to_fp32(0x01) == 0x1p-9f);
  assert_true(agoq_fp8e5m2_to_fp32(0x7b) == 57344.0f);
  assert_true(agoq_fp8e5m2_to_fp32(0x01) == 0x1p-16f);
  assert_true(isinf(agoq_fp8e5m2_to_fp32(0xfc)) && agoq_fp8e5m2_to_fp32(0xfc) < 0);
}

static void test_fp8_encode_edges(void** state) {
  (void)state;
  /* Saturation, never Inf/NaN codes, -0 kept. */
  assert_int_equal(agoq_fp32_to_fp8e4m3(1e30f), 0x7e);
  assert_int_equal(agoq_fp32_to_fp8e4m3(-INFINITY), 0xfe);
  assert_int_equal(agoq_fp32_to_fp8e4m3(464.0f), 0x7e); /* would round to 480 = the NaN code */
  assert_int_equal(agoq_fp32_to_fp8e5m2(61440.0f), 0x7b); /* tie to 65536 = Inf: saturate */
  assert_int_equal(agoq_fp32_to_fp8e5m2(INFINITY), 0x7b);
  assert_int_equal(agoq_fp32_to_fp8e4m3(-0.0f), 0x80);
  assert_int_equal(agoq_fp32_to_fp8e5m2(-0.0f), 0x80);
  assert_int_equal(agoq_fp32_to_fp8e4m3(0.0f), 0x00);
  /* Subnormal ties: half the smallest subnormal goes to 0 (even), 1.5x to 2 units. */
  assert_int_equal(agoq_fp32_to_fp8e4m3(0x1p-10f), 0x00);
  assert_int_equal(agoq_fp32_to_fp8e4m3(0x1.8p-9f), 0x02);
  assert_int_equal(agoq_fp32_to_fp8e4m3(-0x1p-11f), 0x80);
  assert_int_equal(agoq_fp32_to_fp8e5m2(0x1p-17f), 0x00);
  assert_int_equal(agoq_fp32_to_fp8e5m2(0x1.8p-16f), 0x02);
  /* Rounding up across the subnormal/normal boundary and an exponent boundary. */
  assert_int_equal(agoq_fp32_to_fp8e4m3(0x1.fp-7f), 0x08);
  assert_int_equal(agoq_fp32_to_fp8e4m3(1.9375f), 0x40); /* tie between 1.875 and 2 -> 2 (even) */
  /* fp32 subnormal inputs and the smallest ones. */
  assert_int_equal(agoq_fp32_to_fp8e4m3(0x1p-149f), 0x00);
  assert_int_equal(agoq_fp32_to_fp8e5m2(-0x1p-149f), 0x80);
  /* Random fp32 bit patterns against the reference. */
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1 << 20; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    float x = float_of((uint32_t)s);
    if (isnan(x)) continue;
    check_fp8(x, 0);
    check_fp8(x, 1);
  }
}

/* ---- fp32 -> bf16 / fp16 -------------------------------------------------------------------- */

static void check_narrow(float x) {
  double a = fabs((double)x);
  uint32_t sign16 = (bits_of(x) >> 16) & 0x8000u;
  for (int t = 0; t < 2; t++) {
    const ref_format* f = t == 0 ? &ref_bf16 : &ref_fp16;
    uint16_t raw = t == 0 ? agoq_fp32_to_bf16(x) : agoq_fp32_to_fp16(x);
    uint16_t sat = t == 0 ? agoq_fp32_to_bf16_sat(x) : agoq_fp32_to_fp16_sat(x);
    uint32_t want_raw, want_sat;
    uint32_t inf_code = t == 0 ? 0x7f80u : 0x7c00u;
    if (isnan(x)) {
      uint32_t m = bits_of(x) & 0x7fffffu;
      want_raw = t == 0 ? sign16 | 0x7f80u | 0x40u | (m >> 16) : sign16 | 0x7e00u | (m >> 13);
      want_sat = want_raw;
    } else if (isinf(x)) {
      want_raw = sign16 | inf_code;
      want_sat = sign16 | (uint32_t)(f->ncodes - 1);
    } else {
      uint32_t c = ref_round_mag(f, a); /* c == ncodes: the "next" value, Inf */
      want_raw = sign16 | c;
      want_sat = sign16 | (c >= (uint32_t)f->ncodes ? (uint32_t)f->ncodes - 1 : c);
    }
    if (raw != want_raw || sat != want_sat) {
      fprintf(stderr, "%s narrow of %a (0x%08x): raw 0x%04x want 0x%04x, sat 0x%04x want 0x%04x\n",
              t ? "fp16" : "bf16", (double)x, bits_of(x), raw, want_raw, sat, want_sat);
      fail();
    }
  }
}

static void test_fp32_narrow_halfway(void** state) {
  (void)state;
  /* Every midpoint between neighbouring bf16 / fp16 values (exact in fp32), and the fp32
   * values just below and above it, both signs. */
  for (int t = 0; t < 2; t++) {
    const ref_format* f = t == 0 ? &ref_bf16 : &ref_fp16;
    for (int c = 0; c < f->ncodes; c++) {
      double hi = c + 1 < f->ncodes ? f->value[c + 1] : f->next;
      float mid = (float)((f->value[c] + hi) / 2);
      assert_true((double)mid == (f->value[c] + hi) / 2);
      float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
      for (int k = 0; k < 3; k++) {
        check_narrow(probes[k]);
        check_narrow(-probes[k]);
      }
    }
  }
}

static void test_fp32_narrow_sample(void** state) {
  (void)state;
  const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0x1p-149f,
                         65504.0f, 65519.996f, 65520.0f, 65536.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f,
                         0x1.000002p-25f, 0x1.fep127f, 0x1.ff0000p127f, 0x1.feffffp127f, 0x1p-126f,
                         0x1p-133f, 0x1p-134f};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
    check_narrow(edges[i]);
    check_narrow(-edges[i]);
  }
  /* NaNs: signalling and quiet, payload in high and low bits. */
  const uint32_t nans[] = {0x7f800001u, 0x7fa00000u, 0x7fc00000u, 0xffffffffu, 0x7f80e000u, 0xff812345u};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) check_narrow(float_of(nans[i]));
  /* Saturating results near the tops. */
  assert_int_equal(agoq_fp32_to_fp16_sat(1e9f), 0x7bff);
  assert_int_equal(agoq_fp32_to_fp16(1e9f), 0x7c00);
  assert_int_equal(agoq_fp32_to_bf16_sat(-INFINITY), 0xff7f);
  assert_int_equal(agoq_fp32_to_bf16(FLT_MAX), 0x7f80);
  assert_int_equal(agoq_fp32_to_bf16_sat(FLT_MAX), 0x7f7f);
  /* Random bit patterns. */
  uint64_t s = 0x2545f4914f6cdd1dull;
  for (int i = 0; i < 1 << 21; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    check_narrow(float_of((uint32_t)(s >> 11)));
  }
  /* Every fp32 exponent, mantissas around the bf16/fp16 rounding points. */
  for (uint32_t e = 0; e < 256; e++) {
    for (uint32_t m = 0; m < 64; m++) {
      uint32_t lowbits[] = {m, 0x8000u - 32 + m, 0x1000u - 32 + m, 0x7fffc0u + m, 0x400000u + m};
      for (size_t k = 0; k < 5; k++) {
        uint32_t b = (e << 23) | (lowbits[k] & 0x7fffffu);
        check_narrow(float_of(b));
        check_narrow(float_of(b | 0x80000000u));
      }
    }
  }
}

static void test_fp32_sat(void** state) {
  (void)state;
  assert_int_equal(bits_of(agoq_fp32_sat(INFINITY)), 0x7f7fffffu);
  assert_int_equal(bits_of(agoq_fp32_sat(-INFINITY)), 0xff7fffffu);
  assert_int_equal(bits_of(agoq_fp32_sat(-0.0f)), 0x80000000u);
  assert_int_equal(bits_of(agoq_fp32_sat(float_of(0x7fa00001u))), 0x7fa00001u);
  assert_true(agoq_fp32_sat(1.5f) == 1.5f);
}

/* Overflow is Inf: a value becomes +-Inf exactly when its RNE conversion to the output type
 * is +-Inf (the reference narrowing decides), keeps its bits otherwise; fp32 is unchanged. */
static void test_overflow_to_inf(void** state) {
  (void)state;
  const ref_format* fmts[2] = {&ref_bf16, &ref_fp16};
  const agoq_dtype types[2] = {AGOQ_DTYPE_BF16, AGOQ_DTYPE_FP16};
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x7fffu, 0x8000u, 0x8001u, 0xefffu, 0xf000u, 0xffffu};
  enum { NLOW = sizeof lows / sizeof lows[0] };
  static float x[65536 * NLOW], y[65536 * NLOW];
  for (uint32_t hi = 0; hi < 65536; hi++)
    for (size_t k = 0; k < NLOW; k++) x[hi * NLOW + k] = float_of(hi << 16 | lows[k]);
  for (int t = 0; t < 2; t++) {
    memcpy(y, x, sizeof x);
    agoq_codec_overflow_to_inf(types[t], y, 65536 * NLOW);
    for (size_t i = 0; i < 65536 * NLOW; i++) {
      uint16_t code = ref_narrow16(fmts[t], x[i], false);
      bool to_inf = !isnan(x[i]) && (code & 0x7fffu) == (t == 0 ? 0x7f80u : 0x7c00u);
      uint32_t want = to_inf ? (bits_of(x[i]) & 0x80000000u) | 0x7f800000u : bits_of(x[i]);
      if (bits_of(y[i]) != want) {
        fprintf(stderr, "%s overflow_to_inf(0x%08x): got 0x%08x want 0x%08x\n", t ? "fp16" : "bf16",
                bits_of(x[i]), bits_of(y[i]), want);
        fail();
      }
    }
  }
  /* The boundaries themselves: the midpoint ties to the even neighbour, which is Inf. */
  float e[] = {65504.0f, 65519.996f, 65520.0f, -65520.0f, 0x1.fep127f, 0x1.fefffep127f, 0x1.ffp127f, FLT_MAX};
  agoq_codec_overflow_to_inf(AGOQ_DTYPE_FP16, e, 4);
  agoq_codec_overflow_to_inf(AGOQ_DTYPE_BF16, e + 4, 4);
  assert_true(e[0] == 65504.0f && e[1] == 65519.996f && e[2] == INFINITY && e[3] == -INFINITY);
  assert_true(e[4] == 0x1.fep127f && e[5] == 0x1.fefffep127f && e[6] == INFINITY && e[7] == INFINITY);
  memcpy(y, x, sizeof x);
  agoq_codec_overflow_to_inf(AGOQ_DTYPE_FP32, y, 65536 * NLOW);
  assert_memory_equal(x, y, sizeof x);
}

/* ---- integer rounding and Philox ------------------------------------------------------------ */

static int32_t ref_rne_clamp(double v, double m) {
  double r = floor(v), frac = v - r;
  if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) != 0.0)) r += 1.0;
  if (r > m) r = m;
  if (r < -m) r = -m;
  return (int32_t)r;
}

static void test_integer_rounding(void** state) {
  (void)state;
  const float ms[] = {127.0f, 7.0f};
  for (int k = 0; k < 2; k++) {
    float m = ms[k];
    /* Every multiple of 1/64 in [-200, 200] (all ties included), then random values. */
    for (int i = -200 * 64; i <= 200 * 64; i++) {
      float v = (float)i / 64.0f;
      assert_int_equal(agoq_rne_int_clamp(v, m), ref_rne_clamp(v, m));
      double fl = floor((double)v);
      int32_t want = (int32_t)(fl > m ? m : fl < -m ? -m : fl);
      assert_int_equal(agoq_floor_int_clamp(v, m), want);
    }
    uint64_t s = 42;
    for (int i = 0; i < 1 << 18; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      float v = float_of((uint32_t)(s >> 32));
      if (!isfinite(v)) continue;
      assert_int_equal(agoq_rne_int_clamp(v, m), ref_rne_clamp(v, m));
      double fl = floor((double)v);
      assert_int_equal(agoq_floor_int_clamp(v, m), (int32_t)(fl > m ? m : fl < -m ? -m : fl));
    }
    assert_int_equal(agoq_rne_int_clamp(-0.5f, m), 0);
    assert_int_equal(agoq_rne_int_clamp(2.5f, m), 2);
    assert_int_equal(agoq_rne_int_clamp(-3.5f, m), -4);
    assert_int_equal(agoq_floor_int_clamp(-0.25f, m), -1);
    assert_int_equal(agoq_floor_int_clamp(0x1p-149f, m), 0);
  }
}

static void test_philox_known_answers(void** state) {
  (void)state;
  /* Random123 known-answer vectors for philox4x32 with 10 rounds. */
  const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
       0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
      {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
       0x94fdccebu, 0x5001e420u, 0x24126ea1u},
  };
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    agoq_philox4x32_10(kat[i], kat[i] + 4, out);
    for (int j = 0; j < 4; j++) assert_int_equal(out[j], kat[i][6 + j]);
  }
  /* u = (x >> 8) * 2^-24 of the first word, counter = index, key = seed. */
  uint32_t ctr[4] = {0x89abcdefu, 0x01234567u, 0, 0}, key[2] = {0xdeadbeefu, 0xcafef00du}, out[4];
  agoq_philox4x32_10(ctr, key, out);
  float u = agoq_stochastic_u(0xcafef00ddeadbeefull, 0x0123456789abcdefull);
  assert_true((double)u == (double)(out[0] >> 8) / 16777216.0);
  assert_true(u >= 0.0f && u < 1.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_all_patterns),   cmocka_unit_test(test_fp16_all_patterns),
      cmocka_unit_test(test_fp8_decode_all_codes), cmocka_unit_test(test_fp8_encode_edges),
      cmocka_unit_test(test_fp32_narrow_halfway), cmocka_unit_test(test_fp32_narrow_sample),
      cmocka_unit_test(test_fp32_sat),            cmocka_unit_test(test_integer_rounding),
      cmocka_unit_test(test_philox_known_answers), cmocka_unit_test(test_overflow_to_inf),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
