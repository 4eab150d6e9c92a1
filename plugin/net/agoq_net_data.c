/* The data path as NCCL's contract has it: isend/irecv post requests (typed payloads
 * become frames here), the transport moves them, test() reports completion (decoding a
 * frame into NCCL's buffer) with the sizes NCCL expects. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "core/agoq_check.h"
#include "net/agoq_net_comm.h"

static agoq_comm* agoq_comm_from(void* p, uint32_t magic) {
  agoq_comm* comm = p;
  return (comm != NULL && comm->magic == magic) ? comm : NULL;
}

/* ---- memory registration ------------------------------------------------------------ */

/* NCCL's regMr and regMrDmaBuf (fd >= 0): the comm and the memory type checked, a handle
 * made and registered. Device memory travels through the link's pinned staging, registered
 * with it, or by DMA-BUF straight to the NIC; host memory is registered with the transport
 * now, so the data path never registers. */
static ncclResult_t agoq_net_reg(const char* what, void* comm, void* data, size_t size, int type, uint64_t offset,
                                 int fd, void** mhandle) {
  agoq_comm* c = comm;
  if (c == NULL || (c->magic != AGOQ_SEND_MAGIC && c->magic != AGOQ_RECV_MAGIC) || mhandle == NULL) {
    AGOQ_WARN("%s: invalid comm %p", what, comm);
    return ncclInternalError;
  }
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    AGOQ_INFO(NCCL_NET | NCCL_REG, "%s: memory type %d not supported (host and CUDA memory only)", what, type);
    return ncclInternalError;
  }
  bool dmabuf = fd >= 0 && type == NCCL_PTR_CUDA;
  if (dmabuf && agoq_net_tp->reg_dmabuf == NULL) {
    AGOQ_INFO(NCCL_NET | NCCL_REG, "%s: DMA-BUF is not supported by this transport", what);
    return ncclInternalError;
  }
  agoq_mr* mr = calloc(1, sizeof *mr);
  if (mr == NULL) return ncclSystemError;
  *mr = (agoq_mr){.magic = AGOQ_MR_MAGIC, .type = type, .device = -1, .addr = data, .size = size};
  ncclResult_t res = dmabuf                     ? agoq_dev_reg_dmabuf(c, data, size, offset, fd, mr)
                     : type == NCCL_PTR_CUDA    ? agoq_dev_reg(c, data, size, mr)
                     : agoq_net_tp->reg != NULL ? agoq_net_tp->reg(c->dev, data, size, &mr->tp_key)
                                                : ncclSuccess;
  if (res != ncclSuccess) {
    free(mr);
    return res;
  }
  *mhandle = mr;
  return ncclSuccess;
}

ncclResult_t agoq_net_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return agoq_net_reg("regMr", comm, data, size, type, 0, -1, mhandle);
}

ncclResult_t agoq_net_reg_host(int dev, void* data, size_t size, void** key) {
  *key = NULL;
  if (agoq_net_tp == NULL || agoq_net_tp->reg == NULL) return ncclSuccess;
  return agoq_net_tp->reg(dev, data, size, key);
}

void agoq_net_dereg_host(void* key) {
  if (key != NULL && agoq_net_tp != NULL && agoq_net_tp->dereg != NULL) agoq_net_tp->dereg(key);
}

void* agoq_mr_key(const void* mhandle, const void* data, size_t size) {
  const agoq_mr* mr = mhandle;
  if (mr == NULL || mr->magic != AGOQ_MR_MAGIC || mr->tp_key == NULL) return NULL;
  const uint8_t *p = data, *lo = mr->addr;
  if (p < lo || (size_t)(p - lo) > mr->size || size > mr->size - (size_t)(p - lo)) return NULL;
  return mr->tp_key;
}

ncclResult_t agoq_net_reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                    void** mhandle) {
  /* Host memory by DMA-BUF is host memory: registered as regMr does. */
  return agoq_net_reg("regMrDmaBuf", comm, data, size, type, offset, type == NCCL_PTR_CUDA ? fd : -1, mhandle);
}

ncclResult_t agoq_net_dereg_mr(void* comm, void* mhandle) {
  (void)comm;
  agoq_mr* mr = mhandle;
  if (mr == NULL) return ncclSuccess;
  if (mr->magic != AGOQ_MR_MAGIC) {
    AGOQ_WARN("deregMr: invalid handle %p", mhandle);
    return ncclInternalError;
  }
  if (mr->tp_key != NULL) agoq_net_tp->dereg(mr->tp_key);
  mr->magic = 0;
  free(mr);
  return ncclSuccess;
}

/* ---- send side ------------------------------------------------------------------------ */

/* The transfer and statistics of a send that goes as it is. */
void agoq_send_exact(agoq_comm* comm, agoq_request* req, const uint8_t* src, size_t size, agoq_exact_reason why) {
  comm->typed_stats.exact_msgs++;
  comm->typed_stats.exact_bytes += size;
  agoq_stats_exact(comm->st, why);
  agoq_send_account(comm, req, AGOQ_STATS_EXACT, size, size, 0, 0);
  req->xfer.data[0] = (uint8_t*)src;
  req->xfer.size[0] = size;
  req->xfer.flags = 0;
  req->xfer.reg[0] = NULL; /* the caller sets the key of src's memory */
}

/* The transfer and statistics of a send that goes as the frame of frame_len bytes at frame. */
void agoq_send_frame(agoq_comm* comm, agoq_request* req, const uint8_t* frame, size_t frame_len, size_t size,
                     uint64_t codec_ns, uint64_t crc_ns) {
  agoq_send_account(comm, req, AGOQ_STATS_QUANT, size, frame_len, codec_ns, crc_ns);
  req->xfer.data[0] = (uint8_t*)frame;
  req->xfer.size[0] = frame_len;
  req->xfer.flags = AGOQ_XFER_FRAME;
  req->xfer.reg[0] = NULL; /* the caller sets the key of the frame's memory */
}

void agoq_send_account(agoq_comm* comm, agoq_request* req, int path, size_t size, size_t wire_size,
                       uint64_t codec_ns, uint64_t crc_ns) {
  if (comm->st == NULL) return;
  req->quantized = path == AGOQ_STATS_QUANT;
  req->post_ns = agoq_stats_clock_ns();
  agoq_stats_count(comm->st, path, size);
  agoq_stats_wire(comm->st, path, size, wire_size);
  agoq_stats_add(&comm->st->path[path].codec_ns, codec_ns);
  agoq_stats_add(&comm->st->path[path].crc_ns, crc_ns);
}

/* A send from NCCL's host buffer: a p2p float payload whose type the profiler chain
 * established travels as a frame the CPU codec makes (agoq_typed.h); everything else
 * exactly as NCCL handed it over. */
static void agoq_send_prepare(agoq_comm* comm, agoq_request* req, const uint8_t* src, size_t size, void* mhandle,
                              void* phandle) {
  size_t wire_size = size;
  agoq_exact_reason why = AGOQ_EXACT_UNKNOWN; /* no profiler handle: no datatype */
  uint64_t codec0 = comm->typed_stats.codec_ns, crc0 = agoq_frame_crc_ns();
  if (phandle == NULL || !agoq_typed_encode(&comm->stage, &comm->typed_stats, comm->prof_fn, phandle, src, size,
                                            &req->stage[0], &wire_size, &why)) {
    agoq_send_exact(comm, req, src, size, why);
    req->xfer.reg[0] = agoq_mr_key(mhandle, src, size);
    return;
  }
  agoq_send_frame(comm, req, agoq_stage_ptr(&comm->stage, req->stage[0]), wire_size, size,
                  comm->typed_stats.codec_ns - codec0, agoq_frame_crc_ns() - crc0);
  req->xfer.reg[0] = agoq_stage_key(&comm->stage, req->stage[0]);
}

ncclResult_t agoq_net_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                            void** request) {
  agoq_comm* comm = agoq_comm_from(send_comm, AGOQ_SEND_MAGIC);
  if (comm == NULL || request == NULL || (data == NULL && size > 0)) {
    AGOQ_WARN("isend: invalid arguments (comm %p, data %p, size %zu)", send_comm, data, size);
    return ncclInternalError;
  }
  *request = NULL;
  ncclResult_t err = agoq_net_tp->error(comm->tp);
  if (err != ncclSuccess) return err;
  bool on_device = false;
  err = agoq_dev_is_device(mhandle, data, size, &on_device);
  if (err != ncclSuccess) return err;
  agoq_request* req = NULL;
  err = agoq_request_alloc(&comm->pool, AGOQ_REQ_SEND, comm, &req);
  if (err != ncclSuccess) return err;
  if (req == NULL) return ncclSuccess; /* all requests busy: NCCL retries */
  req->xfer.n = 1;
  req->n_bufs = 1;
  req->data[0] = data;
  req->posted[0] = size;
  req->tags[0] = tag;
  req->xfer.tag = tag;
  if (on_device) {
    /* The bytes go to the transport once they are in the staging (agoq_dev_advance). */
    bool again = false;
    err = agoq_dev_send_start(comm, req, data, size, mhandle, phandle, &again);
    if (err != ncclSuccess || again) {
      agoq_request_release(&comm->pool, req);
      return err;
    }
    *request = req;
    return agoq_dev_advance(comm);
  }
  agoq_send_prepare(comm, req, data, size, mhandle, phandle);
  /* One connection carries host and device buffers alike (NCCL's LL buffers stay in host
   * memory): behind device sends still being staged, this one waits its turn. */
  err = agoq_dev_post_ready(comm, req);
  if (err != ncclSuccess) {
    if (req->stage[0] >= 0) agoq_stage_put(&comm->stage, req->stage[0]);
    agoq_request_release(&comm->pool, req);
    return err;
  }
  *request = req;
  return ncclSuccess;
}

/* ---- receive side --------------------------------------------------------------------- */

ncclResult_t agoq_net_match(void* arg, agoq_xfer* x, int tag, uint64_t size, uint32_t flags, int* slot_out,
                            uint8_t** dst) {
  agoq_comm* comm = arg;
  agoq_request* req = (agoq_request*)((char*)x - offsetof(agoq_request, xfer));
  char what[192];
  int slot = -1;
  if (req->n_bufs == 1) {
    slot = 0; /* a single receive takes any tag, as NCCL's socket transport does */
  } else {
    for (int i = 0; i < req->n_bufs && slot < 0; i++)
      if (!(x->matched_mask & (1u << i)) && req->tags[i] == tag) slot = i;
    if (slot < 0) {
      snprintf(what, sizeof what, "message with tag %d matches no buffer of the posted grouped receive", tag);
      AGOQ_WARN("connection from %s: %s", agoq_comm_peer(comm), what);
      return ncclInvalidUsage;
    }
  }
  if (size > req->posted[slot]) {
    AGOQ_WARN("connection from %s: message truncated: peer sent %llu bytes, receive posted for %zu",
              agoq_comm_peer(comm), (unsigned long long)size, req->posted[slot]);
    return ncclInvalidUsage;
  }
  if (flags & AGOQ_XFER_FRAME) {
    /* Staged, decoded at completion. A frame is never larger than the bytes it stands
     * for, so the posted size bounds the staging buffer too. */
    if (size < AGOQ_FRAME_HEADER_SIZE) {
      AGOQ_WARN("connection from %s: frame shorter than a frame header", agoq_comm_peer(comm));
      return ncclSystemError;
    }
    if (req->dev_mask & (1u << slot)) {
      /* Into the pinned staging, from where the GPU decodes it (agoq_net_device.c). */
      ncclResult_t late = agoq_dev_recv_frame_place(comm, req, slot, size);
      if (late != ncclSuccess) return late;
      req->frame_mask |= (uint8_t)(1u << slot);
      *dst = req->host[slot];
      x->reg[slot] = agoq_dev_recv_key(comm, req, slot);
      *slot_out = slot;
      return ncclSuccess;
    }
    int idx = agoq_stage_get(&comm->stage, size);
    if (idx < 0) {
      AGOQ_WARN("connection from %s: out of memory staging a frame", agoq_comm_peer(comm));
      return ncclSystemError;
    }
    req->stage[slot] = idx;
    *dst = agoq_stage_ptr(&comm->stage, idx);
    x->reg[slot] = agoq_stage_key(&comm->stage, idx);
  } else {
    comm->typed_stats.exact_msgs++;
    comm->typed_stats.exact_bytes += size;
    agoq_stats_count(comm->st, AGOQ_STATS_EXACT, size);
    agoq_stats_wire(comm->st, AGOQ_STATS_EXACT, size, size);
    /* NCCL's own buffer keeps the key irecv set from its mhandle. */
    if ((req->direct_ok & (1u << slot)) && (flags & AGOQ_XFER_RDMA)) {
      /* GPUDirect RDMA: the sender's NIC writes into NCCL's device buffer. */
      req->direct_mask |= (uint8_t)(1u << slot);
      *dst = req->data[slot];
    } else if (req->dev_mask & (1u << slot)) {
      ncclResult_t late = agoq_dev_recv_late(comm, req, slot, size);
      if (late != ncclSuccess) return late;
      *dst = req->host[slot];
      x->reg[slot] = agoq_dev_recv_key(comm, req, slot); /* the staging or a bounce buffer */
    } else {
      *dst = req->data[slot];
    }
  }
  *slot_out = slot;
  return ncclSuccess;
}

/* irecv, with a spill maximum (agoq_net_irecv_spill; 0: none). */
static ncclResult_t agoq_net_irecv_max(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                                       void** mhandles, size_t spill_max, void** request) {
  agoq_comm* comm = agoq_comm_from(recv_comm, AGOQ_RECV_MAGIC);
  if (comm == NULL || request == NULL || n < 1 || n > AGOQ_NET_MAX_RECVS || data == NULL || sizes == NULL) {
    AGOQ_WARN("irecv: invalid arguments (comm %p, n %d)", recv_comm, n);
    return ncclInternalError;
  }
  /* NCCL may preset *request to NCCL_NET_OPTIONAL_RECV_COMPLETION for LL/LL128; we always
   * report real completion, which the contract allows. The hint also says NCCL's kernel polls
   * the buffer's flags meanwhile: bytes copied into device memory must land flags last. */
  bool polled = n == 1 && *request == (void*)(uintptr_t)NCCL_NET_OPTIONAL_RECV_COMPLETION;
  *request = NULL;
  ncclResult_t err = agoq_net_tp->error(comm->tp);
  if (err != ncclSuccess) return err;
  uint8_t dev_mask = 0;
  for (int i = 0; i < n; i++) {
    if (data[i] == NULL && sizes[i] > 0) {
      AGOQ_WARN("irecv: NULL buffer %d with size %zu", i, sizes[i]);
      return ncclInternalError;
    }
    bool on_device = false;
    err = agoq_dev_is_device(mhandles != NULL ? mhandles[i] : NULL, data[i], sizes[i], &on_device);
    if (err != ncclSuccess) return err;
    if (on_device) dev_mask |= (uint8_t)(1u << i);
  }
  uint8_t direct_ok = 0;
  for (int i = 0; i < n && mhandles != NULL; i++)
    if ((dev_mask & (1u << i)) && agoq_dev_direct_recv(comm, mhandles[i])) direct_ok |= (uint8_t)(1u << i);
  agoq_request* req = NULL;
  err = agoq_request_alloc(&comm->pool, AGOQ_REQ_RECV, comm, &req);
  if (err != ncclSuccess) return err;
  if (req == NULL) return ncclSuccess; /* all requests busy: NCCL retries */
  req->n_bufs = n;
  req->xfer.n = n;
  for (int i = 0; i < n; i++) {
    req->data[i] = data[i];
    req->posted[i] = sizes[i];
    req->tags[i] = tags != NULL ? tags[i] : 0;
    req->xfer.reg[i] = mhandles != NULL ? agoq_mr_key(mhandles[i], data[i], sizes[i]) : NULL;
  }
  req->dev_mask = dev_mask;
  req->direct_ok = direct_ok;
  req->polled = polled;
  req->spill_max = spill_max;
  if (dev_mask != 0) {
    bool again = false;
    err = agoq_dev_recv_start(comm, req, &again);
    if (err != ncclSuccess || again) {
      agoq_request_release(&comm->pool, req);
      return err;
    }
  }
  if (comm->st != NULL) req->post_ns = agoq_stats_clock_ns();
  err = comm->tagq != NULL ? agoq_tagq_irecv(comm, req) : agoq_net_tp->post_recv(comm->tp, &req->xfer);
  if (err != ncclSuccess) {
    agoq_dev_release(comm, req);
    agoq_request_release(&comm->pool, req);
    return err;
  }
  *request = req;
  return ncclSuccess;
}

ncclResult_t agoq_net_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                            void** phandles, void** request) {
  (void)phandles;
  return agoq_net_irecv_max(recv_comm, n, data, sizes, tags, mhandles, 0, request);
}

ncclResult_t agoq_net_irecv_spill(void* recv_comm, void* data, size_t size, size_t max, int tag, void** request) {
  agoq_comm* comm = agoq_comm_from(recv_comm, AGOQ_RECV_MAGIC);
  if (comm == NULL || comm->tagq == NULL || max < size) {
    AGOQ_WARN("irecv: a spilling receive needs a tagged receive comm (comm %p) and a maximum of at least its size "
              "(%zu < %zu)", recv_comm, max, size);
    return ncclInternalError;
  }
  return agoq_net_irecv_max(recv_comm, 1, &data, &size, &tag, NULL, max, request);
}

ncclResult_t agoq_net_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)data;
  (void)sizes;
  agoq_comm* comm = agoq_comm_from(recv_comm, AGOQ_RECV_MAGIC);
  if (comm == NULL || request == NULL || n < 0 || n > AGOQ_NET_MAX_RECVS) {
    AGOQ_WARN("iflush: invalid arguments (comm %p, n %d)", recv_comm, n);
    return ncclInternalError;
  }
  /* A staged receive into device memory is done only once the plugin's copy into NCCL's
   * buffer has completed (agoq_net_device.c), so it is visible to the GPU already; one the
   * NIC wrote straight into device memory (GPUDirect RDMA) is made visible now. Either way
   * nothing is left to wait for: a NULL request is NCCL's "done". */
  *request = NULL;
  ncclResult_t res = agoq_dev_flush(comm, n, mhandles);
  if (res != ncclSuccess) {
    AGOQ_WARN("iflush: receive from %s: the GPUDirect RDMA flush failed", agoq_comm_peer(comm));
    agoq_net_tp->fail(comm->tp, res);
  }
  return res;
}

/* ---- completion ------------------------------------------------------------------------ */

static int agoq_size_to_int(size_t size) { return size > INT_MAX ? INT_MAX : (int)size; }

/* Decodes the frames of a finished receive into NCCL's buffers; releases the staging. */
static ncclResult_t agoq_recv_decode(agoq_comm* comm, agoq_request* req, size_t* actual) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < req->n_bufs; i++) {
    actual[i] = req->xfer.size[i];
    if (req->stage[i] < 0) continue;
    size_t decoded = 0;
    uint64_t codec0 = comm->typed_stats.codec_ns, crc0 = agoq_frame_crc_ns();
    /* After a failed frame the others are not decoded, but their staging is released. */
    ncclResult_t r = res;
    if (r == ncclSuccess)
      r = agoq_typed_decode(&comm->typed_stats, agoq_stage_ptr(&comm->stage, req->stage[i]), req->xfer.size[i],
                            (req->dev_mask & (1u << i)) ? req->host[i] : req->data[i], req->posted[i], &decoded,
                            agoq_comm_peer(comm));
    if (r == ncclSuccess && comm->st != NULL) {
      req->quantized = true;
      agoq_stats_count(comm->st, AGOQ_STATS_QUANT, decoded);
      agoq_stats_wire(comm->st, AGOQ_STATS_QUANT, decoded, req->xfer.size[i]);
      agoq_stats_add(&comm->st->path[AGOQ_STATS_QUANT].codec_ns, comm->typed_stats.codec_ns - codec0);
      agoq_stats_add(&comm->st->path[AGOQ_STATS_QUANT].crc_ns, agoq_frame_crc_ns() - crc0);
    }
    agoq_stage_put(&comm->stage, req->stage[i]);
    req->stage[i] = -1;
    res = r;
    actual[i] = decoded;
  }
  return res;
}

/* The request is complete: sizes for NCCL, statistics, the request back to its pool. */
static void agoq_request_finish(agoq_comm* comm, agoq_request* req, const size_t* actual, int* sizes) {
  if (sizes != NULL)
    for (int i = 0; i < req->n_bufs; i++) sizes[i] = agoq_size_to_int(actual[i]);
  if (comm->st != NULL)
    agoq_stats_add(&comm->st->path[req->quantized ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT].wire_ns,
                   (uint64_t)(agoq_stats_clock_ns() - req->post_ns));
  agoq_dev_release(comm, req);
  agoq_request_release(&comm->pool, req);
}

/* A failure of the device path: the connection is unusable (NCCL aborts on it). */
static ncclResult_t agoq_dev_failed(agoq_comm* comm, ncclResult_t res) {
  if (!comm->error_reported) {
    comm->error_reported = true;
    AGOQ_WARN("%s %s: the device path failed (%s); pending requests on this connection fail",
              comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), agoq_result_str(res));
  }
  agoq_net_tp->fail(comm->tp, res);
  return res;
}

static ncclResult_t agoq_net_test_req(void* request, int* done, int* sizes, uint8_t** spill) {
  agoq_request* req = request;
  if (req == NULL || done == NULL || req->magic != AGOQ_REQUEST_MAGIC || req->comm == NULL) {
    AGOQ_WARN("test: invalid request %p", request);
    return ncclInternalError;
  }
  agoq_comm* comm = req->comm;
  *done = 0;
  if (comm->dev_count > 0) {
    ncclResult_t r = agoq_dev_advance(comm);
    if (r != ncclSuccess) return agoq_dev_failed(comm, r);
  }
  if (req->phase == AGOQ_DEV_COPY_IN) {
    /* Not with the transport yet; keep the others moving. */
    return agoq_net_tp->progress(comm->tp, NULL);
  }
  if (req->phase == AGOQ_DEV_COPY_OUT) {
    bool copied = false;
    ncclResult_t r = agoq_dev_copied(comm, req, &copied);
    if (r != ncclSuccess) return agoq_dev_failed(comm, r);
    if (copied) {
      agoq_request_finish(comm, req, req->actual, sizes);
      *done = 1;
    }
    return ncclSuccess;
  }
  ncclResult_t err;
  bool xfer_done;
  if (comm->tagq != NULL) { /* receive comms only */
    err = agoq_tagq_test(comm, req, &xfer_done);
    if (xfer_done) {
      if (spill != NULL) {
        *spill = req->spill; /* the caller's now; released with the request otherwise */
        req->spill = NULL;
      }
      agoq_request_finish(comm, req, req->actual, sizes);
      *done = 1;
      return ncclSuccess;
    }
  } else {
    err = agoq_net_tp->progress(comm->tp, &req->xfer);
    xfer_done = agoq_net_tp->done(comm->tp, &req->xfer);
  }
  if (xfer_done) {
    size_t actual[AGOQ_NET_MAX_RECVS] = {0};
    if (comm->is_send) {
      if (req->stage[0] >= 0) agoq_stage_put(&comm->stage, req->stage[0]);
      req->stage[0] = -1;
      actual[0] = req->posted[0];
    } else {
      ncclResult_t res = agoq_recv_decode(comm, req, actual);
      if (res != ncclSuccess) {
        /* Nothing of a rejected frame reached NCCL's buffer; the connection is unusable. */
        agoq_net_tp->fail(comm->tp, res);
        comm->error_reported = true;
        return res;
      }
      if (req->dev_mask != 0) {
        /* In the staging: done once the copy into NCCL's device buffer is. */
        memcpy(req->actual, actual, sizeof req->actual);
        bool queued = false;
        ncclResult_t r = agoq_dev_recv_copy_out(comm, req, &queued);
        if (r != ncclSuccess) return agoq_dev_failed(comm, r);
        if (queued) return ncclSuccess;
      }
    }
    agoq_request_finish(comm, req, actual, sizes);
    *done = 1;
    return ncclSuccess;
  }
  if (err != ncclSuccess && !comm->error_reported) {
    comm->error_reported = true;
    AGOQ_WARN("%s with %s failed (%s); pending requests on this connection fail",
              comm->is_send ? "send" : "receive", agoq_comm_peer(comm), agoq_result_str(err));
  }
  return err;
}

ncclResult_t agoq_net_test(void* request, int* done, int* sizes) {
  return agoq_net_test_req(request, done, sizes, NULL);
}

ncclResult_t agoq_net_test_spill(void* request, int* done, int* size, uint8_t** spill) {
  *spill = NULL;
  return agoq_net_test_req(request, done, size, spill);
}

int agoq_net_wait_fds(void* p, struct pollfd* out, int max, bool* hidden) {
  agoq_comm* comm = p;
  if (comm == NULL || (comm->magic != AGOQ_SEND_MAGIC && comm->magic != AGOQ_RECV_MAGIC)) return 0;
  return agoq_net_tp->wait_fds(comm->tp, out, max, hidden);
}

/* ---- close ----------------------------------------------------------------------------- */

static ncclResult_t agoq_comm_close(void* p, uint32_t magic, const char* what) {
  if (p == NULL) return ncclSuccess;
  agoq_comm* comm = agoq_comm_from(p, magic);
  if (comm == NULL) {
    AGOQ_WARN("%s: invalid comm %p", what, p);
    return ncclInternalError;
  }
  uint32_t busy = agoq_request_in_use(&comm->pool);
  if (busy > 0) AGOQ_INFO(NCCL_NET, "%s with %u requests in flight to %s", what, busy, agoq_comm_peer(comm));
  /* Closing the transport first guarantees no progress thread still writes into the
   * buffers of the abandoned requests. */
  agoq_comm_destroy(comm);
  return ncclSuccess;
}

ncclResult_t agoq_net_close_send(void* send_comm) { return agoq_comm_close(send_comm, AGOQ_SEND_MAGIC, "closeSend"); }
ncclResult_t agoq_net_close_recv(void* recv_comm) { return agoq_comm_close(recv_comm, AGOQ_RECV_MAGIC, "closeRecv"); }
