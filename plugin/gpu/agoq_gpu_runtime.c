/* The process's view of the CUDA runtime: AGOQ_GPU, device discovery, device-memory
 * checks. Compiled against whichever cuda_runtime_api.h the build gives it (the toolkit's
 * or the emulation's, agoq_gpu.h). */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "gpu/agoq_gpu.h"
#include "gpu/agoq_gpu_internal.h"

/* The driver's cuMemGetAddressRange_v2 (CUdeviceptr is 64 bits, CUDA_SUCCESS 0), reached
 * through the runtime without linking the driver API: the exact bounds of an allocation. */
typedef int (*agoq_cu_mem_range_fn)(unsigned long long* base, size_t* size, unsigned long long ptr);

static struct {
  pthread_mutex_t mu;
  bool done;
  ncclResult_t res;
  bool active;
  char describe[480];
  agoq_cu_mem_range_fn mem_range; /* NULL: only both ends of a range can be checked */
} agoq_gpu_state = {.mu = PTHREAD_MUTEX_INITIALIZER};

const char* agoq_gpu_backend(void) { return AGOQ_GPU_BACKEND; }

ncclResult_t agoq_gpu_cuda_error(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ncclSuccess;
  AGOQ_WARN("%s failed: %s (%s, %d)", what, cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
  (void)cudaGetLastError(); /* runtime errors are sticky per thread until read */
  return ncclUnhandledCudaError;
}

/* cudaErrorInsufficientDriver's documented value (the emulation's header has no name for it). */
#define AGOQ_CUDA_ERROR_INSUFFICIENT_DRIVER 35

void agoq_gpu_start_failure(int cuda_error, const char* runtime_text, const char* driver_lib, char* out,
                            size_t len) {
  if (cuda_error != AGOQ_CUDA_ERROR_INSUFFICIENT_DRIVER) {
    snprintf(out, len, "%s", runtime_text);
    return;
  }
  void* h = dlopen(driver_lib, RTLD_LAZY | RTLD_LOCAL);
  if (h == NULL) {
    const char* why = dlerror();
    snprintf(out, len, "no CUDA driver (%s cannot be loaded: %.120s)", driver_lib, why != NULL ? why : "not found");
    return;
  }
  /* cuDriverGetVersion(int*): CUDA_SUCCESS is 0; 12040 means 12.4. */
  int (*get_version)(int*) = (int (*)(int*))dlsym(h, "cuDriverGetVersion");
  int v = 0;
  if (get_version != NULL && get_version(&v) == 0 && v > 0) {
#ifdef CUDART_VERSION
    snprintf(out, len, "the CUDA driver supports CUDA %d.%d, older than this build's runtime (CUDA %d.%d): update the driver",
             v / 1000, v % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
#else
    snprintf(out, len, "the CUDA driver supports CUDA %d.%d, older than this build's runtime", v / 1000, v % 1000 / 10);
#endif
  } else {
    snprintf(out, len, "%s (the driver, %s, does not say which CUDA it supports)", runtime_text, driver_lib);
  }
  dlclose(h);
}

/* A driver API function through the runtime (no link to libcuda), as the CUDA 12 runtime API
 * names it (cudaVersion 12000: the _v2, 64-bit-size symbols); NULL when the driver lacks it. */
static void* agoq_gpu_driver_symbol(const char* name) {
  void* fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    return fn;
  (void)cudaGetLastError();
  return NULL;
}

/* The driver's cuCtxGetCurrent and cuCtxSetCurrent (CUcontext is a pointer, CUDA_SUCCESS 0),
 * reached through the runtime; NULL both where the driver lacks either. */
typedef int (*agoq_cu_ctx_get_fn)(void** ctx);
typedef int (*agoq_cu_ctx_set_fn)(void* ctx);
static pthread_once_t agoq_gpu_ctx_once = PTHREAD_ONCE_INIT;
static agoq_cu_ctx_get_fn agoq_gpu_ctx_get_fn;
static agoq_cu_ctx_set_fn agoq_gpu_ctx_set_fn;

static void agoq_gpu_ctx_resolve(void) {
  agoq_cu_ctx_get_fn get = (agoq_cu_ctx_get_fn)agoq_gpu_driver_symbol("cuCtxGetCurrent");
  agoq_cu_ctx_set_fn set = (agoq_cu_ctx_set_fn)agoq_gpu_driver_symbol("cuCtxSetCurrent");
  if (get != NULL && set != NULL) {
    agoq_gpu_ctx_get_fn = get;
    agoq_gpu_ctx_set_fn = set;
  }
}

bool agoq_gpu_ctx_supported(void) {
  (void)pthread_once(&agoq_gpu_ctx_once, agoq_gpu_ctx_resolve);
  return agoq_gpu_ctx_get_fn != NULL;
}

void* agoq_gpu_ctx_current(void) {
  void* ctx = NULL;
  if (agoq_gpu_ctx_supported() && agoq_gpu_ctx_get_fn(&ctx) != 0) ctx = NULL;
  return ctx;
}

ncclResult_t agoq_gpu_ctx_set(void* ctx) {
  if (!agoq_gpu_ctx_supported()) return ncclInternalError;
  int rc = agoq_gpu_ctx_set_fn(ctx);
  if (rc == 0) return ncclSuccess;
  AGOQ_WARN("GPU: cuCtxSetCurrent(%p) failed: CUresult %d", ctx, rc);
  return ncclUnhandledCudaError;
}

/* cuModuleGetLoadingMode (CUmoduleLoadingMode: 1 eager, 2 lazy), reached through the runtime. */
typedef int (*agoq_cu_loading_mode_fn)(int* mode);

/* What makes the plugin's own CUDA calls hang a job, as far as this process shows it. The data
 * path's copies, launches and event queries run on NCCL's proxy thread while NCCL's kernel
 * waits for their result; measured on an H200 (docs/gpu-h200.md, 2026-12-04,
 * tools/gpu/gpu_hazards): another thread's cudaFree holds the runtime until every running
 * kernel is done, so the plugin's next call blocks and NCCL's kernel never finishes (under lazy
 * and eager loading alike: no setting rules it out, hence auto keeps the path off); under lazy
 * loading a first load of any kernel, by any thread, holds back the plugin's copy until NCCL's
 * kernel ends (the CollNet GPU reduction hung so in nccl-tests); with one hardware queue
 * (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron-LM sets) the copy waits behind NCCL's next
 * kernel. (NCCL_CREATE_THREAD_CONTEXT=1, NCCL's proxy threads in a private CUDA context, is
 * not a hazard: every call of a link runs in the context that made it, agoq_gpu_link.c.) */
static void agoq_gpu_hang_hazards(char* out, size_t len) {
  int mode = 0;
  agoq_cu_loading_mode_fn loading_mode = (agoq_cu_loading_mode_fn)agoq_gpu_driver_symbol("cuModuleGetLoadingMode");
  if (loading_mode != NULL && loading_mode(&mode) != 0) mode = 0;
  /* Read as the driver reads it: a decimal count, 8 when unset. */
  const char* conn = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  bool one_queue = conn != NULL && atoi(conn) == 1;
  snprintf(out, len, "another thread's cudaFree blocks its CUDA calls while NCCL's kernel waits for them%s%s",
           mode == 2 ? "; lazy module loading (the driver's mode)" : mode == 0 ? "; module loading mode unknown" : "",
           one_queue ? "; CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue)" : "");
}

static ncclResult_t agoq_gpu_probe_locked(void) {
  int64_t mode = agoq_param_int(AGOQ_PARAM_GPU);
  if (mode == AGOQ_GPU_MODE_OFF) {
    snprintf(agoq_gpu_state.describe, sizeof agoq_gpu_state.describe, "off: AGOQ_GPU=off");
    return ncclSuccess;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    /* No driver, no device, or a driver older than the runtime: the host path still works. */
    char why[160] = "no CUDA device";
    if (e != cudaSuccess) agoq_gpu_start_failure((int)e, cudaGetErrorString(e), "libcuda.so.1", why, sizeof why);
    snprintf(agoq_gpu_state.describe, sizeof agoq_gpu_state.describe, "off: %s", why);
    (void)cudaGetLastError();
    if (mode == AGOQ_GPU_MODE_ON) {
      AGOQ_WARN("AGOQ_GPU=on but the GPU data path cannot start: %s (backend %s)", agoq_gpu_state.describe + 5,
                AGOQ_GPU_BACKEND);
      return ncclInvalidUsage;
    }
    return ncclSuccess;
  }
  struct cudaDeviceProp prop;
  memset(&prop, 0, sizeof prop);
  int dev = 0;
  (void)cudaGetDevice(&dev);
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(prop.name, sizeof prop.name, "device %d", dev);
  }
  agoq_gpu_state.mem_range = (agoq_cu_mem_range_fn)agoq_gpu_driver_symbol("cuMemGetAddressRange");
  if (agoq_gpu_state.mem_range == NULL) {
    AGOQ_INFO(NCCL_INIT, "GPU: the driver's cuMemGetAddressRange is not available: device ranges are checked at "
              "both ends only");
  }
  char hazards[320];
  agoq_gpu_hang_hazards(hazards, sizeof hazards);
  if (mode != AGOQ_GPU_MODE_ON) {
    snprintf(agoq_gpu_state.describe, sizeof agoq_gpu_state.describe,
             "off (AGOQ_GPU=auto): the plugin's CUDA calls on NCCL's proxy thread can hang the job (%.*s); "
             "AGOQ_GPU=on turns it on",
             (int)(sizeof agoq_gpu_state.describe - 120), hazards);
    return ncclSuccess;
  }
  AGOQ_WARN("AGOQ_GPU=on: the GPU data path is on although its CUDA calls on NCCL's proxy thread can hang the job: "
            "%s (docs/design-gpu.md)", hazards);
  agoq_gpu_state.active = true;
  snprintf(agoq_gpu_state.describe, sizeof agoq_gpu_state.describe, "on (AGOQ_GPU=on): %d device%s (%.100s), backend %s",
           count, count == 1 ? "" : "s", prop.name, AGOQ_GPU_BACKEND);
  return ncclSuccess;
}

ncclResult_t agoq_gpu_init(void) {
  pthread_mutex_lock(&agoq_gpu_state.mu);
  if (!agoq_gpu_state.done) {
    agoq_gpu_state.res = agoq_gpu_probe_locked();
    agoq_gpu_state.done = true;
    if (agoq_gpu_state.res == ncclSuccess)
      AGOQ_INFO(NCCL_INIT | NCCL_NET, "GPU data path %s", agoq_gpu_state.describe);
  }
  ncclResult_t res = agoq_gpu_state.res;
  pthread_mutex_unlock(&agoq_gpu_state.mu);
  return res;
}

bool agoq_gpu_active(void) {
  pthread_mutex_lock(&agoq_gpu_state.mu);
  bool on = agoq_gpu_state.done && agoq_gpu_state.active;
  pthread_mutex_unlock(&agoq_gpu_state.mu);
  return on;
}

const char* agoq_gpu_describe(void) {
  return agoq_gpu_state.done ? agoq_gpu_state.describe : "off: not initialized";
}

/* Device memory at p, else why not. */
static bool agoq_gpu_is_device(const void* p, int* device, char* why, size_t why_len, const char* which) {
  struct cudaPointerAttributes attr;
  memset(&attr, 0, sizeof attr);
  cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    snprintf(why, why_len, "the runtime does not know the %s byte %p: %s", which, p, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return false;
  }
  if (attr.type != cudaMemoryTypeDevice) {
    snprintf(why, why_len, "the %s byte %p is not device memory (memory type %d)", which, p, (int)attr.type);
    return false;
  }
  *device = attr.device;
  return true;
}

ncclResult_t agoq_gpu_range_check(const void* p, size_t size, int* device, char* why, size_t why_len) {
  if (!agoq_gpu_active()) {
    snprintf(why, why_len, "the GPU data path is %s", agoq_gpu_describe());
    return ncclInvalidUsage;
  }
  if (p == NULL) {
    snprintf(why, why_len, "a NULL device pointer");
    return ncclInvalidUsage;
  }
  int first = -1, last = -1;
  if (!agoq_gpu_is_device(p, &first, why, why_len, "first")) return ncclInvalidUsage;
  /* The driver knows the allocation's bounds: the whole range must lie inside the one that
   * holds its first byte (its last byte in another allocation would pass the ends' check). */
  if (agoq_gpu_state.mem_range != NULL) {
    unsigned long long base = 0;
    size_t alloc = 0;
    uintptr_t a = (uintptr_t)p;
    int rc = agoq_gpu_state.mem_range(&base, &alloc, (unsigned long long)a);
    if (rc != 0) {
      snprintf(why, why_len, "the driver knows no allocation at %p (cuMemGetAddressRange: %d)", p, rc);
      return ncclInvalidUsage;
    }
    if (a < base || size > alloc - (size_t)(a - base)) {
      snprintf(why, why_len, "the range runs past its allocation [%#llx, +%zu bytes)", base, alloc);
      return ncclInvalidUsage;
    }
    *device = first;
    return ncclSuccess;
  }
  /* Both ends in device memory of one device. The runtime API has no allocation bounds
   * query; an end byte past the allocation is unmapped or another allocation's, which a
   * copy would fault on or corrupt, so the ends are what can be checked without the
   * driver API. */
  if (size > 1 && !agoq_gpu_is_device((const char*)p + size - 1, &last, why, why_len, "last")) return ncclInvalidUsage;
  if (size > 1 && last != first) {
    snprintf(why, why_len, "the range spans devices %d and %d", first, last);
    return ncclInvalidUsage;
  }
  *device = first;
  return ncclSuccess;
}
