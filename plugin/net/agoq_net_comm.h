/*
 * Internal state of the net core: per-communicator context, listen endpoints and the send
 * and receive comms NCCL holds. Each comm wraps one transport connection
 * (transport/agoq_transport.h) and adds what NCCL's contract defines: requests, typed
 * frames, statistics.
 */
#ifndef AGOQ_NET_COMM_H
#define AGOQ_NET_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "core/agoq_stats.h"
#include "gpu/agoq_gpu.h"
#include "net/agoq_net.h"
#include "net/agoq_request.h"
#include "net/agoq_typed.h"
#include "transport/agoq_transport.h"

#define AGOQ_CTX_MAGIC 0x58544341u    /* "ACTX" */
#define AGOQ_NLISTEN_MAGIC 0x4e4c4e41u /* "ANLN" */
#define AGOQ_SEND_MAGIC 0x444e5341u   /* "ASND" */
#define AGOQ_RECV_MAGIC 0x56435241u   /* "ARCV" */
#define AGOQ_MR_MAGIC 0x52524d41u     /* "AMRR" */

typedef struct {
  uint32_t magic;
  uint64_t comm_id;
  int traffic_class;
  agoq_net_attr attr;
  ncclProfilerCallback_t prof_fn; /* NCCL's profiler callback (v10+), NULL before */
  agoq_stats_entry* st_send;      /* AGOQ_STATS: this context's p2p lines, else NULL */
  agoq_stats_entry* st_recv;
} agoq_ctx;

/* The transport every device of this process uses (fixed at the first init). */
extern const agoq_transport* agoq_net_tp;

typedef struct {
  uint32_t magic;
  int type;   /* NCCL_PTR_HOST or NCCL_PTR_CUDA */
  int device; /* NCCL_PTR_CUDA: the CUDA ordinal holding it; else -1 */
  void* addr;
  size_t size;
  void* tp_key; /* its registration with the transport (NULL where none): host memory, or
                 device memory registered by DMA-BUF (direct) */
  /* GPU memory the transport's HCA reaches itself (regMrDmaBuf): exact messages go from
   * and into it without staging (GPUDirect RDMA); frames and inline ones still stage. */
  bool direct;
} agoq_mr;

typedef struct {
  uint32_t magic;
  int dev;
  agoq_tp_listen* tp;
  unsigned flags;            /* the listen's (AGOQ_TP_*), for the comms it accepts */
  agoq_stats_entry* st_recv; /* its context's, for the comms it accepts */
} agoq_listen_comm;

typedef struct agoq_comm {
  uint32_t magic;
  bool is_send;
  int dev;
  agoq_tp_conn* tp;
  bool error_reported;
  agoq_request_pool pool;
  /* Typed payloads (agoq_typed.h). */
  ncclProfilerCallback_t prof_fn; /* sender: the oracle's way into NCCL's profiler */
  agoq_stage_cache stage;
  agoq_typed_stats typed_stats;
  agoq_stats_entry* st; /* AGOQ_STATS: the context's p2p send or receive entry, else NULL */
  /* Device buffers (agoq_net_device.c): the link is created by the first regMr of device
   * memory; sends whose copy into the staging is queued wait here, oldest first, so that
   * they reach the transport in NCCL's order, and so do the sends posted behind them that
   * need no copy (host buffers, GPUDirect ones: agoq_request.ready). */
  agoq_gpu_link* gpu;
  void* gpu_key; /* the link's pinned staging, registered with the transport */
  uint32_t* dev_fifo; /* AGOQ_REQUESTS_PER_COMM pool indices, allocated with the link */
  uint32_t dev_first, dev_count;
  /* Requests holding a bounce buffer (agoq_request.bounce): at most one per connection, so
   * that host memory grows with the connections, not with NCCL's requests in flight; the
   * next such request waits (NCCL retries), in the order the connection keeps anyway. */
  uint32_t bounce_reqs;
  /* Bounce buffers registered with the transport for their message (verbs: a registration
   * on the data path, slow on hardware; said once per connection at INFO). */
  uint64_t bounce_regs;
  /* AGOQ_NET_TAGGED receive comms: matching by tag (agoq_net_tagged.c); NULL otherwise. */
  struct agoq_tagq* tagq;
} agoq_comm;

/* Wraps a new transport connection (takes it over; closes it on failure). */
ncclResult_t agoq_comm_create(bool is_send, int dev, agoq_tp_conn* tp, unsigned flags, agoq_comm** out);
void agoq_comm_destroy(agoq_comm* comm);
const char* agoq_comm_peer(const agoq_comm* comm);
/* The transport's registration of a host buffer NCCL registered (mhandle from regMr), when
 * it covers [data, data+size); else NULL (the transport registers for the message). */
void* agoq_mr_key(const void* mhandle, const void* data, size_t size);
/* The receive side's agoq_tp_match_fn (arg: the comm): NCCL's matching rules. */
ncclResult_t agoq_net_match(void* arg, agoq_xfer* x, int tag, uint64_t size, uint32_t flags, int* slot, uint8_t** dst);


/* ---- tagged receive comms (agoq_net_tagged.c) ---- */

/* Receives a tagged comm keeps posted with the transport, and so the most messages that may
 * wait on it for their receive; also its request pool's size (every receive posted can wait
 * for a message). */
#define AGOQ_TAGQ_LANDINGS AGOQ_NET_TAGGED_DEPTH
typedef struct agoq_tagq agoq_tagq;
/* Makes comm (a receive comm, nothing posted yet) tagged: takes over the transport's match. */
ncclResult_t agoq_tagq_create(agoq_comm* comm);
/* After the transport is closed: frees the messages still held. */
void agoq_tagq_destroy(agoq_comm* comm);
/* Close, while the transport can still name the peer: messages that waited, at INFO. */
void agoq_tagq_log(const agoq_comm* comm);
/* irecv of req (one host buffer, its tag in tags[0], AGOQ_NET_TAG_ANY for any): takes a
 * message already held, or waits for one. */
ncclResult_t agoq_tagq_irecv(agoq_comm* comm, agoq_request* req);
/* test: *done once req's bytes are in its buffer (size in req->actual[0]). */
ncclResult_t agoq_tagq_test(agoq_comm* comm, agoq_request* req, bool* done);

/* ---- device buffers (agoq_net_device.c) ---- */

/* regMr of NCCL_PTR_CUDA memory: checks the range with the runtime, creates the comm's GPU
 * link on first use, fills mr. */
ncclResult_t agoq_dev_reg(agoq_comm* comm, void* data, size_t size, agoq_mr* mr);
/* regMrDmaBuf of NCCL_PTR_CUDA memory with a transport that registers dma-bufs: as
 * agoq_dev_reg, then the NIC's registration (mr->direct; a failure is warned about and
 * leaves the buffer staged). */
ncclResult_t agoq_dev_reg_dmabuf(agoq_comm* comm, void* data, size_t size, uint64_t offset, int fd, agoq_mr* mr);
/* The handle is GPU memory the transport reaches directly (GPUDirect RDMA): sends from it
 * skip the staging; receives into it too where the GPU can flush the NIC's writes
 * (agoq_dev_direct_recv), and only those need iflush. */
bool agoq_dev_direct(const void* mhandle);
bool agoq_dev_direct_recv(const agoq_comm* comm, const void* mhandle);
/* iflush: makes the NIC's writes into the direct buffers among mhandles visible to the GPU. */
ncclResult_t agoq_dev_flush(agoq_comm* comm, int n, void** mhandles);
/* A send whose transfer is complete: to the transport now, or behind the device sends
 * still being staged (NCCL's order). */
ncclResult_t agoq_dev_post_ready(agoq_comm* comm, agoq_request* req);
/* The registered handle says device memory, and [data, data+size) lies inside it (an
 * error result otherwise). */
ncclResult_t agoq_dev_is_device(const void* mhandle, const void* data, size_t size, bool* device);
/* Sender, after the request is allocated: stages NCCL's device buffer (queues the copy;
 * one larger than the staging in pieces, into a host bounce buffer).
 * *again: the staging is full now, or the connection's bounce buffer is taken; release the
 * request and let NCCL retry. */
ncclResult_t agoq_dev_send_start(agoq_comm* comm, agoq_request* req, void* data, size_t size, void* mhandle,
                                 void* phandle, bool* again);
/* Receiver: reserves the staging for the buffers in req->dev_mask, but for GPUDirect ones
 * (req->direct_ok) larger than the staging: their messages come by RDMA, whatever the size
 * NCCL posts; staged ones larger than the staging get a host bounce buffer each and a part
 * of the staging for their pieces; *again as above. */
ncclResult_t agoq_dev_recv_start(agoq_comm* comm, agoq_request* req, bool* again);
/* Receiver, as buffer `slot`'s message of `size` bytes arrives: its staging (req->host[slot]),
 * taken now where irecv took none (a GPUDirect buffer larger than the staging whose message
 * is a frame or a CPU copy). An error naming AGOQ_GPU_STAGING where it cannot be had. */
ncclResult_t agoq_dev_recv_late(agoq_comm* comm, agoq_request* req, int slot, size_t size);
/* Receiver, as a frame of `size` bytes arrives for device buffer `slot`: where it lands, in
 * pinned memory the GPU decodes from (agoq_dev_recv_late, or for a bounced buffer the piece
 * area). */
ncclResult_t agoq_dev_recv_frame_place(agoq_comm* comm, agoq_request* req, int slot, size_t size);
/* The transport's registration of where device buffer `slot`'s exact bytes land. */
void* agoq_dev_recv_key(const agoq_comm* comm, const agoq_request* req, int slot);
/* Hands sends whose copy finished to the transport, in posting order. */
ncclResult_t agoq_dev_advance(agoq_comm* comm);
/* Receiver: the bytes are in the staging (frames decoded there): queues the copies into
 * NCCL's buffers (*queued; false when every buffer came by GPUDirect RDMA). */
ncclResult_t agoq_dev_recv_copy_out(agoq_comm* comm, agoq_request* req, bool* queued);
/* The request's copy is done (only queries the event). */
ncclResult_t agoq_dev_copied(agoq_comm* comm, agoq_request* req, bool* done);
/* Gives back the request's staging and bounce buffers. */
void agoq_dev_release(agoq_comm* comm, agoq_request* req);
/* Close: what the link moved, at INFO (while the transport can still name the peer). */
void agoq_dev_log(agoq_comm* comm);
/* Close, after the transport: frees the link (waits for its queued copies). */
void agoq_dev_close(agoq_comm* comm);
/* The transfer and statistics of a send (agoq_net_data.c): as it is (why: the reason it is
 * not a frame), or as a frame standing for size bytes; agoq_send_account: the statistics
 * alone, on AGOQ_STATS_EXACT or AGOQ_STATS_QUANT. */
void agoq_send_exact(agoq_comm* comm, agoq_request* req, const uint8_t* src, size_t size, agoq_exact_reason why);
void agoq_send_frame(agoq_comm* comm, agoq_request* req, const uint8_t* frame, size_t frame_len, size_t size,
                     uint64_t codec_ns, uint64_t crc_ns);
void agoq_send_account(agoq_comm* comm, agoq_request* req, int path, size_t size, size_t wire_size,
                       uint64_t codec_ns, uint64_t crc_ns);

#endif
