/* The in-process transport of the CollNet simulation: sim_transport.h says what it models. */
#include "sim_transport.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Thread_local int agoq_sim_rank = -1;

#define SIM_HANDLE_MAGIC 0x4d495341u /* "ASIM" */

typedef struct sim_msg {
  struct sim_msg* next;
  /* The bytes: the sender's own buffer (src) until the message is delivered or the sender
   * sees its send complete, whichever comes first; then, if it is still on its way, a copy
   * (data). NCCL's contract keeps a send's buffer valid until then, and copying every message
   * at posting held a whole chunk's frames per rank: 4 GB over 4096 simulated ranks. */
  const uint8_t* src;
  uint8_t* data;
  struct agoq_tp_conn* sconn; /* the sending end, while src is used */
  size_t size;
  int tag;
  uint32_t flags;
  int from, dst; /* ranks */
  double start;          /* the sending thread's CPU is done with it */
  double tx, sent, wire; /* its first byte leaves, its last byte left, its time on a NIC */
  double ready;          /* last byte at the receiver's NIC; INFINITY until its turn there */
} sim_msg;

/* A posted transfer and when it completes (INFINITY: not yet known); a send's message while
 * it still reads the sender's buffer. */
typedef struct {
  agoq_xfer* x;
  double done_at;
  struct sim_msg* m;
} sim_rec;

struct agoq_tp_conn {
  bool is_send;
  int owner, other; /* ranks: the end holding it, the far end */
  struct agoq_tp_conn* peer;
  agoq_tp_match_fn match;
  void* match_arg;
  sim_msg *qhead, *qtail; /* receive side: messages on their way, in order */
  sim_rec* recs;
  int nrecs, caprecs;
  ncclResult_t err;
  char name[32];
};

struct agoq_tp_listen {
  uint32_t id;
  int owner;
  agoq_tp_conn** pending;
  int npending, cappending;
};

/* CPUs per simulated rank: its own thread (the engine, setup) and each I/O thread
 * (agoq_tp_cpu_lane 0..15), each paying o for the messages it handles. */
#define SIM_CPUS 17

static struct {
  pthread_mutex_t mu;
  int nranks;
  double now;
  bool model;
  double alpha, o, bps;
  double *cpu_free, *tx_free, *rx_free;
  agoq_sim_rank_stats* st;
  agoq_tp_listen** listens;
  int nlistens, caplistens;
  /* Every connection end alive, for the next event's time. */
  agoq_tp_conn** conns;
  int nconns, capconns;
  uint64_t events;
  /* Times something becomes due (a message's last byte in, a transfer complete): a binary
   * min-heap; entries already past are dropped as the clock passes them. */
  struct sim_due {
    double t;
    int rank;
  }* heap;
  int nheap, capheap;
  unsigned char* marked; /* ranks already in the set agoq_sim_advance returns */
  /* Messages whose turn on the receiver's NIC is not yet decided, by the time their first
   * byte leaves (then posting order): a receiver takes messages in the order they start,
   * not in the order their senders posted them (a send posted early may start late). */
  struct sim_rx {
    double t;
    uint64_t order;
    sim_msg* m; /* NULL: its connection closed */
  }* rx;
  int nrx, caprx;
  uint64_t rx_order;
  /* Messages whose turn on the sender's NIC is not yet decided, by the time the sending
   * thread's CPU is done with them (then posting order): a rank's I/O threads post in turns,
   * one thread's messages may be ready before another's posted earlier. */
  struct sim_rx* txq;
  int ntx, captx;
  /* The timeline (agoq_sim_timeline): busy seconds per bin of every rank together, of the
   * NICs' two sides and of the CPUs that handle messages. */
  double tl_bin;
  double *tl_tx, *tl_rx, *tl_cpu;
  int tl_n, tl_cap;
} sim = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Adds the interval [t0, t1) to timeline row `which` (0 tx, 1 rx, 2 CPU), split across its
 * bins. */
static void sim_tl_add(int which, double t0, double t1) {
  if (sim.tl_bin <= 0 || !(t1 > t0) || !isfinite(t1)) return;
  double** rows[3] = {&sim.tl_tx, &sim.tl_rx, &sim.tl_cpu};
  int last = (int)(t1 / sim.tl_bin);
  if (last >= sim.tl_cap) {
    int cap = sim.tl_cap * 2 + 64;
    while (cap <= last) cap *= 2;
    for (int i = 0; i < 3; i++) {
      double* q = realloc(*rows[i], (size_t)cap * sizeof *q);
      if (q == NULL) {
        sim.tl_bin = 0; /* a diagnostic: out of memory, it stops */
        return;
      }
      memset(q + sim.tl_cap, 0, (size_t)(cap - sim.tl_cap) * sizeof *q);
      *rows[i] = q;
    }
    sim.tl_cap = cap;
  }
  if (last + 1 > sim.tl_n) sim.tl_n = last + 1;
  double* row = *rows[which];
  for (int b = (int)(t0 / sim.tl_bin); b <= last; b++) {
    double lo = fmax(t0, b * sim.tl_bin), hi = fmin(t1, (b + 1) * sim.tl_bin);
    if (hi > lo) row[b] += hi - lo;
  }
}

/* The CPU of `rank` the calling thread's work runs on (agoq_tp_cpu_lane). */
static double* sim_cpu(int rank) {
  int lane = agoq_tp_cpu_lane < -1 ? -1 : agoq_tp_cpu_lane > SIM_CPUS - 2 ? SIM_CPUS - 2 : agoq_tp_cpu_lane;
  return &sim.cpu_free[(size_t)rank * SIM_CPUS + (size_t)(lane + 1)];
}

static int sim_grow(void** p, int* cap, int need, size_t elem) {
  if (need <= *cap) return 0;
  int c = *cap * 2 + 16;
  while (c < need) c *= 2;
  void* q = realloc(*p, (size_t)c * elem);
  if (q == NULL) return -1;
  *p = q;
  *cap = c;
  return 0;
}

/* A binary min-heap of `elem`-byte entries ordered by `less`: the due times and the
 * receivers' queue below. */
typedef bool (*sim_less_fn)(const void* x, const void* y);

static int sim_heap_push(void** base, int* n, int* cap, size_t elem, const void* e, sim_less_fn less) {
  if (sim_grow(base, cap, *n + 1, elem) != 0) return -1;
  char* h = *base;
  int i = (*n)++;
  while (i > 0 && less(e, h + (size_t)((i - 1) / 2) * elem)) {
    memcpy(h + (size_t)i * elem, h + (size_t)((i - 1) / 2) * elem, elem);
    i = (i - 1) / 2;
  }
  memcpy(h + (size_t)i * elem, e, elem);
  return 0;
}

/* Moves the least entry into *top (the heap is not empty). */
static void sim_heap_take(void* base, int* n, size_t elem, sim_less_fn less, void* top) {
  char* h = base;
  memcpy(top, h, elem);
  int cnt = --(*n);
  const char* last = h + (size_t)cnt * elem; /* past the live entries: never overwritten below */
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= cnt) break;
    if (c + 1 < cnt && less(h + (size_t)(c + 1) * elem, h + (size_t)c * elem)) c++;
    if (!less(h + (size_t)c * elem, last)) break;
    memcpy(h + (size_t)i * elem, h + (size_t)c * elem, elem);
    i = c;
  }
  if (cnt > 0) memcpy(h + (size_t)i * elem, last, elem);
}

static bool sim_due_before(const void* x, const void* y) {
  return ((const struct sim_due*)x)->t < ((const struct sim_due*)y)->t;
}

static void sim_due(double t, int rank) {
  struct sim_due e = {.t = t, .rank = rank};
  if (isfinite(t)) (void)sim_heap_push((void**)&sim.heap, &sim.nheap, &sim.capheap, sizeof e, &e, sim_due_before);
}

static struct sim_due sim_heap_pop(void) {
  struct sim_due top;
  sim_heap_take(sim.heap, &sim.nheap, sizeof top, sim_due_before, &top);
  return top;
}

static bool sim_rx_before(const void* a, const void* b) {
  const struct sim_rx *x = a, *y = b;
  return x->t < y->t || (x->t == y->t && x->order < y->order);
}

static int sim_rx_push(sim_msg* m) {
  struct sim_rx e = {.t = m->tx, .order = sim.rx_order++, .m = m};
  return sim_heap_push((void**)&sim.rx, &sim.nrx, &sim.caprx, sizeof e, &e, sim_rx_before);
}

static struct sim_rx sim_rx_pop(void) {
  struct sim_rx top;
  sim_heap_take(sim.rx, &sim.nrx, sizeof top, sim_rx_before, &top);
  return top;
}

/* Gives the sender's NIC to the message ready first: it leaves once the NIC is free, and
 * completes its send when its last byte left; its receiver's NIC then takes its turn. */
static void sim_tx_take(void) {
  struct sim_rx e;
  sim_heap_take(sim.txq, &sim.ntx, sizeof e, sim_rx_before, &e);
  sim_msg* m = e.m;
  if (m == NULL) return;
  m->tx = fmax(m->start, sim.tx_free[m->from]);
  m->sent = m->tx + m->wire;
  sim.tx_free[m->from] = m->sent;
  sim_tl_add(0, m->tx, m->sent);
  sim_due(m->sent, m->from);
  if (m->sconn != NULL)
    for (int k = 0; k < m->sconn->nrecs; k++)
      if (m->sconn->recs[k].m == m) m->sconn->recs[k].done_at = m->sent;
  if (sim_rx_push(m) != 0) {
    fprintf(stderr, "sim: out of memory for the receivers' queue\n");
    abort();
  }
}

/* Gives the receiver's NIC to every message that started by time t, in the order they
 * started: its last byte is in wire after the NIC is free, and no earlier than alpha after
 * it left the sender. */
static void sim_rx_take_until(double t) {
  while (sim.nrx > 0 && sim.rx[0].t <= t) {
    sim_msg* m = sim_rx_pop().m;
    if (m == NULL) continue;
    m->ready = fmax(m->sent + sim.alpha, sim.rx_free[m->dst] + m->wire);
    sim.rx_free[m->dst] = m->ready;
    sim_tl_add(1, m->ready - m->wire, m->ready);
    sim_due(m->ready, m->dst);
  }
}

int agoq_sim_init(int nranks) {
  sim.nranks = nranks;
  sim.cpu_free = calloc((size_t)nranks * SIM_CPUS, sizeof(double));
  sim.tx_free = calloc((size_t)nranks, sizeof(double));
  sim.rx_free = calloc((size_t)nranks, sizeof(double));
  sim.st = calloc((size_t)nranks, sizeof *sim.st);
  sim.marked = calloc((size_t)nranks, 1);
  return sim.cpu_free && sim.tx_free && sim.rx_free && sim.st && sim.marked ? 0 : -1;
}

void agoq_sim_fini(void) {
  pthread_mutex_lock(&sim.mu);
  for (int i = 0; i < sim.nlistens; i++)
    if (sim.listens[i] != NULL) {
      free(sim.listens[i]->pending);
      free(sim.listens[i]);
    }
  free(sim.listens);
  free(sim.conns);
  free(sim.heap);
  free(sim.rx);
  free(sim.txq);
  free(sim.cpu_free);
  free(sim.tx_free);
  free(sim.rx_free);
  free(sim.st);
  free(sim.marked);
  free(sim.tl_tx);
  free(sim.tl_rx);
  free(sim.tl_cpu);
  sim.tl_tx = sim.tl_rx = sim.tl_cpu = NULL;
  sim.tl_n = sim.tl_cap = 0;
  sim.listens = NULL;
  sim.conns = NULL;
  sim.heap = NULL;
  sim.rx = NULL;
  sim.txq = NULL;
  sim.ntx = sim.captx = 0;
  sim.nlistens = sim.nconns = sim.nheap = sim.caplistens = sim.capconns = sim.capheap = 0;
  sim.nrx = sim.caprx = 0;
  pthread_mutex_unlock(&sim.mu);
}

void agoq_sim_model(bool on, double alpha, double o, double bytes_per_s) {
  pthread_mutex_lock(&sim.mu);
  sim.model = on;
  sim.alpha = alpha;
  sim.o = o;
  sim.bps = bytes_per_s;
  sim.now = 0;
  sim.nheap = 0;
  sim.nrx = sim.ntx = 0; /* a new run starts with every message delivered */
  sim.tl_n = 0;
  for (int b = 0; b < sim.tl_cap; b++) sim.tl_tx[b] = sim.tl_rx[b] = sim.tl_cpu[b] = 0;
  for (int r = 0; r < sim.nranks; r++) {
    sim.tx_free[r] = sim.rx_free[r] = 0;
    for (int c = 0; c < SIM_CPUS; c++) sim.cpu_free[(size_t)r * SIM_CPUS + (size_t)c] = 0;
    sim.st[r].msgs_sent = sim.st[r].bytes_sent = 0;
  }
  pthread_mutex_unlock(&sim.mu);
}

double agoq_sim_now(void) { return sim.now; }

void agoq_sim_timeline(double bin_s) {
  pthread_mutex_lock(&sim.mu);
  sim.tl_bin = bin_s > 0 ? bin_s : 0;
  pthread_mutex_unlock(&sim.mu);
}

void agoq_sim_timeline_print(FILE* f, int threads) {
  pthread_mutex_lock(&sim.mu);
  if (sim.tl_bin > 0 && sim.tl_n > 0) {
    double cap = sim.tl_bin * sim.nranks;
    fprintf(f, "# timeline: every rank's NIC sides and message CPUs busy, per %.1f us of virtual time\n"
               "#   from(us)  tx_busy  rx_busy  msg_cpu (of %d per rank)\n", sim.tl_bin * 1e6, threads);
    for (int b = 0; b < sim.tl_n; b++)
      fprintf(f, "# %10.1f %8.3f %8.3f %8.3f\n", b * sim.tl_bin * 1e6, sim.tl_tx[b] / cap, sim.tl_rx[b] / cap,
              sim.tl_cpu[b] / cap);
  }
  pthread_mutex_unlock(&sim.mu);
}

uint64_t agoq_sim_events(void) {
  pthread_mutex_lock(&sim.mu);
  uint64_t e = sim.events;
  pthread_mutex_unlock(&sim.mu);
  return e;
}

const agoq_sim_rank_stats* agoq_sim_stats(int rank) { return &sim.st[rank]; }

int agoq_sim_advance(int* due) {
  pthread_mutex_lock(&sim.mu);
  /* Receivers' NICs first, for every message that starts before the next due time: each may
   * make a due time of its own, earlier than that one. */
  for (;;) {
    double th = sim.nheap > 0 ? sim.heap[0].t : INFINITY, tr = sim.nrx > 0 ? sim.rx[0].t : INFINITY;
    if (sim.ntx > 0 && sim.txq[0].t <= th && sim.txq[0].t <= tr) sim_tx_take();
    else if (sim.nrx > 0 && tr <= th) sim_rx_take_until(tr);
    else break;
  }
  while (sim.nheap > 0 && sim.heap[0].t <= sim.now) (void)sim_heap_pop();
  int k = -1;
  if (sim.nheap > 0) {
    k = 0;
    sim.now = sim.heap[0].t;
    while (sim.nheap > 0 && sim.heap[0].t <= sim.now) {
      struct sim_due d = sim_heap_pop();
      if (d.rank < 0 || d.rank >= sim.nranks || sim.marked[d.rank]) continue;
      sim.marked[d.rank] = 1;
      due[k++] = d.rank;
    }
    for (int i = 0; i < k; i++) sim.marked[due[i]] = 0;
  }
  pthread_mutex_unlock(&sim.mu);
  return k;
}

/* ---- setup ------------------------------------------------------------------------------ */

static ncclResult_t sim_init(void) { return ncclSuccess; }
static void sim_idle(void) {}
static int sim_ndevs(void) { return 1; }
static int sim_helper_threads(void) { return 0; }
static bool sim_placement(int dev, cpu_set_t* out) {
  (void)dev;
  (void)out;
  return false;
}
static unsigned sim_conn_fds(unsigned flags) {
  (void)flags;
  return 0; /* none of the process's descriptors: the simulation counts connections */
}

static uint32_t sim_link_mbps;

void agoq_sim_link(uint32_t mbps) { sim_link_mbps = mbps; }

static ncclResult_t sim_props(int dev, agoq_tp_props* p) {
  agoq_tp_props_defaults(p, dev);
  p->name = "sim";
  p->speed_mbps = sim_link_mbps > 0 ? (int)sim_link_mbps : 100000;
  p->speed_known = sim_link_mbps > 0;
  p->max_comms = 1 << 30;
  return ncclSuccess;
}

static agoq_tp_conn* sim_conn_new(bool is_send, int owner, int other) {
  agoq_tp_conn* c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->is_send = is_send;
  c->owner = owner;
  c->other = other;
  snprintf(c->name, sizeof c->name, "sim rank %d", other);
  if (sim_grow((void**)&sim.conns, &sim.capconns, sim.nconns + 1, sizeof *sim.conns) != 0) {
    free(c);
    return NULL;
  }
  sim.conns[sim.nconns++] = c;
  if (owner >= 0 && owner < sim.nranks) sim.st[owner].conns++;
  return c;
}

static ncclResult_t sim_listen(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_listen** out) {
  (void)dev;
  (void)comm_id;
  (void)flags;
  pthread_mutex_lock(&sim.mu);
  agoq_tp_listen* l = calloc(1, sizeof *l);
  if (l == NULL || sim_grow((void**)&sim.listens, &sim.caplistens, sim.nlistens + 1, sizeof *sim.listens) != 0) {
    pthread_mutex_unlock(&sim.mu);
    free(l);
    return ncclSystemError;
  }
  l->id = (uint32_t)sim.nlistens;
  l->owner = agoq_sim_rank;
  sim.listens[sim.nlistens++] = l;
  pthread_mutex_unlock(&sim.mu);
  memset(handle, 0, AGOQ_TP_HANDLE_WIRE_MAX);
  uint32_t w[2] = {SIM_HANDLE_MAGIC, l->id};
  memcpy(handle, w, sizeof w);
  *out = l;
  return ncclSuccess;
}

static ncclResult_t sim_connect(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_conn** out) {
  (void)dev;
  (void)comm_id;
  (void)flags;
  uint32_t w[2];
  memcpy(w, handle, sizeof w);
  pthread_mutex_lock(&sim.mu);
  ncclResult_t res = ncclSuccess;
  if (w[0] != SIM_HANDLE_MAGIC || w[1] >= (uint32_t)sim.nlistens || sim.listens[w[1]] == NULL) {
    res = ncclInvalidArgument;
    goto out;
  }
  agoq_tp_listen* l = sim.listens[w[1]];
  agoq_tp_conn* s = sim_conn_new(true, agoq_sim_rank, l->owner);
  agoq_tp_conn* r = sim_conn_new(false, l->owner, agoq_sim_rank);
  if (s == NULL || r == NULL ||
      sim_grow((void**)&l->pending, &l->cappending, l->npending + 1, sizeof *l->pending) != 0) {
    res = ncclSystemError;
    goto out;
  }
  s->peer = r;
  r->peer = s;
  l->pending[l->npending++] = r;
  *out = s;
out:
  pthread_mutex_unlock(&sim.mu);
  return res;
}

static void sim_connect_abort(void* handle) { (void)handle; }

static ncclResult_t sim_accept(agoq_tp_listen* l, agoq_tp_conn** out) {
  pthread_mutex_lock(&sim.mu);
  *out = NULL;
  if (l->npending > 0) {
    *out = l->pending[0];
    memmove(l->pending, l->pending + 1, (size_t)(l->npending - 1) * sizeof *l->pending);
    l->npending--;
  }
  pthread_mutex_unlock(&sim.mu);
  return ncclSuccess;
}

static ncclResult_t sim_close_listen(agoq_tp_listen* l) {
  pthread_mutex_lock(&sim.mu);
  sim.listens[l->id] = NULL;
  pthread_mutex_unlock(&sim.mu);
  free(l->pending);
  free(l);
  return ncclSuccess;
}

static void sim_set_match(agoq_tp_conn* c, agoq_tp_match_fn fn, void* arg) {
  c->match = fn;
  c->match_arg = arg;
}

/* ---- data --------------------------------------------------------------------------------- */

static int sim_rec_add(agoq_tp_conn* c, agoq_xfer* x, double done_at) {
  if (sim_grow((void**)&c->recs, &c->caprecs, c->nrecs + 1, sizeof *c->recs) != 0) return -1;
  c->recs[c->nrecs++] = (sim_rec){.x = x, .done_at = done_at};
  return 0;
}

/* The message no longer reads its sender's buffer (delivered, or copied). */
static void sim_msg_detach(sim_msg* m) {
  if (m->sconn != NULL)
    for (int k = 0; k < m->sconn->nrecs; k++)
      if (m->sconn->recs[k].m == m) m->sconn->recs[k].m = NULL;
  m->sconn = NULL;
  m->src = NULL;
}

/* A message on its way takes a copy of its bytes: its sender is done with the buffer. */
static int sim_msg_own(sim_msg* m) {
  if (m->src != NULL && m->size > 0) {
    m->data = malloc(m->size);
    if (m->data == NULL) return -1;
    memcpy(m->data, m->src, m->size);
  }
  sim_msg_detach(m);
  return 0;
}

static ncclResult_t sim_post_send(agoq_tp_conn* c, agoq_xfer* x) {
  pthread_mutex_lock(&sim.mu);
  ncclResult_t res = c->err;
  sim_msg* m = NULL;
  if (res != ncclSuccess) goto out;
  size_t size = x->size[0];
  m = calloc(1, sizeof *m);
  if (m == NULL) {
    res = ncclSystemError;
    goto out;
  }
  m->src = x->data[0];
  m->sconn = c;
  m->size = size;
  m->tag = x->tag;
  m->flags = x->flags;
  double sent = sim.now;
  if (sim.model) {
    int src = c->owner, dst = c->other;
    double* cpu = sim_cpu(src);
    double start = fmax(sim.now, *cpu) + sim.o;
    *cpu = start;
    sim_tl_add(2, start - sim.o, start);
    m->from = src;
    m->dst = dst;
    m->start = start;
    m->tx = m->sent = INFINITY; /* sim_tx_take decides, once the sending thread is done */
    m->wire = (double)size / sim.bps;
    m->ready = INFINITY; /* sim_rx_take_until decides, once the message starts */
    sim.st[src].msgs_sent++;
    sim.st[src].bytes_sent += size;
    sent = INFINITY;
  }
  if (sim_rec_add(c, x, sent) != 0) {
    res = ncclSystemError;
    goto out;
  }
  c->recs[c->nrecs - 1].m = m;
  agoq_tp_conn* r = c->peer;
  if (r == NULL) { /* the far end closed: the bytes go nowhere, as on a broken connection */
    res = ncclRemoteError;
    goto out;
  }
  if (sim.model) {
    struct sim_rx e = {.t = m->start, .order = sim.rx_order++, .m = m};
    if (sim_heap_push((void**)&sim.txq, &sim.ntx, &sim.captx, sizeof e, &e, sim_rx_before) != 0) {
      res = ncclSystemError;
      goto out;
    }
  }
  sim.events++;
  if (r->qtail != NULL) r->qtail->next = m;
  else r->qhead = m;
  r->qtail = m;
  m = NULL;
out:
  if (m != NULL) free(m->data);
  free(m);
  pthread_mutex_unlock(&sim.mu);
  return res;
}

static ncclResult_t sim_post_recv(agoq_tp_conn* c, agoq_xfer* x) {
  pthread_mutex_lock(&sim.mu);
  x->matched_mask = 0;
  sim.events++;
  ncclResult_t res = c->err != ncclSuccess ? c->err : sim_rec_add(c, x, INFINITY) != 0 ? ncclSystemError : ncclSuccess;
  pthread_mutex_unlock(&sim.mu);
  return res;
}

/* Receive side: messages whose last byte is in, into the oldest unmatched receives. */
static ncclResult_t sim_deliver(agoq_tp_conn* c) {
  for (int k = 0; k < c->nrecs && c->qhead != NULL; k++) {
    sim_rec* rec = &c->recs[k];
    if (isfinite(rec->done_at)) continue;
    sim_msg* m = c->qhead;
    if (sim.model && m->ready > sim.now) break;
    int slot = -1;
    uint8_t* dst = NULL;
    ncclResult_t res = c->match(c->match_arg, rec->x, m->tag, m->size, m->flags, &slot, &dst);
    if (res != ncclSuccess) {
      c->err = res;
      return res;
    }
    if (m->size > 0) memcpy(dst, m->data != NULL ? m->data : m->src, m->size);
    sim_msg_detach(m);
    rec->x->size[slot] = m->size;
    rec->x->matched_mask |= 1u << slot;
    rec->done_at = sim.now;
    if (sim.model) {
      double* cpu = sim_cpu(c->owner);
      rec->done_at = fmax(m->ready, *cpu) + sim.o;
      *cpu = rec->done_at;
      sim_tl_add(2, rec->done_at - sim.o, rec->done_at);
      sim_due(rec->done_at, c->owner);
    }
    c->qhead = m->next;
    if (c->qhead == NULL) c->qtail = NULL;
    free(m->data);
    free(m);
    sim.events++;
  }
  return ncclSuccess;
}

static ncclResult_t sim_progress(agoq_tp_conn* c, agoq_xfer* x) {
  (void)x;
  pthread_mutex_lock(&sim.mu);
  ncclResult_t res = c->err;
  if (res == ncclSuccess && !c->is_send) res = sim_deliver(c);
  pthread_mutex_unlock(&sim.mu);
  return res;
}

static bool sim_done(agoq_tp_conn* c, const agoq_xfer* x) {
  pthread_mutex_lock(&sim.mu);
  bool done = true; /* a transfer no longer recorded was seen done */
  for (int k = 0; k < c->nrecs; k++) {
    if (c->recs[k].x != x) continue;
    done = c->recs[k].done_at <= sim.now || (!sim.model && isfinite(c->recs[k].done_at));
    if (done) {
      sim.events++;
      /* The sender may reuse its buffer from now on: a message still on its way copies it. */
      if (c->recs[k].m != NULL && sim_msg_own(c->recs[k].m) != 0 && c->err == ncclSuccess) c->err = ncclSystemError;
      memmove(&c->recs[k], &c->recs[k + 1], (size_t)(c->nrecs - k - 1) * sizeof *c->recs);
      c->nrecs--;
    }
    break;
  }
  pthread_mutex_unlock(&sim.mu);
  return done;
}

static int sim_wait_fds(agoq_tp_conn* c, struct pollfd* out, int max, bool* hidden) {
  (void)c;
  (void)out;
  (void)max;
  *hidden = true;
  return 0;
}

static ncclResult_t sim_error(agoq_tp_conn* c) { return c->err; }
static void sim_fail(agoq_tp_conn* c, ncclResult_t res) { c->err = res; }
static const char* sim_peer(agoq_tp_conn* c) { return c->name; }

static void sim_close(agoq_tp_conn* c) {
  pthread_mutex_lock(&sim.mu);
  if (c->peer != NULL) {
    c->peer->peer = NULL;
    if (c->peer->err == ncclSuccess) c->peer->err = ncclRemoteError;
  }
  for (int i = 0; i < sim.nconns; i++)
    if (sim.conns[i] == c) {
      sim.conns[i] = sim.conns[--sim.nconns];
      break;
    }
  if (c->owner >= 0 && c->owner < sim.nranks) sim.st[c->owner].conns--;
  /* Sends still on their way stop reading this end's buffers. */
  for (int k = 0; k < c->nrecs; k++)
    if (c->recs[k].m != NULL) (void)sim_msg_own(c->recs[k].m);
  while (c->qhead != NULL) {
    sim_msg* m = c->qhead;
    c->qhead = m->next;
    for (int i = 0; i < sim.nrx; i++)
      if (sim.rx[i].m == m) sim.rx[i].m = NULL;
    for (int i = 0; i < sim.ntx; i++)
      if (sim.txq[i].m == m) sim.txq[i].m = NULL;
    sim_msg_detach(m);
    free(m->data);
    free(m);
  }
  pthread_mutex_unlock(&sim.mu);
  free(c->recs);
  free(c);
}

const agoq_transport agoq_sim_transport = {
    .name = "sim",
    .init = sim_init,
    .idle = sim_idle,
    .ndevs = sim_ndevs,
    .helper_threads = sim_helper_threads,
    .get_properties = sim_props,
    .placement_cpus = sim_placement,
    .listen = sim_listen,
    .conn_fds = sim_conn_fds,
    .accept = sim_accept,
    .close_listen = sim_close_listen,
    .connect = sim_connect,
    .connect_abort = sim_connect_abort,
    .set_match = sim_set_match,
    .post_send = sim_post_send,
    .post_recv = sim_post_recv,
    .progress = sim_progress,
    .done = sim_done,
    .wait_fds = sim_wait_fds,
    .error = sim_error,
    .fail = sim_fail,
    .peer = sim_peer,
    .close = sim_close,
};
