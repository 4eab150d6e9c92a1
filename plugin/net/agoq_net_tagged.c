/*
 * Tagged receive comms (AGOQ_NET_TAGGED): each message goes to the posted receive of its
 * tag, whatever the order the receives were posted in, so one connection can carry several
 * streams whose messages interleave by timing (CollNet: a chunk's contributions and the
 * results of an earlier chunk, one connection per peer and direction instead of one per
 * phase).
 *
 * The transport matches in posting order only, so NCCL's requests are not what it sees.
 * The comm keeps AGOQ_TAGQ_LANDINGS receives of its own ("landings") posted with the
 * transport at all times; when a message's header arrives on a landing, match() looks for
 * the user's receive of that tag:
 *  - posted already: the bytes go straight into the user's buffer (no copy);
 *  - not yet: into a buffer at least the message's size, held by the landing until a
 *    receive of that tag claims it (one copy). Freed buffers are kept for the next ones (at
 *    most AGOQ_TAGQ_SPARE): with few peers a message is large (a 2-rank group's is half a
 *    chunk) and often early, and a fresh allocation of that size is a fresh mapping whose
 *    every page faults.
 * A receive posted with agoq_net_irecv_spill accepts a message larger than its buffer, up to
 * its maximum: such a message goes into a buffer of its own size (the held one, when it came
 * early, without a copy), which test hands to the caller. CollNet posts its receives at the
 * size of a frame whose blocks compress, instead of reserving every block's raw worst case.
 * A landing holding an unclaimed message is not posted again, so at most AGOQ_TAGQ_LANDINGS
 * messages per connection are ever waiting; beyond that the transport's own flow control
 * holds the sender (TCP's socket buffers, the verbs ring's credits). A user must therefore
 * never have more messages outstanding toward a tagged comm than that, counting those whose
 * receive is not posted: CollNet has at most one per pipeline slot and phase (checked where
 * it connects).
 *
 * Everything here runs on the thread that calls irecv or test (the transports call match
 * only from there), as NCCL's contract has it for one comm.
 */
#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"
#include "net/agoq_net_comm.h"

typedef enum {
  AGOQ_LAND_IDLE = 0, /* not with the transport */
  AGOQ_LAND_POSTED,   /* with the transport; `matched` once a header took it */
  AGOQ_LAND_HELD      /* an unclaimed message, all of it in `buf` */
} agoq_land_state;

typedef struct {
  agoq_xfer x; /* index: the landing's own, below AGOQ_TAGQ_LANDINGS */
  agoq_land_state state;
  bool matched;
  int tag;
  size_t size;
  uint64_t stamp;     /* arrival order of unexpected messages (AGOQ_NET_TAG_ANY takes the oldest) */
  agoq_request* req;  /* the receive the bytes are for; NULL: unclaimed */
  uint8_t* buf;       /* an unexpected message's bytes; NULL when they go into req's buffer */
  size_t buf_cap;
} agoq_landing;

/* Buffers kept for held messages once their message is claimed. */
#define AGOQ_TAGQ_SPARE 4

struct agoq_tagq {
  agoq_comm* comm;
  agoq_landing land[AGOQ_TAGQ_LANDINGS];
  /* Receives posted that no message matched yet, in posting order. */
  agoq_request* waiting[AGOQ_TAGQ_LANDINGS];
  int nwaiting;
  uint64_t stamps;
  uint64_t unexpected; /* messages that arrived before their receive: said at close */
  uint64_t spilled;    /* messages larger than their receive's buffer (agoq_net_irecv_spill) */
  uint8_t* spare[AGOQ_TAGQ_SPARE];
  size_t spare_cap[AGOQ_TAGQ_SPARE];
  int nspare;
};

/* A buffer of at least size bytes for a held message: a kept one when it is large enough. */
static uint8_t* agoq_tagq_buf_get(agoq_tagq* q, size_t size, size_t* cap) {
  if (size == 0) size = 1;
  for (int i = q->nspare - 1; i >= 0; i--) {
    if (q->spare_cap[i] < size) continue;
    uint8_t* p = q->spare[i];
    *cap = q->spare_cap[i];
    q->nspare--;
    q->spare[i] = q->spare[q->nspare];
    q->spare_cap[i] = q->spare_cap[q->nspare];
    return p;
  }
  *cap = size;
  return malloc(size);
}

static void agoq_tagq_buf_put(agoq_tagq* q, uint8_t* p, size_t cap) {
  if (q->nspare < AGOQ_TAGQ_SPARE) {
    q->spare[q->nspare] = p;
    q->spare_cap[q->nspare++] = cap;
    return;
  }
  /* Full: the smallest kept one makes room, if this one is larger. */
  int small = 0;
  for (int i = 1; i < q->nspare; i++)
    if (q->spare_cap[i] < q->spare_cap[small]) small = i;
  if (q->spare_cap[small] < cap) {
    free(q->spare[small]);
    q->spare[small] = p;
    q->spare_cap[small] = cap;
  } else {
    free(p);
  }
}

/* The peer, for log lines (asked of the transport: this file calls nothing else of the net
 * core's, so that setup and the data path can call it without a circle). */
static const char* agoq_tagq_peer(const agoq_comm* comm) { return agoq_net_tp->peer(comm->tp); }

static bool agoq_tag_fits(int posted, int tag) { return posted == AGOQ_NET_TAG_ANY || posted == tag; }

/* The largest message a receive takes: its buffer, or its spill maximum. */
static size_t agoq_tagq_max(const agoq_request* req) {
  return req->spill_max > req->posted[0] ? req->spill_max : req->posted[0];
}

static agoq_landing* agoq_landing_of(agoq_tagq* q, agoq_xfer* x) {
  if (x->index >= AGOQ_TAGQ_LANDINGS || &q->land[x->index].x != x) return NULL;
  return &q->land[x->index];
}

static ncclResult_t agoq_tagq_truncated(agoq_comm* comm, int tag, size_t size, size_t posted) {
  AGOQ_WARN("connection from %s: message truncated: peer sent %zu bytes with tag %d, receive posted for %zu",
            agoq_tagq_peer(comm), size, tag, posted);
  return ncclInvalidUsage;
}

/* The transport's match function on a tagged comm: x is one of the landings. */
static ncclResult_t agoq_tagq_match(void* arg, agoq_xfer* x, int tag, uint64_t size, uint32_t flags, int* slot,
                                    uint8_t** dst) {
  agoq_tagq* q = arg;
  agoq_comm* comm = q->comm;
  agoq_landing* l = agoq_landing_of(q, x);
  if (l == NULL || l->state != AGOQ_LAND_POSTED || l->matched) {
    AGOQ_WARN("connection from %s: the transport matched a message to a receive the tagged comm did not post",
              agoq_tagq_peer(comm));
    return ncclInternalError;
  }
  if (flags & AGOQ_XFER_FRAME) {
    /* Frames are NCCL's typed p2p, decoded into NCCL's buffers: never on a tagged comm. */
    AGOQ_WARN("connection from %s: a codec frame on a tagged connection", agoq_tagq_peer(comm));
    return ncclInvalidUsage;
  }
  l->matched = true;
  l->tag = tag;
  l->size = (size_t)size;
  for (int i = 0; i < q->nwaiting; i++) {
    agoq_request* req = q->waiting[i];
    if (!agoq_tag_fits(req->tags[0], tag)) continue;
    if (size > agoq_tagq_max(req)) return agoq_tagq_truncated(comm, tag, (size_t)size, agoq_tagq_max(req));
    memmove(&q->waiting[i], &q->waiting[i + 1], (size_t)(q->nwaiting - i - 1) * sizeof q->waiting[0]);
    q->nwaiting--;
    l->req = req;
    *slot = 0;
    if (size <= req->posted[0]) {
      *dst = req->data[0];
      x->reg[0] = req->xfer.reg[0];
      return ncclSuccess;
    }
    break; /* larger than its buffer: a buffer of its own, handed over at delivery */
  }
  /* Its receive is not posted yet (hold the bytes), or its buffer is too small (spill). */
  l->buf = agoq_tagq_buf_get(q, (size_t)size, &l->buf_cap);
  if (l->buf == NULL) {
    AGOQ_WARN("connection from %s: out of memory taking a %llu-byte message %s", agoq_tagq_peer(comm),
              (unsigned long long)size, l->req != NULL ? "larger than its receive's buffer" : "that arrived before its receive");
    return ncclSystemError;
  }
  if (l->req == NULL) {
    l->stamp = ++q->stamps;
    q->unexpected++;
  } else {
    q->spilled++;
  }
  *dst = l->buf;
  x->reg[0] = NULL;
  *slot = 0;
  return ncclSuccess;
}

ncclResult_t agoq_tagq_create(agoq_comm* comm) {
  agoq_tagq* q = calloc(1, sizeof *q);
  if (q == NULL) {
    AGOQ_WARN("out of memory creating a tagged receive comm");
    return ncclSystemError;
  }
  q->comm = comm;
  for (uint32_t i = 0; i < AGOQ_TAGQ_LANDINGS; i++) q->land[i].x.index = i;
  comm->tagq = q;
  agoq_net_tp->set_match(comm->tp, agoq_tagq_match, q);
  return ncclSuccess;
}

void agoq_tagq_destroy(agoq_comm* comm) {
  agoq_tagq* q = comm->tagq;
  if (q == NULL) return;
  for (unsigned i = 0; i < AGOQ_TAGQ_LANDINGS; i++) free(q->land[i].buf);
  for (int i = 0; i < q->nspare; i++) free(q->spare[i]);
  free(q);
  comm->tagq = NULL;
}

void agoq_tagq_log(const agoq_comm* comm) {
  const agoq_tagq* q = comm->tagq;
  if (q != NULL && (q->unexpected > 0 || q->spilled > 0))
    AGOQ_INFO(NCCL_NET, "connection from %s: %llu messages arrived before their receive was posted (held, then "
              "copied), %llu were larger than their receive's buffer (spilled)", agoq_tagq_peer(comm),
              (unsigned long long)q->unexpected, (unsigned long long)q->spilled);
}

/* Every idle landing back with the transport. */
static ncclResult_t agoq_tagq_post(agoq_tagq* q) {
  for (unsigned i = 0; i < AGOQ_TAGQ_LANDINGS; i++) {
    agoq_landing* l = &q->land[i];
    if (l->state != AGOQ_LAND_IDLE) continue;
    uint32_t index = l->x.index;
    memset(&l->x, 0, sizeof l->x);
    l->x.index = index;
    l->x.n = 1;
    l->matched = false;
    l->req = NULL;
    l->state = AGOQ_LAND_POSTED;
    ncclResult_t res = agoq_net_tp->post_recv(q->comm->tp, &l->x);
    if (res != ncclSuccess) {
      l->state = AGOQ_LAND_IDLE;
      return res;
    }
  }
  return ncclSuccess;
}

/* The landing's message is all in and claimed: a held one is copied into the receive's
 * buffer, the receive completes and the landing is free again. */
static void agoq_tagq_deliver(agoq_tagq* q, agoq_landing* l) {
  if (l->buf != NULL && l->size > l->req->posted[0]) {
    l->req->spill = l->buf; /* larger than the receive's buffer: handed over as it is */
    l->buf = NULL;
  } else if (l->buf != NULL) {
    if (l->size > 0) memcpy(l->req->data[0], l->buf, l->size);
    agoq_tagq_buf_put(q, l->buf, l->buf_cap);
    l->buf = NULL;
  }
  l->req->tag_done = true;
  l->req->actual[0] = l->size;
  l->req = NULL;
  l->state = AGOQ_LAND_IDLE;
}

/* Landings whose bytes are all in: their receive completes, or they hold the message. */
static void agoq_tagq_reap(agoq_tagq* q) {
  for (unsigned i = 0; i < AGOQ_TAGQ_LANDINGS; i++) {
    agoq_landing* l = &q->land[i];
    if (l->state != AGOQ_LAND_POSTED || !l->matched || !agoq_net_tp->done(q->comm->tp, &l->x)) continue;
    if (l->req != NULL)
      agoq_tagq_deliver(q, l);
    else
      l->state = AGOQ_LAND_HELD;
  }
}

ncclResult_t agoq_tagq_irecv(agoq_comm* comm, agoq_request* req) {
  agoq_tagq* q = comm->tagq;
  if (req->n_bufs != 1 || req->dev_mask != 0) {
    AGOQ_WARN("irecv on tagged connection from %s: only single host buffers are supported (%d buffers%s)",
              agoq_tagq_peer(comm), req->n_bufs, req->dev_mask != 0 ? ", device memory" : "");
    return ncclInvalidUsage;
  }
  req->tag_done = false;
  /* The oldest unclaimed message of this tag, arrived or arriving. */
  agoq_landing* held = NULL;
  for (unsigned i = 0; i < AGOQ_TAGQ_LANDINGS; i++) {
    agoq_landing* l = &q->land[i];
    bool unclaimed = l->buf != NULL && l->req == NULL; /* held, or arriving into its own buffer */
    if (unclaimed && agoq_tag_fits(req->tags[0], l->tag) && (held == NULL || l->stamp < held->stamp)) held = l;
  }
  if (held != NULL) {
    if (held->size > agoq_tagq_max(req)) {
      ncclResult_t res = agoq_tagq_truncated(comm, held->tag, held->size, agoq_tagq_max(req));
      agoq_net_tp->fail(comm->tp, res);
      return res;
    }
    held->req = req;
    if (held->state == AGOQ_LAND_HELD) agoq_tagq_deliver(q, held);
  } else {
    /* Every landing is posted or holds a message, and a receive is outstanding for each
     * message not yet held: the pool (AGOQ_TAGQ_LANDINGS) bounds the waiting list. */
    q->waiting[q->nwaiting++] = req;
  }
  return agoq_tagq_post(q);
}

ncclResult_t agoq_tagq_test(agoq_comm* comm, agoq_request* req, bool* done) {
  agoq_tagq* q = comm->tagq;
  ncclResult_t err = ncclSuccess;
  if (!req->tag_done) {
    err = agoq_net_tp->progress(comm->tp, NULL);
    agoq_tagq_reap(q);
    if (err == ncclSuccess) err = agoq_tagq_post(q);
  }
  *done = req->tag_done;
  return *done ? ncclSuccess : err;
}
