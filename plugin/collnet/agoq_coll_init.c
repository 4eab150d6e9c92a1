/* CollNet lifecycle: contexts (per communicator on v11+, one per process before), devices
 * and properties (the net core's), capabilities, memory registration, and the registry of
 * open groups that lets finalize and library unload stop every engine thread. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_schedule.h"
#include "core/agoq_check.h"
#include "core/agoq_params.h"

/* AGOQ_FORMAT's choices are listed in agoq_format order, so the index is the format. */
_Static_assert(AGOQ_FORMAT_NONE == 0 && AGOQ_FORMAT_INT8 == 1 && AGOQ_FORMAT_INT4 == 2 &&
                   AGOQ_FORMAT_FP8E4M3 == 3 && AGOQ_FORMAT_FP8E5M2 == 4,
               "AGOQ_FORMAT choices follow agoq_format");

static struct {
  pthread_mutex_t mu;
  agoq_coll_ctx* legacy;
  agoq_coll_comm* groups; /* open groups */
} agoq_coll_state = {.mu = PTHREAD_MUTEX_INITIALIZER};

static ncclResult_t agoq_coll_config_load(agoq_coll_config* cfg) {
  AGOQ_CHECK(agoq_params_load());
  cfg->format = (agoq_format)agoq_param_int(AGOQ_PARAM_FORMAT);
  cfg->block = AGOQ_CODEC_BLOCK_MIN << agoq_param_int(AGOQ_PARAM_BLOCK); /* 32|64|...|1024 */
  cfg->min_bytes = (uint64_t)agoq_param_int(AGOQ_PARAM_MIN_BYTES);
  long long chunk = agoq_param_int(AGOQ_PARAM_COLLNET_CHUNK);
  cfg->chunk_bytes = chunk < 0 ? 0 : (uint64_t)chunk; /* 0: auto, resolved with the group's grid */
  char why[192];
  if (agoq_coll_grid_parse(agoq_param_str(AGOQ_PARAM_COLLNET_GRID), &cfg->grid_a, &cfg->grid_b, why, sizeof why) != 0) {
    AGOQ_WARN("%s", why);
    return ncclInvalidUsage;
  }
  cfg->timeout_s = (int)agoq_param_int(AGOQ_PARAM_COLLNET_TIMEOUT_S);
  cfg->codec_threads = (int)agoq_param_int(AGOQ_PARAM_COLLNET_CODEC_THREADS);
  cfg->assist = agoq_param_int(AGOQ_PARAM_COLLNET_ASSIST) != 0;
  cfg->gpu_reduce = agoq_param_int(AGOQ_PARAM_COLLNET_GPU) != 0;
  cfg->quant_partials = agoq_param_int(AGOQ_PARAM_COLLNET_PARTIALS) == 1;
  cfg->io_threads = (int)agoq_param_int(AGOQ_PARAM_COLLNET_IO_THREADS);
  return agoq_coll_config_check();
}

ncclResult_t agoq_coll_config_check(void) {
  AGOQ_CHECK(agoq_params_load());
  (void)agoq_coll_min_bytes_check((uint64_t)agoq_param_int(AGOQ_PARAM_MIN_BYTES));
  return ncclSuccess;
}

/* No "compression inactive" line here: at init the environment cannot tell, since a
 * program may enable CollNet through ncclConfig_t.collnetEnable, and NCCL initialises
 * CollNet for every communicator whether or not it uses it. The tuner says it when it is
 * known (agoq_tuner.c agoq_tuner_warn_inactive). */

ncclResult_t agoq_coll_init(void** ctx, uint64_t comm_id, ncclDebugLogger_t log_fn) {
  ncclResult_t res = ncclSuccess;
  agoq_coll_ctx* c = NULL;
  if (ctx == NULL) {
    AGOQ_WARN("CollNet init: NULL context pointer");
    return ncclInternalError;
  }
  *ctx = NULL;
  if (log_fn != NULL) agoq_log_set_logger(log_fn);
  AGOQ_CALLOC_GOTO(c, 1, res, fail);
  c->magic = AGOQ_COLL_CTX_MAGIC;
  /* Same parameter checks as the net init: an invalid AGOQ_* value fails both. */
  AGOQ_CHECK_GOTO(agoq_coll_config_load(&c->cfg), res, fail);
  AGOQ_CHECK_GOTO(agoq_net_init(&c->net_ctx, comm_id, NCCL_NET_TRAFFIC_CLASS_UNDEF, log_fn, NULL), res, fail);
  c->owns_net_ctx = true;
  *ctx = c;
  return ncclSuccess;
fail:
  free(c);
  return res;
}

ncclResult_t agoq_coll_legacy_init(ncclDebugLogger_t log_fn) {
  ncclResult_t res = ncclSuccess;
  agoq_coll_config cfg;
  if (log_fn != NULL) agoq_log_set_logger(log_fn);
  AGOQ_CHECK(agoq_coll_config_load(&cfg));
  AGOQ_CHECK(agoq_net_legacy_init(log_fn, NULL));
  pthread_mutex_lock(&agoq_coll_state.mu);
  if (agoq_coll_state.legacy == NULL) {
    agoq_coll_ctx* c = calloc(1, sizeof *c);
    if (c == NULL) {
      AGOQ_WARN("out of memory allocating the CollNet context");
      res = ncclSystemError;
    } else {
      *c = (agoq_coll_ctx){.magic = AGOQ_COLL_CTX_MAGIC, .net_ctx = agoq_net_legacy_ctx(), .cfg = cfg};
      agoq_coll_state.legacy = c;
    }
  }
  pthread_mutex_unlock(&agoq_coll_state.mu);
  return res;
}

void* agoq_coll_legacy_ctx(void) {
  pthread_mutex_lock(&agoq_coll_state.mu);
  void* c = agoq_coll_state.legacy;
  pthread_mutex_unlock(&agoq_coll_state.mu);
  return c;
}

void agoq_coll_registry_add(agoq_coll_comm* comm) {
  pthread_mutex_lock(&agoq_coll_state.mu);
  comm->reg_next = agoq_coll_state.groups;
  agoq_coll_state.groups = comm;
  pthread_mutex_unlock(&agoq_coll_state.mu);
}

void agoq_coll_registry_remove(agoq_coll_comm* comm) {
  pthread_mutex_lock(&agoq_coll_state.mu);
  for (agoq_coll_comm** pp = &agoq_coll_state.groups; *pp != NULL; pp = &(*pp)->reg_next) {
    if (*pp == comm) {
      *pp = comm->reg_next;
      break;
    }
  }
  pthread_mutex_unlock(&agoq_coll_state.mu);
}

ncclResult_t agoq_coll_finalize(void* ctx) {
  agoq_coll_ctx* c = ctx;
  if (c == NULL) return ncclSuccess; /* NCCL finalizes after a failed init too */
  if (c->magic != AGOQ_COLL_CTX_MAGIC) {
    AGOQ_WARN("CollNet finalize: not an agoq CollNet context (%p)", ctx);
    return ncclInternalError;
  }
  /* NCCL may unload the library once the last communicator is finalized: no engine of
   * this context may run past this point, even if its group is closed only later. The
   * lock is held across the joins: an engine never takes it. */
  pthread_mutex_lock(&agoq_coll_state.mu);
  for (agoq_coll_comm* g = agoq_coll_state.groups; g != NULL; g = g->reg_next) {
    if (g->ctx != c) continue;
    agoq_coll_engine_stop(g);
    agoq_coll_stats_print(g);
  }
  pthread_mutex_unlock(&agoq_coll_state.mu);
  ncclResult_t res = c->owns_net_ctx ? agoq_net_finalize(c->net_ctx) : ncclSuccess;
  c->magic = 0;
  free(c);
  return res;
}

ncclResult_t agoq_coll_devices(int* ndev) {
  if (ndev == NULL) {
    AGOQ_WARN("CollNet devices: NULL output");
    return ncclInternalError;
  }
  return agoq_net_devices(ndev);
}

ncclResult_t agoq_coll_get_properties(int dev, agoq_net_props* props) {
  return agoq_net_get_properties(dev, props);
}

ncclResult_t agoq_coll_reduce_support(int data_type, int red_op, int* supported) {
  if (supported == NULL) {
    AGOQ_WARN("CollNet reduceSupport: NULL output");
    return ncclInternalError;
  }
  /* Every type NCCL has, every op it hands a network (Avg and PreMulSum arrive as Sum). */
  *supported = data_type >= 0 && data_type < ncclNumTypes && red_op >= ncclSum && red_op <= ncclMin;
  return ncclSuccess;
}

static bool agoq_coll_comm_ok(void* coll_comm) {
  agoq_coll_comm* g = coll_comm;
  return g != NULL && g->magic == AGOQ_COLL_COMM_MAGIC;
}

ncclResult_t agoq_coll_reg_mr(void* coll_comm, void* data, size_t size, int type, void** mhandle) {
  ncclResult_t res = ncclSuccess;
  agoq_coll_mr* mr = NULL;
  if (!agoq_coll_comm_ok(coll_comm) || mhandle == NULL) {
    AGOQ_WARN("CollNet regMr: invalid arguments (comm %p)", coll_comm);
    return ncclInternalError;
  }
  *mhandle = NULL;
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    AGOQ_INFO(NCCL_NET | NCCL_REG, "CollNet regMr: memory type %d not supported (host or CUDA memory only)", type);
    return ncclInternalError;
  }
  AGOQ_CALLOC_GOTO(mr, 1, res, fail);
  *mr = (agoq_coll_mr){.magic = AGOQ_COLL_MR_MAGIC, .type = type, .device = -1, .addr = data, .size = size};
  /* The memory type is the handle's: the calls stage the buffers it covers. */
  if (type == NCCL_PTR_CUDA) AGOQ_CHECK_GOTO(agoq_coll_dev_reg(coll_comm, data, size, mr), res, fail);
  /* Host memory the calls send from and receive into directly: registered with the
   * transport now, so that no chunk registers it. */
  if (type == NCCL_PTR_HOST)
    AGOQ_CHECK_GOTO(agoq_net_reg_host(((agoq_coll_comm*)coll_comm)->dev, data, size, &mr->net_key), res, fail);
  *mhandle = mr;
  return ncclSuccess;
fail:
  free(mr);
  return res;
}

ncclResult_t agoq_coll_reg_mr_dmabuf(void* coll_comm, void* data, size_t size, int type,
                                     uint64_t offset, int fd, void** mhandle) {
  (void)offset;
  (void)fd;
  /* CollNet's device buffers are always read and written by the GPU codec, through the
   * pinned staging (agoq_coll_device.c): the dma-buf (advertised for the net path, whose
   * properties CollNet shares, and which NCCL then uses for CollNet too) is not needed. */
  if (type == NCCL_PTR_HOST || type == NCCL_PTR_CUDA) return agoq_coll_reg_mr(coll_comm, data, size, type, mhandle);
  AGOQ_INFO(NCCL_NET | NCCL_REG, "CollNet regMrDmaBuf: memory type %d not supported", type);
  return ncclInternalError;
}

ncclResult_t agoq_coll_dereg_mr(void* coll_comm, void* mhandle) {
  (void)coll_comm;
  agoq_coll_mr* mr = mhandle;
  if (mr == NULL) return ncclSuccess;
  if (mr->magic != AGOQ_COLL_MR_MAGIC) {
    AGOQ_WARN("CollNet deregMr: invalid handle %p", mhandle);
    return ncclInternalError;
  }
  agoq_net_dereg_host(mr->net_key);
  mr->magic = 0;
  free(mr);
  return ncclSuccess;
}

ncclResult_t agoq_coll_iflush(void* coll_comm, void* data, int size, void* mhandle, void** request) {
  bool device = false;
  if (!agoq_coll_comm_ok(coll_comm) || request == NULL || size < 0) {
    AGOQ_WARN("CollNet iflush: invalid arguments (comm %p, size %d)", coll_comm, size);
    return ncclInternalError;
  }
  AGOQ_CHECK(agoq_coll_dev_is_device(mhandle, data, (size_t)size, &device));
  if (!device) {
    /* NCCL flushes only after GPUDirect receives (coll_net.cc: useGdr && needFlush). */
    AGOQ_WARN("CollNet iflush of %p: not in a device registration (handle %p)", data, mhandle);
    return ncclInternalError;
  }
  /* test() said done only once the copy into this buffer had completed: the bytes are
   * visible to the GPU already, and NCCL takes a NULL request as done. */
  *request = NULL;
  return ncclSuccess;
}

/* Without finalize (v6..v10) groups NCCL never closed would keep their engine threads
 * running in unmapped code after dlclose: stop them here, and free the legacy context. */
__attribute__((destructor)) static void agoq_coll_unload(void) {
  pthread_mutex_lock(&agoq_coll_state.mu);
  for (agoq_coll_comm* g = agoq_coll_state.groups; g != NULL; g = g->reg_next) agoq_coll_engine_stop(g);
  free(agoq_coll_state.legacy);
  agoq_coll_state.legacy = NULL;
  pthread_mutex_unlock(&agoq_coll_state.mu);
}
