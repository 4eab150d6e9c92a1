/*
 * kill_p2p / kill_coll: a peer is SIGKILLed at a random point of connect, of a p2p
 * transfer, or of a collective (group creation or a stream of all-reduces). Each seed picks
 * the victim, the phase and a delay after the victim reports entering that phase. Every
 * survivor's pending call must return an error within FAULT_DETECT_LIMIT_MS of the kill.
 * One exception is by design: a listener whose connector dies before the handshake is
 * complete has nobody to fail for (NCCL's accept simply waits); there the check is that
 * the listener still serves a fresh connector.
 *
 * --path pieces (the default) puts every payload on the data sockets, so a kill lands
 * mid-piece with the progress threads moving the bytes (CollNet's slices, under
 * AGOQ_SOCKET_INLINE's 4 MiB default, would otherwise all go inline); --path inline puts
 * them on the control socket, moved by the caller's thread.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collnet/agoq_collnet.h"
#include "core/agoq_log.h"
#include "fault.h"
#include "net/agoq_net.h"

#define KP_MSG (16u << 20)
#define KP_INFLIGHT 4

typedef struct {
  uint8_t handle[FAULT_HANDLE_SIZE];
  int rank, nranks;
} kp_arg;

/* ---- p2p workers ------------------------------------------------------------------- */

/* Streams receives (or sends) until an error, or STOP. Reports PHASE_TRANSFER after the
 * first completion and ERROR with the failing result. */
static int kp_stream(int fd, void* comm, bool send) {
  uint8_t* buf = malloc(KP_MSG);
  if (buf == NULL) return fault_report_fail(fd, "out of memory");
  memset(buf, 0x5a, KP_MSG);
  void* reqs[KP_INFLIGHT] = {0};
  long posted = 0, done = 0;
  bool reported = false;
  for (;;) {
    if (fault_stop_requested(fd)) break;
    while (posted - done < KP_INFLIGHT) {
      void* req = NULL;
      ncclResult_t r;
      if (send) {
        r = agoq_net_isend(comm, buf, KP_MSG, 1, NULL, NULL, &req);
      } else {
        void* data[1] = {buf};
        size_t sizes[1] = {KP_MSG};
        int tags[1] = {1};
        r = agoq_net_irecv(comm, 1, data, sizes, tags, NULL, NULL, &req);
      }
      if (r != ncclSuccess) {
        fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_TRANSFER, r);
        free(buf);
        return 0;
      }
      if (req == NULL) break;
      reqs[posted++ % KP_INFLIGHT] = req;
    }
    int f = 0, size = 0;
    ncclResult_t r = agoq_net_test(reqs[done % KP_INFLIGHT], &f, &size);
    if (r != ncclSuccess) {
      fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_TRANSFER, r);
      free(buf);
      return 0;
    }
    if (f) {
      done++;
      if (!reported) {
        fault_event_send(fd, FAULT_MSG_PHASE, FAULT_PHASE_TRANSFER, done);
        reported = true;
      }
    }
  }
  free(buf);
  return 0;
}

static int kp_receiver(int fd, void* varg) {
  (void)varg;
  void *ctx = NULL, *lc = NULL;
  uint8_t handle[FAULT_HANDLE_SIZE] = {0};
  if (fault_net_init(&ctx, NULL) != 0) return fault_report_fail(fd, "init failed");
  if (agoq_net_listen(ctx, 0, handle, &lc) != ncclSuccess) return fault_report_fail(fd, "listen failed");
  fault_send(fd, FAULT_MSG_HANDLE, handle, sizeof handle);
  /* Serve connectors one after another until STOP: the first may die mid-handshake. */
  for (;;) {
    fault_event_send(fd, FAULT_MSG_PHASE, FAULT_PHASE_CONNECT, 0);
    void* comm = NULL;
    int rc = fault_accept(lc, &comm, 60000, fd);
    if (rc == -2) break;
    if (rc != 0) {
      fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_CONNECT, rc);
      break;
    }
    fault_event_send(fd, FAULT_MSG_DONE, FAULT_PHASE_CONNECT, 0);
    kp_stream(fd, comm, false);
    agoq_net_close_recv(comm);
    if (fault_stop_requested(fd)) break;
  }
  agoq_net_close_listen(lc);
  agoq_net_finalize(ctx);
  return 0;
}

static int kp_sender(int fd, void* varg) {
  kp_arg* a = varg;
  void *ctx = NULL, *comm = NULL;
  if (fault_net_init(&ctx, NULL) != 0) return fault_report_fail(fd, "init failed");
  fault_event_send(fd, FAULT_MSG_PHASE, FAULT_PHASE_CONNECT, 0);
  int rc = fault_connect(ctx, a->handle, &comm, 60000);
  if (rc != 0) {
    fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_CONNECT, rc);
  } else {
    fault_event_send(fd, FAULT_MSG_DONE, FAULT_PHASE_CONNECT, 0);
    kp_stream(fd, comm, true);
    agoq_net_close_send(comm);
  }
  agoq_net_finalize(ctx);
  return 0;
}

/* Waits for `who` to report an ERROR (skipping other messages); its time, or -1. */
static int64_t kp_wait_error(fault_child* who, int timeout_ms, int64_t* res) {
  int64_t end = fault_now_ms() + timeout_ms;
  for (;;) {
    int left = (int)(end - fault_now_ms());
    if (left <= 0) return -1;
    uint32_t kind = 0;
    fault_event e;
    int n = fault_recv(who->fd, &kind, &e, sizeof e, left);
    if (n < 0) return -1;
    if (kind == FAULT_MSG_ERROR && n == (int)sizeof e) {
      *res = e.value;
      return e.t_ms;
    }
  }
}

/* Waits for `who` to report entering `phase` (or, for the connect phase, being past it). */
static int kp_wait_phase(fault_child* who, int phase, int timeout_ms) {
  int64_t end = fault_now_ms() + timeout_ms;
  for (;;) {
    int left = (int)(end - fault_now_ms());
    if (left <= 0) return -1;
    uint32_t kind = 0;
    fault_event e;
    int n = fault_recv(who->fd, &kind, &e, sizeof e, left);
    if (n < 0) return -1;
    if (kind == FAULT_MSG_PHASE && e.phase == phase) return 0;
    if (kind == FAULT_MSG_ERROR) return -1;
  }
}

int fault_sc_kill_p2p(int seeds, uint64_t seed0, fault_path path) {
  int cases = 0, hangs = 0, failures = 0, served = 0;
  int64_t worst = 0;
  for (int i = 0; i < seeds; i++) {
    uint64_t st = fault_mix(seed0 + (uint64_t)i);
    bool kill_sender = fault_rand(&st) & 1;
    int phase = (fault_rand(&st) % 2) ? FAULT_PHASE_TRANSFER : FAULT_PHASE_CONNECT;
    int delay_ms = (int)(fault_rand(&st) % (phase == FAULT_PHASE_CONNECT ? 3 : 40));
    kp_arg a = {0};
    fault_child r = {0}, s = {0};
    const char* what = kill_sender ? "sender" : "receiver";
    if (fault_spawn(&r, kp_receiver, &a) != 0) return 1;
    if (fault_recv_kind(r.fd, FAULT_MSG_HANDLE, a.handle, sizeof a.handle, 20000) != FAULT_HANDLE_SIZE) {
      fprintf(stderr, "fault: kill_p2p seed %d: no handle\n", i);
      fault_kill(&r);
      fault_reap(&r, 5000);
      failures++;
      continue;
    }
    if (fault_spawn(&s, kp_sender, &a) != 0) return 1;
    fault_child* victim = kill_sender ? &s : &r;
    fault_child* survivor = kill_sender ? &r : &s;
    cases++;
    bool ok = true;
    if (kp_wait_phase(victim, phase, 20000) != 0) {
      fprintf(stderr, "fault: kill_p2p seed %d: %s never reached phase %d\n", i, what, phase);
      ok = false;
    }
    if (ok) {
      fault_sleep_ms(delay_ms);
      fault_kill(victim);
      int64_t killed = fault_now_ms();
      fault_reap(victim, 5000);
      int64_t res = 0;
      int64_t t = kp_wait_error(survivor, FAULT_DETECT_LIMIT_MS + 1000, &res);
      if (t >= 0) {
        int64_t dt = t - killed;
        if (dt > worst) worst = dt;
        printf("fault: kill_p2p seed %d: %s killed %d ms into %s; survivor failed with %d after %lld ms\n", i, what,
               delay_ms, phase == FAULT_PHASE_CONNECT ? "connect" : "transfer", (int)res, (long long)dt);
        if (dt > FAULT_DETECT_LIMIT_MS) ok = false;
      } else if (kill_sender) {
        /* The connector died before the listener had a comm: nothing to fail. The listener
         * must still serve a fresh connector. */
        fault_child s2 = {0};
        fault_spawn(&s2, kp_sender, &a);
        int64_t t0 = fault_now_ms();
        bool got = kp_wait_phase(&s2, FAULT_PHASE_TRANSFER, 20000) == 0;
        printf("fault: kill_p2p seed %d: sender killed %d ms into connect before the handshake completed; listener "
               "%s a fresh connector (%lld ms)\n",
               i, delay_ms, got ? "served" : "did NOT serve", (long long)(fault_now_ms() - t0));
        if (got) served++;
        else ok = false;
        fault_kill(&s2);
        fault_reap(&s2, 5000);
      } else {
        printf("fault: kill_p2p seed %d: receiver killed %d ms into %s; survivor reported no error within %d ms\n",
               i, delay_ms, phase == FAULT_PHASE_CONNECT ? "connect" : "transfer", FAULT_DETECT_LIMIT_MS + 5000);
        hangs++;
        ok = false;
      }
    }
    fault_send(survivor->fd, FAULT_MSG_STOP, NULL, 0);
    if (fault_reap(survivor, 15000) != 0) {
      fprintf(stderr, "fault: kill_p2p seed %d: survivor did not exit after STOP (hang in close/finalize)\n", i);
      hangs++;
      ok = false;
    }
    fault_kill(&r);
    fault_kill(&s);
    fault_reap(&r, 5000);
    fault_reap(&s, 5000);
    if (!ok) failures++;
  }
  printf("fault: kill_p2p (%s): cases=%d failures=%d hangs=%d served-after-connect-kill=%d worst-detect-ms=%lld\n",
         fault_path_name(path), cases, failures, hangs, served, (long long)worst);
  return failures == 0 && cases == seeds ? 0 : 1;
}

/* ---- collectives -------------------------------------------------------------------- */

#define KC_NRANKS 3
#define KC_CALL (1u << 20)
#define KC_INFLIGHT 8

static int kc_rank(int fd, void* varg) {
  kp_arg* a = varg;
  void *ctx = NULL, *lc = NULL, *cc = NULL;
  static uint8_t all[KC_NRANKS][FAULT_HANDLE_SIZE];
  void* hp[KC_NRANKS];
  int rc = fault_coll_join(fd, KC_NRANKS, &ctx, &lc, &all[0][0], hp);
  if (rc != 0) return rc;
  fault_event_send(fd, FAULT_MSG_PHASE, FAULT_PHASE_CONNECT, 0);
  ncclResult_t r = agoq_coll_connect(hp, KC_NRANKS, a->rank, lc, &cc);
  if (r != ncclSuccess) {
    fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_CONNECT, r);
    agoq_coll_close_listen(lc);
    agoq_coll_finalize(ctx);
    return 0;
  }
  size_t bytes = (size_t)KC_CALL * KC_INFLIGHT;
  uint16_t* send = malloc(bytes);
  uint8_t* recv = malloc(bytes);
  if (send == NULL || recv == NULL) return fault_report_fail(fd, "out of memory");
  for (size_t i = 0; i < bytes / 2; i++) send[i] = (uint16_t)(0x3f80 + (i % 64)); /* bf16 around 1.0 */
  void *smh = NULL, *rmh = NULL;
  agoq_coll_reg_mr(cc, send, bytes, NCCL_PTR_HOST, &smh);
  agoq_coll_reg_mr(cc, recv, bytes, NCCL_PTR_HOST, &rmh);
  void* reqs[KC_INFLIGHT] = {0};
  long posted = 0, done = 0;
  bool reported = false;
  ncclResult_t err = ncclSuccess;
  while (!fault_stop_requested(fd)) {
    while (posted - done < KC_INFLIGHT) {
      size_t off = (size_t)(posted % KC_INFLIGHT) * KC_CALL;
      void* req = NULL;
      err = agoq_coll_iallreduce(cc, (uint8_t*)send + off, recv + off, KC_CALL / 2, ncclBfloat16, ncclSum, smh, rmh, &req);
      if (err != ncclSuccess || req == NULL) break;
      reqs[posted++ % KC_INFLIGHT] = req;
    }
    if (err != ncclSuccess) break;
    int f = 0, size = 0;
    err = agoq_coll_test(reqs[done % KC_INFLIGHT], &f, &size);
    if (err != ncclSuccess) break;
    if (f) {
      done++;
      if (!reported) fault_event_send(fd, FAULT_MSG_PHASE, FAULT_PHASE_TRANSFER, done), reported = true;
    } else {
      usleep(50);
    }
  }
  if (err != ncclSuccess) fault_event_send(fd, FAULT_MSG_ERROR, FAULT_PHASE_TRANSFER, err);
  /* Wait for STOP, then tear down: closeColl of a broken group must return. */
  uint32_t kind;
  char sink[64];
  if (err != ncclSuccess) fault_recv(fd, &kind, sink, sizeof sink, 30000);
  int64_t t0 = fault_now_ms();
  agoq_coll_dereg_mr(cc, smh);
  agoq_coll_dereg_mr(cc, rmh);
  agoq_coll_close_coll(cc);
  agoq_coll_close_listen(lc);
  agoq_coll_finalize(ctx);
  free(send);
  free(recv);
  return fault_now_ms() - t0 < FAULT_DETECT_LIMIT_MS ? 0 : 2;
}

int fault_sc_kill_coll(int seeds, uint64_t seed0, fault_path path) {
  int cases = 0, hangs = 0, failures = 0, detections = 0;
  int64_t worst = 0;
  for (int i = 0; i < seeds; i++) {
    uint64_t st = fault_mix(seed0 + 0x100000u + (uint64_t)i);
    int victim = (int)(fault_rand(&st) % KC_NRANKS);
    int phase = (fault_rand(&st) % 3) ? FAULT_PHASE_TRANSFER : FAULT_PHASE_CONNECT;
    int delay_ms = (int)(fault_rand(&st) % (phase == FAULT_PHASE_CONNECT ? 5 : 60));
    fault_child c[KC_NRANKS];
    kp_arg a[KC_NRANKS];
    static uint8_t all[KC_NRANKS][FAULT_HANDLE_SIZE];
    bool ok = true;
    for (int k = 0; k < KC_NRANKS; k++) {
      a[k] = (kp_arg){.rank = k, .nranks = KC_NRANKS};
      if (fault_spawn(&c[k], kc_rank, &a[k]) != 0) return 1;
    }
    for (int k = 0; k < KC_NRANKS && ok; k++)
      ok = fault_recv_kind(c[k].fd, FAULT_MSG_HANDLE, all[k], FAULT_HANDLE_SIZE, 20000) == FAULT_HANDLE_SIZE;
    for (int k = 0; k < KC_NRANKS && ok; k++) ok = fault_send(c[k].fd, FAULT_MSG_HANDLES, all, sizeof all) == 0;
    cases++;
    if (ok && kp_wait_phase(&c[victim], phase, 30000) != 0) {
      fprintf(stderr, "fault: kill_coll seed %d: rank %d never reached phase %d\n", i, victim, phase);
      ok = false;
    }
    if (ok) {
      fault_sleep_ms(delay_ms);
      fault_kill(&c[victim]);
      int64_t killed = fault_now_ms();
      fault_reap(&c[victim], 5000);
      for (int k = 0; k < KC_NRANKS; k++) {
        if (k == victim) continue;
        int64_t res = 0;
        int64_t t = kp_wait_error(&c[k], FAULT_DETECT_LIMIT_MS + 5000, &res);
        if (t < 0) {
          printf("fault: kill_coll seed %d: rank %d killed %d ms into %s; rank %d reported no error within %d ms\n", i,
                 victim, delay_ms, phase == FAULT_PHASE_CONNECT ? "group creation" : "all-reduces", k,
                 FAULT_DETECT_LIMIT_MS + 5000);
          hangs++;
          ok = false;
          continue;
        }
        int64_t dt = t - killed;
        if (dt > worst) worst = dt;
        detections++;
        printf("fault: kill_coll seed %d: rank %d killed %d ms into %s; rank %d failed with %d after %lld ms\n", i,
               victim, delay_ms, phase == FAULT_PHASE_CONNECT ? "group creation" : "all-reduces", k, (int)res,
               (long long)dt);
        if (dt > FAULT_DETECT_LIMIT_MS) ok = false;
      }
    }
    for (int k = 0; k < KC_NRANKS; k++) {
      if (c[k].reaped) continue;
      fault_send(c[k].fd, FAULT_MSG_STOP, NULL, 0);
      if (fault_reap(&c[k], 20000) != 0) {
        fprintf(stderr, "fault: kill_coll seed %d: rank %d did not exit (hang in teardown)\n", i, k);
        hangs++;
        ok = false;
      } else if (k != victim && ok && (!WIFEXITED(c[k].status) || WEXITSTATUS(c[k].status) != 0)) {
        fprintf(stderr, "fault: kill_coll seed %d: rank %d exited with status %#x (slow teardown?)\n", i, k,
                c[k].status);
        ok = false;
      }
    }
    if (!ok) failures++;
  }
  printf("fault: kill_coll (%s): cases=%d survivor-detections=%d failures=%d hangs=%d worst-detect-ms=%lld\n",
         fault_path_name(path), cases, detections, failures, hangs, (long long)worst);
  return failures == 0 ? 0 : 1;
}
