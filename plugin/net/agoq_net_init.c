/* Plugin lifecycle: init (per communicator on v11+, once per process before), finalize,
 * devices and their properties. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "net/agoq_comm.h"
#include "net/agoq_net_config.h"
#include "net/agoq_progress.h"
#include "agoq_codec.h"
#include "agoq_topo.h"

agoq_transport_config agoq_config;

static struct {
  pthread_mutex_t mu;
  bool configured;      /* agoq_config filled */
  int live_ctx;         /* contexts handed out and not finalized */
  agoq_ctx* legacy_ctx; /* the one context of v6..v10 */
} agoq_state = {.mu = PTHREAD_MUTEX_INITIALIZER};

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

ncclResult_t agoq_net_config_resolve(agoq_transport_config* c) {
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
  c->inline_max = (uint64_t)agoq_param_int(AGOQ_PARAM_SOCKET_INLINE);
  c->min_chunk = (uint64_t)agoq_param_int(AGOQ_PARAM_SOCKET_MIN_CHUNK);
  c->sndbuf = (int)agoq_param_int(AGOQ_PARAM_SOCKET_SNDBUF);
  c->rcvbuf = (int)agoq_param_int(AGOQ_PARAM_SOCKET_RCVBUF);
  c->keepalive_s = (int)agoq_param_int(AGOQ_PARAM_KEEPALIVE_S);
  c->timeout_s = (int)agoq_param_int(AGOQ_PARAM_TIMEOUT_S);
  c->handshake_timeout_ms = agoq_param_int(AGOQ_PARAM_HANDSHAKE_TIMEOUT_MS);
  c->max_pending = (int)agoq_param_int(AGOQ_PARAM_MAX_PENDING_CONNECTIONS);
  return ncclSuccess;
}

int agoq_net_config_nthreads(void) { return agoq_progress_nthreads(); }

static ncclResult_t agoq_config_load(void) {
  agoq_transport_config* c = &agoq_config;
  AGOQ_CHECK(agoq_net_config_resolve(c));
  agoq_typed_policy_load();

  char line[512] = "", one[160], desc[128];
  for (int i = 0; i < c->nifs; i++) {
    snprintf(one, sizeof one, "%s[%d]%s", i ? " " : "", i, agoq_netif_describe(&c->ifs[i], desc, sizeof desc));
    strncat(line, one, sizeof line - strlen(line) - 1);
  }
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "Using %s; %u data sockets per connection, %d progress threads%s",
            line, c->nsocks, agoq_net_config_nthreads(),
            agoq_param_int(AGOQ_PARAM_SOCKET_NTHREADS) ? "" : " (auto)");
  return ncclSuccess;
}

static ncclResult_t agoq_ctx_create(uint64_t comm_id, int traffic_class, ncclProfilerCallback_t prof_fn,
                                    agoq_ctx** out) {
  ncclResult_t res = ncclSuccess;
  agoq_ctx* ctx = NULL;
  AGOQ_CALLOC_GOTO(ctx, 1, res, out);
  ctx->magic = AGOQ_CTX_MAGIC;
  ctx->comm_id = comm_id;
  ctx->traffic_class = traffic_class;
  ctx->prof_fn = prof_fn;
  ctx->attr.op = ctx->attr.algo = ctx->attr.proto = UINT32_MAX;
  if (agoq_stats_enabled()) {
    char config[96];
    snprintf(config, sizeof config, "format=%s block=%u min_bytes=%llu",
             agoq_format_name((agoq_format)agoq_typed.format), agoq_typed.block,
             (unsigned long long)agoq_typed.min_bytes);
    ctx->st_send = agoq_stats_open(AGOQ_STATS_P2P_SEND, ctx, -1, -1, config, false);
    ctx->st_recv = agoq_stats_open(AGOQ_STATS_P2P_RECV, ctx, -1, -1, config, false);
  }
  *out = ctx;
out:
  return res;
}

static ncclResult_t agoq_init_common_locked(ncclDebugLogger_t log_fn) {
  if (log_fn != NULL) agoq_log_set_logger(log_fn);
  if (!agoq_state.configured) {
    AGOQ_CHECK(agoq_config_load());
    agoq_state.configured = true;
  }
  return ncclSuccess;
}

ncclResult_t agoq_net_init(void** ctx, uint64_t comm_id, int traffic_class, ncclDebugLogger_t log_fn,
                           ncclProfilerCallback_t prof_fn) {
  ncclResult_t res = ncclSuccess;
  agoq_ctx* c = NULL;
  if (ctx == NULL) return ncclInternalError;
  *ctx = NULL;
  pthread_mutex_lock(&agoq_state.mu);
  AGOQ_CHECK_GOTO(agoq_init_common_locked(log_fn), res, out);
  AGOQ_CHECK_GOTO(agoq_ctx_create(comm_id, traffic_class, prof_fn, &c), res, out);
  agoq_state.live_ctx++;
  *ctx = c;
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "init for communicator %016llx (%d active)", (unsigned long long)comm_id,
            agoq_state.live_ctx);
out:
  pthread_mutex_unlock(&agoq_state.mu);
  return res;
}

ncclResult_t agoq_net_finalize(void* ctx) {
  agoq_ctx* c = ctx;
  if (c == NULL) return ncclSuccess; /* NCCL finalizes even after a failed init */
  if (c->magic != AGOQ_CTX_MAGIC) {
    AGOQ_WARN("finalize: not an agoq context (%p)", ctx);
    return ncclInternalError;
  }
  pthread_mutex_lock(&agoq_state.mu);
  c->magic = 0;
  /* Comms closed after finalize keep counting into the entries (never freed). */
  agoq_stats_close(c->st_send);
  agoq_stats_close(c->st_recv);
  free(c);
  if (--agoq_state.live_ctx == 0) {
    /* The last communicator is gone and NCCL may now dlclose us: no thread may outlive
     * it. Comms still open (closed after finalize) keep the threads until their close. */
    agoq_progress_shutdown_when_idle();
  }
  pthread_mutex_unlock(&agoq_state.mu);
  return ncclSuccess;
}

ncclResult_t agoq_net_legacy_init(ncclDebugLogger_t log_fn, ncclProfilerCallback_t prof_fn) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&agoq_state.mu);
  AGOQ_CHECK_GOTO(agoq_init_common_locked(log_fn), res, out);
  if (agoq_state.legacy_ctx == NULL) {
    /* Before v11 NCCL has no per-communicator init, no comm id and no finalize: one
     * process-wide context; the library destructor stops the threads. */
    AGOQ_CHECK_GOTO(agoq_ctx_create(0, NCCL_NET_TRAFFIC_CLASS_UNDEF, prof_fn, &agoq_state.legacy_ctx), res, out);
  } else if (prof_fn != NULL) {
    agoq_state.legacy_ctx->prof_fn = prof_fn; /* v10: the same callback for every init */
  }
out:
  pthread_mutex_unlock(&agoq_state.mu);
  return res;
}

void* agoq_net_legacy_ctx(void) {
  pthread_mutex_lock(&agoq_state.mu);
  void* c = agoq_state.legacy_ctx;
  pthread_mutex_unlock(&agoq_state.mu);
  return c;
}

static bool agoq_configured(void) {
  pthread_mutex_lock(&agoq_state.mu);
  bool ok = agoq_state.configured;
  pthread_mutex_unlock(&agoq_state.mu);
  return ok;
}

ncclResult_t agoq_net_devices(int* ndev) {
  if (ndev == NULL) return ncclInternalError;
  if (!agoq_configured()) {
    AGOQ_WARN("devices called before a successful init");
    return ncclInternalError;
  }
  *ndev = agoq_config.nifs;
  return ncclSuccess;
}

ncclResult_t agoq_net_get_properties(int dev, agoq_net_props* p) {
  if (p == NULL || !agoq_configured() || dev < 0 || dev >= agoq_config.nifs) {
    AGOQ_WARN("getProperties: invalid device %d (have %d)", dev, agoq_configured() ? agoq_config.nifs : 0);
    return ncclInternalError;
  }
  const agoq_netif* nif = &agoq_config.ifs[dev];
  memset(p, 0, sizeof *p);
  p->name = nif->name;
  p->pci_path = nif->has_pci_path ? nif->pci_path : NULL;
  p->guid = (uint64_t)dev;
  p->ptr_support = NCCL_PTR_HOST;
  p->speed_mbps = nif->speed_mbps;
  p->latency_us = 0;
  p->max_comms = 65536;
  p->max_recvs = AGOQ_NET_MAX_RECVS;
  p->net_device_type = NCCL_NET_DEVICE_HOST;
  p->net_device_version = NCCL_NET_DEVICE_INVALID_VERSION;
  p->vdev_count = 1;
  p->vdevs[0] = dev;
  p->max_p2p_bytes = NCCL_MAX_NET_SIZE_BYTES;
  p->max_coll_bytes = AGOQ_NCCL_MAX_COLLNET_SIZE;
  p->max_multi_request_size = 1;
  p->rail_id = NCCL_NET_ID_UNDEF;
  p->plane_id = NCCL_NET_ID_UNDEF;
  return ncclSuccess;
}

ncclResult_t agoq_net_set_attr(void* ctx, const agoq_net_attr* attr) {
  agoq_ctx* c = ctx;
  if (c == NULL || c->magic != AGOQ_CTX_MAGIC || attr == NULL) return ncclInternalError;
  /* Remembered per communicator: the next isend/irecv on it belongs to this operation. */
  c->attr = *attr;
  return ncclSuccess;
}

/* Without finalize (v6..v10) the process-wide context lives until NCCL unloads us; free it
 * then, so load/unload cycles do not leak. */
__attribute__((destructor)) static void agoq_net_unload(void) {
  pthread_mutex_lock(&agoq_state.mu);
  if (agoq_state.legacy_ctx != NULL) {
    /* Its statistics go out at exit (or now); then the registry may be freed. */
    agoq_stats_at_exit();
    agoq_stats_close(agoq_state.legacy_ctx->st_send);
    agoq_stats_close(agoq_state.legacy_ctx->st_recv);
    agoq_stats_at_exit();
  }
  free(agoq_state.legacy_ctx);
  agoq_state.legacy_ctx = NULL;
  pthread_mutex_unlock(&agoq_state.mu);
}
