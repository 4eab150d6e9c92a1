/* CollNet groups in one process, for test_collnet and test_collnet_device: nranks "nodes"
 * with their own contexts over loopback, connected from one thread per rank (connect
 * blocks); the settings read per context; a log capture; polling requests to completion.
 * Include after <cmocka.h>, with COMM_ID and MAXR (the most ranks of a group) defined. */
#ifndef AGOQ_TEST_COLLNET_GROUP_H
#define AGOQ_TEST_COLLNET_GROUP_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collnet/agoq_collnet.h"
#include "core/agoq_params.h"

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- environment: the collnet settings are read per context, so tests change them ---- */

static inline void env_set(const char* format, const char* min_bytes, const char* chunk) {
  setenv("AGOQ_FORMAT", format, 1);
  setenv("AGOQ_MIN_BYTES", min_bytes, 1);
  setenv("AGOQ_COLLNET_CHUNK", chunk, 1);
  agoq_params_reset();
}

/* ---- log capture (the logger is process-wide: tests restore it) ---- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[16384];
static int log_warns;

static inline void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                               const char* fmt, ...) __attribute__((format(printf, 5, 6)));
static inline void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                               const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_mu);
  if (level == NCCL_LOG_WARN) log_warns++;
  size_t used = strlen(log_buf);
  snprintf(log_buf + used, sizeof log_buf - used, "%s\n", msg);
  pthread_mutex_unlock(&log_mu);
}

static inline void capture_reset(void) {
  pthread_mutex_lock(&log_mu);
  log_buf[0] = '\0';
  log_warns = 0;
  pthread_mutex_unlock(&log_mu);
}

/* ---- a group of ranks ---- */

typedef struct {
  int n;
  void* ctx[MAXR];
  void* listen[MAXR];
  void* comm[MAXR];
  uint8_t handles[MAXR][NCCL_NET_HANDLE_MAXSIZE];
  void* hptr[MAXR];
  ncclResult_t res[MAXR];
} group;

typedef struct {
  group* g;
  int rank;
} connect_arg;

static inline void* connect_main(void* p) {
  connect_arg* a = p;
  group* g = a->g;
  g->res[a->rank] = agoq_coll_connect(g->hptr, g->n, a->rank, g->listen[a->rank], &g->comm[a->rank]);
  return NULL;
}

/* Creates contexts and listens; connects ranks [0, nconnect) from their own threads. */
static inline void group_start(group* g, int n, int nconnect) {
  memset(g, 0, sizeof *g);
  g->n = n;
  for (int r = 0; r < n; r++) {
    assert_int_equal(agoq_coll_init(&g->ctx[r], COMM_ID, NULL), ncclSuccess);
    assert_int_equal(agoq_coll_listen(g->ctx[r], 0, g->handles[r], &g->listen[r]), ncclSuccess);
    g->hptr[r] = g->handles[r];
  }
  pthread_t th[MAXR];
  connect_arg args[MAXR];
  for (int r = 0; r < nconnect; r++) {
    args[r] = (connect_arg){g, r};
    assert_int_equal(pthread_create(&th[r], NULL, connect_main, &args[r]), 0);
  }
  for (int r = 0; r < nconnect; r++) pthread_join(th[r], NULL);
}

static inline void group_open(group* g, int n) {
  group_start(g, n, n);
  for (int r = 0; r < n; r++) {
    assert_int_equal(g->res[r], ncclSuccess);
    assert_non_null(g->comm[r]);
    assert_int_equal(agoq_coll_close_listen(g->listen[r]), ncclSuccess);
    g->listen[r] = NULL;
  }
}

static inline void group_close(group* g) {
  for (int r = 0; r < g->n; r++) {
    assert_int_equal(agoq_coll_close_coll(g->comm[r]), ncclSuccess);
    assert_int_equal(agoq_coll_close_listen(g->listen[r]), ncclSuccess);
    assert_int_equal(agoq_coll_finalize(g->ctx[r]), ncclSuccess);
  }
}

/* Called once per request, right when test() said done (i: its index). */
typedef void (*wait_done_fn)(int i, void* arg);

/* Polls until every request is done; results[i] gets the error of a failed one. */
static inline void wait_all_cb(void** reqs, int nreq, int* sizes, ncclResult_t* results, double timeout,
                               wait_done_fn on_done, void* arg) {
  int left = nreq;
  bool done_flag[64] = {false};
  double deadline = now_s() + timeout;
  while (left > 0) {
    for (int i = 0; i < nreq; i++) {
      if (done_flag[i]) continue;
      int done = 0, size = -1;
      ncclResult_t res = agoq_coll_test(reqs[i], &done, &size);
      if (res != ncclSuccess || done) {
        done_flag[i] = true;
        left--;
        if (results != NULL) results[i] = res;
        else assert_int_equal(res, ncclSuccess);
        if (sizes != NULL) sizes[i] = size;
        if (done && on_done != NULL) on_done(i, arg);
      }
    }
    if (left > 0 && now_s() > deadline) fail_msg("%d of %d CollNet requests not done after %.0f s", left, nreq, timeout);
  }
}

static inline void wait_all(void** reqs, int nreq, int* sizes, ncclResult_t* results, double timeout) {
  wait_all_cb(reqs, nreq, sizes, results, timeout, NULL, NULL);
}

#endif
