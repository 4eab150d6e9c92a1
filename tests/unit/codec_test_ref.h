/* A reference for the codec's number formats written from their definitions alone (not from
 * kernels/cpu/agoq_fpconv.h): values come from ldexp on (sign, exponent, mantissa) in double
 * precision, exact for every format involved, and rounding is a nearest-value search over
 * the sorted representable values with ties to the even code. Slow and obviously right. */
#ifndef AGOQ_CODEC_TEST_REF_H
#define AGOQ_CODEC_TEST_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int ebits, mbits, bias;
  bool ieee_specials; /* top exponent = Inf/NaN (bf16, fp16, e5m2); e4m3: only S.1111.111 = NaN */
  int ncodes;         /* positive codes with a finite value, in increasing value order */
  double* value;      /* value[c], c in [0, ncodes) */
  double next;        /* the value after the largest finite one with an unbounded exponent */
} ref_format;

static inline double ref_decode(const ref_format* f, uint32_t code, bool* nan, bool* inf) {
  uint32_t sbit = 1u << (f->ebits + f->mbits);
  uint32_t e = (code >> f->mbits) & ((1u << f->ebits) - 1), m = code & ((1u << f->mbits) - 1);
  uint32_t emax = (1u << f->ebits) - 1;
  double sign = (code & sbit) ? -1.0 : 1.0;
  *nan = *inf = false;
  if (f->ieee_specials && e == emax) {
    if (m == 0) *inf = true;
    else *nan = true;
    return sign * INFINITY;
  }
  if (!f->ieee_specials && e == emax && m == (1u << f->mbits) - 1) {
    *nan = true;
    return NAN;
  }
  if (e == 0) return sign * ldexp((double)m, 1 - f->bias - f->mbits);
  return sign * ldexp((double)((1u << f->mbits) + m), (int)e - f->bias - f->mbits);
}

static inline bool ref_init(ref_format* f, int ebits, int mbits, int bias, bool ieee) {
  f->ebits = ebits;
  f->mbits = mbits;
  f->bias = bias;
  f->ieee_specials = ieee;
  uint32_t npos = 1u << (ebits + mbits);
  f->value = (double*)calloc(npos, sizeof(double));
  if (f->value == NULL) return false;
  f->ncodes = 0;
  for (uint32_t c = 0; c < npos; c++) {
    bool nan, inf;
    double v = ref_decode(f, c, &nan, &inf);
    if (nan || inf) break;
    f->value[f->ncodes++] = v;
  }
  double maxv = f->value[f->ncodes - 1];
  f->next = maxv + ldexp(1.0, ilogb(maxv) - mbits);
  return true;
}

/* Rounds a >= 0 (finite or Inf) to the nearest code, ties to the even code; the result
 * ncodes stands for `next` (the Inf code of the IEEE formats). */
static inline uint32_t ref_round_mag(const ref_format* f, double a) {
  if (a >= f->next) return (uint32_t)f->ncodes;
  int lo = 0, hi = f->ncodes - 1;
  if (a >= f->value[hi]) {
    double dl = a - f->value[hi], dh = f->next - a;
    if (dl < dh) return (uint32_t)hi;
    if (dh < dl) return (uint32_t)f->ncodes;
    return (hi & 1) ? (uint32_t)f->ncodes : (uint32_t)hi;
  }
  while (hi - lo > 1) { /* value[lo] <= a < value[hi] */
    int mid = (lo + hi) / 2;
    if (f->value[mid] <= a) lo = mid;
    else hi = mid;
  }
  if (f->value[lo] == a) return (uint32_t)lo;
  double dl = a - f->value[lo], dh = f->value[hi] - a;
  if (dl < dh) return (uint32_t)lo;
  if (dh < dl) return (uint32_t)hi;
  return (lo & 1) ? (uint32_t)hi : (uint32_t)lo;
}

static inline uint32_t ref_bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float ref_float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* fp8 code of x: RNE, saturating to +-max finite, sign kept (-0 -> 0x80); NaN -> sign|0x7f. */
static inline uint32_t ref_fp8_encode(const ref_format* f, double x) {
  uint32_t sign = signbit(x) ? 0x80u : 0u;
  if (isnan(x)) return sign | 0x7fu;
  uint32_t c = ref_round_mag(f, fabs(x));
  if (c >= (uint32_t)f->ncodes) c = (uint32_t)f->ncodes - 1;
  return sign | c;
}

/* 16-bit narrowing of a float: raw (IEEE, overflow to Inf) or saturating (to +-max finite,
 * Inf too). NaN: sign and top payload bits kept, made quiet (bf16: |= 0x40, fp16: |= 0x200). */
static inline uint16_t ref_narrow16(const ref_format* f, float x, bool sat) {
  uint32_t b = ref_bits_of(x);
  uint32_t sign = (b >> 16) & 0x8000u;
  bool bf16 = f->ebits == 8;
  if (isnan(x)) {
    uint32_t m = b & 0x7fffffu;
    return (uint16_t)(bf16 ? sign | 0x7fc0u | (m >> 16) : sign | 0x7e00u | (m >> 13));
  }
  uint32_t c = ref_round_mag(f, fabs((double)x));
  if (c >= (uint32_t)f->ncodes && sat) c = (uint32_t)f->ncodes - 1;
  return (uint16_t)(sign | c);
}

/* Exact widening of a 16-bit pattern to fp32 (NaN payload and signalling bit kept). */
static inline float ref_widen16(const ref_format* f, uint16_t h) {
  bool nan, inf;
  double v = ref_decode(f, h, &nan, &inf);
  if (nan) {
    uint32_t m = h & ((1u << f->mbits) - 1);
    return ref_float_of(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | (m << (23 - f->mbits)));
  }
  return (float)v; /* exact, -0 included */
}

#endif
