/*
 * The scenarios. Each runs in every worker; the orchestrator judges the verdicts.
 *  support   reduceSupport: the same answer on every rank and every exported version, Sum of
 *            fp32/bf16/fp16 supported; CollNet's devices are the net tables' devices
 *  versions  a few collectives of each kind through one ABI version (all exported ones),
 *            and the view's refusals of what an old version cannot express
 *  exact     every declared (type, op) at sizes 0, 1, odd, not a multiple of the codec
 *            block, not divisible by the rank count; reduce-scatter and all-gather windows
 *            that span ranks; sizes around AGOQ_MIN_BYTES: bit for bit where the path is
 *            exact, within the bound where it is quantized
 *  quant     quantized reductions: the error bound, identical bits on every rank, windows,
 *            non-finite values carried through
 *  overflow  fp16/bf16 sums beyond the type's range: +-Inf on every rank, both paths
 *  inflight  8 calls outstanding, tested newest first: completion may not depend on test()
 *            being called for older calls
 *  kill      (collnet_scen_kill.c) one rank SIGKILLed mid-collective
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "collnet_harness.h"

int cn_sc_kill(cn_worker* w); /* collnet_scen_kill.c */
int cn_sc_stats(cn_worker* w); /* collnet_scen_stats.c */

static int cn_group_up(cn_worker* w) {
  if (cn_open(w) != 0) return -1;
  return cn_connect(w);
}

/* ---- support ---- */

static int cn_matrix(cn_worker* w, const agoq_collnet_view* v, uint8_t* m) {
  for (int t = 0; t < PERF_NUM_DTYPES; t++)
    for (int op = 0; op < PERF_NUM_OPS; op++) {
      const int unset = 0x5A5A5A5A;
      int s = unset;
      ncclResult_t r = agoq_collnet_view_reduce_support(v, (ncclDataType_t)t, (ncclRedOp_t)op, &s);
      if (r != ncclSuccess || s == unset) {
        CN_FAIL(w, "v%d reduceSupport(%s, %s) returned %s%s", v->version,
                perf_dtype_name((ncclDataType_t)t), perf_op_name((ncclRedOp_t)op),
                cn_result_str(r), s == unset ? " without an answer" : "");
        return -1;
      }
      m[t * PERF_NUM_OPS + op] = s != 0;
    }
  return 0;
}

static int cn_sc_support(cn_worker* w) {
  uint8_t mine[PERF_NUM_DTYPES * PERF_NUM_OPS];
  uint8_t all[CN_MAX_RANKS][PERF_NUM_DTYPES * PERF_NUM_OPS];
  if (cn_open(w) != 0) return -1;
  if (cn_matrix(w, &w->view, mine) != 0) return -1;
  /* Every other exported version, initialised as NCCL would have it. */
  int versions[AGOQ_LOADER_NUM_VERSIONS];
  int nv = agoq_netlib_collnet_versions(w->lib, versions, AGOQ_LOADER_NUM_VERSIONS);
  for (int i = 0; i < nv; i++) {
    if (versions[i] == w->version) continue;
    agoq_collnet_view v;
    void* ctx = NULL;
    uint8_t m[sizeof(mine)];
    CN_REQUIRE(w, agoq_netlib_collnet_view(w->lib, versions[i], &v) == 0, "no v%d view",
               versions[i]);
    CN_OK(w, agoq_collnet_view_init(&v, &ctx, w->comm_id, agoq_log_stderr));
    int rc = cn_matrix(w, &v, m);
    CN_OK(w, agoq_collnet_view_finalize(&v, ctx));
    if (rc != 0) return -1;
    CN_REQUIRE(w, memcmp(m, mine, sizeof(m)) == 0,
               "reduceSupport of v%d differs from v%d's", versions[i], w->version);
  }
  static const ncclDataType_t must[] = {ncclFloat32, ncclBfloat16, ncclFloat16};
  for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++)
    CN_REQUIRE(w, mine[must[i] * PERF_NUM_OPS + ncclSum],
               "Sum of %s is not supported: the quantized path could never run",
               perf_dtype_name(must[i]));
  if (cn_allgather(w, mine, all, sizeof(mine)) != 0) return -1;
  for (int k = 0; k < w->nranks; k++)
    CN_REQUIRE(w, memcmp(all[k], mine, sizeof(mine)) == 0,
               "rank %d's reduceSupport answers differ from rank %d's", k, w->rank);
  if (w->rank == 0) {
    printf("collnet: reduceSupport (sum prod max min):");
    for (int t = 0; t < PERF_NUM_DTYPES; t++) {
      printf(" %s ", perf_dtype_name((ncclDataType_t)t));
      for (int op = 0; op < PERF_NUM_OPS; op++) putchar(mine[t * PERF_NUM_OPS + op] ? "SPXN"[op] : '-');
    }
    printf("\n");
  }
  /* The CollNet devices are the net devices (NCCL merges the two lists by name). */
  int vnet[AGOQ_LOADER_NUM_VERSIONS];
  int nn = agoq_netlib_net_versions(w->lib, vnet, AGOQ_LOADER_NUM_VERSIONS);
  CN_REQUIRE(w, nn > 0, "no net table");
  agoq_net_view nv_;
  void* nctx = NULL;
  int nndev = 0, cndev = 0;
  CN_REQUIRE(w, agoq_netlib_net_view(w->lib, vnet[0], &nv_) == 0, "no net view");
  CN_OK(w, agoq_view_init(&nv_, &nctx, w->comm_id, agoq_log_stderr));
  CN_OK(w, agoq_view_devices(&nv_, &nndev));
  CN_OK(w, agoq_collnet_view_devices(&w->view, &cndev));
  CN_REQUIRE(w, nndev == cndev, "net has %d devices, CollNet %d", nndev, cndev);
  for (int d = 0; d < cndev; d++) {
    agoq_view_props np, cp;
    CN_OK(w, agoq_view_get_properties(&nv_, d, &np));
    CN_OK(w, agoq_collnet_view_get_properties(&w->view, d, &cp));
    CN_REQUIRE(w, strcmp(np.name, cp.name) == 0 && np.has_pci_path == cp.has_pci_path &&
                      strcmp(np.pci_path, cp.pci_path) == 0,
               "device %d: net \"%s\" (%s) vs CollNet \"%s\" (%s)", d, np.name, np.pci_path,
               cp.name, cp.pci_path);
  }
  CN_OK(w, agoq_view_finalize(&nv_, nctx));
  return 0;
fail:
  return -1;
}

/* ---- versions ---- */

static int cn_sc_versions(cn_worker* w) {
  cn_batch b = {.inflight = CN_MAX_INFLIGHT};
  if (cn_group_up(w) != 0) return -1;
  b.max_rel_l2 = cn_quant_bound(w->format);
  bool gs = agoq_collnet_view_has_gather_scatter(&w->view);
  CN_REQUIRE(w, gs == (w->version >= 8),
             "v%d %s iallgather/ireducescatter (NCCL declares them from v8 on)", w->version,
             gs ? "has" : "lacks");
  void* req = (void*)0x1234;
  if (w->version <= 8) {
    /* int count: refused before the plugin sees a truncated count. */
    ncclResult_t r = agoq_collnet_view_iallreduce(&w->view, w->coll_comm, NULL, NULL,
                                                  (size_t)INT_MAX + 1, ncclFloat32, ncclSum,
                                                  NULL, NULL, &req);
    CN_REQUIRE(w, r == ncclInvalidArgument && req == (void*)0x1234,
               "v%d iallreduce of INT_MAX+1 elements: %s", w->version, cn_result_str(r));
  }
  if (!gs) {
    agoq_view_sge part = {0};
    ncclResult_t r = agoq_collnet_view_iallgather(&w->view, w->coll_comm, NULL, 1, &part, 0, 0,
                                                  0, NULL, &req);
    CN_REQUIRE(w, r == ncclInvalidUsage && req == (void*)0x1234,
               "v%d iallgather through the view: %s", w->version, cn_result_str(r));
  }
  if (w->version == 8) {
    agoq_view_sge part = {.size = (size_t)UINT32_MAX + 1};
    ncclResult_t r = agoq_collnet_view_ireducescatter(&w->view, w->coll_comm, 1, &part, NULL, 0,
                                                      0, part.size, ncclFloat32, ncclSum, NULL,
                                                      &req);
    CN_REQUIRE(w, r == ncclInvalidArgument && req == (void*)0x1234,
               "v8 ireducescatter of a 4 GiB part: %s", cn_result_str(r));
  }
  uint64_t seed = 0x1000 + (uint64_t)w->version;
  int rc = 0;
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat32, ncclSum, 1000, 0, seed++);
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclInt64, ncclProd, 333, 0, seed++);
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclBfloat16, ncclSum, 50001, 0, seed++);
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclUint8, ncclMax, 4097, 1000, seed++);
  if (gs) {
    rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, ncclFloat32, ncclSum, 513, 1000, seed++);
    rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, ncclInt32, ncclMin, 77, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLGATHER, ncclInt8, ncclSum, 777, 1000, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLGATHER, ncclFloat64, ncclSum, 50, 0, seed++);
  }
  if (rc == 0) cn_batch_run(w, &b);
  cn_batch_free(w, &b);
  return w->failed ? -1 : 0;
fail:
  cn_batch_free(w, &b);
  return -1;
}

/* ---- exact ---- */

static int cn_sc_exact(cn_worker* w) {
  cn_batch b = {.inflight = CN_MAX_INFLIGHT};
  if (cn_group_up(w) != 0) return -1;
  b.max_rel_l2 = cn_quant_bound(w->format);
  size_t n = (size_t)w->nranks;
  /* 0, 1, odd, not a multiple of the block (128), not divisible by the rank count */
  const size_t sizes[] = {0, 1, 7, 130, n * 517 + 1, 4099};
  const size_t per[] = {1, 7, 130, 301};
  uint64_t seed = 0x2000;
  int rc = 0;
  for (int t = 0; t < PERF_NUM_DTYPES; t++) {
    size_t elt = perf_dtype_size((ncclDataType_t)t);
    for (int op = 0; op < PERF_NUM_OPS; op++) {
      bool yes = false;
      if (cn_supported(w, (ncclDataType_t)t, (ncclRedOp_t)op, &yes) != 0) goto fail;
      if (!yes) continue;
      for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        rc |= cn_batch_add(w, &b, CN_ALLREDUCE, (ncclDataType_t)t, (ncclRedOp_t)op, sizes[i], 0,
                           seed++);
      rc |= cn_batch_add(w, &b, CN_ALLREDUCE, (ncclDataType_t)t, (ncclRedOp_t)op, 4099,
                         1000 * elt, seed++);
      if (!agoq_collnet_view_has_gather_scatter(&w->view)) continue;
      for (size_t i = 0; i < sizeof(per) / sizeof(per[0]); i++) {
        rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, (ncclDataType_t)t, (ncclRedOp_t)op, per[i],
                           0, seed++);
        /* windows that start and end inside ranks' parts */
        rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, (ncclDataType_t)t, (ncclRedOp_t)op, per[i],
                           333 * elt, seed++);
      }
    }
  }
  if (agoq_collnet_view_has_gather_scatter(&w->view)) {
    static const ncclDataType_t ag[] = {ncclUint8, ncclBfloat16, ncclFloat64};
    for (size_t t = 0; t < sizeof(ag) / sizeof(ag[0]); t++)
      for (size_t i = 0; i < sizeof(per) / sizeof(per[0]); i++) {
        rc |= cn_batch_add(w, &b, CN_ALLGATHER, ag[t], ncclSum, per[i], 0, seed++);
        rc |= cn_batch_add(w, &b, CN_ALLGATHER, ag[t], ncclSum, per[i], 100, seed++);
      }
  }
  /* Around AGOQ_MIN_BYTES: exact types stay exact above it, float sums are quantized
   * (unless AGOQ_FORMAT=none), a call below it is exact. */
  static const ncclDataType_t big[] = {ncclFloat32, ncclBfloat16, ncclFloat16, ncclInt32,
                                       ncclFloat64, ncclFloat8e4m3, ncclUint64};
  for (size_t t = 0; t < sizeof(big) / sizeof(big[0]); t++) {
    bool yes = false;
    if (cn_supported(w, big[t], ncclSum, &yes) != 0) goto fail;
    if (yes) rc |= cn_batch_add(w, &b, CN_ALLREDUCE, big[t], ncclSum, 70001, 0, seed++);
  }
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat32, ncclSum, 50000, 64u << 10, seed++);
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclBfloat16, ncclMax, 70001, 0, seed++);
  if (agoq_collnet_view_has_gather_scatter(&w->view))
    rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, ncclBfloat16, ncclSum, 40000, 0, seed++);
  if (rc == 0) cn_batch_run(w, &b);
  cn_batch_free(w, &b);
  return w->failed ? -1 : 0;
fail:
  cn_batch_free(w, &b);
  return -1;
}

/* ---- quant ---- */

static int cn_sc_quant(cn_worker* w) {
  cn_batch b = {.inflight = CN_MAX_INFLIGHT};
  if (cn_group_up(w) != 0) return -1;
  CN_REQUIRE(w, w->format != 0, "the quant scenario needs AGOQ_FORMAT other than none");
  b.max_rel_l2 = cn_quant_bound(w->format);
  static const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclFloat16};
  uint64_t seed = 0x3000;
  int rc = 0;
  bool gs = agoq_collnet_view_has_gather_scatter(&w->view);
  for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
    size_t elt = perf_dtype_size(types[t]);
    /* exactly AGOQ_MIN_BYTES; odd, neither a block nor a rank multiple; 2-4 MiB */
    size_t at_min = (w->min_bytes + elt - 1) / elt;
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, types[t], ncclSum, at_min, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, types[t], ncclSum, 300007, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, types[t], ncclSum, 300007, (1u << 20) + 3 * elt,
                       seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, types[t], ncclSum, 1u << 20, 2u << 20, seed++);
    if (gs) {
      rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, types[t], ncclSum, 100003, 0, seed++);
      rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, types[t], ncclSum, 100003, 2u << 20, seed++);
    }
  }
  /* Inf and NaN in the inputs travel raw and come out as Inf and NaN. */
  rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclBfloat16, ncclSum, 70001, 0, seed++);
  if (rc == 0) {
    b.cases[b.ncases - 1].inject = true;
    cn_batch_run(w, &b);
  }
  cn_batch_free(w, &b);
  return w->failed ? -1 : 0;
fail:
  cn_batch_free(w, &b);
  return -1;
}

/* ---- overflow ---- */

/* fp16 and bf16 sums beyond the type's range are +-Inf on every rank, identical bits, on
 * the quantized path (AGOQ_FORMAT int8 etc.) and the exact one (AGOQ_FORMAT=none), for
 * allreduce (one call and windows of 1 MiB) and reducescatter; the rest within the bound. */
static int cn_sc_overflow(cn_worker* w) {
  cn_batch b = {.inflight = CN_MAX_INFLIGHT};
  if (cn_group_up(w) != 0) return -1;
  b.max_rel_l2 = cn_quant_bound(w->format);
  static const ncclDataType_t types[] = {ncclFloat16, ncclBfloat16};
  bool gs = agoq_collnet_view_has_gather_scatter(&w->view);
  uint64_t seed = 0x5000;
  int rc = 0;
  for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, types[t], ncclSum, 1024 * 300 + 77, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, types[t], ncclSum, 1024 * 1200, 1u << 20, seed++);
    if (gs) rc |= cn_batch_add(w, &b, CN_REDUCESCATTER, types[t], ncclSum, 1024 * 100, 0, seed++);
  }
  if (rc == 0) {
    for (int i = 0; i < b.ncases; i++) b.cases[i].overflow = true;
    cn_batch_run(w, &b);
  }
  cn_batch_free(w, &b);
  return w->failed ? -1 : 0;
}

/* ---- inflight ---- */

static int cn_sc_inflight(cn_worker* w) {
  cn_batch b = {.inflight = CN_MAX_INFLIGHT, .test_lifo = true};
  if (cn_group_up(w) != 0) return -1;
  b.max_rel_l2 = cn_quant_bound(w->format);
  bool gs = agoq_collnet_view_has_gather_scatter(&w->view);
  uint64_t seed = 0x4000;
  int rc = 0;
  for (int round = 0; round < 3; round++) {
    /* Eight single-call collectives per group, exact and quantized mixed. */
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclBfloat16, ncclSum, 100000, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat32, ncclSum, 1000, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclInt32, ncclSum, 5000, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat64, ncclMax, 3000, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclFloat16, ncclSum, 40000, 0, seed++);
    rc |= cn_batch_add(w, &b, CN_ALLREDUCE, ncclUint8, ncclProd, 9999, 0, seed++);
    rc |= cn_batch_add(w, &b, gs ? CN_REDUCESCATTER : CN_ALLREDUCE, ncclBfloat16, ncclSum,
                       20000, 0, seed++);
    rc |= cn_batch_add(w, &b, gs ? CN_ALLGATHER : CN_ALLREDUCE, ncclUint8, ncclMin, 12345, 0,
                       seed++);
  }
  if (rc == 0) cn_batch_run(w, &b);
  cn_batch_free(w, &b);
  return w->failed ? -1 : 0;
}

const cn_scenario cn_scenarios[] = {
    {"support", "reduceSupport identical on every rank and version; devices as the net's",
     cn_sc_support, 0},
    {"versions", "each kind of collective through one ABI version", cn_sc_versions,
     CN_SC_ALL_VERSIONS},
    {"exact", "every declared (type, op), edge sizes, windows: exact bit for bit", cn_sc_exact,
     0},
    {"quant", "quantized reductions: bound, identical bits, windows, Inf/NaN", cn_sc_quant, 0},
    {"overflow", "fp16/bf16 sums beyond the type's range are +-Inf on every rank",
     cn_sc_overflow, 0},
    {"inflight", "8 calls outstanding, tested newest first", cn_sc_inflight, 0},
    {"kill", "a rank SIGKILLed mid-collective: the others fail within 10 s", cn_sc_kill,
     CN_SC_VICTIM},
    {"stats", "AGOQ_STATS: known call mix, then exit() with the group open", cn_sc_stats, 0},
};
const size_t cn_scenario_count = sizeof(cn_scenarios) / sizeof(cn_scenarios[0]);
