/*
 * NCCL's 12 datatypes and 4 reduction ops as the collective benchmarks and the collnet
 * tests see them: names, sizes, element conversions, reproducible inputs and the two
 * references a result is held against:
 *  - the exact path's rank-order reduction, bit for bit: integers wrap (unsigned
 *    arithmetic), fp64 in double, fp32 in float, bf16/fp16/fp8 accumulated in fp32 and
 *    rounded once (RNE) at the end;
 *  - an fp64 reduction, for the error of a quantized result.
 * Our own conversions (RNE, subnormals kept; fp8 saturates to the largest finite value as
 * NCCL's satfinite conversions do), independent of the plugin's codec so a test of the
 * plugin never checks it against itself. Needs only libc and libm.
 */
#ifndef AGOQ_PERF_DTYPE_H
#define AGOQ_PERF_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

#define PERF_NUM_DTYPES 12 /* ncclNumTypes */
#define PERF_NUM_OPS 4     /* Sum, Prod, Max, Min: what NCCL hands a CollNet plugin */

const char* perf_dtype_name(ncclDataType_t t); /* "bf16"; "?" when out of range */
/* Accepts our names and NCCL's spellings (float16, bfloat16, float, double, half, ...). */
int perf_dtype_parse(const char* s, ncclDataType_t* t);
size_t perf_dtype_size(ncclDataType_t t);
bool perf_dtype_is_float(ncclDataType_t t);
bool perf_dtype_is_signed_int(ncclDataType_t t);
const char* perf_op_name(ncclRedOp_t op);
int perf_op_parse(const char* s, ncclRedOp_t* op);

/* Element i of buf as a double (exact for every float type and for integers up to 2^53). */
double perf_elem_get(ncclDataType_t t, const void* buf, size_t i);
/* Element i of a float type widened to fp32 (exact for every type but fp64). */
float perf_elem_get_f32(ncclDataType_t t, const void* buf, size_t i);
/* Stores v, rounded to the type (RNE) for floats; integers are converted by C's rules
 * after rounding to the nearest integer and wrapping modulo 2^bits. */
void perf_elem_set(ncclDataType_t t, void* buf, size_t i, double v);
/* Stores an fp32 value rounded once to a float type (RNE). */
void perf_elem_set_f32(ncclDataType_t t, void* buf, size_t i, float v);

uint16_t perf_f32_to_bf16(float f);
float perf_bf16_to_f32(uint16_t h);
uint16_t perf_f32_to_fp16(float f);
float perf_fp16_to_f32(uint16_t h);
uint8_t perf_f32_to_fp8(float f, bool e5m2);
float perf_fp8_to_f32(uint8_t c, bool e5m2);

/* ---- reproducible inputs ---- */

uint64_t perf_mix64(uint64_t z);               /* splitmix64's finaliser */
double perf_normal(uint64_t seed, uint64_t i); /* N(0,1) element i of stream `seed` */
uint64_t perf_rank_seed(uint64_t base, int rank);

/* A rank's benchmark input is the stream `seed` (perf_rank_seed): element i is N(0,1)
 * rounded to a float type; for integers, N(0,1) * 4 rounded and clamped so that nranks of
 * them never wrap under Sum (int8 within +-127/nranks, unsigned types take |x|). */
/* Stores elements first .. first + count - 1 of the stream into buf[0 .. count - 1]. */
void perf_input_fill(ncclDataType_t t, void* buf, size_t count, uint64_t seed, int nranks,
                     uint64_t first);
/* The same elements as the type holds them (rounded, widened back to double). */
void perf_input_values(ncclDataType_t t, uint64_t seed, int nranks, uint64_t first, size_t count,
                       double* out);
/* v rounded to the type as perf_elem_set stores it, widened back. */
double perf_round_to(ncclDataType_t t, double v);

/* ---- references ---- */

/* out[i] = inputs[0][i] op inputs[1][i] op ... in rank order, as the exact path defines it
 * (see the top of this file). out may alias none of the inputs. */
void perf_reduce_exact(ncclDataType_t t, ncclRedOp_t op, const void* const* inputs, int n,
                       size_t count, void* out);
/* fp64 reduction of one element's n values, in rank order. */
double perf_reduce_f64(ncclRedOp_t op, const double* v, int n);

/* ---- comparison ---- */

/* Running error of a result against a reference. */
typedef struct {
  double err2, ref2; /* sums of (out - ref)^2 and ref^2 */
  double max_abs;
  uint64_t nonfinite; /* elements of out that are NaN or Inf while ref is finite */
  uint64_t count;
} perf_err;
void perf_err_add(perf_err* e, double out, double ref);
void perf_err_merge(perf_err* into, const perf_err* from);
double perf_err_rel_l2(const perf_err* e); /* 0 when the reference is all zero */

/* 64-bit hash of bytes (word at a time; not cryptographic). */
uint64_t perf_hash64(const void* buf, size_t len, uint64_t seed);

#endif
