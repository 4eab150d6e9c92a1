/* Shared by the CUDA-runtime sources of plugin/gpu (they include cuda_runtime_api.h). */
#ifndef AGOQ_GPU_INTERNAL_H
#define AGOQ_GPU_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "abi/agoq_nccl_common.h"

#ifndef AGOQ_GPU_BACKEND
#error "AGOQ_GPU_BACKEND names the runtime this file is built against (CMake sets it)"
#endif

/* Logs a failed runtime call (what, the error's name and text) and clears the thread's
 * sticky error; ncclSuccess for cudaSuccess. */
ncclResult_t agoq_gpu_cuda_error(cudaError_t e, const char* what);

/* The calling thread's CUDA context, by the driver's cuCtxGetCurrent and cuCtxSetCurrent
 * (reached through the runtime, agoq_gpu_runtime.c): supported where the driver has both;
 * current is NULL where none is bound or the driver lacks them; set(NULL) unbinds. */
bool agoq_gpu_ctx_supported(void);
void* agoq_gpu_ctx_current(void);
ncclResult_t agoq_gpu_ctx_set(void* ctx);

#define AGOQ_CUDA_CHECK_GOTO(call, res, label)                  \
  do {                                                          \
    (res) = agoq_gpu_cuda_error((call), #call);                 \
    if ((res) != ncclSuccess) goto label;                       \
  } while (0)

/* Stream capture: NCCL connects lazily and registers buffers during capture, so a link's
 * setup and teardown (allocations, streams, events, a synchronize: calls CUDA may refuse
 * during a capture) can run on NCCL's proxy thread while another thread captures a CUDA graph
 * in Global mode: refused, and that thread's capture invalidated. Relaxed mode around them,
 * as NCCL does around its own proxy allocations (include/alloc.h); the thread's previous
 * mode is put back after. The data path (copies, launches, event records and queries on the
 * link's own stream, never a capturing one) needs no such care. */
static inline enum cudaStreamCaptureMode agoq_gpu_capture_relax(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    mode = cudaStreamCaptureModeRelaxed; /* nothing changed: nothing to put back */
  }
  return mode;
}

static inline void agoq_gpu_capture_restore(enum cudaStreamCaptureMode mode) {
  if (mode != cudaStreamCaptureModeRelaxed && cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess)
    (void)cudaGetLastError();
}

#endif
