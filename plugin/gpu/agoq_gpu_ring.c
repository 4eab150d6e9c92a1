#include "gpu/agoq_gpu_ring.h"

#include <stdlib.h>
#include <string.h>

/* An allocation's length in the ring: at least one aligned unit, so every entry is
 * distinct from its neighbours. */
static size_t agoq_ring_round(size_t n) { return n == 0 ? AGOQ_GPU_RING_ALIGN : agoq_gpu_ring_align(n); }

bool agoq_gpu_ring_init(agoq_gpu_ring* r, uint8_t* base, size_t size, uint32_t max_entries) {
  memset(r, 0, sizeof *r);
  r->ents = calloc(max_entries ? max_entries : 1, sizeof *r->ents);
  if (r->ents == NULL) return false;
  r->base = base;
  r->size = size / AGOQ_GPU_RING_ALIGN * AGOQ_GPU_RING_ALIGN;
  r->cap = max_entries ? max_entries : 1;
  return true;
}

void agoq_gpu_ring_fini(agoq_gpu_ring* r) {
  free(r->ents);
  memset(r, 0, sizeof *r);
}

bool agoq_gpu_ring_fits(const agoq_gpu_ring* r, size_t size) { return size <= r->size && agoq_ring_round(size) <= r->size; }

uint32_t agoq_gpu_ring_live(const agoq_gpu_ring* r) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < r->count; i++) n += r->ents[(r->first + i) % r->cap].live;
  return n;
}

int agoq_gpu_ring_get(agoq_gpu_ring* r, size_t size, uint8_t** ptr) {
  if (!agoq_gpu_ring_fits(r, size) || r->count == r->cap) return -1;
  size_t n = agoq_ring_round(size);
  size_t off;
  if (r->count == 0) {
    off = 0; /* empty: start over, the whole ring is free */
  } else {
    size_t tail = r->ents[r->first].off; /* the oldest allocation still out */
    /* Not wrapped: the allocations run from tail up to head (head > tail, every entry is
     * at least one alignment unit). Wrapped: from tail to the end, then from 0 to head. */
    bool wrapped = r->head <= tail;
    if (!wrapped && r->size - r->head >= n) off = r->head;
    else if (!wrapped && tail >= n) off = 0;
    else if (wrapped && tail - r->head >= n) off = r->head;
    else return -1;
  }
  uint32_t id = (r->first + r->count) % r->cap;
  r->ents[id] = (agoq_gpu_ring_entry){.off = off, .end = off + n, .live = true};
  r->count++;
  r->head = off + n;
  *ptr = r->base + off;
  return (int)id;
}

void agoq_gpu_ring_put(agoq_gpu_ring* r, int id) {
  if (id < 0 || (uint32_t)id >= r->cap) return;
  r->ents[id].live = false;
  /* Space comes back only from the oldest end, so the live bytes stay one run. */
  while (r->count > 0 && !r->ents[r->first].live) {
    r->first = (r->first + 1) % r->cap;
    r->count--;
  }
  if (r->count == 0) {
    r->first = 0;
    r->head = 0;
  }
}
