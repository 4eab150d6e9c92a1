/*
 * The wire-bytes ratio: bytes the plugin puts on the wire for one collective over the
 * bytes the exact path puts there, summed over all ranks. agoq-perf cannot see the
 * plugin's sockets, and AGOQ_STATS=1 prints the plugin's own totals only once per
 * communicator at finalize, so the ratio is modelled from what the plugin documents:
 *  - a call is quantized when its type is fp32, bf16 or fp16, the op is Sum, AGOQ_FORMAT
 *    is not none and the call's bytes (allreduce: count * size; reducescatter: windowBytes)
 *    are at least AGOQ_MIN_BYTES; allgather is always exact;
 *  - a quantized all-reduce call is cut into pipeline chunks of AGOQ_COLLNET_CHUNK input
 *    bytes (whole blocks), each split into one slice per rank on AGOQ_BLOCK boundaries; a
 *    reduce-scatter call sends each owner its part of the window in pieces of
 *    AGOQ_COLLNET_CHUNK / nranks bytes; every slice or piece travels as one frame (kernels/agoq_frame.h: a 48-byte header, then the codec body: an escape bitmap
 *    of ceil(blocks / 64) words, one fp32 scale per block, one code byte per element, half a
 *    byte for int4; N(0,1) inputs escape no block);
 *  - allreduce: phase 1 sends every slice from the n-1 ranks that do not own it, phase 2
 *    sends every owner's reduced slice (from fp32) to the n-1 others: the exact path moves
 *    the same slices raw. reducescatter has phase 1 only.
 * So the ratio of a call is sum(frame bytes) / sum(raw bytes) over its slices. The plugin's
 * own count (AGOQ_STATS=1, "wire ... sent of ... raw" at closeColl) is the same ratio over
 * the whole run, exact calls included: it checks this model.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "perf_coll.h"

#define PERF_FRAME_HEADER 48

int perf_coll_codec_env_get(perf_coll_codec_env* env) {
  *env = (perf_coll_codec_env){.format = 1, .block = 128, .min_bytes = 64u << 10,
                               .pipeline_chunk = 1u << 20};
  int rc = 0;
  const char* f = getenv("AGOQ_FORMAT");
  if (f != NULL && *f != '\0') {
    int found = -1;
    for (int i = 0; i < perf_coll_nformats; i++)
      if (strcasecmp(f, perf_coll_formats[i]) == 0) found = i;
    if (found < 0) rc = -1;
    else env->format = found;
  }
  const char* b = getenv("AGOQ_BLOCK");
  if (b != NULL && *b != '\0') {
    int block = 0;
    if (perf_parse_int(b, 32, 1024, &block) != 0 || (block & (block - 1)) != 0) rc = -1;
    else env->block = (unsigned)block;
  }
  size_t v;
  const char* m = getenv("AGOQ_MIN_BYTES");
  if (m != NULL && *m != '\0') {
    if (perf_parse_size(m, &v) != 0) rc = -1;
    else env->min_bytes = v;
  }
  const char* c = getenv("AGOQ_COLLNET_CHUNK");
  if (c != NULL && *c != '\0') {
    if (perf_parse_size(c, &v) != 0 || v == 0) rc = -1;
    else env->pipeline_chunk = v;
  }
  return rc;
}

/* Elements of one pipeline piece: whole blocks, at least one block. */
static size_t perf_chunk_elems(size_t bytes, size_t elt, unsigned block) {
  size_t e = bytes / elt;
  e -= e % block;
  return e < block ? block : e;
}

static size_t perf_frame_bytes(const perf_coll_codec_env* env, size_t n) {
  if (n == 0) return 0;
  size_t nb = (n + env->block - 1) / env->block;
  size_t codes = env->format == 2 ? (n + 1) / 2 : n; /* int4: two codes a byte */
  return PERF_FRAME_HEADER + (nb + 63) / 64 * 8 + 4 * nb + codes;
}

/* Frame bytes of n elements cut into pipeline pieces of `piece` elements, each piece split
 * into `parts` block-aligned slices (parts 1: the piece is one slice). */
static double perf_frames(const perf_coll_codec_env* env, size_t n, size_t piece, int parts) {
  double total = 0;
  for (size_t off = 0; off < n; off += piece) {
    size_t len = n - off < piece ? n - off : piece;
    size_t nb = (len + env->block - 1) / env->block;
    for (int j = 0; j < parts; j++) {
      size_t b0 = nb * (size_t)j / (size_t)parts, b1 = nb * (size_t)(j + 1) / (size_t)parts;
      size_t e0 = b0 * env->block, e1 = b1 * env->block;
      if (e1 > len) e1 = len;
      if (e0 < e1) total += (double)perf_frame_bytes(env, e1 - e0);
    }
  }
  return total;
}

double perf_coll_wire_ratio(const perf_coll_opts* o, const perf_coll_plan* p) {
  perf_coll_codec_env env;
  perf_coll_codec_env_get(&env); /* an invalid value fails the plugin's init first */
  if (o->format >= 0) env.format = o->format;
  bool quantizable = (p->dtype == ncclFloat32 || p->dtype == ncclBfloat16 ||
                      p->dtype == ncclFloat16) &&
                     p->op == ncclSum && env.format != 0 && p->kind != PERF_COLL_ALLGATHER;
  if (!quantizable || p->nwin == 0 || p->nranks < 2) return 1.0;
  size_t piece = perf_chunk_elems(env.pipeline_chunk, p->elt, env.block);
  double wire = 0, raw = 0;
  for (int w = 0; w < p->nwin; w++) {
    const perf_window* win = &p->win[w];
    size_t elems = win->bytes / p->elt;
    raw += (double)win->bytes;
    if (win->bytes < env.min_bytes) {
      wire += (double)win->bytes;
      continue;
    }
    if (p->kind == PERF_COLL_ALLREDUCE) {
      wire += perf_frames(&env, elems, piece, p->nranks);
      continue;
    }
    /* reducescatter: each owner's share of the window is its own slice. */
    size_t per_bytes = p->per_rank * p->elt;
    size_t piece_per_owner =
        perf_chunk_elems(env.pipeline_chunk / (size_t)p->nranks, p->elt, env.block);
    for (int j = 0; j < p->nranks; j++) {
      size_t lo = (size_t)j * per_bytes, hi = lo + per_bytes;
      size_t a = win->off > lo ? win->off : lo;
      size_t b = win->off + win->bytes < hi ? win->off + win->bytes : hi;
      if (a < b) wire += perf_frames(&env, (b - a) / p->elt, piece_per_owner, 1);
    }
  }
  return raw > 0 ? wire / raw : 1.0;
}
