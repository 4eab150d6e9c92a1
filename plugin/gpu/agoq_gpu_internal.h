/* Shared by the CUDA-runtime sources of plugin/gpu (they include cuda_runtime_api.h). */
#ifndef AGOQ_GPU_INTERNAL_H
#define AGOQ_GPU_INTERNAL_H

#include <cuda_runtime_api.h>

#include "abi/agoq_nccl_common.h"

#ifndef AGOQ_GPU_BACKEND
#error "AGOQ_GPU_BACKEND names the runtime this file is built against (CMake sets it)"
#endif

/* Logs a failed runtime call (what, the error's name and text) and clears the thread's
 * sticky error; ncclSuccess for cudaSuccess. */
ncclResult_t agoq_gpu_cuda_error(cudaError_t e, const char* what);

#define AGOQ_CUDA_CHECK_GOTO(call, res, label)                  \
  do {                                                          \
    (res) = agoq_gpu_cuda_error((call), #call);                 \
    if ((res) != ncclSuccess) goto label;                       \
  } while (0)

#endif
