/*
 * CRC32C (Castagnoli, reflected polynomial 0x82f63b78), chainable like zlib's crc32: start
 * with 0, feed the previous result to continue. Two implementations with identical results:
 * slicing-by-8 tables, and the SSE4.2 crc32 instruction when the CPU has it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "agoq_codec_internal.h"
#include "agoq_frame.h"

#define AGOQ_CRC32C_POLY 0x82f63b78u

static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (AGOQ_CRC32C_POLY & (0u - (c & 1u)));
    crc_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xffu];
}

/* crc here is the running (inverted) register. */
static uint32_t crc32c_sw(uint32_t crc, const uint8_t* p, size_t len) {
  pthread_once(&crc_table_once, crc_table_init);
  while (len >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4); /* little-endian host (agoq_codec_internal.h) */
    memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = crc_table[7][lo & 0xffu] ^ crc_table[6][(lo >> 8) & 0xffu] ^
          crc_table[5][(lo >> 16) & 0xffu] ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xffu] ^
          crc_table[2][(hi >> 8) & 0xffu] ^ crc_table[1][(hi >> 16) & 0xffu] ^ crc_table[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xffu];
  return crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t* p,
                                                             size_t len) {
  uint64_t c = crc;
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    len -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (len--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t*, size_t);

static crc_fn crc_impl(void) {
#if defined(__x86_64__)
  if (agoq_cpu_features() & AGOQ_CPU_SSE42) return crc32c_hw;
#endif
  return crc32c_sw;
}

uint32_t agoq_crc32c_portable(uint32_t crc, const void* data, size_t len) {
  return ~crc32c_sw(~crc, (const uint8_t*)data, len);
}

uint32_t agoq_crc32c(uint32_t crc, const void* data, size_t len) {
  if (len == 0) return crc;
  return ~crc_impl()(~crc, (const uint8_t*)data, len);
}
