/* The verbs data path (the protocol is described in agoq_ib.h): RTS and CTS through the
 * rings, payloads by RDMA WRITE striped over the queue pairs, completions polled on the
 * caller's thread. Nothing here blocks. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/agoq_check.h"
#include "transport/ib/agoq_ib.h"

#define AGOQ_IB_POLL_BATCH 16
#define AGOQ_IB_POLL_ROUNDS 8
/* Progress calls between looks at the bootstrap connection (one recv each). */
#define AGOQ_IB_LIVENESS_EVERY 64
/* After the peer's end of the bootstrap closed, completions already on their way still
 * count for this long; transfers in flight after it fail. */
#define AGOQ_IB_PEER_GONE_GRACE_MS 1000

static agoq_ib_conn* agoq_ib_conn_of(agoq_tp_conn* c) { return (agoq_ib_conn*)c; }

void agoq_ib_conn_fail(agoq_ib_conn* c, ncclResult_t res) {
  int expected = ncclSuccess;
  atomic_compare_exchange_strong(&c->error, &expected, (int)res);
}

/* Stripes of a payload: both sides compute them from the size alone. */
static uint32_t agoq_ib_stripes(uint64_t size, int nqps) {
  uint64_t n = size / AGOQ_IB_STRIPE_MIN;
  if (n < 1) n = 1;
  return (uint32_t)(n < (uint64_t)nqps ? n : (uint64_t)nqps);
}

static bool agoq_ib_in_flight(const agoq_ib_conn* c) { return c->fifo_count > 0 || c->busy_slots > 0; }

static ncclResult_t agoq_ib_write(agoq_ib_conn* c, int qp, uint64_t wr_id, const void* local, uint32_t lkey,
                                  size_t len, uint64_t raddr, uint32_t rkey, bool with_imm, uint32_t imm) {
  struct agoq_ibv_sge sge = {.addr = (uint64_t)(uintptr_t)local, .length = (uint32_t)len, .lkey = lkey};
  struct agoq_ibv_send_wr wr = {
      .wr_id = wr_id,
      .sg_list = len > 0 ? &sge : NULL,
      .num_sge = len > 0 ? 1 : 0,
      .opcode = with_imm ? AGOQ_IBV_WR_RDMA_WRITE_WITH_IMM : AGOQ_IBV_WR_RDMA_WRITE,
      .send_flags = AGOQ_IBV_SEND_SIGNALED,
      .imm_data = htonl(imm),
  };
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  struct agoq_ibv_send_wr* bad = NULL;
  int rc = agoq_ibv_post_send(c->qps[qp], &wr, &bad);
  if (rc == 0) return ncclSuccess;
  AGOQ_WARN("%s: ibv_post_send to %s on queue pair %u failed: %s (errno %d)", c->d->describe, c->peer,
            c->qps[qp]->qp_num, strerror(rc), rc);
  agoq_ib_conn_fail(c, ncclSystemError);
  return ncclSystemError;
}

static void agoq_ib_fifo_push(agoq_ib_conn* c, agoq_xfer* x) {
  c->fifo[(c->fifo_head + c->fifo_count) % AGOQ_XFER_MAX_POSTED] = x;
  c->fifo_count++;
}
static agoq_xfer* agoq_ib_fifo_front(const agoq_ib_conn* c) {
  return c->fifo_count > 0 ? c->fifo[c->fifo_head] : NULL;
}
static void agoq_ib_fifo_pop(agoq_ib_conn* c) {
  c->fifo_head = (c->fifo_head + 1) % AGOQ_XFER_MAX_POSTED;
  c->fifo_count--;
}

/* ---- sender ------------------------------------------------------------------------- */

/* Writes the RTS of queued sends, in order, while their ring slots are free. */
static ncclResult_t agoq_ib_send_issue(agoq_ib_conn* c) {
  for (agoq_xfer* x; (x = agoq_ib_fifo_front(c)) != NULL;) {
    uint32_t seq = c->send_seq;
    uint32_t slot = seq % c->nslots;
    agoq_ib_send_slot* s = &c->sends[slot];
    if (s->x != NULL) return ncclSuccess; /* the message nslots earlier is not done */
    agoq_ib_fifo_pop(c);
    c->send_seq++;
    uint64_t size = x->size[0];
    /* GPU memory goes by RDMA whatever its size: the CPU cannot copy it inline (an empty
     * message has nothing to copy). */
    bool device = (x->flags & AGOQ_XFER_DEVICE) && size > 0;
    bool eager = size <= c->eager_max && !device;
    agoq_ib_rts r = {.seq = seq, .tag = x->tag, .size = size,
                     .flags = ((x->flags & AGOQ_XFER_FRAME) ? AGOQ_IB_RTS_FLAG_FRAME : 0) |
                              (eager ? AGOQ_IB_RTS_FLAG_EAGER : 0) |
                              (device ? AGOQ_IB_RTS_FLAG_DEVICE : 0)};
    uint8_t* out = c->out + (size_t)slot * c->out_slot;
    agoq_ib_rts_encode(&r, out);
    if (eager && size > 0) memcpy(out + AGOQ_IB_RTS_HDR_SIZE, x->data[0], size);
    *s = (agoq_ib_send_slot){.x = x, .seq = seq, .eager = eager};
    c->busy_slots++;
    AGOQ_CHECK(agoq_ib_write(c, 0, agoq_ib_wr_id(AGOQ_IB_WR_RTS, slot), out, c->out_mr->lkey,
                             AGOQ_IB_RTS_HDR_SIZE + (eager ? size : 0), c->peer_ring_addr + slot * c->peer_slot,
                             c->peer_ring_rkey, true, agoq_ib_imm(AGOQ_IB_IMM_RTS, seq)));
  }
  return ncclSuccess;
}

static ncclResult_t agoq_ib_send_finish(agoq_ib_conn* c, agoq_ib_send_slot* s) {
  agoq_ib_mr_put(s->mr);
  agoq_ib_xfer* xs = &c->xs[s->x->index];
  agoq_ib_mr_put(xs->mr[0]); /* an inline message used none */
  xs->mr[0] = NULL;
  xs->done = true;
  *s = (agoq_ib_send_slot){0};
  c->busy_slots--;
  return agoq_ib_send_issue(c);
}

static ncclResult_t agoq_ib_protocol_error(agoq_ib_conn* c, const char* what, uint32_t seq) {
  AGOQ_WARN("%s: protocol error on the connection %s %s: %s (message %u); the connection fails", c->d->describe,
            c->is_send ? "to" : "from", c->peer, what, seq);
  agoq_ib_conn_fail(c, ncclRemoteError);
  return ncclRemoteError;
}

/* The receiver answered message `seq` in our CTS ring. */
static ncclResult_t agoq_ib_on_cts(agoq_ib_conn* c, uint32_t imm_seq) {
  uint32_t slot = imm_seq % c->nslots;
  agoq_ib_send_slot* s = &c->sends[slot];
  agoq_ib_cts cts;
  agoq_ib_wire_status ws = agoq_ib_cts_decode(c->ring + (size_t)slot * c->ring_slot, c->ring_slot, &cts);
  if (ws != AGOQ_IB_WIRE_OK) return agoq_ib_protocol_error(c, agoq_ib_wire_status_str(ws), imm_seq);
  if (s->x == NULL || cts.seq != s->seq || (s->seq & AGOQ_IB_IMM_SEQ_MASK) != imm_seq)
    return agoq_ib_protocol_error(c, "an answer to no message in flight", imm_seq);
  uint64_t size = s->x->size[0];
  bool eager = s->eager;
  switch (cts.kind) {
    case AGOQ_IB_CTS_CONSUMED:
      if (!eager) return agoq_ib_protocol_error(c, "'consumed' for a message that was not inline", s->seq);
      return agoq_ib_send_finish(c, s);
    case AGOQ_IB_CTS_REFUSED:
      AGOQ_WARN("%s: %s refused message %u of %llu bytes (its error %u; its log says why); the connection fails",
                c->d->describe, c->peer, s->seq, (unsigned long long)size, cts.code);
      agoq_ib_conn_fail(c, ncclRemoteError);
      return ncclRemoteError;
    default:
      break;
  }
  if (eager || cts.size != size)
    return agoq_ib_protocol_error(c, "a write address for a message of another size", s->seq);
  agoq_ib_mr* held = c->xs[s->x->index].mr[0];
  c->xs[s->x->index].mr[0] = NULL;
  AGOQ_CHECK(agoq_ib_mr_for(c, held, s->x->data[0], size, &s->mr));
  uint32_t n = agoq_ib_stripes(size, c->nqps);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t off = size / n * i, end = i + 1 == n ? size : size / n * (i + 1);
    for (uint64_t pos = off; pos < end;) {
      uint64_t len = end - pos < AGOQ_IB_WR_MAX_BYTES ? end - pos : AGOQ_IB_WR_MAX_BYTES;
      bool last = pos + len == end;
      s->writes_pending++;
      AGOQ_CHECK(agoq_ib_write(c, (int)i, agoq_ib_wr_id(AGOQ_IB_WR_DATA, slot), s->x->data[0] + pos, s->mr->mr->lkey,
                               len, cts.addr + pos, cts.rkey, last, agoq_ib_imm(AGOQ_IB_IMM_DATA, s->seq)));
      pos += len;
    }
  }
  return ncclSuccess;
}

ncclResult_t agoq_ib_post_send(agoq_tp_conn* cp, agoq_xfer* x) {
  agoq_ib_conn* c = agoq_ib_conn_of(cp);
  ncclResult_t err = (ncclResult_t)atomic_load(&c->error);
  if (err != ncclSuccess) return err;
  pthread_mutex_lock(&c->mu);
  c->xs[x->index] = (agoq_ib_xfer){.mr = {agoq_ib_mr_ref(x->reg[0])}};
  /* The answer clock starts with the first send in flight. */
  if (!agoq_ib_in_flight(c)) c->last_answer_ms = agoq_ib_now_ms();
  agoq_ib_fifo_push(c, x);
  err = agoq_ib_send_issue(c);
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* ---- receiver ----------------------------------------------------------------------- */

static ncclResult_t agoq_ib_cts_write(agoq_ib_conn* c, const agoq_ib_cts* cts) {
  uint32_t slot = cts->seq % c->nslots;
  uint8_t* out = c->out + (size_t)slot * c->out_slot;
  agoq_ib_cts_encode(cts, out);
  return agoq_ib_write(c, 0, agoq_ib_wr_id(AGOQ_IB_WR_CTS, slot), out, c->out_mr->lkey, AGOQ_IB_CTS_SIZE,
                       c->peer_ring_addr + slot * c->peer_slot, c->peer_ring_rkey, true,
                       agoq_ib_imm(AGOQ_IB_IMM_CTS, cts->seq));
}

static void agoq_ib_recv_landed(agoq_ib_conn* c, agoq_xfer* x, int buf, uint64_t size) {
  x->size[buf] = size;
  c->xs[x->index].pending--;
}

/* Matches arrived RTS, oldest first, to the oldest posted receive. */
static ncclResult_t agoq_ib_recv_match(agoq_ib_conn* c) {
  while (c->rts_matched != c->rts_arrived) {
    agoq_xfer* x = agoq_ib_fifo_front(c);
    if (x == NULL) return ncclSuccess; /* the message waits in its slot for a receive */
    uint32_t seq = c->rts_matched;
    uint32_t slot = seq % c->nslots;
    const uint8_t* in = c->ring + (size_t)slot * c->ring_slot;
    agoq_ib_rts r;
    agoq_ib_wire_status ws = agoq_ib_rts_decode(in, c->ring_slot, c->eager_max, &r);
    if (ws != AGOQ_IB_WIRE_OK) return agoq_ib_protocol_error(c, agoq_ib_wire_status_str(ws), seq);
    if (r.seq != seq) return agoq_ib_protocol_error(c, "a message out of order", r.seq);
    int buf = -1;
    uint8_t* dst = NULL;
    /* A message not sent inline is written by the sender's HCA, so it may land in GPU
     * memory; an inline one is copied here by the CPU. */
    uint32_t mflags = ((r.flags & AGOQ_IB_RTS_FLAG_FRAME) ? AGOQ_XFER_FRAME : 0) |
                      ((r.flags & AGOQ_IB_RTS_FLAG_EAGER) ? 0 : AGOQ_XFER_RDMA);
    ncclResult_t res = c->match(c->match_arg, x, r.tag, r.size, mflags, &buf, &dst);
    if (res == ncclSuccess && (buf < 0 || buf >= x->n || (x->matched_mask & (1u << buf))))
      res = ncclInternalError;
    if (res != ncclSuccess) {
      /* Already logged by the net core; the sender learns it from the answer. */
      agoq_ib_cts refuse = {.seq = seq, .kind = AGOQ_IB_CTS_REFUSED, .code = (uint32_t)res};
      agoq_ib_conn_fail(c, res);
      (void)agoq_ib_cts_write(c, &refuse);
      return res;
    }
    x->matched_mask |= 1u << buf;
    c->rts_matched++;
    /* The key posted with the receive is referenced already; one the match chose (the
     * net core's staging) is valid now, while the net core holds it. */
    agoq_ib_mr* held = c->xs[x->index].mr[buf];
    c->xs[x->index].mr[buf] = NULL;
    if ((void*)held != x->reg[buf]) {
      agoq_ib_mr_put(held);
      held = agoq_ib_mr_ref(x->reg[buf]);
    }
    if (__builtin_popcount(x->matched_mask) == x->n) agoq_ib_fifo_pop(c);
    if (r.flags & AGOQ_IB_RTS_FLAG_EAGER) {
      agoq_ib_mr_put(held);
      if (r.size > 0) memcpy(dst, in + AGOQ_IB_RTS_HDR_SIZE, r.size);
      agoq_ib_recv_landed(c, x, buf, r.size);
      agoq_ib_cts consumed = {.seq = seq, .kind = AGOQ_IB_CTS_CONSUMED};
      AGOQ_CHECK(agoq_ib_cts_write(c, &consumed));
      continue;
    }
    agoq_ib_recv_slot* rs = &c->rslots[slot];
    *rs = (agoq_ib_recv_slot){.x = x, .seq = seq, .buf = buf, .size = r.size,
                              .stripes_expected = agoq_ib_stripes(r.size, c->nqps)};
    c->busy_slots++;
    AGOQ_CHECK(agoq_ib_mr_for(c, held, dst, r.size, &rs->mr));
    agoq_ib_cts write = {.seq = seq, .kind = AGOQ_IB_CTS_WRITE, .addr = (uint64_t)(uintptr_t)dst,
                         .rkey = rs->mr->mr->rkey, .size = r.size};
    AGOQ_CHECK(agoq_ib_cts_write(c, &write));
  }
  return ncclSuccess;
}

static ncclResult_t agoq_ib_on_data(agoq_ib_conn* c, uint32_t imm_seq) {
  agoq_ib_recv_slot* rs = &c->rslots[imm_seq % c->nslots];
  if (rs->x == NULL || (rs->seq & AGOQ_IB_IMM_SEQ_MASK) != imm_seq)
    return agoq_ib_protocol_error(c, "payload for no message expected", imm_seq);
  if (++rs->stripes_done < rs->stripes_expected) return ncclSuccess;
  agoq_ib_mr_put(rs->mr);
  agoq_ib_recv_landed(c, rs->x, rs->buf, rs->size);
  *rs = (agoq_ib_recv_slot){0};
  c->busy_slots--;
  return ncclSuccess;
}

ncclResult_t agoq_ib_post_recv(agoq_tp_conn* cp, agoq_xfer* x) {
  agoq_ib_conn* c = agoq_ib_conn_of(cp);
  ncclResult_t err = (ncclResult_t)atomic_load(&c->error);
  if (err != ncclSuccess) return err;
  x->matched_mask = 0;
  pthread_mutex_lock(&c->mu);
  c->xs[x->index] = (agoq_ib_xfer){.pending = x->n};
  for (int i = 0; i < x->n; i++) c->xs[x->index].mr[i] = agoq_ib_mr_ref(x->reg[i]);
  agoq_ib_fifo_push(c, x);
  err = agoq_ib_recv_match(c);
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* ---- completions -------------------------------------------------------------------- */

static ncclResult_t agoq_ib_on_imm(agoq_ib_conn* c, uint32_t imm) {
  uint32_t seq = agoq_ib_imm_seq(imm);
  switch (agoq_ib_imm_kind_of(imm)) {
    case AGOQ_IB_IMM_RTS:
      if (c->is_send || seq != (c->rts_arrived & AGOQ_IB_IMM_SEQ_MASK))
        return agoq_ib_protocol_error(c, "an unexpected message description", seq);
      c->rts_arrived++;
      return ncclSuccess;
    case AGOQ_IB_IMM_CTS:
      if (!c->is_send) return agoq_ib_protocol_error(c, "an answer sent to a receiver", seq);
      return agoq_ib_on_cts(c, seq);
    case AGOQ_IB_IMM_DATA:
      if (c->is_send) return agoq_ib_protocol_error(c, "payload sent to a sender", seq);
      return agoq_ib_on_data(c, seq);
  }
  return agoq_ib_protocol_error(c, "an unknown notification", seq);
}

static ncclResult_t agoq_ib_on_completion(agoq_ib_conn* c, const struct agoq_ibv_wc* wc) {
  if (wc->status != AGOQ_IBV_WC_SUCCESS) {
    agoq_ib_completion_error(c, wc);
    return ncclRemoteError;
  }
  agoq_ib_wr_kind kind = (agoq_ib_wr_kind)(wc->wr_id >> 56);
  uint32_t index = (uint32_t)(wc->wr_id & 0xffffffffu);
  switch (kind) {
    case AGOQ_IB_WR_RTS:
    case AGOQ_IB_WR_CTS:
      return ncclSuccess; /* the answer (or the next RTS) tells what the peer did with it */
    case AGOQ_IB_WR_DATA: {
      agoq_ib_send_slot* s = &c->sends[index % c->nslots];
      if (s->x == NULL || s->writes_pending <= 0) return agoq_ib_protocol_error(c, "a stray payload completion", index);
      if (--s->writes_pending == 0) return agoq_ib_send_finish(c, s);
      return ncclSuccess;
    }
    case AGOQ_IB_WR_RECV:
      if (index >= (uint32_t)c->nqps || !(wc->wc_flags & AGOQ_IBV_WC_WITH_IMM) ||
          wc->opcode != AGOQ_IBV_WC_RECV_RDMA_WITH_IMM)
        return agoq_ib_protocol_error(c, "a receive completion without immediate data", index);
      AGOQ_CHECK(agoq_ib_post_recv_wr(c, (int)index));
      return agoq_ib_on_imm(c, ntohl(wc->imm_data));
  }
  return agoq_ib_protocol_error(c, "a completion of unknown kind", index);
}

/* A peer that died or closed its communicator sends nothing more: without this, a sender
 * waiting for an answer (or a receiver for a payload) would wait forever, as no work
 * request of ours is outstanding to time out. */
static void agoq_ib_liveness(agoq_ib_conn* c) {
  if (c->boot == NULL || !agoq_ib_in_flight(c)) return;
  /* AGOQ_TIMEOUT_S, as TCP's unacknowledged-data timeout: the peer's NIC acknowledges our
   * writes even when its process is stopped, so what stalls is the peer's answer. */
  if (c->is_send && agoq_ib.answer_timeout_ms > 0 && c->last_answer_ms != 0 &&
      agoq_ib_now_ms() - c->last_answer_ms > agoq_ib.answer_timeout_ms) {
    AGOQ_WARN("%s: %s has not answered for %lld ms with sends in flight (AGOQ_TIMEOUT_S=%lld): the peer is "
              "stalled or gone; the connection fails",
              c->d->describe, c->peer, (long long)(agoq_ib_now_ms() - c->last_answer_ms),
              (long long)(agoq_ib.answer_timeout_ms / 1000));
    agoq_ib_conn_fail(c, ncclRemoteError);
    return;
  }
  if (c->peer_gone_ms == 0) {
    if (c->liveness_tick++ % AGOQ_IB_LIVENESS_EVERY != 0) return;
    uint8_t byte;
    bool got = false;
    /* Nothing is ever sent on it after setup: a byte is as wrong as the end. */
    if (agoq_transport_tcp.exchange(c->boot, NULL, 0, &byte, 1, &got) == ncclSuccess && !got) return;
    c->peer_gone_ms = agoq_ib_now_ms();
    return;
  }
  if (agoq_ib_now_ms() - c->peer_gone_ms < AGOQ_IB_PEER_GONE_GRACE_MS) return;
  AGOQ_WARN("%s: %s closed its end of the connection (it exited or closed the communicator) with transfers still "
            "in flight here; they fail",
            c->d->describe, c->peer);
  agoq_ib_conn_fail(c, ncclRemoteError);
}

bool agoq_ib_conn_poll(agoq_ib_conn* c, bool match) {
  if (atomic_load(&c->error) != ncclSuccess || !agoq_ib_in_flight(c)) return false;
  if (atomic_load(&c->d->fatal)) {
    AGOQ_WARN("%s: the device had a catastrophic error: the connection %s %s fails with its transfers in flight",
              c->d->describe, c->is_send ? "to" : "from", c->peer);
    agoq_ib_conn_fail(c, ncclSystemError);
    return false;
  }
  struct agoq_ibv_wc wc[AGOQ_IB_POLL_BATCH];
  for (int round = 0; round < AGOQ_IB_POLL_ROUNDS; round++) {
    int n = agoq_ibv_poll_cq(c->cq, AGOQ_IB_POLL_BATCH, wc);
    if (n < 0) {
      AGOQ_WARN("%s: ibv_poll_cq failed (%d) on the connection with %s", c->d->describe, n, c->peer);
      agoq_ib_conn_fail(c, ncclSystemError);
      return false;
    }
    if (n > 0 && c->is_send) c->last_answer_ms = agoq_ib_now_ms();
    for (int i = 0; i < n; i++) {
      ncclResult_t r = agoq_ib_on_completion(c, &wc[i]);
      if (r != ncclSuccess) {
        agoq_ib_conn_fail(c, r);
        /* The rest of the batch: errors are counted, nothing else is acted on. */
        for (int k = i + 1; k < n; k++)
          if (wc[k].status != AGOQ_IBV_WC_SUCCESS) agoq_ib_completion_error(c, &wc[k]);
        return false;
      }
    }
    if (match && !c->is_send && agoq_ib_recv_match(c) != ncclSuccess) return false;
    if (n < AGOQ_IB_POLL_BATCH) break;
  }
  agoq_ib_liveness(c);
  return agoq_ib_in_flight(c);
}

ncclResult_t agoq_ib_progress(agoq_tp_conn* cp, agoq_xfer* x) {
  (void)x;
  agoq_ib_conn* c = agoq_ib_conn_of(cp);
  pthread_mutex_lock(&c->mu);
  /* With match, the poll also matches what the helper saw arrive. */
  (void)agoq_ib_conn_poll(c, true);
  pthread_mutex_unlock(&c->mu);
  return (ncclResult_t)atomic_load(&c->error);
}

bool agoq_ib_done(agoq_tp_conn* cp, const agoq_xfer* x) {
  agoq_ib_conn* c = agoq_ib_conn_of(cp);
  pthread_mutex_lock(&c->mu);
  const agoq_ib_xfer* s = &c->xs[x->index];
  bool done = c->is_send ? s->done : s->pending == 0;
  pthread_mutex_unlock(&c->mu);
  return done;
}
