/*
 * A stand-in for libcudart with the few entry points nccl_multiproc_check uses, so the
 * driver's launcher, id exchange, checks and reporting run in CI without a GPU.
 * "Device" memory is host memory and every operation completes when called.
 * FAKE_CUDA_DEVICES sets the device count (default 1).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int cudaGetDeviceCount(int* count) {
  const char* env = getenv("FAKE_CUDA_DEVICES");
  *count = 1;
  if (env != NULL) {
    /* Strict: a test that misspells the count must fail loudly, not run with 0 devices. */
    char* end = NULL;
    errno = 0;
    long v = strtol(env, &end, 10);
    if (errno != 0 || end == env || *end != '\0' || v < 0 || v > 1024) {
      fprintf(stderr, "fake libcudart: FAKE_CUDA_DEVICES=\"%s\" is not a device count 0..1024\n", env);
      exit(2);
    }
    *count = (int)v;
  }
  return *count > 0 ? 0 : 100; /* cudaErrorNoDevice */
}
EXPORT int cudaSetDevice(int dev) { return 0; }
EXPORT int cudaMalloc(void** p, size_t n) {
  *p = malloc(n != 0 ? n : 1);
  return *p != NULL ? 0 : 2; /* cudaErrorMemoryAllocation */
}
EXPORT int cudaFree(void* p) {
  free(p);
  return 0;
}
EXPORT int cudaMemcpy(void* dst, const void* src, size_t n, int kind) {
  memcpy(dst, src, n);
  return 0;
}
EXPORT int cudaMemset(void* p, int v, size_t n) {
  memset(p, v, n);
  return 0;
}
static int fake_stream;
EXPORT int cudaStreamCreate(void** s) {
  *s = &fake_stream;
  return 0;
}
EXPORT int cudaStreamDestroy(void* s) { return 0; }
EXPORT int cudaStreamQuery(void* s) { return 0; }
EXPORT int cudaDeviceGetPCIBusId(char* buf, int len, int dev) {
  strncpy(buf, "0000:00:00.0", (size_t)len);
  return 0;
}
/* CUDA's own text for the one error the fake returns, so callers that print it (the
 * stand-in nccl-tests does, as nccl-tests does) are recognised by tools/gpu-check.sh. */
EXPORT const char* cudaGetErrorString(int e) {
  if (e == 0) return "no error";
  if (e == 100) return "no CUDA-capable device is detected";
  return "fake error";
}
