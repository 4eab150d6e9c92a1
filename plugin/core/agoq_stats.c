/* The statistics registry and its three printers (agoq_stats.h). */
#include "core/agoq_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/agoq_log.h"
#include "core/agoq_params.h"
#include "agoq_frame.h"

#define AGOQ_STATS_LINE_MAX 1024
#define AGOQ_STATS_PATH_MAX 4096

/* Push-only list: registration publishes with a release CAS, readers acquire the head and
 * follow `next`, which never changes after publication. */
static _Atomic(agoq_stats_entry*) agoq_stats_head;
static atomic_uint_least64_t agoq_stats_next_id;

/* Output and the interval thread; set up under the mutex at registration (never on the
 * data path, never at exit). */
static pthread_mutex_t agoq_stats_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t agoq_stats_cv;
static atomic_int agoq_stats_fd = -1;
static int agoq_stats_fd_pid;    /* the process that opened it: a fork child reopens */
static bool agoq_stats_fd_owned; /* a file of ours, not stderr */
static char agoq_stats_host[256];
static bool agoq_stats_thread_on;
static int agoq_stats_thread_pid;
static bool agoq_stats_thread_stop;
static pthread_t agoq_stats_thread;
static atomic_int agoq_stats_exit_printed; /* the exit lines are out: a later close adds none */

bool agoq_stats_enabled(void) { return agoq_param_int(AGOQ_PARAM_STATS) != 0; }

int agoq_stats_output_fd(void) { return atomic_load(&agoq_stats_fd); }

/* ---- pure helpers ------------------------------------------------------------------------ */

bool agoq_stats_expand_path(const char* pattern, const char* host, int pid, char* out, size_t outlen,
                            char* err, size_t errlen) {
  size_t n = 0;
  if (outlen == 0) return false;
  for (const char* p = pattern; *p != '\0'; p++) {
    char num[24];
    const char* add = NULL;
    size_t len = 1;
    if (*p != '%') {
      add = p;
    } else if (p[1] == 'h') {
      add = host;
      len = strlen(host);
      p++;
    } else if (p[1] == 'p') {
      snprintf(num, sizeof num, "%d", pid);
      add = num;
      len = strlen(num);
      p++;
    } else if (p[1] == '%') {
      add = p;
      p++;
    } else {
      if (err != NULL) snprintf(err, errlen, "'%%%c' is not %%h (host name), %%p (pid) or %%%%", p[1] ? p[1] : ' ');
      return false;
    }
    if (n + len >= outlen) {
      if (err != NULL) snprintf(err, errlen, "the expanded path is longer than %zu characters", outlen - 1);
      return false;
    }
    memcpy(out + n, add, len);
    n += len;
  }
  out[n] = '\0';
  return true;
}

bool agoq_stats_interval_due(int64_t now_ns, int64_t interval_ns, int64_t* next_ns) {
  if (interval_ns <= 0) return false;
  if (*next_ns == 0) {
    *next_ns = now_ns + interval_ns;
    return false;
  }
  if (now_ns < *next_ns) return false;
  /* A late wake-up (suspended process, loaded machine) reports once, then keeps the grid. */
  int64_t missed = (now_ns - *next_ns) / interval_ns;
  *next_ns += (missed + 1) * interval_ns;
  return true;
}

int64_t agoq_stats_interval_wait(int64_t now_ns, int64_t next_ns) {
  return next_ns > now_ns ? next_ns - now_ns : 0;
}

static const char* agoq_stats_kind_name(agoq_stats_kind k) {
  switch (k) {
    case AGOQ_STATS_COLLNET: return "collnet";
    case AGOQ_STATS_P2P_SEND: return "p2p_send";
    case AGOQ_STATS_P2P_RECV: return "p2p_recv";
  }
  return "?";
}

static const char* const agoq_exact_names[AGOQ_EXACT_REASONS] = {
    [AGOQ_EXACT_TYPE] = "exact_type",           [AGOQ_EXACT_OP] = "exact_op",
    [AGOQ_EXACT_SMALL] = "exact_small",         [AGOQ_EXACT_LL] = "exact_ll",
    [AGOQ_EXACT_UNKNOWN] = "exact_unknown",     [AGOQ_EXACT_FORMAT_NONE] = "exact_format_none",
    [AGOQ_EXACT_COLLECTIVE] = "exact_collective", [AGOQ_EXACT_NOGAIN] = "exact_nogain",
    [AGOQ_EXACT_ONE_WAY] = "exact_one_way",     [AGOQ_EXACT_UNALIGNED] = "exact_unaligned"};

size_t agoq_stats_format(const agoq_stats_entry* e, int path, const char* event, const char* host, int pid,
                         char* out, size_t outlen) {
  const agoq_stats_path* s = &e->path[path];
  uint64_t raw = agoq_stats_get(&s->wire_raw), wire = agoq_stats_get(&s->wire_bytes);
  char who[48] = "";
  if (e->kind == AGOQ_STATS_COLLNET) snprintf(who, sizeof who, " rank=%d nranks=%d", e->rank, e->nranks);
  int n = snprintf(out, outlen,
                   "agoq-stats pid=%d host=%s event=%s id=%" PRIu64 " comm=0x%" PRIxPTR " kind=%s%s path=%s "
                   "calls=%" PRIu64 " bytes_in=%" PRIu64 " wire_raw=%" PRIu64 " wire_bytes=%" PRIu64
                   " ratio=%.3f codec_ms=%.3f crc_ms=%.3f wire_ms=%.3f device_calls=%" PRIu64
                   " pcie_d2h=%" PRIu64 " pcie_h2d=%" PRIu64 " gpu_ms=%.3f%s%s",
                   pid, host, event, e->id, e->comm, agoq_stats_kind_name(e->kind), who,
                   path == AGOQ_STATS_QUANT ? "quantized" : "exact", agoq_stats_get(&s->calls),
                   agoq_stats_get(&s->bytes_in), raw, wire, raw ? (double)wire / (double)raw : 1.0,
                   (double)agoq_stats_get(&s->codec_ns) / 1e6, (double)agoq_stats_get(&s->crc_ns) / 1e6,
                   (double)agoq_stats_get(&s->wire_ns) / 1e6, agoq_stats_get(&s->device_calls),
                   agoq_stats_get(&s->pcie_d2h), agoq_stats_get(&s->pcie_h2d),
                   (double)agoq_stats_get(&s->gpu_ns) / 1e6, e->config[0] ? " " : "", e->config);
  if (n < 0 || (size_t)n >= outlen) return 0;
  size_t len = (size_t)n;
  if (path == AGOQ_STATS_EXACT) {
    for (int r = 0; r < AGOQ_EXACT_REASONS; r++) {
      n = snprintf(out + len, outlen - len, " %s=%" PRIu64, agoq_exact_names[r], agoq_stats_get(&e->exact[r]));
      if (n < 0 || (size_t)n >= outlen - len) return 0;
      len += (size_t)n;
    }
  }
  if (len + 1 >= outlen) return 0;
  out[len++] = '\n';
  out[len] = '\0';
  return len;
}

/* ---- output ------------------------------------------------------------------------------- */

/* One write per line: lines from several threads or processes sharing the file (O_APPEND)
 * never interleave inside a line. */
static void agoq_stats_write(int fd, const char* buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return; /* statistics never fail the job */
    buf += n;
    len -= (size_t)n;
  }
}

static bool agoq_stats_idle(const agoq_stats_entry* e) {
  return agoq_stats_get(&e->path[0].calls) == 0 && agoq_stats_get(&e->path[1].calls) == 0;
}

static void agoq_stats_print_entry(int fd, const agoq_stats_entry* e, const char* event) {
  /* A net context without net traffic (every intra-node communicator has one) says nothing. */
  if (e->kind != AGOQ_STATS_COLLNET && agoq_stats_idle(e)) return;
  char line[AGOQ_STATS_LINE_MAX];
  for (int path = AGOQ_STATS_QUANT; path >= AGOQ_STATS_EXACT; path--) {
    size_t len = agoq_stats_format(e, path, event, agoq_stats_host, e->pid, line, sizeof line);
    if (len > 0) agoq_stats_write(fd, line, len);
  }
}

void agoq_stats_print_all(int fd, const char* event, bool open_only) {
  if (fd < 0) return;
  int pid = (int)getpid();
  for (agoq_stats_entry* e = atomic_load_explicit(&agoq_stats_head, memory_order_acquire); e != NULL; e = e->next) {
    if (e->pid != pid || (open_only && atomic_load(&e->closed))) continue;
    agoq_stats_print_entry(fd, e, event);
  }
}

/* Opens the output for this process (under the mutex). A file that cannot be opened is a
 * WARN and stderr instead: losing the figures is worse than putting them elsewhere. */
static void agoq_stats_output_open_locked(void) {
  int pid = (int)getpid();
  if (atomic_load(&agoq_stats_fd) >= 0 && agoq_stats_fd_pid == pid) return;
  if (agoq_stats_fd_owned && agoq_stats_fd_pid != pid) close(atomic_load(&agoq_stats_fd)); /* the parent's */
  agoq_stats_fd_owned = false;
  if (gethostname(agoq_stats_host, sizeof agoq_stats_host) != 0) snprintf(agoq_stats_host, sizeof agoq_stats_host, "?");
  agoq_stats_host[sizeof agoq_stats_host - 1] = '\0';
  /* Blanks would break key=value parsing. */
  for (char* c = agoq_stats_host; *c; c++)
    if (*c == ' ' || *c == '\t') *c = '_';
  int fd = STDERR_FILENO;
  const char* pattern = agoq_param_str(AGOQ_PARAM_STATS_FILE);
  if (pattern[0] != '\0') {
    char path[AGOQ_STATS_PATH_MAX], err[128];
    if (!agoq_stats_expand_path(pattern, agoq_stats_host, pid, path, sizeof path, err, sizeof err)) {
      AGOQ_WARN("AGOQ_STATS_FILE=\"%s\": %s; statistics go to stderr", pattern, err);
    } else {
      int f = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (f < 0) {
        AGOQ_WARN("AGOQ_STATS_FILE: cannot open %s: %s; statistics go to stderr", path, strerror(errno));
      } else {
        fd = f;
        agoq_stats_fd_owned = true;
      }
    }
  }
  agoq_stats_fd_pid = pid;
  atomic_store(&agoq_stats_fd, fd);
}

int64_t agoq_stats_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t agoq_stats_clock_u64(void) { return (uint64_t)agoq_stats_clock_ns(); }

/* Sleeps on a condition variable (CLOCK_MONOTONIC) between reports, so it costs nothing
 * between them and the exit hook or dlclose can wake and join it at once. */
static void* agoq_stats_thread_main(void* arg) {
  int64_t interval_ns = (int64_t)(intptr_t)arg * 1000000000;
  int64_t next = 0;
  (void)agoq_stats_interval_due(agoq_stats_clock_ns(), interval_ns, &next);
  pthread_mutex_lock(&agoq_stats_mu);
  while (!agoq_stats_thread_stop) {
    int64_t now = agoq_stats_clock_ns();
    if (agoq_stats_interval_due(now, interval_ns, &next)) {
      pthread_mutex_unlock(&agoq_stats_mu);
      agoq_stats_print_all(atomic_load(&agoq_stats_fd), "interval", true);
      pthread_mutex_lock(&agoq_stats_mu);
      continue;
    }
    int64_t wait = agoq_stats_interval_wait(now, next);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t until = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + wait;
    ts.tv_sec = (time_t)(until / 1000000000);
    ts.tv_nsec = (long)(until % 1000000000);
    (void)pthread_cond_timedwait(&agoq_stats_cv, &agoq_stats_mu, &ts);
  }
  pthread_mutex_unlock(&agoq_stats_mu);
  return NULL;
}

static void agoq_stats_thread_start_locked(void) {
  int pid = (int)getpid();
  if (agoq_stats_thread_on && agoq_stats_thread_pid == pid) return;
  int64_t interval_s = agoq_param_int(AGOQ_PARAM_STATS_INTERVAL_S);
  if (interval_s <= 0) return;
  static bool cv_ready = false;
  if (!cv_ready) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&agoq_stats_cv, &a);
    pthread_condattr_destroy(&a);
    cv_ready = true;
  }
  agoq_stats_thread_stop = false;
  int rc = pthread_create(&agoq_stats_thread, NULL, agoq_stats_thread_main, (void*)(intptr_t)interval_s);
  if (rc != 0) {
    AGOQ_WARN("AGOQ_STATS_INTERVAL_S: cannot start the statistics thread: %s; lines at close and exit only",
              strerror(rc));
    return;
  }
  (void)pthread_setname_np(agoq_stats_thread, "agoq-stats");
  agoq_stats_thread_on = true;
  agoq_stats_thread_pid = pid;
}

/* ---- registry ----------------------------------------------------------------------------- */

agoq_stats_entry* agoq_stats_open(agoq_stats_kind kind, const void* comm, int rank, int nranks,
                                  const char* config, bool always) {
  bool on = agoq_stats_enabled();
  if (!on && !always) return NULL;
  agoq_stats_entry* e = calloc(1, sizeof *e);
  if (e == NULL) {
    AGOQ_WARN("out of memory allocating %zu bytes of statistics", sizeof *e);
    return NULL;
  }
  e->kind = kind;
  e->comm = (uintptr_t)comm;
  e->rank = rank;
  e->nranks = nranks;
  e->pid = (int)getpid();
  if (config != NULL) snprintf(e->config, sizeof e->config, "%s", config);
  atomic_init(&e->closed, 0);
  if (!on) return e;
  e->registered = true;
  e->id = atomic_fetch_add(&agoq_stats_next_id, 1) + 1;
  /* The frame code times its payload CRCs only when asked: crc_ms is then measured. */
  agoq_frame_crc_clock_set(agoq_stats_clock_u64);
  pthread_mutex_lock(&agoq_stats_mu);
  agoq_stats_output_open_locked();
  agoq_stats_thread_start_locked();
  pthread_mutex_unlock(&agoq_stats_mu);
  agoq_stats_entry* head = atomic_load_explicit(&agoq_stats_head, memory_order_relaxed);
  do {
    e->next = head;
  } while (!atomic_compare_exchange_weak_explicit(&agoq_stats_head, &head, e, memory_order_release,
                                                  memory_order_relaxed));
  return e;
}

void agoq_stats_close(agoq_stats_entry* e) {
  if (e == NULL || !e->registered) return;
  if (atomic_exchange(&e->closed, 1)) return;
  if (e->pid == (int)getpid() && !atomic_load(&agoq_stats_exit_printed))
    agoq_stats_print_entry(atomic_load(&agoq_stats_fd), e, "close");
}

void agoq_stats_release(agoq_stats_entry* e) {
  if (e == NULL) return;
  if (e->registered)
    agoq_stats_close(e);
  else
    free(e);
}

/* No allocation; the only lock is the interval thread's, which it never holds while it
 * prints or sleeps (pthread_cond_timedwait releases it). */
void agoq_stats_at_exit(void) {
  if (atomic_load(&agoq_stats_head) == NULL) return;
  pthread_mutex_lock(&agoq_stats_mu);
  bool join = agoq_stats_thread_on && agoq_stats_thread_pid == (int)getpid();
  agoq_stats_thread_on = false;
  agoq_stats_thread_stop = true;
  if (join) pthread_cond_broadcast(&agoq_stats_cv);
  pthread_mutex_unlock(&agoq_stats_mu);
  /* dlclose unmaps this code: the thread must be gone first. */
  if (join) pthread_join(agoq_stats_thread, NULL);
  if (!atomic_exchange(&agoq_stats_exit_printed, 1))
    agoq_stats_print_all(atomic_load(&agoq_stats_fd), "exit", true);
  /* When every communicator was closed (a clean teardown before NCCL unloads us), nothing
   * can count into an entry any more: free them, or dlclose would leave them unreachable.
   * With one still open a thread may yet add to it (exit() while NCCL runs): keep them. */
  int pid = (int)getpid();
  for (agoq_stats_entry* e = atomic_load(&agoq_stats_head); e != NULL; e = e->next)
    if (e->pid == pid && !atomic_load(&e->closed)) return;
  agoq_stats_entry* e = atomic_exchange(&agoq_stats_head, NULL);
  while (e != NULL) {
    agoq_stats_entry* next = e->next;
    free(e);
    e = next;
  }
  int fd = atomic_exchange(&agoq_stats_fd, -1);
  if (agoq_stats_fd_owned && fd >= 0) close(fd);
  agoq_stats_fd_owned = false;
}

/* Runs at exit() and when NCCL unloads the plugin. */
__attribute__((destructor)) static void agoq_stats_unload(void) { agoq_stats_at_exit(); }
