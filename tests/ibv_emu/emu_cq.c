/*
 * Completion queues.
 *
 * A CQ holds cq->cqe entries. One more completion than that is an overrun: the CQ goes to
 * error (IB spec 11.4.2.1 / C11-23: "CQ overrun ... affiliated asynchronous error"), the
 * consumer gets IBV_EVENT_CQ_ERR, every QP using the CQ goes to ERR, and completions are
 * lost from then on. An error completion carries only wr_id, status, qp_num and vendor_err
 * (ibv_poll_cq(3): "the other attributes ... are not valid"): here they are junk on
 * purpose, so that code reading them fails in tests rather than on hardware.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

EMU_EXPORT struct agoq_ibv_cq* ibv_create_cq(struct agoq_ibv_context* ibctx, int cqe, void* cq_context,
                                             struct agoq_ibv_comp_channel* channel, int comp_vector) {
  emu_ctx* ctx = (emu_ctx*)ibctx;
  /* ibv_create_cq(3): cqe must be at least 1 and at most the device's max_cqe; no
   * completion channels in the emulator; comp_vector < num_comp_vectors. */
  if (!ctx || cqe < 1 || cqe > ctx->dev.cfg.max_cqe || channel || comp_vector < 0 ||
      comp_vector >= ctx->ibv.num_comp_vectors) {
    errno = EINVAL;
    return NULL;
  }
  emu_cq* cq = calloc(1, sizeof *cq);
  emu_cqe* ring = calloc((size_t)cqe, sizeof *ring);
  if (!cq || !ring) {
    free(cq);
    free(ring);
    errno = ENOMEM;
    return NULL;
  }
  cq->ring = ring;
  cq->cap = cqe;
  cq->ibv.context = ibctx;
  cq->ibv.cq_context = cq_context;
  cq->ibv.cqe = cqe;
  pthread_mutex_init(&cq->ibv.mutex, NULL);
  pthread_cond_init(&cq->ibv.cond, NULL);
  pthread_mutex_lock(&ctx->lock);
  cq->ibv.handle = ctx->next_handle++;
  cq->next = ctx->cqs;
  ctx->cqs = cq;
  pthread_mutex_unlock(&ctx->lock);
  return &cq->ibv;
}

static void cq_free(emu_cq* cq) {
  pthread_mutex_destroy(&cq->ibv.mutex);
  pthread_cond_destroy(&cq->ibv.cond);
  free(cq->ring);
  free(cq);
}

/* ibv_destroy_cq(3): EBUSY while a QP still uses the CQ. */
EMU_EXPORT int ibv_destroy_cq(struct agoq_ibv_cq* ibcq) {
  if (!ibcq) return errno = EINVAL;
  emu_ctx* ctx = (emu_ctx*)ibcq->context;
  emu_cq* cq = (emu_cq*)ibcq;
  pthread_mutex_lock(&ctx->lock);
  if (cq->nqp) {
    pthread_mutex_unlock(&ctx->lock);
    return errno = EBUSY;
  }
  for (emu_cq** pp = &ctx->cqs; *pp; pp = &(*pp)->next)
    if (*pp == cq) {
      *pp = cq->next;
      break;
    }
  pthread_mutex_unlock(&ctx->lock);
  cq_free(cq);
  return 0;
}

void emu_cq_free_all(emu_ctx* ctx) {
  while (ctx->cqs) {
    emu_cq* c = ctx->cqs;
    ctx->cqs = c->next;
    cq_free(c);
  }
}

/* Vendor syndromes in the style of mlx5 (any non-zero value would do). */
uint32_t emu_vendor_err(int status) {
  switch (status) {
    case AGOQ_IBV_WC_SUCCESS: return 0;
    case AGOQ_IBV_WC_LOC_LEN_ERR: return 0x51;
    case AGOQ_IBV_WC_LOC_PROT_ERR: return 0x56;
    case AGOQ_IBV_WC_WR_FLUSH_ERR: return 0xf9;
    case AGOQ_IBV_WC_REM_INV_REQ_ERR: return 0x8a;
    case AGOQ_IBV_WC_REM_ACCESS_ERR: return 0x88;
    case AGOQ_IBV_WC_REM_OP_ERR: return 0x89;
    case AGOQ_IBV_WC_RETRY_EXC_ERR: return 0x81;
    case AGOQ_IBV_WC_RNR_RETRY_EXC_ERR: return 0x82;
    default: return 0xfe;
  }
}

void emu_cq_push(emu_ctx* ctx, emu_cq* cq, const emu_cqe* e) {
  if (cq->overflowed) return; /* a CQ in error loses completions */
  if (cq->count == cq->cap) {
    cq->overflowed = 1;
    emu_async_push(ctx, AGOQ_IBV_EVENT_CQ_ERR, &cq->ibv, 0);
    for (emu_qp* q = ctx->qps; q; q = q->next)
      if ((q->ibv.send_cq == &cq->ibv || q->ibv.recv_cq == &cq->ibv) && q->st != AGOQ_IBV_QPS_ERR &&
          q->st != AGOQ_IBV_QPS_RESET)
        emu_qp_set_err(q);
    return;
  }
  cq->ring[(cq->head + cq->count) % cq->cap] = *e;
  cq->count++;
}

/* ibv_poll_cq(3): up to n completions, oldest first; the number returned. Polling a send
 * completion frees its send-queue slot and those of the unsignaled WRs before it. */
int emu_cq_poll(struct agoq_ibv_cq* ibcq, int n, struct agoq_ibv_wc* wc) {
  if (!ibcq || n < 0 || (n > 0 && !wc)) return -1;
  emu_ctx* ctx = (emu_ctx*)ibcq->context;
  emu_cq* cq = (emu_cq*)ibcq;
  int got = 0;
  pthread_mutex_lock(&ctx->lock);
  while (got < n && cq->count > 0) {
    emu_cqe* e = &cq->ring[cq->head];
    cq->head = (cq->head + 1) % cq->cap;
    cq->count--;
    if (e->wc.status != AGOQ_IBV_WC_SUCCESS) {
      memset(&wc[got], 0xA5, sizeof wc[got]);
      wc[got].wr_id = e->wc.wr_id;
      wc[got].status = e->wc.status;
      wc[got].qp_num = e->wc.qp_num;
      wc[got].vendor_err = e->wc.vendor_err;
    } else {
      wc[got] = e->wc;
    }
    if (e->is_send) {
      emu_qp* qp = emu_qp_find(ctx, e->wc.qp_num);
      if (qp) emu_qp_retire(qp, e->seq);
    }
    got++;
  }
  pthread_mutex_unlock(&ctx->lock);
  return got;
}
