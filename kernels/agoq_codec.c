/*
 * The codec driver: parameters, names, sizes, the body layout, the escape bitmap and the
 * raw region. The arithmetic is the active kernel table's (cpu/agoq_codec_cpu.h); this file
 * hands it whole chunks of blocks with small stack arrays for the per-block scales and
 * escape flags, so a call allocates nothing and the data stays in cache between the scan
 * and the encode of a chunk.
 */
#include <string.h>
#include <strings.h>

#include "agoq_codec_internal.h"
#include "cpu/agoq_fpconv.h"

/* Elements per chunk: the scan and the encode of a chunk share L1/L2. A chunk is a multiple
 * of 8 blocks for every block size, so it writes whole bitmap bytes. */
#define AGOQ_CHUNK_ELEMS 16384u
#define AGOQ_CHUNK_BLOCKS_MAX (AGOQ_CHUNK_ELEMS / AGOQ_CODEC_BLOCK_MIN)

/* ---- names and parameters ----------------------------------------------------------------- */

static const char* const format_names[AGOQ_FORMAT_COUNT] = {"none", "int8", "int4", "fp8e4m3",
                                                             "fp8e5m2"};
static const char* const dtype_names[AGOQ_DTYPE_COUNT] = {"fp32", "bf16", "fp16"};
static const char* const dtype_alt_names[AGOQ_DTYPE_COUNT] = {"float32", "bfloat16", "float16"};

const char* agoq_format_name(agoq_format f) {
  return (unsigned)f < AGOQ_FORMAT_COUNT ? format_names[f] : "unknown";
}

const char* agoq_dtype_name(agoq_dtype t) {
  return (unsigned)t < AGOQ_DTYPE_COUNT ? dtype_names[t] : "unknown";
}

int agoq_format_from_name(const char* s, agoq_format* f) {
  if (s == NULL || f == NULL) return -1;
  for (int i = 0; i < AGOQ_FORMAT_COUNT; i++) {
    if (strcasecmp(s, format_names[i]) == 0) {
      *f = (agoq_format)i;
      return 0;
    }
  }
  return -1;
}

int agoq_dtype_from_name(const char* s, agoq_dtype* t) {
  if (s == NULL || t == NULL) return -1;
  for (int i = 0; i < AGOQ_DTYPE_COUNT; i++) {
    if (strcasecmp(s, dtype_names[i]) == 0 || strcasecmp(s, dtype_alt_names[i]) == 0) {
      *t = (agoq_dtype)i;
      return 0;
    }
  }
  return -1;
}

size_t agoq_dtype_size(agoq_dtype t) {
  switch (t) {
    case AGOQ_DTYPE_FP32: return 4;
    case AGOQ_DTYPE_BF16:
    case AGOQ_DTYPE_FP16: return 2;
    default: return 0;
  }
}

const char* agoq_codec_status_str(agoq_codec_status s) {
  switch (s) {
    case AGOQ_CODEC_OK: return "ok";
    case AGOQ_CODEC_EARG: return "invalid codec parameters";
    case AGOQ_CODEC_ESPACE: return "output buffer too small";
    case AGOQ_CODEC_ECORRUPT: return "corrupt frame or body";
    case AGOQ_CODEC_EVERSION: return "unknown frame version";
  }
  return "unknown codec status";
}

static bool block_valid(uint32_t b) {
  return b >= AGOQ_CODEC_BLOCK_MIN && b <= AGOQ_CODEC_BLOCK_MAX && (b & (b - 1)) == 0;
}

static bool format_is_int(agoq_format f) {
  return f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4;
}

agoq_codec_status agoq_codec_params_check(const agoq_codec_params* p) {
  if (p == NULL || (unsigned)p->format >= AGOQ_FORMAT_COUNT || (unsigned)p->dtype >= AGOQ_DTYPE_COUNT)
    return AGOQ_CODEC_EARG;
  /* NONE has no blocks and nothing to round: block and stochastic are ignored. */
  if (p->format == AGOQ_FORMAT_NONE) return AGOQ_CODEC_OK;
  if (!block_valid(p->block)) return AGOQ_CODEC_EARG;
  if (p->stochastic && !format_is_int(p->format)) return AGOQ_CODEC_EARG;
  return AGOQ_CODEC_OK;
}

/* ---- sizes and layout ---------------------------------------------------------------------- */

bool agoq_codec_layout_init(agoq_codec_layout* lay, const agoq_codec_params* p, size_t n) {
  memset(lay, 0, sizeof *lay);
  lay->p = *p;
  lay->n = n;
  lay->esize = agoq_dtype_size(p->dtype);
  lay->nb = n / p->block + (n % p->block != 0);
  lay->bitmap_bytes = (lay->nb / 64 + (lay->nb % 64 != 0)) * 8;
  lay->codes_bytes = p->format == AGOQ_FORMAT_INT4 ? n / 2 + (n & 1) : n;
  lay->raw_block = (size_t)p->block * lay->esize;
  size_t scales_bytes = lay->nb * sizeof(float); /* nb <= SIZE_MAX / 32: no overflow */
  size_t head;
  if (__builtin_add_overflow(lay->bitmap_bytes, scales_bytes, &head) ||
      __builtin_add_overflow(head, lay->codes_bytes, &head))
    return false;
  return true;
}

void agoq_codec_layout_attach(agoq_codec_layout* lay, const void* body) {
  lay->bitmap = (uint8_t*)body;
  lay->scales = lay->bitmap + lay->bitmap_bytes;
  lay->codes = lay->scales + lay->nb * sizeof(float);
  lay->raw = lay->codes + lay->codes_bytes;
}

/* The raw region holds whole blocks: a short last block that is escaped is padded with zero
 * bytes to the block size, so the body length depends only on the number of escaped blocks
 * (agoq_codec_body_size and the frame header rely on that). */
size_t agoq_codec_layout_size(const agoq_codec_layout* lay, size_t escaped) {
  size_t head = lay->bitmap_bytes + lay->nb * sizeof(float) + lay->codes_bytes, raw, total;
  if (escaped > lay->nb || __builtin_mul_overflow(escaped, lay->raw_block, &raw) ||
      __builtin_add_overflow(head, raw, &total))
    return SIZE_MAX;
  return total;
}

size_t agoq_codec_nblocks(const agoq_codec_params* p, size_t n) {
  if (agoq_codec_params_check(p) != AGOQ_CODEC_OK || p->format == AGOQ_FORMAT_NONE) return 0;
  return n / p->block + (n % p->block != 0);
}

size_t agoq_codec_body_size(const agoq_codec_params* p, size_t n, size_t escaped_blocks) {
  if (agoq_codec_params_check(p) != AGOQ_CODEC_OK) return 0;
  if (p->format == AGOQ_FORMAT_NONE) {
    size_t bytes;
    if (escaped_blocks != 0 || __builtin_mul_overflow(n, agoq_dtype_size(p->dtype), &bytes))
      return SIZE_MAX;
    return bytes;
  }
  agoq_codec_layout lay;
  if (!agoq_codec_layout_init(&lay, p, n)) return SIZE_MAX;
  return agoq_codec_layout_size(&lay, escaped_blocks);
}

size_t agoq_codec_body_size_max(const agoq_codec_params* p, size_t n) {
  return agoq_codec_body_size(p, n, agoq_codec_nblocks(p, n));
}

/* ---- escape bitmap --------------------------------------------------------------------------- */

static uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, sizeof v); /* little-endian host: bit i of the word = block 64w + i */
  return v;
}

agoq_codec_status agoq_codec_body_check(const agoq_codec_params* p, const void* body,
                                        size_t body_len, size_t n, agoq_codec_layout* lay,
                                        size_t* escaped) {
  if (!agoq_codec_layout_init(lay, p, n)) return AGOQ_CODEC_EARG;
  size_t head = agoq_codec_layout_size(lay, 0);
  if (head == SIZE_MAX) return AGOQ_CODEC_EARG;
  if (body_len < head) return AGOQ_CODEC_ECORRUPT;
  if (body != NULL) agoq_codec_layout_attach(lay, body); /* only now known to hold the head */
  size_t words = lay->bitmap_bytes / 8, count = 0;
  for (size_t w = 0; w < words; w++) count += (size_t)__builtin_popcountll(load_u64(lay->bitmap + 8 * w));
  if (lay->nb % 64 != 0) {
    uint64_t last = load_u64(lay->bitmap + 8 * (words - 1));
    if (last >> (lay->nb % 64) != 0) return AGOQ_CODEC_ECORRUPT; /* a bit past the last block */
  }
  if (body_len != agoq_codec_layout_size(lay, count)) return AGOQ_CODEC_ECORRUPT;
  *escaped = count;
  return AGOQ_CODEC_OK;
}

static bool block_escaped(const agoq_codec_layout* lay, size_t b) {
  return (lay->bitmap[b / 8] >> (b % 8)) & 1u;
}

static size_t block_elems(const agoq_codec_layout* lay, size_t b) {
  size_t start = b * lay->p.block;
  return lay->n - start < lay->p.block ? lay->n - start : lay->p.block;
}

/* ---- raw conversions (escaped blocks, format NONE): IEEE, see cpu/agoq_fpconv.h -------------- */

static float raw_load(agoq_dtype t, const uint8_t* src, size_t i) {
  uint16_t h;
  switch (t) {
    case AGOQ_DTYPE_FP32: {
      float f;
      memcpy(&f, src + 4 * i, sizeof f);
      return f;
    }
    case AGOQ_DTYPE_BF16: memcpy(&h, src + 2 * i, sizeof h); return agoq_bf16_to_fp32(h);
    default: memcpy(&h, src + 2 * i, sizeof h); return agoq_fp16_to_fp32(h);
  }
}

void agoq_codec_raw_convert(agoq_dtype in, const uint8_t* src, size_t count, agoq_dtype out,
                            void* dst) {
  if (in == out) {
    memcpy(dst, src, count * agoq_dtype_size(in));
    return;
  }
  switch (out) {
    case AGOQ_DTYPE_FP32:
      for (size_t i = 0; i < count; i++) ((float*)dst)[i] = raw_load(in, src, i);
      break;
    case AGOQ_DTYPE_BF16:
      for (size_t i = 0; i < count; i++) ((uint16_t*)dst)[i] = agoq_fp32_to_bf16(raw_load(in, src, i));
      break;
    default:
      for (size_t i = 0; i < count; i++) ((uint16_t*)dst)[i] = agoq_fp32_to_fp16(raw_load(in, src, i));
      break;
  }
}

void agoq_codec_raw_accumulate(agoq_dtype in, const uint8_t* src, size_t count, float* acc) {
  for (size_t i = 0; i < count; i++) acc[i] += raw_load(in, src, i);
}

void agoq_codec_overflow_to_inf(agoq_dtype out, float* x, size_t n) {
  uint32_t from = out == AGOQ_DTYPE_BF16   ? AGOQ_BF16_INF_FROM_BITS
                  : out == AGOQ_DTYPE_FP16 ? AGOQ_FP16_INF_FROM_BITS
                                           : AGOQ_FP32_INF_FROM_BITS;
  if (from == AGOQ_FP32_INF_FROM_BITS || x == NULL) return; /* fp32 overflows by itself */
  /* Bit operations only (no floating-point environment involved): every table gives the
   * same bits. */
  agoq_cpu_kernels_active()->overflow_inf(x, n, from);
}

void agoq_codec_narrow_fp32(agoq_dtype out, const float* acc, size_t n, void* dst) {
  if (n == 0) return;
  if (out == AGOQ_DTYPE_FP32) {
    memcpy(dst, acc, n * sizeof(float));
  } else if (out == AGOQ_DTYPE_BF16) {
    uint16_t* d = dst;
    for (size_t i = 0; i < n; i++) d[i] = agoq_fp32_to_bf16(acc[i]);
  } else {
    uint16_t* d = dst;
    for (size_t i = 0; i < n; i++) d[i] = agoq_fp32_to_fp16(acc[i]);
  }
}

/* ---- block-range workers ------------------------------------------------------------------- */

static size_t chunk_blocks(const agoq_codec_layout* lay) {
  return AGOQ_CHUNK_ELEMS / lay->p.block;
}

static size_t codes_offset(const agoq_codec_layout* lay, size_t elem) {
  return lay->p.format == AGOQ_FORMAT_INT4 ? elem / 2 : elem;
}

/* The kernels index whole arrays from block 0; a chunk is handed over as a view that starts
 * at its first block (with first_index moved along, so stochastic counters stay global). */
size_t agoq_codec_quantize_blocks(const agoq_codec_layout* lay, const void* src, size_t b0, size_t b1) {
  float scales[AGOQ_CHUNK_BLOCKS_MAX];
  uint8_t esc[AGOQ_CHUNK_BLOCKS_MAX];
  const agoq_cpu_kernels* k = agoq_cpu_kernels_active();
  const agoq_cpu_kernels* kenc = lay->p.stochastic ? &agoq_cpu_kernels_portable : k;
  const size_t step = chunk_blocks(lay);
  size_t escaped = 0;
  for (size_t c0 = b0; c0 < b1; c0 += step) {
    size_t nbk = b1 - c0 < step ? b1 - c0 : step;
    size_t e0 = c0 * lay->p.block;
    const uint8_t* s = (const uint8_t*)src + e0 * lay->esize;
    agoq_codec_params pv = lay->p;
    pv.first_index += e0;
    k->scan(pv.format, pv.dtype, pv.block, s, lay->n - e0, 0, nbk, scales, esc);
    kenc->encode(&pv, s, lay->n - e0, 0, nbk, scales, esc, lay->codes + codes_offset(lay, e0));
    memcpy(lay->scales + c0 * sizeof(float), scales, nbk * sizeof(float));
    for (size_t j = 0; j < nbk; j += 8) {
      unsigned byte = 0;
      for (size_t i = 0; i < 8 && j + i < nbk; i++) byte |= (unsigned)(esc[j + i] != 0) << i;
      lay->bitmap[(c0 + j) / 8] = (uint8_t)byte;
      escaped += (size_t)__builtin_popcount(byte);
    }
  }
  return escaped;
}

void agoq_codec_copy_raw(const agoq_codec_layout* lay, const void* src, size_t b0, size_t b1,
                         size_t raw_index0) {
  size_t r = raw_index0;
  for (size_t b = b0; b < b1; b++) {
    if ((b % 8) == 0 && b + 8 <= b1 && lay->bitmap[b / 8] == 0) {
      b += 7;
      continue;
    }
    if (!block_escaped(lay, b)) continue;
    size_t len = block_elems(lay, b) * lay->esize;
    uint8_t* dst = lay->raw + r * lay->raw_block;
    memcpy(dst, (const uint8_t*)src + b * lay->raw_block, len);
    memset(dst + len, 0, lay->raw_block - len);
    r++;
  }
}

static void unpack_escaped(const agoq_codec_layout* lay, size_t c0, size_t nbk, uint8_t* esc) {
  for (size_t j = 0; j < nbk; j += 8) {
    unsigned byte = lay->bitmap[(c0 + j) / 8];
    for (size_t i = 0; i < 8 && j + i < nbk; i++) esc[j + i] = (uint8_t)((byte >> i) & 1u);
  }
}

void agoq_codec_decode_blocks(const agoq_codec_layout* lay, size_t b0, size_t b1, size_t raw_index0,
                              agoq_dtype out, void* dst) {
  float scales[AGOQ_CHUNK_BLOCKS_MAX];
  uint8_t esc[AGOQ_CHUNK_BLOCKS_MAX];
  const agoq_cpu_kernels* k = agoq_cpu_kernels_active();
  const size_t step = chunk_blocks(lay), osize = agoq_dtype_size(out);
  size_t r = raw_index0;
  for (size_t c0 = b0; c0 < b1; c0 += step) {
    size_t nbk = b1 - c0 < step ? b1 - c0 : step;
    size_t e0 = c0 * lay->p.block;
    uint8_t* d = (uint8_t*)dst + e0 * osize;
    memcpy(scales, lay->scales + c0 * sizeof(float), nbk * sizeof(float));
    unpack_escaped(lay, c0, nbk, esc);
    k->decode(lay->p.format, out, lay->p.block, lay->codes + codes_offset(lay, e0), lay->n - e0, 0,
              nbk, scales, esc, d);
    for (size_t j = 0; j < nbk; j++) {
      if (!esc[j]) continue;
      agoq_codec_raw_convert(lay->p.dtype, lay->raw + r * lay->raw_block, block_elems(lay, c0 + j),
                             out, d + j * lay->p.block * osize);
      r++;
    }
  }
}

void agoq_codec_decode_acc_blocks(const agoq_codec_layout* lay, size_t b0, size_t b1,
                                  size_t raw_index0, float* acc) {
  float scales[AGOQ_CHUNK_BLOCKS_MAX];
  uint8_t esc[AGOQ_CHUNK_BLOCKS_MAX];
  const agoq_cpu_kernels* k = agoq_cpu_kernels_active();
  const size_t step = chunk_blocks(lay);
  size_t r = raw_index0;
  for (size_t c0 = b0; c0 < b1; c0 += step) {
    size_t nbk = b1 - c0 < step ? b1 - c0 : step;
    size_t e0 = c0 * lay->p.block;
    float* a = acc + e0;
    memcpy(scales, lay->scales + c0 * sizeof(float), nbk * sizeof(float));
    unpack_escaped(lay, c0, nbk, esc);
    k->decode_acc(lay->p.format, lay->p.block, lay->codes + codes_offset(lay, e0), lay->n - e0, 0,
                  nbk, scales, esc, a);
    for (size_t j = 0; j < nbk; j++) {
      if (!esc[j]) continue;
      agoq_codec_raw_accumulate(lay->p.dtype, lay->raw + r * lay->raw_block,
                                block_elems(lay, c0 + j), a + j * lay->p.block);
      r++;
    }
  }
}

/* ---- entry points ------------------------------------------------------------------------------ */

agoq_codec_status agoq_codec_quantize_check(const agoq_codec_params* p, const void* src, size_t n,
                                            const void* body, size_t* body_len) {
  if (agoq_codec_params_check(p) != AGOQ_CODEC_OK || body_len == NULL || (src == NULL && n != 0))
    return AGOQ_CODEC_EARG;
  (void)body;
  return AGOQ_CODEC_OK;
}

agoq_codec_status agoq_codec_decode_check(const agoq_codec_params* p, const void* body,
                                          size_t body_len, size_t n, const void* dst) {
  if (agoq_codec_params_check(p) != AGOQ_CODEC_OK || (body == NULL && body_len != 0) ||
      (dst == NULL && n != 0))
    return AGOQ_CODEC_EARG;
  return AGOQ_CODEC_OK;
}

static agoq_codec_status quantize_none(const agoq_codec_params* p, const void* src, size_t n,
                                       void* body, size_t cap, size_t* body_len,
                                       size_t* escaped_blocks) {
  size_t bytes;
  if (__builtin_mul_overflow(n, agoq_dtype_size(p->dtype), &bytes)) return AGOQ_CODEC_EARG;
  if (cap < bytes || (body == NULL && bytes != 0)) return AGOQ_CODEC_ESPACE;
  if (bytes) memcpy(body, src, bytes);
  *body_len = bytes;
  if (escaped_blocks) *escaped_blocks = 0;
  return AGOQ_CODEC_OK;
}

static agoq_codec_status agoq_quantize_impl(const agoq_codec_params* p, const void* src, size_t n, void* body,
                                size_t cap, size_t* body_len, size_t* escaped_blocks) {
  agoq_codec_status st = agoq_codec_quantize_check(p, src, n, body, body_len);
  if (st != AGOQ_CODEC_OK) return st;
  if (p->format == AGOQ_FORMAT_NONE) return quantize_none(p, src, n, body, cap, body_len, escaped_blocks);
  agoq_codec_layout lay;
  if (!agoq_codec_layout_init(&lay, p, n)) return AGOQ_CODEC_EARG;
  size_t head = agoq_codec_layout_size(&lay, 0);
  if (head == SIZE_MAX) return AGOQ_CODEC_EARG;
  if (cap < head || (body == NULL && head != 0)) return AGOQ_CODEC_ESPACE;
  if (head == 0) { /* n == 0 */
    *body_len = 0;
    if (escaped_blocks) *escaped_blocks = 0;
    return AGOQ_CODEC_OK;
  }
  agoq_codec_layout_attach(&lay, body);
  memset(lay.bitmap, 0, lay.bitmap_bytes);
  size_t escaped = agoq_codec_quantize_blocks(&lay, src, 0, lay.nb);
  size_t total = agoq_codec_layout_size(&lay, escaped);
  if (total == SIZE_MAX) return AGOQ_CODEC_EARG;
  if (total > cap) return AGOQ_CODEC_ESPACE;
  if (escaped) agoq_codec_copy_raw(&lay, src, 0, lay.nb, 0);
  *body_len = total;
  if (escaped_blocks) *escaped_blocks = escaped;
  return AGOQ_CODEC_OK;
}

static agoq_codec_status agoq_dequantize_impl(const agoq_codec_params* p, const void* body, size_t body_len,
                                  size_t n, agoq_dtype out, void* dst) {
  agoq_codec_status st = agoq_codec_decode_check(p, body, body_len, n, dst);
  if (st != AGOQ_CODEC_OK) return st;
  if ((unsigned)out >= AGOQ_DTYPE_COUNT) return AGOQ_CODEC_EARG;
  if (p->format == AGOQ_FORMAT_NONE) {
    size_t bytes;
    if (__builtin_mul_overflow(n, agoq_dtype_size(p->dtype), &bytes)) return AGOQ_CODEC_EARG;
    if (body_len != bytes) return AGOQ_CODEC_ECORRUPT;
    if (n) agoq_codec_raw_convert(p->dtype, body, n, out, dst);
    return AGOQ_CODEC_OK;
  }
  agoq_codec_layout lay;
  size_t escaped;
  st = agoq_codec_body_check(p, body, body_len, n, &lay, &escaped);
  if (st != AGOQ_CODEC_OK || n == 0) return st;
  agoq_codec_decode_blocks(&lay, 0, lay.nb, 0, out, dst);
  return AGOQ_CODEC_OK;
}

static agoq_codec_status agoq_dequantize_accumulate_impl(const agoq_codec_params* p, const void* body,
                                             size_t body_len, size_t n, float* acc) {
  agoq_codec_status st = agoq_codec_decode_check(p, body, body_len, n, acc);
  if (st != AGOQ_CODEC_OK) return st;
  if (p->format == AGOQ_FORMAT_NONE) {
    size_t bytes;
    if (__builtin_mul_overflow(n, agoq_dtype_size(p->dtype), &bytes)) return AGOQ_CODEC_EARG;
    if (body_len != bytes) return AGOQ_CODEC_ECORRUPT;
    agoq_codec_raw_accumulate(p->dtype, body, n, acc);
    return AGOQ_CODEC_OK;
  }
  agoq_codec_layout lay;
  size_t escaped;
  st = agoq_codec_body_check(p, body, body_len, n, &lay, &escaped);
  if (st != AGOQ_CODEC_OK || n == 0) return st;
  agoq_codec_decode_acc_blocks(&lay, 0, lay.nb, 0, acc);
  return AGOQ_CODEC_OK;
}

/* Public entry points: the kernels run in the default floating-point environment. */
agoq_codec_status agoq_quantize(const agoq_codec_params* p, const void* src, size_t n, void* body,
                                size_t cap, size_t* body_len, size_t* escaped_blocks) {
  agoq_fpenv env;
  agoq_fpenv_enter(&env);
  agoq_codec_status st = agoq_quantize_impl(p, src, n, body, cap, body_len, escaped_blocks);
  agoq_fpenv_leave(&env);
  return st;
}

agoq_codec_status agoq_dequantize(const agoq_codec_params* p, const void* body, size_t body_len,
                                  size_t n, agoq_dtype out, void* dst) {
  agoq_fpenv env;
  agoq_fpenv_enter(&env);
  agoq_codec_status st = agoq_dequantize_impl(p, body, body_len, n, out, dst);
  agoq_fpenv_leave(&env);
  return st;
}

agoq_codec_status agoq_dequantize_accumulate(const agoq_codec_params* p, const void* body,
                                             size_t body_len, size_t n, float* acc) {
  agoq_fpenv env;
  agoq_fpenv_enter(&env);
  agoq_codec_status st = agoq_dequantize_accumulate_impl(p, body, body_len, n, acc);
  agoq_fpenv_leave(&env);
  return st;
}
