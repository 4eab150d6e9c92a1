/* CollNet on device buffers (NCCL_PTR_CUDA) in one process, over the CUDA emulation
 * (kernels/cuda/emu): its device memory faults when host code touches it, its copies run
 * only when their event or stream is queried, and it counts legacy-stream work,
 * synchronous calls and allocations. Every call runs twice on one group with the same
 * inputs, from and into host memory, then with some or all buffers in device memory: the
 * bits must be equal (test_collnet checks the host path against the references). When
 * test() says done, the result must already be in the device buffer (peeked without running
 * queued work) and nothing past it written; the data path must queue nothing on the legacy
 * stream, make no synchronous call and allocate nothing.
 *
 * Quantized calls whose buffers are all in device memory are reduced on the GPU
 * (agoq_coll_gpu.c; each case says which calls must be): they must move only frames across
 * PCIe.
 *
 * Run four times by CTest: with AGOQ_GPU=on (the emulated device found), with that and
 * AGOQ_COLLNET_GPU=0 (every device call staged and reduced on the CPU), and with AGOQ_GPU=off
 * or unset (auto keeps the path off), where device memory must be refused. */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "collnet/agoq_coll_internal.h"
#include "collnet/agoq_collnet.h"
#include "core/agoq_log.h"
#include "core/agoq_params.h"
#include "gpu/agoq_gpu.h"

#define COMM_ID 0xc011dede00000001ull
#define MAXR 4
#define CANARY 64 /* bytes past every receive buffer that must stay 0xa5 */
#define MAXCALLS 8

#include "collnet_group.h"

/* ---- one call, described ---------------------------------------------------------------- */

typedef enum { CK_AR = 0, CK_RS, CK_AG } ckind;

/* Bit i of `in` / `out` puts part i of the input / output in device memory (a single buffer
 * is part 0). Reducescatter's input and allgather's output are split into nparts parts. */
typedef struct {
  ckind kind;
  int type, op;
  size_t count;       /* allreduce: elements */
  size_t bpr, wo, wb; /* reducescatter/allgather: the window, in bytes */
  int nparts;
  unsigned in, out;
  bool gpu; /* expected reduced on the GPU in the device run (quantized, every buffer there) */
  size_t nan_at; /* nonzero: rank 0's input element nan_at - 1 is a NaN (its block travels raw) */
  size_t nan_every; /* nonzero: every rank's input elements 0, nan_every, 2 nan_every, ... are NaNs */
} ccase;

static const char* kind_name(ckind k) { return k == CK_AR ? "allreduce" : k == CK_RS ? "reducescatter" : "allgather"; }

/* This rank's bytes of the window; *lo = where they start in the ranks' concatenation. */
static size_t window_mine(const ccase* c, int r, size_t* lo) {
  size_t mb = (size_t)r * c->bpr, me = mb + c->bpr;
  size_t a = c->wo > mb ? c->wo : mb, b = c->wo + c->wb < me ? c->wo + c->wb : me;
  *lo = a;
  return b > a ? b - a : 0;
}

static size_t in_bytes(const ccase* c, int r) {
  size_t lo;
  if (c->kind == CK_AR) return c->count * agoq_coll_type_size(c->type);
  return c->kind == CK_RS ? c->wb : window_mine(c, r, &lo);
}

static size_t out_bytes(const ccase* c, int r) {
  size_t lo;
  if (c->kind == CK_AR) return c->count * agoq_coll_type_size(c->type);
  return c->kind == CK_RS ? window_mine(c, r, &lo) : c->wb;
}

/* The parts of one side of `total` bytes: returns how many, with their offsets and sizes. */
static int side_parts(const ccase* c, bool input, size_t total, size_t* off, size_t* len) {
  bool parted = (c->kind == CK_RS && input) || (c->kind == CK_AG && !input);
  size_t e = c->kind == CK_RS ? agoq_coll_type_size(c->type) : 1;
  size_t split = parted && c->nparts == 2 ? total / 3 / e * e : total;
  off[0] = 0;
  len[0] = split;
  off[1] = split;
  len[1] = total - split;
  return parted ? c->nparts : 1;
}

/* Values of the type: floats in [-4, 4) (bf16 truncated from fp32), other types random bits. */
static void fill_values(int t, uint8_t* p, size_t bytes, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t e = agoq_coll_type_size(t);
  for (size_t i = 0; i + e <= bytes; i += e) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    float v = (float)((double)(s >> 40) * 0x1p-24 * 8.0 - 4.0);
    uint32_t u;
    memcpy(&u, &v, 4);
    uint16_t h = (uint16_t)(u >> 16);
    if (t == ncclFloat32) memcpy(p + i, &v, 4);
    else if (t == ncclBfloat16) memcpy(p + i, &h, 2);
    else memcpy(p + i, &s, e);
  }
}

/* ---- one call on every rank of a group ---------------------------------------------------- */

typedef struct {
  size_t in_n, out_n;
  uint8_t* in_h;   /* the input */
  uint8_t* out_h;  /* host receive buffer, out_n + CANARY bytes */
  void* in_d;      /* device twins: NULL where no part is in device memory */
  void* out_d;
  void* mh[4];     /* registrations: input host / device, output host / device */
  uint8_t* landed; /* the device receive buffer as it was when test() said done */
  void* req;
  int size;        /* what test() reported */
  bool gpu;        /* the plugin reduced it on the GPU (agoq_coll_gpu.c), nothing staged */
} rank_call;

typedef struct {
  const ccase* c;
  group* g;
  unsigned in, out; /* device parts of this run (0 for the host run) */
  rank_call rk[MAXR];
} call;

static void* dev_alloc_from(const void* host, size_t n) {
  void* d = NULL;
  assert_int_equal(cudaMalloc(&d, n ? n : 1), cudaSuccess);
  if (n > 0) assert_int_equal(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

static void reg(group* g, int r, void* p, size_t n, int type, void** mh) {
  assert_int_equal(agoq_coll_reg_mr(g->comm[r], p, n ? n : 1, type, mh), ncclSuccess);
}

static void call_prepare(call* k, group* g, const ccase* c, uint64_t seed, bool device) {
  memset(k, 0, sizeof *k);
  k->c = c;
  k->g = g;
  k->in = device ? c->in : 0;
  k->out = device ? c->out : 0;
  for (int r = 0; r < g->n; r++) {
    rank_call* rc = &k->rk[r];
    rc->in_n = in_bytes(c, r);
    rc->out_n = out_bytes(c, r);
    rc->in_h = malloc(rc->in_n + 1);
    rc->out_h = malloc(rc->out_n + CANARY);
    rc->landed = malloc(rc->out_n + CANARY);
    assert_true(rc->in_h != NULL && rc->out_h != NULL && rc->landed != NULL);
    fill_values(c->type, rc->in_h, rc->in_n, seed * 131 + (uint64_t)r);
    if (c->nan_at != 0 && r == 0) {
      size_t e = agoq_coll_type_size(c->type);
      assert_true(c->nan_at * e <= rc->in_n);
      memset(rc->in_h + (c->nan_at - 1) * e, 0xff, e); /* all ones: a NaN in fp32, bf16 and fp16 */
    }
    if (c->nan_every != 0) {
      size_t e = agoq_coll_type_size(c->type);
      for (size_t i = 0; i * e < rc->in_n; i += c->nan_every) memset(rc->in_h + i * e, 0xff, e);
    }
    memset(rc->out_h, 0xa5, rc->out_n + CANARY);
    reg(g, r, rc->in_h, rc->in_n, NCCL_PTR_HOST, &rc->mh[0]);
    reg(g, r, rc->out_h, rc->out_n + CANARY, NCCL_PTR_HOST, &rc->mh[2]);
    if (k->in != 0) {
      rc->in_d = dev_alloc_from(rc->in_h, rc->in_n);
      reg(g, r, rc->in_d, rc->in_n, NCCL_PTR_CUDA, &rc->mh[1]);
    }
    if (k->out != 0) {
      rc->out_d = dev_alloc_from(rc->out_h, rc->out_n + CANARY);
      reg(g, r, rc->out_d, rc->out_n + CANARY, NCCL_PTR_CUDA, &rc->mh[3]);
    }
  }
}

/* Part `part` of a side: in device memory or in host memory, with its registration. */
static uint8_t* side_ptr(const call* k, rank_call* rc, bool input, int part, void** mh) {
  bool dev = ((input ? k->in : k->out) >> part) & 1u;
  *mh = rc->mh[(input ? 0 : 2) + (dev ? 1 : 0)];
  if (input) return dev ? rc->in_d : rc->in_h;
  return dev ? rc->out_d : rc->out_h;
}

static ncclResult_t call_post_rank(call* k, int r) {
  const ccase* c = k->c;
  rank_call* rc = &k->rk[r];
  void* comm = k->g->comm[r];
  void *smh, *rmh;
  size_t off[2], len[2];
  agoq_coll_sge parts[2];
  if (c->kind == CK_AR) {
    uint8_t* send = side_ptr(k, rc, true, 0, &smh);
    uint8_t* recv = side_ptr(k, rc, false, 0, &rmh);
    return agoq_coll_iallreduce(comm, send, recv, c->count, c->type, c->op, smh, rmh, &rc->req);
  }
  bool input = c->kind == CK_RS;
  int n = side_parts(c, input, input ? rc->in_n : rc->out_n, off, len);
  for (int i = 0; i < n; i++) {
    uint8_t* base = side_ptr(k, rc, input, i, &parts[i].mhandle);
    parts[i].address = base + off[i];
    parts[i].size = len[i];
  }
  if (c->kind == CK_RS) {
    uint8_t* recv = side_ptr(k, rc, false, 0, &rmh);
    return agoq_coll_ireducescatter(comm, n, parts, recv, c->bpr, c->wo, c->wb, c->type, c->op, rmh, &rc->req);
  }
  uint8_t* send = side_ptr(k, rc, true, 0, &smh);
  return agoq_coll_iallgather(comm, send, n, parts, c->bpr, c->wo, c->wb, smh, &rc->req);
}

static void call_post(call* k) {
  for (int r = 0; r < k->g->n; r++) {
    double deadline = now_s() + 10;
    k->rk[r].req = NULL;
    while (k->rk[r].req == NULL) {
      assert_int_equal(call_post_rank(k, r), ncclSuccess);
      assert_true(now_s() < deadline);
    }
    /* Read before any test(): the request is the plugin's until then. */
    k->rk[r].gpu = ((const agoq_coll_req*)k->rk[r].req)->gpu;
  }
}

typedef struct {
  call** ks;
  int n; /* ranks per call */
} wait_ctx;

/* Right when test() says done: the device receive buffer as it is, nothing run for it. */
static void on_done(int i, void* arg) {
  wait_ctx* w = arg;
  call* k = w->ks[i / w->n];
  rank_call* rc = &k->rk[i % w->n];
  if (rc->out_d != NULL) assert_int_equal(agoq_emu_peek(rc->landed, rc->out_d, rc->out_n + CANARY), 0);
}

static void calls_wait(call** ks, int nk) {
  int n = ks[0]->g->n;
  void* reqs[MAXCALLS * MAXR];
  int sizes[MAXCALLS * MAXR];
  for (int q = 0; q < nk; q++)
    for (int r = 0; r < n; r++) reqs[q * n + r] = ks[q]->rk[r].req;
  wait_ctx w = {ks, n};
  wait_all_cb(reqs, nk * n, sizes, NULL, 60, on_done, &w);
  for (int q = 0; q < nk; q++)
    for (int r = 0; r < n; r++) assert_int_equal(sizes[q * n + r], (int)ks[q]->rk[r].out_n);
}

static void assert_canary(const uint8_t* p, size_t n, const char* where) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0xa5) fail_msg("%s: byte %zu written (0x%02x)", where, i, p[i]);
}

/* Rank r's result (out_n bytes) from wherever its parts landed. Checks that each device
 * part was in place when test() said done, and that no buffer was written outside its
 * parts. */
static void call_collect(call* k, int r, uint8_t* result) {
  rank_call* rc = &k->rk[r];
  uint8_t* dv = NULL;
  if (rc->out_d != NULL) {
    dv = malloc(rc->out_n + CANARY);
    assert_non_null(dv);
    assert_int_equal(cudaMemcpy(dv, rc->out_d, rc->out_n + CANARY, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  size_t off[2], len[2];
  int n = side_parts(k->c, false, rc->out_n, off, len);
  for (int i = 0; i < n; i++) {
    bool dev = (k->out >> i) & 1u;
    memcpy(result + off[i], (dev ? dv : rc->out_h) + off[i], len[i]);
    if (dev && memcmp(rc->landed + off[i], dv + off[i], len[i]) != 0)
      fail_msg("%s rank %d part %d: test() said done before the result was in the device buffer", kind_name(k->c->kind),
               r, i);
    const uint8_t* other = dev ? rc->out_h : dv;
    if (other != NULL) assert_canary(other + off[i], len[i], "the other receive buffer");
  }
  assert_canary(rc->out_h + rc->out_n, CANARY, "past the host receive buffer");
  if (dv != NULL) assert_canary(dv + rc->out_n, CANARY, "past the device receive buffer");
  free(dv);
}

static void call_release(call* k) {
  for (int r = 0; r < k->g->n; r++) {
    rank_call* rc = &k->rk[r];
    for (int i = 0; i < 4; i++)
      if (rc->mh[i] != NULL) assert_int_equal(agoq_coll_dereg_mr(k->g->comm[r], rc->mh[i]), ncclSuccess);
    if (rc->in_d != NULL) cudaFree(rc->in_d);
    if (rc->out_d != NULL) cudaFree(rc->out_d);
    free(rc->in_h);
    free(rc->out_h);
    free(rc->landed);
  }
}

/* Bytes of one side of rank r's buffers in device memory. */
static uint64_t device_bytes(const call* k, int r, bool input) {
  size_t off[2], len[2];
  const rank_call* rc = &k->rk[r];
  int n = side_parts(k->c, input, input ? rc->in_n : rc->out_n, off, len);
  uint64_t sum = 0;
  for (int i = 0; i < n; i++)
    if (((input ? k->in : k->out) >> i) & 1u) sum += len[i];
  return sum;
}

/* AGOQ_COLLNET_GPU: CTest runs this program with it at its default (1) and at 0, where
 * every device call is staged and reduced on the CPU. */
static bool gpu_reduce_on(void) {
  const char* v = getenv("AGOQ_COLLNET_GPU");
  return v == NULL || strcmp(v, "0") != 0;
}

/* What crossed PCIe on the group's GPU links, over its ranks: copies, frames the GPU wrote
 * into pinned memory and bodies it read from there; and what the statistics lines
 * (AGOQ_STATS's pcie_d2h / pcie_h2d, both paths) say crossed. */
typedef struct {
  uint64_t copy_d2h, copy_h2d; /* cudaMemcpyAsync */
  uint64_t d2h, h2d;           /* everything */
  uint64_t st_d2h, st_h2d;     /* the statistics lines */
} pcie_bytes;

static void link_bytes(group* g, pcie_bytes* b) {
  memset(b, 0, sizeof *b);
  for (int r = 0; r < g->n; r++) {
    agoq_coll_comm* c = g->comm[r];
    for (int path = 0; path < 2; path++) {
      b->st_d2h += agoq_stats_get(&c->st->path[path].pcie_d2h);
      b->st_h2d += agoq_stats_get(&c->st->path[path].pcie_h2d);
    }
    if (c->gpu == NULL) continue;
    const agoq_gpu_link_stats* ls = agoq_gpu_link_stats_get(c->gpu);
    b->copy_d2h += ls->d2h_bytes;
    b->copy_h2d += ls->h2d_bytes;
    b->d2h += ls->d2h_bytes + ls->encoded_bytes;
    b->h2d += ls->h2d_bytes + ls->decoded_bytes;
  }
  assert_int_equal(b->st_d2h, b->d2h);
  assert_int_equal(b->st_h2d, b->h2d);
}

/* The device runs of nk calls posted together, nothing on the legacy stream, no
 * synchronous call, no allocation from the first call to the last done. PCIe: a staged
 * call's device bytes cross once each way; a call reduced on the GPU copies nothing into
 * NCCL's buffers and moves only frames, under 0.7 of its payload (in and out) when it is
 * large (frames of bf16 are 0.52 of it, fp32's 0.26); the statistics say exactly what the
 * links moved. */
/* Bytes per element a GPU-reduced call may move across PCIe beyond its frames: a grid's row
 * sums (fp32, 4/a bytes per element of the chunk) go to host memory, where the column
 * messages leave from (agoq_coll_grid_gpu.c); 0 on the mesh. */
static double pcie_extra_per_elem = 0.0;
/* On a grid, a GPU-reduced reduce-scatter's result is rounded on the CPU and copied into
 * NCCL's buffer (its output crosses once, as a staged call's does). */
static bool grid_run = false;
/* The bound on a GPU-reduced call's frames across PCIe, per byte of payload (in and out):
 * 0.7 where blocks compress; where every block escapes raw, a frame is its elements' bytes
 * and a bf16 call's result frames (fp32 sums) twice its output: 2. */
static double pcie_per_payload = 0.7;

static void calls_run_device(call** ks, int nk) {
  agoq_emu_counters c0, c1;
  pcie_bytes b0, b1;
  uint64_t want_d2h = 0, want_h2d = 0, gpu_payload = 0, gpu_elems = 0;
  for (int q = 0; q < nk; q++)
    for (int r = 0; r < ks[q]->g->n; r++) {
      want_d2h += device_bytes(ks[q], r, true);
      want_h2d += device_bytes(ks[q], r, false);
    }
  link_bytes(ks[0]->g, &b0);
  agoq_emu_counters_get(&c0);
  for (int q = 0; q < nk; q++) call_post(ks[q]);
  for (int q = 0; q < nk; q++)
    for (int r = 0; r < ks[q]->g->n; r++) {
      if (ks[q]->rk[r].gpu != (ks[q]->c->gpu && gpu_reduce_on()))
        fail_msg("%s type %d, device parts in %#x out %#x: rank %d %s on the GPU", kind_name(ks[q]->c->kind),
                 ks[q]->c->type, ks[q]->c->in, ks[q]->c->out, r, ks[q]->rk[r].gpu ? "reduced" : "not reduced");
      if (!ks[q]->rk[r].gpu) continue;
      uint64_t in = device_bytes(ks[q], r, true), out = device_bytes(ks[q], r, false);
      want_d2h -= in;
      if (!(grid_run && ks[q]->c->kind == CK_RS)) want_h2d -= out;
      gpu_payload += in + out;
      gpu_elems += in / agoq_coll_type_size(ks[q]->c->type);
    }
  calls_wait(ks, nk);
  agoq_emu_counters_get(&c1);
  link_bytes(ks[0]->g, &b1);
  /* The GPU calls' only copies are their result frames, out of device memory (and on a grid
   * their row sums, and a reduce-scatter's result into it). */
  assert_true(b1.copy_d2h - b0.copy_d2h >= want_d2h);
  assert_int_equal(b1.copy_h2d - b0.copy_h2d, want_h2d);
  uint64_t gpu_pcie = (b1.d2h - b0.d2h) + (b1.h2d - b0.h2d) - want_d2h - want_h2d;
  /* A frame's 48-byte header outweighs a payload of a few elements: large calls only. */
  if (gpu_payload >= 65536 &&
      (double)gpu_pcie > pcie_per_payload * (double)gpu_payload + pcie_extra_per_elem * (double)gpu_elems)
    fail_msg("GPU-reduced calls moved %llu bytes across PCIe for %llu bytes of payload",
             (unsigned long long)gpu_pcie, (unsigned long long)gpu_payload);
  assert_int_equal(c1.legacy_stream_ops, c0.legacy_stream_ops);
  assert_int_equal(c1.sync_calls, c0.sync_calls);
  assert_int_equal(c1.device_allocs, c0.device_allocs);
  assert_int_equal(c1.pinned_allocs, c0.pinned_allocs);
  /* Every kernel was loaded at setup: none first launched (lazily loaded) on the data path. */
  assert_int_equal(c1.kernels_refused, c0.kernels_refused);
}

static void calls_compare(call* host, call* dev) {
  const ccase* c = host->c;
  for (int r = 0; r < host->g->n; r++) {
    size_t n = host->rk[r].out_n;
    uint8_t* a = malloc(n + 1);
    uint8_t* b = malloc(n + 1);
    call_collect(host, r, a);
    call_collect(dev, r, b);
    if (memcmp(a, b, n) != 0) {
      size_t i = 0;
      while (a[i] == b[i]) i++;
      fail_msg("%s type %d op %d, %d ranks, device parts in %#x out %#x (%d parts): rank %d differs from the host "
               "path at byte %zu of %zu", kind_name(c->kind), c->type, c->op, host->g->n, c->in, c->out, c->nparts, r,
               i, n);
    }
    free(a);
    free(b);
  }
}

/* nk cases: all host runs first, then the device runs posted together. */
static void run_compare_many(group* g, const ccase* cs, int nk, uint64_t seed) {
  call host[MAXCALLS], dev[MAXCALLS];
  call* hp[MAXCALLS];
  call* dp[MAXCALLS];
  for (int q = 0; q < nk; q++) {
    call_prepare(&host[q], g, &cs[q], seed + (uint64_t)q, false);
    hp[q] = &host[q];
    call_post(&host[q]);
  }
  calls_wait(hp, nk);
  for (int q = 0; q < nk; q++) {
    call_prepare(&dev[q], g, &cs[q], seed + (uint64_t)q, true);
    dp[q] = &dev[q];
  }
  calls_run_device(dp, nk);
  for (int q = 0; q < nk; q++) {
    calls_compare(&host[q], &dev[q]);
    call_release(&host[q]);
    call_release(&dev[q]);
  }
}

static void run_compare(group* g, const ccase* c, uint64_t seed) { run_compare_many(g, c, 1, seed); }

/* ---- tests -------------------------------------------------------------------------------- */

static const char* const formats[] = {"int8", "none"}; /* quantized and exact */
static const int types[] = {ncclBfloat16, ncclFloat32, ncclInt32};
static const int ranks[] = {2, 4};

static void test_backend_is_the_emulation(void** state) {
  (void)state;
  group g;
  group_open(&g, 1);
  assert_true(agoq_gpu_active());
  assert_string_equal(agoq_gpu_backend(), "emulation");
  group_close(&g);
}

/* Device send and receive, either alone (the other in host memory): bits of the host path,
 * several chunks, quantized and exact, and the empty and one-element calls. */
static void test_allreduce(void** state) {
  (void)state;
  static const unsigned place[][2] = {{1, 1}, {1, 0}, {0, 1}};
  uint64_t seed = 1;
  for (size_t ni = 0; ni < 2; ni++)
    for (size_t f = 0; f < 2; f++) {
      env_set(formats[f], "0", "64K");
      group g;
      group_open(&g, ranks[ni]);
      for (size_t t = 0; t < 3; t++)
        for (size_t p = 0; p < 3; p++) {
          ccase c = {.kind = CK_AR, .type = types[t], .op = ncclSum, .count = 100003, .nparts = 1,
                     .in = place[p][0], .out = place[p][1], .gpu = f == 0 && t < 2 && p == 0};
          run_compare(&g, &c, seed++);
        }
      ccase extra[] = {{.kind = CK_AR, .type = ncclFloat32, .op = ncclMax, .count = 4099, .nparts = 1, .in = 1, .out = 1},
                       {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 1, .nparts = 1, .in = 1, .out = 1,
                        .gpu = f == 0},
                       {.kind = CK_AR, .type = ncclInt32, .op = ncclSum, .count = 0, .nparts = 1, .in = 1, .out = 1}};
      for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) run_compare(&g, &extra[i], seed++);
      group_close(&g);
    }
}

/* Windows over the whole concatenation and starting inside rank 0's part; one and two send
 * parts, mixed host and device among them. */
static void test_reducescatter(void** state) {
  (void)state;
  static const struct {
    int nparts;
    unsigned in, out;
  } place[] = {{1, 1, 1}, {1, 1, 0}, {1, 0, 1}, {2, 1, 1}, {2, 3, 0}};
  uint64_t seed = 100;
  for (size_t ni = 0; ni < 2; ni++)
    for (size_t f = 0; f < 2; f++) {
      env_set(formats[f], "0", "64K");
      int n = ranks[ni];
      group g;
      group_open(&g, n);
      for (size_t t = 0; t < 3; t++) {
        size_t e = agoq_coll_type_size(types[t]), bpr = e * 30001;
        size_t wo = bpr / 2 / e * e, wb = bpr + e * 999;
        for (size_t p = 0; p < sizeof place / sizeof place[0]; p++) {
          ccase c = {.kind = CK_RS, .type = types[t], .op = ncclSum, .bpr = bpr, .wo = 0, .wb = (size_t)n * bpr,
                     .nparts = place[p].nparts, .in = place[p].in, .out = place[p].out,
                     .gpu = f == 0 && t < 2 && p == 0};
          run_compare(&g, &c, seed++);
        }
        ccase part = {.kind = CK_RS, .type = types[t], .op = ncclSum, .bpr = bpr, .wo = wo, .wb = wb, .nparts = 1,
                      .in = 1, .out = 1, .gpu = f == 0 && t < 2};
        run_compare(&g, &part, seed++);
      }
      group_close(&g);
    }
}

static void test_allgather(void** state) {
  (void)state;
  static const struct {
    int nparts;
    unsigned in, out;
  } place[] = {{1, 1, 1}, {1, 1, 0}, {1, 0, 1}, {2, 1, 1}, {2, 0, 2}, {2, 1, 3}};
  uint64_t seed = 200;
  env_set("int8", "0", "64K");
  for (size_t ni = 0; ni < 2; ni++) {
    int n = ranks[ni];
    group g;
    group_open(&g, n);
    size_t bpr = 30011;
    for (size_t p = 0; p < sizeof place / sizeof place[0]; p++) {
      ccase whole = {.kind = CK_AG, .type = ncclUint8, .op = ncclSum, .bpr = bpr, .wo = 0, .wb = (size_t)n * bpr,
                     .nparts = place[p].nparts, .in = place[p].in, .out = place[p].out};
      run_compare(&g, &whole, seed++);
      ccase part = whole;
      part.wo = bpr / 3;
      part.wb = bpr;
      run_compare(&g, &part, seed++);
    }
    group_close(&g);
  }
}

/* Calls of every kind and placement in flight together on 4 ranks: device ones wait for
 * their input copies in call order, host ones behind them, and all come out right. */
static void test_in_flight_mixed(void** state) {
  (void)state;
  env_set("int8", "0", "64K");
  group g;
  group_open(&g, 4);
  size_t bpr = 4 * 20011;
  ccase cs[MAXCALLS] = {
      {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 200003, .nparts = 1, .in = 1, .out = 1, .gpu = true},
      {.kind = CK_AR, .type = ncclInt32, .op = ncclSum, .count = 50001, .nparts = 1, .in = 0, .out = 0},
      {.kind = CK_AR, .type = ncclFloat32, .op = ncclSum, .count = 70001, .nparts = 1, .in = 0, .out = 1},
      {.kind = CK_RS, .type = ncclFloat32, .op = ncclSum, .bpr = bpr, .wb = 4 * bpr, .nparts = 2, .in = 2, .out = 1},
      {.kind = CK_AG, .type = ncclUint8, .op = ncclSum, .bpr = bpr, .wb = 4 * bpr, .nparts = 1, .in = 1, .out = 1},
      {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 90001, .nparts = 1, .in = 1, .out = 0},
      {.kind = CK_RS, .type = ncclInt32, .op = ncclMax, .bpr = bpr, .wb = 4 * bpr, .nparts = 1, .in = 1, .out = 1},
      {.kind = CK_AR, .type = ncclFloat32, .op = ncclSum, .count = 1000, .nparts = 1, .in = 1, .out = 1, .gpu = true},
  };
  run_compare_many(&g, cs, MAXCALLS, 300);
  group_close(&g);
}

/* With the engine threads held, test() alone moves device requests (AGOQ_COLLNET_ASSIST):
 * input copies polled, results copied out, done only once they are in place. */
static void test_test_alone_moves_device_requests(void** state) {
  (void)state;
  env_set("int8", "0", "64K");
  group g;
  group_open(&g, 2);
  for (int r = 0; r < 2; r++) agoq_coll_engine_hold(g.comm[r], true);
  ccase cs[] = {{.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 100003, .nparts = 1, .in = 1, .out = 1,
                 .gpu = true},
                {.kind = CK_RS, .type = ncclFloat32, .op = ncclSum, .bpr = 4 * 30001, .wb = 2 * 4 * 30001,
                 .nparts = 1, .in = 1, .out = 1, .gpu = true}};
  run_compare(&g, &cs[0], 400);
  run_compare(&g, &cs[1], 401);
  for (int r = 0; r < 2; r++) agoq_coll_engine_hold(g.comm[r], false);
  group_close(&g);
}

/* The emulated device's clock: one microsecond per event it stamps, so GPU times are exact
 * multiples of ticks whatever the machine. */
static _Atomic unsigned long emu_ticks;
static double tick_clock(void) { return 1e-6 * (double)atomic_fetch_add(&emu_ticks, 1); }

/* Escaped-block decodes launched on the GPU: the single calls' (the owner's own result) and
 * the batches' (the peers' result frames). The rank-order sum (sum_kernel) reads escaped
 * blocks itself. */
static unsigned long long raw_decodes(void) {
  return agoq_emu_kernel_launches("raw_decode_kernel<") + agoq_emu_kernel_launches("raw_decode_batch_kernel<");
}

/* A NaN in one rank's input: its block travels raw in that rank's frame, and the sum's block
 * is a NaN, raw in the result frames, so the GPU reduction runs the escaped-block decodes
 * (the sum's raw elements, and raw_decode_kernel and raw_decode_batch_kernel into NCCL's
 * buffer) that no call of the other tests needs. They were loaded at setup with every other kernel (agoq_gpu_codec_load): the
 * emulation refuses a kernel's first launch on the data path, where on a GPU under lazy
 * loading it would load while NCCL's kernel runs (a hang measured on an H200). Bits of the
 * host path, NaN included. */
static void test_nan_block_on_gpu(void** state) {
  (void)state;
  env_set("int8", "0", "64K");
  for (int ni = 0; ni < 2; ni++) {
    group g;
    group_open(&g, ranks[ni]);
    for (size_t t = 0; t < 2; t++) {
      unsigned long long raw0 = raw_decodes();
      ccase c = {.kind = CK_AR, .type = types[t], .op = ncclSum, .count = 100003, .nparts = 1, .in = 1, .out = 1,
                 .gpu = true, .nan_at = 4000};
      run_compare(&g, &c, 900 + t);
      unsigned long long raw = raw_decodes() - raw0;
      /* Each rank decodes the NaN result into its buffer: its owner from its own sum's frame,
       * the others in their batch of result frames. */
      if (gpu_reduce_on() && raw < (unsigned long long)ranks[ni])
        fail_msg("%d ranks, type %d: %llu escaped-block decodes on the GPU", ranks[ni], types[t], raw);
      if (!gpu_reduce_on()) assert_int_equal(raw, 0);
    }
    group_close(&g);
  }
}

/* NCCL_CREATE_THREAD_CONTEXT=1 (NCCL 2.28.9): NCCL's proxy threads, which open the group and
 * post and test its calls, run in a private CUDA context of their own, so the group's link
 * (its stream, events and kernels) is made there; the group's engine thread, bound to no
 * context or the primary one, must launch and query in that context too. The emulation
 * refuses a private context's streams and events while another context is current, and
 * loads kernels per context. The NaN block needs the escaped-block decode loaded there. */
static void test_private_context(void** state) {
  (void)state;
  void* priv = agoq_emu_context_create(0);
  assert_non_null(priv);
  env_set("int8", "0", "64K");
  group g;
  group_open(&g, 2);
  ccase cs[] = {{.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 100003, .nparts = 1, .in = 1,
                 .out = 1, .gpu = true},
                {.kind = CK_AR, .type = ncclFloat32, .op = ncclSum, .count = 50001, .nparts = 1, .in = 1, .out = 1,
                 .gpu = true, .nan_at = 4000},
                {.kind = CK_AR, .type = ncclInt32, .op = ncclSum, .count = 4099, .nparts = 1, .in = 1, .out = 1}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_compare(&g, &cs[i], 1200 + i);
  group_close(&g);
}

/* After a failure too: the other tests run in the primary context. */
static int primary_context_again(void** state) {
  (void)state;
  return cudaSetDevice(0) == cudaSuccess ? 0 : -1;
}

/* AGOQ_STATS's gpu_ms: every codec call of the GPU reduction (a batch is one) is bracketed by
 * timing events and its time lands on the quantized line once it completed: at least a tick
 * per call, all of what the link measured, none left untimed. */
static void test_gpu_time_is_counted(void** state) {
  (void)state;
  if (!gpu_reduce_on()) skip();
  env_set("int8", "0", "64K");
  agoq_emu_clock_set(tick_clock);
  group g;
  group_open(&g, 2);
  ccase c = {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 100003, .nparts = 1, .in = 1, .out = 1,
             .gpu = true};
  run_compare(&g, &c, 500);
  for (int r = 0; r < 2; r++) {
    agoq_coll_comm* cm = g.comm[r];
    const agoq_gpu_link_stats* ls = agoq_gpu_link_stats_get(cm->gpu);
    uint64_t gpu_ns = agoq_stats_get(&cm->st->path[AGOQ_STATS_QUANT].gpu_ns);
    assert_true(ls->encodes > 0 && ls->decodes > 0);
    assert_int_equal(ls->untimed, 0);
    assert_int_equal(gpu_ns, ls->codec_ns);
    /* A tick per codec call (a batch is one call between one pair of timing events, whatever
     * its items). */
    assert_true(ls->codec_calls > 0 && ls->codec_calls <= ls->encodes + ls->decodes);
    if (gpu_ns < 1000 * ls->codec_calls)
      fail_msg("rank %d: %llu ns of GPU time for %llu codec calls", r, (unsigned long long)gpu_ns,
               (unsigned long long)ls->codec_calls);
    assert_int_equal(agoq_stats_get(&cm->st->path[AGOQ_STATS_EXACT].gpu_ns), 0);
  }
  group_close(&g);
  agoq_emu_clock_set(NULL);
}

/* Issue 28: the GPU reduction codes a chunk in a fixed number of calls, however many ranks
 * share it: one batch each for the slices' encodes, the contributions' sum and the result
 * frames' decodes (one launch of each kernel for all peers), and the owner's few single
 * calls. Per-peer calls were 3 per rank and chunk. The same call on 2 and on MAXR ranks: the
 * same codec calls per rank, at most 6 per chunk, while the items (encodes, decodes) grow. */
static void gpu_calls(int n, uint64_t* calls, uint64_t* items) {
  group g;
  group_open(&g, n);
  ccase c = {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 100003, .nparts = 1, .in = 1, .out = 1,
             .gpu = true};
  run_compare(&g, &c, 1300 + (unsigned)n);
  *calls = *items = 0;
  for (int r = 0; r < n; r++) {
    agoq_coll_comm* cm = g.comm[r];
    const agoq_gpu_link_stats* ls = agoq_gpu_link_stats_get(cm->gpu);
    if (r == 0) {
      *calls = ls->codec_calls;
      *items = ls->encodes + ls->decodes;
    }
    if (ls->codec_calls != *calls) fail_msg("%d ranks: rank %d made %llu codec calls, rank 0 %llu", n, r,
                                            (unsigned long long)ls->codec_calls, (unsigned long long)*calls);
  }
  group_close(&g);
}

static void test_gpu_calls_per_chunk_do_not_grow_with_ranks(void** state) {
  (void)state;
  if (!gpu_reduce_on()) skip();
  env_set("int8", "0", "64K");
  uint64_t calls2, items2, callsn, itemsn;
  gpu_calls(2, &calls2, &items2);
  gpu_calls(MAXR, &callsn, &itemsn);
  /* 100003 bf16 in chunks of 64 KiB: 4 chunks (of 32768 elements at most). */
  const uint64_t chunks = (100003 + 32767) / 32768;
  print_message("GPU codec calls per rank: %llu on 2 ranks (%llu items), %llu on %d ranks (%llu items), %llu chunks\n",
                (unsigned long long)calls2, (unsigned long long)items2, (unsigned long long)callsn, MAXR,
                (unsigned long long)itemsn, (unsigned long long)chunks);
  assert_int_equal(callsn, calls2);
  assert_true(calls2 <= 6 * chunks);
  assert_true(itemsn > items2);
}

/* Issue 28: on a grid (2x2, 3x2 with 4 ranks, and 2x2 with 3: ragged rows) a quantized
 * all-reduce or reduce-scatter on device buffers runs on the GPU too, one batch per stage
 * (the frames, the row sums, the final decodes; agoq_coll_grid_gpu.c), with the host path's
 * bits. A NaN in a piece bound for a row peer makes its frame outgrow its nominal place: that
 * message is coded again (one more batch on that rank only) and packed on the host. Mixed
 * placements, reduce-scatters from several parts and exact calls are staged. */
static uint64_t link_calls(group* g, int r) {
  agoq_coll_comm* c = g->comm[r];
  return agoq_gpu_link_stats_get(c->gpu)->codec_calls;
}

static void test_grid_on_gpu(void** state) {
  (void)state;
  /* 3x2: rows of 3, whose sums' order shows (two addends commute). */
  static const struct {
    const char* grid;
    int a, n;
  } grids[] = {{"2x2", 2, 4}, {"3x2", 3, 4}, {"2x2", 2, 3}};
  uint64_t seed = 1500;
  for (size_t gi = 0; gi < sizeof grids / sizeof grids[0]; gi++) {
    int n = grids[gi].n;
    setenv("AGOQ_COLLNET_GRID", grids[gi].grid, 1);
    env_set("int8", "0", "64K");
    pcie_extra_per_elem = 4.0 / grids[gi].a; /* the row sums, to host memory */
    grid_run = true;
    group g;
    group_open(&g, n);
    bool on = gpu_reduce_on();
    ccase cs[] = {
        {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 100003, .nparts = 1, .in = 1, .out = 1, .gpu = true},
        {.kind = CK_AR, .type = ncclFloat32, .op = ncclSum, .count = 50001, .nparts = 1, .in = 1, .out = 1, .gpu = true},
        {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 1, .nparts = 1, .in = 1, .out = 1, .gpu = true},
        {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 100003, .nparts = 1, .in = 1, .out = 0},
        {.kind = CK_AR, .type = ncclInt32, .op = ncclSum, .count = 4099, .nparts = 1, .in = 1, .out = 1},
        {.kind = CK_RS, .type = ncclBfloat16, .op = ncclSum, .bpr = 2 * 20011, .wo = 0, .wb = (size_t)n * 2 * 20011,
         .nparts = 1, .in = 1, .out = 1, .gpu = true},
        {.kind = CK_RS, .type = ncclFloat32, .op = ncclSum, .bpr = 4 * 20011, .wo = 4 * 3001,
         .wb = (size_t)n * 4 * 20011 - 4 * 7001, .nparts = 1, .in = 1, .out = 1, .gpu = true},
        {.kind = CK_RS, .type = ncclBfloat16, .op = ncclSum, .bpr = 2 * 20011, .wo = 0, .wb = (size_t)n * 2 * 20011,
         .nparts = 2, .in = 1, .out = 1}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_compare(&g, &cs[i], seed++);
    /* Element 19999 of a bf16 chunk (32768 elements) or 9999 of an fp32 one (16384) lies in
     * piece 2 of 4 (column 1, row 0) or 3 of 6 (column 1, row 1): a piece of column 1, which
     * rank 0 sends to rank 1 (rank 1 plays it in row 0). */
    for (int t = 0; t < 2; t++) {
      uint64_t c0 = on ? link_calls(&g, 0) : 0, c1 = on ? link_calls(&g, 1) : 0;
      ccase nan = {.kind = CK_AR, .type = t == 0 ? ncclBfloat16 : ncclFloat32, .op = ncclSum, .count = 100003,
                   .nparts = 1, .in = 1, .out = 1, .gpu = true, .nan_at = t == 0 ? 20000 : 10000};
      run_compare(&g, &nan, seed++);
      if (!on) continue;
      uint64_t d0 = link_calls(&g, 0) - c0, d1 = link_calls(&g, 1) - c1;
      if (d0 != d1 + 1)
        fail_msg("%s, %d ranks, type %d: rank 0 made %llu codec calls, rank 1 %llu (the NaN's message coded again: "
                 "one more)", grids[gi].grid, n, nan.type, (unsigned long long)d0, (unsigned long long)d1);
      /* 3 batches per chunk (frames, row sums, final decodes), whatever the pieces. */
      const uint64_t chunks = (100003 + (t == 0 ? 32767 : 16383)) / (t == 0 ? 32768 : 16384);
      print_message("grid %s, %d ranks, type %d: %llu GPU codec calls on rank 1 for %llu chunks, %llu on rank 0 "
                    "(its NaN's message coded again)\n", grids[gi].grid, n, nan.type, (unsigned long long)d1,
                    (unsigned long long)chunks, (unsigned long long)d0);
      assert_int_equal(d1, 3 * chunks);
    }
    group_close(&g);
  }
  pcie_extra_per_elem = 0.0;
  grid_run = false;
  unsetenv("AGOQ_COLLNET_GRID");
  agoq_params_reset();
}

/* The GPU path's frame regions are sized as the host's, for frames whose blocks compress;
 * frames that outgrow them (blocks that escape raw: NaN, Inf, as in fp16 training's overflow
 * steps) go through the group's one pinned spill area, which one pipeline slot holds at a time
 * (agoq_coll_gpu_spill_*): a peer's frame coded again into it and sent from a buffer of its
 * own, a received one that spilled into host memory the device cannot read copied into it
 * before its batch. Every rank's every block NaN (every frame at its largest: the area's
 * worst case, one slot's batch filling it) and one block in 20, on the mesh and on grids, for
 * all-reduces and reduce-scatters of both float types, several calls in flight: the host
 * path's bits, and the area used by every rank. */
static void test_spill_area_on_gpu(void** state) {
  (void)state;
  static const struct {
    const char* grid; /* NULL: the mesh */
    int n;
  } shapes[] = {{NULL, 2}, {NULL, 4}, {"2x2", 4}, {"3x2", 4}, {"2x2", 3}};
  uint64_t seed = 2100;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    int n = shapes[si].n, a = 1;
    if (shapes[si].grid != NULL) {
      setenv("AGOQ_COLLNET_GRID", shapes[si].grid, 1);
      a = shapes[si].grid[0] - '0';
    }
    env_set("int8", "0", "64K");
    pcie_extra_per_elem = shapes[si].grid != NULL ? 4.0 / a : 0.0;
    grid_run = shapes[si].grid != NULL;
    group g;
    group_open(&g, n);
    bool on = gpu_reduce_on();
    uint64_t used0[MAXR];
    for (int r = 0; r < n; r++) used0[r] = on ? ((agoq_coll_comm*)g.comm[r])->gspill_batches : 0;
    static const size_t nan_strides[] = {1, 5120}; /* every element (every block raw); 1 block in 20 */
    for (size_t ei = 0; ei < sizeof nan_strides / sizeof nan_strides[0]; ei++) {
      size_t every = nan_strides[ei];
      pcie_per_payload = every == 1 ? 2.0 : 0.7;
      ccase cs[] = {{.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 100003, .nparts = 1, .in = 1,
                     .out = 1, .gpu = true, .nan_every = every},
                    {.kind = CK_AR, .type = ncclFloat32, .op = ncclSum, .count = 50001, .nparts = 1, .in = 1,
                     .out = 1, .gpu = true, .nan_every = every},
                    {.kind = CK_RS, .type = ncclBfloat16, .op = ncclSum, .bpr = 2 * 20011, .wo = 0,
                     .wb = (size_t)n * 2 * 20011, .nparts = 1, .in = 1, .out = 1, .gpu = true, .nan_every = every},
                    {.kind = CK_RS, .type = ncclFloat32, .op = ncclSum, .bpr = 4 * 20011, .wo = 4 * 3001,
                     .wb = (size_t)n * 4 * 20011 - 4 * 7001, .nparts = 1, .in = 1, .out = 1, .gpu = true,
                     .nan_every = every}};
      run_compare_many(&g, cs, (int)(sizeof cs / sizeof cs[0]), seed++);
    }
    for (int r = 0; r < n && on; r++) {
      const agoq_coll_comm* c = g.comm[r];
      if (c->gspill_batches == used0[r])
        fail_msg("%s, %d ranks: rank %d never used the spill area", shapes[si].grid ? shapes[si].grid : "mesh", n, r);
      if (r == 0)
        print_message("%s, %d ranks: rank 0 used the spill area for %llu batches (%zu bytes; %zu bytes of pinned "
                      "regions for %d slots), found it held %llu times\n", shapes[si].grid ? shapes[si].grid : "mesh",
                      n, (unsigned long long)(c->gspill_batches - used0[r]), c->gspill.cap, c->gpin.cap,
                      AGOQ_COLL_SLOTS, (unsigned long long)c->gspill_waits);
    }
    group_close(&g);
    unsetenv("AGOQ_COLLNET_GRID");
  }
  pcie_extra_per_elem = 0.0;
  pcie_per_payload = 0.7;
  grid_run = false;
  agoq_params_reset();
}

static void staging_env(const char* bytes) {
  if (bytes != NULL) setenv("AGOQ_GPU_STAGING", bytes, 1);
  else unsetenv("AGOQ_GPU_STAGING");
  env_set("none", "0", "64K");
}

/* Calls larger than the staging (CollNetDirect calls reach NCCL_BUFFSIZE, 16 MiB is a common
 * setting; registered windows need input plus output) pass through a host bounce buffer in
 * pieces of half the staging: bits of the host path for every kind and placement, 2 ranks,
 * quantized and exact, at a 64 KiB staging and at the default one with 16 MiB calls; each
 * device byte crosses PCIe once each way (run_compare). */
static void test_beyond_the_staging(void** state) {
  (void)state;
  uint64_t seed = 300;
  for (size_t f = 0; f < 2; f++) {
    setenv("AGOQ_GPU_STAGING", "64K", 1);
    env_set(formats[f], "0", "64K");
    group g;
    group_open(&g, 2);
    static const unsigned place[][2] = {{1, 1}, {1, 0}, {0, 1}};
    for (size_t t = 0; t < 3; t++)
      for (size_t p = 0; p < 3; p++) {
        ccase c = {.kind = CK_AR, .type = types[t], .op = ncclSum, .count = 100003, .nparts = 1,
                   .in = place[p][0], .out = place[p][1], .gpu = f == 0 && t < 2 && p == 0};
        run_compare(&g, &c, seed++);
      }
    size_t bpr = 4 * 30001;
    ccase rs[] = {{.kind = CK_RS, .type = ncclFloat32, .op = ncclSum, .bpr = bpr, .wo = 0, .wb = 2 * bpr, .nparts = 2,
                   .in = 3, .out = 1},
                  {.kind = CK_RS, .type = ncclFloat32, .op = ncclSum, .bpr = bpr, .wo = 0, .wb = 2 * bpr, .nparts = 2,
                   .in = 2, .out = 0}};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) run_compare(&g, &rs[i], seed++);
    ccase ag[] = {{.kind = CK_AG, .type = ncclUint8, .op = ncclSum, .bpr = 50021, .wo = 0, .wb = 2 * 50021, .nparts = 2,
                   .in = 1, .out = 3},
                  {.kind = CK_AG, .type = ncclUint8, .op = ncclSum, .bpr = 50021, .wo = 0, .wb = 2 * 50021, .nparts = 1,
                   .in = 0, .out = 1}};
    for (size_t i = 0; i < sizeof ag / sizeof ag[0]; i++) run_compare(&g, &ag[i], seed++);
    group_close(&g);
  }
  /* At the default staging (8 MiB): a 16 MiB allreduce (NCCL_BUFFSIZE=16M), exact and
   * quantized on the CPU, and an allgather window of 8 MiB per rank (input plus output
   * 24 MiB). */
  for (size_t f = 0; f < 2; f++) {
    staging_env(NULL);
    env_set(formats[f], "0", "64K");
    group g;
    group_open(&g, 2);
    ccase big[] = {{.kind = CK_AR, .type = ncclFloat32, .op = ncclSum, .count = (16u << 20) / 4, .nparts = 1,
                    .in = 1, .out = f == 0 ? 0 : 1},
                   {.kind = CK_AG, .type = ncclUint8, .op = ncclSum, .bpr = 8u << 20, .wo = 0, .wb = 16u << 20,
                    .nparts = 1, .in = 1, .out = 1}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) run_compare(&g, &big[i], seed++);
    group_close(&g);
  }
}

/* Two calls on one rank (the group's own reduction) at a 64 KiB staging: the second is
 * "busy" (a NULL request) until the first is done, then goes. Calls of `count` int32 that
 * fit take the staging, which two cannot share; larger ones each take a bounce buffer, one
 * per group at a time (over verbs registered with the NIC for the call). */
static void second_call_busy(size_t count, uint64_t seed) {
  staging_env("64K");
  group g;
  group_open(&g, 1);
  size_t bytes = count * 4;
  uint8_t* in = malloc(2 * bytes);
  uint8_t* out = malloc(2 * bytes);
  fill_values(ncclInt32, in, 2 * bytes, seed);
  uint8_t* d = dev_alloc_from(in, 2 * bytes);
  void* mh = NULL;
  reg(&g, 0, d, 2 * bytes, NCCL_PTR_CUDA, &mh);
  void* req[2] = {NULL, NULL};
  const char* tp = getenv("AGOQ_TRANSPORT");
  const bool ib = tp != NULL && strcmp(tp, "ib") == 0;
  assert_int_equal(agoq_coll_iallreduce(g.comm[0], d, d, count, ncclInt32, ncclSum, mh, mh, &req[0]), ncclSuccess);
  assert_non_null(req[0]);
  assert_int_equal(agoq_coll_iallreduce(g.comm[0], d + bytes, d + bytes, count, ncclInt32, ncclSum, mh, mh, &req[1]),
                   ncclSuccess);
  assert_null(req[1]);
  wait_all(&req[0], 1, NULL, NULL, 30);
  assert_int_equal(agoq_coll_iallreduce(g.comm[0], d + bytes, d + bytes, count, ncclInt32, ncclSum, mh, mh, &req[1]),
                   ncclSuccess);
  assert_non_null(req[1]);
  wait_all(&req[1], 1, NULL, NULL, 30);
  assert_int_equal(cudaMemcpy(out, d, 2 * bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_memory_equal(out, in, 2 * bytes); /* one rank: the sum is its own input */
  assert_int_equal(((agoq_coll_comm*)g.comm[0])->bounce_reqs, 0);
  /* Calls beyond the staging (both): each one's bounce buffer registered with the NIC for it
   * over verbs (there they were refused, naming AGOQ_GPU_STAGING), never over TCP. */
  assert_int_equal(((agoq_coll_comm*)g.comm[0])->bounce_regs, bytes > 65536 && ib ? 2 : 0);
  assert_int_equal(agoq_coll_dereg_mr(g.comm[0], mh), ncclSuccess);
  cudaFree(d);
  free(in);
  free(out);
  group_close(&g);
  staging_env(NULL);
}

/* Calls larger than the staging: one bounce buffer per group at a time. */
static void test_beyond_the_staging_one_at_a_time(void** state) {
  (void)state;
  second_call_busy(20000, 11);
}

/* A staging held by a request not yet tested makes the next call "busy". */
static void test_staging_full_is_busy(void** state) {
  (void)state;
  second_call_busy(10000, 7);
}

/* regMr refuses what is not device memory; a buffer outside its registration is refused;
 * iflush of a device receive is done at once (a NULL request), anything else refused. */
static void test_refusals_and_iflush(void** state) {
  (void)state;
  env_set("int8", "64K", "1M");
  group g;
  group_open(&g, 1);
  void* comm = g.comm[0];
  uint8_t* host = calloc(1, 4096);
  void* mh = (void*)1;
  capture_reset();
  agoq_log_set_logger(capture_log);
  assert_int_equal(agoq_coll_reg_mr(comm, host, 4096, NCCL_PTR_CUDA, &mh), ncclInvalidUsage);
  assert_null(mh);
  assert_non_null(strstr(log_buf, "refused"));
  uint8_t* d = NULL;
  assert_int_equal(cudaMalloc((void**)&d, 4096), cudaSuccess);
  assert_int_equal(agoq_coll_reg_mr(comm, d, 1u << 20, NCCL_PTR_CUDA, &mh), ncclInvalidUsage); /* runs past it */
  /* From one allocation into another: both ends are device memory, the range is not one
   * buffer (the driver's bounds refuse it). */
  uint8_t* e = NULL;
  assert_int_equal(cudaMalloc((void**)&e, 4096), cudaSuccess);
  uint8_t* lo = d < e ? d : e;
  uint8_t* hi = d < e ? e : d;
  capture_reset();
  assert_int_equal(agoq_coll_reg_mr(comm, lo, (size_t)(hi - lo) + 1, NCCL_PTR_CUDA, &mh), ncclInvalidUsage);
  assert_non_null(strstr(log_buf, "runs past its allocation"));
  cudaFree(e);
  /* By DMA-BUF (advertised where the net transport registers dma-bufs), device memory is
   * staged as by regMr: the fd is not used; a range outside device memory is refused. */
  assert_int_equal(agoq_coll_reg_mr_dmabuf(comm, d, 4096, NCCL_PTR_CUDA, 0, 3, &mh), ncclSuccess);
  assert_int_equal(agoq_coll_dereg_mr(comm, mh), ncclSuccess);
  assert_int_equal(agoq_coll_reg_mr_dmabuf(comm, host, 4096, NCCL_PTR_CUDA, 0, 3, &mh), ncclInvalidUsage);
  void *dmh = NULL, *hmh = NULL;
  reg(&g, 0, d, 4096, NCCL_PTR_CUDA, &dmh);
  reg(&g, 0, host, 4096, NCCL_PTR_HOST, &hmh);
  void* req = (void*)1;
  assert_int_equal(agoq_coll_iallreduce(comm, d + 4000, d, 100, ncclInt32, ncclSum, dmh, dmh, &req), ncclInvalidUsage);
  assert_null(req);
  agoq_coll_sge part = {d, 8192, dmh};
  assert_int_equal(agoq_coll_iallgather(comm, d, 1, &part, 8192, 0, 8192, dmh, &req), ncclInvalidUsage);
  req = (void*)1;
  assert_int_equal(agoq_coll_iflush(comm, d, 4096, dmh, &req), ncclSuccess);
  assert_null(req);
  assert_int_equal(agoq_coll_iflush(comm, d + 64, 128, dmh, &req), ncclSuccess);
  assert_int_equal(agoq_coll_iflush(comm, d + 4000, 128, dmh, &req), ncclInvalidUsage);
  assert_int_not_equal(agoq_coll_iflush(comm, host, 64, hmh, &req), ncclSuccess);
  assert_int_not_equal(agoq_coll_iflush(comm, d, 64, NULL, &req), ncclSuccess);
  assert_int_not_equal(agoq_coll_iflush(comm, d, 64, host, &req), ncclSuccess); /* not a handle */
  assert_int_not_equal(agoq_coll_iflush(comm, d, -1, dmh, &req), ncclSuccess);
  assert_int_not_equal(agoq_coll_iflush(comm, d, 64, dmh, NULL), ncclSuccess);
  assert_int_not_equal(agoq_coll_iflush(host, d, 64, dmh, &req), ncclSuccess);
  agoq_log_set_logger(NULL);
  assert_int_equal(agoq_coll_dereg_mr(comm, dmh), ncclSuccess);
  assert_int_equal(agoq_coll_dereg_mr(comm, hmh), ncclSuccess);
  cudaFree(d);
  free(host);
  group_close(&g);
}

/* AGOQ_GPU=off: device memory is refused with the reason; the host path is unaffected. */
static void test_off_refuses_device_memory(void** state) {
  (void)state;
  env_set("int8", "64K", "1M");
  group g;
  group_open(&g, 1);
  assert_false(agoq_gpu_active());
  void* d = NULL;
  void* mh = (void*)1;
  assert_int_equal(cudaMalloc(&d, 4096), cudaSuccess);
  capture_reset();
  agoq_log_set_logger(capture_log);
  assert_int_equal(agoq_coll_reg_mr(g.comm[0], d, 4096, NCCL_PTR_CUDA, &mh), ncclInvalidUsage);
  agoq_log_set_logger(NULL);
  assert_null(mh);
  const char* mode = getenv("AGOQ_GPU");
  assert_non_null(strstr(log_buf, mode == NULL ? "off (AGOQ_GPU=auto)" : "AGOQ_GPU=off"));
  cudaFree(d);
  ccase c = {.kind = CK_AR, .type = ncclBfloat16, .op = ncclSum, .count = 1001, .nparts = 1};
  call k;
  call_prepare(&k, &g, &c, 5, false);
  call_post(&k);
  call* kp = &k;
  calls_wait(&kp, 1);
  call_release(&k);
  group_close(&g);
}

static const struct CMUnitTest tests_gpu_off[] = {cmocka_unit_test(test_off_refuses_device_memory)};

static const struct CMUnitTest tests_gpu[] = {
    cmocka_unit_test(test_backend_is_the_emulation),
    cmocka_unit_test(test_allreduce),
    cmocka_unit_test(test_nan_block_on_gpu),
    cmocka_unit_test_teardown(test_private_context, primary_context_again),
    cmocka_unit_test(test_reducescatter),
    cmocka_unit_test(test_allgather),
    cmocka_unit_test(test_in_flight_mixed),
    cmocka_unit_test(test_test_alone_moves_device_requests),
    cmocka_unit_test(test_gpu_time_is_counted),
    cmocka_unit_test(test_gpu_calls_per_chunk_do_not_grow_with_ranks),
    cmocka_unit_test(test_grid_on_gpu),
    cmocka_unit_test(test_spill_area_on_gpu),
    cmocka_unit_test(test_beyond_the_staging),
    cmocka_unit_test(test_beyond_the_staging_one_at_a_time),
    cmocka_unit_test(test_staging_full_is_busy),
    cmocka_unit_test(test_refusals_and_iflush),
};

int main(void) {
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  setenv("AGOQ_SOCKET_FAMILY", "ipv4", 1);
  setenv("AGOQ_COLLNET_TIMEOUT_S", "20", 1);
  unsetenv("NCCL_COLLNET_ENABLE");
  /* CTest runs it with AGOQ_GPU=off (collnet_device.gpu_off) and unset (auto, .gpu_auto): the host path only. */
  const char* gpu = getenv("AGOQ_GPU");
  if (gpu == NULL || strcmp(gpu, "off") == 0) return cmocka_run_group_tests(tests_gpu_off, NULL, NULL);
  const char* filter = getenv("CMOCKA_TEST_FILTER"); /* e.g. test_allgather */
  if (filter != NULL && filter[0] != '\0') cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests_gpu, NULL, NULL);
}
