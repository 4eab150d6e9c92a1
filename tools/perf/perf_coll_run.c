/*
 * The calls of one collective, made the way NCCL's CollNet proxy makes them
 * (coll_net.cc, sendProxyProgress):
 *  - allreduce: iallreduce(send + off, recv + off, bytes / elt, ...) per chunk of the
 *    buffer;
 *  - reducescatter / allgather: the buffer of all ranks' parts (nranks * bytesPerRank) is
 *    walked in windows [windowOffset, windowOffset + windowBytes) that may span parts;
 *    one SGE covers the window's bytes of the full side (reducescatter's input,
 *    allgather's output), and the rank's own side pointer is its part at the window start
 *    when the window starts in its part, else the part's start (NCCL's registered-buffer
 *    convention);
 *  - a NULL request means "try again later", as for the net table; calls are tested
 *    oldest first, and the proxy yields when a pass moved nothing.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_coll.h"

/* How long a rank waits without any call completing before it gives up. */
#define PERF_COLL_STALL_S 120

int perf_coll_plan_make(perf_coll_plan* p, const perf_coll_opts* o, int rank, size_t bytes,
                        size_t max_call) {
  memset(p, 0, sizeof(*p));
  p->kind = o->kind;
  p->dtype = o->dtype;
  p->op = o->op;
  p->rank = rank;
  p->nranks = o->nranks;
  p->elt = perf_dtype_size(o->dtype);
  size_t n = (size_t)o->nranks;
  if (o->kind == PERF_COLL_ALLREDUCE) {
    p->count = bytes / p->elt;
    p->per_rank = 0;
  } else {
    p->per_rank = bytes / p->elt / n;
    p->count = p->per_rank * n;
  }
  p->bytes = p->count * p->elt;
  /* Calls hold whole elements: NCCL's chunks are multiples of the element size. */
  size_t chunk = o->chunk == 0 ? p->bytes : o->chunk;
  if (chunk > max_call) chunk = max_call;
  chunk -= chunk % p->elt;
  if (chunk == 0) chunk = p->elt;
  if (p->bytes == 0) return 0; /* NCCL makes no call for an empty buffer */
  size_t nwin = (p->bytes + chunk - 1) / chunk;
  if (nwin > (size_t)1 << 30) {
    fprintf(stderr, "agoq-perf: %zu B in calls of %zu B is too many calls\n", p->bytes, chunk);
    return -1;
  }
  p->win = calloc(nwin, sizeof(*p->win));
  if (p->win == NULL) {
    fprintf(stderr, "agoq-perf: out of memory for %zu calls\n", nwin);
    return -1;
  }
  for (size_t w = 0; w < nwin; w++) {
    p->win[w].off = w * chunk;
    p->win[w].bytes = p->bytes - p->win[w].off < chunk ? p->bytes - p->win[w].off : chunk;
  }
  p->nwin = (int)nwin;
  return 0;
}

void perf_coll_plan_free(perf_coll_plan* p) {
  free(p->win);
  p->win = NULL;
  p->nwin = 0;
}

/* This rank's side of a window of the parts buffer (NCCL: sub->sendbuff/recvbuff plus
 * windowOffset % bytesPerRank when the window starts in our part). */
static uint8_t* perf_coll_own_side(const perf_coll_plan* p, uint8_t* base, size_t off) {
  size_t bpr = p->per_rank * p->elt;
  if (off / bpr == (size_t)p->rank) return base + off % bpr;
  return base;
}

static ncclResult_t perf_coll_post(perf_coll_net* c, const perf_coll_plan* p, int w,
                                   uint8_t* send, uint8_t* recv, void** req) {
  const perf_window* win = &p->win[w];
  size_t bpr = p->per_rank * p->elt;
  switch (p->kind) {
    case PERF_COLL_ALLREDUCE:
      return agoq_collnet_view_iallreduce(&c->view, c->coll_comm, send + win->off,
                                          recv + win->off, win->bytes / p->elt, p->dtype, p->op,
                                          c->send_mh, c->recv_mh, req);
    case PERF_COLL_REDUCESCATTER: {
      agoq_view_sge part = {.mhandle = c->send_mh, .address = send + win->off,
                            .size = win->bytes};
      return agoq_collnet_view_ireducescatter(&c->view, c->coll_comm, 1, &part,
                                              perf_coll_own_side(p, recv, win->off), bpr,
                                              win->off, win->bytes, p->dtype, p->op,
                                              c->recv_mh, req);
    }
    default: {
      agoq_view_sge part = {.mhandle = c->recv_mh, .address = recv + win->off,
                            .size = win->bytes};
      return agoq_collnet_view_iallgather(&c->view, c->coll_comm,
                                          perf_coll_own_side(p, send, win->off), 1, &part, bpr,
                                          win->off, win->bytes, c->send_mh, req);
    }
  }
}

int perf_coll_stream(perf_coll_net* c, perf_group* g, const perf_coll_opts* o,
                     const perf_coll_plan* p, uint8_t* send, uint8_t* recv, int iters) {
  if (p->nwin == 0 || iters <= 0) return 0;
  const char* what = perf_coll_kind_name(p->kind);
  long total = (long)iters * p->nwin;
  int depth = o->inflight < p->nwin ? o->inflight : p->nwin;
  void* reqs[PERF_COLL_MAX_INFLIGHT] = {0};
  long posted = 0, done = 0;
  double last_done = perf_now_us(), last_check = last_done;
  while (done < total) {
    bool progress = false;
    while (posted < total && posted - done < depth) {
      int w = (int)(posted % p->nwin);
      void* req = NULL;
      ncclResult_t r = perf_coll_post(c, p, w, send, recv, &req);
      if (r != ncclSuccess) {
        fprintf(stderr, "agoq-perf: rank %d: %s call %ld (window %zu+%zu of %zu B) failed: %s\n",
                p->rank, what, posted, p->win[w].off, p->win[w].bytes, p->bytes,
                agoq_result_str(r));
        return -1;
      }
      if (req == NULL) break; /* the plugin's "try again" */
      reqs[posted % PERF_COLL_MAX_INFLIGHT] = req;
      posted++;
      progress = true;
    }
    if (done < posted) {
      int finished = 0, size = -1;
      ncclResult_t r =
          agoq_collnet_view_test(&c->view, reqs[done % PERF_COLL_MAX_INFLIGHT], &finished, &size);
      if (r != ncclSuccess) {
        int w = (int)(done % p->nwin);
        fprintf(stderr, "agoq-perf: rank %d: test of %s call %ld (window %zu+%zu of %zu B) "
                "failed: %s\n", p->rank, what, done, p->win[w].off, p->win[w].bytes, p->bytes,
                agoq_result_str(r));
        return -1;
      }
      if (finished) {
        reqs[done % PERF_COLL_MAX_INFLIGHT] = NULL;
        done++;
        progress = true;
      }
    }
    double now = perf_now_us();
    if (progress && done > 0) last_done = now;
    if (!progress) {
      sched_yield();
      if (now - last_check > 200e3) {
        last_check = now;
        if (perf_group_peer_failed(g)) {
          fprintf(stderr, "agoq-perf: rank %d: another rank failed during %s call %ld\n",
                  p->rank, what, done);
          return -1;
        }
        if (now - last_done > PERF_COLL_STALL_S * 1e6) {
          fprintf(stderr, "agoq-perf: rank %d: no %s call completed in %d s (%ld of %ld done)\n",
                  p->rank, what, PERF_COLL_STALL_S, done, total);
          return -1;
        }
      }
    }
  }
  return 0;
}
