/*
 * Typed payloads on the plain net path: a p2p float payload whose datatype the profiler
 * oracle established is sent as a codec frame (quantized), and the receiver decodes it into
 * NCCL's buffer and reports the original size. Everything else is sent exactly.
 *
 * Staging: frames are built in and received into per-comm staging buffers (never NCCL's
 * buffers: a frame decodes to more bytes than it occupies). Buffers are allocated the first
 * time a size is needed and reused afterwards, so the steady state allocates nothing.
 * A comm's staging is used from the thread that calls isend/irecv/test (NCCL's proxy thread).
 */
#ifndef AGOQ_TYPED_H
#define AGOQ_TYPED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"
#include "agoq_codec.h"
#include "core/agoq_stats.h"

/* At most this many staged messages per comm at once; NCCL keeps at most
 * NCCL_NET_MAX_REQUESTS x maxRecvs requests per comm in flight. */
#define AGOQ_STAGE_MAX 256

typedef struct {
  uint8_t* p;
  size_t cap;
  bool busy;
  void* key; /* its registration with the transport, NULL for none */
} agoq_stage_buf;

/* How staging buffers are registered with the transport (agoq_transport.reg), made when a
 * buffer is allocated or grown, never per message; reg NULL: no registration. */
typedef struct {
  ncclResult_t (*reg)(int dev, void* addr, size_t size, void** key);
  void (*dereg)(void* key);
  int dev;
} agoq_stage_reg;

typedef struct {
  /* AGOQ_STAGE_MAX entries, allocated by the first agoq_stage_get: most connections never
   * stage (CollNet's, exact traffic), and a process may hold tens of thousands of them. */
  agoq_stage_buf* bufs;
  int n; /* slots that ever held a buffer */
  agoq_stage_reg reg;
} agoq_stage_cache;

/* Counters of one comm (printed at close with AGOQ_STATS=1). */
typedef struct {
  uint64_t frames, frame_in_bytes, frame_wire_bytes; /* quantized messages */
  uint64_t exact_msgs, exact_bytes;                  /* everything else */
  uint64_t unknown_type;   /* big enough, but no datatype from the oracle */
  uint64_t not_eligible;   /* known but not a SIMPLE p2p of fp32/bf16/fp16 */
  uint64_t oracle_queries, oracle_ns;
  uint64_t codec_ns;
} agoq_typed_stats;

/* Process-wide policy, read from AGOQ_P2P_FORMAT / AGOQ_P2P_SCOPE / AGOQ_BLOCK / AGOQ_MIN_BYTES at
 * init. */
typedef struct {
  int format;        /* agoq_format; AGOQ_FORMAT_NONE disables */
  uint32_t block;
  uint64_t min_bytes;
  bool stats;
  bool pipeline_only; /* AGOQ_P2P_SCOPE=pipeline: only two-way flows are quantized */
} agoq_typed_policy;

extern agoq_typed_policy agoq_typed;
void agoq_typed_policy_load(void);

/* Index of a free staging buffer of at least `need` bytes, or -1 when none can be had. */
int agoq_stage_get(agoq_stage_cache* c, size_t need);
uint8_t* agoq_stage_ptr(agoq_stage_cache* c, int idx);
void* agoq_stage_key(agoq_stage_cache* c, int idx); /* its registration or NULL */
size_t agoq_stage_cap(agoq_stage_cache* c, int idx);
void agoq_stage_put(agoq_stage_cache* c, int idx);
void agoq_stage_fini(agoq_stage_cache* c);

/* Sender: whether `size` bytes go as a frame (the policy and the profiler oracle, no data
 * read): on true, the codec parameters, the element count and the largest frame worth
 * sending (*cap, at most size); on false *why. */
bool agoq_typed_plan(agoq_typed_stats* st, ncclProfilerCallback_t prof_fn, void* phandle, size_t size,
                     agoq_codec_params* p, size_t* n, size_t* cap, agoq_exact_reason* why);
/* A frame of frame_len bytes standing for size bytes was sent or received. */
void agoq_typed_count_frame(agoq_typed_stats* st, size_t size, size_t frame_len);

/* Sender: decides whether `size` bytes at `data` go as a frame. On true, *stage_idx is the
 * staging buffer holding the frame and *wire_len its length (< size); on false *why says
 * which rule kept it exact (AGOQ_STATS). */
bool agoq_typed_encode(agoq_stage_cache* c, agoq_typed_stats* st, ncclProfilerCallback_t prof_fn,
                       void* phandle, const void* data, size_t size, int* stage_idx, size_t* wire_len,
                       agoq_exact_reason* why);

/* Receiver: validates the frame of `len` bytes and decodes it into dst (capacity `cap`).
 * Returns ncclSuccess with *decoded = bytes written, or an error (logged, peer named). */
ncclResult_t agoq_typed_decode(agoq_typed_stats* st, const uint8_t* frame, size_t len, void* dst, size_t cap,
                               size_t* decoded, const char* peer);

void agoq_typed_stats_log(const agoq_typed_stats* st, bool is_send, const char* peer);

#endif
