/*
 * Requests and their pool. Each comm owns a fixed pool sized for NCCL's contract
 * (NCCL_NET_MAX_REQUESTS x maxRecvs sends, NCCL_NET_MAX_REQUESTS receives): no allocation
 * on the data path, and an exhausted pool makes isend/irecv return a NULL request, which
 * NCCL treats as "try again".
 */
#ifndef AGOQ_REQUEST_H
#define AGOQ_REQUEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"
#include "gpu/agoq_gpu_pool.h"
#include "net/agoq_net.h"
#include "transport/agoq_transport.h"

#define AGOQ_REQUESTS_PER_COMM AGOQ_XFER_MAX_POSTED
_Static_assert(AGOQ_NET_MAX_RECVS == AGOQ_XFER_MAX_BUFS, "a grouped receive is one transfer");

struct agoq_comm;

typedef enum { AGOQ_REQ_FREE = 0, AGOQ_REQ_SEND, AGOQ_REQ_RECV } agoq_request_kind;

/* Where a request with device buffers is (agoq_net_device.c); host requests stay at WIRE. */
typedef enum {
  AGOQ_DEV_WIRE = 0,  /* with the transport */
  AGOQ_DEV_COPY_IN,   /* send: NCCL's device buffer is being copied into the staging */
  AGOQ_DEV_COPY_OUT   /* receive: the staging is being copied into NCCL's device buffer */
} agoq_dev_phase;

typedef struct agoq_request {
  uint32_t magic;              /* AGOQ_REQUEST_MAGIC while in use: catches stale pointers */
  agoq_request_kind kind;
  struct agoq_comm* comm;
  /* What the transport moves: NCCL's buffer, or the staging buffer holding its frame. Its
   * index is the request's pool index. */
  agoq_xfer xfer;
  int n_bufs;                          /* 1 for a send, 1..8 for a grouped receive */
  uint8_t* data[AGOQ_NET_MAX_RECVS];   /* NCCL's buffers */
  size_t posted[AGOQ_NET_MAX_RECVS];   /* receive capacities; send size in [0] */
  int tags[AGOQ_NET_MAX_RECVS];
  /* Typed payloads: the staging buffer holding the frame (sender: [0]; receiver: per
   * buffer), -1 when the bytes go straight from / into NCCL's buffer. */
  int stage[AGOQ_NET_MAX_RECVS];
  /* Device buffers (agoq_net_device.c): bit i set when NCCL's buffer i is device memory;
   * its bytes pass through host[i], pinned staging of the comm's GPU link. */
  uint8_t dev_mask;
  uint8_t frame_mask;                  /* receive: buffer i's message is a frame in host[i] */
  uint8_t* host[AGOQ_NET_MAX_RECVS];
  int ring_id;                         /* the staging allocation in the link's share, -1 none */
  agoq_gpu_pool_piece pool_piece;      /* or in the GPU's pinned pool (chunk -1: none) */
  /* receive: buffer i's staging taken when its message arrived (a GPUDirect buffer larger
   * than the staging, whose message did not come by RDMA), -1 none */
  int late_ring[AGOQ_NET_MAX_RECVS];
  agoq_gpu_pool_piece late_piece[AGOQ_NET_MAX_RECVS];
  /* Staged device messages larger than the staging (registered buffers: NCCL sends up to
   * NCCL_MAX_NET_SIZE, 1 GiB, per isend) pass through a host bounce buffer per NCCL buffer
   * (bounce[i], malloc'd), copied across PCIe in pieces through piece_host, piece_cap bytes
   * of this request's staging (agoq_net_device.c). The transport moves the bounce buffer as
   * one message; one that moves only registered memory (verbs) has it registered for the
   * message (bounce_key[i]). */
  uint8_t bounce_mask;                 /* buffer i's bytes are in bounce[i] */
  bool bounce_held;                    /* counted in agoq_comm.bounce_reqs */
  uint8_t* bounce[AGOQ_NET_MAX_RECVS];
  void* bounce_key[AGOQ_NET_MAX_RECVS]; /* its registration with the transport, NULL none */
  uint8_t* piece_host;
  size_t piece_cap;
  int piece_buf;                       /* the buffer whose pieces are moving, -1 none yet */
  size_t piece_off, piece_len;         /* its bytes done, and the piece in flight (0 none) */
  bool piece_frame;                    /* receive: a frame took the piece area */
  /* receive: NCCL's kernel polls this buffer's flags without waiting for the receive (LL,
   * LL128: irecv found NCCL_NET_OPTIONAL_RECV_COMPLETION), so a staged copy into device
   * memory lands each line's flag word last (agoq_gpu_copy_h2d_flags_last) */
  bool polled;
  agoq_dev_phase phase;
  bool dev_frame;                      /* send: the GPU is encoding a frame into host[0] */
  /* send: the transfer is complete and waits only for the device sends queued before it
   * (agoq_dev_advance posts it in order) */
  bool ready;
  /* receive: buffer i is GPU memory the transport reaches (GPUDirect RDMA) ... */
  uint8_t direct_ok;
  /* ... and its message went straight into it: no copy out, a flush where NCCL asks */
  uint8_t direct_mask;
  int dev_why;                         /* send going exact: its agoq_exact_reason */
  size_t actual[AGOQ_NET_MAX_RECVS];   /* receiver: sizes to report once copied out */
  bool tag_done;                       /* receive on a tagged comm: the bytes are in (actual[0]) */
  /* receive on a tagged comm (agoq_net_irecv_spill): a message up to spill_max bytes is
   * accepted; one larger than posted[0] lands in `spill` (malloc'd, its size) instead of
   * data[0], handed to the caller by agoq_net_test_spill (freed here if it never is) */
  size_t spill_max;
  uint8_t* spill;
  int64_t post_ns;             /* AGOQ_STATS: when isend/irecv posted it */
  bool quantized;              /* AGOQ_STATS: a frame went or came (wire time per path) */
  uint32_t pool_index;
} agoq_request;

#define AGOQ_REQUEST_MAGIC 0x52514741u

/* Requests are allocated in blocks as the pool first hands out their indices: a request is
 * about 1 KB, NCCL's contract sizes a pool at 256, and most connections keep a few in
 * flight (a CollNet group's at most AGOQ_COLL_SLOTS on each of thousands of connections).
 * A pool has at most AGOQ_REQUEST_BLOCKS_MAX blocks: of one request up to that capacity
 * (CollNet's 16), of 4 for NCCL's 256. */
#define AGOQ_REQUEST_BLOCKS_MAX 64
_Static_assert(AGOQ_REQUESTS_PER_COMM % AGOQ_REQUEST_BLOCKS_MAX == 0, "whole blocks");

typedef struct {
  agoq_request* blocks[AGOQ_REQUEST_BLOCKS_MAX]; /* NULL until one of its indices is used */
  uint32_t block;                                /* requests per block */
  uint32_t nblocks; /* one past the highest block allocated: what agoq_request_valid searches */
  uint32_t* free_stack;
  uint32_t free_count;
  uint32_t capacity;
} agoq_request_pool;

/* capacity: at most AGOQ_REQUESTS_PER_COMM. */
ncclResult_t agoq_request_pool_init(agoq_request_pool* pool, uint32_t capacity);
void agoq_request_pool_fini(agoq_request_pool* pool);
/* *out NULL when all requests are in use (NCCL retries); ncclSystemError when the memory
 * for a new block cannot be had. The request is zeroed except for its pool index. */
ncclResult_t agoq_request_alloc(agoq_request_pool* pool, agoq_request_kind kind, struct agoq_comm* comm,
                                agoq_request** out);
/* The request at `index`, NULL where its block was never allocated (so never in use). */
agoq_request* agoq_request_at(const agoq_request_pool* pool, uint32_t index);
void agoq_request_release(agoq_request_pool* pool, agoq_request* req);
uint32_t agoq_request_in_use(const agoq_request_pool* pool);
/* True when `req` points at a live request of this pool (NCCL handed back our pointer). */
bool agoq_request_valid(const agoq_request_pool* pool, const agoq_request* req);

#endif
