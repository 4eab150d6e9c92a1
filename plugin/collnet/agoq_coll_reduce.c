/* The exact path: reductions run by a slice's owner over the contributions in rank order.
 * The result depends only on the inputs and their rank order, never on arrival order.
 * Loops go rank by rank over the whole slice (vectorizable, one pass per contribution).
 * Compiled with -ffp-contract=off (agoq_codec's public options): no fused operations. */
#include <math.h>
#include <string.h>

#include "agoq_fpconv.h"
#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_step.h"
#include "core/agoq_check.h"

/* Max/Min pick one input: a NaN loses against a number, -0 is below +0, ties keep the
 * earlier rank. Returns whether b replaces a. */
static inline bool agoq_max_takes_f(float a, float b) {
  if (isnan(b)) return false;
  if (isnan(a)) return true;
  if (a == b) return signbit(a) && !signbit(b);
  return b > a;
}

static inline bool agoq_min_takes_f(float a, float b) {
  if (isnan(b)) return false;
  if (isnan(a)) return true;
  if (a == b) return !signbit(a) && signbit(b);
  return b < a;
}

static inline bool agoq_max_takes_d(double a, double b) {
  if (isnan(b)) return false;
  if (isnan(a)) return true;
  if (a == b) return signbit(a) && !signbit(b);
  return b > a;
}

static inline bool agoq_min_takes_d(double a, double b) {
  if (isnan(b)) return false;
  if (isnan(a)) return true;
  if (a == b) return !signbit(a) && signbit(b);
  return b < a;
}

/* Integers: Sum and Prod wrap around (computed unsigned, so no signed overflow). The 8-bit
 * types widen to unsigned int so the promoted product cannot overflow int. */
#define AGOQ_REDUCE_INT(name, T, UT)                                                   \
  static void name(int op, const void* const* in, int n, size_t m, void* outv) {       \
    T* out = outv;                                                                     \
    memcpy(out, in[0], m * sizeof(T));                                                 \
    for (int k = 1; k < n; k++) {                                                      \
      const T* x = in[k];                                                              \
      switch (op) {                                                                    \
        case ncclSum:                                                                  \
          for (size_t i = 0; i < m; i++) out[i] = (T)(UT)((UT)out[i] + (UT)x[i]);      \
          break;                                                                       \
        case ncclProd:                                                                 \
          for (size_t i = 0; i < m; i++) out[i] = (T)(UT)((UT)out[i] * (UT)x[i]);      \
          break;                                                                       \
        case ncclMax:                                                                  \
          for (size_t i = 0; i < m; i++) out[i] = x[i] > out[i] ? x[i] : out[i];       \
          break;                                                                       \
        default:                                                                       \
          for (size_t i = 0; i < m; i++) out[i] = x[i] < out[i] ? x[i] : out[i];       \
          break;                                                                       \
      }                                                                                \
    }                                                                                  \
  }

AGOQ_REDUCE_INT(agoq_reduce_i8, int8_t, unsigned int)
AGOQ_REDUCE_INT(agoq_reduce_u8, uint8_t, unsigned int)
AGOQ_REDUCE_INT(agoq_reduce_i32, int32_t, uint32_t)
AGOQ_REDUCE_INT(agoq_reduce_u32, uint32_t, uint32_t)
AGOQ_REDUCE_INT(agoq_reduce_i64, int64_t, uint64_t)
AGOQ_REDUCE_INT(agoq_reduce_u64, uint64_t, uint64_t)

#define AGOQ_REDUCE_WIDE(name, T, max_takes, min_takes)                                \
  static void name(int op, const void* const* in, int n, size_t m, void* outv) {       \
    T* out = outv;                                                                     \
    memcpy(out, in[0], m * sizeof(T));                                                 \
    for (int k = 1; k < n; k++) {                                                      \
      const T* x = in[k];                                                              \
      switch (op) {                                                                    \
        case ncclSum:                                                                  \
          for (size_t i = 0; i < m; i++) out[i] = out[i] + x[i];                       \
          break;                                                                       \
        case ncclProd:                                                                 \
          for (size_t i = 0; i < m; i++) out[i] = out[i] * x[i];                       \
          break;                                                                       \
        case ncclMax:                                                                  \
          for (size_t i = 0; i < m; i++)                                               \
            if (max_takes(out[i], x[i])) out[i] = x[i];                                \
          break;                                                                       \
        default:                                                                       \
          for (size_t i = 0; i < m; i++)                                               \
            if (min_takes(out[i], x[i])) out[i] = x[i];                                \
          break;                                                                       \
      }                                                                                \
    }                                                                                  \
  }

AGOQ_REDUCE_WIDE(agoq_reduce_f32, float, agoq_max_takes_f, agoq_min_takes_f)
AGOQ_REDUCE_WIDE(agoq_reduce_f64, double, agoq_max_takes_d, agoq_min_takes_d)

/* The narrow float types: Sum and Prod accumulate in fp32 and round once; Max and Min
 * compare the (exactly) widened values and keep the chosen input's bits. The sums run in
 * tiles that keep the fp32 accumulator in L1. */
#define AGOQ_REDUCE_TILE 2048
#define AGOQ_REDUCE_NARROW(name, T, widen, narrow)                                      \
  static void name(int op, const void* const* in, int n, size_t m, void* outv,         \
                   float* scratch) {                                                    \
    T* out = outv;                                                                      \
    if (op == ncclMax || op == ncclMin) {                                               \
      memcpy(out, in[0], m * sizeof(T));                                                \
      for (int k = 1; k < n; k++) {                                                     \
        const T* x = in[k];                                                             \
        for (size_t i = 0; i < m; i++) {                                                \
          float a = widen(out[i]), b = widen(x[i]);                                     \
          if (op == ncclMax ? agoq_max_takes_f(a, b) : agoq_min_takes_f(a, b)) out[i] = x[i]; \
        }                                                                               \
      }                                                                                 \
      return;                                                                           \
    }                                                                                   \
    float* restrict acc = scratch;                                                      \
    for (size_t t0 = 0; t0 < m; t0 += AGOQ_REDUCE_TILE) {                               \
      size_t len = m - t0 < AGOQ_REDUCE_TILE ? m - t0 : AGOQ_REDUCE_TILE;               \
      const T* restrict x0 = (const T*)in[0] + t0;                                      \
      for (size_t i = 0; i < len; i++) acc[i] = widen(x0[i]);                           \
      for (int k = 1; k < n; k++) {                                                     \
        const T* restrict x = (const T*)in[k] + t0;                                     \
        if (op == ncclSum)                                                              \
          for (size_t i = 0; i < len; i++) acc[i] = acc[i] + widen(x[i]);               \
        else                                                                            \
          for (size_t i = 0; i < len; i++) acc[i] = acc[i] * widen(x[i]);               \
      }                                                                                 \
      T* restrict o = out + t0;                                                         \
      for (size_t i = 0; i < len; i++) o[i] = narrow(acc[i]);                           \
    }                                                                                   \
  }

AGOQ_REDUCE_NARROW(agoq_reduce_bf16, uint16_t, agoq_bf16_to_fp32, agoq_fp32_to_bf16)
AGOQ_REDUCE_NARROW(agoq_reduce_fp16, uint16_t, agoq_fp16_to_fp32, agoq_fp32_to_fp16)
AGOQ_REDUCE_NARROW(agoq_reduce_e4m3, uint8_t, agoq_fp8e4m3_to_fp32, agoq_fp32_to_fp8e4m3)
AGOQ_REDUCE_NARROW(agoq_reduce_e5m2, uint8_t, agoq_fp8e5m2_to_fp32, agoq_fp32_to_fp8e5m2)

void agoq_coll_reduce_exact(int dtype, int op, const void* const* in, int n, size_t m, void* out,
                            float* scratch) {
  if (m == 0) return;
  switch (dtype) {
    case ncclInt8: agoq_reduce_i8(op, in, n, m, out); break;
    case ncclUint8: agoq_reduce_u8(op, in, n, m, out); break;
    case ncclInt32: agoq_reduce_i32(op, in, n, m, out); break;
    case ncclUint32: agoq_reduce_u32(op, in, n, m, out); break;
    case ncclInt64: agoq_reduce_i64(op, in, n, m, out); break;
    case ncclUint64: agoq_reduce_u64(op, in, n, m, out); break;
    case ncclFloat32: agoq_reduce_f32(op, in, n, m, out); break;
    case ncclFloat64: agoq_reduce_f64(op, in, n, m, out); break;
    case ncclBfloat16: agoq_reduce_bf16(op, in, n, m, out, scratch); break;
    case ncclFloat16: agoq_reduce_fp16(op, in, n, m, out, scratch); break;
    case ncclFloat8e4m3: agoq_reduce_e4m3(op, in, n, m, out, scratch); break;
    case ncclFloat8e5m2: agoq_reduce_e5m2(op, in, n, m, out, scratch); break;
    default: break; /* refused before a request exists */
  }
}

/* ---- partial results (a grid's two levels) ------------------------------------------------ */

static bool agoq_coll_narrow_float(int dtype) {
  return dtype == ncclBfloat16 || dtype == ncclFloat16 || dtype == ncclFloat8e4m3 || dtype == ncclFloat8e5m2;
}

size_t agoq_coll_partial_size(int dtype, int op) {
  if (agoq_coll_narrow_float(dtype) && (op == ncclSum || op == ncclProd)) return sizeof(float);
  return agoq_coll_type_size(dtype);
}

/* Narrow float inputs widened exactly and combined in fp32 in input order, not rounded:
 * one typed loop per input, as the narrow reductions above. */
#define AGOQ_PARTIAL_NARROW(name, T, widen)                                             \
  static void name(int op, const void* const* in, int n, size_t m, float* restrict acc) { \
    const T* restrict x0 = in[0];                                                       \
    for (size_t i = 0; i < m; i++) acc[i] = widen(x0[i]);                               \
    for (int k = 1; k < n; k++) {                                                       \
      const T* restrict x = in[k];                                                      \
      if (op == ncclSum)                                                                \
        for (size_t i = 0; i < m; i++) acc[i] = acc[i] + widen(x[i]);                   \
      else                                                                              \
        for (size_t i = 0; i < m; i++) acc[i] = acc[i] * widen(x[i]);                   \
    }                                                                                   \
  }

AGOQ_PARTIAL_NARROW(agoq_partial_bf16, uint16_t, agoq_bf16_to_fp32)
AGOQ_PARTIAL_NARROW(agoq_partial_fp16, uint16_t, agoq_fp16_to_fp32)
AGOQ_PARTIAL_NARROW(agoq_partial_e4m3, uint8_t, agoq_fp8e4m3_to_fp32)
AGOQ_PARTIAL_NARROW(agoq_partial_e5m2, uint8_t, agoq_fp8e5m2_to_fp32)

void agoq_coll_reduce_partial(int dtype, int op, const void* const* in, int n, size_t m, void* out) {
  if (agoq_coll_partial_size(dtype, op) == agoq_coll_type_size(dtype)) {
    agoq_coll_reduce_exact(dtype, op, in, n, m, out, NULL);
    return;
  }
  switch (dtype) {
    case ncclBfloat16: agoq_partial_bf16(op, in, n, m, out); break;
    case ncclFloat16: agoq_partial_fp16(op, in, n, m, out); break;
    case ncclFloat8e4m3: agoq_partial_e4m3(op, in, n, m, out); break;
    default: agoq_partial_e5m2(op, in, n, m, out); break;
  }
}

void agoq_coll_reduce_final(int dtype, int op, const void* const* in, int n, size_t m, float* scratch, void* dst) {
  if (agoq_coll_partial_size(dtype, op) == agoq_coll_type_size(dtype)) {
    agoq_coll_reduce_exact(dtype, op, in, n, m, dst, NULL);
    return;
  }
  agoq_coll_reduce_exact(ncclFloat32, op, in, n, m, scratch, NULL);
  uint16_t* d16 = dst;
  uint8_t* d8 = dst;
  switch (dtype) {
    case ncclBfloat16: for (size_t i = 0; i < m; i++) d16[i] = agoq_fp32_to_bf16(scratch[i]); break;
    case ncclFloat16: for (size_t i = 0; i < m; i++) d16[i] = agoq_fp32_to_fp16(scratch[i]); break;
    case ncclFloat8e4m3: for (size_t i = 0; i < m; i++) d8[i] = agoq_fp32_to_fp8e4m3(scratch[i]); break;
    default: for (size_t i = 0; i < m; i++) d8[i] = agoq_fp32_to_fp8e5m2(scratch[i]); break;
  }
}

/* ---- the exact path of one pipeline chunk -------------------------------------------------- */

ncclResult_t agoq_coll_exact_reserve(agoq_coll_comm* g, agoq_coll_slot* s) {
  size_t m = s->sl[g->rank];
  s->r_stride = m * s->req->esz;
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.rbuf, s->r_stride * (size_t)g->nranks));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.res, m * s->req->esz));
  AGOQ_CHECK(agoq_coll_buf_reserve(-1, &s->own.acc, m * sizeof(float)));
  s->rbuf = s->own.rbuf;
  s->res = s->own.res;
  s->acc = s->own.acc;
  return ncclSuccess;
}

ncclResult_t agoq_coll_exact_reduce(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  int n = g->nranks, me = g->rank;
  size_t m = s->sl[me], bytes = m * r->esz;
  for (int k = 0; k < n; k++) {
    if (k == me) {
      g->reduce_in[k] = agoq_coll_src_at(r, s->sb[me]);
      continue;
    }
    if ((size_t)s->p1r_size[k] != bytes) {
      AGOQ_WARN("CollNet: rank %d sent %d bytes for a slice of %zu bytes (ranks disagree on the call?)", k,
                s->p1r_size[k], bytes);
      return ncclInvalidUsage;
    }
    g->reduce_in[k] = s->p1r_at[k];
  }
  /* Into staging first: the input and output buffers may be the same memory. */
  agoq_coll_reduce_exact(r->dtype, r->op, g->reduce_in, n, m, s->res.p, (float*)s->acc.p);
  memcpy(agoq_coll_dst_at(r, s->sb[me]), s->res.p, bytes);
  s->res_len = bytes;
  return ncclSuccess;
}

/* ---- the exact and all-gather steps (agoq_coll_step.h) -------------------------------------- */

static void agoq_exact_p2_place(agoq_coll_comm* g, agoq_coll_slot* s, int j, uint8_t** p, size_t* cap, size_t* max) {
  (void)g;
  *p = agoq_coll_dst_at(s->req, s->sb[j]); /* straight into place */
  *cap = *max = s->sl[j] * s->req->esz;
}

static ncclResult_t agoq_exact_p1_message(agoq_coll_comm* g, agoq_coll_slot* s, int j, const uint8_t** p,
                                          size_t* len) {
  (void)g;
  *p = agoq_coll_src_at(s->req, s->sb[j]);
  *len = s->sl[j] * s->req->esz;
  return ncclSuccess;
}

static ncclResult_t agoq_exact_reduce_step(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  return agoq_coll_step_reduce_now(g, s, done, agoq_coll_exact_reduce);
}

/* The owner's raw slice: exactly its bytes, or the ranks disagree on the call. */
static ncclResult_t agoq_exact_received(agoq_coll_comm* g, agoq_coll_slot* s, int j, int size) {
  (void)g;
  size_t want = s->sl[j] * s->req->esz;
  if ((size_t)size == want) return ncclSuccess;
  AGOQ_WARN("CollNet: rank %d sent %d bytes for a slice of %zu bytes (ranks disagree on the call?)", j, size, want);
  return ncclInvalidUsage;
}

const agoq_coll_step_impl agoq_coll_step_exact = {
    .reserve = agoq_coll_exact_reserve,
    .p2_place = agoq_exact_p2_place,
    .prepare = agoq_coll_step_ready,
    .p1_message = agoq_exact_p1_message,
    .reduce = agoq_exact_reduce_step,
    .p2_message = agoq_coll_step_result,
    .received = agoq_exact_received,
    .retire = agoq_coll_step_ready,
};

static ncclResult_t agoq_gather_reserve(agoq_coll_comm* g, agoq_coll_slot* s) {
  (void)g;
  (void)s;
  return ncclSuccess; /* every byte moves between NCCL's buffers */
}

/* This rank's own bytes into place (the window's input and output may be one buffer). */
static ncclResult_t agoq_gather_reduce(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  size_t m = s->sl[g->rank];
  const uint8_t* src = agoq_coll_src_at(s->req, s->sb[g->rank]);
  uint8_t* dst = agoq_coll_dst_at(s->req, s->sb[g->rank]);
  if (m > 0 && src != dst) memmove(dst, src, m);
  *done = true;
  return ncclSuccess;
}

static void agoq_gather_p2_message(agoq_coll_comm* g, agoq_coll_slot* s, const uint8_t** p, size_t* len) {
  *p = agoq_coll_src_at(s->req, s->sb[g->rank]);
  *len = s->sl[g->rank];
}

const agoq_coll_step_impl agoq_coll_step_gather = {
    .reserve = agoq_gather_reserve,
    .p2_place = agoq_exact_p2_place,
    .prepare = agoq_coll_step_ready,
    .p1_message = agoq_exact_p1_message, /* no phase 1: never asked */
    .reduce = agoq_gather_reduce,
    .p2_message = agoq_gather_p2_message,
    .received = agoq_exact_received,
    .retire = agoq_coll_step_ready,
};
