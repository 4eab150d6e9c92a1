/*
 * The engine: one thread per group that turns queued requests into pipeline chunks and
 * moves each chunk through its stages (agoq_slot_stage):
 *   POSTING  receives first (phase-1 contributions to our slice, phase-2 results of every
 *            other slice), then per peer in rotated order: encode its slice (quantized
 *            path) and send it; our own slice is encoded last.
 *   WAIT_P1  until every contribution to our slice arrived.
 *   POST_P2  reduce in rank order (strictly in chunk order, so phase-2 messages leave in
 *            the order peers post their receives), then send the result to every peer.
 *   WAIT_ALL until every send completed and every peer's result is decoded into place.
 * A peer's phase-1 and phase-2 messages share one connection each way and are matched by
 * tag (agoq_coll_tag), so a peer ahead of this rank may send the next chunk's contributions
 * before this chunk's results; the pipeline depth is AGOQ_COLL_SLOTS chunks.
 * A pass over these stages (agoq_engine_step) runs under the group's step_mu, on the
 * engine thread or, with AGOQ_COLLNET_ASSIST, on NCCL's proxy thread inside test() when
 * the engine is not in one: the proxy's polling time then does the group's work instead
 * of competing with the engine for a core. Only the engine ends requests after a failure
 * and stops.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_cost.h"
#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_io.h"
#include "collnet/agoq_coll_step.h"
#include "core/agoq_check.h"
#include "core/agoq_eventfd.h"
#include "net/agoq_net.h"

_Static_assert(AGOQ_COLL_COST_CALLS == AGOQ_COLL_SLOTS, "the cost model's pipeline is the engine's");

/* The step implementation request r's chunks run on the mesh (agoq_coll_step.h). */
static const agoq_coll_step_impl* agoq_step_for(const agoq_coll_req* r) {
  if (r->kind == AGOQ_COLL_ALLGATHER) return &agoq_coll_step_gather;
  if (r->gpu) return &agoq_coll_step_gpu;
  return r->quantized ? &agoq_coll_step_quant : &agoq_coll_step_exact;
}

static agoq_coll_slot* agoq_slot_of(agoq_coll_comm* g, uint64_t seq) { return &g->slots[seq % AGOQ_COLL_SLOTS]; }

/* ---- slot setup -------------------------------------------------------------------------- */

static ncclResult_t agoq_slot_alloc(agoq_coll_slot* s, int n);

static ncclResult_t agoq_slot_setup(agoq_coll_comm* g, agoq_coll_slot* s, agoq_coll_req* r, size_t c) {
  /* A slot's per-rank arrays, made the first time a chunk uses it: O(n) each, and a group
   * whose calls are small never fills the pipeline. */
  if (s->sb == NULL) AGOQ_CHECK(agoq_slot_alloc(s, g->nranks));
  s->req = r;
  s->seq = g->next_seq;
  s->post_recvs = s->post_sends = 0;
  s->step = NULL;
  if (agoq_coll_on_grid(g)) return agoq_coll_grid_slot_setup(g, s, r, c);
  int n = g->nranks, me = g->rank;
  agoq_coll_chunk_layout(r, c, n, s->sb, s->sl);
  size_t m = s->sl[me];
  bool p1 = agoq_coll_has_p1(r), p2 = agoq_coll_has_p2(r);
  s->pend_p1s = s->pend_p1r = s->pend_p2s = s->pend_p2r = 0;
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    if (p1 && s->sl[j] > 0) s->pend_p1s++;
    if (p1 && m > 0) s->pend_p1r++;
    if (p2 && m > 0) s->pend_p2s++;
    if (p2 && s->sl[j] > 0) s->pend_p2r++;
    s->s_len[j] = 0;
  }
  s->s_len[me] = 0;
  s->res_len = 0;
  s->r_max = 0; /* the phase-1 regions' size, unless the step's reserve says they spill */
  s->nominal = false;
  s->step = agoq_step_for(r);
  return s->step->reserve(g, s);
}

/* ---- posting ----------------------------------------------------------------------------- */

/* Receives for every peer, then the phase-1 sends; returns with the slot still POSTING
 * when the net core is busy (NULL request), to resume at the same operation. */
static ncclResult_t agoq_slot_post(agoq_coll_comm* g, agoq_coll_slot* s) {
  if (agoq_coll_on_grid(g)) return agoq_coll_grid_post(g, s);
  agoq_coll_req* r = s->req;
  const agoq_coll_step_impl* step = s->step;
  int n = g->nranks, me = g->rank;
  size_t m = s->sl[me];
  bool p1 = agoq_coll_has_p1(r), p2 = agoq_coll_has_p2(r), posted = true;
  for (; s->post_recvs < 2 * n; s->post_recvs++) {
    int j = s->post_recvs / 2;
    bool phase2 = s->post_recvs % 2;
    if (j == me) continue;
    if (!phase2 && p1 && m > 0) {
      size_t max = s->r_max > s->r_stride ? s->r_max : s->r_stride;
      AGOQ_CHECK(agoq_coll_post_recv_max(g, s, AGOQ_CQ_P1R, j, s->rbuf.p + (size_t)j * s->r_stride, s->r_stride,
                                         max, &posted));
    } else if (phase2 && p2 && s->sl[j] > 0) {
      uint8_t* at;
      size_t cap, max;
      step->p2_place(g, s, j, &at, &cap, &max);
      AGOQ_CHECK(agoq_coll_post_recv_max(g, s, AGOQ_CQ_P2R, j, at, cap, max, &posted));
    }
    if (!posted) return ncclSuccess;
  }
  /* A GPU request's frames are all encoded on the device first (agoq_coll_gpu.c). */
  bool ready = false;
  AGOQ_CHECK(step->prepare(g, s, &ready));
  if (!ready) return ncclSuccess;
  /* Sends go to me+1, me+2, ... so the ranks do not all start on the same peer. */
  for (; s->post_sends < n; s->post_sends++) {
    int j = (me + 1 + s->post_sends) % n;
    if (!p1 || s->sl[j] == 0) continue;
    const uint8_t* msg;
    size_t len;
    AGOQ_CHECK(step->p1_message(g, s, j, &msg, &len));
    if (j == me) continue; /* our own contribution stays here, made like the others */
    AGOQ_CHECK(agoq_coll_post_send(g, s, AGOQ_CQ_P1S, j, msg, len, s->sl[j] * r->esz, &posted));
    if (!posted) return ncclSuccess;
  }
  s->stage = AGOQ_SLOT_WAIT_P1;
  s->post_sends = 0; /* reused for the phase-2 sends */
  return ncclSuccess;
}

/* ---- taking requests and admitting chunks -------------------------------------------------- */

/* Multi-part calls: the host parts between the engine's flat buffer and NCCL's (parts in
 * device memory are copied by agoq_coll_device.c). */
static void agoq_engine_join(agoq_coll_req* r, bool gather) {
  size_t off = 0;
  for (int i = 0; i < r->nparts; i++) {
    if (!(r->dev_parts & (1u << i))) {
      if (gather) memcpy(r->joined + off, r->parts[i].address, r->parts[i].size);
      else memcpy(r->parts[i].address, r->joined + off, r->parts[i].size);
    }
    off += r->parts[i].size;
  }
}

/* The host result is complete: published done, or, bound for device memory, once its copy
 * there is queued (test() then waits for that copy). A failure leaves the request active,
 * for the abort to end. */
static ncclResult_t agoq_engine_complete(agoq_coll_comm* g, agoq_coll_req* r) {
  if (r->kind == AGOQ_COLL_ALLGATHER && r->nparts > 1) agoq_engine_join(r, false);
  bool copying = false;
  AGOQ_CHECK(agoq_coll_dev_copy_out(g, r, &copying));
  /* Unlink from the active list (requests can complete out of order). */
  for (agoq_coll_req** pp = &g->act_head; *pp != NULL; pp = &(*pp)->next) {
    if (*pp != r) continue;
    *pp = r->next;
    if (g->act_tail == r) {
      g->act_tail = NULL;
      for (agoq_coll_req* q = g->act_head; q != NULL; q = q->next) g->act_tail = q;
    }
    break;
  }
  if (g->admit == r) g->admit = r->next;
  if (copying) atomic_store_explicit(&r->state, AGOQ_COLL_REQ_COPY_OUT, memory_order_release);
  else agoq_coll_req_finish(r, ncclSuccess);
  return ncclSuccess;
}

/* Everything queued by the proxy thread since the last look, in order. */
static agoq_coll_req* agoq_engine_dequeue(agoq_coll_comm* g) {
  pthread_mutex_lock(&g->mu);
  agoq_coll_req* list = g->q_head;
  g->q_head = g->q_tail = NULL;
  pthread_mutex_unlock(&g->mu);
  return list;
}

static void agoq_engine_take(agoq_coll_comm* g, agoq_coll_req* list) {
  while (list != NULL) {
    agoq_coll_req* r = list;
    list = r->next;
    r->next = NULL;
    agoq_stats_count(g->st, r->quantized ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT,
                     r->kind == AGOQ_COLL_ALLREDUCE ? r->result_bytes : r->count * r->esz);
    if (!r->quantized) agoq_stats_exact(g->st, (agoq_exact_reason)r->exact_reason);
    if (r->nchunks == 0) {
      agoq_coll_req_finish(r, ncclSuccess);
      continue;
    }
    if (g->act_tail != NULL)
      g->act_tail->next = r;
    else
      g->act_head = r;
    g->act_tail = r;
    if (g->admit == NULL) g->admit = r;
  }
}

/* The cap on spilled messages: more held than the slots' own receive staging (the host's, or
 * the GPU path's pinned regions), while some chunk is in flight (the one that holds them
 * retires; a lone chunk always runs). */
static bool agoq_engine_spill_full(const agoq_coll_comm* g) {
  if (g->spill_held == 0) return false;
  size_t staging = 0;
  bool busy = false;
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) {
    const agoq_coll_slot* s = &g->slots[i];
    staging += s->own.rbuf.cap + s->own.gbuf.cap;
    if (g->gslots != NULL) staging += g->gslots[i].pinned.rbuf.cap + g->gslots[i].pinned.gbuf.cap;
    busy = busy || s->stage != AGOQ_SLOT_FREE;
  }
  return busy && g->spill_held > staging;
}

static ncclResult_t agoq_engine_admit(agoq_coll_comm* g, bool* progressed) {
  for (;;) {
    if (g->next_seq > 0) {
      agoq_coll_slot* prev = agoq_slot_of(g, g->next_seq - 1);
      if (prev->stage == AGOQ_SLOT_POSTING) {
        AGOQ_CHECK(agoq_slot_post(g, prev));
        if (prev->stage == AGOQ_SLOT_POSTING) return ncclSuccess;
        *progressed = true;
      }
    }
    agoq_coll_req* r = g->admit;
    while (r != NULL && r->chunks_admitted == r->nchunks) r = r->next;
    g->admit = r;
    if (r == NULL) return ncclSuccess;
    agoq_coll_slot* s = agoq_slot_of(g, g->next_seq);
    if (s->stage != AGOQ_SLOT_FREE) return ncclSuccess;
    if (agoq_engine_spill_full(g)) {
      g->spill_waits++;
      return ncclSuccess;
    }
    if (r->chunks_admitted == 0) {
      /* Its input must be in host memory first: copied from the device (the later requests
       * wait behind it, as every rank admits in call order), its host parts joined. */
      bool ready = false;
      AGOQ_CHECK(agoq_coll_dev_input_ready(g, r, &ready));
      if (!ready) return ncclSuccess;
      if (r->kind == AGOQ_COLL_REDUCESCATTER && r->nparts > 1) agoq_engine_join(r, true);
    }
    AGOQ_CHECK(agoq_slot_setup(g, s, r, r->chunks_admitted));
    r->chunks_admitted++;
    g->next_seq++;
    s->stage = AGOQ_SLOT_POSTING;
    *progressed = true;
  }
}

/* ---- completions --------------------------------------------------------------------------- */

static ncclResult_t agoq_op_complete(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, int size) {
  switch (kind) {
    case AGOQ_CQ_P1S: s->pend_p1s--; return ncclSuccess;
    case AGOQ_CQ_P2S: s->pend_p2s--; return ncclSuccess;
    case AGOQ_CQ_P1R:
      s->p1r_size[j] = size;
      s->pend_p1r--;
      return agoq_coll_on_grid(g) ? agoq_coll_grid_received(g, s, kind, j, size) : ncclSuccess;
    default: break;
  }
  s->pend_p2r--;
  if (agoq_coll_on_grid(g)) return agoq_coll_grid_received(g, s, kind, j, size);
  return s->step->received(g, s, j, size);
}

/* With I/O threads: runs the passes of those not running on their own, then takes back
 * every completion they have, each connection's in posting order. */
static ncclResult_t agoq_engine_poll_io(agoq_coll_comm* g, bool* progressed) {
  if (agoq_coll_io_run_parked(g->io)) *progressed = true;
  agoq_coll_io_done d;
  while (agoq_coll_io_take(g->io, &d)) {
    agoq_coll_slot* s = &g->slots[d.slot];
    if (d.spill != NULL) agoq_coll_spill_take(g, s, d.kind, d.peer, d.spill, (size_t)d.size);
    *progressed = true;
    AGOQ_CHECK(agoq_op_complete(g, s, d.kind, d.peer, d.size));
  }
  return ncclSuccess;
}

/* Tests the oldest pending operation of each connection and kind (a phase's sends or
 * receives), and the next ones while they are done: a kind's operations on one connection
 * complete in posting order (its messages are sent in chunk order). */
static ncclResult_t agoq_engine_poll(agoq_coll_comm* g, bool* progressed) {
  if (g->io != NULL) return agoq_engine_poll_io(g, progressed);
  for (int pi = 0; pi < g->npeers; pi++) {
    int j = g->peers[pi];
    for (int kind = 0; kind < AGOQ_CQ_COUNT; kind++) {
      agoq_coll_connq* q = agoq_coll_cq(g, j, kind);
      while (q->count > 0) {
        agoq_coll_slot* s = &g->slots[q->slot[q->head]];
        void** reqp = agoq_coll_op_req(s, kind, j);
        int done = 0, size = 0;
        uint8_t* spill = NULL; /* a receive's message that outgrew its region; never a send's */
        ncclResult_t res = agoq_net_test_spill(*reqp, &done, &size, &spill);
        if (res != ncclSuccess) {
          if (agoq_coll_fail(g, res))
            AGOQ_WARN("CollNet rank %d: %s rank %d failed (%s); the group's requests fail", g->rank,
                      kind == AGOQ_CQ_P1S || kind == AGOQ_CQ_P2S ? "sending to" : "receiving from", j,
                      agoq_result_str(res));
          return res;
        }
        if (!done) break;
        *reqp = NULL;
        if (spill != NULL) agoq_coll_spill_take(g, s, kind, j, spill, (size_t)size);
        q->head = (q->head + 1) % AGOQ_COLL_SLOTS;
        q->count--;
        *progressed = true;
        AGOQ_CHECK(agoq_op_complete(g, s, kind, j, size));
      }
    }
  }
  return ncclSuccess;
}

/* ---- reduction of this rank's slice ------------------------------------------------------ */

/* Reduces and sends results strictly in chunk order. */
static ncclResult_t agoq_engine_reduce(agoq_coll_comm* g, bool* progressed) {
  if (agoq_coll_on_grid(g)) return agoq_coll_grid_advance(g, progressed);
  int n = g->nranks, me = g->rank;
  while (g->reduce_seq < g->next_seq) {
    agoq_coll_slot* s = agoq_slot_of(g, g->reduce_seq);
    if (s->stage == AGOQ_SLOT_WAIT_P1) {
      if (s->pend_p1r > 0) return ncclSuccess;
      bool reduced = false;
      AGOQ_CHECK(s->step->reduce(g, s, &reduced));
      if (!reduced) return ncclSuccess; /* the device is at it: the next pass looks again */
      s->stage = AGOQ_SLOT_POST_P2;
      *progressed = true;
    }
    if (s->stage != AGOQ_SLOT_POST_P2) return ncclSuccess;
    agoq_coll_req* r = s->req;
    size_t m = s->sl[me];
    if (agoq_coll_has_p2(r) && m > 0) {
      const uint8_t* msg;
      size_t len;
      s->step->p2_message(g, s, &msg, &len);
      for (; s->post_sends < n - 1; s->post_sends++) {
        int j = (me + 1 + s->post_sends) % n;
        bool posted;
        AGOQ_CHECK(agoq_coll_post_send(g, s, AGOQ_CQ_P2S, j, msg, len, m * r->esz, &posted));
        if (!posted) return ncclSuccess;
      }
    }
    s->stage = AGOQ_SLOT_WAIT_ALL;
    g->reduce_seq++;
    *progressed = true;
  }
  return ncclSuccess;
}

static ncclResult_t agoq_engine_retire(agoq_coll_comm* g, bool* progressed) {
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) {
    agoq_coll_slot* s = &g->slots[i];
    if (s->stage != AGOQ_SLOT_WAIT_ALL || s->pend_p1s > 0 || s->pend_p2s > 0 || s->pend_p2r > 0) continue;
    agoq_coll_req* r = s->req;
    /* Its results must all be in place (a GPU's decodes). */
    bool decoded = false;
    if (s->step != NULL) AGOQ_CHECK(s->step->retire(g, s, &decoded));
    else AGOQ_CHECK(agoq_coll_grid_retire(g, s, &decoded));
    if (!decoded) continue;
    s->stage = AGOQ_SLOT_FREE;
    s->req = NULL;
    agoq_coll_spill_free(g, s);
    *progressed = true;
    if (++r->chunks_done == r->nchunks) AGOQ_CHECK(agoq_engine_complete(g, r));
  }
  return ncclSuccess;
}

/* ---- failure and the thread ---------------------------------------------------------------- */

/* Ends every request the engine holds with `res`. The connections are closed first, so no
 * progress thread writes into a buffer NCCL may reuse once it sees the failure. */
static void agoq_engine_abort(agoq_coll_comm* g, ncclResult_t res) {
  agoq_coll_io_quiesce(g->io); /* no I/O thread calls the net core on them any more */
  agoq_coll_close_conns(g);
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) {
    g->slots[i].stage = AGOQ_SLOT_FREE;
    g->slots[i].req = NULL;
    agoq_coll_spill_free(g, &g->slots[i]);
  }
  for (int i = 0; i < g->nranks * AGOQ_CQ_COUNT; i++) g->cq[i].count = 0;
  agoq_coll_req* queued = agoq_engine_dequeue(g);
  agoq_coll_req* lists[2] = {g->act_head, queued};
  g->act_head = g->act_tail = g->admit = NULL;
  for (int l = 0; l < 2; l++) {
    while (lists[l] != NULL) {
      agoq_coll_req* r = lists[l];
      lists[l] = r->next;
      agoq_coll_req_finish(r, res);
    }
  }
}

/* Yields before the engine sleeps on its connections. */
#define AGOQ_ENGINE_SPINS 16
/* Sleep while progress is made where no descriptor announces it (pieces moved by the
 * transport's progress threads): as short as the old nap. */
#define AGOQ_ENGINE_NAP_NS 20000
/* Longest sleep when descriptors cover everything awaited: a safety net only; a peer's
 * bytes, a new request and stop all wake the engine at once. */
#define AGOQ_ENGINE_SLEEP_NS 10000000

void agoq_coll_engine_wake(agoq_coll_comm* g) {
  if (!atomic_load(&g->sleeping)) return;
  agoq_eventfd_post(g->wake_fd);
}

static void agoq_engine_wake_cb(void* g) { agoq_coll_engine_wake(g); }

/* Sleeps until a connection the engine waits on can move bytes, a request arrives, stop,
 * or the timeout. */
static void agoq_engine_sleep(agoq_coll_comm* g) {
  int np = 0;
  bool hidden = false;
  /* The pending operations are the step's state: read them as a pass would. */
  pthread_mutex_lock(&g->step_mu);
  g->pfds[np++] = (struct pollfd){.fd = g->wake_fd, .events = POLLIN};
  /* I/O threads wake the engine when they hand completions back; one not running on its
   * own (not started) leaves its passes to the engine: poll again soon. */
  if (g->io != NULL && !agoq_coll_io_all_running(g->io)) hidden = true;
  for (int pi = 0; g->io == NULL && pi < g->npeers; pi++) {
    int j = g->peers[pi];
    /* Each way's one connection carries both phases. */
    if (agoq_coll_cq(g, j, AGOQ_CQ_P1S)->count > 0 || agoq_coll_cq(g, j, AGOQ_CQ_P2S)->count > 0)
      np += agoq_net_wait_fds(g->send[j], g->pfds + np, g->pfds_cap - np, &hidden);
    if (agoq_coll_cq(g, j, AGOQ_CQ_P1R)->count > 0 || agoq_coll_cq(g, j, AGOQ_CQ_P2R)->count > 0)
      np += agoq_net_wait_fds(g->recv[j], g->pfds + np, g->pfds_cap - np, &hidden);
  }
  /* A device copy or kernel announces its end on no descriptor: poll it again soon. */
  if (g->admit != NULL && g->admit->in_copy) hidden = true;
  for (int i = 0; i < AGOQ_COLL_SLOTS && !hidden; i++)
    if (g->slots[i].stage != AGOQ_SLOT_FREE && g->slots[i].req != NULL && g->slots[i].req->gpu) hidden = true;
  atomic_store(&g->sleeping, true);
  /* A pass from test() that moved something before `sleeping` was set is seen here; one
   * after it writes the eventfd. */
  bool assisted = g->assisted;
  pthread_mutex_unlock(&g->step_mu);
  /* A request queued before `sleeping` was set is seen here; one queued after it writes
   * the eventfd. */
  pthread_mutex_lock(&g->mu);
  bool wake = g->q_head != NULL || g->stop || g->held || assisted;
  pthread_mutex_unlock(&g->mu);
  /* Completions handed back before `sleeping` was set are seen here; later ones wake it. */
  if (!wake && g->io != NULL) wake = agoq_coll_io_pending(g->io);
  if (!wake) {
    struct timespec ts = {0, hidden ? AGOQ_ENGINE_NAP_NS : AGOQ_ENGINE_SLEEP_NS};
    if (ppoll(g->pfds, (nfds_t)np, &ts, NULL) > 0 && (g->pfds[0].revents & POLLIN)) agoq_eventfd_drain(g->wake_fd);
  }
  atomic_store(&g->sleeping, false);
}

/* Charges the time between the first pass that found nothing to do and the next pass
 * that moved something to the network wait of the path then active. Called under step_mu. */
static void agoq_engine_account(agoq_coll_comm* g, bool progressed) {
  if (progressed) {
    if (g->idle_since != 0) agoq_stats_add(&g->st->path[g->idle_path].wire_ns, (uint64_t)(agoq_coll_now_ns() - g->idle_since));
    g->idle_since = 0;
  } else if (g->idle_since == 0) {
    g->idle_since = agoq_coll_now_ns();
    g->idle_path = g->act_head != NULL && g->act_head->quantized ? 1 : 0;
  }
}

/* One pass: take queued requests, admit chunks, test pending operations, reduce, retire.
 * Called under step_mu, by the engine or by test(). */
static ncclResult_t agoq_engine_step(agoq_coll_comm* g, bool* progressed) {
  agoq_coll_req* taken = agoq_engine_dequeue(g);
  *progressed = taken != NULL;
  agoq_engine_take(g, taken);
  ncclResult_t res = (ncclResult_t)atomic_load(&g->error);
  if (res == ncclSuccess) res = agoq_engine_admit(g, progressed);
  if (res == ncclSuccess) res = agoq_engine_poll(g, progressed);
  if (res == ncclSuccess) res = agoq_engine_reduce(g, progressed);
  if (res == ncclSuccess) res = agoq_engine_retire(g, progressed);
  /* What this pass handed to I/O threads that do not run on their own goes out now, not a
   * pass later (the simulation steps a rank only when something concerns it). */
  if (res == ncclSuccess && g->io != NULL && agoq_coll_io_run_parked(g->io)) *progressed = true;
  if (res == ncclSuccess) agoq_engine_account(g, *progressed);
  return res;
}

void agoq_coll_engine_assist(agoq_coll_comm* g) {
  if (atomic_load(&g->error) != ncclSuccess || pthread_mutex_trylock(&g->step_mu) != 0) return;
  bool progressed = false;
  ncclResult_t res = agoq_engine_step(g, &progressed);
  if (res != ncclSuccess && agoq_coll_fail(g, res))
    AGOQ_WARN("CollNet rank %d: group failed (%s)", g->rank, agoq_result_str(res));
  if (progressed) g->assisted = true;
  pthread_mutex_unlock(&g->step_mu);
  /* The engine may sleep on the descriptors of operations this pass completed, or miss
   * the ones it posted, or have to end the group's requests after a failure. */
  if (progressed || res != ncclSuccess) agoq_coll_engine_wake(g);
}

static void* agoq_coll_engine_main(void* arg) {
  agoq_coll_comm* g = arg;
  /* Short naps while waiting on the network should be short: 1 us of timer slack. */
  (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  unsigned idle = 0;
  for (;;) {
    pthread_mutex_lock(&g->mu);
    if (g->held && !g->stop) {
      g->parked = true;
      pthread_cond_broadcast(&g->parked_cv);
      while (g->held && !g->stop) pthread_cond_wait(&g->parked_cv, &g->mu);
      g->parked = false;
    }
    pthread_mutex_unlock(&g->mu);
    /* Waiting for work with step_mu held is safe: with nothing queued or active there is
     * nothing for test() to assist with. */
    pthread_mutex_lock(&g->step_mu);
    pthread_mutex_lock(&g->mu);
    while (!g->stop && !g->held && g->q_head == NULL && g->act_head == NULL) pthread_cond_wait(&g->cv, &g->mu);
    bool stop = g->stop, held = g->held;
    pthread_mutex_unlock(&g->mu);
    if (held && !stop) {
      pthread_mutex_unlock(&g->step_mu);
      continue;
    }
    if (g->io != NULL && !stop) /* on the group's first request: a group never used costs no threads */
      (void)agoq_coll_io_spawn(g->io, g->io_pinned ? &g->io_cpus : NULL);
    if (stop) {
      agoq_engine_take(g, agoq_engine_dequeue(g));
      if (g->act_head != NULL)
        AGOQ_INFO(NCCL_NET, "CollNet rank %d: group stopped with requests in flight; they fail", g->rank);
      agoq_engine_abort(g, ncclInternalError);
      pthread_mutex_unlock(&g->step_mu);
      break;
    }
    bool progressed = false;
    ncclResult_t res = agoq_engine_step(g, &progressed);
    if (res == ncclSuccess) res = (ncclResult_t)atomic_load(&g->error);
    if (res != ncclSuccess) {
      if (agoq_coll_fail(g, res)) AGOQ_WARN("CollNet rank %d: group failed (%s)", g->rank, agoq_result_str(res));
      agoq_engine_abort(g, (ncclResult_t)atomic_load(&g->error));
      pthread_mutex_unlock(&g->step_mu);
      idle = 0;
      continue;
    }
    progressed = progressed || g->assisted;
    g->assisted = false;
    pthread_mutex_unlock(&g->step_mu);
    if (progressed) {
      idle = 0;
      continue;
    }
    /* Waiting on the network: yield first (a peer's bytes are often microseconds away),
     * then sleep in poll() on the connections until bytes can move, so the CPUs stay with
     * the ranks and threads that have work (few-core hosts). */
    if (++idle < AGOQ_ENGINE_SPINS)
      sched_yield();
    else
      agoq_engine_sleep(g);
  }
  return NULL;
}

static void agoq_slot_free_arrays(agoq_coll_slot* s) {
  free(s->sb);
  free(s->sl);
  free(s->p1s);
  free(s->p1r);
  free(s->p2s);
  free(s->p2r);
  free(s->p1r_size);
  free(s->s_off);
  free(s->s_len);
  free(s->g_off);
  free(s->p1r_at);
  free(s->p2r_at);
  free(s->spills);
  free(s->s_at);
  s->sb = s->sl = s->s_off = s->s_len = s->g_off = NULL;
  s->p1s = s->p1r = s->p2s = s->p2r = NULL;
  s->p1r_size = NULL;
  s->p1r_at = s->p2r_at = s->spills = s->s_at = NULL;
}

static ncclResult_t agoq_slot_alloc(agoq_coll_slot* s, int n) {
  size_t un = (size_t)n;
  s->sb = calloc(un + 1, sizeof *s->sb);
  s->sl = calloc(un, sizeof *s->sl);
  s->p1s = calloc(un, sizeof *s->p1s);
  s->p1r = calloc(un, sizeof *s->p1r);
  s->p2s = calloc(un, sizeof *s->p2s);
  s->p2r = calloc(un, sizeof *s->p2r);
  s->p1r_size = calloc(un, sizeof *s->p1r_size);
  s->s_off = calloc(un, sizeof *s->s_off);
  s->s_len = calloc(un, sizeof *s->s_len);
  s->g_off = calloc(un, sizeof *s->g_off);
  s->p1r_at = calloc(un, sizeof *s->p1r_at);
  s->p2r_at = calloc(un, sizeof *s->p2r_at);
  s->spills = calloc(3 * un + 1, sizeof *s->spills);
  s->s_at = calloc(un, sizeof *s->s_at);
  if (s->sb && s->sl && s->p1s && s->p1r && s->p2s && s->p2r && s->p1r_size && s->s_off && s->s_len && s->g_off &&
      s->p1r_at && s->p2r_at && s->spills && s->s_at)
    return ncclSuccess;
  AGOQ_WARN("out of memory allocating CollNet pipeline state for %d ranks", n);
  agoq_slot_free_arrays(s); /* s->sb NULL again: the next chunk tries anew */
  return ncclSystemError;
}

static void agoq_slot_release(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_spill_free(g, s);
  agoq_slot_free_arrays(s);
  agoq_coll_buf_free(&s->own.sbuf);
  agoq_coll_buf_free(&s->own.rbuf);
  agoq_coll_buf_free(&s->own.acc);
  agoq_coll_buf_free(&s->own.res);
  agoq_coll_buf_free(&s->own.gbuf);
  memset(s, 0, sizeof *s);
}

/* AGOQ_COLLNET_CODEC_THREADS, 0 resolved: the idle cores, i.e. the CPUs the engine may run
 * on less the transport's progress threads and NCCL's proxy thread; the engine itself is
 * one of the threads. */
static int agoq_engine_codec_threads(const agoq_coll_comm* g, const cpu_set_t* pinned) {
  if (g->cfg.codec_threads > 0) return g->cfg.codec_threads;
  int ncpu = 1;
  cpu_set_t all;
  if (pinned != NULL) ncpu = CPU_COUNT(pinned);
  else if (sched_getaffinity(0, sizeof all, &all) == 0) ncpu = CPU_COUNT(&all);
  int n = ncpu - agoq_net_helper_threads() - 1;
  return n < 1 ? 1 : n;
}

ncclResult_t agoq_coll_engine_start(agoq_coll_comm* g) {
  ncclResult_t res = ncclSuccess;
  g->wake_fd = -1; /* closed by agoq_coll_engine_free only once created */
  pthread_mutex_init(&g->mu, NULL);
  pthread_mutex_init(&g->step_mu, NULL);
  pthread_mutex_init(&g->gpu_mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  pthread_cond_init(&g->parked_cv, NULL);
  AGOQ_CHECK_GOTO(agoq_coll_pool_init(g), res, fail);
  AGOQ_CALLOC_GOTO(g->cq, (size_t)g->nranks * AGOQ_CQ_COUNT, res, fail);
  AGOQ_CALLOC_GOTO(g->reduce_in, (size_t)g->nranks, res, fail);
  /* Two descriptors at most per connection and kind of operation, and the wake-up. */
  g->pfds_cap = g->npeers * AGOQ_CQ_COUNT * 2 + 1;
  AGOQ_CALLOC_GOTO(g->pfds, (size_t)g->pfds_cap, res, fail);
  g->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (g->wake_fd < 0) {
    AGOQ_WARN("CollNet: eventfd for the engine failed: %s", strerror(errno));
    res = ncclSystemError;
    goto fail;
  }
  atomic_init(&g->sleeping, false);
  if (agoq_coll_on_grid(g)) AGOQ_CHECK_GOTO(agoq_coll_grid_start(g), res, fail);
  /* AGOQ_PLACEMENT=auto: the engine runs on its NIC's NUMA node, and so do the staging
   * buffers it allocates and first touches (frames, fp32 accumulators, gathered results). */
  cpu_set_t cpus;
  bool pinned = agoq_net_placement_cpus(g->dev, &cpus);
  g->codec_threads = agoq_engine_codec_threads(g, pinned ? &cpus : NULL);
  if (g->cfg.io_threads > 0) {
    int k = g->cfg.io_threads < g->npeers ? g->cfg.io_threads : g->npeers;
    if (k < 1) k = 1;
    AGOQ_CHECK_GOTO(agoq_coll_io_create(k, g->rank, g->peers, g->npeers, AGOQ_COLL_SLOTS, &g->error,
                                        agoq_engine_wake_cb, g, &g->io),
                    res, fail);
    g->io_pinned = pinned;
    if (pinned) g->io_cpus = cpus;
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet rank %d: %d I/O thread%s for the messages of %d peers "
              "(AGOQ_COLLNET_IO_THREADS=%d), started with the group's first call", g->rank, k, k == 1 ? "" : "s",
              g->npeers, g->cfg.io_threads);
  }
  pthread_attr_t attr;
  pthread_attr_t* use = NULL;
  if (pinned && pthread_attr_init(&attr) == 0) {
    if (pthread_attr_setaffinity_np(&attr, sizeof cpus, &cpus) == 0) use = &attr;
    else pthread_attr_destroy(&attr);
  }
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet rank %d: codec on %d thread%s per slice (AGOQ_COLLNET_CODEC_THREADS=%d%s)",
            g->rank, g->codec_threads, g->codec_threads == 1 ? "" : "s", g->cfg.codec_threads,
            g->cfg.codec_threads == 0 ? ": idle cores" : "");
  int rc = pthread_create(&g->thread, use, agoq_coll_engine_main, g);
  if (use != NULL) pthread_attr_destroy(use);
  if (rc != 0 && use != NULL) { /* pinning refused: run unpinned rather than not at all */
    use = NULL;
    rc = pthread_create(&g->thread, NULL, agoq_coll_engine_main, g);
  }
  if (rc == 0 && use != NULL) {
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet rank %d: engine thread and its staging buffers on the NUMA node of device %d "
              "(%d CPUs)", g->rank, g->dev, CPU_COUNT(&cpus));
  }
  if (rc != 0) {
    AGOQ_WARN("CollNet: cannot start the engine thread: %s", strerror(rc));
    res = ncclSystemError;
    goto fail;
  }
  char name[16];
  snprintf(name, sizeof name, "agoq-coll-%d", g->rank % 10000);
  (void)pthread_setname_np(g->thread, name);
  g->has_thread = true;
  return ncclSuccess;
fail:
  agoq_coll_engine_free(g);
  return res;
}

void agoq_coll_engine_hold(agoq_coll_comm* g, bool hold) {
  pthread_mutex_lock(&g->mu);
  g->held = hold;
  pthread_cond_broadcast(&g->cv);
  pthread_cond_broadcast(&g->parked_cv);
  agoq_coll_engine_wake(g);
  while (hold && g->has_thread && !g->parked) pthread_cond_wait(&g->parked_cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  /* test() then runs the I/O threads' passes too (agoq_coll_io_run_parked). */
  agoq_coll_io_hold(g->io, hold);
}

void agoq_coll_engine_stop(agoq_coll_comm* g) {
  pthread_mutex_lock(&g->mu);
  g->stop = true;
  bool join = g->has_thread;
  g->has_thread = false;
  pthread_cond_broadcast(&g->cv);
  pthread_cond_broadcast(&g->parked_cv);
  pthread_mutex_unlock(&g->mu);
  agoq_coll_engine_wake(g);
  if (join) pthread_join(g->thread, NULL);
  agoq_coll_io_stop(g->io); /* before the connections close */
}

size_t agoq_coll_staging_bytes(const agoq_coll_comm* g) {
  size_t total = 0;
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) {
    const agoq_coll_slot_bufs* b = &g->slots[i].own;
    total += b->sbuf.cap + b->rbuf.cap + b->acc.cap + b->res.cap + b->gbuf.cap + agoq_coll_grid_staging(&g->slots[i]);
  }
  return total;
}

void agoq_coll_engine_free(agoq_coll_comm* g) {
  agoq_coll_io_destroy(g->io);
  g->io = NULL;
  agoq_coll_grid_free(g);
  if (g->spill_msgs > 0)
    AGOQ_INFO(NCCL_NET, "CollNet rank %d: %llu messages outgrew their staging (blocks escaped raw) and went through "
              "buffers of their own, at most %zu bytes held at once", g->rank, (unsigned long long)g->spill_msgs,
              g->spill_peak);
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) agoq_slot_release(g, &g->slots[i]);
  free(g->cq);
  g->cq = NULL;
  free(g->reduce_in);
  g->reduce_in = NULL;
  free(g->pfds);
  g->pfds = NULL;
  if (g->wake_fd >= 0) close(g->wake_fd);
  g->wake_fd = -1;
  /* After the engine and the connections: no pass or progress thread uses the staging. */
  agoq_coll_dev_close(g);
  agoq_coll_pool_fini(g);
  pthread_cond_destroy(&g->cv);
  pthread_cond_destroy(&g->parked_cv);
  pthread_mutex_destroy(&g->step_mu);
  pthread_mutex_destroy(&g->gpu_mu);
  pthread_mutex_destroy(&g->mu);
}
