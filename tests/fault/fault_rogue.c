/*
 * flood: N rogue TCP connections at once on a listen port (a quarter each: garbage bytes,
 * half a hello then silence, a complete hello with a wrong communicator id, silence), then
 * a real peer connects and sends 1 MiB. The listener must serve the real peer (bytes
 * verified) within FAULT_FLOOD_SERVE_LIMIT_MS, never hand out a comm for a rogue, and drop
 * every rogue by the handshake timeout (the test runs with AGOQ_HANDSHAKE_TIMEOUT_MS=3000).
 * The time to serve the real peer is measured with and without the flood.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/agoq_params.h"
#include "fault.h"
#include "net/agoq_net.h"
#include "transport/tcp/agoq_tcp_wire.h"

#define FL_MSG ((1u << 20) + 3u)
#define FAULT_FLOOD_SERVE_LIMIT_MS 5000

typedef struct {
  uint8_t handle[FAULT_HANDLE_SIZE];
} fl_arg;

static uint8_t fl_byte(size_t i) { return (uint8_t)(i * 2654435761u >> 13); }

static int fl_listener(int fd, void* varg) {
  (void)varg;
  void *ctx = NULL, *lc = NULL, *comm = NULL;
  uint8_t handle[FAULT_HANDLE_SIZE] = {0};
  if (fault_net_init(&ctx, NULL) != 0) return fault_report_fail(fd, "init failed");
  if (agoq_net_listen(ctx, 0, handle, &lc) != ncclSuccess) return fault_report_fail(fd, "listen failed");
  fault_send(fd, FAULT_MSG_HANDLE, handle, sizeof handle);
  uint8_t* buf = malloc(FL_MSG);
  if (buf == NULL) return fault_report_fail(fd, "out of memory");
  for (int round = 0; round < 2; round++) {
    int rc = fault_accept(lc, &comm, 30000, -1);
    if (rc != 0) return fault_report_fail(fd, "accept of the real peer failed (%d)", rc);
    memset(buf, 0, FL_MSG);
    void* req = NULL;
    void* data[1] = {buf};
    size_t sizes[1] = {FL_MSG};
    int tags[1] = {1};
    while (req == NULL)
      if (agoq_net_irecv(comm, 1, data, sizes, tags, NULL, NULL, &req) != ncclSuccess)
        return fault_report_fail(fd, "irecv failed");
    int done = 0, size = 0;
    int64_t end = fault_now_ms() + 30000;
    while (!done) {
      /* Keep the listener's handshakes moving while we wait, as NCCL's accept calls would. */
      void* extra = NULL;
      if (agoq_net_accept(lc, &extra) != ncclSuccess || extra != NULL)
        return fault_report_fail(fd, "accept returned an error or a second comm during the flood");
      if (agoq_net_test(req, &done, &size) != ncclSuccess) return fault_report_fail(fd, "receive failed");
      if (fault_now_ms() > end) return fault_report_fail(fd, "receive never completed");
    }
    for (size_t i = 0; i < FL_MSG; i++)
      if (buf[i] != fl_byte(i) || size != (int)FL_MSG) return fault_report_fail(fd, "wrong data at byte %zu", i);
    fault_event_send(fd, FAULT_MSG_DONE, round, 0);
    agoq_net_close_recv(comm);
    comm = NULL;
  }
  /* Keep serving the listen port (dropping rogues) until STOP; nothing may get in. */
  while (!fault_stop_requested(fd)) {
    void* extra = NULL;
    if (agoq_net_accept(lc, &extra) != ncclSuccess || extra != NULL)
      return fault_report_fail(fd, "a rogue connection became a comm");
    usleep(1000);
  }
  free(buf);
  agoq_net_close_listen(lc);
  agoq_net_finalize(ctx);
  return 0;
}

static int fl_sender(int fd, void* varg) {
  fl_arg* a = varg;
  void *ctx = NULL, *comm = NULL;
  if (fault_net_init(&ctx, NULL) != 0) return fault_report_fail(fd, "init failed");
  if (fault_connect(ctx, a->handle, &comm, 30000) != 0) return fault_report_fail(fd, "connect failed");
  uint8_t* buf = malloc(FL_MSG);
  if (buf == NULL) return fault_report_fail(fd, "out of memory");
  for (size_t i = 0; i < FL_MSG; i++) buf[i] = fl_byte(i);
  void* req = NULL;
  while (req == NULL)
    if (agoq_net_isend(comm, buf, FL_MSG, 1, NULL, NULL, &req) != ncclSuccess) return fault_report_fail(fd, "isend");
  int done = 0, size = 0;
  while (!done)
    if (agoq_net_test(req, &done, &size) != ncclSuccess) return fault_report_fail(fd, "send failed");
  uint32_t kind;
  char sink[16];
  fault_recv(fd, &kind, sink, sizeof sink, 30000);
  agoq_net_close_send(comm);
  agoq_net_finalize(ctx);
  free(buf);
  return 0;
}

/* Spawns a real sender and returns the ms until the listener verified its message. */
static int64_t fl_serve(fault_child* l, fl_arg* a) {
  fault_child s;
  int64_t t0 = fault_now_ms();
  if (fault_spawn(&s, fl_sender, a) != 0) return -1;
  fault_event e;
  int n = fault_recv_kind(l->fd, FAULT_MSG_DONE, &e, sizeof e, 30000);
  fault_send(s.fd, FAULT_MSG_STOP, NULL, 0);
  fault_reap(&s, 10000);
  return n == (int)sizeof e ? e.t_ms - t0 : -1;
}

int fault_sc_flood(int nrogue) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)nrogue + 256) {
    rl.rlim_cur = rl.rlim_max < (rlim_t)nrogue + 256 ? rl.rlim_max : (rlim_t)nrogue + 256;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  /* The plugin's own parameter code (one parser of AGOQ_*) says what timeout it runs with. */
  agoq_params_reset();
  if (agoq_params_load() != ncclSuccess) return 1;
  int hs_ms = (int)agoq_param_int(AGOQ_PARAM_HANDSHAKE_TIMEOUT_MS);
  fl_arg a;
  fault_child l;
  int fail = 0;
  if (fault_spawn(&l, fl_listener, NULL) != 0) return 1;
  if (fault_recv_kind(l.fd, FAULT_MSG_HANDLE, a.handle, sizeof a.handle, 20000) != FAULT_HANDLE_SIZE) return 1;
  agoq_handle h;
  if (agoq_handle_decode(a.handle, sizeof a.handle, &h) != AGOQ_WIRE_OK) return 1;

  /* docs/security.md: the listener binds the chosen interface's address only. With
   * AGOQ_SOCKET_IFNAME=lo that is 127.0.0.1: the same port on 127.0.0.2 (also loopback,
   * but not the bound address) must refuse the connection. */
  bool bound_only = true;
  if (h.addr.ss_family == AF_INET) {
    struct sockaddr_in other = *(struct sockaddr_in*)&h.addr;
    bound_only = ntohl(other.sin_addr.s_addr) == 0x7f000001u;
    other.sin_addr.s_addr = htonl(0x7f000002u);
    int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t >= 0 && connect(t, (struct sockaddr*)&other, sizeof other) == 0) bound_only = false;
    if (t >= 0) close(t);
    printf("fault: flood: listen address %s bound to the interface address only\n", bound_only ? "is" : "is NOT");
    if (!bound_only) fail = 1;
  }
  int64_t base_ms = fl_serve(&l, &a);

  int* fds = calloc((size_t)nrogue, sizeof *fds);
  int64_t* closed_at = calloc((size_t)nrogue, sizeof *closed_at);
  if (fds == NULL || closed_at == NULL) return 1;
  int64_t t_open = fault_now_ms();
  int opened = 0;
  for (int i = 0; i < nrogue; i++) {
    fds[i] = socket(h.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    closed_at[i] = -1;
    if (fds[i] < 0) continue;
    if (connect(fds[i], (const struct sockaddr*)&h.addr, h.addr_len) != 0 && errno != EINPROGRESS) {
      close(fds[i]);
      fds[i] = -1;
      continue;
    }
    opened++;
  }
  /* Send each rogue's bytes once its connect completed. */
  int sent = 0;
  bool* done = calloc((size_t)nrogue, 1);
  int64_t end = fault_now_ms() + 10000;
  while (sent < opened && fault_now_ms() < end) {
    for (int i = 0; i < nrogue; i++) {
      if (fds[i] < 0 || done[i]) continue;
      struct pollfd p = {.fd = fds[i], .events = POLLOUT};
      if (poll(&p, 1, 0) <= 0) continue;
      uint8_t bytes[256];
      size_t len = 0;
      agoq_hello hello = {.comm_id = h.comm_id, .nonce = h.nonce, .conn_id = 0x5000u + (uint64_t)i, .sock_index = 0,
                          .nsocks = (uint8_t)h.nsocks};
      switch (i % 4) {
        case 0:
          for (size_t k = 0; k < sizeof bytes; k++) bytes[k] = (uint8_t)(k * 131u + (unsigned)i);
          len = sizeof bytes;
          break;
        case 1:
          agoq_hello_encode(&hello, bytes);
          len = AGOQ_HELLO_SIZE / 2;
          break;
        case 2:
          hello.comm_id ^= 0xdeadull;
          agoq_hello_encode(&hello, bytes);
          len = AGOQ_HELLO_SIZE;
          break;
        default: break;
      }
      if (len > 0) {
        ssize_t w = send(fds[i], bytes, len, MSG_NOSIGNAL);
        (void)w;
      }
      done[i] = true;
      sent++;
    }
  }
  int64_t flood_ms = fl_serve(&l, &a);
  /* Every rogue must be dropped by the handshake timeout (plus slack for 2 cores). */
  int nclosed = 0;
  end = t_open + hs_ms + 8000;
  while (nclosed < opened && fault_now_ms() < end) {
    for (int i = 0; i < nrogue; i++) {
      if (fds[i] < 0 || closed_at[i] >= 0) continue;
      struct pollfd p = {.fd = fds[i], .events = POLLIN};
      if (poll(&p, 1, 0) <= 0) continue;
      char b[512];
      ssize_t r = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        closed_at[i] = fault_now_ms() - t_open;
        nclosed++;
      }
    }
    fault_sleep_ms(20);
  }
  int64_t last = 0;
  for (int i = 0; i < nrogue; i++)
    if (closed_at[i] > last) last = closed_at[i];
  printf("fault: flood: %d rogue connections opened (%d got their bytes); real peer served in %lld ms under the "
         "flood (%lld ms without); %d/%d rogues dropped, the last after %lld ms (handshake timeout %d ms)\n",
         opened, sent, (long long)flood_ms, (long long)base_ms, nclosed, opened, (long long)last, hs_ms);
  if (opened != nrogue || base_ms < 0 || flood_ms < 0 || flood_ms > FAULT_FLOOD_SERVE_LIMIT_MS || nclosed != opened)
    fail = 1;
  fault_send(l.fd, FAULT_MSG_STOP, NULL, 0);
  uint32_t kind;
  char msg[256];
  int n = fault_recv(l.fd, &kind, msg, sizeof msg - 1, 2000);
  if (n >= 0 && kind == FAULT_MSG_FAIL) {
    printf("fault: flood: listener: %.*s\n", n, msg);
    fail = 1;
  }
  if (fault_reap(&l, 20000) != 0 || !WIFEXITED(l.status) || WEXITSTATUS(l.status) != 0) fail = 1;
  for (int i = 0; i < nrogue; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  free(closed_at);
  free(done);
  printf("fault: flood: cases=1 rogue=%d failures=%d hangs=0\n", nrogue, fail);
  return fail;
}
