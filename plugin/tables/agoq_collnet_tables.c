/*
 * The exported ncclCollNetPlugin_v6..v12 tables: thin adapters over the version-neutral
 * CollNet core (plugin/collnet/agoq_collnet.h). One function per distinct signature; the
 * members whose signature equals the core's point straight at it. getProperties is the net
 * tables' own conversion, so CollNet and net devices are the same list (NCCL merges the two
 * by name and PCI path).
 */
#include <stddef.h>

#include "collnet/agoq_collnet.h"
#include "core/agoq_check.h"
#include "tables/agoq_tables.h"

/* ---- lifecycle ---- */

static ncclResult_t agoq_coll_init_log(ncclDebugLogger_t log_fn) { return agoq_coll_legacy_init(log_fn); }

static ncclResult_t agoq_coll_init_comm(void** ctx, uint64_t comm_id, ncclDebugLogger_t log_fn) {
  return agoq_coll_init(ctx, comm_id, log_fn);
}

/* ---- listen: versions before v11 have no ctx ---- */

static ncclResult_t agoq_coll_listen_legacy(int dev, void* handle, void** listen_comm) {
  void* ctx = agoq_coll_legacy_ctx();
  if (ctx == NULL) {
    AGOQ_WARN("CollNet listen before init");
    return ncclInternalError;
  }
  return agoq_coll_listen(ctx, dev, handle, listen_comm);
}

/* ---- capabilities and memory ---- */

static ncclResult_t agoq_coll_tbl_reduce_support(ncclDataType_t data_type, ncclRedOp_t red_op, int* supported) {
  return agoq_coll_reduce_support((int)data_type, (int)red_op, supported);
}

static ncclResult_t agoq_coll_size_from_int(const char* what, int size, size_t* out) {
  if (size < 0) {
    AGOQ_WARN("CollNet %s: negative size %d", what, size);
    return ncclInternalError;
  }
  *out = (size_t)size;
  return ncclSuccess;
}

static ncclResult_t agoq_coll_reg_mr_int(void* coll_comm, void* data, int size, int type, void** mhandle) {
  size_t bytes;
  AGOQ_CHECK(agoq_coll_size_from_int("regMr", size, &bytes));
  return agoq_coll_reg_mr(coll_comm, data, bytes, type, mhandle);
}

/* ---- collectives: the memory handles tell the core which buffers are in device memory ---- */

static ncclResult_t agoq_coll_iallreduce_size(void* coll_comm, void* send_data, void* recv_data, size_t count,
                                              ncclDataType_t data_type, ncclRedOp_t red_op, void* send_mhandle,
                                              void* recv_mhandle, void** request) {
  return agoq_coll_iallreduce(coll_comm, send_data, recv_data, count, (int)data_type, (int)red_op, send_mhandle,
                              recv_mhandle, request);
}

static ncclResult_t agoq_coll_iallreduce_int(void* coll_comm, void* send_data, void* recv_data, int count,
                                             ncclDataType_t data_type, ncclRedOp_t red_op, void* send_mhandle,
                                             void* recv_mhandle, void** request) {
  size_t n;
  AGOQ_CHECK(agoq_coll_size_from_int("iallreduce", count, &n));
  return agoq_coll_iallreduce(coll_comm, send_data, recv_data, n, (int)data_type, (int)red_op, send_mhandle,
                              recv_mhandle, request);
}

/* SGE arrays differ only in the size member's width (uint32_t in v8, size_t from v9). */
#define AGOQ_COLL_SGE_COPY(parts, n, out)                                        \
  do {                                                                           \
    if ((n) < 1 || (n) > AGOQ_COLL_MAX_PARTS || (parts) == NULL) {               \
      AGOQ_WARN("CollNet: %d buffer parts (1..%d supported)", (n), AGOQ_COLL_MAX_PARTS); \
      return ncclInvalidArgument;                                                \
    }                                                                            \
    for (int i_ = 0; i_ < (n); i_++) {                                           \
      (out)[i_].address = (parts)[i_].address;                                   \
      (out)[i_].size = (size_t)(parts)[i_].size;                                 \
      (out)[i_].mhandle = (parts)[i_].mhandle;                                   \
    }                                                                            \
  } while (0)

static ncclResult_t agoq_coll_iallgather_v8(void* coll_comm, void* send_data, int n_recv_parts,
                                            ncclNetSGE_v8_t* recv_parts, size_t bytes_per_rank,
                                            size_t window_offset, size_t window_bytes, void* send_mhandle,
                                            void** request) {
  agoq_coll_sge parts[AGOQ_COLL_MAX_PARTS];
  AGOQ_COLL_SGE_COPY(recv_parts, n_recv_parts, parts);
  return agoq_coll_iallgather(coll_comm, send_data, n_recv_parts, parts, bytes_per_rank, window_offset,
                              window_bytes, send_mhandle, request);
}

static ncclResult_t agoq_coll_iallgather_v9(void* coll_comm, void* send_data, int n_recv_parts,
                                            ncclNetSGE_v9_t* recv_parts, size_t bytes_per_rank,
                                            size_t window_offset, size_t window_bytes, void* send_mhandle,
                                            void** request) {
  agoq_coll_sge parts[AGOQ_COLL_MAX_PARTS];
  AGOQ_COLL_SGE_COPY(recv_parts, n_recv_parts, parts);
  return agoq_coll_iallgather(coll_comm, send_data, n_recv_parts, parts, bytes_per_rank, window_offset,
                              window_bytes, send_mhandle, request);
}

static ncclResult_t agoq_coll_ireducescatter_v8(void* coll_comm, int n_send_parts, ncclNetSGE_v8_t* send_parts,
                                                void* recv_data, size_t bytes_per_rank, size_t window_offset,
                                                size_t window_bytes, ncclDataType_t data_type, ncclRedOp_t red_op,
                                                void* recv_mhandle, void** request) {
  agoq_coll_sge parts[AGOQ_COLL_MAX_PARTS];
  AGOQ_COLL_SGE_COPY(send_parts, n_send_parts, parts);
  return agoq_coll_ireducescatter(coll_comm, n_send_parts, parts, recv_data, bytes_per_rank, window_offset,
                                  window_bytes, (int)data_type, (int)red_op, recv_mhandle, request);
}

static ncclResult_t agoq_coll_ireducescatter_v9(void* coll_comm, int n_send_parts, ncclNetSGE_v9_t* send_parts,
                                                void* recv_data, size_t bytes_per_rank, size_t window_offset,
                                                size_t window_bytes, ncclDataType_t data_type, ncclRedOp_t red_op,
                                                void* recv_mhandle, void** request) {
  agoq_coll_sge parts[AGOQ_COLL_MAX_PARTS];
  AGOQ_COLL_SGE_COPY(send_parts, n_send_parts, parts);
  return agoq_coll_ireducescatter(coll_comm, n_send_parts, parts, recv_data, bytes_per_rank, window_offset,
                                  window_bytes, (int)data_type, (int)red_op, recv_mhandle, request);
}

/* ---- the tables ---- */

AGOQ_EXPORT const ncclCollNet_v6_t ncclCollNetPlugin_v6 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_coll_init_log,
    .devices = agoq_coll_devices,
    .getProperties = agoq_props_get_v6,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_tbl_reduce_support,
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
    .getProperties = agoq_props_get_v7,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_tbl_reduce_support,
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
    .getProperties = agoq_props_get_v8,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_tbl_reduce_support,
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
    .getProperties = agoq_props_get_v9,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_tbl_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce_size,
    .iallgather = agoq_coll_iallgather_v9,
    .ireducescatter = agoq_coll_ireducescatter_v9,
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
    .getProperties = agoq_props_get_v9,
    .listen = agoq_coll_listen_legacy,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_tbl_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce_size,
    .iallgather = agoq_coll_iallgather_v9,
    .ireducescatter = agoq_coll_ireducescatter_v9,
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
    .getProperties = agoq_props_get_v11,
    .listen = agoq_coll_listen,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_tbl_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce_size,
    .iallgather = agoq_coll_iallgather_v9,
    .ireducescatter = agoq_coll_ireducescatter_v9,
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
    .getProperties = agoq_props_get_v12,
    .listen = agoq_coll_listen,
    .connect = agoq_coll_connect,
    .reduceSupport = agoq_coll_tbl_reduce_support,
    .regMr = agoq_coll_reg_mr,
    .regMrDmaBuf = agoq_coll_reg_mr_dmabuf,
    .deregMr = agoq_coll_dereg_mr,
    .iallreduce = agoq_coll_iallreduce_size,
    .iallgather = agoq_coll_iallgather_v9,
    .ireducescatter = agoq_coll_ireducescatter_v9,
    .iflush = agoq_coll_iflush,
    .test = agoq_coll_test,
    .closeColl = agoq_coll_close_coll,
    .closeListen = agoq_coll_close_listen,
    .makeVDevice = NULL,
    .finalize = agoq_coll_finalize,
};
