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
#include "net/agoq_net.h"
#include "net/agoq_wire.h"

#define AGOQ_REQUESTS_PER_COMM (NCCL_NET_MAX_REQUESTS * AGOQ_NET_MAX_RECVS)

struct agoq_comm;

typedef enum { AGOQ_REQ_FREE = 0, AGOQ_REQ_SEND, AGOQ_REQ_RECV } agoq_request_kind;

typedef struct agoq_request {
  uint32_t magic;              /* AGOQ_REQUEST_MAGIC while in use: catches stale pointers */
  agoq_request_kind kind;
  struct agoq_comm* comm;
  int n;                       /* buffers: 1 for a send, 1..8 for a grouped receive */
  uint8_t* data[AGOQ_NET_MAX_RECVS];
  size_t posted[AGOQ_NET_MAX_RECVS];   /* receive capacities; send size in [0] */
  size_t actual[AGOQ_NET_MAX_RECVS];   /* bytes matched to each receive buffer */
  int tags[AGOQ_NET_MAX_RECVS];
  uint32_t matched_mask;       /* receive buffers a message has been matched to */
  /* Payload pieces handed to progress threads and not finished yet; the request is done
   * when this is 0 and the control-socket work (header, inline bytes) is finished. */
  atomic_int pending_pieces;
  bool control_done;
  /* Sender: the encoded header and inline payload still to write on the control socket. */
  uint8_t wire_hdr[AGOQ_MSG_HDR_SIZE];
  size_t ctrl_sent, ctrl_total;
  /* Typed payloads: the staging buffer holding the frame (sender: [0]; receiver: per
   * buffer), -1 when the bytes go straight from / into NCCL's buffer. */
  int stage[AGOQ_NET_MAX_RECVS];
  int64_t post_ns;             /* AGOQ_STATS: when isend/irecv posted it */
  bool quantized;              /* AGOQ_STATS: a frame went or came (wire time per path) */
  uint32_t pool_index;
} agoq_request;

#define AGOQ_REQUEST_MAGIC 0x52514741u

typedef struct {
  agoq_request* slots;
  uint32_t* free_stack;
  uint32_t free_count;
  uint32_t capacity;
} agoq_request_pool;

ncclResult_t agoq_request_pool_init(agoq_request_pool* pool, uint32_t capacity);
void agoq_request_pool_fini(agoq_request_pool* pool);
/* NULL when all requests are in use. The request is zeroed except for its pool index. */
agoq_request* agoq_request_alloc(agoq_request_pool* pool, agoq_request_kind kind, struct agoq_comm* comm);
void agoq_request_release(agoq_request_pool* pool, agoq_request* req);
uint32_t agoq_request_in_use(const agoq_request_pool* pool);
/* True when `req` points at a live request of this pool (NCCL handed back our pointer). */
bool agoq_request_valid(const agoq_request_pool* pool, const agoq_request* req);

/* A FIFO of request pointers in posting order (headers to write, receives to match). */
typedef struct {
  agoq_request* items[AGOQ_REQUESTS_PER_COMM];
  uint32_t head, count;
} agoq_request_fifo;

static inline bool agoq_fifo_push(agoq_request_fifo* f, agoq_request* r) {
  if (f->count == AGOQ_REQUESTS_PER_COMM) return false;
  f->items[(f->head + f->count) % AGOQ_REQUESTS_PER_COMM] = r;
  f->count++;
  return true;
}
static inline agoq_request* agoq_fifo_front(const agoq_request_fifo* f) {
  return f->count ? f->items[f->head] : NULL;
}
static inline void agoq_fifo_pop(agoq_request_fifo* f) {
  f->head = (f->head + 1) % AGOQ_REQUESTS_PER_COMM;
  f->count--;
}

#endif
