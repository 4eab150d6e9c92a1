/*
 * A ring of staging bytes (pinned host memory, in practice) handed out in posting order and
 * given back in any order: NCCL posts a connection's requests in order but may test them in
 * any order. Space is reused once every older allocation is back, so a ring never
 * fragments; an allocation that does not fit at the end starts again at the beginning.
 * Pure bookkeeping over a caller's buffer: no CUDA, no NCCL, no locking (one connection's
 * requests are driven by one thread at a time, NCCL's proxy).
 */
#ifndef AGOQ_GPU_RING_H
#define AGOQ_GPU_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every allocation starts on this boundary: DMA engines move aligned pieces fastest. */
#define AGOQ_GPU_RING_ALIGN 256u

typedef struct {
  size_t off, end; /* [off, end) of the buffer */
  bool live;
} agoq_gpu_ring_entry;

typedef struct {
  uint8_t* base;
  size_t size;
  size_t head;                /* where the next allocation goes */
  agoq_gpu_ring_entry* ents;  /* circular, oldest at first */
  uint32_t cap, first, count; /* entries: capacity, oldest, in use (live or not yet popped) */
} agoq_gpu_ring;

/* n rounded up to AGOQ_GPU_RING_ALIGN (0 stays 0): where the next piece of one allocation
 * that holds several starts. */
static inline size_t agoq_gpu_ring_align(size_t n) {
  return (n + AGOQ_GPU_RING_ALIGN - 1) / AGOQ_GPU_RING_ALIGN * AGOQ_GPU_RING_ALIGN;
}

/* Takes over no memory: base/size is the caller's. False when out of host memory. */
bool agoq_gpu_ring_init(agoq_gpu_ring* r, uint8_t* base, size_t size, uint32_t max_entries);
void agoq_gpu_ring_fini(agoq_gpu_ring* r);
/* True when `size` bytes can ever be had (the ring is large enough). */
bool agoq_gpu_ring_fits(const agoq_gpu_ring* r, size_t size);
/* The pieces of a message larger than any staging (net and CollNet bounce buffers), out of
 * an area of `area` bytes (a ring, or a chunk of the GPU's pinned pool): half of it, on the
 * ring's alignment, so that the requests around one keep moving. */
static inline size_t agoq_gpu_ring_piece(size_t area) {
  return area / 2 / AGOQ_GPU_RING_ALIGN * AGOQ_GPU_RING_ALIGN;
}
/* Hands out `size` bytes (0 is allowed: a minimal piece) at *ptr and returns the
 * allocation's id; -1 when they do not fit now (older allocations still out). */
int agoq_gpu_ring_get(agoq_gpu_ring* r, size_t size, uint8_t** ptr);
/* Gives allocation `id` back. */
void agoq_gpu_ring_put(agoq_gpu_ring* r, int id);
/* Allocations out. */
uint32_t agoq_gpu_ring_live(const agoq_gpu_ring* r);

#endif
