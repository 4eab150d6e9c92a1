/*
 * Frames: the header of agoq_frame.h in front of a codec body. The parser trusts nothing:
 * every field is checked against the buffer length before the body is touched, and every
 * size is computed with overflow checks (AGOQ_FRAME_MAX_COUNT bounds them all anyway).
 */
#include <stdatomic.h>
#include <string.h>

#include "agoq_codec_internal.h"
#include "agoq_frame.h"

enum {
  OFF_MAGIC = 0,
  OFF_VERSION = 4,
  OFF_FORMAT = 5,
  OFF_DTYPE = 6,
  OFF_FLAGS = 7,
  OFF_BLOCK = 8,
  OFF_ESCAPED = 12,
  OFF_COUNT = 16,
  OFF_PAYLOAD_LEN = 24,
  OFF_PAYLOAD_CRC = 32,
  OFF_RESERVED0 = 36,
  OFF_RESERVED1 = 40,
  OFF_HEADER_CRC = 44,
};

static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Time spent on payload CRC32C, for statistics (agoq_frame_crc_clock_set). Per thread, so
 * a caller reads it before and after its own frame calls without any sharing. */
static _Atomic(agoq_frame_clock_fn) agoq_frame_crc_clock;
static _Thread_local uint64_t agoq_frame_crc_ns_total;

void agoq_frame_crc_clock_set(agoq_frame_clock_fn clock) { atomic_store(&agoq_frame_crc_clock, clock); }

uint64_t agoq_frame_crc_ns(void) { return agoq_frame_crc_ns_total; }

/* agoq_crc32c over a payload, timed when a clock is set. */
static uint32_t agoq_frame_payload_crc(const void* body, size_t len) {
  agoq_frame_clock_fn clock = atomic_load_explicit(&agoq_frame_crc_clock, memory_order_relaxed);
  if (clock == NULL) return agoq_crc32c(0, body, len);
  uint64_t t0 = clock();
  uint32_t crc = agoq_crc32c(0, body, len);
  agoq_frame_crc_ns_total += clock() - t0;
  return crc;
}

size_t agoq_frame_size_max(const agoq_codec_params* p, size_t n) {
  if (agoq_codec_params_check(p) != AGOQ_CODEC_OK || n > AGOQ_FRAME_MAX_COUNT) return 0;
  size_t body = agoq_codec_body_size_max(p, n), total;
  if (body == SIZE_MAX || __builtin_add_overflow(body, (size_t)AGOQ_FRAME_HEADER_SIZE, &total))
    return SIZE_MAX;
  return total;
}

size_t agoq_frame_size_nominal(const agoq_codec_params* p, size_t n) {
  if (agoq_codec_params_check(p) != AGOQ_CODEC_OK || n > AGOQ_FRAME_MAX_COUNT) return 0;
  return (size_t)AGOQ_FRAME_HEADER_SIZE + agoq_codec_body_size(p, n, 0);
}

double agoq_frame_wire_ratio(const agoq_codec_params* p, size_t n) {
  if (n == 0 || agoq_codec_params_check(p) != AGOQ_CODEC_OK) return 1.0;
  double wire = (double)AGOQ_FRAME_HEADER_SIZE + (double)agoq_codec_body_size(p, n, 0);
  double ratio = wire / ((double)n * (double)agoq_dtype_size(p->dtype));
  return ratio < 1.0 ? ratio : 1.0;
}

agoq_codec_status agoq_frame_encode(const agoq_codec_params* p, const void* src, size_t n,
                                    bool payload_crc, void* out, size_t cap, size_t* frame_len) {
  return agoq_frame_encode_mt(p, src, n, payload_crc, out, cap, frame_len, 1);
}

agoq_codec_status agoq_frame_encode_mt(const agoq_codec_params* p, const void* src, size_t n,
                                       bool payload_crc, void* out, size_t cap, size_t* frame_len,
                                       int nthreads) {
  if (agoq_codec_params_check(p) != AGOQ_CODEC_OK || frame_len == NULL || n > AGOQ_FRAME_MAX_COUNT ||
      (src == NULL && n != 0))
    return AGOQ_CODEC_EARG;
  if (out == NULL || cap < AGOQ_FRAME_HEADER_SIZE) return AGOQ_CODEC_ESPACE;
  uint8_t* h = (uint8_t*)out;
  uint8_t* body = h + AGOQ_FRAME_HEADER_SIZE;
  size_t body_len = 0, escaped = 0;
  agoq_codec_status st =
      nthreads > 1 ? agoq_quantize_mt(p, src, n, body, cap - AGOQ_FRAME_HEADER_SIZE, &body_len, &escaped, nthreads)
                   : agoq_quantize(p, src, n, body, cap - AGOQ_FRAME_HEADER_SIZE, &body_len, &escaped);
  if (st != AGOQ_CODEC_OK) return st;
  if (escaped > UINT32_MAX) return AGOQ_CODEC_EARG; /* the header field is 32 bits */
  bool none = p->format == AGOQ_FORMAT_NONE;
  bool stochastic = !none && p->stochastic;
  uint32_t flags = (payload_crc ? AGOQ_FRAME_FLAG_PAYLOAD_CRC : 0u) |
                   (stochastic ? AGOQ_FRAME_FLAG_STOCHASTIC : 0u);
  memset(h, 0, AGOQ_FRAME_HEADER_SIZE);
  put_u32(h + OFF_MAGIC, AGOQ_FRAME_MAGIC);
  h[OFF_VERSION] = (uint8_t)AGOQ_FRAME_VERSION;
  h[OFF_FORMAT] = (uint8_t)p->format;
  h[OFF_DTYPE] = (uint8_t)p->dtype;
  h[OFF_FLAGS] = (uint8_t)flags;
  put_u32(h + OFF_BLOCK, none ? 0u : p->block);
  put_u32(h + OFF_ESCAPED, (uint32_t)escaped);
  put_u64(h + OFF_COUNT, (uint64_t)n);
  put_u64(h + OFF_PAYLOAD_LEN, (uint64_t)body_len);
  put_u32(h + OFF_PAYLOAD_CRC, payload_crc ? agoq_frame_payload_crc(body, body_len) : 0u);
  put_u32(h + OFF_HEADER_CRC, agoq_crc32c(0, h, OFF_HEADER_CRC));
  *frame_len = AGOQ_FRAME_HEADER_SIZE + body_len;
  return AGOQ_CODEC_OK;
}

agoq_codec_status agoq_frame_seal_payload_crc(void* buf, size_t len) {
  if (buf == NULL || len < AGOQ_FRAME_HEADER_SIZE) return AGOQ_CODEC_ECORRUPT;
  uint8_t* h = (uint8_t*)buf;
  if (get_u32(h + OFF_MAGIC) != AGOQ_FRAME_MAGIC || h[OFF_VERSION] != AGOQ_FRAME_VERSION ||
      agoq_crc32c(0, h, OFF_HEADER_CRC) != get_u32(h + OFF_HEADER_CRC) ||
      (h[OFF_FLAGS] & AGOQ_FRAME_FLAG_PAYLOAD_CRC) != 0 ||
      get_u64(h + OFF_PAYLOAD_LEN) != (uint64_t)(len - AGOQ_FRAME_HEADER_SIZE))
    return AGOQ_CODEC_ECORRUPT;
  h[OFF_FLAGS] = (uint8_t)(h[OFF_FLAGS] | AGOQ_FRAME_FLAG_PAYLOAD_CRC);
  put_u32(h + OFF_PAYLOAD_CRC, agoq_frame_payload_crc(h + AGOQ_FRAME_HEADER_SIZE, len - AGOQ_FRAME_HEADER_SIZE));
  put_u32(h + OFF_HEADER_CRC, agoq_crc32c(0, h, OFF_HEADER_CRC));
  return AGOQ_CODEC_OK;
}

bool agoq_frame_has_payload_crc(const void* buf, size_t len) {
  return buf != NULL && len >= AGOQ_FRAME_HEADER_SIZE &&
         (((const uint8_t*)buf)[OFF_FLAGS] & AGOQ_FRAME_FLAG_PAYLOAD_CRC) != 0;
}

/* Every scale of a body our encoders write is a finite non-negative fp32 (amax / M), and +0
 * for an escaped block. Anything else is a corrupt frame, caught here before it can decode
 * to NaN or Inf. */
static bool scales_valid(const agoq_codec_layout* lay) {
  for (size_t b = 0; b < lay->nb; b++) {
    uint32_t bits = get_u32(lay->scales + 4 * b);
    bool esc = (lay->bitmap[b / 8] >> (b % 8)) & 1u;
    if (bits >= 0x7f800000u || (esc && bits != 0)) return false;
  }
  return true;
}

agoq_codec_status agoq_frame_parse(const void* buf, size_t len, agoq_frame_info* info,
                                   const void** body) {
  if (info == NULL || (buf == NULL && len != 0)) return AGOQ_CODEC_EARG;
  const uint8_t* h = (const uint8_t*)buf;
  if (len < AGOQ_FRAME_HEADER_SIZE || get_u32(h + OFF_MAGIC) != AGOQ_FRAME_MAGIC)
    return AGOQ_CODEC_ECORRUPT;
  /* Before the CRC: a later version may lay out (and checksum) its header differently. */
  if (h[OFF_VERSION] != AGOQ_FRAME_VERSION) return AGOQ_CODEC_EVERSION;
  if (agoq_crc32c(0, h, OFF_HEADER_CRC) != get_u32(h + OFF_HEADER_CRC)) return AGOQ_CODEC_ECORRUPT;

  uint32_t flags = h[OFF_FLAGS], block = get_u32(h + OFF_BLOCK), escaped = get_u32(h + OFF_ESCAPED);
  uint64_t count = get_u64(h + OFF_COUNT), payload_len = get_u64(h + OFF_PAYLOAD_LEN);
  uint32_t payload_crc = get_u32(h + OFF_PAYLOAD_CRC);
  if (h[OFF_FORMAT] >= AGOQ_FORMAT_COUNT || h[OFF_DTYPE] >= AGOQ_DTYPE_COUNT ||
      (flags & ~(AGOQ_FRAME_FLAG_PAYLOAD_CRC | AGOQ_FRAME_FLAG_STOCHASTIC)) != 0 ||
      get_u32(h + OFF_RESERVED0) != 0 || get_u32(h + OFF_RESERVED1) != 0 ||
      count > AGOQ_FRAME_MAX_COUNT ||
      (!(flags & AGOQ_FRAME_FLAG_PAYLOAD_CRC) && payload_crc != 0))
    return AGOQ_CODEC_ECORRUPT;

  agoq_codec_params p;
  memset(&p, 0, sizeof p);
  p.format = (agoq_format)h[OFF_FORMAT];
  p.dtype = (agoq_dtype)h[OFF_DTYPE];
  p.block = block;
  p.stochastic = (flags & AGOQ_FRAME_FLAG_STOCHASTIC) != 0;
  if (p.format == AGOQ_FORMAT_NONE) {
    if (block != 0 || escaped != 0 || p.stochastic) return AGOQ_CODEC_ECORRUPT;
  } else if (agoq_codec_params_check(&p) != AGOQ_CODEC_OK) {
    return AGOQ_CODEC_ECORRUPT; /* block size, or stochastic with fp8 */
  }
  /* count <= 2^40 keeps every size below 2^43: no overflow in what follows. */
  size_t n = (size_t)count;
  size_t nb = agoq_codec_nblocks(&p, n);
  if (escaped > nb) return AGOQ_CODEC_ECORRUPT;
  if (payload_len != (uint64_t)agoq_codec_body_size(&p, n, escaped)) return AGOQ_CODEC_ECORRUPT;
  if (payload_len > len - AGOQ_FRAME_HEADER_SIZE) return AGOQ_CODEC_ECORRUPT;
  const uint8_t* b = h + AGOQ_FRAME_HEADER_SIZE;
  if ((flags & AGOQ_FRAME_FLAG_PAYLOAD_CRC) && agoq_frame_payload_crc(b, (size_t)payload_len) != payload_crc)
    return AGOQ_CODEC_ECORRUPT;
  if (p.format != AGOQ_FORMAT_NONE) {
    agoq_codec_layout lay;
    size_t counted;
    /* Checks the bitmap (no bit past the last block) and that it agrees with the length. */
    if (agoq_codec_body_check(&p, b, (size_t)payload_len, n, &lay, &counted) != AGOQ_CODEC_OK ||
        counted != escaped || !scales_valid(&lay))
      return AGOQ_CODEC_ECORRUPT;
  }
  memset(info, 0, sizeof *info);
  info->params = p;
  info->count = count;
  info->payload_len = payload_len;
  info->escaped = escaped;
  info->flags = flags;
  if (body) *body = b;
  return AGOQ_CODEC_OK;
}

agoq_codec_status agoq_frame_decode(const void* buf, size_t len, agoq_dtype out, void* dst,
                                    size_t dst_count) {
  return agoq_frame_decode_mt(buf, len, out, dst, dst_count, 1);
}

agoq_codec_status agoq_frame_decode_mt(const void* buf, size_t len, agoq_dtype out, void* dst,
                                       size_t dst_count, int nthreads) {
  agoq_frame_info info;
  const void* body;
  if ((unsigned)out >= AGOQ_DTYPE_COUNT || (dst == NULL && dst_count != 0)) return AGOQ_CODEC_EARG;
  agoq_codec_status st = agoq_frame_parse(buf, len, &info, &body);
  if (st != AGOQ_CODEC_OK) return st;
  /* The receiver knows how many elements it expects; a frame that says otherwise is bad. */
  if (info.count != (uint64_t)dst_count) return AGOQ_CODEC_ECORRUPT;
  if (nthreads > 1)
    return agoq_dequantize_mt(&info.params, body, (size_t)info.payload_len, dst_count, out, dst, nthreads);
  return agoq_dequantize(&info.params, body, (size_t)info.payload_len, dst_count, out, dst);
}

agoq_codec_status agoq_frame_decode_accumulate(const void* buf, size_t len, float* acc,
                                               size_t acc_count) {
  return agoq_frame_decode_accumulate_mt(buf, len, acc, acc_count, 1);
}

agoq_codec_status agoq_frame_decode_accumulate_mt(const void* buf, size_t len, float* acc,
                                                  size_t acc_count, int nthreads) {
  agoq_frame_info info;
  const void* body;
  if (acc == NULL && acc_count != 0) return AGOQ_CODEC_EARG;
  agoq_codec_status st = agoq_frame_parse(buf, len, &info, &body);
  if (st != AGOQ_CODEC_OK) return st;
  if (info.count != (uint64_t)acc_count) return AGOQ_CODEC_ECORRUPT;
  if (nthreads > 1)
    return agoq_dequantize_accumulate_mt(&info.params, body, (size_t)info.payload_len, acc_count, acc, nthreads);
  return agoq_dequantize_accumulate(&info.params, body, (size_t)info.payload_len, acc_count, acc);
}
