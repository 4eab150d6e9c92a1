/*
 * Portable C kernels: the reference for every other implementation. Each block is first
 * widened into an fp32 scratch array (one switch on the dtype per block, not per element),
 * then coded by a loop specialised for the format.
 */
#include <string.h>

#include "agoq_codec_cpu.h"
#include "agoq_fpconv.h"

static float agoq_format_max_f(agoq_format f) {
  switch (f) {
    case AGOQ_FORMAT_INT8: return 127.0f;
    case AGOQ_FORMAT_INT4: return 7.0f;
    case AGOQ_FORMAT_FP8E4M3: return AGOQ_FP8E4M3_MAX_F;
    case AGOQ_FORMAT_FP8E5M2: return AGOQ_FP8E5M2_MAX_F;
    default: return 1.0f;
  }
}

static size_t block_len(uint32_t block, size_t n, size_t b) {
  size_t start = b * block;
  return n - start < block ? n - start : block;
}

static void widen(agoq_dtype t, const void* src, size_t start, size_t len, float* x) {
  switch (t) {
    case AGOQ_DTYPE_FP32: memcpy(x, (const float*)src + start, len * sizeof(float)); break;
    case AGOQ_DTYPE_BF16: {
      const uint16_t* s = (const uint16_t*)src + start;
      for (size_t i = 0; i < len; i++) x[i] = agoq_bf16_to_fp32(s[i]);
      break;
    }
    default: {
      const uint16_t* s = (const uint16_t*)src + start;
      for (size_t i = 0; i < len; i++) x[i] = agoq_fp16_to_fp32(s[i]);
      break;
    }
  }
}

/* max |x| as a bit pattern: for non-NaN values |x| orders like the unsigned magnitude bits,
 * and a magnitude >= the Inf pattern marks a block to escape. */
static void portable_scan(agoq_format f, agoq_dtype t, uint32_t block, const void* src, size_t n,
                          size_t b0, size_t b1, float* scales, uint8_t* escaped) {
  const float m = agoq_format_max_f(f);
  for (size_t b = b0; b < b1; b++) {
    size_t start = b * block, len = block_len(block, n, b);
    float amax;
    int esc;
    if (t == AGOQ_DTYPE_FP32) {
      const float* s = (const float*)src + start;
      uint32_t mx = 0;
      for (size_t i = 0; i < len; i++) {
        uint32_t a = agoq_fp32_bits(s[i]) & 0x7fffffffu;
        mx = a > mx ? a : mx;
      }
      esc = mx >= 0x7f800000u;
      amax = agoq_fp32_from_bits(mx);
    } else {
      const uint16_t* s = (const uint16_t*)src + start;
      uint16_t mx = 0;
      for (size_t i = 0; i < len; i++) {
        uint16_t a = s[i] & 0x7fffu;
        mx = a > mx ? a : mx;
      }
      if (t == AGOQ_DTYPE_BF16) {
        esc = mx >= 0x7f80u;
        amax = agoq_bf16_to_fp32(mx);
      } else {
        esc = mx >= 0x7c00u;
        amax = agoq_fp16_to_fp32(mx);
      }
    }
    escaped[b] = (uint8_t)esc;
    scales[b] = esc ? 0.0f : amax / m;
  }
}

static void portable_encode(const agoq_codec_params* p, const void* src, size_t n, size_t b0,
                            size_t b1, const float* scales, const uint8_t* escaped, uint8_t* codes) {
  float x[AGOQ_CODEC_BLOCK_MAX];
  const agoq_format f = p->format;
  const float m = agoq_format_max_f(f);
  const int stochastic = p->stochastic && (f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4);
  for (size_t b = b0; b < b1; b++) {
    size_t start = b * p->block, len = block_len(p->block, n, b);
    float s = scales[b];
    if (f == AGOQ_FORMAT_INT4) {
      uint8_t* c = codes + start / 2;
      size_t nbytes = (len + 1) / 2;
      if (escaped[b] || s == 0.0f) {
        memset(c, 0, nbytes);
        continue;
      }
      widen(p->dtype, src, start, len, x);
      if (len & 1) x[len] = 0.0f; /* the last odd element's high nibble stays 0 */
      for (size_t k = 0; k < nbytes; k++) {
        int32_t lo, hi;
        if (stochastic) {
          uint64_t idx = p->first_index + start + 2 * k;
          lo = agoq_floor_int_clamp(x[2 * k] / s + agoq_stochastic_u(p->seed, idx), m);
          hi = 2 * k + 1 < len
                   ? agoq_floor_int_clamp(x[2 * k + 1] / s + agoq_stochastic_u(p->seed, idx + 1), m)
                   : 0;
        } else {
          lo = agoq_rne_int_clamp(x[2 * k] / s, m);
          hi = agoq_rne_int_clamp(x[2 * k + 1] / s, m);
        }
        c[k] = (uint8_t)(((uint32_t)lo & 0xfu) | (((uint32_t)hi & 0xfu) << 4));
      }
      continue;
    }
    uint8_t* c = codes + start;
    if (escaped[b] || s == 0.0f) {
      memset(c, 0, len);
      continue;
    }
    widen(p->dtype, src, start, len, x);
    switch (f) {
      case AGOQ_FORMAT_INT8:
        if (stochastic) {
          for (size_t i = 0; i < len; i++)
            c[i] = (uint8_t)agoq_floor_int_clamp(
                x[i] / s + agoq_stochastic_u(p->seed, p->first_index + start + i), m);
        } else {
          for (size_t i = 0; i < len; i++) c[i] = (uint8_t)agoq_rne_int_clamp(x[i] / s, m);
        }
        break;
      case AGOQ_FORMAT_FP8E4M3:
        for (size_t i = 0; i < len; i++) c[i] = agoq_fp32_to_fp8e4m3(x[i] / s);
        break;
      default:
        for (size_t i = 0; i < len; i++) c[i] = agoq_fp32_to_fp8e5m2(x[i] / s);
        break;
    }
  }
}

/* y_i = sat((float)q_i * s) for one block, into y. */
static void decode_block(agoq_format f, const uint8_t* codes, size_t start, size_t len, float s,
                         float* y) {
  switch (f) {
    case AGOQ_FORMAT_INT8: {
      const int8_t* c = (const int8_t*)codes + start;
      for (size_t i = 0; i < len; i++) y[i] = agoq_fp32_sat((float)c[i] * s);
      break;
    }
    case AGOQ_FORMAT_INT4: {
      const uint8_t* c = codes + start / 2;
      for (size_t i = 0; i < len; i++) {
        uint32_t nib = (c[i / 2] >> (4 * (i & 1))) & 0xfu;
        int32_t q = (int32_t)(nib ^ 8u) - 8; /* sign-extend the 4-bit two's complement */
        y[i] = agoq_fp32_sat((float)q * s);
      }
      break;
    }
    case AGOQ_FORMAT_FP8E4M3: {
      const uint8_t* c = codes + start;
      for (size_t i = 0; i < len; i++) y[i] = agoq_fp32_sat(agoq_fp8e4m3_to_fp32(c[i]) * s);
      break;
    }
    default: {
      const uint8_t* c = codes + start;
      for (size_t i = 0; i < len; i++) y[i] = agoq_fp32_sat(agoq_fp8e5m2_to_fp32(c[i]) * s);
      break;
    }
  }
}

static void portable_decode(agoq_format f, agoq_dtype out, uint32_t block, const uint8_t* codes,
                            size_t n, size_t b0, size_t b1, const float* scales,
                            const uint8_t* escaped, void* dst) {
  float y[AGOQ_CODEC_BLOCK_MAX];
  for (size_t b = b0; b < b1; b++) {
    if (escaped[b]) continue;
    size_t start = b * block, len = block_len(block, n, b);
    if (out == AGOQ_DTYPE_FP32) {
      decode_block(f, codes, start, len, scales[b], (float*)dst + start);
      continue;
    }
    decode_block(f, codes, start, len, scales[b], y);
    uint16_t* d = (uint16_t*)dst + start;
    if (out == AGOQ_DTYPE_BF16) {
      for (size_t i = 0; i < len; i++) d[i] = agoq_fp32_to_bf16_sat(y[i]);
    } else {
      for (size_t i = 0; i < len; i++) d[i] = agoq_fp32_to_fp16_sat(y[i]);
    }
  }
}

static void portable_decode_acc(agoq_format f, uint32_t block, const uint8_t* codes, size_t n,
                                size_t b0, size_t b1, const float* scales, const uint8_t* escaped,
                                float* acc) {
  float y[AGOQ_CODEC_BLOCK_MAX];
  for (size_t b = b0; b < b1; b++) {
    if (escaped[b]) continue;
    size_t start = b * block, len = block_len(block, n, b);
    decode_block(f, codes, start, len, scales[b], y);
    float* a = acc + start;
    for (size_t i = 0; i < len; i++) a[i] += y[i];
  }
}

/* Bit operations only; this file's -O3 vectorizes the loop for the baseline ISA. */
static void portable_overflow_inf(float* x, size_t n, uint32_t inf_from_bits) {
  for (size_t i = 0; i < n; i++) x[i] = agoq_fp32_overflow_inf(x[i], inf_from_bits);
}

const agoq_cpu_kernels agoq_cpu_kernels_portable = {
    .name = "portable",
    .scan = portable_scan,
    .encode = portable_encode,
    .decode = portable_decode,
    .decode_acc = portable_decode_acc,
    .overflow_inf = portable_overflow_inf,
};
