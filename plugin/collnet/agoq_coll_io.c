/* A CollNet group's I/O threads: agoq_coll_io.h says what and why. */
#include "collnet/agoq_coll_io.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_eventfd.h"
#include "net/agoq_net.h"
#include "transport/agoq_transport.h"

/* Kinds of operation per connection pair, as the engine numbers them (AGOQ_CQ_COUNT). */
#define AGOQ_IO_KINDS 4

/* A connection's posted operations of one kind, oldest first: they complete in that order. */
typedef struct {
  void** req;
  agoq_coll_io_op* op;
  unsigned head, count;
} agoq_io_fifo;

/* An operation in a lane's inbox, with its peer's index among the lane's peers (found once,
 * when the engine posts it). */
typedef struct {
  agoq_coll_io_op op;
  int local;
} agoq_io_entry;

typedef struct {
  struct agoq_coll_io* io;
  int index;
  int* peers; /* the ranks this thread serves, ascending */
  int npeers;
  agoq_io_fifo* fifo; /* [local peer * AGOQ_IO_KINDS + kind] */
  /* mu guards the inbox, the completions, held/parked/stop and the sleeping handshake. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  agoq_io_entry* inbox;
  unsigned in_head, in_count;
  agoq_coll_io_done* done;
  unsigned done_head, done_count;
  unsigned cap; /* of the inbox and of the completions */
  /* Held by whoever runs a pass (this thread, or the engine while it is parked): the net
   * calls on this thread's connections. `dead` (under run_mu): the group failed, no more. */
  pthread_mutex_t run_mu;
  bool dead;
  int wake_fd;
  /* Under mu; apart from `dead`, which a wider load of these four would otherwise touch. */
  bool held, parked, stop, has_thread;
  pthread_t thread;
  atomic_bool sleeping;
  struct pollfd* pfds;
  int pfds_cap;
} agoq_io_lane;

struct agoq_coll_io {
  int k, rank, depth;
  agoq_io_lane* lanes;
  atomic_int* error;
  void (*wake)(void*);
  void* wake_arg;
  unsigned take_next; /* the lane agoq_coll_io_take looks at first (engine only) */
  bool spawned;       /* engine only */
};

/* Spins before a thread sleeps on its connections, and the sleeps (as the engine's). */
#define AGOQ_IO_SPINS 16
#define AGOQ_IO_NAP_NS 20000
#define AGOQ_IO_SLEEP_NS 10000000

static int agoq_io_int_cmp(const void* x, const void* y) {
  int a = *(const int*)x, b = *(const int*)y;
  return (a > b) - (a < b);
}

static agoq_io_lane* agoq_io_lane_of(agoq_coll_io* io, int peer, int* local) {
  for (int i = 0; i < io->k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    /* Each lane's peers are ascending: binary search. */
    int lo = 0, hi = l->npeers - 1;
    while (lo <= hi) {
      int mid = (lo + hi) / 2;
      if (l->peers[mid] == peer) {
        *local = mid;
        return l;
      }
      if (l->peers[mid] < peer) lo = mid + 1;
      else hi = mid - 1;
    }
  }
  return NULL;
}

static void agoq_io_fail(agoq_io_lane* l, const agoq_coll_io_op* op, ncclResult_t res, const char* what) {
  int expected = ncclSuccess;
  if (atomic_compare_exchange_strong(l->io->error, &expected, (int)res))
    AGOQ_WARN("CollNet rank %d: %s rank %d failed (%s) on I/O thread %d; the group's requests fail", l->io->rank,
              what, op->peer, agoq_result_str(res), l->index);
}

/* Posts the inbox's operations in order, up to the first the net core calls busy. */
static ncclResult_t agoq_io_post_inbox(agoq_io_lane* l, bool* progressed) {
  for (;;) {
    pthread_mutex_lock(&l->mu);
    bool any = l->in_count > 0;
    agoq_io_entry e;
    if (any) e = l->inbox[l->in_head];
    pthread_mutex_unlock(&l->mu);
    if (!any) return ncclSuccess;
    agoq_coll_io_op op = e.op;
    agoq_io_fifo* f = &l->fifo[e.local * AGOQ_IO_KINDS + op.kind];
    if (f->count == (unsigned)l->io->depth) { /* more than the engine's slots: its bug */
      agoq_io_fail(l, &op, ncclInternalError, "posting more operations than pipeline slots to");
      return ncclInternalError;
    }
    unsigned at = (f->head + f->count) % (unsigned)l->io->depth;
    void* req = NULL;
    ncclResult_t res;
    if (op.is_send) {
      res = agoq_net_isend(op.comm, op.data, op.size, op.tag, NULL, NULL, &req);
    } else if (op.max > op.size) {
      res = agoq_net_irecv_spill(op.comm, op.data, op.size, op.max, op.tag, &req);
    } else {
      void* bufs[1] = {op.data};
      size_t sizes[1] = {op.size};
      int tags[1] = {op.tag};
      res = agoq_net_irecv(op.comm, 1, bufs, sizes, tags, NULL, NULL, &req);
    }
    if (res != ncclSuccess) {
      agoq_io_fail(l, &op, res, op.is_send ? "sending to" : "receiving from");
      return res;
    }
    if (req == NULL) return ncclSuccess; /* busy: the same operation next pass */
    f->req[at] = req;
    f->op[at] = op;
    f->count++;
    pthread_mutex_lock(&l->mu);
    l->in_head = (l->in_head + 1) % l->cap;
    l->in_count--;
    pthread_mutex_unlock(&l->mu);
    *progressed = true;
  }
}

/* Tests the oldest posted operation of each connection and kind, and the next while done. */
static ncclResult_t agoq_io_test(agoq_io_lane* l, bool* completed) {
  for (int p = 0; p < l->npeers; p++) {
    for (int kind = 0; kind < AGOQ_IO_KINDS; kind++) {
      agoq_io_fifo* f = &l->fifo[p * AGOQ_IO_KINDS + kind];
      while (f->count > 0) {
        int done = 0, size = 0;
        uint8_t* spill = NULL;
        const agoq_coll_io_op* op = &f->op[f->head];
        ncclResult_t res = agoq_net_test_spill(f->req[f->head], &done, &size, &spill);
        if (res != ncclSuccess) {
          agoq_io_fail(l, op, res, op->is_send ? "sending to" : "receiving from");
          return res;
        }
        if (!done) break;
        agoq_coll_io_done d = {.peer = op->peer, .size = op->is_send ? 0 : size, .spill = spill, .slot = op->slot,
                               .kind = op->kind};
        f->head = (f->head + 1) % (unsigned)l->io->depth;
        f->count--;
        pthread_mutex_lock(&l->mu);
        /* Within bounds: an operation is counted against the depth until the engine takes
         * its completion back, and the completions have that room. */
        l->done[(l->done_head + l->done_count) % l->cap] = d;
        l->done_count++;
        pthread_mutex_unlock(&l->mu);
        *completed = true;
      }
    }
  }
  return ncclSuccess;
}

/* One pass of lane l, with run_mu held: post what was handed over, test what is posted. */
static bool agoq_io_pass(agoq_io_lane* l) {
  if (l->dead) return false;
  int saved = agoq_tp_cpu_lane;
  agoq_tp_cpu_lane = l->index;
  bool posted = false, completed = false;
  ncclResult_t res = agoq_io_post_inbox(l, &posted);
  if (res == ncclSuccess) res = agoq_io_test(l, &completed);
  agoq_tp_cpu_lane = saved;
  /* After a failure no net call is made again (a failed request is not tested twice); the
   * engine ends the group's requests and quiesces every thread. */
  if (res != ncclSuccess) l->dead = true;
  if (completed || res != ncclSuccess) l->io->wake(l->io->wake_arg);
  return posted || completed;
}

/* Sleeps until one of the lane's connections can move bytes, the engine hands something
 * over, hold or stop, or the timeout. */
static void agoq_io_sleep(agoq_io_lane* l) {
  int np = 0;
  bool hidden = false;
  pthread_mutex_lock(&l->run_mu);
  l->pfds[np++] = (struct pollfd){.fd = l->wake_fd, .events = POLLIN};
  if (!l->dead) {
    for (int p = 0; p < l->npeers; p++) {
      bool busy = false;
      for (int kind = 0; kind < AGOQ_IO_KINDS && !busy; kind++) busy = l->fifo[p * AGOQ_IO_KINDS + kind].count > 0;
      if (!busy) continue;
      for (int kind = 0; kind < AGOQ_IO_KINDS; kind++) {
        agoq_io_fifo* f = &l->fifo[p * AGOQ_IO_KINDS + kind];
        if (f->count > 0 && np < l->pfds_cap)
          np += agoq_net_wait_fds(f->op[f->head].comm, l->pfds + np, l->pfds_cap - np, &hidden);
      }
    }
  }
  pthread_mutex_unlock(&l->run_mu);
  atomic_store(&l->sleeping, true);
  /* Something handed over before `sleeping` was set is seen here; after it, the eventfd. */
  pthread_mutex_lock(&l->mu);
  bool wake = l->in_count > 0 || l->stop || l->held;
  pthread_mutex_unlock(&l->mu);
  if (!wake) {
    struct timespec ts = {0, hidden ? AGOQ_IO_NAP_NS : AGOQ_IO_SLEEP_NS};
    if (ppoll(l->pfds, (nfds_t)np, &ts, NULL) > 0 && (l->pfds[0].revents & POLLIN)) agoq_eventfd_drain(l->wake_fd);
  }
  atomic_store(&l->sleeping, false);
}

static void* agoq_io_main(void* arg) {
  agoq_io_lane* l = arg;
  (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  unsigned idle = 0;
  for (;;) {
    pthread_mutex_lock(&l->mu);
    if (l->held && !l->stop) {
      l->parked = true;
      pthread_cond_broadcast(&l->cv);
      while (l->held && !l->stop) pthread_cond_wait(&l->cv, &l->mu);
      l->parked = false;
    }
    bool stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    if (stop) break;
    pthread_mutex_lock(&l->run_mu);
    bool progressed = agoq_io_pass(l);
    pthread_mutex_unlock(&l->run_mu);
    if (progressed) {
      idle = 0;
      continue;
    }
    if (++idle < AGOQ_IO_SPINS) sched_yield();
    else agoq_io_sleep(l);
  }
  return NULL;
}

static void agoq_io_wake_lane(agoq_io_lane* l) {
  if (atomic_load(&l->sleeping)) agoq_eventfd_post(l->wake_fd);
}

ncclResult_t agoq_coll_io_create(int k, int rank, const int* peers, int npeers, int depth, atomic_int* error,
                                 void (*wake)(void*), void* wake_arg, agoq_coll_io** out) {
  ncclResult_t res = ncclSuccess;
  *out = NULL;
  agoq_coll_io* io = NULL;
  AGOQ_ARG_CHECK(k >= 1 && k <= AGOQ_COLL_IO_MAX && depth >= 1 && npeers >= 0, res, fail);
  AGOQ_CALLOC_GOTO(io, 1, res, fail);
  io->rank = rank;
  io->depth = depth;
  io->error = error;
  io->wake = wake;
  io->wake_arg = wake_arg;
  AGOQ_CALLOC_GOTO(io->lanes, (size_t)k, res, fail);
  for (int i = 0; i < k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    l->io = io;
    l->index = i;
    l->wake_fd = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_mutex_init(&l->run_mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    atomic_init(&l->sleeping, false);
    io->k = i + 1; /* destroy releases the lanes made so far */
    int mine = npeers / k + (i < npeers % k ? 1 : 0);
    AGOQ_CALLOC_GOTO(l->peers, (size_t)(mine > 0 ? mine : 1), res, fail);
    /* Dealt in the order this rank sends in, from the peer after it around (the schedule
     * rotates sends so that ranks do not all start on the same peer): threads posting in
     * turns then keep that order, where dealing by rank would shuffle it and make senders
     * collide at receivers. Sorted afterwards for agoq_io_lane_of. */
    int first = 0;
    while (first < npeers && peers[first] < rank) first++;
    for (int p = i; p < npeers; p += k) l->peers[l->npeers++] = peers[(first + p) % npeers];
    qsort(l->peers, (size_t)l->npeers, sizeof *l->peers, agoq_io_int_cmp);
    l->cap = (unsigned)(depth * AGOQ_IO_KINDS * (mine > 0 ? mine : 1));
    AGOQ_CALLOC_GOTO(l->inbox, l->cap, res, fail);
    AGOQ_CALLOC_GOTO(l->done, l->cap, res, fail);
    AGOQ_CALLOC_GOTO(l->fifo, (size_t)(mine > 0 ? mine : 1) * AGOQ_IO_KINDS, res, fail);
    for (int f = 0; f < mine * AGOQ_IO_KINDS; f++) {
      AGOQ_CALLOC_GOTO(l->fifo[f].req, (size_t)depth, res, fail);
      AGOQ_CALLOC_GOTO(l->fifo[f].op, (size_t)depth, res, fail);
    }
    /* Two descriptors at most per connection and kind, and the wake-up. */
    l->pfds_cap = mine * AGOQ_IO_KINDS * 2 + 1;
    AGOQ_CALLOC_GOTO(l->pfds, (size_t)l->pfds_cap, res, fail);
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd < 0) {
      AGOQ_WARN("CollNet rank %d: eventfd for I/O thread %d failed: %s", rank, i, strerror(errno));
      res = ncclSystemError;
      goto fail;
    }
  }
  *out = io;
  return ncclSuccess;
fail:
  agoq_coll_io_destroy(io);
  return res;
}

ncclResult_t agoq_coll_io_spawn(agoq_coll_io* io, const void* pinned_cpus) {
  if (io->spawned) return ncclSuccess;
  io->spawned = true;
  for (int i = 0; i < io->k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    pthread_attr_t attr;
    pthread_attr_t* use = NULL;
    if (pinned_cpus != NULL && pthread_attr_init(&attr) == 0) {
      if (pthread_attr_setaffinity_np(&attr, sizeof(cpu_set_t), pinned_cpus) == 0) use = &attr;
      else pthread_attr_destroy(&attr);
    }
    int rc = pthread_create(&l->thread, use, agoq_io_main, l);
    if (use != NULL) pthread_attr_destroy(use);
    if (rc != 0 && use != NULL) rc = pthread_create(&l->thread, NULL, agoq_io_main, l);
    if (rc != 0) {
      /* The engine keeps running this lane's passes (agoq_coll_io_run_parked): slower, correct. */
      AGOQ_WARN("CollNet rank %d: cannot start I/O thread %d (%s); the engine does its message work", io->rank, i,
                strerror(rc));
      continue;
    }
    char name[16];
    snprintf(name, sizeof name, "agoq-io-%d", i % 100);
    (void)pthread_setname_np(l->thread, name);
    pthread_mutex_lock(&l->mu);
    l->has_thread = true;
    pthread_mutex_unlock(&l->mu);
  }
  return ncclSuccess;
}

bool agoq_coll_io_post(agoq_coll_io* io, const agoq_coll_io_op* op) {
  int local;
  agoq_io_lane* l = agoq_io_lane_of(io, op->peer, &local);
  if (l == NULL) return false;
  pthread_mutex_lock(&l->mu);
  bool room = l->in_count < l->cap;
  if (room) {
    l->inbox[(l->in_head + l->in_count) % l->cap] = (agoq_io_entry){.op = *op, .local = local};
    l->in_count++;
  }
  pthread_mutex_unlock(&l->mu);
  agoq_io_wake_lane(l);
  return room;
}

bool agoq_coll_io_take(agoq_coll_io* io, agoq_coll_io_done* out) {
  for (int t = 0; t < io->k; t++) {
    agoq_io_lane* l = &io->lanes[(io->take_next + (unsigned)t) % (unsigned)io->k];
    pthread_mutex_lock(&l->mu);
    bool any = l->done_count > 0;
    if (any) {
      *out = l->done[l->done_head];
      l->done_head = (l->done_head + 1) % l->cap;
      l->done_count--;
    }
    pthread_mutex_unlock(&l->mu);
    if (any) {
      io->take_next = (io->take_next + (unsigned)t) % (unsigned)io->k;
      return true;
    }
  }
  return false;
}

bool agoq_coll_io_run_parked(agoq_coll_io* io) {
  bool progressed = false;
  for (int i = 0; i < io->k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    pthread_mutex_lock(&l->mu);
    bool running = l->has_thread && !l->parked && !l->held;
    pthread_mutex_unlock(&l->mu);
    if (running || pthread_mutex_trylock(&l->run_mu) != 0) continue;
    progressed = agoq_io_pass(l) || progressed;
    pthread_mutex_unlock(&l->run_mu);
  }
  return progressed;
}

void agoq_coll_io_hold(agoq_coll_io* io, bool hold) {
  for (int i = 0; io != NULL && i < io->k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    pthread_mutex_lock(&l->mu);
    l->held = hold;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    agoq_eventfd_post(l->wake_fd);
    pthread_mutex_lock(&l->mu);
    while (hold && l->has_thread && !l->parked && !l->stop) pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
  }
}

void agoq_coll_io_quiesce(agoq_coll_io* io) {
  for (int i = 0; io != NULL && i < io->k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    pthread_mutex_lock(&l->run_mu);
    l->dead = true;
    for (int f = 0; l->fifo != NULL && f < l->npeers * AGOQ_IO_KINDS; f++) l->fifo[f].count = 0;
    pthread_mutex_lock(&l->mu);
    /* Spilled buffers of completions the engine will not take are freed here. */
    for (unsigned d = 0; l->done != NULL && d < l->done_count; d++) free(l->done[(l->done_head + d) % l->cap].spill);
    l->in_count = l->done_count = 0;
    pthread_mutex_unlock(&l->mu);
    pthread_mutex_unlock(&l->run_mu);
  }
}

bool agoq_coll_io_pending(agoq_coll_io* io) {
  bool any = false;
  for (int i = 0; i < io->k && !any; i++) {
    agoq_io_lane* l = &io->lanes[i];
    pthread_mutex_lock(&l->mu);
    any = l->done_count > 0;
    pthread_mutex_unlock(&l->mu);
  }
  return any;
}

bool agoq_coll_io_all_running(agoq_coll_io* io) {
  bool all = true;
  for (int i = 0; i < io->k && all; i++) {
    agoq_io_lane* l = &io->lanes[i];
    pthread_mutex_lock(&l->mu);
    all = l->has_thread && !l->held && !l->stop;
    pthread_mutex_unlock(&l->mu);
  }
  return all;
}

void agoq_coll_io_stop(agoq_coll_io* io) {
  if (io == NULL || io->lanes == NULL) return;
  for (int i = 0; i < io->k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    bool join = l->has_thread;
    l->has_thread = false;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (l->wake_fd >= 0) agoq_eventfd_post(l->wake_fd);
    if (join) pthread_join(l->thread, NULL);
  }
  agoq_coll_io_quiesce(io);
}

void agoq_coll_io_destroy(agoq_coll_io* io) {
  if (io == NULL) return;
  agoq_coll_io_stop(io);
  for (int i = 0; io->lanes != NULL && i < io->k; i++) {
    agoq_io_lane* l = &io->lanes[i];
    for (unsigned d = 0; l->done != NULL && d < l->done_count; d++) free(l->done[(l->done_head + d) % l->cap].spill);
    for (int f = 0; l->fifo != NULL && f < l->npeers * AGOQ_IO_KINDS; f++) {
      free(l->fifo[f].req);
      free(l->fifo[f].op);
    }
    free(l->fifo);
    free(l->inbox);
    free(l->done);
    free(l->peers);
    free(l->pfds);
    if (l->wake_fd >= 0) close(l->wake_fd);
    pthread_mutex_destroy(&l->mu);
    pthread_mutex_destroy(&l->run_mu);
    pthread_cond_destroy(&l->cv);
  }
  free(io->lanes);
  free(io);
}
