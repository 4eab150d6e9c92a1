/*
 * stats: what AGOQ_STATS=1 shows a job that never closes its communicator (PyTorch rarely
 * destroys one). Every rank runs a known mix of single-call all-reduces, then reports its
 * verdict and calls exit() with the group still open: the plugin's exit hook must write one
 * event=exit line per path with exactly these counts (tests/collnet/check_stats.sh reads
 * them from AGOQ_STATS_FILE). Expects the default format and AGOQ_MIN_BYTES=64K.
 */
#include <stdlib.h>
#include <unistd.h>

#include "collnet_harness.h"

int cn_sc_stats(cn_worker* w);

int cn_sc_stats(cn_worker* w) {
  if (cn_open(w) != 0 || cn_connect(w) != 0) return -1;
  cn_batch b = {.inflight = 4};
  b.max_rel_l2 = cn_quant_bound(w->format);
  uint64_t seed = 0x5000;
  int rc = 0;
  /* 3 quantized: bf16 Sum of 200 000 bytes (at least 64K). */
  for (int i = 0; i < 3; i++) rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclBfloat16, ncclSum, 100000, 0, seed++);
  /* 4 exact: 2 below 64K (small), 1 int32 (type), 1 fp32 Max (op). */
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat32, ncclSum, 1000, 0, seed++);
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat16, ncclSum, 32767, 0, seed++);
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclInt32, ncclSum, 50000, 0, seed++);
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat32, ncclMax, 50000, 0, seed++);
  if (rc == 0) cn_batch_run(w, &b);
  if (w->failed) {
    cn_batch_free(w, &b);
    return -1;
  }
  /* Exit as a training script does: no closeColl, no finalize. The buffers stay
   * registered with the open group. */
  if (cn_barrier(w) != 0) return -1;
  cn_send_result(w, CN_RESULT_PASS, w->event_ns, w->why);
  close(w->ctrl_fd);
  exit(0);
}
