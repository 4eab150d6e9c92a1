/*
 * The exported ncclCollNetPlugin_v6..v12 tables. CollNet has no engine yet: init
 * succeeds and devices() reports 0, which makes NCCL disable CollNet and keep using the
 * net tables. NCCL never calls the rest with 0 devices; if something does, it gets a
 * WARN and ncclInternalError. One function per distinct signature, so the collectives
 * work replaces bodies here, not table layouts.
 */
#include <stddef.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "net/agoq_net.h"
#include "tables/agoq_tables.h"

static ncclResult_t agoq_coll_unavailable(const char* what) {
  AGOQ_WARN("CollNet not available in this build (%s)", what);
  return ncclInternalError;
}

/* ---- lifecycle ---- */

/* Same configuration checks as the net init: an invalid AGOQ_* value fails both, so
 * NCCL never runs half of agoq. */
static ncclResult_t agoq_coll_init_log(ncclDebugLogger_t log_fn) {
  if (log_fn != NULL) agoq_log_set_logger(log_fn);
  return agoq_params_load();
}

static ncclResult_t agoq_coll_init_comm(void** ctx, uint64_t comm_id, ncclDebugLogger_t log_fn) {
  if (ctx == NULL) {
    AGOQ_WARN("CollNet init: NULL context pointer");
    return ncclInternalError;
  }
  *ctx = NULL;
  return agoq_coll_init_log(log_fn);
}

static ncclResult_t agoq_coll_devices(int* ndev) {
  if (ndev == NULL) {
    AGOQ_WARN("CollNet devices: NULL output");
    return ncclInternalError;
  }
  *ndev = 0;
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet: 0 devices (not available in this build)");
  return ncclSuccess;
}

/* NCCL calls it after a failed init too; the context is always NULL for now. */
static ncclResult_t agoq_coll_finalize(void* ctx) { return ncclSuccess; }

/* ---- per-version properties and listen ---- */

#define AGOQ_COLL_GET_PROPERTIES(V)                                                    \
  static ncclResult_t agoq_coll_get_properties_##V(int dev, ncclNetProperties_##V##_t* props) { \
    return agoq_coll_unavailable("getProperties");                                     \
  }
AGOQ_COLL_GET_PROPERTIES(v6)
AGOQ_COLL_GET_PROPERTIES(v7)
AGOQ_COLL_GET_PROPERTIES(v8)
AGOQ_COLL_GET_PROPERTIES(v9) /* also v10 */
AGOQ_COLL_GET_PROPERTIES(v11)
AGOQ_COLL_GET_PROPERTIES(v12)
#undef AGOQ_COLL_GET_PROPERTIES

static ncclResult_t agoq_coll_listen_legacy(int dev, void* handle, void** listen_comm) {
  return agoq_coll_unavailable("listen");
}

static ncclResult_t agoq_coll_listen_ctx(void* ctx, int dev, void* handle, void** listen_comm) {
  return agoq_coll_unavailable("listen");
}

/* ---- group setup and memory registration ---- */

static ncclResult_t agoq_coll_connect(void* handles[], int nranks, int rank, void* listen_comm,
                                      void** coll_comm) {
  return agoq_coll_unavailable("connect");
}

static ncclResult_t agoq_coll_reduce_support(ncclDataType_t data_type, ncclRedOp_t red_op,
                                             int* supported) {
  return agoq_coll_unavailable("reduceSupport");
}

static ncclResult_t agoq_coll_reg_mr_int(void* coll_comm, void* data, int size, int type,
                                         void** mhandle) {
  return agoq_coll_unavailable("regMr");
}

static ncclResult_t agoq_coll_reg_mr(void* coll_comm, void* data, size_t size, int type,
                                     void** mhandle) {
  return agoq_coll_unavailable("regMr");
}

static ncclResult_t agoq_coll_reg_mr_dmabuf(void* coll_comm, void* data, size_t size, int type,
                                            uint64_t offset, int fd, void** mhandle) {
  return agoq_coll_unavailable("regMrDmaBuf");
}

static ncclResult_t agoq_coll_dereg_mr(void* coll_comm, void* mhandle) {
  return agoq_coll_unavailable("deregMr");
}

/* ---- collectives ---- */

static ncclResult_t agoq_coll_iallreduce_int(void* coll_comm, void* send_data, void* recv_data,
                                             int count, ncclDataType_t data_type,
                                             ncclRedOp_t red_op, void* send_mhandle,
                                             void* recv_mhandle, void** request) {
  return agoq_coll_unavailable("iallreduce");
}

static ncclResult_t agoq_coll_iallreduce(void* coll_comm, void* send_data, void* recv_data,
                                         size_t count, ncclDataType_t data_type,
                                         ncclRedOp_t red_op, void* send_mhandle,
                                         void* recv_mhandle, void** request) {
  return agoq_coll_unavailable("iallreduce");
}

static ncclResult_t agoq_coll_iallgather_v8(void* coll_comm, void* send_data, int n_recv_parts,
                                            ncclNetSGE_v8_t* recv_parts, size_t bytes_per_rank,
                                            size_t window_offset, size_t window_bytes,
                                            void* send_mhandle, void** request) {
  return agoq_coll_unavailable("iallgather");
}

static ncclResult_t agoq_coll_iallgather(void* coll_comm, void* send_data, int n_recv_parts,
                                         ncclNetSGE_v9_t* recv_parts, size_t bytes_per_rank,
                                         size_t window_offset, size_t window_bytes,
                                         void* send_mhandle, void** request) {
  return agoq_coll_unavailable("iallgather");
}

static ncclResult_t agoq_coll_ireducescatter_v8(void* coll_comm, int n_send_parts,
                                                ncclNetSGE_v8_t* send_parts, void* recv_data,
                                                size_t bytes_per_rank, size_t window_offset,
                                                size_t window_bytes, ncclDataType_t data_type,
                                                ncclRedOp_t red_op, void* recv_mhandle,
                                                void** request) {
  return agoq_coll_unavailable("ireducescatter");
}

static ncclResult_t agoq_coll_ireducescatter(void* coll_comm, int n_send_parts,
                                             ncclNetSGE_v9_t* send_parts, void* recv_data,
                                             size_t bytes_per_rank, size_t window_offset,
                                             size_t window_bytes, ncclDataType_t data_type,
                                             ncclRedOp_t red_op, void* recv_mhandle,
                                             void** request) {
  return agoq_coll_unavailable("ireducescatter");
}

static ncclResult_t agoq_coll_iflush(void* coll_comm, void* data, int size, void* mhandle,
                                     void** request) {
  return agoq_coll_unavailable("iflush");
}

static ncclResult_t agoq_coll_test(void* request, int* done, int* size) {
  return agoq_coll_unavailable("test");
}

static ncclResult_t agoq_coll_close_coll(void* coll_comm) {
  return agoq_coll_unavailable("closeColl");
}

static ncclResult_t agoq_coll_close_listen(void* listen_comm) {
  return agoq_coll_unavailable("closeListen");
}

/* ---- the tables ---- */

AGOQ_EXPORT const ncclCollNet_v6_t ncclCollNetPlugin_v6 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_log,
    .devices = agoq_coll_devices,
    .getProperties = agoq_coll_get_properties_v6,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_reduce_support,
    .regMr = agoq_coll_reg_mr_int,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce_int,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
};

AGOQ_EXPORT const ncclCollNet_v7_t ncclCollNetPlugin_v7 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_log,
    .devices = agoq_coll_devices,
    .getProperties = agoq_coll_get_properties_v7,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_reduce_support,
    .regMr = agoq_coll_reg_mr_int,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce_int,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
};

AGOQ_EXPORT const ncclCollNet_v8_t ncclCollNetPlugin_v8 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_log,
    .devices = agoq_coll_devices,
    .getProperties = agoq_coll_get_properties_v8,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce_int,
    .iallgather = agoq_coll_iallgather_v8,
    .ireducescatter = agoq_coll_ireducescatter_v8,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
};

AGOQ_EXPORT const ncclCollNet_v9_t ncclCollNetPlugin_v9 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_log,
    .devices = agoq_coll_devices,
    .getProperties = agoq_coll_get_properties_v9,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce,
    .iallgather = agoq_coll_iallgather,
    .ireducescatter = agoq_coll_ireducescatter,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
    .makeVDevice = NULL,
};

/* v10's CollNet table is v9's layout under a new symbol. */
AGOQ_EXPORT const ncclCollNet_v10_t ncclCollNetPlugin_v10 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_log,
    .devices = agoq_coll_devices,
    .getProperties = agoq_coll_get_properties_v9,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce,
    .iallgather = agoq_coll_iallgather,
    .ireducescatter = agoq_coll_ireducescatter,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
    .makeVDevice = NULL,
};

AGOQ_EXPORT const ncclCollNet_v11_t ncclCollNetPlugin_v11 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_comm,
    .devices = agoq_coll_devices,
    .getProperties = agoq_coll_get_properties_v11,
    .listen = agoq_coll_listen_ctx,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce,
    .iallgather = agoq_coll_iallgather,
    .ireducescatter = agoq_coll_ireducescatter,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
    .makeVDevice = NULL,
    .finalize = agoq_coll_finalize,
};

AGOQ_EXPORT const ncclCollNet_v12_t ncclCollNetPlugin_v12 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_comm,
    .devices = agoq_coll_devices,
    .getProperties = agoq_coll_get_properties_v12,
    .listen = agoq_coll_listen_ctx,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce,
    .iallgather = agoq_coll_iallgather,
    .ireducescatter = agoq_coll_ireducescatter,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
    .makeVDevice = NULL,
    .finalize = agoq_coll_finalize,
};
