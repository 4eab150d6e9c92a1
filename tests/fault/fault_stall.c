/*
 * stall: the receiver connects and then never posts a receive (a rank stuck in compute, or
 * hung). The sender keeps NCCL's 32 requests of 32 MiB posted and polls test() as the
 * proxy does. Checks, sampling the sender's VmRSS every 100 ms:
 *  - default (AGOQ_TIMEOUT_S unset): no error for 8 s (NCCL semantics: wait), and RSS
 *    grows by less than FAULT_STALL_RSS_LIMIT_KB over the run: the transport never copies
 *    or queues payload beyond the caller's buffers and the kernel's socket buffers;
 *  - AGOQ_TIMEOUT_S=2: the sender's test() fails within 2..15 s with an error.
 * --path pieces (the default) stalls the data sockets under the progress threads; --path
 * inline the control socket under the caller's thread (the 32 MiB messages go inline).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "net/agoq_net.h"

#define ST_MSG (32u << 20)
#define ST_REQS 32
#define FAULT_STALL_RSS_LIMIT_KB (16 * 1024)

typedef struct {
  uint8_t handle[FAULT_HANDLE_SIZE];
  int run_ms;
} st_arg;

static int st_receiver(int fd, void* varg) {
  (void)varg;
  void *ctx = NULL, *lc = NULL, *comm = NULL;
  uint8_t handle[FAULT_HANDLE_SIZE] = {0};
  if (fault_net_init(&ctx, NULL) != 0) return fault_report_fail(fd, "init failed");
  if (agoq_net_listen(ctx, 0, handle, &lc) != ncclSuccess) return fault_report_fail(fd, "listen failed");
  fault_send(fd, FAULT_MSG_HANDLE, handle, sizeof handle);
  if (fault_accept(lc, &comm, 20000, fd) != 0) return fault_report_fail(fd, "accept failed");
  /* Stalled: no receive is ever posted. */
  uint32_t kind;
  char sink[16];
  fault_recv(fd, &kind, sink, sizeof sink, 120000);
  agoq_net_close_recv(comm);
  agoq_net_close_listen(lc);
  agoq_net_finalize(ctx);
  return 0;
}

/* DONE value: max RSS growth in KiB; ERROR value: the result; phase TRANSFER. */
static int st_sender(int fd, void* varg) {
  st_arg* a = varg;
  void *ctx = NULL, *comm = NULL;
  if (fault_net_init(&ctx, NULL) != 0) return fault_report_fail(fd, "init failed");
  if (fault_connect(ctx, a->handle, &comm, 20000) != 0) return fault_report_fail(fd, "connect failed");
  uint8_t* buf = malloc(ST_MSG);
  if (buf == NULL) return fault_report_fail(fd, "out of memory");
  memset(buf, 0x33, ST_MSG);
  long base = fault_rss_kb(0), peak = base;
  void* reqs[ST_REQS] = {0};
  int nreq = 0;
  int64_t start = fault_now_ms(), next_sample = start;
  fault_event_send(fd, FAULT_MSG_PHASE, FAULT_PHASE_TRANSFER, base);
  while (fault_now_ms() - start < a->run_ms) {
    if (nreq < ST_REQS) {
      void* req = NULL;
      ncclResult_t r = agoq_net_isend(comm, buf, ST_MSG, 1, NULL, NULL, &req);
      if (r != ncclSuccess) {
        fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_TRANSFER, r);
        goto out;
      }
      if (req != NULL) reqs[nreq++] = req;
    }
    for (int i = 0; i < nreq; i++) {
      int done = 0, size = 0;
      ncclResult_t r = agoq_net_test(reqs[i], &done, &size);
      if (r != ncclSuccess) {
        fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_TRANSFER, r);
        goto out;
      }
      if (done) {
        fault_report_fail(fd, "a send completed although the receiver never posted a receive");
        goto out;
      }
    }
    if (fault_now_ms() >= next_sample) {
      long kb = fault_rss_kb(0);
      if (kb > peak) peak = kb;
      next_sample += 100;
    }
    usleep(1000);
  }
  fault_event_send(fd, FAULT_MSG_DONE, FAULT_PHASE_TRANSFER, peak - base);
out:
  /* Close with the sends pending, as NCCL aborting a comm. */
  agoq_net_close_send(comm);
  agoq_net_finalize(ctx);
  free(buf);
  return 0;
}

static int st_case(bool with_timeout, int run_ms) {
  st_arg a = {.run_ms = run_ms};
  fault_child r = {0}, s = {0};
  int fail = 0;
  if (with_timeout) setenv("AGOQ_TIMEOUT_S", "2", 1);
  else unsetenv("AGOQ_TIMEOUT_S");
  if (fault_spawn(&r, st_receiver, NULL) != 0) return 1;
  if (fault_recv_kind(r.fd, FAULT_MSG_HANDLE, a.handle, sizeof a.handle, 20000) != FAULT_HANDLE_SIZE) {
    fault_kill(&r);
    fault_reap(&r, 5000);
    return 1;
  }
  fault_spawn(&s, st_sender, &a);
  fault_event e;
  int64_t t0 = -1;
  if (fault_recv_kind(s.fd, FAULT_MSG_PHASE, &e, sizeof e, 20000) == (int)sizeof e) t0 = e.t_ms;
  uint32_t kind = 0;
  int n = fault_recv(s.fd, &kind, &e, sizeof e, run_ms + 20000);
  if (t0 < 0 || n != (int)sizeof e) {
    printf("fault: stall%s: the sender neither finished nor failed (hang)\n", with_timeout ? " AGOQ_TIMEOUT_S=2" : "");
    fail = 1;
  } else if (with_timeout) {
    int64_t dt = e.t_ms - t0;
    printf("fault: stall AGOQ_TIMEOUT_S=2: %s after %lld ms of a stalled reader\n",
           kind == FAULT_MSG_ERROR ? "sender's test() failed" : "NO error", (long long)dt);
    if (kind != FAULT_MSG_ERROR || dt < 1500 || dt > 15000) fail = 1;
  } else {
    printf("fault: stall default: %s for %d ms; sender RSS grew %lld KiB at most (limit %d KiB)\n",
           kind == FAULT_MSG_DONE ? "kept waiting, no error" : "FAILED", run_ms, (long long)e.value,
           FAULT_STALL_RSS_LIMIT_KB);
    if (kind != FAULT_MSG_DONE || e.value > FAULT_STALL_RSS_LIMIT_KB) fail = 1;
  }
  if (fault_reap(&s, 20000) != 0) {
    printf("fault: stall: sender did not exit (hang in close/finalize)\n");
    fail = 1;
  }
  fault_send(r.fd, FAULT_MSG_STOP, NULL, 0);
  if (fault_reap(&r, 20000) != 0) {
    printf("fault: stall: receiver did not exit (hang in close/finalize)\n");
    fail = 1;
  }
  unsetenv("AGOQ_TIMEOUT_S");
  return fail;
}

int fault_sc_stall(fault_path path) {
  int fails = st_case(false, 8000);
  fails += st_case(true, 30000);
  printf("fault: stall (%s): cases=2 failures=%d\n", fault_path_name(path), fails);
  return fails == 0 ? 0 : 1;
}
