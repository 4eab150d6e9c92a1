/*
 * bitflip: a TCP proxy between a sender and a receiver flips one bit of the byte stream at
 * a random offset of a random socket (a data socket, or 1 case in 4 the control socket),
 * after the connection's hello. The sender's payloads are typed p2p bf16 transfers (a fake
 * profiler callback answers as agoq's profiler would, as in tests/unit/test_typed.c), so
 * every data byte belongs to a codec frame with header and payload CRCs. The receiver
 * checks each message against the frame it computes itself from the same input: every
 * message must be either bit-identical to that reference or fail with an error; wrong data
 * is the one outcome that fails the test.
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
  uint64_t data_span; /* bytes per data socket the flip offset is drawn from; 0: p2p's */
  bool no_flip;       /* forward only */
} bf_proxy_arg;

#define BF_MAX_CONN 80

typedef struct {
  int c, s;           /* client side, server side */
  uint8_t hello[AGOQ_HELLO_SIZE];
  size_t hello_got;
  uint64_t after;     /* client->server bytes after the hello */
  int index, nsocks;  /* from the hello */
} bf_conn;

/* PHASE event when the bit is flipped: phase = socket index, value = offset. */
static int bf_proxy(int fd, void* varg) {
  bf_proxy_arg* a = varg;
  bf_conn conns[BF_MAX_CONN];
  int nconn = 0;
  uint64_t st = fault_mix(a->seed ^ 0xb1f11bull);
  int target = -1;
  uint64_t flip_at = 0;
  bool flipped = false;
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
              /* Control socket in 1 case of 4 (within its 8 message headers), else a data
               * socket within its share of the 8 frames. */
              bool ctrl = fault_rand(&st) % 4 == 0;
              target = ctrl ? 0 : 1 + (int)(fault_rand(&st) % (uint64_t)k->nsocks);
              uint64_t data = a->data_span ? a->data_span : (uint64_t)BF_MSGS * (BF_BYTES / 2 + 8192) / k->nsocks;
              uint64_t span = ctrl ? 8u * AGOQ_MSG_HDR_SIZE : data;
              flip_at = fault_rand(&st) % span;
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
          if (k->index >= 0) k->after += (uint64_t)(n - (ssize_t)off);
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
  return 0;
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

int fault_sc_bitflip(int seeds, uint64_t seed0) {
  int cases = 0, detected = 0, harmless = 0, noflip = 0, wrong = 0, hangs = 0;
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
    bf_proxy_arg pa = {.to = h.addr, .to_len = h.addr_len, .seed = a.seed};
    if (bf_proxy_start(&h, &pa, &px) != 0) return 1;
    memset(a.handle, 0, sizeof a.handle);
    agoq_handle_encode(&h, a.handle);
    if (fault_spawn(&s, bf_sender, &a) != 0) return 1;
    cases++;
    uint32_t kind = 0;
    fault_event e;
    char text[512];
    int n = fault_recv(r.fd, &kind, text, sizeof text - 1, 40000);
    memcpy(&e, text, sizeof e);
    fault_event fe = {.phase = -1, .value = -1};
    uint32_t fk = 0;
    bool flip = fault_recv(px.fd, &fk, &fe, sizeof fe, 200) == (int)sizeof fe && fk == FAULT_MSG_PHASE;
    const char* where = !flip ? "no flip" : fe.phase == 0 ? "control socket" : "data socket";
    if (n < 0) {
      hangs++;
      printf("fault: bitflip seed %d: receiver neither finished nor failed (hang)\n", i);
    } else if (kind == FAULT_MSG_FAIL) {
      wrong++;
      printf("fault: bitflip seed %d (%s, offset %lld): %.*s\n", i, where, (long long)fe.value, n, text);
    } else if (kind == FAULT_MSG_ERROR) {
      detected++;
      printf("fault: bitflip seed %d: flip on %s %d at offset %lld -> message %d failed with %d\n", i, where,
             fe.phase, (long long)fe.value, e.phase, (int)e.value);
      if (!flip) {
        printf("fault: bitflip seed %d: ...but the proxy reports no flip\n", i);
        wrong++;
      }
    } else if (flip) {
      harmless++;
      printf("fault: bitflip seed %d: flip on %s %d at offset %lld -> all %lld messages correct\n", i, where, fe.phase,
             (long long)fe.value, (long long)e.value);
    } else {
      noflip++;
      printf("fault: bitflip seed %d: offset past the stream, no flip; all %lld messages correct\n", i,
             (long long)e.value);
    }
    fault_child* all[3] = {&r, &s, &px};
    for (int k = 0; k < 3; k++) {
      fault_send(all[k]->fd, FAULT_MSG_STOP, NULL, 0);
      if (fault_reap(all[k], 20000) != 0) hangs++;
    }
  }
  printf("fault: bitflip: cases=%d detected=%d correct-despite-flip=%d no-flip=%d wrong-data=%d hangs=%d\n", cases,
         detected, harmless, noflip, wrong, hangs);
  unsetenv("AGOQ_P2P_FORMAT");
  unsetenv("AGOQ_BLOCK");
  unsetenv("AGOQ_MIN_BYTES");
  return wrong == 0 && hangs == 0 && detected > 0 ? 0 : 1;
}

/* ---- bitflip_coll: the same proxy between CollNet peers -------------------------------
 * Three ranks run BC_CALLS quantized bf16 all-reduces (int8, block 128, every frame with
 * header and payload CRC32C); every rank's listen address is replaced, in the handles the
 * other ranks receive, by a proxy that forwards to it, and one proxy flips one bit of one
 * socket (a data socket, or 1 case in 4 the control socket). Each rank reports a hash of
 * all its results; a first run without a flip gives the reference. Every rank must end
 * with the reference bits or with an error; wrong data or a hang fails the test. */

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
  if (err == ncclSuccess) {
    agoq_coll_reg_mr(cc, send, bytes, NCCL_PTR_HOST, &smh);
    agoq_coll_reg_mr(cc, recv, bytes, NCCL_PTR_HOST, &rmh);
  }
  for (int k = 0; k < BC_CALLS && err == ncclSuccess; k++) {
    step = k;
    int64_t end = fault_now_ms() + 20000;
    while (reqs[k] == NULL && err == ncclSuccess) {
      err = agoq_coll_iallreduce(cc, send + (size_t)k * BC_COUNT, recv + (size_t)k * BC_COUNT, BC_COUNT,
                                 ncclBfloat16, ncclSum, &reqs[k]);
      if (fault_now_ms() > end) return fault_report_fail(fd, "call %d could not be posted in 20 s", k);
    }
  }
  for (int k = 0; k < BC_CALLS && err == ncclSuccess; k++) {
    step = k;
    int done = 0, size = 0;
    int64_t end = fault_now_ms() + 20000;
    while (!done && (err = agoq_coll_test(reqs[k], &done, &size)) == ncclSuccess)
      if (fault_now_ms() > end) return fault_report_fail(fd, "call %d neither completed nor failed in 20 s", k);
  }
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
  free(send);
  free(recv);
  return 0;
}

/* One case: ranks, proxies (one may flip), outcome per rank. Returns -1 on setup failure. */
typedef struct {
  int done, errors, hangs;
  int64_t hash[BC_NRANKS];
  bool flipped;
  fault_event flip;
} bc_outcome;

static int bc_case(uint64_t seed, int flipper, bc_outcome* o) {
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
    bf_proxy_arg pa = {.to = h.addr, .to_len = h.addr_len, .seed = seed + (uint64_t)k,
                       .data_span = (uint64_t)BC_CALLS * (BC_COUNT / BC_NRANKS + 4096) / 2, .no_flip = k != flipper};
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
    int n = fault_recv(r[k].fd, &kind, text, sizeof text - 1, 40000);
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
  if (flipper >= 0) {
    uint32_t fk = 0;
    o->flipped = fault_recv(px[flipper].fd, &fk, &o->flip, sizeof o->flip, 200) == (int)sizeof o->flip &&
                 fk == FAULT_MSG_PHASE;
  }
  for (int k = 0; k < BC_NRANKS; k++) {
    fault_send(r[k].fd, FAULT_MSG_STOP, NULL, 0);
    fault_send(px[k].fd, FAULT_MSG_STOP, NULL, 0);
    if (fault_reap(&r[k], 20000) != 0) o->hangs++;
    if (fault_reap(&px[k], 20000) != 0) o->hangs++;
  }
  return 0;
}

int fault_sc_bitflip_coll(int seeds, uint64_t seed0) {
  int cases = 0, detected = 0, harmless = 0, noflip = 0, wrong = 0, hangs = 0;
  setenv("AGOQ_FORMAT", "int8", 1);
  setenv("AGOQ_BLOCK", "128", 1);
  setenv("AGOQ_MIN_BYTES", "64K", 1);
  bc_outcome ref;
  if (bc_case(seed0, -1, &ref) != 0 || ref.done != BC_NRANKS || ref.hash[1] != ref.hash[0] ||
      ref.hash[2] != ref.hash[0]) {
    printf("fault: bitflip_coll: the reference run without a flip failed (%d of %d ranks done)\n", ref.done,
           BC_NRANKS);
    return 1;
  }
  for (int i = 0; i < seeds; i++) {
    uint64_t seed = fault_mix(seed0 + 0x200000u + (uint64_t)i);
    bc_outcome o;
    if (bc_case(seed, (int)(seed % BC_NRANKS), &o) != 0) return 1;
    cases++;
    hangs += o.hangs;
    int bad = 0;
    for (int k = 0; k < BC_NRANKS; k++)
      if (o.hash[k] != -1 && o.hash[k] != ref.hash[0]) bad++;
    const char* where = !o.flipped ? "no flip" : o.flip.phase == 0 ? "control socket" : "data socket";
    if (bad > 0) {
      wrong++;
      printf("fault: bitflip_coll seed %d (%s, offset %lld): WRONG DATA on %d rank(s)\n", i, where,
             (long long)o.flip.value, bad);
    } else if (o.errors > 0) {
      detected++;
      printf("fault: bitflip_coll seed %d: flip on %s at offset %lld -> %d rank(s) failed, %d correct\n", i, where,
             (long long)o.flip.value, o.errors, o.done);
      if (!o.flipped) wrong++, printf("fault: bitflip_coll seed %d: ...but the proxy reports no flip\n", i);
    } else if (o.flipped) {
      harmless++;
      printf("fault: bitflip_coll seed %d: flip on %s at offset %lld -> all results correct\n", i, where,
             (long long)o.flip.value);
    } else {
      noflip++;
      printf("fault: bitflip_coll seed %d: offset past the stream, no flip; all results correct\n", i);
    }
  }
  printf("fault: bitflip_coll: cases=%d detected=%d correct-despite-flip=%d no-flip=%d wrong-data=%d hangs=%d\n",
         cases, detected, harmless, noflip, wrong, hangs);
  unsetenv("AGOQ_FORMAT");
  unsetenv("AGOQ_BLOCK");
  unsetenv("AGOQ_MIN_BYTES");
  return wrong == 0 && hangs == 0 && detected > 0 ? 0 : 1;
}
