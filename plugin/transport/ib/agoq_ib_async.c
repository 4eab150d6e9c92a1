/* Asynchronous events of the devices (ibv_get_async_event(3)): a port going down or
 * coming back, a device or queue pair in a catastrophic state, a GID table change. They
 * are what explains a later completion error: a queue pair whose port went down fails with
 * status 12 only after its ACK timeout and retries (tens of seconds), with nothing in the
 * completion itself that says why. So each event is logged once, as it happens, and what
 * it says about a port is kept for the completion error's hint; a catastrophic device error
 * fails the device's connections at once (no completion may ever come).
 *
 * The progress helper drains the events between sweeps (agoq_ib_helper.c), and a
 * connection's first completion error drains them before it explains itself: a poll of
 * each context's async_fd that never blocks, and a read only when one is queued. */
#include <poll.h>
#include <stdio.h>

#include "core/agoq_check.h"
#include "transport/ib/agoq_ib.h"

static const char* agoq_ib_event_name(int type) {
  return agoq_ib.api.event_type_str != NULL ? agoq_ib.api.event_type_str(type) : "?";
}

/* Devices (ports) on context ctx, optionally only port `port` (0: any). */
static void agoq_ib_async_port(agoq_ib_state* st, struct agoq_ibv_context* ctx, int port, bool down) {
  for (int i = 0; i < st->ndevs; i++) {
    agoq_ib_dev* d = &st->devs[i];
    if (d->ctx != ctx || d->port != port) continue;
    if (down) {
      d->port_down_ms = agoq_ib_now_ms();
      atomic_store(&d->port_down, 1);
      AGOQ_WARN("%s: the port went DOWN (IBV_EVENT_PORT_ERR): connections with work in flight on it fail once their "
                "queue pairs time out (AGOQ_IB_TIMEOUT, AGOQ_IB_RETRY_CNT) unless it comes back first; check the "
                "cable, the switch port and the subnet manager",
                d->describe);
    } else if (atomic_exchange(&d->port_down, 0) != 0) {
      AGOQ_INFO(NCCL_NET, "%s: the port is ACTIVE again (IBV_EVENT_PORT_ACTIVE) after %lld ms down", d->describe,
                (long long)(agoq_ib_now_ms() - d->port_down_ms));
    }
  }
}

/* One event of context ctx (of device index `first`, the context's first port). */
static void agoq_ib_async_one(agoq_ib_state* st, int first, const struct agoq_ibv_async_event* ev) {
  agoq_ib_dev* d = &st->devs[first];
  int type = ev->event_type;
  switch (type) {
    case AGOQ_IBV_EVENT_PORT_ERR:
    case AGOQ_IBV_EVENT_PORT_ACTIVE:
      agoq_ib_async_port(st, d->ctx, ev->element.port_num, type == AGOQ_IBV_EVENT_PORT_ERR);
      return;
    case AGOQ_IBV_EVENT_DEVICE_FATAL:
      AGOQ_WARN("%s: catastrophic device error (IBV_EVENT_DEVICE_FATAL): every connection on %s fails; the device "
                "needs a reset (driver reload) before it carries traffic again",
                d->describe, d->dev_name);
      for (int i = 0; i < st->ndevs; i++)
        if (st->devs[i].ctx == d->ctx) atomic_store(&st->devs[i].fatal, 1);
      return;
    case AGOQ_IBV_EVENT_QP_FATAL:
    case AGOQ_IBV_EVENT_QP_REQ_ERR:
    case AGOQ_IBV_EVENT_QP_ACCESS_ERR:
      AGOQ_WARN("%s: %s (event %d) on queue pair %u: its connection fails with the completion error that follows",
                d->describe, agoq_ib_event_name(type), type, ev->element.qp != NULL ? ev->element.qp->qp_num : 0);
      return;
    case AGOQ_IBV_EVENT_CQ_ERR:
      AGOQ_WARN("%s: %s (event %d): a completion queue overflowed; its connection stops completing", d->describe,
                agoq_ib_event_name(type), type);
      return;
    case AGOQ_IBV_EVENT_GID_CHANGE:
      AGOQ_WARN("%s: the GID table changed (IBV_EVENT_GID_CHANGE): the GID chosen at init (index %d) may now name "
                "another address; new connections use the old choice until the process restarts",
                d->describe, d->gid_index);
      return;
    default:
      AGOQ_INFO(NCCL_NET, "%s: asynchronous event: %s (%d)", d->describe, agoq_ib_event_name(type), type);
      return;
  }
}

/* One drainer at a time: a second thread's read after the first consumed the event it
 * polled would block. A second one waits, so that it sees what the first one handled (a
 * completion error's hint). A leaf lock: nothing else is taken while it is held. */
static pthread_mutex_t agoq_ib_async_mu = PTHREAD_MUTEX_INITIALIZER;

int agoq_ib_async_drain(agoq_ib_state* st) {
  pthread_mutex_lock(&agoq_ib_async_mu);
  int handled = 0;
  for (int i = 0; i < st->ndevs; i++) {
    struct agoq_ibv_context* ctx = st->devs[i].ctx;
    bool first = true; /* ports of one device share a context: drain it once */
    for (int k = 0; k < i && first; k++) first = st->devs[k].ctx != ctx;
    if (!first || ctx == NULL || ctx->async_fd < 0) continue;
    for (;;) {
      struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
      if (poll(&p, 1, 0) != 1 || !(p.revents & POLLIN)) break;
      struct agoq_ibv_async_event ev;
      if (st->api.get_async_event(ctx, &ev) != 0) break;
      agoq_ib_async_one(st, i, &ev);
      st->api.ack_async_event(&ev);
      handled++;
    }
  }
  pthread_mutex_unlock(&agoq_ib_async_mu);
  return handled;
}
