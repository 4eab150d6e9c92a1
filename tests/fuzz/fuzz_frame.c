/* libFuzzer target: the frame parser and the decoders behind it (bytes from the network).
 * Each input is tried twice: as it is, and with its header and payload CRCs recomputed, so
 * that mutations reach the field checks and the decoders instead of stopping at the CRC.
 * A frame that parses must decode (to every output type, and accumulating) without error,
 * and nothing may read or write out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void try_frame(const uint8_t* in, size_t size) {
  agoq_frame_info info;
  const void* body;
  if (agoq_frame_parse(in, size, &info, &body) != AGOQ_CODEC_OK) return;
  if ((const uint8_t*)body != in + AGOQ_FRAME_HEADER_SIZE ||
      info.payload_len > size - AGOQ_FRAME_HEADER_SIZE)
    abort();
  /* A valid frame's count is bounded by its payload (>= 4 bits per element). */
  size_t n = (size_t)info.count;
  if (n > 2 * (size_t)info.payload_len + 64) abort();
  /* Exact-size outputs, so ASan sees any write past element n. */
  for (int out = 0; out < AGOQ_DTYPE_COUNT; out++) {
    size_t bytes = n * agoq_dtype_size((agoq_dtype)out);
    void* dst = malloc(bytes ? bytes : 1);
    if (dst == NULL) return;
    if (agoq_frame_decode(in, size, (agoq_dtype)out, dst, n) != AGOQ_CODEC_OK) abort();
    free(dst);
  }
  float* acc = calloc(n ? n : 1, sizeof(float));
  if (acc == NULL) return;
  if (agoq_frame_decode_accumulate(in, size, acc, n) != AGOQ_CODEC_OK) abort();
  if (n > 0 && agoq_frame_decode_accumulate(in, size, acc, n - 1) == AGOQ_CODEC_OK) abort();
  free(acc);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  /* A heap copy of exactly `size` bytes, so ASan sees any read past the input. */
  uint8_t* in = malloc(size ? size : 1);
  if (in == NULL) return 0;
  memcpy(in, data, size);
  try_frame(in, size);
  if (size >= AGOQ_FRAME_HEADER_SIZE) {
    uint64_t payload = 0;
    for (int i = 0; i < 8; i++) payload |= (uint64_t)in[24 + i] << (8 * i);
    if (in[7] & AGOQ_FRAME_FLAG_PAYLOAD_CRC) {
      size_t avail = size - AGOQ_FRAME_HEADER_SIZE;
      put_u32(in + 32, agoq_crc32c(0, in + AGOQ_FRAME_HEADER_SIZE, payload < avail ? (size_t)payload : avail));
    }
    put_u32(in + 44, agoq_crc32c(0, in, 44));
    try_frame(in, size);
  }
  free(in);
  return 0;
}
