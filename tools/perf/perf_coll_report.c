/*
 * Result lines of the collective subcommands: nccl-tests' columns plus the compression
 * and correctness columns for people, one JSON object per line for scripts (netlab.sh).
 * Every figure is measured: times and CPU time by the tool, the wire ratio and the
 * configuration by the plugin (perf_coll_wire.c).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "perf_coll.h"

/* CPU seconds per GB (1e9 B) of the size column over the timed collectives; < 0 when there
 * is no figure (no bytes moved, or a rank could not read its CPU time). */
static double perf_coll_cpu_per_gb(const perf_coll_opts* o, const perf_coll_result* r) {
  double gb = (double)r->bytes * (double)o->iters / 1e9;
  if (!(gb > 0) || !(r->cpu_s >= 0)) return -1.0;
  double v = r->cpu_s / gb;
  return isfinite(v) ? v : -1.0;
}

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
  printf("# cpu_s/GB: CPU seconds (user + system, getrusage) of every rank's process, all its "
         "threads (the plugin's engine and progress threads included), over the timed "
         "collectives, per GB (1e9 B) of size x iters\n");
  printf("#\n# %12s %11s %7s %6s %11s %11s %11s %6s %9s %10s %9s %6s %9s\n", "size(B)", "count",
         "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wire", "rel_l2", "max_abs",
         "diverged", "crc%", "cpu_s/GB");
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
  double cpu_gb = perf_coll_cpu_per_gb(o, r);
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
    char cpu[24];
    if (cpu_gb >= 0)
      snprintf(cpu, sizeof cpu, "%.3g", cpu_gb);
    else
      snprintf(cpu, sizeof cpu, "-");
    printf("  %12zu %11zu %7s %6s %11.2f %11.3f %11.3f %6.3f %9.3e %10.3e %9s %6s %9s", r->bytes,
           r->count, perf_dtype_name(o->dtype), op, r->time_us, algbw, busbw, r->wire_ratio, l2,
           r->err.max_abs, div, crc, cpu);
    if (r->err.nonfinite > 0) printf("  (%llu non-finite)", (unsigned long long)r->err.nonfinite);
    printf("\n");
    return;
  }
  printf("{\"test\":\"%s\",\"collnet_version\":%d,\"device\":\"%s\",\"nranks\":%d,"
         "\"dtype\":\"%s\",\"op\":\"%s\",\"format\":\"%s\",\"size\":%zu,\"count\":%zu,"
         "\"chunk\":%zu,\"inflight\":%d,\"iters\":%d,\"time_us\":%.3f,\"algbw_GBps\":%.6g,"
         "\"busbw_GBps\":%.6g,\"wire_ratio\":%.4f,\"codec_ms\":%.3f,\"crc_ms\":%.3f,\"rel_l2\":%.6e,\"max_abs\":%.6e,"
         "\"nonfinite\":%llu,",
         perf_coll_kind_name(o->kind), c->view.version, c->props.name, o->nranks,
         perf_dtype_name(o->dtype), op, w->format, r->bytes, r->count,
         o->chunk, o->inflight, o->iters, r->time_us, algbw, busbw, r->wire_ratio, r->codec_ms, r->crc_ms,
         isfinite(l2) ? l2 : -1.0, r->err.max_abs, (unsigned long long)r->err.nonfinite);
  /* null rather than a number when there is no figure: JSON has no inf or nan. */
  if (r->cpu_s >= 0 && isfinite(r->cpu_s))
    printf("\"cpu_s\":%.6e,", r->cpu_s);
  else
    printf("\"cpu_s\":null,");
  if (cpu_gb >= 0)
    printf("\"cpu_s_per_GB\":%.6e,", cpu_gb);
  else
    printf("\"cpu_s_per_GB\":null,");
  printf("\"diverged\":");
  if (r->diverged < 0)
    printf("null}\n");
  else
    printf("%lld}\n", (long long)r->diverged);
}
