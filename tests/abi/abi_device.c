/*
 * --device: the data scenarios with NCCL's buffers in device memory, as NCCL hands them
 * over with GPUDirect on (NCCL_PTR_CUDA). Run against the test plugin built over the CUDA
 * emulation (libnccl-net-agoq-emu.so), whose device memory the host cannot touch.
 *
 * The scenarios keep writing patterns into and checking their host buffers (abi_buf). In
 * device mode each abi_buf has a device twin of the same layout, guards included: what the
 * plugin gets is the twin's address; before an isend or irecv the harness copies the host
 * bytes of the message (and the guards) to the twin, as a GPU kernel would have written
 * them; when test() says a receive is done it copies them back, so the scenario's checks
 * see what the plugin put into device memory, at that moment. The harness's own copies are
 * synchronous; the plugin's must not be (test_net_device checks that).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi_harness.h"
#include "core/agoq_params.h"

#ifdef ABI_HAVE_DEVICE
#include <cuda_runtime_api.h>

#define ABI_DEV_MAX_BUFS 512

typedef struct {
  uint8_t* host; /* abi_buf.base */
  uint8_t* dev;
  size_t total; /* guards included */
} abi_dev_twin;

static abi_dev_twin abi_twins[ABI_DEV_MAX_BUFS];

typedef struct {
  void* req;
  int n;
  void* host[ABI_MAX_RECVS];
  size_t size[ABI_MAX_RECVS];
} abi_dev_recv;

static abi_dev_recv abi_recvs[ABI_MAX_REQUESTS * 4];

bool abi_device_mode(void) {
  const char* v = getenv("AGOQ_ABI_DEVICE");
  return v != NULL && strcmp(v, "1") == 0;
}

static abi_dev_twin* abi_twin_of(const void* p) {
  const uint8_t* h = p;
  for (int i = 0; i < ABI_DEV_MAX_BUFS; i++) {
    abi_dev_twin* t = &abi_twins[i];
    if (t->host != NULL && h >= t->host && h < t->host + t->total) return t;
  }
  return NULL;
}

int abi_device_alloc(abi_buf* b) {
  for (int i = 0; i < ABI_DEV_MAX_BUFS; i++) {
    abi_dev_twin* t = &abi_twins[i];
    if (t->host != NULL) continue;
    size_t total = b->size + 2 * ABI_GUARD_SIZE;
    void* d = NULL;
    if (cudaMalloc(&d, total) != cudaSuccess) return -1;
    if (cudaMemcpy(d, b->base, total, cudaMemcpyHostToDevice) != cudaSuccess) {
      cudaFree(d);
      return -1;
    }
    *t = (abi_dev_twin){.host = b->base, .dev = d, .total = total};
    return 0;
  }
  return -1;
}

void abi_device_free(abi_buf* b) {
  abi_dev_twin* t = abi_twin_of(b->base);
  if (t == NULL) return;
  cudaFree(t->dev);
  memset(t, 0, sizeof *t);
}

void* abi_device_ptr(void* host) {
  abi_dev_twin* t = abi_twin_of(host);
  return t == NULL ? host : t->dev + ((uint8_t*)host - t->host);
}

/* Copies [p, p + n) and the twin's guards one way; 0 ok. */
static int abi_device_move(const void* p, size_t n, bool to_device) {
  abi_dev_twin* t = abi_twin_of(p);
  if (t == NULL) return 0;
  size_t off = (size_t)((const uint8_t*)p - t->host);
  if (n > t->total - off) n = t->total - off;
  size_t spans[3][2] = {{0, ABI_GUARD_SIZE}, {t->total - ABI_GUARD_SIZE, ABI_GUARD_SIZE}, {off, n}};
  for (int i = 0; i < 3; i++) {
    if (spans[i][1] == 0) continue;
    uint8_t* h = t->host + spans[i][0];
    uint8_t* d = t->dev + spans[i][0];
    cudaError_t e = to_device ? cudaMemcpy(d, h, spans[i][1], cudaMemcpyHostToDevice)
                              : cudaMemcpy(h, d, spans[i][1], cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return -1;
  }
  return 0;
}

int abi_device_push(const void* host, size_t n) { return abi_device_move(host, n, true); }

int abi_device_track_recv(void* req, int n, void** host, const size_t* sizes) {
  /* A request abandoned by a close may come back at the same address. */
  for (size_t i = 0; i < sizeof abi_recvs / sizeof abi_recvs[0]; i++)
    if (abi_recvs[i].req == req) memset(&abi_recvs[i], 0, sizeof abi_recvs[i]);
  for (size_t i = 0; i < sizeof abi_recvs / sizeof abi_recvs[0]; i++) {
    abi_dev_recv* r = &abi_recvs[i];
    if (r->req != NULL) continue;
    r->req = req;
    r->n = n;
    for (int k = 0; k < n; k++) {
      r->host[k] = host[k];
      r->size[k] = sizes[k];
    }
    return 0;
  }
  return -1;
}

int abi_device_recv_done(void* req) {
  for (size_t i = 0; i < sizeof abi_recvs / sizeof abi_recvs[0]; i++) {
    abi_dev_recv* r = &abi_recvs[i];
    if (r->req != req) continue;
    int rc = 0;
    for (int k = 0; k < r->n; k++)
      if (abi_device_move(r->host[k], r->size[k], false) != 0) rc = -1;
    memset(r, 0, sizeof *r);
    return rc;
  }
  return 0;
}

size_t abi_device_max_message(void) {
  if (!abi_device_mode()) return SIZE_MAX;
  /* By GPUDirect RDMA (registered by DMA-BUF) or staged in pieces through a bounce buffer,
   * the staging bounds no message: 256 MiB (registered buffers send up to 1 GiB per isend:
   * NCCL_MAX_NET_SIZE), kept below that because the emulated device memory is the
   * machine's. */
  return (size_t)256 << 20;
}

size_t abi_device_max_coll(void) {
  return abi_device_mode() ? (size_t)agoq_param_int(AGOQ_PARAM_GPU_STAGING) : SIZE_MAX;
}

long abi_device_rdma_flushes(void) {
  agoq_emu_counters c;
  agoq_emu_counters_get(&c);
  return (long)c.rdma_flushes;
}

int abi_device_dmabuf(const void* p, int* fd, uint64_t* offset) {
  *fd = -1;
  const uint8_t* d = p;
  const abi_dev_twin* t = NULL;
  for (int i = 0; i < ABI_DEV_MAX_BUFS && t == NULL; i++)
    if (abi_twins[i].host != NULL && d >= abi_twins[i].dev && d < abi_twins[i].dev + abi_twins[i].total)
      t = &abi_twins[i];
  if (t == NULL) return -1;
  int (*get)(void*, unsigned long long, size_t, int, unsigned long long) = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", (void**)&get, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      get == NULL)
    return -1;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t base = (uintptr_t)t->dev / page * page;
  uintptr_t end = ((uintptr_t)t->dev + t->total + page - 1) / page * page;
  if (get(fd, (unsigned long long)base, (size_t)(end - base), 1 /* DMA_BUF_FD */, 0) != 0) return -1;
  *offset = (uint64_t)((uintptr_t)d - base);
  return 0;
}

#else /* no emulation in this build: --device is refused by the orchestrator */

bool abi_device_mode(void) { return false; }
int abi_device_alloc(abi_buf* b) { (void)b; return -1; }
void abi_device_free(abi_buf* b) { (void)b; }
void* abi_device_ptr(void* host) { return host; }
int abi_device_push(const void* host, size_t n) { (void)host; (void)n; return 0; }
int abi_device_track_recv(void* req, int n, void** host, const size_t* sizes) {
  (void)req; (void)n; (void)host; (void)sizes;
  return 0;
}
int abi_device_recv_done(void* req) { (void)req; return 0; }
size_t abi_device_max_message(void) { return SIZE_MAX; }
size_t abi_device_max_coll(void) { return SIZE_MAX; }
long abi_device_rdma_flushes(void) { return 0; }
int abi_device_dmabuf(const void* p, int* fd, uint64_t* offset) {
  (void)p;
  (void)offset;
  *fd = -1;
  return -1;
}

#endif
