/* Completion errors: the first of a connection is logged with everything that identifies
 * it and a hint for the known causes; the flushes that follow it (every outstanding work
 * request of a queue pair in ERR completes with WR_FLUSH_ERR) are counted, not logged.
 * Only wr_id, status, qp_num and vendor_err of an error completion are defined
 * (ibv_poll_cq(3)): the opcode a failed completion shows is garbage, so the kind of work
 * request comes from our own wr_id. */
#include <stdio.h>

#include "core/agoq_check.h"
#include "transport/ib/agoq_ib.h"

static const char* agoq_ib_wr_kind_name(uint64_t wr_id) {
  switch ((agoq_ib_wr_kind)(wr_id >> 56)) {
    case AGOQ_IB_WR_RTS: return "message description (RDMA WRITE_WITH_IMM)";
    case AGOQ_IB_WR_CTS: return "answer to a message description (RDMA WRITE_WITH_IMM)";
    case AGOQ_IB_WR_DATA: return "payload (RDMA WRITE)";
    case AGOQ_IB_WR_RECV: return "receive";
  }
  return "unknown work request";
}

static const char* agoq_ib_status_hint(int status) {
  switch (status) {
    case AGOQ_IBV_WC_RETRY_EXC_ERR:
      return "the NICs cannot reach each other: usually the GID (a link-local or RoCE v1 entry; see the GID "
             "table at INFO and AGOQ_IB_GID_INDEX), RoCE v1/v2 mismatch, routing or traffic class; or the peer "
             "process died. Check with ib_write_bw using the same GID index and traffic class. A higher "
             "AGOQ_IB_TIMEOUT only helps a congested fabric";
    case AGOQ_IBV_WC_LOC_PROT_ERR:
      return "a local buffer outside its registration; with GPU memory usually PCIe ACS/IOMMU redirecting "
             "peer-to-peer traffic (confirm with NCCL_NET_GDR_LEVEL=0)";
    case AGOQ_IBV_WC_REM_ACCESS_ERR:
      return "the peer's buffer key or range was refused (a stale registration or a protocol mismatch between "
             "agoq versions)";
    case AGOQ_IBV_WC_RNR_RETRY_EXC_ERR:
      return "the peer posted no receive in time (its process is stalled or gone)";
    case AGOQ_IBV_WC_WR_FLUSH_ERR:
      return "the queue pair was already in error (an earlier failure, or the connection was closed)";
  }
  return "see the verbs status";
}

void agoq_ib_completion_error(agoq_ib_conn* c, const struct agoq_ibv_wc* wc) {
  agoq_ib_conn_fail(c, ncclRemoteError);
  if (c->error_logged) {
    c->flushed++;
    return;
  }
  c->error_logged = true;
  /* A port that went down says so before this error explains itself. */
  agoq_ib_async_drain(&agoq_ib);
  char local[48];
  agoq_ib_gid_format(c->d->gid, local, sizeof local);
  const char* status = agoq_ib.api.wc_status_str != NULL ? agoq_ib.api.wc_status_str(wc->status) : "?";
  /* What the asynchronous events said outranks the guesses. */
  char hint[160];
  const char* why = agoq_ib_status_hint(wc->status);
  if (atomic_load(&c->d->port_down)) {
    snprintf(hint, sizeof hint, "this port went DOWN %lld ms ago (IBV_EVENT_PORT_ERR, logged then)",
             (long long)(agoq_ib_now_ms() - c->d->port_down_ms));
    why = hint;
  }
  AGOQ_WARN("%s: completion error on the connection %s %s: status %s (%d), vendor error 0x%x, %s on queue pair %u; "
            "local GID index %d %s, peer GID %s; %s",
            c->d->describe, c->is_send ? "to" : "from", c->peer, status, wc->status, wc->vendor_err,
            agoq_ib_wr_kind_name(wc->wr_id), wc->qp_num, c->d->gid_index, local, c->peer_gid, why);
}
