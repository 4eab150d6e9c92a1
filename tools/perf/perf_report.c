/*
 * Result lines: columns like nccl-tests for people, one JSON object per line for scripts.
 */
#include <stdio.h>
#include <stdlib.h>

#include "perf.h"
#include "perf_dtype.h"
#include "perf_p2p_typed.h"

static void perf_json_string(const char* s) {
  putchar('"');
  for (const unsigned char* p = (const unsigned char*)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      printf("\\%c", *p);
    else if (*p < 0x20)
      printf("\\u%04x", *p);
    else
      putchar(*p);
  }
  putchar('"');
}

void perf_report_header(const perf_opts* o, const perf_net* n, const char* test) {
  if (o->json) return;
  /* The plugin's own figures (its init line), never our reading of its variables. */
  char path[200] = "data sockets per connection not reported";
  if (p2p_typed_verbs() != NULL)
    snprintf(path, sizeof path, "verbs on %s", p2p_typed_verbs());
  else if (p2p_typed_nsocks() > 0)
    snprintf(path, sizeof path, "data sockets per connection %u", p2p_typed_nsocks());
  printf("# agoq-perf %s: net v%d \"%s\", device %d \"%s\" (%d Mbps)\n", test, n->view.version,
         n->view.name ? n->view.name : "?", n->dev, n->props.name, n->props.speed);
  printf("# iters %d, warmup %d, inflight %d, %s, check %s, %s\n", o->iters, o->warmup, o->inflight, path,
         o->check ? "on" : "off",
         o->rank < 0 ? "forked peer on this host" : "two-host mode");
  if (o->pingpong)
    printf("# ping-pong: rank 1 sends every message back; time(us) is half a round trip, bw is "
           "size over it\n");
  if (o->dtype >= 0) {
    printf("# typed p2p: dtype %s, p2p format %s, oracle %s, traffic %s; %s messages checked\n",
           perf_dtype_name((ncclDataType_t)o->dtype),
           o->format ? o->format : "as the plugin is configured (its agoq-stats lines say: format=)",
           o->no_oracle ? "none (no profiler)" : "agoq profiler via emulated NCCL chain",
           o->coll_traffic ? "collective ring" : "p2p", o->check ? "all" : "warm-up");
    printf("#\n# %14s %8s %12s %11s %11s %10s %6s\n", "size(B)", "count", "time(us)", "bw(GB/s)",
           "bw(Gbit/s)", "rel_l2", "exact");
    return;
  }
  printf("#\n# %14s %8s %12s %11s %11s\n", "size(B)", "count", "time(us)", "bw(GB/s)",
         "bw(Gbit/s)");
}

void perf_report_wire(const perf_opts* o) {
  uint64_t frames, unknown;
  double in, wire;
  p2p_typed_wire(&frames, &in, &wire, &unknown);
  uint64_t queries;
  double ns;
  p2p_typed_oracle(&queries, &ns);
  double ratio = wire > 0 ? in / wire : 1.0;
  if (o->json) {
    printf("{\"test\":\"p2p-wire\",\"frames\":%llu,\"in_MiB\":%.3f,\"wire_MiB\":%.3f,\"reduction\":%.4f,"
           "\"unknown\":%llu,\"oracle_queries\":%llu,\"oracle_ns\":%.1f}\n",
           (unsigned long long)frames, in, wire, ratio, (unsigned long long)unknown, (unsigned long long)queries,
           ns);
    return;
  }
  printf("# plugin p2p stats: %llu quantized messages, %.1f MiB in %.1f MiB on the wire (%.3fx fewer bytes); "
         "%llu of unknown type; oracle %llu queries, %.0f ns each inside isend\n",
         (unsigned long long)frames, in, wire, ratio, (unsigned long long)unknown, (unsigned long long)queries, ns);
}

void perf_report_line(const perf_opts* o, const perf_net* n, const perf_result* r) {
  double gbytes = r->time_us > 0 ? (double)r->bytes / (r->time_us * 1e3) : 0.0;
  if (!o->json) {
    if (r->typed)
      printf("  %14zu %8d %12.2f %11.3f %11.3f %10.3e %6s\n", r->bytes, r->iters, r->time_us, gbytes,
             gbytes * 8.0, r->rel_l2, r->exact ? "yes" : "no");
    else
      printf("  %14zu %8d %12.2f %11.3f %11.3f\n", r->bytes, r->iters, r->time_us, gbytes,
             gbytes * 8.0);
    return;
  }
  printf("{\"test\":");
  perf_json_string(r->test);
  printf(",\"net_version\":%d,\"device\":", n->view.version);
  perf_json_string(n->props.name);
  /* Bandwidths in significant digits: a fixed %.4f printed a slow 8-byte transfer's as 0. */
  printf(",\"size\":%zu,\"iters\":%d,\"inflight\":%d,\"time_us\":%.3f,\"bw_GBps\":%.6g,"
         "\"bw_Gbps\":%.6g,\"checked\":%s",
         r->bytes, r->iters, r->inflight, r->time_us, gbytes, gbytes * 8.0,
         r->checked ? "true" : "false");
  if (r->typed)
    printf(",\"dtype\":\"%s\",\"rel_l2\":%.6e,\"exact\":%s", perf_dtype_name((ncclDataType_t)o->dtype),
           r->rel_l2, r->exact ? "true" : "false");
  printf("}\n");
}
