/* NCCL's buffers in device memory on the net path, in one process, over the CUDA emulation
 * (kernels/cuda/emu): its device memory faults when host code touches it, its copies run
 * only when an event or stream is queried, and it counts legacy-stream work, synchronous
 * calls and allocations. So a plugin that reads a device buffer from the host, reports a
 * receive done before the copy into NCCL's buffer completed, waits for the device on the
 * data path or allocates there fails here.
 *
 * Run three times by CTest: with AGOQ_GPU=on (the emulated device found), and with
 * AGOQ_GPU=off or unset (auto keeps the path off for its hang hazards), where device memory
 * must be refused with the reason. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <agoq_emu_capture.h>
#include <cuda_runtime_api.h>

#include "agoq_codec.h"
#include "core/agoq_params.h"
#include "gpu/agoq_gpu.h"
#include "net/agoq_net.h"
#include "net/agoq_net_comm.h"
#include "net/agoq_typed.h"
#include "profiler/agoq_oracle.h"

#define COMM_ID 0x7e7e7e7e00000d01ull

#include "net_pair.h"

static void fill(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = (uint8_t)x;
  }
}

/* A device buffer holding `host`'s bytes (the test's own synchronous copy). */
static void* dev_from(const void* host, size_t n) {
  void* d = NULL;
  assert_int_equal(cudaMalloc(&d, n ? n : 1), cudaSuccess);
  if (n > 0) assert_int_equal(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

static void dev_to(void* host, const void* d, size_t n) {
  if (n > 0) assert_int_equal(cudaMemcpy(host, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
}

typedef struct {
  void* buf;
  size_t size;
  bool device;
  void* mh;
} endpoint;

static void ep_reg(void* comm, endpoint* e) {
  assert_int_equal(agoq_net_reg_mr(comm, e->buf, e->size ? e->size : 1, e->device ? NCCL_PTR_CUDA : NCCL_PTR_HOST,
                                   &e->mh),
                   ncclSuccess);
}

/* One message of n bytes from s to r (each host or device memory) with `step` as the
 * profiler handle; returns what the receive reported and checks the plugin made no
 * legacy-stream work, synchronous call or allocation meanwhile. When the receive says done
 * into device memory, *landed gets the device buffer's first n bytes as they are at that
 * moment (no queued copy run), for the caller to compare. */
static int transfer_peek(pair* p, endpoint* s, endpoint* r, size_t n, fake_step* step, uint8_t* landed) {
  agoq_emu_counters c0, c1;
  agoq_emu_counters_get(&c0);
  void *sreq = NULL, *rreq = NULL;
  int tag = 3;
  double deadline = now_s() + 30;
  while (rreq == NULL && now_s() < deadline)
    assert_int_equal(agoq_net_irecv(p->recv, 1, &r->buf, &r->size, &tag, &r->mh, NULL, &rreq), ncclSuccess);
  while (sreq == NULL && now_s() < deadline)
    assert_int_equal(agoq_net_isend(p->send, s->buf, n, tag, s->mh, step, &sreq), ncclSuccess);
  assert_non_null(sreq);
  assert_non_null(rreq);
  int sdone = 0, rdone = 0, ssize = -1, rsize = -1;
  while ((!sdone || !rdone) && now_s() < deadline) {
    if (!sdone) assert_int_equal(agoq_net_test(sreq, &sdone, &ssize), ncclSuccess);
    if (!rdone) {
      assert_int_equal(agoq_net_test(rreq, &rdone, &rsize), ncclSuccess);
      if (rdone && r->device && landed != NULL) assert_int_equal(agoq_emu_peek(landed, r->buf, n), 0);
    }
  }
  assert_true(sdone && rdone);
  assert_int_equal(ssize, (int)n);
  agoq_emu_counters_get(&c1);
  assert_int_equal(c1.legacy_stream_ops, c0.legacy_stream_ops);
  assert_int_equal(c1.sync_calls, c0.sync_calls);
  assert_int_equal(c1.device_allocs, c0.device_allocs);
  assert_int_equal(c1.pinned_allocs, c0.pinned_allocs);
  /* Every kernel was loaded at setup: none first launched (lazily loaded) on the data path. */
  assert_int_equal(c1.kernels_refused, c0.kernels_refused);
  return rsize;
}

static int transfer(pair* p, endpoint* s, endpoint* r, size_t n, fake_step* step) {
  return transfer_peek(p, s, r, n, step, NULL);
}

static const size_t sizes[] = {0, 1, 255, 4099, 65536, 1u << 20, (5u << 20) + 17};

/* Every combination of host and device at both ends, exact bytes at every size; the
 * receive buffer's bytes past the message stay as they were. */
static void test_exact_every_memory_pair(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID, NULL);
  size_t cap = (6u << 20);
  uint8_t* src = malloc(cap);
  uint8_t* got = malloc(cap);
  uint8_t* canary = malloc(cap);
  memset(canary, 0x5c, cap);
  for (int mode = 0; mode < 4; mode++) {
    bool sdev = mode & 1, rdev = mode & 2;
    endpoint s = {.size = cap, .device = sdev}, r = {.size = cap, .device = rdev};
    fill(src, cap, 100 + (uint32_t)mode);
    s.buf = sdev ? dev_from(src, cap) : src;
    r.buf = rdev ? dev_from(canary, cap) : malloc(cap);
    if (!rdev) memcpy(r.buf, canary, cap);
    ep_reg(p.send, &s);
    ep_reg(p.recv, &r);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      size_t n = sizes[i];
      int rsize = transfer_peek(&p, &s, &r, n, NULL, got);
      assert_int_equal(rsize, (int)n);
      /* Done means in NCCL's buffer already, not once the test's own copy drained the
       * stream. */
      if (rdev) assert_memory_equal(got, src, n);
      if (rdev) dev_to(got, r.buf, cap);
      else memcpy(got, r.buf, cap);
      assert_memory_equal(got, src, n);
      assert_memory_equal(got + n, canary + n, cap - n);
      /* Next size: a fresh canary over what this one wrote. */
      if (rdev) assert_int_equal(cudaMemcpy(r.buf, canary, cap, cudaMemcpyHostToDevice), cudaSuccess);
      else memcpy(r.buf, canary, cap);
    }
    assert_int_equal(agoq_net_dereg_mr(p.send, s.mh), ncclSuccess);
    assert_int_equal(agoq_net_dereg_mr(p.recv, r.mh), ncclSuccess);
    if (sdev) cudaFree(s.buf);
    if (rdev) cudaFree(r.buf);
    else free(r.buf);
  }
  const agoq_gpu_link_stats* st = agoq_gpu_link_stats_get(((agoq_comm*)p.recv)->gpu);
  assert_non_null(st);
  assert_true(st->h2d_bytes > 0);
  assert_int_equal(st->d2h_bytes, 0);
  pair_close(&p);
  free(src);
  free(got);
  free(canary);
}

/* Many sends in flight from one device buffer into several device buffers: they arrive in
 * order and whole, although the staging holds only some of them at once. */
static void test_inflight_in_order(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 1, NULL);
  enum { N = 24 };
  size_t each = 1u << 20; /* 24 MiB in flight against 8 MiB of staging */
  uint8_t* src = malloc(each * N);
  fill(src, each * N, 7);
  endpoint s = {.buf = dev_from(src, each * N), .size = each * N, .device = true};
  endpoint r = {.size = each * N, .device = true};
  assert_int_equal(cudaMalloc(&r.buf, each * N), cudaSuccess);
  ep_reg(p.send, &s);
  ep_reg(p.recv, &r);
  void* sreq[N] = {0};
  void* rreq[N] = {0};
  int posted_s = 0, posted_r = 0, done_s = 0, done_r = 0, tag = 1;
  double deadline = now_s() + 60;
  while ((done_s < N || done_r < N) && now_s() < deadline) {
    if (posted_r < N && posted_r - done_r < 8) {
      void* dst = (uint8_t*)r.buf + (size_t)posted_r * each;
      size_t sz = each;
      assert_int_equal(agoq_net_irecv(p.recv, 1, &dst, &sz, &tag, &r.mh, NULL, &rreq[posted_r]), ncclSuccess);
      if (rreq[posted_r] != NULL) posted_r++;
    }
    if (posted_s < N) {
      assert_int_equal(agoq_net_isend(p.send, (uint8_t*)s.buf + (size_t)posted_s * each, each, tag, s.mh, NULL,
                                      &sreq[posted_s]),
                       ncclSuccess);
      if (sreq[posted_s] != NULL) posted_s++;
    }
    int d = 0, sz = 0;
    if (done_s < posted_s) {
      assert_int_equal(agoq_net_test(sreq[done_s], &d, &sz), ncclSuccess);
      if (d) done_s++;
    }
    if (done_r < posted_r) {
      assert_int_equal(agoq_net_test(rreq[done_r], &d, &sz), ncclSuccess);
      if (d) {
        assert_int_equal(sz, (int)each);
        done_r++;
      }
    }
  }
  assert_int_equal(done_s, N);
  assert_int_equal(done_r, N);
  uint8_t* got = malloc(each * N);
  dev_to(got, r.buf, each * N);
  assert_memory_equal(got, src, each * N);
  agoq_net_dereg_mr(p.send, s.mh);
  agoq_net_dereg_mr(p.recv, r.mh);
  cudaFree(s.buf);
  cudaFree(r.buf);
  pair_close(&p);
  free(src);
  free(got);
}

/* One connection carries host and device buffers (NCCL's LL buffers stay in host memory
 * while SIMPLE's are on the GPU): a host send posted while a device send is still being
 * staged goes after it. The emulated copy does not run before the plugin polls its event,
 * so a host send that overtook it would land in the first receive. */
static void test_host_send_after_staged_device_send(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 7, NULL);
  enum { N1 = 3000, N2 = 5000, CAP = 8192 };
  uint8_t a[N1], b[N2];
  fill(a, N1, 41);
  fill(b, N2, 42);
  endpoint sd = {.buf = dev_from(a, N1), .size = N1, .device = true};
  endpoint sh = {.buf = b, .size = N2, .device = false};
  ep_reg(p.send, &sd);
  ep_reg(p.send, &sh);
  uint8_t* rbuf[2] = {malloc(CAP), malloc(CAP)};
  void* rmh[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++) assert_int_equal(agoq_net_reg_mr(p.recv, rbuf[i], CAP, NCCL_PTR_HOST, &rmh[i]), ncclSuccess);
  int tag = 3;
  void *s1 = NULL, *s2 = NULL, *r[2] = {NULL, NULL};
  assert_int_equal(agoq_net_isend(p.send, sd.buf, N1, tag, sd.mh, NULL, &s1), ncclSuccess);
  assert_int_equal(agoq_net_isend(p.send, sh.buf, N2, tag, sh.mh, NULL, &s2), ncclSuccess);
  assert_non_null(s1);
  assert_non_null(s2);
  for (int i = 0; i < 2; i++) {
    size_t cap = CAP;
    void* dst = rbuf[i];
    assert_int_equal(agoq_net_irecv(p.recv, 1, &dst, &cap, &tag, &rmh[i], NULL, &r[i]), ncclSuccess);
    assert_non_null(r[i]);
  }
  int done[4] = {0}, size[4] = {-1, -1, -1, -1};
  void* reqs[4] = {s1, s2, r[0], r[1]};
  double deadline = now_s() + 30;
  while (!(done[0] && done[1] && done[2] && done[3]) && now_s() < deadline)
    for (int i = 0; i < 4; i++)
      if (!done[i]) assert_int_equal(agoq_net_test(reqs[i], &done[i], &size[i]), ncclSuccess);
  assert_true(done[0] && done[1] && done[2] && done[3]);
  assert_int_equal(size[2], N1);
  assert_memory_equal(rbuf[0], a, N1);
  assert_int_equal(size[3], N2);
  assert_memory_equal(rbuf[1], b, N2);
  for (int i = 0; i < 2; i++) {
    agoq_net_dereg_mr(p.recv, rmh[i]);
    free(rbuf[i]);
  }
  agoq_net_dereg_mr(p.send, sd.mh);
  agoq_net_dereg_mr(p.send, sh.mh);
  cudaFree(sd.buf);
  pair_close(&p);
}

/* A typed float payload from device memory is encoded by the CUDA codec (here: emulated,
 * the same kernels) into a frame, decoded by the receiver's GPU, and the decoded bits are
 * exactly those of the same message sent host to host through the CPU codec. */
static void test_typed_bits_equal_host_path(void** state) {
  (void)state;
  starts = stops = 0;
  pair p;
  pair_open_ex(&p, COMM_ID + 2, fake_prof);
  size_t n = 256u << 10;
  float* src = malloc(n);
  for (size_t i = 0; i < n / 4; i++) src[i] = sinf((float)i * 0.01f) * (float)(1 + i % 7);
  uint8_t* host_got = malloc(n);
  uint8_t* dev_got = malloc(n);
  fake_step step = step_of(AGOQ_XFER_P2P, ncclFloat32, AGOQ_XFER_PROTO_SIMPLE, 1);

  endpoint hs = {.buf = src, .size = n}, hr = {.buf = host_got, .size = n};
  ep_reg(p.send, &hs);
  ep_reg(p.recv, &hr);
  assert_int_equal(transfer(&p, &hs, &hr, n, &step), (int)n);
  uint64_t frames_host = ((agoq_comm*)p.send)->typed_stats.frames;
  assert_int_equal(frames_host, 1);

  endpoint ds = {.buf = dev_from(src, n), .size = n, .device = true}, dr = {.size = n, .device = true};
  assert_int_equal(cudaMalloc(&dr.buf, n), cudaSuccess);
  ep_reg(p.send, &ds);
  ep_reg(p.recv, &dr);
  assert_int_equal(transfer(&p, &ds, &dr, n, &step), (int)n);
  assert_int_equal(((agoq_comm*)p.send)->typed_stats.frames, 2);
  dev_to(dev_got, dr.buf, n);
  assert_memory_equal(dev_got, host_got, n);
  /* Quantized, so not the input bits. */
  assert_true(memcmp(host_got, src, n) != 0);
  /* The GPU wrote the frame into the staging: nothing else crossed PCIe, and the frame is
   * as long as the CPU codec's (the wire bytes of both messages are equal). */
  const agoq_typed_stats* ts = &((agoq_comm*)p.send)->typed_stats;
  const agoq_gpu_link_stats* sl = agoq_gpu_link_stats_get(((agoq_comm*)p.send)->gpu);
  const agoq_gpu_link_stats* rl = agoq_gpu_link_stats_get(((agoq_comm*)p.recv)->gpu);
  assert_int_equal(sl->d2h_bytes, 0);
  assert_int_equal(sl->encodes, 1);
  assert_int_equal(sl->encoded_bytes * 2, ts->frame_wire_bytes);
  assert_true(sl->encoded_bytes < n / 2 + 4096);
  /* The receiver's GPU decoded the body from the staging: no H2D copy of it either. */
  assert_int_equal(rl->decodes, 1);
  assert_int_equal(rl->h2d_bytes, 0);
  /* AGOQ_STATS: the device path's PCIe bytes, on the quantized lines of both ends. */
  agoq_stats_entry* se = ((agoq_comm*)p.send)->st;
  agoq_stats_entry* re = ((agoq_comm*)p.recv)->st;
  assert_non_null(se);
  assert_non_null(re);
  assert_int_equal(agoq_stats_get(&se->path[AGOQ_STATS_QUANT].device_calls), 1);
  assert_int_equal(agoq_stats_get(&se->path[AGOQ_STATS_QUANT].pcie_d2h), sl->encoded_bytes);
  assert_int_equal(agoq_stats_get(&re->path[AGOQ_STATS_QUANT].device_calls), 1);
  assert_int_equal(agoq_stats_get(&re->path[AGOQ_STATS_QUANT].pcie_h2d), rl->decoded_bytes);
  assert_int_equal(agoq_stats_get(&re->path[AGOQ_STATS_QUANT].pcie_h2d) + 48, sl->encoded_bytes);
  for (int i = 0; i < 2; i++) {
    agoq_net_dereg_mr(p.send, i ? ds.mh : hs.mh);
    agoq_net_dereg_mr(p.recv, i ? dr.mh : hr.mh);
  }
  cudaFree(ds.buf);
  cudaFree(dr.buf);
  pair_close(&p);
  free(src);
  free(host_got);
  free(dev_got);
}

/* Every float type, a smooth payload and one whose blocks all hold a NaN (stored raw, so
 * the frame would not be smaller: the device refuses it and the payload goes exact), a
 * length that is no multiple of the block, and every pair of host and device ends: the
 * bits received equal the host-to-host path's. */
static void test_typed_matrix_equals_host_path(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 6, fake_prof);
  static const struct {
    int nccl;
    size_t esz;
  } types[] = {{ncclFloat32, 4}, {ncclBfloat16, 2}, {ncclFloat16, 2}};
  size_t bytes = (300u << 10) + 12; /* 307212: whole elements of every type, not whole blocks */
  uint8_t* src = malloc(bytes);
  uint8_t* ref = malloc(bytes);
  uint8_t* got = malloc(bytes);
  void* dsrc = NULL;
  void* ddst = NULL;
  assert_int_equal(cudaMalloc(&dsrc, bytes), cudaSuccess);
  assert_int_equal(cudaMalloc(&ddst, bytes), cudaSuccess);
  endpoint hs = {.buf = src, .size = bytes}, hr = {.buf = ref, .size = bytes};
  endpoint ds = {.buf = dsrc, .size = bytes, .device = true}, dr = {.buf = ddst, .size = bytes, .device = true};
  endpoint hr2 = {.buf = got, .size = bytes};
  ep_reg(p.send, &hs);
  ep_reg(p.recv, &hr);
  ep_reg(p.send, &ds);
  ep_reg(p.recv, &dr);
  ep_reg(p.recv, &hr2);
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    for (int nan_blocks = 0; nan_blocks < 2; nan_blocks++) {
      fill(src, bytes, (uint32_t)(t * 2 + (size_t)nan_blocks));
      /* Plausible values: the high byte of each element from a small range. */
      for (size_t i = types[t].esz - 1; i < bytes; i += types[t].esz) src[i] = (uint8_t)(0x3c + (src[i] & 3));
      if (nan_blocks)
        for (size_t i = 0; i + types[t].esz <= bytes; i += 32 * types[t].esz) memset(src + i, 0xff, types[t].esz);
      fake_step step = step_of(AGOQ_XFER_P2P, types[t].nccl, AGOQ_XFER_PROTO_SIMPLE, 1);
      uint64_t frames0 = ((agoq_comm*)p.send)->typed_stats.frames;
      assert_int_equal(transfer(&p, &hs, &hr, bytes, &step), (int)bytes);
      bool framed = ((agoq_comm*)p.send)->typed_stats.frames > frames0;
      assert_true(framed == !nan_blocks);
      assert_int_equal(cudaMemcpy(dsrc, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      /* device -> device, device -> host, host -> device */
      for (int mode = 0; mode < 3; mode++) {
        endpoint* se = mode == 2 ? &hs : &ds;
        endpoint* re = mode == 1 ? &hr2 : &dr;
        memset(got, 0, bytes);
        frames0 = ((agoq_comm*)p.send)->typed_stats.frames;
        assert_int_equal(transfer(&p, se, re, bytes, &step), (int)bytes);
        assert_true((((agoq_comm*)p.send)->typed_stats.frames > frames0) == framed);
        if (re->device) dev_to(got, ddst, bytes);
        assert_memory_equal(got, ref, bytes);
      }
      if (nan_blocks) assert_memory_equal(ref, src, bytes); /* went exact */
    }
  }
  agoq_net_dereg_mr(p.send, hs.mh);
  agoq_net_dereg_mr(p.send, ds.mh);
  agoq_net_dereg_mr(p.recv, hr.mh);
  agoq_net_dereg_mr(p.recv, dr.mh);
  agoq_net_dereg_mr(p.recv, hr2.mh);
  cudaFree(dsrc);
  cudaFree(ddst);
  pair_close(&p);
  free(src);
  free(ref);
  free(got);
}

/* A typed payload with a NaN in one block, device to device: the frame is still smaller than
 * the payload, so it goes as a frame, that block raw, and the receiver's GPU decodes it with
 * the escaped-block decode (raw_decode_kernel), which no other frame needs. That kernel was
 * loaded when the link was made (agoq_gpu_codec_load): the emulation refuses a kernel's first
 * launch on the data path, where on a GPU under lazy loading it would load while NCCL's kernel
 * waits for it (a hang measured on an H200). Bits of the host path, the NaN included. */
static void test_typed_nan_block_decoded_on_gpu(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 8, fake_prof);
  static const struct {
    int nccl;
    size_t esz;
  } types[] = {{ncclFloat32, 4}, {ncclBfloat16, 2}, {ncclFloat16, 2}};
  size_t bytes = 256u << 10;
  uint8_t* src = malloc(bytes);
  uint8_t* ref = malloc(bytes);
  uint8_t* got = malloc(bytes);
  endpoint hs = {.buf = src, .size = bytes}, hr = {.buf = ref, .size = bytes};
  endpoint ds = {.size = bytes, .device = true}, dr = {.size = bytes, .device = true};
  assert_int_equal(cudaMalloc(&ds.buf, bytes), cudaSuccess);
  assert_int_equal(cudaMalloc(&dr.buf, bytes), cudaSuccess);
  ep_reg(p.send, &hs);
  ep_reg(p.recv, &hr);
  ep_reg(p.send, &ds);
  ep_reg(p.recv, &dr);
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    const size_t e = types[t].esz, nan_at = 1000;
    fill(src, bytes, (uint32_t)(40 + t));
    for (size_t i = e - 1; i < bytes; i += e) src[i] = (uint8_t)(0x3c + (src[i] & 3));
    memset(src + nan_at * e, 0xff, e); /* all ones: a NaN in every float type */
    fake_step step = step_of(AGOQ_XFER_P2P, types[t].nccl, AGOQ_XFER_PROTO_SIMPLE, 1);
    uint64_t frames0 = ((agoq_comm*)p.send)->typed_stats.frames;
    assert_int_equal(transfer(&p, &hs, &hr, bytes, &step), (int)bytes);
    assert_int_equal(((agoq_comm*)p.send)->typed_stats.frames, frames0 + 1);
    assert_int_equal(cudaMemcpy(ds.buf, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    unsigned long long raw0 = agoq_emu_kernel_launches("raw_decode_kernel<");
    uint64_t decodes0 = agoq_gpu_link_stats_get(((agoq_comm*)p.recv)->gpu)->decodes;
    assert_int_equal(transfer(&p, &ds, &dr, bytes, &step), (int)bytes);
    assert_int_equal(((agoq_comm*)p.send)->typed_stats.frames, frames0 + 2);
    assert_int_equal(agoq_gpu_link_stats_get(((agoq_comm*)p.recv)->gpu)->decodes, decodes0 + 1);
    assert_int_equal(agoq_emu_kernel_launches("raw_decode_kernel<"), raw0 + 1);
    dev_to(got, dr.buf, bytes);
    assert_memory_equal(got, ref, bytes);
    assert_memory_equal(got + nan_at * e, src + nan_at * e, e); /* the NaN's bits, unchanged */
  }
  agoq_net_dereg_mr(p.send, hs.mh);
  agoq_net_dereg_mr(p.send, ds.mh);
  agoq_net_dereg_mr(p.recv, hr.mh);
  agoq_net_dereg_mr(p.recv, dr.mh);
  cudaFree(ds.buf);
  cudaFree(dr.buf);
  pair_close(&p);
  free(src);
  free(ref);
  free(got);
}

/* A typed payload of a few elements (possible with a small AGOQ_MIN_BYTES) cannot make a
 * frame smaller than itself: it goes exact from device memory, as from host memory, rather
 * than failing the send. */
static void test_typed_tiny_goes_exact(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 7, fake_prof);
  uint64_t min0 = agoq_typed.min_bytes;
  agoq_typed.min_bytes = 0;
  float src[3] = {1.5f, -2.25f, 3.0f};
  float got[3] = {0};
  fake_step step = step_of(AGOQ_XFER_P2P, ncclFloat32, AGOQ_XFER_PROTO_SIMPLE, 1);
  endpoint ds = {.buf = dev_from(src, sizeof src), .size = sizeof src, .device = true};
  endpoint dr = {.size = sizeof got, .device = true};
  assert_int_equal(cudaMalloc(&dr.buf, sizeof got), cudaSuccess);
  ep_reg(p.send, &ds);
  ep_reg(p.recv, &dr);
  uint64_t frames0 = ((agoq_comm*)p.send)->typed_stats.frames;
  assert_int_equal(transfer(&p, &ds, &dr, sizeof src, &step), (int)sizeof src);
  assert_int_equal(((agoq_comm*)p.send)->typed_stats.frames, frames0);
  dev_to(got, dr.buf, sizeof got);
  assert_memory_equal(got, src, sizeof src);
  agoq_typed.min_bytes = min0;
  agoq_net_dereg_mr(p.send, ds.mh);
  agoq_net_dereg_mr(p.recv, dr.mh);
  cudaFree(ds.buf);
  cudaFree(dr.buf);
  pair_close(&p);
}

/* A float send from device memory at an address that is not a multiple of the element size
 * (a registered user buffer can start anywhere): exact, counted as exact_unaligned, the bytes
 * arrive unchanged; it must not fail the isend (the CUDA codec refuses unaligned elements). */
static void test_typed_misaligned_goes_exact(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 8, fake_prof);
  uint64_t min0 = agoq_typed.min_bytes;
  agoq_typed.min_bytes = 0;
  enum { N = 4096 };
  static float src[N];
  static float got[N];
  for (int i = 0; i < N; i++) src[i] = (float)i * 0.37f - 100.0f;
  fake_step step = step_of(AGOQ_XFER_P2P, ncclFloat32, AGOQ_XFER_PROTO_SIMPLE, 1);
  /* The send starts 2 bytes into its allocation: aligned for bf16, not for fp32. */
  uint8_t* base = NULL;
  assert_int_equal(cudaMalloc((void**)&base, sizeof src + 2), cudaSuccess);
  assert_int_equal(cudaMemcpy(base + 2, src, sizeof src, cudaMemcpyHostToDevice), cudaSuccess);
  endpoint ds = {.buf = base + 2, .size = sizeof src, .device = true};
  endpoint dr = {.size = sizeof got, .device = true};
  assert_int_equal(cudaMalloc(&dr.buf, sizeof got), cudaSuccess);
  ep_reg(p.send, &ds);
  ep_reg(p.recv, &dr);
  agoq_comm* sc = (agoq_comm*)p.send;
  assert_non_null(sc->st); /* AGOQ_STATS=1 (main) */
  uint64_t frames0 = sc->typed_stats.frames;
  uint64_t unaligned0 = agoq_stats_get(&sc->st->exact[AGOQ_EXACT_UNALIGNED]);
  assert_int_equal(transfer(&p, &ds, &dr, sizeof src, &step), (int)sizeof src);
  assert_int_equal(sc->typed_stats.frames, frames0);
  assert_int_equal(agoq_stats_get(&sc->st->exact[AGOQ_EXACT_UNALIGNED]), unaligned0 + 1);
  dev_to(got, dr.buf, sizeof got);
  assert_memory_equal(got, src, sizeof src);
  agoq_typed.min_bytes = min0;
  agoq_net_dereg_mr(p.send, ds.mh);
  agoq_net_dereg_mr(p.recv, dr.mh);
  cudaFree(base);
  cudaFree(dr.buf);
  pair_close(&p);
}

/* regMr refuses what is not device memory, and ranges running past an allocation; the data
 * path refuses a buffer outside its registration and a message larger than the staging. */
static void test_bad_device_buffers(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 3, NULL);
  void* mh = NULL;
  uint8_t* host = malloc(4096);
  assert_int_equal(agoq_net_reg_mr(p.send, host, 4096, NCCL_PTR_CUDA, &mh), ncclInvalidUsage);
  assert_null(mh);
  void* d = NULL;
  assert_int_equal(cudaMalloc(&d, 4096), cudaSuccess);
  assert_int_equal(agoq_net_reg_mr(p.send, d, 8192, NCCL_PTR_CUDA, &mh), ncclInvalidUsage);
  assert_int_equal(agoq_net_reg_mr(p.send, d, 4096, NCCL_PTR_CUDA, &mh), ncclSuccess);
  void* req = NULL;
  assert_int_equal(agoq_net_isend(p.send, (uint8_t*)d + 1024, 4096, 1, mh, NULL, &req), ncclInvalidUsage);
  assert_null(req);
  agoq_net_dereg_mr(p.send, mh);
  cudaFree(d);

  assert_int_equal(cudaMalloc(&d, 4096), cudaSuccess);
  void* rmh = NULL;
  assert_int_equal(agoq_net_reg_mr(p.recv, d, 4096, NCCL_PTR_CUDA, &rmh), ncclSuccess);
  /* iflush: nothing is left to wait for once a device receive tested done. */
  req = (void*)1;
  assert_int_equal(agoq_net_iflush(p.recv, 1, &d, (int[]){16}, &rmh, &req), ncclSuccess);
  assert_null(req);
  agoq_net_dereg_mr(p.recv, rmh);
  cudaFree(d);
  pair_close(&p);
  free(host);
}

static void test_backend_is_the_emulation(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 4, NULL);
  assert_true(agoq_gpu_active());
  assert_string_equal(agoq_gpu_backend(), "emulation");
  assert_non_null(strstr(agoq_gpu_describe(), "on (AGOQ_GPU=on): 1 device"));
  pair_close(&p);
}

/* The setting that keeps the path off in this run: AGOQ_GPU=off, or unset (auto). */
static bool gpu_mode_is_auto(void) {
  const char* mode = getenv("AGOQ_GPU");
  return mode == NULL || strcmp(mode, "auto") == 0;
}

/* AGOQ_GPU=off, and auto even where a device is found (the emulated one is): the host path
 * only; device memory is refused, naming the setting, and auto says which hang hazards keep
 * it off. */
static void test_off_refuses_device_memory(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 5, NULL);
  assert_false(agoq_gpu_active());
  if (gpu_mode_is_auto()) {
    assert_non_null(strstr(agoq_gpu_describe(), "off (AGOQ_GPU=auto)"));
    assert_non_null(strstr(agoq_gpu_describe(), "cudaFree"));
    assert_non_null(strstr(agoq_gpu_describe(), "AGOQ_GPU=on turns it on"));
  } else {
    assert_non_null(strstr(agoq_gpu_describe(), "AGOQ_GPU=off"));
  }
  void* d = NULL;
  void* mh = NULL;
  assert_int_equal(cudaMalloc(&d, 4096), cudaSuccess);
  assert_int_equal(agoq_net_reg_mr(p.send, d, 4096, NCCL_PTR_CUDA, &mh), ncclInvalidUsage);
  assert_null(mh);
  cudaFree(d);
  pair_close(&p);
}

/* The reason the GPU path is off must be the right one: the runtime calls a missing driver
 * "CUDA driver version is insufficient for CUDA runtime version". */
static void test_start_failure_reason(void** state) {
  (void)state;
  char why[256];
  const char* insufficient = "CUDA driver version is insufficient for CUDA runtime version";
  agoq_gpu_start_failure(35, insufficient, "libagoq-no-such-driver.so.1", why, sizeof why);
  assert_non_null(strstr(why, "no CUDA driver"));
  assert_null(strstr(why, "insufficient"));
  agoq_gpu_start_failure(35, insufficient, AGOQ_FAKE_LIBCUDA, why, sizeof why);
  assert_non_null(strstr(why, "supports CUDA 11.8, older than this build's runtime"));
  agoq_gpu_start_failure(100, "no CUDA-capable device is detected", "libagoq-no-such-driver.so.1", why, sizeof why);
  assert_string_equal(why, "no CUDA-capable device is detected");
}

/* Another thread captures a CUDA graph in Global mode (torch.cuda.graph) while NCCL's proxy
 * thread connects and registers device buffers, and later closes: the link's setup and
 * teardown (allocations, a stream, events) run in Relaxed capture mode, so none is refused
 * and the capture survives; this thread's own mode is as it was. */
static void test_link_setup_during_global_capture(void** state) {
  (void)state;
  size_t n = 1u << 20;
  uint8_t* src = malloc(n);
  uint8_t* got = malloc(n);
  fill(src, n, 77);
  /* The test's own buffers exist before the capture: only the plugin's calls are at stake. */
  endpoint s = {.size = n, .device = true, .buf = dev_from(src, n)};
  endpoint r = {.size = n, .device = true, .buf = dev_from(got, n)};
  agoq_emu_capturer c;
  pthread_t t;
  assert_int_equal(agoq_emu_capture_start(&c, &t, cudaStreamCaptureModeGlobal), 0);
  assert_int_equal(c.begin, cudaSuccess);
  agoq_emu_counters c0, c1;
  agoq_emu_counters_get(&c0);

  pair p;
  pair_open_ex(&p, COMM_ID, NULL);
  ep_reg(p.send, &s);
  ep_reg(p.recv, &r);
  assert_int_equal(transfer(&p, &s, &r, n, NULL), (int)n);
  assert_int_equal(agoq_net_dereg_mr(p.send, s.mh), ncclSuccess);
  assert_int_equal(agoq_net_dereg_mr(p.recv, r.mh), ncclSuccess);
  pair_close(&p);
  agoq_emu_counters_get(&c1);
  assert_int_equal(c1.capture_refused, c0.capture_refused);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  assert_int_equal(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  assert_int_equal(mode, cudaStreamCaptureModeGlobal); /* put back as it was */

  assert_int_equal(agoq_emu_capture_finish(&c, t), cudaSuccess);
  dev_to(got, r.buf, n);
  assert_memory_equal(got, src, n);
  cudaFree(s.buf);
  cudaFree(r.buf);
  free(src);
  free(got);
}

/* Two GPUs in one process (JAX, nccl-tests -g): a connection whose buffers are on device 1,
 * driven from a thread whose current device is 0 (NCCL's proxy thread of another rank, or
 * CollNet's engine). Every call of the plugin, link setup, exact and typed transfers, the
 * GPU codec and close, runs on device 1 (the emulation refuses a kernel on another device's
 * stream, or reaching another device's memory) and leaves device 0 current. */
static void test_link_on_another_device_leaves_the_callers(void** state) {
  (void)state;
  int old = agoq_emu_devices_set(2);
  size_t bytes = 256u << 10;
  uint8_t* src = malloc(bytes);
  uint8_t* got = malloc(bytes);
  for (size_t i = 0; i < bytes / 4; i++) ((float*)src)[i] = (float)(i % 97) * 0.25f - 7.0f;
  endpoint s = {.size = bytes, .device = true}, r = {.size = bytes, .device = true};
  assert_int_equal(cudaSetDevice(1), cudaSuccess);
  s.buf = dev_from(src, bytes);
  assert_int_equal(cudaMalloc(&r.buf, bytes), cudaSuccess);
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  int cur = -1;
  pair p;
  pair_open_ex(&p, COMM_ID + 9, fake_prof);
  ep_reg(p.send, &s);
  ep_reg(p.recv, &r);
  assert_int_equal(cudaGetDevice(&cur), cudaSuccess);
  assert_int_equal(cur, 0);
  assert_int_equal(agoq_gpu_link_device(((agoq_comm*)p.send)->gpu), 1);
  assert_int_equal(transfer(&p, &s, &r, bytes, NULL), (int)bytes);
  assert_int_equal(cudaGetDevice(&cur), cudaSuccess);
  assert_int_equal(cur, 0);
  dev_to(got, r.buf, bytes);
  assert_memory_equal(got, src, bytes);
  fake_step step = step_of(AGOQ_XFER_P2P, ncclFloat32, AGOQ_XFER_PROTO_SIMPLE, 1);
  uint64_t frames0 = ((agoq_comm*)p.send)->typed_stats.frames;
  uint64_t decodes0 = agoq_gpu_link_stats_get(((agoq_comm*)p.recv)->gpu)->decodes;
  assert_int_equal(transfer(&p, &s, &r, bytes, &step), (int)bytes);
  assert_int_equal(((agoq_comm*)p.send)->typed_stats.frames, frames0 + 1);
  assert_int_equal(agoq_gpu_link_stats_get(((agoq_comm*)p.recv)->gpu)->decodes, decodes0 + 1);
  assert_int_equal(cudaGetDevice(&cur), cudaSuccess);
  assert_int_equal(cur, 0);
  assert_int_equal(agoq_net_dereg_mr(p.send, s.mh), ncclSuccess);
  assert_int_equal(agoq_net_dereg_mr(p.recv, r.mh), ncclSuccess);
  pair_close(&p);
  assert_int_equal(cudaGetDevice(&cur), cudaSuccess);
  assert_int_equal(cur, 0);
  unsigned long long loaded = 0;
  assert_int_equal(agoq_emu_kernels_get(1, &loaded, NULL), 0);
  assert_true(loaded > 0); /* the codec was loaded on device 1 too, at the link's setup */
  cudaFree(s.buf);
  cudaFree(r.buf);
  free(src);
  free(got);
  agoq_emu_devices_set(old);
}

typedef int (*ctx_get_fn)(void** ctx);

/* fp32 values that came as an int8 frame (block 128) with element `raw` in a raw block: that
 * block bit-exact, the others changed but within 1% relative L2. */
static void assert_int8_close_but(const uint8_t* got, const float* src, size_t bytes, size_t raw) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < bytes / 4; i++) {
    float v;
    memcpy(&v, got + 4 * i, 4);
    if (i / 128 == raw / 128) {
      assert_memory_equal(&v, &src[i], 4);
      continue;
    }
    err += ((double)v - src[i]) * ((double)v - src[i]);
    ref += (double)src[i] * src[i];
  }
  assert_true(err > 0 && sqrt(err / ref) < 0.01);
}

static void* current_context(void) {
  ctx_get_fn get = NULL;
  enum cudaDriverEntryPointQueryResult q;
  assert_int_equal(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", (void**)&get, 12000, cudaEnableDefault, &q),
                   cudaSuccess);
  void* ctx = NULL;
  assert_int_equal(get(&ctx), 0);
  return ctx;
}

/* After a failure too: the other tests run in the primary context. */
static int primary_context_again(void** state) {
  (void)state;
  return cudaSetDevice(0) == cudaSuccess ? 0 : -1;
}

/* NCCL_CREATE_THREAD_CONTEXT=1 (NCCL 2.28.9): NCCL's proxy threads share a private CUDA
 * context, in which they connect and drive the links. The codec's kernels are loaded there
 * at the link's setup, whatever was loaded in the device's primary context before (the
 * emulation loads per context: a NaN block needs the escaped-block decode). Then a caller in
 * the primary context (as any other thread is): the link's calls still run in the context
 * that made it, and the caller's context is the same after them. */
static void test_link_in_a_private_context(void** state) {
  (void)state;
  size_t bytes = 256u << 10;
  uint8_t* src = malloc(bytes);
  uint8_t* got = malloc(bytes);
  for (size_t i = 0; i < bytes / 4; i++) ((float*)src)[i] = (float)(i % 97) * 0.25f - 7.0f;
  memset(src + 4000 * 4, 0xff, 4); /* a NaN: its block travels raw */
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  void* primary = current_context();
  void* priv = agoq_emu_context_create(0);
  assert_non_null(priv);
  endpoint s = {.size = bytes, .device = true}, r = {.size = bytes, .device = true};
  s.buf = dev_from(src, bytes);
  assert_int_equal(cudaMalloc(&r.buf, bytes), cudaSuccess);
  pair p;
  pair_open_ex(&p, COMM_ID + 40, fake_prof);
  ep_reg(p.send, &s);
  ep_reg(p.recv, &r);
  fake_step step = step_of(AGOQ_XFER_P2P, ncclFloat32, AGOQ_XFER_PROTO_SIMPLE, 1);
  for (int caller = 0; caller < 2; caller++) {
    if (caller == 1) assert_int_equal(cudaSetDevice(0), cudaSuccess); /* the primary context */
    void* before = current_context();
    assert_ptr_equal(before, caller == 0 ? priv : primary);
    uint64_t frames0 = ((agoq_comm*)p.send)->typed_stats.frames;
    unsigned long long raw0 = agoq_emu_kernel_launches("raw_decode_kernel<");
    memset(got, 0, bytes);
    assert_int_equal(cudaMemcpy(r.buf, got, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(transfer(&p, &s, &r, bytes, &step), (int)bytes);
    assert_int_equal(((agoq_comm*)p.send)->typed_stats.frames, frames0 + 1);
    assert_int_equal(agoq_emu_kernel_launches("raw_decode_kernel<"), raw0 + 1);
    assert_ptr_equal(current_context(), before);
    dev_to(got, r.buf, bytes);
    assert_int8_close_but(got, (const float*)src, bytes, 4000);
  }
  assert_int_equal(agoq_emu_context_set(priv), 0);
  assert_int_equal(agoq_net_dereg_mr(p.send, s.mh), ncclSuccess);
  assert_int_equal(agoq_net_dereg_mr(p.recv, r.mh), ncclSuccess);
  pair_close(&p);
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  cudaFree(s.buf);
  cudaFree(r.buf);
  free(src);
  free(got);
}

/* NCCL's device buffer registered by DMA-BUF, as NCCL registers it. */
static void ep_reg_dmabuf(void* comm, endpoint* e) {
  int (*get)(void*, unsigned long long, size_t, int, unsigned long long) = NULL;
  enum cudaDriverEntryPointQueryResult q;
  assert_int_equal(cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", (void**)&get, 12000,
                                                    cudaEnableDefault, &q),
                   cudaSuccess);
  assert_non_null(get);
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t base = (uintptr_t)e->buf / page * page;
  uintptr_t end = ((uintptr_t)e->buf + e->size + page - 1) / page * page;
  int fd = -1;
  assert_int_equal(get(&fd, (unsigned long long)base, (size_t)(end - base), 1 /* DMA_BUF_FD */, 0), 0);
  assert_int_equal(agoq_net_reg_mr_dmabuf(comm, e->buf, e->size, NCCL_PTR_CUDA, (uint64_t)((uintptr_t)e->buf - base),
                                          fd, &e->mh),
                   ncclSuccess);
  close(fd);
}

/* The fp32 values that came as an int8 frame (block 128): changed, within 1% relative L2. */
static void assert_int8_close(const uint8_t* got, const float* src, size_t bytes) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < bytes / 4; i++) {
    float v;
    memcpy(&v, got + 4 * i, 4);
    err += ((double)v - src[i]) * ((double)v - src[i]);
    ref += (double)src[i] * src[i];
  }
  assert_true(err > 0 && sqrt(err / ref) < 0.01);
}

/* A pair with a `big`-byte device buffer at each end, the source holding fp32 values,
 * registered by DMA-BUF or with plain regMr. */
typedef struct {
  pair p;
  size_t big;
  float* src;
  uint8_t* got;
  endpoint s, r;
} big_pair;

static void big_open(big_pair* b, uint64_t comm_id, size_t big, bool dmabuf) {
  pair_open_ex(&b->p, comm_id, fake_prof);
  b->big = big;
  b->src = malloc(big);
  b->got = malloc(big);
  for (size_t i = 0; i < big / 4; i++) b->src[i] = (float)(i % 1021) * 0.125f - 60.0f;
  b->s = (endpoint){.size = big, .device = true, .buf = dev_from(b->src, big)};
  b->r = (endpoint){.size = big, .device = true};
  assert_int_equal(cudaMalloc(&b->r.buf, big), cudaSuccess);
  if (dmabuf) {
    ep_reg_dmabuf(b->p.send, &b->s);
    ep_reg_dmabuf(b->p.recv, &b->r);
  } else {
    ep_reg(b->p.send, &b->s);
    ep_reg(b->p.recv, &b->r);
  }
}

static void big_close(big_pair* b) {
  assert_int_equal(agoq_net_dereg_mr(b->p.send, b->s.mh), ncclSuccess);
  assert_int_equal(agoq_net_dereg_mr(b->p.recv, b->r.mh), ncclSuccess);
  pair_close(&b->p);
  cudaFree(b->s.buf);
  cudaFree(b->r.buf);
  free(b->src);
  free(b->got);
}

/* Typed fp32 through a pair of big buffers: the whole buffer goes exact (a frame's slot
 * must fit the staging: exact_nogain); 1 MiB goes as an int8 frame into the large
 * receive, lands in the staging and is decoded there by the GPU. */
static void typed_beyond_the_staging(big_pair* b) {
  agoq_comm* sc = (agoq_comm*)b->p.send;
  agoq_comm* rc = (agoq_comm*)b->p.recv;
  const agoq_gpu_link_stats* rst = agoq_gpu_link_stats_get(rc->gpu);
  size_t small = 1u << 20;
  fake_step step = step_of(AGOQ_XFER_P2P, ncclFloat32, AGOQ_XFER_PROTO_SIMPLE, 1);
  uint64_t frames0 = sc->typed_stats.frames;
  uint64_t nogain0 = agoq_stats_get(&sc->st->exact[AGOQ_EXACT_NOGAIN]);
  assert_int_equal(cudaMemset(b->r.buf, 0, b->big), cudaSuccess);
  assert_int_equal(transfer(&b->p, &b->s, &b->r, b->big, &step), (int)b->big);
  assert_int_equal(sc->typed_stats.frames, frames0);
  assert_int_equal(agoq_stats_get(&sc->st->exact[AGOQ_EXACT_NOGAIN]), nogain0 + 1);
  dev_to(b->got, b->r.buf, b->big);
  assert_memory_equal(b->got, b->src, b->big);

  uint64_t decodes0 = rst->decodes;
  assert_int_equal(cudaMemset(b->r.buf, 0, b->big), cudaSuccess);
  assert_int_equal(transfer(&b->p, &b->s, &b->r, small, &step), (int)small);
  assert_int_equal(sc->typed_stats.frames, frames0 + 1);
  assert_int_equal(rst->decodes, decodes0 + 1);
  dev_to(b->got, b->r.buf, small);
  assert_int8_close(b->got, b->src, small);
  assert_int_equal(agoq_gpu_ring_live(agoq_gpu_link_ring(rc->gpu)), 0); /* the staging went back */
}

/* By GPUDirect RDMA (a transport that registers dma-bufs: the verbs emulator, net_device.ib),
 * messages far beyond the staging (AGOQ_GPU_STAGING, 8 MiB): NCCL sends up to 1 GiB per isend
 * from registered buffers. An exact 32 MiB message takes no staging and no copy; a typed one
 * that large goes exact by GPUDirect (a frame's slot must hold the payload); a typed 1 MiB
 * frame into a 32 MiB receive takes its staging when it arrives, and is decoded on the GPU. */
static void test_gpudirect_beyond_the_staging(void** state) {
  (void)state;
  const char* tp = getenv("AGOQ_TRANSPORT");
  if (tp == NULL || strcmp(tp, "ib") != 0) skip(); /* TCP registers no dma-buf */
  big_pair b;
  size_t big = 32u << 20;
  big_open(&b, COMM_ID + 10, big, true);
  pair p = b.p;
  float* src = b.src;
  uint8_t* got = b.got;
  endpoint s = b.s, r = b.r;
  agoq_comm* sc = (agoq_comm*)p.send;
  agoq_comm* rc = (agoq_comm*)p.recv;
  const agoq_gpu_link_stats* sst = agoq_gpu_link_stats_get(sc->gpu);
  const agoq_gpu_link_stats* rst = agoq_gpu_link_stats_get(rc->gpu);

  assert_int_equal(transfer(&p, &s, &r, big, NULL), (int)big);
  assert_int_equal(sst->d2h_bytes + sst->h2d_bytes + rst->d2h_bytes + rst->h2d_bytes, 0);
  dev_to(got, r.buf, big);
  assert_memory_equal(got, src, big);

  typed_beyond_the_staging(&b);

  big_close(&b);
}

/* Staged device messages far beyond the staging (AGOQ_GPU_STAGING, 8 MiB): registered
 * buffers over TCP (nccl-tests -R: "a device message of 16777216 bytes exceeds the
 * connection's staging" on an H200, 2026-12-04). They pass through a host bounce buffer in
 * pieces of half the staging: exact and bit-equal at any size, a typed one that large goes
 * exact, a frame into a large receive is decoded from the staging, a shorter message than
 * posted reports its size, and a second such send on the connection waits for the first.
 * Over verbs without DMA-BUF (net_device.ib) the same, the bounce buffer registered with the
 * NIC for its message (it was refused there, naming AGOQ_GPU_STAGING). */
static void test_staged_beyond_the_staging(void** state) {
  (void)state;
  size_t staging = (size_t)agoq_param_int(AGOQ_PARAM_GPU_STAGING);
  size_t big = 3 * staging + 12348, odd = staging + staging / 2 + 4;
  big_pair b;
  big_open(&b, COMM_ID + 11, big, false);
  pair p = b.p;
  float* src = b.src;
  uint8_t* got = b.got;
  endpoint s = b.s, r = b.r;
  const char* tp = getenv("AGOQ_TRANSPORT");
  const bool ib = tp != NULL && strcmp(tp, "ib") == 0;
  agoq_comm* sc = (agoq_comm*)p.send;
  agoq_comm* rc = (agoq_comm*)p.recv;
  const agoq_gpu_link_stats* sst = agoq_gpu_link_stats_get(sc->gpu);
  const agoq_gpu_link_stats* rst = agoq_gpu_link_stats_get(rc->gpu);

  /* Exact: every byte once across PCIe at each end, in pieces, none beyond the staging. */
  uint8_t* landed = malloc(big);
  uint64_t d2h0 = sst->d2h_bytes, h2d0 = rst->h2d_bytes, d2hc0 = sst->d2h_copies, h2dc0 = rst->h2d_copies;
  assert_int_equal(transfer_peek(&p, &s, &r, big, NULL, landed), (int)big);
  assert_memory_equal(landed, src, big); /* in NCCL's buffer when test said done */
  assert_int_equal(sst->d2h_bytes - d2h0, big);
  assert_int_equal(rst->h2d_bytes - h2d0, big);
  assert_int_equal(sst->d2h_copies - d2hc0, 7); /* pieces of staging/2: 3 * 2 + 1 */
  assert_int_equal(rst->h2d_copies - h2dc0, 7);
  /* A bounce buffer each side, registered for the message over verbs only. */
  assert_int_equal(sc->bounce_regs, ib ? 1 : 0);
  assert_int_equal(rc->bounce_regs, ib ? 1 : 0);
  assert_int_equal(sc->bounce_reqs, 0);
  assert_int_equal(rc->bounce_reqs, 0);
  assert_int_equal(agoq_gpu_ring_live(agoq_gpu_link_ring(sc->gpu)), 0);
  assert_int_equal(agoq_gpu_ring_live(agoq_gpu_link_ring(rc->gpu)), 0);

  /* Shorter than posted: the size that came. */
  assert_int_equal(cudaMemset(r.buf, 0, big), cudaSuccess);
  assert_int_equal(transfer(&p, &s, &r, odd, NULL), (int)odd);
  dev_to(got, r.buf, big);
  assert_memory_equal(got, src, odd);
  for (size_t i = odd; i < big; i++) assert_int_equal(got[i], 0);

  typed_beyond_the_staging(&b);
  assert_int_equal(rc->bounce_reqs, 0);

  /* One bounce buffer per connection: the second large send waits (NULL: NCCL retries),
   * then goes once the first is done; both arrive whole and in order. */
  void *s1 = NULL, *s2 = NULL, *r1 = NULL, *r2 = NULL;
  int tag = 3;
  assert_int_equal(agoq_net_isend(p.send, s.buf, big, tag, s.mh, NULL, &s1), ncclSuccess);
  assert_non_null(s1);
  assert_int_equal(agoq_net_isend(p.send, s.buf, odd, tag, s.mh, NULL, &s2), ncclSuccess);
  assert_null(s2);
  assert_int_equal(sc->bounce_reqs, 1);
  assert_int_equal(agoq_net_irecv(p.recv, 1, &r.buf, &r.size, &tag, &r.mh, NULL, &r1), ncclSuccess);
  assert_non_null(r1);
  assert_int_equal(agoq_net_irecv(p.recv, 1, &r.buf, &r.size, &tag, &r.mh, NULL, &r2), ncclSuccess);
  assert_null(r2);
  int d1 = 0, n1 = -1, e1 = 0, m1 = -1;
  double deadline = now_s() + 30;
  while ((!d1 || !e1) && now_s() < deadline) {
    if (!d1) assert_int_equal(agoq_net_test(s1, &d1, &n1), ncclSuccess);
    if (!e1) assert_int_equal(agoq_net_test(r1, &e1, &m1), ncclSuccess);
  }
  assert_true(d1 && e1);
  assert_int_equal(m1, (int)big);
  assert_int_equal(sc->bounce_reqs, 0);
  assert_int_equal(rc->bounce_reqs, 0);
  assert_int_equal(transfer(&p, &s, &r, odd, NULL), (int)odd);

  free(landed);
  big_close(&b);
}

/* What one connection's GPU link holds (issue 27 item 8): an event per request slot (256)
 * and timing pairs for NCCL's requests in flight twice over (2 x 32 pairs), 384 events; it
 * held 4,352 (a pair per slot and codec part). All of it goes back at close. */
static void test_link_resources(void** state) {
  (void)state;
  agoq_emu_counters c0, c1, c2;
  agoq_emu_counters_get(&c0);
  pair p;
  pair_open_ex(&p, COMM_ID + 13, NULL);
  endpoint s = {.size = 4096, .device = true}, r = {.size = 4096, .device = true};
  assert_int_equal(cudaMalloc(&s.buf, s.size), cudaSuccess);
  assert_int_equal(cudaMalloc(&r.buf, r.size), cudaSuccess);
  ep_reg(p.send, &s);
  ep_reg(p.recv, &r);
  agoq_emu_counters_get(&c1);
  assert_int_equal(c1.live_events - c0.live_events, 2 * (AGOQ_REQUESTS_PER_COMM + 2 * 2 * NCCL_NET_MAX_REQUESTS));
  assert_int_equal(c1.live_events - c0.live_events, 2 * 384);
  assert_int_equal(agoq_net_dereg_mr(p.send, s.mh), ncclSuccess);
  assert_int_equal(agoq_net_dereg_mr(p.recv, r.mh), ncclSuccess);
  pair_close(&p);
  cudaFree(s.buf);
  cudaFree(r.buf);
  agoq_emu_counters_get(&c2);
  assert_int_equal(c2.live_events, c0.live_events);
  assert_int_equal(c2.pinned_allocs, c0.pinned_allocs);
}

/* An 8-GPU node's worth of connections on one GPU: 128 links (64 pairs) in one process. The
 * pinned memory the emulation counts stays within 128 MiB (AGOQ_GPU_PINNED_MAX; a whole
 * AGOQ_GPU_STAGING per link pinned 1 GiB), every link still moves messages larger than its
 * own share with more of them in flight than the pool holds (the rest pass in pieces through
 * the shares and a host bounce buffer, over verbs registered for its message), bit-exact, and
 * closing the last link frees it all. Over TCP and verbs (net_device.ib): there the pool's
 * chunks are registered with the NIC at setup. */
static void test_pinned_memory_with_128_links(void** state) {
  (void)state;
  enum { PAIRS = 64 };
  const char* tp = getenv("AGOQ_TRANSPORT");
  const bool ib = tp != NULL && strcmp(tp, "ib") == 0;
  const size_t msg = 1u << 20; /* above a share (256 KiB), within a chunk (8 MiB) */
  /* The pool serves connections without typed p2p (this binary turns it on in main; a net
   * init loads it again, so it is turned off after each). */
  const int typed = agoq_typed.format;
  agoq_emu_counters c0, c1, c2;
  agoq_emu_counters_get(&c0);
  pair* p = calloc(PAIRS, sizeof *p);
  endpoint* s = calloc(PAIRS, sizeof *s);
  endpoint* r = calloc(PAIRS, sizeof *r);
  uint8_t* src = malloc(msg);
  uint8_t* got = malloc(msg);
  fill(src, msg, 128);
  void* sbuf = dev_from(src, msg);
  for (int i = 0; i < PAIRS; i++) {
    pair_open_ex(&p[i], COMM_ID + 100 + (uint64_t)i, NULL);
    agoq_typed.format = AGOQ_FORMAT_NONE;
    s[i] = (endpoint){.buf = sbuf, .size = msg, .device = true};
    r[i] = (endpoint){.size = msg, .device = true};
    assert_int_equal(cudaMalloc(&r[i].buf, msg), cudaSuccess);
    ep_reg(p[i].send, &s[i]);
    ep_reg(p[i].recv, &r[i]);
  }
  agoq_emu_counters_get(&c1);
  agoq_gpu_pool_stats ps;
  agoq_gpu_pool_stats_get(0, &ps);
  unsigned long long pinned = c1.pinned_bytes - c0.pinned_bytes;
  unsigned long long cap = (unsigned long long)agoq_param_int(AGOQ_PARAM_GPU_PINNED_MAX);
  unsigned long long staging = (unsigned long long)agoq_param_int(AGOQ_PARAM_GPU_STAGING);
  /* The pool off (AGOQ_GPU_PINNED_MAX=0): a whole staging per link, as over verbs. */
  bool pooled = cap > 0;
  assert_int_equal(ps.links, pooled ? 2 * PAIRS : 0);
  if (!pooled) assert_true(pinned >= 2 * PAIRS * staging);
  if (pooled) {
    assert_int_equal(pinned, ps.pinned_bytes); /* the pool's count is the emulation's */
    assert_true(pinned <= cap);
    assert_true(ps.chunks >= 1 && ps.chunks * staging + 2 * PAIRS * (staging / 32) <= cap);
  }
  print_message("128 links on one GPU: %llu bytes pinned (%u pool chunks of AGOQ_GPU_STAGING and the links' own)\n",
                pinned, ps.chunks);
  if (pooled) {
    /* Over verbs a piece is registered with the connection's NIC already (at setup). */
    agoq_comm* c = (agoq_comm*)p[0].send;
    agoq_gpu_pool* pool = agoq_gpu_link_pool(c->gpu);
    agoq_gpu_pool_piece piece = {.chunk = -1};
    assert_true(agoq_gpu_pool_get(pool, msg, &piece));
    assert_true((agoq_gpu_pool_key(pool, &piece, c->dev) != NULL) == ib);
    agoq_gpu_pool_put(pool, &piece);
  }
  /* Every receive, then every send, posted before any completes: 128 MiB asked of a pool of
   * about 88 MiB. */
  void *sreq[PAIRS] = {0}, *rreq[PAIRS] = {0};
  int tag = 9;
  double deadline = now_s() + 120;
  for (int i = 0; i < PAIRS; i++)
    while (rreq[i] == NULL && now_s() < deadline)
      assert_int_equal(agoq_net_irecv(p[i].recv, 1, &r[i].buf, &r[i].size, &tag, &r[i].mh, NULL, &rreq[i]),
                       ncclSuccess);
  for (int i = 0; i < PAIRS; i++)
    while (sreq[i] == NULL && now_s() < deadline)
      assert_int_equal(agoq_net_isend(p[i].send, sbuf, msg, tag, s[i].mh, NULL, &sreq[i]), ncclSuccess);
  agoq_gpu_pool_stats_get(0, &ps);
  /* The pool ran out (it holds less than the 128 MiB asked): some went through their shares
   * and a bounce buffer each, registered for the message over verbs, never over TCP. */
  uint64_t bounce_regs = 0;
  for (int i = 0; i < PAIRS; i++)
    bounce_regs += ((agoq_comm*)p[i].send)->bounce_regs + ((agoq_comm*)p[i].recv)->bounce_regs;
  if (pooled && ps.chunks * staging < 2 * PAIRS * msg) {
    assert_true(ps.refusals > 0);
    if (ib) assert_true(bounce_regs > 0);
  }
  if (!ib) assert_int_equal(bounce_regs, 0);
  int left = 2 * PAIRS;
  int sdone[PAIRS] = {0}, rdone[PAIRS] = {0};
  while (left > 0 && now_s() < deadline) {
    for (int i = 0; i < PAIRS; i++) {
      int size = -1;
      if (!sdone[i]) {
        assert_int_equal(agoq_net_test(sreq[i], &sdone[i], NULL), ncclSuccess);
        left -= sdone[i];
      }
      if (!rdone[i]) {
        assert_int_equal(agoq_net_test(rreq[i], &rdone[i], &size), ncclSuccess);
        if (rdone[i]) assert_int_equal(size, (int)msg);
        left -= rdone[i];
      }
    }
  }
  assert_int_equal(left, 0);
  for (int i = 0; i < PAIRS; i++) {
    dev_to(got, r[i].buf, msg);
    assert_memory_equal(got, src, msg);
  }
  agoq_gpu_pool_stats_get(0, &ps);
  assert_int_equal(ps.borrowed_bytes, 0);
  if (pooled) {
    /* A receive NCCL never sees complete (an abort) holds a piece until its connection
     * closes, and gives it back then for the others. */
    void* req = NULL;
    while (req == NULL && now_s() < deadline)
      assert_int_equal(agoq_net_irecv(p[0].recv, 1, &r[0].buf, &r[0].size, &tag, &r[0].mh, NULL, &req), ncclSuccess);
    agoq_gpu_pool_stats_get(0, &ps);
    assert_true(ps.borrowed_bytes >= msg);
    assert_int_equal(agoq_net_dereg_mr(p[0].recv, r[0].mh), ncclSuccess);
    assert_int_equal(agoq_net_close_recv(p[0].recv), ncclSuccess);
    agoq_gpu_pool_stats_get(0, &ps);
    assert_int_equal(ps.borrowed_bytes, 0);
    assert_int_equal(ps.links, 2 * PAIRS - 1);
    p[0].recv = NULL;
  }
  for (int i = 0; i < PAIRS; i++) {
    assert_int_equal(agoq_net_dereg_mr(p[i].send, s[i].mh), ncclSuccess);
    if (p[i].recv != NULL) {
      assert_int_equal(agoq_net_dereg_mr(p[i].recv, r[i].mh), ncclSuccess);
      pair_close(&p[i]);
    } else {
      assert_int_equal(agoq_net_close_send(p[i].send), ncclSuccess);
      assert_int_equal(agoq_net_close_listen(p[i].listen), ncclSuccess);
      assert_int_equal(agoq_net_finalize(p[i].ctx), ncclSuccess);
    }
    cudaFree(r[i].buf);
  }
  cudaFree(sbuf);
  agoq_emu_counters_get(&c2);
  assert_int_equal(c2.pinned_bytes, c0.pinned_bytes);
  agoq_gpu_pool_stats_get(0, &ps);
  assert_int_equal(ps.links, 0);
  /* Typed p2p on: whether a message is a frame must not depend on the pool's state, so the
   * link keeps a whole staging and joins no pool. */
  pair_open_ex(&p[0], COMM_ID + 99, NULL);
  agoq_typed.format = typed == AGOQ_FORMAT_NONE ? AGOQ_FORMAT_INT8 : typed;
  r[0] = (endpoint){.size = msg, .device = true};
  assert_int_equal(cudaMalloc(&r[0].buf, msg), cudaSuccess);
  ep_reg(p[0].recv, &r[0]);
  agoq_gpu_pool_stats_get(0, &ps);
  assert_int_equal(ps.links, 0);
  assert_int_equal(agoq_gpu_link_ring(((agoq_comm*)p[0].recv)->gpu)->size, staging / AGOQ_GPU_RING_ALIGN * AGOQ_GPU_RING_ALIGN);
  assert_int_equal(agoq_net_dereg_mr(p[0].recv, r[0].mh), ncclSuccess);
  pair_close(&p[0]);
  cudaFree(r[0].buf);
  agoq_typed.format = typed;
  free(p);
  free(s);
  free(r);
  free(src);
  free(got);
}

/* One message into a device buffer NCCL's kernel polls (LL/LL128: irecv's *request preset to
 * NCCL_NET_OPTIONAL_RECV_COMPLETION) or does not (SIMPLE). The emulation watches the buffer as
 * LL128 lines and counts each line one copy wrote both the data and the flag word of (its
 * writes inside a line may land in any order). Returns that count. */
static unsigned long long polled_transfer(pair* p, endpoint* s, endpoint* r, const uint8_t* src, bool polled) {
  agoq_emu_counters c0, c1;
  assert_int_equal(cudaMemset(r->buf, 0, r->size), cudaSuccess);
  agoq_emu_watch_ll128(r->buf, r->size);
  agoq_emu_counters_get(&c0);
  void *sreq = NULL, *rreq = NULL;
  int tag = 5;
  double deadline = now_s() + 30;
  while (rreq == NULL && now_s() < deadline) {
    rreq = polled ? (void*)(uintptr_t)NCCL_NET_OPTIONAL_RECV_COMPLETION : NULL;
    assert_int_equal(agoq_net_irecv(p->recv, 1, &r->buf, &r->size, &tag, &r->mh, NULL, &rreq), ncclSuccess);
  }
  while (sreq == NULL && now_s() < deadline)
    assert_int_equal(agoq_net_isend(p->send, s->buf, s->size, tag, s->mh, NULL, &sreq), ncclSuccess);
  int sdone = 0, rdone = 0, size = -1;
  uint8_t* landed = malloc(r->size);
  while ((!sdone || !rdone) && now_s() < deadline) {
    if (!sdone) assert_int_equal(agoq_net_test(sreq, &sdone, NULL), ncclSuccess);
    if (!rdone) {
      assert_int_equal(agoq_net_test(rreq, &rdone, &size), ncclSuccess);
      if (rdone) assert_int_equal(agoq_emu_peek(landed, r->buf, r->size), 0);
    }
  }
  assert_true(sdone && rdone);
  assert_int_equal(size, (int)r->size);
  assert_memory_equal(landed, src, r->size);
  agoq_emu_counters_get(&c1);
  agoq_emu_watch_ll128(NULL, 0);
  free(landed);
  return c1.ll128_flag_early - c0.ll128_flag_early;
}

/* LL/LL128 receives in device memory: NCCL's kernel polls each 128-byte line's flag word
 * without waiting for the receive, so a staged receive lands every flag after its line's
 * data (head and tail lines partial: the buffer starts 40 bytes into a line). A SIMPLE
 * receive, read only after test() says done, is one copy, which the emulation reports as
 * torn lines: the check is live. */
static void test_polled_receive_lands_flags_last(void** state) {
  (void)state;
  pair p;
  pair_open_ex(&p, COMM_ID + 12, NULL);
  size_t n = 65536 + 77, off = 40;
  uint8_t* src = malloc(n);
  for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(i * 31 + 7);
  endpoint s = {.size = n, .device = true, .buf = dev_from(src, n)};
  void* base = NULL;
  assert_int_equal(cudaMalloc(&base, n + off), cudaSuccess);
  endpoint r = {.size = n, .device = true, .buf = (uint8_t*)base + off};
  ep_reg(p.send, &s);
  ep_reg(p.recv, &r);
  assert_int_equal(polled_transfer(&p, &s, &r, src, true), 0);
  assert_true(polled_transfer(&p, &s, &r, src, false) >= n / 128 - 1);
  assert_int_equal(agoq_net_dereg_mr(p.send, s.mh), ncclSuccess);
  assert_int_equal(agoq_net_dereg_mr(p.recv, r.mh), ncclSuccess);
  pair_close(&p);
  cudaFree(s.buf);
  cudaFree(base);
  free(src);
}

int main(void) {
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  setenv("AGOQ_SOCKET_FAMILY", "ipv4", 1);
  setenv("AGOQ_P2P_FORMAT", "int8", 1);
  setenv("AGOQ_MIN_BYTES", "64K", 1);
  setenv("AGOQ_STATS", "1", 1);
  setenv("AGOQ_STATS_FILE", "/dev/null", 1);
  const char* mode = getenv("AGOQ_GPU");
  if (mode == NULL || strcmp(mode, "off") == 0 || strcmp(mode, "auto") == 0) {
    const struct CMUnitTest off[] = {cmocka_unit_test(test_off_refuses_device_memory)};
    return cmocka_run_group_tests(off, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backend_is_the_emulation),
      cmocka_unit_test(test_start_failure_reason),
      cmocka_unit_test(test_exact_every_memory_pair),
      cmocka_unit_test(test_inflight_in_order),
      cmocka_unit_test(test_host_send_after_staged_device_send),
      cmocka_unit_test(test_typed_bits_equal_host_path),
      cmocka_unit_test(test_typed_matrix_equals_host_path),
      cmocka_unit_test(test_typed_nan_block_decoded_on_gpu),
      cmocka_unit_test(test_typed_tiny_goes_exact),
      cmocka_unit_test(test_typed_misaligned_goes_exact),
      cmocka_unit_test(test_bad_device_buffers),
      cmocka_unit_test(test_link_setup_during_global_capture),
      cmocka_unit_test(test_link_on_another_device_leaves_the_callers),
      cmocka_unit_test_teardown(test_link_in_a_private_context, primary_context_again),
      cmocka_unit_test(test_gpudirect_beyond_the_staging),
      cmocka_unit_test(test_staged_beyond_the_staging),
      cmocka_unit_test(test_polled_receive_lands_flags_last),
      cmocka_unit_test(test_link_resources),
      cmocka_unit_test(test_pinned_memory_with_128_links),
  };
  /* net_device.ib runs only the tests about a verbs transport (tests/ib/CMakeLists.txt); not an
   * AGOQ_* name, which the plugin would warn about as an unknown setting. */
  const char* only = getenv("CMOCKA_ONLY_TEST");
  if (only != NULL) cmocka_set_test_filter(only);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
