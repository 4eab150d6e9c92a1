/* A connection's verbs resources: completion queue, RC queue pairs, the two rings; and the
 * queue pairs' way from INIT through RTR to RTS against the peer's metadata. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "transport/ib/agoq_ib.h"

static const char* agoq_ib_qp_state_name(int s) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return s >= 0 && s < (int)(sizeof names / sizeof names[0]) ? names[s] : "UNKNOWN";
}

/* Page-aligned, zeroed memory: registered memory is pinned by the page. */
static void* agoq_ib_alloc_pages(size_t bytes) {
  long page = sysconf(_SC_PAGESIZE);
  size_t align = page > 0 ? (size_t)page : 4096;
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = NULL;
  if (posix_memalign(&p, align, rounded) != 0) return NULL;
  memset(p, 0, rounded);
  return p;
}

ncclResult_t agoq_ib_reg(agoq_ib_conn* c, void* addr, size_t bytes, int access, struct agoq_ibv_mr** out,
                         const char* what) {
  *out = agoq_ib.api.reg_mr(c->d->pd, addr, bytes, access);
  if (*out != NULL) return ncclSuccess;
  int err = errno;
  AGOQ_WARN("%s: ibv_reg_mr of %zu bytes for the %s (connection with %s) failed: %s%s", c->d->describe, bytes, what,
            c->peer, strerror(err),
            err == ENOMEM ? " (RLIMIT_MEMLOCK too low? raise it with ulimit -l, or --ulimit memlock=-1 in a "
                            "container)"
                          : "");
  agoq_ib_conn_fail(c, ncclSystemError);
  return ncclSystemError;
}

ncclResult_t agoq_ib_post_recv_wr(agoq_ib_conn* c, int qp) {
  /* Only WRITE_WITH_IMM arrives: a receive consumes no bytes, so it needs no buffer. */
  struct agoq_ibv_recv_wr wr = {.wr_id = agoq_ib_wr_id(AGOQ_IB_WR_RECV, (uint32_t)qp)};
  struct agoq_ibv_recv_wr* bad = NULL;
  int rc = agoq_ibv_post_recv(c->qps[qp], &wr, &bad);
  if (rc != 0) {
    AGOQ_WARN("%s: ibv_post_recv on queue pair %u failed: %s", c->d->describe, c->qps[qp]->qp_num, strerror(rc));
    return ncclSystemError;
  }
  return ncclSuccess;
}

static ncclResult_t agoq_ib_qp_create(agoq_ib_conn* c, int i) {
  struct agoq_ibv_qp_init_attr init = {
      .send_cq = c->cq,
      .recv_cq = c->cq,
      .cap = {.max_send_wr = AGOQ_IB_QP_SEND_WR, .max_recv_wr = AGOQ_IB_QP_RECV_WR, .max_send_sge = 1,
              .max_recv_sge = 1},
      .qp_type = AGOQ_IBV_QPT_RC,
  };
  c->qps[i] = agoq_ib.api.create_qp(c->d->pd, &init);
  if (c->qps[i] == NULL) {
    AGOQ_WARN("%s: ibv_create_qp failed: %s", c->d->describe, strerror(errno));
    return ncclSystemError;
  }
  struct agoq_ibv_qp_attr attr = {
      .qp_state = AGOQ_IBV_QPS_INIT,
      .pkey_index = 0,
      .port_num = (uint8_t)c->d->port,
      /* The peer writes into our rings and, receiving, into our buffers. */
      .qp_access_flags = AGOQ_IBV_ACCESS_REMOTE_WRITE | AGOQ_IBV_ACCESS_REMOTE_READ,
  };
  int rc = agoq_ib.api.modify_qp(c->qps[i], &attr,
                                 AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_PKEY_INDEX | AGOQ_IBV_QP_PORT | AGOQ_IBV_QP_ACCESS_FLAGS);
  if (rc != 0) {
    AGOQ_WARN("%s: ibv_modify_qp RESET->INIT of queue pair %u failed: %s", c->d->describe, c->qps[i]->qp_num,
              strerror(rc));
    return ncclSystemError;
  }
  for (int k = 0; k < AGOQ_IB_QP_RECV_WR; k++) AGOQ_CHECK(agoq_ib_post_recv_wr(c, i));
  return ncclSuccess;
}

ncclResult_t agoq_ib_conn_resources(agoq_ib_conn* c, int nqps) {
  const agoq_ib_dev* d = c->d;
  int cqe = nqps * (AGOQ_IB_QP_SEND_WR + AGOQ_IB_QP_RECV_WR);
  if (d->max_qp_wr < AGOQ_IB_QP_SEND_WR || d->max_cqe < cqe) {
    AGOQ_WARN("%s: the device allows %d work requests per queue pair and %d completions per queue; a connection "
              "with %d queue pairs needs %d and %d",
              d->describe, d->max_qp_wr, d->max_cqe, nqps, AGOQ_IB_QP_SEND_WR, cqe);
    return ncclSystemError;
  }
  c->cq = agoq_ib.api.create_cq(d->ctx, cqe, c, NULL, 0);
  if (c->cq == NULL) {
    AGOQ_WARN("%s: ibv_create_cq of %d entries failed: %s", d->describe, cqe, strerror(errno));
    return ncclSystemError;
  }
  c->nqps = nqps;
  for (int i = 0; i < nqps; i++) AGOQ_CHECK(agoq_ib_qp_create(c, i));
  c->ring_slot = c->is_send ? AGOQ_IB_CTS_SIZE : AGOQ_IB_RTS_SLOT_SIZE;
  c->out_slot = c->is_send ? AGOQ_IB_RTS_SLOT_SIZE : AGOQ_IB_CTS_SIZE;
  c->ring = agoq_ib_alloc_pages(c->ring_slot * c->nslots);
  c->out = agoq_ib_alloc_pages(c->out_slot * c->nslots);
  if (c->ring == NULL || c->out == NULL) {
    AGOQ_WARN("out of memory for a verbs connection's rings");
    return ncclSystemError;
  }
  AGOQ_CHECK(agoq_ib_reg(c, c->ring, c->ring_slot * c->nslots,
                         AGOQ_IBV_ACCESS_LOCAL_WRITE | AGOQ_IBV_ACCESS_REMOTE_WRITE, &c->ring_mr, "ring"));
  AGOQ_CHECK(agoq_ib_reg(c, c->out, c->out_slot * c->nslots, AGOQ_IBV_ACCESS_LOCAL_WRITE, &c->out_mr,
                         "outgoing ring entries"));
  return ncclSuccess;
}

size_t agoq_ib_conn_ring_bytes(const agoq_ib_conn* c) { return (c->ring_slot + c->out_slot) * c->nslots; }

void agoq_ib_meta_fill(const agoq_ib_conn* c, agoq_ib_meta* m) {
  memset(m, 0, sizeof *m);
  m->role = c->is_send ? 0 : 1;
  m->nqps = (uint8_t)c->nqps;
  m->link_layer = (uint8_t)c->d->link_layer;
  m->mtu = (uint8_t)c->d->active_mtu;
  m->port = (uint8_t)c->d->port;
  m->gid_index = (uint8_t)c->d->gid_index;
  m->lid = c->d->lid;
  memcpy(m->gid, c->d->gid, 16);
  for (int i = 0; i < c->nqps; i++) m->qpn[i] = c->qps[i]->qp_num;
  m->ring_addr = (uint64_t)(uintptr_t)c->ring;
  m->ring_rkey = c->ring_mr->rkey;
  m->ring_slots = c->nslots;
  m->slot_size = (uint32_t)c->ring_slot;
  m->eager_max = c->is_send ? 0 : AGOQ_IB_EAGER_MAX;
}

/* One transition, logged as NCCL does when it fails (both GIDs: the usual cause). */
static ncclResult_t agoq_ib_modify(agoq_ib_conn* c, int i, struct agoq_ibv_qp_attr* attr, int mask, int from) {
  int rc = agoq_ib.api.modify_qp(c->qps[i], attr, mask);
  if (rc == 0) return ncclSuccess;
  char local[48];
  agoq_ib_gid_format(c->d->gid, local, sizeof local);
  AGOQ_WARN("%s: ibv_modify_qp %s->%s of queue pair %u failed: %s (errno %d); local GID index %d %s, remote GID "
            "%s, path MTU %d; %s",
            c->d->describe, agoq_ib_qp_state_name(from), agoq_ib_qp_state_name(attr->qp_state), c->qps[i]->qp_num,
            strerror(rc), rc, c->d->gid_index, local, c->peer_gid, agoq_ib_mtu_bytes(attr->path_mtu),
            rc == ETIMEDOUT || rc == ENETUNREACH
                ? "the peer's address cannot be resolved: check the GID (AGOQ_IB_GID_INDEX) and the routing"
                : "check AGOQ_IB_HCA, AGOQ_IB_GID_INDEX and AGOQ_IB_TC");
  return ncclSystemError;
}

ncclResult_t agoq_ib_conn_ready(agoq_ib_conn* c, const agoq_ib_meta* peer) {
  if (peer->link_layer != c->d->link_layer) {
    AGOQ_WARN("%s: the peer %s uses a %s port, this one is %s: incompatible devices; select NICs of one link type "
              "with AGOQ_IB_HCA",
              c->d->describe, c->peer, agoq_ib_link_layer_name(peer->link_layer),
              agoq_ib_link_layer_name(c->d->link_layer));
    return ncclInvalidUsage;
  }
  if (peer->nqps != c->nqps || peer->role == (c->is_send ? 0 : 1) ||
      peer->slot_size != (c->is_send ? AGOQ_IB_RTS_SLOT_SIZE : AGOQ_IB_CTS_SIZE) ||
      peer->ring_slots != c->nslots || (!c->is_send && peer->eager_max != 0) ||
      (c->is_send && peer->eager_max != AGOQ_IB_EAGER_MAX)) {
    AGOQ_WARN("%s: the peer %s offers %u queue pairs, a ring of %u slots of %u bytes and inline messages up to %u "
              "bytes as %s; this side expects %d, %u, %zu and %u (a different agoq version?)",
              c->d->describe, c->peer, peer->nqps, peer->ring_slots, peer->slot_size, peer->eager_max,
              peer->role ? "receiver" : "sender", c->nqps, c->nslots,
              c->is_send ? (size_t)AGOQ_IB_RTS_SLOT_SIZE : (size_t)AGOQ_IB_CTS_SIZE,
              c->is_send ? AGOQ_IB_EAGER_MAX : 0);
    return ncclInvalidUsage;
  }
  c->peer_ring_addr = peer->ring_addr;
  c->peer_ring_rkey = peer->ring_rkey;
  c->peer_slot = peer->slot_size;
  c->eager_max = c->is_send ? peer->eager_max : AGOQ_IB_EAGER_MAX;
  c->peer_mtu = peer->mtu;
  agoq_ib_gid_format(peer->gid, c->peer_gid, sizeof c->peer_gid);
  int mtu = peer->mtu < c->d->active_mtu ? peer->mtu : c->d->active_mtu;
  bool roce = c->d->link_layer == AGOQ_IBV_LINK_LAYER_ETHERNET;
  for (int i = 0; i < c->nqps; i++) {
    struct agoq_ibv_qp_attr rtr = {
        .qp_state = AGOQ_IBV_QPS_RTR,
        .path_mtu = mtu,
        .dest_qp_num = peer->qpn[i],
        .rq_psn = 0,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
    };
    rtr.ah_attr.port_num = (uint8_t)c->d->port;
    rtr.ah_attr.sl = (uint8_t)agoq_ib.sl;
    if (roce) {
      /* RoCE has no LIDs: always routed by GID. */
      rtr.ah_attr.is_global = 1;
      memcpy(rtr.ah_attr.grh.dgid.raw, peer->gid, 16);
      rtr.ah_attr.grh.sgid_index = (uint8_t)c->d->gid_index;
      rtr.ah_attr.grh.hop_limit = 255;
      rtr.ah_attr.grh.traffic_class = (uint8_t)agoq_ib.tc;
    } else {
      rtr.ah_attr.dlid = peer->lid;
    }
    AGOQ_CHECK(agoq_ib_modify(c, i, &rtr,
                              AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_AV | AGOQ_IBV_QP_PATH_MTU | AGOQ_IBV_QP_DEST_QPN |
                                  AGOQ_IBV_QP_RQ_PSN | AGOQ_IBV_QP_MAX_DEST_RD_ATOMIC | AGOQ_IBV_QP_MIN_RNR_TIMER,
                              AGOQ_IBV_QPS_INIT));
    struct agoq_ibv_qp_attr rts = {
        .qp_state = AGOQ_IBV_QPS_RTS,
        .sq_psn = 0,
        .timeout = (uint8_t)agoq_ib.timeout,
        .retry_cnt = (uint8_t)agoq_ib.retry_cnt,
        .rnr_retry = 7, /* receives are always posted ahead: an RNR only ever waits */
        .max_rd_atomic = 1,
    };
    AGOQ_CHECK(agoq_ib_modify(c, i, &rts,
                              AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_SQ_PSN | AGOQ_IBV_QP_TIMEOUT | AGOQ_IBV_QP_RETRY_CNT |
                                  AGOQ_IBV_QP_RNR_RETRY | AGOQ_IBV_QP_MAX_QP_RD_ATOMIC,
                              AGOQ_IBV_QPS_RTR));
  }
  return ncclSuccess;
}
