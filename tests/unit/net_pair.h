/* A connected send/receive pair on one net context, for the in-process transport tests
 * (test_transport, test_typed, test_stats), and a stand-in for NCCL's profiler callback
 * (fake_step, fake_prof, step_of) for the typed p2p ones. Include after <cmocka.h>. */
#ifndef AGOQ_TEST_NET_PAIR_H
#define AGOQ_TEST_NET_PAIR_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/agoq_net.h"
#include "profiler/agoq_oracle.h"

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

/* What the fake profiler chain says about a transfer: the pHandle points at one. */
typedef struct {
  bool answer; /* false: behave as NCCL with no NetPlugin profiler (nothing started) */
  agoq_xfer_desc desc;
} fake_step;

/* NetPlugin events fake_prof started and stopped, over the process. */
static int starts, stops;

static inline ncclResult_t fake_prof(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  static int marker;
  fake_step* s = pHandle;
  if (type == AGOQ_PROF_NET_EVENT_START) {
    if (!s->answer) return ncclSuccess;
    agoq_xfer_desc* d = extData;
    assert_int_equal(pluginId, AGOQ_PROF_NET_PLUGIN_ID);
    assert_int_equal(d->magic, AGOQ_XFER_DESC_MAGIC);
    *d = s->desc;
    d->magic = AGOQ_XFER_DESC_MAGIC;
    d->filled = 1;
    *eHandle = &marker;
    starts++;
  } else if (type == AGOQ_PROF_NET_EVENT_STOP) {
    assert_ptr_equal(*eHandle, &marker);
    stops++;
  }
  return ncclSuccess;
}

static inline fake_step step_of(agoq_xfer_kind kind, int dtype, agoq_xfer_proto proto, int is_send) {
  return (fake_step){.answer = true,
                     /* two_way: the fake chain answers as for a pipeline flow (AGOQ_P2P_SCOPE). */
                     .desc = {.kind = kind, .dtype = dtype, .proto = proto, .is_send = is_send, .peer = 1,
                              .task_bytes = 1u << 30, .two_way = 1}};
}

/* The environment of the typed p2p tests: loopback, int8 p2p frames from 64 KiB, stats on. */
static inline void p2p_env(void) {
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  setenv("AGOQ_P2P_FORMAT", "int8", 1);
  setenv("AGOQ_MIN_BYTES", "64K", 1);
  setenv("AGOQ_STATS", "1", 1);
}

#endif
