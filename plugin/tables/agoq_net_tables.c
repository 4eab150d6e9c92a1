/*
 * The exported ncclNetPlugin_v6..v12 tables. Each member points straight at the core
 * (plugin/net/agoq_net.h) when the signatures agree, and otherwise at the one adapter
 * shared by every version with that signature; NCCL picks the newest table it knows.
 */
#include <stddef.h>

#include "core/agoq_check.h"
#include "net/agoq_net.h"
#include "tables/agoq_tables.h"

/* ---- init: v6..v9 log only, v10 adds the profiler, v11+ per communicator ---- */

static ncclResult_t agoq_tbl_init_log(ncclDebugLogger_t log_fn) {
  return agoq_net_legacy_init(log_fn, NULL);
}

/* v10 init(logFn, profFn) is agoq_net_legacy_init itself. */

static ncclResult_t agoq_tbl_init_comm(void** ctx, uint64_t comm_id,
                                       ncclNetCommConfig_v11_t* config, ncclDebugLogger_t log_fn,
                                       ncclProfilerCallback_t prof_fn) {
  int traffic_class = config != NULL ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
  return agoq_net_init(ctx, comm_id, traffic_class, log_fn, prof_fn);
}

/* ---- connection setup: versions before v11 have no ctx argument ---- */

static ncclResult_t agoq_tbl_legacy_ctx(void** ctx) {
  *ctx = agoq_net_legacy_ctx();
  if (*ctx != NULL) return ncclSuccess;
  AGOQ_WARN("connection setup before init");
  return ncclInternalError;
}

static ncclResult_t agoq_tbl_listen_legacy(int dev, void* handle, void** listen_comm) {
  void* ctx;
  AGOQ_CHECK(agoq_tbl_legacy_ctx(&ctx));
  return agoq_net_listen(ctx, dev, handle, listen_comm);
}

/* A host plugin never offloads to the device: the device-handle out parameters of v7+
 * stay untouched, which NCCL reads as "no device handle". */

static ncclResult_t agoq_tbl_connect_v6(int dev, void* handle, void** send_comm) {
  void* ctx;
  AGOQ_CHECK(agoq_tbl_legacy_ctx(&ctx));
  return agoq_net_connect(ctx, dev, handle, send_comm);
}

static ncclResult_t agoq_tbl_connect_v7(int dev, void* handle, void** send_comm,
                                        ncclNetDeviceHandle_v7_t** send_dev_comm) {
  return agoq_tbl_connect_v6(dev, handle, send_comm);
}

/* The traffic class of v10 arrives per connection; the core takes it per context, and
 * the legacy context is process-wide, so it is not applied. */
static ncclResult_t agoq_tbl_connect_v10(int dev, ncclNetCommConfig_v10_t* config, void* handle,
                                         void** send_comm,
                                         ncclNetDeviceHandle_v10_t** send_dev_comm) {
  return agoq_tbl_connect_v6(dev, handle, send_comm);
}

static ncclResult_t agoq_tbl_connect_ctx(void* ctx, int dev, void* handle, void** send_comm,
                                         ncclNetDeviceHandle_v11_t** send_dev_comm) {
  return agoq_net_connect(ctx, dev, handle, send_comm);
}

static ncclResult_t agoq_tbl_accept_dev(void* listen_comm, void** recv_comm,
                                        ncclNetDeviceHandle_v7_t** recv_dev_comm) {
  return agoq_net_accept(listen_comm, recv_comm);
}

/* ---- int-size data path (v6..v8 transfers, v6..v7 registration) ---- */

static ncclResult_t agoq_tbl_size_from_int(const char* what, int size, size_t* out) {
  if (size < 0) {
    AGOQ_WARN("%s: negative size %d", what, size);
    return ncclInternalError;
  }
  *out = (size_t)size;
  return ncclSuccess;
}

static ncclResult_t agoq_tbl_reg_mr_int(void* comm, void* data, int size, int type,
                                        void** mhandle) {
  size_t bytes;
  AGOQ_CHECK(agoq_tbl_size_from_int("regMr", size, &bytes));
  return agoq_net_reg_mr(comm, data, bytes, type, mhandle);
}

/* Versions before v10 carry no profiler handles; the core sees NULL ones. */

static ncclResult_t agoq_tbl_isend_size(void* send_comm, void* data, size_t size, int tag,
                                        void* mhandle, void** request) {
  return agoq_net_isend(send_comm, data, size, tag, mhandle, NULL, request);
}

static ncclResult_t agoq_tbl_isend_int(void* send_comm, void* data, int size, int tag,
                                       void* mhandle, void** request) {
  size_t bytes;
  AGOQ_CHECK(agoq_tbl_size_from_int("isend", size, &bytes));
  return agoq_tbl_isend_size(send_comm, data, bytes, tag, mhandle, request);
}

static ncclResult_t agoq_tbl_irecv_count(int n) {
  if (n >= 1 && n <= AGOQ_NET_MAX_RECVS) return ncclSuccess;
  AGOQ_WARN("irecv: %d buffers, expected 1..%d", n, AGOQ_NET_MAX_RECVS);
  return ncclInternalError;
}

static ncclResult_t agoq_tbl_irecv_size(void* recv_comm, int n, void** data, size_t* sizes,
                                        int* tags, void** mhandles, void** request) {
  void* phandles[AGOQ_NET_MAX_RECVS] = {NULL};
  AGOQ_CHECK(agoq_tbl_irecv_count(n));
  return agoq_net_irecv(recv_comm, n, data, sizes, tags, mhandles, phandles, request);
}

static ncclResult_t agoq_tbl_irecv_int(void* recv_comm, int n, void** data, int* sizes,
                                       int* tags, void** mhandles, void** request) {
  size_t bytes[AGOQ_NET_MAX_RECVS];
  AGOQ_CHECK(agoq_tbl_irecv_count(n));
  for (int i = 0; i < n; i++) AGOQ_CHECK(agoq_tbl_size_from_int("irecv", sizes[i], &bytes[i]));
  return agoq_tbl_irecv_size(recv_comm, n, data, bytes, tags, mhandles, request);
}

/* ---- v11+ hints: only the collective's op/algo/proto reach the core ---- */

static ncclResult_t agoq_tbl_set_attr(void* ctx, ncclNetAttr_v11_t* net_attr) {
  if (net_attr == NULL) {
    AGOQ_WARN("setNetAttr: NULL attributes");
    return ncclInternalError;
  }
  agoq_net_attr attr = {.op = net_attr->op, .algo = net_attr->algo, .proto = net_attr->proto};
  return agoq_net_set_attr(ctx, &attr);
}

/* ---- the tables ---- */

AGOQ_EXPORT const ncclNet_v6_t ncclNetPlugin_v6 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_tbl_init_log,
    .devices = agoq_net_devices,
    .getProperties = agoq_props_get_v6,
    .listen = agoq_tbl_listen_legacy,
    .connect = agoq_tbl_connect_v6,
    .accept = agoq_net_accept,
    .regMr = agoq_tbl_reg_mr_int,
    .regMrDmaBuf = agoq_net_reg_mr_dmabuf,
    .deregMr = agoq_net_dereg_mr,
    .isend = agoq_tbl_isend_int,
    .irecv = agoq_tbl_irecv_int,
    .iflush = agoq_net_iflush,
    .test = agoq_net_test,
    .closeSend = agoq_net_close_send,
    .closeRecv = agoq_net_close_recv,
    .closeListen = agoq_net_close_listen,
};

AGOQ_EXPORT const ncclNet_v7_t ncclNetPlugin_v7 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_tbl_init_log,
    .devices = agoq_net_devices,
    .getProperties = agoq_props_get_v7,
    .listen = agoq_tbl_listen_legacy,
    .connect = agoq_tbl_connect_v7,
    .accept = agoq_tbl_accept_dev,
    .regMr = agoq_tbl_reg_mr_int,
    .regMrDmaBuf = agoq_net_reg_mr_dmabuf,
    .deregMr = agoq_net_dereg_mr,
    .isend = agoq_tbl_isend_int,
    .irecv = agoq_tbl_irecv_int,
    .iflush = agoq_net_iflush,
    .test = agoq_net_test,
    .closeSend = agoq_net_close_send,
    .closeRecv = agoq_net_close_recv,
    .closeListen = agoq_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};

AGOQ_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_tbl_init_log,
    .devices = agoq_net_devices,
    .getProperties = agoq_props_get_v8,
    .listen = agoq_tbl_listen_legacy,
    .connect = agoq_tbl_connect_v7,
    .accept = agoq_tbl_accept_dev,
    .regMr = agoq_net_reg_mr,
    .regMrDmaBuf = agoq_net_reg_mr_dmabuf,
    .deregMr = agoq_net_dereg_mr,
    .isend = agoq_tbl_isend_int,
    .irecv = agoq_tbl_irecv_int,
    .iflush = agoq_net_iflush,
    .test = agoq_net_test,
    .closeSend = agoq_net_close_send,
    .closeRecv = agoq_net_close_recv,
    .closeListen = agoq_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};

AGOQ_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_tbl_init_log,
    .devices = agoq_net_devices,
    .getProperties = agoq_props_get_v9,
    .listen = agoq_tbl_listen_legacy,
    .connect = agoq_tbl_connect_v7,
    .accept = agoq_tbl_accept_dev,
    .regMr = agoq_net_reg_mr,
    .regMrDmaBuf = agoq_net_reg_mr_dmabuf,
    .deregMr = agoq_net_dereg_mr,
    .isend = agoq_tbl_isend_size,
    .irecv = agoq_tbl_irecv_size,
    .iflush = agoq_net_iflush,
    .test = agoq_net_test,
    .closeSend = agoq_net_close_send,
    .closeRecv = agoq_net_close_recv,
    .closeListen = agoq_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};

AGOQ_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_net_legacy_init,
    .devices = agoq_net_devices,
    .getProperties = agoq_props_get_v9,
    .listen = agoq_tbl_listen_legacy,
    .connect = agoq_tbl_connect_v10,
    .accept = agoq_tbl_accept_dev,
    .regMr = agoq_net_reg_mr,
    .regMrDmaBuf = agoq_net_reg_mr_dmabuf,
    .deregMr = agoq_net_dereg_mr,
    .isend = agoq_net_isend,
    .irecv = agoq_net_irecv,
    .iflush = agoq_net_iflush,
    .test = agoq_net_test,
    .closeSend = agoq_net_close_send,
    .closeRecv = agoq_net_close_recv,
    .closeListen = agoq_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};

AGOQ_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_tbl_init_comm,
    .devices = agoq_net_devices,
    .getProperties = agoq_props_get_v11,
    .listen = agoq_net_listen,
    .connect = agoq_tbl_connect_ctx,
    .accept = agoq_tbl_accept_dev,
    .regMr = agoq_net_reg_mr,
    .regMrDmaBuf = agoq_net_reg_mr_dmabuf,
    .deregMr = agoq_net_dereg_mr,
    .isend = agoq_net_isend,
    .irecv = agoq_net_irecv,
    .iflush = agoq_net_iflush,
    .test = agoq_net_test,
    .closeSend = agoq_net_close_send,
    .closeRecv = agoq_net_close_recv,
    .closeListen = agoq_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = agoq_net_finalize,
    .setNetAttr = agoq_tbl_set_attr,
};

AGOQ_EXPORT const ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = AGOQ_PLUGIN_NAME,
    .init = agoq_tbl_init_comm,
    .devices = agoq_net_devices,
    .getProperties = agoq_props_get_v12,
    .listen = agoq_net_listen,
    .connect = agoq_tbl_connect_ctx,
    .accept = agoq_tbl_accept_dev,
    .regMr = agoq_net_reg_mr,
    .regMrDmaBuf = agoq_net_reg_mr_dmabuf,
    .deregMr = agoq_net_dereg_mr,
    .isend = agoq_net_isend,
    .irecv = agoq_net_irecv,
    .iflush = agoq_net_iflush,
    .test = agoq_net_test,
    .closeSend = agoq_net_close_send,
    .closeRecv = agoq_net_close_recv,
    .closeListen = agoq_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = agoq_net_finalize,
    .setNetAttr = agoq_tbl_set_attr,
};
