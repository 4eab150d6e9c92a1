/*
 * bitflip: a TCP proxy between a sender and a receiver flips one bit of the byte stream at
 * a random offset of a random socket, after the connection's hello. --path pieces (the
 * default, AGOQ_SOCKET_INLINE=0) puts every payload on the data sockets: the flip hits a
 * data socket, or 1 case in 4 the control socket's message headers. --path inline
 * (AGOQ_SOCKET_INLINE=1G) puts every payload behind its header on the control socket: the
 * flip hits the control socket, anywhere in its headers and frames, and every case must
 * flip. The sender's payloads are typed p2p bf16 transfers (a fake profiler callback
 * answers as agoq's profiler would, as in tests/unit/test_typed.c), so every data byte
 * belongs to a codec frame with header and payload CRCs. The receiver checks each message
 * against the frame it computes itself from the same input: every message must be either
 * bit-identical to that reference or fail with an error. Wrong data fails the test, and so
 * does a payload on the other path than the one asked for (the proxy counts what it
 * forwarded on each socket): a flip meant for one path must not silently land elsewhere.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agoq_frame.h"
#if defined(AGOQ_FAULT_DEVICE)
#include <cuda_runtime_api.h>

#include "collnet/agoq_coll_internal.h"
#endif
#include "collnet/agoq_coll_wire.h"
#include "collnet/agoq_collnet.h"
#include "core/agoq_log.h"
#include "fault.h"
#include "net/agoq_net.h"
#include "transport/tcp/agoq_tcp_wire.h"
#include "profiler/agoq_oracle.h"

#define BF_MSGS 8
#define BF_ELEMS (512u * 1024u) /* bf16: 1 MiB per message */
#define BF_BYTES (BF_ELEMS * 2u)

typedef struct {
  uint8_t handle[FAULT_HANDLE_SIZE];
  uint64_t seed;
} bf_arg;

static void bf_input(uint16_t* x, uint64_t seed, int k) {
  uint64_t st = fault_mix(seed * 31u + (uint64_t)k);
  for (size_t i = 0; i < BF_ELEMS; i++) {
    uint64_t r = fault_rand(&st);
    /* bf16 of moderate magnitude: sign, exponent 120..134, random mantissa. */
    x[i] = (uint16_t)(((r >> 8) & 0x8000u) | ((120u + (unsigned)(r % 15)) << 7) | ((r >> 20) & 0x7fu));
  }
}

static ncclResult_t bf_prof(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  static int marker;
  (void)pHandle;
  (void)pluginId;
  if (type == AGOQ_PROF_NET_EVENT_START) {
    agoq_xfer_desc* d = extData;
    d->kind = AGOQ_XFER_P2P;
    d->dtype = ncclBfloat16;
    d->proto = AGOQ_XFER_PROTO_SIMPLE;
    d->is_send = 1;
    d->peer = 1;
    d->task_bytes = 1u << 30;
    d->two_way = 1; /* a pipeline flow: quantized under the default AGOQ_P2P_SCOPE */
    d->magic = AGOQ_XFER_DESC_MAGIC;
    d->filled = 1;
    *eHandle = &marker;
  }
  return ncclSuccess;
}

static int bf_sender(int fd, void* varg) {
  bf_arg* a = varg;
  void *ctx = NULL, *comm = NULL;
  if (fault_net_init(&ctx, bf_prof) != 0) return fault_report_fail(fd, "init failed");
  if (fault_connect(ctx, a->handle, &comm, 20000) != 0) return fault_report_fail(fd, "connect failed");
  uint16_t* in = malloc((size_t)BF_MSGS * BF_BYTES);
  if (in == NULL) return fault_report_fail(fd, "out of memory");
  void* reqs[BF_MSGS] = {0};
  static int step; /* any non-NULL phandle: the fake profiler answers for all */
  for (int k = 0; k < BF_MSGS; k++) {
    bf_input(in + (size_t)k * BF_ELEMS, a->seed, k);
    while (reqs[k] == NULL)
      if (agoq_net_isend(comm, in + (size_t)k * BF_ELEMS, BF_BYTES, 1, NULL, &step, &reqs[k]) != ncclSuccess) goto out;
  }
  for (int k = 0; k < BF_MSGS; k++) {
    int done = 0, size = 0;
    while (!done)
      if (agoq_net_test(reqs[k], &done, &size) != ncclSuccess) goto out;
  }
out:;
  uint32_t kind;
  char sink[16];
  fault_recv(fd, &kind, sink, sizeof sink, 30000);
  agoq_net_close_send(comm);
  agoq_net_finalize(ctx);
  free(in);
  return 0;
}

/* DONE: value = messages verified; ERROR: value = index of the message that failed. */
static int bf_receiver(int fd, void* varg) {
  bf_arg* a = varg;
  void *ctx = NULL, *lc = NULL, *comm = NULL;
  uint8_t handle[FAULT_HANDLE_SIZE] = {0};
  if (fault_net_init(&ctx, NULL) != 0) return fault_report_fail(fd, "init failed");
  if (agoq_net_listen(ctx, 0, handle, &lc) != ncclSuccess) return fault_report_fail(fd, "listen failed");
  fault_send(fd, FAULT_MSG_HANDLE, handle, sizeof handle);
  if (fault_accept(lc, &comm, 20000, -1) != 0) return fault_report_fail(fd, "accept failed");
  uint16_t* in = malloc(BF_BYTES);
  uint16_t* ref = malloc(BF_BYTES);
  uint16_t* out = malloc((size_t)BF_MSGS * BF_BYTES);
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 128};
  size_t cap = agoq_frame_size_max(&p, BF_ELEMS);
  uint8_t* frame = malloc(cap);
  if (in == NULL || ref == NULL || out == NULL || frame == NULL) return fault_report_fail(fd, "out of memory");
  memset(out, 0xee, (size_t)BF_MSGS * BF_BYTES);
  void* reqs[BF_MSGS] = {0};
  /* A flip early on the control socket can fail the connection while the receives are
   * still being posted: irecv then reports the connection's error, which is a detection
   * like a failed test(). The receives posted before it are still checked. */
  int posted = 0;
  ncclResult_t post_err = ncclSuccess;
  for (int k = 0; k < BF_MSGS && post_err == ncclSuccess; k++) {
    void* data[1] = {out + (size_t)k * BF_ELEMS};
    size_t sizes[1] = {BF_BYTES};
    int tags[1] = {1};
    while (reqs[k] == NULL && post_err == ncclSuccess)
      post_err = agoq_net_irecv(comm, 1, data, sizes, tags, NULL, NULL, &reqs[k]);
    if (post_err == ncclSuccess) posted++;
  }
  int verified = 0;
  for (int k = 0; k < posted; k++) {
    int done = 0, size = 0;
    int64_t end = fault_now_ms() + 20000;
    ncclResult_t r = ncclSuccess;
    while (!done && (r = agoq_net_test(reqs[k], &done, &size)) == ncclSuccess)
      if (fault_now_ms() > end) return fault_report_fail(fd, "message %d neither completed nor failed in 20 s", k);
    if (r != ncclSuccess) {
      fault_event_send(fd, FAULT_MSG_ERROR, k, r);
      goto out;
    }
    size_t len = 0;
    bf_input(in, a->seed, k);
    if (agoq_frame_encode(&p, in, BF_ELEMS, true, frame, cap, &len) != AGOQ_CODEC_OK ||
        agoq_frame_decode(frame, len, AGOQ_DTYPE_BF16, ref, BF_ELEMS) != AGOQ_CODEC_OK)
      return fault_report_fail(fd, "reference encode failed");
    if (size != (int)BF_BYTES || memcmp(ref, out + (size_t)k * BF_ELEMS, BF_BYTES) != 0)
      return fault_report_fail(fd, "WRONG DATA: message %d completed (%d B) but differs from its frame's decode", k,
                               size);
    if (memcmp(in, out + (size_t)k * BF_ELEMS, BF_BYTES) == 0)
      return fault_report_fail(fd, "message %d arrived raw: the typed path did not send a frame", k);
    verified++;
  }
  if (post_err != ncclSuccess) {
    fault_event_send(fd, FAULT_MSG_ERROR, posted, post_err);
    goto out;
  }
  fault_event_send(fd, FAULT_MSG_DONE, 0, verified);
out:;
  uint32_t kind;
  char sink[16];
  fault_recv(fd, &kind, sink, sizeof sink, 30000);
  agoq_net_close_recv(comm);
  agoq_net_close_listen(lc);
  agoq_net_finalize(ctx);
  free(in);
  free(ref);
  free(out);
  free(frame);
  return 0;
}

/* ---- the proxy ------------------------------------------------------------------------ */

typedef struct {
  int lfd; /* listening socket */
  struct sockaddr_storage to;
  socklen_t to_len;
  uint64_t seed;
  fault_path path;    /* inline: the flip always targets the control socket */
  uint64_t ctrl_span; /* bytes of a control stream (after its hello) the flip offset is drawn from */
  /* pieces: bytes per data socket the flip offset is drawn from, given the connection's
   * data sockets (from its hello): a lower bound of what each one carries. */
  uint64_t (*data_span)(unsigned nsocks);
  bool no_flip; /* forward only */
} bf_proxy_arg;

/* What a proxy forwarded from connectors to the acceptor after the hellos, reported when it
 * is stopped (bf_proxy_stop): the path check of every case. */
typedef struct {
  bool flipped;
  fault_event flip; /* phase: socket index, value: offset */
  bool counted;     /* the counts below arrived */
  int64_t ctrl_max; /* longest control stream of one connection */
  int64_t data;     /* data-socket bytes, all connections */
} bf_proxy_report;

#define BF_MAX_CONN 80

typedef struct {
  int c, s;           /* client side, server side */
  uint8_t hello[AGOQ_HELLO_SIZE];
  size_t hello_got;
  uint64_t after;     /* client->server bytes after the hello */
  int index, nsocks;  /* from the hello */
} bf_conn;

/* PHASE event when the bit is flipped: phase = socket index, value = offset. On STOP: DONE
 * with phase 0, value = the longest control stream, then DONE with phase 1, value = the
 * data-socket bytes (connector to acceptor, after the hellos). */
static int bf_proxy(int fd, void* varg) {
  bf_proxy_arg* a = varg;
  bf_conn conns[BF_MAX_CONN];
  int nconn = 0;
  uint64_t st = fault_mix(a->seed ^ 0xb1f11bull);
  int target = -1;
  uint64_t flip_at = 0;
  bool flipped = false;
  uint64_t ctrl_max = 0, data_bytes = 0;
  static uint8_t buf[1 << 16];
  for (;;) {
    struct pollfd p[2 + 2 * BF_MAX_CONN];
    int np = 0;
    p[np++] = (struct pollfd){.fd = fd, .events = POLLIN};
    p[np++] = (struct pollfd){.fd = a->lfd, .events = POLLIN};
    for (int i = 0; i < nconn; i++) {
      p[np++] = (struct pollfd){.fd = conns[i].c, .events = POLLIN};
      p[np++] = (struct pollfd){.fd = conns[i].s, .events = POLLIN};
    }
    if (poll(p, (nfds_t)np, 1000) < 0 && errno != EINTR) return 1;
    if (p[0].revents) break; /* STOP or the orchestrator is gone */
    if ((p[1].revents & POLLIN) && nconn < BF_MAX_CONN) {
      int c = accept(a->lfd, NULL, NULL);
      if (c >= 0) {
        int s = socket(a->to.ss_family, SOCK_STREAM, 0);
        if (s < 0 || connect(s, (struct sockaddr*)&a->to, a->to_len) != 0) {
          close(c);
          if (s >= 0) close(s);
        } else {
          conns[nconn++] = (bf_conn){.c = c, .s = s, .index = -1};
        }
      }
    }
    for (int i = 0; i < nconn; i++) {
      bf_conn* k = &conns[i];
      struct pollfd* pc = &p[2 + 2 * i];
      for (int dir = 0; dir < 2 && k->c >= 0; dir++) {
        if (!(pc[dir].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        int from = dir == 0 ? k->c : k->s, to = dir == 0 ? k->s : k->c;
        ssize_t n = recv(from, buf, sizeof buf, 0);
        if (n <= 0) {
          close(k->c);
          close(k->s);
          k->c = k->s = -1;
          break;
        }
        if (dir == 0) {
          size_t off = 0;
          while (k->hello_got < AGOQ_HELLO_SIZE && off < (size_t)n) k->hello[k->hello_got++] = buf[off++];
          if (k->index < 0 && k->hello_got == AGOQ_HELLO_SIZE) {
            k->index = k->hello[6];
            k->nsocks = k->hello[7];
            if (target < 0 && !a->no_flip) {
              /* pieces: the control socket in 1 case of 4 (within its message headers), else
               * a data socket within its share of the 8 frames. inline: the data sockets carry
               * nothing; the control socket, anywhere in its headers and frames. The inline
               * test comes first: pieces draws the same numbers as before --path existed. */
              bool ctrl = a->path == FAULT_PATH_INLINE || fault_rand(&st) % 4 == 0;
              target = ctrl ? 0 : 1 + (int)(fault_rand(&st) % (uint64_t)k->nsocks);
              uint64_t span = ctrl ? a->ctrl_span : a->data_span((unsigned)k->nsocks);
              flip_at = fault_rand(&st) % (span > 0 ? span : 1);
            }
          }
          if (!flipped && k->index == target && k->index >= 0) {
            uint64_t first = k->after, last = k->after + (uint64_t)(n - (ssize_t)off);
            if (flip_at >= first && flip_at < last) {
              buf[off + (flip_at - first)] ^= (uint8_t)(1u << (fault_rand(&st) % 8));
              flipped = true;
              fault_event_send(fd, FAULT_MSG_PHASE, target, (int64_t)flip_at);
            }
          }
          if (k->index >= 0) {
            k->after += (uint64_t)(n - (ssize_t)off);
            if (k->index == 0 && k->after > ctrl_max) ctrl_max = k->after;
            if (k->index > 0) data_bytes += (uint64_t)(n - (ssize_t)off);
          }
        }
        for (ssize_t w = 0; w < n;) {
          ssize_t r = send(to, buf + w, (size_t)(n - w), MSG_NOSIGNAL);
          if (r <= 0) break;
          w += r;
        }
      }
    }
    int j = 0;
    for (int i = 0; i < nconn; i++)
      if (conns[i].c >= 0) conns[j++] = conns[i];
    nconn = j;
  }
  fault_event_send(fd, FAULT_MSG_DONE, 0, (int64_t)ctrl_max);
  fault_event_send(fd, FAULT_MSG_DONE, 1, (int64_t)data_bytes);
  return 0;
}

/* Stops a proxy and collects its report: the flip, if it made one (sent before the flipped
 * bytes went on, so it is there whatever the timing), and its counts. 0, or -1 if the proxy
 * did not exit. */
static int bf_proxy_stop(fault_child* px, bf_proxy_report* rep) {
  memset(rep, 0, sizeof *rep);
  rep->flip = (fault_event){.phase = -1, .value = -1};
  fault_send(px->fd, FAULT_MSG_STOP, NULL, 0);
  int counts = 0;
  for (;;) {
    uint32_t kind = 0;
    fault_event e;
    int n = fault_recv(px->fd, &kind, &e, sizeof e, 20000);
    if (n < 0) break; /* EOF: the proxy exited */
    if (n != (int)sizeof e) continue;
    if (kind == FAULT_MSG_PHASE) {
      rep->flipped = true;
      rep->flip = e;
    } else if (kind == FAULT_MSG_DONE && e.phase == 0) {
      rep->ctrl_max = e.value;
      counts++;
    } else if (kind == FAULT_MSG_DONE && e.phase == 1) {
      rep->data = e.value;
      counts++;
    }
  }
  rep->counted = counts == 2;
  return fault_reap(px, 20000);
}

/* The path check of one proxy's report, "" when it holds: inline moves nothing on a data
 * socket; pieces puts nothing but message headers (at most hdr_max bytes per connection)
 * on the control socket. Both hold whatever a flip broke, since the sender decides a
 * message's path when it posts it. */
static const char* bf_path_check(fault_path path, const bf_proxy_report* rep, int64_t hdr_max) {
  if (!rep->counted) return "the proxy reported no byte counts";
  if (path == FAULT_PATH_INLINE && rep->data != 0) return "a payload went on a data socket";
  if (path == FAULT_PATH_PIECES && rep->ctrl_max > hdr_max) return "a payload went inline on the control socket";
  return "";
}

/* Starts a proxy (pa: its target and flip settings, filled in) listening on h's address,
 * another port, and rewrites h's address to it. 0, or -1 if the socket or the fork failed. */
static int bf_proxy_start(agoq_handle* h, bf_proxy_arg* pa, fault_child* px) {
  pa->lfd = socket(h->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_storage la = h->addr;
  ((struct sockaddr_in*)&la)->sin_port = 0;
  socklen_t ll = h->addr_len;
  if (pa->lfd < 0 || bind(pa->lfd, (struct sockaddr*)&la, ll) != 0 || listen(pa->lfd, 128) != 0 ||
      getsockname(pa->lfd, (struct sockaddr*)&la, &ll) != 0)
    return -1;
  if (fault_spawn(px, bf_proxy, pa) != 0) return -1;
  close(pa->lfd);
  h->addr = la;
  return 0;
}

/* pieces: each message's frame (more than BF_BYTES / 2 + 8192 bytes) is cut into pieces
 * over the data sockets; each socket carries at least its share of the BF_MSGS frames. */
static uint64_t bf_data_span(unsigned nsocks) { return (uint64_t)BF_MSGS * (BF_BYTES / 2 + 8192) / nsocks; }

/* The control stream of the p2p connection when every payload goes inline: per message its
 * header and its frame, counted with no escaped block (bf_input's values have none), which
 * is what the sender sends: every offset drawn from it lies in the stream. */
static uint64_t bf_inline_span(void) {
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 128};
  return (uint64_t)BF_MSGS * (AGOQ_MSG_HDR_SIZE + AGOQ_FRAME_HEADER_SIZE + agoq_codec_body_size(&p, BF_ELEMS, 0));
}

int fault_sc_bitflip(int seeds, uint64_t seed0, fault_path path) {
  int cases = 0, detected = 0, harmless = 0, noflip = 0, wrong = 0, hangs = 0, offpath = 0;
  const char* pn = fault_path_name(path);
  /* pieces: the control socket carries the BF_MSGS headers and nothing else. */
  const int64_t hdr_max = (int64_t)BF_MSGS * AGOQ_MSG_HDR_SIZE;
  const uint64_t ctrl_span = path == FAULT_PATH_INLINE ? bf_inline_span() : (uint64_t)hdr_max;
  setenv("AGOQ_P2P_FORMAT", "int8", 1);
  setenv("AGOQ_BLOCK", "128", 1);
  setenv("AGOQ_MIN_BYTES", "64K", 1);
  for (int i = 0; i < seeds; i++) {
    bf_arg a = {.seed = fault_mix(seed0 + (uint64_t)i)};
    fault_child r, s, px;
    if (fault_spawn(&r, bf_receiver, &a) != 0) return 1;
    uint8_t real[FAULT_HANDLE_SIZE];
    if (fault_recv_kind(r.fd, FAULT_MSG_HANDLE, real, sizeof real, 20000) != FAULT_HANDLE_SIZE) return 1;
    agoq_handle h;
    if (agoq_handle_decode(real, sizeof real, &h) != AGOQ_WIRE_OK) return 1;
    /* The proxy listens on the same address, another port; the handle is rewritten to it. */
    bf_proxy_arg pa = {.to = h.addr, .to_len = h.addr_len, .seed = a.seed, .path = path, .ctrl_span = ctrl_span,
                       .data_span = bf_data_span};
    if (bf_proxy_start(&h, &pa, &px) != 0) return 1;
    memset(a.handle, 0, sizeof a.handle);
    agoq_handle_encode(&h, a.handle);
    if (fault_spawn(&s, bf_sender, &a) != 0) return 1;
    cases++;
    uint32_t kind = 0;
    fault_event e;
    char text[512];
    int n = fault_recv(r.fd, &kind, text, sizeof text - 1, FAULT_RUN_LIMIT_MS);
    memcpy(&e, text, sizeof e);
    /* The proxy first: its counts then cover the run and none of the teardown. */
    bf_proxy_report rep;
    if (bf_proxy_stop(&px, &rep) != 0) hangs++;
    bool flip = rep.flipped;
    fault_event fe = rep.flip;
    const char* where = !flip ? "no flip" : fe.phase == 0 ? "control socket" : "data socket";
    if (n < 0) {
      hangs++;
      printf("fault: bitflip (%s) seed %d: receiver neither finished nor failed (hang)\n", pn, i);
    } else if (kind == FAULT_MSG_FAIL) {
      wrong++;
      printf("fault: bitflip (%s) seed %d (%s, offset %lld): %.*s\n", pn, i, where, (long long)fe.value, n, text);
    } else if (kind == FAULT_MSG_ERROR) {
      detected++;
      printf("fault: bitflip (%s) seed %d: flip on %s %d at offset %lld -> message %d failed with %d\n", pn, i, where,
             fe.phase, (long long)fe.value, e.phase, (int)e.value);
      if (!flip) {
        printf("fault: bitflip (%s) seed %d: ...but the proxy reports no flip\n", pn, i);
        wrong++;
      }
    } else if (flip) {
      harmless++;
      printf("fault: bitflip (%s) seed %d: flip on %s %d at offset %lld -> all %lld messages correct\n", pn, i, where,
             fe.phase, (long long)fe.value, (long long)e.value);
    } else {
      noflip++;
      printf("fault: bitflip (%s) seed %d: offset past the stream, no flip; all %lld messages correct\n", pn, i,
             (long long)e.value);
    }
    const char* off = bf_path_check(path, &rep, hdr_max);
    /* A complete inline run sent the whole span: else offsets drawn from it can miss. */
    if (!*off && path == FAULT_PATH_INLINE && n >= 0 && kind == FAULT_MSG_DONE && e.value == BF_MSGS &&
        (uint64_t)rep.ctrl_max < ctrl_span)
      off = "the control stream is shorter than the span the flip offsets are drawn from";
    if (*off) {
      offpath++;
      printf("fault: bitflip (%s) seed %d: PATH CHECK FAILED: %s (control stream %lld B, data sockets %lld B)\n", pn,
             i, off, (long long)rep.ctrl_max, (long long)rep.data);
    }
    fault_child* all[2] = {&r, &s};
    for (int k = 0; k < 2; k++) {
      fault_send(all[k]->fd, FAULT_MSG_STOP, NULL, 0);
      if (fault_reap(all[k], 20000) != 0) hangs++;
    }
  }
  printf("fault: bitflip (%s): cases=%d detected=%d correct-despite-flip=%d no-flip=%d wrong-data=%d hangs=%d "
         "path-check-failed=%d\n",
         pn, cases, detected, harmless, noflip, wrong, hangs, offpath);
  unsetenv("AGOQ_P2P_FORMAT");
  unsetenv("AGOQ_BLOCK");
  unsetenv("AGOQ_MIN_BYTES");
  /* inline draws every offset inside the control stream: a case without a flip means the
   * span is wrong and the case tested nothing. */
  if (path == FAULT_PATH_INLINE && noflip > 0) printf("fault: bitflip (inline): %d case(s) flipped nothing\n", noflip);
  return wrong == 0 && hangs == 0 && offpath == 0 && detected > 0 && (path != FAULT_PATH_INLINE || noflip == 0) ? 0 : 1;
}

/* ---- bitflip_coll: the same proxy between CollNet peers -------------------------------
 * Three ranks run BC_CALLS quantized bf16 all-reduces (int8, block 128, every frame with
 * header and payload CRC32C); every rank's listen address is replaced, in the handles the
 * other ranks receive, by a proxy that forwards to it, and one proxy flips one bit of one
 * socket (a data socket, or 1 case in 4 the control socket). Each rank reports a hash of
 * all its results; a first run without a flip gives the reference. Every rank must end
 * with the reference bits or with an error; wrong data or a hang fails the test.
 * agoq-fault-emu (AGOQ_FAULT_DEVICE, over the CUDA emulation) puts each rank's buffers in
 * device memory: every call must then be reduced on the GPU (agoq_coll_gpu.c), whose host
 * checks of the frames the flips must hit. */

#define BC_NRANKS 3
#define BC_CALLS 8
#define BC_COUNT (256u * 1024u) /* bf16 elements per call: 512 KiB */

typedef struct {
  int rank;
} bc_arg;

static int bc_rank(int fd, void* varg) {
  bc_arg* a = varg;
  void *ctx = NULL, *lc = NULL, *cc = NULL;
  static uint8_t all[BC_NRANKS][FAULT_HANDLE_SIZE];
  void* hp[BC_NRANKS];
  int rc = fault_coll_join(fd, BC_NRANKS, &ctx, &lc, &all[0][0], hp);
  if (rc != 0) return rc;
  ncclResult_t err = agoq_coll_connect(hp, BC_NRANKS, a->rank, lc, &cc);
  size_t bytes = (size_t)BC_COUNT * 2 * BC_CALLS;
  uint16_t* send = malloc(bytes);
  uint16_t* recv = malloc(bytes);
  if (send == NULL || recv == NULL) return fault_report_fail(fd, "out of memory");
  uint64_t st = fault_mix(0xc011b17ull + (uint64_t)a->rank); /* the same inputs in every case */
  for (size_t i = 0; i < bytes / 2; i++) {
    uint64_t r = fault_rand(&st);
    send[i] = (uint16_t)(((r >> 8) & 0x8000u) | ((120u + (unsigned)(r % 15)) << 7) | ((r >> 20) & 0x7fu));
  }
  memset(recv, 0xee, bytes);
  void *smh = NULL, *rmh = NULL;
  void* reqs[BC_CALLS] = {0};
  int step = 0;
  uint16_t* sbuf = send;
  uint16_t* rbuf = recv;
  int type = NCCL_PTR_HOST;
#if defined(AGOQ_FAULT_DEVICE)
  if (cudaMalloc((void**)&sbuf, bytes) != cudaSuccess || cudaMalloc((void**)&rbuf, bytes) != cudaSuccess ||
      cudaMemcpy(sbuf, send, bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(rbuf, recv, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return fault_report_fail(fd, "device buffers could not be set up");
  type = NCCL_PTR_CUDA;
#endif
  if (err == ncclSuccess) err = agoq_coll_reg_mr(cc, sbuf, bytes, type, &smh);
  if (err == ncclSuccess) err = agoq_coll_reg_mr(cc, rbuf, bytes, type, &rmh);
  for (int k = 0; k < BC_CALLS && err == ncclSuccess; k++) {
    step = k;
    int64_t end = fault_now_ms() + 20000;
    while (reqs[k] == NULL && err == ncclSuccess) {
      err = agoq_coll_iallreduce(cc, sbuf + (size_t)k * BC_COUNT, rbuf + (size_t)k * BC_COUNT, BC_COUNT,
                                 ncclBfloat16, ncclSum, smh, rmh, &reqs[k]);
      if (fault_now_ms() > end) return fault_report_fail(fd, "call %d could not be posted in 20 s", k);
    }
#if defined(AGOQ_FAULT_DEVICE)
    if (reqs[k] != NULL && !((const agoq_coll_req*)reqs[k])->gpu)
      return fault_report_fail(fd, "call %d on device buffers was not reduced on the GPU", k);
#endif
  }
  for (int k = 0; k < BC_CALLS && err == ncclSuccess; k++) {
    step = k;
    int done = 0, size = 0;
    int64_t end = fault_now_ms() + 20000;
    while (!done && (err = agoq_coll_test(reqs[k], &done, &size)) == ncclSuccess)
      if (fault_now_ms() > end) return fault_report_fail(fd, "call %d neither completed nor failed in 20 s", k);
  }
#if defined(AGOQ_FAULT_DEVICE)
  if (err == ncclSuccess && cudaMemcpy(recv, rbuf, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    return fault_report_fail(fd, "the device results could not be read");
#endif
  if (err != ncclSuccess) {
    fault_event_send(fd, FAULT_MSG_ERROR, step, err);
  } else {
    uint32_t h = agoq_crc32c(0, recv, bytes);
    fault_event_send(fd, FAULT_MSG_DONE, 0, (int64_t)h);
  }
  uint32_t kind;
  char sink[16];
  fault_recv(fd, &kind, sink, sizeof sink, 30000);
  if (smh) agoq_coll_dereg_mr(cc, smh);
  if (rmh) agoq_coll_dereg_mr(cc, rmh);
  if (cc) agoq_coll_close_coll(cc);
  agoq_coll_close_listen(lc);
  agoq_coll_finalize(ctx);
#if defined(AGOQ_FAULT_DEVICE)
  cudaFree(sbuf);
  cudaFree(rbuf);
#endif
  free(send);
  free(recv);
  return 0;
}

/* One frame of the smallest slice (BC_COUNT cut into BC_NRANKS runs of whole blocks), with
 * no escaped block (the inputs and their sums have none): no frame of a call is shorter. */
static uint64_t bc_frame_min(void) {
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 128};
  size_t slice_min = (BC_COUNT / 128u / BC_NRANKS) * 128u;
  return AGOQ_FRAME_HEADER_SIZE + agoq_codec_body_size(&p, slice_min, 0);
}

/* pieces: a connection's messages take its data sockets in turn, each whole (a frame of
 * about 90 KB is less than two pieces of AGOQ_SOCKET_MIN_CHUNK's 64 KiB default): every
 * data socket carries at least BC_CALLS / nsocks frames. (It used to be BC_CALLS / 2 frames
 * whatever nsocks: with AGOQ_SOCKET_NSOCKS=4, 10 of 24 cases flipped nothing.) */
static uint64_t bc_data_span(unsigned nsocks) { return (uint64_t)(BC_CALLS / nsocks) * bc_frame_min(); }

/* Bytes on the control socket of one CollNet connection when every message goes inline:
 * the ident message (the first on every connection), then per call one frame of a slice
 * (phase 0: the owner's slice of the sender's contribution; phase 1: the sender's slice of
 * the result) behind its header. Counted with the smallest frame (bc_frame_min): no
 * connection's stream is shorter, so every offset drawn from it lies in every one of them. */
static uint64_t bc_inline_span(void) {
  return AGOQ_MSG_HDR_SIZE + AGOQ_COLL_MSG_SIZE + (uint64_t)BC_CALLS * (AGOQ_MSG_HDR_SIZE + bc_frame_min());
}

/* pieces: the control socket of a connection carries message headers only: the ident, the
 * ready (phase 0) and one per call. */
#define BC_HDR_MAX ((int64_t)(BC_CALLS + 2) * AGOQ_MSG_HDR_SIZE)

/* The control stream bytes a flip offset is drawn from: pieces, within its first BC_CALLS
 * headers (as before paths); inline, anywhere in it. */
static uint64_t bc_ctrl_span(fault_path path) {
  return path == FAULT_PATH_INLINE ? bc_inline_span() : (uint64_t)BC_CALLS * AGOQ_MSG_HDR_SIZE;
}

/* One case: ranks, proxies (one may flip), outcome per rank. Returns -1 on setup failure. */
typedef struct {
  int done, errors, hangs;
  int64_t hash[BC_NRANKS];
  bool flipped;
  fault_event flip;
  bf_proxy_report rep[BC_NRANKS];
} bc_outcome;

static int bc_case(uint64_t seed, int flipper, fault_path path, bc_outcome* o) {
  memset(o, 0, sizeof *o);
  fault_child r[BC_NRANKS], px[BC_NRANKS];
  bc_arg a[BC_NRANKS];
  static uint8_t real[BC_NRANKS][FAULT_HANDLE_SIZE], proxied[BC_NRANKS][FAULT_HANDLE_SIZE];
  static uint8_t view[BC_NRANKS][BC_NRANKS][FAULT_HANDLE_SIZE];
  for (int k = 0; k < BC_NRANKS; k++) {
    a[k].rank = k;
    if (fault_spawn(&r[k], bc_rank, &a[k]) != 0) return -1;
  }
  for (int k = 0; k < BC_NRANKS; k++) {
    if (fault_recv_kind(r[k].fd, FAULT_MSG_HANDLE, real[k], FAULT_HANDLE_SIZE, 20000) != FAULT_HANDLE_SIZE) return -1;
    agoq_handle h;
    if (agoq_handle_decode(real[k], AGOQ_HANDLE_WIRE_SIZE, &h) != AGOQ_WIRE_OK) return -1;
    bf_proxy_arg pa = {.to = h.addr, .to_len = h.addr_len, .seed = seed + (uint64_t)k, .path = path,
                       .ctrl_span = bc_ctrl_span(path),
                       .data_span = bc_data_span, .no_flip = k != flipper};
    if (bf_proxy_start(&h, &pa, &px[k]) != 0) return -1;
    memcpy(proxied[k], real[k], FAULT_HANDLE_SIZE); /* CollNet's settings at [64, 96) stay */
    agoq_handle_encode(&h, proxied[k]);
  }
  /* Rank k sees its own handle as made, every other rank's through that rank's proxy. */
  for (int k = 0; k < BC_NRANKS; k++) {
    for (int j = 0; j < BC_NRANKS; j++) memcpy(view[k][j], j == k ? real[j] : proxied[j], FAULT_HANDLE_SIZE);
    fault_send(r[k].fd, FAULT_MSG_HANDLES, view[k], sizeof view[k]);
  }
  for (int k = 0; k < BC_NRANKS; k++) {
    uint32_t kind = 0;
    char text[512];
    int n = fault_recv(r[k].fd, &kind, text, sizeof text - 1, FAULT_RUN_LIMIT_MS);
    fault_event e;
    memcpy(&e, text, sizeof e);
    if (n < 0) {
      o->hangs++;
      printf("fault: bitflip_coll: rank %d neither finished nor failed (hang)\n", k);
    } else if (kind == FAULT_MSG_FAIL) {
      o->hangs++;
      printf("fault: bitflip_coll: rank %d: %.*s\n", k, n, text);
    } else if (kind == FAULT_MSG_ERROR) {
      o->errors++;
      o->hash[k] = -1;
    } else {
      o->done++;
      o->hash[k] = e.value;
    }
  }
  /* The proxies first: their counts then cover the run and none of the teardown. */
  for (int k = 0; k < BC_NRANKS; k++)
    if (bf_proxy_stop(&px[k], &o->rep[k]) != 0) o->hangs++;
  if (flipper >= 0) {
    o->flipped = o->rep[flipper].flipped;
    o->flip = o->rep[flipper].flip;
  }
  for (int k = 0; k < BC_NRANKS; k++) {
    fault_send(r[k].fd, FAULT_MSG_STOP, NULL, 0);
    if (fault_reap(&r[k], 20000) != 0) o->hangs++;
  }
  return 0;
}

/* The path check of a case over its proxies (bf_path_check), "" when it holds; *k: the
 * proxy that failed it. */
static const char* bc_path_check(fault_path path, const bc_outcome* o, int* k) {
  for (*k = 0; *k < BC_NRANKS; (*k)++) {
    const char* off = bf_path_check(path, &o->rep[*k], BC_HDR_MAX);
    if (*off) return off;
  }
  return "";
}

int fault_sc_bitflip_coll(int seeds, uint64_t seed0, fault_path path) {
  int cases = 0, detected = 0, harmless = 0, noflip = 0, wrong = 0, hangs = 0, offpath = 0;
  const char* pn = fault_path_name(path);
  setenv("AGOQ_FORMAT", "int8", 1);
  setenv("AGOQ_BLOCK", "128", 1);
  setenv("AGOQ_MIN_BYTES", "64K", 1);
  bc_outcome ref;
  if (bc_case(seed0, -1, path, &ref) != 0 || ref.done != BC_NRANKS || ref.hash[1] != ref.hash[0] ||
      ref.hash[2] != ref.hash[0]) {
    printf("fault: bitflip_coll (%s): the reference run without a flip failed (%d of %d ranks done)\n", pn, ref.done,
           BC_NRANKS);
    return 1;
  }
  /* The reference run is complete: its streams must take the path asked for and, inline,
   * be no shorter than the span the flip offsets are drawn from. */
  int pk = 0;
  const char* off = bc_path_check(path, &ref, &pk);
  for (int k = 0; !*off && path == FAULT_PATH_INLINE && k < BC_NRANKS; k++)
    if ((uint64_t)ref.rep[k].ctrl_max < bc_inline_span()) {
      pk = k;
      off = "the control stream is shorter than the span the flip offsets are drawn from";
    }
  if (*off) {
    printf("fault: bitflip_coll (%s): reference run: PATH CHECK FAILED at proxy %d: %s (control stream %lld B, data "
           "sockets %lld B)\n",
           pn, pk, off, (long long)ref.rep[pk].ctrl_max, (long long)ref.rep[pk].data);
    return 1;
  }
  printf("fault: bitflip_coll (%s): reference run, per proxy: longest control stream / data-socket bytes:", pn);
  for (int k = 0; k < BC_NRANKS; k++)
    printf(" %lld / %lld B", (long long)ref.rep[k].ctrl_max, (long long)ref.rep[k].data);
  printf("; control flip span %llu B\n", (unsigned long long)bc_ctrl_span(path));
  for (int i = 0; i < seeds; i++) {
    uint64_t seed = fault_mix(seed0 + 0x200000u + (uint64_t)i);
    bc_outcome o;
    if (bc_case(seed, (int)(seed % BC_NRANKS), path, &o) != 0) return 1;
    cases++;
    hangs += o.hangs;
    int bad = 0;
    for (int k = 0; k < BC_NRANKS; k++)
      if (o.hash[k] != -1 && o.hash[k] != ref.hash[0]) bad++;
    const char* where = !o.flipped ? "no flip" : o.flip.phase == 0 ? "control socket" : "data socket";
    if (bad > 0) {
      wrong++;
      printf("fault: bitflip_coll (%s) seed %d (%s, offset %lld): WRONG DATA on %d rank(s)\n", pn, i, where,
             (long long)o.flip.value, bad);
    } else if (o.errors > 0) {
      detected++;
      printf("fault: bitflip_coll (%s) seed %d: flip on %s at offset %lld -> %d rank(s) failed, %d correct\n", pn, i,
             where, (long long)o.flip.value, o.errors, o.done);
      if (!o.flipped) wrong++, printf("fault: bitflip_coll (%s) seed %d: ...but the proxy reports no flip\n", pn, i);
    } else if (o.flipped) {
      harmless++;
      printf("fault: bitflip_coll (%s) seed %d: flip on %s at offset %lld -> all results correct\n", pn, i, where,
             (long long)o.flip.value);
    } else {
      noflip++;
      printf("fault: bitflip_coll (%s) seed %d: offset past the stream, no flip; all results correct\n", pn, i);
    }
    if (*(off = bc_path_check(path, &o, &pk))) {
      offpath++;
      printf("fault: bitflip_coll (%s) seed %d: PATH CHECK FAILED at proxy %d: %s (control stream %lld B, data "
             "sockets %lld B)\n",
             pn, i, pk, off, (long long)o.rep[pk].ctrl_max, (long long)o.rep[pk].data);
    }
  }
  printf("fault: bitflip_coll (%s): cases=%d detected=%d correct-despite-flip=%d no-flip=%d wrong-data=%d hangs=%d "
         "path-check-failed=%d\n",
         pn, cases, detected, harmless, noflip, wrong, hangs, offpath);
  unsetenv("AGOQ_FORMAT");
  unsetenv("AGOQ_BLOCK");
  unsetenv("AGOQ_MIN_BYTES");
  /* inline draws every offset inside every control stream: a case without a flip means
   * the span is wrong and the case tested nothing. */
  if (path == FAULT_PATH_INLINE && noflip > 0)
    printf("fault: bitflip_coll (inline): %d case(s) flipped nothing\n", noflip);
  return wrong == 0 && hangs == 0 && offpath == 0 && detected > 0 && (path != FAULT_PATH_INLINE || noflip == 0) ? 0 : 1;
}
