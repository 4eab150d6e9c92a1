/* A connected send/receive pair on one net context, for the in-process transport tests
 * (test_transport, test_typed). Include after <cmocka.h>. */
#ifndef AGOQ_TEST_NET_PAIR_H
#define AGOQ_TEST_NET_PAIR_H

#include <string.h>
#include <time.h>

#include "net/agoq_net.h"

typedef struct {
  void* ctx;
  void* listen;
  void* send;
  void* recv;
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
} pair;

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Polls connect and accept alternately, as two proxies would. */
static inline void pair_open_ex(pair* p, uint64_t comm_id, ncclProfilerCallback_t prof) {
  memset(p, 0, sizeof *p);
  assert_int_equal(agoq_net_init(&p->ctx, comm_id, -1, NULL, prof), ncclSuccess);
  assert_int_equal(agoq_net_listen(p->ctx, 0, p->handle, &p->listen), ncclSuccess);
  double deadline = now_s() + 10;
  while ((p->send == NULL || p->recv == NULL) && now_s() < deadline) {
    if (p->send == NULL) assert_int_equal(agoq_net_connect(p->ctx, 0, p->handle, &p->send), ncclSuccess);
    if (p->recv == NULL) assert_int_equal(agoq_net_accept(p->listen, &p->recv), ncclSuccess);
  }
  assert_non_null(p->send);
  assert_non_null(p->recv);
}

static inline void pair_close(pair* p) {
  assert_int_equal(agoq_net_close_send(p->send), ncclSuccess);
  assert_int_equal(agoq_net_close_recv(p->recv), ncclSuccess);
  assert_int_equal(agoq_net_close_listen(p->listen), ncclSuccess);
  assert_int_equal(agoq_net_finalize(p->ctx), ncclSuccess);
}

#endif
