/* The slicing rule: how a request is cut into pipeline chunks and each chunk into one slice
 * per rank. Every rank computes the same layout from the same arguments and settings, which
 * is what makes the messages match and the quantization blocks identical everywhere. */
#include <stdlib.h>

#include "collnet/agoq_coll_internal.h"

size_t agoq_coll_type_size(int dtype) {
  switch (dtype) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

size_t agoq_coll_chunk_elems(size_t chunk_bytes, size_t elem_size, uint32_t block) {
  size_t e = elem_size > 0 ? chunk_bytes / elem_size : 0;
  if (block > 0) e -= e % block;
  size_t min = block > 0 ? block : 1;
  return e < min ? min : e;
}

void agoq_coll_slices(size_t m, int n, uint32_t block, size_t* bounds) {
  /* Units are blocks on the quantized path so no block straddles two owners; the products
   * stay far below 2^64 (m <= 2^40 elements, n <= AGOQ_COLL_MAX_RANKS). */
  size_t units = block > 0 ? (m + block - 1) / block : m;
  size_t unit = block > 0 ? block : 1;
  for (int j = 0; j <= n; j++) {
    size_t b = (units * (size_t)j / (size_t)n) * unit;
    bounds[j] = b < m ? b : m;
  }
}

size_t agoq_coll_rank_begin(const agoq_coll_req* req, int j) {
  size_t g = (size_t)j * req->bpr;
  if (g <= req->wo) return 0;
  size_t e = (g - req->wo) / req->esz;
  return e < req->count ? e : req->count;
}

void agoq_coll_chunk_layout(const agoq_coll_req* req, size_t c, int n, size_t* sb, size_t* sl) {
  if (req->kind == AGOQ_COLL_ALLREDUCE) {
    size_t c0 = c * req->chunk_elems;
    size_t m = req->count - c0 < req->chunk_elems ? req->count - c0 : req->chunk_elems;
    uint32_t block = req->quantized ? req->comm->cfg.block : 0;
    /* bounds[] reuses sb: sb[j] = bounds[j] until the loop below turns it absolute. */
    size_t prev;
    agoq_coll_slices(m, n, block, sb); /* needs n + 1 entries: the caller allocates them */
    prev = sb[0];
    for (int j = 0; j < n; j++) {
      size_t next = sb[j + 1];
      sl[j] = next - prev;
      sb[j] = c0 + prev;
      prev = next;
    }
    return;
  }
  /* Reducescatter/allgather: the owner of each element is fixed by the window; chunk c takes
   * the c-th piece of every rank's range, so each chunk's traffic spreads over all owners. */
  for (int j = 0; j < n; j++) {
    size_t b = agoq_coll_rank_begin(req, j), e = agoq_coll_rank_begin(req, j + 1);
    size_t off = c * req->chunk_elems;
    size_t len = e - b;
    sb[j] = b + (off < len ? off : len);
    size_t left = off < len ? len - off : 0;
    sl[j] = left < req->chunk_elems ? left : req->chunk_elems;
  }
}

const uint8_t* agoq_coll_src_at(const agoq_coll_req* req, size_t elem) {
  if (req->kind == AGOQ_COLL_ALLGATHER) return req->src + (elem - req->my_begin);
  return req->src + elem * req->esz;
}

uint8_t* agoq_coll_dst_at(const agoq_coll_req* req, size_t elem) {
  if (req->kind == AGOQ_COLL_REDUCESCATTER) return req->dst + (elem - req->my_begin) * req->esz;
  return req->dst + elem * req->esz;
}
