/* Typed payloads (agoq_typed.h): the sender's decision and frame, the receiver's decode. */
#include "net/agoq_typed.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "core/agoq_log.h"
#include "core/agoq_nccl_env.h"
#include "core/agoq_params.h"
#include "profiler/agoq_oracle.h"

/* ncclDataType_t values of the float types the codec takes. */
enum { AGOQ_NCCL_FLOAT16 = 6, AGOQ_NCCL_FLOAT32 = 7, AGOQ_NCCL_BFLOAT16 = 9 };

agoq_typed_policy agoq_typed;

void agoq_typed_policy_load(void) {
  agoq_typed.format = (int)agoq_param_int(AGOQ_PARAM_P2P_FORMAT);
  agoq_typed.block = AGOQ_CODEC_BLOCK_MIN << agoq_param_int(AGOQ_PARAM_BLOCK);
  agoq_typed.min_bytes = (uint64_t)agoq_param_int(AGOQ_PARAM_MIN_BYTES);
  agoq_typed.stats = agoq_param_int(AGOQ_PARAM_STATS) != 0;
  /* ENUM index into "pipeline|all". */
  agoq_typed.pipeline_only = agoq_param_int(AGOQ_PARAM_P2P_SCOPE) == 0;
}

static uint64_t agoq_now_ns(void) { return (uint64_t)agoq_stats_clock_ns(); }

/* ---- staging ---------------------------------------------------------------------------- */

int agoq_stage_get(agoq_stage_cache* c, size_t need) {
  if (c->bufs == NULL && (c->bufs = calloc(AGOQ_STAGE_MAX, sizeof *c->bufs)) == NULL) return -1;
  int empty = -1, smaller = -1;
  for (int i = 0; i < c->n; i++) {
    agoq_stage_buf* b = &c->bufs[i];
    if (b->busy) continue;
    if (b->p != NULL && b->cap >= need) {
      b->busy = true;
      return i;
    }
    if (b->p == NULL && empty < 0) empty = i;
    if (b->p != NULL && smaller < 0) smaller = i;
  }
  int i = empty >= 0 ? empty : (c->n < AGOQ_STAGE_MAX ? c->n : smaller);
  if (i < 0) return -1;
  agoq_stage_buf* b = &c->bufs[i];
  /* Grow a free buffer that is too small rather than hold ever more buffers: NCCL's
   * message sizes settle quickly, so this happens only while they do. Its registration
   * goes before the memory may move, and is made again for the new one: a failure leaves
   * it unregistered (the transport then registers per message, and says so). */
  if (b->key != NULL) c->reg.dereg(b->key);
  b->key = NULL;
  uint8_t* p = realloc(b->p, need);
  if (p == NULL) return -1;
  b->p = p;
  b->cap = need;
  b->busy = true;
  if (i == c->n) c->n++;
  if (c->reg.reg != NULL && c->reg.reg(c->reg.dev, p, need, &b->key) != ncclSuccess) b->key = NULL;
  return i;
}

void* agoq_stage_key(agoq_stage_cache* c, int idx) { return c->bufs[idx].key; }

uint8_t* agoq_stage_ptr(agoq_stage_cache* c, int idx) { return c->bufs[idx].p; }
size_t agoq_stage_cap(agoq_stage_cache* c, int idx) { return c->bufs[idx].cap; }
void agoq_stage_put(agoq_stage_cache* c, int idx) {
  if (idx >= 0 && idx < c->n) c->bufs[idx].busy = false;
}

void agoq_stage_fini(agoq_stage_cache* c) {
  for (int i = 0; i < c->n; i++) {
    if (c->bufs[i].key != NULL) c->reg.dereg(c->bufs[i].key);
    free(c->bufs[i].p);
  }
  free(c->bufs);
  memset(c, 0, sizeof *c);
}

/* ---- sender ------------------------------------------------------------------------------- */

static atomic_bool agoq_said_no_oracle;

/* Once per process: why big p2p payloads are going exact. */
static void agoq_typed_explain_unknown(ncclProfilerCallback_t prof_fn) {
  /* With agoq's profiler loaded, "unknown" is the normal answer for everything it does not
   * track (receives, integers, LL-sized sends): nothing to explain. */
  if (prof_fn != NULL && agoq_oracle_profiler_loaded()) return;
  if (atomic_exchange(&agoq_said_no_oracle, true)) return;
  if (prof_fn == NULL) {
    AGOQ_INFO(NCCL_NET | NCCL_P2P, "p2p payloads go exact: NCCL gave no profiler callback (net ABI before v10)");
  } else if (!agoq_oracle_profiler_loaded()) {
    const char* p = agoq_nccl_env_str("NCCL_PROFILER_PLUGIN"); /* as NCCL's ncclGetEnv */
    AGOQ_INFO(NCCL_NET | NCCL_P2P,
              "p2p payloads go exact: agoq's profiler is not loaded (NCCL_PROFILER_PLUGIN=%s), so no transfer's "
              "datatype is known; unset it to let NCCL find agoq's profiler in this library",
              p != NULL ? p : "(unset; another libnccl-profiler.so was found first?)");
  }
}

static bool agoq_codec_dtype_of(int nccl_dtype, agoq_dtype* out) {
  switch (nccl_dtype) {
    case AGOQ_NCCL_FLOAT32: *out = AGOQ_DTYPE_FP32; return true;
    case AGOQ_NCCL_BFLOAT16: *out = AGOQ_DTYPE_BF16; return true;
    case AGOQ_NCCL_FLOAT16: *out = AGOQ_DTYPE_FP16; return true;
    default: return false;
  }
}

bool agoq_typed_plan(agoq_typed_stats* st, ncclProfilerCallback_t prof_fn, void* phandle, size_t size,
                     agoq_codec_params* p, size_t* n_out, size_t* cap_out, agoq_exact_reason* why) {
  *why = AGOQ_EXACT_NOGAIN;
  if (agoq_typed.format == AGOQ_FORMAT_NONE) {
    *why = AGOQ_EXACT_FORMAT_NONE;
    return false;
  }
  if (size < agoq_typed.min_bytes || size == 0) {
    *why = AGOQ_EXACT_SMALL;
    return false;
  }
  agoq_xfer_desc d;
  uint64_t t0 = agoq_typed.stats ? agoq_now_ns() : 0;
  bool known = agoq_oracle_query(prof_fn, phandle, &d);
  if (agoq_typed.stats) {
    st->oracle_queries++;
    st->oracle_ns += agoq_now_ns() - t0;
  }
  if (!known) {
    *why = AGOQ_EXACT_UNKNOWN;
    st->unknown_type++;
    agoq_typed_explain_unknown(prof_fn);
    return false;
  }
  agoq_dtype dt;
  /* Only a send of a p2p under SIMPLE: ring/tree traffic of a collective must keep every
   * rank's bits equal, and LL payloads interleave flags with the data. */
  if (d.kind != AGOQ_XFER_P2P || !d.is_send || d.proto != AGOQ_XFER_PROTO_SIMPLE ||
      !agoq_codec_dtype_of(d.dtype, &dt) || size % agoq_dtype_size(dt) != 0) {
    *why = d.kind != AGOQ_XFER_P2P || !d.is_send        ? AGOQ_EXACT_COLLECTIVE
           : d.proto != AGOQ_XFER_PROTO_SIMPLE            ? AGOQ_EXACT_LL
                                                          : AGOQ_EXACT_TYPE;
    st->not_eligible++;
    return false;
  }
  /* AGOQ_P2P_SCOPE=pipeline: a send is pipeline traffic only when its communicator carried
   * a receive of the same shape from the same peer (activations one way, gradients the
   * other). Scatter and gather roots, weights, checkpoints and KV caches go one way and
   * stay exact. An unsure profiler says not two-way: this rule can only keep bytes exact. */
  if (agoq_typed.pipeline_only && d.two_way != 1) {
    *why = AGOQ_EXACT_ONE_WAY;
    st->not_eligible++;
    return false;
  }
  const size_t n = size / agoq_dtype_size(dt);
  *p = (agoq_codec_params){.format = (agoq_format)agoq_typed.format, .dtype = dt, .block = agoq_typed.block};
  /* A frame that would not be smaller than the raw bytes is pointless: cap it there. */
  size_t cap = agoq_frame_size_max(p, n);
  if (cap == 0 || cap == SIZE_MAX) return false;
  *n_out = n;
  *cap_out = cap > size ? size : cap;
  return true;
}

void agoq_typed_count_frame(agoq_typed_stats* st, size_t size, size_t frame_len) {
  st->frames++;
  st->frame_in_bytes += size;
  st->frame_wire_bytes += frame_len;
}

bool agoq_typed_encode(agoq_stage_cache* c, agoq_typed_stats* st, ncclProfilerCallback_t prof_fn, void* phandle,
                       const void* data, size_t size, int* stage_idx, size_t* wire_len, agoq_exact_reason* why) {
  *stage_idx = -1;
  agoq_codec_params p;
  size_t n = 0, cap = 0;
  if (!agoq_typed_plan(st, prof_fn, phandle, size, &p, &n, &cap, why)) return false;
  int idx = agoq_stage_get(c, cap);
  if (idx < 0) return false;
  size_t len = 0;
  uint64_t t1 = agoq_typed.stats ? agoq_now_ns() : 0;
  /* The payload CRC makes a damaged frame an error at the receiver, never wrong data. */
  agoq_codec_status s = agoq_frame_encode(&p, data, n, true, agoq_stage_ptr(c, idx), cap, &len);
  if (agoq_typed.stats) st->codec_ns += agoq_now_ns() - t1;
  if (s != AGOQ_CODEC_OK || len >= size) { /* ESPACE: too many escaped blocks to gain */
    agoq_stage_put(c, idx);
    st->not_eligible++;
    return false;
  }
  agoq_typed_count_frame(st, size, len);
  *stage_idx = idx;
  *wire_len = len;
  return true;
}

/* ---- receiver ----------------------------------------------------------------------------- */

ncclResult_t agoq_typed_decode(agoq_typed_stats* st, const uint8_t* frame, size_t len, void* dst, size_t cap,
                               size_t* decoded, const char* peer) {
  agoq_frame_info info;
  const void* body;
  agoq_codec_status s = agoq_frame_parse(frame, len, &info, &body);
  /* agoq's senders always seal p2p frames: one without its payload CRC could carry
   * corruption nothing would catch. */
  if (s == AGOQ_CODEC_OK && !agoq_frame_has_payload_crc(frame, len)) s = AGOQ_CODEC_ECORRUPT;
  if (s != AGOQ_CODEC_OK) {
    AGOQ_WARN("p2p frame from %s rejected: %s (%zu bytes); no data delivered", peer, agoq_codec_status_str(s), len);
    return ncclSystemError;
  }
  const size_t esize = agoq_dtype_size(info.params.dtype);
  if (info.count > cap / esize || AGOQ_FRAME_HEADER_SIZE + info.payload_len != len) {
    AGOQ_WARN("p2p frame from %s decodes to %llu %s elements (frame %zu bytes), receive posted for %zu bytes",
              peer, (unsigned long long)info.count, agoq_dtype_name(info.params.dtype), len, cap);
    return ncclInvalidUsage;
  }
  uint64_t t0 = agoq_typed.stats ? agoq_now_ns() : 0;
  s = agoq_dequantize(&info.params, body, info.payload_len, info.count, info.params.dtype, dst);
  if (agoq_typed.stats) st->codec_ns += agoq_now_ns() - t0;
  if (s != AGOQ_CODEC_OK) {
    AGOQ_WARN("p2p frame from %s could not be decoded: %s", peer, agoq_codec_status_str(s));
    return ncclSystemError;
  }
  *decoded = info.count * esize;
  st->frames++;
  st->frame_in_bytes += *decoded;
  st->frame_wire_bytes += len;
  return ncclSuccess;
}

void agoq_typed_stats_log(const agoq_typed_stats* st, bool is_send, const char* peer) {
  if (!agoq_typed.stats) return;
  const double mib = 1.0 / (1 << 20);
  double ratio = st->frame_in_bytes ? (double)st->frame_wire_bytes / (double)st->frame_in_bytes : 1.0;
  AGOQ_INFO(NCCL_NET | NCCL_P2P,
            "p2p stats %s %s: %llu frames, %.1f MiB in %.1f MiB on the wire (ratio %.3f), codec %.1f ms; exact %llu "
            "messages %.1f MiB; type unknown %llu, not eligible %llu; oracle %llu queries, %.0f ns each",
            is_send ? "to" : "from", peer, (unsigned long long)st->frames, (double)st->frame_in_bytes * mib,
            (double)st->frame_wire_bytes * mib, ratio, (double)st->codec_ns * 1e-6, (unsigned long long)st->exact_msgs,
            (double)st->exact_bytes * mib, (unsigned long long)st->unknown_type, (unsigned long long)st->not_eligible,
            (unsigned long long)st->oracle_queries,
            st->oracle_queries ? (double)st->oracle_ns / (double)st->oracle_queries : 0.0);
}
