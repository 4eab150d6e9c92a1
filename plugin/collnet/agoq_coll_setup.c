/* Group creation and teardown: listen (a net listen plus the group-wide settings in NCCL's
 * 128-byte handle), connect (one connection each way with every peer of the schedule,
 * blocking with a timeout), and close. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collnet/agoq_coll_cost.h"
#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_wire.h"
#include "core/agoq_check.h"
#include "core/agoq_fdlimit.h"
#include "net/agoq_net.h"
#include "transport/agoq_transport.h"

/* The flags of every CollNet connection. INLINE: each message is a slice of one chunk,
 * inline, no data sockets (with AGOQ_SOCKET_NSOCKS=4 a connection took 5 descriptors).
 * FEW: few messages in flight on a connection, so verbs rings of AGOQ_TP_FEW_DEPTH slots,
 * not 256. TAGGED: a chunk's phase-1 and phase-2 messages share the connection, matched by
 * tag (agoq_coll_tag), one connection per peer and direction instead of one per phase. */
#define AGOQ_COLL_TP_FLAGS (AGOQ_TP_LISTEN_INLINE | AGOQ_TP_FEW | AGOQ_NET_TAGGED)
/* A connection carries at most one message per pipeline slot and phase that its receiver
 * has not consumed: a rank reuses a slot only once its chunk is complete, which needs the
 * peer's phase-2 message, sent only after the peer consumed this rank's phase-1 message of
 * that chunk, and the peer's phase-1 message of the slot's next chunk, sent only once the
 * peer completed the chunk and so consumed this rank's phase-2 message. The tagged comm
 * holds that many unclaimed messages, and the verbs ring that many slots. */
_Static_assert(2 * AGOQ_COLL_SLOTS <= AGOQ_NET_TAGGED_DEPTH, "a CollNet connection's unconsumed messages fit");
_Static_assert(2 * AGOQ_COLL_SLOTS <= AGOQ_TP_FEW_DEPTH, "a CollNet connection's messages in flight fit its verbs ring");

/* ---- the handle: [0, 64) the net handle, [64, 96) the settings, [96, 128) the rank block -- */
/* The settings block, the rank block and the setup messages are encoded and decoded in
 * agoq_coll_wire.c. The rank block takes the bytes where the net core keeps a connect in
 * progress: connect never hands NCCL's handles to the net core, only copies of their first
 * AGOQ_COLL_HANDLE_OFFSET bytes (agoq_coll_setup.handles), whose state slot is zero. */
_Static_assert(AGOQ_TP_HANDLE_WIRE_MAX <= AGOQ_COLL_HANDLE_OFFSET, "net handle fits before ours");
_Static_assert(AGOQ_COLL_HANDLE_OFFSET + AGOQ_COLL_SETTINGS_SIZE <= AGOQ_COLL_RANK_OFFSET, "settings before the rank block");
_Static_assert(AGOQ_COLL_RANK_OFFSET + AGOQ_COLL_RANK_SIZE <= NCCL_NET_HANDLE_MAXSIZE, "the rank block fits");

/* ---- listen ------------------------------------------------------------------------- */

ncclResult_t agoq_coll_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  ncclResult_t res = ncclSuccess;
  agoq_coll_ctx* c = ctx;
  agoq_coll_listen_comm* lc = NULL;
  AGOQ_ARG_CHECK(c != NULL && c->magic == AGOQ_COLL_CTX_MAGIC, res, fail);
  AGOQ_ARG_CHECK(handle != NULL && listen_comm != NULL, res, fail);
  *listen_comm = NULL;
  AGOQ_CALLOC_GOTO(lc, 1, res, fail);
  lc->magic = AGOQ_COLL_LISTEN_MAGIC;
  lc->ctx = c;
  lc->dev = dev;
  uint8_t net_handle[NCCL_NET_HANDLE_MAXSIZE];
  AGOQ_CHECK_GOTO(agoq_net_listen_flags(c->net_ctx, dev, AGOQ_COLL_TP_FLAGS, net_handle, &lc->net_listen), res, fail);
  memset(lc->handle, 0, sizeof lc->handle);
  memcpy(lc->handle, net_handle, AGOQ_COLL_HANDLE_OFFSET);
  agoq_coll_settings_encode(&c->cfg, lc->handle + AGOQ_COLL_HANDLE_OFFSET);
  {
    /* This rank's link rate, for the automatic schedule; 0 where the transport only guessed. */
    agoq_net_props props;
    uint32_t mbps = 0;
    if (agoq_net_get_properties(dev, &props) == ncclSuccess && props.speed_known && props.speed_mbps > 0)
      mbps = (uint32_t)props.speed_mbps <= AGOQ_COLL_LINK_MBPS_MAX ? (uint32_t)props.speed_mbps : AGOQ_COLL_LINK_MBPS_MAX;
    agoq_coll_rank_encode(mbps, lc->handle + AGOQ_COLL_RANK_OFFSET);
  }
  memcpy(handle, lc->handle, NCCL_NET_HANDLE_MAXSIZE);
  *listen_comm = lc;
  return ncclSuccess;
fail:
  free(lc);
  return res;
}

ncclResult_t agoq_coll_close_listen(void* listen_comm) {
  agoq_coll_listen_comm* lc = listen_comm;
  if (lc == NULL) return ncclSuccess;
  if (lc->magic != AGOQ_COLL_LISTEN_MAGIC) {
    AGOQ_WARN("CollNet closeListen: not an agoq listen comm (%p)", listen_comm);
    return ncclInternalError;
  }
  ncclResult_t res = agoq_net_close_listen(lc->net_listen);
  lc->magic = 0;
  free(lc);
  return res;
}

/* ---- connect -------------------------------------------------------------------------- */

/* One accepted connection whose identity message has not arrived yet. */
typedef struct {
  void* comm;
  void* req;
  uint8_t msg[AGOQ_COLL_MSG_SIZE];
} agoq_coll_accepted;

typedef struct {
  agoq_coll_comm* g;
  agoq_coll_listen_comm* lc;
  int64_t deadline_ns;
  /* Per peer: our copy of its net handle (the net core keeps its connect progress inside
   * it), the identity send, and what has completed. */
  uint8_t (*handles)[NCCL_NET_HANDLE_MAXSIZE];
  void** ident_req;
  bool* ident_done;
  agoq_coll_accepted* acc;
  int nacc, acc_cap;
  int nsend_done, nrecv_known;
  uint8_t ident[AGOQ_COLL_MSG_SIZE];
  uint8_t ready[AGOQ_COLL_MSG_SIZE];
} agoq_coll_setup;

static ncclResult_t agoq_coll_comm_alloc(int nranks, int rank, const agoq_coll_plan* plan, agoq_coll_listen_comm* lc,
                                         agoq_coll_comm** out) {
  const agoq_coll_grid* grid = &plan->grid;
  ncclResult_t res = ncclSuccess;
  agoq_coll_comm* g = NULL;
  AGOQ_CALLOC_GOTO(g, 1, res, fail);
  g->magic = AGOQ_COLL_COMM_MAGIC;
  g->ctx = lc->ctx;
  g->cfg = lc->ctx->cfg;
  g->rank = rank;
  g->nranks = nranks;
  g->dev = lc->dev;
  g->grid = *grid;
  /* AGOQ_COLLNET_CHUNK=auto (0 in the handle, so on every rank): the plan's, from its grid. */
  g->cfg.chunk_bytes = (uint64_t)plan->chunk_bytes;
  atomic_init(&g->error, ncclSuccess);
  AGOQ_CALLOC_GOTO(g->send, nranks, res, fail);
  AGOQ_CALLOC_GOTO(g->recv, nranks, res, fail);
  AGOQ_CALLOC_GOTO(g->peers, nranks, res, fail);
  for (int p = 0; p < nranks; p++)
    if (agoq_coll_schedule_is_peer(grid, rank, p)) g->peers[g->npeers++] = p;
  *out = g;
  return ncclSuccess;
fail:
  if (g != NULL) {
    free(g->send);
    free(g->recv);
    free(g->peers);
    free(g);
  }
  return res;
}

static void agoq_coll_comm_free(agoq_coll_comm* g) {
  agoq_coll_close_conns(g);
  free(g->send);
  free(g->recv);
  free(g->peers);
  agoq_stats_release(g->st);
  g->magic = 0;
  free(g);
}

/* Gives up the connects still in progress in our handle copies. Without an abort in the net
 * core their state (and sockets) cannot be released: it stays reachable here until the
 * process ends, which only happens when a peer listened but never joined. */
#ifndef AGOQ_NET_HAS_CONNECT_ABORT
static struct {
  pthread_mutex_t mu;
  void* list; /* nodes {next, abandoned handle array} */
} agoq_coll_abandoned = {.mu = PTHREAD_MUTEX_INITIALIZER};
#endif

static void agoq_coll_abandon(agoq_coll_setup* s, int nranks) {
  if (s->handles == NULL) return;
#ifdef AGOQ_NET_HAS_CONNECT_ABORT
  for (int i = 0; i < nranks; i++) agoq_net_connect_abort(s->handles[i]);
#else
  bool pending = false;
  for (int i = 0; i < nranks && !pending; i++) {
    void* state;
    memcpy(&state, s->handles[i] + AGOQ_TP_HANDLE_STATE_OFFSET, sizeof state);
    pending = state != NULL;
  }
  if (pending) {
    void** node = malloc(2 * sizeof(void*));
    if (node != NULL) {
      pthread_mutex_lock(&agoq_coll_abandoned.mu);
      node[0] = agoq_coll_abandoned.list;
      node[1] = s->handles;
      agoq_coll_abandoned.list = node;
      pthread_mutex_unlock(&agoq_coll_abandoned.mu);
      s->handles = NULL;
    }
  }
#endif
}

static bool agoq_coll_expired(const agoq_coll_setup* s) { return agoq_coll_now_ns() > s->deadline_ns; }

/* Sends each peer's connection its identity once the connection exists. */
static ncclResult_t agoq_coll_setup_connect(agoq_coll_setup* s, bool* progressed) {
  agoq_coll_comm* g = s->g;
  void* net_ctx = s->lc->ctx->net_ctx;
  for (int pi = 0; pi < g->npeers; pi++) {
    int p = g->peers[pi];
    if (g->send[p] == NULL) {
      AGOQ_CHECK(agoq_net_connect_flags(net_ctx, g->dev, AGOQ_COLL_TP_FLAGS, s->handles[p], &g->send[p]));
      if (g->send[p] == NULL) continue;
      agoq_net_stats_detach(g->send[p]); /* counted on the group's CollNet lines */
      *progressed = true;
    }
    if (s->ident_done[p]) continue;
    if (s->ident_req[p] == NULL) {
      AGOQ_CHECK(agoq_net_isend(g->send[p], s->ident, AGOQ_COLL_MSG_SIZE, AGOQ_COLL_TAG_SETUP, NULL, NULL,
                                &s->ident_req[p]));
      if (s->ident_req[p] == NULL) continue;
    }
    int done = 0, size = 0;
    AGOQ_CHECK(agoq_net_test(s->ident_req[p], &done, &size));
    if (done) {
      s->ident_req[p] = NULL;
      s->ident_done[p] = true;
      s->nsend_done++;
      *progressed = true;
    }
  }
  return ncclSuccess;
}

/* Identifies an accepted connection by its first message. */
static ncclResult_t agoq_coll_setup_identify(agoq_coll_setup* s, agoq_coll_accepted* a, int size) {
  agoq_coll_comm* g = s->g;
  agoq_coll_setup_msg m;
  if (size < 0 || !agoq_coll_msg_decode(a->msg, (size_t)size, AGOQ_COLL_MSG_IDENT, &m)) {
    AGOQ_WARN("CollNet group creation: unexpected first message (%d bytes) on an accepted connection", size);
    return ncclRemoteError;
  }
  uint32_t rank = m.rank, nranks = m.nranks;
  bool valid = agoq_coll_ident_valid(&m, g->rank, g->nranks);
  bool peer = valid && agoq_coll_schedule_is_peer(&g->grid, g->rank, (int)rank);
  if (!peer || g->recv[rank] != NULL) {
    AGOQ_WARN("CollNet group creation: rank %d got a connection claiming rank %u of %u, phase %u "
              "(this group has %d ranks%s)", g->rank, rank, nranks, m.phase, g->nranks,
              !valid ? "" : !peer ? "; not a peer of this rank in the group's grid" : "; duplicate");
    return ncclRemoteError;
  }
  g->recv[rank] = a->comm;
  a->comm = NULL;
  s->nrecv_known++;
  return ncclSuccess;
}

static ncclResult_t agoq_coll_setup_accept(agoq_coll_setup* s, bool* progressed) {
  for (;;) {
    void* rc = NULL;
    AGOQ_CHECK(agoq_net_accept(s->lc->net_listen, &rc));
    if (rc == NULL) break;
    agoq_net_stats_detach(rc); /* counted on the group's CollNet lines */
    if (s->nacc == s->acc_cap) {
      (void)agoq_net_close_recv(rc);
      AGOQ_WARN("CollNet group creation: rank %d accepted more connections than the group has", s->g->rank);
      return ncclRemoteError;
    }
    s->acc[s->nacc++] = (agoq_coll_accepted){.comm = rc};
    *progressed = true;
  }
  for (int i = 0; i < s->nacc; i++) {
    agoq_coll_accepted* a = &s->acc[i];
    if (a->comm == NULL) continue;
    if (a->req == NULL) {
      void* data = a->msg;
      size_t size = AGOQ_COLL_MSG_SIZE;
      int tag = AGOQ_COLL_TAG_SETUP;
      AGOQ_CHECK(agoq_net_irecv(a->comm, 1, &data, &size, &tag, NULL, NULL, &a->req));
      if (a->req == NULL) continue;
    }
    int done = 0, size = 0;
    AGOQ_CHECK(agoq_net_test(a->req, &done, &size));
    if (!done) continue;
    a->req = NULL;
    AGOQ_CHECK(agoq_coll_setup_identify(s, a, size));
    *progressed = true;
  }
  return ncclSuccess;
}

static void agoq_coll_setup_missing(const agoq_coll_setup* s, char* out, size_t len) {
  const agoq_coll_comm* g = s->g;
  size_t used = 0;
  out[0] = '\0';
  for (int pi = 0; pi < g->npeers && used + 32 < len; pi++) {
    int p = g->peers[pi];
    bool out_ok = s->ident_done[p];
    bool in_ok = g->recv[p] != NULL;
    if (out_ok && in_ok) continue;
    used += (size_t)snprintf(out + used, len - used, "%s%d(%s%s)", used ? " " : "", p, out_ok ? "" : "to",
                             in_ok ? "" : (out_ok ? "from" : ",from"));
  }
}

static void agoq_coll_nap(void) {
  struct timespec ts = {0, 200000};
  nanosleep(&ts, NULL);
}

/* Every peer says "ready" on its connection once its own connections are complete, and
 * nobody returns success before hearing it from everyone: a rank that failed closes its
 * connections instead, and its peers fail too rather than run a half-built group. */
static ncclResult_t agoq_coll_setup_barrier(agoq_coll_setup* s) {
  agoq_coll_comm* g = s->g;
  int n = g->nranks, left = 0;
  void** sreq = calloc((size_t)n, sizeof *sreq);
  void** rreq = calloc((size_t)n, sizeof *rreq);
  uint8_t(*rmsg)[AGOQ_COLL_MSG_SIZE] = calloc((size_t)n, AGOQ_COLL_MSG_SIZE);
  bool* sdone = calloc((size_t)n, sizeof *sdone);
  bool* rdone = calloc((size_t)n, sizeof *rdone);
  ncclResult_t res = ncclSuccess;
  if (sreq == NULL || rreq == NULL || rmsg == NULL || sdone == NULL || rdone == NULL) {
    AGOQ_WARN("out of memory in CollNet group creation");
    res = ncclSystemError;
    goto out;
  }
  for (int p = 0; p < n; p++) sdone[p] = rdone[p] = true;
  for (int pi = 0; pi < g->npeers; pi++) sdone[g->peers[pi]] = rdone[g->peers[pi]] = false;
  left = 2 * g->npeers;
  while (left > 0) {
    bool progressed = false;
    for (int pi = 0; pi < g->npeers; pi++) {
      int p = g->peers[pi];
      int done = 0, size = 0;
      if (!sdone[p]) {
        if (sreq[p] == NULL)
          AGOQ_CHECK_GOTO(agoq_net_isend(g->send[p], s->ready, AGOQ_COLL_MSG_SIZE, AGOQ_COLL_TAG_SETUP, NULL, NULL, &sreq[p]),
                          res, out);
        if (sreq[p] != NULL) {
          AGOQ_CHECK_GOTO(agoq_net_test(sreq[p], &done, &size), res, out);
          if (done) {
            sreq[p] = NULL;
            sdone[p] = true;
            left--;
            progressed = true;
          }
        }
      }
      if (!rdone[p]) {
        if (rreq[p] == NULL) {
          void* data = rmsg[p];
          size_t cap = AGOQ_COLL_MSG_SIZE;
          int tag = AGOQ_COLL_TAG_SETUP;
          AGOQ_CHECK_GOTO(agoq_net_irecv(g->recv[p], 1, &data, &cap, &tag, NULL, NULL, &rreq[p]), res, out);
        }
        if (rreq[p] != NULL) {
          AGOQ_CHECK_GOTO(agoq_net_test(rreq[p], &done, &size), res, out);
          if (done) {
            rreq[p] = NULL;
            agoq_coll_setup_msg m;
            if (size < 0 || !agoq_coll_msg_decode(rmsg[p], (size_t)size, AGOQ_COLL_MSG_READY, &m) ||
                m.rank != (uint32_t)p) {
              AGOQ_WARN("CollNet group creation: rank %d got a malformed ready message from rank %d", g->rank, p);
              res = ncclRemoteError;
              goto out;
            }
            rdone[p] = true;
            left--;
            progressed = true;
          }
        }
      }
    }
    if (left == 0) break;
    if (agoq_coll_expired(s)) {
      AGOQ_WARN("CollNet group creation timed out after %d s (AGOQ_COLLNET_TIMEOUT_S) waiting for every "
                "rank to finish its connections (rank %d of %d)", g->cfg.timeout_s, g->rank, n);
      res = ncclRemoteError;
      goto out;
    }
    if (!progressed) agoq_coll_nap();
  }
out:
  free(sreq);
  free(rreq);
  free(rmsg);
  free(sdone);
  free(rdone);
  return res;
}

/* The schedule the group runs (agoq_coll_plans_pick) from what every rank shares: the
 * settings and the slowest link. *chosen says why, for the INFO line. */
static ncclResult_t agoq_coll_schedule_choose(const agoq_coll_config* cfg, int nranks, uint32_t link_mbps,
                                              agoq_coll_plan* out, char* chosen, size_t len) {
  char why[192], text[32];
  agoq_coll_grid_text(cfg->grid_a, cfg->grid_b, text, sizeof text);
  agoq_coll_plans plans;
  switch (agoq_coll_plans_make(nranks, cfg->grid_a, cfg->grid_b, (double)cfg->chunk_bytes, &plans, why, sizeof why)) {
    case 0: break;
    case AGOQ_COLL_PLANS_BAD_GRID:
      AGOQ_WARN("CollNet connect: AGOQ_COLLNET_GRID=%s for a group of %d ranks: %s", text, nranks, why);
      return ncclInvalidUsage;
    default:
      AGOQ_WARN("CollNet connect: %s", why);
      return ncclSystemError;
  }
  agoq_coll_pick_in in = {.format = cfg->format, .block = cfg->block, .frame_partials = cfg->quant_partials,
                          .link_Bps = link_mbps * 1e6 / 8, .io_threads = cfg->io_threads};
  double secs[AGOQ_COLL_PLANS_MAX];
  int i = agoq_coll_plans_pick(&plans, &in, secs);
  *out = plans.plan[i];
  const agoq_coll_grid* rule = &plans.plan[plans.rule].grid;
  if (cfg->grid_a != 0)
    snprintf(chosen, len, "AGOQ_COLLNET_GRID=%s", text);
  else if (nranks <= AGOQ_COLL_GRID_DIRECT_MAX)
    snprintf(chosen, len, "AGOQ_COLLNET_GRID=auto: the mesh up to %d ranks", AGOQ_COLL_GRID_DIRECT_MAX);
  else if (plans.count == 1)
    snprintf(chosen, len, "AGOQ_COLLNET_GRID=auto: the grid of %d ranks, no other shape within %d peers", nranks,
             AGOQ_COLL_MESH_AUTO_MAX - 1);
  else if (link_mbps == 0)
    snprintf(chosen, len, "AGOQ_COLLNET_GRID=auto: the grid of %d ranks, as some rank's link rate is not known",
             nranks);
  else
    snprintf(chosen, len, "AGOQ_COLLNET_GRID=auto: at %.1f Gbit/s, the slowest rank's link, the fastest of %d shapes "
             "in the cost model, %d calls of %.0f MiB in %.0f us (%dx%d, n's own grid: %.0f us)", link_mbps / 1e3,
             plans.count, AGOQ_COLL_COST_CALLS, AGOQ_COLL_PICK_CALL_BYTES / 1048576.0, secs[i] * 1e6, rule->a,
             rule->b, secs[plans.rule] * 1e6);
  return ncclSuccess;
}

/* Checks every handle: ours at our rank, the same settings everywhere, a rank block that
 * decodes; *link_mbps gets the slowest rank's link rate, 0 when any rank does not know its. */
static ncclResult_t agoq_coll_check_handles(void* handles[], int nranks, int rank, const agoq_coll_listen_comm* lc,
                                            uint32_t* link_mbps) {
  const uint8_t* mine = lc->handle + AGOQ_COLL_HANDLE_OFFSET;
  agoq_coll_settings my_settings, first_theirs = {0};
  if (agoq_coll_settings_decode(mine, &my_settings) != AGOQ_COLL_SETTINGS_OK) {
    AGOQ_WARN("CollNet connect: this rank's own settings block does not decode");
    return ncclInternalError;
  }
  int first_mismatch = -1, mismatches = 0;
  for (int i = 0; i < nranks; i++) {
    const uint8_t* h = handles[i];
    if (h == NULL) {
      AGOQ_WARN("CollNet connect: handle of rank %d is NULL", i);
      return ncclInternalError;
    }
    agoq_coll_settings theirs;
    agoq_coll_settings_status st = agoq_coll_settings_check(h + AGOQ_COLL_HANDLE_OFFSET, mine);
    if (st == AGOQ_COLL_SETTINGS_OK) continue;
    (void)agoq_coll_settings_decode(h + AGOQ_COLL_HANDLE_OFFSET, &theirs);
    switch (st) {
      case AGOQ_COLL_SETTINGS_FOREIGN:
        AGOQ_WARN("CollNet connect: handle of rank %d was not made by agoq's CollNet listen (another plugin on "
                  "that rank?)", i);
        return ncclInvalidUsage;
      case AGOQ_COLL_SETTINGS_VERSION:
        /* Its fields may sit elsewhere in another layout: name the versions, not values. */
        AGOQ_WARN("CollNet connect: rank %d runs an agoq whose CollNet handle has layout version %u, this rank (%d) "
                  "has version %u; every rank must run the same agoq version", i, (unsigned)theirs.version, rank,
                  (unsigned)AGOQ_COLL_HANDLE_VERSION);
        return ncclInvalidUsage;
      case AGOQ_COLL_SETTINGS_MALFORMED:
        AGOQ_WARN("CollNet connect: the settings in rank %d's handle are corrupt (an unknown AGOQ_FORMAT or "
                  "AGOQ_BLOCK, or nonzero padding)", i);
        return ncclInvalidUsage;
      case AGOQ_COLL_SETTINGS_OK:
      case AGOQ_COLL_SETTINGS_MISMATCH:
        if (mismatches++ == 0) {
          first_mismatch = i;
          first_theirs = theirs;
        }
        break;
    }
  }
  if (mismatches > 0) {
    /* Every rank sees the same handles, so every rank fails here alike, each naming a peer
     * and both values: the WARN of whichever rank a user reads is enough. One line however
     * many peers differ (with 256 ranks one odd rank would otherwise log 255). */
    char msg[768];
    if (agoq_coll_settings_describe(&first_theirs, first_mismatch, &my_settings, rank, msg, sizeof msg) == 0)
      snprintf(msg, sizeof msg, "CollNet group: rank %d's settings block differs from this rank (%d)'s", first_mismatch,
               rank);
    if (mismatches > 1)
      AGOQ_WARN("%s (%d more rank(s) differ from this rank too)", msg, mismatches - 1);
    else
      AGOQ_WARN("%s", msg);
    return ncclInvalidUsage;
  }
  if (memcmp(handles[rank], lc->handle, NCCL_NET_HANDLE_MAXSIZE) != 0) {
    AGOQ_WARN("CollNet connect: handles[%d] is not the handle this rank's listen produced", rank);
    return ncclInvalidUsage;
  }
  int bad = agoq_coll_rank_slowest(handles, nranks, link_mbps);
  if (bad >= 0) {
    AGOQ_WARN("CollNet connect: the rank block of rank %d's handle is corrupt (a link rate above %u Mbit/s, or "
              "nonzero padding)", bad, AGOQ_COLL_LINK_MBPS_MAX);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

static ncclResult_t agoq_coll_setup_run(agoq_coll_setup* s) {
  agoq_coll_comm* g = s->g;
  int want = g->npeers;
  while (s->nsend_done < want || s->nrecv_known < want) {
    bool progressed = false;
    AGOQ_CHECK(agoq_coll_setup_connect(s, &progressed));
    AGOQ_CHECK(agoq_coll_setup_accept(s, &progressed));
    if (s->nsend_done == want && s->nrecv_known == want) break;
    if (agoq_coll_expired(s)) {
      char missing[256];
      agoq_coll_setup_missing(s, missing, sizeof missing);
      AGOQ_WARN("CollNet group creation timed out after %d s (AGOQ_COLLNET_TIMEOUT_S): rank %d of %d is "
                "missing connections with rank(s) %s", g->cfg.timeout_s, g->rank, g->nranks, missing);
      return ncclRemoteError;
    }
    if (!progressed) agoq_coll_nap();
  }
  return agoq_coll_setup_barrier(s);
}

ncclResult_t agoq_coll_connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  ncclResult_t res = ncclSuccess;
  agoq_coll_listen_comm* lc = listen_comm;
  agoq_coll_setup s;
  memset(&s, 0, sizeof s);
  AGOQ_ARG_CHECK(lc != NULL && lc->magic == AGOQ_COLL_LISTEN_MAGIC && coll_comm != NULL && handles != NULL, res, out);
  *coll_comm = NULL;
  if (nranks < 1 || nranks > AGOQ_COLL_MAX_RANKS || rank < 0 || rank >= nranks) {
    AGOQ_WARN("CollNet connect: rank %d of %d is out of range (at most %d ranks)", rank, nranks, AGOQ_COLL_MAX_RANKS);
    res = ncclInvalidArgument;
    goto fail;
  }
  uint32_t link_mbps = 0;
  AGOQ_CHECK_GOTO(agoq_coll_check_handles(handles, nranks, rank, lc, &link_mbps), res, fail);
  agoq_coll_plan plan;
  char chosen[256];
  AGOQ_CHECK_GOTO(agoq_coll_schedule_choose(&lc->ctx->cfg, nranks, link_mbps, &plan, chosen, sizeof chosen), res, fail);
  agoq_coll_grid grid = plan.grid;
  AGOQ_CHECK_GOTO(agoq_coll_comm_alloc(nranks, rank, &plan, lc, &s.g), res, fail);
  {
    /* Two connections per peer of the schedule (one each way): room for their descriptors
     * now, or an error that names the limit (where the group would otherwise fail on some
     * rank as a handshake timeout). */
    size_t conns = 2 * (size_t)s.g->npeers;
    char what[128];
    snprintf(what, sizeof what, "a CollNet group of %d ranks (%zu connections to %d peers)", nranks, conns,
             s.g->npeers);
    AGOQ_CHECK_GOTO(agoq_fd_reserve(conns * agoq_net_conn_fds(AGOQ_COLL_TP_FLAGS), what), res, fail);
  }
  s.lc = lc;
  s.deadline_ns = agoq_coll_now_ns() + (int64_t)lc->ctx->cfg.timeout_s * 1000000000;
  size_t nconn = (size_t)nranks;
  s.acc_cap = s.g->npeers;
  s.handles = calloc(nconn, sizeof *s.handles);
  s.ident_req = calloc(nconn, sizeof *s.ident_req);
  s.ident_done = calloc(nconn, sizeof *s.ident_done);
  s.acc = calloc((size_t)s.acc_cap + 1, sizeof *s.acc);
  if (s.handles == NULL || s.ident_req == NULL || s.ident_done == NULL || s.acc == NULL) {
    AGOQ_WARN("out of memory in CollNet group creation");
    res = ncclSystemError;
    goto fail;
  }
  for (int p = 0; p < nranks; p++) memcpy(s.handles[p], handles[p], AGOQ_COLL_HANDLE_OFFSET);
  agoq_coll_msg_encode(s.ident, AGOQ_COLL_MSG_IDENT, 0, rank, nranks);
  agoq_coll_msg_encode(s.ready, AGOQ_COLL_MSG_READY, 0, rank, nranks);
  int64_t t0 = agoq_coll_now_ns();
  AGOQ_CHECK_GOTO(agoq_coll_setup_run(&s), res, fail);
  AGOQ_CHECK_GOTO(agoq_coll_stats_open(s.g), res, fail);
  AGOQ_CHECK_GOTO(agoq_coll_engine_start(s.g), res, fail);
  agoq_coll_registry_add(s.g);
  if (grid.b == 1)
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet rank %d: one-level mesh of %d ranks (%s): %d peers, %d connections",
              rank, nranks, chosen, s.g->npeers, 2 * s.g->npeers);
  else
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet rank %d: two-level grid of %d columns x %d rows, last row %d ranks "
              "(%s): %d peers, %d connections", rank, grid.a, grid.b, grid.last, chosen, s.g->npeers,
              2 * s.g->npeers);
  if (s.g->cfg.format == AGOQ_FORMAT_NONE)
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet group of %d ranks created (rank %d) in %.1f ms; compression off "
              "(AGOQ_FORMAT=none): every reduction exact", nranks, rank, (double)(agoq_coll_now_ns() - t0) / 1e6);
  else
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet group of %d ranks created (rank %d) in %.1f ms; fp32/bf16/fp16 Sum "
              "from %llu bytes quantized to %s, block %u; pipeline chunks of %llu bytes", nranks, rank,
              (double)(agoq_coll_now_ns() - t0) / 1e6, (unsigned long long)s.g->cfg.min_bytes,
              agoq_format_name(s.g->cfg.format), s.g->cfg.block, (unsigned long long)s.g->cfg.chunk_bytes);
  *coll_comm = s.g;
  s.g = NULL;
  goto out;
fail:
  /* NCCL drops the listen comm of a failed connect without closing it (coll_net.cc
   * sharedConnect): release its socket now; a closeListen that does come frees the rest. */
  (void)agoq_net_close_listen(lc->net_listen);
  lc->net_listen = NULL;
  agoq_coll_abandon(&s, nranks);
  for (int i = 0; i < s.nacc; i++)
    if (s.acc[i].comm != NULL) (void)agoq_net_close_recv(s.acc[i].comm);
  if (s.g != NULL) agoq_coll_comm_free(s.g);
  s.g = NULL;
out:
  free(s.handles);
  free(s.ident_req);
  free(s.ident_done);
  free(s.acc);
  return res;
}

ncclResult_t agoq_coll_close_coll(void* coll_comm) {
  agoq_coll_comm* g = coll_comm;
  if (g == NULL) return ncclSuccess;
  if (g->magic != AGOQ_COLL_COMM_MAGIC) {
    AGOQ_WARN("CollNet closeColl: not an agoq collective comm (%p)", coll_comm);
    return ncclInternalError;
  }
  /* Leaving the registry first: a concurrent finalize is done with this group once it is
   * out, so the engine below is stopped (and joined) by exactly one caller. */
  agoq_coll_registry_remove(g);
  agoq_coll_engine_stop(g);
  /* The engine is gone; closing the connections detaches the progress threads, so nothing
   * writes into NCCL's buffers or ours after this. */
  agoq_coll_close_conns(g);
  agoq_coll_stats_print(g);
  agoq_coll_engine_free(g);
  agoq_coll_comm_free(g);
  return ncclSuccess;
}
