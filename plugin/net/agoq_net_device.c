/* NCCL's buffers in device memory (NCCL_PTR_CUDA) on the net path. The transport moves
 * host bytes only, so each request's bytes pass through pinned staging of the comm's GPU
 * link (plugin/gpu):
 *  - send: isend queues the copy of NCCL's buffer into the staging, or for a typed payload
 *    the CUDA codec's encode of it straight into the staging, and an event; once the event
 *    is done the staging goes to the transport, in posting order; the request is done when
 *    the transport has sent it. NCCL's buffer was read by then.
 *  - receive: irecv reserves the staging; the transport fills it; then the copy into NCCL's
 *    buffer, or for a frame the GPU's decode of it from the staging, and an event are
 *    queued; test says done only when that event is, so the bytes are in NCCL's buffer when
 *    NCCL's kernel looks, and iflush has nothing left to do.
 * GPUDirect RDMA: memory NCCL registered by DMA-BUF (regMrDmaBuf) with a transport whose HCA
 * reaches it (mr->direct) skips the staging for exact messages: a send hands NCCL's buffer to
 * the transport (AGOQ_XFER_DEVICE: the CPU never touches it), and a receive the transport
 * writes by RDMA lands in NCCL's buffer, made visible to the GPU by iflush where NCCL asks
 * (agoq_dev_flush). Frames (the GPU codec) and messages a transport copies with the CPU
 * (inline) still pass through the staging.
 * Nothing here waits for the device: test only queries events. Copies of one connection
 * run in order on its stream; NCCL keeps several steps in flight per connection, so the
 * copy of one step overlaps the wire time of the others. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_frame.h"
#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "net/agoq_net_comm.h"

/* Pool chunks registered with the connection's NIC at link setup, where the transport
 * moves only registered memory (verbs): a piece is then never registered on the data path.
 * Elsewhere (TCP) agoq_net_reg_host answers "no key" and the pool keeps none. */
static const agoq_gpu_pool_ops agoq_dev_pool_ops = {.reg = agoq_net_reg_host, .dereg = agoq_net_dereg_host};

/* A pooled connection's own pinned bytes: AGOQ_GPU_STAGING/32 (256 KiB by default, 32 MiB on
 * 128 connections), at least 64 KiB (or the staging itself when smaller). */
static size_t agoq_dev_share(size_t staging) {
  size_t floor = staging < 65536 ? staging : 65536;
  size_t share = staging / 32;
  return share > floor ? share : floor;
}

/* The largest staged message one allocation can hold: the share, or a chunk of the pool. */
static size_t agoq_dev_stage_max(agoq_comm* comm) {
  size_t ring = agoq_gpu_link_ring(comm->gpu)->size, chunk = agoq_gpu_pool_chunk_size(agoq_gpu_link_pool(comm->gpu));
  return ring > chunk ? ring : chunk;
}

/* size bytes of staging: the connection's share when it holds them now, else a piece of the
 * GPU's pool; never waits. */
static bool agoq_dev_stage_get(agoq_comm* comm, size_t size, uint8_t** p, int* ring_id, agoq_gpu_pool_piece* piece) {
  agoq_gpu_ring* ring = agoq_gpu_link_ring(comm->gpu);
  *ring_id = -1;
  piece->chunk = -1;
  if (agoq_gpu_ring_fits(ring, size)) {
    *ring_id = agoq_gpu_ring_get(ring, size, p);
    if (*ring_id >= 0) return true;
  }
  return agoq_gpu_pool_get(agoq_gpu_link_pool(comm->gpu), size, piece) && (*p = piece->ptr) != NULL;
}

static void agoq_dev_stage_put(agoq_comm* comm, int* ring_id, agoq_gpu_pool_piece* piece) {
  if (*ring_id >= 0) agoq_gpu_ring_put(agoq_gpu_link_ring(comm->gpu), *ring_id);
  *ring_id = -1;
  if (piece->chunk >= 0) agoq_gpu_pool_put(agoq_gpu_link_pool(comm->gpu), piece);
}

/* The transport's registration of a staging allocation: the share's, or its pool chunk's. */
static void* agoq_dev_stage_key(const agoq_comm* comm, const agoq_gpu_pool_piece* piece) {
  return piece->chunk >= 0 ? agoq_gpu_pool_key(agoq_gpu_link_pool(comm->gpu), piece, comm->dev) : comm->gpu_key;
}

ncclResult_t agoq_dev_reg(agoq_comm* comm, void* data, size_t size, agoq_mr* mr) {
  char why[224];
  int device = -1;
  if (agoq_gpu_range_check(data, size, &device, why, sizeof why) != ncclSuccess) {
    AGOQ_WARN("regMr: device memory %p (%zu bytes) refused: %s", data, size, why);
    return ncclInvalidUsage;
  }
  if (comm->gpu == NULL) {
    size_t staging = (size_t)agoq_param_int(AGOQ_PARAM_GPU_STAGING);
    size_t pinned_max = (size_t)agoq_param_int(AGOQ_PARAM_GPU_PINNED_MAX);
    /* Pinned memory per GPU, not per connection (agoq_gpu_pool.h): a share of its own, and
     * the GPU's pool for what the share cannot hold. A message neither has room for now
     * passes in pieces through the share and a host bounce buffer (below), never waiting
     * for the pool, which other connections hold (waiting could deadlock across nodes).
     * Every connection with typed p2p on keeps a whole staging instead: whether a message
     * goes as a frame must not depend on what the pool holds at that moment (the numbers
     * would change from run to run), and a frame cannot pass in pieces. */
    bool pooled = pinned_max > 0 && agoq_typed.format == AGOQ_FORMAT_NONE;
    /* A request's codec calls: one encode, or a decode per buffer of a grouped receive.
     * Their GPU time (statistics only) is measured for as many calls as NCCL keeps requests
     * in flight, twice over; calls beyond that go untimed (counted). Sized by the requests,
     * 256 x 8 pairs took 4,096 events per connection, 0.5 million on a node's 128 links. */
    agoq_gpu_link_config lc = {.staging = pooled ? agoq_dev_share(staging) : staging,
                               .slots = AGOQ_REQUESTS_PER_COMM,
                               .parts = AGOQ_GPU_PARTS_PER_SLOT,
                               .timed = 2 * NCCL_NET_MAX_REQUESTS,
                               .pool = {.chunk = pooled ? staging : 0, .cap = pinned_max},
                               .pool_net_dev = comm->dev,
                               .pool_ops = &agoq_dev_pool_ops};
    /* Also loads every codec kernel on this device (agoq_gpu_codec_load), whatever format a
     * peer sends: none is first launched on the data path. */
    if (comm->dev_fifo == NULL && (comm->dev_fifo = calloc(AGOQ_REQUESTS_PER_COMM, sizeof *comm->dev_fifo)) == NULL) {
      AGOQ_WARN("regMr: out of memory for a connection's queue of device sends");
      return ncclSystemError;
    }
    AGOQ_CHECK(agoq_gpu_link_create(device, &lc, &comm->gpu));
    /* The staging is what the transport reads and writes: registered once, here. */
    const agoq_gpu_ring* ring = agoq_gpu_link_ring(comm->gpu);
    if (agoq_net_tp->reg != NULL) AGOQ_CHECK(agoq_net_tp->reg(comm->dev, ring->base, ring->size, &comm->gpu_key));
    if (pooled)
      AGOQ_INFO(NCCL_NET | NCCL_REG,
                "%s %s: device buffers of GPU %d staged through %zu bytes of pinned memory of its own, and pieces "
                "of GPU %d's pinned pool (chunks of AGOQ_GPU_STAGING=%zu, AGOQ_GPU_PINNED_MAX=%zu with the shares)",
                comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), device, ring->size, device,
                staging, pinned_max);
    else
      AGOQ_INFO(NCCL_NET | NCCL_REG, "%s %s: device buffers of GPU %d staged through %zu bytes of pinned memory",
                comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), device, staging);
  } else if (agoq_gpu_link_device(comm->gpu) != device) {
    AGOQ_WARN("regMr: device memory of GPU %d on a connection that carries GPU %d's", device,
              agoq_gpu_link_device(comm->gpu));
    return ncclInvalidUsage;
  }
  mr->device = device;
  return ncclSuccess;
}

ncclResult_t agoq_dev_reg_dmabuf(agoq_comm* comm, void* data, size_t size, uint64_t offset, int fd, agoq_mr* mr) {
  AGOQ_CHECK(agoq_dev_reg(comm, data, size, mr));
  /* A failed registration leaves the buffer on the staged path: slower, never wrong. */
  ncclResult_t res = agoq_net_tp->reg_dmabuf(comm->dev, data, size, offset, fd, &mr->tp_key);
  if (res != ncclSuccess) {
    mr->tp_key = NULL;
    AGOQ_WARN("regMrDmaBuf: GPU buffer %p (%zu bytes) could not be registered with the NIC (logged above): its "
              "messages are staged through host memory instead of GPUDirect RDMA",
              data, size);
    return ncclSuccess;
  }
  mr->direct = true;
  AGOQ_INFO(NCCL_NET | NCCL_REG, "%s %s: GPU buffer %p (%zu bytes) registered by DMA-BUF: GPUDirect RDMA",
            comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), data, size);
  return ncclSuccess;
}

bool agoq_dev_direct(const void* mhandle) {
  const agoq_mr* mr = mhandle;
  return mr != NULL && mr->magic == AGOQ_MR_MAGIC && mr->direct;
}

bool agoq_dev_direct_recv(const agoq_comm* comm, const void* mhandle) {
  /* Straight into GPU memory only where its writes can be made visible when NCCL asks. */
  return agoq_dev_direct(mhandle) && agoq_gpu_link_rdma_flush(comm->gpu);
}

ncclResult_t agoq_dev_flush(agoq_comm* comm, int n, void** mhandles) {
  bool direct = false;
  for (int i = 0; i < n && mhandles != NULL; i++) direct = direct || agoq_dev_direct_recv(comm, mhandles[i]);
  /* Staged receives were copied in by the GPU's own stream before test said done. */
  return direct ? agoq_gpu_flush_rdma_writes(comm->gpu) : ncclSuccess;
}

ncclResult_t agoq_dev_post_ready(agoq_comm* comm, agoq_request* req) {
  if (comm->dev_count == 0) {
    req->phase = AGOQ_DEV_WIRE;
    return agoq_net_tp->post_send(comm->tp, &req->xfer);
  }
  /* Behind device sends still being staged: it goes after them (agoq_dev_advance). */
  req->ready = true;
  req->phase = AGOQ_DEV_COPY_IN;
  comm->dev_fifo[(comm->dev_first + comm->dev_count) % AGOQ_REQUESTS_PER_COMM] = req->pool_index;
  comm->dev_count++;
  return ncclSuccess;
}

ncclResult_t agoq_dev_is_device(const void* mhandle, const void* data, size_t size, bool* device) {
  const agoq_mr* mr = mhandle;
  *device = false;
  if (mr == NULL || mr->magic != AGOQ_MR_MAGIC || mr->type != NCCL_PTR_CUDA) return ncclSuccess;
  const uint8_t* p = data;
  const uint8_t* lo = mr->addr;
  if (p < lo || (size_t)(p - lo) > mr->size || size > mr->size - (size_t)(p - lo)) {
    AGOQ_WARN("device buffer %p (%zu bytes) lies outside its registration %p (%zu bytes)", data, size, mr->addr,
              mr->size);
    return ncclInvalidUsage;
  }
  *device = true;
  return ncclSuccess;
}

/* A request whose bytes can never fit is an error now rather than a retry forever. */
static ncclResult_t agoq_dev_fits(agoq_comm* comm, size_t need) {
  if (need <= agoq_dev_stage_max(comm)) return ncclSuccess;
  AGOQ_WARN("%s %s: a device message of %zu bytes exceeds the connection's staging (AGOQ_GPU_STAGING=%lld): raise it",
            comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), need,
            (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
  return ncclInvalidUsage;
}

/* ---- messages larger than the staging, through a host bounce buffer ----
 * A staged message must lie whole in host memory the transport reads or writes, and the
 * pinned staging (AGOQ_GPU_STAGING) is smaller than what NCCL sends from registered
 * buffers (up to NCCL_MAX_NET_SIZE, 1 GiB, per isend). Such a message, or one neither the
 * share nor the pool has room for now, goes through a malloc'd bounce buffer, filled (send)
 * or emptied (receive) across PCIe in pieces through a part of the request's staging, one
 * piece at a time behind an event: no CUDA allocation on the data path (a cudaHostAlloc
 * there can block behind another thread's work), no wait for the device, and pinned memory
 * stays as configured. One such request per connection at a time (agoq_comm.bounce_reqs).
 * A transport that moves only registered memory (verbs) gets the bounce buffer registered
 * for its message: the one registration agoq makes on the data path, slow on hardware
 * (pinning its pages) and said once per connection; it never waits for another connection.
 * GPUDirect RDMA (DMA-BUF) avoids it for exact messages, a larger AGOQ_GPU_STAGING for the
 * others. */
/* The staging a bounce request takes for its pieces, out of an allocation of at most `area`
 * bytes (the share's ring or a pool chunk): half of it, so that the requests around it keep
 * moving, or what the other buffers of its grouped receive leave. */
static size_t agoq_dev_piece_cap(size_t area, size_t others) {
  size_t half = agoq_gpu_ring_piece(area);
  size_t left = others < area ? (area - others) / AGOQ_GPU_RING_ALIGN * AGOQ_GPU_RING_ALIGN : 0;
  return left < half ? left : half;
}

static ncclResult_t agoq_dev_bounce_alloc(agoq_comm* comm, agoq_request* req, int i, size_t size) {
  uint8_t* p = malloc(size);
  if (p == NULL) {
    AGOQ_WARN("%s %s: no host memory for the bounce buffer of a %zu-byte device message (larger than "
              "AGOQ_GPU_STAGING=%lld)",
              comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), size,
              (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
    return ncclSystemError;
  }
  void* key = NULL;
  ncclResult_t res = agoq_net_reg_host(comm->dev, p, size, &key);
  if (res != ncclSuccess) {
    free(p);
    AGOQ_WARN("%s %s: the host bounce buffer of a %zu-byte device message could not be registered with the NIC "
              "(logged above); GPUDirect RDMA (DMA-BUF) or a larger AGOQ_GPU_STAGING (%lld) avoids it",
              comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), size,
              (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
    return res;
  }
  if (key != NULL && comm->bounce_regs++ == 0)
    AGOQ_INFO(NCCL_NET | NCCL_REG,
              "%s %s: a %zu-byte device message without room in the pinned staging passes through a host buffer "
              "registered for it (slow on hardware; GPUDirect RDMA by DMA-BUF, or a larger AGOQ_GPU_STAGING=%lld, "
              "avoids it); counted in this connection's closing line",
              comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), size,
              (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
  if (!req->bounce_held) comm->bounce_reqs++;
  req->bounce_held = true;
  req->bounce[i] = p;
  req->bounce_key[i] = key;
  req->bounce_mask |= (uint8_t)(1u << i);
  return ncclSuccess;
}

static void agoq_dev_bounce_free(agoq_comm* comm, agoq_request* req) {
  for (int i = 0; i < AGOQ_NET_MAX_RECVS; i++) {
    agoq_net_dereg_host(req->bounce_key[i]);
    req->bounce_key[i] = NULL;
    free(req->bounce[i]);
    req->bounce[i] = NULL;
  }
  if (req->bounce_held) comm->bounce_reqs--;
  req->bounce_held = false;
  req->bounce_mask = 0;
}

/* Send: the piece in the staging is complete; into the bounce buffer with it, and the
 * next piece's copy queued (*more) or the staging handed back. */
static ncclResult_t agoq_dev_send_piece_done(agoq_comm* comm, agoq_request* req, bool* more) {
  size_t size = req->posted[0];
  memcpy(req->bounce[0] + req->piece_off, req->piece_host, req->piece_len);
  req->piece_off += req->piece_len;
  req->piece_len = 0;
  *more = req->piece_off < size;
  if (!*more) {
    agoq_dev_stage_put(comm, &req->ring_id, &req->pool_piece);
    return ncclSuccess;
  }
  size_t len = size - req->piece_off < req->piece_cap ? size - req->piece_off : req->piece_cap;
  AGOQ_CHECK(agoq_gpu_copy_d2h(comm->gpu, req->piece_host, req->data[0] + req->piece_off, len));
  AGOQ_CHECK(agoq_gpu_mark(comm->gpu, req->pool_index));
  req->piece_len = len;
  return ncclSuccess;
}

/* Receive: the previous piece (if any) has landed in NCCL's buffer; the next one, of this
 * buffer or of the next bounced one, goes from the bounce buffer through the staging
 * (*queued; the caller marks), or none is left. */
static ncclResult_t agoq_dev_recv_piece_next(agoq_comm* comm, agoq_request* req, bool* queued) {
  *queued = false;
  if (req->piece_len > 0) {
    agoq_stats_device(comm->st, AGOQ_STATS_EXACT, 0, req->piece_len);
    req->piece_off += req->piece_len;
    req->piece_len = 0;
  }
  int i = req->piece_buf;
  while (i < req->n_bufs && (i < 0 || req->piece_off >= req->actual[i])) {
    i++;
    while (i < req->n_bufs && !((req->bounce_mask & (1u << i)) && req->actual[i] > 0)) i++;
    req->piece_off = 0;
  }
  req->piece_buf = i;
  if (i >= req->n_bufs) return ncclSuccess;
  size_t len = req->actual[i] - req->piece_off < req->piece_cap ? req->actual[i] - req->piece_off : req->piece_cap;
  memcpy(req->piece_host, req->bounce[i] + req->piece_off, len);
  AGOQ_CHECK(agoq_gpu_copy_h2d(comm->gpu, req->data[i] + req->piece_off, req->piece_host, len));
  req->piece_len = len;
  *queued = true;
  return ncclSuccess;
}

ncclResult_t agoq_dev_send_start(agoq_comm* comm, agoq_request* req, void* data, size_t size, void* mhandle,
                                 void* phandle, bool* again) {
  *again = false;
  if (comm->gpu == NULL) {
    AGOQ_WARN("isend: device buffer on a connection without registered device memory");
    return ncclInternalError;
  }
  ncclResult_t res = ncclSuccess;
  agoq_gpu_ring* ring = agoq_gpu_link_ring(comm->gpu);
  const bool direct = agoq_dev_direct(mhandle);
  /* The staging first, before anything is counted (a full one: NCCL calls again). A message
   * by GPUDirect needs none, so one larger than the staging goes without (NCCL sends up to
   * NCCL_MAX_NET_SIZE, 1 GiB, per isend from registered buffers); a staged one that large is
   * an error naming AGOQ_GPU_STAGING. */
  uint8_t* host = NULL;
  int id = -1;
  agoq_gpu_pool_piece piece = {.chunk = -1};
  /* Staged and larger than any staging: through a bounce buffer, in pieces. */
  bool bounce = !direct && size > agoq_dev_stage_max(comm);
  if (!bounce && (!direct || size <= agoq_dev_stage_max(comm))) {
    if (!direct) AGOQ_CHECK(agoq_dev_fits(comm, size));
    if (!agoq_dev_stage_get(comm, size, &host, &id, &piece)) {
      /* Neither the share nor the pool has room now. One the share can hold waits for it
       * (this connection's own requests give it back); one it cannot passes in pieces
       * through it rather than wait for the pool, which other connections hold. A GPUDirect
       * one waits too: whether it goes as a frame must not depend on what the staging
       * holds at that moment. */
      if (direct || agoq_gpu_ring_fits(ring, size)) {
        *again = true;
        return ncclSuccess;
      }
      bounce = true;
    }
  }
  size_t piece_cap = 0;
  if (bounce) {
    /* Pieces as large as the pool gives (fewer copies and events for a 1 GiB message),
     * else as the share does. */
    if (comm->bounce_reqs > 0) {
      *again = true;
      return ncclSuccess;
    }
    piece_cap = agoq_dev_piece_cap(agoq_dev_stage_max(comm), 0);
    if (!agoq_dev_stage_get(comm, piece_cap, &host, &id, &piece)) {
      piece_cap = agoq_dev_piece_cap(ring->size, 0);
      id = agoq_gpu_ring_get(ring, piece_cap, &host);
      if (id < 0) {
        *again = true;
        return ncclSuccess;
      }
    }
  }
  const bool staged = id >= 0 || piece.chunk >= 0;
  agoq_codec_params p;
  size_t n = 0, cap = 0;
  agoq_exact_reason why = AGOQ_EXACT_UNKNOWN; /* no profiler handle: no datatype */
  req->dev_frame = phandle != NULL &&
                   agoq_typed_plan(&comm->typed_stats, comm->prof_fn, phandle, size, &p, &n, &cap, &why);
  if (req->dev_frame && cap < AGOQ_FRAME_HEADER_SIZE + agoq_codec_body_size(&p, n, 0)) {
    /* Even without escaped blocks the frame would not be smaller (a few elements under a
     * small AGOQ_MIN_BYTES): exact, as the host path decides. The device would refuse the
     * launch itself. */
    comm->typed_stats.not_eligible++;
    req->dev_frame = false;
    why = AGOQ_EXACT_NOGAIN;
  }
  if (req->dev_frame && ((uintptr_t)data & (agoq_dtype_size(p.dtype) - 1)) != 0) {
    /* A registered user buffer can start anywhere: the CUDA codec reads whole elements and
     * would refuse it, failing the isend. The bytes go exact instead. */
    comm->typed_stats.not_eligible++;
    req->dev_frame = false;
    why = AGOQ_EXACT_UNALIGNED;
  }
  if (req->dev_frame && (!staged || bounce)) {
    /* Larger than the staging, which a frame's slot needs (it must hold the payload's copy
     * too, should the frame be no smaller): exact instead, by GPUDirect or bounced. */
    comm->typed_stats.not_eligible++;
    req->dev_frame = false;
    why = AGOQ_EXACT_NOGAIN;
  }
  if (!req->dev_frame && direct) {
    /* GPUDirect RDMA: the NIC reads NCCL's buffer; the staging taken above goes back. */
    agoq_dev_stage_put(comm, &id, &piece);
    agoq_send_exact(comm, req, data, size, why);
    req->xfer.flags |= AGOQ_XFER_DEVICE;
    req->xfer.reg[0] = ((const agoq_mr*)mhandle)->tp_key;
    return agoq_dev_post_ready(comm, req);
  }
  if (req->dev_frame) {
    /* The GPU reads NCCL's buffer and writes the frame into the pinned staging: only the
     * frame crosses PCIe. cap <= size: a frame no smaller than the payload is refused on
     * the device (ESPACE), and the payload is copied instead (agoq_dev_frame_done). */
    AGOQ_CHECK_GOTO(agoq_gpu_frame_encode(comm->gpu, req->pool_index, 0, &p, data, n, host, cap), res, fail);
  } else if (bounce) {
    req->dev_why = (int)why;
    AGOQ_CHECK_GOTO(agoq_dev_bounce_alloc(comm, req, 0, size), res, fail);
    req->piece_host = host;
    req->piece_cap = piece_cap;
    req->piece_buf = 0;
    req->piece_len = piece_cap;
    AGOQ_CHECK_GOTO(agoq_gpu_copy_d2h(comm->gpu, host, data, piece_cap), res, fail);
  } else {
    req->dev_why = (int)why;
    AGOQ_CHECK_GOTO(agoq_gpu_copy_d2h(comm->gpu, host, data, size), res, fail);
  }
  AGOQ_CHECK_GOTO(agoq_gpu_mark(comm->gpu, req->pool_index), res, fail);
  req->ring_id = id;
  req->pool_piece = piece;
  req->dev_mask = 1;
  req->host[0] = host;
  req->phase = AGOQ_DEV_COPY_IN;
  comm->dev_fifo[(comm->dev_first + comm->dev_count) % AGOQ_REQUESTS_PER_COMM] = req->pool_index;
  comm->dev_count++;
  return ncclSuccess;
fail:
  agoq_dev_bounce_free(comm, req);
  agoq_dev_stage_put(comm, &id, &piece);
  return res;
}

/* The GPU's frame is in the staging: seal it as the CPU codec would have (the payload CRC,
 * so the frame on the wire is the host path's, byte for byte) and fill the transfer; or,
 * when the frame would not have been smaller than the payload, queue the payload's copy
 * instead (*requeued: wait for that). */
static ncclResult_t agoq_dev_frame_done(agoq_comm* comm, agoq_request* req, bool* requeued) {
  uint32_t status = 0;
  uint64_t body_len = 0;
  size_t size = req->posted[0];
  *requeued = false;
  agoq_gpu_codec_result(comm->gpu, req->pool_index, 0, &status, &body_len);
  size_t len = AGOQ_FRAME_HEADER_SIZE + (size_t)body_len;
  if (status == AGOQ_CODEC_ESPACE || (status == AGOQ_CODEC_OK && len >= size)) {
    /* Too many blocks stored raw to gain: exact, like the host path. */
    comm->typed_stats.not_eligible++;
    req->dev_frame = false;
    req->dev_why = (int)AGOQ_EXACT_NOGAIN;
    AGOQ_CHECK(agoq_gpu_copy_d2h(comm->gpu, req->host[0], req->data[0], size));
    AGOQ_CHECK(agoq_gpu_mark(comm->gpu, req->pool_index));
    *requeued = true;
    return ncclSuccess;
  }
  if (status != AGOQ_CODEC_OK) {
    AGOQ_WARN("send to %s: the GPU frame encode failed: %s", agoq_comm_peer(comm),
              agoq_codec_status_str((agoq_codec_status)status));
    return ncclInternalError;
  }
  uint64_t crc0 = agoq_frame_crc_ns();
  agoq_codec_status s = agoq_frame_seal_payload_crc(req->host[0], len);
  if (s != AGOQ_CODEC_OK) {
    AGOQ_WARN("send to %s: the GPU's frame could not be sealed: %s", agoq_comm_peer(comm), agoq_codec_status_str(s));
    return ncclInternalError;
  }
  agoq_gpu_note_encoded(comm->gpu, len);
  agoq_typed_count_frame(&comm->typed_stats, size, len);
  agoq_send_frame(comm, req, req->host[0], len, size, 0, agoq_frame_crc_ns() - crc0);
  return ncclSuccess;
}

/* The request's event, and the GPU time of the codec calls seen complete meanwhile. */
static ncclResult_t agoq_dev_poll(agoq_comm* comm, const agoq_request* req, bool* done) {
  ncclResult_t res = agoq_gpu_poll(comm->gpu, req->pool_index, done);
  uint64_t gpu_ns = agoq_gpu_codec_ns_take(comm->gpu);
  if (comm->st != NULL && gpu_ns > 0) agoq_stats_add(&comm->st->path[AGOQ_STATS_QUANT].gpu_ns, gpu_ns);
  return res;
}

ncclResult_t agoq_dev_advance(agoq_comm* comm) {
  while (comm->dev_count > 0) {
    agoq_request* req = agoq_request_at(&comm->pool, comm->dev_fifo[comm->dev_first]);
    if (!req->ready) {
      bool done = false;
      AGOQ_CHECK(agoq_dev_poll(comm, req, &done));
      if (!done) return ncclSuccess; /* the later ones are behind it on the stream */
      if (req->dev_frame) {
        bool requeued = false;
        AGOQ_CHECK(agoq_dev_frame_done(comm, req, &requeued));
        if (requeued) return ncclSuccess;
      } else if (req->bounce_mask != 0) {
        bool more = false;
        AGOQ_CHECK(agoq_dev_send_piece_done(comm, req, &more));
        if (more) return ncclSuccess;
        agoq_send_exact(comm, req, req->bounce[0], req->posted[0], (agoq_exact_reason)req->dev_why);
      } else {
        agoq_send_exact(comm, req, req->host[0], req->posted[0], (agoq_exact_reason)req->dev_why);
      }
      /* Across PCIe: the frame the GPU wrote, or the payload's copy. */
      agoq_stats_device(comm->st, req->dev_frame ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT, req->xfer.size[0], 0);
      /* Frame or copy, it lies in the pinned staging, or whole in the bounce buffer. */
      req->xfer.reg[0] = req->bounce_mask != 0 ? req->bounce_key[0] : agoq_dev_stage_key(comm, &req->pool_piece);
    }
    comm->dev_first = (comm->dev_first + 1) % AGOQ_REQUESTS_PER_COMM;
    comm->dev_count--;
    /* A failed post leaves it out of the transport (COPY_IN): its test reports the
     * connection's error, never a completion. */
    AGOQ_CHECK(agoq_net_tp->post_send(comm->tp, &req->xfer));
    req->phase = AGOQ_DEV_WIRE;
  }
  return ncclSuccess;
}

ncclResult_t agoq_dev_recv_start(agoq_comm* comm, agoq_request* req, bool* again) {
  *again = false;
  if (comm->gpu == NULL) {
    AGOQ_WARN("irecv: device buffer on a connection without registered device memory");
    return ncclInternalError;
  }
  /* One allocation for all device buffers of a grouped receive, each on the ring's
   * alignment. A second layout bounces every staged buffer, when neither the share nor the
   * pool has room for the first and the share cannot hold it (agoq_dev_send_start). */
  agoq_gpu_ring* ring = agoq_gpu_link_ring(comm->gpu);
  size_t most = agoq_dev_stage_max(comm);
  size_t off[AGOQ_NET_MAX_RECVS] = {0}, total = 0, piece_off = 0, piece_cap = 0;
  uint8_t staged = 0, bounced = 0;
  uint8_t* base = NULL;
  int id = -1;
  agoq_gpu_pool_piece piece = {.chunk = -1};
  /* Layouts in turn: as posted; every staged buffer bounced, pieces out of the larger of
   * share and pool chunk; the same with pieces out of the share. */
  for (int layout = 0; layout < 3; layout++) {
    bool bounce_all = layout >= 1;
    size_t area = layout < 2 ? most : ring->size;
    staged = bounced = 0;
    total = 0;
    for (int i = 0; i < req->n_bufs; i++) {
      if (!(req->dev_mask & (1u << i))) continue;
      if (req->posted[i] > most || bounce_all) {
        /* A GPUDirect buffer too large for the staging takes none now (agoq_dev_recv_late);
         * a staged one comes through a bounce buffer. */
        if (req->direct_ok & (1u << i)) continue;
        bounced |= (uint8_t)(1u << i);
        continue;
      }
      staged |= (uint8_t)(1u << i);
      off[i] = total;
      total += agoq_gpu_ring_align(req->posted[i]);
    }
    if (staged == 0 && bounced == 0) return ncclSuccess;
    piece_off = total;
    piece_cap = 0;
    if (bounced != 0) {
      if (comm->bounce_reqs > 0) {
        *again = true;
        return ncclSuccess;
      }
      piece_cap = agoq_dev_piece_cap(area, total);
      if (piece_cap == 0) {
        AGOQ_WARN("receive from %s: a grouped receive of device buffers larger than the staging "
                  "(AGOQ_GPU_STAGING=%lld) leaves it no room for their pieces: raise it",
                  agoq_comm_peer(comm), (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING));
        return ncclInvalidUsage;
      }
      total += piece_cap;
    }
    AGOQ_CHECK(agoq_dev_fits(comm, total));
    if (agoq_dev_stage_get(comm, total, &base, &id, &piece)) break;
    /* Nothing free now: one the share can hold waits for it (this connection's own
     * requests give it back); else the next layout, over TCP, rather than wait for the
     * pool, which other connections hold. */
    if (layout == 2 || agoq_gpu_ring_fits(ring, total)) {
      *again = true;
      return ncclSuccess;
    }
  }
  req->ring_id = id;
  req->pool_piece = piece;
  for (int i = 0; i < req->n_bufs; i++)
    if (staged & (1u << i)) req->host[i] = base + off[i];
  if (bounced == 0) return ncclSuccess;
  req->piece_host = base + piece_off;
  req->piece_cap = piece_cap;
  for (int i = 0; i < req->n_bufs; i++) {
    if (!(bounced & (1u << i))) continue;
    ncclResult_t res = agoq_dev_bounce_alloc(comm, req, i, req->posted[i]);
    if (res != ncclSuccess) {
      agoq_dev_release(comm, req);
      return res;
    }
    req->host[i] = req->bounce[i];
  }
  return ncclSuccess;
}

ncclResult_t agoq_dev_recv_frame_place(agoq_comm* comm, agoq_request* req, int slot, size_t size) {
  if (!(req->bounce_mask & (1u << slot))) return agoq_dev_recv_late(comm, req, slot, size);
  /* The GPU decodes from pinned memory: a frame for a bounced buffer goes into the piece
   * area, free until the exact buffers' pieces start (after the decodes). */
  if (req->piece_frame || size > req->piece_cap) {
    AGOQ_WARN("receive from %s: a %zu-byte frame for GPU buffer %p (posted %zu bytes) %s: set AGOQ_GPU_STAGING "
              "and AGOQ_P2P_FORMAT alike on every rank (a connection that may receive frames keeps a whole staging)",
              agoq_comm_peer(comm), size, (void*)req->data[slot], req->posted[slot],
              req->piece_frame ? "finds the staging taken by another frame" : "exceeds the staging left for it");
    return ncclInvalidUsage;
  }
  req->piece_frame = true;
  req->bounce_mask &= (uint8_t)~(1u << slot);
  req->host[slot] = req->piece_host;
  return ncclSuccess;
}

void* agoq_dev_recv_key(const agoq_comm* comm, const agoq_request* req, int slot) {
  if (req->bounce_mask & (1u << slot)) return req->bounce_key[slot];
  return agoq_dev_stage_key(comm, req->late_piece[slot].chunk >= 0 ? &req->late_piece[slot] : &req->pool_piece);
}

ncclResult_t agoq_dev_recv_late(agoq_comm* comm, agoq_request* req, int slot, size_t size) {
  if (req->host[slot] != NULL) return ncclSuccess;
  uint8_t* p = NULL;
  int id = -1;
  agoq_gpu_pool_piece piece = {.chunk = -1};
  if (!agoq_dev_stage_get(comm, size, &p, &id, &piece)) {
    /* The message is already arriving: it cannot wait for the staging to drain. A sender
     * with a larger AGOQ_GPU_STAGING sends frames this receiver's staging cannot hold. */
    AGOQ_WARN("receive from %s: a %zu-byte message for GPU buffer %p (posted %zu bytes, GPUDirect) came as a "
              "frame or CPU copy, and the staging (AGOQ_GPU_STAGING=%lld) %s: set AGOQ_GPU_STAGING alike on every rank",
              agoq_comm_peer(comm), size, (void*)req->data[slot], req->posted[slot],
              (long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING),
              size <= agoq_dev_stage_max(comm) ? "is full" : "cannot hold it");
    return ncclInvalidUsage;
  }
  req->late_ring[slot] = id;
  req->late_piece[slot] = piece;
  req->host[slot] = p;
  return ncclSuccess;
}

/* Buffer i's message is a frame in the staging: validated on the host (header and payload
 * CRC, its size against the posted buffer), decoded by the GPU from the staging straight
 * into NCCL's buffer. */
static ncclResult_t agoq_dev_frame_decode(agoq_comm* comm, agoq_request* req, int i) {
  agoq_frame_info info;
  const void* body = NULL;
  size_t len = req->xfer.size[i];
  agoq_codec_status s = agoq_frame_parse(req->host[i], len, &info, &body);
  /* As on the host path (agoq_typed_decode): a p2p frame without its payload CRC is refused. */
  if (s == AGOQ_CODEC_OK && !agoq_frame_has_payload_crc(req->host[i], len)) s = AGOQ_CODEC_ECORRUPT;
  if (s != AGOQ_CODEC_OK) {
    AGOQ_WARN("p2p frame from %s rejected: %s (%zu bytes); no data delivered", agoq_comm_peer(comm),
              agoq_codec_status_str(s), len);
    return ncclSystemError;
  }
  size_t esize = agoq_dtype_size(info.params.dtype);
  if (info.count > req->posted[i] / esize || AGOQ_FRAME_HEADER_SIZE + info.payload_len != len) {
    AGOQ_WARN("p2p frame from %s decodes to %llu %s elements (frame %zu bytes), receive posted for %zu bytes",
              agoq_comm_peer(comm), (unsigned long long)info.count, agoq_dtype_name(info.params.dtype), len,
              req->posted[i]);
    return ncclInvalidUsage;
  }
  AGOQ_CHECK(agoq_gpu_dequantize(comm->gpu, req->pool_index, i, &info.params, body, info.payload_len, info.count,
                                 info.params.dtype, req->data[i]));
  req->actual[i] = info.count * esize;
  agoq_typed_count_frame(&comm->typed_stats, req->actual[i], len);
  req->quantized = true;
  if (comm->st != NULL) {
    agoq_stats_count(comm->st, AGOQ_STATS_QUANT, req->actual[i]);
    agoq_stats_wire(comm->st, AGOQ_STATS_QUANT, req->actual[i], len);
    /* The GPU reads the body across PCIe; the header stays on the host. */
    agoq_stats_device(comm->st, AGOQ_STATS_QUANT, 0, info.payload_len);
  }
  return ncclSuccess;
}

ncclResult_t agoq_dev_recv_copy_out(agoq_comm* comm, agoq_request* req, bool* queued) {
  *queued = false;
  for (int i = 0; i < req->n_bufs; i++) {
    if (!(req->dev_mask & (1u << i)) || (req->direct_mask & (1u << i))) continue;
    if (req->frame_mask & (1u << i)) {
      AGOQ_CHECK(agoq_dev_frame_decode(comm, req, i));
    } else if (req->bounce_mask & (1u << i)) {
      continue; /* in pieces, below */
    } else if (req->polled) {
      /* LL/LL128: NCCL's kernel reads a line once its flag is there. */
      AGOQ_CHECK(agoq_gpu_copy_h2d_flags_last(comm->gpu, req->data[i], req->host[i], req->actual[i]));
      agoq_stats_device(comm->st, AGOQ_STATS_EXACT, 0, req->actual[i]);
    } else {
      AGOQ_CHECK(agoq_gpu_copy_h2d(comm->gpu, req->data[i], req->host[i], req->actual[i]));
      agoq_stats_device(comm->st, AGOQ_STATS_EXACT, 0, req->actual[i]);
    }
    *queued = true;
  }
  /* The first piece of the bounced buffers now, unless a frame's decode reads the piece
   * area (then after it: agoq_dev_copied). */
  if (req->bounce_mask != 0 && !req->piece_frame) {
    bool piece = false;
    AGOQ_CHECK(agoq_dev_recv_piece_next(comm, req, &piece));
    *queued = *queued || piece;
  }
  if (!*queued) return ncclSuccess; /* everything came by GPUDirect RDMA: in place already */
  AGOQ_CHECK(agoq_gpu_mark(comm->gpu, req->pool_index));
  req->phase = AGOQ_DEV_COPY_OUT;
  return ncclSuccess;
}

ncclResult_t agoq_dev_copied(agoq_comm* comm, agoq_request* req, bool* done) {
  AGOQ_CHECK(agoq_dev_poll(comm, req, done));
  if (!*done) return ncclSuccess;
  /* A body the device found inconsistent left NCCL's buffer untouched: an error, never
   * wrong data. */
  for (int i = 0; i < req->n_bufs; i++) {
    if (!(req->frame_mask & (1u << i))) continue;
    uint32_t status = 0;
    agoq_gpu_codec_result(comm->gpu, req->pool_index, i, &status, NULL);
    if (status != AGOQ_CODEC_OK) {
      AGOQ_WARN("p2p frame from %s could not be decoded on the GPU: %s", agoq_comm_peer(comm),
                agoq_codec_status_str((agoq_codec_status)status));
      *done = false;
      return ncclSystemError;
    }
  }
  if (req->bounce_mask != 0) {
    /* The pieces of bounced buffers: one behind the other through the piece area. */
    bool queued = false;
    AGOQ_CHECK(agoq_dev_recv_piece_next(comm, req, &queued));
    if (queued) {
      AGOQ_CHECK(agoq_gpu_mark(comm->gpu, req->pool_index));
      *done = false;
    }
  }
  return ncclSuccess;
}

void agoq_dev_release(agoq_comm* comm, agoq_request* req) {
  if (comm->gpu != NULL) {
    agoq_dev_stage_put(comm, &req->ring_id, &req->pool_piece);
    for (int i = 0; i < AGOQ_NET_MAX_RECVS; i++) agoq_dev_stage_put(comm, &req->late_ring[i], &req->late_piece[i]);
  }
  req->ring_id = -1;
  req->pool_piece.chunk = -1;
  for (int i = 0; i < AGOQ_NET_MAX_RECVS; i++) {
    req->late_ring[i] = -1;
    req->late_piece[i].chunk = -1;
  }
  agoq_dev_bounce_free(comm, req);
}

void agoq_dev_log(agoq_comm* comm) {
  if (comm->gpu == NULL) return;
  const agoq_gpu_link_stats* st = agoq_gpu_link_stats_get(comm->gpu);
  AGOQ_INFO(NCCL_NET, "%s %s: device path copied %llu bytes D2H in %llu copies, %llu bytes H2D in %llu copies; %llu "
            "bounce buffers registered for their message",
            comm->is_send ? "send to" : "receive from", agoq_comm_peer(comm), (unsigned long long)st->d2h_bytes,
            (unsigned long long)st->d2h_copies, (unsigned long long)st->h2d_bytes,
            (unsigned long long)st->h2d_copies, (unsigned long long)comm->bounce_regs);
  if (agoq_gpu_link_pool(comm->gpu) != NULL) {
    agoq_gpu_pool_stats ps;
    agoq_gpu_pool_stats_get(agoq_gpu_link_device(comm->gpu), &ps);
    AGOQ_INFO(NCCL_NET, "GPU %d's pinned pool: %llu bytes pinned for %u connections (%u chunks and their own shares), "
              "%llu pieces borrowed, %llu times none free (through a share instead)",
              agoq_gpu_link_device(comm->gpu), (unsigned long long)ps.pinned_bytes, ps.links, ps.chunks,
              (unsigned long long)ps.borrows, (unsigned long long)ps.refusals);
  }
}

void agoq_dev_close(agoq_comm* comm) {
  /* Requests NCCL never saw complete (an abort): their bounce buffers, now that the
   * transport no longer touches them. */
  for (uint32_t i = 0; i < comm->pool.capacity; i++) {
    agoq_request* req = agoq_request_at(&comm->pool, i);
    if (req != NULL && req->magic == AGOQ_REQUEST_MAGIC && req->bounce_held) agoq_dev_bounce_free(comm, req);
  }
  /* And their pieces of the GPU's pool, which other connections borrow next: once this
   * link's queued copies are done with them. */
  if (comm->gpu != NULL && agoq_gpu_link_pool(comm->gpu) != NULL) {
    agoq_gpu_link_quiesce(comm->gpu);
    for (uint32_t i = 0; i < comm->pool.capacity; i++) {
      agoq_request* req = agoq_request_at(&comm->pool, i);
      if (req != NULL && req->magic == AGOQ_REQUEST_MAGIC) agoq_dev_release(comm, req);
    }
  }
  if (comm->gpu_key != NULL) agoq_net_tp->dereg(comm->gpu_key);
  comm->gpu_key = NULL;
  agoq_gpu_link_destroy(comm->gpu);
  comm->gpu = NULL;
  free(comm->dev_fifo);
  comm->dev_fifo = NULL;
}
