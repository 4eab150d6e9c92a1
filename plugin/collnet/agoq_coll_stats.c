/* AGOQ_STATS=1: one INFO line per group when it is closed (or its context finalized first),
 * with the figures of each path. Read only after the engine stopped (it owns them). */
#include <stdio.h>

#include "collnet/agoq_coll_internal.h"
#include "core/agoq_check.h"

static void agoq_coll_stats_path(char* out, size_t len, const char* name, const agoq_coll_path_stats* s) {
  double mib = 1024.0 * 1024.0;
  snprintf(out, len,
           "%s: %llu calls, %.1f MiB in, wire %.1f MiB sent of %.1f MiB raw (ratio %.3f), codec %.1f ms, "
           "network wait %.1f ms",
           name, (unsigned long long)s->calls, (double)s->bytes_in / mib, (double)s->wire_sent / mib,
           (double)s->wire_raw / mib, s->wire_raw ? (double)s->wire_sent / (double)s->wire_raw : 1.0,
           (double)s->codec_ns / 1e6, (double)s->wait_ns / 1e6);
}

void agoq_coll_stats_print(agoq_coll_comm* g, const char* when) {
  if (!g->cfg.stats || g->stats_printed) return;
  g->stats_printed = true;
  char quant[256], exact[256];
  agoq_coll_stats_path(quant, sizeof quant, "quantized", &g->stats[1]);
  agoq_coll_stats_path(exact, sizeof exact, "exact", &g->stats[0]);
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "CollNet stats at %s, rank %d of %d (%s, block %u): %s; %s", when, g->rank,
            g->nranks, agoq_format_name(g->cfg.format), g->cfg.block, quant, exact);
}
