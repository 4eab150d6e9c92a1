/*
 * Scenarios on a healthy connection: properties, message sizes, requests in flight,
 * grouped receives, in-order matching, many connections on one listen comm.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_harness.h"
#include "abi_scenarios.h"
#include "core/agoq_log.h"

#define ABI_CANARY 0x5C

/* The first byte of [p, p+n) that is not v, or SIZE_MAX. */
static size_t abi_find_not(const uint8_t* p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return i;
  return SIZE_MAX;
}

/* A received message: `actual` bytes reported, the pattern in them, the rest of the posted
 * area untouched, guards intact. */
int abi_check_received(abi_worker* w, const abi_buf* b, size_t posted, size_t expect,
                       int reported, uint64_t seed, const char* what) {
  char guard[160];
  ABI_REQUIRE(w, reported >= 0 && (size_t)reported == expect,
              "%s: test() reported %d bytes, sender sent %zu", what, reported, expect);
  size_t bad = abi_pattern_check(b->data, expect, seed);
  ABI_REQUIRE(w, bad == SIZE_MAX, "%s: wrong byte at offset %zu of %zu", what, bad, expect);
  bad = abi_find_not(b->data + expect, posted - expect, ABI_CANARY);
  ABI_REQUIRE(w, bad == SIZE_MAX, "%s: byte %zu past the received %zu bytes was written", what,
              expect + bad, expect);
  ABI_REQUIRE(w, abi_buf_guard_check(b, guard, sizeof(guard)) == 0, "%s: %s", what, guard);
  return 0;
fail:
  return -1;
}

/* ---- props: init/devices/getProperties, single process ---- */

int abi_sc_props(abi_worker* w) {
  for (int dev = 0; dev < w->ndev; dev++) {
    agoq_view_props p;
    memset(&p, 0, sizeof(p));
    ABI_NCCL_OK(w, agoq_view_get_properties(&w->view, dev, &p));
    ABI_REQUIRE(w, p.name[0] != '\0', "dev %d: empty name", dev);
    ABI_REQUIRE(w, (p.ptr_support & NCCL_PTR_HOST) != 0, "dev %d: ptrSupport 0x%x lacks HOST",
                dev, p.ptr_support);
    /* DMA-BUF exactly where the run expects it (AGOQ_ABI_EXPECT_DMABUF=1: a verbs device that
     * registers dma-bufs, with the GPU path behind it; the data scenarios then register
     * device buffers by DMA-BUF, abi_reg); never on TCP, nor without a GPU. */
    const char* expect = getenv("AGOQ_ABI_EXPECT_DMABUF");
    bool want = expect != NULL && strcmp(expect, "1") == 0;
    ABI_REQUIRE(w, want == ((p.ptr_support & NCCL_PTR_DMABUF) != 0), "dev %d: ptrSupport 0x%x %s DMA-BUF", dev,
                p.ptr_support, want ? "lacks" : "claims");
    if (abi_device_mode()) {
      /* With a device, device buffers are advertised, and p2p messages and CollNet calls
       * of any size NCCL sends (1 GiB, NCCL_MAX_NET_SIZE) are taken on every transport: by
       * GPUDirect RDMA, staged, or in pieces through a bounce buffer (over verbs registered
       * for its message). */
      ABI_REQUIRE(w, (p.ptr_support & NCCL_PTR_CUDA) != 0, "dev %d: ptrSupport 0x%x lacks CUDA with a device",
                  dev, p.ptr_support);
      if (w->view.version >= 9) {
        ABI_REQUIRE(w, p.max_p2p_bytes >= ((size_t)1 << 30), "dev %d: maxP2pBytes %zu (NCCL sends 1 GiB)", dev,
                    (size_t)p.max_p2p_bytes);
        ABI_REQUIRE(w, p.max_coll_bytes > abi_device_max_coll(), "dev %d: maxCollBytes %zu (beyond the staging %zu)",
                    dev, (size_t)p.max_coll_bytes, abi_device_max_coll());
      }
    }
    ABI_REQUIRE(w, p.max_recvs >= 1, "dev %d: maxRecvs %d", dev, p.max_recvs);
    ABI_REQUIRE(w, p.speed > 0, "dev %d: speed %d Mbps", dev, p.speed);
    ABI_REQUIRE(w, p.max_comms > 0, "dev %d: maxComms %d", dev, p.max_comms);
    if (w->view.version >= 9) {
      /* NCCL fails setup outside (0, 1 TiB]. */
      ABI_REQUIRE(w, p.max_p2p_bytes > 0 && p.max_p2p_bytes <= (1ull << 40),
                  "dev %d: maxP2pBytes %zu outside (0, 1 TiB]", dev, (size_t)p.max_p2p_bytes);
    }
  }

  /* v11 inits once per communicator and finalizes each, including after a failed init
   * (ctx NULL). Older versions init once per process, but NCCL of different ages and
   * several comms may call it again: it must stay idempotent. */
  void* ctx2 = NULL;
  ABI_NCCL_OK(w, agoq_view_init(&w->view, &ctx2, w->comm_id ^ 0x5a5a5a5aull, agoq_log_stderr));
  if (w->view.version >= 11) {
    ABI_REQUIRE(w, ctx2 != NULL && ctx2 != w->ctx,
                "second init returned ctx %p (first %p): one ctx per communicator expected",
                ctx2, w->ctx);
    ABI_NCCL_OK(w, agoq_view_finalize(&w->view, ctx2));
    ABI_NCCL_OK(w, agoq_view_finalize(&w->view, NULL));
  }
  int ndev2 = 0;
  ABI_NCCL_OK(w, agoq_view_devices(&w->view, &ndev2));
  ABI_REQUIRE(w, ndev2 == w->ndev, "devices() changed from %d to %d after a second init",
              w->ndev, ndev2);
  return 0;
fail:
  return -1;
}

/* ---- sizes: 0 B .. 1 GiB, posted exact and larger ---- */

typedef struct {
  size_t size;
  size_t posted;
} abi_size_case;

static size_t abi_size_cases(const abi_worker* w, abi_size_case* c, size_t cap) {
  static const size_t sizes[] = {0, 1, 4097, 1000003, 1u << 20, 64u << 20};
  size_t n = 0;
  /* Device buffers: no size is bounded by the staging (GPUDirect RDMA, or staged in pieces
   * through a bounce buffer); 1 GiB is left out (the emulated device memory is the
   * machine's). */
  size_t most = abi_device_max_message();
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && n + 2 <= cap; i++) {
    size_t larger = sizes[i] + 1013 + sizes[i] / 8;
    if (larger > most) continue;
    c[n++] = (abi_size_case){sizes[i], sizes[i]};
    /* Receive sizes are upper bounds: test() must report what arrived. */
    c[n++] = (abi_size_case){sizes[i], larger};
  }
  /* 1 GiB: once, in the newest version. Not under TSan (ABI_NO_GIANT_MESSAGE): the threads
   * that move it are those of 64 MiB, and it took 48 s of a 100 s TSan test there. */
#ifndef ABI_NO_GIANT_MESSAGE
  if (w->newest && n < cap && (1u << 30) <= most) c[n++] = (abi_size_case){1u << 30, 1u << 30};
#endif
  /* Device buffers far beyond the staging (abi_device_max_message). */
  if (abi_device_mode() && most >= (256u << 20) && most < (1u << 30) && n < cap)
    c[n++] = (abi_size_case){256u << 20, 256u << 20};
  return n;
}

/* NCCL's iflush after a receive into device memory (SIMPLE with GPUDirect, where the GPU
 * needs it or NCCL_NET_FORCE_FLUSH=1): it succeeds and leaves nothing to wait for. A
 * receive the NIC wrote straight into device memory (DMA-BUF registered) asks the GPU to
 * flush those writes; a staged one was copied in by the GPU itself and asks nothing. */
static int abi_flush_check(abi_worker* w, void* comm, void* host, int size, void* mh, const char* what) {
  long before = abi_device_rdma_flushes();
  void* data[1] = {abi_device_ptr(host)};
  int sizes[1] = {size};
  void* mhs[1] = {mh};
  void* req = (void*)1;
  ABI_NCCL_OK(w, agoq_view_iflush(&w->view, comm, 1, data, sizes, mhs, &req));
  ABI_REQUIRE(w, req == NULL, "%s: iflush left a request to wait for", what);
  const char* expect = getenv("AGOQ_ABI_EXPECT_DMABUF");
  long want = expect != NULL && strcmp(expect, "1") == 0 ? 1 : 0;
  ABI_REQUIRE(w, abi_device_rdma_flushes() - before == want, "%s: iflush asked the GPU for %ld RDMA flushes, not %ld",
              what, abi_device_rdma_flushes() - before, want);
  return 0;
fail:
  return -1;
}

int abi_sc_sizes(abi_worker* w) {
  abi_size_case cases[16];
  size_t ncases = abi_size_cases(w, cases, 16);
  size_t cap = 0;
  for (size_t i = 0; i < ncases; i++) cap = cases[i].posted > cap ? cases[i].posted : cap;
  abi_buf b = {0};
  void* comm = NULL;
  void* mh = NULL;
  ABI_REQUIRE(w, abi_buf_alloc(&b, cap) == 0, "cannot allocate %zu bytes", cap);
  if (abi_pair_connect(w, &comm) != 0) goto fail;
  if (abi_reg(w, comm, b.data, cap, &mh) != 0) goto fail;

  for (size_t i = 0; i < ncases; i++) {
    char what[96];
    snprintf(what, sizeof(what), "message %zu (%zu B into %zu B)", i, cases[i].size,
             cases[i].posted);
    uint64_t seed = 1000 + i;
    void* req = NULL;
    if (w->role == 0) {
      memset(b.data, ABI_CANARY, cases[i].posted);
      void* data[1] = {b.data};
      size_t sizes[1] = {cases[i].posted};
      int tags[1] = {1};
      void* mhs[1] = {mh};
      int got[ABI_MAX_RECVS] = {-1};
      if (abi_irecv(w, comm, 1, data, sizes, tags, mhs, &req, 10000) != 0) goto fail;
      if (abi_wait(w, req, got, 60000) != 0) goto fail;
      if (abi_check_received(w, &b, cases[i].posted, cases[i].size, got[0], seed, what) != 0)
        goto fail;
      if (abi_device_mode() && got[0] > 0 && abi_flush_check(w, comm, b.data, got[0], mh, what) != 0) goto fail;
    } else {
      abi_pattern_fill(b.data, cases[i].size, seed);
      int got[1] = {-1};
      if (abi_isend(w, comm, b.data, cases[i].size, 1, mh, &req, 10000) != 0) goto fail;
      if (abi_wait(w, req, got, 60000) != 0) goto fail;
    }
  }
  /* NCCL closes only once both ends are finished; a sender closing early could reset the
   * connection under data the receiver has not read yet. */
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 30000) != 0) goto fail;
fail:
  abi_dereg(w, comm, mh);
  if (w->role == 0)
    abi_close_recv(w, &comm);
  else
    abi_close_send(w, &comm);
  abi_buf_free(&b);
  return w->failed ? -1 : 0;
}

/* ---- inflight: 32 requests posted at once, each way ---- */

static size_t abi_inflight_size(int i) {
  return i == 0 ? 0 : ((size_t)i * 70001u) % (1u << 20) + (size_t)i;
}

int abi_sc_inflight(abi_worker* w) {
  enum { N = ABI_MAX_REQUESTS };
  abi_buf rb[N], sb[N];
  void* rmh[N] = {0};
  void* smh[N] = {0};
  void* scomm = NULL;
  void* rcomm = NULL;
  abi_reqlist sends = {.count = N}, recvs = {.count = N};
  memset(rb, 0, sizeof(rb));
  memset(sb, 0, sizeof(sb));
  for (int i = 0; i < N; i++) {
    ABI_REQUIRE(w, abi_buf_alloc(&rb[i], abi_inflight_size(i) + 512) == 0 &&
                       abi_buf_alloc(&sb[i], abi_inflight_size(i)) == 0,
                "out of memory");
    memset(rb[i].data, ABI_CANARY, rb[i].size);
    abi_pattern_fill(sb[i].data, sb[i].size, ((uint64_t)w->role << 16) | (uint64_t)i);
  }
  if (abi_pair_connect_both(w, &scomm, &rcomm) != 0) goto fail;
  for (int i = 0; i < N; i++) {
    if (abi_reg(w, rcomm, rb[i].data, rb[i].size, &rmh[i]) != 0) goto fail;
    if (abi_reg(w, scomm, sb[i].data, sb[i].size, &smh[i]) != 0) goto fail;
  }
  /* NCCL counts on NCCL_NET_MAX_REQUESTS (32) of each being accepted at once: no retry. */
  for (int i = 0; i < N; i++) {
    void* data[1] = {rb[i].data};
    size_t sizes[1] = {rb[i].size};
    int tags[1] = {1 - w->role};
    void* mhs[1] = {rmh[i]};
    ABI_NCCL_OK(w, abi_net_irecv(w, rcomm, 1, data, sizes, tags, mhs, &recvs.req[i]));
    ABI_REQUIRE(w, recvs.req[i] != NULL, "irecv %d of %d in flight returned a NULL request", i,
                N);
  }
  for (int i = 0; i < N; i++) {
    ABI_NCCL_OK(w, abi_net_isend(w, scomm, sb[i].data, sb[i].size, w->role, smh[i],
                                   &sends.req[i]));
    ABI_REQUIRE(w, sends.req[i] != NULL, "isend %d of %d in flight returned a NULL request", i,
                N);
  }
  if (abi_wait_lists(w, &recvs, &sends, 60000) != 0) goto fail;
  for (int i = 0; i < N; i++) {
    char what[64];
    snprintf(what, sizeof(what), "in-flight receive %d", i);
    if (abi_check_received(w, &rb[i], rb[i].size, abi_inflight_size(i), recvs.sizes[i][0],
                           ((uint64_t)(1 - w->role) << 16) | (uint64_t)i, what) != 0)
      goto fail;
  }
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 30000) != 0) goto fail;
fail:
  for (int i = 0; i < N; i++) {
    abi_dereg(w, rcomm, rmh[i]);
    abi_dereg(w, scomm, smh[i]);
  }
  abi_close_send(w, &scomm);
  abi_close_recv(w, &rcomm);
  for (int i = 0; i < N; i++) {
    abi_buf_free(&rb[i]);
    abi_buf_free(&sb[i]);
  }
  return w->failed ? -1 : 0;
}

/* ---- grouped: n-buffer receives matched by tag, two groups back to back ---- */

#define ABI_GROUPS 2
#define ABI_GROUP_POSTED (600u << 10)

static size_t abi_group_size(int g, int k) {
  if (k == 2) return 0;                     /* empty messages happen inside groups too */
  if (k == 5) return 300000 + (size_t)g;    /* large enough for the data sockets */
  return 1000u * (size_t)k + 17u * (size_t)g + 1u;
}

static uint64_t abi_group_seed(int g, int k) {
  return 0x6000u + ((uint64_t)g << 8) + (uint64_t)k;
}

static int abi_group_width(abi_worker* w, int* n) {
  agoq_view_props p;
  memset(&p, 0, sizeof(p));
  ABI_NCCL_OK(w, agoq_view_get_properties(&w->view, w->dev, &p));
  *n = p.max_recvs < ABI_MAX_RECVS ? p.max_recvs : ABI_MAX_RECVS;
  return 0;
fail:
  return -1;
}

int abi_sc_grouped(abi_worker* w) {
  int n = 0;
  abi_buf b[ABI_GROUPS][ABI_MAX_RECVS];
  void* mh[ABI_GROUPS][ABI_MAX_RECVS];
  void* comm = NULL;
  memset(b, 0, sizeof(b));
  memset(mh, 0, sizeof(mh));
  if (abi_group_width(w, &n) != 0) goto fail;
  if (w->role == 0 && n < ABI_MAX_RECVS)
    fprintf(stderr, "abi[v%d grouped] note: maxRecvs is %d, groups have %d buffers\n",
            w->view.version, n, n);
  for (int g = 0; g < ABI_GROUPS; g++) {
    for (int k = 0; k < n; k++) {
      size_t sz = w->role == 0 ? ABI_GROUP_POSTED : abi_group_size(g, k);
      ABI_REQUIRE(w, abi_buf_alloc(&b[g][k], sz) == 0, "out of memory");
      if (w->role == 0)
        memset(b[g][k].data, ABI_CANARY, sz);
      else
        abi_pattern_fill(b[g][k].data, sz, abi_group_seed(g, k));
    }
  }
  if (abi_pair_connect(w, &comm) != 0) goto fail;
  for (int g = 0; g < ABI_GROUPS; g++)
    for (int k = 0; k < n; k++)
      if (abi_reg(w, comm, b[g][k].data, b[g][k].size, &mh[g][k]) != 0) goto fail;

  abi_reqlist reqs = {.count = 0};
  if (w->role == 0) {
    for (int g = 0; g < ABI_GROUPS; g++) {
      void* data[ABI_MAX_RECVS];
      size_t sizes[ABI_MAX_RECVS];
      int tags[ABI_MAX_RECVS];
      for (int k = 0; k < n; k++) {
        data[k] = b[g][k].data;
        sizes[k] = b[g][k].size;
        tags[k] = 100 + k;
      }
      if (abi_irecv(w, comm, n, data, sizes, tags, mh[g], &reqs.req[reqs.count++], 10000) != 0)
        goto fail;
    }
    if (abi_wait_lists(w, &reqs, NULL, 30000) != 0) goto fail;
    for (int g = 0; g < ABI_GROUPS; g++) {
      for (int k = 0; k < n; k++) {
        char what[64];
        snprintf(what, sizeof(what), "group %d buffer %d (tag %d)", g, k, 100 + k);
        if (abi_check_received(w, &b[g][k], b[g][k].size, abi_group_size(g, k),
                               reqs.sizes[g][k], abi_group_seed(g, k), what) != 0)
          goto fail;
      }
    }
  } else {
    /* Each group's messages leave in a shuffled tag order: only the tag says where each
     * one belongs. */
    uint64_t rnd = 0x243F6A8885A308D3ull;
    for (int g = 0; g < ABI_GROUPS; g++) {
      int order[ABI_MAX_RECVS];
      for (int k = 0; k < n; k++) order[k] = k;
      for (int k = n - 1; k > 0; k--) {
        rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
        int j = (int)(rnd % (uint64_t)(k + 1));
        int t = order[k];
        order[k] = order[j];
        order[j] = t;
      }
      if (n > 1 && order[0] == 0) { /* never the posted order */
        order[0] = order[1];
        order[1] = 0;
      }
      for (int i = 0; i < n; i++) {
        int k = order[i];
        if (abi_isend(w, comm, b[g][k].data, b[g][k].size, 100 + k, mh[g][k],
                      &reqs.req[reqs.count++], 10000) != 0)
          goto fail;
      }
    }
    if (abi_wait_lists(w, &reqs, NULL, 30000) != 0) goto fail;
  }
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 30000) != 0) goto fail;
fail:
  for (int g = 0; g < ABI_GROUPS; g++)
    for (int k = 0; k < ABI_MAX_RECVS; k++) abi_dereg(w, comm, mh[g][k]);
  if (w->role == 0)
    abi_close_recv(w, &comm);
  else
    abi_close_send(w, &comm);
  for (int g = 0; g < ABI_GROUPS; g++)
    for (int k = 0; k < ABI_MAX_RECVS; k++) abi_buf_free(&b[g][k]);
  return w->failed ? -1 : 0;
}

/* ---- order: n == 1 receives match in posting order, whatever the tags ---- */

#define ABI_ORDER_BURST 32
#define ABI_ORDER_STREAM 400
#define ABI_ORDER_WINDOW 8
#define ABI_ORDER_BURST_POSTED (64u << 10)
#define ABI_ORDER_STREAM_POSTED 200000u

static size_t abi_order_burst_size(int i) {
  if (i == 7) return 0;
  if (i == 20) return ABI_ORDER_BURST_POSTED;
  return 1000u + 13u * (size_t)i;
}

static size_t abi_order_stream_size(int j) {
  return ((size_t)j * 7919u) % ABI_ORDER_STREAM_POSTED;
}

int abi_sc_order(abi_worker* w) {
  enum { N = ABI_ORDER_BURST, W = ABI_ORDER_WINDOW };
  abi_buf b[N];
  void* mh[N] = {0};
  void* comm = NULL;
  memset(b, 0, sizeof(b));
  for (int i = 0; i < N; i++) {
    /* Burst messages and stream messages both fit: the stream reuses slots 0..W-1. */
    ABI_REQUIRE(w, abi_buf_alloc(&b[i], ABI_ORDER_STREAM_POSTED) == 0, "out of memory");
  }
  if (abi_pair_connect(w, &comm) != 0) goto fail;
  for (int i = 0; i < N; i++)
    if (abi_reg(w, comm, b[i].data, b[i].size, &mh[i]) != 0) goto fail;

  /* Burst: 32 posted at once; the sender's tag (77) differs from the receiver's (0):
   * with n == 1 the tag must not matter, only the order. */
  abi_reqlist reqs = {.count = N};
  for (int i = 0; i < N; i++) {
    if (w->role == 0) {
      memset(b[i].data, ABI_CANARY, ABI_ORDER_BURST_POSTED);
      void* data[1] = {b[i].data};
      size_t sizes[1] = {ABI_ORDER_BURST_POSTED};
      int tags[1] = {0};
      if (abi_irecv(w, comm, 1, data, sizes, tags, &mh[i], &reqs.req[i], 10000) != 0) goto fail;
    } else {
      abi_pattern_fill(b[i].data, abi_order_burst_size(i), 5000 + (uint64_t)i);
      if (abi_isend(w, comm, b[i].data, abi_order_burst_size(i), 77, mh[i], &reqs.req[i],
                    10000) != 0)
        goto fail;
    }
  }
  if (abi_wait_lists(w, &reqs, NULL, 30000) != 0) goto fail;
  if (w->role == 0) {
    for (int i = 0; i < N; i++) {
      char what[64];
      snprintf(what, sizeof(what), "burst receive %d", i);
      if (abi_check_received(w, &b[i], ABI_ORDER_BURST_POSTED, abi_order_burst_size(i),
                             reqs.sizes[i][0], 5000 + (uint64_t)i, what) != 0)
        goto fail;
    }
  }

  /* Stream: a window of W requests kept full, oldest tested first, as the proxy's steps. */
  int posted = 0, completed = 0;
  void* win[W] = {0};
  unsigned idle = 0;
  int64_t deadline = abi_now_ms() + 60000;
  while (completed < ABI_ORDER_STREAM) {
    while (posted < ABI_ORDER_STREAM && posted - completed < W) {
      int slot = posted % W;
      size_t sz = abi_order_stream_size(posted);
      void* req = NULL;
      if (w->role == 0) {
        memset(b[slot].data, ABI_CANARY, ABI_ORDER_STREAM_POSTED);
        void* data[1] = {b[slot].data};
        size_t sizes[1] = {ABI_ORDER_STREAM_POSTED};
        int tags[1] = {1};
        ABI_NCCL_OK(w, abi_net_irecv(w, comm, 1, data, sizes, tags, &mh[slot], &req));
      } else {
        abi_pattern_fill(b[slot].data, sz, 9000 + (uint64_t)posted);
        ABI_NCCL_OK(w, abi_net_isend(w, comm, b[slot].data, sz, 1, mh[slot], &req));
      }
      if (req == NULL) break; /* "try again later", as the proxy reads it */
      win[slot] = req;
      posted++;
    }
    int slot = completed % W;
    int got[ABI_MAX_RECVS] = {-1};
    int rc = abi_test_once(w, win[slot], got);
    ABI_REQUIRE(w, rc >= 0, "stream message %d: test returned %s", completed,
                abi_result_str((ncclResult_t)-rc));
    if (rc == 1) {
      if (w->role == 0) {
        char what[64];
        snprintf(what, sizeof(what), "stream message %d", completed);
        if (abi_check_received(w, &b[slot], ABI_ORDER_STREAM_POSTED,
                               abi_order_stream_size(completed), got[0],
                               9000 + (uint64_t)completed, what) != 0)
          goto fail;
      }
      completed++;
      idle = 0;
      continue;
    }
    ABI_REQUIRE(w, abi_now_ms() < deadline, "stream stalled at message %d (posted %d)", completed,
                posted);
    if (++idle > 64) abi_sleep_us(50);
  }
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 30000) != 0) goto fail;
fail:
  for (int i = 0; i < N; i++) abi_dereg(w, comm, mh[i]);
  if (w->role == 0)
    abi_close_recv(w, &comm);
  else
    abi_close_send(w, &comm);
  for (int i = 0; i < N; i++) abi_buf_free(&b[i]);
  return w->failed ? -1 : 0;
}

/* ---- many: 16 connections on one listen comm ---- */

#define ABI_MANY 16
#define ABI_MANY_BASE 100000u
#define ABI_MANY_STEP 1001u

int abi_sc_many(abi_worker* w) {
  enum { N = ABI_MANY };
  void* comms[N] = {0};
  void* mh[N] = {0};
  abi_buf b[N];
  void* lc = NULL;
  bool seen[N] = {false};
  memset(b, 0, sizeof(b));
  for (int i = 0; i < N; i++) {
    size_t sz = w->role == 0 ? 2 * ABI_MANY_BASE : ABI_MANY_BASE + ABI_MANY_STEP * (size_t)i;
    ABI_REQUIRE(w, abi_buf_alloc(&b[i], sz) == 0, "out of memory");
    if (w->role == 0)
      memset(b[i].data, ABI_CANARY, sz);
    else
      abi_pattern_fill(b[i].data, sz, 7000 + (uint64_t)i);
  }

  int64_t deadline = abi_now_ms() + 30000;
  unsigned idle = 0;
  int ready = 0;
  if (w->role == 0) {
    if (abi_listen_publish(w, &lc) != 0) goto fail;
    while (ready < N) {
      ABI_NCCL_OK(w, agoq_view_accept(&w->view, lc, &comms[ready]));
      if (comms[ready] != NULL) {
        ready++;
        idle = 0;
        continue;
      }
      ABI_REQUIRE(w, abi_now_ms() < deadline, "only %d of %d connections accepted in 30 s",
                  ready, N);
      if (++idle > 64) abi_sleep_us(50);
    }
  } else {
    /* Each connect keeps its state in its own copy of the handle, as NCCL gives every
     * connection its own buffer. */
    uint8_t handles[N][ABI_HANDLE_SIZE];
    if (abi_handle_receive(w, handles[0]) != 0) goto fail;
    for (int i = 1; i < N; i++) memcpy(handles[i], handles[0], ABI_HANDLE_SIZE);
    while (ready < N) {
      for (int i = 0; i < N; i++) {
        if (comms[i] != NULL) continue;
        ABI_NCCL_OK(w, agoq_view_connect(&w->view, w->ctx, w->dev, handles[i], &comms[i]));
        if (comms[i] != NULL) ready++;
      }
      ABI_REQUIRE(w, abi_now_ms() < deadline, "only %d of %d connects done in 30 s", ready, N);
      if (++idle > 64) abi_sleep_us(50);
    }
  }
  for (int i = 0; i < N; i++)
    if (abi_reg(w, comms[i], b[i].data, b[i].size, &mh[i]) != 0) goto fail;

  abi_reqlist reqs = {.count = N};
  for (int i = 0; i < N; i++) {
    if (w->role == 0) {
      void* data[1] = {b[i].data};
      size_t sizes[1] = {b[i].size};
      int tags[1] = {1};
      if (abi_irecv(w, comms[i], 1, data, sizes, tags, &mh[i], &reqs.req[i], 10000) != 0)
        goto fail;
    } else {
      if (abi_isend(w, comms[i], b[i].data, b[i].size, 1, mh[i], &reqs.req[i], 10000) != 0)
        goto fail;
    }
  }
  if (abi_wait_lists(w, &reqs, NULL, 30000) != 0) goto fail;
  if (w->role == 0) {
    /* Accept order need not be connect order: the size names the sending connection. */
    for (int i = 0; i < N; i++) {
      int got = reqs.sizes[i][0];
      size_t off = got >= (int)ABI_MANY_BASE ? (size_t)got - ABI_MANY_BASE : 1;
      int idx = (int)(off / ABI_MANY_STEP);
      ABI_REQUIRE(w, got >= (int)ABI_MANY_BASE && off % ABI_MANY_STEP == 0 && idx < N && !seen[idx],
                  "accepted connection %d received %d bytes: matches no connect (or a duplicate)",
                  i, got);
      seen[idx] = true;
      char what[64];
      snprintf(what, sizeof(what), "connection %d (sender's #%d)", i, idx);
      if (abi_check_received(w, &b[i], b[i].size, (size_t)got, got, 7000 + (uint64_t)idx,
                             what) != 0)
        goto fail;
    }
  }
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 30000) != 0) goto fail;
fail:
  for (int i = 0; i < N; i++) {
    abi_dereg(w, comms[i], mh[i]);
    if (w->role == 0)
      abi_close_recv(w, &comms[i]);
    else
      abi_close_send(w, &comms[i]);
    abi_buf_free(&b[i]);
  }
  abi_close_listen(w, &lc);
  return w->failed ? -1 : 0;
}


/* ---- reload: NCCL dlcloses the plugin when its last communicator goes, and dlopens it
 * again for the next one; nothing may outlive the unload (threads, sockets, memory). ---- */

#define ABI_RELOAD_BYTES ((1u << 20) + 3u)

static int abi_reload_transfer(abi_worker* w, uint64_t seed) {
  void* comm = NULL;
  void* mh = NULL;
  abi_buf b = {0};
  ABI_REQUIRE(w, abi_buf_alloc(&b, ABI_RELOAD_BYTES) == 0, "out of memory");
  if (w->role == 0)
    memset(b.data, ABI_CANARY, b.size);
  else
    abi_pattern_fill(b.data, b.size, seed);
  if (abi_pair_connect(w, &comm) != 0) goto fail;
  if (abi_reg(w, comm, b.data, b.size, &mh) != 0) goto fail;
  void* req = NULL;
  int got[ABI_MAX_RECVS] = {-1};
  if (w->role == 0) {
    void* data[1] = {b.data};
    size_t sizes[1] = {b.size};
    int tags[1] = {1};
    if (abi_irecv(w, comm, 1, data, sizes, tags, &mh, &req, 10000) != 0) goto fail;
    if (abi_wait(w, req, got, 20000) != 0) goto fail;
    if (abi_check_received(w, &b, b.size, b.size, got[0], seed, "message") != 0) goto fail;
  } else {
    if (abi_isend(w, comm, b.data, b.size, 1, mh, &req, 10000) != 0) goto fail;
    if (abi_wait(w, req, got, 20000) != 0) goto fail;
  }
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 20000) != 0) goto fail;
fail:
  abi_dereg(w, comm, mh);
  if (w->role == 0)
    abi_close_recv(w, &comm);
  else
    abi_close_send(w, &comm);
  abi_buf_free(&b);
  return w->failed ? -1 : 0;
}

int abi_sc_reload(abi_worker* w) {
  const char* path = w->lib_path;
  int version = w->view.version;
  for (int cycle = 0; cycle < 3; cycle++) {
    if (abi_reload_transfer(w, 0x7E10ADu + (uint64_t)cycle) != 0) return -1;
    /* finalize (v11+) and dlclose, as NCCL's ncclNetPluginUnload at refcount 0. */
    abi_worker_teardown(w);
    if (w->failed) return -1;
    /* A plugin thread still running now would be executing unmapped code. */
    abi_sleep_us(200000);
    if (abi_worker_setup(w, path, version) != 0) return -1;
  }
  return 0;
}
