/* One connection's device resources (agoq_gpu.h): created at setup, used by the data path
 * only to queue copies on the link's stream and to query its events. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"
#include "gpu/agoq_gpu.h"
#include "gpu/agoq_gpu_internal.h"

struct agoq_gpu_link {
  int device;
  cudaStream_t stream;
  cudaEvent_t* events; /* one per request slot */
  uint32_t slots;
  void* staging; /* pinned */
  agoq_gpu_ring ring;
  agoq_gpu_link_stats stats;
};

/* The runtime's calls act on the calling thread's current device; NCCL's proxy thread has
 * its rank's device current, but another caller (a test, CollNet's engine) may not. */
static ncclResult_t agoq_gpu_link_enter(const agoq_gpu_link* l) {
  int cur = -1;
  ncclResult_t res = ncclSuccess;
  AGOQ_CUDA_CHECK_GOTO(cudaGetDevice(&cur), res, out);
  if (cur != l->device) AGOQ_CUDA_CHECK_GOTO(cudaSetDevice(l->device), res, out);
out:
  return res;
}

ncclResult_t agoq_gpu_link_create(int device, size_t staging, uint32_t slots, agoq_gpu_link** out) {
  ncclResult_t res = ncclSuccess;
  agoq_gpu_link* l = NULL;
  *out = NULL;
  AGOQ_CALLOC_GOTO(l, 1, res, fail);
  l->device = device;
  AGOQ_CALLOC_GOTO(l->events, slots, res, fail);
  l->slots = slots;
  AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l), res, fail);
  int least = 0, greatest = 0;
  AGOQ_CUDA_CHECK_GOTO(cudaDeviceGetStreamPriorityRange(&least, &greatest), res, fail);
  /* Non-blocking: never ordered behind the legacy default stream (or NCCL's kernels on
   * it); the greatest priority: the network waits on these copies. */
  AGOQ_CUDA_CHECK_GOTO(cudaStreamCreateWithPriority(&l->stream, cudaStreamNonBlocking, greatest), res, fail);
  for (uint32_t i = 0; i < slots; i++)
    AGOQ_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&l->events[i], cudaEventDisableTiming), res, fail);
  AGOQ_CUDA_CHECK_GOTO(cudaHostAlloc(&l->staging, staging, cudaHostAllocPortable), res, fail);
  if (!agoq_gpu_ring_init(&l->ring, l->staging, staging, slots * 8u)) {
    AGOQ_WARN("out of memory creating a GPU link");
    res = ncclSystemError;
    goto fail;
  }
  *out = l;
  return ncclSuccess;
fail:
  agoq_gpu_link_destroy(l);
  return res;
}

void agoq_gpu_link_destroy(agoq_gpu_link* l) {
  if (l == NULL) return;
  (void)agoq_gpu_link_enter(l);
  /* Copies still queued read or write the staging: they finish before it is freed. Close
   * is the one place the plugin waits for the device. */
  if (l->stream != NULL) (void)agoq_gpu_cuda_error(cudaStreamSynchronize(l->stream), "cudaStreamSynchronize");
  if (l->events != NULL)
    for (uint32_t i = 0; i < l->slots; i++)
      if (l->events[i] != NULL) (void)agoq_gpu_cuda_error(cudaEventDestroy(l->events[i]), "cudaEventDestroy");
  if (l->stream != NULL) (void)agoq_gpu_cuda_error(cudaStreamDestroy(l->stream), "cudaStreamDestroy");
  if (l->staging != NULL) (void)agoq_gpu_cuda_error(cudaFreeHost(l->staging), "cudaFreeHost");
  agoq_gpu_ring_fini(&l->ring);
  free(l->events);
  free(l);
}

int agoq_gpu_link_device(const agoq_gpu_link* l) { return l->device; }
agoq_gpu_ring* agoq_gpu_link_ring(agoq_gpu_link* l) { return &l->ring; }
const agoq_gpu_link_stats* agoq_gpu_link_stats_get(const agoq_gpu_link* l) { return &l->stats; }

static ncclResult_t agoq_gpu_copy(agoq_gpu_link* l, void* dst, const void* src, size_t size, enum cudaMemcpyKind kind,
                                  uint64_t* bytes, uint64_t* copies) {
  ncclResult_t res = ncclSuccess;
  if (size == 0) return ncclSuccess;
  AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l), res, out);
  AGOQ_CUDA_CHECK_GOTO(cudaMemcpyAsync(dst, src, size, kind, l->stream), res, out);
  *bytes += size;
  (*copies)++;
out:
  return res;
}

ncclResult_t agoq_gpu_copy_d2h(agoq_gpu_link* l, void* host, const void* dev, size_t size) {
  return agoq_gpu_copy(l, host, dev, size, cudaMemcpyDeviceToHost, &l->stats.d2h_bytes, &l->stats.d2h_copies);
}

ncclResult_t agoq_gpu_copy_h2d(agoq_gpu_link* l, void* dev, const void* host, size_t size) {
  return agoq_gpu_copy(l, dev, host, size, cudaMemcpyHostToDevice, &l->stats.h2d_bytes, &l->stats.h2d_copies);
}

ncclResult_t agoq_gpu_mark(agoq_gpu_link* l, uint32_t slot) {
  ncclResult_t res = ncclSuccess;
  if (slot >= l->slots) {
    AGOQ_WARN("GPU link: event slot %u out of range (%u)", slot, l->slots);
    return ncclInternalError;
  }
  AGOQ_CHECK_GOTO(agoq_gpu_link_enter(l), res, out);
  AGOQ_CUDA_CHECK_GOTO(cudaEventRecord(l->events[slot], l->stream), res, out);
out:
  return res;
}

ncclResult_t agoq_gpu_poll(agoq_gpu_link* l, uint32_t slot, bool* done) {
  *done = false;
  if (slot >= l->slots) {
    AGOQ_WARN("GPU link: event slot %u out of range (%u)", slot, l->slots);
    return ncclInternalError;
  }
  /* cudaEventQuery needs no current device. */
  cudaError_t e = cudaEventQuery(l->events[slot]);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return ncclSuccess;
  }
  if (e != cudaSuccess) return agoq_gpu_cuda_error(e, "cudaEventQuery");
  *done = true;
  return ncclSuccess;
}
