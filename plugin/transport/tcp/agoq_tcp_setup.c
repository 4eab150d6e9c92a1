/* Connection setup: listen, the staged non-blocking connect, and accept with the handshake
 * that binds every socket to the communicator and the listen instance. Nothing here ever
 * blocks: every step is retried by NCCL's next call. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_fdlimit.h"
#include "transport/tcp/agoq_tcp.h"

#define AGOQ_CONNECT_MAGIC 0x4e4e4341u /* "ACNN" */
#define AGOQ_ACCEPT_BURST 128          /* new sockets taken per accept call */

int64_t agoq_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t agoq_random_u64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
    /* getrandom only fails before the entropy pool is ready; mix what we have. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    v = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 16) ^ (uintptr_t)&v;
  }
  return v;
}

static void agoq_setsockopt_int(int fd, int level, int opt, int value, const char* name) {
  /* Socket options tune, they do not decide correctness: a refused one is logged only. */
  if (setsockopt(fd, level, opt, &value, sizeof value) != 0)
    AGOQ_INFO(NCCL_NET, "setsockopt(%s=%d) failed: %s", name, value, strerror(errno));
}

static bool agoq_addr_is_loopback(const struct sockaddr_storage* a) {
  if (a->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in*)a)->sin_addr.s_addr) >> 24) == 127;
  if (a->ss_family == AF_INET6) {
    const struct in6_addr* a6 = &((const struct sockaddr_in6*)a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a6) ||
           (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
  }
  return false;
}

static bool agoq_dev_is_loopback(const agoq_transport_config* c, int dev) {
  return dev >= 0 && dev < c->nifs && agoq_addr_is_loopback(&c->ifs[dev].addr);
}

bool agoq_tcp_cc_paces(const char* name) { return strncmp(name, "bbr", 3) == 0; }

/* The socket's congestion control, "" when it cannot be read. */
static void agoq_socket_cc(int fd, char out[16]) {
  socklen_t len = 15;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, out, &len) != 0) len = 0;
  out[len < 16 ? len : 15] = '\0';
}

void agoq_tcp_cc_effective(const agoq_transport_config* c, int dev, char out[16]) {
  out[0] = '\0';
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  agoq_socket_cc(fd, out);
  close(fd);
  /* The first name a socket would accept; what the kernel refuses is known only then. */
  const char* want[2];
  if (out[0] != '\0' && agoq_tcp_cc_choice(c, agoq_dev_is_loopback(c, dev), out, want) > 0)
    snprintf(out, 16, "%s", want[0]);
}

void agoq_tcp_buffer_sizes(const agoq_transport_config* c, int dev, bool paces, int* sndbuf, int* rcvbuf) {
  bool fixed = agoq_dev_is_loopback(c, dev) && paces;
  *sndbuf = c->sndbuf == AGOQ_TCP_BUF_AUTO ? (fixed ? AGOQ_TCP_LOOPBACK_SNDBUF : 0) : c->sndbuf;
  *rcvbuf = c->rcvbuf == AGOQ_TCP_BUF_AUTO ? (fixed ? AGOQ_TCP_LOOPBACK_RCVBUF : 0) : c->rcvbuf;
}

uint64_t agoq_tcp_inline_max(const agoq_transport_config* c, int dev, bool paces) {
  if (c->inline_max != AGOQ_TCP_INLINE_AUTO) return (uint64_t)c->inline_max;
  /* Without pacing one loopback socket is limited only by the two copies, which the
   * caller's thread and the peer's already keep busy: threads and pieces only add hand-offs. */
  return agoq_dev_is_loopback(c, dev) && !paces ? UINT64_MAX : (uint64_t)AGOQ_TCP_INLINE_DEFAULT;
}

/* One line of a /proc list of algorithms, "(unreadable)" when it cannot be read. */
static void agoq_tcp_cc_read_list(const char* path, char* out, size_t len) {
  snprintf(out, len, "(unreadable)");
  FILE* f = fopen(path, "re");
  if (f == NULL) return;
  if (fgets(out, (int)len, f) == NULL) snprintf(out, len, "(empty)");
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

ncclResult_t agoq_tcp_cc_resolve(agoq_transport_config* c, const char* value) {
  c->cc_auto = false;
  c->cc[0] = '\0';
  if (value == NULL || value[0] == '\0' || strcmp(value, "system") == 0) return ncclSuccess;
  if (strcmp(value, "auto") == 0) {
    c->cc_auto = true;
    return ncclSuccess;
  }
  /* The kernel's names (TCP_CA_NAME_MAX is 16 with the NUL): lower-case letters, digits, '_'. */
  size_t n = strlen(value);
  bool ok = n < sizeof c->cc;
  for (size_t i = 0; ok && i < n; i++)
    ok = (value[i] >= 'a' && value[i] <= 'z') || (value[i] >= '0' && value[i] <= '9') || value[i] == '_';
  if (!ok) {
    AGOQ_WARN("AGOQ_SOCKET_CC=\"%s\": not a congestion control name (auto, system, or at most %zu of a-z, 0-9, "
              "_; see /proc/sys/net/ipv4/tcp_available_congestion_control)",
              value, sizeof c->cc - 1);
    return ncclInvalidArgument;
  }
  /* Ask the kernel now, as every socket would ask it later: a name it refuses (not built,
   * not loadable, or not allowed to this process) would otherwise leave every socket on the
   * system's default with one WARN at the first connection, and `agoq-info -c` would pass
   * it. No IPv4 socket (an IPv6-only host) leaves the check to the connections. */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int rc = setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, value, (socklen_t)n);
    int err = errno;
    close(fd);
    if (rc != 0) {
      char avail[160], allowed[160];
      agoq_tcp_cc_read_list("/proc/sys/net/ipv4/tcp_available_congestion_control", avail, sizeof avail);
      agoq_tcp_cc_read_list("/proc/sys/net/ipv4/tcp_allowed_congestion_control", allowed, sizeof allowed);
      AGOQ_WARN("AGOQ_SOCKET_CC=%s: this kernel refuses it (%s); loaded: %s; allowed without CAP_NET_ADMIN: %s. "
                "Use one of those, auto, or system",
                value, strerror(err), avail, allowed);
      return ncclInvalidArgument;
    }
  }
  memcpy(c->cc, value, n + 1);
  return ncclSuccess;
}

int agoq_tcp_cc_choice(const agoq_transport_config* c, bool loopback, const char* current, const char* out[2]) {
  if (c->cc[0] != '\0') {
    if (strcmp(current, c->cc) == 0) return 0;
    out[0] = c->cc;
    return 1;
  }
  /* On loopback no queue needs protecting, and bbr's per-socket pacing held a connection
   * that had carried small messages to a third of its rate (agoq_params.def). reno is
   * always built in and allowed; cubic may not be allowed to an unprivileged process. */
  if (!c->cc_auto || !loopback || !agoq_tcp_cc_paces(current)) return 0;
  out[0] = "cubic";
  out[1] = "reno";
  return 2;
}

/* AGOQ_SOCKET_CC on one socket: before connect or listen (accepted sockets inherit the
 * listener's), and again once connected (then a no-op). */
static void agoq_socket_set_cc(int fd, int dev) {
  if (!agoq_config.cc_auto && agoq_config.cc[0] == '\0') return;
  char current[16];
  agoq_socket_cc(fd, current);
  const char* want[2];
  int n = agoq_tcp_cc_choice(&agoq_config, agoq_dev_is_loopback(&agoq_config, dev), current, want);
  static atomic_bool said;
  for (int i = 0; i < n; i++) {
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, want[i], (socklen_t)strlen(want[i])) == 0) {
      if (!atomic_exchange(&said, true))
        AGOQ_INFO(NCCL_INIT | NCCL_NET, "TCP congestion control %s instead of %s on %s (AGOQ_SOCKET_CC=%s)", want[i],
                  current, agoq_config.cc_auto ? "loopback" : "every socket", agoq_config.cc_auto ? "auto" : want[i]);
      return;
    }
    if (agoq_config.cc[0] != '\0' && !atomic_exchange(&said, true))
      AGOQ_WARN("AGOQ_SOCKET_CC=%s: the kernel refused it (%s); sockets keep %s", want[i], strerror(errno), current);
  }
}

static void agoq_socket_tune_buffers(int fd, int dev) {
  agoq_socket_set_cc(fd, dev); /* first: the buffer sizes follow the algorithm */
  char cc[16];
  agoq_socket_cc(fd, cc);
  int snd, rcv;
  agoq_tcp_buffer_sizes(&agoq_config, dev, agoq_tcp_cc_paces(cc), &snd, &rcv);
  if (snd > 0) agoq_setsockopt_int(fd, SOL_SOCKET, SO_SNDBUF, snd, "SO_SNDBUF");
  if (rcv > 0) agoq_setsockopt_int(fd, SOL_SOCKET, SO_RCVBUF, rcv, "SO_RCVBUF");
}

ncclResult_t agoq_socket_configure(int fd, int dev, const char* peer) {
  (void)peer;
  agoq_setsockopt_int(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
  agoq_socket_set_cc(fd, dev);
  if (agoq_config.keepalive_s > 0) {
    agoq_setsockopt_int(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
    agoq_setsockopt_int(fd, IPPROTO_TCP, TCP_KEEPIDLE, agoq_config.keepalive_s, "TCP_KEEPIDLE");
    agoq_setsockopt_int(fd, IPPROTO_TCP, TCP_KEEPINTVL, 2, "TCP_KEEPINTVL");
    agoq_setsockopt_int(fd, IPPROTO_TCP, TCP_KEEPCNT, 5, "TCP_KEEPCNT");
  }
  if (agoq_config.timeout_s > 0)
    agoq_setsockopt_int(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, agoq_config.timeout_s * 1000, "TCP_USER_TIMEOUT");
  return ncclSuccess;
}

/* ---- comms ------------------------------------------------------------------------ */

ncclResult_t agoq_tcp_conn_create(bool is_send, int dev, int ctrl_fd, const int* data_fds, unsigned nsocks,
                                  const char* peer, agoq_tp_conn** out) {
  ncclResult_t res = ncclSuccess;
  agoq_tp_conn* comm = NULL;
  AGOQ_CALLOC_GOTO(comm, 1, res, fail);
  comm->is_send = is_send;
  comm->dev = dev;
  comm->ctrl_fd = ctrl_fd;
  comm->nsocks = nsocks;
  comm->min_chunk = agoq_config.min_chunk;
  atomic_init(&comm->error, ncclSuccess);
  snprintf(comm->peer, sizeof comm->peer, "%s", peer);
  if (!is_send) AGOQ_CALLOC_GOTO(comm->rx_buf, AGOQ_RX_BUF_SIZE, res, fail);
  if (nsocks > 0) AGOQ_CALLOC_GOTO(comm->streams, nsocks, res, fail);
  for (unsigned i = 0; i < nsocks; i++) comm->streams[i].fd = -1;
  AGOQ_CHECK_GOTO(agoq_socket_configure(ctrl_fd, dev, peer), res, fail);
  /* The sender's plan follows the algorithm its control socket ended up with. */
  char cc[16];
  agoq_socket_cc(ctrl_fd, cc);
  /* An inline-only connection (no data sockets) carries every message inline. */
  comm->inline_max = nsocks == 0 ? UINT64_MAX : agoq_tcp_inline_max(&agoq_config, dev, agoq_tcp_cc_paces(cc));
  for (unsigned i = 0; i < nsocks; i++) {
    agoq_stream* s = &comm->streams[i];
    s->fd = data_fds[i];
    s->is_send = is_send;
    s->comm_error = &comm->error;
    s->peer = comm->peer;
    atomic_init(&s->head, 0);
    atomic_init(&s->tail, 0);
    AGOQ_CHECK_GOTO(agoq_socket_configure(s->fd, dev, peer), res, fail);
    AGOQ_CHECK_GOTO(agoq_progress_attach(s), res, fail);
  }
  *out = comm;
  return ncclSuccess;
fail:
  if (comm != NULL) {
    agoq_tcp_conn_destroy(comm);
  } else {
    /* The fds were handed to us: close them even when the comm never existed. */
    close(ctrl_fd);
    for (unsigned i = 0; i < nsocks; i++) close(data_fds[i]);
  }
  return res;
}

void agoq_tcp_conn_destroy(agoq_tp_conn* comm) {
  if (comm->streams != NULL) {
    for (unsigned i = 0; i < comm->nsocks; i++) {
      agoq_stream* s = &comm->streams[i];
      agoq_progress_detach(s); /* after this no worker touches the stream or its pieces */
      if (s->fd >= 0) close(s->fd);
    }
    free(comm->streams);
  }
  if (comm->ctrl_fd >= 0) close(comm->ctrl_fd);
  free(comm->rx_buf);
  free(comm);
}

/* A stream socket for listen or connect. Out of descriptors (EMFILE), the soft limit is
 * raised toward the hard one and the call tried again; where it cannot be, the error names
 * the limit (a CollNet group reserves its descriptors up front: agoq_fd_reserve). */
static int agoq_tcp_socket(int family, const char* peer) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 && errno == EMFILE && agoq_fd_raise_after_emfile())
    fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    char hint[256] = "";
    if (err == EMFILE || err == ENFILE) agoq_fd_exhausted_hint(hint, sizeof hint);
    AGOQ_WARN("socket for %s failed: %s%s", peer, strerror(err), hint);
  }
  return fd;
}

/* ---- listen ------------------------------------------------------------------------ */

unsigned agoq_tcp_conn_fds(unsigned listen_flags) {
  return 1 + ((listen_flags & AGOQ_TP_LISTEN_INLINE) ? 0 : agoq_config.nsocks);
}

ncclResult_t agoq_tcp_listen(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_listen** listen_comm) {
  ncclResult_t res = ncclSuccess;
  agoq_tp_listen* lc = NULL;
  *listen_comm = NULL;
  AGOQ_CALLOC_GOTO(lc, 1, res, fail);
  lc->dev = dev;
  lc->fd = -1;
  lc->comm_id = comm_id;
  lc->nonce = agoq_random_u64();
  AGOQ_CALLOC_GOTO(lc->pending, agoq_config.max_pending, res, fail);

  const agoq_netif* nif = &agoq_config.ifs[dev];
  struct sockaddr_storage addr = nif->addr;
  socklen_t addr_len = nif->addr_len;
  lc->fd = agoq_tcp_socket(addr.ss_family, "a listen");
  if (lc->fd < 0) {
    res = ncclSystemError;
    goto fail;
  }
  agoq_socket_tune_buffers(lc->fd, dev); /* accepted sockets inherit the buffer sizes */
  /* Listen on the chosen interface's address only, never on all interfaces. */
  AGOQ_SYSCHECK_GOTO(bind(lc->fd, (struct sockaddr*)&addr, addr_len), "bind", res, fail);
  AGOQ_SYSCHECK_GOTO(listen(lc->fd, agoq_config.max_pending), "listen", res, fail);
  AGOQ_SYSCHECK_GOTO(getsockname(lc->fd, (struct sockaddr*)&addr, &addr_len), "getsockname", res, fail);
  agoq_sockaddr_str((struct sockaddr*)&addr, lc->addr, sizeof lc->addr);

  agoq_handle h = {.addr = addr, .addr_len = addr_len, .comm_id = comm_id, .nonce = lc->nonce,
                   .nsocks = (uint16_t)(agoq_tcp_conn_fds(flags) - 1)};
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  agoq_handle_encode(&h, handle);
  AGOQ_INFO(NCCL_NET, "listening on %s (dev %d)", lc->addr, dev);
  *listen_comm = lc;
  return ncclSuccess;
fail:
  if (lc != NULL) {
    if (lc->fd >= 0) close(lc->fd);
    free(lc->pending);
    free(lc);
  }
  return res;
}

static void agoq_group_free(agoq_conn_group* g) {
  for (unsigned i = 0; i <= g->nsocks; i++)
    if (g->fds[i] >= 0) close(g->fds[i]);
  free(g);
}

ncclResult_t agoq_tcp_close_listen(agoq_tp_listen* listen_comm) {
  agoq_tp_listen* lc = listen_comm;
  for (int i = 0; i < lc->npending; i++) close(lc->pending[i].fd);
  while (lc->groups != NULL) {
    agoq_conn_group* g = lc->groups;
    lc->groups = g->next;
    agoq_group_free(g);
  }
  close(lc->fd);
  free(lc->pending);
  free(lc);
  return ncclSuccess;
}

/* ---- connect ----------------------------------------------------------------------- */

typedef struct {
  uint32_t magic;
  int dev;
  uint64_t comm_id;
  agoq_handle target;
  unsigned nsocks;
  int fds[AGOQ_WIRE_MAX_DATA_SOCKS + 1];
  bool connected[AGOQ_WIRE_MAX_DATA_SOCKS + 1];
  uint8_t hello[AGOQ_WIRE_MAX_DATA_SOCKS + 1][AGOQ_HELLO_SIZE];
  size_t sent[AGOQ_WIRE_MAX_DATA_SOCKS + 1];
  uint8_t ack[AGOQ_ACK_SIZE];
  size_t ack_got;
  /* A transient failure (refused, unreachable, reset, dropped before the acknowledgement)
   * closes the sockets and tries again from retry_at_ms, up to connect_retries times. */
  int64_t retries;
  int64_t retry_at_ms; /* 0: sockets open, the attempt under way */
  char peer[64];
} agoq_connect_state;

static agoq_connect_state** agoq_handle_state_slot(void* handle) {
  return (agoq_connect_state**)((uint8_t*)handle + AGOQ_HANDLE_STATE_OFFSET);
}

static void agoq_connect_close_fds(agoq_connect_state* st) {
  for (unsigned i = 0; i <= st->nsocks; i++) {
    if (st->fds[i] >= 0) close(st->fds[i]);
    st->fds[i] = -1;
    st->connected[i] = false;
    st->sent[i] = 0;
  }
  st->ack_got = 0;
}

static void agoq_connect_state_free(agoq_connect_state* st) {
  agoq_connect_close_fds(st);
  st->magic = 0;
  free(st);
}

/* An attempt: nsocks + 1 sockets connecting, each with its hello (a new connection id, so
 * that nothing of an earlier attempt the listener still holds is mistaken for it). */
static ncclResult_t agoq_connect_open(agoq_connect_state* st) {
  const agoq_handle* h = &st->target;
  uint64_t conn_id = agoq_random_u64();
  for (unsigned i = 0; i <= st->nsocks; i++) {
    int fd = agoq_tcp_socket(h->addr.ss_family, st->peer);
    if (fd < 0) return ncclSystemError;
    st->fds[i] = fd;
    agoq_socket_tune_buffers(fd, st->dev); /* before connect, so the window scale is negotiated for it */
    if (connect(fd, (const struct sockaddr*)&h->addr, h->addr_len) != 0 && errno != EINPROGRESS) {
      AGOQ_WARN("connect to %s failed: %s", st->peer, strerror(errno));
      return ncclSystemError;
    }
    agoq_hello hello = {.comm_id = st->comm_id, .nonce = h->nonce, .conn_id = conn_id,
                        .sock_index = (uint8_t)i, .nsocks = (uint8_t)st->nsocks};
    agoq_hello_encode(&hello, st->hello[i]);
  }
  st->retry_at_ms = 0;
  return ncclSuccess;
}

static ncclResult_t agoq_connect_start(uint64_t comm_id, int dev, const void* handle, agoq_connect_state** out) {
  ncclResult_t res = ncclSuccess;
  agoq_connect_state* st = NULL;
  agoq_handle h;
  agoq_wire_status ws = agoq_handle_decode(handle, NCCL_NET_HANDLE_MAXSIZE, &h);
  if (ws != AGOQ_WIRE_OK) {
    AGOQ_WARN("connect: invalid handle (%s); was it produced by agoq's listen?", agoq_wire_status_str(ws));
    return ncclInvalidUsage;
  }
  if (h.comm_id != comm_id) {
    AGOQ_WARN("connect: handle belongs to communicator %016llx, this is %016llx",
              (unsigned long long)h.comm_id, (unsigned long long)comm_id);
    return ncclInvalidUsage;
  }
  AGOQ_CALLOC_GOTO(st, 1, res, fail);
  st->magic = AGOQ_CONNECT_MAGIC;
  st->dev = dev;
  st->comm_id = comm_id;
  st->target = h;
  st->nsocks = h.nsocks;
  for (unsigned i = 0; i <= AGOQ_WIRE_MAX_DATA_SOCKS; i++) st->fds[i] = -1;
  agoq_sockaddr_str((struct sockaddr*)&h.addr, st->peer, sizeof st->peer);
  AGOQ_CHECK_GOTO(agoq_connect_open(st), res, fail);
  *out = st;
  return ncclSuccess;
fail:
  if (st != NULL) agoq_connect_state_free(st);
  return res;
}

/* What a failed attempt means: worth another one (a dropped or reset handshake: a listener
 * sheds its oldest unidentified connections under load; a route or SYN lost for a while), or
 * final (refused: the handle comes from a listen that existed before NCCL handed it over, so
 * nobody listening means the peer exited or closed it; an explicit rejection, a malformed
 * answer, a local failure). */
typedef enum { AGOQ_CONNECT_WAIT, AGOQ_CONNECT_READY, AGOQ_CONNECT_TRANSIENT, AGOQ_CONNECT_FINAL } agoq_connect_status;

static bool agoq_connect_errno_transient(int err) {
  return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == ECONNRESET || err == EPIPE ||
         err == ECONNABORTED;
}

/* One non-blocking step of every socket; why: the failure, for the caller's log line. */
static agoq_connect_status agoq_connect_step(agoq_connect_state* st, char* why, size_t len) {
  bool all_sent = true;
  for (unsigned i = 0; i <= st->nsocks; i++) {
    if (!st->connected[i]) {
      struct pollfd pfd = {.fd = st->fds[i], .events = POLLOUT};
      if (poll(&pfd, 1, 0) <= 0) {
        all_sent = false;
        continue;
      }
      int err = 0;
      socklen_t optlen = sizeof err;
      if (getsockopt(st->fds[i], SOL_SOCKET, SO_ERROR, &err, &optlen) != 0) err = errno;
      if (err != 0) {
        snprintf(why, len, "connect failed: %s", strerror(err));
        return agoq_connect_errno_transient(err) ? AGOQ_CONNECT_TRANSIENT : AGOQ_CONNECT_FINAL;
      }
      st->connected[i] = true;
    }
    while (st->sent[i] < AGOQ_HELLO_SIZE) {
      ssize_t n = send(st->fds[i], st->hello[i] + st->sent[i], AGOQ_HELLO_SIZE - st->sent[i],
                       MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        st->sent[i] += (size_t)n;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        break;
      } else {
        int err = n < 0 ? errno : ECONNRESET;
        snprintf(why, len, "handshake failed: %s", n < 0 ? strerror(err) : "connection closed");
        return agoq_connect_errno_transient(err) ? AGOQ_CONNECT_TRANSIENT : AGOQ_CONNECT_FINAL;
      }
    }
    all_sent &= st->sent[i] == AGOQ_HELLO_SIZE;
  }
  if (!all_sent) return AGOQ_CONNECT_WAIT;
  while (st->ack_got < AGOQ_ACK_SIZE) {
    ssize_t n = recv(st->fds[0], st->ack + st->ack_got, AGOQ_ACK_SIZE - st->ack_got, MSG_DONTWAIT);
    if (n > 0) {
      st->ack_got += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return AGOQ_CONNECT_WAIT;
    } else if (st->ack_got == 0 && (n == 0 || agoq_connect_errno_transient(errno))) {
      /* Closed with no answer at all: a listener under load drops its oldest unidentified
       * connections (AGOQ_MAX_PENDING_CONNECTIONS), and one that rejects us says so first. */
      snprintf(why, len, "the peer closed the connection during the handshake without an answer (%s)",
               n == 0 ? "end of stream" : strerror(errno));
      return AGOQ_CONNECT_TRANSIENT;
    } else {
      snprintf(why, len, "the peer closed the connection during the handshake after %zu bytes of its answer",
               st->ack_got);
      return AGOQ_CONNECT_FINAL;
    }
  }
  agoq_ack_status status;
  agoq_wire_status ws = agoq_ack_decode(st->ack, AGOQ_ACK_SIZE, &status);
  if (ws != AGOQ_WIRE_OK || status != AGOQ_ACK_ACCEPTED) {
    snprintf(why, len, "the peer rejected the connection (%s: wrong communicator, stale handle, or not an agoq "
             "listener)", ws != AGOQ_WIRE_OK ? agoq_wire_status_str(ws) : "handshake refused");
    return AGOQ_CONNECT_FINAL;
  }
  return AGOQ_CONNECT_READY;
}

ncclResult_t agoq_tcp_connect(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_conn** send_comm) {
  (void)flags; /* the number of data sockets comes with the handle (the listen's flags) */
  ncclResult_t res = ncclSuccess;
  *send_comm = NULL;
  /* NCCL calls again with the same handle buffer until we return a comm: our progress
   * lives behind a pointer in the part of the handle the listener left zero. */
  agoq_connect_state** slot = agoq_handle_state_slot(handle);
  agoq_connect_state* st = *slot;
  if (st != NULL && st->magic != AGOQ_CONNECT_MAGIC) {
    AGOQ_WARN("connect: corrupted handle state");
    return ncclInternalError;
  }
  if (st == NULL) {
    AGOQ_CHECK_GOTO(agoq_connect_start(comm_id, dev, handle, &st), res, out);
    *slot = st;
  }
  if (st->retry_at_ms > 0) {
    if (agoq_now_ms() < st->retry_at_ms) return ncclSuccess; /* waiting to try again */
    AGOQ_CHECK_GOTO(agoq_connect_open(st), res, fail);
  }
  char why[192] = "";
  agoq_connect_status cs = agoq_connect_step(st, why, sizeof why);
  if (cs == AGOQ_CONNECT_WAIT) return ncclSuccess;
  if (cs == AGOQ_CONNECT_TRANSIENT && st->retries < agoq_config.connect_retries) {
    /* As NCCL's own sockets do: attempt k waits k x NCCL_SOCKET_RETRY_SLEEP_MSEC first. */
    st->retries++;
    int64_t wait_ms = st->retries * agoq_config.connect_retry_ms;
    AGOQ_INFO(NCCL_NET | NCCL_INIT, "connect to %s: %s; trying again (%lld of NCCL_SOCKET_RETRY_CNT=%lld) in %lld ms",
              st->peer, why, (long long)st->retries, (long long)agoq_config.connect_retries, (long long)wait_ms);
    agoq_connect_close_fds(st);
    st->retry_at_ms = agoq_now_ms() + (wait_ms > 0 ? wait_ms : 1);
    return ncclSuccess;
  }
  if (cs == AGOQ_CONNECT_TRANSIENT) {
    AGOQ_WARN("connect to %s: %s, after %lld attempts (NCCL_SOCKET_RETRY_CNT=%lld): is the peer alive and its "
              "listen reachable?", st->peer, why, (long long)st->retries + 1, (long long)agoq_config.connect_retries);
    res = ncclRemoteError;
    goto fail;
  }
  if (cs == AGOQ_CONNECT_FINAL) {
    AGOQ_WARN("connect to %s: %s", st->peer, why);
    res = ncclRemoteError;
    goto fail;
  }
  agoq_tp_conn* comm;
  *slot = NULL;
  res = agoq_tcp_conn_create(true, dev, st->fds[0], st->fds + 1, st->nsocks, st->peer, &comm);
  /* The fds now belong to the comm (or were closed by a failed create). */
  for (unsigned i = 0; i <= st->nsocks; i++) st->fds[i] = -1;
  agoq_connect_state_free(st);
  if (res != ncclSuccess) goto out;
  AGOQ_INFO(NCCL_NET, "connected to %s with %u data sockets (dev %d)", comm->peer, comm->nsocks, dev);
  *send_comm = comm;
  return ncclSuccess;
fail:
  *slot = NULL;
  agoq_connect_state_free(st);
out:
  return res;
}

void agoq_tcp_connect_abort(void* handle) {
  if (handle == NULL) return;
  agoq_connect_state** slot = agoq_handle_state_slot(handle);
  agoq_connect_state* st = *slot;
  *slot = NULL;
  if (st != NULL && st->magic == AGOQ_CONNECT_MAGIC) agoq_connect_state_free(st);
}

/* ---- accept ------------------------------------------------------------------------ */

static void agoq_pending_drop(agoq_tp_listen* lc, int index, bool close_fd) {
  if (close_fd) close(lc->pending[index].fd);
  lc->pending[index] = lc->pending[--lc->npending];
}

static void agoq_listen_take_new(agoq_tp_listen* lc) {
  for (int burst = 0; burst < AGOQ_ACCEPT_BURST; burst++) {
    struct sockaddr_storage peer;
    socklen_t peer_len = sizeof peer;
    int fd = accept4(lc->fd, (struct sockaddr*)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && errno == EMFILE && agoq_fd_raise_after_emfile())
      fd = accept4(lc->fd, (struct sockaddr*)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EMFILE || err == ENFILE) {
        /* The peer waits in the backlog for its handshake: say why, once per listen. */
        char hint[256];
        if (!lc->said_emfile)
          AGOQ_WARN("accept on %s: %s%s", lc->addr, strerror(err), agoq_fd_exhausted_hint(hint, sizeof hint));
        lc->said_emfile = true;
      } else if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && err != ECONNABORTED) {
        AGOQ_INFO(NCCL_NET, "accept on %s: %s", lc->addr, strerror(err));
      }
      return;
    }
    if (lc->npending == agoq_config.max_pending) {
      /* A flood must not lock real peers out: the oldest unidentified connection goes. */
      int oldest = 0;
      for (int i = 1; i < lc->npending; i++)
        if (lc->pending[i].deadline_ms < lc->pending[oldest].deadline_ms) oldest = i;
      AGOQ_INFO(NCCL_NET, "listen %s: %d connections without handshake, dropping the oldest (%s)", lc->addr,
                lc->npending, lc->pending[oldest].peer);
      agoq_pending_drop(lc, oldest, true);
    }
    agoq_pending_sock* p = &lc->pending[lc->npending++];
    memset(p, 0, sizeof *p);
    p->fd = fd;
    p->deadline_ms = agoq_now_ms() + agoq_config.handshake_timeout_ms;
    agoq_sockaddr_str((struct sockaddr*)&peer, p->peer, sizeof p->peer);
  }
}

static void agoq_send_reject(int fd) {
  uint8_t ack[AGOQ_ACK_SIZE];
  agoq_ack_encode(AGOQ_ACK_REJECTED, ack);
  ssize_t ignored = send(fd, ack, sizeof ack, MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)ignored;
}

/* Places a validated socket into its connection group; false if it contradicts the group. */
static bool agoq_group_add(agoq_tp_listen* lc, const agoq_hello* h, int fd, const char* peer) {
  agoq_conn_group* g = lc->groups;
  while (g != NULL && g->conn_id != h->conn_id) g = g->next;
  if (g == NULL) {
    if (lc->ngroups >= agoq_config.max_pending) return false;
    g = calloc(1, sizeof *g);
    if (g == NULL) return false;
    g->conn_id = h->conn_id;
    g->nsocks = h->nsocks;
    for (unsigned i = 0; i <= AGOQ_WIRE_MAX_DATA_SOCKS; i++) g->fds[i] = -1;
    g->deadline_ms = agoq_now_ms() + agoq_config.handshake_timeout_ms;
    snprintf(g->peer, sizeof g->peer, "%s", peer);
    g->next = lc->groups;
    lc->groups = g;
    lc->ngroups++;
  }
  if (g->nsocks != h->nsocks || g->fds[h->sock_index] >= 0) return false;
  g->fds[h->sock_index] = fd;
  g->have++;
  return true;
}

/* Reads handshakes of pending sockets; moves valid ones into groups, drops the rest. */
static void agoq_listen_read_hellos(agoq_tp_listen* lc) {
  int64_t now = agoq_now_ms();
  for (int i = 0; i < lc->npending;) {
    agoq_pending_sock* p = &lc->pending[i];
    ssize_t n = recv(p->fd, p->hello + p->got, AGOQ_HELLO_SIZE - p->got, MSG_DONTWAIT);
    if (n > 0) p->got += (size_t)n;
    const char* reject = NULL;
    if (n == 0) {
      reject = "closed before completing the handshake";
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      reject = strerror(errno);
    } else if (p->got > 0 && agoq_hello_check_prefix(p->hello, p->got) != AGOQ_WIRE_OK) {
      reject = agoq_wire_status_str(agoq_hello_check_prefix(p->hello, p->got));
    } else if (p->got < AGOQ_HELLO_SIZE) {
      if (now < p->deadline_ms) {
        i++;
        continue;
      }
      reject = "handshake timed out";
    }
    agoq_hello h;
    if (reject == NULL) {
      agoq_wire_status ws = agoq_hello_decode(p->hello, AGOQ_HELLO_SIZE, &h);
      if (ws != AGOQ_WIRE_OK) reject = agoq_wire_status_str(ws);
      else if (h.comm_id != lc->comm_id) reject = "wrong communicator id";
      else if (h.nonce != lc->nonce) reject = "stale or foreign listen handle (nonce mismatch)";
      else if (!agoq_group_add(lc, &h, p->fd, p->peer)) reject = "inconsistent connection sockets";
      if (reject != NULL && ws == AGOQ_WIRE_OK && h.sock_index == 0) agoq_send_reject(p->fd);
    }
    if (reject != NULL) AGOQ_WARN("listen %s: rejected connection from %s: %s", lc->addr, p->peer, reject);
    agoq_pending_drop(lc, i, reject != NULL); /* the fd moved into a group, or is closed */
  }
}

/* Returns a complete group (unlinked) or NULL; expires stale incomplete ones. */
static agoq_conn_group* agoq_listen_take_group(agoq_tp_listen* lc) {
  int64_t now = agoq_now_ms();
  for (agoq_conn_group** pp = &lc->groups; *pp != NULL;) {
    agoq_conn_group* g = *pp;
    bool complete = g->have == g->nsocks + 1;
    if (complete || now >= g->deadline_ms) {
      *pp = g->next;
      lc->ngroups--;
      if (complete) return g;
      AGOQ_WARN("listen %s: connection from %s sent %u of %u sockets before timing out", lc->addr, g->peer,
                g->have, g->nsocks + 1);
      agoq_group_free(g);
      continue;
    }
    pp = &g->next;
  }
  return NULL;
}

ncclResult_t agoq_tcp_accept(agoq_tp_listen* listen_comm, agoq_tp_conn** recv_comm) {
  ncclResult_t res = ncclSuccess;
  agoq_tp_listen* lc = listen_comm;
  *recv_comm = NULL;
  agoq_listen_take_new(lc);
  agoq_listen_read_hellos(lc);
  agoq_conn_group* g = agoq_listen_take_group(lc);
  if (g == NULL) return ncclSuccess;

  uint8_t ack[AGOQ_ACK_SIZE];
  agoq_ack_encode(AGOQ_ACK_ACCEPTED, ack);
  /* 8 bytes into a fresh socket's empty send buffer cannot be short. */
  if (send(g->fds[0], ack, sizeof ack, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof ack) {
    AGOQ_WARN("listen %s: peer %s vanished during the handshake", lc->addr, g->peer);
    agoq_group_free(g);
    return ncclSuccess; /* the listener keeps serving; the peer's connect reports the failure */
  }
  agoq_tp_conn* comm;
  res = agoq_tcp_conn_create(false, lc->dev, g->fds[0], g->fds + 1, g->nsocks, g->peer, &comm);
  free(g); /* the fds belong to the comm now (or were closed by the failed create) */
  if (res != ncclSuccess) goto out;
  lc->accepted++;
  AGOQ_INFO(NCCL_NET, "accepted connection from %s with %u data sockets on %s", comm->peer, comm->nsocks, lc->addr);
  *recv_comm = comm;
out:
  return res;
}
