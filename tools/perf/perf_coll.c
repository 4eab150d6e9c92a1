/*
 * agoq-perf allreduce | reducescatter | allgather: the sweep every rank runs. For each
 * size: warm-up collectives, a barrier, the timed collectives, then the checks of the last
 * result (perf_coll_check.c) and one line from rank 0.
 *
 * The CPU column: each rank's process time (getrusage RUSAGE_SELF: user + system of every
 * thread, so the plugin's engine and progress threads count with the calling thread) over
 * the same stretch as the time column: from the barrier that starts the timed collectives
 * (every warm-up call is done on every rank by then) to this rank's last completion; rank 0
 * sums the ranks. A rank's own work for the timed calls is inside its stretch: the plugin
 * completes a call only once its sends and receives are done. No harness work is inside
 * but the proxy-like loop that posts and tests: set-up, connect, warm-up, the barriers and
 * the checks lie outside.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "perf_coll.h"

#define PERF_COLL_BOOT_MS(o) ((o)->boot_timeout_s * 1000)
/* Checks of a large size can take a while on a slow rank. */
#define PERF_COLL_CHECK_MS(o) ((o)->boot_timeout_s * 1000 + 600000)

/* What every rank reports to rank 0 for one size. */
typedef struct {
  double time_us;
  double cpu_s; /* this process's CPU time over the timed collectives */
  double err2, ref2, max_abs, nonfinite, count;
} perf_coll_share;

/* 1 when every rank passed `ok`. When rank 0 itself passed, it names the ranks that did
 * not (their own messages say why); otherwise its own message already explains. */
static int perf_coll_all_ok(perf_group* g, int ok, const char* what) {
  int all[PERF_COLL_MAX_RANKS];
  if (perf_group_allgather(g, &ok, all, sizeof(ok), 600000) != 0) return 0;
  int good = 1;
  for (int k = 0; k < g->nranks; k++)
    if (!all[k]) {
      if (g->rank == 0 && all[0]) fprintf(stderr, "agoq-perf: rank %d: %s failed\n", k, what);
      good = 0;
    }
  return good;
}

/* User + system seconds of every thread of this process so far; -1 when unknown. */
static double perf_coll_cpu_s(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1.0;
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int perf_coll_support(perf_coll_net* c, const perf_coll_opts* o, perf_group* g) {
  int ok = 1;
  if (o->kind != PERF_COLL_ALLREDUCE && !agoq_collnet_view_has_gather_scatter(&c->view)) {
    if (g->rank == 0)
      fprintf(stderr, "agoq-perf: CollNet v%d has no %s (NCCL's v6 and v7 tables lack "
              "iallgather and ireducescatter; try --abi 8 or later)\n", c->view.version,
              o->kind == PERF_COLL_ALLGATHER ? "iallgather" : "ireducescatter");
    ok = 0;
  } else if (o->kind != PERF_COLL_ALLGATHER) {
    int supported = 0;
    ncclResult_t r = agoq_collnet_view_reduce_support(&c->view, o->dtype, o->op, &supported);
    if (r != ncclSuccess || !supported) {
      fprintf(stderr, "agoq-perf: rank %d: the plugin does not reduce %s with %s%s%s\n",
              g->rank, perf_dtype_name(o->dtype), perf_op_name(o->op),
              r != ncclSuccess ? ": reduceSupport returned " : " (reduceSupport)",
              r != ncclSuccess ? agoq_result_str(r) : "");
      ok = 0;
    }
  }
  return perf_coll_all_ok(g, ok, "the support check") ? 0 : -1;
}

static int perf_coll_size(perf_coll_net* c, perf_group* g, const perf_coll_opts* o,
                          perf_coll_wire* wire, size_t size, uint8_t* send,
                          uint8_t* recv, bool* limits_ok) {
  perf_coll_plan plan;
  int rc = -1;
  if (perf_coll_plan_make(&plan, o, g->rank, size, c->props.max_coll_bytes) != 0) {
    perf_group_abort(g);
    return -1;
  }
  if (o->warmup > 0 && perf_coll_stream(c, g, o, &plan, send, recv, o->warmup) != 0) goto fail;
  if (perf_group_barrier(g, PERF_COLL_CHECK_MS(o)) != 0) goto out;
  double cpu0 = perf_coll_cpu_s();
  double t0 = perf_now_us();
  if (perf_coll_stream(c, g, o, &plan, send, recv, o->iters) != 0) goto fail;
  double cpu1 = perf_coll_cpu_s();
  perf_coll_share mine = {.time_us = (perf_now_us() - t0) / o->iters};
  mine.cpu_s = cpu0 >= 0 && cpu1 >= cpu0 ? cpu1 - cpu0 : -1.0;
  perf_err e;
  perf_coll_error(o, &plan, recv, &e);
  mine.err2 = e.err2;
  mine.ref2 = e.ref2;
  mine.max_abs = e.max_abs;
  mine.nonfinite = (double)e.nonfinite;
  mine.count = (double)e.count;
  int64_t diverged = -1;
  if (perf_coll_diverged(g, &plan, recv, &diverged) != 0) goto fail;
  perf_coll_wire_figures fig; /* the plugin's count for this size (perf_coll_wire.c) */
  if (perf_coll_wire_cycle(c, g, wire, PERF_COLL_CHECK_MS(o), &fig) != 0) goto fail;
  perf_coll_share* all = g->rank == 0 ? calloc((size_t)g->nranks, sizeof(*all)) : NULL;
  if (g->rank == 0 && all == NULL) goto fail;
  if (perf_group_gather(g, &mine, all, sizeof(mine), PERF_COLL_CHECK_MS(o)) != 0) {
    free(all);
    goto out;
  }
  if (g->rank == 0) {
    perf_coll_result res = {.bytes = plan.bytes, .count = plan.count, .diverged = diverged,
                            .wire_ratio = fig.ratio, .codec_ms = fig.codec_ms, .crc_ms = fig.crc_ms};
    for (int k = 0; k < g->nranks; k++) {
      if (all[k].time_us > res.time_us) res.time_us = all[k].time_us;
      /* One rank without a figure leaves the sum unknown, not smaller. */
      res.cpu_s = res.cpu_s < 0 || all[k].cpu_s < 0 ? -1.0 : res.cpu_s + all[k].cpu_s;
      perf_err ek = {.err2 = all[k].err2, .ref2 = all[k].ref2, .max_abs = all[k].max_abs,
                     .nonfinite = (uint64_t)all[k].nonfinite, .count = (uint64_t)all[k].count};
      perf_err_merge(&res.err, &ek);
    }
    free(all);
    if (plan.nwin == 0) res.time_us = 0;
    perf_coll_report_line(o, c, wire, &res);
    fflush(stdout);
    double l2 = perf_err_rel_l2(&res.err);
    if (o->max_rel_l2 >= 0 && (!(l2 <= o->max_rel_l2) || res.err.nonfinite > 0)) {
      fprintf(stderr, "agoq-perf: %zu B: relative L2 error %.4e exceeds --max-rel-l2 %.4e%s\n",
              plan.bytes, l2, o->max_rel_l2, res.err.nonfinite > 0 ? " (non-finite results)" : "");
      *limits_ok = false;
    }
    if (o->max_diverged >= 0 && res.diverged > o->max_diverged) {
      fprintf(stderr, "agoq-perf: %zu B: %lld elements differ between ranks (--max-diverged "
              "%ld)\n", plan.bytes, (long long)res.diverged, o->max_diverged);
      *limits_ok = false;
    }
  }
  rc = 0;
  goto out;
fail:
  perf_group_abort(g);
out:
  perf_coll_plan_free(&plan);
  return rc;
}

/* Buffer sizes at the largest size: allreduce in = out; reducescatter in = all parts;
 * allgather out = all parts. */
static void perf_coll_buffer_sizes(const perf_coll_opts* o, size_t* send_count,
                                   size_t* recv_count) {
  size_t elt = perf_dtype_size(o->dtype), n = (size_t)o->nranks;
  size_t all = o->max_bytes / elt;
  size_t per = all / n;
  switch (o->kind) {
    case PERF_COLL_ALLREDUCE: *send_count = *recv_count = all; break;
    case PERF_COLL_REDUCESCATTER: *send_count = per * n; *recv_count = per; break;
    default: *send_count = per; *recv_count = per * n; break;
  }
}

/* 0: every size ran and met the limits; 1: a limit was exceeded; -1: a failure. */
static int perf_coll_session(perf_coll_opts* o, perf_group* g, uint64_t comm_id) {
  perf_coll_net c;
  uint8_t *send = NULL, *recv = NULL;
  int rc = -1;
  perf_coll_wire wire;
  memset(&c, 0, sizeof(c));
  if (perf_coll_wire_begin(&wire, g->rank) != 0) return -1;
  int opened = perf_coll_open(&c, o->lib, o->abi, o->dev, comm_id, g->rank) == 0;
  if (!perf_coll_all_ok(g, opened, "CollNet set-up")) goto out;
  if (perf_coll_support(&c, o, g) != 0) goto out;
  if (perf_coll_connect(&c, g) != 0) {
    perf_group_abort(g);
    goto out;
  }
  size_t send_count, recv_count, elt = perf_dtype_size(o->dtype);
  perf_coll_buffer_sizes(o, &send_count, &recv_count);
  /* At least one element each, so every registration has a buffer to name. */
  size_t send_bytes = (send_count ? send_count : 1) * elt, recv_bytes = (recv_count ? recv_count : 1) * elt;
  send = aligned_alloc(4096, (send_bytes + 4095) / 4096 * 4096);
  recv = aligned_alloc(4096, (recv_bytes + 4095) / 4096 * 4096);
  int ready = send != NULL && recv != NULL;
  if (!ready) {
    fprintf(stderr, "agoq-perf: rank %d: cannot allocate %zu + %zu B\n", g->rank, send_bytes,
            recv_bytes);
  } else {
    perf_input_fill(o->dtype, send, send_count, perf_rank_seed(o->seed, g->rank), o->nranks, 0);
    memset(recv, 0, recv_bytes); /* first-touch faults stay out of the timed runs */
    ready = perf_coll_register(&c, send, send_bytes, recv, recv_bytes) == 0;
    wire.send = send;
    wire.recv = recv;
    wire.send_bytes = send_bytes;
    wire.recv_bytes = recv_bytes;
  }
  if (!perf_coll_all_ok(g, ready, "buffer set-up")) goto out;

  perf_opts sweep = {.min_bytes = o->min_bytes, .max_bytes = o->max_bytes,
                     .factor = o->factor, .step_bytes = o->step_bytes};
  bool limits_ok = true;
  bool first = true;
  size_t last = 0, unit = elt * (o->kind == PERF_COLL_ALLREDUCE ? 1 : (size_t)o->nranks);
  for (size_t size = o->min_bytes; size != 0 || first; size = perf_next_size(&sweep, size)) {
    /* Sizes round down to whole elements (per rank): run each rounded size once. */
    if (!first && size / unit * unit == last) continue;
    first = false;
    last = size / unit * unit;
    if (perf_coll_size(&c, g, o, &wire, size, send, recv, &limits_ok) != 0) goto out;
  }
  /* Close only when everyone is done, so no rank tears down a connection under a peer's
   * last bytes. */
  if (perf_group_barrier(g, PERF_COLL_CHECK_MS(o)) != 0) goto out;
  rc = limits_ok ? 0 : 1;
out:
  perf_coll_close(&c);
  perf_coll_wire_end(&wire);
  free(send);
  free(recv);
  return rc;
}

static int perf_coll_main(int argc, char** argv, perf_coll_kind kind) {
  perf_coll_opts o;
  int rc = perf_coll_opts_parse(argc, argv, kind, &o);
  if (rc != 0) return rc > 0 ? 0 : 2;
  perf_group g;
  /* Before the fork, so rank 0 knows every rank's statistics file (perf_coll_wire.c). */
  if (perf_coll_stats_prepare(o.rank < 0 ? o.nranks : 1) != 0) return 1;
  if (o.rank < 0) {
    /* All ranks on this host: loopback, unless the user chose interfaces. */
    if (getenv("NCCL_SOCKET_IFNAME") == NULL) setenv("AGOQ_SOCKET_IFNAME", "lo", 0);
    if (perf_group_fork(&g, o.nranks) != 0) {
      perf_coll_stats_cleanup();
      return 1;
    }
    perf_coll_stats_children(&g);
  } else if (perf_group_tcp(&g, o.rank, o.nranks, o.addr, o.boot_timeout_s) != 0) {
    perf_coll_stats_cleanup();
    return 1;
  }
  uint8_t config[PERF_COLL_CONFIG_BYTES];
  uint64_t comm_id = 0;
  if (g.rank == 0) {
    /* Any value the ranks share, like NCCL's commHash. */
    comm_id = perf_mix64((uint64_t)perf_now_us() ^ ((uint64_t)getpid() << 32));
    perf_coll_config_encode(&o, comm_id, config);
  }
  rc = 1;
  if (perf_group_bcast(&g, config, sizeof(config), PERF_COLL_BOOT_MS(&o)) != 0) goto done;
  if (g.rank != 0) {
    perf_coll_opts mine = o;
    perf_coll_config_decode(config, &o, &comm_id);
    if (o.kind != mine.kind || o.nranks != mine.nranks) {
      fprintf(stderr, "agoq-perf: rank %d runs %s with %d ranks, rank 0 %s with %d\n", g.rank,
              perf_coll_kind_name(mine.kind), mine.nranks, perf_coll_kind_name(o.kind),
              o.nranks);
      perf_group_abort(&g);
      goto done;
    }
    /* Per host: where the plugin is, which device, how this rank reports. */
    o.lib = mine.lib;
    o.dev = mine.dev;
    o.json = mine.json;
    o.rank = mine.rank;
    o.addr = mine.addr;
    o.boot_timeout_s = mine.boot_timeout_s;
  }
  /* Before the plugin is loaded, which reads it at init. */
  if (o.format >= 0) setenv("AGOQ_FORMAT", perf_coll_formats[o.format], 1);
  /* We play NCCL with CollNet enabled: without this the plugin would rightly warn that
   * NCCL (which reads the same variable) will not use its CollNet. */
  setenv("NCCL_COLLNET_ENABLE", "1", 0);
  int session = perf_coll_session(&o, &g, comm_id);
  if (session < 0) perf_group_abort(&g);
  rc = session == 0 ? 0 : 1;
  /* After a clean run the forked ranks are exiting: collect their status. */
  if (g.rank == 0 && session >= 0 && perf_group_finish(&g) != 0) rc = 1;
done:
  /* On failure this kills forked ranks that may be stuck in a plugin call. */
  perf_group_close(&g);
  perf_coll_stats_cleanup();
  return rc;
}

int perf_allreduce_main(int argc, char** argv) {
  return perf_coll_main(argc, argv, PERF_COLL_ALLREDUCE);
}

int perf_reducescatter_main(int argc, char** argv) {
  return perf_coll_main(argc, argv, PERF_COLL_REDUCESCATTER);
}

int perf_allgather_main(int argc, char** argv) {
  return perf_coll_main(argc, argv, PERF_COLL_ALLGATHER);
}
