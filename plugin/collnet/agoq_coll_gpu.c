/* The quantized CollNet path on the GPU (AGOQ_COLLNET_GPU), on the one-level mesh (a grid's is
 * agoq_coll_grid_gpu.c, with this file's plumbing): a quantized call whose buffers are all in
 * device memory runs the three codec steps of a chunk with the CUDA codec, which
 * gives the CPU codec's bits, in the CPU path's order of fp32 additions, so its results are
 * the host path's bit for bit:
 *   encode  every slice of NCCL's buffer is quantized straight into the slot's pinned frames
 *           (this rank's own slice into device memory: it never leaves the GPU); the host
 *           seals the payload CRC of the frames for peers, which are then sent;
 *   reduce  the host checks each contribution (header, payload CRC, lengths, scales:
 *           agoq_frame_parse) in the pinned receive buffer; the GPU decodes rank 0's into
 *           the fp32 sum in device memory and adds the others' in rank order; allreduce:
 *           overflows become Inf, the sum is quantized once in fp32 parameters into device
 *           memory, copied to pinned memory (the result message) and decoded into NCCL's
 *           buffer; reducescatter: the sum is rounded into NCCL's buffer;
 *   decode  each owner's result frame is checked on the host and decoded by the GPU from
 *           the pinned receive buffer into NCCL's buffer.
 * Each of the three is one batch (agoq_gpu_*_batch: one launch of each kernel for every slice,
 * contribution or result frame of the chunk, not one call per peer); the result frames are
 * checked as they arrive and decoded together once all are in.
 * Only frames cross PCIe; the CPU checks and seals CRCs. Nothing waits for the device: each
 * step queues its work on the group's link, records the pipeline slot's event and returns;
 * a later pass (the engine's, or test()'s assisting) polls the event and goes on. A chunk
 * retires once its slot's event says every decode into NCCL's buffer has completed, so the
 * request is done with its result in place. All link calls run under gpu_mu (agoq_coll_device.c),
 * and everything here under step_mu, like the rest of a pass. */
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_coll_step.h"
#include "core/agoq_check.h"

/* Pipeline slot i uses the link's event and results after the requests' (agoq_coll_device.c
 * gives request k slot k). */
uint32_t agoq_coll_gpu_link_slot(const agoq_coll_comm* g, const agoq_coll_slot* s) {
  return AGOQ_COLL_MAX_REQUESTS + (uint32_t)(s - g->slots);
}

/* A slot's codec results: [0, n) the slices' encodes, then the contributions' decodes; n the
 * sum's encode; n + 1 its decode into place; n + 2 + j rank j's result frame's decode. */
static int agoq_part_sum(const agoq_coll_comm* g) { return g->nranks; }
static int agoq_part_share(const agoq_coll_comm* g) { return g->nranks + 1; }
static int agoq_part_gather(const agoq_coll_comm* g, int j) { return g->nranks + 2 + j; }

uint32_t agoq_coll_gpu_parts(const agoq_coll_comm* g) { return 2u * (uint32_t)g->nranks + 2u; }

static size_t agoq_align256(size_t v) { return (v + 255) & ~(size_t)255; }

/* The largest slice of any chunk of a type of esz bytes, in elements: an allreduce chunk's
 * slices are at most ceil(blocks / n) blocks, a reducescatter chunk takes at most one piece
 * per rank. */
static size_t agoq_gpu_slice_max(const agoq_coll_comm* g, size_t esz) {
  size_t n = (size_t)g->nranks, b = g->cfg.block;
  size_t ar = agoq_coll_chunk_elems(g->cfg.chunk_bytes, esz, g->cfg.block);
  size_t ar_slice = ((ar + b - 1) / b + n - 1) / n * b;
  size_t rs = agoq_coll_chunk_elems(g->cfg.chunk_bytes / n, esz, g->cfg.block);
  return ar_slice > rs ? ar_slice : rs;
}

static void agoq_gpu_max(size_t* have, size_t v) {
  if (v > *have) *have = v;
}

bool agoq_coll_gpu_wanted(const agoq_coll_comm* g) {
  return g->cfg.gpu_reduce && g->cfg.format != AGOQ_FORMAT_NONE && !agoq_coll_on_grid(g);
}

size_t agoq_coll_gpu_slice_elems(const agoq_coll_comm* g) {
  size_t m = 0;
  agoq_gpu_max(&m, agoq_gpu_slice_max(g, agoq_dtype_size(AGOQ_DTYPE_FP32)));
  agoq_gpu_max(&m, agoq_gpu_slice_max(g, agoq_dtype_size(AGOQ_DTYPE_BF16)));
  return m;
}

void agoq_coll_gpu_slots_free(agoq_coll_gpu_slot* gs) {
  if (gs == NULL) return;
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) {
    free(gs[i].enc);
    free(gs[i].sum);
    free(gs[i].res);
    free(gs[i].frames);
    free(gs[i].own);
    free(gs[i].groups);
    free(gs[i].redo);
  }
  free(gs);
}

void agoq_coll_gpu_release(agoq_coll_comm* g) {
  agoq_coll_gpu_slots_free(g->gslots);
  g->gslots = NULL;
}

agoq_coll_gpu_slot* agoq_coll_gpu_slots_alloc(size_t items, size_t peers, bool grid) {
  agoq_coll_gpu_slot* gs = calloc(AGOQ_COLL_SLOTS, sizeof *gs);
  bool ok = gs != NULL;
  for (int i = 0; ok && i < AGOQ_COLL_SLOTS; i++) {
    agoq_coll_gpu_slot* x = &gs[i];
    x->cap_items = (int)items;
    x->enc = calloc(items, sizeof *x->enc);
    x->sum = calloc(items, sizeof *x->sum);
    x->res = calloc(items, sizeof *x->res);
    x->redo = calloc(peers, sizeof *x->redo);
    ok = x->enc != NULL && x->sum != NULL && x->res != NULL && x->redo != NULL;
    if (!ok || !grid) continue;
    x->frames = calloc(items, sizeof *x->frames);
    x->own = calloc(items, sizeof *x->own);
    x->groups = calloc(items, sizeof *x->groups);
    ok = x->frames != NULL && x->own != NULL && x->groups != NULL;
  }
  if (ok) return gs;
  AGOQ_WARN("out of memory setting up CollNet's GPU path");
  agoq_coll_gpu_slots_free(gs);
  return NULL;
}

ncclResult_t agoq_coll_gpu_slots_carve(agoq_coll_comm* g, agoq_coll_gpu_slot* gs, const agoq_coll_slot_bufs* pin,
                                       const size_t dev[3], size_t spill, size_t* pinned_bytes, size_t* device_bytes) {
  size_t pc[] = {pin->sbuf.cap, pin->rbuf.cap, pin->gbuf.cap, pin->acc.cap, pin->res.cap};
  size_t pinned_slot = 0, device_slot = 0;
  for (int k = 0; k < 5; k++) pinned_slot += agoq_align256(pc[k]);
  for (int k = 0; k < 3; k++) device_slot += agoq_align256(dev[k]);
  uint8_t *pinned = NULL, *device = NULL;
  AGOQ_CHECK(agoq_gpu_link_alloc(g->gpu, false, pinned_slot * AGOQ_COLL_SLOTS, (void**)&pinned));
  AGOQ_CHECK(agoq_gpu_link_alloc(g->gpu, true, device_slot * AGOQ_COLL_SLOTS, (void**)&device));
  /* The network sends the pinned frames and receives into them. */
  AGOQ_CHECK(agoq_net_reg_host(g->dev, pinned, pinned_slot * AGOQ_COLL_SLOTS, &g->gpu_keys[1]));
  for (int i = 0; i < AGOQ_COLL_SLOTS; i++) {
    uint8_t* p = pinned + (size_t)i * pinned_slot;
    uint8_t* d = device + (size_t)i * device_slot;
    agoq_coll_buf* pb[] = {&gs[i].pinned.sbuf, &gs[i].pinned.rbuf, &gs[i].pinned.gbuf, &gs[i].pinned.acc,
                           &gs[i].pinned.res};
    agoq_coll_buf* db[] = {&gs[i].dacc, &gs[i].down, &gs[i].dres};
    for (int k = 0; k < 5; k++) {
      *pb[k] = (agoq_coll_buf){.p = p, .cap = pc[k]};
      p += agoq_align256(pc[k]);
    }
    for (int k = 0; k < 3; k++) {
      *db[k] = (agoq_coll_buf){.p = d, .cap = dev[k]};
      d += agoq_align256(dev[k]);
    }
  }
  g->gpin = (agoq_coll_buf){.p = pinned, .cap = pinned_slot * AGOQ_COLL_SLOTS};
  g->gdev = (agoq_coll_buf){.p = device, .cap = device_slot * AGOQ_COLL_SLOTS};
  /* Only the device and the host's copies touch the spill area: not registered. */
  uint8_t* sp = NULL;
  if (spill > 0) AGOQ_CHECK(agoq_gpu_link_alloc(g->gpu, false, spill, (void**)&sp));
  g->gspill = (agoq_coll_buf){.p = sp, .cap = spill};
  g->gspill_holder = 0;
  *pinned_bytes = pinned_slot * AGOQ_COLL_SLOTS + spill;
  *device_bytes = device_slot * AGOQ_COLL_SLOTS;
  return ncclSuccess;
}

/* ---- the spill area -------------------------------------------------------------------- */

static bool agoq_gpu_in(const agoq_coll_buf* b, const void* p, size_t len) {
  uintptr_t lo = (uintptr_t)b->p, a = (uintptr_t)p;
  return b->p != NULL && a >= lo && a - lo <= b->cap && len <= b->cap - (a - lo);
}

bool agoq_coll_gpu_reachable(const agoq_coll_comm* g, const void* p, size_t len) {
  return agoq_gpu_in(&g->gpin, p, len) || agoq_gpu_in(&g->gdev, p, len) || agoq_gpu_in(&g->gspill, p, len);
}

static int agoq_gpu_spill_who(const agoq_coll_comm* g, const agoq_coll_slot* s) { return (int)(s - g->slots) + 1; }

bool agoq_coll_gpu_spill_ready(agoq_coll_comm* g, const agoq_coll_slot* s) {
  bool ready = g->gspill_holder == 0 || g->gspill_holder == agoq_gpu_spill_who(g, s);
  if (!ready) g->gspill_waits++;
  return ready;
}

bool agoq_coll_gpu_spill_blocked(agoq_coll_comm* g, const agoq_coll_slot* s, const void* p, size_t len) {
  return !agoq_coll_gpu_reachable(g, p, len) && !agoq_coll_gpu_spill_ready(g, s);
}

uint8_t* agoq_coll_gpu_spill_room(agoq_coll_comm* g, agoq_coll_slot* s, size_t bytes, ncclResult_t* res) {
  *res = ncclSuccess;
  if (g->gspill_holder != agoq_gpu_spill_who(g, s)) {
    g->gspill_holder = agoq_gpu_spill_who(g, s);
    g->gspill_used = 0;
    g->gspill_batches++;
  }
  size_t off = agoq_coll_align16(g->gspill_used);
  if (off > g->gspill.cap || bytes > g->gspill.cap - off) {
    AGOQ_WARN("CollNet rank %d: frames that outgrew their regions need %zu bytes of the GPU path's %zu-byte spill "
              "area, %zu of it in use: internal error", g->rank, bytes, g->gspill.cap, off);
    *res = ncclInternalError;
    return NULL;
  }
  g->gspill_used = off + bytes;
  return g->gspill.p + off;
}

ncclResult_t agoq_coll_gpu_spill_stage(agoq_coll_comm* g, agoq_coll_slot* s, agoq_gpu_decode_item* items, size_t k,
                                       bool* ready) {
  *ready = true;
  for (size_t i = 0; i < k; i++) {
    if (agoq_coll_gpu_reachable(g, items[i].body, items[i].body_len)) continue;
    /* The first that spilled: nothing was copied before it. */
    if (!agoq_coll_gpu_spill_ready(g, s)) {
      *ready = false;
      return ncclSuccess;
    }
    ncclResult_t res;
    uint8_t* at = agoq_coll_gpu_spill_room(g, s, items[i].body_len, &res);
    if (at == NULL) return res;
    memcpy(at, items[i].body, items[i].body_len);
    items[i].body = at;
  }
  return ncclSuccess;
}

ncclResult_t agoq_coll_gpu_setup(agoq_coll_comm* g) {
  if (!g->cfg.gpu_reduce || g->cfg.format == AGOQ_FORMAT_NONE || g->gslots != NULL) return ncclSuccess;
  ncclResult_t res = ncclSuccess;
  int n = g->nranks;
  size_t* sl = calloc((size_t)n, sizeof *sl);
  agoq_coll_gpu_slot* gs = agoq_coll_gpu_slots_alloc((size_t)n, (size_t)n, false);
  if (sl == NULL || gs == NULL) {
    if (sl == NULL) AGOQ_WARN("out of memory setting up CollNet's GPU path");
    res = ncclSystemError;
    goto out;
  }
  /* For each float type, every slice at its largest: no chunk needs more (sizes grow with
   * the slices). The frame regions are the host path's, sized for frames whose blocks
   * compress; the spill area holds one batch's frames at their largest: the sends coded
   * again, the contributions or the result frames (whichever is most). */
  agoq_coll_slot_bufs cap;
  memset(&cap, 0, sizeof cap);
  size_t own = 0, sum_frame = 0, mmax = 0, spill = 0;
  static const agoq_dtype types[] = {AGOQ_DTYPE_FP32, AGOQ_DTYPE_BF16, AGOQ_DTYPE_FP16};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    size_t m = agoq_gpu_slice_max(g, agoq_dtype_size(types[t]));
    for (int j = 0; j < n; j++) sl[j] = m;
    agoq_coll_slot_bufs need, most;
    size_t stride;
    agoq_coll_quant_sizes(g, types[t], true, true, sl, NULL, NULL, &stride, &need);
    agoq_coll_quant_sizes(g, types[t], true, false, sl, NULL, NULL, &stride, &most);
    agoq_codec_params pin = agoq_coll_params(g, types[t]);
    agoq_gpu_max(&mmax, m);
    agoq_gpu_max(&own, agoq_frame_size_max(&pin, m));
    agoq_gpu_max(&sum_frame, agoq_coll_quant_result_cap(g, m));
    agoq_gpu_max(&cap.sbuf.cap, need.sbuf.cap);
    agoq_gpu_max(&cap.rbuf.cap, need.rbuf.cap);
    agoq_gpu_max(&cap.gbuf.cap, need.gbuf.cap);
    agoq_gpu_max(&cap.res.cap, most.res.cap); /* made on the device at its largest */
    agoq_gpu_max(&spill, most.sbuf.cap);
    agoq_gpu_max(&spill, most.rbuf.cap);
    agoq_gpu_max(&spill, most.gbuf.cap);
  }
  /* The sum stays in device memory: no pinned accumulator. */
  const size_t dev[3] = {mmax * sizeof(float), own, sum_frame};
  size_t pinned_bytes = 0, device_bytes = 0;
  AGOQ_CHECK_GOTO(agoq_coll_gpu_slots_carve(g, gs, &cap, dev, spill, &pinned_bytes, &device_bytes), res, out);
  /* Every codec kernel (the escaped-block decodes that a NaN or an overflow to Inf brings
   * included) was loaded in the link's CUDA context when it was made (agoq_gpu_link_create),
   * not at a first launch under NCCL's kernel. */
  AGOQ_INFO(NCCL_INIT | NCCL_NET,
            "CollNet rank %d: quantized calls on device buffers reduced on GPU %d (AGOQ_COLLNET_GPU=1): %zu bytes of "
            "pinned frames (%zu of them the spill area for frames whose blocks escape raw) and %zu bytes of device "
            "memory for %d chunks of up to %zu elements per slice",
            g->rank, agoq_gpu_link_device(g->gpu), pinned_bytes, spill, device_bytes, AGOQ_COLL_SLOTS, mmax);
  g->gslots = gs;
  gs = NULL;
out:
  /* The memory itself belongs to the link: freed with it. */
  agoq_coll_gpu_slots_free(gs);
  free(sl);
  return res;
}

/* dst in device memory, aligned to its element size (NCCL's buffers are). */
static bool agoq_gpu_aligned(const void* p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

bool agoq_coll_gpu_takes(agoq_coll_comm* g, agoq_coll_req* r, bool in_dev, bool out_dev) {
  if (!r->quantized || g->gslots == NULL || !in_dev || !out_dev || r->kind == AGOQ_COLL_ALLGATHER) return false;
  if (r->kind == AGOQ_COLL_REDUCESCATTER && (r->nparts != 1 || r->dev_parts != 1u)) return false;
  if (!agoq_gpu_aligned(r->src, r->esz) || !agoq_gpu_aligned(r->dst, r->esz)) return false;
  r->gpu = true;
  agoq_stats_device(g->st, AGOQ_STATS_QUANT, 0, 0); /* its PCIe bytes are counted as they move */
  return true;
}

ncclResult_t agoq_coll_gpu_reserve(agoq_coll_comm* g, agoq_coll_slot* s) {
  agoq_coll_req* r = s->req;
  agoq_coll_slot_bufs need_bufs;
  const agoq_coll_slot_bufs* need = &need_bufs;
  /* The host path's frame layout (agoq_coll_quant_reserve's), in the pinned frames: sized for
   * frames whose blocks compress, a larger received one spills (agoq_coll_gpu_spill_stage). */
  agoq_coll_quant_sizes(g, r->codec_dtype, agoq_coll_has_p2(r), true, s->sl, s->s_off, s->g_off, &s->r_stride,
                        &need_bufs);
  agoq_codec_params pin = agoq_coll_params(g, r->codec_dtype);
  size_t m = s->sl[g->rank];
  s->r_max = m > 0 ? agoq_frame_size_max(&pin, m) : 0;
  s->nominal = true;
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  if (need->sbuf.cap > gs->pinned.sbuf.cap || need->rbuf.cap > gs->pinned.rbuf.cap ||
      need->gbuf.cap > gs->pinned.gbuf.cap || need->res.cap > gs->pinned.res.cap || need->acc.cap > gs->dacc.cap) {
    AGOQ_WARN("CollNet rank %d: a chunk needs more GPU path memory than was set aside (frames %zu/%zu/%zu/%zu "
              "bytes, sum %zu bytes): internal error", g->rank, need->sbuf.cap, need->rbuf.cap, need->gbuf.cap,
              need->res.cap, need->acc.cap);
    return ncclInternalError;
  }
  s->sbuf = gs->pinned.sbuf;
  s->rbuf = gs->pinned.rbuf;
  s->gbuf = gs->pinned.gbuf;
  s->res = gs->pinned.res;
  s->acc = gs->dacc; /* device memory: the host never touches it */
  s->gpu_step = AGOQ_GPU_STEP_NONE;
  gs->nres = 0;
  gs->res_queued = false;
  return ncclSuccess;
}

/* *done = the work queued before the slot's last mark has completed. */
ncclResult_t agoq_coll_gpu_poll(agoq_coll_comm* g, const agoq_coll_slot* s, bool* done) {
  pthread_mutex_lock(&g->gpu_mu);
  ncclResult_t res = agoq_gpu_poll(g->gpu, agoq_coll_gpu_link_slot(g, s), done);
  uint64_t gpu_ns = agoq_gpu_codec_ns_take(g->gpu); /* the codec's time of what completed */
  pthread_mutex_unlock(&g->gpu_mu);
  /* The batch that used the spill area has completed: the area is free (its holder reads
   * what the batch wrote there in this same pass, under step_mu). */
  if (res == ncclSuccess && *done && g->gspill_holder == agoq_gpu_spill_who(g, s)) g->gspill_holder = 0;
  agoq_stats_add(&g->st->path[AGOQ_STATS_QUANT].gpu_ns, gpu_ns);
  return res;
}

uint32_t agoq_coll_gpu_status(agoq_coll_comm* g, const agoq_coll_slot* s, int part, uint64_t* body_len) {
  uint32_t status = 0;
  pthread_mutex_lock(&g->gpu_mu);
  agoq_gpu_codec_result(g->gpu, agoq_coll_gpu_link_slot(g, s), part, &status, body_len);
  pthread_mutex_unlock(&g->gpu_mu);
  return status;
}

/* The CPU's part of a GPU step (CRCs, the checks) counts as codec time, as on the host path. */
void agoq_coll_gpu_cpu_time(agoq_coll_comm* g, const agoq_coll_req* r, int64_t t0, uint64_t crc0) {
  agoq_stats_add(&agoq_coll_req_stats(g, r)->codec_ns, (uint64_t)(agoq_coll_now_ns() - t0));
  agoq_stats_add(&agoq_coll_req_stats(g, r)->crc_ns, agoq_frame_crc_ns() - crc0);
}

void agoq_coll_gpu_sealed(agoq_coll_comm* g, const agoq_coll_req* r, uint64_t d2h, int64_t t0, uint64_t crc0) {
  pthread_mutex_lock(&g->gpu_mu);
  agoq_gpu_note_encoded(g->gpu, d2h);
  pthread_mutex_unlock(&g->gpu_mu);
  agoq_stats_add(&agoq_coll_req_stats(g, r)->pcie_d2h, d2h);
  agoq_coll_gpu_cpu_time(g, r, t0, crc0);
}

/* Work queued on the group's link (agoq_gpu_queue), under gpu_mu. */
typedef ncclResult_t (*agoq_gpu_queue_fn)(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg);

/* Queues fn's work on the link under gpu_mu and, with mark, the slot's mark after it: the
 * event agoq_coll_gpu_poll polls. */
ncclResult_t agoq_coll_gpu_queue(agoq_coll_comm* g, agoq_coll_slot* s, bool mark, agoq_coll_gpu_queue_fn fn,
                                 const void* arg) {
  pthread_mutex_lock(&g->gpu_mu);
  ncclResult_t res = fn(g, s, arg);
  if (res == ncclSuccess && mark) AGOQ_CHECK_GOTO(agoq_gpu_mark(g->gpu, agoq_coll_gpu_link_slot(g, s)), res, out);
out:
  pthread_mutex_unlock(&g->gpu_mu);
  return res;
}

/* Every slice's frame from NCCL's buffer, one batch: the peers' into their pinned regions,
 * with the room a frame whose blocks compress takes (the host path's layout), this rank's own
 * into device memory at its largest. With redo, only the peers' frames that did not fit,
 * again, at their largest, one after another in the spill area. Item i (result i) is the
 * i-th slice coded. */
static ncclResult_t agoq_gpu_encode_slices(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  bool redo = *(const bool*)arg;
  agoq_coll_req* r = s->req;
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  agoq_codec_params p = agoq_coll_params(g, r->codec_dtype);
  size_t k = 0;
  for (int j = 0; j < g->nranks; j++) {
    if (s->sl[j] == 0 || (redo && !gs->redo[j])) continue;
    agoq_gpu_encode_item* e = &gs->enc[k++];
    *e = (agoq_gpu_encode_item){.src = agoq_coll_src_at(r, s->sb[j]), .n = s->sl[j]};
    if (redo) {
      e->frame = s->s_at[j];
      e->cap = agoq_frame_size_max(&p, s->sl[j]);
    } else if (j == g->rank) {
      e->frame = gs->down.p;
      e->cap = gs->down.cap;
    } else {
      e->frame = s->sbuf.p + s->s_off[j];
      e->cap = agoq_coll_align16(agoq_frame_size_nominal(&p, s->sl[j]));
    }
  }
  if (k == 0) return ncclSuccess;
  return agoq_gpu_frame_encode_batch(g->gpu, agoq_coll_gpu_link_slot(g, s), 0, &p, gs->enc, k);
}

/* The frames coded again get their room in the spill area (s_at), one after another: false
 * while another slot holds it. */
static ncclResult_t agoq_gpu_redo_room(agoq_coll_comm* g, agoq_coll_slot* s, bool* ready) {
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  agoq_codec_params p = agoq_coll_params(g, s->req->codec_dtype);
  *ready = agoq_coll_gpu_spill_ready(g, s);
  for (int j = 0; *ready && j < g->nranks; j++) {
    if (!gs->redo[j]) continue;
    ncclResult_t res;
    s->s_at[j] = agoq_coll_gpu_spill_room(g, s, agoq_frame_size_max(&p, s->sl[j]), &res);
    if (s->s_at[j] == NULL) return res;
  }
  return ncclSuccess;
}

/* The verdicts of the batch that completed (first: every slice's; else the frames coded
 * again): each peer's frame that fit is sealed for the wire, from its region or (coded
 * again) copied out of the spill area into a buffer of its own, as the host path sends a
 * frame that outgrew its region; one that did not fit is marked for the redo (*redo). */
static ncclResult_t agoq_gpu_slices_done(agoq_coll_comm* g, agoq_coll_slot* s, bool first, bool* redo) {
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns(), d2h = 0;
  int item = 0;
  *redo = false;
  for (int j = 0; j < g->nranks; j++) {
    if (s->sl[j] == 0 || (!first && !gs->redo[j])) continue;
    if (first) gs->redo[j] = 0;
    uint64_t body_len = 0;
    uint32_t status = agoq_coll_gpu_status(g, s, item++, &body_len);
    if (first && j != g->rank && status == AGOQ_CODEC_ESPACE) {
      gs->redo[j] = 1; /* blocks escaped raw: larger than its region */
      *redo = true;
      continue;
    }
    if (status != AGOQ_CODEC_OK) {
      AGOQ_WARN("CollNet rank %d: the GPU could not quantize elements [%zu, %zu) of the call: %s", g->rank, s->sb[j],
                s->sb[j] + s->sl[j], agoq_codec_status_str((agoq_codec_status)status));
      return ncclInternalError;
    }
    s->s_len[j] = AGOQ_FRAME_HEADER_SIZE + (size_t)body_len;
    if (j == g->rank) continue; /* stays in device memory: decoded there, never sent */
    d2h += s->s_len[j];
    if (first) {
      s->s_at[j] = s->sbuf.p + s->s_off[j];
    } else {
      uint8_t* own = agoq_coll_spill_alloc(g, s, s->s_len[j]);
      if (own == NULL) return ncclSystemError;
      memcpy(own, s->s_at[j], s->s_len[j]);
      s->s_at[j] = own;
    }
    /* As the host path's frames for peers: the same bytes on the wire. */
    agoq_codec_status st = agoq_frame_seal_payload_crc(s->s_at[j], s->s_len[j]);
    if (st != AGOQ_CODEC_OK) {
      AGOQ_WARN("CollNet rank %d: the GPU's frame of elements [%zu, %zu) could not be sealed: %s", g->rank, s->sb[j],
                s->sb[j] + s->sl[j], agoq_codec_status_str(st));
      return ncclInternalError;
    }
  }
  agoq_coll_gpu_sealed(g, s->req, d2h, t0, crc0);
  return ncclSuccess;
}

ncclResult_t agoq_coll_gpu_encode_steps(agoq_coll_comm* g, agoq_coll_slot* s, agoq_coll_gpu_start_fn start,
                                        agoq_coll_gpu_done_fn done_fn, bool* ready) {
  *ready = s->gpu_step >= AGOQ_GPU_STEP_ENCODED;
  if (*ready) return ncclSuccess;
  bool queued = false, redo = false;
  if (s->gpu_step == AGOQ_GPU_STEP_NONE) {
    AGOQ_CHECK(start(g, s, false, &queued));
    s->gpu_step = AGOQ_GPU_STEP_ENCODING;
    return ncclSuccess;
  }
  if (s->gpu_step != AGOQ_GPU_STEP_REDO_WAIT) {
    bool done = false;
    AGOQ_CHECK(agoq_coll_gpu_poll(g, s, &done));
    if (!done) return ncclSuccess;
    AGOQ_CHECK(done_fn(g, s, s->gpu_step == AGOQ_GPU_STEP_ENCODING, &redo));
    if (!redo) {
      s->gpu_step = AGOQ_GPU_STEP_ENCODED;
      *ready = true;
      return ncclSuccess;
    }
    s->gpu_step = AGOQ_GPU_STEP_REDO_WAIT;
  }
  /* Frames that outgrew their room (NaN, Inf): coded again, in the spill area once this slot
   * has it. */
  AGOQ_CHECK(start(g, s, true, &queued));
  if (queued) s->gpu_step = AGOQ_GPU_STEP_REENCODING;
  return ncclSuccess;
}

/* The mesh's encode batch queued (with redo: once the frames coded again have their room). */
static ncclResult_t agoq_gpu_encode_start(agoq_coll_comm* g, agoq_coll_slot* s, bool redo, bool* queued) {
  *queued = true;
  if (redo) AGOQ_CHECK(agoq_gpu_redo_room(g, s, queued));
  if (!*queued) return ncclSuccess;
  return agoq_coll_gpu_queue(g, s, true, agoq_gpu_encode_slices, &redo);
}

ncclResult_t agoq_coll_gpu_encode(agoq_coll_comm* g, agoq_coll_slot* s, bool* ready) {
  return agoq_coll_gpu_encode_steps(g, s, agoq_gpu_encode_start, agoq_gpu_slices_done, ready);
}

/* A received frame parsed on the host for the GPU's decode: *info and *body, its count
 * checked against the slice's and its format, type and block against the group's (want: a
 * batch decodes its frames with one set of parameters); with r, the check's CPU time is
 * counted (agoq_gpu_cpu_time). */
typedef struct {
  agoq_coll_comm* g;
  const agoq_coll_req* r;
  int64_t t0;
  uint64_t crc0;
  size_t count;
  agoq_codec_params want;
  agoq_frame_info* info;
  const void** body;
} agoq_gpu_parse_arg;

agoq_codec_status agoq_coll_gpu_frame_check(const uint8_t* f, size_t len, size_t count, const agoq_codec_params* want,
                                            agoq_frame_info* info, const void** body) {
  agoq_codec_status st = agoq_frame_parse(f, len, info, body);
  const agoq_codec_params* got = &info->params;
  if (st == AGOQ_CODEC_OK && (info->count != (uint64_t)count || got->format != want->format ||
                              got->dtype != want->dtype || got->block != want->block))
    st = AGOQ_CODEC_ECORRUPT;
  return st;
}

static agoq_codec_status agoq_gpu_parse_step(void* arg, const uint8_t* f, size_t len) {
  const agoq_gpu_parse_arg* a = arg;
  agoq_codec_status st = agoq_coll_gpu_frame_check(f, len, a->count, &a->want, a->info, a->body);
  if (a->r != NULL) agoq_coll_gpu_cpu_time(a->g, a->r, a->t0, a->crc0);
  return st;
}

/* Rank k's contribution to this rank's slice, checked on the host as the CPU path's decoder
 * checks it (header and payload CRC32C, lengths, bitmap, scales); *body and *p for the GPU. */
static ncclResult_t agoq_gpu_check_contribution(agoq_coll_comm* g, agoq_coll_slot* s, int k, agoq_frame_info* info,
                                                const void** body) {
  agoq_gpu_parse_arg a = {
      .g = g, .count = s->sl[g->rank], .want = agoq_coll_params(g, s->req->codec_dtype), .info = info, .body = body};
  return agoq_coll_quant_frame_check(g, s, AGOQ_COLL_FRAME_CONTRIBUTION, k, true, s->p1r_at[k],
                                     (size_t)s->p1r_size[k], agoq_gpu_parse_step, &a);
}

/* The contributions, one batch: rank 0's decoded into the fp32 sum, the others' added to it
 * in rank order (result k: rank k's). */
static ncclResult_t agoq_gpu_add_contributions(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  (void)arg;
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  agoq_codec_params p = agoq_coll_params(g, s->req->codec_dtype);
  return agoq_gpu_dequantize_sum(g->gpu, agoq_coll_gpu_link_slot(g, s), 0, &p, gs->sum, (size_t)g->nranks,
                                 s->sl[g->rank], (float*)gs->dacc.p);
}

/* The owner's step on the sum: allreduce overflow to Inf and the sum's frame; reducescatter
 * the sum rounded into NCCL's buffer. */
static ncclResult_t agoq_gpu_finish_sum(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  agoq_coll_req* r = s->req;
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  size_t m = s->sl[g->rank];
  float* acc = (float*)gs->dacc.p;
  if (r->kind == AGOQ_COLL_REDUCESCATTER) {
    AGOQ_CHECK(agoq_gpu_narrow(g->gpu, r->codec_dtype, acc, m, agoq_coll_dst_at(r, s->sb[g->rank])));
    return ncclSuccess;
  }
  /* A sum outside the output type's finite range is Inf, and the owner takes the same
   * decoded bytes as everyone else (agoq_coll_quant_reduce). */
  AGOQ_CHECK(agoq_gpu_overflow_to_inf(g->gpu, r->codec_dtype, acc, m));
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  AGOQ_CHECK(agoq_gpu_frame_encode(g->gpu, agoq_coll_gpu_link_slot(g, s), agoq_part_sum(g), &p32, acc, m, gs->dres.p,
                                   gs->dres.cap));
  return ncclSuccess;
}

/* The contributions in rank order into the fp32 sum, then the owner's step (*queued: not
 * while a contribution that spilled waits for the spill area). */
static ncclResult_t agoq_gpu_sum_queue(agoq_coll_comm* g, agoq_coll_slot* s, uint64_t* h2d, bool* queued) {
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  int n = g->nranks, me = g->rank;
  *h2d = 0;
  *queued = false;
  for (int k = 0; k < n; k++)
    if (k != me && agoq_coll_gpu_spill_blocked(g, s, s->p1r_at[k], (size_t)s->p1r_size[k])) return ncclSuccess;
  for (int k = 0; k < n; k++) {
    agoq_gpu_decode_item* c = &gs->sum[k];
    *c = (agoq_gpu_decode_item){.n = s->sl[me]};
    if (k == me) {
      c->body = gs->down.p + AGOQ_FRAME_HEADER_SIZE;
      c->body_len = s->s_len[me] - AGOQ_FRAME_HEADER_SIZE;
    } else {
      agoq_frame_info info;
      AGOQ_CHECK(agoq_gpu_check_contribution(g, s, k, &info, &c->body));
      c->body_len = (size_t)info.payload_len;
      *h2d += info.payload_len;
    }
  }
  bool ready = false;
  AGOQ_CHECK(agoq_coll_gpu_spill_stage(g, s, gs->sum, (size_t)n, &ready));
  if (!ready) return ncclInternalError; /* it was free or this slot's a moment ago */
  /* acc = y_0, then acc += y_k in rank order: the host path's additions. */
  AGOQ_CHECK(agoq_coll_gpu_queue(g, s, false, agoq_gpu_add_contributions, NULL));
  *queued = true;
  return agoq_coll_gpu_queue(g, s, true, agoq_gpu_finish_sum, NULL);
}

/* The sum's frame (body_len bytes of body) from device memory: its copy to the result
 * message and its decode into NCCL's buffer. */
static ncclResult_t agoq_gpu_share_sum(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  uint64_t body_len = *(const uint64_t*)arg;
  agoq_coll_req* r = s->req;
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  if (g->nranks > 1) AGOQ_CHECK(agoq_gpu_copy_d2h(g->gpu, s->res.p, gs->dres.p, s->res_len));
  AGOQ_CHECK(agoq_gpu_dequantize(g->gpu, agoq_coll_gpu_link_slot(g, s), agoq_part_share(g), &p32,
                                 gs->dres.p + AGOQ_FRAME_HEADER_SIZE, (size_t)body_len, s->sl[g->rank], r->codec_dtype,
                                 agoq_coll_dst_at(r, s->sb[g->rank])));
  return ncclSuccess;
}

static ncclResult_t agoq_gpu_share_queue(agoq_coll_comm* g, agoq_coll_slot* s, uint64_t body_len) {
  s->res_len = AGOQ_FRAME_HEADER_SIZE + (size_t)body_len;
  if (s->res_len > s->res.cap) {
    AGOQ_WARN("CollNet rank %d: the GPU's sum frame (%zu bytes) exceeds its message buffer (%zu)", g->rank, s->res_len,
              s->res.cap);
    return ncclInternalError;
  }
  ncclResult_t res = agoq_coll_gpu_queue(g, s, true, agoq_gpu_share_sum, &body_len);
  if (res == ncclSuccess && g->nranks > 1) agoq_stats_add(&agoq_coll_req_stats(g, s->req)->pcie_d2h, s->res_len);
  return res;
}

/* The device's verdict on parts [from, to) of the slot; anything but OK fails the call. */
ncclResult_t agoq_coll_gpu_check_parts(agoq_coll_comm* g, agoq_coll_slot* s, int from, int to, const char* what) {
  for (int part = from; part < to; part++) {
    uint32_t status = agoq_coll_gpu_status(g, s, part, NULL);
    if (status == AGOQ_CODEC_OK) continue;
    AGOQ_WARN("CollNet rank %d: %s on the GPU failed (result %d of the chunk): %s", g->rank, what, part,
              agoq_codec_status_str((agoq_codec_status)status));
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t agoq_coll_gpu_reduce(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  agoq_coll_req* r = s->req;
  *done = s->gpu_step == AGOQ_GPU_STEP_REDUCED || s->sl[g->rank] == 0;
  if (*done) return ncclSuccess;
  int64_t t0 = agoq_coll_now_ns();
  uint64_t crc0 = agoq_frame_crc_ns();
  ncclResult_t res = ncclSuccess;
  if (s->gpu_step == AGOQ_GPU_STEP_ENCODED) {
    uint64_t h2d = 0;
    bool queued = false;
    res = agoq_gpu_sum_queue(g, s, &h2d, &queued);
    agoq_stats_add(&agoq_coll_req_stats(g, r)->pcie_h2d, h2d);
    if (res == ncclSuccess && queued) s->gpu_step = AGOQ_GPU_STEP_SUMMING;
    agoq_coll_gpu_cpu_time(g, r, t0, crc0);
    return res;
  }
  bool ready = false;
  AGOQ_CHECK(agoq_coll_gpu_poll(g, s, &ready));
  if (!ready) return ncclSuccess;
  if (s->gpu_step == AGOQ_GPU_STEP_SUMMING) {
    AGOQ_CHECK(agoq_coll_gpu_check_parts(g, s, 0, g->nranks, "decoding a contribution"));
    if (r->kind == AGOQ_COLL_REDUCESCATTER) {
      s->gpu_step = AGOQ_GPU_STEP_REDUCED;
      *done = true;
      return ncclSuccess;
    }
    AGOQ_CHECK(agoq_coll_gpu_check_parts(g, s, agoq_part_sum(g), agoq_part_sum(g) + 1, "quantizing the sum"));
    uint64_t body_len = 0;
    (void)agoq_coll_gpu_status(g, s, agoq_part_sum(g), &body_len);
    AGOQ_CHECK(agoq_gpu_share_queue(g, s, body_len));
    s->gpu_step = AGOQ_GPU_STEP_SHARING;
    return ncclSuccess;
  }
  /* SHARING: the result message is in pinned memory; its copy on the wire gets the CRC. */
  AGOQ_CHECK(agoq_coll_gpu_check_parts(g, s, agoq_part_share(g), agoq_part_share(g) + 1, "decoding the sum"));
  if (g->nranks > 1) {
    agoq_codec_status st = agoq_frame_seal_payload_crc(s->res.p, s->res_len);
    if (st != AGOQ_CODEC_OK) {
      AGOQ_WARN("CollNet rank %d: the GPU's sum frame could not be sealed: %s", g->rank, agoq_codec_status_str(st));
      return ncclInternalError;
    }
  }
  agoq_coll_gpu_cpu_time(g, r, t0, crc0);
  s->gpu_step = AGOQ_GPU_STEP_REDUCED;
  *done = true;
  return ncclSuccess;
}

/* The owners' checked result frames, one batch, into NCCL's buffer (results from
 * agoq_part_gather(g, 0), in the order the frames arrived). */
static ncclResult_t agoq_gpu_decode_results(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg) {
  (void)arg;
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  agoq_codec_params p32 = agoq_coll_params(g, AGOQ_DTYPE_FP32);
  return agoq_gpu_dequantize_batch(g->gpu, agoq_coll_gpu_link_slot(g, s), agoq_part_gather(g, 0), &p32, gs->res, (size_t)gs->nres,
                                   s->req->codec_dtype);
}

ncclResult_t agoq_coll_gpu_decode(agoq_coll_comm* g, agoq_coll_slot* s, int j, int size) {
  agoq_coll_req* r = s->req;
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  agoq_frame_info info;
  const void* body = NULL;
  agoq_gpu_parse_arg a = {.g = g,
                          .r = r,
                          .t0 = agoq_coll_now_ns(),
                          .crc0 = agoq_frame_crc_ns(),
                          .count = s->sl[j],
                          .want = agoq_coll_params(g, AGOQ_DTYPE_FP32),
                          .info = &info,
                          .body = &body};
  ncclResult_t res = agoq_coll_quant_frame_check(g, s, AGOQ_COLL_FRAME_RESULT, j, true, s->p2r_at[j],
                                                 (size_t)size, agoq_gpu_parse_step, &a);
  if (res != ncclSuccess) return res;
  if (gs->nres >= g->nranks || gs->res_queued) {
    AGOQ_WARN("CollNet rank %d: a result frame from rank %d after the chunk's %d were in: internal error", g->rank, j,
              gs->nres);
    return ncclInternalError;
  }
  gs->res[gs->nres++] = (agoq_gpu_decode_item){
      .body = body, .body_len = (size_t)info.payload_len, .n = s->sl[j], .dst = agoq_coll_dst_at(r, s->sb[j])};
  agoq_stats_add(&agoq_coll_req_stats(g, r)->pcie_h2d, info.payload_len);
  return ncclSuccess;
}

ncclResult_t agoq_coll_gpu_retire(agoq_coll_comm* g, agoq_coll_slot* s, bool* done) {
  agoq_coll_gpu_slot* gs = &g->gslots[s - g->slots];
  /* Every receive is in: the result frames' one decode (the slot's earlier batches have
   * completed: their marks were seen done before this chunk's sends could finish). */
  if (!gs->res_queued) {
    bool ready = false;
    AGOQ_CHECK(agoq_coll_gpu_spill_stage(g, s, gs->res, (size_t)gs->nres, &ready));
    if (!ready) {
      *done = false;
      return ncclSuccess;
    }
    if (gs->nres > 0) AGOQ_CHECK(agoq_coll_gpu_queue(g, s, true, agoq_gpu_decode_results, NULL));
    gs->res_queued = true;
  }
  AGOQ_CHECK(agoq_coll_gpu_poll(g, s, done));
  if (!*done || gs->nres == 0) return ncclSuccess;
  return agoq_coll_gpu_check_parts(g, s, agoq_part_gather(g, 0), agoq_part_gather(g, 0) + gs->nres,
                              "decoding a result frame");
}

/* ---- the GPU step (agoq_coll_step.h) ------------------------------------------------------ */

/* Made by prepare (every slice at once, on the device). */
static ncclResult_t agoq_gpu_p1_message(agoq_coll_comm* g, agoq_coll_slot* s, int j, const uint8_t** p,
                                        size_t* len) {
  *p = j == g->rank ? NULL : s->s_at[j]; /* its region, or (coded again) a buffer of its own */
  *len = s->s_len[j];
  return ncclSuccess;
}

const agoq_coll_step_impl agoq_coll_step_gpu = {
    .reserve = agoq_coll_gpu_reserve,
    .p2_place = agoq_coll_quant_p2_place,
    .prepare = agoq_coll_gpu_encode,
    .p1_message = agoq_gpu_p1_message,
    .reduce = agoq_coll_gpu_reduce,
    .p2_message = agoq_coll_step_result,
    .received = agoq_coll_gpu_decode,
    .retire = agoq_coll_gpu_retire,
};
