/* NCCL's CollNet buffers in device memory (NCCL_PTR_CUDA), staged through pinned host memory
 * of the group's GPU link (plugin/gpu): the host algorithm of the engine runs unchanged from
 * and into the staging.
 *  - the call (iallreduce / ireducescatter / iallgather, NCCL's proxy thread) reserves the
 *    request's staging, queues the copy of its device input into it and records the
 *    request's event: the copy starts at once, and a full staging is a NULL request now;
 *  - the engine admits the request's first chunk only once that event is done (polled by
 *    whichever thread runs the pass: the engine, or test() assisting). Admission is in call
 *    order on every rank, so later requests wait behind it, as the wire order needs;
 *  - when the host result is complete, the pass that retired the last chunk queues the copy
 *    into NCCL's device buffers and records the event again (state COPY_OUT);
 *  - test() says done only once that event is: the result is in NCCL's buffer when NCCL's
 *    kernel looks (shared/reference/gpu-data-path.md 2.3), so iflush has nothing to do.
 * Threads: the runtime is thread-safe, but the link is not: its ring and counters are plain
 * bookkeeping, and an event marks "everything queued so far" only if no other thread
 * queues in between. Both NCCL's proxy threads and the engine use it, so every call on it
 * is made under gpu_mu, a leaf lock held only around non-blocking calls (copies queued,
 * events recorded or queried). Nothing here waits for the device; the only wait is the
 * link's destruction at close. Every byte crosses PCIe twice (input D2H, result H2D). Quantized
 * calls whose buffers are all on the device skip the staging: agoq_coll_gpu.c reduces them
 * on the GPU.
 * A call larger than the staging (CollNetDirect calls reach NCCL_BUFFSIZE, 16 MiB is a common
 * setting; registered windows need input plus output) runs from and into a host bounce
 * buffer of its size instead (over verbs registered for the call: slow on hardware, said
 * once per group): the input comes across PCIe in pieces of half the staging, one behind the request's event at
 * a time, the CPU moving each into the bounce buffer, before the first chunk is admitted;
 * the result goes back the same way before test() says done. One such request per group at
 * a time (the next is a NULL request): host memory grows with the groups, not the calls. */
#include <stdlib.h>
#include <string.h>

#include "collnet/agoq_coll_internal.h"
#include "core/agoq_check.h"
#include "core/agoq_params.h"

/* One event per request of the pool (a request uses its own slot for its input copy, then
 * again for its result copy), then one per pipeline slot for the GPU path (agoq_coll_gpu.c). */
#define AGOQ_COLL_GPU_SLOTS (AGOQ_COLL_MAX_REQUESTS + AGOQ_COLL_SLOTS)
/* A chunk's codec calls on the GPU path: on the mesh 3 batches and at most 3 single calls; on a
 * grid at most 4 batches (frames, frames coded again, row sums, final decodes). */
#define AGOQ_COLL_GPU_CALLS_PER_CHUNK 6u

static uint32_t agoq_dev_slot(const agoq_coll_comm* g, const agoq_coll_req* r) { return (uint32_t)(r - g->reqs); }

ncclResult_t agoq_coll_dev_reg(agoq_coll_comm* g, void* data, size_t size, agoq_coll_mr* mr) {
  char why[224];
  int device = -1;
  ncclResult_t res = agoq_gpu_range_check(data, size, &device, why, sizeof why);
  if (res != ncclSuccess) {
    AGOQ_WARN("CollNet regMr: device memory %p (%zu bytes) refused: %s", data, size, why);
    return ncclInvalidUsage;
  }
  pthread_mutex_lock(&g->gpu_mu);
  if (g->gpu == NULL) {
    /* Setup time (NCCL registers its buffers at connect): groups that only ever see host
     * memory pin nothing. */
    size_t staging = (size_t)agoq_param_int(AGOQ_PARAM_GPU_STAGING);
    /* Codec calls in flight: at most the GPU path's, per pipeline slot its batches (slices'
     * encode, sum, result frames' decode) and the owner's single calls (overflow to Inf or
     * narrowing, the sum's encode and decode): AGOQ_COLL_GPU_CALLS_PER_CHUNK. The batches
     * run in the pipeline slots' link slots, after the requests'. */
    bool mesh = agoq_coll_gpu_wanted(g), grid = agoq_coll_grid_gpu_wanted(g);
    uint32_t items = mesh ? (uint32_t)g->nranks : 0u, parts = agoq_coll_gpu_parts(g);
    size_t max_n = mesh ? agoq_coll_gpu_slice_elems(g) : 0;
    if (grid) {
      agoq_coll_grid_gpu_needs(g, &items, &max_n);
      if (items > parts) parts = items;
    }
    agoq_gpu_link_config lc = {.staging = staging, .slots = AGOQ_COLL_GPU_SLOTS, .parts = parts,
                               .timed = AGOQ_COLL_SLOTS * AGOQ_COLL_GPU_CALLS_PER_CHUNK,
                               .batch_from = AGOQ_COLL_MAX_REQUESTS,
                               .batch_items = items,
                               .batch_block = g->cfg.block,
                               .batch_max_n = max_n};
    res = agoq_gpu_link_create(device, &lc, &g->gpu);
    if (res == ncclSuccess)
      AGOQ_INFO(NCCL_NET | NCCL_REG, "CollNet rank %d: device buffers of GPU %d staged through %zu bytes of pinned memory",
                g->rank, device, staging);
    if (res == ncclSuccess) {
      const agoq_gpu_ring* ring = agoq_gpu_link_ring(g->gpu);
      res = agoq_net_reg_host(g->dev, ring->base, ring->size, &g->gpu_keys[0]);
    }
    if (res == ncclSuccess) res = agoq_coll_on_grid(g) ? agoq_coll_grid_gpu_setup(g) : agoq_coll_gpu_setup(g);
    if (res != ncclSuccess) { /* no half-built path: the next registration tries again */
      agoq_coll_gpu_unregister(g);
      agoq_gpu_link_destroy(g->gpu);
      g->gpu = NULL;
    }
  } else if (agoq_gpu_link_device(g->gpu) != device) {
    AGOQ_WARN("CollNet regMr: device memory of GPU %d on a group that carries GPU %d's", device,
              agoq_gpu_link_device(g->gpu));
    res = ncclInvalidUsage;
  }
  pthread_mutex_unlock(&g->gpu_mu);
  AGOQ_CHECK(res);
  mr->device = device;
  return ncclSuccess;
}

ncclResult_t agoq_coll_dev_is_device(const void* mhandle, const void* data, size_t size, bool* device) {
  const agoq_coll_mr* mr = mhandle;
  *device = false;
  if (mr == NULL || mr->magic != AGOQ_COLL_MR_MAGIC || mr->type != NCCL_PTR_CUDA) return ncclSuccess;
  *device = true;
  if (size == 0) return ncclSuccess; /* no byte is touched: any pointer will do (NULL too) */
  const uint8_t* p = data;
  const uint8_t* lo = mr->addr;
  if (p < lo || (size_t)(p - lo) > mr->size || size > mr->size - (size_t)(p - lo)) {
    AGOQ_WARN("CollNet: device buffer %p (%zu bytes) lies outside its registration %p (%zu bytes)", data, size,
              mr->addr, mr->size);
    *device = false;
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* The input bytes the engine reads: allreduce the send buffer, reducescatter the window,
 * allgather this rank's bytes of it. */
static size_t agoq_dev_in_bytes(const agoq_coll_req* r) {
  if (r->kind == AGOQ_COLL_ALLGATHER) return agoq_coll_rank_begin(r, r->comm->rank + 1) - r->my_begin;
  return r->count * r->esz;
}

/* The statistics line a request counts on. */
static int agoq_dev_path(const agoq_coll_req* r) { return r->quantized ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT; }

/* A request whose staging can never fit is an error now rather than a retry forever. */
static ncclResult_t agoq_dev_fits(agoq_coll_comm* g, size_t need) {
  if (agoq_gpu_ring_fits(agoq_gpu_link_ring(g->gpu), need)) return ncclSuccess;
  AGOQ_WARN("CollNet rank %d: a device call needs %zu bytes of staging, more than the group's AGOQ_GPU_STAGING=%lld: "
            "raise it", g->rank, need, (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
  return ncclInvalidUsage;
}

static void agoq_dev_redirect(agoq_coll_req* r, uint8_t* in, uint8_t* out);

/* Segment k of a bounced request's device bytes (the input's with `in`, else the
 * result's): *dev in NCCL's buffer, *host its place in the bounce buffer. false: no more. */
static bool agoq_dev_segment(const agoq_coll_req* r, bool in, int k, uint8_t** dev, uint8_t** host, size_t* size) {
  bool parts = in ? r->kind == AGOQ_COLL_REDUCESCATTER : r->kind == AGOQ_COLL_ALLGATHER;
  uint8_t* base = in ? r->bounce_in : r->bounce_out;
  if (base == NULL) return false;
  if (!parts) {
    *dev = in ? (uint8_t*)r->dev_src : r->dev_dst;
    *host = base;
    *size = in ? agoq_dev_in_bytes(r) : r->result_bytes;
    return k == 0 && *dev != NULL;
  }
  size_t off = 0;
  for (int i = 0, seen = 0; i < r->nparts; off += r->parts[i].size, i++) {
    if (!(r->dev_parts & (1u << i)) || seen++ != k) continue;
    *dev = r->parts[i].address;
    *host = base + off;
    *size = r->parts[i].size;
    return true;
  }
  return false;
}

/* Queues the next piece of a bounced request (input: D2H into the staging; result: from the
 * bounce buffer into the staging, H2D) and the request's event; *queued false when none is
 * left. Under gpu_mu. The first piece's bytes are counted in the statistics by the call that
 * queued it (agoq_coll_dev_stage, agoq_coll_dev_copy_out), the others where they are queued. */
static ncclResult_t agoq_dev_piece_queue(agoq_coll_comm* g, agoq_coll_req* r, bool in, bool* queued) {
  *queued = false;
  uint8_t *dev = NULL, *host = NULL;
  size_t size = 0;
  while (agoq_dev_segment(r, in, r->piece_seg, &dev, &host, &size)) {
    if (r->piece_off < size) {
      size_t len = size - r->piece_off < r->piece_cap ? size - r->piece_off : r->piece_cap;
      if (in) {
        AGOQ_CHECK(agoq_gpu_copy_d2h(g->gpu, r->piece_host, dev + r->piece_off, len));
      } else {
        memcpy(r->piece_host, host + r->piece_off, len);
        AGOQ_CHECK(agoq_gpu_copy_h2d(g->gpu, dev + r->piece_off, r->piece_host, len));
      }
      AGOQ_CHECK(agoq_gpu_mark(g->gpu, agoq_dev_slot(g, r)));
      r->piece_len = len;
      *queued = true;
      return ncclSuccess;
    }
    r->piece_seg++;
    r->piece_off = 0;
  }
  return ncclSuccess;
}

/* The piece in flight is complete: an input piece goes on into the bounce buffer. */
static void agoq_dev_piece_landed(agoq_coll_req* r, bool in) {
  uint8_t *dev = NULL, *host = NULL;
  size_t size = 0;
  if (in && agoq_dev_segment(r, true, r->piece_seg, &dev, &host, &size))
    memcpy(host + r->piece_off, r->piece_host, r->piece_len);
  r->piece_off += r->piece_len;
  r->piece_len = 0;
}

/* A call larger than the staging: its bounce buffer, half the staging for its pieces, and
 * the first input piece queued. *busy: the staging or the group's bounce is taken. */
static ncclResult_t agoq_dev_bounce_locked(agoq_coll_comm* g, agoq_coll_req* r, size_t in_bytes, size_t out_bytes,
                                           bool alias, size_t total, bool* busy) {
  agoq_gpu_ring* ring = agoq_gpu_link_ring(g->gpu);
  size_t cap = agoq_gpu_ring_piece(ring->size);
  uint8_t* piece = NULL;
  int id = g->bounce_reqs == 0 ? agoq_gpu_ring_get(ring, cap, &piece) : -1;
  if (id < 0) {
    *busy = true;
    return ncclSuccess;
  }
  uint8_t* b = malloc(total);
  if (b == NULL) {
    agoq_gpu_ring_put(ring, id);
    AGOQ_WARN("CollNet rank %d: no host memory for the bounce buffer of a %zu-byte device call (larger than "
              "AGOQ_GPU_STAGING=%lld)", g->rank, total, (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
    return ncclSystemError;
  }
  /* Over verbs the engine's messages from and into it need a registration: one for the
   * call, made here on the data path (slow on hardware: its pages are pinned), found by
   * every chunk's message. */
  void* key = NULL;
  ncclResult_t res = agoq_net_reg_host(g->dev, b, total, &key);
  if (res != ncclSuccess) {
    free(b);
    agoq_gpu_ring_put(ring, id);
    AGOQ_WARN("CollNet rank %d: the host bounce buffer of a %zu-byte device call could not be registered with the "
              "NIC (logged above); a larger AGOQ_GPU_STAGING (%lld) avoids it",
              g->rank, total, (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
    return res;
  }
  if (key != NULL && g->bounce_regs++ == 0)
    AGOQ_INFO(NCCL_NET | NCCL_REG,
              "CollNet rank %d: a %zu-byte device call larger than the pinned staging runs from and into a host "
              "buffer registered for it (slow on hardware; a larger AGOQ_GPU_STAGING=%lld avoids it)",
              g->rank, total, (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
  g->bounce_reqs++;
  r->bounce = b;
  r->bounce_key = key;
  r->ring_id = id;
  r->piece_host = piece;
  r->piece_cap = cap;
  r->dev_src = r->src;
  r->bounce_in = in_bytes > 0 ? b : NULL;
  r->bounce_out = out_bytes == 0 ? NULL : alias ? b : b + agoq_gpu_ring_align(in_bytes);
  if (r->bounce_in != NULL) {
    bool queued = false;
    AGOQ_CHECK(agoq_dev_piece_queue(g, r, true, &queued));
    r->pieces_in = queued;
    r->in_copy = queued;
  }
  agoq_dev_redirect(r, r->bounce_in, r->bounce_out);
  return ncclSuccess;
}

/* Queues the copies of the device input into the staging at `in` and the request's event. */
static ncclResult_t agoq_dev_copy_in(agoq_coll_comm* g, agoq_coll_req* r, uint8_t* in, size_t in_bytes) {
  if (r->kind != AGOQ_COLL_REDUCESCATTER) {
    AGOQ_CHECK(agoq_gpu_copy_d2h(g->gpu, in, r->src, in_bytes));
  } else {
    /* The parts land concatenated; host parts are joined to them at admission. */
    size_t off = 0;
    for (int i = 0; i < r->nparts; i++) {
      if (r->dev_parts & (1u << i)) AGOQ_CHECK(agoq_gpu_copy_d2h(g->gpu, in + off, r->parts[i].address, r->parts[i].size));
      off += r->parts[i].size;
    }
  }
  AGOQ_CHECK(agoq_gpu_mark(g->gpu, agoq_dev_slot(g, r)));
  r->in_copy = true;
  return ncclSuccess;
}

/* Points the request at its staging: the engine reads src and writes dst (joined for parts). */
static void agoq_dev_redirect(agoq_coll_req* r, uint8_t* in, uint8_t* out) {
  if (in != NULL) {
    r->src = in;
    if (r->kind == AGOQ_COLL_REDUCESCATTER) r->joined = in;
  }
  if (out != NULL) {
    if (r->kind == AGOQ_COLL_ALLGATHER) r->joined = out;
    else r->dev_dst = r->dst;
    r->dst = out;
  }
}

static ncclResult_t agoq_dev_stage_locked(agoq_coll_comm* g, agoq_coll_req* r, size_t in_bytes, size_t out_bytes,
                                          bool alias, bool* busy) {
  if (g->gpu == NULL) {
    AGOQ_WARN("CollNet rank %d: a device buffer on a group without registered device memory", g->rank);
    return ncclInternalError;
  }
  size_t total = agoq_gpu_ring_align(in_bytes) + (alias ? 0 : out_bytes);
  if (!agoq_gpu_ring_fits(agoq_gpu_link_ring(g->gpu), total)) {
    ncclResult_t res = agoq_dev_bounce_locked(g, r, in_bytes, out_bytes, alias, total, busy);
    if (res != ncclSuccess && agoq_coll_fail(g, res))
      AGOQ_WARN("CollNet rank %d: the device path failed (%s); the group fails", g->rank, agoq_result_str(res));
    return res;
  }
  AGOQ_CHECK(agoq_dev_fits(g, total));
  uint8_t* base = NULL;
  int id = agoq_gpu_ring_get(agoq_gpu_link_ring(g->gpu), total, &base);
  if (id < 0) {
    *busy = true;
    return ncclSuccess;
  }
  uint8_t* in = in_bytes > 0 ? base : NULL;
  uint8_t* out = out_bytes == 0 ? NULL : alias ? base : base + agoq_gpu_ring_align(in_bytes);
  ncclResult_t res = ncclSuccess;
  if (in != NULL) AGOQ_CHECK_GOTO(agoq_dev_copy_in(g, r, in, in_bytes), res, fail);
  r->ring_id = id;
  agoq_dev_redirect(r, in, out);
  return ncclSuccess;
fail:
  /* Copies may be queued into the staging: the group stops here (its later calls fail), so
   * nothing is staged into it again. */
  if (agoq_coll_fail(g, res)) AGOQ_WARN("CollNet rank %d: the device path failed (%s); the group fails", g->rank,
                                       agoq_result_str(res));
  agoq_gpu_ring_put(agoq_gpu_link_ring(g->gpu), id);
  return res;
}

ncclResult_t agoq_coll_dev_stage(agoq_coll_comm* g, agoq_coll_req* r, bool in_dev, bool out_dev, bool* busy) {
  *busy = false;
  size_t in_bytes = in_dev ? agoq_dev_in_bytes(r) : 0;
  size_t out_bytes = out_dev ? r->result_bytes : 0;
  if (in_bytes == 0 && out_bytes == 0) return ncclSuccess; /* no byte to move: nothing is read or written */
  /* Allreduce from and into device memory runs in place in the staging (the engine takes
   * send == recv), so a call needs its payload once. */
  bool alias = r->kind == AGOQ_COLL_ALLREDUCE && in_bytes > 0 && out_bytes > 0;
  pthread_mutex_lock(&g->gpu_mu);
  /* Quantized with every buffer on the device: reduced there, nothing staged. */
  if (agoq_coll_gpu_takes(g, r, in_dev, out_dev)) {
    pthread_mutex_unlock(&g->gpu_mu);
    return ncclSuccess;
  }
  uint64_t d2h0 = agoq_gpu_link_stats_get(g->gpu)->d2h_bytes;
  ncclResult_t res = agoq_dev_stage_locked(g, r, in_bytes, out_bytes, alias, busy);
  uint64_t d2h = agoq_gpu_link_stats_get(g->gpu)->d2h_bytes - d2h0;
  pthread_mutex_unlock(&g->gpu_mu);
  /* AGOQ_STATS: the bytes the copies queued really move across PCIe. */
  if (res == ncclSuccess && !*busy) agoq_stats_device(g->st, agoq_dev_path(r), d2h, 0);
  return res;
}

ncclResult_t agoq_coll_dev_input_ready(agoq_coll_comm* g, agoq_coll_req* r, bool* ready) {
  *ready = !r->in_copy;
  if (*ready) return ncclSuccess;
  pthread_mutex_lock(&g->gpu_mu);
  ncclResult_t res = agoq_gpu_poll(g->gpu, agoq_dev_slot(g, r), ready);
  if (res == ncclSuccess && *ready && r->pieces_in) {
    /* A bounced input: this piece into the bounce buffer, then the next one's copy. */
    bool queued = false;
    agoq_dev_piece_landed(r, true);
    res = agoq_dev_piece_queue(g, r, true, &queued);
    if (queued) agoq_stats_device(g->st, agoq_dev_path(r), r->piece_len, 0);
    r->pieces_in = queued;
    *ready = res == ncclSuccess && !queued;
  }
  pthread_mutex_unlock(&g->gpu_mu);
  if (*ready) r->in_copy = false;
  return res;
}

static ncclResult_t agoq_dev_copy_out_locked(agoq_coll_comm* g, agoq_coll_req* r, bool* queued) {
  if (r->bounce != NULL) {
    /* From the bounce buffer in pieces (agoq_coll_dev_copied queues the others). */
    r->piece_seg = 0;
    r->piece_off = 0;
    r->piece_len = 0;
    AGOQ_CHECK(agoq_dev_piece_queue(g, r, false, queued));
    r->pieces_out = *queued;
    return ncclSuccess;
  }
  if (r->kind != AGOQ_COLL_ALLGATHER) {
    if (r->dev_dst == NULL) return ncclSuccess;
    AGOQ_CHECK(agoq_gpu_copy_h2d(g->gpu, r->dev_dst, r->dst, r->result_bytes));
  } else {
    if (r->dev_parts == 0) return ncclSuccess;
    size_t off = 0;
    for (int i = 0; i < r->nparts; i++) {
      if (r->dev_parts & (1u << i))
        AGOQ_CHECK(agoq_gpu_copy_h2d(g->gpu, r->parts[i].address, r->joined + off, r->parts[i].size));
      off += r->parts[i].size;
    }
  }
  AGOQ_CHECK(agoq_gpu_mark(g->gpu, agoq_dev_slot(g, r)));
  *queued = true;
  return ncclSuccess;
}

ncclResult_t agoq_coll_dev_copy_out(agoq_coll_comm* g, agoq_coll_req* r, bool* queued) {
  *queued = false;
  if (r->ring_id < 0) return ncclSuccess;
  pthread_mutex_lock(&g->gpu_mu);
  uint64_t h2d0 = agoq_gpu_link_stats_get(g->gpu)->h2d_bytes;
  ncclResult_t res = agoq_dev_copy_out_locked(g, r, queued);
  uint64_t h2d = agoq_gpu_link_stats_get(g->gpu)->h2d_bytes - h2d0;
  pthread_mutex_unlock(&g->gpu_mu);
  if (g->st != NULL && h2d > 0) agoq_stats_add(&g->st->path[agoq_dev_path(r)].pcie_h2d, h2d);
  return res;
}

ncclResult_t agoq_coll_dev_copied(agoq_coll_comm* g, agoq_coll_req* r, bool* done) {
  pthread_mutex_lock(&g->gpu_mu);
  ncclResult_t res = agoq_gpu_poll(g->gpu, agoq_dev_slot(g, r), done);
  if (res == ncclSuccess && *done && r->pieces_out) {
    /* A bounced result: the next piece, until none is left. */
    bool queued = false;
    agoq_dev_piece_landed(r, false);
    res = agoq_dev_piece_queue(g, r, false, &queued);
    if (queued && g->st != NULL) agoq_stats_add(&g->st->path[agoq_dev_path(r)].pcie_h2d, r->piece_len);
    r->pieces_out = queued;
    *done = res == ncclSuccess && !queued;
  }
  pthread_mutex_unlock(&g->gpu_mu);
  return res;
}

void agoq_coll_dev_release(agoq_coll_comm* g, agoq_coll_req* r) {
  if (r->ring_id < 0) return;
  /* A failed request's copy may still run: only a failed group leaves one, and a failed
   * group stages nothing again (every later call fails), so its staging is not reused. A
   * bounce buffer a copy may still touch is kept (agoq_coll_pool_fini frees it, after the
   * link's destruction). */
  pthread_mutex_lock(&g->gpu_mu);
  agoq_gpu_ring_put(agoq_gpu_link_ring(g->gpu), r->ring_id);
  if (r->bounce != NULL && !r->pieces_in && !r->pieces_out) {
    agoq_net_dereg_host(r->bounce_key);
    r->bounce_key = NULL;
    free(r->bounce);
    r->bounce = NULL;
    g->bounce_reqs--;
  }
  pthread_mutex_unlock(&g->gpu_mu);
  r->ring_id = -1;
}

void agoq_coll_gpu_unregister(agoq_coll_comm* g) {
  for (int i = 0; i < 2; i++) {
    agoq_net_dereg_host(g->gpu_keys[i]);
    g->gpu_keys[i] = NULL;
  }
}

void agoq_coll_dev_close(agoq_coll_comm* g) {
  agoq_coll_gpu_unregister(g);
  pthread_mutex_lock(&g->gpu_mu);
  agoq_gpu_link* l = g->gpu;
  g->gpu = NULL;
  pthread_mutex_unlock(&g->gpu_mu);
  if (l == NULL) return;
  const agoq_gpu_link_stats* st = agoq_gpu_link_stats_get(l);
  AGOQ_INFO(NCCL_NET, "CollNet rank %d: device path copied %llu bytes D2H in %llu copies, %llu bytes H2D in %llu copies",
            g->rank, (unsigned long long)st->d2h_bytes, (unsigned long long)st->d2h_copies,
            (unsigned long long)st->h2d_bytes, (unsigned long long)st->h2d_copies);
  agoq_gpu_link_destroy(l); /* waits for work still queued: it touches the staging and the GPU path's memory */
  agoq_coll_gpu_release(g);
}
