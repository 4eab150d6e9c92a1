/* One connection's device resources (agoq_gpu.h): created at setup, used by the data path
 * only to queue copies on the link's stream and to query its events. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"
#include "gpu/agoq_gpu.h"
#include "agoq_codec_cuda.h"
#include "gpu/agoq_gpu_internal.h"

/* Ring entries per event slot: a request takes one piece (a grouped receive one for all its
 * buffers); the spare ones keep a request tested late from exhausting the table. */
enum { AGOQ_GPU_RING_ENTRIES_PER_SLOT = 8 };

/* Memory the link's owner allocated through it: freed with the link. */
typedef struct agoq_gpu_link_mem {
  void* p;
  size_t size;
  bool device;
  struct agoq_gpu_link_mem* next;
} agoq_gpu_link_mem;

struct agoq_gpu_link {
  int device;
  void* ctx; /* the CUDA context it was made in (NULL: the driver cannot say; its device's, by cudaSetDevice) */
  cudaStream_t stream;
  cudaEvent_t* events; /* one per request slot */
  uint32_t slots;
  void* staging; /* pinned */
  agoq_gpu_ring ring;
  agoq_gpu_pool* pool; /* the GPU's pinned pool (NULL: none), joined for pool_net_dev */
  int pool_net_dev;
  void* workspace;                 /* the codec's, device memory; calls on this stream share it */
  agoq_cuda_codec_result* results; /* per slot and part, pinned: the device writes, the host reads */
  uint32_t parts;                  /* results per slot */
  agoq_gpu_link_mem* mem;          /* allocated through the link (agoq_gpu_link_alloc) */
  /* Timing events around each codec call, a ring in stream order: [thead, thead + tcount)
   * await collection; they complete in that order, as the stream runs them. */
  cudaEvent_t* tbegin;
  cudaEvent_t* tend;
  uint32_t ntimed, thead, tcount;
  uint64_t codec_ns_taken; /* of stats.codec_ns, handed to the owner (agoq_gpu_codec_ns_take) */
  agoq_gpu_link_stats stats;
  bool rdma_flush; /* the device flushes GPUDirect RDMA writes on request */
  /* Batches: slot batch_from + i has bmem[i] (its pinned and device table, its workspace)
   * and bstate[i]: AGOQ_GPU_BATCH_FREE, or taken by a batch (QUEUED), then behind a mark
   * (MARKED) until a poll sees that mark done. benc / bdec: the items as the CUDA codec
   * takes them, filled at each call (batch_items of each). */
  agoq_cuda_batch_mem* bmem;
  uint8_t* bstate;
  uint32_t batch_from, batch_items;
  size_t batch_pinned; /* bytes of the pinned tables */
  agoq_cuda_encode_item* benc;
  agoq_cuda_decode_item* bdec;
  agoq_cuda_sum_group* bsum; /* a sum batch's groups (at most batch_items) */
};

enum { AGOQ_GPU_BATCH_FREE = 0, AGOQ_GPU_BATCH_QUEUED = 1, AGOQ_GPU_BATCH_MARKED = 2 };

/* Where a link's calls run. A stream, an event and a loaded kernel belong to the CUDA
 * context that made them: NCCL's proxy threads run in their device's primary context, or,
 * with NCCL_CREATE_THREAD_CONTEXT=1 (NCCL 2.28.9), in a private one they share; another
 * caller (CollNet's engine thread, a test) may be bound to another context or device, or to
 * none. So every call of a link enters the context it was made in (the driver's
 * cuCtxSetCurrent; cudaSetDevice would enter the primary one) and leaves the caller's
 * current context as it found it. A link's setup enters its device: the caller's context
 * where it is on that device (a private one stays), else the device's primary one. Where
 * the driver lacks the context calls, the device is entered and left by cudaSetDevice. */
typedef struct {
  void* prev_ctx;
  int prev_dev;
  bool restore_ctx, restore_dev;
} agoq_gpu_scope;

/* Enters ctx, or (NULL) `device` by the runtime. */
static ncclResult_t agoq_gpu_scope_enter(int device, void* ctx, agoq_gpu_scope* sc) {
  ncclResult_t res = ncclSuccess;
  *sc = (agoq_gpu_scope){.prev_dev = -1};
  bool ctx_api = agoq_gpu_ctx_supported();
  if (ctx_api) sc->prev_ctx = agoq_gpu_ctx_current();
  if (ctx != NULL) {
    if (sc->prev_ctx == ctx) return ncclSuccess;
    AGOQ_CHECK(agoq_gpu_ctx_set(ctx));
    sc->restore_ctx = true;
    return ncclSuccess;
  }
  AGOQ_CUDA_CHECK_GOTO(cudaGetDevice(&sc->prev_dev), res, out);
  if (sc->prev_dev != device) {
    /* The caller's binding is put back as it was: its context where the driver says which
     * (a private one, or none), else its device. */
    if (ctx_api) sc->restore_ctx = true;
    else sc->restore_dev = true;
    AGOQ_CUDA_CHECK_GOTO(cudaSetDevice(device), res, out);
  }
out:
  return res;
}

static void agoq_gpu_scope_leave(const agoq_gpu_scope* sc) {
  if (sc->restore_ctx) (void)agoq_gpu_ctx_set(sc->prev_ctx);
  else if (sc->restore_dev)
    (void)agoq_gpu_cuda_error(cudaSetDevice(sc->prev_dev), "cudaSetDevice (the caller's device again)");
}

/* Every data-path call of a link: in its context (or on its device). */
static ncclResult_t agoq_gpu_link_enter(const agoq_gpu_link* l, agoq_gpu_scope* sc) {
  return agoq_gpu_scope_enter(l->device, l->ctx, sc);
}

/* Setup and teardown (create, alloc, destroy): also in Relaxed capture mode
 * (agoq_gpu_capture_relax), the caller's mode put back at the end. */
typedef struct {
  enum cudaStreamCaptureMode mode;
  agoq_gpu_scope scope;
} agoq_gpu_setup_scope;

static ncclResult_t agoq_gpu_setup_begin(int device, void* ctx, agoq_gpu_setup_scope* sc) {
  sc->mode = agoq_gpu_capture_relax();
  return agoq_gpu_scope_enter(device, ctx, &sc->scope);
}

static void agoq_gpu_setup_end(const agoq_gpu_setup_scope* sc) {
  agoq_gpu_scope_leave(&sc->scope);
  agoq_gpu_capture_restore(sc->mode);
}

static void agoq_gpu_link_teardown(agoq_gpu_link* l);
static ncclResult_t agoq_gpu_codec_load(int device);

/* Pinned bytes of the link's own: its ring (the staging, or its share of it) and its codec
 * results. */
static size_t agoq_gpu_link_own_pinned(const agoq_gpu_link* l) {
  return l->ring.size + (size_t)l->slots * l->parts * sizeof *l->results + l->batch_pinned;
}

/* Each batch slot's table (pinned, and its device copy) and workspace, for cfg's batches. */
static ncclResult_t agoq_gpu_batch_build(agoq_gpu_link* l, const agoq_gpu_link_config* cfg) {
  ncclResult_t res = ncclSuccess;
  if (cfg->batch_items == 0 || cfg->batch_from >= l->slots) return ncclSuccess;
  uint32_t nslots = l->slots - cfg->batch_from;
  AGOQ_CALLOC_GOTO(l->bmem, nslots, res, out);
  AGOQ_CALLOC_GOTO(l->bstate, nslots, res, out);
  AGOQ_CALLOC_GOTO(l->benc, cfg->batch_items, res, out);
  AGOQ_CALLOC_GOTO(l->bdec, cfg->batch_items, res, out);
  AGOQ_CALLOC_GOTO(l->bsum, cfg->batch_items, res, out);
  l->batch_from = cfg->batch_from;
  l->batch_items = cfg->batch_items;
  agoq_codec_params pb = {.block = cfg->batch_block};
  size_t table = agoq_cuda_batch_table_size(cfg->batch_items);
  size_t ws = agoq_cuda_batch_workspace_size(&pb, cfg->batch_items, cfg->batch_max_n);
  for (uint32_t i = 0; i < nslots; i++) {
    agoq_cuda_batch_mem* m = &l->bmem[i];
    AGOQ_CUDA_CHECK_GOTO(cudaHostAlloc(&m->table_host, table, cudaHostAllocPortable), res, out);
    m->table_cap = table;
    l->batch_pinned += table;
    AGOQ_CUDA_CHECK_GOTO(cudaMalloc(&m->table_dev, table), res, out);
    AGOQ_CUDA_CHECK_GOTO(cudaMalloc(&m->workspace, ws), res, out);
    m->workspace_cap = ws;
  }
out:
  return res; /* on failure the teardown frees what was made */
}

static void agoq_gpu_batch_teardown(agoq_gpu_link* l) {
  if (l->bmem != NULL)
    for (uint32_t i = 0; i + l->batch_from < l->slots; i++) {
      agoq_cuda_batch_mem* m = &l->bmem[i];
      if (m->table_host != NULL) (void)agoq_gpu_cuda_error(cudaFreeHost(m->table_host), "cudaFreeHost");
      if (m->table_dev != NULL) (void)agoq_gpu_cuda_error(cudaFree(m->table_dev), "cudaFree");
      if (m->workspace != NULL) (void)agoq_gpu_cuda_error(cudaFree(m->workspace), "cudaFree");
    }
  free(l->bmem);
  free(l->bstate);
  free(l->benc);
  free(l->bdec);
  free(l->bsum);
}

/* agoq_gpu_link_create's work, on `device`, in Relaxed capture mode. */
static ncclResult_t agoq_gpu_link_build(int device, const agoq_gpu_link_config* cfg, agoq_gpu_link** out) {
  ncclResult_t res = ncclSuccess;
  agoq_gpu_link* l = NULL;
  uint32_t slots = cfg->slots;
  size_t staging = cfg->staging;
  *out = NULL;
  /* Before anything of this link can launch a kernel: in the context it is made in. */
  AGOQ_CHECK(agoq_gpu_codec_load(device));
  AGOQ_CALLOC_GOTO(l, 1, res, fail);
  l->device = device;
  l->ctx = agoq_gpu_ctx_current();
  l->parts = cfg->parts > 0 ? cfg->parts : 1;
  l->ntimed = cfg->timed;
  if (l->ntimed > 0) {
    AGOQ_CALLOC_GOTO(l->tbegin, l->ntimed, res, fail);
    AGOQ_CALLOC_GOTO(l->tend, l->ntimed, res, fail);
  }
  AGOQ_CALLOC_GOTO(l->events, slots, res, fail);
  l->slots = slots;
  int least = 0, greatest = 0;
  AGOQ_CUDA_CHECK_GOTO(cudaDeviceGetStreamPriorityRange(&least, &greatest), res, fail);
  /* Non-blocking: never ordered behind the legacy default stream (or NCCL's kernels on
   * it); the greatest priority: the network waits on these copies. */
  AGOQ_CUDA_CHECK_GOTO(cudaStreamCreateWithPriority(&l->stream, cudaStreamNonBlocking, greatest), res, fail);
  for (uint32_t i = 0; i < slots; i++)
    AGOQ_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&l->events[i], cudaEventDisableTiming), res, fail);
  for (uint32_t i = 0; i < l->ntimed; i++) {
    AGOQ_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&l->tbegin[i], cudaEventDefault), res, fail);
    AGOQ_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&l->tend[i], cudaEventDefault), res, fail);
  }
  /* A NIC's writes into this device's memory can be made visible to it on request
   * (agoq_gpu_flush_rdma_writes); where they cannot, no receive goes there directly. */
  int flush_options = 0;
  if (cudaDeviceGetAttribute(&flush_options, cudaDevAttrGPUDirectRDMAFlushWritesOptions, device) == cudaSuccess)
    l->rdma_flush = (flush_options & cudaFlushGPUDirectRDMAWritesOptionHost) != 0;
  else
    (void)cudaGetLastError();
  AGOQ_CUDA_CHECK_GOTO(cudaHostAlloc(&l->staging, staging, cudaHostAllocPortable), res, fail);
  AGOQ_CUDA_CHECK_GOTO(cudaMalloc(&l->workspace, AGOQ_CUDA_CODEC_WORKSPACE_SIZE), res, fail);
  size_t nres = (size_t)slots * l->parts;
  AGOQ_CUDA_CHECK_GOTO(cudaHostAlloc((void**)&l->results, nres * sizeof *l->results, cudaHostAllocPortable), res,
                       fail);
  memset(l->results, 0, nres * sizeof *l->results);
  AGOQ_CHECK_GOTO(agoq_gpu_batch_build(l, cfg), res, fail);
  if (!agoq_gpu_ring_init(&l->ring, l->staging, staging, slots * AGOQ_GPU_RING_ENTRIES_PER_SLOT)) {
    AGOQ_WARN("out of memory creating a GPU link");
    res = ncclSystemError;
    goto fail;
  }
  l->pool_net_dev = cfg->pool_net_dev;
  if (cfg->pool.chunk > 0) {
    /* Against the pool's cap: everything the link pins, its ring and its codec results. */
    agoq_gpu_pool_config pc = cfg->pool;
    pc.share = agoq_gpu_link_own_pinned(l);
    AGOQ_CHECK_GOTO(agoq_gpu_pool_join(device, cfg->pool_net_dev, &pc, cfg->pool_ops, &l->pool), res, fail);
  }
  *out = l;
  return ncclSuccess;
fail:
  agoq_gpu_link_teardown(l);
  return res;
}

ncclResult_t agoq_gpu_link_create(int device, const agoq_gpu_link_config* cfg, agoq_gpu_link** out) {
  agoq_gpu_setup_scope sc;
  *out = NULL;
  ncclResult_t res = agoq_gpu_setup_begin(device, NULL, &sc);
  if (res == ncclSuccess) res = agoq_gpu_link_build(device, cfg, out);
  agoq_gpu_setup_end(&sc);
  return res;
}

bool agoq_gpu_link_rdma_flush(const agoq_gpu_link* l) { return l != NULL && l->rdma_flush; }

ncclResult_t agoq_gpu_flush_rdma_writes(agoq_gpu_link* l) {
  ncclResult_t res = ncclSuccess;
  agoq_gpu_scope sc = {0};
  AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l, &sc), res, out);
  AGOQ_CUDA_CHECK_GOTO(cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                                          cudaFlushGPUDirectRDMAWritesToOwner),
                       res, out);
out:
  agoq_gpu_scope_leave(&sc);
  return res;
}

void agoq_gpu_link_quiesce(agoq_gpu_link* l) {
  if (l == NULL || l->stream == NULL) return;
  agoq_gpu_setup_scope sc;
  (void)agoq_gpu_setup_begin(l->device, l->ctx, &sc);
  (void)agoq_gpu_cuda_error(cudaStreamSynchronize(l->stream), "cudaStreamSynchronize");
  agoq_gpu_setup_end(&sc);
}

void agoq_gpu_link_destroy(agoq_gpu_link* l) {
  if (l == NULL) return;
  agoq_gpu_setup_scope sc;
  (void)agoq_gpu_setup_begin(l->device, l->ctx, &sc);
  agoq_gpu_link_teardown(l);
  agoq_gpu_setup_end(&sc);
}

/* agoq_gpu_link_destroy's work, on the link's device, in Relaxed capture mode. */
static void agoq_gpu_link_teardown(agoq_gpu_link* l) {
  if (l == NULL) return;
  /* Copies still queued read or write the staging: they finish before it is freed. Close
   * is the one place the plugin waits for the device. */
  if (l->stream != NULL) (void)agoq_gpu_cuda_error(cudaStreamSynchronize(l->stream), "cudaStreamSynchronize");
  if (l->events != NULL)
    for (uint32_t i = 0; i < l->slots; i++)
      if (l->events[i] != NULL) (void)agoq_gpu_cuda_error(cudaEventDestroy(l->events[i]), "cudaEventDestroy");
  for (uint32_t i = 0; i < l->ntimed; i++) {
    if (l->tbegin != NULL && l->tbegin[i] != NULL) (void)agoq_gpu_cuda_error(cudaEventDestroy(l->tbegin[i]), "cudaEventDestroy");
    if (l->tend != NULL && l->tend[i] != NULL) (void)agoq_gpu_cuda_error(cudaEventDestroy(l->tend[i]), "cudaEventDestroy");
  }
  if (l->stream != NULL) (void)agoq_gpu_cuda_error(cudaStreamDestroy(l->stream), "cudaStreamDestroy");
  agoq_gpu_pool_leave(l->pool, l->pool_net_dev, agoq_gpu_link_own_pinned(l)); /* the last frees the chunks */
  if (l->staging != NULL) (void)agoq_gpu_cuda_error(cudaFreeHost(l->staging), "cudaFreeHost");
  if (l->results != NULL) (void)agoq_gpu_cuda_error(cudaFreeHost(l->results), "cudaFreeHost");
  if (l->workspace != NULL) (void)agoq_gpu_cuda_error(cudaFree(l->workspace), "cudaFree");
  agoq_gpu_batch_teardown(l);
  while (l->mem != NULL) {
    agoq_gpu_link_mem* m = l->mem;
    l->mem = m->next;
    (void)agoq_gpu_cuda_error(m->device ? cudaFree(m->p) : cudaFreeHost(m->p), m->device ? "cudaFree" : "cudaFreeHost");
    free(m);
  }
  agoq_gpu_ring_fini(&l->ring);
  free(l->events);
  free(l->tbegin);
  free(l->tend);
  free(l);
}

int agoq_gpu_link_device(const agoq_gpu_link* l) { return l->device; }
agoq_gpu_ring* agoq_gpu_link_ring(agoq_gpu_link* l) { return &l->ring; }
agoq_gpu_pool* agoq_gpu_link_pool(agoq_gpu_link* l) { return l->pool; }
const agoq_gpu_link_stats* agoq_gpu_link_stats_get(const agoq_gpu_link* l) { return &l->stats; }

ncclResult_t agoq_gpu_link_alloc(agoq_gpu_link* l, bool device, size_t size, void** p) {
  ncclResult_t res = ncclSuccess;
  agoq_gpu_link_mem* m = NULL;
  agoq_gpu_setup_scope sc;
  *p = NULL;
  AGOQ_CHECK_GOTO(agoq_gpu_setup_begin(l->device, l->ctx, &sc), res, fail);
  AGOQ_CALLOC_GOTO(m, 1, res, fail);
  m->device = device;
  m->size = size > 0 ? size : 1;
  if (device) AGOQ_CUDA_CHECK_GOTO(cudaMalloc(&m->p, m->size), res, fail);
  else AGOQ_CUDA_CHECK_GOTO(cudaHostAlloc(&m->p, m->size, cudaHostAllocPortable), res, fail);
  m->next = l->mem;
  l->mem = m;
  *p = m->p;
  agoq_gpu_setup_end(&sc);
  return ncclSuccess;
fail:
  free(m);
  agoq_gpu_setup_end(&sc);
  return res;
}

/* [p, p + size) lies in pinned memory of the link (staging or its own): the device reading
 * or writing it crosses PCIe. */
static bool agoq_gpu_link_pinned(const agoq_gpu_link* l, const void* p, size_t size) {
  const uint8_t* a = p;
  const uint8_t* lo = l->staging;
  if (a >= lo && a <= lo + l->ring.size && size <= (size_t)(lo + l->ring.size - a)) return true;
  if (agoq_gpu_pool_contains(l->pool, p, size)) return true;
  for (const agoq_gpu_link_mem* m = l->mem; m != NULL; m = m->next) {
    lo = m->p;
    if (!m->device && a >= lo && a <= lo + m->size && size <= (size_t)(lo + m->size - a)) return true;
  }
  return false;
}

static ncclResult_t agoq_gpu_copy(agoq_gpu_link* l, void* dst, const void* src, size_t size, enum cudaMemcpyKind kind,
                                  uint64_t* bytes, uint64_t* copies) {
  ncclResult_t res = ncclSuccess;
  if (size == 0) return ncclSuccess;
  agoq_gpu_scope sc = {0};
  AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l, &sc), res, out);
  AGOQ_CUDA_CHECK_GOTO(cudaMemcpyAsync(dst, src, size, kind, l->stream), res, out);
  *bytes += size;
  (*copies)++;
out:
  agoq_gpu_scope_leave(&sc);
  return res;
}

ncclResult_t agoq_gpu_copy_d2h(agoq_gpu_link* l, void* host, const void* dev, size_t size) {
  return agoq_gpu_copy(l, host, dev, size, cudaMemcpyDeviceToHost, &l->stats.d2h_bytes, &l->stats.d2h_copies);
}

ncclResult_t agoq_gpu_copy_h2d(agoq_gpu_link* l, void* dev, const void* host, size_t size) {
  return agoq_gpu_copy(l, dev, host, size, cudaMemcpyHostToDevice, &l->stats.h2d_bytes, &l->stats.h2d_copies);
}

/* LL128's line: 120 bytes of data, then the 8-byte flag word NCCL's kernel polls. */
#define AGOQ_LL128_LINE 128u
#define AGOQ_LL128_FLAG_OFF 120u

/* Queues the part of [x, y), inside one 128-byte line, that is data (flags false) or flag. */
static ncclResult_t agoq_gpu_copy_line_part(agoq_gpu_link* l, uintptr_t x, uintptr_t y, const uint8_t* src,
                                            uintptr_t base, bool flags) {
  uintptr_t flag = x / AGOQ_LL128_LINE * AGOQ_LL128_LINE + AGOQ_LL128_FLAG_OFF;
  uintptr_t lo = flags ? (x > flag ? x : flag) : x, hi = flags ? y : (y < flag ? y : flag);
  ncclResult_t res = ncclSuccess;
  if (hi <= lo) return ncclSuccess;
  AGOQ_CUDA_CHECK_GOTO(cudaMemcpyAsync((void*)lo, src + (lo - base), hi - lo, cudaMemcpyHostToDevice, l->stream), res,
                       out);
  l->stats.h2d_copies++;
out:
  return res;
}

ncclResult_t agoq_gpu_copy_h2d_flags_last(agoq_gpu_link* l, void* dev, const void* host, size_t size) {
  ncclResult_t res = ncclSuccess;
  if (size == 0) return ncclSuccess;
  const uint8_t* src = host;
  uintptr_t a = (uintptr_t)dev, e = a + size;
  uintptr_t l0 = (a + AGOQ_LL128_LINE - 1) / AGOQ_LL128_LINE * AGOQ_LL128_LINE;
  uintptr_t l1 = e / AGOQ_LL128_LINE * AGOQ_LL128_LINE;
  /* A head before the first whole line, whole lines [l0, l1), a tail after them; a range
   * inside one line is all head. */
  uintptr_t head_end = l0 < e ? l0 : e;
  bool whole = l1 > l0;
  uintptr_t tail = whole ? l1 : head_end;
  agoq_gpu_scope sc = {0};
  AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l, &sc), res, out);
  for (int flags = 0; flags < 2; flags++) {
    AGOQ_CHECK_GOTO(agoq_gpu_copy_line_part(l, a, head_end, src, a, flags), res, out);
    if (whole) {
      size_t off = flags ? AGOQ_LL128_FLAG_OFF : 0, width = flags ? AGOQ_LL128_LINE - AGOQ_LL128_FLAG_OFF
                                                                  : AGOQ_LL128_FLAG_OFF;
      AGOQ_CUDA_CHECK_GOTO(cudaMemcpy2DAsync((void*)(l0 + off), AGOQ_LL128_LINE, src + (l0 - a) + off, AGOQ_LL128_LINE,
                                             width, (l1 - l0) / AGOQ_LL128_LINE, cudaMemcpyHostToDevice, l->stream),
                           res, out);
      l->stats.h2d_copies++;
    }
    if (tail < e) AGOQ_CHECK_GOTO(agoq_gpu_copy_line_part(l, tail, e, src, a, flags), res, out);
  }
  l->stats.h2d_bytes += size;
out:
  agoq_gpu_scope_leave(&sc);
  return res;
}

static ncclResult_t agoq_gpu_slot_ok(const agoq_gpu_link* l, uint32_t slot, int part) {
  if (slot < l->slots && part >= 0 && (uint32_t)part < l->parts) return ncclSuccess;
  AGOQ_WARN("GPU link: result %u/%d out of range (%u slots of %u)", slot, part, l->slots, l->parts);
  return ncclInternalError;
}

static agoq_cuda_codec_result* agoq_gpu_result(const agoq_gpu_link* l, uint32_t slot, int part) {
  return &l->results[(size_t)slot * l->parts + (size_t)part];
}

ncclResult_t agoq_gpu_mark(agoq_gpu_link* l, uint32_t slot) {
  ncclResult_t res = ncclSuccess;
  AGOQ_CHECK(agoq_gpu_slot_ok(l, slot, 0));
  agoq_gpu_scope sc = {0};
  AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l, &sc), res, out);
  AGOQ_CUDA_CHECK_GOTO(cudaEventRecord(l->events[slot], l->stream), res, out);
  /* A batch queued before this mark: its table and workspace are free once the mark is. */
  if (l->bstate != NULL && slot >= l->batch_from && l->bstate[slot - l->batch_from] == AGOQ_GPU_BATCH_QUEUED)
    l->bstate[slot - l->batch_from] = AGOQ_GPU_BATCH_MARKED;
out:
  agoq_gpu_scope_leave(&sc);
  return res;
}

/* ---- GPU time of the codec calls ---------------------------------------------------------- */

/* Before a codec call's launches: the next timing pair's begin, or none (the call goes
 * untimed) while every pair awaits collection. Returns the pair, or -1. A failed record
 * only loses the figure: the statistics never fail the data path. */
static int agoq_gpu_time_begin(agoq_gpu_link* l) {
  if (l->tcount == l->ntimed) {
    l->stats.untimed++;
    return -1;
  }
  uint32_t i = (l->thead + l->tcount) % l->ntimed;
  if (cudaEventRecord(l->tbegin[i], l->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    l->stats.untimed++;
    return -1;
  }
  return (int)i;
}

/* After the launches: the pair's end; it now awaits collection. */
static void agoq_gpu_time_end(agoq_gpu_link* l, int pair) {
  if (pair < 0) return;
  if (cudaEventRecord(l->tend[pair], l->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    l->stats.untimed++;
    return;
  }
  l->tcount++;
}

/* The GPU time of every bracketed call that has completed, oldest first; never waits. */
static void agoq_gpu_time_collect(agoq_gpu_link* l) {
  while (l->tcount > 0) {
    uint32_t i = l->thead;
    cudaError_t e = cudaEventQuery(l->tend[i]);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return;
    }
    float ms = 0;
    if (e == cudaSuccess && cudaEventElapsedTime(&ms, l->tbegin[i], l->tend[i]) == cudaSuccess && ms > 0)
      l->stats.codec_ns += (uint64_t)((double)ms * 1e6);
    else if (e != cudaSuccess || ms < 0)
      l->stats.untimed++;
    (void)cudaGetLastError();
    l->thead = (l->thead + 1) % l->ntimed;
    l->tcount--;
  }
}

uint64_t agoq_gpu_codec_ns_take(agoq_gpu_link* l) {
  uint64_t v = l->stats.codec_ns - l->codec_ns_taken;
  l->codec_ns_taken = l->stats.codec_ns;
  return v;
}

ncclResult_t agoq_gpu_poll(agoq_gpu_link* l, uint32_t slot, bool* done) {
  *done = false;
  AGOQ_CHECK(agoq_gpu_slot_ok(l, slot, 0));
  /* cudaEventQuery needs no current device, but its event's context may have to be
   * current (a private one's: undocumented); only the context is entered. */
  agoq_gpu_scope sc = {0};
  ncclResult_t res = ncclSuccess;
  if (l->ctx != NULL) AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l, &sc), res, out);
  cudaError_t e = cudaEventQuery(l->events[slot]);
  if (e != cudaSuccess && e != cudaErrorNotReady) {
    res = agoq_gpu_cuda_error(e, "cudaEventQuery");
    goto out;
  }
  (void)cudaGetLastError();
  *done = e == cudaSuccess;
  /* Done: every codec call queued before the mark is complete, its time there to collect,
   * and a batch behind the mark has released its table and workspace. */
  agoq_gpu_time_collect(l);
  if (*done && l->bstate != NULL && slot >= l->batch_from && l->bstate[slot - l->batch_from] == AGOQ_GPU_BATCH_MARKED)
    l->bstate[slot - l->batch_from] = AGOQ_GPU_BATCH_FREE;
out:
  agoq_gpu_scope_leave(&sc);
  return res;
}

/* ---- the codec --------------------------------------------------------------------------- */

static ncclResult_t agoq_gpu_codec_check(int rc, const char* what) {
  if (rc == AGOQ_CODEC_OK) return ncclSuccess;
  if (rc == AGOQ_CUDA_CODEC_ECUDA) {
    AGOQ_WARN("%s: a CUDA call failed: %s (%d)", what, agoq_cuda_codec_last_error_string(),
              agoq_cuda_codec_last_error());
    return ncclUnhandledCudaError;
  }
  AGOQ_WARN("%s refused: %s", what, agoq_codec_status_str((agoq_codec_status)rc));
  return ncclInternalError;
}

/* One call of the CUDA codec on the link's stream (agoq_gpu_codec_run). */
typedef enum {
  AGOQ_GPU_OP_ENCODE,            /* in: n elements of p's type; out: their frame, at most cap bytes */
  AGOQ_GPU_OP_DECODE,            /* in: a body of in_len bytes; out: its n elements as dtype */
  AGOQ_GPU_OP_OVERFLOW_TO_INF,   /* out: n fp32 sums, Inf beyond dtype's finite range */
  AGOQ_GPU_OP_NARROW,            /* in: n fp32 sums; out: rounded to dtype */
  AGOQ_GPU_OP_ENCODE_BATCH,      /* enc: k items (AGOQ_GPU_OP_ENCODE each) */
  AGOQ_GPU_OP_DECODE_BATCH,      /* dec: k items (AGOQ_GPU_OP_DECODE each into dtype) */
  AGOQ_GPU_OP_DECODE_SUM,        /* dec: k items, ngroups sums of k / ngroups in item order (groups) */
} agoq_gpu_op_kind;

typedef struct {
  agoq_gpu_op_kind kind;
  const agoq_codec_params* p;
  const void* in;
  size_t in_len;
  size_t n;
  agoq_dtype dtype;
  void* out;
  size_t cap;
  size_t k; /* batches: items, results in parts [part, part + k) */
  const agoq_gpu_encode_item* enc;
  const agoq_gpu_decode_item* dec;
  const agoq_gpu_sum_group* groups; /* AGOQ_GPU_OP_DECODE_SUM */
  size_t ngroups;
  const agoq_cuda_batch_mem* mem; /* batches: the slot's table and workspace */
} agoq_gpu_op;

static bool agoq_gpu_op_batch(agoq_gpu_op_kind kind) {
  return kind == AGOQ_GPU_OP_ENCODE_BATCH || kind == AGOQ_GPU_OP_DECODE_BATCH || kind == AGOQ_GPU_OP_DECODE_SUM;
}

/* The encode and the decodes write a codec result (the slot's part) and count in the link's
 * statistics; overflow to Inf and narrowing do neither. */
static bool agoq_gpu_op_has_result(agoq_gpu_op_kind kind) {
  return kind == AGOQ_GPU_OP_ENCODE || kind == AGOQ_GPU_OP_DECODE ||
         agoq_gpu_op_batch(kind);
}

/* A batch's items as the CUDA codec takes them (the link's own arrays: nothing allocated). */
static void agoq_gpu_batch_items(agoq_gpu_link* l, const agoq_gpu_op* op) {
  for (size_t i = 0; i < op->k; i++) {
    if (op->enc != NULL)
      l->benc[i] = (agoq_cuda_encode_item){
          .src = op->enc[i].src, .n = op->enc[i].n, .frame = op->enc[i].frame, .cap = op->enc[i].cap};
    else
      l->bdec[i] = (agoq_cuda_decode_item){
          .body = op->dec[i].body, .body_len = op->dec[i].body_len, .n = op->dec[i].n, .dst = op->dec[i].dst};
  }
  for (size_t i = 0; i < op->ngroups; i++) l->bsum[i] = (agoq_cuda_sum_group){.n = op->groups[i].n, .acc = op->groups[i].acc};
}

/* Whether slot may take a batch of k items now; says why not. */
static ncclResult_t agoq_gpu_batch_ok(const agoq_gpu_link* l, uint32_t slot, int part, size_t k) {
  if (l->bstate == NULL) {
    AGOQ_WARN("GPU link: a batch on slot %u of a link made without batch memory: internal error", slot);
    return ncclInternalError;
  }
  if (slot < l->batch_from || slot >= l->slots || k == 0 || k > l->batch_items || part < 0 ||
      (size_t)part + k > l->parts) {
    AGOQ_WARN("GPU link: a batch of %zu items on slot %u (results from %d) is outside what the link holds (batch "
              "slots %u to %u, up to %u items, %u results per slot): internal error",
              k, slot, part, l->batch_from, l->slots - 1, l->batch_items, l->parts);
    return ncclInternalError;
  }
  if (l->bstate[slot - l->batch_from] != AGOQ_GPU_BATCH_FREE) {
    AGOQ_WARN("GPU link: a batch on slot %u while the slot's last batch may still read its table (no mark after "
              "it seen done): internal error", slot);
    return ncclInternalError;
  }
  return ncclSuccess;
}

/* Queues op on the link's stream between a timing pair (agoq_gpu_time_begin); r: its result. */
static ncclResult_t agoq_gpu_op_launch(agoq_gpu_link* l, const agoq_gpu_op* op, agoq_cuda_codec_result* r) {
  int rc = AGOQ_CODEC_EARG;
  const char* what = "GPU codec";
  int pair = agoq_gpu_time_begin(l);
  switch (op->kind) {
    case AGOQ_GPU_OP_ENCODE:
      rc = agoq_cuda_frame_encode(op->p, op->in, op->n, op->out, op->cap, l->workspace, r, l->stream);
      what = "GPU frame encode";
      break;
    case AGOQ_GPU_OP_DECODE:
      rc = agoq_cuda_dequantize(op->p, op->in, op->in_len, op->n, op->dtype, op->out, l->workspace, r, l->stream);
      what = "GPU decode";
      break;
    case AGOQ_GPU_OP_OVERFLOW_TO_INF:
      rc = agoq_cuda_overflow_to_inf(op->dtype, op->out, op->n, l->stream);
      what = "GPU overflow to Inf";
      break;
    case AGOQ_GPU_OP_NARROW:
      rc = agoq_cuda_narrow_fp32(op->dtype, op->in, op->n, op->out, l->stream);
      what = "GPU narrowing";
      break;
    case AGOQ_GPU_OP_ENCODE_BATCH:
    case AGOQ_GPU_OP_DECODE_BATCH:
    case AGOQ_GPU_OP_DECODE_SUM: {
      /* r: the batch's first result. */
      const agoq_cuda_batch_mem* m = op->mem;
      agoq_gpu_batch_items(l, op);
      if (op->kind == AGOQ_GPU_OP_ENCODE_BATCH) {
        rc = agoq_cuda_frame_encode_batch(op->p, l->benc, op->k, m, r, l->stream);
        what = "GPU batched frame encode";
      } else if (op->kind == AGOQ_GPU_OP_DECODE_BATCH) {
        rc = agoq_cuda_dequantize_batch(op->p, l->bdec, op->k, op->dtype, m, r, l->stream);
        what = "GPU batched decode";
      } else {
        rc = agoq_cuda_dequantize_sums(op->p, l->bdec, op->k / op->ngroups, l->bsum, op->ngroups, m, r, l->stream);
        what = "GPU batched sum";
      }
      break;
    }
  }
  ncclResult_t res = agoq_gpu_codec_check(rc, what);
  agoq_gpu_time_end(l, pair);
  return res;
}

/* Every codec call of the data path: the slot's part checked and its result cleared, the
 * device entered, op queued (timed), then the link's statistics. */
static ncclResult_t agoq_gpu_codec_run(agoq_gpu_link* l, uint32_t slot, int part, const agoq_gpu_op* op) {
  bool with_result = agoq_gpu_op_has_result(op->kind), batch = agoq_gpu_op_batch(op->kind);
  agoq_cuda_codec_result* r = NULL;
  if (batch) AGOQ_CHECK(agoq_gpu_batch_ok(l, slot, part, op->k));
  else if (with_result) AGOQ_CHECK(agoq_gpu_slot_ok(l, slot, part));
  agoq_gpu_scope sc = {0};
  ncclResult_t res = agoq_gpu_link_enter(l, &sc);
  if (res != ncclSuccess) {
    agoq_gpu_scope_leave(&sc);
    return res;
  }
  size_t nres = batch ? op->k : 1;
  if (with_result) {
    r = agoq_gpu_result(l, slot, part);
    memset(r, 0, nres * sizeof *r);
  }
  agoq_gpu_op bop;
  if (batch) {
    bop = *op;
    bop.mem = &l->bmem[slot - l->batch_from];
    op = &bop;
  }
  res = agoq_gpu_op_launch(l, op, r);
  agoq_gpu_scope_leave(&sc);
  if (res == ncclSuccess) l->stats.codec_calls++;
  if (!with_result) return res; /* overflow to Inf and narrowing: their failure untraced, as always */
  AGOQ_CHECK(res);
  if (batch) l->bstate[slot - l->batch_from] = AGOQ_GPU_BATCH_QUEUED;
  if (op->kind == AGOQ_GPU_OP_ENCODE || op->kind == AGOQ_GPU_OP_ENCODE_BATCH) {
    l->stats.encodes += nres;
    return ncclSuccess;
  }
  l->stats.decodes += nres;
  if (!batch) {
    if (agoq_gpu_link_pinned(l, op->in, op->in_len)) l->stats.decoded_bytes += op->in_len;
    return ncclSuccess;
  }
  for (size_t i = 0; i < op->k; i++)
    if (agoq_gpu_link_pinned(l, op->dec[i].body, op->dec[i].body_len)) l->stats.decoded_bytes += op->dec[i].body_len;
  return ncclSuccess;
}

ncclResult_t agoq_gpu_frame_encode(agoq_gpu_link* l, uint32_t slot, int part, const agoq_codec_params* p,
                                   const void* src, size_t n, void* frame, size_t cap) {
  agoq_gpu_op op = {.kind = AGOQ_GPU_OP_ENCODE, .p = p, .in = src, .n = n, .out = frame, .cap = cap};
  return agoq_gpu_codec_run(l, slot, part, &op);
}

ncclResult_t agoq_gpu_dequantize(agoq_gpu_link* l, uint32_t slot, int part, const agoq_codec_params* p,
                                 const void* body, size_t body_len, size_t n, agoq_dtype out, void* dst) {
  agoq_gpu_op op = {
      .kind = AGOQ_GPU_OP_DECODE, .p = p, .in = body, .in_len = body_len, .n = n, .dtype = out, .out = dst};
  return agoq_gpu_codec_run(l, slot, part, &op);
}

ncclResult_t agoq_gpu_frame_encode_batch(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                         const agoq_gpu_encode_item* items, size_t k) {
  agoq_gpu_op op = {.kind = AGOQ_GPU_OP_ENCODE_BATCH, .p = p, .k = k, .enc = items};
  return agoq_gpu_codec_run(l, slot, part0, &op);
}

ncclResult_t agoq_gpu_dequantize_batch(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                       const agoq_gpu_decode_item* items, size_t k, agoq_dtype out) {
  agoq_gpu_op op = {.kind = AGOQ_GPU_OP_DECODE_BATCH, .p = p, .k = k, .dec = items, .dtype = out};
  return agoq_gpu_codec_run(l, slot, part0, &op);
}

ncclResult_t agoq_gpu_dequantize_sums(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                      const agoq_gpu_decode_item* items, size_t k, const agoq_gpu_sum_group* groups,
                                      size_t ngroups) {
  if (k == 0 || ngroups == 0 || ngroups > SIZE_MAX / k) {
    AGOQ_WARN("GPU link: %zu sums of %zu items each: internal error", ngroups, k);
    return ncclInternalError;
  }
  agoq_gpu_op op = {
      .kind = AGOQ_GPU_OP_DECODE_SUM, .p = p, .k = k * ngroups, .dec = items, .groups = groups, .ngroups = ngroups};
  return agoq_gpu_codec_run(l, slot, part0, &op);
}

ncclResult_t agoq_gpu_dequantize_sum(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                     const agoq_gpu_decode_item* items, size_t k, size_t n, float* acc) {
  agoq_gpu_sum_group one = {.n = n, .acc = acc};
  return agoq_gpu_dequantize_sums(l, slot, part0, p, items, k, &one, 1);
}

ncclResult_t agoq_gpu_overflow_to_inf(agoq_gpu_link* l, agoq_dtype out, float* acc, size_t n) {
  agoq_gpu_op op = {.kind = AGOQ_GPU_OP_OVERFLOW_TO_INF, .n = n, .dtype = out, .out = acc};
  return agoq_gpu_codec_run(l, 0, 0, &op);
}

ncclResult_t agoq_gpu_narrow(agoq_gpu_link* l, agoq_dtype out, const float* acc, size_t n, void* dst) {
  agoq_gpu_op op = {.kind = AGOQ_GPU_OP_NARROW, .in = acc, .n = n, .dtype = out, .out = dst};
  return agoq_gpu_codec_run(l, 0, 0, &op);
}

void agoq_gpu_codec_result(const agoq_gpu_link* l, uint32_t slot, int part, uint32_t* status, uint64_t* body_len) {
  bool ok = slot < l->slots && part >= 0 && (uint32_t)part < l->parts;
  const agoq_cuda_codec_result* r = agoq_gpu_result(l, ok ? slot : 0, ok ? part : 0);
  *status = r->status;
  if (body_len != NULL) *body_len = r->body_len;
}

void agoq_gpu_note_encoded(agoq_gpu_link* l, uint64_t frame_bytes) { l->stats.encoded_bytes += frame_bytes; }

/* Lazy loading is per context: a kernel loaded in one is not loaded in another (another
 * GPU's, or a private context on the same GPU: NCCL_CREATE_THREAD_CONTEXT=1). So every link
 * loads the codec in the context it is made in, whoever got there first: cudaFuncGetAttributes
 * of a kernel already loaded costs little beside a link's allocations, and a cache keyed by
 * context could be fooled by a destroyed context's handle reused for a new one (NCCL makes
 * one per communicator). Said at INFO once per device; the devices past the bitmap say it
 * every time. This replaces a warm-up that launched some kernels on zeros: it never launched
 * the escaped-block decode (a block with NaN or Inf) nor the NONE decode, warmed only the
 * formats and block sizes of the links made so far, and only once per process. */
enum { AGOQ_GPU_LOAD_DEVICES = 256 };
static pthread_mutex_t agoq_gpu_load_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t agoq_gpu_load_said[AGOQ_GPU_LOAD_DEVICES / 64];

static ncclResult_t agoq_gpu_codec_load(int device) {
  size_t loaded = 0;
  const char* failed = NULL;
  if (agoq_cuda_codec_load_all(&loaded, &failed) != AGOQ_CODEC_OK) {
    AGOQ_WARN("GPU %d: loading the CUDA codec's kernel %s failed: %s (%d); no codec kernel may be left to load "
              "at its first launch (CUDA's lazy loading could then wait for NCCL's kernel)",
              device, failed != NULL ? failed : "?", agoq_cuda_codec_last_error_string(),
              agoq_cuda_codec_last_error());
    (void)cudaGetLastError();
    return ncclUnhandledCudaError;
  }
  bool known = device >= 0 && device < AGOQ_GPU_LOAD_DEVICES;
  const uint64_t bit = known ? 1ull << (device % 64) : 0;
  pthread_mutex_lock(&agoq_gpu_load_mu);
  bool say = !known || (agoq_gpu_load_said[device / 64] & bit) == 0;
  if (known) agoq_gpu_load_said[device / 64] |= bit;
  pthread_mutex_unlock(&agoq_gpu_load_mu);
  if (say)
    AGOQ_INFO(NCCL_INIT, "GPU %d: the CUDA codec's %zu kernels loaded (cudaFuncGetAttributes) in each link's CUDA "
              "context at its setup, none launched", device, loaded);
  return ncclSuccess;
}
