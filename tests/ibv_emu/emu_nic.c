/*
 * The NIC thread of one context: the requester and responder engines of the emulated HCA.
 *
 * A requester QP in RTS with work to do connects to the context owning its dest_qp_num
 * (found in <dir>/qpn-<n>), sends a hello describing its address vector, and, once the
 * responder accepted it, streams its WRs in order: WRITE (with or without immediate),
 * SEND and READ requests, each tagged with its send-queue sequence number. The responder
 * answers each with an ACK, a NAK (remote access, RNR, ...) or a READ response; after a
 * NAK it drops the stream's later requests until the NAKed one comes again (go-back-N,
 * IB spec 9.7.5.2.8). No answer within the local ACK timeout (a refused hello, a dead
 * peer, an EOF) is "transport retry counter exceeded". Sockets are non-blocking; the
 * thread polls them, the context's wake eventfd and its listening socket.
 *
 * As on a wire, where a message is a train of MTU packets placed as they arrive, WRITE
 * and SEND payloads and READ responses travel in segments of at most SEG_MAX bytes (the
 * WR's seq, the offset within the message, the message's length, a "last" flag). The
 * sender appends them lazily, keeping at most about OUT_MAX bytes queued per stream; the
 * responder checks and places each segment as it comes and answers a non-last one with
 * a progress frame (the per-packet ACK timer of IB spec 9.7.6.1.3). Only the last
 * segment consumes a receive WR and produces the completion and the ACK; the RNR and
 * receive-length checks happen at the first one, before any byte is placed.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

enum { F_HELLO = 1, F_HELLO_OK, F_HELLO_NAK, F_WRITE, F_SEND, F_READ_REQ, F_READ_RESP, F_ACK, F_NAK, F_PROGRESS };
enum { HF_IMM = 1, HF_LAST = 2 };
#define NAK_RNR 0xffffu
#define SEQ_UNSET UINT64_MAX
#define SEG_MAX ((uint32_t)1 << 20)     /* payload bytes of one segment */
#define OUT_MAX ((size_t)4 << 20)       /* a stream's sender queues no more than this */
#define MSG_MAX 0x80000000ull           /* max_msg_sz */
#define HELLO_MAX 4096u                 /* the longest hello payload accepted */
#define READ_CHUNK ((size_t)256 << 10)  /* bytes asked of recv() at once */
#define READ_BUDGET ((size_t)8 << 20)   /* bytes one conn_read takes before others get a turn */

typedef struct emu_hdr {
  uint32_t type, len; /* len: payload bytes after the header */
  uint64_t seq, raddr;
  uint64_t off; /* WRITE/SEND/READ_RESP segments: the payload's offset in the message */
  /* rlen: READ_REQ: the length to read; WRITE/SEND/READ_RESP: the message's length */
  uint32_t rkey, imm, status, flags, rlen, timer;
} emu_hdr;

typedef struct emu_hello {
  uint32_t src_qpn, dest_qpn, sgid_type, is_global, dlid, slid, path_mtu, pad;
  uint8_t sgid[16], dgid[16];
} emu_hello;

/* ---- buffers and connections ---------------------------------------------------------- */

static void buf_reserve(emu_buf* b, size_t n) {
  if (b->off && b->off == b->len) b->off = b->len = 0;
  if (b->len + n <= b->cap) return;
  if (b->off) { /* compact */
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
    if (b->len + n <= b->cap) return;
  }
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + n) cap *= 2;
  uint8_t* p = realloc(b->p, cap);
  if (!p) {
    fprintf(stderr, "agoq-ibv-emu: out of memory\n");
    abort();
  }
  b->p = p;
  b->cap = cap;
}

static void buf_append(emu_buf* b, const void* p, size_t n) {
  buf_reserve(b, n);
  if (n) memcpy(b->p + b->len, p, n);
  b->len += n;
}

static void send_frame(emu_conn* c, emu_hdr* h, const void* payload, uint32_t len) {
  h->len = len;
  buf_append(&c->out, h, sizeof *h);
  buf_append(&c->out, payload, len);
}

static size_t pending(const emu_buf* b) { return b->len - b->off; }

/* No room for one more full segment within OUT_MAX: stop appending until out drains. */
static bool out_full(const emu_conn* c) { return pending(&c->out) + SEG_MAX + sizeof(emu_hdr) > OUT_MAX; }

/* Copies n bytes between buf and the bytes [off, off+n) of a message laid out over an SGE
 * list (lkeys of pd): into the SGEs (scatter, which needs LOCAL_WRITE) or out of them.
 * Every piece is checked against its MR at the time of the copy. 0, LOC_PROT_ERR, or
 * LOC_LEN_ERR when the list ends first. */
static int sge_xfer(emu_ctx* ctx, struct agoq_ibv_pd* pd, const struct agoq_ibv_sge* sge, int nsge, uint64_t off,
                    uint8_t* buf, uint64_t n, int scatter) {
  for (int i = 0; i < nsge && n; i++) {
    uint64_t l = sge[i].length;
    if (off >= l) {
      off -= l;
      continue;
    }
    uint64_t k = l - off < n ? l - off : n;
    uint8_t* p;
    if (!emu_mr_check(ctx, pd, sge[i].lkey, 0, sge[i].addr + off, k, scatter ? AGOQ_IBV_ACCESS_LOCAL_WRITE : 0, &p))
      return AGOQ_IBV_WC_LOC_PROT_ERR;
    if (scatter)
      memcpy(p, buf, k);
    else
      memcpy(buf, p, k);
    buf += k;
    n -= k;
    off = 0;
  }
  return n ? AGOQ_IBV_WC_LOC_LEN_ERR : 0;
}

static void conn_drop(emu_ctx* ctx, emu_conn* c) {
  c->closing = 1;
  if (c->role == EMU_CONN_REQ) {
    emu_qp* qp = emu_qp_find(ctx, c->qpn);
    if (qp && qp->conn == c) qp->conn = NULL;
  }
}

void emu_conn_close_qp(emu_ctx* ctx, uint32_t qpn) {
  for (emu_conn* c = ctx->conns; c; c = c->next)
    if (c->qpn == qpn && (c->role == EMU_CONN_REQ || c->state == EMU_CS_OPEN)) conn_drop(ctx, c);
}

/* 0, or -1 when the stream broke; *moved: some bytes left. */
static int flush_out(emu_conn* c, bool* moved) {
  *moved = false;
  while (c->out.off < c->out.len) {
    ssize_t w = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c->out.off += (size_t)w;
      *moved = true;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
  }
  c->out.off = c->out.len = 0;
  return 0;
}

/* The local ACK timeout runs per packet (IB spec 9.7.6.1.3): while the bytes of a long
 * message keep leaving (the responder takes them) or those of a long READ response keep
 * arriving, hardware sees packets acknowledged or answered one by one, so a requester's
 * timer restarts whenever its stream moves. */
static void restart_ack(emu_ctx* ctx, emu_conn* c, int64_t now) {
  if (c->role != EMU_CONN_REQ) return;
  emu_qp* qp = emu_qp_find(ctx, c->qpn);
  int64_t to = qp ? emu_qp_timeout_ns(qp) : 0;
  if (qp && qp->conn == c && qp->ack_deadline && to) qp->ack_deadline = now + to;
}

static void conn_free(emu_conn* c) {
  close(c->fd);
  free(c->in.p);
  free(c->out.p);
  free(c);
}

static void reap(emu_ctx* ctx) {
  for (emu_conn** pp = &ctx->conns; *pp;) {
    emu_conn* c = *pp;
    if (!c->closing) {
      pp = &c->next;
      continue;
    }
    bool moved;
    flush_out(c, &moved); /* a last NAK still reaches the peer */
    *pp = c->next;
    conn_free(c);
  }
}

void emu_conn_free_all(emu_ctx* ctx) {
  while (ctx->conns) {
    emu_conn* c = ctx->conns;
    ctx->conns = c->next;
    conn_free(c);
  }
}

static emu_conn* conn_new(emu_ctx* ctx, int fd, int role) {
  emu_conn* c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return NULL;
  }
  c->fd = fd;
  c->role = role;
  c->state = EMU_CS_HELLO;
  c->expect_seq = SEQ_UNSET;
  c->next = ctx->conns;
  ctx->conns = c;
  return c;
}

/* ---- requester -------------------------------------------------------------------------- */

static int64_t retry_interval(const emu_qp* qp) {
  int64_t to = emu_qp_timeout_ns(qp);
  int64_t iv = to ? to / (qp->retry_cnt + 1) : 1000000;
  return iv < 20000 ? 20000 : iv;
}

/* IB spec Table 45 (RNR NAK timer field), in units of 10 ns */
static int64_t rnr_ns(const emu_ctx* ctx, unsigned timer) {
  static const uint32_t t10ns[32] = {65536, 1,    2,    3,    4,    6,    8,     12,    16,    24,   32,
                                     48,    64,   96,   128,  192,  256,  384,   512,   768,   1024, 1536,
                                     2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  double ns = (double)t10ns[timer & 31] * 10000.0 * ctx->time_scale;
  return ns < 20000 ? 20000 : (int64_t)ns;
}

static const emu_port_cfg* qp_port(const emu_qp* qp) { return &qp->ctx->dev.cfg.ports[qp->port - 1]; }

static void try_connect(emu_ctx* ctx, emu_qp* qp, int64_t now) {
  qp->next_connect = now + retry_interval(qp);
  char path[PATH_MAX], text[2048];
  snprintf(path, sizeof path, "%s/qpn-%u", ctx->dir, qp->dest_qpn);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return; /* no such QP anywhere: nothing will ever answer */
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return;
  text[n] = 0;
  char* s = strstr(text, "sock=");
  if (!s) return;
  s += 5;
  char* nl = strchr(s, '\n');
  if (nl) *nl = 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(s) >= sizeof sa.sun_path) return;
  strcpy(sa.sun_path, s);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (connect(fd, (struct sockaddr*)&sa, sizeof sa)) { /* refused: a dead context */
    close(fd);
    return;
  }
  emu_conn* c = conn_new(ctx, fd, EMU_CONN_REQ);
  if (!c) return;
  c->qpn = qp->ibv.qp_num;
  qp->conn = c;
  const emu_port_cfg* p = qp_port(qp);
  emu_hello h;
  memset(&h, 0, sizeof h);
  h.src_qpn = qp->ibv.qp_num;
  h.dest_qpn = qp->dest_qpn;
  h.is_global = qp->ah.is_global;
  h.dlid = qp->ah.dlid;
  h.slid = p->lid;
  h.path_mtu = (uint32_t)qp->path_mtu;
  if (qp->ah.is_global) {
    memcpy(h.sgid, p->gids[qp->ah.grh.sgid_index].gid.raw, 16);
    h.sgid_type = (uint32_t)p->gids[qp->ah.grh.sgid_index].type;
    memcpy(h.dgid, qp->ah.grh.dgid.raw, 16);
  }
  emu_hdr hd;
  memset(&hd, 0, sizeof hd);
  hd.type = F_HELLO;
  send_frame(c, &hd, &h, sizeof h);
}

/* No answer in time: what is on the wire ends with RETRY_EXC_ERR (or the oldest WR when
 * nothing is); the QP goes to ERR when that completion is generated. */
static void fail_timeout(emu_qp* qp) {
  int any = 0;
  for (uint64_t s = qp->sq_ack; s < qp->sq_exec; s++) {
    emu_swr* e = emu_swr_at(qp, s);
    if (e->result < 0 && e->transmitted) {
      e->result = AGOQ_IBV_WC_RETRY_EXC_ERR;
      any = 1;
    }
  }
  if (!any && qp->sq_exec < qp->sq_next) {
    emu_swr_at(qp, qp->sq_exec)->result = AGOQ_IBV_WC_RETRY_EXC_ERR;
    qp->sq_exec++;
  }
  qp->tx_halt = 1;
}

static void push_send_cqe(emu_qp* qp, const emu_swr* e, int status) {
  emu_cqe c;
  memset(&c, 0, sizeof c);
  c.is_send = 1;
  c.seq = e->seq;
  c.wc.wr_id = e->wr_id;
  c.wc.status = status;
  c.wc.vendor_err = emu_vendor_err(status);
  c.wc.qp_num = qp->ibv.qp_num;
  c.wc.opcode = e->opcode == AGOQ_IBV_WR_RDMA_READ ? AGOQ_IBV_WC_RDMA_READ
                : e->opcode == AGOQ_IBV_WR_SEND    ? AGOQ_IBV_WC_SEND
                                                   : AGOQ_IBV_WC_RDMA_WRITE;
  if (e->opcode == AGOQ_IBV_WR_RDMA_READ) c.wc.byte_len = e->byte_len;
  emu_cq_push(qp->ctx, (emu_cq*)qp->ibv.send_cq, &c);
}

static void port_down(emu_ctx* ctx, int port);

/* Completions in send-queue order, as far as results are known (IB spec 10.8.4:
 * completions of one send queue are returned in the order the WRs were posted). */
static void emit(emu_qp* qp) {
  while (qp->sq_ack < qp->sq_exec) {
    emu_swr* e = emu_swr_at(qp, qp->sq_ack);
    if (e->result < 0) break;
    /* unsignaled WRs complete silently, errors always produce a CQE (IB spec 10.7.2) */
    if (e->result != 0 || e->signaled) push_send_cqe(qp, e, e->result);
    qp->sq_ack++;
    if (e->result != 0 && qp->st != AGOQ_IBV_QPS_ERR) emu_qp_set_err(qp);
    if (e->result == 0 && e->port_down_after) port_down(qp->ctx, qp->port);
  }
}

/* In ERR every WR not yet completed is flushed (WR_FLUSH_ERR), after those whose result
 * was already known. */
static void flush_sq(emu_qp* qp) {
  emit(qp);
  for (; qp->sq_ack < qp->sq_next; qp->sq_ack++) {
    emu_swr* e = emu_swr_at(qp, qp->sq_ack);
    push_send_cqe(qp, e, e->result > 0 ? e->result : AGOQ_IBV_WC_WR_FLUSH_ERR);
  }
  qp->sq_exec = qp->sq_next;
}

/* The port went down: the oldest WR still outstanding ends with RETRY_EXC_ERR, the rest
 * are flushed, and the QP goes to ERR. */
static void port_fail_qp(emu_qp* qp) {
  if (qp->sq_ack < qp->sq_next) {
    for (uint64_t s = qp->sq_ack; s < qp->sq_next; s++)
      emu_swr_at(qp, s)->result = s == qp->sq_ack ? AGOQ_IBV_WC_RETRY_EXC_ERR : AGOQ_IBV_WC_WR_FLUSH_ERR;
    qp->sq_exec = qp->sq_next;
    emit(qp);
  }
  if (qp->st != AGOQ_IBV_QPS_ERR) emu_qp_set_err(qp);
  flush_sq(qp);
}

static void port_down(emu_ctx* ctx, int port) {
  if (ctx->port_state[port] != AGOQ_IBV_PORT_ACTIVE) return;
  ctx->port_state[port] = AGOQ_IBV_PORT_DOWN;
  emu_async_push(ctx, AGOQ_IBV_EVENT_PORT_ERR, NULL, port);
  for (emu_qp* q = ctx->qps; q; q = q->next)
    if (q->port == port && (q->st == AGOQ_IBV_QPS_RTS || q->st == AGOQ_IBV_QPS_RTR)) port_fail_qp(q);
}

/* Appends the next segment of the WRITE/SEND being streamed on c (c->tx_seq), gathering
 * its bytes from the SGEs (or the inline copy) now. 0, or the WC status of a local error
 * (an MR deregistered under a message in flight). */
static int append_segment(emu_qp* qp, emu_conn* c, emu_swr* e) {
  uint32_t off = c->tx_off, n = e->len - off < SEG_MAX ? e->len - off : SEG_MAX;
  emu_hdr h;
  memset(&h, 0, sizeof h);
  h.type = e->opcode == AGOQ_IBV_WR_SEND ? F_SEND : F_WRITE;
  h.len = n;
  h.seq = e->seq;
  h.raddr = e->raddr;
  h.off = off;
  h.rkey = e->rkey;
  h.imm = e->imm;
  h.rlen = e->len;
  h.flags = (e->opcode == AGOQ_IBV_WR_RDMA_WRITE_WITH_IMM ? HF_IMM : 0) | (off + n == e->len ? HF_LAST : 0);
  buf_reserve(&c->out, sizeof h + n);
  uint8_t* p = c->out.p + c->out.len;
  memcpy(p, &h, sizeof h);
  if (e->is_inline) {
    if (n) memcpy(p + sizeof h, e->inl + off, n);
  } else {
    int rc = sge_xfer(qp->ctx, qp->ibv.pd, e->sge, e->nsge, off, p + sizeof h, n, 0);
    if (rc) return rc == AGOQ_IBV_WC_LOC_LEN_ERR ? AGOQ_IBV_WC_LOC_PROT_ERR : rc;
  }
  c->out.len += sizeof h + n;
  c->tx_off = off + n;
  if (h.flags & HF_LAST) c->tx_active = 0;
  return 0;
}

/* Local checks of one WR (IB spec 10.6.3.3 and ibv_post_send(3): an lkey that is not an MR
 * of the QP's PD, a range outside the MR, or an RDMA READ into memory without LOCAL_WRITE
 * is a local protection error).
 * Returns 0 and appends the request (a WRITE/SEND: its first segment), or the WC status. */
static int transmit(emu_qp* qp, emu_swr* e) {
  emu_ctx* ctx = qp->ctx;
  unsigned need = e->opcode == AGOQ_IBV_WR_RDMA_READ ? AGOQ_IBV_ACCESS_LOCAL_WRITE : 0;
  if (!e->is_inline)
    for (int i = 0; i < e->nsge; i++) {
      uint8_t* ptr = NULL;
      if (e->sge[i].length &&
          !emu_mr_check(ctx, qp->ibv.pd, e->sge[i].lkey, 0, e->sge[i].addr, e->sge[i].length, need, &ptr))
        return AGOQ_IBV_WC_LOC_PROT_ERR;
    }
  emu_conn* c = qp->conn;
  if (e->opcode == AGOQ_IBV_WR_RDMA_READ) {
    emu_hdr h;
    memset(&h, 0, sizeof h);
    h.type = F_READ_REQ;
    h.seq = e->seq;
    h.raddr = e->raddr;
    h.rkey = e->rkey;
    h.rlen = e->len;
    e->rd_off = 0;
    send_frame(c, &h, NULL, 0);
    return 0;
  }
  c->tx_active = 1;
  c->tx_seq = e->seq;
  c->tx_off = 0;
  int rc = append_segment(qp, c, e);
  if (rc) c->tx_active = 0;
  return rc;
}

static void req_progress(emu_ctx* ctx, emu_qp* qp, int64_t now, int64_t* next) {
  if (qp->conn) qp->conn->want_more = 0;
  int st = qp->st;
  if (st == AGOQ_IBV_QPS_ERR) {
    flush_sq(qp);
    return;
  }
  if (st != AGOQ_IBV_QPS_RTS) return;
  if (ctx->port_state[qp->port] != AGOQ_IBV_PORT_ACTIVE) {
    port_fail_qp(qp);
    return;
  }
  emit(qp);
  if (qp->st == AGOQ_IBV_QPS_ERR) {
    flush_sq(qp);
    return;
  }
  if (qp->sq_ack == qp->sq_next) { /* idle */
    qp->reach_deadline = 0;
    qp->ack_deadline = 0;
    return;
  }
  int64_t to = emu_qp_timeout_ns(qp);
  if (!qp->conn || qp->conn->state != EMU_CS_OPEN) {
    if (!qp->conn && !qp->peer_lost && now >= qp->next_connect) try_connect(ctx, qp, now);
    if (!qp->reach_deadline && to) qp->reach_deadline = now + to;
    if (qp->reach_deadline && now >= qp->reach_deadline) {
      fail_timeout(qp);
      emit(qp);
      flush_sq(qp);
      return;
    }
    if (qp->reach_deadline && qp->reach_deadline < *next) *next = qp->reach_deadline;
    if (!qp->conn && !qp->peer_lost && qp->next_connect < *next) *next = qp->next_connect;
    return;
  }
  emu_conn* c = qp->conn;
  while (!qp->tx_halt && (c->tx_active || qp->sq_exec < qp->sq_next) && now >= qp->rnr_until) {
    if (out_full(c)) { /* the main loop calls again as the stream drains */
      c->want_more = 1;
      break;
    }
    if (c->tx_active) { /* the next segment of the message on the wire */
      emu_swr* e = emu_swr_at(qp, c->tx_seq);
      int rc = append_segment(qp, c, e);
      if (rc) { /* its CQE carries the error, in order; the QP then goes to ERR */
        e->result = rc;
        c->tx_active = 0;
        qp->tx_halt = 1;
        break;
      }
      if (!qp->ack_deadline && to) qp->ack_deadline = now + to;
      continue;
    }
    emu_swr* e = emu_swr_at(qp, qp->sq_exec);
    int rc = e->forced ? e->forced : transmit(qp, e);
    qp->sq_exec++;
    if (rc) { /* completes in order, then the QP goes to ERR */
      e->result = rc;
      qp->tx_halt = 1;
      break;
    }
    e->transmitted = 1;
    if (!qp->ack_deadline && to) qp->ack_deadline = now + to;
  }
  if (!qp->tx_halt && qp->sq_exec < qp->sq_next && qp->rnr_until > now && qp->rnr_until < *next)
    *next = qp->rnr_until;
  emit(qp);
  if (qp->st == AGOQ_IBV_QPS_ERR) {
    flush_sq(qp);
    return;
  }
  int outstanding = 0;
  for (uint64_t s = qp->sq_ack; s < qp->sq_exec && !outstanding; s++)
    outstanding = emu_swr_at(qp, s)->transmitted && emu_swr_at(qp, s)->result < 0;
  if (!outstanding) {
    qp->ack_deadline = 0;
  } else if (qp->ack_deadline && now >= qp->ack_deadline) {
    fail_timeout(qp);
    emit(qp);
    flush_sq(qp);
  } else if (qp->ack_deadline && qp->ack_deadline < *next) {
    *next = qp->ack_deadline;
  }
}

/* One frame from the responder. -1: a malformed one (the stream is then dropped). */
static int req_frame(emu_ctx* ctx, emu_conn* c, const emu_hdr* h, const uint8_t* payload, int64_t now) {
  emu_qp* qp = emu_qp_find(ctx, c->qpn);
  if (!qp || qp->conn != c || qp->st != AGOQ_IBV_QPS_RTS) return 0;
  int64_t to = emu_qp_timeout_ns(qp);
  if (h->type == F_HELLO_OK) {
    c->state = EMU_CS_OPEN;
    qp->reach_deadline = 0;
    return 0;
  }
  if (h->type == F_HELLO_NAK) { /* not (yet) reachable: try again until the timeout */
    conn_drop(ctx, c);
    return 0;
  }
  if (c->state != EMU_CS_OPEN) return -1; /* an answer before the hello was accepted */
  if (h->seq < qp->sq_ack || h->seq >= qp->sq_exec) return 0; /* stale: of a WR already answered */
  emu_swr* e = emu_swr_at(qp, h->seq);
  if (!e->transmitted || e->result >= 0) return 0;
  if (h->type == F_READ_RESP &&
      (e->opcode != AGOQ_IBV_WR_RDMA_READ || h->rlen != e->len || h->off != e->rd_off))
    return -1; /* not the response, or not the next segment of the response, of this WR */
  if (to) qp->ack_deadline = now + to; /* the peer is alive: restart the ACK timer */
  if (h->type == F_ACK) {
    e->result = 0;
    qp->rnr_count = 0;
  } else if (h->type == F_READ_RESP) { /* one segment, placed at its offset */
    int rc = sge_xfer(ctx, qp->ibv.pd, e->sge, e->nsge, h->off, (uint8_t*)payload, h->len, 1);
    e->rd_off += h->len;
    qp->rnr_count = 0;
    if (rc) {
      e->result = AGOQ_IBV_WC_LOC_PROT_ERR; /* later segments of it are ignored */
      e->byte_len = h->rlen;
    } else if (h->flags & HF_LAST) {
      e->result = 0;
      e->byte_len = h->rlen;
    }
  } else if (h->type == F_NAK) {
    int fail = 1;
    /* go-back-N: a message being streamed from the NAKed WR on stops here; its segments
     * already queued are dropped by the responder, which waits for the NAKed seq again */
    if (c->tx_active && c->tx_seq >= h->seq) c->tx_active = 0;
    if (h->status == NAK_RNR) {
      qp->rnr_count++;
      if (qp->rnr_retry == 7 || qp->rnr_count <= qp->rnr_retry) { /* 7: retry forever (IB spec 9.7.5.2.8) */
        fail = 0;
        for (uint64_t s = h->seq; s < qp->sq_exec; s++) emu_swr_at(qp, s)->transmitted = 0;
        qp->sq_exec = h->seq;
        qp->rnr_until = now + rnr_ns(ctx, h->timer);
      }
    }
    if (fail) {
      e->result = h->status == NAK_RNR ? AGOQ_IBV_WC_RNR_RETRY_EXC_ERR : (int)h->status;
      for (uint64_t s = h->seq + 1; s < qp->sq_exec; s++) emu_swr_at(qp, s)->transmitted = 0;
      qp->sq_exec = h->seq + 1;
      qp->tx_halt = 1;
    }
  }
  /* F_PROGRESS: a non-last segment was placed; the timer restart above is all it does */
  return 0;
}

/* ---- responder --------------------------------------------------------------------------- */

static int gid_match(const emu_port_cfg* p, const uint8_t* gid, int want_type) {
  static const uint8_t zero[16];
  if (!memcmp(gid, zero, 16)) return 0;
  for (int i = 0; i < p->ngid; i++)
    if (!memcmp(p->gids[i].gid.raw, gid, 16) && (want_type < 0 || p->gids[i].type == want_type)) return 1;
  return 0;
}

static void resp_hello(emu_ctx* ctx, emu_conn* c, const emu_hdr* h, const uint8_t* payload) {
  emu_hello hl;
  memset(&hl, 0, sizeof hl);
  memcpy(&hl, payload, h->len < sizeof hl ? h->len : sizeof hl);
  emu_qp* qp = h->type == F_HELLO ? emu_qp_find(ctx, hl.dest_qpn) : NULL;
  /* accepted only by a QP ready to receive (RTR/RTS) whose peer is this requester */
  int ok = qp && (qp->st == AGOQ_IBV_QPS_RTR || qp->st == AGOQ_IBV_QPS_RTS) &&
           qp->dest_qpn == hl.src_qpn && ctx->port_state[qp->port] == AGOQ_IBV_PORT_ACTIVE;
  if (ok) {
    const emu_port_cfg* p = qp_port(qp);
    if (p->link == AGOQ_IBV_LINK_LAYER_ETHERNET) /* RoCE: routed by GID, v1 and v2 do not interoperate */
      ok = hl.is_global && gid_match(p, hl.dgid, (int)hl.sgid_type) && qp->ah.is_global &&
           p->gids[qp->ah.grh.sgid_index].type == (int)hl.sgid_type;
    else if (hl.is_global)
      ok = gid_match(p, hl.dgid, -1);
    else
      ok = hl.dlid == p->lid;
  }
  emu_hdr r;
  memset(&r, 0, sizeof r);
  r.type = ok ? F_HELLO_OK : F_HELLO_NAK;
  send_frame(c, &r, NULL, 0);
  if (ok) {
    c->state = EMU_CS_OPEN;
    c->qpn = hl.dest_qpn;
    c->peer_qpn = hl.src_qpn;
    c->peer_lid = (uint16_t)hl.slid;
  }
}

static void nak(emu_conn* c, uint64_t seq, uint32_t status, unsigned timer) {
  emu_hdr r;
  memset(&r, 0, sizeof r);
  r.type = F_NAK;
  r.seq = seq;
  r.status = status;
  r.timer = timer;
  send_frame(c, &r, NULL, 0);
}

static void resp_error(emu_qp* qp, emu_conn* c, uint64_t seq, uint32_t status, int event) {
  nak(c, seq, status, 0);
  emu_async_push(qp->ctx, event, &qp->ibv, 0);
  emu_qp_set_err(qp);
}

static void recv_cqe(emu_qp* qp, emu_conn* c, const emu_rwr* r, int status, int opcode, uint32_t len, int imm,
                     uint32_t imm_data) {
  emu_cqe e;
  memset(&e, 0, sizeof e);
  e.wc.wr_id = r->wr_id;
  e.wc.status = status;
  e.wc.vendor_err = emu_vendor_err(status);
  e.wc.opcode = opcode;
  e.wc.byte_len = len;
  e.wc.imm_data = imm ? imm_data : 0;
  e.wc.wc_flags = imm ? AGOQ_IBV_WC_WITH_IMM : 0;
  e.wc.qp_num = qp->ibv.qp_num;
  e.wc.src_qp = c->peer_qpn;
  e.wc.slid = c->peer_lid;
  emu_cq_push(qp->ctx, (emu_cq*)qp->ibv.recv_cq, &e);
}

static void consume_rwr(emu_qp* qp, emu_rwr* out) {
  *out = qp->rq[qp->rq_head];
  qp->rq_head = (qp->rq_head + 1) % qp->rq_cap;
  qp->rq_count--;
}

static void progress(emu_conn* c, uint64_t seq) {
  emu_hdr r;
  memset(&r, 0, sizeof r);
  r.type = F_PROGRESS;
  r.seq = seq;
  send_frame(c, &r, NULL, 0);
}

/* One segment of a WRITE (with or without immediate) or a SEND. */
static void resp_data(emu_ctx* ctx, emu_conn* c, emu_qp* qp, const emu_hdr* h, const uint8_t* payload) {
  int first = h->off == 0, last = !!(h->flags & HF_LAST), imm = !!(h->flags & HF_IMM), send = h->type == F_SEND;
  if (first) {
    if (c->rx_active) { /* a new message before the last one ended */
      conn_drop(ctx, c);
      return;
    }
  } else {
    /* the rest of a message NAKed at its first segment: dropped, as its first one was */
    if (!c->rx_active || c->rx_seq != h->seq) return;
    if (h->off != c->rx_off || h->rlen != c->rx_total || h->type != c->rx_type ||
        (h->flags & HF_IMM) != (c->rx_flags & HF_IMM)) { /* not the next segment of it */
      conn_drop(ctx, c);
      return;
    }
  }
  if (!send) {
    uint8_t* mem = NULL;
    /* IB spec 9.7.4.1.3 / 10.6.3 (R_Key checks): the rkey names an MR of the QP's PD, the
     * range lies inside it, and both the MR and the QP allow the access; a zero-length
     * RDMA operation checks no key. Else NAK "remote access error". Each segment's range
     * is checked as it arrives, as each packet is on hardware. */
    if (!(qp->access & AGOQ_IBV_ACCESS_REMOTE_WRITE) ||
        (h->len && !emu_mr_check(ctx, qp->ibv.pd, h->rkey, 1, h->raddr + h->off, h->len,
                                 AGOQ_IBV_ACCESS_REMOTE_WRITE, &mem))) {
      c->rx_active = 0;
      resp_error(qp, c, h->seq, AGOQ_IBV_WC_REM_ACCESS_ERR, AGOQ_IBV_EVENT_QP_ACCESS_ERR);
      return;
    }
    if (first && imm && qp->rq_count == 0) { /* no receive WR: RNR NAK, the data is dropped */
      nak(c, h->seq, NAK_RNR, qp->min_rnr_timer);
      return;
    }
    if (h->len) memcpy(mem, payload, h->len);
  } else {
    if (first && qp->rq_count == 0) {
      nak(c, h->seq, NAK_RNR, qp->min_rnr_timer);
      return;
    }
    if (qp->rq_count == 0) { /* its receive WR vanished under it: cannot happen in RTR/RTS */
      conn_drop(ctx, c);
      return;
    }
    emu_rwr* rw = &qp->rq[qp->rq_head]; /* placed into the head receive WR, consumed at the end */
    int st = 0;
    if (first) {
      uint64_t room = 0;
      for (int i = 0; i < rw->nsge; i++) room += rw->sge[i].length;
      if (room < h->rlen) st = AGOQ_IBV_WC_LOC_LEN_ERR;
    }
    if (!st) st = sge_xfer(ctx, qp->ibv.pd, rw->sge, rw->nsge, h->off, (uint8_t*)payload, h->len, 1);
    if (st) { /* the requester sees an invalid request (too long) or a remote operation error */
      emu_rwr done;
      consume_rwr(qp, &done);
      c->rx_active = 0;
      recv_cqe(qp, c, &done, st, AGOQ_IBV_WC_RECV, h->rlen, 0, 0);
      nak(c, h->seq, st == AGOQ_IBV_WC_LOC_LEN_ERR ? AGOQ_IBV_WC_REM_INV_REQ_ERR : AGOQ_IBV_WC_REM_OP_ERR, 0);
      emu_qp_set_err(qp);
      return;
    }
  }
  if (!last) { /* placed; the progress frame restarts the requester's ACK timer */
    c->rx_active = 1;
    c->rx_seq = h->seq;
    c->rx_type = h->type;
    c->rx_flags = h->flags;
    c->rx_total = h->rlen;
    c->rx_off = (uint32_t)(h->off + h->len);
    progress(c, h->seq);
    return;
  }
  c->rx_active = 0;
  if (imm || send) {
    if (qp->rq_count == 0) { /* cannot happen: checked at the first segment, only we consume */
      nak(c, h->seq, NAK_RNR, qp->min_rnr_timer);
      return;
    }
    emu_rwr done;
    consume_rwr(qp, &done);
    recv_cqe(qp, c, &done, AGOQ_IBV_WC_SUCCESS, send ? AGOQ_IBV_WC_RECV : AGOQ_IBV_WC_RECV_RDMA_WITH_IMM, h->rlen, imm,
             h->imm);
  }
  if (!send) { /* dead@n counts whole incoming writes */
    pthread_mutex_lock(&emu_g.lock);
    if (emu_g.f_dead_n && ++emu_g.incoming_writes >= emu_g.f_dead_n) emu_g.dead = 1;
    pthread_mutex_unlock(&emu_g.lock);
  }
  emu_hdr r;
  memset(&r, 0, sizeof r);
  r.type = F_ACK;
  r.seq = h->seq;
  send_frame(c, &r, NULL, 0);
  c->expect_seq = h->seq + 1;
}

static int nic_dead(void) {
  pthread_mutex_lock(&emu_g.lock);
  int dead = emu_g.dead;
  pthread_mutex_unlock(&emu_g.lock);
  return dead;
}

/* The responder QP of an open stream when it answers at all: a dead NIC, a destroyed QP
 * or one outside RTR/RTS answers nothing. */
static emu_qp* resp_qp(emu_ctx* ctx, emu_conn* c) {
  if (nic_dead()) return NULL;
  emu_qp* qp = emu_qp_find(ctx, c->qpn);
  if (!qp || (qp->st != AGOQ_IBV_QPS_RTR && qp->st != AGOQ_IBV_QPS_RTS)) return NULL;
  return qp;
}

/* Appends the next segment of the READ response being streamed on c, reading the MR now. */
static void resp_read_segment(emu_ctx* ctx, emu_conn* c) {
  emu_qp* qp = resp_qp(ctx, c);
  if (!qp) { /* stops answering mid-response: the requester times out */
    c->rd_active = 0;
    return;
  }
  uint32_t off = c->rd_off, n = c->rd_total - off < SEG_MAX ? c->rd_total - off : SEG_MAX;
  uint8_t* mem = NULL;
  if (n && !emu_mr_check(ctx, qp->ibv.pd, c->rd_rkey, 1, c->rd_raddr + off, n, AGOQ_IBV_ACCESS_REMOTE_READ, &mem)) {
    c->rd_active = 0; /* the MR went away under the response */
    resp_error(qp, c, c->rd_seq, AGOQ_IBV_WC_REM_ACCESS_ERR, AGOQ_IBV_EVENT_QP_ACCESS_ERR);
    return;
  }
  emu_hdr r;
  memset(&r, 0, sizeof r);
  r.type = F_READ_RESP;
  r.seq = c->rd_seq;
  r.off = off;
  r.rlen = c->rd_total;
  if (off + n == c->rd_total) {
    r.flags = HF_LAST;
    c->rd_active = 0;
  }
  send_frame(c, &r, mem, n);
  c->rd_off = off + n;
}

static void resp_frame(emu_ctx* ctx, emu_conn* c, const emu_hdr* h, const uint8_t* payload) {
  if (c->state == EMU_CS_HELLO) {
    resp_hello(ctx, c, h, payload);
    return;
  }
  emu_qp* qp = resp_qp(ctx, c);
  if (!qp) return;
  if (c->expect_seq != SEQ_UNSET && h->seq != c->expect_seq) return; /* go-back-N: wait for the retry */
  c->expect_seq = h->seq;
  if (h->type == F_WRITE || h->type == F_SEND) {
    resp_data(ctx, c, qp, h, payload);
    return;
  }
  /* F_READ_REQ: checked whole here (IB spec 9.7.4.1.3, see resp_data), then answered in
   * segments by resp_read_segment; the stream's later requests wait until it is queued */
  uint8_t* mem = NULL;
  if (!(qp->access & AGOQ_IBV_ACCESS_REMOTE_READ) ||
      (h->rlen && !emu_mr_check(ctx, qp->ibv.pd, h->rkey, 1, h->raddr, h->rlen, AGOQ_IBV_ACCESS_REMOTE_READ, &mem))) {
    resp_error(qp, c, h->seq, AGOQ_IBV_WC_REM_ACCESS_ERR, AGOQ_IBV_EVENT_QP_ACCESS_ERR);
    return;
  }
  c->rd_active = 1;
  c->rd_seq = h->seq;
  c->rd_raddr = h->raddr;
  c->rd_rkey = h->rkey;
  c->rd_total = h->rlen;
  c->rd_off = 0;
  c->expect_seq = h->seq + 1;
}

/* ---- the thread --------------------------------------------------------------------------- */

static void conn_eof(emu_ctx* ctx, emu_conn* c, int64_t now) {
  if (c->role == EMU_CONN_REQ) {
    emu_qp* qp = emu_qp_find(ctx, c->qpn);
    if (qp && qp->conn == c) qp->peer_lost = 1; /* never answers again: retry exceeded at the timeout */
    (void)now;
  }
  conn_drop(ctx, c);
}

/* Whether a frame header is well formed for the stream's role and state: a known type
 * with a sane length; a segment inside its message, at most SEG_MAX bytes, flagged "last"
 * exactly when it ends the message, empty only then. */
static int frame_ok(const emu_conn* c, const emu_hdr* h) {
  if (c->role == EMU_CONN_RESP) {
    if (c->state == EMU_CS_HELLO) return h->len <= HELLO_MAX; /* resp_hello refuses anything but a hello */
    if (h->type == F_READ_REQ) return h->len == 0 && h->rlen <= MSG_MAX && !h->flags;
    if (h->type != F_WRITE && h->type != F_SEND) return 0;
    if (h->flags & ~(uint32_t)(HF_IMM | HF_LAST) || (h->type == F_SEND && (h->flags & HF_IMM))) return 0;
  } else {
    switch (h->type) {
      case F_HELLO_OK:
      case F_HELLO_NAK:
      case F_ACK:
      case F_PROGRESS:
        return h->len == 0;
      case F_NAK:
        return h->len == 0 && (h->status == NAK_RNR || h->status == AGOQ_IBV_WC_REM_ACCESS_ERR ||
                               h->status == AGOQ_IBV_WC_REM_INV_REQ_ERR || h->status == AGOQ_IBV_WC_REM_OP_ERR);
      case F_READ_RESP:
        if (h->flags & ~(uint32_t)HF_LAST) return 0;
        break;
      default:
        return 0;
    }
  }
  if (h->len > SEG_MAX || h->rlen > MSG_MAX || h->off > h->rlen || h->rlen - h->off < h->len) return 0;
  int ends = h->off + h->len == h->rlen;
  return ends == !!(h->flags & HF_LAST) && (ends || h->len > 0);
}

/* What a stream can do without reading: stream the READ response in progress while out
 * has room, and handle the complete frames buffered in c->in (which wait while a READ
 * response is being queued: requests are answered in order). A malformed frame drops
 * the stream. */
static void conn_process(emu_ctx* ctx, emu_conn* c, int64_t now) {
  if (c->role == EMU_CONN_RESP) c->want_more = 0;
  while (!c->closing) {
    if (c->rd_active) {
      if (out_full(c)) {
        c->want_more = 1;
        return;
      }
      resp_read_segment(ctx, c);
      bool moved; /* on its way at once: the requester's timer restarts as bytes come */
      if (!c->closing && flush_out(c, &moved)) return; /* the main loop sees the broken stream */
      continue;
    }
    if (pending(&c->in) < sizeof(emu_hdr)) return;
    emu_hdr h;
    memcpy(&h, c->in.p + c->in.off, sizeof h);
    if (!frame_ok(c, &h)) {
      conn_eof(ctx, c, now);
      return;
    }
    if (pending(&c->in) - sizeof h < h.len) return;
    const uint8_t* payload = c->in.p + c->in.off + sizeof h;
    int bad = 0;
    if (c->role == EMU_CONN_REQ)
      bad = req_frame(ctx, c, &h, payload, now) < 0;
    else
      resp_frame(ctx, c, &h, payload);
    c->in.off += sizeof h + h.len;
    if (bad) {
      conn_eof(ctx, c, now);
      return;
    }
  }
}

/* Reads in chunks, handling complete frames as they come, so c->in holds at most about
 * one segment; stops after READ_BUDGET bytes (poll says when more are there) and while a
 * READ response is being queued. The clock is read again per chunk (the ACK timer
 * restarts from when a segment came, not from when the read began), and a responder
 * sends its progress frames as it goes. */
static void conn_read(emu_ctx* ctx, emu_conn* c, int64_t now) {
  int eof = 0;
  size_t budget = READ_BUDGET;
  conn_process(ctx, c, now);
  while (!c->closing && !c->rd_active && budget) {
    buf_reserve(&c->in, READ_CHUNK);
    size_t room = c->in.cap - c->in.len < READ_CHUNK ? c->in.cap - c->in.len : READ_CHUNK;
    ssize_t n = recv(c->fd, c->in.p + c->in.len, room, MSG_DONTWAIT);
    if (n > 0) {
      c->in.len += (size_t)n;
      budget = budget > (size_t)n ? budget - (size_t)n : 0;
      now = emu_now_ns();
      if (c->state == EMU_CS_OPEN) restart_ack(ctx, c, now);
      conn_process(ctx, c, now);
      bool moved;
      if (c->role == EMU_CONN_RESP && !c->closing && flush_out(c, &moved)) break; /* the main loop sees it */
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) eof = 1;
    break;
  }
  if (eof && !c->closing) conn_eof(ctx, c, now);
}

void* emu_nic_main(void* arg) {
  emu_ctx* ctx = arg;
  struct pollfd* pfd = NULL;
  emu_conn** pconn = NULL;
  size_t pcap = 0;
  pthread_mutex_lock(&ctx->lock);
  while (!ctx->stop) {
    int64_t now = emu_now_ns();
    int64_t next = now + 200000000;
    for (emu_qp* q = ctx->qps; q; q = q->next) req_progress(ctx, q, now, &next);
    for (emu_conn* c = ctx->conns; c; c = c->next)
      if (!c->closing && c->role == EMU_CONN_RESP) conn_process(ctx, c, now);
    reap(ctx);
    now = emu_now_ns(); /* what the flushes below restart timers from */
    size_t n = 2;
    for (emu_conn* c = ctx->conns; c; c = c->next) n++;
    if (n > pcap) {
      pcap = n * 2;
      struct pollfd* np = realloc(pfd, pcap * sizeof *pfd);
      emu_conn** nc = np ? realloc(pconn, pcap * sizeof *pconn) : NULL;
      if (!np || !nc) {
        fprintf(stderr, "agoq-ibv-emu: out of memory\n");
        abort();
      }
      pfd = np;
      pconn = nc;
    }
    pfd[0] = (struct pollfd){.fd = ctx->wake_fd, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
    n = 2;
    int busy = 0;
    for (emu_conn* c = ctx->conns; c; c = c->next) {
      bool moved;
      if (flush_out(c, &moved)) {
        conn_eof(ctx, c, now);
        continue;
      }
      if (moved) restart_ack(ctx, c, now);
      /* a message or READ response being streamed continues as soon as out has room */
      if (c->want_more && !out_full(c)) busy = 1;
      /* while a READ response is being queued, later requests wait in the socket */
      short ev = (short)((c->rd_active ? 0 : POLLIN) | (c->out.off < c->out.len ? POLLOUT : 0));
      pconn[n] = c;
      pfd[n++] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int64_t wait = busy ? 0 : next - now;
    if (wait < 0) wait = 0;
    struct timespec ts = {.tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000};
    pthread_mutex_unlock(&ctx->lock);
    int rc = ppoll(pfd, n, &ts, NULL);
    pthread_mutex_lock(&ctx->lock);
    if (rc <= 0) continue;
    now = emu_now_ns();
    if (pfd[0].revents) {
      uint64_t v;
      ssize_t r = read(ctx->wake_fd, &v, sizeof v);
      (void)r;
    }
    if (pfd[1].revents & POLLIN) {
      for (;;) {
        int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        conn_new(ctx, fd, EMU_CONN_RESP);
      }
    }
    for (size_t i = 2; i < n; i++)
      if (!pconn[i]->closing && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) conn_read(ctx, pconn[i], now);
  }
  pthread_mutex_unlock(&ctx->lock);
  free(pfd);
  free(pconn);
  return NULL;
}
