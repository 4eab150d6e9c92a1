/*
 * roundtrip, encode, decode: the codec between files. roundtrip uses the multi-threaded
 * entry points (the same bits as the single-threaded ones); encode and decode go through
 * the frame API exactly as a receiver would.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "codec.h"

#define CODEC_QUANT_OPTS                                                             \
  (CODEC_OPT_FORMAT | CODEC_OPT_DTYPE | CODEC_OPT_BLOCK | CODEC_OPT_STOCHASTIC |     \
   CODEC_OPT_SEED | CODEC_OPT_VERBOSE)

static void codec_print_sizes(const agoq_codec_params* p, size_t n, size_t encoded,
                              size_t escaped, const char* what) {
  size_t raw = n * agoq_dtype_size(p->dtype);
  char blocks[96] = "";
  if (p->format != AGOQ_FORMAT_NONE)
    snprintf(blocks, sizeof(blocks), " block %u%s", p->block, p->stochastic ? " stochastic" : "");
  fprintf(stderr, "%zu x %s -> %s%s: %zu B -> %zu B %s (%.3f of the input)", n,
          agoq_dtype_name(p->dtype), agoq_format_name(p->format), blocks, raw, encoded, what,
          raw ? (double)encoded / (double)raw : 0.0);
  if (p->format != AGOQ_FORMAT_NONE)
    fprintf(stderr, ", %zu of %zu blocks escaped (NaN/Inf)", escaped, agoq_codec_nblocks(p, n));
  fprintf(stderr, "\n");
}

int codec_roundtrip_main(int argc, char** argv) {
  codec_opts o;
  int rc = codec_opts_parse(argc, argv, CODEC_QUANT_OPTS | CODEC_OPT_THREADS,
                            CODEC_OPT_FORMAT | CODEC_OPT_DTYPE, 2, &o);
  if (rc != 0) return rc > 0 ? 0 : CODEC_EXIT_USAGE;
  agoq_codec_params p;
  if (codec_opts_params(&o, &p) != 0) return CODEC_EXIT_USAGE;

  uint8_t *in = NULL, *body = NULL, *out = NULL;
  size_t n = 0;
  rc = CODEC_EXIT_FAIL;
  if (codec_array_read(o.cmd, o.path[0], p.dtype, &in, &n) != 0) goto done;
  size_t cap = agoq_codec_body_size_max(&p, n);
  size_t out_bytes = n * agoq_dtype_size(p.dtype);
  body = malloc(cap ? cap : 1);
  out = malloc(out_bytes ? out_bytes : 1);
  if (body == NULL || out == NULL) {
    codec_err(o.cmd, "out of memory for %zu elements", n);
    goto done;
  }
  size_t body_len = 0, escaped = 0;
  agoq_codec_status st =
      agoq_quantize_mt(&p, in, n, body, cap, &body_len, &escaped, o.threads);
  if (st != AGOQ_CODEC_OK) {
    codec_err(o.cmd, "quantize failed: %s", agoq_codec_status_str(st));
    goto done;
  }
  st = agoq_dequantize_mt(&p, body, body_len, n, p.dtype, out, o.threads);
  if (st != AGOQ_CODEC_OK) {
    codec_err(o.cmd, "dequantize failed: %s", agoq_codec_status_str(st));
    goto done;
  }
  if (o.verbose) codec_print_sizes(&p, n, body_len, escaped, "body");
  if (codec_file_write(o.cmd, o.path[1], out, out_bytes) != 0) goto done;
  rc = 0;
done:
  free(in);
  free(body);
  free(out);
  return rc;
}

int codec_encode_main(int argc, char** argv) {
  codec_opts o;
  int rc = codec_opts_parse(argc, argv, CODEC_QUANT_OPTS | CODEC_OPT_CRC,
                            CODEC_OPT_FORMAT | CODEC_OPT_DTYPE, 2, &o);
  if (rc != 0) return rc > 0 ? 0 : CODEC_EXIT_USAGE;
  agoq_codec_params p;
  if (codec_opts_params(&o, &p) != 0) return CODEC_EXIT_USAGE;

  uint8_t *in = NULL, *frame = NULL;
  size_t n = 0;
  rc = CODEC_EXIT_FAIL;
  if (codec_array_read(o.cmd, o.path[0], p.dtype, &in, &n) != 0) goto done;
  if ((uint64_t)n > AGOQ_FRAME_MAX_COUNT) {
    codec_err(o.cmd, "%s: %zu elements exceed a frame's limit of %llu", o.path[0], n,
              (unsigned long long)AGOQ_FRAME_MAX_COUNT);
    goto done;
  }
  size_t cap = agoq_frame_size_max(&p, n);
  frame = malloc(cap);
  if (frame == NULL) {
    codec_err(o.cmd, "out of memory for a frame of up to %zu bytes", cap);
    goto done;
  }
  size_t frame_len = 0;
  agoq_codec_status st = agoq_frame_encode(&p, in, n, o.crc, frame, cap, &frame_len);
  if (st != AGOQ_CODEC_OK) {
    codec_err(o.cmd, "encode failed: %s", agoq_codec_status_str(st));
    goto done;
  }
  if (o.verbose) {
    agoq_frame_info info;
    const void* body = NULL;
    size_t escaped = agoq_frame_parse(frame, frame_len, &info, &body) == AGOQ_CODEC_OK
                         ? info.escaped
                         : 0;
    codec_print_sizes(&p, n, frame_len, escaped, "frame");
  }
  if (codec_file_write(o.cmd, o.path[1], frame, frame_len) != 0) goto done;
  rc = 0;
done:
  free(in);
  free(frame);
  return rc;
}

static void codec_print_frame(const char* path, size_t file_len, const agoq_frame_info* info) {
  const agoq_codec_params* p = &info->params;
  size_t raw = (size_t)info->count * agoq_dtype_size(p->dtype);
  fprintf(stderr,
          "%s: frame v%u, %zu B: format %s, dtype %s, block %u, count %" PRIu64
          ", escaped blocks %u, payload %" PRIu64 " B%s%s (%.3f of the raw %zu B)\n",
          path, AGOQ_FRAME_VERSION, file_len, agoq_format_name(p->format),
          agoq_dtype_name(p->dtype), p->block, info->count, info->escaped, info->payload_len,
          (info->flags & AGOQ_FRAME_FLAG_PAYLOAD_CRC) ? ", payload CRC32C" : "",
          (info->flags & AGOQ_FRAME_FLAG_STOCHASTIC) ? ", stochastic rounding" : "",
          raw ? (double)file_len / (double)raw : 0.0, raw);
}

int codec_decode_main(int argc, char** argv) {
  codec_opts o;
  int rc = codec_opts_parse(argc, argv, CODEC_OPT_DTYPE | CODEC_OPT_VERBOSE, 0, 2, &o);
  if (rc != 0) return rc > 0 ? 0 : CODEC_EXIT_USAGE;

  uint8_t *frame = NULL, *out = NULL;
  size_t len = 0;
  rc = CODEC_EXIT_FAIL;
  if (codec_file_read(o.cmd, o.path[0], &frame, &len) != 0) goto done;
  agoq_frame_info info;
  const void* body = NULL;
  agoq_codec_status st = agoq_frame_parse(frame, len, &info, &body);
  if (st != AGOQ_CODEC_OK) {
    codec_err(o.cmd, "%s: not a valid frame (%zu bytes): %s", o.path[0], len,
              agoq_codec_status_str(st));
    goto done;
  }
  size_t frame_len = AGOQ_FRAME_HEADER_SIZE + (size_t)info.payload_len;
  if (o.verbose) codec_print_frame(o.path[0], frame_len, &info);
  if (frame_len != len) {
    /* The parser accepts a frame at the start of a larger buffer; a file holds one frame. */
    codec_err(o.cmd, "%s: %zu byte%s after the %zu-byte frame (a file holds one frame)",
              o.path[0], len - frame_len, len - frame_len == 1 ? "" : "s", frame_len);
    goto done;
  }
  agoq_dtype out_t = (o.given & CODEC_OPT_DTYPE) ? o.dtype : info.params.dtype;
  /* The parser bounds count by the payload the file holds, so this cannot overflow. */
  size_t n = (size_t)info.count;
  size_t out_bytes = n * agoq_dtype_size(out_t);
  out = malloc(out_bytes ? out_bytes : 1);
  if (out == NULL) {
    codec_err(o.cmd, "out of memory for %zu elements", n);
    goto done;
  }
  st = agoq_frame_decode(frame, len, out_t, out, n);
  if (st != AGOQ_CODEC_OK) {
    codec_err(o.cmd, "%s: decode failed: %s", o.path[0], agoq_codec_status_str(st));
    goto done;
  }
  if (codec_file_write(o.cmd, o.path[1], out, out_bytes) != 0) goto done;
  rc = 0;
done:
  free(frame);
  free(out);
  return rc;
}
