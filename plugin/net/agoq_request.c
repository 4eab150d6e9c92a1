#include "net/agoq_request.h"

#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"

ncclResult_t agoq_request_pool_init(agoq_request_pool* pool, uint32_t capacity) {
  ncclResult_t res = ncclSuccess;
  memset(pool, 0, sizeof *pool);
  if (capacity == 0 || capacity > AGOQ_REQUESTS_PER_COMM) {
    AGOQ_WARN("internal error: a request pool of %u (1 to %d)", capacity, AGOQ_REQUESTS_PER_COMM);
    return ncclInternalError;
  }
  AGOQ_CALLOC_GOTO(pool->free_stack, capacity, res, fail);
  pool->capacity = capacity;
  pool->block = (capacity + AGOQ_REQUEST_BLOCKS_MAX - 1) / AGOQ_REQUEST_BLOCKS_MAX;
  /* Stack order hands out low indices first, which keeps the hot requests in cache and
   * the blocks allocated few. */
  for (uint32_t i = 0; i < capacity; i++) pool->free_stack[i] = capacity - 1 - i;
  pool->free_count = capacity;
  return ncclSuccess;
fail:
  agoq_request_pool_fini(pool);
  return res;
}

void agoq_request_pool_fini(agoq_request_pool* pool) {
  /* A receive's spilled message its caller never took (the comm closed first). */
  for (uint32_t b = 0; b < pool->nblocks; b++)
    for (uint32_t i = 0; pool->blocks[b] != NULL && i < pool->block; i++) free(pool->blocks[b][i].spill);
  for (uint32_t b = 0; b < pool->nblocks; b++) free(pool->blocks[b]);
  free(pool->free_stack);
  memset(pool, 0, sizeof *pool);
}

agoq_request* agoq_request_at(const agoq_request_pool* pool, uint32_t index) {
  if (index >= pool->capacity) return NULL;
  agoq_request* block = pool->blocks[index / pool->block];
  return block == NULL ? NULL : &block[index % pool->block];
}

ncclResult_t agoq_request_alloc(agoq_request_pool* pool, agoq_request_kind kind, struct agoq_comm* comm,
                                agoq_request** out) {
  *out = NULL;
  if (pool->free_count == 0) return ncclSuccess;
  uint32_t index = pool->free_stack[pool->free_count - 1];
  agoq_request** block = &pool->blocks[index / pool->block];
  if (*block == NULL && (*block = calloc(pool->block, sizeof **block)) == NULL) {
    AGOQ_WARN("out of memory allocating %u requests of %zu bytes", pool->block, sizeof **block);
    return ncclSystemError;
  }
  if (index / pool->block >= pool->nblocks) pool->nblocks = index / pool->block + 1;
  pool->free_count--;
  agoq_request* req = &(*block)[index % pool->block];
  memset(req, 0, sizeof *req);
  req->pool_index = index;
  req->magic = AGOQ_REQUEST_MAGIC;
  req->kind = kind;
  req->comm = comm;
  req->xfer.index = index;
  for (int i = 0; i < AGOQ_NET_MAX_RECVS; i++) {
    req->stage[i] = req->late_ring[i] = -1;
    req->late_piece[i].chunk = -1;
  }
  req->ring_id = -1;
  req->pool_piece.chunk = -1;
  req->piece_buf = -1;
  *out = req;
  return ncclSuccess;
}

void agoq_request_release(agoq_request_pool* pool, agoq_request* req) {
  free(req->spill); /* NULL unless its caller never took it */
  req->spill = NULL;
  req->magic = 0;
  req->kind = AGOQ_REQ_FREE;
  pool->free_stack[pool->free_count++] = req->pool_index;
}

uint32_t agoq_request_in_use(const agoq_request_pool* pool) { return pool->capacity - pool->free_count; }

bool agoq_request_valid(const agoq_request_pool* pool, const agoq_request* req) {
  /* Which block, if any, holds the pointer NCCL handed back, on pointers only (a foreign
   * pointer is never dereferenced): the blocks ever used, low indices first, so as many
   * compares as the connection's most requests in flight needed blocks (test() calls this). */
  for (uint32_t b = 0; b < pool->nblocks; b++) {
    const agoq_request* base = pool->blocks[b];
    if (base == NULL || req < base || req >= base + pool->block) continue;
    if ((size_t)((const char*)req - (const char*)base) % sizeof *req != 0) return false;
    return req->magic == AGOQ_REQUEST_MAGIC && req->kind != AGOQ_REQ_FREE;
  }
  return false;
}
