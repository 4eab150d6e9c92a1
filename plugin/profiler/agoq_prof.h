/*
 * agoq's profiler core, shared by plugin/profiler/ and the exported ncclProfiler_v5/v6
 * tables (plugin/tables/agoq_profiler_tables.c). Version-neutral: the tables unpack NCCL's
 * descriptor and call one start function per event type.
 *
 * What it tracks, and how:
 *  - Coll task: no object. The handle is a static sentinel that encodes the protocol and
 *    datatype, so a ProxyOp under it knows it carries collective traffic.
 *  - P2p task, ProxyOp, ProxyStep: one 64-byte object each from a per-context fixed pool.
 *    A child copies what it learned from its parent when it starts (NCCL stops the task
 *    event right after posting the proxy ops, before the proxy thread starts them), so no
 *    object depends on its parent's lifetime.
 *  - NetPlugin: the net side's agoq_xfer_desc is filled from the step's copy; the handle
 *    is a static sentinel.
 * A parent pointer is trusted only if it lies inside this context's pool of the right
 * kind, at an object boundary, with the right magic; anything else (another profiler's
 * handle, another process's under PXN, NULL) makes the transfer unknown.
 */
#ifndef AGOQ_PROF_H
#define AGOQ_PROF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "abi/agoq_nccl_common.h"
#include "abi/agoq_nccl_profiler_v5.h" /* event-type bits: the same in every version */
#include "profiler/agoq_oracle.h"

#define AGOQ_PROF_NAME "AGOQ"

/* Pool sizes per communicator (powers of two). Generous so that a stopped P2p object is
 * not recycled before the proxy thread has started its ops: that would take 4096 later
 * p2p tasks of the same communicator in between. 16384 x 64 B = 1 MiB per communicator. */
#define AGOQ_PROF_P2P_POOL 16384u
#define AGOQ_PROF_OP_POOL 4096u
#define AGOQ_PROF_STEP_POOL 8192u
/* A stopped P2p object is not reused for this long: NCCL may stop a task's event before
 * the proxy thread starts its ops (hostStreamPlanTask), and an op that started after its
 * task's slot was taken by another p2p with the same peer and direction would read the
 * wrong datatype. Ring order alone bounds that by 16384 later tasks, which a preempted
 * thread can see on a busy host; the quarantine bounds it by time as well (the proxy picks
 * up posted ops within its loop, far inside 2 s). Sustained rates above 16384 p2p per 2 s
 * per communicator find no free slot: those transfers are unknown, i.e. exact. */
#define AGOQ_PROF_P2P_QUARANTINE_MS 2000u
/* Slots a start tries before giving up (pool full: the transfer is simply unknown). */
#define AGOQ_PROF_ALLOC_PROBES 64u
/* The most channels NCCL uses for one p2p peer (MAXCHANNELS): the LL bound below. */
#define AGOQ_PROF_MAX_P2P_CHANNELS 64
#define AGOQ_PROF_P2P_LL_THRESHOLD_DEFAULT 16384

typedef enum {
  AGOQ_PROF_OBJ_P2P = 0,
  AGOQ_PROF_OBJ_OP = 1,
  AGOQ_PROF_OBJ_STEP = 2,
  AGOQ_PROF_OBJ_KINDS = 3
} agoq_prof_obj_kind;

/* What a chain link knows about its transfer. */
typedef struct {
  agoq_xfer_kind kind;
  int dtype; /* ncclDataType_t, -1 unknown */
  agoq_xfer_proto proto;
  int is_send; /* 1 send, 0 recv */
  int peer;
  uint64_t task_bytes;
} agoq_prof_info;

/* One pool object. `magic` is written once at context creation and only read afterwards;
 * everything else is atomic: `busy` claims the slot, and `seq` is a sequence lock around
 * info/bytes so a reader that races with a recycling writer sees a changed sequence and
 * reports "unknown" instead of a torn mix. */
typedef struct {
  _Alignas(64) uint32_t magic;
  _Atomic uint32_t busy;
  _Atomic uint32_t seq; /* odd while being written; 0: never written */
  /* 1 once stopEvent has freed it: released_ms is then valid. A flag of its own, so that
   * no value of the clock (0, an even or odd millisecond) is mistaken for "never freed". */
  _Atomic uint32_t released;
  _Atomic uint64_t info;
  _Atomic uint64_t bytes;
  _Atomic uint64_t released_ms; /* the quarantine clock when stopEvent freed it */
} agoq_prof_obj;

typedef struct {
  agoq_prof_obj* objs;
  uint32_t n; /* power of two */
  uint32_t magic;
  uint32_t quarantine_ms; /* 0: a stopped object is free at once */
  _Alignas(64) _Atomic uint32_t cursor; /* next slot in ring order; own cache line */
} agoq_prof_pool;

/* The receives a communicator has carried, for AGOQ_P2P_SCOPE=pipeline: a send is two-way
 * (pipeline activations one way, their gradients the other, same shape) when a receive of
 * the same datatype and task bytes from the same peer was seen. A key packs
 * (bytes, dtype, peer) exactly, so two different receives never share a key and a lookup
 * never says "two-way" for a flow that was not seen (rule 1: a wrong yes would make a
 * one-way send lossy). 64 slots written round-robin: a pipeline stage has a handful of
 * distinct shapes per peer; when more are live the oldest are forgotten, and their sends
 * go exact until the next receive records them again. */
#define AGOQ_PROF_FLOW_SLOTS 64u
#define AGOQ_PROF_FLOW_PEER_BITS 20
#define AGOQ_PROF_FLOW_DTYPE_BITS 4
#define AGOQ_PROF_FLOW_BYTES_BITS 40
typedef struct {
  /* 0: empty (no key is 0: bytes > 0). Written by the user thread that starts the Recv P2p
   * event, read by proxy threads at the net event: atomics, release/acquire. */
  _Atomic uint64_t keys[AGOQ_PROF_FLOW_SLOTS];
  _Atomic uint32_t cursor; /* next slot to write, modulo AGOQ_PROF_FLOW_SLOTS */
} agoq_prof_flows;

typedef struct {
  uint32_t magic; /* AGOQ_PROF_CTX_MAGIC while alive */
  uint64_t comm_id;
  int rank, nranks, nnodes;
  agoq_prof_pool pools[AGOQ_PROF_OBJ_KINDS];
  agoq_prof_flows flows;
} agoq_prof_ctx;

#define AGOQ_PROF_CTX_MAGIC 0x43505141u /* "AQPC" */

/* ---- pools (agoq_prof_pool.c) ---- */
/* The quarantine's clock, in milliseconds (CLOCK_MONOTONIC_COARSE by default). Tests
 * install their own so that no result depends on real time or on the clock's
 * granularity; NULL restores the default. Process-wide. */
typedef uint64_t (*agoq_prof_clock_fn)(void);
void agoq_prof_clock_set(agoq_prof_clock_fn fn);
/* True when an object freed at `released_ms` may be reused at `now_ms`: only once
 * now_ms >= released_ms + quarantine_ms. A clock that reads earlier than the stamp (another
 * thread's later release, a test clock moved back) means "not yet", never "long ago". */
bool agoq_prof_quarantine_over(uint64_t released_ms, uint64_t now_ms, uint32_t quarantine_ms);
/* The magic of each kind's objects. */
uint32_t agoq_prof_magic(agoq_prof_obj_kind kind);
ncclResult_t agoq_prof_pool_init(agoq_prof_pool* p, uint32_t n, uint32_t magic);
void agoq_prof_pool_fini(agoq_prof_pool* p);
/* A free slot in ring order, claimed; NULL when AGOQ_PROF_ALLOC_PROBES slots were busy. */
agoq_prof_obj* agoq_prof_pool_alloc(agoq_prof_pool* p);
/* `ptr` as one of this pool's objects, or NULL; never dereferences a pointer outside. */
agoq_prof_obj* agoq_prof_pool_find(const agoq_prof_pool* p, const void* ptr);
/* Writes info under the sequence lock (the caller owns the claimed object). */
void agoq_prof_obj_publish(agoq_prof_obj* o, const agoq_prof_info* info);
/* Reads a consistent copy; false while being written, never written, or torn. */
bool agoq_prof_obj_read(const agoq_prof_obj* o, agoq_prof_info* info);
/* Marks a stopped object free (the magic must match one of the kinds). */
void agoq_prof_obj_release(agoq_prof_obj* o);
/* True when `ptr` looks like any pool object (by its magic): only for handles NCCL got
 * from us, which stopEvent receives. */
bool agoq_prof_obj_is_ours(const void* ptr);

/* ---- two-way flows (agoq_prof_flow.c) ---- */
/* The key of a p2p task of `bytes` bytes of ncclDataType_t `dtype` with `peer`: bytes in
 * the top 40 bits, dtype in the next 4, peer in the low 20. False (no key) when a field
 * does not fit or bytes is 0: such a task is simply not recorded, and a send that has no
 * key is never two-way. */
bool agoq_prof_flow_key(int peer, int dtype, uint64_t bytes, uint64_t* key);
/* Records a receive's key (once: a key already present is not written again, so a
 * pipeline's repeated receives do not push other flows out). */
void agoq_prof_flow_record(agoq_prof_flows* f, uint64_t key);
/* True when `key` was recorded and not yet overwritten. */
bool agoq_prof_flow_seen(const agoq_prof_flows* f, uint64_t key);

/* ---- parsing NCCL's strings (agoq_prof_parse.c) ---- */
/* "ncclFloat32" -> ncclFloat32, ...; -1 for anything else (2.28 prints "Unknown" for
 * ncclUint8). */
int agoq_prof_parse_dtype(const char* s);
size_t agoq_prof_dtype_size(int dtype);
/* "LL" / "LL128" / "SIMPLE" (or "Simple") -> the xfer proto; UNKNOWN otherwise. */
agoq_xfer_proto agoq_prof_parse_proto(const char* s);
/* "Send" -> 1, "Recv" -> 0, else -1. */
int agoq_prof_parse_p2p_func(const char* s);

/* ---- lifecycle (agoq_prof_init.c) ---- */
ncclResult_t agoq_prof_init(void** ctx, uint64_t comm_id, int* activation_mask,
                            const char* comm_name, int nnodes, int nranks, int rank,
                            ncclDebugLogger_t log_fn);
ncclResult_t agoq_prof_finalize(void* ctx);
/* The live context behind NCCL's `context` argument, or NULL. */
agoq_prof_ctx* agoq_prof_ctx_get(void* ctx);
/* getpid() of the process that initialised the profiler, 0 before any init. */
pid_t agoq_prof_pid(void);
/* Largest p2p task (bytes) NCCL may send with LL: 64 x NCCL_P2P_LL_THRESHOLD. */
uint64_t agoq_prof_ll_limit(void);

/* ---- events (agoq_prof_events.c): each returns the handle for *eHandle ---- */
void* agoq_prof_start_coll(void* ctx, const char* datatype, const char* proto);
/* A collective API call: remembered for the tuner (agoq_prof_api.h); no handle. */
void* agoq_prof_start_coll_api(void* ctx, const char* func, const char* datatype, size_t count);
void* agoq_prof_start_p2p(void* ctx, const char* func, const char* datatype, size_t count,
                          int peer);
void* agoq_prof_start_op(void* ctx, const void* parent, pid_t pid, int peer, int is_send);
void* agoq_prof_start_step(void* ctx, const void* parent);
void* agoq_prof_start_net(void* ctx, const void* parent, int64_t plugin_id, void* data);
ncclResult_t agoq_prof_stop(void* handle);

#endif
