/* Pinned memory shared by one GPU's links (agoq_gpu_pool.h). */
#include "gpu/agoq_gpu_pool.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"
#include "core/agoq_log.h"
#include "gpu/agoq_gpu_heap.h"
#include "gpu/agoq_gpu_internal.h"

enum {
  AGOQ_GPU_POOL_DEVICES = 128,   /* GPUs per process */
  AGOQ_GPU_POOL_CHUNKS = 64,     /* chunks per pool: 512 MiB at the default 8 MiB */
  AGOQ_GPU_POOL_NET_DEVS = 64,   /* NICs whose registrations a chunk keeps */
  AGOQ_GPU_POOL_EXTENTS = 1024,  /* free extents per chunk: pieces out at once, plus one */
};

typedef struct {
  uint8_t* base;
  size_t size;
  agoq_gpu_heap heap;
  void* key[AGOQ_GPU_POOL_NET_DEVS];
} agoq_gpu_pool_chunk;

struct agoq_gpu_pool {
  int device;
  agoq_gpu_pool_config cfg;
  agoq_gpu_pool_ops ops;
  /* mu guards the chunks' heaps and the count the data path reads; chunks are added and
   * registered at setup (setup_mu, below) before they are published under mu. */
  pthread_mutex_t mu;
  uint32_t nchunks;
  agoq_gpu_pool_chunk chunks[AGOQ_GPU_POOL_CHUNKS];
  uint32_t links;
  uint64_t share_bytes; /* the links' own, counted against cfg.cap */
  uint32_t dev_links[AGOQ_GPU_POOL_NET_DEVS];
  uint64_t borrows, refusals, borrowed_bytes;
};

/* Setup and teardown of every pool: joins and leaves, never the data path. */
static pthread_mutex_t agoq_gpu_pool_setup_mu = PTHREAD_MUTEX_INITIALIZER;
static agoq_gpu_pool* agoq_gpu_pools[AGOQ_GPU_POOL_DEVICES];

static bool agoq_gpu_pool_net_dev_ok(int net_dev) { return net_dev >= 0 && net_dev < AGOQ_GPU_POOL_NET_DEVS; }

/* Registers chunk c with net_dev where the transport needs it. */
static ncclResult_t agoq_gpu_pool_chunk_reg(agoq_gpu_pool* p, agoq_gpu_pool_chunk* c, int net_dev) {
  if (p->ops.reg == NULL || !agoq_gpu_pool_net_dev_ok(net_dev) || c->key[net_dev] != NULL) return ncclSuccess;
  return p->ops.reg(net_dev, c->base, c->size, &c->key[net_dev]);
}

static void agoq_gpu_pool_chunk_free(agoq_gpu_pool* p, agoq_gpu_pool_chunk* c) {
  for (int d = 0; d < AGOQ_GPU_POOL_NET_DEVS; d++)
    if (c->key[d] != NULL && p->ops.dereg != NULL) p->ops.dereg(c->key[d]);
  if (c->base != NULL) (void)agoq_gpu_cuda_error(cudaFreeHost(c->base), "cudaFreeHost (pinned pool)");
  agoq_gpu_heap_fini(&c->heap);
  memset(c, 0, sizeof *c);
}

/* A chunk more, when the pool has fewer chunks than links and the cap allows; registered with
 * every NIC one of its links is on, then published. */
static ncclResult_t agoq_gpu_pool_grow(agoq_gpu_pool* p) {
  ncclResult_t res = ncclSuccess;
  if (p->nchunks >= p->links || p->nchunks >= AGOQ_GPU_POOL_CHUNKS) return ncclSuccess;
  if ((uint64_t)(p->nchunks + 1) * p->cfg.chunk + p->share_bytes > p->cfg.cap) return ncclSuccess;
  agoq_gpu_pool_chunk c;
  memset(&c, 0, sizeof c);
  c.size = p->cfg.chunk;
  AGOQ_CUDA_CHECK_GOTO(cudaHostAlloc((void**)&c.base, c.size, cudaHostAllocPortable), res, fail);
  if (!agoq_gpu_heap_init(&c.heap, c.base, c.size, AGOQ_GPU_POOL_EXTENTS)) {
    AGOQ_WARN("out of host memory creating GPU %d's pinned pool", p->device);
    res = ncclSystemError;
    goto fail;
  }
  for (int d = 0; d < AGOQ_GPU_POOL_NET_DEVS; d++)
    if (p->dev_links[d] > 0) AGOQ_CHECK_GOTO(agoq_gpu_pool_chunk_reg(p, &c, d), res, fail);
  pthread_mutex_lock(&p->mu);
  p->chunks[p->nchunks] = c;
  p->nchunks++;
  pthread_mutex_unlock(&p->mu);
  return ncclSuccess;
fail:
  agoq_gpu_pool_chunk_free(p, &c);
  return res;
}

/* Shares grown past the cap: the last chunks go while nothing is borrowed from them (the data
 * path borrows under mu, so a chunk found whole there is no one's). */
static void agoq_gpu_pool_shrink(agoq_gpu_pool* p) {
  while (p->nchunks > 0 && (uint64_t)p->nchunks * p->cfg.chunk + p->share_bytes > p->cfg.cap) {
    agoq_gpu_pool_chunk c;
    pthread_mutex_lock(&p->mu);
    agoq_gpu_pool_chunk* last = &p->chunks[p->nchunks - 1];
    bool whole = last->heap.free_bytes == last->heap.size;
    if (whole) {
      c = *last;
      memset(last, 0, sizeof *last);
      p->nchunks--;
    }
    pthread_mutex_unlock(&p->mu);
    if (!whole) return;
    agoq_gpu_pool_chunk_free(p, &c);
  }
}

/* Its last link gone (or its first join failed): every chunk, the pool itself. Under setup_mu. */
static void agoq_gpu_pool_free(agoq_gpu_pool* p) {
  for (uint32_t i = 0; i < p->nchunks; i++) agoq_gpu_pool_chunk_free(p, &p->chunks[i]);
  pthread_mutex_destroy(&p->mu);
  agoq_gpu_pools[p->device] = NULL;
  free(p);
}

ncclResult_t agoq_gpu_pool_join(int device, int net_dev, const agoq_gpu_pool_config* cfg, const agoq_gpu_pool_ops* ops,
                                agoq_gpu_pool** out) {
  ncclResult_t res = ncclSuccess;
  *out = NULL;
  if (device < 0 || device >= AGOQ_GPU_POOL_DEVICES || cfg == NULL || cfg->chunk == 0 ||
      (net_dev >= 0 && !agoq_gpu_pool_net_dev_ok(net_dev))) {
    AGOQ_WARN("pinned pool: GPU %d, net device %d out of range", device, net_dev);
    return ncclInternalError;
  }
  pthread_mutex_lock(&agoq_gpu_pool_setup_mu);
  agoq_gpu_pool* p = agoq_gpu_pools[device];
  bool created = p == NULL;
  if (created) {
    p = calloc(1, sizeof *p);
    if (p == NULL) {
      res = ncclSystemError;
      goto out;
    }
    p->device = device;
    p->cfg = *cfg;
    if (ops != NULL) p->ops = *ops;
    pthread_mutex_init(&p->mu, NULL);
    agoq_gpu_pools[device] = p;
  }
  /* This NIC's first link: the chunks there are get its registration. */
  if (net_dev >= 0 && p->dev_links[net_dev] == 0)
    for (uint32_t i = 0; i < p->nchunks; i++) AGOQ_CHECK_GOTO(agoq_gpu_pool_chunk_reg(p, &p->chunks[i], net_dev), res, undo);
  p->links++;
  p->share_bytes += cfg->share;
  if (net_dev >= 0) p->dev_links[net_dev]++;
  res = agoq_gpu_pool_grow(p);
  if (res != ncclSuccess) {
    p->links--;
    p->share_bytes -= cfg->share;
    if (net_dev >= 0) p->dev_links[net_dev]--;
    goto undo;
  }
  agoq_gpu_pool_shrink(p);
  *out = p;
  goto out;
undo:
  if (p->links == 0) agoq_gpu_pool_free(p);
out:
  pthread_mutex_unlock(&agoq_gpu_pool_setup_mu);
  return res;
}

void agoq_gpu_pool_leave(agoq_gpu_pool* p, int net_dev, size_t share) {
  if (p == NULL) return;
  pthread_mutex_lock(&agoq_gpu_pool_setup_mu);
  p->links--;
  p->share_bytes -= share;
  if (net_dev >= 0 && agoq_gpu_pool_net_dev_ok(net_dev)) p->dev_links[net_dev]--;
  if (p->links == 0) {
    if (p->borrowed_bytes != 0)
      AGOQ_WARN("GPU %d's pinned pool: %llu bytes still borrowed when its last link closed", p->device,
                (unsigned long long)p->borrowed_bytes);
    agoq_gpu_pool_free(p);
  }
  pthread_mutex_unlock(&agoq_gpu_pool_setup_mu);
}

bool agoq_gpu_pool_get(agoq_gpu_pool* p, size_t size, agoq_gpu_pool_piece* piece) {
  piece->ptr = NULL;
  piece->size = 0;
  piece->chunk = -1;
  if (p == NULL) return false;
  pthread_mutex_lock(&p->mu);
  for (uint32_t i = 0; i < p->nchunks; i++) {
    if (agoq_gpu_heap_get(&p->chunks[i].heap, size, &piece->ptr)) {
      piece->size = size;
      piece->chunk = (int)i;
      p->borrows++;
      p->borrowed_bytes += agoq_gpu_heap_round(size);
      break;
    }
  }
  if (piece->chunk < 0) p->refusals++;
  pthread_mutex_unlock(&p->mu);
  return piece->chunk >= 0;
}

void agoq_gpu_pool_put(agoq_gpu_pool* p, agoq_gpu_pool_piece* piece) {
  if (p == NULL || piece->chunk < 0) return;
  pthread_mutex_lock(&p->mu);
  if (agoq_gpu_heap_put(&p->chunks[piece->chunk].heap, piece->ptr, piece->size))
    p->borrowed_bytes -= agoq_gpu_heap_round(piece->size);
  else
    AGOQ_WARN("GPU %d's pinned pool: a piece of %zu bytes at %p given back twice or never borrowed", p->device,
              piece->size, (void*)piece->ptr);
  pthread_mutex_unlock(&p->mu);
  piece->chunk = -1;
  piece->ptr = NULL;
}

void* agoq_gpu_pool_key(agoq_gpu_pool* p, const agoq_gpu_pool_piece* piece, int net_dev) {
  if (p == NULL || piece->chunk < 0 || !agoq_gpu_pool_net_dev_ok(net_dev)) return NULL;
  return p->chunks[piece->chunk].key[net_dev];
}

size_t agoq_gpu_pool_chunk_size(const agoq_gpu_pool* p) { return p == NULL ? 0 : p->cfg.chunk; }

bool agoq_gpu_pool_contains(agoq_gpu_pool* p, const void* ptr, size_t size) {
  if (p == NULL) return false;
  const uint8_t* a = ptr;
  bool in = false;
  pthread_mutex_lock(&p->mu);
  for (uint32_t i = 0; i < p->nchunks && !in; i++) {
    const uint8_t* lo = p->chunks[i].base;
    in = a >= lo && a <= lo + p->chunks[i].size && size <= (size_t)(lo + p->chunks[i].size - a);
  }
  pthread_mutex_unlock(&p->mu);
  return in;
}

void agoq_gpu_pool_stats_get(int device, agoq_gpu_pool_stats* s) {
  memset(s, 0, sizeof *s);
  if (device < 0 || device >= AGOQ_GPU_POOL_DEVICES) return;
  pthread_mutex_lock(&agoq_gpu_pool_setup_mu);
  agoq_gpu_pool* p = agoq_gpu_pools[device];
  if (p != NULL) {
    pthread_mutex_lock(&p->mu);
    s->chunks = p->nchunks;
    s->links = p->links;
    s->chunk_bytes = (uint64_t)p->nchunks * p->cfg.chunk;
    s->pinned_bytes = s->chunk_bytes + p->share_bytes;
    s->borrows = p->borrows;
    s->refusals = p->refusals;
    s->borrowed_bytes = p->borrowed_bytes;
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&agoq_gpu_pool_setup_mu);
}
