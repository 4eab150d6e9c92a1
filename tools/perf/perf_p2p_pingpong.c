/*
 * agoq-perf p2p --pingpong: latency. Rank 0 sends a message, rank 1 sends it back, and the
 * time of a round trip over two is the one-way latency, as a user's blocking send/recv
 * sees it. The streaming run (perf_p2p.c) with one in flight times something else: its
 * sender never waits for its receiver, so the kernel may carry many small messages in one
 * TCP segment and the figure says how fast a sender can queue, not how soon a message
 * arrives. Both ends post their next receive before they send, as NCCL's proxy posts
 * receives ahead; every request is polled with test() and the caller yields when a pass
 * moved nothing, as the proxy does.
 */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

#define PP_TAG 0

/* What the plugin gets of buffer k: its device twin with --device, else the buffer. */
static uint8_t* pp_plugin_buf(const perf_pp_bufs* b, int k) { return b->dev[k] != NULL ? b->dev[k] : b->buf[k]; }

int perf_pp_bufs_alloc(perf_net* n, size_t bytes, bool device, perf_pp_bufs* b) {
  memset(b, 0, sizeof(*b));
  if (bytes == 0) bytes = 1;
  void* comms[2] = {n->send_comm, n->recv_comm};
  for (int k = 0; k < 2; k++) {
    b->buf[k] = malloc(bytes);
    if (b->buf[k] == NULL) {
      fprintf(stderr, "agoq-perf: cannot allocate 2 x %zu B for ping-pong\n", bytes);
      return -1;
    }
    memset(b->buf[k], 0, bytes); /* first-touch faults are not timed */
    if (device && (b->dev[k] = perf_device_twin(b->buf[k], bytes)) == NULL) return -1;
    for (int c = 0; c < 2; c++) {
      ncclResult_t r = agoq_view_reg_mr(&n->view, comms[c], pp_plugin_buf(b, k), bytes,
                                        device ? NCCL_PTR_CUDA : NCCL_PTR_HOST, &b->mh[k][c]);
      if (r != ncclSuccess) {
        fprintf(stderr, "agoq-perf: regMr of %zu B failed: %s\n", bytes, agoq_result_str(r));
        return -1;
      }
    }
  }
  return 0;
}

void perf_pp_bufs_free(perf_net* n, perf_pp_bufs* b) {
  void* comms[2] = {n->send_comm, n->recv_comm};
  for (int k = 0; k < 2; k++) {
    for (int c = 0; c < 2; c++)
      if (b->mh[k][c] != NULL && comms[c] != NULL) agoq_view_dereg_mr(&n->view, comms[c], b->mh[k][c]);
    perf_device_free(b->dev[k]);
    free(b->buf[k]);
  }
  memset(b, 0, sizeof(*b));
}

/* Posts a receive of `size` bytes into buf; the plugin may say "try again" (NULL request). */
static int pp_post_recv(perf_net* n, void* buf, size_t size, void* mh, void** req) {
  void* data[1] = {buf};
  size_t sizes[1] = {size};
  int tags[1] = {PP_TAG};
  for (;;) {
    ncclResult_t r = agoq_view_irecv(&n->view, n->recv_comm, 1, data, sizes, tags, &mh, req);
    if (r != ncclSuccess) {
      fprintf(stderr, "agoq-perf: ping-pong: irecv of %zu B failed: %s\n", size, agoq_result_str(r));
      return -1;
    }
    if (*req != NULL) return 0;
    sched_yield();
  }
}

/* Sends `size` bytes and polls until the plugin says the buffer may be reused. */
static int pp_send(perf_net* n, void* buf, size_t size, void* mh) {
  void* req = NULL;
  for (;;) {
    ncclResult_t r = agoq_view_isend_ph(&n->view, n->send_comm, buf, size, PP_TAG, mh, NULL, &req);
    if (r != ncclSuccess) {
      fprintf(stderr, "agoq-perf: ping-pong: isend of %zu B failed: %s\n", size, agoq_result_str(r));
      return -1;
    }
    if (req != NULL) break;
    sched_yield();
  }
  for (;;) {
    int done = 0, got = -1;
    ncclResult_t r = agoq_view_test(&n->view, req, &done, &got);
    if (r != ncclSuccess) {
      fprintf(stderr, "agoq-perf: ping-pong: test of a send (%zu B) failed: %s\n", size, agoq_result_str(r));
      return -1;
    }
    if (done) return 0;
    sched_yield();
  }
}

/* Polls a posted receive until it is done; the size that arrived must be the size sent. */
static int pp_wait_recv(perf_net* n, void* req, size_t size) {
  for (;;) {
    int done = 0, got = -1;
    ncclResult_t r = agoq_view_test(&n->view, req, &done, &got);
    if (r != ncclSuccess) {
      fprintf(stderr, "agoq-perf: ping-pong: test of a receive (%zu B) failed: %s\n", size,
              agoq_result_str(r));
      return -1;
    }
    if (done) {
      if (size <= INT_MAX && got != (int)size) {
        fprintf(stderr, "agoq-perf: ping-pong: %d B arrived, %zu B were sent\n", got, size);
        return -1;
      }
      return 0;
    }
    sched_yield();
  }
}

static int pp_check(const uint8_t* p, size_t size, int msg, const char* what) {
  size_t bad = perf_p2p_verify(p, size, perf_p2p_seed(size, msg));
  if (bad == SIZE_MAX) return 0;
  fprintf(stderr, "agoq-perf: ping-pong: message %d (%zu B): wrong data at offset %zu of the %s\n", msg, size,
          bad, what);
  return -1;
}

/* Rank 1: receive into buf[0], echo buf[0]; the next receive is posted before the echo. */
static int pp_echo(perf_net* n, const perf_opts* o, perf_pp_bufs* b, size_t size, int count, int msg_base) {
  void* req = NULL;
  if (count > 0 && pp_post_recv(n, pp_plugin_buf(b, 0), size, b->mh[0][1], &req) != 0) return -1;
  for (int k = 0; k < count; k++) {
    if (pp_wait_recv(n, req, size) != 0) return -1;
    /* --device: the bytes the plugin put into the device buffer once the receive was done. */
    if (o->check && b->dev[0] != NULL && perf_device_pull(b->buf[0], b->dev[0], size) != 0) return -1;
    if (o->check && pp_check(b->buf[0], size, msg_base + k, "message") != 0) return -1;
    /* The echo goes from buf[0] while the next message lands in buf[1]: a receive is
     * never posted into a buffer a send still reads. The two swap each round trip. */
    uint8_t* echo = pp_plugin_buf(b, 0); /* device to device with --device: no copy */
    void* echo_mh = b->mh[0][0];
    if (k + 1 < count) {
      uint8_t* t = b->buf[0];
      b->buf[0] = b->buf[1];
      b->buf[1] = t;
      t = b->dev[0];
      b->dev[0] = b->dev[1];
      b->dev[1] = t;
      for (int c = 0; c < 2; c++) {
        void* m = b->mh[0][c];
        b->mh[0][c] = b->mh[1][c];
        b->mh[1][c] = m;
      }
      if (pp_post_recv(n, pp_plugin_buf(b, 0), size, b->mh[0][1], &req) != 0) return -1;
    }
    if (pp_send(n, echo, size, echo_mh) != 0) return -1;
  }
  return 0;
}

/* Rank 0: post the echo's receive into buf[1], send buf[0], wait for both. */
static int pp_ping(perf_net* n, const perf_opts* o, perf_pp_bufs* b, size_t size, int count, int msg_base) {
  for (int k = 0; k < count; k++) {
    if (o->check) {
      perf_p2p_fill(b->buf[0], size, perf_p2p_seed(size, msg_base + k));
      memset(b->buf[1], 0, size);
      /* The last round trip is over: neither device buffer is in use. */
      if (b->dev[0] != NULL &&
          (perf_device_push(b->dev[0], b->buf[0], size) != 0 || perf_device_push(b->dev[1], b->buf[1], size) != 0))
        return -1;
    }
    void* req = NULL;
    if (pp_post_recv(n, pp_plugin_buf(b, 1), size, b->mh[1][1], &req) != 0) return -1;
    if (pp_send(n, pp_plugin_buf(b, 0), size, b->mh[0][0]) != 0) return -1;
    if (pp_wait_recv(n, req, size) != 0) return -1;
    if (o->check && b->dev[1] != NULL && perf_device_pull(b->buf[1], b->dev[1], size) != 0) return -1;
    if (o->check && pp_check(b->buf[1], size, msg_base + k, "echo") != 0) return -1;
  }
  return 0;
}

int perf_pp_run(perf_net* n, perf_boot* boot, const perf_opts* o, perf_pp_bufs* b, size_t size,
                int count, int msg_base, double* elapsed_us) {
  int timeout_ms = o->boot_timeout_s * 1000;
  if (boot->rank == 1) {
    if (perf_boot_send(boot, PERF_MSG_READY, NULL, 0) != 0) return -1;
    if (pp_echo(n, o, b, size, count, msg_base) != 0) return -1;
    return perf_boot_send(boot, PERF_MSG_DONE, NULL, 0);
  }
  if (perf_boot_recv(boot, PERF_MSG_READY, NULL, 0, timeout_ms) != 0) return -1;
  double t0 = perf_now_us();
  if (pp_ping(n, o, b, size, count, msg_base) != 0) return -1;
  *elapsed_us = perf_now_us() - t0;
  return perf_boot_recv(boot, PERF_MSG_DONE, NULL, 0, timeout_ms);
}
