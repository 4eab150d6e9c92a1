/* CollNet statistics: each group's entry in the statistics registry (core/agoq_stats.h),
 * its lines when it is closed (or its context finalized first), and the init-time check
 * that AGOQ_MIN_BYTES still lets some call be quantized. */
#include <stdatomic.h>
#include <stdio.h>

#include "collnet/agoq_coll_internal.h"
#include "core/agoq_check.h"

int64_t agoq_coll_now_ns(void) { return agoq_stats_clock_ns(); }

#define AGOQ_COLL_NCCL_STAGED_CALL_MAX AGOQ_NCCL_STAGED_COLLNET_CALL_MAX

ncclResult_t agoq_coll_stats_open(agoq_coll_comm* g) {
  char config[96];
  snprintf(config, sizeof config, "format=%s block=%u min_bytes=%llu chunk=%llu", agoq_format_name(g->cfg.format),
           g->cfg.block, (unsigned long long)g->cfg.min_bytes, (unsigned long long)g->cfg.chunk_bytes);
  /* Kept with statistics off too (private entry): the engine counts unconditionally. */
  g->st = agoq_stats_open(AGOQ_STATS_COLLNET, g, g->rank, g->nranks, config, true);
  return g->st != NULL ? ncclSuccess : ncclSystemError;
}

/* At close, or at finalize before close: the engine has stopped, so the counters are final
 * either way, and the lines are printed once. */
void agoq_coll_stats_print(agoq_coll_comm* g) {
  agoq_stats_close(g->st);
}

static atomic_bool agoq_coll_min_bytes_warned;

bool agoq_coll_min_bytes_check(uint64_t min_bytes) {
  if (min_bytes <= AGOQ_COLL_NCCL_STAGED_CALL_MAX) return false;
  if (atomic_exchange(&agoq_coll_min_bytes_warned, true)) return false;
  AGOQ_WARN("AGOQ_MIN_BYTES=%llu bytes (%.2f MiB) is above the largest CollNet call NCCL makes from its staging "
            "buffers (%llu bytes = 2 MiB: 8 channels x 256 KiB with the default NCCL_BUFFSIZE): CollNet "
            "reductions will all run exact, uncompressed (only user-registered buffers with one rank per node "
            "make larger calls). Units are 1024-based: 64K = 64KiB = 65536 bytes, 1M = 1MiB = 1048576 bytes; "
            "the default is 64K",
            (unsigned long long)min_bytes, (double)min_bytes / 1048576.0,
            (unsigned long long)AGOQ_COLL_NCCL_STAGED_CALL_MAX);
  return true;
}
