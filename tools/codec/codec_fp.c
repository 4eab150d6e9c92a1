/*
 * Element access for stats and gen, written apart from the codec's own conversions so the
 * tools that judge the codec do not share its mistakes. Elements are little-endian.
 */
#include <math.h>
#include <string.h>

#include "codec.h"

static uint16_t codec_ld16(const uint8_t* p) { return (uint16_t)(p[0] | p[1] << 8); }
static void codec_st16(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static float codec_f32_from_bits(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof(f));
  return f;
}

static float codec_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float mag = (float)m * 0x1p-24f; /* subnormal or zero: exact */
    return sign ? -mag : mag;
  }
  if (e == 31) return codec_f32_from_bits(sign | 0x7f800000u | m << 13);
  return codec_f32_from_bits(sign | (e + 112u) << 23 | m << 13);
}

static uint16_t codec_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520: rounds to Inf */
  if (ax < 0x38800000u) {
    /* Below 2^-14: a multiple of 2^-24; scaling by 2^24 is exact and nearbyintf rounds
     * half to even in the default mode. 1024 carries into the smallest normal. */
    float mag = codec_f32_from_bits(ax) * 0x1p24f;
    return (uint16_t)(sign | (uint16_t)nearbyintf(mag));
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u); /* half to even on the 13 dropped bits */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static uint16_t codec_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

double codec_elem_get(agoq_dtype t, const uint8_t* p, size_t i) {
  switch (t) {
    case AGOQ_DTYPE_BF16:
      return codec_f32_from_bits((uint32_t)codec_ld16(p + 2 * i) << 16);
    case AGOQ_DTYPE_FP16:
      return codec_f16_to_f32(codec_ld16(p + 2 * i));
    default: {
      const uint8_t* q = p + 4 * i;
      return codec_f32_from_bits((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                                 (uint32_t)q[3] << 24);
    }
  }
}

void codec_elem_put(agoq_dtype t, uint8_t* p, size_t i, float v) {
  switch (t) {
    case AGOQ_DTYPE_BF16:
      codec_st16(p + 2 * i, codec_f32_to_bf16(v));
      break;
    case AGOQ_DTYPE_FP16:
      codec_st16(p + 2 * i, codec_f32_to_f16(v));
      break;
    default: {
      uint32_t x;
      memcpy(&x, &v, sizeof(x));
      for (int k = 0; k < 4; k++) p[4 * i + (size_t)k] = (uint8_t)(x >> (8 * k));
      break;
    }
  }
}
