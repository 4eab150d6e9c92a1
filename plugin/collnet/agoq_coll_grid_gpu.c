/*
 * A grid's quantized calls on the GPU (AGOQ_COLLNET_GPU with every buffer on the device:
 * all-reduces, and reduce-scatters from one input part): the grid's stages (agoq_coll_grid.c) run as on the host, but the work that grows
 * with the chunk runs on the device, one batch per stage, and only frames and the row sums
 * cross PCIe:
 *   frames    (POSTING) every piece of NCCL's input quantized in one batch: the row
 *             messages' frames straight into the pinned message regions, packed as the host
 *             packs them; this rank's own pieces' frames into device memory (never sent);
 *             the host seals the payload CRCs;
 *   row sums  (G_ROW) the row's frames checked on the host and summed in fp32 in rank order,
 *             one sum per piece of this rank's columns in one batch, then copied to the
 *             pinned accumulator the column messages are sent from;
 *   final     the column's fp32 sum, its quantization and the column messages stay on the
 *             CPU: 1/a of the chunk, and the partial sums arrive in and leave from host
 *             memory anyway (moving them to the device and back would cross PCIe twice for
 *             work the CPU does in place, with the host's bits by construction);
 *   decode    (WAIT_ALL) every final frame of the chunk (this rank's own, the column's, the
 *             row's), checked as it arrives, decoded into NCCL's buffer in one batch; a
 *             reduce-scatter's final pieces are rounded on the CPU (into the pinned region of
 *             the frames it does not make) and copied into NCCL's buffer.
 * The CUDA codec gives the CPU codec's bits and the sums add in the host's order, so the
 * results are the host path's, bit for bit, on every rank.
 * A frame's place in its message depends on the frames before it: the device writes each at
 * the place it has when no block escapes raw (the common case) with no room for more. A
 * message one of whose frames outgrew that (NaN, Inf) is coded again, its frames spaced at
 * their largest, and packed on the host.
 * Nothing waits for the device: each stage queues its batch and the slot's mark, and a
 * later pass polls it (as agoq_coll_gpu.c does on the mesh).
 */
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_grid_state.h"
#include "core/agoq_check.h"

static agoq_coll_gpu_slot* agoq_ggpu_slot(agoq_coll_comm* g, const agoq_coll_slot* s) {
  return &g->gslots[s - g->slots];
}

static void agoq_ggpu_max(size_t* have, size_t v) {
  if (v > *have) *have = v;
}

bool agoq_coll_grid_gpu_wanted(const agoq_coll_comm* g) {
  return g->cfg.gpu_reduce && g->cfg.format != AGOQ_FORMAT_NONE && agoq_coll_on_grid(g);
}

/* The largest piece of a chunk of a type of esz bytes: an all-reduce chunk's blocks cut into
 * a*b pieces (agoq_coll_slices), or (rs) a reduce-scatter chunk's piece of one rank's range. */
static size_t agoq_ggpu_piece_of(const agoq_coll_comm* g, size_t esz, bool rs) {
  size_t b = g->cfg.block, P = (size_t)agoq_coll_grid_pieces(&g->grid);
  if (rs) return agoq_coll_chunk_elems(g->cfg.chunk_bytes / (size_t)g->nranks, esz, g->cfg.block);
  size_t blocks = (agoq_coll_chunk_elems(g->cfg.chunk_bytes, esz, g->cfg.block) + b - 1) / b;
  return (blocks + P - 1) / P * b;
}

/* Pieces a step's messages (dir 0 sends, 1 receives) hold: every one they name (an
 * all-reduce), or only those of a rank (rs: a reduce-scatter's pieces are its ranks' ranges,
 * and a ragged grid's missing places have none). */
static size_t agoq_ggpu_pieces(const agoq_coll_comm* g, int st, int dir, bool rs) {
  const struct agoq_coll_gplan* p = g->plan;
  size_t k = 0;
  for (int i = 0; i < p->nmsg[st][dir]; i++) {
    const agoq_gmsg* m = &p->msg[st][dir][i];
    agoq_piece_it it = agoq_pieces(agoq_gspans(g, m), m->nspans);
    int idx;
    while (agoq_piece_next(&it, &g->grid, &idx)) k += !rs || agoq_grid_rs_rank(&g->grid, idx) < g->nranks;
  }
  return k;
}

/* This rank's pieces (its columns, every row); rs: those a reduce-scatter fills. */
static size_t agoq_ggpu_mine(const agoq_coll_comm* g, bool rs) {
  agoq_piece_it it = agoq_pieces(g->plan->mine, g->plan->ncols);
  size_t k = 0;
  int idx;
  while (agoq_piece_next(&it, &g->grid, &idx)) k += !rs || agoq_grid_rs_rank(&g->grid, idx) < g->nranks;
  return k;
}

/* Items of the largest batch: the chunk's pieces (frames, final decodes), or the row sums'
 * items (a row's contributions to each of this rank's pieces). */
static size_t agoq_ggpu_items(const agoq_coll_comm* g) {
  size_t P = (size_t)agoq_coll_grid_pieces(&g->grid), sums = agoq_ggpu_mine(g, false) * (size_t)g->plan->row_len;
  return P > sums ? P : sums;
}

void agoq_coll_grid_gpu_needs(const agoq_coll_comm* g, uint32_t* items, size_t* max_n) {
  *items = (uint32_t)agoq_ggpu_items(g);
  size_t ar = agoq_ggpu_piece_of(g, 2, false), rs = agoq_ggpu_piece_of(g, 2, true);
  *max_n = ar > rs ? ar : rs; /* 2-byte types have the most elements per chunk */
}

/* A slot's memory for the largest chunks of type t, cut as an all-reduce or (rs) as a
 * reduce-scatter, grown into pin, dev and *spill: every piece the messages hold at its
 * largest bounds every region the grid's layout gives (agoq_coll_grid_slot_setup), 16 bytes
 * of alignment per message on top. Pinned: the message regions, sized as the host sizes them
 * (frames whose blocks compress; the column's frames of partial sums at their largest, made
 * on the CPU), the row sums' host copy and this rank's final frames (res); device: the row
 * sums and this rank's own frames (dev[0], dev[1]; no sum frame: the column quantizes on the
 * CPU). The spill area: the largest batch that reads or writes frames at their largest, the
 * row messages coded again (sends), the row's frames summed, or the final frames decoded. */
static void agoq_ggpu_need_of(const agoq_coll_comm* g, agoq_dtype t, bool rs, agoq_coll_slot_bufs* pin,
                              size_t dev[3], size_t* spill) {
  const struct agoq_coll_gplan* p = g->plan;
  size_t pm = agoq_ggpu_piece_of(g, agoq_dtype_size(t), rs), mine = agoq_ggpu_mine(g, rs);
  agoq_codec_params pin_t = agoq_coll_params(g, t), p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  size_t fin = agoq_coll_align16(agoq_frame_size_nominal(&pin_t, pm));
  size_t fin_max = agoq_coll_align16(agoq_frame_size_max(&pin_t, pm));
  size_t f32 = agoq_coll_align16(agoq_frame_size_nominal(&p32, pm));
  size_t f32_max = agoq_coll_align16(agoq_frame_size_max(&p32, pm));
  size_t partial = g->cfg.quant_partials ? f32 : pm * sizeof(float) + AGOQ_GRID_TRAILER;
  /* Every piece of this rank's columns has its trailer's room in acc, empty ones included. */
  size_t sums = mine * pm * sizeof(float) + agoq_ggpu_mine(g, false) * AGOQ_GRID_TRAILER;
  size_t row_s = agoq_ggpu_pieces(g, AGOQ_COLL_ROW_RS, 0, rs), row_r = agoq_ggpu_pieces(g, AGOQ_COLL_ROW_RS, 1, rs);
  size_t ag_r = rs ? 0 : agoq_ggpu_pieces(g, AGOQ_COLL_COL_AG, 1, rs) + agoq_ggpu_pieces(g, AGOQ_COLL_ROW_AG, 1, rs);
  size_t pad_s = 16 * (size_t)(p->nmsg[AGOQ_COLL_ROW_RS][0] + p->nmsg[AGOQ_COLL_COL_RS][0]);
  size_t pad_r = 16 * (size_t)(p->nmsg[AGOQ_COLL_ROW_RS][1] + p->nmsg[AGOQ_COLL_COL_RS][1]);
  size_t pad_g = 16 * (size_t)(p->nmsg[AGOQ_COLL_COL_AG][1] + p->nmsg[AGOQ_COLL_ROW_AG][1]);
  agoq_ggpu_max(&pin->sbuf.cap, row_s * fin +
                                    (g->cfg.quant_partials ? agoq_ggpu_pieces(g, AGOQ_COLL_COL_RS, 0, rs) * f32_max : 0) +
                                    pad_s);
  agoq_ggpu_max(&pin->rbuf.cap, row_r * fin + agoq_ggpu_pieces(g, AGOQ_COLL_COL_RS, 1, rs) * partial + pad_r);
  agoq_ggpu_max(&pin->gbuf.cap, ag_r * f32 + pad_g);
  agoq_ggpu_max(&pin->acc.cap, sums);
  agoq_ggpu_max(&pin->res.cap, (size_t)p->ncols * f32_max);
  agoq_ggpu_max(&dev[0], sums);
  agoq_ggpu_max(&dev[1], mine * fin_max);
  agoq_ggpu_max(spill, row_s * fin_max + pad_s);
  agoq_ggpu_max(spill, row_r * fin_max + pad_r);
  agoq_ggpu_max(spill, ag_r * f32_max + pad_g);
}

static void agoq_ggpu_need(const agoq_coll_comm* g, agoq_coll_slot_bufs* pin, size_t dev[3], size_t* spill) {
  memset(pin, 0, sizeof *pin);
  dev[0] = dev[1] = dev[2] = 0;
  *spill = 0;
  static const agoq_dtype types[] = {AGOQ_DTYPE_FP32, AGOQ_DTYPE_BF16, AGOQ_DTYPE_FP16};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
    for (int rs = 0; rs < 2; rs++) agoq_ggpu_need_of(g, types[t], rs, pin, dev, spill);
}

ncclResult_t agoq_coll_grid_gpu_setup(agoq_coll_comm* g) {
  if (!agoq_coll_grid_gpu_wanted(g) || g->gslots != NULL) return ncclSuccess;
  ncclResult_t res = ncclSuccess;
  agoq_coll_gpu_slot* gs = agoq_coll_gpu_slots_alloc(agoq_ggpu_items(g), (size_t)g->nranks, true);
  if (gs == NULL) return ncclSystemError;
  agoq_coll_slot_bufs pin;
  size_t dev[3], spill = 0, pinned_bytes = 0, device_bytes = 0, max_n = 0;
  uint32_t items = 0;
  agoq_ggpu_need(g, &pin, dev, &spill);
  agoq_coll_grid_gpu_needs(g, &items, &max_n);
  AGOQ_CHECK_GOTO(agoq_coll_gpu_slots_carve(g, gs, &pin, dev, spill, &pinned_bytes, &device_bytes), res, out);
  AGOQ_INFO(NCCL_INIT | NCCL_NET,
            "CollNet rank %d: on a %dx%d grid quantized calls on device buffers run on GPU %d "
            "(AGOQ_COLLNET_GPU=1), one batch per stage: %zu bytes of pinned frames (%zu of them the spill area for "
            "frames whose blocks escape raw) and %zu bytes of device memory for %d chunks of pieces of up to %zu "
            "elements", g->rank, g->grid.a, g->grid.b, agoq_gpu_link_device(g->gpu), pinned_bytes, spill,
            device_bytes, AGOQ_COLL_SLOTS, max_n);
  g->gslots = gs;
  gs = NULL;
out:
  agoq_coll_gpu_slots_free(gs); /* the memory itself belongs to the link */
  return res;
}

ncclResult_t agoq_coll_grid_gpu_bufs(agoq_coll_comm* g, agoq_coll_slot* s, size_t sb, size_t rb, size_t gb,
                                     size_t acc, size_t res) {
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  if (sb > gg->pinned.sbuf.cap || rb > gg->pinned.rbuf.cap || gb > gg->pinned.gbuf.cap || acc > gg->pinned.acc.cap ||
      res > gg->pinned.res.cap || acc > gg->dacc.cap) {
    AGOQ_WARN("CollNet rank %d: a grid chunk needs more GPU path memory than was set aside (%zu/%zu/%zu/%zu/%zu "
              "bytes, have %zu/%zu/%zu/%zu/%zu): internal error", g->rank, sb, rb, gb, acc, res, gg->pinned.sbuf.cap,
              gg->pinned.rbuf.cap, gg->pinned.gbuf.cap, gg->pinned.acc.cap, gg->pinned.res.cap);
    return ncclInternalError;
  }
  s->sbuf = gg->pinned.sbuf;
  s->rbuf = gg->pinned.rbuf;
  s->gbuf = gg->pinned.gbuf;
  s->acc = gg->pinned.acc; /* the row sums' host copy */
  s->res = gg->pinned.res;
  gg->nframes = gg->nown = gg->nres = 0;
  gg->res_queued = false;
  return ncclSuccess;
}

/* ---- frames -------------------------------------------------------------------------------- */

/* The encode items of the row messages (every one, or with redo those marked for it) and,
 * on the first pass, of this rank's own pieces. A message's frames are placed in its region
 * as the host packs them when no block escapes raw, each with exactly that room (first
 * pass), or spaced at their largest in the spill area, one message after another (redo: the
 * area is this slot's, agoq_ggpu_encode_start). */
static ncclResult_t agoq_ggpu_frames_plan(agoq_coll_comm* g, agoq_coll_slot* s, bool redo) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  agoq_codec_params pin = agoq_coll_params(g, r->codec_dtype);
  int k = 0;
  gg->nframes = 0;
  for (int i = 0; i < p->nmsg[AGOQ_COLL_ROW_RS][0]; i++) {
    const agoq_gmsg* m = &p->msg[AGOQ_COLL_ROW_RS][0][i];
    if (gs->melems[AGOQ_COLL_ROW_RS][0][i] == 0 || (redo && !gg->redo[m->peer])) continue;
    uint8_t* base = s->sbuf.p + s->s_off[m->peer];
    if (redo) {
      ncclResult_t res;
      base = agoq_coll_gpu_spill_room(g, s, gs->mcap[AGOQ_COLL_ROW_RS][0][i], &res);
      if (base == NULL) return res;
    }
    agoq_piece_it it = agoq_pieces(agoq_gspans(g, m), m->nspans);
    size_t end = 0;
    int idx;
    while (agoq_piece_next(&it, &g->grid, &idx)) {
      size_t n = gs->pl[idx];
      if (n == 0) continue;
      size_t off = agoq_coll_align16(end), cap = redo ? agoq_frame_size_max(&pin, n) : agoq_frame_size_nominal(&pin, n);
      end = off + cap;
      gg->frames[gg->nframes++] = (struct agoq_coll_gpu_frame){.peer = m->peer, .off = off, .cap = cap, .base = base};
      gg->enc[k++] = (agoq_gpu_encode_item){
          .src = agoq_coll_src_at(r, gs->pb[idx]), .n = n, .frame = base + off, .cap = cap};
    }
  }
  if (redo) return ncclSuccess;
  gg->nown = 0;
  agoq_piece_it it = agoq_pieces(p->mine, p->ncols);
  size_t end = 0;
  int idx;
  while (agoq_piece_next(&it, &g->grid, &idx)) {
    size_t n = gs->pl[idx];
    if (n == 0) continue;
    size_t cap = agoq_frame_size_max(&pin, n);
    gg->own[gg->nown++] = (struct agoq_coll_gpu_frame){.peer = g->rank, .off = end, .cap = cap};
    gg->enc[k++] = (agoq_gpu_encode_item){.src = agoq_coll_src_at(r, gs->pb[idx]), .n = n, .frame = gg->down.p + end,
                                          .cap = cap};
    end += agoq_coll_align16(cap);
  }
  return ncclSuccess;
}

static ncclResult_t agoq_ggpu_encode_queue(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  size_t k = *(const size_t*)arg;
  agoq_codec_params pin = agoq_coll_params(g, s->req->codec_dtype);
  return agoq_gpu_frame_encode_batch(g->gpu, agoq_coll_gpu_link_slot(g, s), 0, &pin, agoq_ggpu_slot(g, s)->enc, k);
}

/* Queues the slot's encode batch (items planned) and its mark; *queued false, with nothing
 * done, when a redo finds the spill area held by another slot. */
static ncclResult_t agoq_ggpu_encode_start(agoq_coll_comm* g, agoq_coll_slot* s, bool redo, bool* queued) {
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  *queued = !redo || agoq_coll_gpu_spill_ready(g, s);
  if (!*queued) return ncclSuccess;
  AGOQ_CHECK(agoq_ggpu_frames_plan(g, s, redo));
  size_t k = (size_t)gg->nframes + (redo ? 0 : (size_t)gg->nown);
  if (k == 0) return ncclSuccess;
  return agoq_coll_gpu_queue(g, s, true, agoq_ggpu_encode_queue, &k);
}

/* Frame i's verdict: its length, or (a row frame that did not fit) its message marked to be
 * coded again. */
static ncclResult_t agoq_ggpu_frame_done(agoq_coll_comm* g, agoq_coll_slot* s, int part,
                                         struct agoq_coll_gpu_frame* f, bool may_redo) {
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  uint64_t body_len = 0;
  uint32_t status = agoq_coll_gpu_status(g, s, part, &body_len);
  f->len = AGOQ_FRAME_HEADER_SIZE + (size_t)body_len;
  if (may_redo && (status == AGOQ_CODEC_ESPACE || (status == AGOQ_CODEC_OK && f->len != f->cap))) {
    gg->redo[f->peer] = 1;
    return ncclSuccess;
  }
  if (status == AGOQ_CODEC_OK) return ncclSuccess;
  AGOQ_WARN("CollNet rank %d: the GPU could not quantize a piece of the call for rank %d: %s", g->rank, f->peer,
            agoq_codec_status_str((agoq_codec_status)status));
  return ncclInternalError;
}

/* Seals the frames [i, j) of peer's message, packed as the host packs them: in its region
 * (where the device placed them), or (coded again, spaced at their largest in the spill area)
 * copied into a buffer of its own, as the host path sends a message that outgrew its region;
 * its length and place for the send. */
static ncclResult_t agoq_ggpu_seal_msg(agoq_coll_comm* g, agoq_coll_slot* s, int i, int j, uint64_t* d2h) {
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  int peer = gg->frames[i].peer;
  uint8_t* region = s->sbuf.p + s->s_off[peer];
  size_t end = 0;
  if (gg->frames[i].base != region) {
    for (int f = i; f < j; f++) end = agoq_coll_align16(end) + gg->frames[f].len;
    region = agoq_coll_spill_alloc(g, s, end);
    if (region == NULL) return ncclSystemError;
    end = 0;
  }
  for (int f = i; f < j; f++) {
    size_t off = agoq_coll_align16(end), len = gg->frames[f].len;
    if (region + off != gg->frames[f].base + gg->frames[f].off)
      memmove(region + off, gg->frames[f].base + gg->frames[f].off, len);
    agoq_codec_status st = agoq_frame_seal_payload_crc(region + off, len);
    if (st != AGOQ_CODEC_OK) {
      AGOQ_WARN("CollNet rank %d: the GPU's frame for rank %d could not be sealed: %s", g->rank, peer,
                agoq_codec_status_str(st));
      return ncclInternalError;
    }
    *d2h += len;
    end = off + len;
  }
  s->s_len[peer] = end;
  s->s_at[peer] = region;
  return ncclSuccess;
}

/* The frames of the batch that completed: each message whose frames all fit is sealed, the
 * others are marked for the redo (first pass); *redo says whether any is. */
static ncclResult_t agoq_ggpu_frames_done(agoq_coll_comm* g, agoq_coll_slot* s, bool first, bool* redo) {
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns(), d2h = 0;
  *redo = false;
  if (first)
    for (int f = 0; f < gg->nframes; f++) gg->redo[gg->frames[f].peer] = 0;
  for (int f = 0; f < gg->nframes; f++) AGOQ_CHECK(agoq_ggpu_frame_done(g, s, f, &gg->frames[f], first));
  if (first)
    for (int o = 0; o < gg->nown; o++) AGOQ_CHECK(agoq_ggpu_frame_done(g, s, gg->nframes + o, &gg->own[o], false));
  for (int i = 0, j; i < gg->nframes; i = j) {
    int peer = gg->frames[i].peer;
    for (j = i; j < gg->nframes && gg->frames[j].peer == peer; j++) {}
    if (first && gg->redo[peer]) {
      *redo = true;
      continue;
    }
    AGOQ_CHECK(agoq_ggpu_seal_msg(g, s, i, j, &d2h));
  }
  agoq_coll_gpu_sealed(g, s->req, d2h, t0, crc0);
  return ncclSuccess;
}

ncclResult_t agoq_coll_grid_gpu_encode(agoq_coll_comm* g, agoq_coll_slot* s, bool* ready) {
  return agoq_coll_gpu_encode_steps(g, s, agoq_ggpu_encode_start, agoq_ggpu_frames_done, ready);
}

/* ---- row sums ------------------------------------------------------------------------------ */

/* A travelled frame checked on the host as the CPU decoder checks it (header, payload CRC,
 * lengths), its count and parameters against the piece's and the group's: *item's body. */
typedef struct {
  agoq_codec_params want;
  agoq_gpu_decode_item* item;
} agoq_ggpu_parse_arg;

static agoq_codec_status agoq_ggpu_parse(void* arg, const uint8_t* f, size_t len, size_t m) {
  const agoq_ggpu_parse_arg* a = arg;
  agoq_frame_info info;
  const void* body = NULL;
  agoq_codec_status st = agoq_coll_gpu_frame_check(f, len, m, &a->want, &info, &body);
  if (st != AGOQ_CODEC_OK) return st;
  a->item->body = body;
  a->item->body_len = (size_t)info.payload_len;
  a->item->n = m;
  return AGOQ_CODEC_OK;
}

static ncclResult_t agoq_ggpu_sums_queue(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  const size_t* kn = arg; /* items per sum, sums */
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  agoq_codec_params pin = agoq_coll_params(g, s->req->codec_dtype);
  AGOQ_CHECK(agoq_gpu_dequantize_sums(g->gpu, agoq_coll_gpu_link_slot(g, s), 0, &pin, gg->sum, kn[0], gg->groups,
                                      kn[1]));
  /* The column messages go from host memory. */
  return agoq_gpu_copy_d2h(g->gpu, s->acc.p, gg->dacc.p, s->gs->acc_len);
}

/* The row's contributions to each of this rank's pieces, item (piece i, row member k) at
 * i * k_all + k: this rank's own frames in device memory, the others' checked in their
 * messages. *k_all: the row's members that contribute. */
static ncclResult_t agoq_ggpu_sums_plan(agoq_coll_comm* g, agoq_coll_slot* s, size_t* k_all, uint64_t* h2d) {
  agoq_coll_req* r = s->req;
  struct agoq_coll_gslot* gs = s->gs;
  const struct agoq_coll_gplan* p = g->plan;
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  int me = g->rank;
  size_t k = 0;
  for (int q = p->row_first; q < p->row_first + p->row_len; q++)
    if (q == me || p->msg_of[AGOQ_COLL_ROW_RS][1][q] >= 0) k++;
  *k_all = k;
  size_t kq = 0;
  for (int q = p->row_first; q < p->row_first + p->row_len; q++) {
    bool own = q == me;
    if (!own && p->msg_of[AGOQ_COLL_ROW_RS][1][q] < 0) continue;
    const uint8_t* msg = s->p1r_at[q];
    size_t size = own ? 0 : (size_t)s->p1r_size[q], off = 0, end = 0;
    agoq_piece_it it = agoq_pieces(p->mine, p->ncols);
    int idx, i = 0;
    while (agoq_piece_next(&it, &g->grid, &idx)) {
      size_t m = gs->pl[idx];
      if (m == 0) continue;
      agoq_gpu_decode_item* item = &gg->sum[(size_t)i * k + kq];
      if (own) {
        const struct agoq_coll_gpu_frame* f = &gg->own[i];
        *item = (agoq_gpu_decode_item){.body = gg->down.p + f->off + AGOQ_FRAME_HEADER_SIZE,
                                       .body_len = f->len - AGOQ_FRAME_HEADER_SIZE, .n = m};
        gg->groups[i] = (agoq_gpu_sum_group){.n = m, .acc = (float*)gg->dacc.p + gs->aoff[idx]};
      } else {
        off = agoq_coll_align16(end);
        agoq_ggpu_parse_arg a = {.want = agoq_coll_params(g, r->codec_dtype), .item = item};
        AGOQ_CHECK(agoq_gframe_next(g, q, msg, size, &off, true, m, agoq_ggpu_parse, &a));
        end = off;
        *h2d += item->body_len;
      }
      i++;
    }
    if (!own && end != size) {
      AGOQ_WARN("CollNet rank %d: a %zu-byte row message from rank %d holds %zu bytes of frames (ranks disagree on "
                "the call?)", g->rank, size, q, end);
      return ncclInvalidUsage;
    }
    kq++;
  }
  return ncclSuccess;
}

ncclResult_t agoq_coll_grid_gpu_row(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  agoq_coll_req* r = s->req;
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  *done = s->gpu_step == AGOQ_GPU_STEP_REDUCED || s->gs->mine_elems == 0;
  if (*done) return ncclSuccess;
  if (s->gpu_step == AGOQ_GPU_STEP_ENCODED) {
    /* A row message that spilled waits for the spill area before anything is done. */
    const struct agoq_coll_gplan* p = g->plan;
    for (int q = p->row_first; q < p->row_first + p->row_len; q++)
      if (q != g->rank && p->msg_of[AGOQ_COLL_ROW_RS][1][q] >= 0 &&
          agoq_coll_gpu_spill_blocked(g, s, s->p1r_at[q], (size_t)s->p1r_size[q]))
        return ncclSuccess;
    int64_t t0 = agoq_coll_now_ns();
    uint64_t crc0 = agoq_frame_crc_ns(), h2d = 0;
    size_t kn[2] = {0, (size_t)gg->nown};
    bool staged = false;
    ncclResult_t res = agoq_ggpu_sums_plan(g, s, &kn[0], &h2d);
    if (res == ncclSuccess) res = agoq_coll_gpu_spill_stage(g, s, gg->sum, kn[0] * kn[1], &staged);
    if (res == ncclSuccess && !staged) res = ncclInternalError; /* it was free or this slot's */
    agoq_coll_gpu_cpu_time(g, r, t0, crc0);
    AGOQ_CHECK(res);
    AGOQ_CHECK(agoq_coll_gpu_queue(g, s, true, agoq_ggpu_sums_queue, kn));
    agoq_stats_add(&agoq_coll_req_stats(g, r)->pcie_h2d, h2d);
    agoq_stats_add(&agoq_coll_req_stats(g, r)->pcie_d2h, s->gs->acc_len);
    gg->nsum = (int)(kn[0] * kn[1]);
    s->gpu_step = AGOQ_GPU_STEP_SUMMING;
    return ncclSuccess;
  }
  bool ready = false;
  AGOQ_CHECK(agoq_coll_gpu_poll(g, s, &ready));
  if (!ready) return ncclSuccess;
  AGOQ_CHECK(agoq_coll_gpu_check_parts(g, s, 0, gg->nsum, "summing a row's contribution"));
  s->gpu_step = AGOQ_GPU_STEP_REDUCED;
  *done = true;
  return ncclSuccess;
}

/* ---- the final pieces --------------------------------------------------------------------- */

ncclResult_t agoq_coll_grid_gpu_narrow(agoq_coll_comm* g, agoq_coll_slot* s, const float* sum, size_t m,
                                       uint8_t* pinned, void* dst) {
  agoq_coll_req* r = s->req;
  agoq_codec_narrow_fp32(r->codec_dtype, sum, m, pinned);
  pthread_mutex_lock(&g->gpu_mu);
  ncclResult_t res = agoq_gpu_copy_h2d(g->gpu, dst, pinned, m * r->esz);
  pthread_mutex_unlock(&g->gpu_mu);
  if (res == ncclSuccess) agoq_stats_add(&agoq_coll_req_stats(g, r)->pcie_h2d, m * r->esz);
  return res;
}

agoq_codec_status agoq_coll_grid_gpu_final(agoq_coll_comm* g, agoq_coll_slot* s, const uint8_t* f, size_t len,
                                           size_t m, void* dst, bool travelled) {
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  if (gg->nres >= gg->cap_items || gg->res_queued) {
    AGOQ_WARN("CollNet rank %d: a final frame after the chunk's %d: internal error", g->rank, gg->nres);
    return AGOQ_CODEC_EARG;
  }
  agoq_gpu_decode_item* item = &gg->res[gg->nres];
  if (travelled) {
    int64_t t0 = agoq_coll_now_ns();
    uint64_t crc0 = agoq_frame_crc_ns();
    agoq_ggpu_parse_arg a = {.want = agoq_coll_params(g, AGOQ_DTYPE_FP32), .item = item};
    agoq_codec_status st = agoq_ggpu_parse(&a, f, len, m);
    agoq_coll_gpu_cpu_time(g, s->req, t0, crc0);
    if (st != AGOQ_CODEC_OK) return st;
  } else {
    *item = (agoq_gpu_decode_item){.body = f + AGOQ_FRAME_HEADER_SIZE, .body_len = len - AGOQ_FRAME_HEADER_SIZE, .n = m};
  }
  item->dst = dst;
  gg->nres++;
  agoq_stats_add(&agoq_coll_req_stats(g, s->req)->pcie_h2d, item->body_len);
  return AGOQ_CODEC_OK;
}

static ncclResult_t agoq_ggpu_decode_queue(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  (void)arg;
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  if (gg->nres == 0) return ncclSuccess; /* a reduce-scatter's copies: the mark behind them */
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  return agoq_gpu_dequantize_batch(g->gpu, agoq_coll_gpu_link_slot(g, s), 0, &p32, gg->res, (size_t)gg->nres,
                                   s->req->codec_dtype);
}

ncclResult_t agoq_coll_grid_gpu_retire(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  agoq_coll_gpu_slot* gg = agoq_ggpu_slot(g, s);
  /* Every receive is in, and the slot's earlier batches were seen done. The mark goes behind
   * a reduce-scatter's copies too. */
  if (!gg->res_queued) {
    bool staged = false;
    AGOQ_CHECK(agoq_coll_gpu_spill_stage(g, s, gg->res, (size_t)gg->nres, &staged));
    if (!staged) {
      *done = false;
      return ncclSuccess;
    }
    AGOQ_CHECK(agoq_coll_gpu_queue(g, s, true, agoq_ggpu_decode_queue, NULL));
    gg->res_queued = true;
  }
  AGOQ_CHECK(agoq_coll_gpu_poll(g, s, done));
  if (!*done || gg->nres == 0) return ncclSuccess;
  return agoq_coll_gpu_check_parts(g, s, 0, gg->nres, "decoding a final frame");
}
