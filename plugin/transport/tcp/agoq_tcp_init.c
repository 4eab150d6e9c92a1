/* The TCP transport's process-wide part: settings and interfaces resolved once, devices
 * and their properties, and the interface table the net core uses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_nccl_env.h"
#include "core/agoq_params.h"
#include "transport/tcp/agoq_tcp.h"
#include "agoq_topo.h"

agoq_transport_config agoq_config;

/* NUMA node, CPUs and the PCI device's path of each interface, from hwloc when it can be
 * loaded, else sysfs. Never fatal: without it the interfaces keep what agoq_netif found. */
static void agoq_config_topology(agoq_transport_config* c) {
  agoq_topo* topo = calloc(1, sizeof *topo);
  if (topo == NULL) return;
  bool fallback = false;
  int rc = agoq_topo_discover(topo, &fallback);
  if (fallback) {
    char why[256];
    agoq_topo_hwloc_available(why, sizeof why);
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "hwloc not used (%s): NUMA nodes and PCI paths from sysfs", why);
  }
  if (rc != AGOQ_TOPO_OK) {
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "topology discovery failed: %s", agoq_topo_strerror(rc));
    free(topo);
    return;
  }
  agoq_topo_annotate_netifs(topo, c->ifs, c->nifs);
  for (int i = 0; i < c->nifs; i++) {
    const agoq_netif* nif = &c->ifs[i];
    char cpus[AGOQ_TOPO_CPUS_LEN] = "";
    if (nif->has_local_cpus) agoq_topo_cpulist(&nif->local_cpus, cpus, sizeof cpus);
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "dev %d %s: NUMA node %d%s%s, pciPath %s (topology from %s)", i, nif->name,
              nif->numa_node, cpus[0] ? " cpus " : "", cpus, nif->has_pci_path ? nif->pci_path : "none",
              topo->source);
  }
  free(topo);
}

ncclResult_t agoq_tcp_config_resolve(agoq_transport_config* c) {
  AGOQ_CHECK(agoq_params_load());
  memset(c, 0, sizeof *c);
  const char* spec = agoq_param_str(AGOQ_PARAM_SOCKET_IFNAME);
  agoq_netif_family family = (agoq_netif_family)agoq_param_int(AGOQ_PARAM_SOCKET_FAMILY);
  c->nifs = agoq_netif_discover(spec, family, "/sys", c->ifs, AGOQ_NETIF_MAX);
  if (c->nifs < 0) {
    AGOQ_WARN("cannot list network interfaces: %s", strerror(errno));
    return ncclSystemError;
  }
  if (c->nifs == 0) {
    /* Say what exists: a filter that matches nothing is usually a name from another host. */
    char all[768];
    if (agoq_netif_list_all(all, sizeof all) < 0) snprintf(all, sizeof all, "(cannot list: %s)", strerror(errno));
    AGOQ_WARN("no usable network interface matches %s=\"%s\" (family %s, must be up with an address); "
              "this host has: %s; set AGOQ_SOCKET_IFNAME",
              agoq_param_source(AGOQ_PARAM_SOCKET_IFNAME), spec, agoq_param_str(AGOQ_PARAM_SOCKET_FAMILY),
              all[0] ? all : "no interfaces");
    return ncclSystemError;
  }
  agoq_config_topology(c);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int64_t nsocks = agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS);
  c->nsocks = nsocks > 0 ? (unsigned)nsocks : (ncpu < 4 ? 2u : 4u);
  c->inline_max = agoq_param_int(AGOQ_PARAM_SOCKET_INLINE);
  c->min_chunk = (uint64_t)agoq_param_int(AGOQ_PARAM_SOCKET_MIN_CHUNK);
  c->sndbuf = (int)agoq_param_int(AGOQ_PARAM_SOCKET_SNDBUF);
  c->rcvbuf = (int)agoq_param_int(AGOQ_PARAM_SOCKET_RCVBUF);
  AGOQ_CHECK(agoq_tcp_cc_resolve(c, agoq_param_str(AGOQ_PARAM_SOCKET_CC)));
  c->keepalive_s = (int)agoq_param_int(AGOQ_PARAM_KEEPALIVE_S);
  c->timeout_s = (int)agoq_param_int(AGOQ_PARAM_TIMEOUT_S);
  c->handshake_timeout_ms = agoq_param_int(AGOQ_PARAM_HANDSHAKE_TIMEOUT_MS);
  c->max_pending = (int)agoq_param_int(AGOQ_PARAM_MAX_PENDING_CONNECTIONS);
  c->connect_retries = agoq_nccl_param("NCCL_SOCKET_RETRY_CNT", 34);
  c->connect_retry_ms = agoq_nccl_param("NCCL_SOCKET_RETRY_SLEEP_MSEC", 100);
  if (c->connect_retries < 0) c->connect_retries = 0;
  if (c->connect_retry_ms < 0) c->connect_retry_ms = 0;
  return ncclSuccess;
}

static ncclResult_t agoq_tcp_init(void) {
  agoq_transport_config* c = &agoq_config;
  AGOQ_CHECK(agoq_tcp_config_resolve(c));
  char line[512] = "", one[160], desc[128], cc[16], inl[96];
  for (int i = 0; i < c->nifs; i++) {
    snprintf(one, sizeof one, "%s[%d]%s", i ? " " : "", i, agoq_netif_describe(&c->ifs[i], desc, sizeof desc));
    strncat(line, one, sizeof line - strlen(line) - 1);
  }
  agoq_tcp_cc_effective(c, 0, cc);
  if (c->inline_max == AGOQ_TCP_INLINE_AUTO)
    snprintf(inl, sizeof inl, "by interface and congestion control (auto)");
  else
    snprintf(inl, sizeof inl, "up to %lld B", (long long)c->inline_max);
  AGOQ_INFO(NCCL_INIT | NCCL_NET,
            "Using %s; %u data sockets per connection, %d progress threads%s; messages %s move on the caller's "
            "thread; TCP congestion control %s (device 0)",
            line, c->nsocks, agoq_progress_nthreads(), agoq_param_int(AGOQ_PARAM_SOCKET_NTHREADS) ? "" : " (auto)",
            inl, cc[0] ? cc : "unknown");
  return ncclSuccess;
}

static int agoq_tcp_ndevs(void) { return agoq_config.nifs; }

static ncclResult_t agoq_tcp_get_properties(int dev, agoq_tp_props* p) {
  if (p == NULL || dev < 0 || dev >= agoq_config.nifs) {
    AGOQ_WARN("getProperties: invalid device %d (have %d)", dev, agoq_config.nifs);
    return ncclInternalError;
  }
  const agoq_netif* nif = &agoq_config.ifs[dev];
  agoq_tp_props_defaults(p, dev);
  p->name = nif->name;
  p->pci_path = nif->has_pci_path ? nif->pci_path : NULL;
  p->guid = (uint64_t)dev;
  p->speed_mbps = nif->speed_mbps;
  p->speed_known = nif->speed_source != AGOQ_NETIF_SPEED_DEFAULT;
  p->max_comms = 65536;
  return ncclSuccess;
}

static void agoq_tcp_set_match(agoq_tp_conn* c, agoq_tp_match_fn fn, void* arg) {
  c->match = fn;
  c->match_arg = arg;
}

static ncclResult_t agoq_tcp_error(agoq_tp_conn* c) { return (ncclResult_t)atomic_load(&c->error); }
static void agoq_tcp_fail(agoq_tp_conn* c, ncclResult_t res) { agoq_comm_error_set(&c->error, res); }
static const char* agoq_tcp_peer(agoq_tp_conn* c) { return c->peer; }

const agoq_transport agoq_transport_tcp = {
    .name = "tcp",
    .init = agoq_tcp_init,
    .idle = agoq_progress_shutdown_when_idle,
    .ndevs = agoq_tcp_ndevs,
    .helper_threads = agoq_progress_nthreads,
    .get_properties = agoq_tcp_get_properties,
    .placement_cpus = agoq_tcp_placement_cpus,
    .listen = agoq_tcp_listen,
    .accept = agoq_tcp_accept,
    .close_listen = agoq_tcp_close_listen,
    .connect = agoq_tcp_connect,
    .connect_abort = agoq_tcp_connect_abort,
    .conn_fds = agoq_tcp_conn_fds,
    .set_match = agoq_tcp_set_match,
    .post_send = agoq_tcp_post_send,
    .post_recv = agoq_tcp_post_recv,
    .progress = agoq_tcp_progress,
    .done = agoq_tcp_done,
    .wait_fds = agoq_tcp_wait_fds,
    .error = agoq_tcp_error,
    .fail = agoq_tcp_fail,
    .peer = agoq_tcp_peer,
    .close = agoq_tcp_conn_destroy,
    .exchange = agoq_tcp_exchange,
};
