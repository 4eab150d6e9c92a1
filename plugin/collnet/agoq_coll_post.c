/* A group's connections and what goes on them: posting a chunk's receive or send (the net
 * core's "busy" is NULL: the caller retries the same operation), each connection's queue of
 * pending operations in posting order (the engine tests the oldest first), the group's first
 * failure, closing every connection; and the staging buffers every path grows and reuses.
 * Used by the mesh (agoq_coll_engine.c), the grid (agoq_coll_grid.c), setup and the device
 * path alike; it calls nothing of theirs, so none of them call each other through it. */
#include <stdlib.h>

#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_io.h"
#include "core/agoq_check.h"
#include "net/agoq_net.h"

ncclResult_t agoq_coll_buf_reserve(int dev, agoq_coll_buf* b, size_t size) {
  if (size <= b->cap) return ncclSuccess;
  /* Grown to what the largest chunk needs, then reused: no allocation, and no
   * registration with the transport, per chunk. */
  uint8_t* p = malloc(size);
  if (p == NULL) {
    AGOQ_WARN("CollNet: out of memory allocating %zu bytes of staging", size);
    return ncclSystemError;
  }
  void* key = NULL;
  ncclResult_t res = dev >= 0 ? agoq_net_reg_host(dev, p, size, &key) : ncclSuccess;
  if (res != ncclSuccess) {
    free(p);
    return res;
  }
  agoq_coll_buf_free(b);
  *b = (agoq_coll_buf){.p = p, .cap = size, .key = key};
  return ncclSuccess;
}

void agoq_coll_buf_free(agoq_coll_buf* b) {
  agoq_net_dereg_host(b->key);
  free(b->p);
  *b = (agoq_coll_buf){0};
}

/* ---- per-connection queues of pending operations ---------------------------------------- */

agoq_coll_connq* agoq_coll_cq(agoq_coll_comm* g, int peer, int kind) {
  return &g->cq[peer * AGOQ_CQ_COUNT + kind];
}

static void agoq_cq_push(agoq_coll_connq* q, const agoq_coll_comm* g, const agoq_coll_slot* s) {
  /* At most one operation per slot per connection: the ring cannot overflow. */
  q->slot[(q->head + q->count) % AGOQ_COLL_SLOTS] = (uint8_t)(s - g->slots);
  q->count++;
}

void** agoq_coll_op_req(agoq_coll_slot* s, int kind, int peer) {
  switch (kind) {
    case AGOQ_CQ_P1S: return &s->p1s[peer];
    case AGOQ_CQ_P1R: return &s->p1r[peer];
    case AGOQ_CQ_P2S: return &s->p2s[peer];
    default: return &s->p2r[peer];
  }
}

/* With I/O threads: op goes to peer j's thread, which posts it, tests it and hands its
 * completion back (agoq_coll_engine.c takes it); it never comes back "busy". */
static ncclResult_t agoq_coll_post_io(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, const void* data,
                                      size_t size, size_t max) {
  bool is_send = kind == AGOQ_CQ_P1S || kind == AGOQ_CQ_P2S;
  agoq_coll_io_op op = {.comm = is_send ? g->send[j] : g->recv[j], .data = (void*)data, .size = size, .max = max,
                        .tag = agoq_coll_tag(kind, s->seq), .peer = j, .slot = (uint8_t)(s - g->slots),
                        .kind = (uint8_t)kind, .is_send = is_send};
  if (agoq_coll_io_post(g->io, &op)) return ncclSuccess;
  /* Each (slot, kind, peer) has one operation at a time, and the inbox has room for all. */
  AGOQ_WARN("CollNet rank %d: the I/O thread of rank %d has no room for an operation of chunk %llu", g->rank, j,
            (unsigned long long)s->seq);
  return ncclInternalError;
}

ncclResult_t agoq_coll_post_recv_max(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, void* data, size_t size,
                                     size_t max, bool* posted) {
  if (g->io != NULL) {
    AGOQ_CHECK(agoq_coll_post_io(g, s, kind, j, data, size, max));
    (kind == AGOQ_CQ_P1R ? s->p1r_at : s->p2r_at)[j] = data;
    *posted = true;
    return ncclSuccess;
  }
  void** reqp = agoq_coll_op_req(s, kind, j);
  int tag = agoq_coll_tag(kind, s->seq);
  if (max > size) {
    AGOQ_CHECK(agoq_net_irecv_spill(g->recv[j], data, size, max, tag, reqp));
  } else {
    void* bufs[1] = {data};
    size_t sizes[1] = {size};
    AGOQ_CHECK(agoq_net_irecv(g->recv[j], 1, bufs, sizes, &tag, NULL, NULL, reqp));
  }
  *posted = *reqp != NULL;
  if (*posted) {
    (kind == AGOQ_CQ_P1R ? s->p1r_at : s->p2r_at)[j] = data;
    agoq_cq_push(agoq_coll_cq(g, j, kind), g, s);
  }
  return ncclSuccess;
}

ncclResult_t agoq_coll_post_recv(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, void* data, size_t size,
                                 bool* posted) {
  return agoq_coll_post_recv_max(g, s, kind, j, data, size, size, posted);
}

/* ---- spilled messages ---------------------------------------------------------------------- */

/* At most one receive per peer and phase, one send per peer and one row all-gather message
 * per chunk: the list (3n + 1 entries) has room. */
static void agoq_coll_spill_keep(agoq_coll_comm* g, agoq_coll_slot* s, uint8_t* buf, size_t len) {
  s->spills[s->nspills++] = buf;
  s->spill_bytes += len;
  g->spill_held += len;
  g->spill_msgs++;
  if (g->spill_held > g->spill_peak) g->spill_peak = g->spill_held;
}

void agoq_coll_spill_take(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, uint8_t* buf, size_t len) {
  (kind == AGOQ_CQ_P1R ? s->p1r_at : s->p2r_at)[j] = buf;
  agoq_coll_spill_keep(g, s, buf, len);
}

uint8_t* agoq_coll_spill_alloc(agoq_coll_comm* g, agoq_coll_slot* s, size_t len) {
  uint8_t* buf = malloc(len > 0 ? len : 1);
  if (buf == NULL) {
    AGOQ_WARN("CollNet rank %d: out of memory for a %zu-byte message that outgrew its staging", g->rank, len);
    return NULL;
  }
  agoq_coll_spill_keep(g, s, buf, len);
  return buf;
}

void agoq_coll_spill_free(agoq_coll_comm* g, agoq_coll_slot* s) {
  for (int i = 0; i < s->nspills; i++) free(s->spills[i]);
  s->nspills = 0;
  g->spill_held -= s->spill_bytes;
  s->spill_bytes = 0;
}

ncclResult_t agoq_coll_post_send(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, const void* data,
                                 size_t size, size_t raw, bool* posted) {
  if (g->io != NULL) {
    AGOQ_CHECK(agoq_coll_post_io(g, s, kind, j, data, size, size));
    agoq_stats_wire(g->st, s->req->quantized ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT, raw, size);
    *posted = true;
    return ncclSuccess;
  }
  void** reqp = agoq_coll_op_req(s, kind, j);
  AGOQ_CHECK(agoq_net_isend(g->send[j], (void*)data, size, agoq_coll_tag(kind, s->seq), NULL, NULL, reqp));
  *posted = *reqp != NULL;
  if (*posted) {
    agoq_stats_wire(g->st, s->req->quantized ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT, raw, size);
    agoq_cq_push(agoq_coll_cq(g, j, kind), g, s);
  }
  return ncclSuccess;
}


/* ---- the group's connections and its first failure --------------------------------------- */

bool agoq_coll_fail(agoq_coll_comm* g, ncclResult_t res) {
  int expected = ncclSuccess;
  return atomic_compare_exchange_strong(&g->error, &expected, (int)res);
}

void agoq_coll_close_conns(agoq_coll_comm* g) {
  for (int p = 0; p < g->nranks; p++) {
    if (g->send != NULL && g->send[p] != NULL) {
      (void)agoq_net_close_send(g->send[p]);
      g->send[p] = NULL;
    }
    if (g->recv != NULL && g->recv[p] != NULL) {
      (void)agoq_net_close_recv(g->recv[p]);
      g->recv[p] = NULL;
    }
  }
}

