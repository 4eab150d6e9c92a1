#include "net/agoq_request.h"

#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"

ncclResult_t agoq_request_pool_init(agoq_request_pool* pool, uint32_t capacity) {
  ncclResult_t res = ncclSuccess;
  memset(pool, 0, sizeof *pool);
  AGOQ_CALLOC_GOTO(pool->slots, capacity, res, fail);
  AGOQ_CALLOC_GOTO(pool->free_stack, capacity, res, fail);
  pool->capacity = capacity;
  /* Stack order hands out low indices first, which keeps the hot requests in cache. */
  for (uint32_t i = 0; i < capacity; i++) pool->free_stack[i] = capacity - 1 - i;
  pool->free_count = capacity;
  return ncclSuccess;
fail:
  agoq_request_pool_fini(pool);
  return res;
}

void agoq_request_pool_fini(agoq_request_pool* pool) {
  free(pool->slots);
  free(pool->free_stack);
  memset(pool, 0, sizeof *pool);
}

agoq_request* agoq_request_alloc(agoq_request_pool* pool, agoq_request_kind kind, struct agoq_comm* comm) {
  if (pool->free_count == 0) return NULL;
  uint32_t index = pool->free_stack[--pool->free_count];
  agoq_request* req = &pool->slots[index];
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
  return req;
}

void agoq_request_release(agoq_request_pool* pool, agoq_request* req) {
  req->magic = 0;
  req->kind = AGOQ_REQ_FREE;
  pool->free_stack[pool->free_count++] = req->pool_index;
}

uint32_t agoq_request_in_use(const agoq_request_pool* pool) { return pool->capacity - pool->free_count; }

bool agoq_request_valid(const agoq_request_pool* pool, const agoq_request* req) {
  if (req < pool->slots || req >= pool->slots + pool->capacity) return false;
  if ((size_t)((const char*)req - (const char*)pool->slots) % sizeof *req != 0) return false;
  return req->magic == AGOQ_REQUEST_MAGIC && req->kind != AGOQ_REQ_FREE;
}
