/*
 * Internal to the codec driver: the body layout of one (params, n) pair, and the block-range
 * workers that the single-threaded and multi-threaded entry points share. Ranges handed to
 * the workers start on a multiple of 64 blocks (one bitmap word), so concurrent workers never
 * write the same bitmap byte.
 */
#ifndef AGOQ_CODEC_INTERNAL_H
#define AGOQ_CODEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agoq_codec.h"
#include "cpu/agoq_codec_cpu.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "agoq codec: the body layout is little-endian and the CPU code assumes a little-endian host"
#endif

typedef struct {
  agoq_codec_params p;
  size_t n;
  size_t esize;        /* bytes per dtype element */
  size_t nb;           /* blocks */
  size_t bitmap_bytes; /* ceil(nb / 64) * 8 */
  size_t codes_bytes;  /* n, or ceil(n / 2) for int4 */
  size_t raw_block;    /* bytes of one escaped block in the raw region: block * esize */
  uint8_t* bitmap;     /* into the body; scales and codes follow (maybe unaligned) */
  uint8_t* scales;
  uint8_t* codes;
  uint8_t* raw;
} agoq_codec_layout;

/* Fills the sizes of lay (format != NONE); false if one overflows. attach then points lay at
 * a body known to hold at least its head (bitmap, scales, codes). */
bool agoq_codec_layout_init(agoq_codec_layout* lay, const agoq_codec_params* p, size_t n);
void agoq_codec_layout_attach(agoq_codec_layout* lay, const void* body);
size_t agoq_codec_layout_size(const agoq_codec_layout* lay, size_t escaped);

/* Checks a body against (p, n): length, escape bitmap (no bit past the last block), and
 * returns the number of escaped blocks. p must have passed agoq_codec_params_check. */
agoq_codec_status agoq_codec_body_check(const agoq_codec_params* p, const void* body,
                                        size_t body_len, size_t n, agoq_codec_layout* lay,
                                        size_t* escaped);

/* Workers on blocks [b0, b1). quantize_blocks writes bitmap, scales and codes and returns the
 * number of escaped blocks; copy_raw then fills the raw region, raw_index0 = escaped blocks
 * before b0. The decode workers take raw_index0 likewise. */
size_t agoq_codec_quantize_blocks(const agoq_codec_layout* lay, const void* src, size_t b0, size_t b1);
void agoq_codec_copy_raw(const agoq_codec_layout* lay, const void* src, size_t b0, size_t b1,
                         size_t raw_index0);
void agoq_codec_decode_blocks(const agoq_codec_layout* lay, size_t b0, size_t b1, size_t raw_index0,
                              agoq_dtype out, void* dst);
void agoq_codec_decode_acc_blocks(const agoq_codec_layout* lay, size_t b0, size_t b1,
                                  size_t raw_index0, float* acc);

/* Format NONE: raw elements of `in` converted to `out` (IEEE RNE), or added to acc. */
void agoq_codec_raw_convert(agoq_dtype in, const uint8_t* src, size_t count, agoq_dtype out,
                            void* dst);
void agoq_codec_raw_accumulate(agoq_dtype in, const uint8_t* src, size_t count, float* acc);

/* CPU features (agoq_codec_isa.c), detected once. */
#define AGOQ_CPU_DETECTED 0x1u
#define AGOQ_CPU_SSE42 0x2u
#define AGOQ_CPU_AVX2 0x4u   /* AVX2 + F16C, OS saves YMM */
#define AGOQ_CPU_AVX512 0x8u /* F + BW + VL + DQ, OS saves ZMM and opmasks */
unsigned agoq_cpu_features(void);

/* agoq_crc32c without the SSE4.2 path, for tests that compare the two. */
uint32_t agoq_crc32c_portable(uint32_t crc, const void* data, size_t len);

/* Entry-point checks shared by agoq_quantize*, agoq_dequantize*. */
agoq_codec_status agoq_codec_quantize_check(const agoq_codec_params* p, const void* src, size_t n,
                                            const void* body, size_t* body_len);
agoq_codec_status agoq_codec_decode_check(const agoq_codec_params* p, const void* body,
                                          size_t body_len, size_t n, const void* dst);


/* The codec's arithmetic assumes the default SSE environment (round to nearest even, no
 * flush-to-zero, no denormals-are-zero). Frameworks switch FTZ/DAZ on for speed and threads
 * inherit it, so every entry into the kernels sets the default and restores the caller's. */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define AGOQ_MXCSR_DEFAULT 0x1f80u /* all exceptions masked, RNE, FTZ and DAZ off */
typedef struct {
  unsigned saved;
} agoq_fpenv;
static inline void agoq_fpenv_enter(agoq_fpenv* e) {
  e->saved = _mm_getcsr();
  if ((e->saved & ~0x3fu) != AGOQ_MXCSR_DEFAULT) _mm_setcsr(AGOQ_MXCSR_DEFAULT);
}
static inline void agoq_fpenv_leave(const agoq_fpenv* e) {
  if ((e->saved & ~0x3fu) != AGOQ_MXCSR_DEFAULT) _mm_setcsr(e->saved);
}
#else
typedef struct {
  int unused;
} agoq_fpenv;
static inline void agoq_fpenv_enter(agoq_fpenv* e) { (void)e; }
static inline void agoq_fpenv_leave(const agoq_fpenv* e) { (void)e; }
#endif

#endif
