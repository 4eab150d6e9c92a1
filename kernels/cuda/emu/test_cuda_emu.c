/*
 * The CUDA emulation is strict where a GPU is (emu/include/cuda_runtime_api.h): host code
 * cannot read device memory, copies must name the right direction, kernels reach only
 * device and pinned memory, and work on a stream is done only once its event or stream says
 * so. These are the properties the plugin's device-buffer tests rely on to fail when the
 * plugin gets them wrong.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>
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
#include "agoq_emu_capture.h"
#include "cuda_runtime_api.h"

/* Every codec kernel loaded on the current device, as the plugin does at setup: a launch of
 * one that is not is refused (test_unloaded_kernel_launch_is_refused). */
static size_t load_codec(void) {
  size_t n = 0;
  const char* failed = "none";
  assert_int_equal(agoq_cuda_codec_load_all(&n, &failed), AGOQ_CODEC_OK);
  assert_null(failed);
  return n;
}
/* Not a code the emulation returns: a result not yet written. */
#define cudaErrorUnknownForTest ((cudaError_t)9999)

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

/* cudaMemcpy2DAsync copies rows; in a range watched as LL128 lines, a copy that writes a
 * line's data and its flag word counts that line (its flag may land first), one that writes
 * only data or only flags does not; a bad pitch or direction is refused. */
static void test_2d_copies_and_ll128_lines(void** state) {
  (void)state;
  enum { LINES = 8, N = LINES * 128 };
  uint8_t* h = NULL;
  void* d = NULL;
  assert_int_equal(cudaMallocHost((void**)&h, N), cudaSuccess);
  assert_int_equal(cudaMalloc(&d, N), cudaSuccess);
  for (int i = 0; i < N; i++) h[i] = (uint8_t)(i * 5 + 3);
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  agoq_emu_watch_ll128(d, N);
  agoq_emu_counters c0 = counters();
  assert_int_equal(cudaMemcpy2DAsync(d, 128, h, 128, 120, LINES, cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(cudaMemcpy2DAsync((char*)d + 120, 128, h + 120, 128, 8, LINES, cudaMemcpyHostToDevice, s),
                   cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(counters().ll128_flag_early, c0.ll128_flag_early);
  uint8_t* back = malloc(N);
  assert_int_equal(cudaMemcpy(back, d, N, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_memory_equal(back, h, N);
  /* One copy over lines 2..4 and half of line 5's data: three lines torn, not the fourth. */
  assert_int_equal(cudaMemcpyAsync((char*)d + 256, h, 3 * 128 + 60, cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(counters().ll128_flag_early, c0.ll128_flag_early + 3);
  agoq_emu_watch_ll128(NULL, 0);
  assert_int_equal(cudaMemcpyAsync(d, h, N, cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(counters().ll128_flag_early, c0.ll128_flag_early + 3); /* not watched */
  assert_int_equal(cudaMemcpy2DAsync(d, 64, h, 128, 120, 2, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpy2DAsync(h, 128, d, 128, 120, 2, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpy2DAsync(d, 128, h, 128, 120, LINES + 1, cudaMemcpyHostToDevice, s),
                   cudaErrorInvalidValue); /* past the allocation */
  assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  free(back);
  cudaFree(d);
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
  load_codec();
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

/* An int8 fp32 encode's buffers: N floats of device memory, its frame, the codec's
 * workspace, a pinned result. */
enum { ENC_N = 1024 };
typedef struct {
  agoq_codec_params p;
  size_t cap;
  agoq_cuda_codec_result* res;
  void *src, *frame, *ws;
} enc_bufs;

static void enc_bufs_alloc(enc_bufs* b) {
  b->p = (agoq_codec_params){.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128};
  b->cap = agoq_frame_size_max(&b->p, ENC_N);
  assert_int_equal(cudaMallocHost((void**)&b->res, sizeof *b->res), cudaSuccess);
  assert_int_equal(cudaMalloc(&b->src, ENC_N * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMalloc(&b->frame, b->cap), cudaSuccess);
  assert_int_equal(cudaMalloc(&b->ws, AGOQ_CUDA_CODEC_WORKSPACE_SIZE), cudaSuccess);
}

static int enc_run(enc_bufs* b, cudaStream_t s) {
  return agoq_cuda_frame_encode(&b->p, b->src, ENC_N, b->frame, b->cap, b->ws, b->res, s);
}

static void enc_bufs_free(enc_bufs* b) {
  assert_int_equal(cudaFree(b->src), cudaSuccess);
  assert_int_equal(cudaFree(b->frame), cudaSuccess);
  assert_int_equal(cudaFree(b->ws), cudaSuccess);
  assert_int_equal(cudaFreeHost(b->res), cudaSuccess);
}

/* Lazy loading at its worst: a kernel not loaded on the device (cudaFuncGetAttributes) is
 * refused at launch, with cudaErrorFunctionNotLoaded and nothing run, where a GPU would load
 * it then, possibly while NCCL's kernel runs. Once loaded, the same call runs. */
static void test_unloaded_kernel_launch_is_refused(void** state) {
  (void)state;
  agoq_emu_kernels_forget();
  unsigned long long loaded = 99, launched = 99;
  assert_int_equal(agoq_emu_kernels_get(0, &loaded, &launched), 0);
  assert_int_equal(loaded, 0);
  assert_int_equal(launched, 0);
  enc_bufs b;
  enc_bufs_alloc(&b);
  agoq_cuda_codec_result* res = b.res;
  assert_int_equal(cudaMemset(b.src, 0, ENC_N * sizeof(float)), cudaSuccess);
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);

  agoq_emu_counters c0 = counters();
  memset(res, 0, sizeof *res);
  assert_int_equal(enc_run(&b, s), AGOQ_CUDA_CODEC_ECUDA);
  assert_int_equal(agoq_cuda_codec_last_error(), cudaErrorFunctionNotLoaded);
  assert_string_equal(agoq_cuda_codec_last_error_string(), "cudaErrorFunctionNotLoaded");
  agoq_emu_counters c1 = counters();
  assert_true(c1.kernels_refused > c0.kernels_refused);
  assert_int_equal(c1.kernels_refused - c0.kernels_refused, c1.kernel_launches - c0.kernel_launches);
  assert_true(agoq_emu_kernel_launches("quantize_kernel<1, 0, 16, 1, 2, false>") >= 1);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(res->body_len, 0); /* nothing ran */
  assert_int_equal(res->status, 0);

  /* cudaFuncGetAttributes loads one kernel: only that one. */
  assert_int_equal(agoq_emu_kernels_get(0, &loaded, &launched), 0);
  assert_int_equal(loaded, 0);
  assert_true(launched >= 1);
  struct cudaFuncAttributes attr;
  assert_int_equal(cudaFuncGetAttributes(&attr, NULL), cudaErrorInvalidDeviceFunction);
  (void)cudaGetLastError();

  size_t n = load_codec();
  assert_true(n > 100);
  assert_int_equal(agoq_emu_kernels_get(0, &loaded, NULL), 0);
  assert_int_equal(loaded, n);
  agoq_emu_counters c2 = counters();
  assert_int_equal(enc_run(&b, s), AGOQ_CODEC_OK);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(res->status, AGOQ_CODEC_OK);
  assert_int_equal(counters().kernels_refused, c2.kernels_refused);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  enc_bufs_free(&b);
}

/* The emulation has one device: its loaded set is kept per device, but a second device to load
 * on (or not) is not emulated (a multi-device emulation is left for later). */
static void test_one_emulated_device(void** state) {
  (void)state;
  int count = 0;
  assert_int_equal(cudaGetDeviceCount(&count), cudaSuccess);
  assert_int_equal(count, 1);
  assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
  assert_int_equal(agoq_emu_kernels_get(1, NULL, NULL), -1);
  assert_int_equal(agoq_emu_kernels_get(0, NULL, NULL), 0);
}

/* Runs every call shape of the codec over every parameter it accepts (format, type, block,
 * rounding), each with an escaped block (NaN) and each output, NONE, empty calls, and the
 * owner's element-wise steps: no launch is refused, and the distinct kernels launched are
 * exactly those agoq_cuda_codec_load_all loaded. A kernel the launch code reaches but the
 * loader does not is refused here (and in every emulated test that reaches it); one the loader
 * loads but no call can launch makes the counts differ. */
/* A batch's table (pinned and device) and workspace for k items of up to n elements, and k
 * pinned results. */
static void batch_mem_alloc(agoq_cuda_batch_mem* m, agoq_cuda_codec_result** res, size_t k, size_t n) {
  m->table_cap = agoq_cuda_batch_table_size(k);
  m->workspace_cap = agoq_cuda_batch_workspace_size(NULL, k, n);
  assert_int_equal(cudaMallocHost(&m->table_host, m->table_cap), cudaSuccess);
  assert_int_equal(cudaMalloc(&m->table_dev, m->table_cap), cudaSuccess);
  assert_int_equal(cudaMalloc(&m->workspace, m->workspace_cap), cudaSuccess);
  assert_int_equal(cudaMallocHost((void**)res, k * sizeof **res), cudaSuccess);
}

static void batch_mem_free(agoq_cuda_batch_mem* m, agoq_cuda_codec_result* res) {
  cudaFreeHost(m->table_host);
  cudaFree(m->table_dev);
  cudaFree(m->workspace);
  cudaFreeHost(res);
}

static void test_loader_loads_exactly_what_calls_launch(void** state) {
  (void)state;
  agoq_emu_kernels_forget();
  const size_t nk = load_codec();
  enum { BLOCK_MAX = AGOQ_CODEC_BLOCK_MAX, N = 2 * BLOCK_MAX + 5 };
  static const agoq_dtype types[] = {AGOQ_DTYPE_FP32, AGOQ_DTYPE_BF16, AGOQ_DTYPE_FP16};
  agoq_cuda_codec_result* res = NULL;
  uint8_t* h_src = NULL;
  void *d_src = NULL, *d_frame = NULL, *d_dst = NULL, *ws = NULL;
  agoq_codec_params pmax = {.format = AGOQ_FORMAT_NONE, .dtype = AGOQ_DTYPE_FP32};
  size_t cap = agoq_frame_size_max(&pmax, N) + 4096;
  for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params q = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP32, .block = AGOQ_CODEC_BLOCK_MIN};
    if (agoq_frame_size_max(&q, N) > cap) cap = agoq_frame_size_max(&q, N);
  }
  assert_int_equal(cudaMallocHost((void**)&res, sizeof *res), cudaSuccess);
  assert_int_equal(cudaMallocHost((void**)&h_src, N * 4), cudaSuccess);
  assert_int_equal(cudaMalloc(&d_src, N * 4), cudaSuccess);
  assert_int_equal(cudaMalloc(&d_frame, cap), cudaSuccess);
  assert_int_equal(cudaMalloc(&d_dst, N * 4), cudaSuccess);
  assert_int_equal(cudaMalloc(&ws, AGOQ_CUDA_CODEC_WORKSPACE_SIZE), cudaSuccess);
  agoq_cuda_batch_mem bm;
  agoq_cuda_codec_result* bres = NULL;
  batch_mem_alloc(&bm, &bres, 2, N);
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  uint8_t header[AGOQ_FRAME_HEADER_SIZE];
  const agoq_emu_counters c0 = counters();
  long calls = 0;
  for (int f = 0; f < AGOQ_FORMAT_COUNT; f++)
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
      for (uint32_t block = AGOQ_CODEC_BLOCK_MIN; block <= BLOCK_MAX; block *= 2)
        for (int stoch = 0; stoch < 2; stoch++) {
          agoq_codec_params p = {.format = (agoq_format)f, .dtype = types[t], .block = block, .stochastic = stoch};
          if (f == AGOQ_FORMAT_NONE) p.block = 0;
          if (agoq_codec_params_check(&p) != AGOQ_CODEC_OK || (f == AGOQ_FORMAT_NONE && (stoch || block > 32)))
            continue;
          /* Values of the type, the first element of the second block a NaN: one escaped block. */
          size_t es = agoq_dtype_size(types[t]);
          for (size_t i = 0; i < N; i++) {
            if (es == 4) {
              float v = (float)((int)(i % 41) - 20) * 0.125f;
              memcpy(h_src + 4 * i, &v, 4);
            } else {
              uint16_t v = (uint16_t)(types[t] == AGOQ_DTYPE_BF16 ? 0x3f80u + i % 64 : 0x3c00u + i % 64);
              memcpy(h_src + 2 * i, &v, 2);
            }
          }
          size_t nan_at = f == AGOQ_FORMAT_NONE ? 1 : block;
          memset(h_src + nan_at * es, 0xff, es);
          assert_int_equal(cudaMemcpyAsync(d_src, h_src, N * es, cudaMemcpyHostToDevice, s), cudaSuccess);
          memset(res, 0, sizeof *res);
          assert_int_equal(agoq_cuda_frame_encode(&p, d_src, N, d_frame, cap, ws, res, s), AGOQ_CODEC_OK);
          assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
          assert_int_equal(res->status, AGOQ_CODEC_OK);
          if (f != AGOQ_FORMAT_NONE) assert_int_equal(res->escaped_blocks, 1);
          const size_t flen = AGOQ_FRAME_HEADER_SIZE + (size_t)res->body_len;
          assert_int_equal(cudaMemcpy(header, d_frame, sizeof header, cudaMemcpyDeviceToHost), cudaSuccess);
          const uint8_t* body = (const uint8_t*)d_frame + AGOQ_FRAME_HEADER_SIZE;
          for (size_t o = 0; o < sizeof types / sizeof types[0]; o++) {
            assert_int_equal(agoq_cuda_frame_decode(header, d_frame, flen, types[o], d_dst, N, ws, res, s),
                             AGOQ_CODEC_OK);
            assert_int_equal(agoq_cuda_dequantize(&p, body, flen - AGOQ_FRAME_HEADER_SIZE, N, types[o], d_dst, ws,
                                                  res, s),
                             AGOQ_CODEC_OK);
            calls += 2;
          }
          assert_int_equal(agoq_cuda_frame_decode_accumulate(header, d_frame, flen, d_dst, N, ws, res, s),
                           AGOQ_CODEC_OK);
          assert_int_equal(
              agoq_cuda_dequantize_accumulate(&p, body, flen - AGOQ_FRAME_HEADER_SIZE, N, d_dst, ws, res, s),
              AGOQ_CODEC_OK);
          if (f != AGOQ_FORMAT_NONE) {
            /* The batched forms (no NONE): the frame again and an empty one, their decodes
             * into every type (the escaped block's batched decode too), and the sum of two. */
            agoq_cuda_encode_item e[2] = {{.src = d_src, .n = N, .frame = d_frame, .cap = cap},
                                          {.src = d_src, .n = 0, .frame = (uint8_t*)d_frame + cap - 64, .cap = 64}};
            /* One table for every call: each waits for the last (its pinned table may be
             * rewritten only once the stream has copied it). */
            assert_int_equal(agoq_cuda_frame_encode_batch(&p, e, 2, &bm, bres, s), AGOQ_CODEC_OK);
            assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
            agoq_cuda_decode_item d[2] = {{.body = body, .body_len = flen - AGOQ_FRAME_HEADER_SIZE, .n = N, .dst = d_dst},
                                          {.body = body, .body_len = flen - AGOQ_FRAME_HEADER_SIZE, .n = N,
                                           .dst = (uint8_t*)d_dst + 2 * N}};
            for (size_t o = 0; o < sizeof types / sizeof types[0]; o++) {
              assert_int_equal(agoq_cuda_dequantize_batch(&p, d, 1, types[o], &bm, bres, s), AGOQ_CODEC_OK);
              assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
            }
            assert_int_equal(agoq_cuda_dequantize_sum(&p, d, 2, N, d_dst, &bm, bres, s), AGOQ_CODEC_OK);
            assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
            assert_int_equal(bres[0].status, AGOQ_CODEC_OK);
            calls += 5;
          }
          /* Empty calls: a frame of no elements (its header only), a body of none. */
          assert_int_equal(agoq_cuda_frame_encode(&p, d_src, 0, d_frame, cap, ws, res, s), AGOQ_CODEC_OK);
          assert_int_equal(agoq_cuda_quantize(&p, d_src, 0, d_frame, cap, ws, res, s), AGOQ_CODEC_OK);
          assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
          assert_int_equal(res->status, AGOQ_CODEC_OK);
          calls += 5;
        }
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    assert_int_equal(agoq_cuda_overflow_to_inf(types[t], d_dst, N, s), AGOQ_CODEC_OK);
    assert_int_equal(agoq_cuda_narrow_fp32(types[t], d_dst, N, d_frame, s), AGOQ_CODEC_OK);
  }
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  const agoq_emu_counters c1 = counters();
  assert_int_equal(c1.kernels_refused, c0.kernels_refused);
  assert_true(c1.kernel_launches - c0.kernel_launches > (unsigned long long)calls);
  assert_true(agoq_emu_kernel_launches("raw_decode_kernel<") > 0);
  assert_true(agoq_emu_kernel_launches("none_decode_kernel<") > 0);
  unsigned long long loaded = 0, launched = 0;
  assert_int_equal(agoq_emu_kernels_get(0, &loaded, &launched), 0);
  print_message("codec kernels: %zu loaded by agoq_cuda_codec_load_all, %llu launched by %ld calls\n", nk, launched,
                calls);
  assert_int_equal(loaded, nk);
  assert_int_equal(launched, nk);
  assert_true(agoq_emu_kernel_launches("sum_kernel<") > 0);
  assert_true(agoq_emu_kernel_launches("raw_decode_batch_kernel<") > 0);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  batch_mem_free(&bm, bres);
  cudaFree(d_src);
  cudaFree(d_frame);
  cudaFree(d_dst);
  cudaFree(ws);
  cudaFreeHost(h_src);
  cudaFreeHost(res);
}

/* A batch is one launch of each of its kernels, whatever its number of items: a CollNet step
 * codes one slice per peer, and per-item calls would launch 4 kernels per peer. */
static unsigned long long batch_launches(size_t k) {
  enum { N = 4096 };
  const agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 32};
  const size_t cap = agoq_frame_size_max(&p, N);
  agoq_cuda_batch_mem bm;
  agoq_cuda_codec_result* bres = NULL;
  batch_mem_alloc(&bm, &bres, k, N);
  void *d_src = NULL, *d_frames = NULL, *d_dst = NULL;
  assert_int_equal(cudaMalloc(&d_src, N * 2), cudaSuccess);
  assert_int_equal(cudaMemset(d_src, 0x3c, N * 2), cudaSuccess);
  assert_int_equal(cudaMalloc(&d_frames, k * cap), cudaSuccess);
  assert_int_equal(cudaMalloc(&d_dst, k * N * 4), cudaSuccess);
  agoq_cuda_encode_item e[16];
  agoq_cuda_decode_item d[16];
  assert_true(k <= 16);
  const agoq_emu_counters c0 = counters();
  for (size_t i = 0; i < k; i++)
    e[i] = (agoq_cuda_encode_item){.src = d_src, .n = N, .frame = (uint8_t*)d_frames + i * cap, .cap = cap};
  assert_int_equal(agoq_cuda_frame_encode_batch(&p, e, k, &bm, bres, NULL), AGOQ_CODEC_OK);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < k; i++) {
    assert_int_equal(bres[i].status, AGOQ_CODEC_OK);
    d[i] = (agoq_cuda_decode_item){.body = (uint8_t*)e[i].frame + AGOQ_FRAME_HEADER_SIZE,
                                   .body_len = (size_t)bres[i].body_len, .n = N, .dst = (uint8_t*)d_dst + i * N * 2};
  }
  assert_int_equal(agoq_cuda_dequantize_batch(&p, d, k, AGOQ_DTYPE_BF16, &bm, bres, NULL), AGOQ_CODEC_OK);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(agoq_cuda_dequantize_sum(&p, d, k, N, d_dst, &bm, bres, NULL), AGOQ_CODEC_OK);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  /* The same items as one sum per item (k sums of one body each, one launch of each kernel). */
  agoq_cuda_sum_group groups[16];
  for (size_t i = 0; i < k; i++) groups[i] = (agoq_cuda_sum_group){.n = N, .acc = (float*)d_dst + i * N};
  assert_int_equal(agoq_cuda_dequantize_sums(&p, d, 1, groups, k, &bm, bres, NULL), AGOQ_CODEC_OK);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < k; i++) assert_int_equal(bres[i].status, AGOQ_CODEC_OK);
  const agoq_emu_counters c1 = counters();
  assert_int_equal(c1.kernels_refused, c0.kernels_refused);
  batch_mem_free(&bm, bres);
  cudaFree(d_src);
  cudaFree(d_frames);
  cudaFree(d_dst);
  return c1.kernel_launches - c0.kernel_launches;
}

static void test_batch_launches_do_not_grow_with_items(void** state) {
  (void)state;
  (void)load_codec();
  const unsigned long long one = batch_launches(1), sixteen = batch_launches(16);
  print_message("batched encode, decode, sum and sums: %llu kernel launches for 1 item, %llu for 16\n", one, sixteen);
  /* encode: quantize, count, scan, raw copy; decode: count, scan, decode; sum and sums: count,
   * scan, sum */
  assert_int_equal(one, 13);
  assert_int_equal(sixteen, one);
}

/* ---- hangs: the context lock, hardware queues, a stand-in for NCCL's kernel ---- */

typedef struct {
  cudaStream_t nccl;       /* NCCL's stream: K1 (the wait item), then K2 */
  cudaStream_t plugin;     /* the plugin's stream: X, the copy K1 waits for */
  unsigned* word;          /* device word K1 waits for */
  unsigned* one;           /* pinned: X's source */
  void* k2_target;         /* K2: a memset into it */
  agoq_emu_wait* k1;
} hang_setup;

/* K1 on NCCL's stream waiting for the device word to be 1, and (with_k2) K2 queued behind
 * it: the job NCCL launched next. The streams are the next two created. */
static void hang_open(hang_setup* h, bool with_k2) {
  memset(h, 0, sizeof *h);
  assert_int_equal(cudaStreamCreateWithPriority(&h->nccl, cudaStreamNonBlocking, -5), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithPriority(&h->plugin, cudaStreamNonBlocking, -5), cudaSuccess);
  assert_int_equal(cudaMalloc((void**)&h->word, 256), cudaSuccess);
  assert_int_equal(cudaMemset(h->word, 0, 256), cudaSuccess);
  assert_int_equal(cudaMallocHost((void**)&h->one, sizeof(unsigned)), cudaSuccess);
  *h->one = 1;
  assert_int_equal(cudaMalloc(&h->k2_target, 64), cudaSuccess);
  assert_int_equal(agoq_emu_wait_item(h->nccl, h->word, 1, &h->k1), cudaSuccess);
  if (with_k2) assert_int_equal(cudaMemsetAsync(h->k2_target, 7, 64, h->nccl), cudaSuccess);
}

static cudaError_t hang_copy_x(hang_setup* h) {
  return cudaMemcpyAsync(h->word, h->one, sizeof(unsigned), cudaMemcpyHostToDevice, h->plugin);
}

static void hang_close(hang_setup* h) {
  assert_int_equal(cudaStreamSynchronize(h->nccl), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(h->plugin), cudaSuccess);
  agoq_emu_wait_item_release(h->k1);
  assert_int_equal(cudaStreamDestroy(h->nccl), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(h->plugin), cudaSuccess);
  assert_int_equal(cudaFree(h->word), cudaSuccess);
  assert_int_equal(cudaFree(h->k2_target), cudaSuccess);
  assert_int_equal(cudaFreeHost(h->one), cudaSuccess);
}

static void expect_deadlock_text(const char* part) {
  char text[1024];
  agoq_emu_deadlock_text(text, sizeof text);
  if (strstr(text, part) == NULL) fail_msg("the deadlock report \"%s\" does not say \"%s\"", text, part);
}

/* K1 waits for X on another hardware queue: it runs while K1 spins, K1 then finishes and K2
 * after it. Nothing is reported. */
static void test_wait_item_completes_when_its_copy_lands(void** state) {
  (void)state;
  agoq_emu_max_connections_set(8);
  agoq_emu_counters c0 = counters();
  hang_setup h;
  hang_open(&h, true);
  assert_int_equal(cudaStreamQuery(h.nccl), cudaErrorNotReady);
  assert_int_equal(agoq_emu_wait_item_state(h.k1), AGOQ_EMU_WAIT_RUNNING);
  assert_int_equal(cudaStreamQuery(h.nccl), cudaErrorNotReady); /* spins: the word is not there */
  assert_int_equal(hang_copy_x(&h), cudaSuccess);
  /* Synchronizing NCCL's stream: the device runs X beside the spinning K1. */
  assert_int_equal(cudaStreamSynchronize(h.nccl), cudaSuccess);
  assert_int_equal(agoq_emu_wait_item_state(h.k1), AGOQ_EMU_WAIT_DONE);
  uint8_t k2[64];
  assert_int_equal(agoq_emu_peek(k2, h.k2_target, sizeof k2), 0);
  assert_int_equal(k2[63], 7);
  hang_close(&h);
  assert_int_equal(counters().deadlocks, c0.deadlocks);
}

/* One hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1): [K1 running, K2, X]. K2 waits for K1,
 * K1 for X, X behind K2: the copy is refused with the cycle, K1 is ended. */
static void test_one_hardware_queue_deadlocks(void** state) {
  (void)state;
  agoq_emu_max_connections_set(1);
  agoq_emu_counters c0 = counters();
  hang_setup h;
  hang_open(&h, true);
  assert_int_equal(cudaStreamQuery(h.nccl), cudaErrorNotReady); /* K1 starts */
  assert_int_equal(hang_copy_x(&h), cudaErrorLaunchTimeout);
  assert_int_equal(counters().deadlocks, c0.deadlocks + 1);
  assert_int_equal(agoq_emu_wait_item_state(h.k1), AGOQ_EMU_WAIT_ABORTED);
  expect_deadlock_text("deadlock: a copy (host to device) on stream");
  expect_deadlock_text("waits behind that kernel");
  expect_deadlock_text("CUDA_DEVICE_MAX_CONNECTIONS");
  hang_close(&h);
  agoq_emu_max_connections_set(8);
}

/* One hardware queue, but nothing of NCCL's behind K1: X starts behind a running kernel of
 * another stream, lands, and K1 finishes (the queue holds work up only when it cannot start). */
static void test_one_hardware_queue_without_k2_completes(void** state) {
  (void)state;
  agoq_emu_max_connections_set(1);
  agoq_emu_counters c0 = counters();
  hang_setup h;
  hang_open(&h, false);
  assert_int_equal(hang_copy_x(&h), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(h.plugin), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(h.nccl), cudaSuccess);
  assert_int_equal(agoq_emu_wait_item_state(h.k1), AGOQ_EMU_WAIT_DONE);
  hang_close(&h);
  assert_int_equal(counters().deadlocks, c0.deadlocks);
  agoq_emu_max_connections_set(8);
}

/* Eight queues, streams round-robin: the ninth stream created after NCCL's shares its queue,
 * and X on it deadlocks as with one queue; X on the next one (another queue) does not. */
static void test_round_robin_puts_the_ninth_stream_in_the_same_queue(void** state) {
  (void)state;
  agoq_emu_max_connections_set(8);
  agoq_emu_counters c0 = counters();
  hang_setup h;
  hang_open(&h, true); /* NCCL's stream: queue 0; the plugin's: queue 1 */
  cudaStream_t filler[6], same_queue, other_queue;
  for (int i = 0; i < 6; i++) assert_int_equal(cudaStreamCreateWithFlags(&filler[i], cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&same_queue, cudaStreamNonBlocking), cudaSuccess);  /* queue 0 */
  assert_int_equal(cudaStreamCreateWithFlags(&other_queue, cudaStreamNonBlocking), cudaSuccess); /* queue 1 */
  assert_int_equal(cudaStreamQuery(h.nccl), cudaErrorNotReady);
  assert_int_equal(cudaMemcpyAsync(h.word, h.one, sizeof(unsigned), cudaMemcpyHostToDevice, same_queue),
                   cudaErrorLaunchTimeout);
  assert_int_equal(counters().deadlocks, c0.deadlocks + 1);
  expect_deadlock_text("hardware queue 0 of 8");
  assert_int_equal(cudaStreamSynchronize(h.nccl), cudaSuccess); /* K1 was ended */
  /* Again, X on a stream of another queue: no deadlock. */
  agoq_emu_wait* k1b = NULL;
  assert_int_equal(cudaMemset(h.word, 0, sizeof(unsigned)), cudaSuccess);
  assert_int_equal(agoq_emu_wait_item(h.nccl, h.word, 1, &k1b), cudaSuccess);
  assert_int_equal(cudaMemsetAsync(h.k2_target, 7, 64, h.nccl), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(h.word, h.one, sizeof(unsigned), cudaMemcpyHostToDevice, other_queue), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(h.nccl), cudaSuccess);
  assert_int_equal(agoq_emu_wait_item_state(k1b), AGOQ_EMU_WAIT_DONE);
  assert_int_equal(counters().deadlocks, c0.deadlocks + 1);
  agoq_emu_wait_item_release(k1b);
  for (int i = 0; i < 6; i++) assert_int_equal(cudaStreamDestroy(filler[i]), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(same_queue), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(other_queue), cudaSuccess);
  hang_close(&h);
}

/* CUDA_DEVICE_MAX_CONNECTIONS read as the driver reads it: 1 puts both streams in one queue
 * (the K1/K2/X deadlock); unset is 8 (no deadlock). */
static void test_max_connections_from_the_environment(void** state) {
  (void)state;
  agoq_emu_counters c0 = counters();
  hang_setup h;
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
  agoq_emu_max_connections_set(0);
  hang_open(&h, true);
  assert_int_equal(hang_copy_x(&h), cudaErrorLaunchTimeout);
  hang_close(&h);
  assert_int_equal(counters().deadlocks, c0.deadlocks + 1);
  unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  agoq_emu_max_connections_set(0);
  hang_open(&h, true);
  assert_int_equal(hang_copy_x(&h), cudaSuccess);
  hang_close(&h);
  assert_int_equal(counters().deadlocks, c0.deadlocks + 1);
  agoq_emu_max_connections_set(8);
}

static void* free_on_thread(void* p) {
  cudaError_t* res = p;
  void* d = NULL;
  *res = cudaMalloc(&d, 64);
  if (*res == cudaSuccess) *res = cudaFree(d);
  return NULL;
}

/* cudaFree on another thread while K1 waits for a device word: cudaFree holds the context
 * lock until K1 finishes, and K1 needs a copy nobody can issue without that lock. Reported
 * at once; the call fails, K1 is ended. */
static void test_cuda_free_while_nccl_kernel_waits_deadlocks(void** state) {
  (void)state;
  agoq_emu_max_connections_set(8);
  agoq_emu_counters c0 = counters();
  hang_setup h;
  hang_open(&h, true);
  assert_int_equal(cudaStreamQuery(h.nccl), cudaErrorNotReady);
  pthread_t t;
  cudaError_t res = cudaSuccess;
  assert_int_equal(pthread_create(&t, NULL, free_on_thread, &res), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(res, cudaErrorLaunchTimeout);
  assert_int_equal(counters().deadlocks, c0.deadlocks + 1);
  assert_int_equal(agoq_emu_wait_item_state(h.k1), AGOQ_EMU_WAIT_ABORTED);
  expect_deadlock_text("deadlock: cudaFree holds the context lock");
  expect_deadlock_text("the plugin's cudaMemcpyAsync");
  hang_close(&h);
}

typedef struct {
  hang_setup* h;
  atomic_int returned;
  cudaError_t res;
} copy_call;

static void* copy_on_thread(void* p) {
  copy_call* c = p;
  c->res = hang_copy_x(c->h);
  atomic_store(&c->returned, 1);
  return NULL;
}

/* The same with K1 waiting for a pinned host word (another thread may write it, so nothing
 * is provable): cudaFree waits holding the context lock, and the plugin's cudaMemcpyAsync
 * call, on a third thread, cannot return until the word is written and cudaFree is done. */
static void test_cuda_free_blocks_every_call_until_idle(void** state) {
  (void)state;
  agoq_emu_max_connections_set(8);
  agoq_emu_counters c0 = counters();
  hang_setup h;
  hang_open(&h, false);
  unsigned* flag = NULL;
  assert_int_equal(cudaMallocHost((void**)&flag, sizeof *flag), cudaSuccess);
  atomic_store((atomic_uint*)flag, 0);
  agoq_emu_wait* k1_host = NULL;
  assert_int_equal(agoq_emu_wait_item(h.nccl, flag, 5, &k1_host), cudaSuccess);
  /* K1 (device word) first: X lands it, so only k1_host holds the device up. */
  assert_int_equal(hang_copy_x(&h), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(h.plugin), cudaSuccess);
  pthread_t tf, tc;
  cudaError_t free_res = cudaErrorUnknownForTest;
  assert_int_equal(pthread_create(&tf, NULL, free_on_thread, &free_res), 0);
  while (agoq_emu_context_lock_holders_waiting() == 0) sched_yield();
  copy_call c = {.h = &h, .res = cudaErrorUnknownForTest};
  atomic_init(&c.returned, 0);
  assert_int_equal(pthread_create(&tc, NULL, copy_on_thread, &c), 0);
  struct timespec ts = {0, 20 * 1000 * 1000}; /* gives a wrong emulation time to let the copy through */
  nanosleep(&ts, NULL);
  assert_int_equal(atomic_load(&c.returned), 0);
  assert_int_equal(agoq_emu_context_lock_holders_waiting(), 1);
  atomic_store((atomic_uint*)flag, 5); /* NCCL's kernel sees its word: the device goes idle */
  assert_int_equal(pthread_join(tf, NULL), 0);
  assert_int_equal(pthread_join(tc, NULL), 0);
  assert_int_equal(free_res, cudaSuccess);
  assert_int_equal(c.res, cudaSuccess);
  assert_int_equal(agoq_emu_wait_item_state(k1_host), AGOQ_EMU_WAIT_DONE);
  assert_int_equal(counters().deadlocks, c0.deadlocks);
  agoq_emu_wait_item_release(k1_host);
  assert_int_equal(cudaFreeHost(flag), cudaSuccess);
  hang_close(&h);
}

/* ---- stream capture ------------------------------------------------------------------- */

typedef agoq_emu_capturer capturer;

static void* end_on_thread(void* arg) {
  capturer* c = arg;
  cudaGraph_t g = NULL;
  c->end = cudaStreamEndCapture(c->stream, &g);
  return NULL;
}

static void capture_start(capturer* c, pthread_t* t, enum cudaStreamCaptureMode mode) {
  assert_int_equal(agoq_emu_capture_start(c, t, mode), 0);
  assert_int_equal(c->begin, cudaSuccess);
}

static cudaError_t capture_finish(capturer* c, pthread_t t) { return agoq_emu_capture_finish(c, t); }

/* The setup calls CUDA may refuse during another thread's Global capture: each is refused on
 * a thread in the default (Global) mode, and invalidates that capture. */
static void test_global_capture_refuses_setup_calls_elsewhere(void** state) {
  (void)state;
  void* d = NULL;
  void* h = NULL;
  cudaStream_t s = NULL;
  cudaEvent_t e = NULL;
  assert_int_equal(cudaMalloc(&d, 64), cudaSuccess);
  assert_int_equal(cudaHostAlloc(&h, 64, cudaHostAllocPortable), cudaSuccess);
  capturer c;
  pthread_t t;
  capture_start(&c, &t, cudaStreamCaptureModeGlobal);
  agoq_emu_counters c0, c1;
  agoq_emu_counters_get(&c0);
  void* p = NULL;
  assert_int_equal(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  assert_null(p);
  assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaHostAlloc(&p, 64, cudaHostAllocPortable), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaFree(d), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaFreeHost(h), cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();
  agoq_emu_counters_get(&c1);
  assert_int_equal(c1.capture_refused - c0.capture_refused, 7);
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  assert_int_equal(cudaStreamIsCapturing(c.stream, &st), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusInvalidated);
  assert_int_equal(capture_finish(&c, t), cudaErrorStreamCaptureInvalidated);
  /* Once the capture is over, the same calls succeed. */
  assert_int_equal(cudaFree(d), cudaSuccess);
  assert_int_equal(cudaFreeHost(h), cudaSuccess);
}

/* In Relaxed mode (what NCCL's proxy allocations use) the same calls succeed and the capture
 * ends with its graph; the thread's previous mode comes back from the exchange. */
static void test_relaxed_mode_allows_setup_during_capture(void** state) {
  (void)state;
  capturer c;
  pthread_t t;
  capture_start(&c, &t, cudaStreamCaptureModeGlobal);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  assert_int_equal(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  assert_int_equal(mode, cudaStreamCaptureModeGlobal);
  void* d = NULL;
  void* h = NULL;
  cudaStream_t s = NULL;
  cudaEvent_t e = NULL;
  assert_int_equal(cudaMalloc(&d, 64), cudaSuccess);
  assert_int_equal(cudaHostAlloc(&h, 64, cudaHostAllocPortable), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(d, h, 64, cudaMemcpyHostToDevice, s), cudaSuccess);
  assert_int_equal(cudaEventRecord(e, s), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaEventDestroy(e), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  assert_int_equal(cudaFree(d), cudaSuccess);
  assert_int_equal(cudaFreeHost(h), cudaSuccess);
  assert_int_equal(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  assert_int_equal(mode, cudaStreamCaptureModeRelaxed);
  assert_int_equal(capture_finish(&c, t), cudaSuccess);
}

/* Another thread's ThreadLocal or Relaxed capture does not concern this thread; a thread's
 * own Global capture forbids its own unsafe calls unless it is in Relaxed mode; and a Global
 * capture ends only on the thread that began it. */
static void test_capture_modes_and_threads(void** state) {
  (void)state;
  enum cudaStreamCaptureMode others[] = {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed};
  for (int i = 0; i < 2; i++) {
    capturer c;
    pthread_t t;
    capture_start(&c, &t, others[i]);
    void* d = NULL;
    assert_int_equal(cudaMalloc(&d, 64), cudaSuccess);
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(capture_finish(&c, t), cudaSuccess);
  }
  cudaStream_t s = NULL;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  assert_int_equal(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  void* d = NULL;
  assert_int_equal(cudaMalloc(&d, 64), cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();
  cudaGraph_t g = NULL;
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  assert_null(g);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  mode = cudaStreamCaptureModeRelaxed;
  assert_int_equal(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  assert_int_equal(cudaMalloc(&d, 64), cudaSuccess);
  assert_int_equal(cudaFree(d), cudaSuccess);
  mode = cudaStreamCaptureModeGlobal;
  assert_int_equal(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
  assert_non_null(g);
  assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
  /* Ended by another thread: refused for a Global capture. */
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  capturer c = {.stream = s, .mode = cudaStreamCaptureModeGlobal};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, end_on_thread, &c), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(c.end, cudaErrorStreamCaptureWrongThread);
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
  assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* ---- several devices ------------------------------------------------------------------ */

static void* current_device_on_thread(void* arg) {
  int* dev = arg;
  *dev = -1;
  (void)cudaGetDevice(dev);
  return NULL;
}

/* Each thread has its own current device; memory, streams and events belong to the device
 * current at their creation; an event is recorded only on a stream of its own device. */
static void test_devices_are_separate(void** state) {
  (void)state;
  int old = agoq_emu_devices_set(2);
  int n = 0;
  assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
  assert_int_equal(n, 2);
  assert_int_equal(cudaSetDevice(2), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
  assert_int_equal(cudaSetDevice(1), cudaSuccess);
  int other = 7;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, current_device_on_thread, &other), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(other, 0); /* a new thread starts on device 0 */
  void* d1 = NULL;
  cudaStream_t s1 = NULL;
  cudaEvent_t e1 = NULL;
  assert_int_equal(cudaMalloc(&d1, 64), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  struct cudaPointerAttributes a;
  assert_int_equal(cudaPointerGetAttributes(&a, d1), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeDevice);
  assert_int_equal(a.device, 1);
  cudaStream_t s0 = NULL;
  cudaEvent_t e0 = NULL;
  assert_int_equal(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&e0, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaEventRecord(e1, s0), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  assert_int_equal(cudaEventRecord(e1, s1), cudaSuccess); /* whatever device is current */
  assert_int_equal(cudaEventSynchronize(e1), cudaSuccess);
  assert_int_equal(cudaEventDestroy(e0), cudaSuccess);
  assert_int_equal(cudaEventDestroy(e1), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s0), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
  assert_int_equal(cudaFree(d1), cudaSuccess);
  agoq_emu_devices_set(old);
}

/* ---- contexts -------------------------------------------------------------------------- */

typedef int (*ctx_get_fn)(void** ctx);
typedef int (*ctx_set_fn)(void* ctx);

static void* driver_fn(const char* name) {
  void* fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  assert_int_equal(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q), cudaSuccess);
  assert_int_equal(q, cudaDriverEntryPointSuccess);
  return fn;
}

static void* context_on_thread(void* arg) {
  ctx_get_fn get = (ctx_get_fn)driver_fn("cuCtxGetCurrent");
  void** out = arg;
  *out = (void*)1;
  (void)get(out);
  return NULL;
}

/* As NCCL_CREATE_THREAD_CONTEXT=1 has it: a private context on device 0 beside its primary
 * one. Kernels are loaded per context; a private context's streams and events serve only
 * while it is current; cudaSetDevice makes the primary one current again; a new thread is
 * bound to none. */
static void test_contexts_are_separate(void** state) {
  (void)state;
  ctx_get_fn get = (ctx_get_fn)driver_fn("cuCtxGetCurrent");
  ctx_set_fn set = (ctx_set_fn)driver_fn("cuCtxSetCurrent");
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  void* primary = NULL;
  assert_int_equal(get(&primary), 0);
  assert_non_null(primary);
  void* other = (void*)1;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, context_on_thread, &other), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_null(other);
  (void)load_codec(); /* in the primary context */

  void* priv = agoq_emu_context_create(0);
  assert_non_null(priv);
  assert_null(agoq_emu_context_create(5));
  void* cur = NULL;
  assert_int_equal(get(&cur), 0);
  assert_ptr_equal(cur, priv);
  int dev = -1;
  assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
  assert_int_equal(dev, 0);
  assert_int_equal(set((void*)&dev), 201); /* not a context */

  enc_bufs b;
  enc_bufs_alloc(&b);
  agoq_cuda_codec_result* res = b.res;
  void* d_src = b.src;
  cudaStream_t s = NULL;
  cudaEvent_t e = NULL;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaMemsetAsync(d_src, 0, ENC_N * sizeof(float), s), cudaSuccess);
  /* Loaded in the primary context is not loaded here. */
  assert_int_equal(enc_run(&b, s), AGOQ_CUDA_CODEC_ECUDA);
  assert_int_equal(agoq_cuda_codec_last_error(), cudaErrorFunctionNotLoaded);
  (void)cudaGetLastError();
  (void)load_codec();
  memset(res, 0, sizeof *res);
  assert_int_equal(enc_run(&b, s), AGOQ_CODEC_OK);
  assert_int_equal(cudaEventRecord(e, s), cudaSuccess);

  /* The primary context current (as cudaSetDevice makes it): the private one's stream and
   * event are refused, whatever the call. */
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  assert_int_equal(get(&cur), 0);
  assert_ptr_equal(cur, primary);
  agoq_emu_counters c0 = counters();
  assert_int_equal(enc_run(&b, s), AGOQ_CUDA_CODEC_ECUDA);
  assert_int_equal(agoq_cuda_codec_last_error(), cudaErrorInvalidResourceHandle);
  assert_int_equal(counters().ops_run, c0.ops_run);
  assert_int_equal(cudaMemcpyAsync(b.frame, d_src, 64, cudaMemcpyDeviceToDevice, s), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaMemsetAsync(d_src, 0, 64, s), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaEventRecord(e, s), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaEventSynchronize(e), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  cudaStream_t ps = NULL;
  assert_int_equal(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventRecord(e, ps), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaStreamWaitEvent(ps, e, 0), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();

  /* Back in the private context, all of it works; and the other way round, the primary
   * context's stream is refused there. */
  assert_int_equal(set(priv), 0);
  assert_int_equal(cudaMemsetAsync(d_src, 0, 64, ps), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  assert_int_equal(cudaEventSynchronize(e), cudaSuccess);
  assert_int_equal(res->status, AGOQ_CODEC_OK);
  assert_true(res->body_len > 0);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaEventDestroy(e), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  assert_int_equal(set(NULL), 0);
  assert_int_equal(get(&cur), 0);
  assert_null(cur);
  assert_int_equal(cudaStreamDestroy(ps), cudaSuccess); /* bound to none: device 0's primary again */
  assert_int_equal(get(&cur), 0);
  assert_ptr_equal(cur, primary);
  enc_bufs_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_cannot_touch_device_memory),
      cmocka_unit_test(test_pointer_attributes),
      cmocka_unit_test(test_copy_directions),
      cmocka_unit_test(test_driver_address_range),
      cmocka_unit_test(test_work_is_done_only_when_its_event_says_so),
      cmocka_unit_test(test_streams_are_independent),
      cmocka_unit_test(test_2d_copies_and_ll128_lines),
      cmocka_unit_test(test_legacy_stream_and_sync_calls_are_counted),
      cmocka_unit_test(test_kernels_reach_only_device_and_pinned_memory),
      cmocka_unit_test(test_unloaded_kernel_launch_is_refused),
      cmocka_unit_test(test_one_emulated_device),
      cmocka_unit_test(test_loader_loads_exactly_what_calls_launch),
      cmocka_unit_test(test_batch_launches_do_not_grow_with_items),
      cmocka_unit_test(test_wait_item_completes_when_its_copy_lands),
      cmocka_unit_test(test_one_hardware_queue_deadlocks),
      cmocka_unit_test(test_one_hardware_queue_without_k2_completes),
      cmocka_unit_test(test_round_robin_puts_the_ninth_stream_in_the_same_queue),
      cmocka_unit_test(test_max_connections_from_the_environment),
      cmocka_unit_test(test_cuda_free_while_nccl_kernel_waits_deadlocks),
      cmocka_unit_test(test_cuda_free_blocks_every_call_until_idle),
      cmocka_unit_test(test_global_capture_refuses_setup_calls_elsewhere),
      cmocka_unit_test(test_relaxed_mode_allows_setup_during_capture),
      cmocka_unit_test(test_capture_modes_and_threads),
      cmocka_unit_test(test_devices_are_separate),
      cmocka_unit_test(test_contexts_are_separate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
