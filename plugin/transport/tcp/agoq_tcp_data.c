/* The TCP data path. Each message is a header on the control socket followed by its
 * payload: inline on the control socket, moved by the caller's thread (NCCL's proxy, in
 * isend/irecv/test) with no hand-off, when it is at most AGOQ_SOCKET_INLINE bytes; else in
 * pieces on the data sockets, moved by the progress threads with the caller assisting.
 * Message order on a connection is the posting order. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "core/agoq_check.h"
#include "transport/tcp/agoq_tcp.h"

/* Bytes the caller's thread may move per data socket while it polls: enough to be worth
 * the syscall, small enough that NCCL's proxy gets back to its other connections quickly. */
#define AGOQ_ASSIST_BUDGET (512u << 10)
/* Most transfers whose header and inline bytes one sendmsg carries: a burst of small
 * messages costs one syscall, not one each. */
#define AGOQ_SEND_BATCH 16
/* Bytes one progress call (isend, irecv, test, the CollNet engine's turn) moves on a
 * control socket before it returns, whatever remains: the caller (NCCL's proxy) serves other
 * connections between calls, and on loopback one call could otherwise move a whole 256 MiB
 * message. NCCL's own steps are 128 KiB-4 MiB, so they still move in one call. */
#define AGOQ_CALL_BUDGET (4u << 20)
/* An inline payload smaller than this is read into the read-ahead buffer and copied out
 * (one recv for many small messages); a larger one goes straight to its destination. */
#define AGOQ_RX_DIRECT_MIN (16u << 10)
/* Read-ahead behind a payload read straight into its destination, and for the header after
 * such a payload: enough for the next header and a few small messages in the same recv,
 * little enough that a large next payload mostly goes straight to its place too. Measured
 * on loopback (2 vCPUs, 8 in flight): 4 KiB gives 2 MiB messages 7.2-7.6 GB/s; 32 B (the
 * header alone) 5.0-5.3; 64 KiB the same rate as 4 KiB but 128 KiB messages copy half their
 * bytes through the buffer. */
#define AGOQ_RX_AHEAD_LARGE (4u << 10)

static bool agoq_would_block(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

static agoq_tcp_xfer* agoq_xs(agoq_tp_conn* c, const agoq_xfer* x) { return &c->xs[x->index]; }

static ncclResult_t agoq_tcp_conn_fail(agoq_tp_conn* c, ncclResult_t res) {
  agoq_comm_error_set(&c->error, res);
  return (ncclResult_t)atomic_load(&c->error);
}

/* ---- send side ------------------------------------------------------------------------ */

/* Writes pending headers (and inline payloads) in posting order until the socket is full,
 * gathering the control bytes of up to AGOQ_SEND_BATCH queued transfers per sendmsg. */
static ncclResult_t agoq_send_progress(agoq_tp_conn* c) {
  size_t moved = 0;
  while (c->ctrl_fifo.count > 0 && moved < AGOQ_CALL_BUDGET) {
    struct iovec iov[2 * AGOQ_SEND_BATCH];
    int niov = 0;
    /* One sendmsg is handed no more payload than the call's budget: the kernel takes what
     * fits in the socket anyway, and a tool checking the whole iovec (valgrind reads every
     * byte of it) would otherwise scan a 1 GiB message per syscall. */
    size_t room = AGOQ_CALL_BUDGET - moved;
    for (uint32_t i = 0; i < AGOQ_SEND_BATCH && i < c->ctrl_fifo.count && room > 0; i++) {
      agoq_xfer* x = agoq_fifo_at(&c->ctrl_fifo, i);
      agoq_tcp_xfer* t = agoq_xs(c, x);
      if (t->ctrl_sent < AGOQ_MSG_HDR_SIZE)
        iov[niov++] = (struct iovec){t->wire_hdr + t->ctrl_sent, AGOQ_MSG_HDR_SIZE - t->ctrl_sent};
      size_t body_done = t->ctrl_sent > AGOQ_MSG_HDR_SIZE ? t->ctrl_sent - AGOQ_MSG_HDR_SIZE : 0;
      size_t body_left = t->ctrl_total - AGOQ_MSG_HDR_SIZE - body_done;
      if (body_left > room) body_left = room;
      if (body_left > 0) iov[niov++] = (struct iovec){x->data[0] + body_done, body_left};
      room -= body_left;
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(c->ctrl_fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && agoq_would_block()) return ncclSuccess;
    if (n <= 0) {
      ncclResult_t res = (n < 0 && errno != EPIPE && errno != ECONNRESET) ? ncclSystemError : ncclRemoteError;
      if (agoq_comm_error_set(&c->error, res))
        AGOQ_WARN("send to %s failed: %s", c->peer, n < 0 ? strerror(errno) : "connection closed");
      return (ncclResult_t)atomic_load(&c->error);
    }
    moved += (size_t)n;
    /* Hand the written bytes to the transfers in order; the ones fully written are done
     * with the control socket. */
    size_t left = (size_t)n;
    agoq_xfer* x;
    while (left > 0 && (x = agoq_fifo_at(&c->ctrl_fifo, 0)) != NULL) {
      agoq_tcp_xfer* t = agoq_xs(c, x);
      size_t take = t->ctrl_total - t->ctrl_sent < left ? t->ctrl_total - t->ctrl_sent : left;
      t->ctrl_sent += take;
      left -= take;
      if (t->ctrl_sent < t->ctrl_total) break;
      t->control_done = true;
      agoq_fifo_pop(&c->ctrl_fifo);
    }
  }
  return ncclSuccess;
}

ncclResult_t agoq_tcp_post_send(agoq_tp_conn* c, agoq_xfer* x) {
  ncclResult_t err = (ncclResult_t)atomic_load(&c->error);
  if (err != ncclSuccess) return err;
  agoq_tcp_xfer* t = agoq_xs(c, x);
  size_t size = x->size[0];
  agoq_msg_hdr hdr;
  agoq_msg_plan(size, c->inline_max, c->min_chunk, c->nsocks, &hdr);
  if (x->flags & AGOQ_XFER_FRAME) hdr.flags |= AGOQ_MSG_FLAG_FRAME;
  hdr.tag = x->tag;
  hdr.seq = c->seq++;
  if (hdr.nchunks > 0) {
    hdr.first_sock = (uint16_t)c->next_sock;
    c->next_sock = (c->next_sock + hdr.nchunks) % c->nsocks;
  }
  agoq_msg_hdr_encode(&hdr, t->wire_hdr);
  t->ctrl_sent = 0;
  t->control_done = false;
  t->ctrl_total = AGOQ_MSG_HDR_SIZE + ((hdr.flags & AGOQ_MSG_FLAG_INLINE) ? size : 0);
  /* Payload pieces go to the progress threads right away; the receiver reads them in the
   * same per-socket order once it has matched the header. */
  atomic_store(&t->pending_pieces, hdr.nchunks);
  for (unsigned k = 0; k < hdr.nchunks; k++) {
    uint64_t off = (uint64_t)k * hdr.chunk;
    uint64_t len = size - off < hdr.chunk ? size - off : hdr.chunk;
    if (!agoq_stream_post(&c->streams[(hdr.first_sock + k) % c->nsocks], x->data[0] + off, len, &t->pending_pieces)) {
      AGOQ_WARN("isend: data socket queue overflow (internal limit exceeded)");
      return agoq_tcp_conn_fail(c, ncclInternalError);
    }
  }
  agoq_fifo_push(&c->ctrl_fifo, x); /* cannot fail: the fifo holds every postable transfer */
  /* Start the header (and an inline payload) right away; a failure found here is
   * reported by the next progress, like one found later, so the caller sees the same
   * outcome whatever the timing. */
  (void)agoq_send_progress(c);
  return ncclSuccess;
}

/* ---- receive side --------------------------------------------------------------------- */

/* Reads from the control socket into up to two ranges (a payload's destination, then the
 * read-ahead buffer); returns bytes read, 0 on would-block, -1 on failure (error set and
 * logged). */
static ssize_t agoq_ctrl_readv(agoq_tp_conn* c, struct iovec* iov, int niov) {
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
  ssize_t n;
  do n = recvmsg(c->ctrl_fd, &msg, MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n > 0) {
    c->rx_moved += (size_t)n;
    return n;
  }
  if (n < 0 && agoq_would_block()) return 0;
  ncclResult_t res = n == 0 ? ncclRemoteError : ncclSystemError;
  if (agoq_comm_error_set(&c->error, res))
    AGOQ_WARN("receive from %s failed: %s", c->peer, n == 0 ? "connection closed by peer" : strerror(errno));
  return -1;
}

static ncclResult_t agoq_recv_protocol_error(agoq_tp_conn* c, ncclResult_t res, const char* what) {
  if (agoq_comm_error_set(&c->error, res)) AGOQ_WARN("connection from %s: %s", c->peer, what);
  return (ncclResult_t)atomic_load(&c->error);
}

static bool agoq_recv_all_matched(const agoq_xfer* x) {
  return x->matched_mask == (x->n == 32 ? UINT32_MAX : (1u << x->n) - 1);
}

/* Matches one decoded header to the oldest receive (the net core picks the buffer and
 * where the bytes go) and hands its payload out. */
static ncclResult_t agoq_recv_dispatch(agoq_tp_conn* c, agoq_xfer* x, const agoq_msg_hdr* hdr) {
  int slot = -1;
  uint8_t* dst = NULL;
  uint32_t flags = (hdr->flags & AGOQ_MSG_FLAG_FRAME) ? AGOQ_XFER_FRAME : 0;
  ncclResult_t res = c->match(c->match_arg, x, hdr->tag, hdr->size, flags, &slot, &dst);
  if (res != ncclSuccess) return agoq_tcp_conn_fail(c, res); /* the net core said why */
  x->size[slot] = hdr->size;
  x->matched_mask |= 1u << slot;
  agoq_tcp_xfer* t = agoq_xs(c, x);
  if (hdr->flags & AGOQ_MSG_FLAG_INLINE) {
    if (hdr->size > 0) {
      c->rx_inline = x;
      c->rx_inline_slot = slot;
      c->rx_inline_dst = dst;
      c->rx_inline_got = 0;
    }
  } else {
    atomic_fetch_add(&t->pending_pieces, hdr->nchunks);
    for (unsigned k = 0; k < hdr->nchunks; k++) {
      uint64_t off = (uint64_t)k * hdr->chunk;
      uint64_t len = hdr->size - off < hdr->chunk ? hdr->size - off : hdr->chunk;
      if (!agoq_stream_post(&c->streams[(hdr->first_sock + k) % c->nsocks], dst + off, len, &t->pending_pieces))
        return agoq_recv_protocol_error(c, ncclInternalError, "data socket queue overflow");
    }
  }
  if (agoq_recv_all_matched(x)) agoq_fifo_pop(&c->ctrl_fifo);
  return ncclSuccess;
}

/* Moves the current inline payload's bytes: first what the read-ahead buffer holds, then
 * from the socket, straight into the destination when large, with AGOQ_RX_AHEAD_LARGE of
 * read-ahead behind it in the same recvmsg (the next header comes along). Returns 1 when
 * the payload is complete, 0 when the socket ran dry or the call's budget is spent, -1 on
 * failure. */
static int agoq_recv_inline(agoq_tp_conn* c) {
  size_t total = c->rx_inline->size[c->rx_inline_slot];
  uint8_t* dst = c->rx_inline_dst;
  while (c->rx_inline_got < total) {
    size_t want = total - c->rx_inline_got;
    size_t avail = c->rx_len - c->rx_off;
    if (avail > 0) {
      size_t take = avail < want ? avail : want;
      memcpy(dst + c->rx_inline_got, c->rx_buf + c->rx_off, take);
      c->rx_off += take;
      c->rx_inline_got += take;
      continue;
    }
    if (c->rx_moved >= AGOQ_CALL_BUDGET) return 0; /* the rest in a later call */
    c->rx_off = c->rx_len = 0;
    struct iovec iov[2];
    int niov = 0;
    bool direct = want >= AGOQ_RX_DIRECT_MIN;
    if (want > AGOQ_CALL_BUDGET) want = AGOQ_CALL_BUDGET; /* one recvmsg, as one sendmsg */
    if (direct) iov[niov++] = (struct iovec){dst + c->rx_inline_got, want};
    iov[niov++] = (struct iovec){c->rx_buf, direct ? AGOQ_RX_AHEAD_LARGE : AGOQ_RX_BUF_SIZE};
    ssize_t n = agoq_ctrl_readv(c, iov, niov);
    if (n <= 0) return (int)n;
    if (direct) {
      size_t placed = (size_t)n < want ? (size_t)n : want;
      c->rx_inline_got += placed;
      c->rx_len = (size_t)n - placed;
    } else {
      c->rx_len = (size_t)n;
    }
  }
  c->rx_inline = NULL;
  return 1;
}

/* Reads headers and inline payloads for posted receives until the socket runs dry. Bytes
 * are taken from the socket only while a receive is posted, and never more than the
 * read-ahead buffer holds beyond the payload being read: a peer cannot make us buffer
 * more. */
static ncclResult_t agoq_recv_progress(agoq_tp_conn* c) {
  c->rx_moved = 0;
  for (;;) {
    if (c->rx_inline != NULL) {
      int rc = agoq_recv_inline(c);
      if (rc < 0) return (ncclResult_t)atomic_load(&c->error);
      if (rc == 0) return ncclSuccess;
      continue;
    }
    agoq_xfer* x = agoq_fifo_at(&c->ctrl_fifo, 0);
    if (x == NULL) return ncclSuccess; /* nothing posted: leave the bytes in the socket */
    if (c->rx_len - c->rx_off < AGOQ_MSG_HDR_SIZE) {
      /* Keep the partial header, make room behind it, read what the socket has: after a
       * large message little beyond the header (the next payload is likely large too and
       * should go straight to its destination, not through this buffer), else as much as
       * fits (a burst of small messages in one recv). */
      if (c->rx_moved >= AGOQ_CALL_BUDGET) return ncclSuccess; /* the rest in a later call */
      size_t keep = c->rx_len - c->rx_off;
      memmove(c->rx_buf, c->rx_buf + c->rx_off, keep);
      c->rx_off = 0;
      c->rx_len = keep;
      struct iovec iov = {c->rx_buf + keep, (c->rx_last_large ? AGOQ_RX_AHEAD_LARGE : AGOQ_RX_BUF_SIZE) - keep};
      ssize_t n = agoq_ctrl_readv(c, &iov, 1);
      if (n < 0) return (ncclResult_t)atomic_load(&c->error);
      if (n == 0) return ncclSuccess;
      c->rx_len += (size_t)n;
      continue;
    }
    agoq_msg_hdr hdr;
    agoq_wire_status ws = agoq_msg_hdr_decode(c->rx_buf + c->rx_off, AGOQ_MSG_HDR_SIZE, c->nsocks, &hdr);
    c->rx_off += AGOQ_MSG_HDR_SIZE;
    if (ws != AGOQ_WIRE_OK) return agoq_recv_protocol_error(c, ncclSystemError, "corrupt message header");
    if (hdr.seq != c->seq) return agoq_recv_protocol_error(c, ncclSystemError, "message out of sequence");
    c->seq++;
    c->rx_last_large = hdr.size >= AGOQ_RX_DIRECT_MIN;
    AGOQ_CHECK(agoq_recv_dispatch(c, x, &hdr));
  }
}

ncclResult_t agoq_tcp_post_recv(agoq_tp_conn* c, agoq_xfer* x) {
  ncclResult_t err = (ncclResult_t)atomic_load(&c->error);
  if (err != ncclSuccess) return err;
  if (c->match == NULL) {
    AGOQ_WARN("irecv: no match function set on the connection from %s", c->peer);
    return ncclInternalError;
  }
  agoq_tcp_xfer* t = agoq_xs(c, x);
  atomic_store(&t->pending_pieces, 0);
  x->matched_mask = 0;
  agoq_fifo_push(&c->ctrl_fifo, x);
  (void)agoq_recv_progress(c); /* errors surface in the next progress, whatever the timing */
  return ncclSuccess;
}

/* ---- progress and completion ------------------------------------------------------------ */

ncclResult_t agoq_tcp_progress(agoq_tp_conn* c, agoq_xfer* x) {
  ncclResult_t res = c->is_send ? agoq_send_progress(c) : agoq_recv_progress(c);
  if (x != NULL && atomic_load_explicit(&agoq_xs(c, x)->pending_pieces, memory_order_acquire) != 0) {
    /* Rather than spin while the progress threads work, help them (few-core hosts). */
    for (unsigned i = 0; i < c->nsocks; i++) agoq_stream_assist(&c->streams[i], AGOQ_ASSIST_BUDGET);
  }
  ncclResult_t err = (ncclResult_t)atomic_load(&c->error);
  return err != ncclSuccess ? err : res;
}

bool agoq_tcp_done(agoq_tp_conn* c, const agoq_xfer* x) {
  const agoq_tcp_xfer* t = &c->xs[x->index];
  if (atomic_load_explicit(&t->pending_pieces, memory_order_acquire) != 0) return false;
  return c->is_send ? t->control_done : agoq_recv_all_matched(x) && c->rx_inline != x;
}

int agoq_tcp_wait_fds(agoq_tp_conn* c, struct pollfd* out, int max, bool* hidden) {
  int n = 0;
  /* Pieces on the data sockets are the progress threads' to move; the caller only learns
   * of them by testing again. */
  for (unsigned i = 0; i < c->nsocks && !*hidden; i++)
    *hidden = atomic_load_explicit(&c->streams[i].head, memory_order_relaxed) !=
              atomic_load_explicit(&c->streams[i].tail, memory_order_acquire);
  bool waiting = c->is_send ? c->ctrl_fifo.count > 0 : c->ctrl_fifo.count > 0 || c->rx_inline != NULL;
  if (waiting && n < max) out[n++] = (struct pollfd){.fd = c->ctrl_fd, .events = c->is_send ? POLLOUT : POLLIN};
  return n;
}

ncclResult_t agoq_tcp_exchange(agoq_tp_conn* c, const void* out, size_t out_len, void* in, size_t in_len,
                               bool* done) {
  *done = false;
  while (c->xchg_sent < out_len) {
    ssize_t n = send(c->ctrl_fd, (const uint8_t*)out + c->xchg_sent, out_len - c->xchg_sent,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c->xchg_sent += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      break;
    } else {
      AGOQ_INFO(NCCL_NET, "bootstrap with %s: %s", c->peer, n < 0 ? strerror(errno) : "connection closed");
      return ncclRemoteError;
    }
  }
  while (c->xchg_got < in_len) {
    ssize_t n = recv(c->ctrl_fd, (uint8_t*)in + c->xchg_got, in_len - c->xchg_got, MSG_DONTWAIT);
    if (n > 0) {
      c->xchg_got += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      break;
    } else {
      AGOQ_INFO(NCCL_NET, "bootstrap with %s: %s", c->peer, n < 0 ? strerror(errno) : "the peer closed it");
      return ncclRemoteError;
    }
  }
  if (c->xchg_sent < out_len || c->xchg_got < in_len) return ncclSuccess;
  c->xchg_sent = c->xchg_got = 0;
  *done = true;
  return ncclSuccess;
}
