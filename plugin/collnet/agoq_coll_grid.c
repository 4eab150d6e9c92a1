/*
 * A pipeline chunk on a two-level grid (agoq_coll_schedule.h; docs/design-collnet.md "Two
 * levels"), for groups whose grid has more than one row. The engine (agoq_coll_engine.c)
 * admits, polls and retires chunks as on the mesh; this file gives a grid chunk its stages:
 *   POSTING  every receive of the chunk, then the row reduce-scatter: each column slice of
 *            this rank's input (quantized once, or raw) to the row peer that plays it; this
 *            rank's own columns' frames are kept. The sends wait until the chunk
 *            AGOQ_COLL_ROW_LEAD before this one has summed its row.
 *   G_ROW    once the row's contributions are in: the fp32 (exact: typed, fp32 for the narrow
 *            floats) sum of each of its pieces in rank order; then the column reduce-scatter:
 *            piece (c, r) of that row sum to the player of (r, c).
 *   G_COL    once the column's row sums are in: the sum of its pieces in row order, quantized
 *            once (Inf where it overflows) and decoded into place like everyone else's, or
 *            rounded once (exact); then the column all-gather of those final pieces.
 *   G_AG     once the column's final pieces are in (decoded into place): the row all-gather,
 *            one message per row peer with every final piece of this rank's columns.
 *   WAIT_ALL every send completed and every row peer's pieces decoded into place.
 * Each stage runs strictly in chunk order (one cursor per stage). Row and column peers are
 * distinct ranks, so each peer gets one phase-1 (reduce-scatter) and one phase-2
 * (all-gather) message per chunk and direction, as on the mesh, on the one connection each
 * way, matched by tag (agoq_coll_tag).
 *
 * Pieces: an all-reduce chunk is cut into a*b pieces at block granularity (piece (c, r) has
 * index c*b + r; a column's pieces are contiguous); a reduce-scatter or all-gather chunk's
 * piece (c, r) is the part of rank r*a + c's range in this chunk (empty where no rank sits).
 * A message carries its pieces in span order: quantized, one frame per non-empty piece, each
 * starting 16-byte aligned; exact, their bytes back to back. Frames that travel carry a
 * payload CRC and are refused without one; this rank's own frames never travel unsealed.
 * A GPU request (every buffer on the device) runs the same stages with its frames, row sums
 * and final decodes on the device (agoq_coll_grid_gpu.c); its regions are the group's pinned
 * memory, sized as the host's, and what spills past them reaches the device through the
 * group's pinned spill area.
 */
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_grid_state.h"
#include "collnet/agoq_coll_step.h"
#include "core/agoq_check.h"

/* ---- the plan ------------------------------------------------------------------------------ */

typedef struct {
  struct agoq_coll_gplan* p;
  int step, dir;
  bool oom;
} agoq_gplan_fill;

static void agoq_gplan_add(void* arg, const agoq_coll_msg* m) {
  agoq_gplan_fill* f = arg;
  struct agoq_coll_gplan* p = f->p;
  if (f->oom) return;
  if (p->nspans + m->nspans > p->spans_cap) {
    int cap = p->spans_cap * 2 + m->nspans + 16;
    agoq_coll_span* sp = realloc(p->spans, (size_t)cap * sizeof *sp);
    if (sp == NULL) {
      f->oom = true;
      return;
    }
    p->spans = sp;
    p->spans_cap = cap;
  }
  int peer = f->dir == 0 ? m->to : m->from;
  agoq_gmsg* list = p->msg[f->step][f->dir];
  int k = p->nmsg[f->step][f->dir]++;
  list[k] = (agoq_gmsg){.peer = peer, .span0 = p->nspans, .nspans = m->nspans};
  memcpy(p->spans + p->nspans, m->spans, (size_t)m->nspans * sizeof *m->spans);
  p->nspans += m->nspans;
  p->msg_of[f->step][f->dir][peer] = k;
}

/* A step's sends start with the first peer after this rank and wrap around, as the mesh's
 * do: the schedule lists them by destination ascending, and every rank of a row (or column)
 * sending to its first player at once would queue them all at that player's NIC while the
 * others' sat idle (at 64 ranks, 8x8, 10 Gbit/s, one 1 MiB chunk took 1.49x its bytes'
 * time in agoq-collnet-sim). Each connection still carries one message per step. */
static void agoq_gmsg_reverse(agoq_gmsg* list, int lo, int hi) {
  for (; lo < hi; lo++, hi--) {
    agoq_gmsg tmp = list[lo];
    list[lo] = list[hi];
    list[hi] = tmp;
  }
}

static void agoq_gplan_rotate(struct agoq_coll_gplan* p, int st, int me) {
  agoq_gmsg* list = p->msg[st][0];
  int n = p->nmsg[st][0], k0 = 0;
  while (k0 < n && list[k0].peer < me) k0++;
  if (k0 == 0 || k0 == n) return;
  /* Rotate left by k0 with three reversals (no allocation). */
  agoq_gmsg_reverse(list, 0, k0 - 1);
  agoq_gmsg_reverse(list, k0, n - 1);
  agoq_gmsg_reverse(list, 0, n - 1);
  for (int k = 0; k < n; k++) p->msg_of[st][0][list[k].peer] = k;
}

static void agoq_gplan_free(struct agoq_coll_gplan* p) {
  if (p == NULL) return;
  for (int st = 0; st < AGOQ_COLL_STEPS; st++)
    for (int d = 0; d < 2; d++) {
      free(p->msg[st][d]);
      free(p->msg_of[st][d]);
    }
  free(p->spans);
  free(p->mine);
  free(p->cols);
  free(p->col_index);
  free(p->row_peer);
  free(p);
}

static ncclResult_t agoq_gplan_make(agoq_coll_comm* g, struct agoq_coll_gplan** out) {
  ncclResult_t res = ncclSuccess;
  const agoq_coll_grid* gr = &g->grid;
  int n = g->nranks, me = g->rank;
  struct agoq_coll_gplan* p = NULL;
  agoq_coll_span* scratch = NULL;
  AGOQ_CALLOC_GOTO(p, 1, res, fail);
  AGOQ_CALLOC_GOTO(scratch, (size_t)gr->a, res, fail);
  AGOQ_CALLOC_GOTO(p->cols, (size_t)gr->a, res, fail);
  AGOQ_CALLOC_GOTO(p->col_index, (size_t)gr->a, res, fail);
  AGOQ_CALLOC_GOTO(p->row_peer, (size_t)n, res, fail);
  p->ncols = agoq_coll_grid_cols_of(gr, me, p->cols);
  AGOQ_CALLOC_GOTO(p->mine, (size_t)p->ncols, res, fail);
  for (int c = 0; c < gr->a; c++) p->col_index[c] = -1;
  for (int i = 0; i < p->ncols; i++) {
    p->col_index[p->cols[i]] = i;
    p->mine[i] = (agoq_coll_span){.col = p->cols[i], .row = 0, .rows = gr->b};
  }
  p->row_first = agoq_coll_grid_row(gr, me) * gr->a;
  p->row_len = agoq_coll_grid_row_len(gr, agoq_coll_grid_row(gr, me));
  for (int q = p->row_first; q < p->row_first + p->row_len; q++) p->row_peer[q] = q != me;
  for (int st = 0; st < AGOQ_COLL_STEPS; st++)
    for (int d = 0; d < 2; d++) {
      /* A rank sends and receives at most one message per peer and step. */
      AGOQ_CALLOC_GOTO(p->msg[st][d], (size_t)(g->npeers > 0 ? g->npeers : 1), res, fail);
      AGOQ_CALLOC_GOTO(p->msg_of[st][d], (size_t)n, res, fail);
      for (int j = 0; j < n; j++) p->msg_of[st][d][j] = -1;
      agoq_gplan_fill f = {.p = p, .step = st, .dir = d};
      if (d == 0) agoq_coll_schedule_sends(gr, me, (agoq_coll_step)st, scratch, agoq_gplan_add, &f);
      else agoq_coll_schedule_recvs(gr, me, (agoq_coll_step)st, scratch, agoq_gplan_add, &f);
      if (f.oom) {
        AGOQ_WARN("out of memory planning a CollNet grid");
        res = ncclSystemError;
        goto fail;
      }
      if (d == 0) agoq_gplan_rotate(p, st, me);
    }
  free(scratch);
  *out = p;
  return ncclSuccess;
fail:
  free(scratch);
  agoq_gplan_free(p);
  return res;
}

/* ---- pieces and message sizes ---------------------------------------------------------------- */

typedef enum {
  AGOQ_GC_IN_FRAMES,  /* quantized contributions: frames of the input type */
  AGOQ_GC_OUT_FRAMES, /* quantized final pieces: frames of fp32 sums */
  AGOQ_GC_RAW,        /* the request's elements */
  AGOQ_GC_PARTIAL     /* partial sums, isz bytes each */
} agoq_gcontent;

/* Elements a message's pieces hold, and the bytes it needs as `what`: at most, or (nominal)
 * when none of its frames' blocks escapes raw. */
static size_t agoq_gmsg_size(const agoq_coll_comm* g, const agoq_coll_slot* s, const agoq_coll_span* sp, int ns,
                             agoq_gcontent what, bool nominal, size_t* elems) {
  const struct agoq_coll_gslot* gs = s->gs;
  const agoq_coll_req* r = s->req;
  agoq_codec_params pin = agoq_coll_params(g, r->codec_dtype), p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  agoq_piece_it it = agoq_pieces(sp, ns);
  size_t bytes = 0, e = 0;
  int idx;
  while (agoq_piece_next(&it, &g->grid, &idx)) {
    size_t m = gs->pl[idx];
    if (m == 0) continue;
    e += m;
    switch (what) {
      case AGOQ_GC_IN_FRAMES: bytes += agoq_coll_align16(agoq_coll_frame_cap(&pin, m, nominal)); break;
      case AGOQ_GC_OUT_FRAMES: bytes += agoq_coll_align16(agoq_coll_frame_cap(&p32, m, nominal)); break;
      case AGOQ_GC_RAW: bytes += m * r->esz; break;
      case AGOQ_GC_PARTIAL: bytes += m * gs->isz; break;
    }
  }
  if (what == AGOQ_GC_PARTIAL && e > 0 && agoq_grid_partials_sealed(g, r)) bytes += AGOQ_GRID_TRAILER;
  if (elems != NULL) *elems = e;
  return bytes;
}

/* An all-reduce message of one span is one range of NCCL's buffers (a column's pieces are
 * contiguous): it is sent from and received into them as is. */
static bool agoq_gmsg_contig(const agoq_coll_slot* s, const agoq_coll_grid* gr, const agoq_coll_span* sp, int ns,
                             size_t* first) {
  if (s->req->kind != AGOQ_COLL_ALLREDUCE || ns != 1) return false;
  *first = s->gs->pb[agoq_coll_grid_piece(gr, sp[0].col, sp[0].row)];
  return true;
}

/* ---- frames -------------------------------------------------------------------------------- */

typedef struct {
  float* acc;
  bool first;
  int threads;
} agoq_gsum_arg;

static agoq_codec_status agoq_gsum_step(void* arg, const uint8_t* f, size_t len, size_t m) {
  const agoq_gsum_arg* a = arg;
  return a->first ? agoq_frame_decode_mt(f, len, AGOQ_DTYPE_FP32, a->acc, m, a->threads)
                  : agoq_frame_decode_accumulate_mt(f, len, a->acc, m, a->threads);
}

typedef struct {
  agoq_coll_comm* g;
  agoq_coll_slot* s;
  void* dst;
} agoq_gdecode_arg;

/* A final piece's frame into place: decoded now, or (a GPU request) checked for the chunk's
 * one decode on the device. */
static agoq_codec_status agoq_gdecode_step(void* arg, const uint8_t* f, size_t len, size_t m) {
  const agoq_gdecode_arg* a = arg;
  if (a->s->req->gpu) return agoq_coll_grid_gpu_final(a->g, a->s, f, len, m, a->dst, true);
  return agoq_frame_decode_mt(f, len, a->s->req->codec_dtype, a->dst, m, a->g->codec_threads);
}

/* Decodes every frame of a message of final pieces (spans) into place; the message must
 * hold exactly them. */
static ncclResult_t agoq_grid_decode_msg(agoq_coll_comm* g, agoq_coll_slot* s, int from, const uint8_t* msg,
                                         size_t size, const agoq_coll_span* sp, int ns) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  agoq_piece_it it = agoq_pieces(sp, ns);
  size_t off = 0, end = 0;
  int idx;
  while (agoq_piece_next(&it, &g->grid, &idx)) {
    if (gs->pl[idx] == 0) continue;
    off = agoq_coll_align16(end);
    agoq_gdecode_arg a = {.g = g, .s = s, .dst = agoq_coll_dst_at(r, gs->pb[idx])};
    AGOQ_CHECK(agoq_gframe_next(g, from, msg, size, &off, true, gs->pl[idx], agoq_gdecode_step, &a));
    end = off;
  }
  if (end != size) {
    AGOQ_WARN("CollNet rank %d: a %zu-byte message from rank %d holds %zu bytes of frames (ranks disagree on the "
              "call?)", g->rank, size, from, end);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

static ncclResult_t agoq_grid_size_check(agoq_coll_comm* g, int from, size_t got, size_t want) {
  if (got == want) return ncclSuccess;
  AGOQ_WARN("CollNet rank %d: rank %d sent %zu bytes where the grid's layout gives %zu (ranks disagree on the "
            "call?)", g->rank, from, got, want);
  return ncclInvalidUsage;
}

/* ---- slot setup ------------------------------------------------------------------------------ */

static bool agoq_grid_has_rs(const agoq_coll_req* r) { return r->kind != AGOQ_COLL_ALLGATHER; }
static bool agoq_grid_has_ag(const agoq_coll_req* r) { return r->kind != AGOQ_COLL_REDUCESCATTER; }

static bool agoq_grid_step_runs(const agoq_coll_req* r, int step) {
  return step == AGOQ_COLL_ROW_RS || step == AGOQ_COLL_COL_RS ? agoq_grid_has_rs(r) : agoq_grid_has_ag(r);
}

/* What a step's messages hold. */
static agoq_gcontent agoq_grid_content(const agoq_coll_comm* g, const agoq_coll_req* r, int step) {
  switch (step) {
    case AGOQ_COLL_ROW_RS: return r->quantized ? AGOQ_GC_IN_FRAMES : AGOQ_GC_RAW;
    case AGOQ_COLL_COL_RS: return r->quantized && g->cfg.quant_partials ? AGOQ_GC_OUT_FRAMES : AGOQ_GC_PARTIAL;
    default: return r->quantized ? AGOQ_GC_OUT_FRAMES : AGOQ_GC_RAW;
  }
}

static ncclResult_t agoq_gslot_alloc(agoq_coll_comm* g, agoq_coll_slot* s);

ncclResult_t agoq_coll_grid_slot_setup(agoq_coll_comm* g, agoq_coll_slot* s, agoq_coll_req* r, size_t c) {
  if (s->gs == NULL) AGOQ_CHECK(agoq_gslot_alloc(g, s));
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  const agoq_coll_grid* gr = &g->grid;
  int n = g->nranks, me = g->rank, R = agoq_coll_grid_row(gr, me), P = agoq_coll_grid_pieces(gr);
  if (r->kind == AGOQ_COLL_ALLREDUCE) {
    agoq_coll_chunk_layout(r, c, P, gs->pb, gs->pl);
  } else {
    agoq_coll_chunk_layout(r, c, n, s->sb, s->sl);
    for (int idx = 0; idx < P; idx++) {
      int k = agoq_grid_rs_rank(gr, idx);
      gs->pb[idx] = k < n ? s->sb[k] : 0;
      gs->pl[idx] = k < n ? s->sl[k] : 0;
    }
  }
  gs->isz = r->quantized ? sizeof(float) : agoq_coll_partial_size(r->dtype, r->op);
  s->pend_p1s = s->pend_p1r = s->pend_p2s = s->pend_p2r = 0;
  gs->pend_rowr = gs->pend_colr = gs->pend_colg = 0;
  gs->row_done = gs->col_done = gs->ag_done = gs->lead_held = false;
  gs->own_len = gs->pack_len = 0;
  gs->pack_at = NULL;
  /* This rank's pieces: offsets in acc, and its final pieces' places in res and csum. */
  size_t acc_elems = 0, fin_elems = 0, res_cap = 0;
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  for (int i = 0; i < p->ncols; i++) {
    for (int row = 0; row < gr->b; row++) {
      int idx = agoq_coll_grid_piece(gr, p->cols[i], row);
      gs->aoff[idx] = acc_elems;
      acc_elems += gs->pl[idx] + (agoq_grid_partials_sealed(g, r) ? AGOQ_GRID_TRAILER / sizeof(float) : 0);
    }
    size_t m = gs->pl[agoq_coll_grid_piece(gr, p->cols[i], R)];
    gs->foff[i] = res_cap;
    gs->flen[i] = 0;
    fin_elems += m;
    if (r->quantized && m > 0) res_cap += agoq_coll_align16(agoq_frame_size_max(&p32, m));
  }
  /* Message regions: sends of the row reduce-scatter in sbuf (s_off by peer; this rank's own
   * frames at s_off[me]), phase-1 receives in rbuf (r_off), phase-2 receives in gbuf (g_off). */
  size_t sb = 0, rb = 0, gb = 0, pack = 0;
  for (int st = 0; st < AGOQ_COLL_STEPS; st++) {
    bool runs = agoq_grid_step_runs(r, st);
    agoq_gcontent what = agoq_grid_content(g, r, st);
    for (int d = 0; d < 2; d++)
      for (int k = 0; k < p->nmsg[st][d]; k++) {
        const agoq_gmsg* m = &p->msg[st][d][k];
        gs->melems[st][d][k] = 0;
        gs->mcap[st][d][k] =
            runs ? agoq_gmsg_size(g, s, agoq_gspans(g, m), m->nspans, what, false, &gs->melems[st][d][k]) : 0;
        gs->mnom[st][d][k] = runs ? agoq_gmsg_size(g, s, agoq_gspans(g, m), m->nspans, what, true, NULL) : 0;
      }
    if (!runs) continue;
    for (int k = 0; k < p->nmsg[st][0]; k++) {
      const agoq_gmsg* m = &p->msg[st][0][k];
      size_t elems = gs->melems[st][0][k], cap = gs->mcap[st][0][k];
      if (elems == 0) continue;
      if (st == AGOQ_COLL_ROW_RS || st == AGOQ_COLL_COL_RS) s->pend_p1s++;
      else s->pend_p2s++;
      if (st == AGOQ_COLL_ROW_RS || (st == AGOQ_COLL_COL_RS && what == AGOQ_GC_OUT_FRAMES)) {
        s->s_off[m->peer] = sb; /* row and column peers are distinct ranks */
        s->s_len[m->peer] = 0;
        /* The row reduce-scatter's frames at their nominal size (agoq_grid_encode_send; on the
         * GPU agoq_coll_grid_gpu_encode), the column's (made on the CPU) at their largest. */
        sb += agoq_coll_align16(st == AGOQ_COLL_ROW_RS ? gs->mnom[st][0][k] : cap);
      }
    }
    for (int k = 0; k < p->nmsg[st][1]; k++) {
      const agoq_gmsg* m = &p->msg[st][1][k];
      /* A larger message spills (on the GPU path into the group's spill area before the device
       * reads it: agoq_coll_gpu_spill_stage). */
      size_t elems = gs->melems[st][1][k], cap = gs->mnom[st][1][k], first;
      if (elems == 0) continue;
      switch (st) {
        case AGOQ_COLL_ROW_RS: s->pend_p1r++; gs->pend_rowr++; break;
        case AGOQ_COLL_COL_RS: s->pend_p1r++; gs->pend_colr++; break;
        case AGOQ_COLL_COL_AG: s->pend_p2r++; gs->pend_colg++; break;
        default: s->pend_p2r++; break;
      }
      if (st == AGOQ_COLL_ROW_RS || st == AGOQ_COLL_COL_RS) {
        gs->r_off[m->peer] = rb;
        rb += agoq_coll_align16(cap); /* typed and fp32 reads, frames: aligned */
      } else if (r->quantized || (st == AGOQ_COLL_ROW_AG && !agoq_gmsg_contig(s, gr, agoq_gspans(g, m), m->nspans,
                                                                                &first))) {
        /* Exact column pieces and whole column slices land in NCCL's buffer directly. */
        s->g_off[m->peer] = gb;
        gb += agoq_coll_align16(cap);
      }
    }
  }
  (void)agoq_gmsg_size(g, s, p->mine, p->ncols, AGOQ_GC_RAW, false, &gs->mine_elems);
  if (agoq_grid_has_rs(r) && r->quantized && !r->gpu) { /* a GPU request's stay on the device */
    s->s_off[me] = sb;
    sb += agoq_gmsg_size(g, s, p->mine, p->ncols, AGOQ_GC_IN_FRAMES, false, NULL);
  }
  /* Nominal: a row all-gather message whose frames outgrow it is built in a buffer of its own. */
  if (agoq_grid_has_ag(r))
    pack = agoq_gmsg_size(g, s, p->mine, p->ncols, agoq_grid_content(g, r, AGOQ_COLL_ROW_AG), true, NULL);
  AGOQ_CHECK(agoq_coll_buf_reserve(-1, &gs->csum, fin_elems * sizeof(float)));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &gs->pack, pack));
  s->gpu_step = AGOQ_GPU_STEP_NONE;
  gs->acc_len = acc_elems * gs->isz;
  if (r->gpu) return agoq_coll_grid_gpu_bufs(g, s, sb, rb, gb, gs->acc_len, res_cap);
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.sbuf, sb));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.rbuf, rb));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.gbuf, gb));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.acc, gs->acc_len));
  AGOQ_CHECK(agoq_coll_buf_reserve(g->dev, &s->own.res, res_cap));
  s->sbuf = s->own.sbuf;
  s->rbuf = s->own.rbuf;
  s->gbuf = s->own.gbuf;
  s->acc = s->own.acc;
  s->res = s->own.res;
  return ncclSuccess;
}

/* ---- posting ----------------------------------------------------------------------------------- */

/* Encodes the frames of a message's pieces from this rank's input, packed from out. */
static agoq_codec_status agoq_grid_encode_st(agoq_coll_comm* g, agoq_coll_slot* s, const agoq_coll_span* sp, int ns,
                                             bool sealed, uint8_t* out, size_t cap, size_t* len) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  agoq_codec_params pin = agoq_coll_params(g, r->codec_dtype);
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns();
  agoq_piece_it it = agoq_pieces(sp, ns);
  size_t end = 0;
  int idx;
  agoq_codec_status st = AGOQ_CODEC_OK;
  while (st == AGOQ_CODEC_OK && agoq_piece_next(&it, &g->grid, &idx)) {
    if (gs->pl[idx] == 0) continue;
    size_t off = agoq_coll_align16(end), flen = 0;
    st = agoq_frame_encode_mt(&pin, agoq_coll_src_at(r, gs->pb[idx]), gs->pl[idx], sealed, out + off, cap - off,
                              &flen, g->codec_threads);
    end = off + flen;
  }
  agoq_stats_add(&agoq_coll_req_stats(g, r)->codec_ns, (uint64_t)(agoq_coll_now_ns() - t0));
  agoq_stats_add(&agoq_coll_req_stats(g, r)->crc_ns, agoq_frame_crc_ns() - crc0);
  *len = end;
  return st;
}

static ncclResult_t agoq_grid_encode(agoq_coll_comm* g, agoq_coll_slot* s, const agoq_coll_span* sp, int ns,
                                     bool sealed, uint8_t* out, size_t cap, size_t* len) {
  agoq_codec_status st = agoq_grid_encode_st(g, s, sp, ns, sealed, out, cap, len);
  if (st == AGOQ_CODEC_OK) return ncclSuccess;
  AGOQ_WARN("CollNet: quantizing this rank's own pieces failed: %s", agoq_codec_status_str(st));
  return ncclInternalError;
}

/* A row reduce-scatter message's frames into its region of sbuf (nominal bytes); when blocks
 * escaped raw and they do not fit, into a buffer of their own (max bytes). s_at says where. */
static ncclResult_t agoq_grid_encode_send(agoq_coll_comm* g, agoq_coll_slot* s, const agoq_gmsg* m, size_t nom,
                                         size_t max) {
  const agoq_coll_span* sp = agoq_gspans(g, m);
  uint8_t* out = s->sbuf.p + s->s_off[m->peer];
  agoq_codec_status st = agoq_grid_encode_st(g, s, sp, m->nspans, true, out, nom, &s->s_len[m->peer]);
  if (st == AGOQ_CODEC_ESPACE && nom < max) {
    out = agoq_coll_spill_alloc(g, s, max);
    if (out == NULL) return ncclSystemError;
    st = agoq_grid_encode_st(g, s, sp, m->nspans, true, out, max, &s->s_len[m->peer]);
  }
  s->s_at[m->peer] = out;
  if (st == AGOQ_CODEC_OK) return ncclSuccess;
  AGOQ_WARN("CollNet: quantizing the row message for rank %d failed: %s", m->peer, agoq_codec_status_str(st));
  return ncclInternalError;
}

/* Copies a message's pieces from `base` (the request's input or output) back to back. */
static size_t agoq_grid_pack_raw(const agoq_coll_comm* g, const agoq_coll_slot* s, const agoq_coll_span* sp, int ns,
                                 bool from_src, uint8_t* out) {
  const agoq_coll_req* r = s->req;
  const struct agoq_coll_gslot* gs = s->gs;
  agoq_piece_it it = agoq_pieces(sp, ns);
  size_t off = 0;
  int idx;
  while (agoq_piece_next(&it, &g->grid, &idx)) {
    size_t bytes = gs->pl[idx] * r->esz;
    if (bytes == 0) continue;
    memcpy(out + off, from_src ? agoq_coll_src_at(r, gs->pb[idx]) : agoq_coll_dst_at(r, gs->pb[idx]), bytes);
    off += bytes;
  }
  return off;
}

static void agoq_grid_unpack_raw(const agoq_coll_comm* g, const agoq_coll_slot* s, const agoq_coll_span* sp, int ns,
                                 const uint8_t* in) {
  const agoq_coll_req* r = s->req;
  const struct agoq_coll_gslot* gs = s->gs;
  agoq_piece_it it = agoq_pieces(sp, ns);
  size_t off = 0;
  int idx;
  while (agoq_piece_next(&it, &g->grid, &idx)) {
    size_t bytes = gs->pl[idx] * r->esz;
    if (bytes == 0) continue;
    memcpy(agoq_coll_dst_at(r, gs->pb[idx]), in + off, bytes);
    off += bytes;
  }
}

/* Where a phase-2 message from peer j of step st lands. */
static uint8_t* agoq_grid_p2_dst(agoq_coll_comm* g, agoq_coll_slot* s, int st, const agoq_gmsg* m) {
  agoq_coll_req* r = s->req;
  size_t first;
  if (r->quantized) return s->gbuf.p + s->g_off[m->peer];
  if (st == AGOQ_COLL_COL_AG) {
    const agoq_coll_span* sp = agoq_gspans(g, m);
    return agoq_coll_dst_at(r, s->gs->pb[agoq_coll_grid_piece(&g->grid, sp[0].col, sp[0].row)]);
  }
  if (agoq_gmsg_contig(s, &g->grid, agoq_gspans(g, m), m->nspans, &first)) return agoq_coll_dst_at(r, first);
  return s->gbuf.p + s->g_off[m->peer];
}

/* Every receive of the chunk, in step order, then the row reduce-scatter's sends; returns
 * with the slot still POSTING when the net core is busy, to resume at the same operation. */
ncclResult_t agoq_coll_grid_post(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  const struct agoq_coll_gplan* p = g->plan;
  struct agoq_coll_gslot* gs = s->gs;
  bool posted = true;
  for (;; s->post_recvs++) {
    int k = s->post_recvs, st = 0;
    while (st < AGOQ_COLL_STEPS && k >= p->nmsg[st][1]) k -= p->nmsg[st][1], st++;
    if (st == AGOQ_COLL_STEPS) break;
    const agoq_gmsg* m = &p->msg[st][1][k];
    size_t max = gs->mcap[st][1][k], nom = gs->mnom[st][1][k];
    if (gs->melems[st][1][k] == 0) continue; /* none this chunk, or a step this call has not */
    if (st == AGOQ_COLL_ROW_RS || st == AGOQ_COLL_COL_RS)
      AGOQ_CHECK(agoq_coll_post_recv_max(g, s, AGOQ_CQ_P1R, m->peer, s->rbuf.p + gs->r_off[m->peer], nom, max,
                                         &posted));
    else
      AGOQ_CHECK(agoq_coll_post_recv_max(g, s, AGOQ_CQ_P2R, m->peer, agoq_grid_p2_dst(g, s, st, m), nom, max,
                                         &posted));
    if (!posted) return ncclSuccess;
  }
  if (agoq_grid_has_rs(r)) {
    /* A GPU request's frames, every one at once on the device. */
    bool ready = true;
    if (r->gpu) AGOQ_CHECK(agoq_coll_grid_gpu_encode(g, s, &ready));
    if (!ready) return ncclSuccess;
    /* The row lead (AGOQ_COLL_ROW_LEAD): grid_seq[0] is the oldest chunk whose row is not
     * yet summed; it is older than this one, so its progress never waits on this one's. */
    if (s->post_sends == 0 && s->seq >= g->grid_seq[0] + g->row_lead) {
      if (!gs->lead_held) g->lead_waits++;
      gs->lead_held = true;
      return ncclSuccess;
    }
    for (; s->post_sends < p->nmsg[AGOQ_COLL_ROW_RS][0]; s->post_sends++) {
      const agoq_gmsg* m = &p->msg[AGOQ_COLL_ROW_RS][0][s->post_sends];
      const agoq_coll_span* sp = agoq_gspans(g, m);
      size_t elems = gs->melems[AGOQ_COLL_ROW_RS][0][s->post_sends], cap = gs->mcap[AGOQ_COLL_ROW_RS][0][s->post_sends],
             first;
      if (elems == 0) continue;
      const uint8_t* data;
      size_t len;
      if (r->quantized) {
        if (s->s_len[m->peer] == 0 && !r->gpu)
          AGOQ_CHECK(agoq_grid_encode_send(g, s, m, gs->mnom[AGOQ_COLL_ROW_RS][0][s->post_sends], cap));
        data = s->s_at[m->peer];
        len = s->s_len[m->peer];
      } else if (agoq_gmsg_contig(s, &g->grid, sp, m->nspans, &first)) {
        data = agoq_coll_src_at(r, first);
        len = cap;
      } else {
        if (s->s_len[m->peer] == 0) s->s_len[m->peer] = agoq_grid_pack_raw(g, s, sp, m->nspans, true,
                                                                             s->sbuf.p + s->s_off[m->peer]);
        data = s->sbuf.p + s->s_off[m->peer];
        len = s->s_len[m->peer];
      }
      AGOQ_CHECK(agoq_coll_post_send(g, s, AGOQ_CQ_P1S, m->peer, data, len, elems * r->esz, &posted));
      if (!posted) return ncclSuccess;
    }
    /* This rank's own columns, quantized like every contribution, never sent. */
    if (r->quantized && !r->gpu && gs->own_len == 0)
      AGOQ_CHECK(agoq_grid_encode(g, s, p->mine, p->ncols, false, s->sbuf.p + s->s_off[g->rank],
                                  s->sbuf.cap - s->s_off[g->rank], &gs->own_len));
  }
  s->stage = agoq_grid_has_rs(r) ? AGOQ_SLOT_G_ROW : AGOQ_SLOT_G_COL;
  s->post_sends = 0;
  return ncclSuccess;
}

/* ---- completions -------------------------------------------------------------------------------- */

ncclResult_t agoq_coll_grid_received(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, int size) {
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  agoq_coll_req* r = s->req;
  if (kind == AGOQ_CQ_P1R) {
    if (p->row_peer[j]) gs->pend_rowr--;
    else gs->pend_colr--;
    return ncclSuccess;
  }
  gs->p2r_size[j] = size;
  int st = p->row_peer[j] ? AGOQ_COLL_ROW_AG : AGOQ_COLL_COL_AG, k = p->msg_of[st][1][j];
  /* Exact: the bytes the layout gives (a quantized message's frames are checked as read). */
  if (!r->quantized) AGOQ_CHECK(agoq_grid_size_check(g, j, (size_t)size, gs->mcap[st][1][k]));
  if (st == AGOQ_COLL_COL_AG) {
    gs->pend_colg--; /* quantized: decoded in order, at the row all-gather */
    return ncclSuccess;
  }
  /* A row peer's final pieces: into place now. */
  const agoq_gmsg* m = &p->msg[st][1][k];
  const agoq_coll_span* sp = agoq_gspans(g, m);
  if (r->quantized) {
    int64_t t0 = agoq_coll_now_ns();
    uint64_t crc0 = agoq_frame_crc_ns();
    ncclResult_t res = agoq_grid_decode_msg(g, s, j, s->p2r_at[j], (size_t)size, sp, m->nspans);
    agoq_stats_add(&agoq_coll_req_stats(g, r)->codec_ns, (uint64_t)(agoq_coll_now_ns() - t0));
    agoq_stats_add(&agoq_coll_req_stats(g, r)->crc_ns, agoq_frame_crc_ns() - crc0);
    return res;
  }
  size_t first;
  if (!agoq_gmsg_contig(s, &g->grid, sp, m->nspans, &first)) agoq_grid_unpack_raw(g, s, sp, m->nspans, s->p2r_at[j]);
  return ncclSuccess;
}

/* ---- the row reduce ------------------------------------------------------------------------------ */

/* acc = the row's contributions to this rank's pieces, summed in rank order. */
static ncclResult_t agoq_grid_row_reduce(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  const agoq_coll_grid* gr = &g->grid;
  int me = g->rank;
  if (gs->mine_elems == 0) return ncclSuccess; /* no piece here in this chunk: no message came either */
  if (r->quantized) {
    for (int q = p->row_first; q < p->row_first + p->row_len; q++) {
      bool own = q == me;
      if (!own && p->msg_of[AGOQ_COLL_ROW_RS][1][q] < 0) continue;
      const uint8_t* msg = own ? s->sbuf.p + s->s_off[me] : s->p1r_at[q];
      size_t size = own ? gs->own_len : (size_t)s->p1r_size[q], off = 0, end = 0;
      agoq_piece_it it = agoq_pieces(p->mine, p->ncols);
      int idx;
      while (agoq_piece_next(&it, gr, &idx)) {
        if (gs->pl[idx] == 0) continue;
        off = agoq_coll_align16(end);
        agoq_gsum_arg a = {.acc = (float*)s->acc.p + gs->aoff[idx], .first = q == p->row_first,
                           .threads = g->codec_threads};
        AGOQ_CHECK(agoq_gframe_next(g, q, msg, size, &off, !own, gs->pl[idx], agoq_gsum_step, &a));
        end = off;
      }
      if (end != size) return agoq_grid_size_check(g, q, size, end);
    }
    return ncclSuccess;
  }
  /* Exact: each piece's row inputs, in rank order. */
  size_t want = gs->mine_elems * r->esz;
  for (int q = p->row_first; q < p->row_first + p->row_len; q++)
    if (q != me) AGOQ_CHECK(agoq_grid_size_check(g, q, (size_t)s->p1r_size[q], want));
  agoq_piece_it it = agoq_pieces(p->mine, p->ncols);
  size_t at = 0;
  int idx;
  while (agoq_piece_next(&it, gr, &idx)) {
    size_t m = gs->pl[idx];
    if (m == 0) continue;
    for (int q = p->row_first; q < p->row_first + p->row_len; q++)
      g->reduce_in[q - p->row_first] = q == me ? agoq_coll_src_at(r, gs->pb[idx]) : s->p1r_at[q] + at;
    agoq_coll_reduce_partial(r->dtype, r->op, g->reduce_in, p->row_len, m, s->acc.p + gs->aoff[idx] * gs->isz);
    at += m * r->esz;
  }
  return ncclSuccess;
}

/* ---- the partial sums' trailers ------------------------------------------------------------------ */

static uint32_t agoq_grid_crc_timed(agoq_coll_comm* g, const agoq_coll_slot* s, const uint8_t* p, size_t len) {
  int64_t t0 = agoq_coll_now_ns();
  uint32_t crc = agoq_crc32c(0, p, len);
  uint64_t ns = (uint64_t)(agoq_coll_now_ns() - t0);
  agoq_stats_add(&agoq_coll_req_stats(g, s->req)->crc_ns, ns);
  agoq_stats_add(&agoq_coll_req_stats(g, s->req)->codec_ns, ns);
  return crc;
}

/* After the row reduce: the trailer of every piece this rank sends down its column. */
static void agoq_grid_partials_seal(agoq_coll_comm* g, agoq_coll_slot* s) {
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  if (!agoq_grid_partials_sealed(g, s->req)) return;
  for (int k = 0; k < p->nmsg[AGOQ_COLL_COL_RS][0]; k++) {
    const agoq_coll_span* sp = agoq_gspans(g, &p->msg[AGOQ_COLL_COL_RS][0][k]);
    int idx = agoq_coll_grid_piece(&g->grid, sp[0].col, sp[0].row);
    size_t len = gs->pl[idx] * gs->isz;
    if (len == 0) continue;
    uint8_t* at = s->acc.p + gs->aoff[idx] * gs->isz;
    uint32_t crc = agoq_grid_crc_timed(g, s, at, len);
    for (int i = 0; i < 4; i++) at[len + (size_t)i] = (uint8_t)(crc >> (8 * i));
    memset(at + len + 4, 0, AGOQ_GRID_TRAILER - 4);
  }
}

/* A column message of `len` bytes of partial sums from `from`, followed by its trailer. */
static ncclResult_t agoq_grid_partial_check(agoq_coll_comm* g, const agoq_coll_slot* s, int from, const uint8_t* msg,
                                            size_t len) {
  uint32_t crc = agoq_grid_crc_timed(g, s, msg, len), got = 0;
  for (int i = 3; i >= 0; i--) got = got << 8 | msg[len + (size_t)i];
  bool pad = true;
  for (size_t i = 4; i < AGOQ_GRID_TRAILER; i++) pad = pad && msg[len + i] == 0;
  if (crc == got && pad) return ncclSuccess;
  AGOQ_WARN("CollNet rank %d: the partial sums from rank %d (%zu bytes) fail their CRC32C (%08x, carried %08x%s): "
            "corrupted on the way; the call fails", g->rank, from, len, crc, got, pad ? "" : ", trailer not zero-padded");
  return ncclSystemError;
}

/* ---- the column reduce ------------------------------------------------------------------------- */

/* This rank's final pieces: the rows' partial sums in row order, then quantized once (and
 * decoded into place) or rounded once; an all-gather's own piece is put in place. */
static ncclResult_t agoq_grid_col_reduce(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  const agoq_coll_grid* gr = &g->grid;
  int R = agoq_coll_grid_row(gr, g->rank);
  if (r->kind == AGOQ_COLL_ALLGATHER) {
    for (int i = 0; i < p->ncols; i++) {
      int idx = agoq_coll_grid_piece(gr, p->cols[i], R);
      if (gs->pl[idx] == 0) continue;
      const uint8_t* src = agoq_coll_src_at(r, gs->pb[idx]);
      uint8_t* dst = agoq_coll_dst_at(r, gs->pb[idx]);
      if (src != dst) memmove(dst, src, gs->pl[idx]);
    }
    return ncclSuccess;
  }
  float* csum = (float*)gs->csum.p;
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  for (int i = 0; i < p->ncols; i++) {
    int c = p->cols[i], idx = agoq_coll_grid_piece(gr, c, R);
    size_t m = gs->pl[idx];
    if (m == 0) continue;
    uint8_t* dst = agoq_coll_dst_at(r, gs->pb[idx]);
    if (r->quantized && g->cfg.quant_partials) {
      /* The rows' quantized partial sums (this row's exact), summed in fp32 in row order. */
      const float* own = (const float*)s->acc.p + gs->aoff[idx];
      for (int row = 0; row < gr->b; row++) {
        if (row == R) {
          for (size_t e = 0; e < m; e++) csum[e] = row == 0 ? own[e] : csum[e] + own[e];
          continue;
        }
        int from = agoq_coll_grid_player(gr, row, c);
        size_t size = (size_t)s->p1r_size[from], off = 0;
        agoq_gsum_arg a = {.acc = csum, .first = row == 0, .threads = g->codec_threads};
        AGOQ_CHECK(agoq_gframe_next(g, from, s->p1r_at[from], size, &off, true, m, agoq_gsum_step, &a));
        if (off != size) return agoq_grid_size_check(g, from, size, off);
      }
    } else {
      bool sealed = agoq_grid_partials_sealed(g, r);
      for (int row = 0; row < gr->b; row++) {
        if (row == R) {
          g->reduce_in[row] = s->acc.p + gs->aoff[idx] * gs->isz;
          continue;
        }
        int from = agoq_coll_grid_player(gr, row, c);
        AGOQ_CHECK(agoq_grid_size_check(g, from, (size_t)s->p1r_size[from],
                                        m * gs->isz + (sealed ? AGOQ_GRID_TRAILER : 0)));
        if (sealed) AGOQ_CHECK(agoq_grid_partial_check(g, s, from, s->p1r_at[from], m * gs->isz));
        g->reduce_in[row] = s->p1r_at[from];
      }
    }
    if (!r->quantized) {
      agoq_coll_reduce_final(r->dtype, r->op, g->reduce_in, gr->b, m, csum, dst);
      csum += m;
      continue;
    }
    /* fp32 sums in row order; a sum beyond the type's range is Inf, as the mesh gives. */
    if (!g->cfg.quant_partials) agoq_coll_reduce_exact(ncclFloat32, ncclSum, g->reduce_in, gr->b, m, csum, NULL);
    if (r->kind == AGOQ_COLL_REDUCESCATTER) {
      /* A GPU request's frames region holds the rounded piece on its way to the device. */
      if (r->gpu) AGOQ_CHECK(agoq_coll_grid_gpu_narrow(g, s, csum, m, s->res.p + gs->foff[i], dst));
      else agoq_codec_narrow_fp32(r->codec_dtype, csum, m, dst);
      csum += m;
      continue;
    }
    agoq_codec_overflow_to_inf(r->codec_dtype, csum, m);
    uint8_t* f = s->res.p + gs->foff[i];
    /* Every rank takes the same decoded bytes, this one too (a GPU request: in the chunk's one
     * decode on the device); the copy that travels is sealed. */
    agoq_codec_status st = agoq_frame_encode_mt(&p32, csum, m, false, f, s->res.cap - gs->foff[i], &gs->flen[i],
                                                g->codec_threads);
    if (st == AGOQ_CODEC_OK)
      st = r->gpu ? agoq_coll_grid_gpu_final(g, s, f, gs->flen[i], m, dst, false)
                  : agoq_frame_decode_mt(f, gs->flen[i], r->codec_dtype, dst, m, g->codec_threads);
    if (st == AGOQ_CODEC_OK) st = agoq_frame_seal_payload_crc(f, gs->flen[i]);
    if (st != AGOQ_CODEC_OK) {
      AGOQ_WARN("CollNet: quantizing a reduced piece of %zu elements failed: %s", m, agoq_codec_status_str(st));
      return ncclInternalError;
    }
    csum += m;
  }
  return ncclSuccess;
}

/* ---- the all-gathers ------------------------------------------------------------------------------ */

/* The column's final pieces into place (quantized), then the row all-gather message. */
static ncclResult_t agoq_grid_ag_pack(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  const agoq_coll_grid* gr = &g->grid;
  int R = agoq_coll_grid_row(gr, g->rank);
  size_t first;
  if (!r->quantized) {
    gs->pack_at = gs->pack.p;
    if (!agoq_gmsg_contig(s, gr, p->mine, p->ncols, &first))
      gs->pack_len = agoq_grid_pack_raw(g, s, p->mine, p->ncols, false, gs->pack.p);
    return ncclSuccess;
  }
  for (int k = 0; k < p->nmsg[AGOQ_COLL_COL_AG][1]; k++) {
    const agoq_gmsg* m = &p->msg[AGOQ_COLL_COL_AG][1][k];
    if (gs->melems[AGOQ_COLL_COL_AG][1][k] == 0) continue;
    AGOQ_CHECK(agoq_grid_decode_msg(g, s, m->peer, s->p2r_at[m->peer], (size_t)gs->p2r_size[m->peer],
                                    agoq_gspans(g, m), m->nspans));
  }
  /* Its frames back to back, 16-byte aligned: sized first, built second. */
  gs->pack_at = gs->pack.p;
  for (int pass = 0; pass < 2; pass++) {
    size_t end = 0;
    for (int i = 0; i < p->ncols; i++) {
      for (int row = 0; row < gr->b; row++) {
        int idx = agoq_coll_grid_piece(gr, p->cols[i], row);
        if (gs->pl[idx] == 0) continue;
        const uint8_t* f;
        size_t len;
        if (row == R) {
          f = s->res.p + gs->foff[i];
          len = gs->flen[i];
        } else {
          int from = agoq_coll_grid_player(gr, row, p->cols[i]);
          f = s->p2r_at[from];
          len = (size_t)gs->p2r_size[from];
        }
        size_t off = agoq_coll_align16(end);
        if (pass == 1) memcpy(gs->pack_at + off, f, len);
        end = off + len;
      }
    }
    gs->pack_len = end;
    if (pass == 0 && end > gs->pack.cap) {
      /* Blocks escaped raw: larger than nominal frames. */
      gs->pack_at = agoq_coll_spill_alloc(g, s, end);
      if (gs->pack_at == NULL) return ncclSystemError;
    }
  }
  return ncclSuccess;
}

/* ---- the stages, each in chunk order ---------------------------------------------------------- */

/* AGOQ_COLLNET_PARTIALS=quantized: piece idx of this row's fp32 partial sums as one sealed
 * frame for `peer`, in its region of sbuf (cap bytes). */
static ncclResult_t agoq_grid_encode_partial(agoq_coll_comm* g, agoq_coll_slot* s, int idx, int peer, size_t cap) {
  struct agoq_coll_gslot* gs = s->gs;
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns();
  agoq_codec_status st = agoq_frame_encode_mt(&p32, (const float*)s->acc.p + gs->aoff[idx], gs->pl[idx], true,
                                              s->sbuf.p + s->s_off[peer], cap, &s->s_len[peer], g->codec_threads);
  agoq_stats_add(&agoq_coll_req_stats(g, s->req)->codec_ns, (uint64_t)(agoq_coll_now_ns() - t0));
  agoq_stats_add(&agoq_coll_req_stats(g, s->req)->crc_ns, agoq_frame_crc_ns() - crc0);
  if (st == AGOQ_CODEC_OK) return ncclSuccess;
  AGOQ_WARN("CollNet: quantizing a partial sum of %zu elements failed: %s", gs->pl[idx], agoq_codec_status_str(st));
  return ncclInternalError;
}

/* Posts the sends of `step` from s->post_sends on; *done once all are posted. */
static ncclResult_t agoq_grid_send_step(agoq_coll_comm* g, agoq_coll_slot* s, int step, bool* done) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  const agoq_coll_grid* gr = &g->grid;
  int R = agoq_coll_grid_row(gr, g->rank);
  bool posted = true;
  *done = false;
  for (; s->post_sends < p->nmsg[step][0]; s->post_sends++) {
    const agoq_gmsg* m = &p->msg[step][0][s->post_sends];
    const agoq_coll_span* sp = agoq_gspans(g, m);
    size_t elems = gs->melems[step][0][s->post_sends], len = gs->mcap[step][0][s->post_sends], first;
    if (elems == 0) continue;
    const uint8_t* data;
    int idx = agoq_coll_grid_piece(gr, sp[0].col, sp[0].row);
    switch (step) {
      case AGOQ_COLL_COL_RS: /* piece (c, r) of this row's partial sums */
        data = s->acc.p + gs->aoff[idx] * gs->isz;
        if (agoq_grid_content(g, r, step) == AGOQ_GC_OUT_FRAMES) { /* AGOQ_COLLNET_PARTIALS=quantized */
          if (s->s_len[m->peer] == 0) AGOQ_CHECK(agoq_grid_encode_partial(g, s, idx, m->peer, len));
          data = s->sbuf.p + s->s_off[m->peer];
          len = s->s_len[m->peer];
        }
        break;
      case AGOQ_COLL_COL_AG: /* this rank's final piece (c, R) */
        if (r->quantized) {
          int i = p->col_index[sp[0].col];
          data = s->res.p + gs->foff[i];
          len = gs->flen[i];
        } else {
          data = agoq_coll_dst_at(r, gs->pb[agoq_coll_grid_piece(gr, sp[0].col, R)]);
        }
        break;
      default: /* ROW_AG: every final piece of this rank's columns */
        if (!r->quantized && agoq_gmsg_contig(s, gr, sp, m->nspans, &first)) {
          data = agoq_coll_dst_at(r, first);
        } else {
          data = gs->pack_at;
          len = gs->pack_len;
        }
        break;
    }
    AGOQ_CHECK(agoq_coll_post_send(g, s, step == AGOQ_COLL_COL_RS ? AGOQ_CQ_P1S : AGOQ_CQ_P2S, m->peer, data, len,
                                   elems * r->esz, &posted));
    if (!posted) return ncclSuccess;
  }
  s->post_sends = 0;
  *done = true;
  return ncclSuccess;
}

/* One stage of one slot; *moved once the slot is past it. */
static ncclResult_t agoq_grid_stage(agoq_coll_comm* g, agoq_coll_slot* s, bool* moved, bool* progressed) {
  struct agoq_coll_gslot* gs = s->gs;
  agoq_coll_req* r = s->req;
  bool sent = false;
  *moved = false;
  switch (s->stage) {
    case AGOQ_SLOT_G_ROW:
      if (!gs->row_done) {
        if (gs->pend_rowr > 0) return ncclSuccess;
        if (r->gpu) {
          bool summed = false;
          AGOQ_CHECK(agoq_coll_grid_gpu_row(g, s, &summed));
          if (!summed) return ncclSuccess; /* the device is at it: a later pass looks again */
        } else {
          AGOQ_CHECK(agoq_coll_timed(g, s, agoq_grid_row_reduce));
        }
        agoq_grid_partials_seal(g, s);
        gs->row_done = *progressed = true;
      }
      AGOQ_CHECK(agoq_grid_send_step(g, s, AGOQ_COLL_COL_RS, &sent));
      if (!sent) return ncclSuccess;
      s->stage = AGOQ_SLOT_G_COL;
      break;
    case AGOQ_SLOT_G_COL:
      if (!gs->col_done) {
        if (gs->pend_colr > 0) return ncclSuccess;
        AGOQ_CHECK(agoq_coll_timed(g, s, agoq_grid_col_reduce));
        gs->col_done = *progressed = true;
      }
      if (agoq_grid_has_ag(r)) {
        AGOQ_CHECK(agoq_grid_send_step(g, s, AGOQ_COLL_COL_AG, &sent));
        if (!sent) return ncclSuccess;
      }
      s->stage = agoq_grid_has_ag(r) ? AGOQ_SLOT_G_AG : AGOQ_SLOT_WAIT_ALL;
      break;
    case AGOQ_SLOT_G_AG:
      if (!gs->ag_done) {
        if (gs->pend_colg > 0) return ncclSuccess;
        AGOQ_CHECK(agoq_coll_timed(g, s, agoq_grid_ag_pack));
        gs->ag_done = *progressed = true;
      }
      AGOQ_CHECK(agoq_grid_send_step(g, s, AGOQ_COLL_ROW_AG, &sent));
      if (!sent) return ncclSuccess;
      s->stage = AGOQ_SLOT_WAIT_ALL;
      break;
    default:
      return ncclSuccess;
  }
  *moved = *progressed = true;
  return ncclSuccess;
}

ncclResult_t agoq_coll_grid_advance(agoq_coll_comm* g, bool* progressed) {
  static const agoq_slot_stage stage_of[3] = {AGOQ_SLOT_G_ROW, AGOQ_SLOT_G_COL, AGOQ_SLOT_G_AG};
  for (int k = 0; k < 3; k++) {
    while (g->grid_seq[k] < g->next_seq) {
      uint64_t seq = g->grid_seq[k];
      agoq_coll_slot* s = &g->slots[seq % AGOQ_COLL_SLOTS];
      /* A chunk already retired (its slot free or reused) is past every stage. */
      if (s->stage == AGOQ_SLOT_FREE || s->seq != seq) {
        g->grid_seq[k]++;
        continue;
      }
      if (s->stage == AGOQ_SLOT_POSTING || s->stage < stage_of[k]) break;
      if (s->stage == stage_of[k]) {
        bool moved = false;
        AGOQ_CHECK(agoq_grid_stage(g, s, &moved, progressed));
        if (!moved) break;
      }
      g->grid_seq[k]++;
    }
  }
  return ncclSuccess;
}

ncclResult_t agoq_coll_grid_retire(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  *done = true;
  return s->req->gpu ? agoq_coll_grid_gpu_retire(g, s, done) : ncclSuccess;
}

/* ---- lifetime -------------------------------------------------------------------------------------- */

static void agoq_gslot_free(struct agoq_coll_gslot* gs) {
  if (gs == NULL) return;
  free(gs->pb);
  free(gs->pl);
  free(gs->aoff);
  free(gs->r_off);
  free(gs->p2r_size);
  free(gs->foff);
  free(gs->flen);
  for (int st = 0; st < AGOQ_COLL_STEPS; st++)
    for (int d = 0; d < 2; d++) {
      free(gs->melems[st][d]);
      free(gs->mcap[st][d]);
      free(gs->mnom[st][d]);
    }
  agoq_coll_buf_free(&gs->csum);
  agoq_coll_buf_free(&gs->pack);
  free(gs);
}

size_t agoq_coll_grid_staging(const agoq_coll_slot* s) {
  return s->gs == NULL ? 0 : s->gs->csum.cap + s->gs->pack.cap;
}

ncclResult_t agoq_coll_grid_start(agoq_coll_comm* g) {
  g->row_lead = AGOQ_COLL_ROW_LEAD;
  return agoq_gplan_make(g, &g->plan);
}

/* A slot's grid state, made the first time a chunk uses the slot: O(n) per slot, and a
 * group of small calls never fills the pipeline. */
static ncclResult_t agoq_gslot_alloc(agoq_coll_comm* g, agoq_coll_slot* s) {
  ncclResult_t res = ncclSuccess;
  size_t P = (size_t)agoq_coll_grid_pieces(&g->grid), n = (size_t)g->nranks, k = (size_t)g->plan->ncols;
  struct agoq_coll_gslot* gs = NULL;
  AGOQ_CALLOC_GOTO(gs, 1, res, fail);
  AGOQ_CALLOC_GOTO(gs->pb, P + 1, res, fail);
  AGOQ_CALLOC_GOTO(gs->pl, P, res, fail);
  AGOQ_CALLOC_GOTO(gs->aoff, P, res, fail);
  AGOQ_CALLOC_GOTO(gs->r_off, n, res, fail);
  AGOQ_CALLOC_GOTO(gs->p2r_size, n, res, fail);
  AGOQ_CALLOC_GOTO(gs->foff, k, res, fail);
  AGOQ_CALLOC_GOTO(gs->flen, k, res, fail);
  for (int st = 0; st < AGOQ_COLL_STEPS; st++)
    for (int d = 0; d < 2; d++) {
      size_t nm = (size_t)(g->plan->nmsg[st][d] > 0 ? g->plan->nmsg[st][d] : 1);
      AGOQ_CALLOC_GOTO(gs->melems[st][d], nm, res, fail);
      AGOQ_CALLOC_GOTO(gs->mcap[st][d], nm, res, fail);
      AGOQ_CALLOC_GOTO(gs->mnom[st][d], nm, res, fail);
    }
  s->gs = gs;
  return ncclSuccess;
fail:
  agoq_gslot_free(gs);
  return res;
}

void agoq_coll_grid_free(agoq_coll_comm* g) {
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) {
    agoq_gslot_free(g->slots[i].gs);
    g->slots[i].gs = NULL;
  }
  agoq_gplan_free(g->plan);
  g->plan = NULL;
}
