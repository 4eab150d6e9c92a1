/*
 * First-fit allocation over a caller's buffer, released in any order, free neighbours
 * merged: the bookkeeping of the per-device pinned pool (issue 27 item 8), which many
 * connections share. A ring (agoq_gpu_ring.h) cannot be shared that way: one connection's
 * receive posted long before its data comes holds the oldest end, and no space after it
 * comes back until it does (head-of-line blocking across connections). Pure bookkeeping: no
 * CUDA, no NCCL, no locking (the pool locks).
 */
#ifndef AGOQ_GPU_HEAP_H
#define AGOQ_GPU_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  size_t off, len;
} agoq_gpu_heap_extent;

typedef struct {
  uint8_t* base;
  size_t size;                 /* a multiple of AGOQ_GPU_RING_ALIGN */
  agoq_gpu_heap_extent* free;  /* free extents, sorted by offset, never adjacent */
  uint32_t nfree, cap;
  size_t free_bytes;
} agoq_gpu_heap;

/* Takes over no memory: base/size is the caller's. max_extents bounds the free list (an
 * allocation that would split one more extent beyond it fails). False when out of host memory. */
bool agoq_gpu_heap_init(agoq_gpu_heap* h, uint8_t* base, size_t size, uint32_t max_extents);
void agoq_gpu_heap_fini(agoq_gpu_heap* h);
/* size rounded up to AGOQ_GPU_RING_ALIGN (0: one unit), as the heap counts it. */
size_t agoq_gpu_heap_round(size_t size);
/* The lowest free extent that holds `size` bytes: *ptr, true; false when none does now. */
bool agoq_gpu_heap_get(agoq_gpu_heap* h, size_t size, uint8_t** ptr);
/* Gives back an allocation of `size` bytes at p (as got). False, and nothing changed, for a
 * range that is not wholly allocated (a double put or a foreign pointer). */
bool agoq_gpu_heap_put(agoq_gpu_heap* h, uint8_t* p, size_t size);
/* The largest allocation that would succeed now. */
size_t agoq_gpu_heap_largest(const agoq_gpu_heap* h);

#endif
