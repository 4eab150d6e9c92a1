/* Requests: the collective calls validate their arguments, pick the path, stage device
 * buffers (agoq_coll_device.c) and hand a request to the group's engine; test() reads the
 * state the engine published and, while a request is not done, runs a pass of the pipeline
 * itself when the engine is not running one (AGOQ_COLLNET_ASSIST); a result bound for
 * device memory is done once its copy there is. Both run on NCCL's proxy thread and never
 * wait: not on the network, not on the engine, not on the device. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "collnet/agoq_coll_internal.h"
#include "core/agoq_check.h"

static agoq_coll_req* agoq_coll_req_alloc(agoq_coll_comm* g) {
  pthread_mutex_lock(&g->mu);
  agoq_coll_req* r = g->free_reqs;
  if (r != NULL) g->free_reqs = r->next;
  pthread_mutex_unlock(&g->mu);
  if (r == NULL) return NULL;
  uint8_t* flat = r->flat;
  memset(r, 0, sizeof *r);
  r->flat = flat; /* a staging buffer is kept for the next multi-part request */
  r->magic = AGOQ_COLL_REQ_MAGIC;
  r->ring_id = -1;
  r->comm = g;
  atomic_init(&r->state, AGOQ_COLL_REQ_PENDING);
  return r;
}

static void agoq_coll_req_release(agoq_coll_req* r) {
  agoq_coll_comm* g = r->comm;
  agoq_coll_dev_release(g, r);
  r->magic = 0;
  pthread_mutex_lock(&g->mu);
  r->next = g->free_reqs;
  g->free_reqs = r;
  pthread_mutex_unlock(&g->mu);
}

static void agoq_coll_enqueue(agoq_coll_comm* g, agoq_coll_req* r) {
  pthread_mutex_lock(&g->mu);
  r->next = NULL;
  if (g->q_tail != NULL)
    g->q_tail->next = r;
  else
    g->q_head = r;
  g->q_tail = r;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
  agoq_coll_engine_wake(g);
}

/* Stages the request's device buffers, then hands it to the engine; a full staging makes
 * the call return a NULL request (NCCL calls again). */
static ncclResult_t agoq_coll_submit(agoq_coll_comm* g, agoq_coll_req* r, bool in_dev, bool out_dev, void** request) {
  bool busy = false;
  ncclResult_t res = agoq_coll_dev_stage(g, r, in_dev, out_dev, &busy);
  if (res != ncclSuccess || busy) {
    agoq_coll_req_release(r);
    return res;
  }
  agoq_coll_enqueue(g, r);
  *request = r;
  return ncclSuccess;
}

/* Common checks; *g_out is the group, or the call fails. */
static ncclResult_t agoq_coll_call_begin(void* coll_comm, void** request, const char* what, agoq_coll_comm** g_out) {
  agoq_coll_comm* g = coll_comm;
  if (g == NULL || g->magic != AGOQ_COLL_COMM_MAGIC || request == NULL) {
    AGOQ_WARN("CollNet %s: invalid comm %p or request pointer", what, coll_comm);
    return ncclInternalError;
  }
  *request = NULL;
  ncclResult_t err = (ncclResult_t)atomic_load(&g->error);
  if (err != ncclSuccess) return err; /* the group failed: so does every later call */
  *g_out = g;
  return ncclSuccess;
}

static ncclResult_t agoq_coll_check_type_op(const char* what, int dtype, int op, size_t* esz) {
  *esz = agoq_coll_type_size(dtype);
  if (*esz == 0 || op < ncclSum || op > ncclMin) {
    AGOQ_WARN("CollNet %s: unsupported data type %d or operation %d", what, dtype, op);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* The quantized path takes fp32/bf16/fp16 sums from AGOQ_MIN_BYTES up; the decision uses
 * only values every rank has alike (call arguments and group settings). An exact call
 * records why (AGOQ_STATS), first reason that applies in this order. */
static bool agoq_coll_quantizable(const agoq_coll_comm* g, int dtype, int op, size_t bytes, agoq_dtype* ct,
                                  uint8_t* why) {
  bool is_float = true;
  switch (dtype) {
    case ncclFloat32: *ct = AGOQ_DTYPE_FP32; break;
    case ncclBfloat16: *ct = AGOQ_DTYPE_BF16; break;
    case ncclFloat16: *ct = AGOQ_DTYPE_FP16; break;
    default: is_float = false; break;
  }
  if (g->cfg.format == AGOQ_FORMAT_NONE) *why = AGOQ_EXACT_FORMAT_NONE;
  else if (!is_float) *why = AGOQ_EXACT_TYPE;
  else if (op != ncclSum) *why = AGOQ_EXACT_OP;
  else if (bytes < g->cfg.min_bytes) *why = AGOQ_EXACT_SMALL;
  else return true;
  return false;
}

ncclResult_t agoq_coll_iallreduce(void* coll_comm, void* send_data, void* recv_data, size_t count, int data_type,
                                  int red_op, void* send_mhandle, void* recv_mhandle, void** request) {
  agoq_coll_comm* g = NULL;
  size_t esz;
  bool in_dev = false, out_dev = false;
  AGOQ_CHECK(agoq_coll_call_begin(coll_comm, request, "iallreduce", &g));
  AGOQ_CHECK(agoq_coll_check_type_op("iallreduce", data_type, red_op, &esz));
  if (count > AGOQ_FRAME_MAX_COUNT || (count > 0 && (send_data == NULL || recv_data == NULL))) {
    AGOQ_WARN("CollNet iallreduce: invalid buffers (send %p, recv %p, count %zu)", send_data, recv_data, count);
    return ncclInvalidArgument;
  }
  AGOQ_CHECK(agoq_coll_dev_is_device(send_mhandle, send_data, count * esz, &in_dev));
  AGOQ_CHECK(agoq_coll_dev_is_device(recv_mhandle, recv_data, count * esz, &out_dev));
  agoq_coll_req* r = agoq_coll_req_alloc(g);
  if (r == NULL) return ncclSuccess; /* every request busy: NCCL calls again */
  r->kind = AGOQ_COLL_ALLREDUCE;
  r->dtype = data_type;
  r->op = red_op;
  r->esz = esz;
  r->count = count;
  r->src = send_data;
  r->dst = recv_data;
  r->result_bytes = count * esz;
  r->quantized = agoq_coll_quantizable(g, data_type, red_op, count * esz, &r->codec_dtype, &r->exact_reason);
  r->chunk_elems = agoq_coll_chunk_elems(g->cfg.chunk_bytes, esz, r->quantized ? g->cfg.block : 0);
  r->nchunks = (count + r->chunk_elems - 1) / r->chunk_elems;
  return agoq_coll_submit(g, r, in_dev, out_dev, request);
}

/* Window checks shared by reducescatter and allgather; fills the element space. */
static ncclResult_t agoq_coll_window(agoq_coll_comm* g, agoq_coll_req* r, const char* what, int nparts,
                                     const agoq_coll_sge* parts, size_t bpr, size_t wo, size_t wb) {
  size_t total = 0;
  if (nparts < 1 || nparts > AGOQ_COLL_MAX_PARTS || parts == NULL) {
    AGOQ_WARN("CollNet %s: %d buffer parts (1..%d supported)", what, nparts, AGOQ_COLL_MAX_PARTS);
    return ncclInvalidArgument;
  }
  for (int i = 0; i < nparts; i++) {
    if (parts[i].address == NULL && parts[i].size > 0) {
      AGOQ_WARN("CollNet %s: part %d has no address", what, i);
      return ncclInvalidArgument;
    }
    bool dev = false;
    AGOQ_CHECK(agoq_coll_dev_is_device(parts[i].mhandle, parts[i].address, parts[i].size, &dev));
    if (dev) r->dev_parts |= 1u << i;
    total += parts[i].size;
    r->parts[i] = parts[i];
  }
  r->nparts = nparts;
  size_t esz = r->esz;
  /* Every offset must be whole elements, and the window inside the ranks' concatenation. */
  if (total != wb || wb % esz != 0 || wo % esz != 0 || bpr % esz != 0 || bpr > (SIZE_MAX / 2) / (size_t)g->nranks ||
      wo > bpr * (size_t)g->nranks || wb > bpr * (size_t)g->nranks - wo || wb / esz > AGOQ_FRAME_MAX_COUNT) {
    AGOQ_WARN("CollNet %s: inconsistent window (bytes per rank %zu, offset %zu, bytes %zu, parts total %zu, "
              "element size %zu, %d ranks)", what, bpr, wo, wb, total, esz, g->nranks);
    return ncclInvalidArgument;
  }
  r->bpr = bpr;
  r->wo = wo;
  r->count = wb / esz;
  r->my_begin = agoq_coll_rank_begin(r, g->rank);
  size_t maxlen = 0;
  for (int j = 0; j < g->nranks; j++) {
    size_t len = agoq_coll_rank_begin(r, j + 1) - agoq_coll_rank_begin(r, j);
    if (len > maxlen) maxlen = len;
  }
  /* Each chunk takes one piece of every rank's range: pieces of chunk / nranks bytes keep a
   * chunk's total near AGOQ_COLLNET_CHUNK. */
  size_t per_rank = g->cfg.chunk_bytes / (size_t)g->nranks;
  r->chunk_elems = agoq_coll_chunk_elems(per_rank, esz, r->quantized ? g->cfg.block : 0);
  r->nchunks = (maxlen + r->chunk_elems - 1) / r->chunk_elems;
  /* Parts in device memory are joined in the staging instead (agoq_coll_dev_stage). */
  if (nparts > 1 && r->dev_parts == 0) {
    uint8_t* flat = realloc(r->flat, wb > 0 ? wb : 1);
    if (flat == NULL) {
      AGOQ_WARN("CollNet %s: out of memory staging %zu bytes of %d parts", what, wb, nparts);
      return ncclSystemError;
    }
    r->flat = flat;
    r->joined = flat;
  }
  return ncclSuccess;
}

ncclResult_t agoq_coll_ireducescatter(void* coll_comm, int n_send_parts, const agoq_coll_sge* send_parts,
                                      void* recv_data, size_t bytes_per_rank, size_t window_offset,
                                      size_t window_bytes, int data_type, int red_op, void* recv_mhandle,
                                      void** request) {
  agoq_coll_comm* g = NULL;
  size_t esz;
  bool out_dev = false;
  AGOQ_CHECK(agoq_coll_call_begin(coll_comm, request, "ireducescatter", &g));
  AGOQ_CHECK(agoq_coll_check_type_op("ireducescatter", data_type, red_op, &esz));
  agoq_coll_req* r = agoq_coll_req_alloc(g);
  if (r == NULL) return ncclSuccess;
  r->kind = AGOQ_COLL_REDUCESCATTER;
  r->dtype = data_type;
  r->op = red_op;
  r->esz = esz;
  r->quantized = agoq_coll_quantizable(g, data_type, red_op, window_bytes, &r->codec_dtype, &r->exact_reason);
  ncclResult_t res = agoq_coll_window(g, r, "ireducescatter", n_send_parts, send_parts, bytes_per_rank,
                                      window_offset, window_bytes);
  if (res == ncclSuccess) {
    size_t mine = agoq_coll_rank_begin(r, g->rank + 1) - r->my_begin;
    if (mine > 0 && recv_data == NULL) {
      AGOQ_WARN("CollNet ireducescatter: no receive buffer for %zu elements", mine);
      res = ncclInvalidArgument;
    }
    r->result_bytes = mine * esz;
  }
  if (res == ncclSuccess) res = agoq_coll_dev_is_device(recv_mhandle, recv_data, r->result_bytes, &out_dev);
  if (res != ncclSuccess) {
    agoq_coll_req_release(r);
    return res;
  }
  r->src = n_send_parts > 1 ? r->joined : send_parts[0].address;
  r->dst = recv_data;
  return agoq_coll_submit(g, r, r->dev_parts != 0, out_dev, request);
}

ncclResult_t agoq_coll_iallgather(void* coll_comm, void* send_data, int n_recv_parts, const agoq_coll_sge* recv_parts,
                                  size_t bytes_per_rank, size_t window_offset, size_t window_bytes,
                                  void* send_mhandle, void** request) {
  agoq_coll_comm* g = NULL;
  bool in_dev = false;
  AGOQ_CHECK(agoq_coll_call_begin(coll_comm, request, "iallgather", &g));
  agoq_coll_req* r = agoq_coll_req_alloc(g);
  if (r == NULL) return ncclSuccess;
  r->kind = AGOQ_COLL_ALLGATHER;
  r->dtype = ncclUint8;
  r->op = ncclSum;
  r->esz = 1;
  r->exact_reason = AGOQ_EXACT_TYPE; /* bytes: no datatype to quantize */
  ncclResult_t res = agoq_coll_window(g, r, "iallgather", n_recv_parts, recv_parts, bytes_per_rank,
                                      window_offset, window_bytes);
  if (res == ncclSuccess && send_data == NULL && agoq_coll_rank_begin(r, g->rank + 1) > r->my_begin) {
    AGOQ_WARN("CollNet iallgather: no send buffer for this rank's bytes");
    res = ncclInvalidArgument;
  }
  if (res == ncclSuccess)
    res = agoq_coll_dev_is_device(send_mhandle, send_data, agoq_coll_rank_begin(r, g->rank + 1) - r->my_begin, &in_dev);
  if (res != ncclSuccess) {
    agoq_coll_req_release(r);
    return res;
  }
  r->result_bytes = window_bytes;
  r->src = send_data;
  r->dst = n_recv_parts > 1 ? r->joined : recv_parts[0].address;
  return agoq_coll_submit(g, r, in_dev, r->dev_parts != 0, request);
}

/* A result bound for device memory is done once its copy there is (agoq_coll_device.c). */
static int agoq_coll_copy_state(agoq_coll_req* r) {
  bool copied = false;
  ncclResult_t res = agoq_coll_dev_copied(r->comm, r, &copied);
  if (res == ncclSuccess) return copied ? AGOQ_COLL_REQ_DONE : AGOQ_COLL_REQ_COPY_OUT;
  if (agoq_coll_fail(r->comm, res))
    AGOQ_WARN("CollNet rank %d: copying a result into device memory failed (%s); the group fails", r->comm->rank,
              agoq_result_str(res));
  r->error = res;
  return AGOQ_COLL_REQ_FAILED;
}

ncclResult_t agoq_coll_test(void* request, int* done, int* size) {
  agoq_coll_req* r = request;
  if (r == NULL || done == NULL || r->magic != AGOQ_COLL_REQ_MAGIC) {
    AGOQ_WARN("CollNet test: invalid request %p", request);
    return ncclInternalError;
  }
  *done = 0;
  int st = atomic_load_explicit(&r->state, memory_order_acquire);
  if (st == AGOQ_COLL_REQ_PENDING && r->comm->cfg.assist) {
    agoq_coll_engine_assist(r->comm);
    st = atomic_load_explicit(&r->state, memory_order_acquire);
  }
  if (st == AGOQ_COLL_REQ_COPY_OUT) st = agoq_coll_copy_state(r);
  if (st == AGOQ_COLL_REQ_PENDING || st == AGOQ_COLL_REQ_COPY_OUT) return ncclSuccess;
  ncclResult_t res = st == AGOQ_COLL_REQ_DONE ? ncclSuccess : (ncclResult_t)r->error;
  if (res == ncclSuccess) {
    *done = 1;
    if (size != NULL) *size = r->result_bytes > INT_MAX ? INT_MAX : (int)r->result_bytes;
  }
  agoq_coll_req_release(r);
  return res;
}
