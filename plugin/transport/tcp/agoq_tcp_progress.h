/*
 * Progress threads: a process-wide pool of workers that move payload bytes between NCCL's
 * buffers and the data sockets, so bandwidth does not depend on how often NCCL's proxy
 * thread polls test(). Each data socket is a stream owned by one worker; the proxy thread
 * hands it pieces through a single-producer/single-consumer ring (no lock on the data
 * path), and the worker sleeps in poll() when none of its streams can move.
 */
#ifndef AGOQ_TCP_PROGRESS_H
#define AGOQ_TCP_PROGRESS_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

/* A power of two above the most pieces one comm can have in flight on one socket
 * (every message puts at most one piece on each data socket). */
#define AGOQ_STREAM_RING_SIZE 512u

typedef struct {
  uint8_t* ptr;
  size_t len;
  size_t done; /* touched only by the worker */
  atomic_int* pending; /* its transfer's count of unfinished pieces */
} agoq_piece;

struct agoq_worker;

typedef struct agoq_stream {
  int fd;
  bool is_send;
  agoq_piece ring[AGOQ_STREAM_RING_SIZE];
  _Atomic uint32_t head; /* next piece the worker works on */
  _Atomic uint32_t tail; /* next free slot for the producer */
  atomic_int* comm_error; /* first failure of the comm (an ncclResult_t), shared by its streams */
  const char* peer;      /* for log lines */
  /* Whoever moves this stream's bytes holds `busy`: its worker, or the comm's own thread
   * assisting from test(). `done` of the pieces and `failed` are guarded by it. */
  atomic_bool busy;
  bool failed;
  /* Worker-private. */
  struct agoq_worker* worker;
  struct agoq_stream* next;
} agoq_stream;

/* Binds the stream to a worker, starting the pool on first use (AGOQ_SOCKET_NTHREADS). */
ncclResult_t agoq_progress_attach(agoq_stream* s);
/* Unbinds; when it returns no worker touches `s` any more, so it can be freed. */
void agoq_progress_detach(agoq_stream* s);
/* Producer side (the comm's proxy thread). False when the ring is full (cannot happen
 * within the per-comm request limits; callers treat it as an internal error). */
bool agoq_stream_post(agoq_stream* s, uint8_t* ptr, size_t len, atomic_int* pending);
/* Lets the comm's own thread (NCCL's proxy, polling test()) move up to `budget` bytes of
 * the stream when its worker is not on it. On a host with few cores a polling proxy
 * otherwise only takes CPU time away from the workers; this way it does their work.
 * Returns whether any byte moved. */
bool agoq_stream_assist(agoq_stream* s, size_t budget);
/* AGOQ_PLACEMENT=auto: the CPUs of device `dev`'s NUMA node that this process may use, for
 * threads that work for that NIC (CollNet's engine). False (out cleared) when placement is
 * off, the node is unknown, or none of its CPUs is allowed: then do not pin. */
bool agoq_tcp_placement_cpus(int dev, cpu_set_t* out);
/* Stops and joins the workers. Streams still attached are abandoned (library unload). */
void agoq_progress_shutdown(void);
/* Stops the workers now if no stream is attached, else when the last one detaches. */
void agoq_progress_shutdown_when_idle(void);
int agoq_progress_nworkers(void);
/* Progress threads the pool starts with: AGOQ_SOCKET_NTHREADS, its 0 (auto) resolved. */
int agoq_progress_nthreads(void);
/* Worker i's NUMA node under AGOQ_PLACEMENT=auto (-1 = not pinned, -2 = no such worker)
 * and, if `cpus` is not NULL, its current affinity (tests, agoq-info). */
int agoq_progress_worker_numa(int i, cpu_set_t* cpus);

/* Records the first failure of a comm; returns true for the caller that set it (and so
 * should log it). */
static inline bool agoq_comm_error_set(atomic_int* slot, ncclResult_t res) {
  int expected = ncclSuccess;
  return atomic_compare_exchange_strong(slot, &expected, (int)res);
}

#endif
