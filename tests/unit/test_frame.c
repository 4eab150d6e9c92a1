/* Frames (kernels/agoq_frame.h): round trips, and every malformed frame is rejected with the
 * right status: truncated at every length, every header bit flipped, payload bits flipped
 * under a payload CRC, oversized or inconsistent lengths, unknown version or magic, bad
 * escape bitmaps and scales, element counts that disagree with the receiver's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_codec_internal.h"
#include "agoq_frame.h"

static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* After editing a header field: a valid header CRC again, so the field check is what fails. */
static void fix_header_crc(uint8_t* f) {
  put_u32(f + 44, agoq_crc32c(0, f, 44));
}

static void fix_payload_crc(uint8_t* f, size_t payload_len) {
  put_u32(f + 32, agoq_crc32c(0, f + 48, payload_len));
  fix_header_crc(f);
}

static void fill(float* x, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((int64_t)(seed >> 40) - (1 << 23)) / (float)(1 << 20);
  }
}

/* A frame of n fp32 elements with blocks 1 and (for n > 200) the last one escaped. */
static uint8_t* make_frame(const agoq_codec_params* p, size_t n, bool crc, size_t* len) {
  float* x = malloc(n * 4 + 4);
  assert_non_null(x);
  fill(x, n, 1);
  if (n > 40) x[40] = NAN;
  if (n > 200) x[n - 1] = -INFINITY;
  size_t cap = agoq_frame_size_max(p, n);
  uint8_t* f = malloc(cap);
  assert_non_null(f);
  assert_int_equal(agoq_frame_encode(p, x, n, crc, f, cap, len), AGOQ_CODEC_OK);
  free(x);
  return f;
}

static void test_crc32c(void** state) {
  (void)state;
  assert_int_equal(agoq_crc32c(0, "123456789", 9), 0xe3069283u);
  assert_int_equal(agoq_crc32c_portable(0, "123456789", 9), 0xe3069283u);
  assert_int_equal(agoq_crc32c(0, NULL, 0), 0);
  uint8_t buf[4096 + 16];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 131 + (i >> 5));
  /* The SSE4.2 path (when present) and the tables agree at every alignment and length. */
  for (size_t off = 0; off < 16; off++) {
    for (size_t len = 0; len < 300; len += 1 + len / 16) {
      assert_int_equal(agoq_crc32c(0, buf + off, len), agoq_crc32c_portable(0, buf + off, len));
    }
  }
  /* Three-lane path (from 3 x 4 KiB on): lengths around its lane multiples, chained starts. */
  size_t big = 64 * 1024 + 128;
  uint8_t* b = malloc(big);
  assert_non_null(b);
  for (size_t i = 0; i < big; i++) b[i] = (uint8_t)((i * 2654435761u) >> 13);
  const size_t lens[] = {12287, 12288, 12289, 12295, 24576, 24577, 36863, 65536, 65536 + 63};
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
    for (size_t off = 0; off < 3; off++) {
      assert_int_equal(agoq_crc32c(0, b + off, lens[k]), agoq_crc32c_portable(0, b + off, lens[k]));
      assert_int_equal(agoq_crc32c(0x12345678u, b + off, lens[k]), agoq_crc32c_portable(0x12345678u, b + off, lens[k]));
    }
  free(b);
  /* Chaining. */
  uint32_t whole = agoq_crc32c(0, buf, sizeof buf);
  assert_int_equal(agoq_crc32c(agoq_crc32c(0, buf, 1000), buf + 1000, sizeof buf - 1000), whole);
  assert_int_equal(agoq_crc32c_portable(agoq_crc32c_portable(0, buf, 7), buf + 7, sizeof buf - 7), whole);
}

static void test_roundtrip(void** state) {
  (void)state;
  const size_t n = 1000;
  float x[1000], y[1000], y2[1000], acc[1000], acc2[1000];
  fill(x, n, 7);
  x[123] = NAN;
  for (int f = AGOQ_FORMAT_NONE; f < AGOQ_FORMAT_COUNT; f++) {
    for (int t = 0; t < AGOQ_DTYPE_COUNT; t++) {
      for (int crc = 0; crc < 2; crc++) {
        agoq_codec_params p = {.format = (agoq_format)f, .dtype = (agoq_dtype)t, .block = 64,
                               .stochastic = crc && (f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4),
                               .seed = 5};
        /* The input as dtype t: fp32 bits, or the top half (bf16) / a small-range fp16. */
        uint8_t in[4000];
        for (size_t i = 0; i < n; i++) {
          uint32_t b;
          memcpy(&b, &x[i], 4);
          if (t == AGOQ_DTYPE_FP32) memcpy(in + 4 * i, &b, 4);
          else if (t == AGOQ_DTYPE_BF16) {
            uint16_t h = (uint16_t)(b >> 16);
            memcpy(in + 2 * i, &h, 2);
          } else {
            uint16_t h = (uint16_t)(0x3c00u + (i % 1000)); /* 1.0 .. 2.0 */
            if (i == 123) h = 0x7e00u;
            memcpy(in + 2 * i, &h, 2);
          }
        }
        size_t cap = agoq_frame_size_max(&p, n), len;
        uint8_t* fr = malloc(cap + 64);
        assert_non_null(fr);
        assert_int_equal(agoq_frame_encode(&p, in, n, crc, fr, cap, &len), AGOQ_CODEC_OK);
        assert_true(len <= cap);
        /* Header layout, byte by byte. */
        assert_memory_equal(fr, "AGQF", 4);
        assert_int_equal(fr[4], 1);
        assert_int_equal(fr[5], f);
        assert_int_equal(fr[6], t);
        assert_int_equal(get_u32(fr + 8), f == AGOQ_FORMAT_NONE ? 0 : 64);
        assert_int_equal(get_u32(fr + 16), n);
        assert_int_equal(get_u32(fr + 44), agoq_crc32c(0, fr, 44));
        agoq_frame_info info;
        const void* body;
        /* A buffer longer than the frame is fine. */
        memset(fr + len, 0xee, 64);
        assert_int_equal(agoq_frame_parse(fr, len + 64, &info, &body), AGOQ_CODEC_OK);
        assert_ptr_equal(body, fr + 48);
        assert_int_equal(info.count, n);
        assert_int_equal(info.payload_len, len - 48);
        assert_int_equal(info.params.format, f);
        assert_int_equal(info.params.dtype, t);
        assert_int_equal(info.params.stochastic, p.stochastic);
        assert_int_equal(info.escaped, f == AGOQ_FORMAT_NONE ? 0 : 1);
        assert_int_equal(info.flags, (crc ? 1u : 0u) | (p.stochastic ? 2u : 0u));
        for (int out = 0; out < AGOQ_DTYPE_COUNT; out++) {
          assert_int_equal(agoq_frame_decode(fr, len, (agoq_dtype)out, y, n), AGOQ_CODEC_OK);
          assert_int_equal(agoq_dequantize(&p, fr + 48, len - 48, n, (agoq_dtype)out, y2), AGOQ_CODEC_OK);
          assert_memory_equal(y, y2, n * (out == AGOQ_DTYPE_FP32 ? 4 : 2));
        }
        for (size_t i = 0; i < n; i++) acc[i] = acc2[i] = (float)i;
        assert_int_equal(agoq_frame_decode_accumulate(fr, len, acc, n), AGOQ_CODEC_OK);
        assert_int_equal(agoq_dequantize_accumulate(&p, fr + 48, len - 48, n, acc2), AGOQ_CODEC_OK);
        assert_memory_equal(acc, acc2, n * 4);
        /* The receiver expects another count. */
        assert_int_equal(agoq_frame_decode(fr, len, AGOQ_DTYPE_FP32, y, n - 1), AGOQ_CODEC_ECORRUPT);
        assert_int_equal(agoq_frame_decode_accumulate(fr, len, acc, n + 1), AGOQ_CODEC_ECORRUPT);
        /* Encode into too little space. */
        size_t l2;
        assert_int_equal(agoq_frame_encode(&p, in, n, crc, fr, len - 1, &l2), AGOQ_CODEC_ESPACE);
        assert_int_equal(agoq_frame_encode(&p, in, n, crc, fr, 47, &l2), AGOQ_CODEC_ESPACE);
        free(fr);
      }
    }
  }
  /* An empty frame. */
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  uint8_t fr[64];
  size_t len;
  assert_int_equal(agoq_frame_encode(&p, NULL, 0, true, fr, sizeof fr, &len), AGOQ_CODEC_OK);
  assert_int_equal(len, 48);
  assert_int_equal(agoq_frame_decode(fr, len, AGOQ_DTYPE_FP32, NULL, 0), AGOQ_CODEC_OK);
  /* Arguments. */
  assert_int_equal(agoq_frame_encode(&p, x, (size_t)AGOQ_FRAME_MAX_COUNT + 1, false, fr, sizeof fr, &len),
                   AGOQ_CODEC_EARG);
  assert_int_equal(agoq_frame_parse(fr, len, NULL, NULL), AGOQ_CODEC_EARG);
  assert_int_equal(agoq_frame_decode(fr, len, (agoq_dtype)9, y, 0), AGOQ_CODEC_EARG);
  assert_int_equal(agoq_frame_size_max(&p, (size_t)AGOQ_FRAME_MAX_COUNT + 1), 0);
  assert_int_equal(agoq_frame_size_max(&p, 1000), 48 + 8 + 32 + 1000 + 8 * 128 * 4);
  /* Nominal: no block escapes; what a frame of ordinary values takes exactly. */
  assert_int_equal(agoq_frame_size_nominal(&p, (size_t)AGOQ_FRAME_MAX_COUNT + 1), 0);
  assert_int_equal(agoq_frame_size_nominal(&p, 1000), 48 + 8 + 32 + 1000);
  static float ordinary[1000];
  static uint8_t big[48 + 8 + 32 + 1000 + 8 * 128 * 4];
  for (int i = 0; i < 1000; i++) ordinary[i] = (float)(i % 37) - 18.0f;
  assert_int_equal(agoq_frame_encode(&p, ordinary, 1000, true, big, sizeof big, &len), AGOQ_CODEC_OK);
  assert_int_equal(len, agoq_frame_size_nominal(&p, 1000));
  ordinary[500] = 1.0f / 0.0f; /* one escaped block: past nominal */
  assert_int_equal(agoq_frame_encode(&p, ordinary, 1000, true, big, sizeof big, &len), AGOQ_CODEC_OK);
  assert_true(len > agoq_frame_size_nominal(&p, 1000));
}

static void test_truncated(void** state) {
  (void)state;
  for (int f = AGOQ_FORMAT_NONE; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP32, .block = 32};
    size_t len;
    uint8_t* fr = make_frame(&p, 300, f % 2 == 0, &len);
    agoq_frame_info info;
    assert_int_equal(agoq_frame_parse(fr, len, &info, NULL), AGOQ_CODEC_OK);
    for (size_t l = 0; l < len; l++) {
      /* An exact-size copy: ASan would see any read past the prefix. */
      uint8_t* cut = malloc(l ? l : 1);
      assert_non_null(cut);
      memcpy(cut, fr, l);
      assert_int_equal(agoq_frame_parse(cut, l, &info, NULL), AGOQ_CODEC_ECORRUPT);
      float y[300];
      assert_int_equal(agoq_frame_decode(cut, l, AGOQ_DTYPE_FP32, y, 300), AGOQ_CODEC_ECORRUPT);
      free(cut);
    }
    free(fr);
  }
}

static void test_header_bit_flips(void** state) {
  (void)state;
  for (int f = AGOQ_FORMAT_NONE; f < AGOQ_FORMAT_COUNT; f++) {
    for (int crc = 0; crc < 2; crc++) {
      agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_BF16, .block = 64};
      size_t len;
      uint8_t* fr = make_frame(&p, 500, crc, &len);
      agoq_frame_info info;
      for (size_t bit = 0; bit < 48 * 8; bit++) {
        fr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        agoq_codec_status st = agoq_frame_parse(fr, len, &info, NULL);
        agoq_codec_status want = bit / 8 < 4 ? AGOQ_CODEC_ECORRUPT
                                 : bit / 8 == 4 ? AGOQ_CODEC_EVERSION
                                                : AGOQ_CODEC_ECORRUPT;
        if (st != want) {
          fprintf(stderr, "format %d: header bit %zu flipped: status %d, want %d\n", f, bit, st, want);
          fail();
        }
        fr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      }
      assert_int_equal(agoq_frame_parse(fr, len, &info, NULL), AGOQ_CODEC_OK);
      free(fr);
    }
  }
}

static void test_payload_bit_flips(void** state) {
  (void)state;
  for (int f = AGOQ_FORMAT_NONE; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP16, .block = 32};
    size_t len;
    float y[250];
    /* With the payload CRC every flip is caught. */
    uint8_t* fr = make_frame(&p, 250, true, &len);
    for (size_t bit = 48 * 8; bit < len * 8; bit++) {
      fr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      assert_int_equal(agoq_frame_decode(fr, len, AGOQ_DTYPE_FP32, y, 250), AGOQ_CODEC_ECORRUPT);
      fr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    free(fr);
    /* Without it a flip may decode to other values, but never out of bounds or to a crash;
     * flips in the bitmap and in the scales' sign and exponent are still caught. */
    fr = make_frame(&p, 250, false, &len);
    size_t caught = 0;
    for (size_t bit = 48 * 8; bit < len * 8; bit++) {
      fr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      agoq_codec_status st = agoq_frame_decode(fr, len, AGOQ_DTYPE_BF16, y, 250);
      assert_true(st == AGOQ_CODEC_OK || st == AGOQ_CODEC_ECORRUPT);
      caught += st != AGOQ_CODEC_OK;
      if (f != AGOQ_FORMAT_NONE && bit < (48 + 8) * 8) assert_int_equal(st, AGOQ_CODEC_ECORRUPT);
      fr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    if (f != AGOQ_FORMAT_NONE) assert_true(caught >= 64);
    free(fr);
  }
}

/* A frame sealed after the fact (CollNet's owner decodes its result frame itself, then
 * seals it for the peers) equals one encoded with the CRC, and then catches every flip;
 * a frame that is not an unsealed frame of exactly len bytes is refused. */
static void test_seal_payload_crc(void** state) {
  (void)state;
  for (int f = AGOQ_FORMAT_NONE; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP32, .block = 64};
    size_t len, len_crc;
    uint8_t* plain = make_frame(&p, 250, false, &len);
    uint8_t* with = make_frame(&p, 250, true, &len_crc);
    assert_int_equal(len, len_crc);
    assert_false(agoq_frame_has_payload_crc(plain, len));
    assert_true(agoq_frame_has_payload_crc(with, len));
    assert_false(agoq_frame_has_payload_crc(with, AGOQ_FRAME_HEADER_SIZE - 1));
    assert_int_equal(agoq_frame_seal_payload_crc(plain, len - 1), AGOQ_CODEC_ECORRUPT);
    assert_int_equal(agoq_frame_seal_payload_crc(plain, len), AGOQ_CODEC_OK);
    assert_memory_equal(plain, with, len);
    assert_int_equal(agoq_frame_seal_payload_crc(plain, len), AGOQ_CODEC_ECORRUPT); /* sealed twice */
    with[3] ^= 1; /* magic */
    assert_int_equal(agoq_frame_seal_payload_crc(with, len), AGOQ_CODEC_ECORRUPT);
    float y[250];
    for (size_t bit = 48 * 8; bit < len * 8; bit += 7) {
      plain[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      assert_int_equal(agoq_frame_decode(plain, len, AGOQ_DTYPE_FP32, y, 250), AGOQ_CODEC_ECORRUPT);
      plain[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    assert_int_equal(agoq_frame_decode(plain, len, AGOQ_DTYPE_FP32, y, 250), AGOQ_CODEC_OK);
    free(plain);
    free(with);
  }
}

/* What CollNet frames had before they carried the payload CRC: one flipped bit in a scale's
 * mantissa still passes every structural check and decodes a whole block to other finite
 * values (the header CRC does not cover the payload); with the CRC it is refused. */
static void test_scale_flip_needs_payload_crc(void** state) {
  (void)state;
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  float x[256], y[256], ref[256];
  for (int i = 0; i < 256; i++) x[i] = (float)(i % 17) - 8.0f;
  uint8_t f[4096];
  size_t len;
  for (int crc = 0; crc < 2; crc++) {
    assert_int_equal(agoq_frame_encode(&p, x, 256, crc, f, sizeof f, &len), AGOQ_CODEC_OK);
    assert_int_equal(agoq_frame_decode(f, len, AGOQ_DTYPE_FP32, ref, 256), AGOQ_CODEC_OK);
    f[48 + 8 + 2] ^= 0x40; /* block 0's scale, bit 22 of its mantissa */
    agoq_codec_status st = agoq_frame_decode(f, len, AGOQ_DTYPE_FP32, y, 256);
    if (crc) {
      assert_int_equal(st, AGOQ_CODEC_ECORRUPT);
    } else {
      assert_int_equal(st, AGOQ_CODEC_OK);
      assert_true(memcmp(y, ref, 128 * sizeof(float)) != 0); /* silently different values */
    }
  }
}

/* Header fields that pass the CRC but not validation. */
static void test_bad_fields(void** state) {
  (void)state;
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 64};
  size_t len;
  uint8_t* fr = make_frame(&p, 300, false, &len);
  uint8_t* ed = malloc(len);
  agoq_frame_info info;
  assert_non_null(ed);
#define EDIT_EXPECT(status, ...)                                             \
  do {                                                                       \
    memcpy(ed, fr, len);                                                     \
    __VA_ARGS__;                                                             \
    fix_header_crc(ed);                                                      \
    assert_int_equal(agoq_frame_parse(ed, len, &info, NULL), (status));      \
  } while (0)
  EDIT_EXPECT(AGOQ_CODEC_OK, (void)0);
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed, 0x46514742u));   /* magic */
  EDIT_EXPECT(AGOQ_CODEC_EVERSION, ed[4] = 2);                  /* version */
  EDIT_EXPECT(AGOQ_CODEC_EVERSION, ed[4] = 0);
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, ed[5] = AGOQ_FORMAT_COUNT);  /* format */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, ed[6] = AGOQ_DTYPE_COUNT);   /* dtype */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, ed[7] = 4);                  /* unknown flag */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, ed[7] = 1);                  /* CRC flag, CRC 0 */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 32, 1));        /* CRC without the flag */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 8, 0));         /* block sizes */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 8, 48));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 8, 16));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 8, 2048));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 8, 128));       /* valid size, wrong length */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 36, 1));        /* reserved */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 40, 0x80000000u));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 12, 0));        /* escaped count vs length */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 12, 6));        /* more than the blocks */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u32(ed + 12, 0xffffffffu));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u64(ed + 16, 301));      /* count vs length */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u64(ed + 16, AGOQ_FRAME_MAX_COUNT + 1));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u64(ed + 16, UINT64_MAX));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u64(ed + 24, len - 48 + 1)); /* payload past the buffer */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u64(ed + 24, UINT64_MAX));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u64(ed + 24, 0));
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, ed[7] = 2, ed[5] = AGOQ_FORMAT_FP8E4M3); /* stochastic fp8 */
  /* Consistent but enormous: count 2^40 with the matching payload length. */
  {
    agoq_codec_params q = p;
    size_t huge = agoq_codec_body_size(&q, (size_t)AGOQ_FRAME_MAX_COUNT, 0);
    EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, put_u64(ed + 16, AGOQ_FRAME_MAX_COUNT), put_u32(ed + 12, 0),
                put_u64(ed + 24, huge));
  }
  /* format NONE: block 0 and no escapes. */
  EDIT_EXPECT(AGOQ_CODEC_ECORRUPT, ed[5] = AGOQ_FORMAT_NONE);
  /* The stochastic flag on an int format is fine. */
  EDIT_EXPECT(AGOQ_CODEC_OK, ed[7] = 2);
  /* The escape bitmap: a third bit (the count and length say two), bits past the last of
   * the 5 blocks (with and without the popcount still matching), two bits moved (so block 1,
   * now escaped, has a non-zero scale); scales: NaN, Inf, negative, -0, and a non-zero scale
   * on the escaped block 0. The payload CRC is recomputed, so only the checks catch them. */
  const size_t scales = 48 + 8;
  struct {
    size_t off;
    uint32_t val;
  } body_edits[] = {{48, 0x13}, {48, 0x31}, {48, 0x21}, {48, 0x81}, {48, 0x03}, {scales + 4, 0x7fc00000u},
                    {scales + 4, 0x7f800000u}, {scales + 8, 0xbf800000u}, {scales + 8, 0x80000000u},
                    {scales + 0, 0x3f800000u}};
  for (size_t i = 0; i < sizeof body_edits / sizeof body_edits[0]; i++) {
    for (int crc = 0; crc < 2; crc++) {
      memcpy(ed, fr, len);
      if (body_edits[i].off == 48) ed[48] = (uint8_t)body_edits[i].val;
      else put_u32(ed + body_edits[i].off, body_edits[i].val);
      if (crc) {
        ed[7] |= 1;
        fix_payload_crc(ed, len - 48);
      }
      assert_int_equal(agoq_frame_parse(ed, len, &info, NULL), AGOQ_CODEC_ECORRUPT);
    }
  }
  /* The original has block 0 escaped (x[40] is NaN) and a valid positive scale elsewhere. */
  assert_int_equal(fr[48], 0x11); /* blocks 0 and 4 (the -Inf at the end) */
  free(ed);
  free(fr);
#undef EDIT_EXPECT
}

/* crc_ms in AGOQ_STATS: every payload CRC the frame code computes or checks is timed on the
 * injected clock (which advances 1000 ns a reading: each CRC adds exactly 1000), and only
 * payload CRCs, only while a clock is set. */
static uint64_t fake_clock_now;
static uint64_t fake_clock(void) { return fake_clock_now += 1000; }

static void test_crc_time_is_counted(void** state) {
  (void)state;
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 64};
  float y[250];
  size_t len;
  uint8_t* plain = make_frame(&p, 250, false, &len); /* no clock yet: not counted */
  uint64_t t0 = agoq_frame_crc_ns();
  agoq_frame_crc_clock_set(fake_clock);
  size_t len2;
  uint8_t* with = make_frame(&p, 250, true, &len2);
  assert_int_equal(agoq_frame_crc_ns() - t0, 1000); /* encode computed one */
  free(make_frame(&p, 250, false, &len2));
  assert_int_equal(agoq_frame_crc_ns() - t0, 1000); /* none without the flag */
  assert_int_equal(agoq_frame_decode(with, len, AGOQ_DTYPE_FP32, y, 250), AGOQ_CODEC_OK);
  assert_int_equal(agoq_frame_crc_ns() - t0, 2000); /* the check */
  assert_int_equal(agoq_frame_decode(plain, len, AGOQ_DTYPE_FP32, y, 250), AGOQ_CODEC_OK);
  assert_int_equal(agoq_frame_crc_ns() - t0, 2000); /* a frame without one: nothing to check */
  assert_int_equal(agoq_frame_seal_payload_crc(plain, len), AGOQ_CODEC_OK);
  assert_int_equal(agoq_frame_crc_ns() - t0, 3000); /* the seal */
  agoq_frame_crc_clock_set(NULL);
  assert_int_equal(agoq_frame_decode(with, len, AGOQ_DTYPE_FP32, y, 250), AGOQ_CODEC_OK);
  assert_int_equal(agoq_frame_crc_ns() - t0, 3000); /* off again */
  free(plain);
  free(with);
}

/* The threaded frame calls CollNet uses for large slices give the bits of the single-threaded
 * ones, whatever the thread count: frames byte for byte (escaped blocks included), decodes
 * and accumulations bit for bit. 3 x 64K elements: enough for the pool to split the work. */
static void test_threaded_same_bits(void** state) {
  (void)state;
  enum { N = 3 * 65536 + 77 };
  float* x = malloc(N * sizeof *x);
  assert_non_null(x);
  fill(x, N, 7);
  x[1000] = NAN;
  x[N - 5] = INFINITY;
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  size_t cap = agoq_frame_size_max(&p, N);
  uint8_t* one = malloc(cap);
  uint8_t* many = malloc(cap);
  float* d1 = malloc(N * sizeof *d1);
  float* dn = malloc(N * sizeof *dn);
  assert_true(one && many && d1 && dn);
  size_t len1 = 0;
  assert_int_equal(agoq_frame_encode(&p, x, N, true, one, cap, &len1), AGOQ_CODEC_OK);
  assert_int_equal(agoq_frame_decode(one, len1, AGOQ_DTYPE_FP32, d1, N), AGOQ_CODEC_OK);
  for (int threads = 2; threads <= 5; threads += 3) {
    size_t lenn = 0;
    memset(many, 0x5a, cap);
    assert_int_equal(agoq_frame_encode_mt(&p, x, N, true, many, cap, &lenn, threads), AGOQ_CODEC_OK);
    assert_int_equal(lenn, len1);
    assert_memory_equal(many, one, len1);
    memset(dn, 0x5a, N * sizeof *dn);
    assert_int_equal(agoq_frame_decode_mt(many, lenn, AGOQ_DTYPE_FP32, dn, N, threads), AGOQ_CODEC_OK);
    assert_memory_equal(dn, d1, N * sizeof *dn);
    /* acc = d1 + frame, both ways. */
    memcpy(dn, d1, N * sizeof *dn);
    float* acc1 = malloc(N * sizeof *acc1);
    assert_non_null(acc1);
    memcpy(acc1, d1, N * sizeof *acc1);
    assert_int_equal(agoq_frame_decode_accumulate(one, len1, acc1, N), AGOQ_CODEC_OK);
    assert_int_equal(agoq_frame_decode_accumulate_mt(one, len1, dn, N, threads), AGOQ_CODEC_OK);
    assert_memory_equal(dn, acc1, N * sizeof *dn);
    free(acc1);
    /* A damaged frame is refused the same way, and nothing is decoded. */
    many[len1 - 3] ^= 0x10;
    memset(dn, 0x5a, N * sizeof *dn);
    assert_int_equal(agoq_frame_decode_mt(many, lenn, AGOQ_DTYPE_FP32, dn, N, threads), AGOQ_CODEC_ECORRUPT);
    for (size_t i = 0; i < N; i += 4099) assert_int_equal(((uint8_t*)dn)[i * 4], 0x5a);
  }
  free(x);
  free(one);
  free(many);
  free(d1);
  free(dn);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threaded_same_bits),
      cmocka_unit_test(test_crc_time_is_counted),
      cmocka_unit_test(test_crc32c),           cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_truncated),        cmocka_unit_test(test_header_bit_flips),
      cmocka_unit_test(test_payload_bit_flips), cmocka_unit_test(test_bad_fields),
      cmocka_unit_test(test_seal_payload_crc), cmocka_unit_test(test_scale_flip_needs_payload_crc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
