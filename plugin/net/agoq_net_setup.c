/* Connection setup as NCCL's contract has it: listen, connect and accept over the
 * transport (which owns sockets and handshakes), each connection wrapped in a comm with
 * its request pool, staging and statistics. Nothing here blocks: a NULL comm means
 * "call again". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"
#include "net/agoq_net_comm.h"

const char* agoq_comm_peer(const agoq_comm* comm) { return agoq_net_tp->peer(comm->tp); }

ncclResult_t agoq_comm_create(bool is_send, int dev, agoq_tp_conn* tp, unsigned flags, agoq_comm** out) {
  ncclResult_t res = ncclSuccess;
  agoq_comm* comm = calloc(1, sizeof *comm);
  if (comm == NULL) {
    AGOQ_WARN("out of memory creating a comm");
    agoq_net_tp->close(tp);
    return ncclSystemError;
  }
  comm->magic = is_send ? AGOQ_SEND_MAGIC : AGOQ_RECV_MAGIC;
  comm->is_send = is_send;
  comm->dev = dev;
  comm->tp = tp;
  comm->stage.reg = (agoq_stage_reg){.reg = agoq_net_tp->reg, .dereg = agoq_net_tp->dereg, .dev = dev};
  /* NCCL keeps up to NCCL_NET_MAX_REQUESTS receives (each of up to maxRecvs buffers) and
   * NCCL_NET_MAX_REQUESTS x maxRecvs sends in flight; both sides get the larger bound. A
   * CollNet connection (AGOQ_TP_FEW) holds one operation per pipeline chunk: its depth (a
   * 1024-rank grid's 124 connections per rank then take 2 MB of requests, not 16 MB). */
  bool tagged = !is_send && (flags & AGOQ_NET_TAGGED);
  uint32_t depth = tagged ? AGOQ_TAGQ_LANDINGS : (flags & AGOQ_TP_FEW) ? AGOQ_TP_FEW_DEPTH : AGOQ_REQUESTS_PER_COMM;
  AGOQ_CHECK_GOTO(agoq_request_pool_init(&comm->pool, depth), res, fail);
  if (tagged)
    AGOQ_CHECK_GOTO(agoq_tagq_create(comm), res, fail);
  else if (!is_send)
    agoq_net_tp->set_match(tp, agoq_net_match, comm);
  *out = comm;
  return ncclSuccess;
fail:
  agoq_comm_destroy(comm);
  return res;
}

void agoq_comm_destroy(agoq_comm* comm) {
  if (comm->tp != NULL) {
    if (comm->typed_stats.frames > 0 || comm->typed_stats.unknown_type > 0)
      agoq_typed_stats_log(&comm->typed_stats, comm->is_send, agoq_comm_peer(comm));
    agoq_dev_log(comm);
    agoq_tagq_log(comm);
    /* After this no helper thread touches a posted buffer, staging included. */
    agoq_net_tp->close(comm->tp);
  }
  agoq_tagq_destroy(comm);
  /* After the transport: no helper thread writes into the pinned staging any more. */
  agoq_dev_close(comm);
  agoq_stage_fini(&comm->stage);
  agoq_request_pool_fini(&comm->pool);
  comm->magic = 0;
  free(comm);
}

void agoq_net_stats_detach(void* p) {
  agoq_comm* comm = p;
  if (comm != NULL && (comm->magic == AGOQ_SEND_MAGIC || comm->magic == AGOQ_RECV_MAGIC)) comm->st = NULL;
}

static bool agoq_ctx_ok(const agoq_ctx* c) { return c != NULL && c->magic == AGOQ_CTX_MAGIC && agoq_net_tp != NULL; }

ncclResult_t agoq_net_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  return agoq_net_listen_flags(ctx, dev, 0, handle, listen_comm);
}

ncclResult_t agoq_net_listen_flags(void* ctx, int dev, unsigned flags, void* handle, void** listen_comm) {
  ncclResult_t res = ncclSuccess;
  agoq_ctx* c = ctx;
  agoq_listen_comm* l = NULL;
  AGOQ_ARG_CHECK(agoq_ctx_ok(c), res, out);
  AGOQ_ARG_CHECK(handle != NULL && listen_comm != NULL, res, out);
  AGOQ_ARG_CHECK(dev >= 0 && dev < agoq_net_tp->ndevs(), res, out);
  *listen_comm = NULL;
  AGOQ_CALLOC_GOTO(l, 1, res, out);
  l->magic = AGOQ_NLISTEN_MAGIC;
  l->dev = dev;
  l->flags = flags;
  l->st_recv = c->st_recv;
  res = agoq_net_tp->listen(dev, c->comm_id, agoq_net_tp_flags(flags), handle, &l->tp);
  if (res != ncclSuccess) {
    free(l);
    goto out;
  }
  *listen_comm = l;
out:
  return res;
}

ncclResult_t agoq_net_close_listen(void* listen_comm) {
  agoq_listen_comm* l = listen_comm;
  if (l == NULL) return ncclSuccess;
  if (l->magic != AGOQ_NLISTEN_MAGIC) {
    AGOQ_WARN("closeListen: not an agoq listen comm (%p)", listen_comm);
    return ncclInternalError;
  }
  ncclResult_t res = agoq_net_tp->close_listen(l->tp);
  l->magic = 0;
  free(l);
  return res;
}

ncclResult_t agoq_net_connect(void* ctx, int dev, void* handle, void** send_comm) {
  return agoq_net_connect_flags(ctx, dev, 0, handle, send_comm);
}

ncclResult_t agoq_net_connect_flags(void* ctx, int dev, unsigned flags, void* handle, void** send_comm) {
  ncclResult_t res = ncclSuccess;
  agoq_ctx* c = ctx;
  AGOQ_ARG_CHECK(agoq_ctx_ok(c), res, out);
  AGOQ_ARG_CHECK(handle != NULL && send_comm != NULL, res, out);
  AGOQ_ARG_CHECK(dev >= 0 && dev < agoq_net_tp->ndevs(), res, out);
  *send_comm = NULL;
  agoq_tp_conn* tp = NULL;
  AGOQ_CHECK_GOTO(agoq_net_tp->connect(dev, c->comm_id, agoq_net_tp_flags(flags), handle, &tp), res, out);
  if (tp == NULL) return ncclSuccess; /* the handshake is still under way */
  agoq_comm* comm;
  AGOQ_CHECK_GOTO(agoq_comm_create(true, dev, tp, flags, &comm), res, out);
  comm->prof_fn = c->prof_fn;
  comm->st = c->st_send;
  *send_comm = comm;
out:
  return res;
}

void agoq_net_connect_abort(void* handle) {
  if (handle != NULL && agoq_net_tp != NULL) agoq_net_tp->connect_abort(handle);
}

ncclResult_t agoq_net_accept(void* listen_comm, void** recv_comm) {
  ncclResult_t res = ncclSuccess;
  agoq_listen_comm* l = listen_comm;
  AGOQ_ARG_CHECK(l != NULL && l->magic == AGOQ_NLISTEN_MAGIC && recv_comm != NULL, res, out);
  *recv_comm = NULL;
  agoq_tp_conn* tp = NULL;
  AGOQ_CHECK_GOTO(agoq_net_tp->accept(l->tp, &tp), res, out);
  if (tp == NULL) return ncclSuccess;
  agoq_comm* comm;
  AGOQ_CHECK_GOTO(agoq_comm_create(false, l->dev, tp, l->flags, &comm), res, out);
  comm->st = l->st_recv;
  *recv_comm = comm;
out:
  return res;
}
