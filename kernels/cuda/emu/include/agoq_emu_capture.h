/*
 * Not CUDA: for tests of the emulation and of the plugin over it. A thread that captures its
 * own stream until told to end, as a training loop's torch.cuda.graph does on its own thread
 * while NCCL's proxy thread sets up connections (docs/design-gpu.md, emulation rule 5).
 */
#ifndef AGOQ_EMU_CAPTURE_H
#define AGOQ_EMU_CAPTURE_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "cuda_runtime_api.h"

typedef struct {
  enum cudaStreamCaptureMode mode;
  cudaStream_t stream;
  atomic_int state; /* 0 starting, 1 capturing, 2 told to end, 3 ended */
  cudaError_t begin, end;
} agoq_emu_capturer;

static inline void* agoq_emu_capturer_main(void* arg) {
  agoq_emu_capturer* c = (agoq_emu_capturer*)arg;
  c->begin = cudaStreamBeginCapture(c->stream, c->mode);
  atomic_store(&c->state, 1);
  while (atomic_load(&c->state) != 2) sched_yield();
  cudaGraph_t g = NULL;
  c->end = cudaStreamEndCapture(c->stream, &g);
  if (g != NULL) (void)cudaGraphDestroy(g);
  atomic_store(&c->state, 3);
  return NULL;
}

/* Creates the stream, starts the thread and waits until its capture has begun (or failed to:
 * c->begin). 0, or -1 when the stream or the thread could not be made. */
static inline int agoq_emu_capture_start(agoq_emu_capturer* c, pthread_t* t, enum cudaStreamCaptureMode mode) {
  c->mode = mode;
  c->stream = NULL;
  c->begin = c->end = cudaSuccess;
  atomic_store(&c->state, 0);
  if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) return -1;
  if (pthread_create(t, NULL, agoq_emu_capturer_main, c) != 0) return -1;
  while (atomic_load(&c->state) != 1) sched_yield();
  return 0;
}

/* Ends the capture on its thread, joins it, destroys the stream: what cudaStreamEndCapture
 * returned. */
static inline cudaError_t agoq_emu_capture_finish(agoq_emu_capturer* c, pthread_t t) {
  atomic_store(&c->state, 2);
  (void)pthread_join(t, NULL);
  (void)cudaStreamDestroy(c->stream);
  return c->end;
}

#endif
