/* Fixed pools of event objects: claimed in ring order, released by stopEvent, never freed
 * before the communicator's profiler context is finalized. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/agoq_check.h"
#include "profiler/agoq_prof.h"

/* Per-kind magics: a pointer into the op pool is never mistaken for a step, and stopEvent
 * can tell a pool object from a sentinel. */
static const uint32_t agoq_prof_magics[AGOQ_PROF_OBJ_KINDS] = {
    0x50325041u, /* "AP2P" */
    0x504f5141u, /* "AQOP" */
    0x50545341u, /* "ASTP" */
};

_Static_assert(sizeof(agoq_prof_obj) == 64, "one object per cache line");

ncclResult_t agoq_prof_pool_init(agoq_prof_pool* p, uint32_t n, uint32_t magic) {
  if (n == 0 || (n & (n - 1)) != 0) {
    AGOQ_WARN("profiler pool size %u is not a power of two", n);
    return ncclInternalError;
  }
  p->objs = aligned_alloc(64, (size_t)n * sizeof(agoq_prof_obj));
  if (p->objs == NULL) {
    AGOQ_WARN("out of memory allocating %zu bytes of profiler events",
              (size_t)n * sizeof(agoq_prof_obj));
    return ncclSystemError;
  }
  memset(p->objs, 0, (size_t)n * sizeof(agoq_prof_obj));
  for (uint32_t i = 0; i < n; i++) p->objs[i].magic = magic;
  p->n = n;
  p->magic = magic;
  p->quarantine_ms = 0; /* the owner sets it; a pool is never quarantined by accident */
  atomic_init(&p->cursor, 0);
  return ncclSuccess;
}

void agoq_prof_pool_fini(agoq_prof_pool* p) {
  free(p->objs);
  p->objs = NULL;
  p->n = 0;
}

/* A coarse clock is enough for a 2 s quarantine and costs a few ns (vDSO). */
static uint64_t agoq_prof_clock_default(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static _Atomic(agoq_prof_clock_fn) agoq_prof_clock = agoq_prof_clock_default;

void agoq_prof_clock_set(agoq_prof_clock_fn fn) {
  atomic_store_explicit(&agoq_prof_clock, fn != NULL ? fn : agoq_prof_clock_default,
                        memory_order_release);
}

static uint64_t agoq_prof_now_ms(void) {
  return atomic_load_explicit(&agoq_prof_clock, memory_order_acquire)();
}

bool agoq_prof_quarantine_over(uint64_t released_ms, uint64_t now_ms, uint32_t quarantine_ms) {
  /* Compare the age, never a sum: released_ms + quarantine_ms may not be representable,
   * and now_ms - released_ms is only an age when now_ms is not earlier. */
  return now_ms >= released_ms && now_ms - released_ms >= quarantine_ms;
}

/* Whether a claimed or free-looking slot is still quarantined at `now`. */
static bool agoq_prof_obj_quarantined(const agoq_prof_obj* o, const agoq_prof_pool* p,
                                      uint64_t now) {
  if (p->quarantine_ms == 0 || atomic_load_explicit(&o->released, memory_order_relaxed) == 0)
    return false;
  uint64_t freed = atomic_load_explicit(&o->released_ms, memory_order_relaxed);
  return !agoq_prof_quarantine_over(freed, now, p->quarantine_ms);
}

agoq_prof_obj* agoq_prof_pool_alloc(agoq_prof_pool* p) {
  const uint64_t now = p->quarantine_ms ? agoq_prof_now_ms() : 0;
  for (uint32_t probe = 0; probe < AGOQ_PROF_ALLOC_PROBES; probe++) {
    uint32_t i = atomic_fetch_add_explicit(&p->cursor, 1, memory_order_relaxed) & (p->n - 1);
    agoq_prof_obj* o = &p->objs[i];
    /* Cheap look first: under load most probes that fail, fail here without a CAS. */
    if (atomic_load_explicit(&o->busy, memory_order_relaxed) != 0) continue;
    if (agoq_prof_obj_quarantined(o, p, now)) continue;
    uint32_t expect = 0;
    if (!atomic_compare_exchange_strong_explicit(&o->busy, &expect, 1, memory_order_acquire,
                                                 memory_order_relaxed))
      continue;
    /* The look above may have seen an older stamp: between it and the CAS another thread
     * can have claimed and released the slot again. The CAS synchronises with that
     * release, so this second look sees its stamp; still quarantined: give it back. */
    if (agoq_prof_obj_quarantined(o, p, now)) {
      atomic_store_explicit(&o->busy, 0, memory_order_release);
      continue;
    }
    return o;
  }
  return NULL;
}

agoq_prof_obj* agoq_prof_pool_find(const agoq_prof_pool* p, const void* ptr) {
  /* Address arithmetic only: a foreign pointer is compared, never loaded from. */
  uintptr_t base = (uintptr_t)p->objs;
  uintptr_t off = (uintptr_t)ptr - base;
  if (p->objs == NULL || off >= (uintptr_t)p->n * sizeof(agoq_prof_obj) ||
      off % sizeof(agoq_prof_obj) != 0)
    return NULL;
  agoq_prof_obj* o = &p->objs[off / sizeof(agoq_prof_obj)];
  return o->magic == p->magic ? o : NULL;
}

/* Packing: kind | dtype + 1 | proto | is_send in the low 32 bits, peer in the high 32. */
static uint64_t agoq_prof_pack(const agoq_prof_info* in) {
  return (uint64_t)(uint8_t)in->kind | (uint64_t)(uint8_t)(in->dtype + 1) << 8 |
         (uint64_t)(uint8_t)in->proto << 16 | (uint64_t)(uint8_t)(in->is_send != 0) << 24 |
         (uint64_t)(uint32_t)in->peer << 32;
}

static void agoq_prof_unpack(uint64_t w, uint64_t bytes, agoq_prof_info* out) {
  out->kind = (agoq_xfer_kind)(w & 0xff);
  out->dtype = (int)((w >> 8) & 0xff) - 1;
  out->proto = (agoq_xfer_proto)((w >> 16) & 0xff);
  out->is_send = (int)((w >> 24) & 0xff);
  out->peer = (int)(int32_t)(uint32_t)(w >> 32);
  out->task_bytes = bytes;
}

void agoq_prof_obj_publish(agoq_prof_obj* o, const agoq_prof_info* info) {
  uint32_t s = atomic_load_explicit(&o->seq, memory_order_relaxed);
  atomic_store_explicit(&o->seq, s + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&o->info, agoq_prof_pack(info), memory_order_relaxed);
  atomic_store_explicit(&o->bytes, info->task_bytes, memory_order_relaxed);
  atomic_store_explicit(&o->seq, s + 2, memory_order_release);
}

bool agoq_prof_obj_read(const agoq_prof_obj* o, agoq_prof_info* info) {
  uint32_t s1 = atomic_load_explicit(&o->seq, memory_order_acquire);
  if (s1 == 0 || (s1 & 1u) != 0) return false;
  uint64_t w = atomic_load_explicit(&o->info, memory_order_relaxed);
  uint64_t bytes = atomic_load_explicit(&o->bytes, memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&o->seq, memory_order_relaxed) != s1) return false;
  agoq_prof_unpack(w, bytes, info);
  return true;
}

bool agoq_prof_obj_is_ours(const void* ptr) {
  uint32_t m = ((const agoq_prof_obj*)ptr)->magic;
  for (int k = 0; k < AGOQ_PROF_OBJ_KINDS; k++)
    if (m == agoq_prof_magics[k]) return true;
  return false;
}

void agoq_prof_obj_release(agoq_prof_obj* o) {
  /* Stamp first, then free: an allocator whose CAS takes the slot also sees its stamp.
   * The stamp is the clock as it reads; `released` says it is valid. */
  atomic_store_explicit(&o->released_ms, agoq_prof_now_ms(), memory_order_relaxed);
  atomic_store_explicit(&o->released, 1, memory_order_relaxed);
  atomic_store_explicit(&o->busy, 0, memory_order_release);
}

uint32_t agoq_prof_magic(agoq_prof_obj_kind kind) { return agoq_prof_magics[kind]; }
