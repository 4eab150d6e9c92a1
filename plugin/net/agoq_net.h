/*
 * The version-neutral net core. Every exported ncclNetPlugin_vN table is a thin adapter
 * over these functions (plugin/tables/); nothing here knows which ABI version called.
 * Semantics follow NCCL's net contract: connect/accept/isend/irecv never block, a NULL
 * comm or request means "call again", test() polls.
 */
#ifndef AGOQ_NET_H
#define AGOQ_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

#include "transport/agoq_transport.h"

#define AGOQ_PLUGIN_NAME "AGOQ"
#define AGOQ_NET_MAX_RECVS AGOQ_XFER_MAX_BUFS /* grouped receives per irecv */
#define AGOQ_NET_MAX_VDEVS AGOQ_TP_MAX_VDEVS  /* fused-NIC children we can describe */

/* Device properties in a version-neutral form (the transport's); adapters copy them into
 * ncclNetProperties_vN_t. */
typedef agoq_tp_props agoq_net_props;

/* Per-communicator hints from NCCL (v11+ setNetAttr); stored in the ctx. */
typedef struct {
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} agoq_net_attr;

/* init: v11+ calls it once per communicator (comm_id = NCCL's commHash, equal on all
 * ranks); older versions once per process with comm_id 0. Loads and validates AGOQ_*
 * parameters and discovers interfaces on the first call; an invalid parameter or no
 * usable interface fails it. *ctx receives a per-communicator context. */
ncclResult_t agoq_net_init(void** ctx, uint64_t comm_id, int traffic_class,
                           ncclDebugLogger_t log_fn, ncclProfilerCallback_t prof_fn);
/* Copes with NULL (failed or absent init). */
ncclResult_t agoq_net_finalize(void* ctx);
ncclResult_t agoq_net_devices(int* ndev);
ncclResult_t agoq_net_get_properties(int dev, agoq_net_props* props);
ncclResult_t agoq_net_set_attr(void* ctx, const agoq_net_attr* attr);

/* The process-wide context used by ABI versions whose listen/connect carry no ctx
 * (v6..v10). Created by the first legacy init. */
void* agoq_net_legacy_ctx(void);
ncclResult_t agoq_net_legacy_init(ncclDebugLogger_t log_fn, ncclProfilerCallback_t prof_fn);

/* AGOQ_PLACEMENT=auto: the CPUs of device `dev`'s NUMA node that this process may use, for
 * threads that work for that NIC (CollNet's engine). False (out cleared) when placement is
 * off, the node is unknown, or none of its CPUs is allowed: then do not pin. */
#include <sched.h>
bool agoq_net_placement_cpus(int dev, cpu_set_t* out);
/* Threads the transport keeps for itself (its progress threads); 0 before init. */
int agoq_net_helper_threads(void);
/* File descriptors one connection of a listen with these flags holds at each end. */
unsigned agoq_net_conn_fds(unsigned listen_flags);

ncclResult_t agoq_net_listen(void* ctx, int dev, void* handle, void** listen_comm);
/* The same with the transport's listen flags (AGOQ_TP_LISTEN_INLINE: CollNet), and
 * AGOQ_NET_TAGGED for the receive comms it accepts. */
ncclResult_t agoq_net_listen_flags(void* ctx, int dev, unsigned flags, void* handle, void** listen_comm);
/* Listen flag of the net core's own (the transport never sees it): the accepted receive
 * comms match each message to the posted receive of the same tag, whatever the order of
 * posting, as MPI does; a message whose receive is not posted yet waits in a bounded
 * queue of the comm's (agoq_net_tagged.c). NCCL's own comms match in posting order. For a
 * user that multiplexes several streams on one connection (CollNet: a chunk's
 * contributions and its results, one connection per peer and direction). */
#define AGOQ_NET_TAGGED 0x10000u
/* The part of a caller's flags that is the transport's (AGOQ_TP_*). */
static inline unsigned agoq_net_tp_flags(unsigned flags) { return flags & ~AGOQ_NET_TAGGED; }
/* A tagged comm's depth: the receives it has in flight at most (more: NCCL's NULL request,
 * call again), and the messages it holds whose receive is not posted yet (more wait in the
 * transport, and the sender with them). */
#define AGOQ_NET_TAGGED_DEPTH AGOQ_TP_FEW_DEPTH
/* On a tagged comm, a receive that takes the oldest message of any tag. */
#define AGOQ_NET_TAG_ANY (-1)
/* The comm's traffic is not p2p (CollNet's own connections): keep it off the net
 * context's p2p statistics lines. */
void agoq_net_stats_detach(void* comm);
ncclResult_t agoq_net_connect(void* ctx, int dev, void* handle, void** send_comm);
/* The same with the transport's connect flags (AGOQ_TP_FEW: CollNet). */
ncclResult_t agoq_net_connect_flags(void* ctx, int dev, unsigned flags, void* handle, void** send_comm);
/* Abandons a connect still in progress on this handle buffer: closes its sockets and frees
 * its state; a no-op when there is none. For callers that give up waiting (CollNet group
 * creation timeout); NCCL itself never abandons a connect. */
#define AGOQ_NET_HAS_CONNECT_ABORT 1
void agoq_net_connect_abort(void* handle);
ncclResult_t agoq_net_accept(void* listen_comm, void** recv_comm);
ncclResult_t agoq_net_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t agoq_net_reg_mr_dmabuf(void* comm, void* data, size_t size, int type,
                                    uint64_t offset, int fd, void** mhandle);
ncclResult_t agoq_net_dereg_mr(void* comm, void* mhandle);
/* Host memory of a user of the net core that is not NCCL (CollNet's own buffers, and
 * NCCL's buffers registered through CollNet), registered with the transport of device dev
 * for transfers on any of its comms: the transport then finds it when such a transfer
 * comes without a handle, instead of registering for the message. *key is NULL where the
 * transport registers nothing. Setup only. */
ncclResult_t agoq_net_reg_host(int dev, void* data, size_t size, void** key);
void agoq_net_dereg_host(void* key); /* NULL is a no-op */
ncclResult_t agoq_net_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                            void* phandle, void** request);
ncclResult_t agoq_net_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                            void** mhandles, void** phandles, void** request);
ncclResult_t agoq_net_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                             void** request);
ncclResult_t agoq_net_test(void* request, int* done, int* sizes);
/* Tagged comms only (not NCCL's contract): a receive whose buffer holds size bytes that
 * takes a message of up to max bytes; one larger than size goes into a buffer of its own
 * instead of data. agoq_net_test_spill tests any request as agoq_net_test does, and sets
 * *spill to that buffer (the caller's then, freed with free()), or to NULL when the bytes are
 * in data or the request is not such a receive. CollNet posts
 * receives at a frame's size when its blocks compress, not at every block's raw size. */
ncclResult_t agoq_net_irecv_spill(void* recv_comm, void* data, size_t size, size_t max, int tag, void** request);
ncclResult_t agoq_net_test_spill(void* request, int* done, int* size, uint8_t** spill);
/* For our own threads (CollNet's engine) that would sleep rather than poll test(): the
 * descriptors whose readiness lets this comm's posted requests progress (at most max, the
 * count returned); *hidden is set when helper threads make progress no descriptor
 * announces (then sleep only briefly). Not part of NCCL's contract. */
int agoq_net_wait_fds(void* comm, struct pollfd* out, int max, bool* hidden);
ncclResult_t agoq_net_close_send(void* send_comm);
ncclResult_t agoq_net_close_recv(void* recv_comm);
ncclResult_t agoq_net_close_listen(void* listen_comm);

#endif
