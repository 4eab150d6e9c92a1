/*
 * kill: every rank streams 1 MiB bf16 all-reduce calls, 8 in flight, as NCCL's proxy does.
 * After 40 completed calls (--device: 12 calls of 256 KiB, since over the CUDA emulation the
 * GPU path's kernels run on the CPU, slowly under the sanitizers) the victim (rank
 * nranks / 2) posts its next calls, reports its time of death and SIGKILLs itself: its peers
 * are then waiting for its data. Each survivor must see a post or a test fail (never hang,
 * never succeed forever) within
 * CN_DEATH_LIMIT_MS of the death, and closeColl and finalize must return after that.
 */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collnet_harness.h"

#define CN_KILL_CALL_BYTES (1u << 20)
#define CN_KILL_CALL_BYTES_DEVICE (1u << 18)
#define CN_KILL_WINDOWS 8
#define CN_KILL_AFTER 40
#define CN_KILL_AFTER_DEVICE 12 /* still more than the 8 in flight */
/* Survivors give up on a silent plugin after this long without any call completing. */
#define CN_KILL_STALL_MS 30000

int cn_sc_kill(cn_worker* w);

int cn_sc_kill(cn_worker* w) {
  if (cn_open(w) != 0 || cn_connect(w) != 0) return -1;
  int victim = w->nranks / 2;
  bool dev = cn_device_mode();
  const size_t call_bytes = dev ? CN_KILL_CALL_BYTES_DEVICE : CN_KILL_CALL_BYTES;
  size_t bytes = call_bytes * CN_KILL_WINDOWS;
  uint8_t* send = aligned_alloc(4096, bytes);
  uint8_t* recv = aligned_alloc(4096, bytes);
  void *smh = NULL, *rmh = NULL;
  void* reqs[CN_MAX_INFLIGHT] = {0};
  CN_REQUIRE(w, send != NULL && recv != NULL, "out of memory");
  perf_input_fill(ncclBfloat16, send, bytes / 2, perf_rank_seed(77, w->rank), w->nranks, 0);
  memset(recv, 0, bytes);
  /* --device: the calls read and write the buffers' device twins (collnet_device.c). */
  CN_REQUIRE(w, !dev || (cn_device_alloc(send, bytes) == 0 && cn_device_alloc(recv, bytes) == 0),
             "cannot make the device twins of the buffers (2 x %zu B)", bytes);
  uint8_t* dsend = cn_device_ptr(send);
  uint8_t* drecv = cn_device_ptr(recv);
  int mem = dev ? NCCL_PTR_CUDA : NCCL_PTR_HOST;
  CN_OK(w, agoq_collnet_view_reg_mr(&w->view, w->coll_comm, dsend, bytes, mem, &smh));
  CN_OK(w, agoq_collnet_view_reg_mr(&w->view, w->coll_comm, drecv, bytes, mem, &rmh));
  if (cn_barrier(w) != 0) goto fail;

  long posted = 0, done = 0;
  const long limit = 1000000; /* far more than can finish before the death */
  int64_t last = cn_now_ns();
  ncclResult_t err = ncclSuccess;
  const char* where = NULL;
  while (done < limit) {
    bool progress = false;
    while (posted - done < CN_MAX_INFLIGHT) {
      size_t off = (size_t)(posted % CN_KILL_WINDOWS) * call_bytes;
      void* req = NULL;
      err = agoq_collnet_view_iallreduce(&w->view, w->coll_comm, dsend + off, drecv + off,
                                         call_bytes / 2, ncclBfloat16, ncclSum, smh, rmh,
                                         &req);
      if (err != ncclSuccess) {
        where = "iallreduce";
        break;
      }
      if (req == NULL) break;
      reqs[posted % CN_MAX_INFLIGHT] = req;
      posted++;
      progress = true;
    }
    if (where != NULL) break;
    if (w->rank == victim && done >= (dev ? CN_KILL_AFTER_DEVICE : CN_KILL_AFTER)) {
      /* Calls of ours are in flight and the peers wait for our contributions. */
      int64_t now = cn_now_ns();
      cn_send_result(w, CN_RESULT_DYING, now, "victim");
      raise(SIGKILL);
    }
    int f = 0, size = -1;
    err = agoq_collnet_view_test(&w->view, reqs[done % CN_MAX_INFLIGHT], &f, &size);
    if (err != ncclSuccess) {
      where = "test";
      break;
    }
    if (f) {
      done++;
      progress = true;
    }
    int64_t now = cn_now_ns();
    if (progress) {
      last = now;
    } else {
      sched_yield();
      CN_REQUIRE(w, now - last < (int64_t)CN_KILL_STALL_MS * 1000000,
                 "no call completed or failed for %d s after %ld calls: the collective hangs",
                 CN_KILL_STALL_MS / 1000, done);
    }
  }
  CN_REQUIRE(w, where != NULL, "%ld calls completed although rank %d died", done, victim);
  w->event_ns = cn_now_ns();
  fprintf(stderr, "collnet: rank %d: %s failed with %s after %ld completed calls (expected)\n",
          w->rank, where, cn_result_str(err), done);
  /* The group is broken; tearing it down must still return. */
  int64_t t0 = cn_now_ns();
  agoq_collnet_view_dereg_mr(&w->view, w->coll_comm, smh);
  agoq_collnet_view_dereg_mr(&w->view, w->coll_comm, rmh);
  smh = rmh = NULL;
  ncclResult_t r = agoq_collnet_view_close_coll(&w->view, w->coll_comm);
  w->coll_comm = NULL;
  int64_t close_ms = (cn_now_ns() - t0) / 1000000;
  CN_REQUIRE(w, close_ms < CN_DEATH_LIMIT_MS, "closeColl of the broken group took %lld ms",
             (long long)close_ms);
  if (r != ncclSuccess)
    fprintf(stderr, "collnet: rank %d: closeColl of the broken group returned %s\n", w->rank,
            cn_result_str(r));
  cn_device_free(send);
  cn_device_free(recv);
  free(send);
  free(recv);
  return 0;
fail:
  if (smh != NULL) agoq_collnet_view_dereg_mr(&w->view, w->coll_comm, smh);
  if (rmh != NULL) agoq_collnet_view_dereg_mr(&w->view, w->coll_comm, rmh);
  /* Calls may still be in flight into the twins and the buffers: both are left to the
   * process's exit. */
  return -1;
}
