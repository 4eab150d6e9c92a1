/* The data path: isend/irecv post requests, test() drives the control socket and reports
 * completion, progress threads move the payload. Message order on a connection is the
 * posting order; each message is a header on the control socket followed by its payload,
 * inline on the control socket when small, else in pieces on the data sockets. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "agoq_frame.h"
#include "core/agoq_check.h"
#include "net/agoq_comm.h"

/* Bytes test() may move per data socket while the caller polls: enough to be worth the
 * syscall, small enough that NCCL's proxy gets back to its other connections quickly. */
#define AGOQ_ASSIST_BUDGET (512u << 10)

static agoq_comm* agoq_comm_from(void* p, uint32_t magic) {
  agoq_comm* comm = p;
  return (comm != NULL && comm->magic == magic) ? comm : NULL;
}

/* Records a comm failure; the first one is logged by whoever detects it. */
static ncclResult_t agoq_comm_fail(agoq_comm* comm, ncclResult_t res) {
  agoq_comm_error_set(&comm->error, res);
  return (ncclResult_t)atomic_load(&comm->error);
}

static bool agoq_would_block(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

/* ---- memory registration ------------------------------------------------------------ */

ncclResult_t agoq_net_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  agoq_comm* c = comm;
  if (c == NULL || (c->magic != AGOQ_SEND_MAGIC && c->magic != AGOQ_RECV_MAGIC) || mhandle == NULL) {
    AGOQ_WARN("regMr: invalid comm %p", comm);
    return ncclInternalError;
  }
  if (type != NCCL_PTR_HOST) {
    /* We advertise host memory only; NCCL's user-buffer registration probes device
     * memory and falls back to its own staging buffers when we refuse. */
    AGOQ_INFO(NCCL_NET | NCCL_REG, "regMr: memory type %d not supported (host memory only)", type);
    return ncclInternalError;
  }
  agoq_mr* mr = calloc(1, sizeof *mr);
  if (mr == NULL) return ncclSystemError;
  *mr = (agoq_mr){.magic = AGOQ_MR_MAGIC, .type = type, .addr = data, .size = size};
  *mhandle = mr;
  return ncclSuccess;
}

ncclResult_t agoq_net_reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                    void** mhandle) {
  (void)offset;
  (void)fd;
  if (type == NCCL_PTR_HOST) return agoq_net_reg_mr(comm, data, size, type, mhandle);
  AGOQ_INFO(NCCL_NET | NCCL_REG, "regMrDmaBuf: DMA-BUF is not supported by the TCP transport");
  return ncclInternalError;
}

ncclResult_t agoq_net_dereg_mr(void* comm, void* mhandle) {
  (void)comm;
  agoq_mr* mr = mhandle;
  if (mr == NULL) return ncclSuccess;
  if (mr->magic != AGOQ_MR_MAGIC) {
    AGOQ_WARN("deregMr: invalid handle %p", mhandle);
    return ncclInternalError;
  }
  mr->magic = 0;
  free(mr);
  return ncclSuccess;
}

/* Where buffer `slot` of a request travels from or lands: NCCL's buffer, or the staging
 * buffer holding its frame (typed p2p). */
static uint8_t* agoq_req_bytes(agoq_comm* comm, const agoq_request* req, int slot) {
  return req->stage[slot] >= 0 ? agoq_stage_ptr(&comm->stage, req->stage[slot]) : req->data[slot];
}

/* ---- send side ------------------------------------------------------------------------ */

/* Most requests whose header and inline bytes one sendmsg carries: a burst of small
 * messages costs one syscall, not one each. */
#define AGOQ_SEND_BATCH 16

/* Writes pending headers (and inline payloads) in posting order until the socket is full,
 * gathering the control bytes of up to AGOQ_SEND_BATCH queued requests per sendmsg. */
static ncclResult_t agoq_send_progress(agoq_comm* comm) {
  while (comm->ctrl_fifo.count > 0) {
    struct iovec iov[2 * AGOQ_SEND_BATCH];
    int niov = 0;
    uint32_t nreq = comm->ctrl_fifo.count < AGOQ_SEND_BATCH ? comm->ctrl_fifo.count : AGOQ_SEND_BATCH;
    for (uint32_t i = 0; i < nreq; i++) {
      agoq_request* req = comm->ctrl_fifo.items[(comm->ctrl_fifo.head + i) % AGOQ_REQUESTS_PER_COMM];
      if (req->ctrl_sent < AGOQ_MSG_HDR_SIZE)
        iov[niov++] = (struct iovec){req->wire_hdr + req->ctrl_sent, AGOQ_MSG_HDR_SIZE - req->ctrl_sent};
      size_t body_done = req->ctrl_sent > AGOQ_MSG_HDR_SIZE ? req->ctrl_sent - AGOQ_MSG_HDR_SIZE : 0;
      size_t body_total = req->ctrl_total - AGOQ_MSG_HDR_SIZE;
      if (body_done < body_total)
        iov[niov++] = (struct iovec){agoq_req_bytes(comm, req, 0) + body_done, body_total - body_done};
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(comm->ctrl_fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && agoq_would_block()) return ncclSuccess;
    if (n <= 0) {
      ncclResult_t res = (n < 0 && errno != EPIPE && errno != ECONNRESET) ? ncclSystemError : ncclRemoteError;
      if (agoq_comm_error_set(&comm->error, res))
        AGOQ_WARN("send to %s failed: %s", comm->peer, n < 0 ? strerror(errno) : "connection closed");
      return res;
    }
    /* Hand the written bytes to the requests in order; the ones fully written are done
     * with the control socket. */
    size_t left = (size_t)n;
    agoq_request* req;
    while (left > 0 && (req = agoq_fifo_front(&comm->ctrl_fifo)) != NULL) {
      size_t take = req->ctrl_total - req->ctrl_sent < left ? req->ctrl_total - req->ctrl_sent : left;
      req->ctrl_sent += take;
      left -= take;
      if (req->ctrl_sent < req->ctrl_total) break;
      req->control_done = true;
      agoq_fifo_pop(&comm->ctrl_fifo);
    }
  }
  return ncclSuccess;
}

ncclResult_t agoq_net_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                            void** request) {
  (void)mhandle;
  agoq_comm* comm = agoq_comm_from(send_comm, AGOQ_SEND_MAGIC);
  if (comm == NULL || request == NULL || (data == NULL && size > 0)) {
    AGOQ_WARN("isend: invalid arguments (comm %p, data %p, size %zu)", send_comm, data, size);
    return ncclInternalError;
  }
  *request = NULL;
  ncclResult_t err = (ncclResult_t)atomic_load(&comm->error);
  if (err != ncclSuccess) return err;
  agoq_request* req = agoq_request_alloc(&comm->pool, AGOQ_REQ_SEND, comm);
  if (req == NULL) return ncclSuccess; /* all requests busy: NCCL retries */

  /* A p2p float payload whose type the profiler chain established travels as a frame
   * (agoq_typed.h); everything else exactly as NCCL handed it over. */
  size_t wire_size = size;
  agoq_exact_reason why = AGOQ_EXACT_UNKNOWN; /* no profiler handle: no datatype */
  uint64_t codec0 = comm->typed_stats.codec_ns, crc0 = agoq_frame_crc_ns();
  if (phandle == NULL || !agoq_typed_encode(&comm->stage, &comm->typed_stats, comm->prof_fn, phandle, data, size,
                                            &req->stage[0], &wire_size, &why)) {
    comm->typed_stats.exact_msgs++;
    comm->typed_stats.exact_bytes += size;
    agoq_stats_exact(comm->st, why);
  }
  if (comm->st != NULL) {
    int path = req->stage[0] >= 0 ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT;
    req->quantized = path == AGOQ_STATS_QUANT;
    req->post_ns = agoq_stats_clock_ns();
    agoq_stats_count(comm->st, path, size);
    agoq_stats_wire(comm->st, path, size, wire_size);
    agoq_stats_add(&comm->st->path[path].codec_ns, comm->typed_stats.codec_ns - codec0);
    agoq_stats_add(&comm->st->path[path].crc_ns, agoq_frame_crc_ns() - crc0);
  }
  agoq_msg_hdr hdr;
  agoq_msg_plan(wire_size, comm->inline_max, comm->min_chunk, comm->nsocks, &hdr);
  if (req->stage[0] >= 0) hdr.flags |= AGOQ_MSG_FLAG_FRAME;
  hdr.tag = tag;
  hdr.seq = comm->seq++;
  if (hdr.nchunks > 0) {
    hdr.first_sock = (uint16_t)comm->next_sock;
    comm->next_sock = (comm->next_sock + hdr.nchunks) % comm->nsocks;
  }
  agoq_msg_hdr_encode(&hdr, req->wire_hdr);
  req->n = 1;
  req->data[0] = data;
  req->posted[0] = req->actual[0] = size;
  req->tags[0] = tag;
  req->ctrl_total = AGOQ_MSG_HDR_SIZE + ((hdr.flags & AGOQ_MSG_FLAG_INLINE) ? wire_size : 0);
  /* Payload pieces go to the progress threads right away; the receiver reads them in the
   * same per-socket order once it has matched the header. */
  atomic_store(&req->pending_pieces, hdr.nchunks);
  for (unsigned k = 0; k < hdr.nchunks; k++) {
    uint64_t off = (uint64_t)k * hdr.chunk;
    uint64_t len = wire_size - off < hdr.chunk ? wire_size - off : hdr.chunk;
    if (!agoq_stream_post(&comm->streams[(hdr.first_sock + k) % comm->nsocks], agoq_req_bytes(comm, req, 0) + off, len, req)) {
      AGOQ_WARN("isend: data socket queue overflow (internal limit exceeded)");
      return agoq_comm_fail(comm, ncclInternalError);
    }
  }
  agoq_fifo_push(&comm->ctrl_fifo, req); /* cannot fail: the fifo holds every request of the pool */
  *request = req;
  /* Start the header right away; a failure found here is reported by test(), like one
   * found later, so the caller sees the same outcome whatever the timing. */
  (void)agoq_send_progress(comm);
  return ncclSuccess;
}

/* ---- receive side --------------------------------------------------------------------- */

/* Reads from the control socket into up to two ranges (a payload's destination, then the
 * read-ahead buffer); returns bytes read, 0 on would-block, -1 on failure (comm error set
 * and logged). */
static ssize_t agoq_ctrl_readv(agoq_comm* comm, struct iovec* iov, int niov) {
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
  ssize_t n;
  do n = recvmsg(comm->ctrl_fd, &msg, MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n > 0) return n;
  if (n < 0 && agoq_would_block()) return 0;
  ncclResult_t res = n == 0 ? ncclRemoteError : ncclSystemError;
  if (agoq_comm_error_set(&comm->error, res))
    AGOQ_WARN("receive from %s failed: %s", comm->peer, n == 0 ? "connection closed by peer" : strerror(errno));
  return -1;
}

static ncclResult_t agoq_recv_protocol_error(agoq_comm* comm, ncclResult_t res, const char* what) {
  if (agoq_comm_error_set(&comm->error, res)) AGOQ_WARN("connection from %s: %s", comm->peer, what);
  return (ncclResult_t)atomic_load(&comm->error);
}

static bool agoq_recv_all_matched(const agoq_request* req) {
  return req->matched_mask == (req->n == 32 ? UINT32_MAX : (1u << req->n) - 1);
}

/* Matches one decoded header to the oldest receive and hands its payload out. */
static ncclResult_t agoq_recv_dispatch(agoq_comm* comm, agoq_request* req, const agoq_msg_hdr* hdr) {
  char what[192];
  int slot = -1;
  if (req->n == 1) {
    slot = 0; /* a single receive takes any tag, as NCCL's socket transport does */
  } else {
    for (int i = 0; i < req->n && slot < 0; i++)
      if (!(req->matched_mask & (1u << i)) && req->tags[i] == hdr->tag) slot = i;
    if (slot < 0) {
      snprintf(what, sizeof what, "message with tag %d matches no buffer of the posted grouped receive", hdr->tag);
      return agoq_recv_protocol_error(comm, ncclInvalidUsage, what);
    }
  }
  if (hdr->size > req->posted[slot]) {
    snprintf(what, sizeof what, "message truncated: peer sent %llu bytes, receive posted for %zu",
             (unsigned long long)hdr->size, req->posted[slot]);
    return agoq_recv_protocol_error(comm, ncclInvalidUsage, what);
  }
  if (hdr->flags & AGOQ_MSG_FLAG_FRAME) {
    /* Staged, decoded at completion. A frame is never larger than the bytes it stands
     * for, so the posted size bounds the staging buffer too. */
    if (hdr->size < AGOQ_FRAME_HEADER_SIZE)
      return agoq_recv_protocol_error(comm, ncclSystemError, "frame shorter than a frame header");
    int idx = agoq_stage_get(&comm->stage, hdr->size);
    if (idx < 0) return agoq_recv_protocol_error(comm, ncclSystemError, "out of memory staging a frame");
    req->stage[slot] = idx;
  } else {
    comm->typed_stats.exact_msgs++;
    comm->typed_stats.exact_bytes += hdr->size;
    agoq_stats_count(comm->st, AGOQ_STATS_EXACT, hdr->size);
    agoq_stats_wire(comm->st, AGOQ_STATS_EXACT, hdr->size, hdr->size);
  }
  req->actual[slot] = hdr->size;
  req->matched_mask |= 1u << slot;
  if (hdr->flags & AGOQ_MSG_FLAG_INLINE) {
    if (hdr->size > 0) {
      comm->rx_inline_req = req;
      comm->rx_inline_slot = slot;
      comm->rx_inline_got = 0;
    }
  } else {
    atomic_fetch_add(&req->pending_pieces, hdr->nchunks);
    for (unsigned k = 0; k < hdr->nchunks; k++) {
      uint64_t off = (uint64_t)k * hdr->chunk;
      uint64_t len = hdr->size - off < hdr->chunk ? hdr->size - off : hdr->chunk;
      if (!agoq_stream_post(&comm->streams[(hdr->first_sock + k) % comm->nsocks], agoq_req_bytes(comm, req, slot) + off,
                            len, req))
        return agoq_recv_protocol_error(comm, ncclInternalError, "data socket queue overflow");
    }
  }
  if (agoq_recv_all_matched(req)) agoq_fifo_pop(&comm->ctrl_fifo);
  return ncclSuccess;
}

/* An inline payload smaller than this is read into the read-ahead buffer and copied out
 * (one recv for many small messages); a larger one goes straight to its destination. */
#define AGOQ_RX_DIRECT_MIN (16u << 10)

/* Moves the current inline payload's bytes: first what the read-ahead buffer holds, then
 * from the socket, straight into the destination when large, with the read-ahead buffer
 * behind it in the same recvmsg so the next headers come along. Returns 1 when the
 * payload is complete, 0 when the socket ran dry, -1 on failure. */
static int agoq_recv_inline(agoq_comm* comm) {
  agoq_request* inl = comm->rx_inline_req;
  int slot = comm->rx_inline_slot;
  uint8_t* dst = agoq_req_bytes(comm, inl, slot);
  size_t total = inl->actual[slot];
  while (comm->rx_inline_got < total) {
    size_t want = total - comm->rx_inline_got;
    size_t avail = comm->rx_len - comm->rx_off;
    if (avail > 0) {
      size_t take = avail < want ? avail : want;
      memcpy(dst + comm->rx_inline_got, comm->rx_buf + comm->rx_off, take);
      comm->rx_off += take;
      comm->rx_inline_got += take;
      continue;
    }
    comm->rx_off = comm->rx_len = 0;
    struct iovec iov[2];
    int niov = 0;
    if (want >= AGOQ_RX_DIRECT_MIN) iov[niov++] = (struct iovec){dst + comm->rx_inline_got, want};
    iov[niov++] = (struct iovec){comm->rx_buf, AGOQ_RX_BUF_SIZE};
    ssize_t n = agoq_ctrl_readv(comm, iov, niov);
    if (n <= 0) return (int)n;
    if (niov == 2) {
      size_t direct = (size_t)n < want ? (size_t)n : want;
      comm->rx_inline_got += direct;
      comm->rx_len = (size_t)n - direct;
    } else {
      comm->rx_len = (size_t)n;
    }
  }
  comm->rx_inline_req = NULL;
  return 1;
}

/* Reads headers and inline payloads for posted receives until the socket runs dry. Bytes
 * are taken from the socket only while a receive is posted (a peer cannot make us buffer
 * more than the read-ahead buffer), and only as far as the buffer reaches. */
static ncclResult_t agoq_recv_progress(agoq_comm* comm) {
  for (;;) {
    if (comm->rx_inline_req != NULL) {
      int rc = agoq_recv_inline(comm);
      if (rc < 0) return (ncclResult_t)atomic_load(&comm->error);
      if (rc == 0) return ncclSuccess;
      continue;
    }
    agoq_request* req = agoq_fifo_front(&comm->ctrl_fifo);
    if (req == NULL) return ncclSuccess; /* nothing posted: leave the bytes in the socket */
    if (comm->rx_len - comm->rx_off < AGOQ_MSG_HDR_SIZE) {
      /* Keep the partial header, make room behind it, read what the socket has. */
      size_t keep = comm->rx_len - comm->rx_off;
      memmove(comm->rx_buf, comm->rx_buf + comm->rx_off, keep);
      comm->rx_off = 0;
      comm->rx_len = keep;
      struct iovec iov = {comm->rx_buf + keep, AGOQ_RX_BUF_SIZE - keep};
      ssize_t n = agoq_ctrl_readv(comm, &iov, 1);
      if (n < 0) return (ncclResult_t)atomic_load(&comm->error);
      if (n == 0) return ncclSuccess;
      comm->rx_len += (size_t)n;
      continue;
    }
    agoq_msg_hdr hdr;
    agoq_wire_status ws = agoq_msg_hdr_decode(comm->rx_buf + comm->rx_off, AGOQ_MSG_HDR_SIZE, comm->nsocks, &hdr);
    comm->rx_off += AGOQ_MSG_HDR_SIZE;
    if (ws != AGOQ_WIRE_OK) return agoq_recv_protocol_error(comm, ncclSystemError, "corrupt message header");
    if (hdr.seq != comm->seq) return agoq_recv_protocol_error(comm, ncclSystemError, "message out of sequence");
    comm->seq++;
    AGOQ_CHECK(agoq_recv_dispatch(comm, req, &hdr));
  }
}

ncclResult_t agoq_net_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                            void** phandles, void** request) {
  (void)mhandles;
  (void)phandles;
  agoq_comm* comm = agoq_comm_from(recv_comm, AGOQ_RECV_MAGIC);
  if (comm == NULL || request == NULL || n < 1 || n > AGOQ_NET_MAX_RECVS || data == NULL || sizes == NULL) {
    AGOQ_WARN("irecv: invalid arguments (comm %p, n %d)", recv_comm, n);
    return ncclInternalError;
  }
  /* NCCL may preset *request to NCCL_NET_OPTIONAL_RECV_COMPLETION for LL/LL128; we always
   * report real completion, which the contract allows. */
  *request = NULL;
  ncclResult_t err = (ncclResult_t)atomic_load(&comm->error);
  if (err != ncclSuccess) return err;
  for (int i = 0; i < n; i++) {
    if (data[i] == NULL && sizes[i] > 0) {
      AGOQ_WARN("irecv: NULL buffer %d with size %zu", i, sizes[i]);
      return ncclInternalError;
    }
  }
  agoq_request* req = agoq_request_alloc(&comm->pool, AGOQ_REQ_RECV, comm);
  if (req == NULL) return ncclSuccess;
  req->n = n;
  for (int i = 0; i < n; i++) {
    req->data[i] = data[i];
    req->posted[i] = sizes[i];
    req->tags[i] = tags != NULL ? tags[i] : 0;
  }
  if (comm->st != NULL) req->post_ns = agoq_stats_clock_ns();
  agoq_fifo_push(&comm->ctrl_fifo, req);
  *request = req;
  (void)agoq_recv_progress(comm); /* errors surface in test(), whatever the timing */
  return ncclSuccess;
}

ncclResult_t agoq_net_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)recv_comm;
  (void)n;
  (void)data;
  (void)sizes;
  (void)mhandles;
  (void)request;
  /* Only needed after GPUDirect receives into device memory, which a host-memory
   * transport never does; NCCL does not call it for us. */
  AGOQ_WARN("iflush called, but the TCP transport receives into host memory only");
  return ncclInternalError;
}

/* ---- completion ------------------------------------------------------------------------ */

static int agoq_size_to_int(size_t size) { return size > INT_MAX ? INT_MAX : (int)size; }

ncclResult_t agoq_net_test(void* request, int* done, int* sizes) {
  agoq_request* req = request;
  if (req == NULL || done == NULL || req->magic != AGOQ_REQUEST_MAGIC || req->comm == NULL) {
    AGOQ_WARN("test: invalid request %p", request);
    return ncclInternalError;
  }
  agoq_comm* comm = req->comm;
  *done = 0;
  ncclResult_t progress = comm->is_send ? agoq_send_progress(comm) : agoq_recv_progress(comm);
  if (atomic_load_explicit(&req->pending_pieces, memory_order_acquire) != 0) {
    /* Rather than spin while the progress threads work, help them (few-core hosts). */
    for (unsigned i = 0; i < comm->nsocks; i++) agoq_stream_assist(&comm->streams[i], AGOQ_ASSIST_BUDGET);
  }
  bool finished = atomic_load_explicit(&req->pending_pieces, memory_order_acquire) == 0 &&
                  (comm->is_send ? req->control_done
                                 : agoq_recv_all_matched(req) && comm->rx_inline_req != req);
  if (finished) {
    for (int i = 0; i < req->n; i++) {
      if (req->stage[i] < 0) continue;
      if (comm->is_send) {
        agoq_stage_put(&comm->stage, req->stage[i]);
        req->stage[i] = -1;
        continue;
      }
      size_t decoded = 0;
      uint64_t codec0 = comm->typed_stats.codec_ns, crc0 = agoq_frame_crc_ns();
      ncclResult_t res = agoq_typed_decode(&comm->typed_stats, agoq_stage_ptr(&comm->stage, req->stage[i]),
                                           req->actual[i], req->data[i], req->posted[i], &decoded, comm->peer);
      if (res == ncclSuccess && comm->st != NULL) {
        req->quantized = true;
        agoq_stats_count(comm->st, AGOQ_STATS_QUANT, decoded);
        agoq_stats_wire(comm->st, AGOQ_STATS_QUANT, decoded, req->actual[i]);
        agoq_stats_add(&comm->st->path[AGOQ_STATS_QUANT].codec_ns, comm->typed_stats.codec_ns - codec0);
        agoq_stats_add(&comm->st->path[AGOQ_STATS_QUANT].crc_ns, agoq_frame_crc_ns() - crc0);
      }
      agoq_stage_put(&comm->stage, req->stage[i]);
      req->stage[i] = -1;
      if (res != ncclSuccess) {
        /* Nothing of a rejected frame reached NCCL's buffer; the connection is unusable. */
        agoq_comm_fail(comm, res);
        comm->error_reported = true;
        return res;
      }
      req->actual[i] = decoded;
    }
    if (sizes != NULL)
      for (int i = 0; i < req->n; i++) sizes[i] = agoq_size_to_int(req->actual[i]);
    if (comm->st != NULL)
      agoq_stats_add(&comm->st->path[req->quantized ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT].wire_ns,
                     (uint64_t)(agoq_stats_clock_ns() - req->post_ns));
    agoq_request_release(&comm->pool, req);
    *done = 1;
    return ncclSuccess;
  }
  ncclResult_t err = (ncclResult_t)atomic_load(&comm->error);
  if (err == ncclSuccess) err = progress;
  if (err != ncclSuccess && !comm->error_reported) {
    comm->error_reported = true;
    AGOQ_WARN("%s with %s failed (error %d); pending requests on this connection fail",
              comm->is_send ? "send" : "receive", comm->peer, err);
  }
  return err;
}

/* ---- close ----------------------------------------------------------------------------- */

static ncclResult_t agoq_comm_close(void* p, uint32_t magic, const char* what) {
  if (p == NULL) return ncclSuccess;
  agoq_comm* comm = agoq_comm_from(p, magic);
  if (comm == NULL) {
    AGOQ_WARN("%s: invalid comm %p", what, p);
    return ncclInternalError;
  }
  uint32_t busy = agoq_request_in_use(&comm->pool);
  if (busy > 0) AGOQ_INFO(NCCL_NET, "%s with %u requests in flight to %s", what, busy, comm->peer);
  /* Detaching the streams first guarantees no progress thread still writes into the
   * buffers of the abandoned requests. */
  agoq_comm_destroy(comm);
  return ncclSuccess;
}

ncclResult_t agoq_net_close_send(void* send_comm) { return agoq_comm_close(send_comm, AGOQ_SEND_MAGIC, "closeSend"); }
ncclResult_t agoq_net_close_recv(void* recv_comm) { return agoq_comm_close(recv_comm, AGOQ_RECV_MAGIC, "closeRecv"); }
