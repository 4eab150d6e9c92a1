/* The verbs transport's process-wide part: the library, the ports (one NCCL device each)
 * with their GIDs, properties, and the interface table the net core uses. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "transport/ib/agoq_ib.h"

agoq_ib_state agoq_ib;

#define AGOQ_IB_GID_TABLE_MAX 256
#define AGOQ_IB_DEFAULT_SPEED_MBPS 100000
#define AGOQ_IB_SYSFS_ROOT "/sys"

typedef struct {
  agoq_ib_report_fn fn;
  void* arg;
} agoq_ib_reporter;

/* One line about discovery: INFO always, and the caller's report (agoq-info). */
__attribute__((format(printf, 2, 3))) static void agoq_ib_say(const agoq_ib_reporter* r, const char* fmt, ...) {
  char line[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "%s", line);
  if (r->fn != NULL) r->fn(r->arg, line);
}

static uint64_t agoq_be64_to_host(uint64_t be) {
  const uint8_t* b = (const uint8_t*)&be;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | b[i];
  return v;
}

/* The port's GID table with each entry's type: from _ibv_query_gid_ex where the library
 * has it, else from sysfs (an unreadable type stays UNKNOWN with its errno). */
static int agoq_ib_read_gids(const agoq_ibv_api* api, struct agoq_ibv_context* ctx, const char* dev, int port,
                             int link_layer, int count, agoq_ib_gid_entry* gids) {
  if (count > AGOQ_IB_GID_TABLE_MAX) count = AGOQ_IB_GID_TABLE_MAX;
  for (int i = 0; i < count; i++) {
    agoq_ib_gid_entry* g = &gids[i];
    memset(g, 0, sizeof *g);
    agoq_ibv_gid gid;
    if (api->query_gid(ctx, (uint8_t)port, i, &gid) != 0) continue; /* all zero: unconfigured */
    memcpy(g->raw, gid.raw, 16);
    if (link_layer == AGOQ_IBV_LINK_LAYER_INFINIBAND) {
      g->type = AGOQ_IB_GID_TYPE_IB;
      continue;
    }
    if (!agoq_ib_gid_is_configured(g->raw)) continue;
    if (api->query_gid_ex != NULL) {
      struct agoq_ibv_gid_entry e;
      int rc = api->query_gid_ex(ctx, (uint32_t)port, (uint32_t)i, &e, 0, sizeof e);
      if (rc == 0) {
        g->type = e.gid_type == AGOQ_IBV_GID_TYPE_ROCE_V2   ? AGOQ_IB_GID_TYPE_ROCE_V2
                  : e.gid_type == AGOQ_IBV_GID_TYPE_ROCE_V1 ? AGOQ_IB_GID_TYPE_ROCE_V1
                                                            : AGOQ_IB_GID_TYPE_IB;
      } else {
        g->type = AGOQ_IB_GID_TYPE_UNKNOWN;
        g->type_errno = rc;
      }
      continue;
    }
    agoq_ib_gid_type t = AGOQ_IB_GID_TYPE_UNKNOWN;
    int rc = agoq_ib_sysfs_gid_type(AGOQ_IB_SYSFS_ROOT, dev, port, i, &t);
    g->type = rc == 0 ? t : AGOQ_IB_GID_TYPE_UNKNOWN;
    g->type_errno = rc;
  }
  return count;
}

static void agoq_ib_gid_policy_load(agoq_ib_gid_policy* p) {
  *p = agoq_ib_gid_policy_default();
  p->index = (int)agoq_param_int(AGOQ_PARAM_IB_GID_INDEX);
  static const int families[] = {AF_INET, AF_INET6, AF_UNSPEC};
  p->family = families[agoq_param_int(AGOQ_PARAM_IB_ADDR_FAMILY)];
  p->roce_version = (int)agoq_param_int(AGOQ_PARAM_IB_ROCE_VERSION);
}

/* Considers one port; adds it to st when usable. Returns true when it was added. */
static bool agoq_ib_port_consider(agoq_ib_state* st, const agoq_ib_hca_filter* filter, const agoq_ib_reporter* r,
                                  struct agoq_ibv_context* ctx, const struct agoq_ibv_device_attr* dattr,
                                  const char* name, int port, agoq_ib_gid_entry* gids) {
  struct agoq_ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  int rc = st->api.query_port(ctx, (uint8_t)port, &pa);
  if (rc != 0) {
    agoq_ib_say(r, "%s:%d not used: ibv_query_port failed: %s", name, port, strerror(rc));
    return false;
  }
  agoq_ib_port_info info = {.port = port, .state = pa.state, .link_layer = pa.link_layer,
                            .active_mtu = pa.active_mtu, .active_width = pa.active_width,
                            .active_speed = pa.active_speed, .lid = pa.lid,
                            .sys_image_guid = agoq_be64_to_host(dattr->sys_image_guid), .gids = gids};
  snprintf(info.dev, sizeof info.dev, "%s", name);
  char why[1024];
  if (!agoq_ib_port_usable(&info, why, sizeof why)) {
    agoq_ib_say(r, "%s:%d not used: %s", name, port, why);
    return false;
  }
  char hca[256];
  if (!agoq_ib_hca_filter_describe(filter, name, port, hca, sizeof hca)) {
    agoq_ib_say(r, "%s:%d not used: AGOQ_IB_HCA: %s", name, port, hca);
    return false;
  }
  if (st->ndevs == AGOQ_IB_MAX_DEVS) {
    agoq_ib_say(r, "%s:%d not used: more than %d usable ports", name, port, AGOQ_IB_MAX_DEVS);
    return false;
  }
  info.gid_count = agoq_ib_read_gids(&st->api, ctx, name, port, pa.link_layer, pa.gid_tbl_len, gids);
  int index = -1;
  char table[4096];
  agoq_ib_gid_table_describe(&info, table, sizeof table);
  if (agoq_ib_gid_choose(&info, &st->gid_policy, &index, why, sizeof why) != 0) {
    agoq_ib_say(r, "%s:%d not used: no GID: %s; GID table:\n%s", name, port, why, table);
    return false;
  }
  agoq_ib_dev* d = &st->devs[st->ndevs++];
  memset(d, 0, sizeof *d);
  snprintf(d->dev_name, sizeof d->dev_name, "%s", name);
  d->port = port;
  d->ctx = ctx;
  d->link_layer = pa.link_layer;
  d->active_mtu = pa.active_mtu;
  d->lid = pa.lid;
  d->gid_index = index;
  memcpy(d->gid, gids[index].raw, 16);
  d->guid = info.sys_image_guid;
  d->max_qp = dattr->max_qp;
  d->max_qp_wr = dattr->max_qp_wr;
  d->max_cqe = dattr->max_cqe;
  d->speed_mbps = agoq_ib_speed_mbps(pa.active_speed, 0, pa.active_width);
  bool speed_known = d->speed_mbps > 0;
  d->speed_known = speed_known;
  if (!speed_known) d->speed_mbps = AGOQ_IB_DEFAULT_SPEED_MBPS;
  d->has_pci_path = agoq_ib_sysfs_pci_path(AGOQ_IB_SYSFS_ROOT, name, d->pci_path, sizeof d->pci_path) == 0;
  snprintf(d->describe, sizeof d->describe, "%s:%d", name, port);
  agoq_ib_say(r, "[%d] %s:%d %s, %s %s = %d Mbit/s%s, MTU %d, LID %u, pciPath %s%s%s", st->ndevs - 1, name, port,
              agoq_ib_link_layer_name(pa.link_layer), agoq_ib_width_name(pa.active_width),
              agoq_ib_speed_name(pa.active_speed, 0), d->speed_mbps, speed_known ? "" : " (rate unknown: default)",
              agoq_ib_mtu_bytes(pa.active_mtu), pa.lid, d->has_pci_path ? d->pci_path : "unknown",
              filter->count > 0 ? "; AGOQ_IB_HCA: " : "", filter->count > 0 ? hca : "");
  agoq_ib_say(r, "[%d] %s", st->ndevs - 1, why);
  return true;
}

/* nvidia-peermem (or the older nv_peer_mem) lets ibv_reg_mr take GPU addresses; NCCL checks
 * these files. agoq reaches GPU memory by DMA-BUF only, so this is reported (once, with the
 * first device), not used. */
static const char* agoq_ib_peermem(void) {
  static const char* const files[] = {"/sys/module/nvidia_peermem/version", "/sys/kernel/mm/memory_peers/nv_mem/version",
                                      "/sys/kernel/mm/memory_peers/nv_mem_nc/version"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
    if (access(files[i], F_OK) == 0) return files[i];
  return NULL;
}

/* Whether devices [first, last) (one context) register dma-bufs: NCCL's probe, a
 * registration of fd -1, answers EBADF where the kernel and driver support them and
 * EOPNOTSUPP (or EPROTONOSUPPORT) where they do not. Each answer is said with its reason. */
static void agoq_ib_gdr_probe(agoq_ib_state* st, const agoq_ib_reporter* r, int first, int last) {
  agoq_ib_dev* d0 = &st->devs[first];
  bool dmabuf = false;
  char why[192];
  if (st->api.reg_dmabuf_mr == NULL) {
    snprintf(why, sizeof why, "no DMA-BUF: this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later has it)");
  } else {
    errno = 0;
    struct agoq_ibv_mr* mr = st->api.reg_dmabuf_mr(d0->pd, 0, 0, 0, -1, 0);
    int err = errno;
    if (mr != NULL) st->api.dereg_mr(mr);
    dmabuf = mr == NULL && err != EOPNOTSUPP && err != EPROTONOSUPPORT;
    if (dmabuf)
      snprintf(why, sizeof why, "DMA-BUF (ibv_reg_dmabuf_mr probe: %s): GPU buffers NCCL registers by DMA-BUF are "
                                "written and read by the HCA",
               strerror(err));
    else
      snprintf(why, sizeof why, "no DMA-BUF: ibv_reg_dmabuf_mr answers %s (needs Linux 5.12+ and a driver with "
                                "dma-buf support)",
               strerror(err));
  }
  for (int k = first; k < last; k++) {
    agoq_ib_dev* d = &st->devs[k];
    d->dmabuf = dmabuf;
    snprintf(d->gdr, sizeof d->gdr, "%s", why);
    agoq_ib_say(r, "[%d] GPUDirect: %s", k, d->gdr);
  }
  if (first == 0) {
    const char* peermem = agoq_ib_peermem();
    agoq_ib_say(r, "nvidia-peermem: %s%s", peermem != NULL ? "loaded, " : "not loaded",
                peermem != NULL ? peermem : "");
  }
}

void agoq_ib_release(agoq_ib_state* st) {
  /* Registrations before the protection domains they live in. */
  for (int i = 0; i < st->ndevs; i++) agoq_ib_mr_release_dev(st, &st->devs[i]);
  for (int i = 0; i < st->ndevs; i++) {
    agoq_ib_dev* d = &st->devs[i];
    /* Ports of one device share its context and protection domain: the first owns them. */
    bool first = true;
    for (int k = 0; k < i; k++) first &= st->devs[k].ctx != d->ctx;
    if (!first) continue;
    if (d->pd != NULL) st->api.dealloc_pd(d->pd);
    if (d->ctx != NULL) st->api.close_device(d->ctx);
  }
  st->ndevs = 0;
  if (st->api.handle != NULL) agoq_ibv_api_unload(&st->api);
}

static ncclResult_t agoq_ib_open_ports(agoq_ib_state* st, const agoq_ib_hca_filter* filter,
                                       const agoq_ib_reporter* r, char* why, size_t why_len) {
  int n = 0;
  errno = 0;
  struct agoq_ibv_device** list = st->api.get_device_list(&n);
  if (list == NULL) {
    int err = errno;
    snprintf(why, why_len, "no RDMA device (ibv_get_device_list: %s%s)", strerror(err),
             err == ENOSYS ? ": the kernel has no RDMA support" : "");
    return ncclSystemError;
  }
  agoq_ib_gid_entry* gids = calloc(AGOQ_IB_GID_TABLE_MAX, sizeof *gids);
  if (gids == NULL) {
    st->api.free_device_list(list);
    snprintf(why, why_len, "out of memory");
    return ncclSystemError;
  }
  for (int i = 0; i < n; i++) {
    const char* name = list[i]->name;
    struct agoq_ibv_context* ctx = st->api.open_device(list[i]);
    if (ctx == NULL) {
      agoq_ib_say(r, "%s not used: cannot open it: %s (is /dev/infiniband mapped into the container?)", name,
                  strerror(errno));
      continue;
    }
    struct agoq_ibv_device_attr dattr;
    memset(&dattr, 0, sizeof dattr);
    int rc = st->api.query_device(ctx, &dattr);
    if (rc != 0) agoq_ib_say(r, "%s not used: ibv_query_device failed: %s", name, strerror(rc));
    int used = 0;
    for (int p = 1; rc == 0 && p <= dattr.phys_port_cnt; p++)
      used += agoq_ib_port_consider(st, filter, r, ctx, &dattr, name, p, gids);
    if (used == 0) {
      st->api.close_device(ctx);
      continue;
    }
    struct agoq_ibv_pd* pd = st->api.alloc_pd(ctx);
    if (pd == NULL) agoq_ib_say(r, "%s not used: ibv_alloc_pd failed: %s", name, strerror(errno));
    for (int k = st->ndevs - used; k < st->ndevs; k++) st->devs[k].pd = pd;
    if (pd == NULL) {
      st->ndevs -= used;
      st->api.close_device(ctx);
      continue;
    }
    agoq_ib_gdr_probe(st, r, st->ndevs - used, st->ndevs);
  }
  free(gids);
  st->api.free_device_list(list);
  if (st->ndevs == 0) {
    snprintf(why, why_len, "%d RDMA device%s, no usable port (INFO lists each port and why)", n, n == 1 ? "" : "s");
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t agoq_ib_discover(agoq_ib_state* st, agoq_ib_report_fn report, void* report_arg, char* why,
                              size_t why_len) {
  agoq_ib_reporter r = {report, report_arg};
  memset(st, 0, sizeof *st);
  st->tc = (int)agoq_param_int(AGOQ_PARAM_IB_TC);
  st->sl = (int)agoq_param_int(AGOQ_PARAM_IB_SL);
  st->timeout = (int)agoq_param_int(AGOQ_PARAM_IB_TIMEOUT);
  st->retry_cnt = (int)agoq_param_int(AGOQ_PARAM_IB_RETRY_CNT);
  st->nqps = (int)agoq_param_int(AGOQ_PARAM_IB_QPS_PER_CONNECTION);
  st->answer_timeout_ms = agoq_param_int(AGOQ_PARAM_TIMEOUT_S) * 1000;
  agoq_ib_gid_policy_load(&st->gid_policy);
  agoq_ib_hca_filter filter;
  char err[256];
  if (agoq_ib_hca_filter_parse(agoq_param_str(AGOQ_PARAM_IB_HCA), &filter, err, sizeof err) != 0) {
    snprintf(why, why_len, "%s=\"%s\": %s", agoq_param_source(AGOQ_PARAM_IB_HCA), agoq_param_str(AGOQ_PARAM_IB_HCA),
             err);
    return ncclInvalidArgument;
  }
  int rc = agoq_ibv_api_load(agoq_param_str(AGOQ_PARAM_IB_LIBRARY), &st->api, err, sizeof err);
  if (rc != 0) {
    snprintf(why, why_len, "%s", err);
    return ncclSystemError;
  }
  ncclResult_t res = agoq_ib_open_ports(st, &filter, &r, why, why_len);
  if (res != ncclSuccess) {
    agoq_ib_release(st);
    return res;
  }
  struct rlimit lim;
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < (64ull << 20))
    agoq_ib_say(&r, "RLIMIT_MEMLOCK is %llu KiB: registering more than that fails with ENOMEM (raise it with "
                    "ulimit -l, or --ulimit memlock=-1 in a container)",
                (unsigned long long)(lim.rlim_cur >> 10));
  return ncclSuccess;
}

/* The unload: NCCL dlcloses the plugin when its last communicator goes (v6..v10 have no
 * finalize to tell us first), so no thread may run our code after it; the verbs contexts
 * (and the library) go with the plugin, so a plugin loaded again starts from nothing. */
__attribute__((destructor)) static void agoq_ib_unload(void) {
  agoq_ib_helper_shutdown();
  agoq_ib_release(&agoq_ib);
}

/* ---- the interface table -------------------------------------------------------------- */

static ncclResult_t agoq_ib_init(void) {
  /* agoq_transport_choose discovers the ports (and the TCP bootstrap) before choosing this
   * table; init only confirms it. */
  return agoq_ib.ndevs > 0 ? ncclSuccess : ncclInternalError;
}

/* The progress helper stops with the last connection; bootstrap connections are TCP
 * connections, whose helpers the TCP transport stops. */
static void agoq_ib_idle(void) {
  agoq_ib_helper_stop_when_idle();
  agoq_transport_tcp.idle();
}

static int agoq_ib_ndevs(void) { return agoq_ib.ndevs; }
static int agoq_ib_helper_count(void) { return agoq_ib_helper_threads(); }

static ncclResult_t agoq_ib_get_properties(int dev, agoq_tp_props* p) {
  if (p == NULL || dev < 0 || dev >= agoq_ib.ndevs) {
    AGOQ_WARN("getProperties: invalid device %d (have %d)", dev, agoq_ib.ndevs);
    return ncclInternalError;
  }
  const agoq_ib_dev* d = &agoq_ib.devs[dev];
  agoq_tp_props_defaults(p, dev);
  p->name = d->dev_name;
  p->pci_path = d->has_pci_path ? d->pci_path : NULL;
  p->guid = d->guid;
  p->speed_mbps = d->speed_mbps;
  p->speed_known = d->speed_known;
  p->port = d->port;
  p->max_comms = d->max_qp / agoq_ib.nqps > 0 ? d->max_qp / agoq_ib.nqps : 1;
  /* The net core keeps it only where it can handle GPU buffers at all (agoq_net_get_properties). */
  if (d->dmabuf) p->ptr_support |= NCCL_PTR_DMABUF;
  return ncclSuccess;
}

static bool agoq_ib_placement_cpus(int dev, cpu_set_t* out) {
  (void)dev;
  (void)out;
  return false;
}

static void agoq_ib_set_match(agoq_tp_conn* c, agoq_tp_match_fn fn, void* arg) {
  agoq_ib_conn* ic = (agoq_ib_conn*)c;
  ic->match = fn;
  ic->match_arg = arg;
}

/* Completions are polled: no descriptor announces them (a completion channel would, at
 * the cost of an interrupt per event). */
static int agoq_ib_wait_fds(agoq_tp_conn* c, struct pollfd* out, int max, bool* hidden) {
  (void)c;
  (void)out;
  (void)max;
  *hidden = true;
  return 0;
}

static ncclResult_t agoq_ib_error(agoq_tp_conn* c) { return (ncclResult_t)atomic_load(&((agoq_ib_conn*)c)->error); }
static void agoq_ib_fail(agoq_tp_conn* c, ncclResult_t res) { agoq_ib_conn_fail((agoq_ib_conn*)c, res); }
static const char* agoq_ib_peer(agoq_tp_conn* c) { return ((agoq_ib_conn*)c)->peer; }
static void agoq_ib_close(agoq_tp_conn* c) { agoq_ib_conn_destroy((agoq_ib_conn*)c); }

const agoq_transport agoq_transport_ib = {
    .name = "ib",
    .init = agoq_ib_init,
    .idle = agoq_ib_idle,
    .ndevs = agoq_ib_ndevs,
    .helper_threads = agoq_ib_helper_count,
    .get_properties = agoq_ib_get_properties,
    .placement_cpus = agoq_ib_placement_cpus,
    .listen = agoq_ib_listen,
    .accept = agoq_ib_accept,
    .close_listen = agoq_ib_close_listen,
    .connect = agoq_ib_connect,
    .connect_abort = agoq_ib_connect_abort,
    .conn_fds = agoq_ib_conn_fds,
    .set_match = agoq_ib_set_match,
    .post_send = agoq_ib_post_send,
    .post_recv = agoq_ib_post_recv,
    .progress = agoq_ib_progress,
    .done = agoq_ib_done,
    .wait_fds = agoq_ib_wait_fds,
    .error = agoq_ib_error,
    .fail = agoq_ib_fail,
    .peer = agoq_ib_peer,
    .close = agoq_ib_close,
    .reg = agoq_ib_reg_key,
    .reg_dmabuf = agoq_ib_reg_dmabuf_key,
    .dereg = agoq_ib_dereg_key,
    .exchange = NULL,
};
