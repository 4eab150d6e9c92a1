/*
 * Loads the built plugin the way NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, look up the
 * exported tables by name) and drives any exported ABI version through one
 * version-neutral view, so tools and tests exercise every version with the same code.
 *
 * Tools that need an ncclDebugLogger_t use agoq_log_stderr (core/agoq_log.h, included
 * below): the same format and NCCL_DEBUG/AGOQ_DEBUG levels as the plugin's own fallback.
 */
#ifndef AGOQ_LOADER_H
#define AGOQ_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "core/agoq_log.h"

#define AGOQ_LOADER_MIN_VERSION 6
#define AGOQ_LOADER_MAX_VERSION 12
#define AGOQ_LOADER_NUM_VERSIONS (AGOQ_LOADER_MAX_VERSION - AGOQ_LOADER_MIN_VERSION + 1)
/* Largest n an irecv through the view may group (NCCL's own limit: one sub per channel). */
#define AGOQ_VIEW_MAX_RECVS 64

typedef struct agoq_netlib agoq_netlib;

/* Fails (non-zero, message in err) when dlopen fails or the library exports no
 * ncclNetPlugin_v6..v12. */
int agoq_netlib_open(const char* path, agoq_netlib** out, char* err, size_t errlen);
/* Any other symbol of the opened library (the profiler and tuner tables), or NULL. */
const void* agoq_netlib_symbol(agoq_netlib* lib, const char* name);
void agoq_netlib_close(agoq_netlib* lib);
/* $AGOQ_PLUGIN_PATH, else <dir of the executable>/../lib/libnccl-net-agoq.so (the build
 * tree and install layouts). Static storage: not thread-safe, valid until the next call. */
const char* agoq_netlib_default_path(void);
/* Exported versions, newest first; writes at most max and returns how many it wrote. */
int agoq_netlib_net_versions(agoq_netlib* lib, int* versions, int max);
int agoq_netlib_collnet_versions(agoq_netlib* lib, int* versions, int max);

/* ---- net view ---- */

typedef struct {
  int version;
  const void* table; /* const ncclNet_v<version>_t* */
  const char* name;
} agoq_net_view;

/* 0 when the library exports ncclNetPlugin_v<version>. */
int agoq_netlib_net_view(agoq_netlib* lib, int version, agoq_net_view* view);

/* Properties in one shape. Members a version lacks hold what NCCL's own adapter for that
 * version assumes: regIsGlobal/forceFlush 0, host device type, a single vdev (the device
 * itself), maxP2pBytes 1 GiB, maxCollBytes 512 MiB, maxMultiRequestSize 1. */
typedef struct {
  char name[64];
  char pci_path[256];
  int has_pci_path;
  uint64_t guid;
  int ptr_support, reg_is_global, force_flush, speed, port;
  float latency;
  int max_comms, max_recvs, net_device_type, net_device_version;
  size_t max_p2p_bytes, max_coll_bytes;
  int max_multi_request_size;
  int vdev_count;
} agoq_view_props;

/* v11+: per-communicator init (traffic class undefined, no profiler). Older versions:
 * init(log[, NULL]) and *ctx = NULL, because their listen/connect take no context. */
ncclResult_t agoq_view_init(const agoq_net_view* v, void** ctx, uint64_t comm_id,
                            ncclDebugLogger_t log);
/* The same with NCCL's profiler callback (v10+; older versions have no place for it). */
ncclResult_t agoq_view_init_prof(const agoq_net_view* v, void** ctx, uint64_t comm_id,
                                 ncclDebugLogger_t log, ncclProfilerCallback_t prof);
/* No-op for versions without finalize. */
ncclResult_t agoq_view_finalize(const agoq_net_view* v, void* ctx);
ncclResult_t agoq_view_devices(const agoq_net_view* v, int* ndev);
ncclResult_t agoq_view_get_properties(const agoq_net_view* v, int dev, agoq_view_props* p);
/* ctx is ignored by versions before v11. connect/accept pass a NULL device handle, as
 * NCCL does for host plugins. */
ncclResult_t agoq_view_listen(const agoq_net_view* v, void* ctx, int dev, void* handle,
                              void** listen_comm);
ncclResult_t agoq_view_connect(const agoq_net_view* v, void* ctx, int dev, void* handle,
                               void** send_comm);
ncclResult_t agoq_view_accept(const agoq_net_view* v, void* listen_comm, void** recv_comm);
/* Int-size versions (regMr v6..v7, isend/irecv v6..v8): a size above INT_MAX is refused
 * with ncclInvalidArgument before the plugin is called. */
ncclResult_t agoq_view_reg_mr(const agoq_net_view* v, void* comm, void* data, size_t size,
                              int type, void** mhandle);
ncclResult_t agoq_view_reg_mr_dmabuf(const agoq_net_view* v, void* comm, void* data,
                                     size_t size, int type, uint64_t offset, int fd,
                                     void** mhandle);
ncclResult_t agoq_view_dereg_mr(const agoq_net_view* v, void* comm, void* mhandle);
/* v10+ get NULL profiler handles. */
ncclResult_t agoq_view_isend(const agoq_net_view* v, void* send_comm, void* data, size_t size,
                             int tag, void* mhandle, void** request);
/* With NCCL's profiler handle of the transfer (dropped by versions before v10). */
ncclResult_t agoq_view_isend_ph(const agoq_net_view* v, void* send_comm, void* data, size_t size,
                                int tag, void* mhandle, void* phandle, void** request);
/* n above AGOQ_VIEW_MAX_RECVS is refused with ncclInvalidArgument; any other n reaches
 * the plugin. As NCCL's adapters do, v6..v8 turn an NCCL_NET_OPTIONAL_RECV_COMPLETION
 * hint in *request into NULL before the call. */
ncclResult_t agoq_view_irecv(const agoq_net_view* v, void* recv_comm, int n, void** data,
                             size_t* sizes, int* tags, void** mhandles, void** request);
ncclResult_t agoq_view_iflush(const agoq_net_view* v, void* recv_comm, int n, void** data,
                              int* sizes, void** mhandles, void** request);
ncclResult_t agoq_view_test(const agoq_net_view* v, void* request, int* done, int* sizes);
ncclResult_t agoq_view_close_send(const agoq_net_view* v, void* c);
ncclResult_t agoq_view_close_recv(const agoq_net_view* v, void* c);
ncclResult_t agoq_view_close_listen(const agoq_net_view* v, void* c);
/* v11+ only (op/algo/proto as NCCL sets them; peer and flow hints undefined); older
 * versions have no setNetAttr: ncclInvalidUsage. */
ncclResult_t agoq_view_set_attr(const agoq_net_view* v, void* ctx, uint32_t op, uint32_t algo,
                                uint32_t proto);

/* ---- collnet view ---- */

typedef struct {
  int version;
  const void* table; /* const ncclCollNet_v<version>_t* */
  const char* name;
} agoq_collnet_view;

int agoq_netlib_collnet_view(agoq_netlib* lib, int version, agoq_collnet_view* view);
/* Same conventions as the net view: v11+ per communicator, older *ctx = NULL. */
ncclResult_t agoq_collnet_view_init(const agoq_collnet_view* v, void** ctx, uint64_t comm_id,
                                    ncclDebugLogger_t log);
ncclResult_t agoq_collnet_view_finalize(const agoq_collnet_view* v, void* ctx);
ncclResult_t agoq_collnet_view_devices(const agoq_collnet_view* v, int* ndev);
ncclResult_t agoq_collnet_view_get_properties(const agoq_collnet_view* v, int dev,
                                              agoq_view_props* p);
/* ctx is ignored by versions before v11. The handle buffer is NCCL's 128 bytes. */
ncclResult_t agoq_collnet_view_listen(const agoq_collnet_view* v, void* ctx, int dev,
                                      void* handle, void** listen_comm);
/* Group creation, called once (not polled) with every node head's listen handle, as
 * NCCL's proxy does; blocks until the group exists or fails. */
ncclResult_t agoq_collnet_view_connect(const agoq_collnet_view* v, void** handles, int nranks,
                                       int rank, void* listen_comm, void** coll_comm);
ncclResult_t agoq_collnet_view_reduce_support(const agoq_collnet_view* v, ncclDataType_t dtype,
                                              ncclRedOp_t op, int* supported);
/* v6..v7 take an int size: a size above INT_MAX is refused with ncclInvalidArgument
 * before the plugin is called. */
ncclResult_t agoq_collnet_view_reg_mr(const agoq_collnet_view* v, void* coll_comm, void* data,
                                      size_t size, int type, void** mhandle);
ncclResult_t agoq_collnet_view_dereg_mr(const agoq_collnet_view* v, void* coll_comm,
                                        void* mhandle);
/* v6..v8 take an int count: a count above INT_MAX is refused with ncclInvalidArgument. */
ncclResult_t agoq_collnet_view_iallreduce(const agoq_collnet_view* v, void* coll_comm,
                                          void* send_data, void* recv_data, size_t count,
                                          ncclDataType_t dtype, ncclRedOp_t op,
                                          void* send_mhandle, void* recv_mhandle,
                                          void** request);

/* One scatter-gather entry of iallgather/ireducescatter in every version's shape. */
typedef struct {
  void* mhandle;
  void* address;
  size_t size;
} agoq_view_sge;
/* NCCL passes exactly one part; the view accepts a few more so a test can pass n > 1. */
#define AGOQ_VIEW_MAX_SGES 8

/* Whether the table has iallgather and ireducescatter: v8+ tables that fill them in
 * (NCCL treats NULL members as "not supported"). */
int agoq_collnet_view_has_gather_scatter(const agoq_collnet_view* v);
/* The window [window_offset, window_offset + window_bytes) of the global buffer of
 * nranks * bytes_per_rank bytes, as NCCL's proxy passes it. Versions without the member
 * (v6, v7, or a NULL member) return ncclInvalidUsage without calling anything; v8's
 * uint32 SGE size makes a part above UINT32_MAX ncclInvalidArgument; more than
 * AGOQ_VIEW_MAX_SGES parts is ncclInvalidArgument. */
ncclResult_t agoq_collnet_view_iallgather(const agoq_collnet_view* v, void* coll_comm,
                                          void* send_data, int n_recv_parts,
                                          const agoq_view_sge* recv_parts,
                                          size_t bytes_per_rank, size_t window_offset,
                                          size_t window_bytes, void* send_mhandle,
                                          void** request);
ncclResult_t agoq_collnet_view_ireducescatter(const agoq_collnet_view* v, void* coll_comm,
                                              int n_send_parts, const agoq_view_sge* send_parts,
                                              void* recv_data, size_t bytes_per_rank,
                                              size_t window_offset, size_t window_bytes,
                                              ncclDataType_t dtype, ncclRedOp_t op,
                                              void* recv_mhandle, void** request);
ncclResult_t agoq_collnet_view_iflush(const agoq_collnet_view* v, void* coll_comm, void* data,
                                      int size, void* mhandle, void** request);
/* size may be NULL (NCCL passes NULL for flush requests). */
ncclResult_t agoq_collnet_view_test(const agoq_collnet_view* v, void* request, int* done,
                                    int* size);
ncclResult_t agoq_collnet_view_close_coll(const agoq_collnet_view* v, void* coll_comm);
ncclResult_t agoq_collnet_view_close_listen(const agoq_collnet_view* v, void* listen_comm);

#ifdef __cplusplus
}
#endif
#endif
