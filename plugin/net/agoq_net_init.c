/* Plugin lifecycle: init (per communicator on v11+, once per process before), finalize,
 * devices and their properties. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "gpu/agoq_gpu.h"
#include "net/agoq_net_comm.h"
#include "net/agoq_net_config.h"
#include "agoq_codec.h"

const agoq_transport* agoq_net_tp;

static struct {
  pthread_mutex_t mu;
  int live_ctx;         /* contexts handed out and not finalized */
  agoq_ctx* legacy_ctx; /* the one context of v6..v10 */
} agoq_state = {.mu = PTHREAD_MUTEX_INITIALIZER};

static ncclResult_t agoq_ctx_create(uint64_t comm_id, int traffic_class, ncclProfilerCallback_t prof_fn,
                                    agoq_ctx** out) {
  ncclResult_t res = ncclSuccess;
  agoq_ctx* ctx = NULL;
  AGOQ_CALLOC_GOTO(ctx, 1, res, out);
  ctx->magic = AGOQ_CTX_MAGIC;
  ctx->comm_id = comm_id;
  ctx->traffic_class = traffic_class;
  ctx->prof_fn = prof_fn;
  ctx->attr.op = ctx->attr.algo = ctx->attr.proto = UINT32_MAX;
  if (agoq_stats_enabled()) {
    char config[96];
    snprintf(config, sizeof config, "format=%s block=%u min_bytes=%llu",
             agoq_format_name((agoq_format)agoq_typed.format), agoq_typed.block,
             (unsigned long long)agoq_typed.min_bytes);
    ctx->st_send = agoq_stats_open(AGOQ_STATS_P2P_SEND, ctx, -1, -1, config, false);
    ctx->st_recv = agoq_stats_open(AGOQ_STATS_P2P_RECV, ctx, -1, -1, config, false);
  }
  *out = ctx;
out:
  return res;
}

static ncclResult_t agoq_init_common_locked(ncclDebugLogger_t log_fn) {
  if (log_fn != NULL) agoq_log_set_logger(log_fn);
  return agoq_net_config_load(); /* once per process: each WARN once */
}

ncclResult_t agoq_net_init(void** ctx, uint64_t comm_id, int traffic_class, ncclDebugLogger_t log_fn,
                           ncclProfilerCallback_t prof_fn) {
  ncclResult_t res = ncclSuccess;
  agoq_ctx* c = NULL;
  if (ctx == NULL) return ncclInternalError;
  *ctx = NULL;
  pthread_mutex_lock(&agoq_state.mu);
  AGOQ_CHECK_GOTO(agoq_init_common_locked(log_fn), res, out);
  AGOQ_CHECK_GOTO(agoq_ctx_create(comm_id, traffic_class, prof_fn, &c), res, out);
  agoq_state.live_ctx++;
  *ctx = c;
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "init for communicator %016llx (%d active)", (unsigned long long)comm_id,
            agoq_state.live_ctx);
out:
  pthread_mutex_unlock(&agoq_state.mu);
  return res;
}

ncclResult_t agoq_net_finalize(void* ctx) {
  agoq_ctx* c = ctx;
  if (c == NULL) return ncclSuccess; /* NCCL finalizes even after a failed init */
  if (c->magic != AGOQ_CTX_MAGIC) {
    AGOQ_WARN("finalize: not an agoq context (%p)", ctx);
    return ncclInternalError;
  }
  pthread_mutex_lock(&agoq_state.mu);
  c->magic = 0;
  /* Comms closed after finalize keep counting into the entries (never freed). */
  agoq_stats_close(c->st_send);
  agoq_stats_close(c->st_recv);
  free(c);
  if (--agoq_state.live_ctx == 0) {
    /* The last communicator is gone and NCCL may now dlclose us: no thread may outlive
     * it. Comms still open (closed after finalize) keep the threads until their close. */
    agoq_net_tp->idle();
  }
  pthread_mutex_unlock(&agoq_state.mu);
  return ncclSuccess;
}

ncclResult_t agoq_net_legacy_init(ncclDebugLogger_t log_fn, ncclProfilerCallback_t prof_fn) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&agoq_state.mu);
  AGOQ_CHECK_GOTO(agoq_init_common_locked(log_fn), res, out);
  if (agoq_state.legacy_ctx == NULL) {
    /* Before v11 NCCL has no per-communicator init, no comm id and no finalize: one
     * process-wide context; the library destructor stops the threads. */
    AGOQ_CHECK_GOTO(agoq_ctx_create(0, NCCL_NET_TRAFFIC_CLASS_UNDEF, prof_fn, &agoq_state.legacy_ctx), res, out);
  } else if (prof_fn != NULL) {
    agoq_state.legacy_ctx->prof_fn = prof_fn; /* v10: the same callback for every init */
  }
out:
  pthread_mutex_unlock(&agoq_state.mu);
  return res;
}

void* agoq_net_legacy_ctx(void) {
  pthread_mutex_lock(&agoq_state.mu);
  void* c = agoq_state.legacy_ctx;
  pthread_mutex_unlock(&agoq_state.mu);
  return c;
}

ncclResult_t agoq_net_devices(int* ndev) {
  if (ndev == NULL) return ncclInternalError;
  if (!agoq_net_configured()) {
    AGOQ_WARN("devices called before a successful init");
    return ncclInternalError;
  }
  *ndev = agoq_net_tp->ndevs();
  return ncclSuccess;
}

ncclResult_t agoq_net_get_properties(int dev, agoq_net_props* p) {
  if (!agoq_net_configured()) {
    AGOQ_WARN("getProperties: called before a successful init (device %d)", dev);
    return ncclInternalError;
  }
  AGOQ_CHECK(agoq_net_tp->get_properties(dev, p));
  if (agoq_gpu_active()) {
    /* NCCL may now hand over device buffers (with GPUDirect allowed by NCCL_NET_GDR_LEVEL
     * for this GPU and NIC), and a p2p message or CollNet call of any size passes (NCCL
     * 2.28.9 range-checks maxP2pBytes/maxCollBytes and never applies them, sending up to
     * NCCL_MAX_NET_SIZE, 1 GiB): by GPUDirect RDMA, through the pinned staging, or in pieces
     * through a host bounce buffer (agoq_net_device.c, agoq_coll_device.c; over verbs
     * registered for its message), so the transport's figures stand. */
    p->ptr_support |= NCCL_PTR_CUDA;
  } else {
    /* A transport's DMA-BUF support is of no use without the GPU path behind it. */
    p->ptr_support &= ~NCCL_PTR_DMABUF;
  }
  return ncclSuccess;
}

int agoq_net_helper_threads(void) { return agoq_net_configured() ? agoq_net_tp->helper_threads() : 0; }

unsigned agoq_net_conn_fds(unsigned listen_flags) {
  return agoq_net_configured() ? agoq_net_tp->conn_fds(agoq_net_tp_flags(listen_flags)) : 1;
}

bool agoq_net_placement_cpus(int dev, cpu_set_t* out) {
  if (!agoq_net_configured()) {
    CPU_ZERO(out);
    return false;
  }
  return agoq_net_tp->placement_cpus(dev, out);
}

ncclResult_t agoq_net_set_attr(void* ctx, const agoq_net_attr* attr) {
  agoq_ctx* c = ctx;
  if (c == NULL || c->magic != AGOQ_CTX_MAGIC || attr == NULL) return ncclInternalError;
  /* Remembered per communicator: the next isend/irecv on it belongs to this operation. */
  c->attr = *attr;
  return ncclSuccess;
}

/* Without finalize (v6..v10) the process-wide context lives until NCCL unloads us; free it
 * then, so load/unload cycles do not leak. */
__attribute__((destructor)) static void agoq_net_unload(void) {
  pthread_mutex_lock(&agoq_state.mu);
  if (agoq_state.legacy_ctx != NULL) {
    /* Its statistics go out at exit (or now); then the registry may be freed. */
    agoq_stats_at_exit();
    agoq_stats_close(agoq_state.legacy_ctx->st_send);
    agoq_stats_close(agoq_state.legacy_ctx->st_recv);
    agoq_stats_at_exit();
  }
  free(agoq_state.legacy_ctx);
  agoq_state.legacy_ctx = NULL;
  pthread_mutex_unlock(&agoq_state.mu);
}
