/* agoq-perf p2p --dtype: the emulated profiler chain, typed data and its check
 * (perf_p2p_typed.h). */
#include "perf_p2p_typed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_nccl_emul.h"
#include "perf_dtype.h"

void p2p_typed_env(const char* format) {
  if (format != NULL) setenv("AGOQ_P2P_FORMAT", format, 1);
  /* The tool counts frames from the plugin's statistics, so they must be on; a user who
   * turned them off is told, never silently overruled. AGOQ_STATS_FILE is left as it is. */
  const char* user = getenv("AGOQ_STATS");
  if (user != NULL && user[0] != '\0' && strcmp(user, "1") != 0)
    fprintf(stderr, "agoq-perf p2p: AGOQ_STATS=%s replaced by 1 for this run: the typed check reads the plugin's "
            "statistics\n", user);
  setenv("AGOQ_STATS", "1", 1);
}

/* ---- the plugin's statistics, from its log ---- */

static uint64_t typed_frames, typed_unknown, typed_queries;
static double typed_in_mib, typed_wire_mib, typed_query_ns;
static unsigned typed_nsocks; /* from the plugin's init line; 0 until it said */
/* The verbs transport's init line, from "on ": when it carries the data, the TCP line's
 * sockets only bootstrap it. */
static char typed_verbs[160];

/* Every line the plugin logs passes here first (the stderr logger's tap), whatever the
 * level shows. */
static void p2p_typed_tap(ncclDebugLogLevel level, const char* msg) {
  (void)level;
  /* "p2p stats to PEER: F frames, X MiB in Y MiB on the wire (...); ...; type unknown U" */
  const char* s = strstr(msg, "p2p stats to ");
  if (s != NULL) {
    unsigned long long f = 0, u = 0;
    double in = 0, wire = 0;
    const char* colon = strstr(s, ": "); /* after the peer, whose address has colons */
    if (colon != NULL && sscanf(colon, ": %llu frames, %lf MiB in %lf MiB on the wire", &f, &in, &wire) == 3) {
      typed_frames += f;
      typed_in_mib += in;
      typed_wire_mib += wire;
    }
    const char* unk = strstr(s, "type unknown ");
    if (unk != NULL && sscanf(unk, "type unknown %llu", &u) == 1) typed_unknown += u;
    unsigned long long q = 0;
    double ns = 0;
    const char* orc = strstr(s, "oracle ");
    if (orc != NULL && sscanf(orc, "oracle %llu queries, %lf ns each", &q, &ns) == 2 && q > 0) {
      typed_query_ns = (typed_query_ns * (double)typed_queries + ns * (double)q) / (double)(typed_queries + q);
      typed_queries += q;
    }
  }
  /* "Using verbs (ib, lib) on [0]mlx5_0:1/IB; N queue pairs per connection; ...". */
  const char* vb = strstr(msg, "Using verbs (");
  const char* on = vb != NULL ? strstr(vb, ") on ") : NULL;
  if (on != NULL) {
    snprintf(typed_verbs, sizeof typed_verbs, "%s", on + 5);
    char* end = strstr(typed_verbs, "; bootstrap");
    if (end != NULL) *end = '\0';
  }
  /* "Using [0]lo ...; N data sockets per connection, ..." at init: what the plugin chose. */
  const char* ds = strstr(msg, " data sockets per connection");
  if (ds != NULL && strstr(msg, "Using ") != NULL) {
    const char* p = ds;
    while (p > msg && p[-1] >= '0' && p[-1] <= '9') p--;
    unsigned v = 0;
    if (p < ds && sscanf(p, "%u", &v) == 1) typed_nsocks = v;
  }
}

unsigned p2p_typed_nsocks(void) { return typed_nsocks; }
const char* p2p_typed_verbs(void) { return typed_verbs[0] ? typed_verbs : NULL; }

ncclDebugLogger_t p2p_typed_logger(void) {
  agoq_log_stderr_set_tap(p2p_typed_tap);
  return agoq_log_stderr;
}
ncclProfilerCallback_t p2p_typed_callback(void) { return agoq_emul_callback(); }

void p2p_typed_oracle(uint64_t* queries, double* ns_each) {
  *queries = typed_queries;
  *ns_each = typed_query_ns;
}

void p2p_typed_wire(uint64_t* frames, double* in_mib, double* wire_mib, uint64_t* unknown) {
  *frames = typed_frames;
  *in_mib = typed_in_mib;
  *wire_mib = typed_wire_mib;
  *unknown = typed_unknown;
}

/* ---- the emulated chain ---- */

int p2p_typed_open(p2p_typed* t, perf_net* n, uint64_t comm_id, size_t max_bytes, int rank) {
  t->all_exact = true;
  if (rank == 1) {
    t->expect = malloc(max_bytes > 0 ? max_bytes : 1);
    if (t->expect == NULL) {
      fprintf(stderr, "agoq-perf: cannot allocate %zu B for the check\n", max_bytes);
      return -1;
    }
    return 0;
  }
  const void* table = NULL;
  int version = 0;
  if (t->oracle) {
    /* As NCCL 2.28 finds it: the profiler table in the net plugin's own library. */
    if ((table = agoq_netlib_symbol(n->lib, "ncclProfiler_v5")) != NULL) version = 5;
    if (table == NULL) {
      fprintf(stderr, "agoq-perf: the plugin exports no ncclProfiler_v5 (needed for --oracle profiler)\n");
      return -1;
    }
  }
  agoq_emul_set_logger(p2p_typed_logger()); /* the profiler's init installs it as the library's logger */
  t->emul = agoq_emul_comm_create(table, version, comm_id, t->flow == PERF_FLOW_OTHER_PEER ? 3 : 2, 0);
  if (t->emul == NULL || agoq_emul_comm_init_result(t->emul) != ncclSuccess) {
    fprintf(stderr, "agoq-perf: the profiler's init failed\n");
    return -1;
  }
  return 0;
}

void p2p_typed_close(p2p_typed* t) {
  for (int i = 0; i < P2P_TYPED_MAX_SLOTS; i++) p2p_typed_end(t, i);
  if (t->emul != NULL) agoq_emul_comm_destroy(t->emul);
  free(t->expect);
  t->emul = NULL;
  t->expect = NULL;
}

void* p2p_typed_begin(p2p_typed* t, int slot, size_t size, size_t transfer) {
  if (t->emul == NULL || t->dtype < 0) return NULL;
  size_t esize = perf_dtype_size((ncclDataType_t)t->dtype);
  size_t count = transfer / esize;
  /* One task per message, stopped before its op starts, as NCCL's hostStreamPlanTask
   * does; one op with one step carrying the message. The task describes the whole
   * transfer the message is a chunk of: that is what NCCL's P2p event says. */
  agoq_emul_task* task = t->coll ? agoq_emul_coll_start(t->emul, "AllReduce", t->dtype, count, "RING", "SIMPLE")
                                 : agoq_emul_p2p_start(t->emul, true, t->dtype, count, 1, 1);
  /* --flow: an irecv posted in the same group as the send, from the peer. NCCL starts the
   * plan's task events in order, so this Recv starts after the Send's task: the profiler
   * must look for it at the net event, not when the Send's task started. */
  if (!t->coll && t->flow != PERF_FLOW_ONEWAY) {
    int rdtype = t->dtype, rpeer = 1;
    size_t rcount = count;
    if (t->flow == PERF_FLOW_OTHER_COUNT) rcount = count + 64;
    if (t->flow == PERF_FLOW_OTHER_PEER) rpeer = 2; /* the emulated comm has 3 ranks then */
    if (t->flow == PERF_FLOW_OTHER_DTYPE) {
      /* Another float type of the same byte count: only the datatype tells them apart. */
      rdtype = t->dtype == ncclBfloat16 ? ncclFloat16 : ncclBfloat16;
      rcount = transfer / perf_dtype_size((ncclDataType_t)rdtype);
    }
    agoq_emul_task* recv = agoq_emul_p2p_start(t->emul, false, rdtype, rcount, rpeer, 1);
    agoq_emul_task_free(recv); /* stopped with the send's once the plan's ops are posted */
  }
  agoq_emul_task_stop(task);
  agoq_emul_op* op = agoq_emul_op_start(task, 0, 1, size > INT32_MAX ? INT32_MAX : (int)size);
  t->task[slot] = task;
  t->op[slot] = op;
  return agoq_emul_step_phandle(op, 0);
}

void p2p_typed_end(p2p_typed* t, int slot) {
  if (t->op[slot] != NULL) {
    agoq_emul_step_stop(t->op[slot], 0);
    agoq_emul_op_stop(t->op[slot]);
  }
  if (t->task[slot] != NULL) agoq_emul_task_free(t->task[slot]);
  t->op[slot] = NULL;
  t->task[slot] = NULL;
}

/* ---- data ---- */

void p2p_typed_fill(const p2p_typed* t, uint8_t* buf, size_t size, uint64_t seed) {
  ncclDataType_t dt = (ncclDataType_t)t->dtype;
  size_t esize = perf_dtype_size(dt), count = size / esize;
  perf_input_fill(dt, buf, count, seed, 1, 0);
  memset(buf + count * esize, 0x5a, size - count * esize); /* a tail that is not an element */
}

void p2p_typed_check(p2p_typed* t, const uint8_t* buf, size_t len, uint64_t seed, size_t off, size_t size) {
  ncclDataType_t dt = (ncclDataType_t)t->dtype;
  const size_t esize = perf_dtype_size(dt);
  /* The chunk's elements of the transfer's stream (chunks are element-aligned: --chunk is a
   * multiple of 64), then the transfer's non-element tail if the chunk holds it. */
  size_t whole = size / esize * esize;
  size_t elems = off < whole ? ((len < whole - off ? len : whole - off) / esize) : 0;
  perf_input_fill(dt, t->expect, elems, seed, 1, off / esize);
  memset(t->expect + elems * esize, 0x5a, len - elems * esize);
  t->checked++;
  if (memcmp(buf, t->expect, len) == 0) return;
  t->all_exact = false;
  perf_err e;
  memset(&e, 0, sizeof e);
  size_t count = elems;
  for (size_t i = 0; i < count; i++) perf_err_add(&e, perf_elem_get(dt, buf, i), perf_elem_get(dt, t->expect, i));
  double rel = e.nonfinite ? 1e300 : perf_err_rel_l2(&e);
  if (rel > t->rel_l2_max) t->rel_l2_max = rel;
}
