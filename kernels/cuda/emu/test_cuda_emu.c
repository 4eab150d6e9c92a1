/*
 * The CUDA emulation is strict where a GPU is (emu/include/cuda_runtime_api.h): host code
 * cannot read device memory, copies must name the right direction, kernels reach only
 * device and pinned memory, and work on a stream is done only once its event or stream says
 * so. These are the properties the plugin's device-buffer tests rely on to fail when the
 * plugin gets them wrong.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "agoq_codec_cuda.h"
#include "cuda_runtime_api.h"

static agoq_emu_counters counters(void) {
  agoq_emu_counters c;
  agoq_emu_counters_get(&c);
  return c;
}

/* Runs fn in a child; true when the child did not get through it (a fault ended it). */
static bool faults(void (*fn)(void*), void* arg) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* Not cmocka's handler (it would go on with the other tests in the child), nor ASan's. */
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    fn(arg);
    _exit(42); /* got through */
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  if (WIFEXITED(st)) assert_int_equal(WEXITSTATUS(st), 42);
  return WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
}

static void read_byte(void* p) {
  volatile uint8_t v = *(volatile uint8_t*)p;
  (void)v;
}

static void write_byte(void* p) { *(volatile uint8_t*)p = 1; }

static void test_host_cannot_touch_device_memory(void** state) {
  (void)state;
  void* d = NULL;
  assert_int_equal(cudaMalloc(&d, 4096), cudaSuccess);
  assert_non_null(d);
  assert_int_equal((uintptr_t)d % 256, 0);
  assert_true(faults(read_byte, d));
  assert_true(faults(write_byte, (uint8_t*)d + 100));
  /* Pinned host memory is host memory. */
  void* h = NULL;
  assert_int_equal(cudaMallocHost(&h, 4096), cudaSuccess);
  assert_false(faults(read_byte, h));
  assert_int_equal(cudaFree(d), cudaSuccess);
  assert_int_equal(cudaFreeHost(h), cudaSuccess);
}

static void test_pointer_attributes(void** state) {
  (void)state;
  void *d = NULL, *h = NULL;
  char pageable[16];
  assert_int_equal(cudaMalloc(&d, 1000), cudaSuccess);
  assert_int_equal(cudaHostAlloc(&h, 1000, cudaHostAllocPortable), cudaSuccess);
  struct cudaPointerAttributes a;
  assert_int_equal(cudaPointerGetAttributes(&a, (char*)d + 999), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeDevice);
  assert_int_equal(a.device, 0);
  assert_int_equal(cudaPointerGetAttributes(&a, h), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeHost);
  assert_ptr_equal(a.hostPointer, h);
  assert_int_equal(cudaPointerGetAttributes(&a, pageable), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeUnregistered);
  /* Only the pointer cudaMalloc returned can be freed, and by the right call. */
  assert_int_equal(cudaFree((char*)d + 1), cudaErrorInvalidDevicePointer);
  assert_int_equal(cudaFreeHost(d), cudaErrorInvalidValue);
  assert_int_equal(cudaFree(h), cudaErrorInvalidDevicePointer);
  agoq_emu_counters c = counters();
  assert_true(c.device_allocs >= 1 && c.pinned_allocs >= 1);
  assert_int_equal(cudaFree(d), cudaSuccess);
  assert_int_equal(cudaFreeHost(h), cudaSuccess);
  (void)cudaGetLastError();
}

/* The driver's cuMemGetAddressRange through the runtime: the allocation holding a pointer,
 * nothing for host memory; any other symbol is not found. */
static void test_driver_address_range(void** state) {
  (void)state;
  typedef int (*range_fn)(unsigned long long*, size_t*, unsigned long long);
  void* fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
  assert_int_equal(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &q),
                   cudaErrorSymbolNotFound);
  assert_int_equal(q, cudaDriverEntryPointSymbolNotFound);
  assert_null(fn);
  (void)cudaGetLastError();
  assert_int_equal(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q),
                   cudaSuccess);
  assert_int_equal(q, cudaDriverEntryPointSuccess);
  range_fn range = (range_fn)fn;
  uint8_t* d = NULL;
  assert_int_equal(cudaMalloc((void**)&d, 1000), cudaSuccess);
  unsigned long long base = 0;
  size_t size = 0;
  assert_int_equal(range(&base, &size, (unsigned long long)(uintptr_t)(d + 999)), 0);
  assert_int_equal(base, (unsigned long long)(uintptr_t)d);
  assert_int_equal(size, 1000);
  char host[16];
  assert_int_not_equal(range(&base, &size, (unsigned long long)(uintptr_t)host), 0);
  assert_int_equal(cudaFree(d), cudaSuccess);
}

static void test_copy_directions(void** state) {
  (void)state;
  void *d = NULL, *d2 = NULL, *h = NULL;
  char pageable[256] = {0};
  assert_int_equal(cudaMalloc(&d, 256), cudaSuccess);
  assert_int_equal(cudaMalloc(&d2, 256), cudaSuccess);
  assert_int_equal(cudaMallocHost(&h, 256), cudaSuccess);
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(d, h, 256, cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(d, pageable, 256, cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(h, d, 256, cudaMemcpyDeviceToHost, s), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(d2, d, 256, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(h, d, 256, cudaMemcpyDefault, s), cudaSuccess);
  /* The wrong direction, a range past the allocation, a host pointer where device memory belongs. */
  assert_int_equal(cudaMemcpyAsync(h, d, 256, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpyAsync(d, h, 256, cudaMemcpyDeviceToHost, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpyAsync(d2, h, 256, cudaMemcpyDeviceToDevice, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpyAsync(h, pageable, 256, cudaMemcpyDeviceToHost, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpyAsync((char*)d + 1, h, 256, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemsetAsync(h, 0, 16, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemsetAsync(d, 0, 257, s), cudaErrorInvalidValue);
  assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  cudaFree(d);
  cudaFree(d2);
  cudaFreeHost(h);
}

/* Work on a stream is not done until its event says so, and asking is what moves it. */
static void test_work_is_done_only_when_its_event_says_so(void** state) {
  (void)state;
  enum { N = 1 << 16 };
  uint8_t *h_in = NULL, *h_out = NULL;
  void* d = NULL;
  assert_int_equal(cudaMallocHost((void**)&h_in, N), cudaSuccess);
  assert_int_equal(cudaMallocHost((void**)&h_out, N), cudaSuccess);
  assert_int_equal(cudaMalloc(&d, N), cudaSuccess);
  for (int i = 0; i < N; i++) h_in[i] = (uint8_t)(i * 7 + 1);
  memset(h_out, 0, N);
  agoq_emu_counters before = counters();
  cudaStream_t s;
  cudaEvent_t e;
  assert_int_equal(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -1), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(d, h_in, N, cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(h_out, d, N, cudaMemcpyDeviceToHost, s), cudaSuccess);
  assert_int_equal(cudaEventRecord(e, s), cudaSuccess);
  for (int i = 0; i < N; i++) assert_int_equal(h_out[i], 0); /* nothing has run */
  int not_ready = 0;
  cudaError_t q;
  while ((q = cudaEventQuery(e)) == cudaErrorNotReady) not_ready++;
  assert_int_equal(q, cudaSuccess);
  assert_int_equal(not_ready, 2); /* one query runs one operation: two copies, then the record */
  assert_memory_equal(h_out, h_in, N);
  assert_int_equal(cudaStreamQuery(s), cudaSuccess);
  agoq_emu_counters after = counters();
  assert_int_equal(after.legacy_stream_ops, before.legacy_stream_ops);
  assert_int_equal(after.sync_calls, before.sync_calls);
  assert_int_equal(after.ops_run - before.ops_run, 3);
  /* A destroyed stream's queued work still runs. */
  memset(h_out, 0, N);
  assert_int_equal(cudaMemcpyAsync(h_out, d, N, cudaMemcpyDeviceToHost, s), cudaSuccess);
  assert_int_equal(cudaEventRecord(e, s), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  assert_int_equal(cudaEventSynchronize(e), cudaSuccess);
  assert_memory_equal(h_out, h_in, N);
  assert_int_equal(cudaEventDestroy(e), cudaSuccess);
  cudaFree(d);
  cudaFreeHost(h_in);
  cudaFreeHost(h_out);
}

/* Streams are independent: polling one never runs another's work, a wait joins them, and
 * the legacy stream does not wait for non-blocking streams. */
static void test_streams_are_independent(void** state) {
  (void)state;
  enum { N = 4096 };
  uint8_t *h_in = NULL, *h_out = NULL, *h_out2 = NULL;
  void* d = NULL;
  assert_int_equal(cudaMallocHost((void**)&h_in, N), cudaSuccess);
  assert_int_equal(cudaMallocHost((void**)&h_out, N), cudaSuccess);
  assert_int_equal(cudaMallocHost((void**)&h_out2, N), cudaSuccess);
  assert_int_equal(cudaMalloc(&d, N), cudaSuccess);
  for (int i = 0; i < N; i++) h_in[i] = (uint8_t)(i * 13 + 5);
  memset(h_out, 0, N);
  memset(h_out2, 0, N);
  cudaStream_t a, b;
  cudaEvent_t ea, eb;
  assert_int_equal(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&ea, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&eb, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(d, h_in, N, cudaMemcpyHostToDevice, a), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(h_out, d, N, cudaMemcpyDeviceToHost, a), cudaSuccess);
  assert_int_equal(cudaEventRecord(ea, a), cudaSuccess);
  for (int i = 0; i < 100; i++) assert_int_equal(cudaStreamQuery(b), cudaSuccess); /* the wrong stream */
  assert_int_equal(cudaEventQuery(eb), cudaSuccess);                                /* never recorded */
  assert_int_equal(h_out[0], 0);
  /* Work on the legacy stream does not wait for a non-blocking stream. */
  uint8_t* h_legacy = NULL;
  assert_int_equal(cudaMallocHost((void**)&h_legacy, 1), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(h_legacy, h_in, 1, cudaMemcpyHostToHost, NULL), cudaSuccess);
  assert_int_equal(h_legacy[0], h_in[0]);
  assert_int_equal(h_out[0], 0);
  /* b waits for ea: its copy runs after a's, and synchronizing b runs a's work first. */
  assert_int_equal(cudaStreamWaitEvent(b, ea, 0), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(h_out2, d, N, cudaMemcpyDeviceToHost, b), cudaSuccess);
  assert_int_equal(cudaEventRecord(eb, b), cudaSuccess);
  assert_int_equal(cudaEventSynchronize(eb), cudaSuccess);
  assert_memory_equal(h_out2, h_in, N);
  assert_memory_equal(h_out, h_in, N);
  assert_int_equal(cudaEventQuery(ea), cudaSuccess);
  assert_int_equal(cudaEventDestroy(ea), cudaSuccess);
  assert_int_equal(cudaEventDestroy(eb), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(a), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(b), cudaSuccess);
  cudaFree(d);
  cudaFreeHost(h_in);
  cudaFreeHost(h_out);
  cudaFreeHost(h_out2);
  cudaFreeHost(h_legacy);
}

static void test_legacy_stream_and_sync_calls_are_counted(void** state) {
  (void)state;
  void *d = NULL, *h = NULL;
  assert_int_equal(cudaMalloc(&d, 64), cudaSuccess);
  assert_int_equal(cudaMallocHost(&h, 64), cudaSuccess);
  agoq_emu_counters a = counters();
  assert_int_equal(cudaMemcpyAsync(d, h, 64, cudaMemcpyHostToDevice, NULL), cudaSuccess);
  agoq_emu_counters b = counters();
  assert_int_equal(b.legacy_stream_ops - a.legacy_stream_ops, 1);
  assert_int_equal(b.sync_calls, a.sync_calls);
  assert_int_equal(cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(cudaMemset(d, 0, 64), cudaSuccess);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  agoq_emu_counters c = counters();
  assert_int_equal(c.sync_calls - b.sync_calls, 3);
  assert_int_equal(c.legacy_stream_ops, b.legacy_stream_ops);
  cudaFree(d);
  cudaFreeHost(h);
}

/* A kernel given pageable memory is refused at launch; given device memory, it runs when
 * the stream is asked, and its result is visible only through a copy. */
static void test_kernels_reach_only_device_and_pinned_memory(void** state) {
  (void)state;
  enum { N = 4096 };
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  size_t cap = agoq_frame_size_max(&p, N);
  float* h_src = NULL;
  agoq_cuda_codec_result* res = NULL;
  void *d_src = NULL, *d_frame = NULL, *ws = NULL;
  assert_int_equal(cudaMallocHost((void**)&h_src, N * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMallocHost((void**)&res, sizeof *res), cudaSuccess);
  assert_int_equal(cudaMalloc(&d_src, N * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMalloc(&d_frame, cap), cudaSuccess);
  assert_int_equal(cudaMalloc(&ws, AGOQ_CUDA_CODEC_WORKSPACE_SIZE), cudaSuccess);
  for (int i = 0; i < N; i++) h_src[i] = (float)(i % 97) * 0.25f - 3.0f;
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);

  float* pageable = malloc(N * sizeof(float));
  assert_non_null(pageable);
  memcpy(pageable, h_src, N * sizeof(float));
  assert_int_equal(agoq_cuda_frame_encode(&p, pageable, N, d_frame, cap, ws, res, s), AGOQ_CUDA_CODEC_ECUDA);
  assert_int_equal(agoq_cuda_codec_last_error(), cudaErrorInvalidDevicePointer);
  free(pageable);

  memset(res, 0, sizeof *res);
  assert_int_equal(cudaMemcpyAsync(d_src, h_src, N * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(agoq_cuda_frame_encode(&p, d_src, N, d_frame, cap, ws, res, s), AGOQ_CODEC_OK);
  assert_int_equal(res->body_len, 0); /* queued, not run */
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(res->status, AGOQ_CODEC_OK);
  size_t len = (size_t)res->body_len + AGOQ_FRAME_HEADER_SIZE;
  assert_true(len <= cap);
  uint8_t* frame = malloc(cap);
  assert_non_null(frame);
  assert_int_equal(cudaMemcpy(frame, d_frame, len, cudaMemcpyDeviceToHost), cudaSuccess);
  float* back = malloc(N * sizeof(float));
  assert_non_null(back);
  assert_int_equal(agoq_frame_decode(frame, len, AGOQ_DTYPE_FP32, back, N), AGOQ_CODEC_OK);
  /* The CPU codec decodes the emulated kernels' frame: the same frames, bit for bit. */
  uint8_t* cpu = malloc(cap);
  assert_non_null(cpu);
  size_t cpu_len = 0;
  assert_int_equal(agoq_frame_encode(&p, h_src, N, false, cpu, cap, &cpu_len), AGOQ_CODEC_OK);
  assert_int_equal(cpu_len, len);
  assert_memory_equal(cpu, frame, len);
  free(cpu);
  free(back);
  free(frame);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  cudaFree(d_src);
  cudaFree(d_frame);
  cudaFree(ws);
  cudaFreeHost(h_src);
  cudaFreeHost(res);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_cannot_touch_device_memory),
      cmocka_unit_test(test_pointer_attributes),
      cmocka_unit_test(test_copy_directions),
      cmocka_unit_test(test_driver_address_range),
      cmocka_unit_test(test_work_is_done_only_when_its_event_says_so),
      cmocka_unit_test(test_streams_are_independent),
      cmocka_unit_test(test_legacy_stream_and_sync_calls_are_counted),
      cmocka_unit_test(test_kernels_reach_only_device_and_pinned_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
