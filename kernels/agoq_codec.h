/*
 * agoq codec: block-scaled quantization of fp32 / bf16 / fp16 arrays to int8, int4,
 * fp8e4m3 or fp8e5m2 codes with one fp32 scale per block, plus the self-describing frame
 * that carries them on the wire. Knows nothing of NCCL.
 *
 * Every implementation (portable C, AVX2, AVX-512, CUDA) produces the same bits: the
 * arithmetic below is exact IEEE fp32 with round-to-nearest-even, no fused multiply-add,
 * no flush-to-zero, no fast-math.
 *
 * ---- Arithmetic (per block of B elements; the last block may be shorter) ----
 *  x_i   = input widened exactly to fp32
 *  amax  = max |x_i|
 *  A block containing a NaN or an Inf is ESCAPED: stored raw, every bit preserved.
 *  s     = amax / M            (one fp32 division, RNE)   M = 127 int8, 7 int4,
 *                                                         448 fp8e4m3, 57344 fp8e5m2
 *  if s == 0 (amax 0 or underflow): scale stored as +0, codes 0, block decodes to +0.
 *  v_i   = x_i / s             (one fp32 division, RNE)
 *  int8/int4: q_i = clamp(rne_to_integer(v_i), -M, M)
 *     stochastic: q_i = clamp(floor(v_i + u_i), -M, M), v_i + u_i one fp32 add (RNE),
 *     u_i = (philox4x32_10(counter = {idx lo32, idx hi32, 0, 0}, key = {seed lo32,
 *     seed hi32}).x >> 8) * 2^-24, idx = first_index + i (global element index).
 *     Stochastic rounding applies to int formats only (fp8 + stochastic = AGOQ_CODEC_EARG).
 *  fp8:  q_i = v_i converted to the fp8 format, RNE, saturating to +-max finite (448 for
 *     e4m3, 57344 for e5m2); never an Inf or NaN code. -0 stays -0 (code 0x80).
 *  decode: y_i = (float)q_i * s (one fp32 multiply, RNE). For a block whose amax is near
 *     FLT_MAX the product can round to +-Inf: y is then saturated to +-FLT_MAX (a finite
 *     block never decodes to Inf). y is converted to the output type with RNE, saturating:
 *     a finite y beyond the output type's largest finite value becomes that value with its
 *     sign. An int code 0 decodes to +0, an fp8 -0 to -0. Codes the encoder never makes
 *     (int8 -128, int4 -8) decode as their two's complement value times s.
 *  A body is checked before decoding: every scale must be +0 or a positive finite fp32
 *     (anything else is AGOQ_CODEC_ECORRUPT), so corrupt scales cannot make NaN*NaN
 *     results that differ between implementations.
 *  The CPU driver runs the kernels with the default floating-point environment (RNE, no
 *     FTZ/DAZ) whatever the calling thread set (frameworks enable FTZ/DAZ).
 *  decode-accumulate: acc_i += y_i (one fp32 add, y before any output rounding); for an
 *     escaped block acc_i += (float)raw_i.
 *  Escaped blocks decode to their raw values converted to the output type (RNE; NaN stays
 *  NaN with its payload truncated as the conversion requires; identical bits when the output
 *  type equals the input type).
 *
 * ---- Body layout (all multi-byte values little-endian) ----
 *  format NONE: the n raw elements of dtype, nothing else.
 *  otherwise, nb = ceil(n / B):
 *    [escape bitmap]  ceil(nb / 64) * 8 bytes; bit (i % 8) of byte (i / 8) = block i escaped
 *    [scales]         nb fp32 values; an escaped block's scale is +0
 *    [codes]          int8/fp8: n bytes; int4: ceil(n / 2) bytes, element 2k in the low
 *                     nibble of byte k, element 2k+1 in the high nibble (two's complement);
 *                     an escaped block's codes are 0
 *    [raw]            the escaped blocks' elements in dtype, in block order, B elements
 *                     each: an escaped short last block is padded with zero bytes to B
 *  The body length is therefore known from (format, dtype, B, n, number of escaped blocks):
 *  bitmap + 4 nb + code bytes + escaped * B * sizeof(dtype).
 */
#ifndef AGOQ_CODEC_H
#define AGOQ_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  AGOQ_FORMAT_NONE = 0,
  AGOQ_FORMAT_INT8 = 1,
  AGOQ_FORMAT_INT4 = 2,
  AGOQ_FORMAT_FP8E4M3 = 3,
  AGOQ_FORMAT_FP8E5M2 = 4,
  AGOQ_FORMAT_COUNT
} agoq_format;

typedef enum {
  AGOQ_DTYPE_FP32 = 0,
  AGOQ_DTYPE_BF16 = 1,
  AGOQ_DTYPE_FP16 = 2,
  AGOQ_DTYPE_COUNT
} agoq_dtype;

typedef enum {
  AGOQ_CODEC_OK = 0,
  AGOQ_CODEC_EARG = 1,     /* invalid parameters (format, dtype, block, NULL, stochastic fp8) */
  AGOQ_CODEC_ESPACE = 2,   /* output buffer too small */
  AGOQ_CODEC_ECORRUPT = 3, /* frame or body inconsistent (bad magic, lengths, checksum, ...) */
  AGOQ_CODEC_EVERSION = 4, /* frame of an unknown version */
} agoq_codec_status;

#define AGOQ_CODEC_BLOCK_MIN 32u
#define AGOQ_CODEC_BLOCK_MAX 1024u
#define AGOQ_CODEC_BLOCK_DEFAULT 128u

typedef struct {
  agoq_format format;
  agoq_dtype dtype;     /* element type of the input, and of escaped (raw) blocks */
  uint32_t block;       /* 32, 64, 128, 256, 512 or 1024 */
  bool stochastic;      /* int formats only */
  uint64_t seed;        /* stochastic rounding key */
  uint64_t first_index; /* global index of element 0 (stochastic counter) */
} agoq_codec_params;

const char* agoq_format_name(agoq_format f);     /* "int8", ..., "none" */
const char* agoq_dtype_name(agoq_dtype t);       /* "fp32", "bf16", "fp16" */
int agoq_format_from_name(const char* s, agoq_format* f); /* 0 ok */
int agoq_dtype_from_name(const char* s, agoq_dtype* t);   /* 0 ok; also "float32", "bfloat16", "float16" */
size_t agoq_dtype_size(agoq_dtype t);
const char* agoq_codec_status_str(agoq_codec_status s);
agoq_codec_status agoq_codec_params_check(const agoq_codec_params* p);

/* Sizes. body_size_exact needs the number of escaped blocks; body_size_max assumes all. */
size_t agoq_codec_nblocks(const agoq_codec_params* p, size_t n);
size_t agoq_codec_body_size(const agoq_codec_params* p, size_t n, size_t escaped_blocks);
size_t agoq_codec_body_size_max(const agoq_codec_params* p, size_t n);

/* Quantize n elements of p->dtype at src into body (capacity cap); *body_len receives the
 * exact length and *escaped_blocks (may be NULL) the number of raw blocks. */
agoq_codec_status agoq_quantize(const agoq_codec_params* p, const void* src, size_t n, void* body,
                                size_t cap, size_t* body_len, size_t* escaped_blocks);
/* Decode a body of n elements (made with p's format, dtype, block) into dst of type out. */
agoq_codec_status agoq_dequantize(const agoq_codec_params* p, const void* body, size_t body_len,
                                  size_t n, agoq_dtype out, void* dst);
/* acc[i] += decoded element i (fp32, before output rounding). */
agoq_codec_status agoq_dequantize_accumulate(const agoq_codec_params* p, const void* body,
                                             size_t body_len, size_t n, float* acc);

/* Gives n fp32 values the finite range of `out` (rule "overflow is Inf"): x[i] whose
 * round-to-nearest-even conversion to `out` is +-Inf becomes +-Inf; NaN, Inf and every value
 * `out` can hold are unchanged (for out = fp32 nothing changes). A reduction applies it to
 * its fp32 sums before quantizing them: the blocks that then hold an Inf are escaped and
 * travel raw, so every rank decodes +-Inf where the exact reduction gives +-Inf, and the
 * decoder's saturation of finite blocks cannot turn an overflow into the type's maximum. */
void agoq_codec_overflow_to_inf(agoq_dtype out, float* x, size_t n);
/* n fp32 values into `out` (fp32: the bits unchanged; bf16, fp16: round to nearest even, a
 * value beyond the type's range is +-Inf, NaN stays NaN): how a reduce-scatter owner gives
 * its fp32 sums their type. The CUDA codec's agoq_cuda_narrow_fp32 gives the same bits. */
void agoq_codec_narrow_fp32(agoq_dtype out, const float* acc, size_t n, void* dst);

/* Multi-threaded variants: the same bits, the work split by blocks over `nthreads` threads
 * (0 = all online CPUs); for buffers large enough to be worth it. */
agoq_codec_status agoq_quantize_mt(const agoq_codec_params* p, const void* src, size_t n, void* body,
                                   size_t cap, size_t* body_len, size_t* escaped_blocks, int nthreads);
agoq_codec_status agoq_dequantize_mt(const agoq_codec_params* p, const void* body, size_t body_len,
                                     size_t n, agoq_dtype out, void* dst, int nthreads);
agoq_codec_status agoq_dequantize_accumulate_mt(const agoq_codec_params* p, const void* body,
                                                size_t body_len, size_t n, float* acc, int nthreads);

/* CPU implementation choice: "portable", "avx2", "avx512"; default = best the CPU has.
 * Returns 0, or -1 if the CPU (or build) lacks it. Tests pin each in turn. */
int agoq_codec_set_isa(const char* isa);
const char* agoq_codec_isa(void);
bool agoq_codec_isa_available(const char* isa);

#ifdef __cplusplus
}
#endif
#endif
