/*
 * The collnet view: one call per NCCL CollNet entry point, dispatched to the table's
 * version with the arguments NCCL's proxy passes to that version (src/transport/coll_net.cc).
 * Narrow integer parameters of old versions are range-checked here, as NCCL's adapters do,
 * so a caller never has a size silently truncated.
 */
#include <limits.h>
#include <stdint.h>

#include "agoq_loader_internal.h"

#define AGOQ_COLL_CALL(N, member, ...) \
  AGOQ_VIEW_CALL(ncclCollNet_v##N##_t, v, member, __VA_ARGS__)

/* For members whose signature is the same in every version. */
#define AGOQ_COLL_CALL_ANY(member, ...)                           \
  (v->version == 6    ? AGOQ_COLL_CALL(6, member, __VA_ARGS__)    \
   : v->version == 7  ? AGOQ_COLL_CALL(7, member, __VA_ARGS__)    \
   : v->version == 8  ? AGOQ_COLL_CALL(8, member, __VA_ARGS__)    \
   : v->version == 9  ? AGOQ_COLL_CALL(9, member, __VA_ARGS__)    \
   : v->version == 10 ? AGOQ_COLL_CALL(10, member, __VA_ARGS__)   \
   : v->version == 11 ? AGOQ_COLL_CALL(11, member, __VA_ARGS__)   \
   : v->version == 12 ? AGOQ_COLL_CALL(12, member, __VA_ARGS__)   \
                      : agoq_view_bad_version(v->version))

/* Members v8+ share (iallgather, ireducescatter): one signature from v9 on. */
#define AGOQ_COLL_CALL_V9UP(member, ...)                          \
  (v->version == 9    ? AGOQ_COLL_CALL(9, member, __VA_ARGS__)    \
   : v->version == 10 ? AGOQ_COLL_CALL(10, member, __VA_ARGS__)   \
   : v->version == 11 ? AGOQ_COLL_CALL(11, member, __VA_ARGS__)   \
   : v->version == 12 ? AGOQ_COLL_CALL(12, member, __VA_ARGS__)   \
                      : agoq_view_bad_version(v->version))

static ncclResult_t agoq_coll_refuse(const agoq_collnet_view* v, const char* what,
                                     ncclResult_t res) {
  agoq_log_stderr(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, "loader: collnet v%d: %s",
                  v->version, what);
  return res;
}

ncclResult_t agoq_collnet_view_init(const agoq_collnet_view* v, void** ctx, uint64_t comm_id,
                                    ncclDebugLogger_t log) {
  if (v->version == 11) return AGOQ_COLL_CALL(11, init, ctx, comm_id, log);
  if (v->version == 12) return AGOQ_COLL_CALL(12, init, ctx, comm_id, log);
  *ctx = NULL;
  switch (v->version) {
    case 6: return AGOQ_COLL_CALL(6, init, log);
    case 7: return AGOQ_COLL_CALL(7, init, log);
    case 8: return AGOQ_COLL_CALL(8, init, log);
    case 9: return AGOQ_COLL_CALL(9, init, log);
    case 10: return AGOQ_COLL_CALL(10, init, log);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_collnet_view_finalize(const agoq_collnet_view* v, void* ctx) {
  if (v->version == 11) return AGOQ_COLL_CALL(11, finalize, ctx);
  if (v->version == 12) return AGOQ_COLL_CALL(12, finalize, ctx);
  return ncclSuccess;
}

ncclResult_t agoq_collnet_view_devices(const agoq_collnet_view* v, int* ndev) {
  return AGOQ_COLL_CALL_ANY(devices, ndev);
}

ncclResult_t agoq_collnet_view_get_properties(const agoq_collnet_view* v, int dev,
                                              agoq_view_props* p) {
  return agoq_view_props_get(v->version, 1, v->table, dev, p);
}

ncclResult_t agoq_collnet_view_listen(const agoq_collnet_view* v, void* ctx, int dev,
                                      void* handle, void** listen_comm) {
  switch (v->version) {
    case 6: return AGOQ_COLL_CALL(6, listen, dev, handle, listen_comm);
    case 7: return AGOQ_COLL_CALL(7, listen, dev, handle, listen_comm);
    case 8: return AGOQ_COLL_CALL(8, listen, dev, handle, listen_comm);
    case 9: return AGOQ_COLL_CALL(9, listen, dev, handle, listen_comm);
    case 10: return AGOQ_COLL_CALL(10, listen, dev, handle, listen_comm);
    case 11: return AGOQ_COLL_CALL(11, listen, ctx, dev, handle, listen_comm);
    case 12: return AGOQ_COLL_CALL(12, listen, ctx, dev, handle, listen_comm);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_collnet_view_connect(const agoq_collnet_view* v, void** handles, int nranks,
                                       int rank, void* listen_comm, void** coll_comm) {
  return AGOQ_COLL_CALL_ANY(connect, handles, nranks, rank, listen_comm, coll_comm);
}

ncclResult_t agoq_collnet_view_reduce_support(const agoq_collnet_view* v, ncclDataType_t dtype,
                                              ncclRedOp_t op, int* supported) {
  return AGOQ_COLL_CALL_ANY(reduceSupport, dtype, op, supported);
}

ncclResult_t agoq_collnet_view_reg_mr(const agoq_collnet_view* v, void* coll_comm, void* data,
                                      size_t size, int type, void** mhandle) {
  if (v->version <= 7) {
    if (size > INT_MAX) return agoq_coll_refuse(v, "regMr size above INT_MAX", ncclInvalidArgument);
    if (v->version == 6) return AGOQ_COLL_CALL(6, regMr, coll_comm, data, (int)size, type, mhandle);
    if (v->version == 7) return AGOQ_COLL_CALL(7, regMr, coll_comm, data, (int)size, type, mhandle);
    return agoq_view_bad_version(v->version);
  }
  switch (v->version) {
    case 8: return AGOQ_COLL_CALL(8, regMr, coll_comm, data, size, type, mhandle);
    case 9: return AGOQ_COLL_CALL(9, regMr, coll_comm, data, size, type, mhandle);
    case 10: return AGOQ_COLL_CALL(10, regMr, coll_comm, data, size, type, mhandle);
    case 11: return AGOQ_COLL_CALL(11, regMr, coll_comm, data, size, type, mhandle);
    case 12: return AGOQ_COLL_CALL(12, regMr, coll_comm, data, size, type, mhandle);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_collnet_view_dereg_mr(const agoq_collnet_view* v, void* coll_comm,
                                        void* mhandle) {
  return AGOQ_COLL_CALL_ANY(deregMr, coll_comm, mhandle);
}

ncclResult_t agoq_collnet_view_iallreduce(const agoq_collnet_view* v, void* coll_comm,
                                          void* send_data, void* recv_data, size_t count,
                                          ncclDataType_t dtype, ncclRedOp_t op,
                                          void* send_mhandle, void* recv_mhandle,
                                          void** request) {
  if (v->version <= 8) {
    if (count > INT_MAX)
      return agoq_coll_refuse(v, "iallreduce count above INT_MAX", ncclInvalidArgument);
    int icount = (int)count;
    switch (v->version) {
      case 6:
        return AGOQ_COLL_CALL(6, iallreduce, coll_comm, send_data, recv_data, icount, dtype, op,
                              send_mhandle, recv_mhandle, request);
      case 7:
        return AGOQ_COLL_CALL(7, iallreduce, coll_comm, send_data, recv_data, icount, dtype, op,
                              send_mhandle, recv_mhandle, request);
      case 8:
        return AGOQ_COLL_CALL(8, iallreduce, coll_comm, send_data, recv_data, icount, dtype, op,
                              send_mhandle, recv_mhandle, request);
      default: return agoq_view_bad_version(v->version);
    }
  }
  return AGOQ_COLL_CALL_V9UP(iallreduce, coll_comm, send_data, recv_data, count, dtype, op,
                             send_mhandle, recv_mhandle, request);
}

int agoq_collnet_view_has_gather_scatter(const agoq_collnet_view* v) {
  switch (v->version) {
#define AGOQ_COLL_HAS(N)                                        \
  case N: {                                                     \
    const ncclCollNet_v##N##_t* t = v->table;                   \
    return t->iallgather != NULL && t->ireducescatter != NULL;  \
  }
    AGOQ_COLL_HAS(8)
    AGOQ_COLL_HAS(9)
    AGOQ_COLL_HAS(10)
    AGOQ_COLL_HAS(11)
    AGOQ_COLL_HAS(12)
#undef AGOQ_COLL_HAS
    default: return 0; /* v6, v7: no such members */
  }
}

/* The v8 shape of a part list, or an error when a size does not fit its uint32. */
static ncclResult_t agoq_coll_sges_v8(const agoq_collnet_view* v, int n, const agoq_view_sge* in,
                                      ncclNetSGE_v8_t* out) {
  for (int i = 0; i < n; i++) {
    if (in[i].size > UINT32_MAX)
      return agoq_coll_refuse(v, "SGE size above UINT32_MAX", ncclInvalidArgument);
    out[i] = (ncclNetSGE_v8_t){.mhandle = in[i].mhandle, .address = in[i].address,
                               .size = (uint32_t)in[i].size};
  }
  return ncclSuccess;
}

static ncclResult_t agoq_coll_sge_check(const agoq_collnet_view* v, const char* what, int n,
                                        const agoq_view_sge* parts) {
  if (!agoq_collnet_view_has_gather_scatter(v))
    return agoq_coll_refuse(v, what, ncclInvalidUsage);
  if (n < 0 || n > AGOQ_VIEW_MAX_SGES || (n > 0 && parts == NULL))
    return agoq_coll_refuse(v, "part count out of the view's range", ncclInvalidArgument);
  return ncclSuccess;
}

ncclResult_t agoq_collnet_view_iallgather(const agoq_collnet_view* v, void* coll_comm,
                                          void* send_data, int n_recv_parts,
                                          const agoq_view_sge* recv_parts,
                                          size_t bytes_per_rank, size_t window_offset,
                                          size_t window_bytes, void* send_mhandle,
                                          void** request) {
  ncclResult_t res = agoq_coll_sge_check(v, "this version has no iallgather", n_recv_parts,
                                         recv_parts);
  if (res != ncclSuccess) return res;
  if (v->version == 8) {
    ncclNetSGE_v8_t parts[AGOQ_VIEW_MAX_SGES];
    res = agoq_coll_sges_v8(v, n_recv_parts, recv_parts, parts);
    if (res != ncclSuccess) return res;
    return AGOQ_COLL_CALL(8, iallgather, coll_comm, send_data, n_recv_parts, parts,
                          bytes_per_rank, window_offset, window_bytes, send_mhandle, request);
  }
  /* v9..v12 share ncclNetSGE_v9_t's layout, which is agoq_view_sge's. */
  ncclNetSGE_v9_t parts[AGOQ_VIEW_MAX_SGES];
  for (int i = 0; i < n_recv_parts; i++)
    parts[i] = (ncclNetSGE_v9_t){.mhandle = recv_parts[i].mhandle,
                                 .address = recv_parts[i].address,
                                 .size = recv_parts[i].size};
  return AGOQ_COLL_CALL_V9UP(iallgather, coll_comm, send_data, n_recv_parts, parts,
                             bytes_per_rank, window_offset, window_bytes, send_mhandle, request);
}

ncclResult_t agoq_collnet_view_ireducescatter(const agoq_collnet_view* v, void* coll_comm,
                                              int n_send_parts, const agoq_view_sge* send_parts,
                                              void* recv_data, size_t bytes_per_rank,
                                              size_t window_offset, size_t window_bytes,
                                              ncclDataType_t dtype, ncclRedOp_t op,
                                              void* recv_mhandle, void** request) {
  ncclResult_t res = agoq_coll_sge_check(v, "this version has no ireducescatter", n_send_parts,
                                         send_parts);
  if (res != ncclSuccess) return res;
  if (v->version == 8) {
    ncclNetSGE_v8_t parts[AGOQ_VIEW_MAX_SGES];
    res = agoq_coll_sges_v8(v, n_send_parts, send_parts, parts);
    if (res != ncclSuccess) return res;
    return AGOQ_COLL_CALL(8, ireducescatter, coll_comm, n_send_parts, parts, recv_data,
                          bytes_per_rank, window_offset, window_bytes, dtype, op, recv_mhandle,
                          request);
  }
  ncclNetSGE_v9_t parts[AGOQ_VIEW_MAX_SGES];
  for (int i = 0; i < n_send_parts; i++)
    parts[i] = (ncclNetSGE_v9_t){.mhandle = send_parts[i].mhandle,
                                 .address = send_parts[i].address,
                                 .size = send_parts[i].size};
  return AGOQ_COLL_CALL_V9UP(ireducescatter, coll_comm, n_send_parts, parts, recv_data,
                             bytes_per_rank, window_offset, window_bytes, dtype, op,
                             recv_mhandle, request);
}

ncclResult_t agoq_collnet_view_iflush(const agoq_collnet_view* v, void* coll_comm, void* data,
                                      int size, void* mhandle, void** request) {
  return AGOQ_COLL_CALL_ANY(iflush, coll_comm, data, size, mhandle, request);
}

ncclResult_t agoq_collnet_view_test(const agoq_collnet_view* v, void* request, int* done,
                                    int* size) {
  return AGOQ_COLL_CALL_ANY(test, request, done, size);
}

ncclResult_t agoq_collnet_view_close_coll(const agoq_collnet_view* v, void* coll_comm) {
  return AGOQ_COLL_CALL_ANY(closeColl, coll_comm);
}

ncclResult_t agoq_collnet_view_close_listen(const agoq_collnet_view* v, void* listen_comm) {
  return AGOQ_COLL_CALL_ANY(closeListen, listen_comm);
}
