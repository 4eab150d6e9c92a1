/*
 * An emulation of NCCL's profiler plumbing (NCCL 2.28.9 src/plugin/profiler.cc), for tests
 * and agoq-perf: it drives a loaded ncclProfiler_v5/v6 table exactly as NCCL does and
 * provides the ncclProfilerCallback_t that NCCL hands to the net plugin, so the net side's
 * isend/irecv can run their type-oracle query against a real profiler chain without NCCL.
 *
 * What is emulated, in NCCL's order:
 *  - comm create: init(&ctx, commId, &mask, ...). A failed init leaves ctx NULL and NCCL
 *    carries on calling the profiler with it (so does this).
 *  - task start (the plan's host callback): a Coll or P2p event whose descriptor holds
 *    NCCL's strings ("ncclBfloat16", "Send", "RING", "SIMPLE"; 2.28.9 prints "Unknown" for
 *    ncclUint8), if the mask sampled at enqueue enables it.
 *  - task stop: right after the proxy ops are posted, usually before the proxy thread has
 *    started them; the task object stays usable for agoq_emul_op_start until freed.
 *  - proxy op start with parent = the task's handle (pid, channel, peer, nSteps, chunkSize,
 *    isSend), step start with parent = the op's handle into pHandles[step % 8], the net
 *    plugin callback (start: a NetPlugin event whose parent is the step's handle), and the
 *    stops.
 * The event mask is per emulated communicator (NCCL keeps one per process; every init
 * writes the same value). Objects of one communicator may be used from several threads as
 * long as each task/op is driven by one thread at a time.
 */
#ifndef AGOQ_NCCL_EMUL_H
#define AGOQ_NCCL_EMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "abi/agoq_nccl_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AGOQ_EMUL_NCCL_STEPS 8 /* NCCL_STEPS: pHandles per proxy sub */

typedef struct agoq_emul_comm agoq_emul_comm;
typedef struct agoq_emul_task agoq_emul_task;
typedef struct agoq_emul_op agoq_emul_op;

/* The logger the profiler's init gets (NCCL passes the same one to every plugin of the
 * library; default agoq_log_stderr). Set it before agoq_emul_comm_create. */
void agoq_emul_set_logger(ncclDebugLogger_t log);

/* profiler_table: const ncclProfiler_v5_t* (version 5) or const ncclProfiler_v6_t*
 * (version 6), e.g. from dlsym(lib, "ncclProfiler_v5"); NULL emulates NCCL without a
 * profiler (no events; the callback does nothing). NULL only on allocation failure or a
 * bad version. */
agoq_emul_comm* agoq_emul_comm_create(const void* profiler_table, int version, uint64_t comm_id,
                                      int nranks, int rank);
/* finalize(ctx) when init gave one, then frees. All tasks and ops must be gone. */
void agoq_emul_comm_destroy(agoq_emul_comm* comm);
ncclResult_t agoq_emul_comm_init_result(const agoq_emul_comm* comm);
int agoq_emul_comm_mask(const agoq_emul_comm* comm);       /* what init set */
void* agoq_emul_comm_context(const agoq_emul_comm* comm);  /* the profiler's ctx */

/* ncclSend (send) / ncclRecv of `count` elements of ncclDataType_t `dtype`. */
agoq_emul_task* agoq_emul_p2p_start(agoq_emul_comm* comm, bool send, int dtype, size_t count,
                                    int peer, int nchannels);
/* Same with NCCL's strings given directly (tests of strings NCCL might print). */
agoq_emul_task* agoq_emul_p2p_start_str(agoq_emul_comm* comm, const char* func,
                                        const char* datatype, size_t count, int peer,
                                        int nchannels);
/* A collective: func "AllReduce", ...; algo "RING", ...; proto "LL", "LL128", "SIMPLE". */
agoq_emul_task* agoq_emul_coll_start(agoq_emul_comm* comm, const char* func, int dtype,
                                     size_t count, const char* algo, const char* proto);
/* The handle the profiler returned for the task (NULL: not tracked). */
void* agoq_emul_task_handle(const agoq_emul_task* task);
/* ncclProfilerStopTaskEvents; idempotent. Ops may still be started from the task. */
void agoq_emul_task_stop(agoq_emul_task* task);
/* Stops the event if still running and frees the task. */
void agoq_emul_task_free(agoq_emul_task* task);

/* A proxy op of the task on `channel`. Its peer and direction are the task's for p2p and
 * (rank + 1) % nranks / send for a collective; nsteps and chunk go into the descriptor. */
agoq_emul_op* agoq_emul_op_start(agoq_emul_task* task, int channel, int nsteps, int chunk);

/* Everything NCCL puts in a ProxyOp descriptor, for tests that need odd values. */
typedef struct {
  int channel, nsteps, chunk;
  int peer;
  int is_send;
  pid_t pid;            /* 0: this process's (as NCCL records it) */
  bool override_parent; /* use `parent` instead of the task's handle (foreign parents) */
  void* parent;
} agoq_emul_op_args;
agoq_emul_op* agoq_emul_op_start_ex(agoq_emul_task* task, const agoq_emul_op_args* args);
void* agoq_emul_op_handle(const agoq_emul_op* op);

/* Starts ProxyStep `step` (NCCL: pHandles[step % 8]) and returns the phandle that NCCL
 * passes to isend/irecv for it. */
void* agoq_emul_step_phandle(agoq_emul_op* op, int step);
/* The profiler's handle for the step's event (NULL: not tracked). */
void* agoq_emul_step_handle(const agoq_emul_op* op, int step);
void agoq_emul_step_stop(agoq_emul_op* op, int step);
/* Stops the op's event (and any step still running) and frees the op. */
void agoq_emul_op_stop(agoq_emul_op* op);

/* NCCL's ncclProfilerCallback: what the net plugin's init receives. */
ncclProfilerCallback_t agoq_emul_callback(void);

/* The string NCCL 2.28.9 prints for a datatype ("ncclFloat32"; "Unknown" for ncclUint8 and
 * anything out of range). */
const char* agoq_emul_dtype_string(int dtype);

#ifdef __cplusplus
}
#endif
#endif
