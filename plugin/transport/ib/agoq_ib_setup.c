/* Connection setup over a TCP bootstrap: listen, the staged non-blocking connect, and
 * accept. The TCP transport's handshake (communicator id and the listen instance's nonce)
 * admits the peer; the queue-pair metadata and a final "ready" travel over the bootstrap
 * connection, which is closed once the queue pairs are in RTS. Nothing here blocks: each
 * step is retried by NCCL's next call. The connector is always the sender. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "transport/ib/agoq_ib.h"

#define AGOQ_IB_LISTEN_MAGIC 0x4e4c4241u  /* "ABLN" */
#define AGOQ_IB_CONNECT_MAGIC 0x53434241u /* "ABCS" */
#define AGOQ_IB_READY_SIZE 8
#define AGOQ_IB_READY_WORD 0x5944524551474141ull /* "AAGQREDY" */

/* The bootstrap always uses the TCP transport's first interface (the out-of-band network
 * NCCL's own IB transport uses too). */
#define AGOQ_IB_BOOT_DEV 0

typedef enum { AGOQ_IB_STAGE_BOOT = 0, AGOQ_IB_STAGE_META, AGOQ_IB_STAGE_READY } agoq_ib_stage;

/* One connection being set up, on either side. */
typedef struct agoq_ib_setup {
  agoq_ib_stage stage;
  agoq_tp_conn* boot;
  agoq_ib_conn* c;
  uint8_t meta_out[AGOQ_IB_META_SIZE];
  uint8_t meta_in[AGOQ_IB_META_SIZE];
  uint8_t ready[AGOQ_IB_READY_SIZE];
  int64_t deadline_ms; /* acceptor: give up on a peer that stalls */
  struct agoq_ib_setup* next;
} agoq_ib_setup;

typedef struct {
  uint32_t magic;
  int dev;
  agoq_tp_listen* boot;
  agoq_ib_setup* pending;
} agoq_ib_listen_comm;

typedef struct {
  uint32_t magic;
  int dev;
  unsigned flags; /* the connect's (AGOQ_TP_FEW) */
  /* The TCP transport's connect state lives here, behind a pointer it reads in place: the
   * handle must be as aligned as NCCL's. */
  _Alignas(8) uint8_t boot_handle[NCCL_NET_HANDLE_MAXSIZE];
  agoq_ib_setup s;
} agoq_ib_connect_state;

int64_t agoq_ib_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static ncclResult_t agoq_ib_conn_create(bool is_send, int dev, agoq_tp_conn* boot, agoq_ib_conn** out) {
  ncclResult_t res = ncclSuccess;
  agoq_ib_conn* c = NULL;
  AGOQ_CALLOC_GOTO(c, 1, res, out);
  c->magic = AGOQ_IB_CONN_MAGIC;
  c->is_send = is_send;
  c->dev = dev;
  c->d = &agoq_ib.devs[dev];
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->error, ncclSuccess);
  snprintf(c->peer, sizeof c->peer, "%s", agoq_transport_tcp.peer(boot));
  *out = c;
out:
  return res;
}

void agoq_ib_conn_destroy(agoq_ib_conn* c) {
  if (c == NULL) return;
  const agoq_ibv_api* api = &agoq_ib.api;
  /* After detach the helper never looks at c again; its lock is then ours alone. */
  agoq_ib_helper_detach(c);
  pthread_mutex_destroy(&c->mu);
  /* Queue pairs first: after destroy_qp nothing more lands in our memory. */
  for (int i = 0; i < AGOQ_IB_MAX_QPS; i++)
    if (c->qps[i] != NULL) api->destroy_qp(c->qps[i]);
  if (c->cq != NULL) api->destroy_cq(c->cq);
  /* The references of transfers that never finished. */
  for (int i = 0; i < AGOQ_IB_RING_SLOTS; i++) {
    agoq_ib_mr_put(c->sends[i].mr);
    agoq_ib_mr_put(c->rslots[i].mr);
  }
  for (int i = 0; i < AGOQ_XFER_MAX_POSTED; i++)
    for (int b = 0; b < AGOQ_XFER_MAX_BUFS; b++) agoq_ib_mr_put(c->xs[i].mr[b]);
  if (c->boot != NULL) agoq_transport_tcp.close(c->boot);
  if (c->ring_mr != NULL) api->dereg_mr(c->ring_mr);
  if (c->out_mr != NULL) api->dereg_mr(c->out_mr);
  free(c->ring);
  free(c->out);
  if (c->flushed > 0)
    AGOQ_INFO(NCCL_NET, "%s: %llu work requests with %s were flushed after its first error", c->d->describe,
              (unsigned long long)c->flushed, c->peer);
  if (c->transient_regs > 0)
    AGOQ_INFO(NCCL_NET | NCCL_REG, "%s: connection %s %s registered %llu payloads that nothing had registered, "
              "one message each", c->d->describe, c->is_send ? "to" : "from", c->peer,
              (unsigned long long)c->transient_regs);
  c->magic = 0;
  free(c);
}

static void agoq_ib_setup_release(agoq_ib_setup* s) {
  if (s->boot != NULL) agoq_transport_tcp.close(s->boot);
  s->boot = NULL;
  agoq_ib_conn_destroy(s->c);
  s->c = NULL;
}

/* Reads the peer's metadata: valid, and of the other role. */
static ncclResult_t agoq_ib_meta_check(const agoq_ib_setup* s, agoq_ib_meta* m) {
  agoq_ib_wire_status ws = agoq_ib_meta_decode(s->meta_in, sizeof s->meta_in, m);
  if (ws != AGOQ_IB_WIRE_OK) {
    AGOQ_WARN("verbs setup with %s: invalid queue-pair metadata (%s); is the peer using AGOQ_TRANSPORT=ib too?",
              agoq_transport_tcp.peer(s->boot), agoq_ib_wire_status_str(ws));
    return ncclRemoteError;
  }
  return ncclSuccess;
}

static ncclResult_t agoq_ib_boot_exchange(agoq_ib_setup* s, const void* out, size_t out_len, void* in,
                                          size_t in_len, bool* done) {
  ncclResult_t res = agoq_transport_tcp.exchange(s->boot, out, out_len, in, in_len, done);
  if (res != ncclSuccess)
    AGOQ_WARN("verbs setup with %s failed: the bootstrap connection broke (the peer gave up, exited, or does not "
              "use AGOQ_TRANSPORT=ib)",
              agoq_transport_tcp.peer(s->boot));
  return res;
}

/* One step of a setup; *done once the connection is ready. The bootstrap connection then
 * moves into it: it stays open as the way to notice a peer that is gone. */
static ncclResult_t agoq_ib_setup_step(agoq_ib_setup* s, bool is_send, bool* done) {
  *done = false;
  bool xdone = false;
  agoq_ib_meta peer;
  if (s->stage == AGOQ_IB_STAGE_META) {
    /* The sender offers its metadata at once; the receiver answers with its own after
     * building its queue pairs for the sender's count. */
    if (is_send) {
      AGOQ_CHECK(agoq_ib_boot_exchange(s, s->meta_out, sizeof s->meta_out, s->meta_in, sizeof s->meta_in, &xdone));
      if (!xdone) return ncclSuccess;
      AGOQ_CHECK(agoq_ib_meta_check(s, &peer));
      AGOQ_CHECK(agoq_ib_conn_ready(s->c, &peer));
    } else {
      AGOQ_CHECK(agoq_ib_boot_exchange(s, NULL, 0, s->meta_in, sizeof s->meta_in, &xdone));
      if (!xdone) return ncclSuccess;
      AGOQ_CHECK(agoq_ib_meta_check(s, &peer));
      /* The connecting side chose the rings' depth (AGOQ_TP_FEW): one this side supports. */
      if (peer.ring_slots > AGOQ_IB_RING_SLOTS || (peer.ring_slots & (peer.ring_slots - 1)) != 0) {
        AGOQ_WARN("verbs setup with %s: the peer offers a ring of %u slots; this side supports powers of two up to "
                  "%d (a different agoq version?)",
                  s->c->peer, peer.ring_slots, AGOQ_IB_RING_SLOTS);
        return ncclInvalidUsage;
      }
      s->c->nslots = peer.ring_slots;
      AGOQ_CHECK(agoq_ib_conn_resources(s->c, peer.nqps));
      AGOQ_CHECK(agoq_ib_conn_ready(s->c, &peer));
      agoq_ib_meta mine;
      agoq_ib_meta_fill(s->c, &mine);
      agoq_ib_meta_encode(&mine, s->meta_out);
    }
    s->stage = AGOQ_IB_STAGE_READY;
    uint64_t word = AGOQ_IB_READY_WORD;
    if (is_send) memcpy(s->ready, &word, sizeof word);
  }
  if (s->stage == AGOQ_IB_STAGE_READY) {
    /* The sender says "ready" once its queue pairs are in RTS: only then may the receiver
     * write into the sender's ring. The receiver's metadata goes out at the same time. */
    if (is_send) {
      AGOQ_CHECK(agoq_ib_boot_exchange(s, s->ready, sizeof s->ready, NULL, 0, &xdone));
    } else {
      AGOQ_CHECK(agoq_ib_boot_exchange(s, s->meta_out, sizeof s->meta_out, s->ready, sizeof s->ready, &xdone));
      if (xdone) {
        uint64_t word;
        memcpy(&word, s->ready, sizeof word);
        if (word != AGOQ_IB_READY_WORD) {
          AGOQ_WARN("verbs setup with %s: the peer's ready word is wrong", s->c->peer);
          return ncclRemoteError;
        }
      }
    }
    if (!xdone) return ncclSuccess;
    s->c->boot = s->boot;
    s->boot = NULL;
    agoq_ib_helper_attach(s->c);
    *done = true;
  }
  return ncclSuccess;
}

/* ---- listen ------------------------------------------------------------------------ */

unsigned agoq_ib_conn_fds(unsigned listen_flags) {
  (void)listen_flags;
  return agoq_transport_tcp.conn_fds(AGOQ_TP_LISTEN_INLINE);
}

ncclResult_t agoq_ib_listen(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_listen** out) {
  ncclResult_t res = ncclSuccess;
  agoq_ib_listen_comm* l = NULL;
  *out = NULL;
  AGOQ_CALLOC_GOTO(l, 1, res, fail);
  l->magic = AGOQ_IB_LISTEN_MAGIC;
  l->dev = dev;
  (void)flags; /* the rings do not depend on it yet */
  /* The bootstrap moves a few small messages and then only watches the peer's liveness:
   * inline, one descriptor per connection. */
  AGOQ_CHECK_GOTO(agoq_transport_tcp.listen(AGOQ_IB_BOOT_DEV, comm_id, AGOQ_TP_LISTEN_INLINE, handle, &l->boot), res,
                  fail);
  *out = (agoq_tp_listen*)l;
  return ncclSuccess;
fail:
  free(l);
  return res;
}

ncclResult_t agoq_ib_close_listen(agoq_tp_listen* lp) {
  agoq_ib_listen_comm* l = (agoq_ib_listen_comm*)lp;
  while (l->pending != NULL) {
    agoq_ib_setup* s = l->pending;
    l->pending = s->next;
    agoq_ib_setup_release(s);
    free(s);
  }
  ncclResult_t res = agoq_transport_tcp.close_listen(l->boot);
  l->magic = 0;
  free(l);
  return res;
}

ncclResult_t agoq_ib_accept(agoq_tp_listen* lp, agoq_tp_conn** out) {
  agoq_ib_listen_comm* l = (agoq_ib_listen_comm*)lp;
  *out = NULL;
  agoq_tp_conn* boot = NULL;
  /* A rejected or failed TCP peer is the TCP transport's to log; the listener goes on. */
  ncclResult_t res = agoq_transport_tcp.accept(l->boot, &boot);
  if (res != ncclSuccess) return res;
  if (boot != NULL) {
    agoq_ib_setup* s = calloc(1, sizeof *s);
    if (s == NULL) {
      agoq_transport_tcp.close(boot);
      AGOQ_WARN("out of memory accepting a verbs connection");
      return ncclSystemError;
    }
    s->boot = boot;
    s->stage = AGOQ_IB_STAGE_META;
    s->deadline_ms = agoq_ib_now_ms() + agoq_param_int(AGOQ_PARAM_HANDSHAKE_TIMEOUT_MS);
    res = agoq_ib_conn_create(false, l->dev, boot, &s->c);
    if (res != ncclSuccess) {
      agoq_ib_setup_release(s);
      free(s);
      return res;
    }
    s->next = l->pending;
    l->pending = s;
  }
  int64_t now = agoq_ib_now_ms();
  for (agoq_ib_setup** pp = &l->pending; *pp != NULL;) {
    agoq_ib_setup* s = *pp;
    bool done = false;
    ncclResult_t r = agoq_ib_setup_step(s, false, &done);
    if (r == ncclSuccess && !done && now >= s->deadline_ms) {
      AGOQ_WARN("verbs setup with %s did not complete within AGOQ_HANDSHAKE_TIMEOUT_MS; dropped", s->c->peer);
      r = ncclRemoteError;
    }
    if (r != ncclSuccess || done) {
      *pp = s->next;
      if (r != ncclSuccess) {
        /* This peer's connect fails too (its bootstrap closes); the listener goes on. */
        agoq_ib_setup_release(s);
        free(s);
        continue;
      }
      AGOQ_INFO(NCCL_NET, "%s: accepted a verbs connection from %s (%d queue pairs, rings of %u slots: %zu bytes "
                "pinned, peer GID %s)",
                s->c->d->describe, s->c->peer, s->c->nqps, s->c->nslots, agoq_ib_conn_ring_bytes(s->c),
                s->c->peer_gid);
      *out = (agoq_tp_conn*)s->c;
      free(s);
      return ncclSuccess;
    }
    pp = &s->next;
  }
  return ncclSuccess;
}

/* ---- connect ----------------------------------------------------------------------- */

static agoq_ib_connect_state** agoq_ib_state_slot(void* handle) {
  return (agoq_ib_connect_state**)((uint8_t*)handle + AGOQ_TP_HANDLE_STATE_OFFSET);
}

static void agoq_ib_connect_state_free(agoq_ib_connect_state* st) {
  agoq_transport_tcp.connect_abort(st->boot_handle);
  agoq_ib_setup_release(&st->s);
  st->magic = 0;
  free(st);
}

ncclResult_t agoq_ib_connect(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_conn** out) {
  ncclResult_t res = ncclSuccess;
  *out = NULL;
  agoq_ib_connect_state** slot = agoq_ib_state_slot(handle);
  agoq_ib_connect_state* st = *slot;
  if (st != NULL && st->magic != AGOQ_IB_CONNECT_MAGIC) {
    AGOQ_WARN("connect: corrupted handle state");
    return ncclInternalError;
  }
  if (st == NULL) {
    st = calloc(1, sizeof *st);
    if (st == NULL) {
      AGOQ_WARN("out of memory connecting");
      return ncclSystemError;
    }
    st->magic = AGOQ_IB_CONNECT_MAGIC;
    st->dev = dev;
    st->flags = flags;
    memcpy(st->boot_handle, handle, AGOQ_TP_HANDLE_STATE_OFFSET);
    *slot = st;
  }
  bool done = false;
  if (st->s.stage == AGOQ_IB_STAGE_BOOT) {
    AGOQ_CHECK_GOTO(agoq_transport_tcp.connect(AGOQ_IB_BOOT_DEV, comm_id, AGOQ_TP_LISTEN_INLINE, st->boot_handle,
                                               &st->s.boot),
                    res, fail);
    if (st->s.boot == NULL) return ncclSuccess;
    AGOQ_CHECK_GOTO(agoq_ib_conn_create(true, dev, st->s.boot, &st->s.c), res, fail);
    st->s.c->nslots = (st->flags & AGOQ_TP_FEW) ? AGOQ_TP_FEW_DEPTH : AGOQ_IB_RING_SLOTS;
    AGOQ_CHECK_GOTO(agoq_ib_conn_resources(st->s.c, agoq_ib.nqps), res, fail);
    agoq_ib_meta mine;
    agoq_ib_meta_fill(st->s.c, &mine);
    agoq_ib_meta_encode(&mine, st->s.meta_out);
    st->s.stage = AGOQ_IB_STAGE_META;
  }
  AGOQ_CHECK_GOTO(agoq_ib_setup_step(&st->s, true, &done), res, fail);
  if (!done) return ncclSuccess;
  agoq_ib_conn* c = st->s.c;
  st->s.c = NULL;
  *slot = NULL;
  agoq_ib_connect_state_free(st);
  AGOQ_INFO(NCCL_NET, "%s: connected to %s over verbs (%d queue pairs, rings of %u slots: %zu bytes pinned, peer "
            "GID %s)",
            c->d->describe, c->peer, c->nqps, c->nslots, agoq_ib_conn_ring_bytes(c), c->peer_gid);
  *out = (agoq_tp_conn*)c;
  return ncclSuccess;
fail:
  *slot = NULL;
  agoq_ib_connect_state_free(st);
  return res;
}

void agoq_ib_connect_abort(void* handle) {
  if (handle == NULL) return;
  agoq_ib_connect_state** slot = agoq_ib_state_slot(handle);
  agoq_ib_connect_state* st = *slot;
  *slot = NULL;
  if (st != NULL && st->magic == AGOQ_IB_CONNECT_MAGIC) agoq_ib_connect_state_free(st);
}
