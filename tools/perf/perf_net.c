/*
 * The plugin session of one rank: the newest exported net table, one communicator
 * context, a connection rank 0 -> rank 1 (and, for ping-pong, one back) set up with the
 * polled, non-blocking connect/accept NCCL's proxy uses.
 */
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "perf.h"

int perf_net_open(perf_net* n, const char* lib_path, int dev, uint64_t comm_id) {
  return perf_net_open_ex(n, lib_path, dev, comm_id, agoq_log_stderr, NULL);
}

int perf_net_open_ex(perf_net* n, const char* lib_path, int dev, uint64_t comm_id, ncclDebugLogger_t log,
                     ncclProfilerCallback_t prof) {
  memset(n, 0, sizeof(*n));
  char err[512] = "";
  if (lib_path == NULL) lib_path = agoq_netlib_default_path();
  if (lib_path == NULL || agoq_netlib_open(lib_path, &n->lib, err, sizeof(err)) != 0) {
    fprintf(stderr, "agoq-perf: cannot load the plugin %s: %s\n", lib_path ? lib_path : "(none)",
            err);
    return -1;
  }
  int versions[16];
  if (agoq_netlib_net_versions(n->lib, versions, 16) <= 0 ||
      agoq_netlib_net_view(n->lib, versions[0], &n->view) != 0) {
    fprintf(stderr, "agoq-perf: %s exports no usable ncclNetPlugin_vN\n", lib_path);
    return -1;
  }
  ncclResult_t r = agoq_view_init_prof(&n->view, &n->ctx, comm_id, log, prof);
  int ndev = 0;
  if (r == ncclSuccess) r = agoq_view_devices(&n->view, &ndev);
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: plugin init/devices failed: %s\n", agoq_result_str(r));
    return -1;
  }
  if (dev >= ndev) {
    fprintf(stderr, "agoq-perf: --dev %d but the plugin has %d device(s)\n", dev, ndev);
    return -1;
  }
  n->dev = dev;
  r = agoq_view_get_properties(&n->view, dev, &n->props);
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: getProperties(%d) failed: %s\n", dev, agoq_result_str(r));
    return -1;
  }
  return 0;
}

int perf_net_connect_pair(perf_net* n, perf_boot* b) { return perf_net_connect_from(n, b, 0); }

int perf_net_connect_from(perf_net* n, perf_boot* b, int sender) {
  uint8_t handle[PERF_HANDLE_SIZE];
  memset(handle, 0, sizeof(handle));
  ncclResult_t r;
  bool listener = b->rank != sender;
  if (listener) {
    r = agoq_view_listen(&n->view, n->ctx, n->dev, handle, &n->listen_comm);
    if (r != ncclSuccess || n->listen_comm == NULL) {
      fprintf(stderr, "agoq-perf: listen failed: %s\n", agoq_result_str(r));
      return -1;
    }
    if (perf_boot_send(b, PERF_MSG_HANDLE, handle, sizeof(handle)) != 0) return -1;
  } else if (perf_boot_recv(b, PERF_MSG_HANDLE, handle, sizeof(handle), 60000) != 0) {
    return -1;
  }
  double deadline = perf_now_us() + 60e6;
  for (;;) {
    void** comm = listener ? &n->recv_comm : &n->send_comm;
    r = listener ? agoq_view_accept(&n->view, n->listen_comm, comm)
                 : agoq_view_connect(&n->view, n->ctx, n->dev, handle, comm);
    if (r != ncclSuccess) {
      fprintf(stderr, "agoq-perf: rank %d: %s failed: %s\n", b->rank,
              listener ? "accept" : "connect", agoq_result_str(r));
      return -1;
    }
    if (*comm != NULL) break;
    if (perf_boot_peer_failed(b)) {
      fprintf(stderr, "agoq-perf: rank %d: the other rank failed during connection setup\n",
              b->rank);
      return -1;
    }
    if (perf_now_us() > deadline) {
      fprintf(stderr, "agoq-perf: rank %d: connection not established in 60 s\n", b->rank);
      return -1;
    }
    sched_yield();
  }
  if (n->listen_comm != NULL) {
    agoq_view_close_listen(&n->view, n->listen_comm);
    n->listen_comm = NULL;
  }
  return 0;
}

void perf_net_close(perf_net* n) {
  if (n->lib == NULL) return;
  if (n->send_comm != NULL) agoq_view_close_send(&n->view, n->send_comm);
  if (n->recv_comm != NULL) agoq_view_close_recv(&n->view, n->recv_comm);
  if (n->listen_comm != NULL) agoq_view_close_listen(&n->view, n->listen_comm);
  agoq_view_finalize(&n->view, n->ctx);
  agoq_netlib_close(n->lib);
  memset(n, 0, sizeof(*n));
}
