/*
 * Result lines of the collective subcommands: nccl-tests' columns plus the compression
 * and correctness columns for people, one JSON object per line for scripts (netlab.sh).
 * Every figure is measured: times by the tool, the wire ratio and the configuration by the
 * plugin (perf_coll_wire.c).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "perf_coll.h"

double perf_coll_busbw_factor(perf_coll_kind kind, int nranks) {
  double n = nranks;
  if (nranks <= 1) return 0.0;
  return kind == PERF_COLL_ALLREDUCE ? 2.0 * (n - 1) / n : (n - 1) / n;
}

static void perf_coll_report_header(const perf_coll_opts* o, const perf_coll_net* c,
                                    const perf_coll_wire* w) {
  printf("# agoq-perf %s: collnet v%d \"%s\", device %d \"%s\" (%d Mbps), %d ranks (%s)\n",
         perf_coll_kind_name(o->kind), c->view.version, c->view.name ? c->view.name : "?",
         c->dev, c->props.name, c->props.speed, o->nranks,
         o->rank < 0 ? "forked on this host" : "multi-host mode");
  char calls[64];
  if (o->chunk == 0)
    snprintf(calls, sizeof calls, "one call per buffer (at most %zu B)", c->props.max_coll_bytes);
  else
    snprintf(calls, sizeof calls, "calls of at most %zu B", o->chunk);
  /* The plugin's own settings, as its statistics lines state them. */
  printf("# %s %s; plugin: format %s%s, block %u, min bytes %" PRIu64 ", pipeline chunk %" PRIu64
         " B; %s, %d in flight; iters %d, warmup %d\n",
         perf_dtype_name(o->dtype),
         o->kind == PERF_COLL_ALLGATHER ? "(bytes)" : perf_op_name(o->op), w->format,
         o->format >= 0 ? " (--format)" : "", w->block, w->min_bytes, w->pipeline_chunk, calls,
         o->inflight, o->iters, o->warmup);
  printf("# wire: bytes on the wire / bytes in the input type, both as the plugin counted them "
         "(AGOQ_STATS), all ranks\n");
  printf("# crc%%: the plugin's payload CRC32C time as a share of its codec time (crc_ms / codec_ms, "
         "AGOQ_STATS), all ranks, warm-up and check calls included; - when no codec work ran\n");
  printf("#\n# %12s %11s %7s %6s %11s %11s %11s %6s %9s %10s %9s %6s\n", "size(B)", "count", "type",
         "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wire", "rel_l2", "max_abs",
         "diverged", "crc%");
}

void perf_coll_report_line(const perf_coll_opts* o, const perf_coll_net* c,
                           const perf_coll_wire* w, const perf_coll_result* r) {
  static bool header_done = false;
  if (!o->json && !header_done) perf_coll_report_header(o, c, w);
  header_done = true;
  double algbw = r->time_us > 0 ? (double)r->bytes / (r->time_us * 1e3) : 0.0;
  double busbw = algbw * perf_coll_busbw_factor(o->kind, o->nranks);
  double l2 = perf_err_rel_l2(&r->err);
  const char* op = o->kind == PERF_COLL_ALLGATHER ? "none" : perf_op_name(o->op);
  if (!o->json) {
    char div[32];
    if (r->diverged < 0)
      snprintf(div, sizeof(div), "-");
    else
      snprintf(div, sizeof(div), "%lld", (long long)r->diverged);
    char crc[16];
    if (r->codec_ms > 0 && r->crc_ms > 0)
      snprintf(crc, sizeof crc, "%.1f", 100.0 * r->crc_ms / r->codec_ms);
    else
      snprintf(crc, sizeof crc, "-");
    printf("  %12zu %11zu %7s %6s %11.2f %11.3f %11.3f %6.3f %9.3e %10.3e %9s %6s", r->bytes,
           r->count, perf_dtype_name(o->dtype), op, r->time_us, algbw, busbw, r->wire_ratio, l2,
           r->err.max_abs, div, crc);
    if (r->err.nonfinite > 0) printf("  (%llu non-finite)", (unsigned long long)r->err.nonfinite);
    printf("\n");
    return;
  }
  printf("{\"test\":\"%s\",\"collnet_version\":%d,\"device\":\"%s\",\"nranks\":%d,"
         "\"dtype\":\"%s\",\"op\":\"%s\",\"format\":\"%s\",\"size\":%zu,\"count\":%zu,"
         "\"chunk\":%zu,\"inflight\":%d,\"iters\":%d,\"time_us\":%.3f,\"algbw_GBps\":%.4f,"
         "\"busbw_GBps\":%.4f,\"wire_ratio\":%.4f,\"codec_ms\":%.3f,\"crc_ms\":%.3f,\"rel_l2\":%.6e,\"max_abs\":%.6e,"
         "\"nonfinite\":%llu,\"diverged\":",
         perf_coll_kind_name(o->kind), c->view.version, c->props.name, o->nranks,
         perf_dtype_name(o->dtype), op, w->format, r->bytes, r->count,
         o->chunk, o->inflight, o->iters, r->time_us, algbw, busbw, r->wire_ratio, r->codec_ms, r->crc_ms,
         isfinite(l2) ? l2 : -1.0, r->err.max_abs, (unsigned long long)r->err.nonfinite);
  if (r->diverged < 0)
    printf("null}\n");
  else
    printf("%lld}\n", (long long)r->diverged);
}
