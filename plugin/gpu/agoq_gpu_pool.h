/*
 * Pinned memory shared by the links of one GPU in this process (docs/design-gpu.md, "Pinned
 * memory per device"): chunks of pinned host memory, allocated only at link setup, while the
 * pool has fewer chunks than links and its total stays under a cap; inside a chunk, first-fit
 * with merging (agoq_gpu_heap.h). A link borrows a chunk's piece for a message larger than its
 * own share and gives it back when the message is done; a borrow never waits (a receive holds
 * its piece until its data comes: links waiting on one pool could deadlock across nodes), the
 * caller falls back to its share. Knows the CUDA runtime (cudaHostAlloc), not NCCL's tables.
 */
#ifndef AGOQ_GPU_POOL_H
#define AGOQ_GPU_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

typedef struct agoq_gpu_pool agoq_gpu_pool;

/* Registration of a chunk with a NIC (verbs: no registration on the data path), given by the
 * net layer; NULL where the transport needs none (TCP). */
typedef struct {
  ncclResult_t (*reg)(int net_dev, void* base, size_t size, void** key);
  void (*dereg)(void* key);
} agoq_gpu_pool_ops;

typedef struct {
  size_t chunk; /* bytes per chunk (AGOQ_GPU_STAGING) */
  size_t cap;   /* chunks and the links' shares together stay under it while they can */
  size_t share; /* the joining link's own pinned bytes, counted against cap */
} agoq_gpu_pool_config;

typedef struct {
  uint8_t* ptr;
  size_t size;
  int chunk; /* -1: none */
} agoq_gpu_pool_piece;

typedef struct {
  uint64_t pinned_bytes; /* the chunks' and the links' shares */
  uint64_t chunk_bytes;  /* the chunks' alone */
  uint32_t chunks, links;
  uint64_t borrows, refusals; /* gets that found room, and those that did not */
  uint64_t borrowed_bytes;    /* out now */
} agoq_gpu_pool_stats;

/* Setup only, inside the link's setup scope (its device current, Relaxed capture): joins
 * (creating on first use) the pool of `device` for a link on net device net_dev (-1: none)
 * with cfg->share bytes of its own, adding a chunk when the pool has fewer than its links and
 * chunks plus shares stay under cap, freeing unused chunks when the shares grow past it, and
 * registering every chunk with net_dev when ops->reg is given. The first joiner's chunk size,
 * cap and ops hold for the pool's life. */
ncclResult_t agoq_gpu_pool_join(int device, int net_dev, const agoq_gpu_pool_config* cfg, const agoq_gpu_pool_ops* ops,
                                agoq_gpu_pool** out);
/* Setup only (link teardown, the link's queued work done): the last link out frees it all. */
void agoq_gpu_pool_leave(agoq_gpu_pool* p, int net_dev, size_t share);
/* Data path, never blocks beyond a short lock: a piece of `size` bytes, or false. */
bool agoq_gpu_pool_get(agoq_gpu_pool* p, size_t size, agoq_gpu_pool_piece* piece);
void agoq_gpu_pool_put(agoq_gpu_pool* p, agoq_gpu_pool_piece* piece);
/* The piece's chunk's registration with net_dev (NULL without ops->reg). */
void* agoq_gpu_pool_key(agoq_gpu_pool* p, const agoq_gpu_pool_piece* piece, int net_dev);
/* The most one piece can be (a chunk's size); 0 for NULL. */
size_t agoq_gpu_pool_chunk_size(const agoq_gpu_pool* p);
/* [ptr, ptr + size) lies in one chunk. */
bool agoq_gpu_pool_contains(agoq_gpu_pool* p, const void* ptr, size_t size);
/* The pool of `device` now (zeros when there is none). */
void agoq_gpu_pool_stats_get(int device, agoq_gpu_pool_stats* s);

#endif
