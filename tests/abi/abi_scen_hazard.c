/*
 * gpu_hazard_cuda_free: a receive pending, NCCL's kernel waiting for its bytes, and another
 * thread of the process calling cudaFree (PyTorch's caching allocator does, any time). On a
 * GPU (docs/gpu-h200.md) cudaFree holds the context lock until every queued kernel has
 * finished, so if the bytes can only land through a CUDA call of the plugin's (its H2D copy
 * on the device path) nothing ever finishes. Over the CUDA emulation
 * (kernels/cuda/emu: context lock, wait item) that cycle is reported instead of hanging.
 *
 * Role 0 plays NCCL's receiving rank, as NCCL would with this plugin: NCCL's buffer is
 * device memory when the plugin advertises NCCL_PTR_CUDA, else pinned host memory (NCCL's
 * host staging, which its kernel reads). NCCL's kernel is a wait item for the message's last
 * word. Once the cudaFree thread is inside cudaFree (or done), role 1 sends.
 *
 * The outcome checked: with AGOQ_ABI_EXPECT_HANG=1 (AGOQ_GPU=on: the hazard is real), the
 * emulation must report the deadlock; otherwise (the plugin's default policy) everything
 * must complete: the kernel sees its bytes, cudaFree succeeds, nothing is reported.
 * Needs --device (the emulation); the test plugin's regMr is plain (no DMA-BUF: a NIC
 * writing device memory directly would not need the lock).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_harness.h"
#include "abi_scenarios.h"

#ifdef ABI_HAVE_DEVICE
#include <cuda_runtime_api.h>

enum { HAZARD_BYTES = 256 * 1024, HAZARD_TAG = 7 };
#define HAZARD_SEED 0x6a7a4dull

typedef struct {
  void* scratch;
  atomic_int finished;
  cudaError_t res;
} free_thread;

static void* hazard_free(void* p) {
  free_thread* f = p;
  f->res = cudaFree(f->scratch);
  atomic_store(&f->finished, 1);
  return NULL;
}

static int hazard_receiver(abi_worker* w) {
  void* rcomm = NULL;
  void* mh = NULL;
  void* buf = NULL;
  bool device = false;
  cudaStream_t nccl_stream = NULL;
  agoq_emu_wait* kernel = NULL;
  free_thread ft = {.scratch = NULL, .res = cudaSuccess};
  atomic_init(&ft.finished, 0);
  bool thread_started = false;
  pthread_t t;
  bool expect_hang = getenv("AGOQ_ABI_EXPECT_HANG") != NULL && strcmp(getenv("AGOQ_ABI_EXPECT_HANG"), "1") == 0;
  agoq_emu_counters c0, c1;
  agoq_emu_counters_get(&c0);

  agoq_view_props props;
  memset(&props, 0, sizeof props);
  ABI_NCCL_OK(w, agoq_view_get_properties(&w->view, 0, &props));
  device = (props.ptr_support & NCCL_PTR_CUDA) != 0;
  if (abi_pair_connect(w, &rcomm) != 0) goto fail;

  /* The word NCCL's kernel waits for: the message's last one, as the sender fills it. */
  uint8_t* expect = malloc(HAZARD_BYTES);
  ABI_REQUIRE(w, expect != NULL, "out of memory");
  abi_pattern_fill(expect, HAZARD_BYTES, HAZARD_SEED);
  unsigned last_word;
  memcpy(&last_word, expect + HAZARD_BYTES - sizeof last_word, sizeof last_word);
  free(expect);
  if (last_word == 0) last_word = 1; /* never the case for this seed; keeps the wait meaningful */

  if (device) {
    ABI_REQUIRE(w, cudaMalloc(&buf, HAZARD_BYTES) == cudaSuccess, "cudaMalloc failed");
    ABI_REQUIRE(w, cudaMemset(buf, 0, HAZARD_BYTES) == cudaSuccess, "cudaMemset failed");
  } else {
    ABI_REQUIRE(w, cudaHostAlloc(&buf, HAZARD_BYTES, cudaHostAllocDefault) == cudaSuccess, "cudaHostAlloc failed");
    memset(buf, 0, HAZARD_BYTES);
  }
  ncclResult_t r = agoq_view_reg_mr(&w->view, rcomm, buf, HAZARD_BYTES, device ? NCCL_PTR_CUDA : NCCL_PTR_HOST, &mh);
  ABI_REQUIRE(w, r == ncclSuccess, "regMr(%s) returned %s", device ? "NCCL_PTR_CUDA" : "NCCL_PTR_HOST",
              abi_result_str(r));
  void* req = NULL;
  void* data[1] = {buf};
  size_t sizes[1] = {HAZARD_BYTES};
  int tags[1] = {HAZARD_TAG};
  void* mhs[1] = {mh};
  if (abi_irecv(w, rcomm, 1, data, sizes, tags, mhs, &req, 20000) != 0) goto fail;

  /* NCCL's kernel on NCCL's (greatest-priority, non-blocking) stream, spinning on the word. */
  ABI_REQUIRE(w, cudaStreamCreateWithPriority(&nccl_stream, cudaStreamNonBlocking, -5) == cudaSuccess,
              "cudaStreamCreateWithPriority failed");
  ABI_REQUIRE(w,
              agoq_emu_wait_item(nccl_stream, (uint8_t*)buf + HAZARD_BYTES - sizeof last_word, last_word, &kernel) ==
                  cudaSuccess,
              "agoq_emu_wait_item failed");
  ABI_REQUIRE(w, cudaStreamQuery(nccl_stream) == cudaErrorNotReady, "NCCL's kernel did not start spinning");

  /* Another thread frees memory meanwhile; the bytes are sent only once it is inside. */
  ABI_REQUIRE(w, cudaMalloc(&ft.scratch, 4096) == cudaSuccess, "cudaMalloc failed");
  ABI_REQUIRE(w, pthread_create(&t, NULL, hazard_free, &ft) == 0, "pthread_create failed");
  thread_started = true;
  while (!atomic_load(&ft.finished) && agoq_emu_context_lock_holders_waiting() == 0) sched_yield();
  if (abi_ctrl_barrier(w, ABI_MSG_READY, 30000) != 0) goto fail;

  int got[1] = {-1};
  if (abi_wait(w, req, got, 60000) != 0) goto fail;
  pthread_join(t, NULL);
  thread_started = false;
  ABI_REQUIRE(w, cudaStreamSynchronize(nccl_stream) == cudaSuccess, "cudaStreamSynchronize failed");
  agoq_emu_counters_get(&c1);
  char text[1024];
  agoq_emu_deadlock_text(text, sizeof text);
  enum agoq_emu_wait_state st = agoq_emu_wait_item_state(kernel);
  fprintf(stderr, "gpu_hazard_cuda_free: NCCL's buffer in %s memory; cudaFree returned %s; NCCL's kernel %s; "
                  "deadlocks reported %llu%s%s\n",
          device ? "device" : "pinned host", cudaGetErrorName(ft.res),
          st == AGOQ_EMU_WAIT_DONE ? "finished" : st == AGOQ_EMU_WAIT_ABORTED ? "was ended" : "did not finish",
          c1.deadlocks - c0.deadlocks, text[0] ? ": " : "", text);
  ABI_REQUIRE(w, got[0] == HAZARD_BYTES, "the receive reported %d bytes, not %d", got[0], HAZARD_BYTES);
  if (expect_hang) {
    ABI_REQUIRE(w, c1.deadlocks > c0.deadlocks && ft.res == cudaErrorLaunchTimeout,
                "expected the emulation to report the deadlock (NCCL's buffer in %s memory), but cudaFree "
                "returned %s and no deadlock was reported",
                device ? "device" : "pinned host", cudaGetErrorName(ft.res));
  } else {
    ABI_REQUIRE(w, c1.deadlocks == c0.deadlocks,
                "a receive pending with NCCL's kernel waiting for it and a cudaFree on another thread deadlock "
                "(NCCL's buffer in %s memory): %s",
                device ? "device" : "pinned host", text);
    ABI_REQUIRE(w, ft.res == cudaSuccess, "cudaFree returned %s", cudaGetErrorName(ft.res));
    ABI_REQUIRE(w, st == AGOQ_EMU_WAIT_DONE, "NCCL's kernel did not finish");
  }
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 30000) != 0) goto fail;
fail:
  if (thread_started) pthread_join(t, NULL);
  if (kernel != NULL) {
    (void)cudaStreamSynchronize(nccl_stream);
    agoq_emu_wait_item_release(kernel);
  }
  if (nccl_stream != NULL) (void)cudaStreamDestroy(nccl_stream);
  abi_dereg(w, rcomm, mh);
  abi_close_recv(w, &rcomm);
  if (buf != NULL) (void)(device ? cudaFree(buf) : cudaFreeHost(buf));
  return w->failed ? -1 : 0;
}

static int hazard_sender(abi_worker* w) {
  void* scomm = NULL;
  void* mh = NULL;
  /* Plain host memory on this side (not an abi_buf: --device would hand out its device
   * twin): the hazard is the receiver's. */
  uint8_t* sbuf = malloc(HAZARD_BYTES);
  ABI_REQUIRE(w, sbuf != NULL, "out of memory");
  abi_pattern_fill(sbuf, HAZARD_BYTES, HAZARD_SEED);
  if (abi_pair_connect(w, &scomm) != 0) goto fail;
  ncclResult_t r = agoq_view_reg_mr(&w->view, scomm, sbuf, HAZARD_BYTES, NCCL_PTR_HOST, &mh);
  ABI_REQUIRE(w, r == ncclSuccess, "regMr returned %s", abi_result_str(r));
  if (abi_ctrl_barrier(w, ABI_MSG_READY, 30000) != 0) goto fail;
  void* req = NULL;
  if (abi_isend(w, scomm, sbuf, HAZARD_BYTES, HAZARD_TAG, mh, &req, 20000) != 0) goto fail;
  int got[1] = {-1};
  if (abi_wait(w, req, got, 60000) != 0) goto fail;
  if (abi_ctrl_barrier(w, ABI_MSG_DONE, 30000) != 0) goto fail;
fail:
  abi_dereg(w, scomm, mh);
  abi_close_send(w, &scomm);
  free(sbuf);
  return w->failed ? -1 : 0;
}

int abi_sc_gpu_hazard_cuda_free(abi_worker* w) { return w->role == 0 ? hazard_receiver(w) : hazard_sender(w); }

#else

int abi_sc_gpu_hazard_cuda_free(abi_worker* w) {
  abi_fail(w, __FILE__, __LINE__, "needs the CUDA emulation (a harness built with the emulated test plugin)");
  return -1;
}

#endif
