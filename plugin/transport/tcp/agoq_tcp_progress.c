#include "transport/tcp/agoq_tcp_progress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_eventfd.h"
#include "core/agoq_params.h"
#include "transport/tcp/agoq_tcp.h"
#include "agoq_topo.h"

/* Bytes one stream may move per pass before the worker turns to its other streams. */
#define AGOQ_STREAM_PASS_BUDGET (4u << 20)
/* A sleeping worker wakes this often even without events, as a safety net. */
#define AGOQ_WORKER_POLL_MS 200
/* While the comm's own thread moves one of its streams (assist), the worker does not spin
 * on it: it looks again after this long, or earlier when another stream can move. */
#define AGOQ_WORKER_ASSIST_POLL_MS 1

typedef struct agoq_worker {
  pthread_t thread;
  pthread_mutex_t mu; /* guards the stream list; held by the worker during a pass */
  agoq_stream* streams;
  int nstreams;
  int wake_fd;        /* eventfd: new pieces while asleep, or stop */
  atomic_bool stop;
  atomic_bool sleeping;
  atomic_uint_fast64_t posts; /* bumped on every post: lets the worker skip a stale sleep */
  struct pollfd* pfds; /* worker-private */
  int pfds_cap;
  int numa;           /* AGOQ_PLACEMENT=auto: the NUMA node it runs on, else -1 */
  cpu_set_t cpus;     /* its affinity when numa >= 0 */
} agoq_worker;

static struct {
  pthread_mutex_t mu;
  agoq_worker* workers;
  int nworkers;
  unsigned next;
  int attached;     /* streams bound to a worker */
  bool stop_when_idle; /* the last context is gone: stop once the last stream detaches */
} agoq_pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void agoq_stream_fail(agoq_stream* s, int err, bool eof) {
  s->failed = true;
  ncclResult_t res = (eof || err == ECONNRESET || err == EPIPE) ? ncclRemoteError : ncclSystemError;
  if (agoq_comm_error_set(s->comm_error, res)) {
    if (eof)
      AGOQ_WARN("connection closed by peer %s while receiving payload", s->peer);
    else if (err == ETIMEDOUT && agoq_config.timeout_s > 0)
      /* TCP_USER_TIMEOUT fired: say which setting did it, it is the user's to change. */
      AGOQ_WARN("%s on data socket to %s failed: no progress for AGOQ_TIMEOUT_S=%d s (peer gone, stalled or "
                "unreachable): %s",
                s->is_send ? "send" : "recv", s->peer, agoq_config.timeout_s, strerror(err));
    else
      AGOQ_WARN("%s on data socket to %s failed: %s", s->is_send ? "send" : "recv", s->peer, strerror(err));
  }
}

/* Moves bytes of the stream's pieces until it would block, the ring is empty or `budget`
 * bytes moved. Caller holds s->busy. Returns whether any byte moved; *blocked tells the
 * caller to poll. */
static bool agoq_stream_run(agoq_stream* s, size_t budget, bool* blocked) {
  bool progressed = false;
  *blocked = false;
  if (s->failed) return false;
  uint32_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
  while (head != atomic_load_explicit(&s->tail, memory_order_acquire)) {
    agoq_piece* p = &s->ring[head % AGOQ_STREAM_RING_SIZE];
    /* One syscall never moves more than the budget, so a huge piece cannot keep the
     * worker from its other streams for long. */
    size_t want = p->len - p->done < budget ? p->len - p->done : budget;
    ssize_t n = s->is_send ? send(s->fd, p->ptr + p->done, want, MSG_DONTWAIT | MSG_NOSIGNAL)
                           : recv(s->fd, p->ptr + p->done, want, MSG_DONTWAIT);
    if (n > 0) {
      p->done += (size_t)n;
      progressed = true;
      if (p->done == p->len) {
        atomic_fetch_sub_explicit(p->pending, 1, memory_order_release);
        atomic_store_explicit(&s->head, ++head, memory_order_release);
      }
      if ((size_t)n >= budget) break;
      budget -= (size_t)n;
      continue;
    }
    if (n == 0 && !s->is_send) {
      agoq_stream_fail(s, 0, true);
      break;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *blocked = true;
      break;
    }
    agoq_stream_fail(s, n < 0 ? errno : EIO, false);
    break;
  }
  return progressed;
}

static bool agoq_stream_try_own(agoq_stream* s) {
  return !atomic_load_explicit(&s->busy, memory_order_relaxed) &&
         !atomic_exchange_explicit(&s->busy, true, memory_order_acquire);
}

static void agoq_stream_release(agoq_stream* s) { atomic_store_explicit(&s->busy, false, memory_order_release); }

bool agoq_stream_assist(agoq_stream* s, size_t budget) {
  if (atomic_load_explicit(&s->head, memory_order_relaxed) == atomic_load_explicit(&s->tail, memory_order_acquire))
    return false;
  if (!agoq_stream_try_own(s)) return false;
  bool blocked;
  bool progressed = agoq_stream_run(s, budget, &blocked);
  agoq_stream_release(s);
  return progressed;
}

static void agoq_worker_sleep(agoq_worker* w, int npoll, uint64_t seen_posts, int timeout_ms) {
  atomic_store(&w->sleeping, true);
  /* A post between our pass and here must not be slept through: the producer bumps
   * `posts` before reading `sleeping`, we set `sleeping` before re-reading `posts`. */
  if (atomic_load(&w->posts) == seen_posts) {
    w->pfds[npoll].fd = w->wake_fd;
    w->pfds[npoll].events = POLLIN;
    w->pfds[npoll].revents = 0;
    int rc = poll(w->pfds, (nfds_t)npoll + 1, timeout_ms);
    if (rc > 0 && (w->pfds[npoll].revents & POLLIN)) agoq_eventfd_drain(w->wake_fd);
  }
  atomic_store(&w->sleeping, false);
}

static void* agoq_worker_main(void* arg) {
  agoq_worker* w = arg;
  while (!atomic_load(&w->stop)) {
    uint64_t seen_posts = atomic_load(&w->posts);
    bool progressed = false, assisted = false;
    int npoll = 0;
    pthread_mutex_lock(&w->mu);
    if (w->pfds_cap < w->nstreams + 1) {
      int cap = (w->nstreams + 1) * 2;
      struct pollfd* grown = realloc(w->pfds, sizeof *grown * (size_t)cap);
      if (grown != NULL) {
        w->pfds = grown;
        w->pfds_cap = cap;
      }
    }
    for (agoq_stream* s = w->streams; s != NULL; s = s->next) {
      if (!agoq_stream_try_own(s)) {
        assisted = true; /* the comm's thread is on it right now: look again soon */
        continue;
      }
      bool blocked;
      progressed |= agoq_stream_run(s, AGOQ_STREAM_PASS_BUDGET, &blocked);
      agoq_stream_release(s);
      if (blocked && npoll + 1 < w->pfds_cap) {
        w->pfds[npoll].fd = s->fd;
        w->pfds[npoll].events = s->is_send ? POLLOUT : POLLIN;
        w->pfds[npoll].revents = 0;
        npoll++;
      }
    }
    pthread_mutex_unlock(&w->mu);
    if (!progressed && w->pfds_cap > 0)
      agoq_worker_sleep(w, npoll, seen_posts, assisted ? AGOQ_WORKER_ASSIST_POLL_MS : AGOQ_WORKER_POLL_MS);
  }
  return NULL;
}

static int agoq_progress_default_threads(void) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  long n = ncpu / 2;
  if (n < 1) n = 1;
  if (n > 8) n = 8;
  return (int)n;
}

int agoq_progress_nthreads(void) {
  int n = (int)agoq_param_int(AGOQ_PARAM_SOCKET_NTHREADS);
  return n != 0 ? n : agoq_progress_default_threads();
}

static void agoq_worker_destroy(agoq_worker* w) {
  if (w->wake_fd >= 0) close(w->wake_fd);
  pthread_mutex_destroy(&w->mu);
  free(w->pfds);
}

static void agoq_pool_stop_locked(void) {
  for (int i = 0; i < agoq_pool.nworkers; i++) {
    agoq_worker* w = &agoq_pool.workers[i];
    atomic_store(&w->stop, true);
    agoq_eventfd_post(w->wake_fd);
    pthread_join(w->thread, NULL);
    /* Streams still attached (only at unload) must never reach the freed worker. */
    for (agoq_stream* s = w->streams; s != NULL; s = s->next) s->worker = NULL;
    agoq_worker_destroy(w);
  }
  free(agoq_pool.workers);
  agoq_pool.workers = NULL;
  agoq_pool.nworkers = 0;
  agoq_pool.attached = 0;
  agoq_pool.stop_when_idle = false;
}

/* AGOQ_PLACEMENT=auto: the distinct NUMA nodes of the interfaces, in device order; worker
 * i serves homes[i % n]. Nodes whose CPUs the process may not use are left out (a thread
 * is never pinned outside sched_getaffinity). Returns the count; 0 = do not pin. */
static int agoq_placement_homes(int* homes, cpu_set_t* cpus, int max) {
  if (agoq_param_int(AGOQ_PARAM_PLACEMENT) != 0) {
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "AGOQ_PLACEMENT=none: progress threads are not pinned");
    return 0;
  }
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "placement: sched_getaffinity failed (%s); progress threads are not pinned",
              strerror(errno));
    return 0;
  }
  int n = 0;
  for (int d = 0; d < agoq_config.nifs && n < max; d++) {
    const agoq_netif* nif = &agoq_config.ifs[d];
    bool seen = false;
    for (int i = 0; i < n; i++) seen |= homes[i] == nif->numa_node;
    if (seen || nif->numa_node < 0 || !nif->has_local_cpus) continue;
    CPU_AND(&cpus[n], &nif->local_cpus, &allowed);
    if (CPU_COUNT(&cpus[n]) == 0) {
      AGOQ_INFO(NCCL_INIT | NCCL_NET, "placement: no allowed CPU on NUMA node %d of %s; not pinning for it",
                nif->numa_node, nif->name);
      continue;
    }
    homes[n++] = nif->numa_node;
  }
  if (n == 0) AGOQ_INFO(NCCL_INIT | NCCL_NET, "placement: NUMA nodes of the interfaces unknown; progress threads are not pinned");
  return n;
}

bool agoq_tcp_placement_cpus(int dev, cpu_set_t* out) {
  CPU_ZERO(out);
  if (agoq_param_int(AGOQ_PARAM_PLACEMENT) != 0 || dev < 0 || dev >= agoq_config.nifs) return false;
  const agoq_netif* nif = &agoq_config.ifs[dev];
  cpu_set_t allowed;
  if (nif->numa_node < 0 || !nif->has_local_cpus || sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  CPU_AND(out, &nif->local_cpus, &allowed);
  return CPU_COUNT(out) > 0;
}

static int agoq_worker_start(agoq_worker* w, int index) {
  pthread_attr_t attr;
  pthread_attr_t* use = NULL;
  if (w->numa >= 0 && pthread_attr_init(&attr) == 0) {
    /* Pinned from birth: no first run on a remote node, no window where its stacks and
     * pollfd array are first touched elsewhere. */
    if (pthread_attr_setaffinity_np(&attr, sizeof w->cpus, &w->cpus) == 0) use = &attr;
  }
  int rc = pthread_create(&w->thread, use, agoq_worker_main, w);
  if (rc != 0 && use != NULL) {
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "placement: pinned start of progress thread %d failed (%s); starting it unpinned",
              index, strerror(rc));
    w->numa = -1;
    rc = pthread_create(&w->thread, NULL, agoq_worker_main, w);
  }
  if (use != NULL) pthread_attr_destroy(use);
  if (rc == 0) {
    /* Named, so top and perf tell the transport's threads from NCCL's and CollNet's. */
    char name[16];
    snprintf(name, sizeof name, "agoq-tcp-%d", index % 1000);
    (void)pthread_setname_np(w->thread, name);
  }
  if (rc == 0 && w->numa >= 0) {
    char list[AGOQ_TOPO_CPUS_LEN];
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "progress thread %d pinned to NUMA node %d, cpus %s", index, w->numa,
              agoq_topo_cpulist(&w->cpus, list, sizeof list));
  }
  return rc;
}

static ncclResult_t agoq_pool_start_locked(void) {
  ncclResult_t res = ncclSuccess;
  int n = agoq_progress_nthreads();
  AGOQ_CALLOC_GOTO(agoq_pool.workers, n, res, fail);
  int homes[AGOQ_NETIF_MAX];
  cpu_set_t home_cpus[AGOQ_NETIF_MAX];
  int nhomes = agoq_placement_homes(homes, home_cpus, AGOQ_NETIF_MAX);
  for (int i = 0; i < n; i++) {
    agoq_worker* w = &agoq_pool.workers[i];
    w->numa = nhomes > 0 ? homes[i % nhomes] : -1;
    if (nhomes > 0) w->cpus = home_cpus[i % nhomes];
    pthread_mutex_init(&w->mu, NULL);
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->wake_fd < 0) {
      AGOQ_WARN("eventfd for progress thread failed: %s", strerror(errno));
      agoq_worker_destroy(w);
      res = ncclSystemError;
      goto fail;
    }
    int rc = agoq_worker_start(w, i);
    if (rc != 0) {
      AGOQ_WARN("cannot start progress thread: %s", strerror(rc));
      agoq_worker_destroy(w);
      res = ncclSystemError;
      goto fail;
    }
    agoq_pool.nworkers = i + 1;
  }
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "started %d progress thread%s", n, n == 1 ? "" : "s");
  return ncclSuccess;
fail:
  agoq_pool_stop_locked();
  return res;
}

/* NUMA node of the interface a socket is bound to (its local address), -1 if unknown. */
static int agoq_stream_numa(const agoq_stream* s) {
  struct sockaddr_storage local;
  socklen_t len = sizeof local;
  if (getsockname(s->fd, (struct sockaddr*)&local, &len) != 0) return -1;
  for (int d = 0; d < agoq_config.nifs; d++) {
    const struct sockaddr* a = (const struct sockaddr*)&agoq_config.ifs[d].addr;
    if (a->sa_family != local.ss_family) continue;
    if (a->sa_family == AF_INET &&
        ((const struct sockaddr_in*)a)->sin_addr.s_addr == ((const struct sockaddr_in*)&local)->sin_addr.s_addr)
      return agoq_config.ifs[d].numa_node;
    if (a->sa_family == AF_INET6 && memcmp(&((const struct sockaddr_in6*)a)->sin6_addr,
                                           &((const struct sockaddr_in6*)&local)->sin6_addr, sizeof(struct in6_addr)) == 0)
      return agoq_config.ifs[d].numa_node;
  }
  return -1;
}

/* Round robin, restricted to the workers on the stream's NUMA node when there are any. */
static agoq_worker* agoq_pool_pick_locked(int numa) {
  int nlocal = 0;
  for (int i = 0; numa >= 0 && i < agoq_pool.nworkers; i++) nlocal += agoq_pool.workers[i].numa == numa;
  unsigned turn = agoq_pool.next++;
  if (nlocal == 0) return &agoq_pool.workers[turn % (unsigned)agoq_pool.nworkers];
  int want = (int)(turn % (unsigned)nlocal);
  for (int i = 0; i < agoq_pool.nworkers; i++)
    if (agoq_pool.workers[i].numa == numa && want-- == 0) return &agoq_pool.workers[i];
  return &agoq_pool.workers[0];
}

ncclResult_t agoq_progress_attach(agoq_stream* s) {
  ncclResult_t res = ncclSuccess;
  int numa = agoq_stream_numa(s);
  pthread_mutex_lock(&agoq_pool.mu);
  if (agoq_pool.nworkers == 0) AGOQ_CHECK_GOTO(agoq_pool_start_locked(), res, out);
  agoq_worker* w = agoq_pool_pick_locked(numa);
  s->worker = w;
  s->failed = false;
  atomic_store(&s->busy, false);
  pthread_mutex_lock(&w->mu);
  s->next = w->streams;
  w->streams = s;
  w->nstreams++;
  pthread_mutex_unlock(&w->mu);
  agoq_pool.attached++;
  agoq_pool.stop_when_idle = false;
out:
  pthread_mutex_unlock(&agoq_pool.mu);
  return res;
}

void agoq_progress_detach(agoq_stream* s) {
  pthread_mutex_lock(&agoq_pool.mu);
  agoq_worker* w = s->worker;
  if (w == NULL) {
    pthread_mutex_unlock(&agoq_pool.mu);
    return;
  }
  pthread_mutex_lock(&w->mu);
  for (agoq_stream** pp = &w->streams; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == s) {
      *pp = s->next;
      w->nstreams--;
      break;
    }
  }
  pthread_mutex_unlock(&w->mu);
  s->worker = NULL;
  if (--agoq_pool.attached == 0 && agoq_pool.stop_when_idle) agoq_pool_stop_locked();
  pthread_mutex_unlock(&agoq_pool.mu);
}

bool agoq_stream_post(agoq_stream* s, uint8_t* ptr, size_t len, atomic_int* pending) {
  uint32_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
  if (tail - atomic_load_explicit(&s->head, memory_order_acquire) >= AGOQ_STREAM_RING_SIZE) return false;
  s->ring[tail % AGOQ_STREAM_RING_SIZE] = (agoq_piece){.ptr = ptr, .len = len, .done = 0, .pending = pending};
  atomic_store_explicit(&s->tail, tail + 1, memory_order_release);
  agoq_worker* w = s->worker;
  if (w == NULL) return true; /* pool stopped at unload: only test()'s assist moves bytes */
  atomic_fetch_add(&w->posts, 1);
  if (atomic_load(&w->sleeping)) agoq_eventfd_post(w->wake_fd);
  return true;
}

void agoq_progress_shutdown_when_idle(void) {
  pthread_mutex_lock(&agoq_pool.mu);
  if (agoq_pool.attached == 0)
    agoq_pool_stop_locked();
  else
    agoq_pool.stop_when_idle = true; /* comms outlive their contexts: the last close stops it */
  pthread_mutex_unlock(&agoq_pool.mu);
}

void agoq_progress_shutdown(void) {
  pthread_mutex_lock(&agoq_pool.mu);
  agoq_pool_stop_locked();
  pthread_mutex_unlock(&agoq_pool.mu);
}

int agoq_progress_worker_numa(int i, cpu_set_t* cpus) {
  pthread_mutex_lock(&agoq_pool.mu);
  int numa = -2;
  if (i >= 0 && i < agoq_pool.nworkers) {
    numa = agoq_pool.workers[i].numa;
    if (cpus != NULL && pthread_getaffinity_np(agoq_pool.workers[i].thread, sizeof *cpus, cpus) != 0) CPU_ZERO(cpus);
  }
  pthread_mutex_unlock(&agoq_pool.mu);
  return numa;
}

int agoq_progress_nworkers(void) {
  pthread_mutex_lock(&agoq_pool.mu);
  int n = agoq_pool.nworkers;
  pthread_mutex_unlock(&agoq_pool.mu);
  return n;
}

/* NCCL dlcloses the plugin when its last communicator is gone; threads running our code
 * after that would crash, so they are stopped before the library is unmapped. */
__attribute__((destructor)) static void agoq_progress_unload(void) { agoq_progress_shutdown(); }
