/*
 * agoq-perf p2p with a datatype (--dtype): the sender drives the plugin the way NCCL 2.28
 * does when agoq's profiler is loaded: every isend carries the profiler handle of a ProxyStep
 * of a P2p task (or of a collective's ring, --traffic coll), created through the emulated
 * NCCL profiler plumbing (tools/common/agoq_nccl_emul.h) on the plugin's own ncclProfiler
 * table; with --oracle none no profiler is loaded (NCCL's callback does nothing). The
 * receiver checks the warm-up messages against the sender's data: bit for bit, or the
 * relative L2 error of a quantized payload. The plugin's p2p statistics (AGOQ_STATS=1)
 * give the bytes that went on the wire.
 */
#ifndef AGOQ_PERF_P2P_TYPED_H
#define AGOQ_PERF_P2P_TYPED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perf.h"

#define P2P_TYPED_MAX_SLOTS 32

typedef struct agoq_emul_comm agoq_emul_comm;
typedef struct agoq_emul_task agoq_emul_task;
typedef struct agoq_emul_op agoq_emul_op;

typedef struct {
  int dtype;  /* ncclDataType_t, -1: untyped bytes */
  bool oracle; /* agoq's profiler through the emulated chain (else: no profiler) */
  bool coll;   /* the transfers are a collective's ring traffic */
  int flow;    /* perf_p2p_flow (--flow): the Recv task started with each send */
  agoq_emul_comm* emul;
  agoq_emul_task* task[P2P_TYPED_MAX_SLOTS];
  agoq_emul_op* op[P2P_TYPED_MAX_SLOTS];
  uint8_t* expect; /* receiver: the sender's data of one message */
  /* Receiver's verdict over the checked messages. */
  double rel_l2_max;
  bool all_exact;
  uint64_t checked;
} p2p_typed;

/* Sets the plugin's environment before it is loaded (AGOQ_P2P_FORMAT from `format`,
 * AGOQ_STATS=1): call before perf_net_open. */
void p2p_typed_env(const char* format);
/* The logger to hand the plugin: agoq_log_stderr, plus it keeps the p2p statistics and the
 * data sockets per connection the plugin chose. */
ncclDebugLogger_t p2p_typed_logger(void);
/* Data sockets per connection from the plugin's init line (0: it has not said). */
unsigned p2p_typed_nsocks(void);
/* The verbs transport's port and queue pairs from its init line, NULL when it carries no
 * data (TCP). */
const char* p2p_typed_verbs(void);
/* The callback to hand the plugin's init: the emulated NCCL's (a no-op without profiler). */
ncclProfilerCallback_t p2p_typed_callback(void);
/* Rank 0: the plugin's profiler table and one emulated communicator. */
int p2p_typed_open(p2p_typed* t, perf_net* n, uint64_t comm_id, size_t max_bytes, int rank);
void p2p_typed_close(p2p_typed* t);
/* The message's profiler handle (NULL for untyped runs); end after it completed. */
void* p2p_typed_begin(p2p_typed* t, int slot, size_t size, size_t transfer);
void p2p_typed_end(p2p_typed* t, int slot);
/* Data of a message: deterministic per (size, slot). */
void p2p_typed_fill(const p2p_typed* t, uint8_t* buf, size_t size, uint64_t seed);
/* Receiver: compares bytes [off, off + len) of a transfer of `size` bytes with what the
 * sender filled. */
void p2p_typed_check(p2p_typed* t, const uint8_t* buf, size_t len, uint64_t seed, size_t off, size_t size);
/* After the plugin was closed: bytes in / on the wire of its frames (0 when none). */
void p2p_typed_wire(uint64_t* frames, double* in_mib, double* wire_mib, uint64_t* unknown);
/* The sender's oracle queries and their mean cost inside isend (plugin statistics). */
void p2p_typed_oracle(uint64_t* queries, double* ns_each);

#endif
