/*
 * Internal: the per-ISA CPU kernels behind agoq_codec.h. The generic driver
 * (kernels/agoq_codec.c) lays out the body, unpacks the escape bitmap, copies escaped
 * blocks raw and splits work by whole blocks; a kernel table only does the arithmetic on
 * the blocks [b0, b1) of one array of n elements. Every table produces the same bits as
 * agoq_cpu_kernels_portable (agoq_codec.h states the arithmetic).
 *
 * Conventions for all entries:
 *  - block b covers elements [b * block, min(n, (b + 1) * block)).
 *  - escaped[b] != 0 marks a block with a NaN or Inf: scan sets it (and scales[b] = +0);
 *    encode writes zero codes for it; decode and decode_acc skip it (the driver handles it).
 *  - codes / src / dst / acc / scales always point at the start of the whole array, not at
 *    block b0.
 *  - int4 blocks start on a byte boundary (block sizes are even); element 2k is the low
 *    nibble of byte k.
 *  - Stochastic rounding never reaches a SIMD table: the driver uses the portable one.
 */
#ifndef AGOQ_CODEC_CPU_H
#define AGOQ_CODEC_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "agoq_codec.h"

typedef struct {
  const char* name; /* "portable", "avx2", "avx512" */
  void (*scan)(agoq_format f, agoq_dtype t, uint32_t block, const void* src, size_t n, size_t b0,
               size_t b1, float* scales, uint8_t* escaped);
  void (*encode)(const agoq_codec_params* p, const void* src, size_t n, size_t b0, size_t b1,
                 const float* scales, const uint8_t* escaped, uint8_t* codes);
  void (*decode)(agoq_format f, agoq_dtype out, uint32_t block, const uint8_t* codes, size_t n,
                 size_t b0, size_t b1, const float* scales, const uint8_t* escaped, void* dst);
  void (*decode_acc)(agoq_format f, uint32_t block, const uint8_t* codes, size_t n, size_t b0,
                     size_t b1, const float* scales, const uint8_t* escaped, float* acc);
  /* x[i] = agoq_fp32_overflow_inf(x[i], inf_from_bits) for i < n (agoq_fpconv.h): the
   * owner's pass over every fp32 sum before it quantizes them. Stores only changed lanes. */
  void (*overflow_inf)(float* x, size_t n, uint32_t inf_from_bits);
} agoq_cpu_kernels;

extern const agoq_cpu_kernels agoq_cpu_kernels_portable;
#ifdef AGOQ_CODEC_HAVE_AVX2
extern const agoq_cpu_kernels agoq_cpu_kernels_avx2; /* AVX2 + F16C, no FMA */
#endif
#ifdef AGOQ_CODEC_HAVE_AVX512
extern const agoq_cpu_kernels agoq_cpu_kernels_avx512; /* AVX-512 F/BW/VL/DQ */
#endif

/* The table in use (agoq_codec_set_isa), and a table by name for tests (NULL if absent
 * from the build or the CPU). */
const agoq_cpu_kernels* agoq_cpu_kernels_active(void);
const agoq_cpu_kernels* agoq_cpu_kernels_by_name(const char* isa);

#endif
