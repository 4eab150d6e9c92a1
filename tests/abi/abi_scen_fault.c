/*
 * Scenarios where something goes wrong: a message larger than its receive, strangers on
 * the listen port, a peer killed mid-transfer, comms closed with requests in flight.
 * The plugin must turn each into an error (or a dropped connection) and keep serving.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "abi_harness.h"
#include "core/agoq_params.h"
#include "abi_scenarios.h"
#include "core/agoq_log.h"
#include "transport/tcp/agoq_tcp_wire.h"

#define ABI_CANARY 0x5C

/* Polls the pending requests oldest-first until one fails, which the peer's death must
 * cause within ABI_PEER_DEATH_LIMIT_MS of its control socket closing. */
static int abi_expect_failure(abi_worker* w, void** reqs, int n, const char* what) {
  int64_t start = abi_now_ms(), gone_at = -1;
  int next = 0;
  unsigned idle = 0;
  for (;;) {
    int64_t now = abi_now_ms();
    if (gone_at < 0 && abi_ctrl_peer_gone(w)) gone_at = now;
    int sizes[ABI_MAX_RECVS];
    int rc = abi_test_once(w, reqs[next], sizes);
    if (rc < 0) {
      fprintf(stderr, "abi[v%d %s role %d] %s %d failed as expected: %s (%lld ms after the peer died)\n",
              w->view.version, w->sc->name, w->role, what, next,
              abi_result_str((ncclResult_t)-rc), gone_at < 0 ? -1LL : (long long)(now - gone_at));
      return 0;
    }
    if (rc == 1) {
      ABI_REQUIRE(w, ++next < n, "all %d %ss completed although the peer was killed", n, what);
      idle = 0;
      continue;
    }
    ABI_REQUIRE(w, gone_at < 0 || now - gone_at <= ABI_PEER_DEATH_LIMIT_MS,
                "%s %d still pending %d ms after the peer was killed", what, next,
                ABI_PEER_DEATH_LIMIT_MS);
    ABI_REQUIRE(w, now - start < 30000, "%s %d pending for 30 s and the peer never died", what,
                next);
    if (++idle > 64) abi_sleep_us(200);
  }
fail:
  return -1;
}

/* ---- truncation: a send larger than the posted receive ---- */

typedef struct {
  size_t posted, sent;
} abi_trunc_case;

static const abi_trunc_case abi_trunc_cases[] = {
    {100, 200},                   /* inline-sized */
    {256u << 10, (1u << 20) + 1}, /* spread over the data sockets */
    {0, 1},                       /* an empty receive */
};

static int abi_truncation_receiver(abi_worker* w, void* comm, const abi_trunc_case* c) {
  abi_buf b = {0};
  void* mh = NULL;
  void* req = NULL;
  char guard[160];
  ABI_REQUIRE(w, abi_buf_alloc(&b, c->posted) == 0, "out of memory");
  memset(b.data, ABI_CANARY, c->posted);
  if (abi_reg(w, comm, b.data, c->posted, &mh) != 0) goto fail;
  void* data[1] = {b.data};
  size_t sizes[1] = {c->posted};
  int tags[1] = {1};
  if (abi_irecv(w, comm, 1, data, sizes, tags, &mh, &req, 10000) != 0) goto fail;
  int64_t deadline = abi_now_ms() + 10000;
  int rc = 0, got[ABI_MAX_RECVS] = {-1};
  while ((rc = abi_test_once(w, req, got)) == 0) {
    ABI_REQUIRE(w, abi_now_ms() < deadline,
                "%zu-B receive for a %zu-B send neither failed nor completed in 10 s", c->posted,
                c->sent);
    abi_sleep_us(100);
  }
  ABI_REQUIRE(w, rc < 0, "%zu-B receive for a %zu-B send completed (reported %d B)", c->posted,
              c->sent, got[0]);
  ABI_REQUIRE(w, -rc == ncclInvalidUsage,
              "%zu-B receive for a %zu-B send failed with %s, expected ncclInvalidUsage",
              c->posted, c->sent, abi_result_str((ncclResult_t)-rc));
  ABI_REQUIRE(w, abi_buf_guard_check(&b, guard, sizeof(guard)) == 0,
              "%zu-B receive for a %zu-B send: %s", c->posted, c->sent, guard);

  /* The connection is now broken: a further receive must fail, not hang or succeed. */
  void* req2 = NULL;
  ncclResult_t r = abi_net_irecv(w, comm, 1, data, sizes, tags, &mh, &req2);
  if (r == ncclSuccess && req2 != NULL) {
    deadline = abi_now_ms() + 3000;
    while ((rc = abi_test_once(w, req2, got)) == 0) {
      ABI_REQUIRE(w, abi_now_ms() < deadline,
                  "receive posted after a truncation still pending after 3 s");
      abi_sleep_us(100);
    }
    ABI_REQUIRE(w, rc < 0, "receive posted after a truncation completed (%d B)", got[0]);
  }
fail:
  abi_dereg(w, comm, mh);
  abi_buf_free(&b);
  return w->failed ? -1 : 0;
}

static int abi_truncation_sender(abi_worker* w, void* comm, const abi_trunc_case* c) {
  abi_buf b = {0};
  void* mh = NULL;
  void* req = NULL;
  ABI_REQUIRE(w, abi_buf_alloc(&b, c->sent) == 0, "out of memory");
  abi_pattern_fill(b.data, c->sent, 77);
  if (abi_reg(w, comm, b.data, c->sent, &mh) != 0) goto fail;
  if (abi_isend(w, comm, b.data, c->sent, 1, mh, &req, 10000) != 0) goto fail;
  /* Done (the bytes left) or failed (the receiver closed): either, but not a hang. */
  int64_t deadline = abi_now_ms() + 15000;
  int got[1];
  while (abi_test_once(w, req, got) == 0) {
    ABI_REQUIRE(w, abi_now_ms() < deadline,
                "oversized send still pending 15 s after the receiver saw the truncation");
    abi_sleep_us(100);
  }
fail:
  abi_dereg(w, comm, mh);
  abi_buf_free(&b);
  return w->failed ? -1 : 0;
}

int abi_sc_truncation(abi_worker* w) {
  for (size_t i = 0; i < sizeof(abi_trunc_cases) / sizeof(abi_trunc_cases[0]); i++) {
    void* comm = NULL;
    if (abi_pair_connect(w, &comm) != 0) return -1;
    if (w->role == 0) {
      abi_truncation_receiver(w, comm, &abi_trunc_cases[i]);
      abi_close_recv(w, &comm);
      if (abi_ctrl_send(w, ABI_MSG_DONE, NULL, 0) != 0) return -1;
    } else {
      abi_truncation_sender(w, comm, &abi_trunc_cases[i]);
      if (abi_ctrl_recv(w, ABI_MSG_DONE, NULL, 0, 30000) != 0) return -1;
      abi_close_send(w, &comm);
    }
    if (w->failed) return -1;
  }
  return 0;
}

/* ---- rogue: strangers on the listen port while a real peer connects ---- */

enum {
  ABI_ROGUE_GARBAGE,
  ABI_ROGUE_BAD_MAGIC,
  ABI_ROGUE_BAD_VERSION,
  ABI_ROGUE_HALF_HELLO,
  ABI_ROGUE_SILENT,
  ABI_ROGUE_WRONG_COMM,
  ABI_ROGUE_WRONG_NONCE,
  ABI_ROGUE_ORPHAN_DATA,
  ABI_ROGUE_COUNT
};

static const char* const abi_rogue_names[ABI_ROGUE_COUNT] = {
    "garbage bytes",         "hello with a bad magic", "hello with a bad version",
    "half a hello, then silence", "silent connection", "hello with a wrong comm id",
    "hello with a wrong nonce", "data socket of a connection that never came"};

#define ABI_ROGUE_PAYLOAD 1048579u
#define ABI_ROGUE_SEED 4242u

/* The handshake timeout the plugin uses, from its own parameter code (one parser of AGOQ_*);
 * the plugin under test has already refused an invalid value. */
static int abi_handshake_timeout_ms(void) {
  agoq_params_reset();
  if (agoq_params_load() != ncclSuccess) return 10000;
  return (int)agoq_param_int(AGOQ_PARAM_HANDSHAKE_TIMEOUT_MS);
}

/* A raw TCP connection to the listen address carrying `bytes` (possibly none). */
static int abi_rogue_open(abi_worker* w, const agoq_handle* h, const void* bytes, size_t len,
                          const char* name) {
  int fd = socket(h->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ABI_REQUIRE(w, fd >= 0, "socket: %s", strerror(errno));
  ABI_REQUIRE(w, connect(fd, (const struct sockaddr*)&h->addr, h->addr_len) == 0,
              "%s: connect to the listen port: %s", name, strerror(errno));
  /* The listener may already have dropped it: a failed write is its business, not ours. */
  if (len > 0) {
    ssize_t ignored = send(fd, bytes, len, MSG_NOSIGNAL);
    (void)ignored;
  }
  return fd;
fail:
  if (fd >= 0) close(fd);
  return -1;
}

/* 1 once the listener has closed the connection (EOF or reset), 0 while it is open. */
static int abi_rogue_closed(int fd) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  if (poll(&pfd, 1, 0) <= 0) return 0;
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT); /* a rejection ack may precede EOF */
  if (n == 0) return 1;
  if (n < 0) return (errno == EAGAIN || errno == EINTR) ? 0 : 1;
  return 0;
}

static int abi_rogue_listener(abi_worker* w) {
  void* lc = NULL;
  void* comm = NULL;
  void* extra = NULL;
  void* mh = NULL;
  abi_buf b = {0};
  ABI_REQUIRE(w, abi_buf_alloc(&b, ABI_ROGUE_PAYLOAD + 4096) == 0, "out of memory");
  memset(b.data, ABI_CANARY, b.size);
  if (abi_listen_publish(w, &lc) != 0) goto fail;
  /* The strangers reached the port first; the real peer must come through anyway. */
  if (abi_accept_poll(w, lc, &comm, 20000) != 0) goto fail;
  if (abi_reg(w, comm, b.data, b.size, &mh) != 0) goto fail;
  void* data[1] = {b.data};
  size_t sizes[1] = {b.size};
  int tags[1] = {1};
  void* req = NULL;
  int got[ABI_MAX_RECVS] = {-1};
  if (abi_irecv(w, comm, 1, data, sizes, tags, &mh, &req, 10000) != 0) goto fail;
  if (abi_wait(w, req, got, 20000) != 0) goto fail;
  if (abi_check_received(w, &b, b.size, ABI_ROGUE_PAYLOAD, got[0], ABI_ROGUE_SEED,
                         "the real peer's message") != 0)
    goto fail;
  /* Keep the listener serving (NCCL would keep calling accept for further peers) while
   * the connector checks that every stranger gets dropped; none may become a comm. */
  unsigned idle = 0;
  int64_t deadline = abi_now_ms() + abi_handshake_timeout_ms() + 20000;
  while (!abi_ctrl_readable(w)) {
    ABI_NCCL_OK(w, agoq_view_accept(&w->view, lc, &extra));
    ABI_REQUIRE(w, extra == NULL,
                "accept returned a second comm: a stranger (or another communicator) got in");
    ABI_REQUIRE(w, abi_now_ms() < deadline, "connector never finished its checks");
    if (++idle > 16) abi_sleep_us(1000);
  }
  if (abi_ctrl_recv(w, ABI_MSG_DONE, NULL, 0, 1000) != 0) goto fail;
  abi_ctrl_send(w, ABI_MSG_DONE, NULL, 0);
fail:
  abi_dereg(w, comm, mh);
  abi_close_recv(w, &comm);
  abi_close_recv(w, &extra);
  abi_close_listen(w, &lc);
  abi_buf_free(&b);
  return w->failed ? -1 : 0;
}

/* v11+: a connect from a ctx of another communicator must not get through. */
static int abi_rogue_other_comm(abi_worker* w, const uint8_t* handle0) {
  if (w->view.version < 11) return 0;
  void* ctx2 = NULL;
  void* comm = NULL;
  uint8_t handle[ABI_HANDLE_SIZE];
  memcpy(handle, handle0, ABI_HANDLE_SIZE);
  ABI_NCCL_OK(w, agoq_view_init(&w->view, &ctx2, w->comm_id ^ 0xbadc0ffeull, agoq_log_stderr));
  int64_t deadline = abi_now_ms() + abi_handshake_timeout_ms() + 3000;
  ncclResult_t r = ncclSuccess;
  while ((r = agoq_view_connect(&w->view, ctx2, w->dev, handle, &comm)) == ncclSuccess &&
         comm == NULL && abi_now_ms() < deadline)
    abi_sleep_us(500);
  ABI_REQUIRE(w, comm == NULL,
              "connect from a ctx with comm id %#llx to a listener of comm id %#llx succeeded",
              (unsigned long long)(w->comm_id ^ 0xbadc0ffeull), (unsigned long long)w->comm_id);
  ABI_REQUIRE(w, r != ncclSuccess,
              "connect from another communicator's ctx neither failed nor completed in %d ms",
              abi_handshake_timeout_ms() + 3000);
fail:
  abi_close_send(w, &comm);
  if (ctx2 != NULL) agoq_view_finalize(&w->view, ctx2);
  return w->failed ? -1 : 0;
}

static int abi_rogue_connector(abi_worker* w) {
  uint8_t handle[ABI_HANDLE_SIZE], handle_other[ABI_HANDLE_SIZE];
  int fds[ABI_ROGUE_COUNT];
  int64_t closed_at[ABI_ROGUE_COUNT];
  void* comm = NULL;
  void* mh = NULL;
  abi_buf b = {0};
  agoq_handle h;
  for (int i = 0; i < ABI_ROGUE_COUNT; i++) fds[i] = -1, closed_at[i] = -1;
  ABI_REQUIRE(w, abi_buf_alloc(&b, ABI_ROGUE_PAYLOAD) == 0, "out of memory");
  abi_pattern_fill(b.data, b.size, ABI_ROGUE_SEED);
  if (abi_handle_receive(w, handle) != 0) goto fail;
  memcpy(handle_other, handle, sizeof(handle));
  agoq_wire_status st = agoq_handle_decode(handle, sizeof(handle), &h);
  ABI_REQUIRE(w, st == AGOQ_WIRE_OK, "cannot decode the listener's handle: %s",
              agoq_wire_status_str(st));

  int64_t opened = abi_now_ms();
  for (int i = 0; i < ABI_ROGUE_COUNT; i++) {
    uint8_t bytes[256];
    size_t len = 0;
    agoq_hello hello = {.comm_id = h.comm_id,
                        .nonce = h.nonce,
                        .conn_id = 0x1000u + (uint64_t)i,
                        .sock_index = 0,
                        .nsocks = (uint8_t)h.nsocks};
    switch (i) {
      case ABI_ROGUE_GARBAGE:
        for (size_t k = 0; k < sizeof(bytes); k++) bytes[k] = (uint8_t)(k * 131u + 7u);
        len = sizeof(bytes);
        break;
      case ABI_ROGUE_BAD_MAGIC:
        agoq_hello_encode(&hello, bytes);
        bytes[0] ^= 0xFF;
        len = AGOQ_HELLO_SIZE;
        break;
      case ABI_ROGUE_BAD_VERSION:
        agoq_hello_encode(&hello, bytes);
        bytes[4] = 0x7F; /* the version field follows the magic */
        len = AGOQ_HELLO_SIZE;
        break;
      case ABI_ROGUE_HALF_HELLO:
        agoq_hello_encode(&hello, bytes);
        len = AGOQ_HELLO_SIZE / 2;
        break;
      case ABI_ROGUE_SILENT:
        break;
      case ABI_ROGUE_WRONG_COMM:
        hello.comm_id ^= 1;
        agoq_hello_encode(&hello, bytes);
        len = AGOQ_HELLO_SIZE;
        break;
      case ABI_ROGUE_WRONG_NONCE:
        hello.nonce ^= 1;
        agoq_hello_encode(&hello, bytes);
        len = AGOQ_HELLO_SIZE;
        break;
      case ABI_ROGUE_ORPHAN_DATA:
        hello.sock_index = 1;
        agoq_hello_encode(&hello, bytes);
        len = AGOQ_HELLO_SIZE;
        break;
    }
    fds[i] = abi_rogue_open(w, &h, bytes, len, abi_rogue_names[i]);
    if (fds[i] < 0) goto fail;
  }

  if (abi_connect_poll(w, w->ctx, handle, &comm, 20000) != 0) goto fail;
  if (abi_reg(w, comm, b.data, b.size, &mh) != 0) goto fail;
  void* req = NULL;
  int sent[1];
  if (abi_isend(w, comm, b.data, b.size, 1, mh, &req, 10000) != 0) goto fail;
  if (abi_wait(w, req, sent, 20000) != 0) goto fail;

  if (abi_rogue_other_comm(w, handle_other) != 0) goto fail;

  /* Every stranger must be dropped by the handshake timeout at the latest. */
  int limit = abi_handshake_timeout_ms() + 4000;
  int open_left = ABI_ROGUE_COUNT;
  while (open_left > 0 && abi_now_ms() - opened < limit) {
    for (int i = 0; i < ABI_ROGUE_COUNT; i++) {
      if (closed_at[i] < 0 && abi_rogue_closed(fds[i])) {
        closed_at[i] = abi_now_ms() - opened;
        open_left--;
      }
    }
    abi_sleep_us(2000);
  }
  for (int i = 0; i < ABI_ROGUE_COUNT; i++) {
    ABI_REQUIRE(w, closed_at[i] >= 0, "%s still open after %d ms (handshake timeout %d ms)",
                abi_rogue_names[i], limit, abi_handshake_timeout_ms());
  }
  fprintf(stderr, "abi[v%d rogue] strangers dropped after (ms):", w->view.version);
  for (int i = 0; i < ABI_ROGUE_COUNT; i++)
    fprintf(stderr, " %s=%lld", abi_rogue_names[i], (long long)closed_at[i]);
  fprintf(stderr, "\n");
fail:
  /* The listener's trailing accept loop ends on DONE whether or not we failed. */
  if (abi_ctrl_send(w, ABI_MSG_DONE, NULL, 0) == 0) abi_ctrl_recv(w, ABI_MSG_DONE, NULL, 0, 30000);
  for (int i = 0; i < ABI_ROGUE_COUNT; i++)
    if (fds[i] >= 0) close(fds[i]);
  abi_dereg(w, comm, mh);
  abi_close_send(w, &comm);
  abi_buf_free(&b);
  return w->failed ? -1 : 0;
}

int abi_sc_rogue(abi_worker* w) {
  return w->role == 0 ? abi_rogue_listener(w) : abi_rogue_connector(w);
}

/* ---- kill: a peer dies with SIGKILL in the middle of a transfer ---- */

#define ABI_KILL_BIG (256u << 20)
#define ABI_KILL_SMALL (1u << 20)

/* The victim: a few progress calls so the transfer is under way, then SIGKILL. */
static void abi_die_midway(abi_worker* w, void* req) {
  for (int i = 0; i < 3; i++) {
    int sizes[ABI_MAX_RECVS];
    abi_test_once(w, req, sizes);
    abi_sleep_us(1000);
  }
  raise(SIGKILL);
}

int abi_sc_kill_sender(abi_worker* w) {
  void* comm = NULL;
  void* mh[2] = {0};
  void* req[2] = {0};
  uint8_t* big = calloc(1, ABI_KILL_BIG);
  uint8_t* small = calloc(1, ABI_KILL_SMALL);
  ABI_REQUIRE(w, big != NULL && small != NULL, "out of memory");
  if (abi_pair_connect(w, &comm) != 0) goto fail;
  if (abi_reg(w, comm, big, ABI_KILL_BIG, &mh[0]) != 0) goto fail;
  if (abi_reg(w, comm, small, ABI_KILL_SMALL, &mh[1]) != 0) goto fail;
  if (w->role == 0) {
    /* Two receives: the big one the sender dies in the middle of, and one it never
     * starts. At least one must fail rather than wait forever. */
    for (int i = 0; i < 2; i++) {
      void* data[1] = {i == 0 ? big : small};
      size_t sizes[1] = {i == 0 ? ABI_KILL_BIG : ABI_KILL_SMALL};
      int tags[1] = {1};
      if (abi_irecv(w, comm, 1, data, sizes, tags, &mh[i], &req[i], 10000) != 0) goto fail;
    }
    if (abi_ctrl_send(w, ABI_MSG_READY, NULL, 0) != 0) goto fail;
    abi_expect_failure(w, req, 2, "receive");
  } else {
    if (abi_ctrl_recv(w, ABI_MSG_READY, NULL, 0, 20000) != 0) goto fail;
    if (abi_isend(w, comm, big, ABI_KILL_BIG, 1, mh[0], &req[0], 10000) != 0) goto fail;
    abi_die_midway(w, req[0]);
  }
fail:
  /* As NCCL aborting a comm: deregister and close with the failed requests outstanding. */
  for (int i = 0; i < 2; i++) abi_dereg(w, comm, mh[i]);
  if (w->role == 0)
    abi_close_recv(w, &comm);
  else
    abi_close_send(w, &comm);
  free(big);
  free(small);
  return w->failed ? -1 : 0;
}

int abi_sc_kill_receiver(abi_worker* w) {
  void* comm = NULL;
  void* mh[2] = {0};
  void* req[2] = {0};
  uint8_t* big = calloc(1, ABI_KILL_BIG);
  uint8_t* small = calloc(1, ABI_KILL_SMALL);
  ABI_REQUIRE(w, big != NULL && small != NULL, "out of memory");
  if (abi_pair_connect(w, &comm) != 0) goto fail;
  if (abi_reg(w, comm, big, ABI_KILL_BIG, &mh[0]) != 0) goto fail;
  if (abi_reg(w, comm, small, ABI_KILL_SMALL, &mh[1]) != 0) goto fail;
  if (w->role == 0) {
    void* data[1] = {big};
    size_t sizes[1] = {ABI_KILL_BIG};
    int tags[1] = {1};
    if (abi_irecv(w, comm, 1, data, sizes, tags, &mh[0], &req[0], 10000) != 0) goto fail;
    if (abi_ctrl_send(w, ABI_MSG_READY, NULL, 0) != 0) goto fail;
    if (abi_ctrl_recv(w, ABI_MSG_DATA, NULL, 0, 20000) != 0) goto fail;
    abi_die_midway(w, req[0]);
  } else {
    if (abi_ctrl_recv(w, ABI_MSG_READY, NULL, 0, 20000) != 0) goto fail;
    if (abi_isend(w, comm, big, ABI_KILL_BIG, 1, mh[0], &req[0], 10000) != 0) goto fail;
    if (abi_isend(w, comm, small, ABI_KILL_SMALL, 1, mh[1], &req[1], 10000) != 0) goto fail;
    if (abi_ctrl_send(w, ABI_MSG_DATA, NULL, 0) != 0) goto fail;
    abi_expect_failure(w, req, 2, "send");
  }
fail:
  for (int i = 0; i < 2; i++) abi_dereg(w, comm, mh[i]);
  if (w->role == 0)
    abi_close_recv(w, &comm);
  else
    abi_close_send(w, &comm);
  free(big);
  free(small);
  return w->failed ? -1 : 0;
}

/* ---- close_inflight: close comms with 32 requests pending each way ---- */

#define ABI_CLOSE_MSG (8u << 20)
#define ABI_CLOSE_CHECK ((1u << 20) + 7u)

static int abi_close_phase1(abi_worker* w) {
  enum { N = ABI_MAX_REQUESTS };
  void* scomm = NULL;
  void* rcomm = NULL;
  void* smh = NULL;
  void* rmh = NULL;
  void* sreq[N] = {0};
  void* rreq[N] = {0};
  /* Every request shares one buffer per direction: the content is not checked, and 32 x 8
   * MiB each way keeps the transfer going well past the moment of the close. */
  uint8_t* sbuf = calloc(1, ABI_CLOSE_MSG);
  uint8_t* rbuf = calloc(1, ABI_CLOSE_MSG);
  ABI_REQUIRE(w, sbuf != NULL && rbuf != NULL, "out of memory");
  if (abi_pair_connect_both(w, &scomm, &rcomm) != 0) goto fail;
  if (abi_reg(w, scomm, sbuf, ABI_CLOSE_MSG, &smh) != 0) goto fail;
  if (abi_reg(w, rcomm, rbuf, ABI_CLOSE_MSG, &rmh) != 0) goto fail;
  for (int i = 0; i < N; i++) {
    void* data[1] = {rbuf};
    size_t sizes[1] = {ABI_CLOSE_MSG};
    int tags[1] = {1 - w->role};
    if (abi_irecv(w, rcomm, 1, data, sizes, tags, &rmh, &rreq[i], 10000) != 0) goto fail;
  }
  for (int i = 0; i < N; i++)
    if (abi_isend(w, scomm, sbuf, ABI_CLOSE_MSG, w->role, smh, &sreq[i], 10000) != 0) goto fail;
  if (abi_ctrl_barrier(w, ABI_MSG_READY, 20000) != 0) goto fail;
  /* Get the transfer moving, then pull the rug: results do not matter here, a crash,
   * a hang or a sanitizer report does. */
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < N; i++) {
      int sizes[ABI_MAX_RECVS];
      abi_test_once(w, rreq[i], sizes);
      abi_test_once(w, sreq[i], sizes);
    }
    abi_sleep_us(5000);
  }
fail:
  abi_dereg(w, scomm, smh);
  abi_dereg(w, rcomm, rmh);
  abi_close_send(w, &scomm);
  abi_close_recv(w, &rcomm);
  free(sbuf);
  free(rbuf);
  return w->failed ? -1 : 0;
}

/* After closing comms mid-flight the plugin must still serve new connections. */
static int abi_close_phase2(abi_worker* w) {
  void* scomm = NULL;
  void* rcomm = NULL;
  void* smh = NULL;
  void* rmh = NULL;
  abi_buf sb = {0}, rb = {0};
  ABI_REQUIRE(w, abi_buf_alloc(&sb, ABI_CLOSE_CHECK) == 0 && abi_buf_alloc(&rb, ABI_CLOSE_CHECK) == 0,
              "out of memory");
  abi_pattern_fill(sb.data, sb.size, 0xC105Eu + (uint64_t)w->role);
  memset(rb.data, ABI_CANARY, rb.size);
  if (abi_pair_connect_both(w, &scomm, &rcomm) != 0) goto fail;
  if (abi_reg(w, scomm, sb.data, sb.size, &smh) != 0) goto fail;
  if (abi_reg(w, rcomm, rb.data, rb.size, &rmh) != 0) goto fail;
  abi_reqlist sends = {.count = 1}, recvs = {.count = 1};
  void* data[1] = {rb.data};
  size_t sizes[1] = {rb.size};
  int tags[1] = {1 - w->role};
  if (abi_irecv(w, rcomm, 1, data, sizes, tags, &rmh, &recvs.req[0], 10000) != 0) goto fail;
  if (abi_isend(w, scomm, sb.data, sb.size, w->role, smh, &sends.req[0], 10000) != 0) goto fail;
  if (abi_wait_lists(w, &recvs, &sends, 20000) != 0) goto fail;
  if (abi_check_received(w, &rb, rb.size, ABI_CLOSE_CHECK, recvs.sizes[0][0],
                         0xC105Eu + (uint64_t)(1 - w->role), "message on a fresh connection") != 0)
    goto fail;
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 20000) != 0) goto fail;
fail:
  abi_dereg(w, scomm, smh);
  abi_dereg(w, rcomm, rmh);
  abi_close_send(w, &scomm);
  abi_close_recv(w, &rcomm);
  abi_buf_free(&sb);
  abi_buf_free(&rb);
  return w->failed ? -1 : 0;
}

int abi_sc_close_inflight(abi_worker* w) {
  if (abi_close_phase1(w) != 0) return -1;
  return abi_close_phase2(w);
}
