/*
 * One rank's CollNet group, set up in the order NCCL's proxy uses (coll_net.cc): init per
 * communicator, listen on the device, all-gather the listen handles between the node
 * heads, connect once with all of them (blocking is allowed), close the listen comm on
 * success, register the buffers once with the collComm.
 */
#include <stdio.h>
#include <string.h>

#include "perf_coll.h"

int perf_coll_open(perf_coll_net* c, const char* lib_path, int abi, int dev, uint64_t comm_id,
                   int rank) {
  memset(c, 0, sizeof(*c));
  char err[512] = "";
  if (lib_path == NULL) lib_path = agoq_netlib_default_path();
  if (lib_path == NULL || agoq_netlib_open(lib_path, &c->lib, err, sizeof(err)) != 0) {
    fprintf(stderr, "agoq-perf: rank %d: cannot load the plugin %s: %s\n", rank,
            lib_path ? lib_path : "(none)", err);
    return -1;
  }
  int versions[AGOQ_LOADER_NUM_VERSIONS];
  int nv = agoq_netlib_collnet_versions(c->lib, versions, AGOQ_LOADER_NUM_VERSIONS);
  int version = abi > 0 ? abi : (nv > 0 ? versions[0] : 0);
  if (nv <= 0 || agoq_netlib_collnet_view(c->lib, version, &c->view) != 0) {
    fprintf(stderr, "agoq-perf: rank %d: %s exports no ncclCollNetPlugin_v%d\n", rank, lib_path,
            abi > 0 ? abi : AGOQ_LOADER_MAX_VERSION);
    return -1;
  }
  ncclResult_t r = agoq_collnet_view_init(&c->view, &c->ctx, comm_id, agoq_log_stderr);
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet v%d init failed: %s\n", rank, version,
            agoq_result_str(r));
    return -1;
  }
  int ndev = 0;
  r = agoq_collnet_view_devices(&c->view, &ndev);
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet v%d devices failed: %s\n", rank, version,
            agoq_result_str(r));
    return -1;
  }
  if (ndev <= 0) {
    /* What NCCL does with such a plugin: CollNet off, the net tables carry everything. */
    fprintf(stderr,
            "agoq-perf: rank %d: the plugin's CollNet reports %d devices: CollNet is not "
            "available in this build of %s (NCCL would disable CollNet)\n",
            rank, ndev, lib_path);
    return -1;
  }
  if (dev >= ndev) {
    fprintf(stderr, "agoq-perf: rank %d: --dev %d but CollNet has %d device(s)\n", rank, dev,
            ndev);
    return -1;
  }
  c->dev = dev;
  r = agoq_collnet_view_get_properties(&c->view, dev, &c->props);
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet getProperties(%d) failed: %s\n", rank, dev,
            agoq_result_str(r));
    return -1;
  }
  if (c->props.max_coll_bytes == 0) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet device %d reports maxCollBytes 0 (NCCL "
            "refuses such a device)\n", rank, dev);
    return -1;
  }
  return 0;
}

int perf_coll_connect(perf_coll_net* c, perf_group* g) {
  uint8_t handle[PERF_HANDLE_SIZE];
  memset(handle, 0, sizeof(handle));
  int ok = 1;
  ncclResult_t r = agoq_collnet_view_listen(&c->view, c->ctx, c->dev, handle, &c->listen_comm);
  if (r != ncclSuccess || c->listen_comm == NULL) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet listen failed: %s\n", g->rank,
            r != ncclSuccess ? agoq_result_str(r) : "NULL listen comm");
    ok = 0;
  }
  /* Every rank learns whether all listened before anyone connects: a group with a
   * missing member would only time out. */
  int all_ok[PERF_COLL_MAX_RANKS];
  if (perf_group_allgather(g, &ok, all_ok, sizeof(ok), 120000) != 0) return -1;
  for (int k = 0; k < g->nranks; k++)
    if (!all_ok[k]) {
      if (g->rank == 0 && k != 0) fprintf(stderr, "agoq-perf: rank %d could not listen\n", k);
      return -1;
    }
  static uint8_t handles[PERF_COLL_MAX_RANKS][PERF_HANDLE_SIZE];
  if (perf_group_allgather(g, handle, handles, PERF_HANDLE_SIZE, 120000) != 0) return -1;
  void* ptrs[PERF_COLL_MAX_RANKS];
  for (int k = 0; k < g->nranks; k++) ptrs[k] = handles[k];
  r = agoq_collnet_view_connect(&c->view, ptrs, g->nranks, g->rank, c->listen_comm,
                                &c->coll_comm);
  if (r != ncclSuccess || c->coll_comm == NULL) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet connect (%d ranks) failed: %s\n", g->rank,
            g->nranks, r != ncclSuccess ? agoq_result_str(r) : "NULL collComm");
    /* NCCL forgets the listen comm of a failed connect; we close it. */
    return -1;
  }
  r = agoq_collnet_view_close_listen(&c->view, c->listen_comm);
  c->listen_comm = NULL;
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet closeListen failed: %s\n", g->rank,
            agoq_result_str(r));
    return -1;
  }
  return 0;
}

int perf_coll_register(perf_coll_net* c, void* send, size_t send_bytes, void* recv,
                       size_t recv_bytes) {
  ncclResult_t r = agoq_collnet_view_reg_mr(&c->view, c->coll_comm, send, send_bytes,
                                            NCCL_PTR_HOST, &c->send_mh);
  if (r == ncclSuccess)
    r = agoq_collnet_view_reg_mr(&c->view, c->coll_comm, recv, recv_bytes, NCCL_PTR_HOST,
                                 &c->recv_mh);
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: CollNet regMr of %zu B failed: %s\n",
            c->send_mh == NULL ? send_bytes : recv_bytes, agoq_result_str(r));
    return -1;
  }
  return 0;
}

ncclResult_t perf_coll_close_group(perf_coll_net* c) {
  if (c->coll_comm == NULL) return ncclSuccess;
  if (c->send_mh != NULL) agoq_collnet_view_dereg_mr(&c->view, c->coll_comm, c->send_mh);
  if (c->recv_mh != NULL) agoq_collnet_view_dereg_mr(&c->view, c->coll_comm, c->recv_mh);
  c->send_mh = c->recv_mh = NULL;
  ncclResult_t r = agoq_collnet_view_close_coll(&c->view, c->coll_comm);
  c->coll_comm = NULL;
  return r;
}

void perf_coll_close(perf_coll_net* c) {
  if (c->lib == NULL) return;
  ncclResult_t r = perf_coll_close_group(c);
  if (r != ncclSuccess) fprintf(stderr, "agoq-perf: CollNet closeColl failed: %s\n", agoq_result_str(r));
  if (c->listen_comm != NULL) agoq_collnet_view_close_listen(&c->view, c->listen_comm);
  /* Before v11 there is no finalize; the view makes it a no-op. */
  if (c->view.table != NULL) agoq_collnet_view_finalize(&c->view, c->ctx);
  agoq_netlib_close(c->lib);
  memset(c, 0, sizeof(*c));
}
