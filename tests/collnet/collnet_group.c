/*
 * One worker's CollNet group, in NCCL's order (coll_net.cc): per-communicator init,
 * devices and properties, listen on the device, all-gather the listen handles, one blocking
 * connect(handles, nranks, rank, listenComm), closeListen after it succeeded; at the end
 * closeColl and finalize.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "collnet_harness.h"
#include "collnet/agoq_coll_cost.h"
#include "collnet/agoq_coll_wire.h"
#include "core/agoq_params.h"

/* The configuration the checks assume, read by the plugin's own parameter code (one parser
 * of AGOQ_*): the harness expects exactly what the plugin will do, and an invalid value
 * fails here with the plugin's own message. */
static int cn_read_env(cn_worker* w) {
  agoq_params_reset();
  if (agoq_params_load() != ncclSuccess) {
    CN_FAIL(w, "an AGOQ_* value is invalid (the WARN above says which)");
    return -1;
  }
  w->format = (int)agoq_param_int(AGOQ_PARAM_FORMAT); /* index in none|int8|int4|fp8e4m3|fp8e5m2 */
  w->min_bytes = (size_t)agoq_param_int(AGOQ_PARAM_MIN_BYTES);
  return 0;
}

double cn_quant_bound(int format) {
  /* Relative L2 of an all-reduce of N(0,1) data quantized twice (each contribution and
   * the sum), with the output rounding on top. int8 block 128 is the bound; the
   * others follow from their step sizes (int4: 1/7 of the block's amax; fp8: 3 and 2
   * mantissa bits). Measured with 2..8 ranks: 0.93 %, 16.9 %, 3.7 %, 7.3 %; over these
   * sizes the figure varies by less than 0.1 point, so the margins catch real regressions. */
  switch (format) {
    case 1: return 0.012;
    case 2: return 0.20;
    case 3: return 0.05;
    case 4: return 0.10;
    default: return 0.0;
  }
}

int cn_open(cn_worker* w) {
  char err[512] = "";
  if (cn_read_env(w) != 0) return -1;
  if (agoq_netlib_open(w->lib_path, &w->lib, err, sizeof(err)) != 0) {
    CN_FAIL(w, "cannot load %s: %s", w->lib_path, err);
    return -1;
  }
  if (agoq_netlib_collnet_view(w->lib, w->version, &w->view) != 0) {
    CN_FAIL(w, "%s exports no ncclCollNetPlugin_v%d", w->lib_path, w->version);
    return -1;
  }
  int ndev = 0;
  CN_OK(w, agoq_collnet_view_init(&w->view, &w->ctx, w->comm_id, agoq_log_stderr));
  CN_OK(w, agoq_collnet_view_devices(&w->view, &ndev));
  CN_REQUIRE(w, ndev > 0,
             "CollNet v%d reports %d devices: CollNet is not available in this build "
             "(NCCL would disable it)", w->version, ndev);
  w->dev = 0;
  CN_OK(w, agoq_collnet_view_get_properties(&w->view, w->dev, &w->props));
  CN_REQUIRE(w, w->props.max_coll_bytes > 0 && w->props.max_coll_bytes <= NCCL_MAX_NET_SIZE_BYTES,
             "maxCollBytes %zu outside NCCL's (0, 1 TiB]", w->props.max_coll_bytes);
  CN_REQUIRE(w, (w->props.ptr_support & NCCL_PTR_HOST) != 0,
             "CollNet device 0 does not take host memory (ptrSupport 0x%x)",
             w->props.ptr_support);
  CN_REQUIRE(w, !cn_device_mode() || (w->props.ptr_support & NCCL_PTR_CUDA) != 0,
             "--device: CollNet device 0 does not take device memory (ptrSupport 0x%x; is %s "
             "the plugin built over the CUDA emulation?)", w->props.ptr_support, w->lib_path);
  return 0;
fail:
  return -1;
}

/* The schedule the group will run, decided as the plugin decides it from what the handles
 * carry: the settings block (AGOQ_COLLNET_GRID, the format, the chunk) and the slowest rank's
 * link rate (the rank blocks; 0 when any is unknown). */
static int cn_schedule_of(cn_worker* w, void* const* handles) {
  agoq_coll_settings st;
  if (agoq_coll_settings_decode((const uint8_t*)handles[0] + AGOQ_COLL_HANDLE_OFFSET, &st) != AGOQ_COLL_SETTINGS_OK) {
    CN_FAIL(w, "rank 0's handle carries no settings block this harness can read");
    return -1;
  }
  uint32_t slowest = 0;
  int bad = agoq_coll_rank_slowest(handles, w->nranks, &slowest);
  if (bad >= 0) {
    CN_FAIL(w, "rank %d's handle carries a rank block this harness cannot read", bad);
    return -1;
  }
  agoq_coll_plans plans;
  char why[192];
  if (agoq_coll_plans_make(w->nranks, st.grid_a, st.grid_b, (double)st.chunk_bytes, &plans, why, sizeof why) != 0) {
    /* The group's creation refuses it too; the reference is then never needed. */
    agoq_coll_grid_auto(w->nranks, &w->grid);
    return 0;
  }
  agoq_coll_pick_in in = {.format = st.format, .block = st.block, .frame_partials = st.quant_partials,
                          .link_Bps = slowest * 1e6 / 8, .io_threads = st.io_threads};
  w->grid = plans.plan[agoq_coll_plans_pick(&plans, &in, NULL)].grid;
  return 0;
}

int cn_connect(cn_worker* w) {
  uint8_t handle[CN_HANDLE_SIZE];
  memset(handle, 0, sizeof(handle));
  uint8_t* handles = NULL;
  int ok = 1;
  ncclResult_t r = agoq_collnet_view_listen(&w->view, w->ctx, w->dev, handle, &w->listen_comm);
  if (r != ncclSuccess || w->listen_comm == NULL) {
    CN_FAIL(w, "listen returned %s, listen comm %p", cn_result_str(r), w->listen_comm);
    ok = 0;
  }
  /* Everyone learns whether all listened before anyone blocks in connect. */
  int all_ok[CN_MAX_RANKS];
  if (cn_allgather(w, &ok, all_ok, sizeof(ok)) != 0) return -1;
  for (int k = 0; k < w->nranks; k++)
    if (!all_ok[k]) {
      if (k != w->rank) CN_FAIL(w, "rank %d could not listen", k);
      return -1;
    }
  handles = malloc((size_t)CN_HANDLE_SIZE * (size_t)w->nranks);
  CN_REQUIRE(w, handles != NULL, "out of memory");
  if (cn_allgather(w, handle, handles, CN_HANDLE_SIZE) != 0) goto fail;
  void* ptrs[CN_MAX_RANKS];
  for (int k = 0; k < w->nranks; k++) ptrs[k] = handles + (size_t)k * CN_HANDLE_SIZE;
  if (cn_schedule_of(w, ptrs) != 0) goto fail;
  int64_t t0 = cn_now_ns();
  CN_OK(w, agoq_collnet_view_connect(&w->view, ptrs, w->nranks, w->rank, w->listen_comm,
                                     &w->coll_comm));
  CN_REQUIRE(w, w->coll_comm != NULL, "connect succeeded with a NULL collComm");
  /* NCCL's handle buffers are its own: connect must not have kept pointers into them. */
  memset(handles, 0xEE, (size_t)CN_HANDLE_SIZE * (size_t)w->nranks);
  CN_OK(w, agoq_collnet_view_close_listen(&w->view, w->listen_comm));
  w->listen_comm = NULL;
  free(handles);
  if (getenv("COLLNET_VERBOSE") != NULL)
    fprintf(stderr, "collnet: rank %d connected in %.1f ms\n", w->rank,
            (double)(cn_now_ns() - t0) / 1e6);
  return 0;
fail:
  free(handles);
  return -1;
}

void cn_close(cn_worker* w) {
  if (w->lib == NULL) return;
  if (w->coll_comm != NULL) {
    ncclResult_t r = agoq_collnet_view_close_coll(&w->view, w->coll_comm);
    if (r != ncclSuccess) CN_FAIL(w, "closeColl returned %s", cn_result_str(r));
    w->coll_comm = NULL;
  }
  if (w->listen_comm != NULL) {
    agoq_collnet_view_close_listen(&w->view, w->listen_comm);
    w->listen_comm = NULL;
  }
  if (w->view.table != NULL) {
    /* NCCL calls finalize unconditionally, also after a failed init. */
    ncclResult_t r = agoq_collnet_view_finalize(&w->view, w->ctx);
    if (r != ncclSuccess) CN_FAIL(w, "finalize returned %s", cn_result_str(r));
  }
  agoq_netlib_close(w->lib);
  w->lib = NULL;
}

int cn_supported(cn_worker* w, ncclDataType_t dtype, ncclRedOp_t op, bool* yes) {
  const int unset = 0x5A5A5A5A; /* the answer must be written */
  int s = unset;
  ncclResult_t r = agoq_collnet_view_reduce_support(&w->view, dtype, op, &s);
  if (r != ncclSuccess || s == unset) {
    CN_FAIL(w, "reduceSupport(%s, %s) returned %s%s", perf_dtype_name(dtype), perf_op_name(op),
            cn_result_str(r), s == unset ? " without writing *supported" : "");
    return -1;
  }
  *yes = s != 0;
  return 0;
}
