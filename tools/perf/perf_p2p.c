/*
 * agoq-perf p2p: point-to-point bandwidth through the plugin's newest net table. Rank 0
 * sends, rank 1 receives; each keeps `inflight` requests posted and tests the oldest, as
 * NCCL's proxy keeps its steps in flight. For every size: a warm-up run, then a timed run
 * that starts when the receiver says it is ready and ends when it says all arrived.
 * With -c every message is checked and a wrong one fails the run (exit 1). --pingpong
 * measures latency instead (perf_p2p_pingpong.c).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <unistd.h>

#include "perf.h"
#include "perf_dtype.h"
#include "perf_p2p_typed.h"

#define P2P_TAG 0 /* NCCL's tag is the sender's rank */

typedef struct {
  uint8_t* buf[32];
  uint8_t* dev[32]; /* --device: buf's device twins (perf_device.c), which the plugin gets */
  void* mh[32];
  int nbuf; /* 1, or `inflight` with --check: one buffer per slot */
} p2p_bufs;

/* What the plugin gets of buffer i: its device twin with --device, else the buffer. */
static uint8_t* p2p_plugin_buf(const p2p_bufs* b, int i) { return b->dev[i] != NULL ? b->dev[i] : b->buf[i]; }

/* ---- the configuration rank 0 hands rank 1 ---- */

enum { P2P_CONFIG_WORDS = 13 };

static void p2p_config_encode(const perf_opts* o, uint64_t comm_id, uint8_t* out) {
  uint64_t w[P2P_CONFIG_WORDS] = {o->min_bytes, o->max_bytes, o->step_bytes,
                                  (uint64_t)(o->factor * 1e6), (uint64_t)o->iters,
                                  (uint64_t)o->warmup, (uint64_t)o->inflight,
                                  (uint64_t)o->check, comm_id, (uint64_t)(o->dtype + 1),
                                  (uint64_t)o->no_oracle | (uint64_t)o->coll_traffic << 1 | (uint64_t)o->pingpong << 2 |
                                      (uint64_t)o->device << 3,
                                  (uint64_t)o->chunk,
                                  (uint64_t)o->target_bytes};
  for (int i = 0; i < P2P_CONFIG_WORDS; i++)
    for (int k = 0; k < 8; k++) out[i * 8 + k] = (uint8_t)(w[i] >> (8 * k));
}

static void p2p_config_decode(const uint8_t* in, perf_opts* o, uint64_t* comm_id) {
  uint64_t w[P2P_CONFIG_WORDS] = {0};
  for (int i = 0; i < P2P_CONFIG_WORDS; i++)
    for (int k = 7; k >= 0; k--) w[i] = (w[i] << 8) | in[i * 8 + k];
  o->min_bytes = w[0];
  o->max_bytes = w[1];
  o->step_bytes = w[2];
  o->factor = (double)w[3] / 1e6;
  o->iters = (int)w[4];
  o->warmup = (int)w[5];
  o->inflight = (int)w[6];
  o->check = w[7] != 0;
  *comm_id = w[8];
  o->dtype = (int)w[9] - 1;
  o->no_oracle = (w[10] & 1) != 0;
  o->coll_traffic = (w[10] & 2) != 0;
  o->pingpong = (w[10] & 4) != 0;
  o->device = (w[10] & 8) != 0; /* rank 0's --device applies to both ranks */
  o->chunk = w[11];
  o->target_bytes = w[12]; /* the receiver counts the same messages per size */
}

/* ---- payload pattern (--check) ---- */

static inline uint64_t p2p_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void perf_p2p_fill(uint8_t* p, size_t size, uint64_t seed) {
  uint64_t key = p2p_mix(seed);
  size_t words = size / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t v = p2p_mix(key + i);
    memcpy(p + i * 8, &v, 8);
  }
  uint64_t v = p2p_mix(key + words);
  memcpy(p + words * 8, &v, size % 8);
}

size_t perf_p2p_verify(const uint8_t* p, size_t size, uint64_t seed) {
  uint64_t key = p2p_mix(seed);
  for (size_t i = 0; i * 8 < size; i++) {
    uint64_t v = p2p_mix(key + i);
    size_t n = size - i * 8 < 8 ? size - i * 8 : 8;
    if (memcmp(p + i * 8, &v, n) != 0) return i * 8;
  }
  return SIZE_MAX;
}

uint64_t perf_p2p_seed(size_t size, int msg) {
  return (uint64_t)size * 1000003u + (uint64_t)msg;
}

/* ---- the streaming loop both ranks run ---- */

/* Typed runs check their warm-up messages against the sender's per-slot data. */
/* With --chunk a transfer of `size` bytes goes as nch isends (NCCL's steps); message m is
 * chunk m % nch of transfer m / nch, whose buffer is that transfer's slot. */
static size_t p2p_nchunks(const perf_opts* o, size_t size) {
  return o->chunk != 0 && size > o->chunk ? (size + o->chunk - 1) / o->chunk : 1;
}

/* Message m's bytes: [off, off + len) of its transfer; where they are: buffer bi at boff. */
static void p2p_chunk_of(const perf_opts* o, const p2p_bufs* b, int rank, size_t size, int m, int* bi,
                         size_t* off, size_t* len, size_t* boff) {
  size_t nch = p2p_nchunks(o, size);
  size_t csz = nch > 1 ? o->chunk : size;
  *off = (size_t)m % nch * csz;
  *len = size - *off < csz ? size - *off : csz;
  *boff = *off;
  if (o->dtype >= 0 && rank == 1) { /* a ring of per-request buffers */
    *bi = m % o->inflight;
    if (nch > 1) *boff = 0;
  } else {
    *bi = b->nbuf > 1 ? (int)((size_t)m / nch % (size_t)o->inflight) : 0;
  }
}

static int p2p_stream(perf_net* n, int rank, const perf_opts* o, p2p_bufs* b, size_t size,
                      int count, int msg_base, p2p_typed* typed, bool verify) {
  void* reqs[32] = {0};
  int posted = 0, done = 0;
  ncclResult_t r;
  count *= (int)p2p_nchunks(o, size);
  while (done < count) {
    bool progress = false;
    while (posted < count && posted - done < o->inflight) {
      int slot = posted % o->inflight;
      int bi;
      size_t off, len, boff;
      p2p_chunk_of(o, b, rank, size, posted, &bi, &off, &len, &boff);
      void* req = NULL;
      if (rank == 0) {
        if (o->check && typed->dtype < 0) {
          perf_p2p_fill(b->buf[bi], size, perf_p2p_seed(size, msg_base + posted));
          /* The slot's previous message is done: nothing reads its device buffer now. */
          if (b->dev[bi] != NULL && perf_device_push(b->dev[bi], b->buf[bi], size) != 0) return -1;
        }
        void* ph = p2p_typed_begin(typed, slot, len, size);
        r = agoq_view_isend_ph(&n->view, n->send_comm, p2p_plugin_buf(b, bi) + boff, len, P2P_TAG, b->mh[bi], ph,
                               &req);
        if (req == NULL) p2p_typed_end(typed, slot);
      } else {
        void* data[1] = {p2p_plugin_buf(b, bi) + boff};
        size_t sizes[1] = {len};
        int tags[1] = {P2P_TAG};
        r = agoq_view_irecv(&n->view, n->recv_comm, 1, data, sizes, tags, &b->mh[bi], &req);
      }
      if (r != ncclSuccess) {
        fprintf(stderr, "agoq-perf: rank %d: %s of %zu B failed: %s\n", rank,
                rank == 0 ? "isend" : "irecv", size, agoq_result_str(r));
        return -1;
      }
      if (req == NULL) break; /* the plugin's "try again", as NCCL reads it */
      reqs[slot] = req;
      posted++;
      progress = true;
    }
    int slot = done % o->inflight;
    int finished = 0, got = -1;
    r = agoq_view_test(&n->view, reqs[slot], &finished, &got);
    if (r != ncclSuccess) {
      fprintf(stderr, "agoq-perf: rank %d: test of message %d (%zu B) failed: %s\n", rank, done,
              size, agoq_result_str(r));
      return -1;
    }
    if (finished) {
      int bi;
      size_t off, len, boff;
      p2p_chunk_of(o, b, rank, size, done, &bi, &off, &len, &boff);
      if (rank == 0) p2p_typed_end(typed, slot);
      /* --device: what the plugin put into the device buffer, as it is now that test()
       * said done, is what gets checked. */
      bool checks = verify || (o->check && typed->dtype < 0);
      if (rank == 1 && checks && b->dev[bi] != NULL && len > 0 &&
          perf_device_pull(b->buf[bi] + boff, b->dev[bi] + boff, len) != 0)
        return -1;
      if (rank == 1 && verify) p2p_typed_check(typed, b->buf[bi] + boff, len, perf_p2p_seed(size, 0), off, size);
      if (rank == 1 && len <= INT_MAX && got != (int)len) {
        fprintf(stderr, "agoq-perf: rank 1: message %d: %d B arrived, %zu B were sent\n", done,
                got, len);
        return -1;
      }
      if (rank == 1 && o->check && typed->dtype < 0) {
        size_t bad = perf_p2p_verify(b->buf[b->nbuf > 1 ? slot : 0], size,
                                perf_p2p_seed(size, msg_base + done));
        if (bad != SIZE_MAX) {
          fprintf(stderr, "agoq-perf: rank 1: message %d (%zu B): wrong data at offset %zu\n",
                  done, size, bad);
          return -1;
        }
      }
      done++;
      progress = true;
    }
    /* The proxy yields when a pass moved nothing; so do we, or on a small host the
     * polling starves the plugin's own progress threads. */
    if (!progress) sched_yield();
  }
  return 0;
}

/* The receiver's verdict on a typed run's checked messages, carried by its DONE. */
typedef struct {
  double rel_l2_max;
  uint64_t exact, checked;
} p2p_verdict;

static void p2p_verdict_merge(p2p_verdict* into, const p2p_verdict* from) {
  if (from->rel_l2_max > into->rel_l2_max) into->rel_l2_max = from->rel_l2_max;
  into->exact = into->exact && from->exact;
  into->checked += from->checked;
}

/* Rank 0: a typed size's verdict against the rules. Every message that should have been
 * checked was; integers and fp64 are never quantized (a message that is not bit-exact is
 * corruption); --max-rel-l2 bounds the quantized ones, as in the collective runs. */
static bool p2p_verdict_fails(const perf_opts* o, const p2p_verdict* v, uint64_t want, size_t size) {
  ncclDataType_t dt = (ncclDataType_t)o->dtype;
  bool lossless = !perf_dtype_is_float(dt) || dt == ncclFloat64;
  bool fail = false;
  if (v->checked != want) {
    fprintf(stderr, "agoq-perf: p2p %zu B: %llu of %llu messages were checked\n", size,
            (unsigned long long)v->checked, (unsigned long long)want);
    fail = true;
  }
  if (lossless && !v->exact) {
    fprintf(stderr, "agoq-perf: p2p %zu B: %s is never quantized, but a message arrived changed "
            "(rel. L2 %.3e)\n", size, perf_dtype_name(dt), v->rel_l2_max);
    fail = true;
  }
  if (o->max_rel_l2 >= 0 && !v->exact && !(v->rel_l2_max <= o->max_rel_l2)) {
    fprintf(stderr, "agoq-perf: p2p %zu B: rel. L2 error %.3e exceeds --max-rel-l2 %g\n", size,
            v->rel_l2_max, o->max_rel_l2);
    fail = true;
  }
  return fail;
}

/* One run of `count` messages, framed by READY (receiver ready) and DONE (all arrived).
 * On rank 0, *elapsed_us is the time from READY to DONE; a typed run's verdict (of the
 * messages checked in this run) arrives with DONE. */
static int p2p_run(perf_net* n, perf_boot* boot, const perf_opts* o, p2p_bufs* b, size_t size,
                   int count, int msg_base, double* elapsed_us, p2p_typed* typed, bool verify,
                   p2p_verdict* verdict) {
  if (boot->rank == 1) {
    typed->rel_l2_max = 0;
    typed->all_exact = true;
    typed->checked = 0;
    if (perf_boot_send(boot, PERF_MSG_READY, NULL, 0) != 0) return -1;
    if (p2p_stream(n, 1, o, b, size, count, msg_base, typed, verify) != 0) return -1;
    p2p_verdict v = {typed->rel_l2_max, typed->all_exact, typed->checked};
    return perf_boot_send(boot, PERF_MSG_DONE, &v, sizeof v);
  }
  int timeout_ms = o->boot_timeout_s * 1000;
  if (perf_boot_recv(boot, PERF_MSG_READY, NULL, 0, timeout_ms) != 0) return -1;
  double t0 = perf_now_us();
  if (p2p_stream(n, 0, o, b, size, count, msg_base, typed, verify) != 0) return -1;
  /* The receiver's DONE can take as long as the transfer itself: allow for slow links. */
  p2p_verdict v;
  if (perf_boot_recv(boot, PERF_MSG_DONE, &v, sizeof v, timeout_ms + 600000) != 0) return -1;
  if (verdict != NULL) *verdict = v;
  *elapsed_us = perf_now_us() - t0;
  return 0;
}

static int p2p_bufs_alloc(perf_net* n, int rank, const perf_opts* o, p2p_bufs* b) {
  memset(b, 0, sizeof(*b));
  b->nbuf = o->check ? o->inflight : 1;
  size_t bytes = o->max_bytes > 0 ? o->max_bytes : 1;
  /* Typed: every transfer carries the same data, so the sender needs one buffer; the
   * receiver gets one per request in flight, of one chunk with --chunk (the ring of
   * step-sized buffers NCCL receives into), else of a whole transfer. */
  if (o->dtype >= 0 && rank == 1) {
    b->nbuf = o->inflight;
    if (o->chunk != 0 && o->chunk < bytes) bytes = o->chunk;
  }
  void* comm = rank == 0 ? n->send_comm : n->recv_comm;
  for (int i = 0; i < b->nbuf; i++) {
    b->buf[i] = malloc(bytes);
    if (b->buf[i] == NULL) {
      fprintf(stderr, "agoq-perf: rank %d: cannot allocate %d x %zu B%s\n", rank, b->nbuf, bytes,
              o->check ? " (--check needs one buffer per in-flight request)" : "");
      return -1;
    }
    /* Touch every page now, so first-touch faults are not timed. */
    if (rank == 0 && !o->check && o->dtype < 0)
      perf_p2p_fill(b->buf[i], bytes, 1);
    else
      memset(b->buf[i], 0, bytes);
    if (o->device && (b->dev[i] = perf_device_twin(b->buf[i], bytes)) == NULL) return -1;
    ncclResult_t r = agoq_view_reg_mr(&n->view, comm, p2p_plugin_buf(b, i), bytes,
                                      o->device ? NCCL_PTR_CUDA : NCCL_PTR_HOST, &b->mh[i]);
    if (r != ncclSuccess) {
      fprintf(stderr, "agoq-perf: rank %d: regMr of %zu B failed: %s\n", rank, bytes,
              agoq_result_str(r));
      return -1;
    }
  }
  return 0;
}

static void p2p_bufs_free(perf_net* n, int rank, p2p_bufs* b) {
  void* comm = rank == 0 ? n->send_comm : n->recv_comm;
  for (int i = 0; i < b->nbuf; i++) {
    if (b->mh[i] != NULL && comm != NULL) agoq_view_dereg_mr(&n->view, comm, b->mh[i]);
    perf_device_free(b->dev[i]);
    free(b->buf[i]);
  }
  memset(b, 0, sizeof(*b));
}

int perf_p2p_main(int argc, char** argv) {
  perf_opts o;
  int rc = perf_opts_parse(argc, argv, "p2p", &o);
  if (rc != 0) return rc > 0 ? 0 : 2;

  perf_boot boot = {.fd = -1};
  bool check_failed = false; /* a typed size failed its check: run on, then exit 1 */
  if (o.rank < 0) {
    /* Both ends on this host: loopback, unless the user chose interfaces. */
    if (getenv("NCCL_SOCKET_IFNAME") == NULL) setenv("AGOQ_SOCKET_IFNAME", "lo", 0);
    if (perf_boot_fork(&boot) != 0) return 1;
  } else if (perf_boot_tcp(&boot, o.rank, o.addr, o.boot_timeout_s) != 0) {
    return 1;
  }
  int rank = boot.rank;

  uint8_t config[P2P_CONFIG_WORDS * 8];
  uint64_t comm_id = 0;
  if (rank == 0) {
    /* Any value both ranks share, like NCCL's commHash. */
    comm_id = p2p_mix((uint64_t)perf_now_us() ^ ((uint64_t)getpid() << 32));
    p2p_config_encode(&o, comm_id, config);
    if (perf_boot_send(&boot, PERF_MSG_CONFIG, config, sizeof(config)) != 0) goto fail_boot;
  } else {
    if (perf_boot_recv(&boot, PERF_MSG_CONFIG, config, sizeof(config),
                       o.boot_timeout_s * 1000) != 0)
      goto fail_boot;
    p2p_config_decode(config, &o, &comm_id);
  }

  perf_net n;
  p2p_bufs bufs;
  perf_pp_bufs pp;
  p2p_typed typed;
  memset(&bufs, 0, sizeof(bufs));
  memset(&pp, 0, sizeof(pp));
  memset(&typed, 0, sizeof(typed));
  typed.dtype = o.dtype;
  typed.oracle = !o.no_oracle;
  typed.coll = o.coll_traffic;
  typed.flow = o.flow; /* rank 0's own: only the sender drives the emulated profiler */
  rc = 1;
  if (o.dtype >= 0) {
    if (o.warmup < 1) {
      fprintf(stderr, "agoq-perf: --dtype checks the warm-up messages: -w must be at least 1\n");
      goto fail_boot;
    }
    p2p_typed_env(o.format);
  }
  if (perf_net_open_ex(&n, o.lib, o.dev, comm_id, p2p_typed_logger(),
                       o.dtype >= 0 ? p2p_typed_callback() : NULL) != 0)
    goto fail_net;
  if (o.dtype >= 0 && p2p_typed_open(&typed, &n, comm_id, o.max_bytes, rank) != 0) goto fail_net;
  if (o.device && (n.props.ptr_support & NCCL_PTR_CUDA) == 0) {
    if (rank == 0)
      fprintf(stderr, "agoq-perf: --device: the plugin %s takes no device buffers (ptrSupport 0x%x): "
              "--device needs the plugin built over the CUDA emulation (libnccl-net-agoq-emu.so)\n",
              o.lib != NULL ? o.lib : "(default)", (unsigned)n.props.ptr_support);
    goto fail_net;
  }
  if (o.max_bytes > n.props.max_p2p_bytes) {
    fprintf(stderr, "agoq-perf: -e %zu exceeds the device's maxP2pBytes %zu%s\n", o.max_bytes,
            n.props.max_p2p_bytes,
            (n.props.ptr_support & NCCL_PTR_CUDA) != 0 ? " (a plugin that takes device buffers caps it at AGOQ_GPU_STAGING)"
                                                     : "");
    goto fail_net;
  }
  if (perf_net_connect_pair(&n, &boot) != 0) goto fail_net;
  if (o.pingpong) {
    /* The echo's connection, rank 1 -> rank 0, on the same contexts. */
    if (perf_net_connect_from(&n, &boot, 1) != 0) goto fail_net;
    if (perf_pp_bufs_alloc(&n, o.max_bytes, o.device, &pp) != 0) goto fail_net;
  } else if (p2p_bufs_alloc(&n, rank, &o, &bufs) != 0) {
    goto fail_net;
  }

  if (rank == 0) perf_report_header(&o, &n, o.pingpong ? "pingpong" : "p2p");
  int msg_base = 0;
  for (size_t size = o.min_bytes; size != 0 || msg_base == 0; size = perf_next_size(&o, size)) {
    double us = 0;
    int iters = perf_timed_iters(&o, size);
    p2p_verdict verdict = {0, 1, 0}, timed = {0, 1, 0};
    /* Typed: every transfer carries the same data, sent again and again; with -c the sender
     * cycles through one buffer per request in flight, so every one of them holds it. */
    if (o.pingpong) {
      if (o.warmup > 0 && perf_pp_run(&n, &boot, &o, &pp, size, o.warmup, msg_base, &us) != 0) goto fail_net;
      msg_base += o.warmup;
      if (perf_pp_run(&n, &boot, &o, &pp, size, iters, msg_base, &us) != 0) goto fail_net;
      msg_base += iters;
      if (rank == 0) {
        perf_result res = {.test = "pingpong", .bytes = size, .iters = iters, .inflight = 1,
                           .time_us = us / (2.0 * iters), .checked = o.check};
        perf_report_line(&o, &n, &res);
        fflush(stdout);
      }
      continue;
    }
    if (o.dtype >= 0 && rank == 0)
      for (int k = 0; k < bufs.nbuf; k++) {
        p2p_typed_fill(&typed, bufs.buf[k], size, perf_p2p_seed(size, 0));
        /* Nothing in flight between sizes: the device buffers may be written. */
        if (bufs.dev[k] != NULL && perf_device_push(bufs.dev[k], bufs.buf[k], size) != 0) goto fail_net;
      }
    if (o.warmup > 0 && p2p_run(&n, &boot, &o, &bufs, size, o.warmup, msg_base, &us, &typed, o.dtype >= 0,
                                &verdict) != 0)
      goto fail_net;
    msg_base += o.warmup;
    /* -c checks the timed messages too (typed: against the sender's data, as the warm-up). */
    if (p2p_run(&n, &boot, &o, &bufs, size, iters, msg_base, &us, &typed, o.dtype >= 0 && o.check,
                &timed) != 0)
      goto fail_net;
    msg_base += iters;
    if (o.dtype >= 0 && o.check) p2p_verdict_merge(&verdict, &timed);
    if (rank == 0 && o.dtype >= 0) {
      uint64_t want = (uint64_t)(o.warmup + (o.check ? iters : 0)) * p2p_nchunks(&o, size);
      if (p2p_verdict_fails(&o, &verdict, want, size)) check_failed = true;
    }
    if (rank == 0) {
      perf_result res = {.test = "p2p",
                         .bytes = size,
                         .iters = iters,
                         .inflight = o.inflight,
                         .time_us = us / iters,
                         .checked = o.check,
                         .typed = o.dtype >= 0,
                         .rel_l2 = verdict.rel_l2_max,
                         .exact = verdict.exact != 0};
      perf_report_line(&o, &n, &res);
      fflush(stdout);
    }
  }
  /* Close only when both are finished, so neither end resets a connection under the
   * other's last bytes. */
  if (rank == 0) {
    if (perf_boot_send(&boot, PERF_MSG_DONE, NULL, 0) != 0) goto fail_net;
  } else if (perf_boot_recv(&boot, PERF_MSG_DONE, NULL, 0, 60000) != 0) {
    goto fail_net;
  }
  rc = 0; /* the transport's status; a failed check is reported apart (check_failed) */

fail_net:
  if (rc != 0) perf_boot_send(&boot, PERF_MSG_ERROR, NULL, 0);
  p2p_bufs_free(&n, rank, &bufs);
  perf_pp_bufs_free(&n, &pp);
  p2p_typed_close(&typed);
  perf_net_close(&n);
  if (rank == 0 && rc == 0 && o.dtype >= 0) perf_report_wire(&o);
  if (rank == 0 && rc == 0) {
    /* On failure perf_boot_close kills the child instead: it may be stuck in a plugin
     * call that no longer has a peer. */
    close(boot.fd);
    boot.fd = -1;
    int child = perf_boot_finish(&boot);
    if (child != 0) {
      fprintf(stderr, "agoq-perf: the receiver exited with %d\n", child);
      rc = 1;
    }
  }
  perf_boot_close(&boot);
  if (check_failed) {
    fprintf(stderr, "agoq-perf: p2p check FAILED (see above)\n");
    return 1;
  }
  return rc;

fail_boot:
  perf_boot_close(&boot);
  return 1;
}
