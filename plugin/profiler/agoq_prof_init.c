/* Profiler lifecycle: one context per communicator (init/finalize), the process-wide facts
 * the event handlers need (our pid, the LL bound) and the "profiler loaded" flag the net
 * side reads once. */
#include <stdlib.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_nccl_env.h"
#include "profiler/agoq_prof.h"

static _Atomic int agoq_prof_loaded;     /* an init succeeded in this process */
static _Atomic int agoq_prof_announced;  /* the one INFO line was printed */
static _Atomic int agoq_prof_pid_value;  /* getpid() at the first init */
static _Atomic uint64_t agoq_prof_ll_bytes =
    (uint64_t)AGOQ_PROF_MAX_P2P_CHANNELS * AGOQ_PROF_P2P_LL_THRESHOLD_DEFAULT;

bool agoq_oracle_profiler_loaded(void) {
  return atomic_load_explicit(&agoq_prof_loaded, memory_order_acquire) != 0;
}

pid_t agoq_prof_pid(void) {
  return (pid_t)atomic_load_explicit(&agoq_prof_pid_value, memory_order_relaxed);
}

uint64_t agoq_prof_ll_limit(void) {
  return atomic_load_explicit(&agoq_prof_ll_bytes, memory_order_relaxed);
}

/* NCCL sends a p2p task with LL when its bytes are at most p2pnChannelsPerPeer x
 * NCCL_P2P_LL_THRESHOLD (enqueue.cc addP2pToPlan). No profiler event says which protocol a
 * p2p used: the P2p, ProxyOp and ProxyStep descriptors and the step's state args of
 * ncclProfiler_v5 (2.28) and v6 (2.29+) carry no protocol, only the Coll event does; and
 * the P2p event's nChannels is the count NCCL chose for the task, not the
 * p2pnChannelsPerPeer of the bound. So the bound is derived, with the largest channel
 * count NCCL allows: a task called SIMPLE here is SIMPLE whatever the channel count. The
 * threshold is read exactly as NCCL_PARAM reads it (agoq_nccl_env.h): "1048576 " is
 * 1048576, "abc" is 0; with a threshold <= 0 NCCL sends nothing non-empty as LL. */
static void agoq_prof_read_ll_threshold(void) {
  int64_t thr = agoq_nccl_param("NCCL_P2P_LL_THRESHOLD", AGOQ_PROF_P2P_LL_THRESHOLD_DEFAULT);
  uint64_t limit = thr <= 0 ? 0 : (uint64_t)thr * AGOQ_PROF_MAX_P2P_CHANNELS;
  if (thr > 0 && limit / AGOQ_PROF_MAX_P2P_CHANNELS != (uint64_t)thr) limit = UINT64_MAX;
  atomic_store_explicit(&agoq_prof_ll_bytes, limit, memory_order_relaxed);
}

ncclResult_t agoq_prof_init(void** ctx, uint64_t comm_id, int* activation_mask,
                            const char* comm_name, int nnodes, int nranks, int rank,
                            ncclDebugLogger_t log_fn) {
  ncclResult_t res = ncclSuccess;
  agoq_prof_ctx* c = NULL;
  if (log_fn != NULL) agoq_log_set_logger(log_fn);
  AGOQ_ARG_CHECK(ctx != NULL && activation_mask != NULL, res, fail);
  *ctx = NULL;
  AGOQ_CALLOC_GOTO(c, 1, res, fail);
  static const uint32_t sizes[AGOQ_PROF_OBJ_KINDS] = {
      [AGOQ_PROF_OBJ_P2P] = AGOQ_PROF_P2P_POOL,
      [AGOQ_PROF_OBJ_OP] = AGOQ_PROF_OP_POOL,
      [AGOQ_PROF_OBJ_STEP] = AGOQ_PROF_STEP_POOL,
  };
  for (int k = 0; k < AGOQ_PROF_OBJ_KINDS; k++)
    AGOQ_CHECK_GOTO(agoq_prof_pool_init(&c->pools[k], sizes[k],
                                        agoq_prof_magic((agoq_prof_obj_kind)k)),
                    res, fail);
  c->pools[AGOQ_PROF_OBJ_P2P].quarantine_ms = AGOQ_PROF_P2P_QUARANTINE_MS;
  c->comm_id = comm_id;
  c->rank = rank;
  c->nranks = nranks;
  c->nnodes = nnodes;
  c->magic = AGOQ_PROF_CTX_MAGIC;

  agoq_prof_read_ll_threshold();
  atomic_store_explicit(&agoq_prof_pid_value, (int)getpid(), memory_order_relaxed);
  /* Exactly the NetPlugin bit: NCCL then also creates the Coll/P2p task, ProxyOp and
   * ProxyStep events the chain needs (their enable tests include NetPlugin), and nothing
   * else that costs (no kernel-channel timestamps, no proxy-control events). */
  *activation_mask = ncclProfileNetPlugin;
  atomic_store_explicit(&agoq_prof_loaded, 1, memory_order_release);
  if (atomic_exchange(&agoq_prof_announced, 1) == 0)
    AGOQ_INFO(NCCL_INIT | NCCL_PROFILE,
              "profiler %s loaded: p2p type oracle active (net transfers learn their "
              "datatype; p2p tasks up to %llu bytes count as LL)",
              AGOQ_PROF_NAME, (unsigned long long)agoq_prof_ll_limit());
  AGOQ_TRACE(NCCL_PROFILE, "profiler context %p for comm %llx \"%s\" rank %d/%d", (void*)c,
             (unsigned long long)comm_id, comm_name != NULL ? comm_name : "", rank, nranks);
  *ctx = c;
  return ncclSuccess;
fail:
  if (c != NULL) {
    for (int k = 0; k < AGOQ_PROF_OBJ_KINDS; k++) agoq_prof_pool_fini(&c->pools[k]);
    free(c);
  }
  return res;
}

agoq_prof_ctx* agoq_prof_ctx_get(void* ctx) {
  agoq_prof_ctx* c = ctx;
  return c != NULL && c->magic == AGOQ_PROF_CTX_MAGIC ? c : NULL;
}

ncclResult_t agoq_prof_finalize(void* ctx) {
  agoq_prof_ctx* c = agoq_prof_ctx_get(ctx);
  if (c == NULL) return ncclSuccess; /* init failed: NCCL may still finalize */
  c->magic = 0;
  for (int k = 0; k < AGOQ_PROF_OBJ_KINDS; k++) agoq_prof_pool_fini(&c->pools[k]);
  free(c);
  return ncclSuccess;
}
