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

/* Three streams at once: crc32 has a latency of 3 cycles and a throughput of 1 per cycle, so
 * one dependency chain runs at a third of the instruction's speed. Three lanes of L bytes
 * are summed independently and joined with the register algebra of a CRC: the register
 * after A||B is M^|B| (register after A) xor (register after B from 0), where M^L, the
 * effect of L zero bytes, is linear and applied through four byte-indexed tables. */
#if defined(__x86_64__)
#define AGOQ_CRC_LANE 4096u
static uint32_t crc_shift_table[4][256];
static pthread_once_t crc_shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static uint32_t crc32c_zeros_hw(uint32_t reg, size_t len) {
  uint64_t c = reg;
  for (size_t i = 0; i < len / 8; i++) c = _mm_crc32_u64(c, 0);
  return (uint32_t)c;
}

static void crc_shift_init(void) {
  uint32_t basis[32];
  for (int b = 0; b < 32; b++) basis[b] = crc32c_zeros_hw(1u << b, AGOQ_CRC_LANE);
  for (int k = 0; k < 4; k++)
    for (uint32_t v = 0; v < 256; v++) {
      uint32_t r = 0;
      for (int j = 0; j < 8; j++)
        if (v & (1u << j)) r ^= basis[8 * k + j];
      crc_shift_table[k][v] = r;
    }
}

static inline uint32_t crc_shift_lane(uint32_t reg) {
  return crc_shift_table[0][reg & 0xffu] ^ crc_shift_table[1][(reg >> 8) & 0xffu] ^
         crc_shift_table[2][(reg >> 16) & 0xffu] ^ crc_shift_table[3][reg >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw3(uint32_t crc, const uint8_t* p, size_t len) {
  if (len >= 3 * AGOQ_CRC_LANE) {
    pthread_once(&crc_shift_once, crc_shift_init);
    while (len >= 3 * AGOQ_CRC_LANE) {
      uint64_t c0 = crc, c1 = 0, c2 = 0;
      for (size_t i = 0; i < AGOQ_CRC_LANE; i += 8) {
        uint64_t v0, v1, v2;
        memcpy(&v0, p + i, 8);
        memcpy(&v1, p + AGOQ_CRC_LANE + i, 8);
        memcpy(&v2, p + 2 * AGOQ_CRC_LANE + i, 8);
        c0 = _mm_crc32_u64(c0, v0);
        c1 = _mm_crc32_u64(c1, v1);
        c2 = _mm_crc32_u64(c2, v2);
      }
      crc = crc_shift_lane(crc_shift_lane((uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
      p += 3 * AGOQ_CRC_LANE;
      len -= 3 * AGOQ_CRC_LANE;
    }
  }
  return crc32c_hw(crc, p, len);
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t*, size_t);

static crc_fn crc_impl(void) {
#if defined(__x86_64__)
  if (agoq_cpu_features() & AGOQ_CPU_SSE42) return crc32c_hw3;
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
