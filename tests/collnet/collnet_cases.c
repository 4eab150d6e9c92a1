/*
 * Batches of collectives driven as NCCL's proxy drives them, and their checks.
 *
 * Inputs are a function of (case seed, rank, element index), so every rank rebuilds
 * every other rank's input and computes the expected result itself:
 *  - integers: random bits over the whole width (sums and products wrap);
 *  - floats, Sum: N(0,1); Prod: +-[0.5, 1.5) (no overflow over 8 ranks, even in fp8);
 *    Max/Min: +-(1/16 + |N(0,1)|), never a zero, so no +0/-0 tie makes the order matter.
 * A call goes the quantized way when the plugin's documented rules say so (fp32, bf16 or
 * fp16, Sum, AGOQ_FORMAT not none, the call's bytes at least AGOQ_MIN_BYTES); a case all of
 * whose calls go the exact way must equal the exact reduction in the plugin's order bit for
 * bit (perf_reduce_exact in rank order; on a grid by rows, then columns: cn_reduce_reference),
 * a quantized one must be within the format's relative L2 bound of the
 * fp64 reduction. Every result is compared between ranks, and the bytes around every
 * buffer and the input buffers must be untouched.
 */
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "collnet/agoq_coll_schedule.h"
#include "collnet_harness.h"

#define CN_ALIGN 64
#define CN_GUARD 64
#define CN_GUARD_BYTE 0xA7

static const char* const cn_kind_names[] = {"allreduce", "reducescatter", "allgather"};

static void cn_case_label(const cn_case* c, char* buf, size_t cap) {
  snprintf(buf, cap, "%s %s %s count %zu%s window %zu", cn_kind_names[c->kind],
           perf_dtype_name(c->dtype), c->kind == CN_ALLGATHER ? "-" : perf_op_name(c->op),
           c->count, c->kind == CN_ALLREDUCE ? "" : "/rank", c->window);
}

/* ---- overflow: sums outside the output type's finite range are +-Inf, as NCCL gives ----
 * In runs of 1024 elements (whole codec blocks for every block size, since slices and
 * chunks start on block multiples) with (index / 1024) % 3 == 1, rank k contributes +-c_k
 * with a random sign per (rank, element): fp16 c = 30000 on every rank (3 ranks: sums of
 * +-90000, beyond 65504, or +-30000); bf16 c_0 = the largest bf16, c_1 = 1.5 * 2^119, c_k = 0
 * beyond (sums of +-(2 - 2^-9) * 2^127, finite in fp32 but beyond bf16's range, or
 * +-(2 - 3.5 * 2^-8) * 2^127). The other runs are N(0,1) and keep the usual bound. */
static bool cn_overflow_elem(const cn_case* c, uint64_t g) {
  return c->overflow && (g / 1024) % 3 == 1;
}

static void cn_overflow_fill(const cn_case* c, int rank, void* buf, uint64_t first, size_t count) {
  uint64_t seed = perf_rank_seed(c->seed, rank);
  for (size_t i = 0; i < count; i++) {
    uint64_t g = first + i;
    if (!cn_overflow_elem(c, g)) continue;
    uint16_t mag = c->dtype == ncclFloat16 ? 0x7753 /* 30000 */
                   : rank == 0             ? 0x7f7f /* bf16 max */
                   : rank == 1             ? 0x7b40 /* 1.5 * 2^119 */
                                           : 0;
    bool neg = perf_mix64(seed ^ perf_mix64(g + 0x0F0F)) & 1;
    uint16_t v = (uint16_t)(mag | (neg && mag != 0 ? 0x8000u : 0u));
    memcpy((uint8_t*)buf + i * 2, &v, 2);
  }
}

/* The overflow runs of one result: an element whose sum (exact, in fp64) is beyond the
 * value that rounds to Inf must be that Inf, with its sign, on every path; the others must
 * be finite and close to the sum (their blocks hold an Inf, so they travel raw). */
static int cn_check_overflow(cn_worker* w, const cn_case* c, uint8_t* const* in, uint64_t first,
                             size_t out_n, const char* label) {
  double inf_from = c->dtype == ncclFloat16 ? 65520.0 : 0x1.ffp127;
  size_t infs = 0, finite = 0;
  for (size_t i = 0; i < out_n; i++) {
    if (!cn_overflow_elem(c, first + i)) continue;
    double sum = 0;
    for (int k = 0; k < w->nranks; k++) sum += perf_elem_get(c->dtype, in[k], i);
    double y = perf_elem_get(c->dtype, c->recv, i);
    if (fabs(sum) >= inf_from * (1 + 1e-4)) {
      if (!(isinf(y) && (y < 0) == (sum < 0))) {
        CN_FAIL(w, "%s: element %zu sums to %g, beyond the type's range, but came out %g "
                "(an overflow must be Inf, as NCCL gives)", label, (size_t)(first + i), sum, y);
        return -1;
      }
      infs++;
    } else {
      if (!isfinite(y) || fabs(y - sum) > 0.01 * fabs(sum) + 1e-30) {
        CN_FAIL(w, "%s: element %zu sums to %g (within range) but came out %g", label,
                (size_t)(first + i), sum, y);
        return -1;
      }
      finite++;
    }
  }
  if (infs == 0 || finite == 0) {
    CN_FAIL(w, "%s: the overflow runs held %zu overflowing and %zu finite sums (want both)",
            label, infs, finite);
    return -1;
  }
  return 0;
}

static void cn_input_fill(const cn_case* c, int nranks, int rank, void* buf, uint64_t first,
                          size_t count) {
  uint64_t seed = perf_rank_seed(c->seed, rank);
  size_t elt = perf_dtype_size(c->dtype);
  if (perf_dtype_is_float(c->dtype) && (c->op == ncclSum || c->kind == CN_ALLGATHER)) {
    /* N(0,1), a normal pair per two elements */
    perf_input_fill(c->dtype, buf, count, seed, nranks, first);
    if (c->inject && rank == 0 && first <= 5 && 5 < first + count)
      perf_elem_set(c->dtype, buf, 5 - first, INFINITY);
    if (c->inject && rank == 1 % nranks && first <= 300 && 300 < first + count)
      perf_elem_set(c->dtype, buf, 300 - first, NAN);
    if (c->overflow) cn_overflow_fill(c, rank, buf, first, count);
    return;
  }
  for (size_t i = 0; i < count; i++) {
    uint64_t g = first + i;
    if (!perf_dtype_is_float(c->dtype)) {
      uint64_t bits = perf_mix64(seed ^ perf_mix64(g));
      memcpy((uint8_t*)buf + i * elt, &bits, elt); /* little-endian: the low bytes */
      continue;
    }
    uint64_t h = perf_mix64(seed + 0x9E3779B97F4A7C15ull * (g + 1));
    double sign = (h & 1) ? -1.0 : 1.0;
    double v = c->op == ncclProd ? sign * (0.5 + (double)(h >> 11) * 0x1.0p-53)
                                 : sign * (0.0625 + fabs(perf_normal(seed, g)));
    perf_elem_set(c->dtype, buf, i, v);
  }
}

static size_t cn_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

int cn_batch_add(cn_worker* w, cn_batch* b, cn_kind kind, ncclDataType_t dtype, ncclRedOp_t op,
                 size_t count, size_t window, uint64_t seed) {
  if (cn_device_mode()) {
    /* Over verbs a call whose staging cannot fit is an error by design (AGOQ_GPU_STAGING;
     * over TCP it goes through a bounce buffer): such a case is left out here, identically
     * on every rank. Allreduce runs in place in the staging; the others stage input and
     * output apart (each at most the window). */
    size_t all = count * perf_dtype_size(dtype) * (kind == CN_ALLREDUCE ? 1 : (size_t)w->nranks);
    size_t call = window == 0 || window > all ? all : window;
    size_t need = (kind == CN_ALLREDUCE ? call : 2 * call) + 2 * 4096; /* alignment */
    if (need > cn_device_max_call()) {
      b->device_skipped++;
      return 0;
    }
  }
  if (b->ncases == b->cap) {
    int cap = b->cap ? b->cap * 2 : 64;
    cn_case* n = realloc(b->cases, sizeof(*n) * (size_t)cap);
    if (n == NULL) {
      CN_FAIL(w, "out of memory");
      return -1;
    }
    b->cases = n;
    b->cap = cap;
  }
  b->cases[b->ncases++] = (cn_case){.kind = kind, .dtype = dtype, .op = op, .count = count,
                                    .window = window, .seed = seed};
  return 0;
}

void cn_batch_free(cn_worker* w, cn_batch* b) {
  free(b->cases);
  memset(b, 0, sizeof(*b));
}

/* ---- the calls ---- */

typedef struct {
  int c;             /* case */
  size_t off, bytes; /* the window (allreduce: of the buffer; else of all ranks' parts) */
  size_t result;     /* bytes the call writes here: what test() reports as its size */
} cn_call;

static bool cn_call_quantized(const cn_worker* w, const cn_case* c, size_t bytes) {
  return c->kind != CN_ALLGATHER && c->op == ncclSum &&
         (c->dtype == ncclFloat32 || c->dtype == ncclBfloat16 || c->dtype == ncclFloat16) &&
         w->format != 0 && bytes >= w->min_bytes;
}

/* The arenas' memory handles: NCCL passes the registered region's handle with every call. */
static void* cn_send_mh;
static void* cn_recv_mh;

/* The window's overlap with our part of a reducescatter or allgather, as an offset into
 * our own buffer (recv, resp. send) and a length; 0 and 0 when they do not overlap. */
static void cn_call_own(const cn_worker* w, const cn_case* c, const cn_call* call, size_t* at,
                        size_t* len) {
  size_t bpr = c->count * perf_dtype_size(c->dtype);
  size_t lo = (size_t)w->rank * bpr, hi = lo + bpr;
  size_t a = call->off > lo ? call->off : lo;
  size_t e = call->off + call->bytes < hi ? call->off + call->bytes : hi;
  *at = a < e ? a - lo : 0;
  *len = a < e ? e - a : 0;
}

/* --device: the bytes a call reads (to the device twin before it is posted) and the bytes
 * it writes (back from the twin once test() says it is done). */
static void cn_call_span(const cn_worker* w, const cn_case* c, const cn_call* call, bool input,
                         uint8_t** p, size_t* n) {
  size_t at = 0, len = 0;
  cn_call_own(w, c, call, &at, &len);
  bool own = (c->kind == CN_ALLGATHER) == input; /* the side that is our part only */
  if (c->kind == CN_ALLREDUCE || !own) {
    *p = (input ? c->send : c->recv) + call->off;
    *n = call->bytes;
  } else {
    *p = (input ? c->send : c->recv) + at;
    *n = len;
  }
}

static ncclResult_t cn_post(cn_worker* w, const cn_case* c, const cn_call* call, void** req) {
  size_t elt = perf_dtype_size(c->dtype);
  size_t bpr = c->count * elt;
  /* Host mode: the arenas themselves; device mode: their twins (identity without one). */
  uint8_t* send = cn_device_ptr(c->send);
  uint8_t* recv = cn_device_ptr(c->recv);
  if (cn_device_mode()) {
    uint8_t* p = NULL;
    size_t n = 0;
    cn_call_span(w, c, call, true, &p, &n);
    if (cn_device_push(p, n) != 0) {
      CN_FAIL(w, "cudaMemcpy of a call's input (%zu B) to its device twin failed", n);
      return ncclUnhandledCudaError;
    }
  }
  if (c->kind == CN_ALLREDUCE)
    return agoq_collnet_view_iallreduce(&w->view, w->coll_comm, send + call->off,
                                        recv + call->off, call->bytes / elt, c->dtype, c->op,
                                        cn_send_mh, cn_recv_mh, req);
  /* Our part's side: at the window start when the window starts in our part, else the
   * part's start (NCCL's convention, coll_net.cc). */
  size_t own = call->off / bpr == (size_t)w->rank ? call->off % bpr : 0;
  if (c->kind == CN_REDUCESCATTER) {
    agoq_view_sge part = {.mhandle = cn_send_mh, .address = send + call->off,
                          .size = call->bytes};
    return agoq_collnet_view_ireducescatter(&w->view, w->coll_comm, 1, &part, recv + own, bpr,
                                            call->off, call->bytes, c->dtype, c->op, cn_recv_mh,
                                            req);
  }
  agoq_view_sge part = {.mhandle = cn_recv_mh, .address = recv + call->off,
                        .size = call->bytes};
  return agoq_collnet_view_iallgather(&w->view, w->coll_comm, send + own, 1, &part, bpr,
                                      call->off, call->bytes, cn_send_mh, req);
}

/* test() said call i is done: in device mode its result is read back from the twin now,
 * so the checks see what device memory held at that moment. */
static int cn_call_done(cn_worker* w, cn_batch* b, const cn_call* call, int i) {
  if (!cn_device_mode()) return 0;
  uint8_t* p = NULL;
  size_t n = 0;
  cn_call_span(w, &b->cases[call->c], call, false, &p, &n);
  if (cn_device_pull(p, n) == 0) return 0;
  CN_FAIL(w, "cudaMemcpy of call %d's result (%zu B) from device memory failed", i, n);
  return -1;
}

/* Posts and completes every call: at most `inflight` outstanding; FIFO tests the oldest
 * (NCCL's order), LIFO posts a group and tests it newest first, so a call can only
 * complete through the plugin's own progress. */
static int cn_drive(cn_worker* w, cn_batch* b, const cn_call* calls, int ncalls) {
  void* reqs[CN_MAX_INFLIGHT];
  bool fin[CN_MAX_INFLIGHT];
  int depth = b->inflight > 0 && b->inflight <= CN_MAX_INFLIGHT ? b->inflight : CN_MAX_INFLIGHT;
  int posted = 0, done = 0;
  int64_t last = cn_now_ns();
  char label[160];
  while (done < ncalls) {
    bool progress = false;
    /* LIFO: a new group only when the previous one is complete. */
    bool may_post = !b->test_lifo || posted == done;
    while (may_post && posted < ncalls && posted - done < depth) {
      void* req = NULL;
      const cn_call* call = &calls[posted];
      ncclResult_t r = cn_post(w, &b->cases[call->c], call, &req);
      if (r != ncclSuccess) {
        cn_case_label(&b->cases[call->c], label, sizeof label);
        CN_FAIL(w, "posting call %d (%s, window %zu+%zu) returned %s", posted, label, call->off,
                call->bytes, cn_result_str(r));
        return -1;
      }
      if (req == NULL) break; /* "try again", as NCCL reads it */
      reqs[posted % CN_MAX_INFLIGHT] = req;
      fin[posted % CN_MAX_INFLIGHT] = false;
      posted++;
      progress = true;
    }
    if (b->test_lifo) {
      for (int i = posted - 1; i >= done; i--) {
        int s = i % CN_MAX_INFLIGHT;
        if (fin[s]) continue;
        int f = 0, size = -1;
        ncclResult_t r = agoq_collnet_view_test(&w->view, reqs[s], &f, &size);
        if (r != ncclSuccess) {
          CN_FAIL(w, "test of call %d returned %s", i, cn_result_str(r));
          return -1;
        }
        if (f) {
          size_t want = calls[i].result > INT_MAX ? INT_MAX : calls[i].result;
          if (size != (int)want) {
            CN_FAIL(w, "test of call %d reported %d bytes written, not %zu", i, size, want);
            return -1;
          }
          if (cn_call_done(w, b, &calls[i], i) != 0) return -1;
          fin[s] = true;
          progress = true;
        }
        break; /* one test per pass, newest unfinished first */
      }
      while (done < posted && fin[done % CN_MAX_INFLIGHT]) done++;
    } else if (done < posted) {
      int f = 0, size = -1;
      ncclResult_t r = agoq_collnet_view_test(&w->view, reqs[done % CN_MAX_INFLIGHT], &f, &size);
      if (r != ncclSuccess) {
        const cn_call* call = &calls[done];
        cn_case_label(&b->cases[call->c], label, sizeof label);
        CN_FAIL(w, "test of call %d (%s, window %zu+%zu) returned %s", done, label, call->off,
                call->bytes, cn_result_str(r));
        return -1;
      }
      if (f) {
        const cn_call* call = &calls[done];
        size_t want = call->result > INT_MAX ? INT_MAX : call->result;
        if (size != (int)want) {
          cn_case_label(&b->cases[call->c], label, sizeof label);
          CN_FAIL(w, "test of call %d (%s, window %zu+%zu) reported %d bytes written, not %zu",
                  done, label, call->off, call->bytes, size, want);
          return -1;
        }
        if (cn_call_done(w, b, call, done) != 0) return -1;
        done++;
        progress = true;
      }
    }
    int64_t now = cn_now_ns();
    if (progress) {
      last = now;
    } else {
      sched_yield();
      if (now - last > (int64_t)CN_WAIT_MS * 1000000) {
        CN_FAIL(w, "no call completed in %d s (%d of %d done, %d posted)", CN_WAIT_MS / 1000,
                done, ncalls, posted);
        return -1;
      }
    }
  }
  return 0;
}

/* ---- checks ---- */

static int cn_check_exact(cn_worker* w, const cn_case* c, const uint8_t* expect) {
  size_t elt = perf_dtype_size(c->dtype);
  size_t n = c->recv_bytes / elt;
  size_t bad = 0, first = SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    if (memcmp(c->recv + i * elt, expect + i * elt, elt) == 0) continue;
    /* A NaN's payload depends on the order of the operations that carried it. */
    if (c->inject && perf_dtype_is_float(c->dtype) && isnan(perf_elem_get(c->dtype, c->recv, i)) &&
        isnan(perf_elem_get(c->dtype, expect, i)))
      continue;
    if (first == SIZE_MAX) first = i;
    bad++;
  }
  if (bad == 0) return 0;
  char label[160];
  cn_case_label(c, label, sizeof label);
  uint64_t got = 0, want = 0;
  memcpy(&got, c->recv + first * elt, elt);
  memcpy(&want, expect + first * elt, elt);
  CN_FAIL(w, "%s: %zu of %zu elements differ from the exact reduction in the schedule's order; first at %zu: "
          "got 0x%llx (%g) want 0x%llx (%g)", label, bad, n, first, (unsigned long long)got,
          perf_elem_get(c->dtype, c->recv, first), (unsigned long long)want,
          perf_elem_get(c->dtype, expect, first));
  return -1;
}

/* The exact reduction the plugin's schedule computes: on the one-level mesh every rank's
 * input in rank order (perf_reduce_exact); on a grid (g: the group's, cn_connect) each row's
 * inputs in rank order, then the rows' partial results in row order, the partials in fp32
 * for the narrow float types' Sum and Prod (rounded once, at the end). */
static void cn_reduce_reference(const agoq_coll_grid* grid, ncclDataType_t t, ncclRedOp_t op, uint8_t* const* in,
                                int n, size_t m, uint8_t* out) {
  agoq_coll_grid g = *grid;
  if (g.n != n || g.b == 1) {
    perf_reduce_exact(t, op, (const void* const*)in, n, m, out);
    return;
  }
  bool narrow = (t == ncclBfloat16 || t == ncclFloat16 || t == ncclFloat8e4m3 || t == ncclFloat8e5m2) &&
                (op == ncclSum || op == ncclProd);
  ncclDataType_t pt = narrow ? ncclFloat32 : t;
  size_t psz = perf_dtype_size(pt);
  uint8_t* wide = narrow ? malloc((size_t)n * m * sizeof(float) + 8) : NULL;
  uint8_t* partial = malloc((size_t)g.b * m * psz + 8);
  float* fin = malloc(m * sizeof(float) + 8);
  const void** rin = calloc((size_t)(n > g.b ? n : g.b), sizeof *rin);
  if ((narrow && wide == NULL) || partial == NULL || fin == NULL || rin == NULL) abort();
  for (int k = 0; k < n; k++) {
    rin[k] = in[k];
    if (!narrow) continue;
    float* w = (float*)(wide + (size_t)k * m * sizeof(float));
    for (size_t i = 0; i < m; i++) w[i] = perf_elem_get_f32(t, in[k], i);
    rin[k] = w;
  }
  for (int row = 0; row < g.b; row++)
    perf_reduce_exact(pt, op, rin + row * g.a, agoq_coll_grid_row_len(&g, row), m, partial + (size_t)row * m * psz);
  for (int row = 0; row < g.b; row++) rin[row] = partial + (size_t)row * m * psz;
  if (narrow) {
    perf_reduce_exact(pt, op, rin, g.b, m, fin);
    for (size_t i = 0; i < m; i++) perf_elem_set_f32(t, out, i, fin[i]);
  } else {
    perf_reduce_exact(pt, op, rin, g.b, m, out);
  }
  free(wide);
  free(partial);
  free(fin);
  free(rin);
}

/* expect: the exact result; inputs: every rank's values for the output's elements. */
static int cn_check_case(cn_worker* w, cn_batch* b, cn_case* c) {
  size_t elt = perf_dtype_size(c->dtype);
  size_t out_n = c->recv_bytes / elt;
  int n = w->nranks;
  int rc = -1;
  uint8_t* expect = malloc(c->recv_bytes + 8);
  uint8_t** in = calloc((size_t)n, sizeof(*in));
  uint64_t first = c->kind == CN_REDUCESCATTER ? (uint64_t)w->rank * c->count : 0;
  CN_REQUIRE(w, expect != NULL && in != NULL, "out of memory");
  if (c->kind == CN_ALLGATHER) {
    for (int k = 0; k < n; k++) cn_input_fill(c, n, k, expect + (size_t)k * c->count * elt, 0, c->count);
  } else {
    for (int k = 0; k < n; k++) {
      in[k] = malloc(c->recv_bytes + 8);
      CN_REQUIRE(w, in[k] != NULL, "out of memory");
      cn_input_fill(c, n, k, in[k], first, out_n);
    }
    if (!c->quantized) cn_reduce_reference(&w->grid, c->dtype, c->op, in, n, out_n, expect);
  }
  if (c->inject && c->kind == CN_ALLREDUCE && out_n > 300) {
    double inf = perf_elem_get(c->dtype, c->recv, 5), nan = perf_elem_get(c->dtype, c->recv, 300);
    CN_REQUIRE(w, isinf(inf) && inf > 0 && isnan(nan),
               "%s %s: an input +Inf came out as %g and an input NaN as %g",
               perf_dtype_name(c->dtype), c->quantized ? "quantized" : "exact", inf, nan);
  }
  if (c->overflow) {
    char olabel[192];
    cn_case_label(c, olabel, sizeof olabel);
    if (cn_check_overflow(w, c, in, first, out_n, olabel) != 0) goto fail;
  }
  if (!c->quantized) {
    rc = cn_check_exact(w, c, expect);
    goto out;
  }
  perf_err e = {0};
  double* col = malloc(sizeof(double) * (size_t)n);
  CN_REQUIRE(w, col != NULL, "out of memory");
  for (size_t i = 0; i < out_n; i++) {
    if (cn_overflow_elem(c, first + i)) continue; /* checked above */
    for (int k = 0; k < n; k++) col[k] = perf_elem_get(c->dtype, in[k], i);
    perf_err_add(&e, perf_elem_get(c->dtype, c->recv, i), perf_reduce_f64(c->op, col, n));
  }
  free(col);
  c->rel_l2 = perf_err_rel_l2(&e);
  char label[160];
  cn_case_label(c, label, sizeof label);
  if (e.nonfinite > 0) {
    CN_FAIL(w, "%s: %llu non-finite results from finite inputs", label,
            (unsigned long long)e.nonfinite);
    goto out;
  }
  if (!(c->rel_l2 <= b->max_rel_l2)) {
    CN_FAIL(w, "%s: relative L2 error %.4e above the bound %.4e (max abs %.3e)", label,
            c->rel_l2, b->max_rel_l2, e.max_abs);
    goto out;
  }
  rc = 0;
  goto out;
fail:
  rc = -1;
out:
  if (in != NULL)
    for (int k = 0; k < n; k++) free(in[k]);
  free(in);
  free(expect);
  return rc;
}

/* ---- the batch ---- */

int cn_batch_run(cn_worker* w, cn_batch* b) {
  int rc = -1;
  size_t send_total = CN_GUARD, recv_total = CN_GUARD;
  int ncalls = 0;
  for (int i = 0; i < b->ncases; i++) {
    cn_case* c = &b->cases[i];
    size_t elt = perf_dtype_size(c->dtype), n = (size_t)w->nranks;
    size_t all = c->count * elt * (c->kind == CN_ALLREDUCE ? 1 : n);
    size_t one = c->count * elt;
    c->send_bytes = c->kind == CN_ALLGATHER ? one : all;
    c->recv_bytes = c->kind == CN_REDUCESCATTER ? one : all;
    size_t window = c->window == 0 ? all : c->window;
    /* NCCL never asks for 0 elements, but a plugin must survive it: one empty call. */
    c->ncalls = all == 0 ? (c->kind == CN_ALLREDUCE) : (int)((all + window - 1) / window);
    ncalls += c->ncalls;
    send_total += cn_round_up(c->send_bytes, CN_ALIGN) + CN_GUARD;
    recv_total += cn_round_up(c->recv_bytes, CN_ALIGN) + CN_GUARD;
  }
  uint8_t* send = aligned_alloc(4096, cn_round_up(send_total, 4096));
  uint8_t* recv = aligned_alloc(4096, cn_round_up(recv_total, 4096));
  cn_call* calls = calloc((size_t)ncalls + 1, sizeof(*calls));
  uint64_t* hashes = malloc(sizeof(uint64_t) * ((size_t)b->ncases + 1));
  uint64_t* all_hashes = malloc(sizeof(uint64_t) * ((size_t)b->ncases + 1) * (size_t)w->nranks);
  void *smh = NULL, *rmh = NULL;
  bool dev = cn_device_mode(), twins = false;
  bool drained = false; /* every call completed: nothing of the plugin's uses the twins */
  uint8_t* dview = NULL; /* device mode: the twins' bytes after the batch */
  CN_REQUIRE(w, send && recv && calls && hashes && all_hashes, "out of memory (%zu + %zu B)",
             send_total, recv_total);
  memset(send, CN_GUARD_BYTE, send_total);
  memset(recv, CN_GUARD_BYTE, recv_total);
  size_t so = CN_GUARD, ro = CN_GUARD;
  int nc = 0;
  for (int i = 0; i < b->ncases; i++) {
    cn_case* c = &b->cases[i];
    size_t elt = perf_dtype_size(c->dtype);
    c->send = send + so;
    c->recv = recv + ro;
    so += cn_round_up(c->send_bytes, CN_ALIGN) + CN_GUARD;
    ro += cn_round_up(c->recv_bytes, CN_ALIGN) + CN_GUARD;
    cn_input_fill(c, w->nranks, w->rank, c->send, 0, c->send_bytes / elt);
    /* The result area starts as a pattern the reduction cannot leave behind by chance. */
    memset(c->recv, 0x5C, c->recv_bytes);
    size_t all = c->kind == CN_ALLGATHER ? c->recv_bytes : c->send_bytes;
    size_t window = c->window == 0 ? all : c->window;
    c->quantized = false;
    if (all == 0 && c->kind == CN_ALLREDUCE) calls[nc++] = (cn_call){.c = i, .off = 0, .bytes = 0};
    size_t lo = (size_t)w->rank * c->count * elt, hi = lo + c->count * elt; /* our part */
    for (size_t off = 0; off < all; off += window) {
      size_t len = all - off < window ? all - off : window;
      size_t result = len;
      if (c->kind == CN_REDUCESCATTER) {
        size_t a = off > lo ? off : lo, e = off + len < hi ? off + len : hi;
        result = a < e ? e - a : 0;
      }
      calls[nc++] = (cn_call){.c = i, .off = off, .bytes = len, .result = result};
      if (cn_call_quantized(w, c, len)) c->quantized = true;
    }
  }
  uint64_t send_hash = perf_hash64(send, send_total, 7);
  if (dev) {
    /* The twins start as the host arenas: inputs, result patterns and guards. */
    twins = true;
    CN_REQUIRE(w, cn_device_alloc(send, send_total) == 0 && cn_device_alloc(recv, recv_total) == 0,
               "cannot make the device twins of the arenas (%zu + %zu B)", send_total, recv_total);
  }
  int mem = dev ? NCCL_PTR_CUDA : NCCL_PTR_HOST;
  CN_OK(w, agoq_collnet_view_reg_mr(&w->view, w->coll_comm, cn_device_ptr(send), send_total, mem, &smh));
  CN_OK(w, agoq_collnet_view_reg_mr(&w->view, w->coll_comm, cn_device_ptr(recv), recv_total, mem, &rmh));
  cn_send_mh = smh;
  cn_recv_mh = rmh;
  /* All ranks enter together: a rank still building inputs is not a slow network. */
  if (cn_barrier(w) != 0) goto fail;
  int64_t t0 = cn_now_ns();
  if (cn_drive(w, b, calls, nc) != 0) goto fail;
  drained = true;
  double secs = (double)(cn_now_ns() - t0) / 1e9;

  CN_REQUIRE(w, perf_hash64(send, send_total, 7) == send_hash,
             "the plugin wrote into a send buffer");
  /* The guards are checked where the plugin wrote: in device mode, in the twin. */
  const uint8_t* gv = recv;
  if (dev) {
    dview = malloc(send_total > recv_total ? send_total : recv_total);
    CN_REQUIRE(w, dview != NULL, "out of memory");
    CN_REQUIRE(w, cn_device_read(send, dview, send_total) == 0, "cudaMemcpy of the send twin failed");
    CN_REQUIRE(w, perf_hash64(dview, send_total, 7) == send_hash,
               "the plugin wrote into a send buffer in device memory");
    CN_REQUIRE(w, cn_device_read(recv, dview, recv_total) == 0, "cudaMemcpy of the recv twin failed");
    gv = dview;
  }
  size_t off = 0;
  for (int i = 0; i < b->ncases && !w->failed; i++) {
    cn_case* c = &b->cases[i];
    size_t start = (size_t)(c->recv - recv);
    for (size_t j = off; j < start; j++)
      if (gv[j] != CN_GUARD_BYTE) {
        char label[160];
        cn_case_label(c, label, sizeof label);
        CN_FAIL(w, "%s: byte %zd before its result was overwritten", label,
                (ssize_t)j - (ssize_t)start);
        break;
      }
    off = start + c->recv_bytes; /* the padding up to the alignment is guard too */
  }
  for (size_t j = off; j < recv_total && !w->failed; j++)
    if (gv[j] != CN_GUARD_BYTE) CN_FAIL(w, "byte %zu past the last result was overwritten", j - off);
  if (w->failed) goto fail;
#ifdef CN_TSAN_READ_RESULTS
  /* The checks read results through perf_dtype.c, uninstrumented under TSan (CMakeLists.txt):
   * this read makes a result the plugin writes after its call completed a report. */
  for (int i = 0; i < b->ncases; i++) {
    volatile uint8_t sink = 0;
    for (size_t j = 0; j < b->cases[i].recv_bytes; j++) sink ^= b->cases[i].recv[j];
    (void)sink;
  }
#endif
  for (int i = 0; i < b->ncases; i++) {
    cn_case* c = &b->cases[i];
    if (cn_check_case(w, b, c) != 0 && strlen(w->why) > 1500) break;
    hashes[i] = c->kind == CN_REDUCESCATTER ? 0 : perf_hash64(c->recv, c->recv_bytes, 1);
  }
  /* Device mode: the checks above saw what was read back when test() said done; device
   * memory must still hold exactly that (nothing written after done). */
  for (int i = 0; dev && i < b->ncases && strlen(w->why) <= 1500; i++) {
    cn_case* c = &b->cases[i];
    if (memcmp(dview + (c->recv - recv), c->recv, c->recv_bytes) != 0) {
      char label[160];
      cn_case_label(c, label, sizeof label);
      CN_FAIL(w, "%s: its device buffer changed after test() said done", label);
    }
  }
  /* Same bits on every rank: even a wrong result must be wrong the same way everywhere. */
  if (cn_allgather(w, hashes, all_hashes, (uint32_t)(sizeof(uint64_t) * (size_t)b->ncases)) != 0)
    goto fail;
  for (int i = 0; i < b->ncases; i++)
    for (int k = 0; k < w->nranks; k++)
      if (all_hashes[(size_t)k * (size_t)b->ncases + (size_t)i] != hashes[i]) {
        char label[160];
        cn_case_label(&b->cases[i], label, sizeof label);
        CN_FAIL(w, "%s: rank %d's result bits differ from rank %d's", label, k, w->rank);
        break;
      }
  if (w->rank == 0) {
    int nq = 0;
    double worst = 0;
    for (int i = 0; i < b->ncases; i++)
      if (b->cases[i].quantized) {
        nq++;
        if (b->cases[i].rel_l2 > worst) worst = b->cases[i].rel_l2;
      }
    printf("collnet: v%d, %d ranks: %d collectives in %d calls (%d quantized, worst relative "
           "L2 %.3f%%) in %.2f s, %d in flight%s%s", w->version, w->nranks, b->ncases, nc, nq,
           worst * 100, secs, b->inflight, b->test_lifo ? ", tested newest first" : "",
           dev ? ", device buffers" : "");
    if (b->device_skipped > 0)
      printf(" (%d left out: above AGOQ_GPU_STAGING=%zu)", b->device_skipped, cn_device_max_call());
    printf("\n");
  }
  rc = w->failed ? -1 : 0;
fail:
  if (smh != NULL) {
    ncclResult_t r = agoq_collnet_view_dereg_mr(&w->view, w->coll_comm, smh);
    if (r != ncclSuccess) CN_FAIL(w, "deregMr returned %s", cn_result_str(r));
  }
  if (rmh != NULL) {
    ncclResult_t r = agoq_collnet_view_dereg_mr(&w->view, w->coll_comm, rmh);
    if (r != ncclSuccess) CN_FAIL(w, "deregMr returned %s", cn_result_str(r));
  }
  cn_send_mh = cn_recv_mh = NULL;
  /* After a failed drive calls may still be in flight into the twins: they (and the
   * arenas they map) are left to the process's exit. */
  if (twins && drained) {
    cn_device_free(send);
    cn_device_free(recv);
  }
  free(dview);
  if (!twins || drained) {
    free(send);
    free(recv);
  }
  free(calls);
  free(hashes);
  free(all_hashes);
  if (w->failed) rc = -1;
  return rc;
}
