/*
 * --device: the collectives with NCCL's buffers in device memory, as NCCL's proxy hands them
 * to a CollNet plugin with GPUDirect on (regMr NCCL_PTR_CUDA). Run against the test plugin
 * built over the CUDA emulation (libnccl-net-agoq-emu.so), whose device memory the host
 * cannot touch.
 *
 * The scenarios keep building inputs in and checking their host arenas. In device mode each
 * arena has a device twin of the same size and layout, guards included, filled from the
 * host bytes when it is made; the plugin gets the twin's addresses and its registration.
 * Before a call the harness copies the call's input bytes to the twin again, as the
 * kernel before NCCL's proxy step would have written them; when test() says the call is
 * done it copies the call's result bytes back, so the checks see what the plugin had put
 * into device memory at that moment (collnet_cases.c). The harness's copies are
 * synchronous; they do not complete the plugin's own stream work, so a plugin that says
 * done before its copy into device memory has run leaves stale bytes here.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collnet_harness.h"
#include "core/agoq_params.h"

#ifdef CN_HAVE_DEVICE
#include <cuda_runtime_api.h>

#define CN_DEV_MAX_TWINS 8

typedef struct {
  uint8_t* host;
  uint8_t* dev;
  size_t size;
} cn_dev_twin;

static cn_dev_twin cn_twins[CN_DEV_MAX_TWINS];

bool cn_device_available(void) { return true; }

static cn_dev_twin* cn_twin_of(const void* p) {
  const uint8_t* h = p;
  for (int i = 0; i < CN_DEV_MAX_TWINS; i++) {
    cn_dev_twin* t = &cn_twins[i];
    /* the end too: a 0-byte buffer may sit there */
    if (t->host != NULL && h >= t->host && h <= t->host + t->size) return t;
  }
  return NULL;
}

int cn_device_alloc(void* host, size_t size) {
  for (int i = 0; i < CN_DEV_MAX_TWINS; i++) {
    cn_dev_twin* t = &cn_twins[i];
    if (t->host != NULL) continue;
    void* d = NULL;
    if (cudaMalloc(&d, size) != cudaSuccess) return -1;
    if (cudaMemcpy(d, host, size, cudaMemcpyHostToDevice) != cudaSuccess) {
      cudaFree(d);
      return -1;
    }
    *t = (cn_dev_twin){.host = host, .dev = d, .size = size};
    return 0;
  }
  return -1;
}

void cn_device_free(void* host) {
  for (int i = 0; i < CN_DEV_MAX_TWINS; i++) {
    cn_dev_twin* t = &cn_twins[i];
    if (t->host == NULL || t->host != host) continue;
    cudaFree(t->dev);
    memset(t, 0, sizeof *t);
  }
}

void* cn_device_ptr(void* host) {
  cn_dev_twin* t = cn_twin_of(host);
  return t == NULL ? host : t->dev + ((uint8_t*)host - t->host);
}

/* [p, p + n) one way between the host arena and its twin; 0 ok (also without a twin). */
static int cn_device_move(void* p, size_t n, bool to_device) {
  cn_dev_twin* t = cn_twin_of(p);
  if (t == NULL || n == 0) return 0;
  size_t off = (size_t)((uint8_t*)p - t->host);
  if (n > t->size - off) return -1;
  cudaError_t e = to_device ? cudaMemcpy(t->dev + off, p, n, cudaMemcpyHostToDevice)
                            : cudaMemcpy(p, t->dev + off, n, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? 0 : -1;
}

int cn_device_push(void* host, size_t n) { return cn_device_move(host, n, true); }
int cn_device_pull(void* host, size_t n) { return cn_device_move(host, n, false); }

int cn_device_read(const void* host, void* out, size_t n) {
  cn_dev_twin* t = cn_twin_of(host);
  if (t == NULL) return -1;
  size_t off = (size_t)((const uint8_t*)host - t->host);
  if (n > t->size - off) return -1;
  return cudaMemcpy(out, t->dev + off, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

size_t cn_device_max_call(void) {
  return cn_device_mode() ? (size_t)agoq_param_int(AGOQ_PARAM_GPU_STAGING) : SIZE_MAX;
}

#else /* no emulation in this build: --device is refused by the orchestrator */

bool cn_device_available(void) { return false; }
int cn_device_alloc(void* host, size_t size) { (void)host; (void)size; return -1; }
void cn_device_free(void* host) { (void)host; }
void* cn_device_ptr(void* host) { return host; }
int cn_device_push(void* host, size_t n) { (void)host; (void)n; return 0; }
int cn_device_pull(void* host, size_t n) { (void)host; (void)n; return 0; }
int cn_device_read(const void* host, void* out, size_t n) {
  (void)host; (void)out; (void)n;
  return -1;
}
size_t cn_device_max_call(void) { return SIZE_MAX; }

#endif

/* Set by --device for the workers, which inherit it (collnet_main.c). */
bool cn_device_mode(void) {
  const char* v = getenv("AGOQ_COLLNET_DEVICE");
  return cn_device_available() && v != NULL && strcmp(v, "1") == 0;
}
