/* The quantized path of one pipeline chunk: staging sizes, quantizing each slice once (the
 * owner's own too), the owner's fp32 accumulation in rank order with one re-quantization,
 * and decoding the owners' result frames. Frames are validated by the codec before use.
 *
 * Every frame that crosses the wire carries a payload CRC32C besides the header CRC, and a
 * receiver refuses a frame without one: a flipped bit anywhere in a frame (a scale, a code,
 * the escape bitmap, a raw block) fails the chunk before a byte of it is decoded, instead of
 * decoding to wrong values (a flipped scale exponent gives 3.4e38) on every rank. The two
 * frames that never travel get none: a rank's frame of its own slice, and the owner's result
 * frame until the owner itself has decoded it (sealed with the CRC after that, before it is
 * sent). Exact CollNet payloads carry no checksum of their own (TCP's, as on the net path). */
#include <string.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_step.h"
#include "core/agoq_check.h"

size_t agoq_coll_quant_result_cap(const agoq_coll_comm* g, size_t n) {
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  return agoq_frame_size_max(&p32, n);
}


size_t agoq_coll_frame_cap(const agoq_codec_params* p, size_t n, bool nominal) {
  return nominal ? agoq_frame_size_nominal(p, n) : agoq_frame_size_max(p, n);
}

void agoq_coll_quant_sizes(const agoq_coll_comm* g, agoq_dtype dtype, bool p2, bool nominal, const size_t* sl,
                           size_t* s_off, size_t* g_off, size_t* r_stride, agoq_coll_slot_bufs* need) {
  int n = g->nranks, me = g->rank;
  size_t m = sl[me];
  agoq_codec_params pin = agoq_coll_params(g, dtype), p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  size_t total = 0, gtotal = 0;
  /* Every frame starts 16-byte aligned: the CUDA codec needs 4, vector loads like 16. */
  for (int j = 0; j < n; j++) {
    if (s_off != NULL) s_off[j] = total;
    if (g_off != NULL) g_off[j] = gtotal;
    if (sl[j] == 0) continue;
    total += agoq_coll_align16(agoq_coll_frame_cap(&pin, sl[j], nominal));
    if (j != me && p2) gtotal += agoq_coll_align16(agoq_coll_frame_cap(&p32, sl[j], nominal));
  }
  *r_stride = m > 0 ? agoq_coll_align16(agoq_coll_frame_cap(&pin, m, nominal)) : 0;
  memset(need, 0, sizeof *need);
  need->sbuf.cap = total;
  need->gbuf.cap = gtotal;
  need->rbuf.cap = *r_stride * (size_t)n;
  need->acc.cap = m * sizeof(float);
  need->res.cap = p2 && m > 0 ? agoq_coll_quant_result_cap(g, m) : 0;
}

ncclResult_t agoq_coll_quant_reserve(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  agoq_coll_slot_bufs need;
  /* Frames' regions, sent and received, are sized for frames whose blocks compress; a larger
   * one spills into a buffer of its own. */
  agoq_coll_quant_sizes(g, r->codec_dtype, agoq_coll_has_p2(r), true, s->sl, s->s_off, s->g_off, &s->r_stride, &need);
  agoq_codec_params pin = agoq_coll_params(g, r->codec_dtype);
  size_t m = s->sl[g->rank];
  s->r_max = m > 0 ? agoq_frame_size_max(&pin, m) : 0;
  s->nominal = true;
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.sbuf, need.sbuf.cap));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.gbuf, need.gbuf.cap));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.rbuf, need.rbuf.cap));
  AGOQ_CHECK(agoq_coll_buf_reserve(-1, &s->own.acc, need.acc.cap));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.res, need.res.cap));
  s->sbuf = s->own.sbuf;
  s->gbuf = s->own.gbuf;
  s->rbuf = s->own.rbuf;
  s->acc = s->own.acc;
  s->res = s->own.res;
  return ncclSuccess;
}

ncclResult_t agoq_coll_quant_encode(agoq_coll_comm* g, agoq_coll_slot* s, int j) {
  agoq_coll_req* r = s->req;
  agoq_codec_params p = agoq_coll_params(g, r->codec_dtype);
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns();
  uint8_t* out = s->sbuf.p + s->s_off[j];
  size_t cap = s->nominal ? agoq_coll_align16(agoq_frame_size_nominal(&p, s->sl[j])) : s->sbuf.cap - s->s_off[j];
  const void* src = agoq_coll_src_at(r, s->sb[j]);
  agoq_codec_status st = agoq_frame_encode_mt(&p, src, s->sl[j], j != g->rank, out, cap, &s->s_len[j], g->codec_threads);
  if (st == AGOQ_CODEC_ESPACE && s->nominal) {
    /* Blocks escaped raw: the frame outgrew its region; it goes from a buffer of its own. */
    cap = agoq_frame_size_max(&p, s->sl[j]);
    out = agoq_coll_spill_alloc(g, s, cap);
    if (out == NULL) return ncclSystemError;
    st = agoq_frame_encode_mt(&p, src, s->sl[j], j != g->rank, out, cap, &s->s_len[j], g->codec_threads);
  }
  s->s_at[j] = out;
  agoq_stats_add(&agoq_coll_req_stats(g, r)->codec_ns, (uint64_t)(agoq_coll_now_ns() - t0));
  agoq_stats_add(&agoq_coll_req_stats(g, r)->crc_ns, agoq_frame_crc_ns() - crc0);
  if (st != AGOQ_CODEC_OK) {
    AGOQ_WARN("CollNet: quantizing %zu elements failed: %s", s->sl[j], agoq_codec_status_str(st));
    return ncclInternalError;
  }
  return ncclSuccess;
}

/* Decodes a contribution into the fp32 sum (agoq_coll_quant_reduce). */
typedef struct {
  float* acc;
  size_t m;
  bool first; /* rank 0's: acc = y_0; the others' are added */
  int threads;
} agoq_quant_sum_arg;

static agoq_codec_status agoq_quant_sum_step(void* arg, const uint8_t* f, size_t len) {
  const agoq_quant_sum_arg* a = arg;
  return a->first ? agoq_frame_decode_mt(f, len, AGOQ_DTYPE_FP32, a->acc, a->m, a->threads)
                  : agoq_frame_decode_accumulate_mt(f, len, a->acc, a->m, a->threads);
}

ncclResult_t agoq_coll_quant_reduce(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  int n = g->nranks, me = g->rank;
  size_t m = s->sl[me];
  float* acc = (float*)s->acc.p;
  /* acc = y_0, then acc += y_k in rank order: the bits do not depend on arrival order. */
  for (int k = 0; k < n; k++) {
    const uint8_t* f = k == me ? s->s_at[me] : s->p1r_at[k];
    size_t len = k == me ? s->s_len[me] : (size_t)s->p1r_size[k];
    agoq_quant_sum_arg a = {.acc = acc, .m = m, .first = k == 0, .threads = g->codec_threads};
    /* Our own frame never travelled: it has no payload CRC. */
    ncclResult_t res = agoq_coll_quant_frame_check(g, s, AGOQ_COLL_FRAME_CONTRIBUTION, k, k != me, f, len,
                                                   agoq_quant_sum_step, &a);
    if (res != ncclSuccess) return res;
  }
  uint8_t* dst = agoq_coll_dst_at(r, s->sb[me]);
  if (r->kind == AGOQ_COLL_REDUCESCATTER) {
    agoq_codec_narrow_fp32(r->codec_dtype, acc, m, dst);
    return ncclSuccess;
  }
  /* A sum outside the output type's finite range is Inf (as NCCL's reduction gives): its
   * block then travels raw, instead of decoding to the type's saturated maximum. */
  agoq_codec_overflow_to_inf(r->codec_dtype, acc, m);
  /* The owner takes the same decoded bytes as everyone else, not its fp32 sum. */
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  agoq_codec_status st = agoq_frame_encode_mt(&p32, acc, m, false, s->res.p, s->res.cap, &s->res_len, g->codec_threads);
  if (st == AGOQ_CODEC_OK) st = agoq_frame_decode_mt(s->res.p, s->res_len, r->codec_dtype, dst, m, g->codec_threads);
  /* Decoded here from our own memory without a check; the copies for the peers get the CRC. */
  if (st == AGOQ_CODEC_OK && n > 1) st = agoq_frame_seal_payload_crc(s->res.p, s->res_len);
  if (st != AGOQ_CODEC_OK) {
    AGOQ_WARN("CollNet: quantizing the reduced slice failed: %s", agoq_codec_status_str(st));
    return ncclInternalError;
  }
  return ncclSuccess;
}

/* Decodes a result frame into NCCL's buffer (agoq_coll_quant_decode); codec time. */
typedef struct {
  agoq_coll_comm* g;
  agoq_coll_slot* s;
  int j;
} agoq_quant_result_arg;

static agoq_codec_status agoq_quant_result_step(void* arg, const uint8_t* f, size_t len) {
  const agoq_quant_result_arg* a = arg;
  agoq_coll_comm* g = a->g;
  agoq_coll_slot* s = a->s;
  agoq_coll_req* r = s->req;
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns();
  /* The decoder writes nothing into NCCL's buffer unless the whole frame checked out. */
  agoq_codec_status st =
      agoq_frame_decode_mt(f, len, r->codec_dtype, agoq_coll_dst_at(r, s->sb[a->j]), s->sl[a->j], g->codec_threads);
  agoq_stats_add(&agoq_coll_req_stats(g, r)->codec_ns, (uint64_t)(agoq_coll_now_ns() - t0));
  agoq_stats_add(&agoq_coll_req_stats(g, r)->crc_ns, agoq_frame_crc_ns() - crc0);
  return st;
}

ncclResult_t agoq_coll_quant_decode(agoq_coll_comm* g, agoq_coll_slot* s, int j, int size) {
  agoq_quant_result_arg a = {.g = g, .s = s, .j = j};
  return agoq_coll_quant_frame_check(g, s, AGOQ_COLL_FRAME_RESULT, j, true, s->p2r_at[j], (size_t)size,
                                     agoq_quant_result_step, &a);
}

/* The host path and the GPU path (agoq_coll_gpu.c) check a received frame here, with the
 * same refusals: one that travelled without a payload CRC is refused before it is read,
 * and step's verdict (parsing or decoding it, which validates it first) fails the call. */
ncclResult_t agoq_coll_quant_frame_check(agoq_coll_comm* g, const agoq_coll_slot* s, agoq_coll_frame_kind kind, int k,
                                         bool sealed, const uint8_t* f, size_t len, agoq_coll_frame_step_fn step,
                                         void* arg) {
  bool result = kind == AGOQ_COLL_FRAME_RESULT;
  /* Its elements: a contribution is to this rank's slice, a result frame is of its owner's. */
  int at = result ? k : g->rank;
  size_t b = s->sb[at], e = s->sb[at] + s->sl[at];
  if (sealed && !agoq_frame_has_payload_crc(f, len)) {
    AGOQ_WARN("CollNet rank %d: %sframe from rank %d for elements [%zu, %zu) of the call has no payload CRC "
              "(%zu bytes; another agoq version?): refused, nothing decoded", g->rank, result ? "result " : "", k, b,
              e, len);
    return ncclSystemError;
  }
  agoq_codec_status st = step(arg, f, len);
  if (st == AGOQ_CODEC_OK) return ncclSuccess;
  AGOQ_WARN("CollNet rank %d: %sframe from rank %d for elements [%zu, %zu) of the call rejected before decoding: %s "
            "(%zu bytes; header and payload CRC32C, lengths and scales are checked first); %sthe call fails", g->rank,
            result ? "result " : "", k, b, e, agoq_codec_status_str(st), len, result ? "" : "nothing decoded, ");
  return ncclSystemError;
}

/* ---- the host quantized step (agoq_coll_step.h) ------------------------------------------- */

void agoq_coll_quant_p2_place(agoq_coll_comm* g, agoq_coll_slot* s, int j, uint8_t** p, size_t* cap, size_t* max) {
  /* Host slots (agoq_coll_quant_reserve) are laid out for nominal frames, GPU slots
   * (agoq_coll_gpu_reserve) for the worst case. */
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  *p = s->gbuf.p + s->g_off[j];
  *max = agoq_coll_quant_result_cap(g, s->sl[j]);
  *cap = agoq_coll_frame_cap(&p32, s->sl[j], s->nominal);
}

static ncclResult_t agoq_quant_p1_message(agoq_coll_comm* g, agoq_coll_slot* s, int j, const uint8_t** p,
                                          size_t* len) {
  if (s->s_len[j] == 0) AGOQ_CHECK(agoq_coll_quant_encode(g, s, j));
  *p = s->s_at[j];
  *len = s->s_len[j];
  return ncclSuccess;
}

static ncclResult_t agoq_quant_reduce_step(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  return agoq_coll_step_reduce_now(g, s, done, agoq_coll_quant_reduce);
}

const agoq_coll_step_impl agoq_coll_step_quant = {
    .reserve = agoq_coll_quant_reserve,
    .p2_place = agoq_coll_quant_p2_place,
    .prepare = agoq_coll_step_ready,
    .p1_message = agoq_quant_p1_message,
    .reduce = agoq_quant_reduce_step,
    .p2_message = agoq_coll_step_result,
    .received = agoq_coll_quant_decode,
    .retire = agoq_coll_step_ready,
};
