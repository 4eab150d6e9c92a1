/*
 * The step interface: what a chunk's own slice needs done, apart from moving messages, on
 * the one-level mesh. The engine (agoq_coll_engine.c) posts, polls and orders the stages;
 * everything that depends on where the bytes are and what they are (host or device memory,
 * frames or raw values) sits behind one of these tables, so the engine names no codec, no
 * reduction and no GPU function:
 *  - agoq_coll_step_quant (agoq_coll_quant.c): frames encoded, summed in fp32 and decoded on
 *    the CPU;
 *  - agoq_coll_step_gpu (agoq_coll_gpu.c): the same frames, made and used by the GPU, only
 *    frames crossing PCIe (asynchronous: prepare, reduce and retire say when it is done);
 *  - agoq_coll_step_exact (agoq_coll_reduce.c): raw values reduced in rank order on the CPU;
 *  - agoq_coll_step_gather (agoq_coll_reduce.c): all-gather, nothing reduced.
 * A grid group's chunks have stages of their own (agoq_coll_grid.c), with the GPU's part of
 * them in agoq_coll_grid_gpu.c.
 */
#ifndef AGOQ_COLL_STEP_H
#define AGOQ_COLL_STEP_H

#include "agoq_frame.h"
#include "collnet/agoq_coll_internal.h"

typedef struct agoq_coll_step_impl {
  /* The slot's buffers for its chunk (its slices laid out in s->sb, s->sl). */
  ncclResult_t (*reserve)(agoq_coll_comm* g, agoq_coll_slot* s);
  /* Where the phase-2 message of slice j's owner lands (cap bytes), and at most how many
   * bytes it may have (max > cap: a larger one spills into a buffer of its own). */
  void (*p2_place)(agoq_coll_comm* g, agoq_coll_slot* s, int j, uint8_t** p, size_t* cap, size_t* max);
  /* Once the receives are posted, before the first phase-1 send: *ready false while the
   * device is still making the frames (call again on a later pass). */
  ncclResult_t (*prepare)(agoq_coll_comm* g, agoq_coll_slot* s, bool* ready);
  /* Slice j's phase-1 message (j == this rank: its own contribution, kept here), made now
   * where it is made on demand. */
  ncclResult_t (*p1_message)(agoq_coll_comm* g, agoq_coll_slot* s, int j, const uint8_t** p, size_t* len);
  /* Every contribution to this rank's slice is in: the slice reduced, in rank order, and its
   * phase-2 message made; *done false while the device is at it. */
  ncclResult_t (*reduce)(agoq_coll_comm* g, agoq_coll_slot* s, bool* done);
  /* This rank's phase-2 message (after reduce). */
  void (*p2_message)(agoq_coll_comm* g, agoq_coll_slot* s, const uint8_t** p, size_t* len);
  /* The phase-2 message of slice j's owner arrived (size bytes): checked, into place. */
  ncclResult_t (*received)(agoq_coll_comm* g, agoq_coll_slot* s, int j, int size);
  /* Every send and receive of the slot is complete: *done once the results are all in place. */
  ncclResult_t (*retire)(agoq_coll_comm* g, agoq_coll_slot* s, bool* done);
} agoq_coll_step_impl;

extern const agoq_coll_step_impl agoq_coll_step_quant;
extern const agoq_coll_step_impl agoq_coll_step_gpu;
extern const agoq_coll_step_impl agoq_coll_step_exact;
extern const agoq_coll_step_impl agoq_coll_step_gather;

/* Steps that have nothing to wait for. */
static inline ncclResult_t agoq_coll_step_ready(agoq_coll_comm* g, agoq_coll_slot* s, bool* ready) {
  (void)g;
  (void)s;
  *ready = true;
  return ncclSuccess;
}

/* The result message the reduction left in the slot (every path but all-gather). */
static inline void agoq_coll_step_result(agoq_coll_comm* g, agoq_coll_slot* s, const uint8_t** p, size_t* len) {
  (void)g;
  *p = s->res.p;
  *len = s->res_len;
}

/* fn(g, s), CPU codec work of the slot's chunk: its time and its CRC time (checks of frames
 * received, seals of frames made) charged to the request's path statistics. The mesh's host
 * steps and the grid's stages alike. */
static inline ncclResult_t agoq_coll_timed(agoq_coll_comm* g, agoq_coll_slot* s,
                                           ncclResult_t (*fn)(agoq_coll_comm*, agoq_coll_slot*)) {
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns();
  ncclResult_t res = fn(g, s);
  agoq_stats_add(&agoq_coll_req_stats(g, s->req)->codec_ns, (uint64_t)(agoq_coll_now_ns() - t0));
  agoq_stats_add(&agoq_coll_req_stats(g, s->req)->crc_ns, agoq_frame_crc_ns() - crc0);
  return res;
}

/* A mesh step's reduction on the CPU, done when it returns (nothing when this rank's slice is
 * empty), timed. */
static inline ncclResult_t agoq_coll_step_reduce_now(agoq_coll_comm* g, agoq_coll_slot* s, bool* done,
                                                     ncclResult_t (*reduce)(agoq_coll_comm*, agoq_coll_slot*)) {
  *done = true;
  return s->sl[g->rank] == 0 ? ncclSuccess : agoq_coll_timed(g, s, reduce);
}

#endif
