#include "gpu/agoq_gpu_heap.h"

#include <stdlib.h>
#include <string.h>

#include "gpu/agoq_gpu_ring.h"

size_t agoq_gpu_heap_round(size_t size) { return size == 0 ? AGOQ_GPU_RING_ALIGN : agoq_gpu_ring_align(size); }

bool agoq_gpu_heap_init(agoq_gpu_heap* h, uint8_t* base, size_t size, uint32_t max_extents) {
  memset(h, 0, sizeof *h);
  h->cap = max_extents > 0 ? max_extents : 1;
  h->free = calloc(h->cap, sizeof *h->free);
  if (h->free == NULL) return false;
  h->base = base;
  h->size = size / AGOQ_GPU_RING_ALIGN * AGOQ_GPU_RING_ALIGN;
  if (h->size > 0) {
    h->free[0] = (agoq_gpu_heap_extent){0, h->size};
    h->nfree = 1;
  }
  h->free_bytes = h->size;
  return true;
}

void agoq_gpu_heap_fini(agoq_gpu_heap* h) {
  free(h->free);
  memset(h, 0, sizeof *h);
}

bool agoq_gpu_heap_get(agoq_gpu_heap* h, size_t size, uint8_t** ptr) {
  if (size > h->size) return false;
  size_t n = agoq_gpu_heap_round(size);
  for (uint32_t i = 0; i < h->nfree; i++) {
    agoq_gpu_heap_extent* e = &h->free[i];
    if (e->len < n) continue;
    *ptr = h->base + e->off;
    e->off += n;
    e->len -= n;
    if (e->len == 0) {
      memmove(e, e + 1, (h->nfree - i - 1) * sizeof *e);
      h->nfree--;
    }
    h->free_bytes -= n;
    return true;
  }
  return false;
}

bool agoq_gpu_heap_put(agoq_gpu_heap* h, uint8_t* p, size_t size) {
  /* As addresses: a foreign pointer is no element of the buffer to compare with. */
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)h->base;
  if (a < lo || a - lo > h->size) return false;
  size_t off = (size_t)(a - lo), n = agoq_gpu_heap_round(size);
  if (off % AGOQ_GPU_RING_ALIGN != 0 || n > h->size - off) return false;
  /* i: the first free extent after the range; it and the one before must not overlap it. */
  uint32_t i = 0;
  while (i < h->nfree && h->free[i].off < off) i++;
  bool merge_prev = i > 0 && h->free[i - 1].off + h->free[i - 1].len == off;
  bool merge_next = i < h->nfree && off + n == h->free[i].off;
  if (i > 0 && h->free[i - 1].off + h->free[i - 1].len > off) return false;
  if (i < h->nfree && off + n > h->free[i].off) return false;
  if (!merge_prev && !merge_next && h->nfree == h->cap) {
    /* The list is full: refuse rather than lose the range (the pool sizes cap so that
     * it never is: one extent more than its allocations can be). */
    return false;
  }
  if (merge_prev && merge_next) {
    h->free[i - 1].len += n + h->free[i].len;
    memmove(&h->free[i], &h->free[i + 1], (h->nfree - i - 1) * sizeof *h->free);
    h->nfree--;
  } else if (merge_prev) {
    h->free[i - 1].len += n;
  } else if (merge_next) {
    h->free[i].off = off;
    h->free[i].len += n;
  } else {
    memmove(&h->free[i + 1], &h->free[i], (h->nfree - i) * sizeof *h->free);
    h->free[i] = (agoq_gpu_heap_extent){off, n};
    h->nfree++;
  }
  h->free_bytes += n;
  return true;
}

size_t agoq_gpu_heap_largest(const agoq_gpu_heap* h) {
  size_t best = 0;
  for (uint32_t i = 0; i < h->nfree; i++) best = h->free[i].len > best ? h->free[i].len : best;
  return best;
}
