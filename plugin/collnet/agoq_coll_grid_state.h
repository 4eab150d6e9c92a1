/*
 * A grid group's state, as its two files of stages share it (agoq_coll_grid.c, the stages;
 * agoq_coll_grid_gpu.c, the GPU's part of them): the plan of this rank's messages, a chunk's
 * grid state, and how a message's pieces and frames are walked (agoq_coll_grid_state.c).
 * Private to the grid; neither stage file calls the other's helpers through it.
 */
#ifndef AGOQ_COLL_GRID_STATE_H
#define AGOQ_COLL_GRID_STATE_H

#include "agoq_frame.h"
#include "collnet/agoq_coll_internal.h"

typedef struct {
  int peer;
  int span0, nspans; /* in the plan's span pool */
} agoq_gmsg;

/* The messages of this rank for every chunk (the schedule's enumerations, once per group). */
struct agoq_coll_gplan {
  /* [step][0: sends, 1: receives]; receives by peer ascending, sends from the first peer
   * after this rank, wrapping around (agoq_gplan_rotate) */
  agoq_gmsg* msg[AGOQ_COLL_STEPS][2];
  int nmsg[AGOQ_COLL_STEPS][2];
  int* msg_of[AGOQ_COLL_STEPS][2];    /* peer -> index in msg[][], -1: none */
  agoq_coll_span* spans;
  int nspans, spans_cap;
  agoq_coll_span* mine; /* this rank's pieces: its columns, every row (one span per column) */
  int* cols;            /* the columns it plays, ascending */
  int ncols;
  int* col_index;       /* column -> index in cols, -1 where it does not play */
  bool* row_peer;       /* rank -> in this rank's row */
  int row_first, row_len;
};

/* A grid chunk's own state, per pipeline slot. */
struct agoq_coll_gslot {
  size_t* pb; /* piece -> first element (of the request's element space), length */
  size_t* pl;
  size_t* aoff;      /* piece of this rank's columns -> element offset in acc */
  size_t* r_off;     /* peer -> its phase-1 message in rbuf */
  int* p2r_size;     /* peer -> bytes of its phase-2 message */
  size_t* foff;      /* column index -> this rank's final frame of (column, its row) in res */
  size_t* flen;
  /* Each planned message's elements and bytes at most in this chunk ([step][0 send, 1
   * receive][index in the plan]; 0 elements: no message), computed once at setup. */
  size_t* melems[AGOQ_COLL_STEPS][2];
  size_t* mcap[AGOQ_COLL_STEPS][2];
  /* A message's region: its bytes when no block escapes raw. A larger one, up to mcap, goes
   * from (sends) or into (receives: agoq_net_irecv_spill) a buffer of its own. */
  size_t* mnom[AGOQ_COLL_STEPS][2];
  size_t mine_elems; /* elements of this rank's pieces (its columns, every row) */
  size_t acc_len;    /* bytes of acc: the pieces' partial sums, each followed by its trailer */
  size_t own_len;    /* quantized: this rank's own frames, packed at sbuf + s_off[me] */
  size_t pack_len;   /* the row all-gather message in pack (or pack_at: it outgrew pack) */
  uint8_t* pack_at;
  size_t isz;        /* bytes of one partial sum: fp32, or the type itself */
  int pend_rowr, pend_colr, pend_colg; /* receives still to come, by step */
  bool row_done, col_done, ag_done;    /* the stage's computation ran; its sends are being posted */
  bool lead_held;                      /* its row sends waited for the row lead (counted once) */
  agoq_coll_buf csum; /* fp32 column sums of this rank's final pieces */
  agoq_coll_buf pack; /* the row all-gather message when it is not in NCCL's buffer as is */
};

/* A quantized call's raw fp32 partial sums (the column reduce-scatter, AGOQ_COLLNET_PARTIALS=
 * fp32) travel with a trailer, as frames travel with their payload CRC: CRC32C of the sums
 * (little-endian), then 4 zero bytes. Without it a bit flipped on the wire (TCP's checksum
 * misses some) became a wrong sum on every rank of the column. In acc every piece is followed
 * by room for it, so the message goes as is. */
#define AGOQ_GRID_TRAILER 8u

static inline bool agoq_grid_partials_sealed(const agoq_coll_comm* g, const agoq_coll_req* r) {
  return r->quantized && !g->cfg.quant_partials;
}

/* ---- pieces -------------------------------------------------------------------------------- */

typedef struct {
  const agoq_coll_span* sp;
  int ns, i, r;
} agoq_piece_it;

static inline agoq_piece_it agoq_pieces(const agoq_coll_span* sp, int ns) { return (agoq_piece_it){.sp = sp, .ns = ns}; }

static inline bool agoq_piece_next(agoq_piece_it* it, const agoq_coll_grid* gr, int* idx) {
  while (it->i < it->ns) {
    const agoq_coll_span* s = &it->sp[it->i];
    if (it->r < s->rows) {
      *idx = agoq_coll_grid_piece(gr, s->col, s->row + it->r);
      it->r++;
      return true;
    }
    it->i++;
    it->r = 0;
  }
  return false;
}

/* The rank whose range a reduce-scatter chunk's piece idx holds (none, >= n, on a ragged
 * grid's missing places). */
static inline int agoq_grid_rs_rank(const agoq_coll_grid* gr, int idx) { return (idx % gr->b) * gr->a + idx / gr->b; }

static inline const agoq_coll_span* agoq_gspans(const agoq_coll_comm* g, const agoq_gmsg* m) {
  return g->plan->spans + m->span0;
}

/* ---- frames (agoq_coll_grid_state.c) --------------------------------------------------------- */

/* The next frame of a message at *off (a piece of m elements), checked and handed to step:
 * refused when a travelled frame has no payload CRC or the frame does not fit the message. */
typedef agoq_codec_status (*agoq_gframe_fn)(void* arg, const uint8_t* f, size_t len, size_t m);

ncclResult_t agoq_gframe_next(agoq_coll_comm* g, int from, const uint8_t* msg, size_t size, size_t* off,
                                     bool sealed, size_t m, agoq_gframe_fn fn, void* arg);

#endif
