/*
 * Queue pairs: creation, the RC state machine of ibv_modify_qp, and posting.
 *
 * Every QP number is unique across the processes sharing the fabric directory: it is
 * reserved by creating <dir>/qpn-<n> with O_CREAT|O_EXCL, and the file says how to reach
 * the QP (its context's socket, port, LID, GIDs). It is removed at destroy.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"

emu_swr* emu_swr_at(emu_qp* qp, uint64_t seq) { return &qp->sq[seq % qp->sq_cap]; }

int64_t emu_qp_timeout_ns(const emu_qp* qp) {
  /* IB spec 9.7.6.1.3: Local ACK Timeout = 4.096 us * 2^timeout; 0 means infinite. Each
   * of retry_cnt retries waits that long again. Scaled by AGOQ_IBV_EMU_TIME_SCALE. */
  if (qp->timeout == 0) return 0;
  double ns = 4096.0 * (double)(1ull << qp->timeout) * (qp->retry_cnt + 1) * qp->ctx->time_scale;
  return ns < 1000 ? 1000 : (int64_t)ns;
}

static int write_qpn_file(emu_qp* qp, int flags) {
  emu_ctx* ctx = qp->ctx;
  int fd = open(qp->qpn_path, flags, 0600);
  if (fd < 0) return -1;
  char text[1024];
  int n = snprintf(text, sizeof text, "sock=%s\nqpn=%u\n", ctx->sock_path, qp->ibv.qp_num);
  if (qp->port) {
    const emu_port_cfg* p = &ctx->dev.cfg.ports[qp->port - 1];
    n += snprintf(text + n, sizeof text - (size_t)n, "port=%d\nlid=%u\n", qp->port, p->lid);
    for (int i = 0; i < p->ngid && n < (int)sizeof text - 64; i++) {
      n += snprintf(text + n, sizeof text - (size_t)n, "gid%d=", i);
      for (int b = 0; b < 16; b++) n += snprintf(text + n, sizeof text - (size_t)n, "%02x", p->gids[i].gid.raw[b]);
      n += snprintf(text + n, sizeof text - (size_t)n, " type=%d\n", p->gids[i].type);
    }
  }
  ssize_t w = write(fd, text, (size_t)n);
  close(fd);
  return w == n ? 0 : -1;
}

/* ibv_create_qp(3): RC only here; capacities within the device limits (else EINVAL);
 * both CQs must belong to the PD's context. */
EMU_EXPORT struct agoq_ibv_qp* ibv_create_qp(struct agoq_ibv_pd* pd, struct agoq_ibv_qp_init_attr* attr) {
  if (!pd || !attr) {
    errno = EINVAL;
    return NULL;
  }
  emu_ctx* ctx = (emu_ctx*)pd->context;
  const emu_dev_cfg* d = &ctx->dev.cfg;
  struct agoq_ibv_qp_cap* cap = &attr->cap;
  if (attr->qp_type != AGOQ_IBV_QPT_RC || attr->srq || !attr->send_cq || !attr->recv_cq ||
      attr->send_cq->context != pd->context || attr->recv_cq->context != pd->context || cap->max_send_wr < 1 ||
      cap->max_send_wr > (uint32_t)d->max_qp_wr || cap->max_recv_wr > (uint32_t)d->max_qp_wr ||
      cap->max_send_sge > EMU_MAX_SGE || cap->max_recv_sge > EMU_MAX_SGE || cap->max_inline_data > EMU_MAX_INLINE) {
    errno = EINVAL;
    return NULL;
  }
  int nqp = 0;
  pthread_mutex_lock(&ctx->lock);
  for (emu_qp* q = ctx->qps; q; q = q->next) nqp++;
  pthread_mutex_unlock(&ctx->lock);
  if (nqp >= d->max_qp) {
    errno = ENOMEM;
    return NULL;
  }
  emu_qp* qp = calloc(1, sizeof *qp);
  if (!qp) {
    errno = ENOMEM;
    return NULL;
  }
  qp->ctx = ctx;
  qp->cap = *cap;
  qp->sq_cap = cap->max_send_wr;
  qp->rq_cap = cap->max_recv_wr ? cap->max_recv_wr : 1;
  uint32_t ssge = cap->max_send_sge ? cap->max_send_sge : 1, rsge = cap->max_recv_sge ? cap->max_recv_sge : 1;
  qp->sq = calloc(qp->sq_cap, sizeof *qp->sq);
  qp->rq = calloc(qp->rq_cap, sizeof *qp->rq);
  struct agoq_ibv_sge* ssg = calloc((size_t)qp->sq_cap * ssge, sizeof *ssg);
  struct agoq_ibv_sge* rsg = calloc((size_t)qp->rq_cap * rsge, sizeof *rsg);
  uint8_t* inl = calloc((size_t)qp->sq_cap, cap->max_inline_data ? cap->max_inline_data : 1);
  if (!qp->sq || !qp->rq || !ssg || !rsg || !inl) {
    free(qp->sq);
    free(qp->rq);
    free(ssg);
    free(rsg);
    free(inl);
    free(qp);
    errno = ENOMEM;
    return NULL;
  }
  for (uint32_t i = 0; i < qp->sq_cap; i++) {
    qp->sq[i].sge = ssg + (size_t)i * ssge;
    qp->sq[i].inl = inl + (size_t)i * (cap->max_inline_data ? cap->max_inline_data : 1);
  }
  for (uint32_t i = 0; i < qp->rq_cap; i++) qp->rq[i].sge = rsg + (size_t)i * rsge;
  qp->sq_sig_all = attr->sq_sig_all;
  qp->ibv.context = pd->context;
  qp->ibv.qp_context = attr->qp_context;
  qp->ibv.pd = pd;
  qp->ibv.send_cq = attr->send_cq;
  qp->ibv.recv_cq = attr->recv_cq;
  qp->ibv.qp_type = AGOQ_IBV_QPT_RC;
  qp->ibv.state = qp->st = AGOQ_IBV_QPS_RESET;
  pthread_mutex_init(&qp->ibv.mutex, NULL);
  pthread_cond_init(&qp->ibv.cond, NULL);
  int err = 0;
  for (int tries = 0; !err; tries++) {
    pthread_mutex_lock(&emu_g.lock);
    uint32_t n = (uint32_t)(emu_random() % 0xFFFFFF) + 1; /* QPNs are 24 bits; 0 and 1 are special */
    pthread_mutex_unlock(&emu_g.lock);
    if (n < 2) continue;
    qp->ibv.qp_num = n;
    snprintf(qp->qpn_path, sizeof qp->qpn_path, "%s/qpn-%u", ctx->dir, n);
    if (write_qpn_file(qp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC) == 0) break;
    if (errno != EEXIST || tries > 1000) err = errno ? errno : EIO;
  }
  if (err) {
    pthread_mutex_destroy(&qp->ibv.mutex);
    pthread_cond_destroy(&qp->ibv.cond);
    free(qp->sq[0].sge);
    free(qp->sq[0].inl);
    free(qp->rq[0].sge);
    free(qp->sq);
    free(qp->rq);
    free(qp);
    errno = err;
    return NULL;
  }
  pthread_mutex_lock(&ctx->lock);
  qp->ibv.handle = ctx->next_handle++;
  ((emu_pd*)pd)->nqp++;
  ((emu_cq*)attr->send_cq)->nqp++;
  ((emu_cq*)attr->recv_cq)->nqp++;
  qp->next = ctx->qps;
  ctx->qps = qp;
  pthread_mutex_unlock(&ctx->lock);
  cap->max_inline_data = qp->cap.max_inline_data;
  return &qp->ibv;
}

static void qp_free(emu_qp* qp) {
  unlink(qp->qpn_path);
  pthread_mutex_destroy(&qp->ibv.mutex);
  pthread_cond_destroy(&qp->ibv.cond);
  free(qp->sq[0].sge);
  free(qp->sq[0].inl);
  free(qp->rq[0].sge);
  free(qp->sq);
  free(qp->rq);
  free(qp);
}

EMU_EXPORT int ibv_destroy_qp(struct agoq_ibv_qp* ibqp) {
  if (!ibqp) return errno = EINVAL;
  emu_ctx* ctx = (emu_ctx*)ibqp->context;
  emu_qp* qp = (emu_qp*)ibqp;
  pthread_mutex_lock(&ctx->lock);
  for (emu_qp** pp = &ctx->qps; *pp; pp = &(*pp)->next)
    if (*pp == qp) {
      *pp = qp->next;
      break;
    }
  emu_conn_close_qp(ctx, qp->ibv.qp_num);
  ((emu_pd*)ibqp->pd)->nqp--;
  ((emu_cq*)ibqp->send_cq)->nqp--;
  ((emu_cq*)ibqp->recv_cq)->nqp--;
  pthread_mutex_unlock(&ctx->lock);
  emu_wake(ctx);
  qp_free(qp);
  return 0;
}

void emu_qp_free_all(emu_ctx* ctx) {
  while (ctx->qps) {
    emu_qp* q = ctx->qps;
    ctx->qps = q->next;
    qp_free(q);
  }
}

/* ---- the state machine ---------------------------------------------------------------- */

enum {
  M_STATE = AGOQ_IBV_QP_STATE,
  M_CUR = AGOQ_IBV_QP_CUR_STATE,
  M_ACCESS = AGOQ_IBV_QP_ACCESS_FLAGS,
  M_PKEY = AGOQ_IBV_QP_PKEY_INDEX,
  M_PORT = AGOQ_IBV_QP_PORT,
  M_AV = AGOQ_IBV_QP_AV,
  M_MTU = AGOQ_IBV_QP_PATH_MTU,
  M_TIMEOUT = AGOQ_IBV_QP_TIMEOUT,
  M_RETRY = AGOQ_IBV_QP_RETRY_CNT,
  M_RNR_RETRY = AGOQ_IBV_QP_RNR_RETRY,
  M_RQ_PSN = AGOQ_IBV_QP_RQ_PSN,
  M_RD_ATOMIC = AGOQ_IBV_QP_MAX_QP_RD_ATOMIC,
  M_ALT = AGOQ_IBV_QP_ALT_PATH,
  M_RNR_TIMER = AGOQ_IBV_QP_MIN_RNR_TIMER,
  M_SQ_PSN = AGOQ_IBV_QP_SQ_PSN,
  M_DEST_RD_ATOMIC = AGOQ_IBV_QP_MAX_DEST_RD_ATOMIC,
  M_MIG = AGOQ_IBV_QP_PATH_MIG_STATE,
  M_DEST_QPN = AGOQ_IBV_QP_DEST_QPN,
};

/* The RC rows of the IB spec's "QP state transition" table (Vol 1, 11.2.5.2 / Table 91),
 * as ibv_modify_qp(3) lists them: the attributes each transition requires and the ones it
 * may carry. Anything else in the mask, a missing required one, or a transition not in
 * the table is EINVAL with the state unchanged. */
static const struct {
  int from, to;
  int req, opt;
} k_rc_table[] = {
    {AGOQ_IBV_QPS_RESET, AGOQ_IBV_QPS_INIT, M_STATE | M_PKEY | M_PORT | M_ACCESS, 0},
    {AGOQ_IBV_QPS_INIT, AGOQ_IBV_QPS_INIT, M_STATE, M_PKEY | M_PORT | M_ACCESS},
    {AGOQ_IBV_QPS_INIT, AGOQ_IBV_QPS_RTR,
     M_STATE | M_AV | M_MTU | M_DEST_QPN | M_RQ_PSN | M_DEST_RD_ATOMIC | M_RNR_TIMER, M_ALT | M_ACCESS | M_PKEY},
    {AGOQ_IBV_QPS_RTR, AGOQ_IBV_QPS_RTS, M_STATE | M_SQ_PSN | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_RD_ATOMIC,
     M_CUR | M_ACCESS | M_RNR_TIMER | M_ALT | M_MIG},
    {AGOQ_IBV_QPS_RTS, AGOQ_IBV_QPS_RTS, M_STATE, M_CUR | M_ACCESS | M_RNR_TIMER | M_ALT | M_MIG},
};

static void qp_reset_queues(emu_qp* qp) {
  /* sequence numbers keep counting so that a stale CQE never retires a new WR */
  qp->sq_head = qp->sq_ack = qp->sq_exec = qp->sq_next;
  qp->rq_head = qp->rq_count = 0;
  qp->tx_halt = qp->unreachable = qp->peer_lost = qp->rnr_count = 0;
  qp->reach_deadline = qp->next_connect = qp->ack_deadline = qp->rnr_until = 0;
}

void emu_qp_set_err(emu_qp* qp) {
  emu_ctx* ctx = qp->ctx;
  qp->st = AGOQ_IBV_QPS_ERR;
  /* IB spec 10.3.1: in the Error state every outstanding and later WR completes in error
   * (flushed). The receive queue is flushed here; the NIC thread flushes the send queue
   * in order behind whatever it has already completed. */
  while (qp->rq_count > 0) {
    emu_rwr* r = &qp->rq[qp->rq_head];
    qp->rq_head = (qp->rq_head + 1) % qp->rq_cap;
    qp->rq_count--;
    emu_cqe e;
    memset(&e, 0, sizeof e);
    e.wc.wr_id = r->wr_id;
    e.wc.status = AGOQ_IBV_WC_WR_FLUSH_ERR;
    e.wc.vendor_err = emu_vendor_err(AGOQ_IBV_WC_WR_FLUSH_ERR);
    e.wc.qp_num = qp->ibv.qp_num;
    e.wc.opcode = AGOQ_IBV_WC_RECV;
    emu_cq_push(ctx, (emu_cq*)qp->ibv.recv_cq, &e);
  }
  emu_conn_close_qp(ctx, qp->ibv.qp_num);
  emu_wake(ctx);
}

void emu_qp_retire(emu_qp* qp, uint64_t seq) {
  if (seq >= qp->sq_head && seq < qp->sq_ack) qp->sq_head = seq + 1;
}

static int gid_is_zero(const agoq_ibv_gid* g) {
  static const uint8_t zero[16];
  return !memcmp(g->raw, zero, 16);
}

EMU_EXPORT int ibv_modify_qp(struct agoq_ibv_qp* ibqp, struct agoq_ibv_qp_attr* attr, int mask) {
  if (!ibqp || !attr) return errno = EINVAL;
  emu_qp* qp = (emu_qp*)ibqp;
  emu_ctx* ctx = qp->ctx;
  pthread_mutex_lock(&ctx->lock);
  int cur = qp->st;
  int to = (mask & M_STATE) ? attr->qp_state : cur;
  int eff = mask | M_STATE; /* without IBV_QP_STATE: a same-state modify */
  int ok = 0;
  if (to == AGOQ_IBV_QPS_RESET || to == AGOQ_IBV_QPS_ERR) {
    ok = (mask & M_STATE) && !(mask & ~(M_STATE | M_CUR)); /* any state -> RESET / ERR */
  } else {
    for (size_t i = 0; i < sizeof k_rc_table / sizeof k_rc_table[0]; i++)
      if (k_rc_table[i].from == cur && k_rc_table[i].to == to) {
        ok = (eff & k_rc_table[i].req) == k_rc_table[i].req && !(eff & ~(k_rc_table[i].req | k_rc_table[i].opt));
        break;
      }
  }
  /* cur_qp_state, when given, must be the current state (IB spec 11.2.5.2) */
  if (ok && (mask & M_CUR) && attr->cur_qp_state != cur) ok = 0;
  int port = (mask & M_PORT) ? attr->port_num : qp->port;
  const emu_port_cfg* p = (port >= 1 && port <= ctx->dev.cfg.nports) ? &ctx->dev.cfg.ports[port - 1] : NULL;
  if (ok && (mask & M_PORT)) {
    /* the port must exist and be ACTIVE to be bound to a QP */
    if (!p || ctx->port_state[port] != AGOQ_IBV_PORT_ACTIVE) ok = 0;
  }
  if (ok && (mask & M_PKEY) && attr->pkey_index >= EMU_PKEY_TBL_LEN) ok = 0;
  if (ok && (mask & M_ACCESS) &&
      (attr->qp_access_flags & ~(unsigned)(AGOQ_IBV_ACCESS_LOCAL_WRITE | AGOQ_IBV_ACCESS_REMOTE_WRITE |
                                           AGOQ_IBV_ACCESS_REMOTE_READ | AGOQ_IBV_ACCESS_REMOTE_ATOMIC)))
    ok = 0;
  if (ok && (mask & M_MTU)) {
    /* path_mtu must be a valid enum ibv_mtu no larger than the port's active MTU
     * (ibv_modify_qp(3): EINVAL for an invalid value in attr) */
    if (!p || attr->path_mtu < AGOQ_IBV_MTU_256 || attr->path_mtu > p->mtu) ok = 0;
  }
  if (ok && (mask & M_DEST_QPN) && (attr->dest_qp_num == 0 || attr->dest_qp_num > 0xFFFFFF)) ok = 0;
  if (ok && (mask & M_AV)) {
    const struct agoq_ibv_ah_attr* ah = &attr->ah_attr;
    if (!p || (ah->port_num && ah->port_num != port)) ok = 0;
    /* RoCE carries every packet in a GRH: an Ethernet port's AV must be global with a
     * valid source GID entry (ibv_modify_qp(3) / the kernel's rdma_ah_attr checks) */
    else if (p->link == AGOQ_IBV_LINK_LAYER_ETHERNET &&
             (!ah->is_global || ah->grh.sgid_index >= p->ngid || gid_is_zero(&p->gids[ah->grh.sgid_index].gid)))
      ok = 0;
    else if (ah->is_global && (ah->grh.sgid_index >= p->ngid || gid_is_zero(&p->gids[ah->grh.sgid_index].gid)))
      ok = 0;
    else if (!ah->is_global && p->link == AGOQ_IBV_LINK_LAYER_INFINIBAND && ah->dlid == 0)
      ok = 0; /* LID 0 is reserved: an IB path needs a LID or a GRH */
  }
  if (ok && (mask & M_RNR_TIMER) && attr->min_rnr_timer > 31) ok = 0;
  if (ok && (mask & M_TIMEOUT) && attr->timeout > 31) ok = 0;
  if (ok && (mask & M_RETRY) && attr->retry_cnt > 7) ok = 0;
  if (ok && (mask & M_RNR_RETRY) && attr->rnr_retry > 7) ok = 0;
  if (ok && (mask & M_RD_ATOMIC) && attr->max_rd_atomic > EMU_MAX_RD_ATOMIC) ok = 0;
  if (ok && (mask & M_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > EMU_MAX_RD_ATOMIC) ok = 0;
  if (!ok) {
    pthread_mutex_unlock(&ctx->lock);
    return errno = EINVAL;
  }
  if (mask & M_PORT) qp->port = port;
  if (mask & M_PKEY) qp->pkey_index = attr->pkey_index;
  if (mask & M_ACCESS) qp->access = attr->qp_access_flags;
  if (mask & M_AV) qp->ah = attr->ah_attr;
  if (mask & M_MTU) qp->path_mtu = attr->path_mtu;
  if (mask & M_DEST_QPN) qp->dest_qpn = attr->dest_qp_num;
  if (mask & M_RQ_PSN) qp->rq_psn = attr->rq_psn;
  if (mask & M_SQ_PSN) qp->sq_psn = attr->sq_psn;
  if (mask & M_RNR_TIMER) qp->min_rnr_timer = attr->min_rnr_timer;
  if (mask & M_TIMEOUT) qp->timeout = attr->timeout;
  if (mask & M_RETRY) qp->retry_cnt = attr->retry_cnt;
  if (mask & M_RNR_RETRY) qp->rnr_retry = attr->rnr_retry;
  if (mask & M_RD_ATOMIC) qp->max_rd_atomic = attr->max_rd_atomic;
  if (mask & M_DEST_RD_ATOMIC) qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (to == AGOQ_IBV_QPS_ERR) {
    if (cur != AGOQ_IBV_QPS_ERR) emu_qp_set_err(qp);
    qp->ibv.state = AGOQ_IBV_QPS_ERR;
  } else {
    if (to == AGOQ_IBV_QPS_RESET && cur != AGOQ_IBV_QPS_RESET) {
      emu_conn_close_qp(ctx, qp->ibv.qp_num);
      qp_reset_queues(qp);
      qp->port = 0;
    }
    qp->ibv.state = qp->st = to;
  }
  if ((mask & M_PORT) && cur == AGOQ_IBV_QPS_RESET) write_qpn_file(qp, O_WRONLY | O_TRUNC | O_CLOEXEC);
  pthread_mutex_unlock(&ctx->lock);
  emu_wake(ctx);
  return 0;
}

/* ---- posting -------------------------------------------------------------------------- */

/* ibv_post_send(3), validated synchronously as the provider does; never blocks. */
int emu_post_send(struct agoq_ibv_qp* ibqp, struct agoq_ibv_send_wr* wr, struct agoq_ibv_send_wr** bad) {
  emu_qp* qp = (emu_qp*)ibqp;
  emu_ctx* ctx = qp->ctx;
  int rc = 0;
  pthread_mutex_lock(&ctx->lock);
  for (; wr; wr = wr->next) {
    int st = qp->st;
    /* IB spec 10.8.2 / ibv_post_send(3): the send queue accepts WRs in RTS and, in Error,
     * completes them with a flush (as hardware does); RESET/INIT/RTR reject them */
    if (st != AGOQ_IBV_QPS_RTS && st != AGOQ_IBV_QPS_ERR) rc = EINVAL;
    else if (wr->opcode != AGOQ_IBV_WR_RDMA_WRITE && wr->opcode != AGOQ_IBV_WR_RDMA_WRITE_WITH_IMM &&
             wr->opcode != AGOQ_IBV_WR_RDMA_READ && wr->opcode != AGOQ_IBV_WR_SEND)
      rc = EINVAL;
    else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge || (wr->num_sge && !wr->sg_list))
      rc = EINVAL;
    else if (qp->sq_next - qp->sq_head >= qp->sq_cap)
      rc = ENOMEM; /* every WR not yet retired holds its slot (unsignaled ones until a later CQE is polled) */
    uint64_t total = 0;
    for (int i = 0; !rc && i < wr->num_sge; i++) total += wr->sg_list[i].length;
    if (!rc && (wr->send_flags & AGOQ_IBV_SEND_INLINE) &&
        (total > qp->cap.max_inline_data || wr->opcode == AGOQ_IBV_WR_RDMA_READ))
      rc = EINVAL;
    if (!rc && total > 0x80000000ull) rc = EINVAL; /* max_msg_sz */
    if (rc) break;
    emu_swr* e = emu_swr_at(qp, qp->sq_next);
    e->seq = qp->sq_next;
    e->wr_id = wr->wr_id;
    e->opcode = wr->opcode;
    e->signaled = (wr->send_flags & AGOQ_IBV_SEND_SIGNALED) || qp->sq_sig_all;
    e->imm = wr->imm_data;
    e->raddr = wr->wr.rdma.remote_addr;
    e->rkey = wr->wr.rdma.rkey;
    e->len = (uint32_t)total;
    e->nsge = wr->num_sge;
    e->transmitted = 0;
    e->result = -1;
    e->byte_len = 0;
    e->forced = 0;
    e->port_down_after = 0;
    e->is_inline = !!(wr->send_flags & AGOQ_IBV_SEND_INLINE);
    if (e->is_inline) { /* inline data is copied at post time; the lkeys are not used */
      uint32_t off = 0;
      for (int i = 0; i < wr->num_sge; i++) {
        if (wr->sg_list[i].length)
          memcpy(e->inl + off, (const void*)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
        off += wr->sg_list[i].length;
      }
    } else {
      if (wr->num_sge) memcpy(e->sge, wr->sg_list, sizeof *wr->sg_list * (size_t)wr->num_sge);
    }
    pthread_mutex_lock(&emu_g.lock);
    uint64_t n = ++emu_g.send_count;
    if (emu_g.f_wc_status && n == emu_g.f_wc_n) e->forced = emu_g.f_wc_status;
    if (emu_g.f_port_down_n && n == emu_g.f_port_down_n) e->port_down_after = 1;
    pthread_mutex_unlock(&emu_g.lock);
    qp->sq_next++;
  }
  pthread_mutex_unlock(&ctx->lock);
  if (rc && bad) *bad = wr;
  emu_wake(ctx);
  return rc;
}

/* ibv_post_recv(3): refused in RESET; ENOMEM when max_recv_wr WRs are outstanding. In
 * Error the WR is accepted and flushed at once. */
int emu_post_recv(struct agoq_ibv_qp* ibqp, struct agoq_ibv_recv_wr* wr, struct agoq_ibv_recv_wr** bad) {
  emu_qp* qp = (emu_qp*)ibqp;
  emu_ctx* ctx = qp->ctx;
  int rc = 0;
  pthread_mutex_lock(&ctx->lock);
  for (; wr; wr = wr->next) {
    if (qp->st == AGOQ_IBV_QPS_RESET)
      rc = EINVAL;
    else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_recv_sge || (wr->num_sge && !wr->sg_list))
      rc = EINVAL;
    else if (qp->rq_count >= qp->cap.max_recv_wr)
      rc = ENOMEM;
    if (rc) break;
    emu_rwr* r = &qp->rq[(qp->rq_head + qp->rq_count) % qp->rq_cap];
    r->wr_id = wr->wr_id;
    r->nsge = wr->num_sge;
    if (wr->num_sge) memcpy(r->sge, wr->sg_list, sizeof *wr->sg_list * (size_t)wr->num_sge);
    qp->rq_count++;
    if (qp->st == AGOQ_IBV_QPS_ERR) emu_qp_set_err(qp);
  }
  pthread_mutex_unlock(&ctx->lock);
  if (rc && bad) *bad = wr;
  return rc;
}
