/*
 * The net view: one call per NCCL net entry point, dispatched to the table's version
 * with the arguments NCCL itself would pass to that version.
 */
#include <limits.h>

#include "agoq_loader_internal.h"

#define AGOQ_NET_CALL(N, member, ...) AGOQ_VIEW_CALL(ncclNet_v##N##_t, v, member, __VA_ARGS__)

/* For members whose signature is the same in every version. */
#define AGOQ_NET_CALL_ANY(member, ...)                           \
  (v->version == 6    ? AGOQ_NET_CALL(6, member, __VA_ARGS__)    \
   : v->version == 7  ? AGOQ_NET_CALL(7, member, __VA_ARGS__)    \
   : v->version == 8  ? AGOQ_NET_CALL(8, member, __VA_ARGS__)    \
   : v->version == 9  ? AGOQ_NET_CALL(9, member, __VA_ARGS__)    \
   : v->version == 10 ? AGOQ_NET_CALL(10, member, __VA_ARGS__)   \
   : v->version == 11 ? AGOQ_NET_CALL(11, member, __VA_ARGS__)   \
   : v->version == 12 ? AGOQ_NET_CALL(12, member, __VA_ARGS__)   \
                      : agoq_view_bad_version(v->version))

static int agoq_view_int_size(size_t size, int* out) {
  if (size > INT_MAX) return -1;
  *out = (int)size;
  return 0;
}

/* A host plugin must leave NCCL's device-handle pointer alone; NCCL would otherwise
 * treat the connection as device-offloaded. */
static ncclResult_t agoq_view_check_dev_handle(const agoq_net_view* v, const char* what,
                                               ncclResult_t res,
                                               const ncclNetDeviceHandle_v7_t* dev_handle) {
  if (res != ncclSuccess || dev_handle == NULL) return res;
  agoq_log_stderr(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__,
                  "loader: v%d %s returned a device handle from a host plugin", v->version,
                  what);
  return ncclInternalError;
}

ncclResult_t agoq_view_init(const agoq_net_view* v, void** ctx, uint64_t comm_id,
                            ncclDebugLogger_t log) {
  return agoq_view_init_prof(v, ctx, comm_id, log, NULL);
}

ncclResult_t agoq_view_init_prof(const agoq_net_view* v, void** ctx, uint64_t comm_id,
                                 ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  ncclNetCommConfig_v11_t config = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
  if (v->version == 11) return AGOQ_NET_CALL(11, init, ctx, comm_id, &config, log, prof);
  if (v->version == 12) return AGOQ_NET_CALL(12, init, ctx, comm_id, &config, log, prof);
  *ctx = NULL;
  switch (v->version) {
    case 6: return AGOQ_NET_CALL(6, init, log);
    case 7: return AGOQ_NET_CALL(7, init, log);
    case 8: return AGOQ_NET_CALL(8, init, log);
    case 9: return AGOQ_NET_CALL(9, init, log);
    case 10: return AGOQ_NET_CALL(10, init, log, prof);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_view_finalize(const agoq_net_view* v, void* ctx) {
  if (v->version == 11) return AGOQ_NET_CALL(11, finalize, ctx);
  if (v->version == 12) return AGOQ_NET_CALL(12, finalize, ctx);
  return ncclSuccess;
}

ncclResult_t agoq_view_devices(const agoq_net_view* v, int* ndev) {
  return AGOQ_NET_CALL_ANY(devices, ndev);
}

ncclResult_t agoq_view_get_properties(const agoq_net_view* v, int dev, agoq_view_props* p) {
  return agoq_view_props_get(v->version, 0, v->table, dev, p);
}

ncclResult_t agoq_view_listen(const agoq_net_view* v, void* ctx, int dev, void* handle,
                              void** listen_comm) {
  switch (v->version) {
    case 6: return AGOQ_NET_CALL(6, listen, dev, handle, listen_comm);
    case 7: return AGOQ_NET_CALL(7, listen, dev, handle, listen_comm);
    case 8: return AGOQ_NET_CALL(8, listen, dev, handle, listen_comm);
    case 9: return AGOQ_NET_CALL(9, listen, dev, handle, listen_comm);
    case 10: return AGOQ_NET_CALL(10, listen, dev, handle, listen_comm);
    case 11: return AGOQ_NET_CALL(11, listen, ctx, dev, handle, listen_comm);
    case 12: return AGOQ_NET_CALL(12, listen, ctx, dev, handle, listen_comm);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_view_connect(const agoq_net_view* v, void* ctx, int dev, void* handle,
                               void** send_comm) {
  ncclNetDeviceHandle_v7_t* dh = NULL;
  ncclNetCommConfig_v10_t config = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ncclResult_t res;
  switch (v->version) {
    case 6: return AGOQ_NET_CALL(6, connect, dev, handle, send_comm);
    case 7: res = AGOQ_NET_CALL(7, connect, dev, handle, send_comm, &dh); break;
    case 8: res = AGOQ_NET_CALL(8, connect, dev, handle, send_comm, &dh); break;
    case 9: res = AGOQ_NET_CALL(9, connect, dev, handle, send_comm, &dh); break;
    case 10: res = AGOQ_NET_CALL(10, connect, dev, &config, handle, send_comm, &dh); break;
    case 11: res = AGOQ_NET_CALL(11, connect, ctx, dev, handle, send_comm, &dh); break;
    case 12: res = AGOQ_NET_CALL(12, connect, ctx, dev, handle, send_comm, &dh); break;
    default: return agoq_view_bad_version(v->version);
  }
  return agoq_view_check_dev_handle(v, "connect", res, dh);
}

ncclResult_t agoq_view_accept(const agoq_net_view* v, void* listen_comm, void** recv_comm) {
  ncclNetDeviceHandle_v7_t* dh = NULL;
  ncclResult_t res;
  switch (v->version) {
    case 6: return AGOQ_NET_CALL(6, accept, listen_comm, recv_comm);
    case 7: res = AGOQ_NET_CALL(7, accept, listen_comm, recv_comm, &dh); break;
    case 8: res = AGOQ_NET_CALL(8, accept, listen_comm, recv_comm, &dh); break;
    case 9: res = AGOQ_NET_CALL(9, accept, listen_comm, recv_comm, &dh); break;
    case 10: res = AGOQ_NET_CALL(10, accept, listen_comm, recv_comm, &dh); break;
    case 11: res = AGOQ_NET_CALL(11, accept, listen_comm, recv_comm, &dh); break;
    case 12: res = AGOQ_NET_CALL(12, accept, listen_comm, recv_comm, &dh); break;
    default: return agoq_view_bad_version(v->version);
  }
  return agoq_view_check_dev_handle(v, "accept", res, dh);
}

ncclResult_t agoq_view_reg_mr(const agoq_net_view* v, void* comm, void* data, size_t size,
                              int type, void** mhandle) {
  int isize;
  if (v->version <= 7) {
    if (agoq_view_int_size(size, &isize) != 0) return ncclInvalidArgument;
    if (v->version == 6) return AGOQ_NET_CALL(6, regMr, comm, data, isize, type, mhandle);
    if (v->version == 7) return AGOQ_NET_CALL(7, regMr, comm, data, isize, type, mhandle);
  }
  switch (v->version) {
    case 8: return AGOQ_NET_CALL(8, regMr, comm, data, size, type, mhandle);
    case 9: return AGOQ_NET_CALL(9, regMr, comm, data, size, type, mhandle);
    case 10: return AGOQ_NET_CALL(10, regMr, comm, data, size, type, mhandle);
    case 11: return AGOQ_NET_CALL(11, regMr, comm, data, size, type, mhandle);
    case 12: return AGOQ_NET_CALL(12, regMr, comm, data, size, type, mhandle);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_view_reg_mr_dmabuf(const agoq_net_view* v, void* comm, void* data,
                                     size_t size, int type, uint64_t offset, int fd,
                                     void** mhandle) {
  return AGOQ_NET_CALL_ANY(regMrDmaBuf, comm, data, size, type, offset, fd, mhandle);
}

ncclResult_t agoq_view_dereg_mr(const agoq_net_view* v, void* comm, void* mhandle) {
  return AGOQ_NET_CALL_ANY(deregMr, comm, mhandle);
}

ncclResult_t agoq_view_isend(const agoq_net_view* v, void* send_comm, void* data, size_t size,
                             int tag, void* mhandle, void** request) {
  return agoq_view_isend_ph(v, send_comm, data, size, tag, mhandle, NULL, request);
}

ncclResult_t agoq_view_isend_ph(const agoq_net_view* v, void* send_comm, void* data, size_t size,
                                int tag, void* mhandle, void* phandle, void** request) {
  int isize;
  if (v->version <= 8) {
    if (agoq_view_int_size(size, &isize) != 0) return ncclInvalidArgument;
    switch (v->version) {
      case 6: return AGOQ_NET_CALL(6, isend, send_comm, data, isize, tag, mhandle, request);
      case 7: return AGOQ_NET_CALL(7, isend, send_comm, data, isize, tag, mhandle, request);
      case 8: return AGOQ_NET_CALL(8, isend, send_comm, data, isize, tag, mhandle, request);
      default: return agoq_view_bad_version(v->version);
    }
  }
  switch (v->version) {
    case 9: return AGOQ_NET_CALL(9, isend, send_comm, data, size, tag, mhandle, request);
    case 10: return AGOQ_NET_CALL(10, isend, send_comm, data, size, tag, mhandle, phandle, request);
    case 11: return AGOQ_NET_CALL(11, isend, send_comm, data, size, tag, mhandle, phandle, request);
    case 12: return AGOQ_NET_CALL(12, isend, send_comm, data, size, tag, mhandle, phandle, request);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_view_irecv(const agoq_net_view* v, void* recv_comm, int n, void** data,
                             size_t* sizes, int* tags, void** mhandles, void** request) {
  if (n > AGOQ_VIEW_MAX_RECVS) return ncclInvalidArgument;
  if (v->version <= 8) {
    int isizes[AGOQ_VIEW_MAX_RECVS];
    for (int i = 0; i < n; i++)
      if (agoq_view_int_size(sizes[i], &isizes[i]) != 0) return ncclInvalidArgument;
    if (request != NULL && *request == (void*)NCCL_NET_OPTIONAL_RECV_COMPLETION) *request = NULL;
    switch (v->version) {
      case 6: return AGOQ_NET_CALL(6, irecv, recv_comm, n, data, isizes, tags, mhandles, request);
      case 7: return AGOQ_NET_CALL(7, irecv, recv_comm, n, data, isizes, tags, mhandles, request);
      case 8: return AGOQ_NET_CALL(8, irecv, recv_comm, n, data, isizes, tags, mhandles, request);
      default: return agoq_view_bad_version(v->version);
    }
  }
  void* phandles[AGOQ_VIEW_MAX_RECVS] = {NULL};
  switch (v->version) {
    case 9: return AGOQ_NET_CALL(9, irecv, recv_comm, n, data, sizes, tags, mhandles, request);
    case 10:
      return AGOQ_NET_CALL(10, irecv, recv_comm, n, data, sizes, tags, mhandles, phandles,
                           request);
    case 11:
      return AGOQ_NET_CALL(11, irecv, recv_comm, n, data, sizes, tags, mhandles, phandles,
                           request);
    case 12:
      return AGOQ_NET_CALL(12, irecv, recv_comm, n, data, sizes, tags, mhandles, phandles,
                           request);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_view_iflush(const agoq_net_view* v, void* recv_comm, int n, void** data,
                              int* sizes, void** mhandles, void** request) {
  return AGOQ_NET_CALL_ANY(iflush, recv_comm, n, data, sizes, mhandles, request);
}

ncclResult_t agoq_view_test(const agoq_net_view* v, void* request, int* done, int* sizes) {
  return AGOQ_NET_CALL_ANY(test, request, done, sizes);
}

ncclResult_t agoq_view_close_send(const agoq_net_view* v, void* c) {
  return AGOQ_NET_CALL_ANY(closeSend, c);
}

ncclResult_t agoq_view_close_recv(const agoq_net_view* v, void* c) {
  return AGOQ_NET_CALL_ANY(closeRecv, c);
}

ncclResult_t agoq_view_close_listen(const agoq_net_view* v, void* c) {
  return AGOQ_NET_CALL_ANY(closeListen, c);
}

ncclResult_t agoq_view_set_attr(const agoq_net_view* v, void* ctx, uint32_t op, uint32_t algo,
                                uint32_t proto) {
  ncclNetAttr_v11_t attr = {
      .sendCommAttr = {NCCL_NET_ATTR_UNDEF, NCCL_NET_ATTR_UNDEF, NCCL_NET_ATTR_UNDEF,
                       NCCL_NET_ATTR_UNDEF},
      .recvCommAttr = {NCCL_NET_ATTR_UNDEF, NCCL_NET_ATTR_UNDEF, NCCL_NET_ATTR_UNDEF,
                       NCCL_NET_ATTR_UNDEF},
      .op = op,
      .algo = algo,
      .proto = proto,
  };
  if (v->version == 11) return AGOQ_NET_CALL(11, setNetAttr, ctx, &attr);
  if (v->version == 12) return AGOQ_NET_CALL(12, setNetAttr, ctx, &attr);
  return ncclInvalidUsage;
}
