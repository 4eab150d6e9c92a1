/*
 * agoq-perf p2p --device: NCCL's buffers in device memory, as NCCL hands them over with
 * GPUDirect on (regMr NCCL_PTR_CUDA). Only in a build with the CUDA emulation
 * (kernels/cuda/emu, libagoq-cuda-emu.so), against the test plugin built over the same
 * emulation (libnccl-net-agoq-emu.so): both link the one shared library, so they see one
 * device. This is not the real CUDA runtime: on a machine with a GPU, --device would need
 * agoq-perf built against it (and the real plugin), which this build does not do.
 *
 * The host buffers stay where the payload is written and checked; each has a device twin
 * of the same size, whose address is what the plugin gets. The sender copies its bytes to
 * the twin before the isends that read them, as a kernel would have written them; the
 * receiver copies a message back when test() says it is done, so every check sees what the
 * plugin put into device memory at that moment. Those copies are synchronous (cudaMemcpy)
 * and complete none of the plugin's own stream work. The emulation's device memory faults
 * when host code touches it: a plugin that read or wrote it from the host fails here.
 */
#include <stdio.h>

#include "perf.h"

#ifdef AGOQ_PERF_DEVICE
#include <cuda_runtime_api.h>

void* perf_device_twin(const void* host, size_t bytes) {
  void* d = NULL;
  if (bytes == 0) bytes = 1;
  cudaError_t e = cudaMalloc(&d, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    fprintf(stderr, "agoq-perf: --device: a device buffer of %zu B: %s\n", bytes, cudaGetErrorString(e));
    if (d != NULL) cudaFree(d);
    return NULL;
  }
  return d;
}

void perf_device_free(void* dev) {
  if (dev != NULL) cudaFree(dev);
}

int perf_device_push(void* dev, const void* host, size_t bytes) {
  if (bytes == 0) return 0;
  cudaError_t e = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "agoq-perf: --device: copy of %zu B to the device: %s\n", bytes, cudaGetErrorString(e));
  return -1;
}

int perf_device_pull(void* host, const void* dev, size_t bytes) {
  if (bytes == 0) return 0;
  cudaError_t e = cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "agoq-perf: --device: copy of %zu B from the device: %s\n", bytes, cudaGetErrorString(e));
  return -1;
}

#else /* no emulation in this build: --device is refused when the options are parsed */

void* perf_device_twin(const void* host, size_t bytes) {
  (void)host;
  (void)bytes;
  return NULL;
}
void perf_device_free(void* dev) { (void)dev; }
int perf_device_push(void* dev, const void* host, size_t bytes) {
  (void)dev;
  (void)host;
  (void)bytes;
  return -1;
}
int perf_device_pull(void* host, const void* dev, size_t bytes) {
  (void)host;
  (void)dev;
  (void)bytes;
  return -1;
}

#endif
