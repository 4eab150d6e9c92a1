/*
 * Which CPU kernel table runs: the best one both the build and the CPU support, unless a
 * test pins another with agoq_codec_set_isa. A SIMD table counts as supported only when the
 * CPU has the instructions AND the OS saves the wide registers (XGETBV), which a CPUID bit
 * alone does not promise.
 */
#include <stdatomic.h>
#include <string.h>

#include "agoq_codec_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

static unsigned cpu_features_detect(void) {
  unsigned a, b, c, d, feats = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  if (c & (1u << 20)) feats |= AGOQ_CPU_SSE42;
  const unsigned osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
  if ((c & (osxsave | avx | f16c)) != (osxsave | avx | f16c)) return feats;
  uint64_t xcr0 = xgetbv0();
  if ((xcr0 & 0x6u) != 0x6u) return feats; /* XMM and YMM state */
  if (__get_cpuid_max(0, NULL) < 7) return feats;
  __cpuid_count(7, 0, a, b, c, d);
  if (b & (1u << 5)) feats |= AGOQ_CPU_AVX2;
  const unsigned f = 1u << 16, dq = 1u << 17, bw = 1u << 30, vl = 1u << 31;
  /* opmask, upper ZMM halves and ZMM16-31 state */
  if ((feats & AGOQ_CPU_AVX2) && (b & (f | dq | bw | vl)) == (f | dq | bw | vl) &&
      (xcr0 & 0xe0u) == 0xe0u)
    feats |= AGOQ_CPU_AVX512;
  return feats;
}
#else
static unsigned cpu_features_detect(void) {
  return 0;
}
#endif

unsigned agoq_cpu_features(void) {
  /* Detection is idempotent, so racing first callers just compute the same value. */
  static atomic_uint cached = 0;
  unsigned v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v == 0) {
    v = cpu_features_detect() | AGOQ_CPU_DETECTED;
    atomic_store_explicit(&cached, v, memory_order_relaxed);
  }
  return v;
}

const agoq_cpu_kernels* agoq_cpu_kernels_by_name(const char* isa) {
  if (isa == NULL) return NULL;
  if (strcmp(isa, "portable") == 0) return &agoq_cpu_kernels_portable;
#ifdef AGOQ_CODEC_HAVE_AVX2
  if (strcmp(isa, "avx2") == 0) return (agoq_cpu_features() & AGOQ_CPU_AVX2) ? &agoq_cpu_kernels_avx2 : NULL;
#endif
#ifdef AGOQ_CODEC_HAVE_AVX512
  if (strcmp(isa, "avx512") == 0)
    return (agoq_cpu_features() & AGOQ_CPU_AVX512) ? &agoq_cpu_kernels_avx512 : NULL;
#endif
  return NULL;
}

static const agoq_cpu_kernels* kernels_best(void) {
  static const char* const order[] = {"avx512", "avx2", "portable"};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    const agoq_cpu_kernels* k = agoq_cpu_kernels_by_name(order[i]);
    if (k != NULL) return k;
  }
  return &agoq_cpu_kernels_portable;
}

static _Atomic(const agoq_cpu_kernels*) active_kernels = NULL;

const agoq_cpu_kernels* agoq_cpu_kernels_active(void) {
  const agoq_cpu_kernels* k = atomic_load_explicit(&active_kernels, memory_order_acquire);
  if (k == NULL) {
    const agoq_cpu_kernels* expected = NULL;
    k = kernels_best();
    /* A concurrent agoq_codec_set_isa wins over the default. */
    if (!atomic_compare_exchange_strong(&active_kernels, &expected, k)) k = expected;
  }
  return k;
}

int agoq_codec_set_isa(const char* isa) {
  const agoq_cpu_kernels* k =
      (isa == NULL || strcmp(isa, "auto") == 0) ? kernels_best() : agoq_cpu_kernels_by_name(isa);
  if (k == NULL) return -1;
  atomic_store_explicit(&active_kernels, k, memory_order_release);
  return 0;
}

const char* agoq_codec_isa(void) {
  return agoq_cpu_kernels_active()->name;
}

bool agoq_codec_isa_available(const char* isa) {
  return agoq_cpu_kernels_by_name(isa) != NULL;
}
