/*
 * The frame: a self-describing codec body as it travels on the wire. A receiver validates
 * every field against the buffer before it touches the body; a bad frame is an error,
 * never a crash, an out-of-bounds access or silently wrong data.
 *
 * Header, 48 bytes, little-endian:
 *   0  u32 magic 0x46514741 ("AGQF")
 *   4  u8  version (1)
 *   5  u8  format (agoq_format)
 *   6  u8  dtype  (agoq_dtype of the input / raw blocks)
 *   7  u8  flags: bit0 payload CRC present, bit1 stochastic rounding was used; others 0
 *   8  u32 block size (32..1024, power of two; 0 for format NONE)
 *  12  u32 escaped blocks
 *  16  u64 element count
 *  24  u64 payload (body) length in bytes
 *  32  u32 payload CRC32C (0 when flag bit0 is clear)
 *  36  u32 reserved (0)
 *  40  u32 reserved (0)
 *  44  u32 header CRC32C over bytes 0..43
 * followed by the body (agoq_codec.h) of exactly `payload length` bytes.
 * The parser checks: magic, version, known format and dtype, block size, reserved zero,
 * header CRC, count within AGOQ_FRAME_MAX_COUNT, payload length == the length implied by
 * (format, dtype, block, count, escaped), header + payload <= buffer, escape bitmap
 * popcount == escaped and no bit set past the last block, every scale +0 or positive finite
 * and every escaped block's scale +0, payload CRC when present. An escaped-block count that
 * does not fit the 32-bit field makes agoq_frame_encode return AGOQ_CODEC_EARG.
 */
#ifndef AGOQ_FRAME_H
#define AGOQ_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agoq_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AGOQ_FRAME_MAGIC 0x46514741u
#define AGOQ_FRAME_VERSION 1u
#define AGOQ_FRAME_HEADER_SIZE 48u
#define AGOQ_FRAME_FLAG_PAYLOAD_CRC 0x1u
#define AGOQ_FRAME_FLAG_STOCHASTIC 0x2u
#define AGOQ_FRAME_MAX_COUNT (1ull << 40) /* elements; bounds every size computation */

typedef struct {
  agoq_codec_params params; /* format, dtype, block, stochastic (seed not carried) */
  uint64_t count;
  uint64_t payload_len;
  uint32_t escaped;
  uint32_t flags;
} agoq_frame_info;

uint32_t agoq_crc32c(uint32_t crc, const void* data, size_t len); /* crc = 0 to start */

/* Payload CRC32C time, measured for statistics. With a clock set (nanoseconds, monotonic;
 * NULL: off, the default) every payload CRC that agoq_frame_encode, agoq_frame_seal_payload_crc
 * and the parser (agoq_frame_parse and every decode) compute is timed, and
 * agoq_frame_crc_ns() is the calling thread's running total: read it before and after a
 * frame call to learn that call's CRC share. The clock is process-wide, injectable for tests. */
typedef uint64_t (*agoq_frame_clock_fn)(void);
void agoq_frame_crc_clock_set(agoq_frame_clock_fn clock);
uint64_t agoq_frame_crc_ns(void);

size_t agoq_frame_size_max(const agoq_codec_params* p, size_t n);
/* The size of a frame of n elements none of whose blocks escapes raw: what a frame of
 * finite values of ordinary range takes (a receiver can size for it and spill the rest).
 * 0 for invalid parameters. */
size_t agoq_frame_size_nominal(const agoq_codec_params* p, size_t n);
/* Bytes on the wire over bytes of input for one frame of n elements with no escaped block
 * (the header, the body, one scale per block and the escape bitmap), at most 1: a frame no
 * smaller than its payload is sent exact. 1 for n = 0 or invalid parameters. */
double agoq_frame_wire_ratio(const agoq_codec_params* p, size_t n);
/* Quantizes n elements into a complete frame in out (capacity cap). */
agoq_codec_status agoq_frame_encode(const agoq_codec_params* p, const void* src, size_t n,
                                    bool payload_crc, void* out, size_t cap, size_t* frame_len);
/* Adds the payload CRC32C to a complete frame of len bytes made without one (sets flag bit0,
 * the payload CRC and the header CRC). For a frame its maker decodes before sending it: the
 * local decode needs no check, the copy on the wire does. AGOQ_CODEC_ECORRUPT if buf is not
 * such a frame (bad magic, version, header CRC, length, or a CRC already present). */
agoq_codec_status agoq_frame_seal_payload_crc(void* buf, size_t len);
/* Whether the frame header at buf (len bytes) says a payload CRC is present; false when len
 * is shorter than a header. Receivers that require the CRC ask before decoding; the flag
 * itself is covered by the header CRC, which agoq_frame_parse checks. */
bool agoq_frame_has_payload_crc(const void* buf, size_t len);
/* Validates a frame of at most len bytes; on success fills info and *body (inside buf). */
agoq_codec_status agoq_frame_parse(const void* buf, size_t len, agoq_frame_info* info,
                                   const void** body);
/* Parses, checks dst_count == count, decodes into dst of type out. */
agoq_codec_status agoq_frame_decode(const void* buf, size_t len, agoq_dtype out, void* dst,
                                    size_t dst_count);
agoq_codec_status agoq_frame_decode_accumulate(const void* buf, size_t len, float* acc,
                                               size_t acc_count);

/* The same on up to nthreads threads (agoq_codec.h's *_mt: the same bits by construction;
 * 1 or less = the calling thread only). The CRCs run on the calling thread. */
agoq_codec_status agoq_frame_encode_mt(const agoq_codec_params* p, const void* src, size_t n,
                                       bool payload_crc, void* out, size_t cap, size_t* frame_len,
                                       int nthreads);
agoq_codec_status agoq_frame_decode_mt(const void* buf, size_t len, agoq_dtype out, void* dst,
                                       size_t dst_count, int nthreads);
agoq_codec_status agoq_frame_decode_accumulate_mt(const void* buf, size_t len, float* acc,
                                                  size_t acc_count, int nthreads);

#ifdef __cplusplus
}
#endif
#endif
