/*
 * Devices, contexts, queries and asynchronous events.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "emu.h"

EMU_EXPORT struct agoq_ibv_device** ibv_get_device_list(int* num) {
  emu_fault_sync_env();
  pthread_mutex_lock(&emu_g.lock);
  int nodev = emu_g.f_nodev;
  pthread_mutex_unlock(&emu_g.lock);
  if (num) *num = 0;
  if (nodev) { /* libibverbs on a kernel without RDMA: find_sysfs_devs fails with ENOSYS */
    errno = ENOSYS;
    return NULL;
  }
  emu_dev_cfg* cfg = calloc(EMU_MAX_DEV, sizeof *cfg);
  if (!cfg) {
    errno = ENOMEM;
    return NULL;
  }
  int n = 0;
  int rc = emu_fixture_load(cfg, &n);
  if (rc) {
    free(cfg);
    errno = rc;
    return NULL;
  }
  /* one block: the NULL-terminated pointer array, then the devices */
  size_t head = sizeof(struct agoq_ibv_device*) * (size_t)(n + 1);
  head = (head + 63) & ~(size_t)63;
  char* block = calloc(1, head + sizeof(emu_device) * (size_t)n);
  if (!block) {
    free(cfg);
    errno = ENOMEM;
    return NULL;
  }
  struct agoq_ibv_device** list = (struct agoq_ibv_device**)block;
  emu_device* devs = (emu_device*)(block + head);
  for (int i = 0; i < n; i++) {
    devs[i].cfg = cfg[i];
    devs[i].ibv.node_type = AGOQ_IBV_NODE_CA;
    devs[i].ibv.transport_type = AGOQ_IBV_TRANSPORT_IB;
    snprintf(devs[i].ibv.name, sizeof devs[i].ibv.name, "%s", cfg[i].name);
    snprintf(devs[i].ibv.dev_name, sizeof devs[i].ibv.dev_name, "uverbs%d", i);
    snprintf(devs[i].ibv.dev_path, sizeof devs[i].ibv.dev_path, "/sys/class/infiniband_verbs/uverbs%d", i);
    snprintf(devs[i].ibv.ibdev_path, sizeof devs[i].ibv.ibdev_path, "/sys/class/infiniband/%s", cfg[i].name);
    list[i] = &devs[i].ibv;
  }
  list[n] = NULL;
  free(cfg);
  if (num) *num = n;
  return list;
}

EMU_EXPORT void ibv_free_device_list(struct agoq_ibv_device** list) { free(list); }

EMU_EXPORT struct agoq_ibv_context* ibv_open_device(struct agoq_ibv_device* dev) {
  if (!dev) {
    errno = EINVAL;
    return NULL;
  }
  emu_fault_sync_env();
  emu_ctx* ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    errno = ENOMEM;
    return NULL;
  }
  memcpy(&ctx->dev, (emu_device*)dev, sizeof ctx->dev);
  for (int p = 0; p < ctx->dev.cfg.nports; p++) ctx->port_state[p + 1] = ctx->dev.cfg.ports[p].state;
  ctx->listen_fd = -1;
  ctx->wake_fd = -1;
  ctx->ibv.async_fd = -1;
  int err = 0;
  char* dir = ctx->dir;
  if ((err = emu_fabric_dir(ctx->dir, sizeof ctx->dir))) goto fail;
  ctx->time_scale = emu_time_scale();
  pthread_mutex_lock(&emu_g.lock);
  unsigned k = emu_g.ctx_counter++;
  pthread_mutex_unlock(&emu_g.lock);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int len = snprintf(ctx->sock_path, sizeof ctx->sock_path, "%s/ctx-%d-%u.sock", dir, (int)getpid(), k);
  if (len < 0 || (size_t)len >= sizeof ctx->sock_path) {
    err = ENAMETOOLONG;
    goto fail;
  }
  memcpy(sa.sun_path, ctx->sock_path, (size_t)len + 1);
  ctx->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  /* async_fd: readable while an event is queued, one read per event (EFD_SEMAPHORE) */
  ctx->ibv.async_fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
  ctx->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (ctx->wake_fd < 0 || ctx->ibv.async_fd < 0 || ctx->listen_fd < 0) {
    err = errno;
    goto fail;
  }
  unlink(ctx->sock_path);
  if (bind(ctx->listen_fd, (struct sockaddr*)&sa, sizeof sa) || listen(ctx->listen_fd, 128)) {
    err = errno;
    unlink(ctx->sock_path);
    goto fail;
  }
  ctx->ibv.device = &ctx->dev.ibv;
  ctx->ibv.cmd_fd = -1;
  ctx->ibv.num_comp_vectors = 1;
  pthread_mutex_init(&ctx->ibv.mutex, NULL);
  ctx->ibv.ops.poll_cq = emu_cq_poll;
  ctx->ibv.ops.post_send = emu_post_send;
  ctx->ibv.ops.post_recv = emu_post_recv;
  pthread_mutex_init(&ctx->lock, NULL);
  ctx->next_handle = 1;
  if ((err = pthread_create(&ctx->nic, NULL, emu_nic_main, ctx))) {
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&ctx->ibv.mutex);
    unlink(ctx->sock_path);
    goto fail;
  }
  ctx->nic_started = 1;
  return &ctx->ibv;
fail:
  if (ctx->listen_fd >= 0) close(ctx->listen_fd);
  if (ctx->wake_fd >= 0) close(ctx->wake_fd);
  if (ctx->ibv.async_fd >= 0) close(ctx->ibv.async_fd);
  free(ctx);
  errno = err ? err : EINVAL;
  return NULL;
}

/* Closes everything the application left open, as the kernel does at close. */
EMU_EXPORT int ibv_close_device(struct agoq_ibv_context* ibctx) {
  if (!ibctx) {
    errno = EINVAL;
    return -1;
  }
  emu_ctx* ctx = (emu_ctx*)ibctx;
  pthread_mutex_lock(&ctx->lock);
  ctx->stop = 1;
  pthread_mutex_unlock(&ctx->lock);
  emu_wake(ctx);
  if (ctx->nic_started) pthread_join(ctx->nic, NULL);
  emu_conn_free_all(ctx);
  emu_qp_free_all(ctx);
  emu_cq_free_all(ctx);
  emu_mem_free_all(ctx);
  while (ctx->aq_head) {
    emu_async* a = ctx->aq_head;
    ctx->aq_head = a->next;
    free(a);
  }
  close(ctx->listen_fd);
  unlink(ctx->sock_path);
  close(ctx->wake_fd);
  close(ctx->ibv.async_fd);
  pthread_mutex_destroy(&ctx->lock);
  pthread_mutex_destroy(&ctx->ibv.mutex);
  free(ctx);
  return 0;
}

void emu_wake(emu_ctx* ctx) {
  uint64_t one = 1;
  ssize_t w = write(ctx->wake_fd, &one, sizeof one); /* EAGAIN: already signalled */
  (void)w;
}

emu_qp* emu_qp_find(emu_ctx* ctx, uint32_t qpn) {
  for (emu_qp* q = ctx->qps; q; q = q->next)
    if (q->ibv.qp_num == qpn) return q;
  return NULL;
}

EMU_EXPORT int ibv_query_device(struct agoq_ibv_context* ibctx, struct agoq_ibv_device_attr* attr) {
  if (!ibctx || !attr) return errno = EINVAL;
  const emu_dev_cfg* c = &((emu_ctx*)ibctx)->dev.cfg;
  memset(attr, 0, sizeof *attr);
  snprintf(attr->fw_ver, sizeof attr->fw_ver, "agoq-ibv-emu 1.0");
  uint64_t be = 0;
  for (int i = 0; i < 8; i++) ((uint8_t*)&be)[i] = (uint8_t)(c->guid >> (56 - 8 * i));
  attr->node_guid = be;
  attr->sys_image_guid = be;
  attr->max_mr_size = ~0ull;
  attr->page_size_cap = 4096;
  attr->vendor_id = 0x02c9;
  attr->vendor_part_id = 0xa2dc;
  attr->max_qp = c->max_qp;
  attr->max_qp_wr = c->max_qp_wr;
  attr->max_sge = EMU_MAX_SGE;
  attr->max_sge_rd = EMU_MAX_SGE;
  attr->max_cq = 1 << 16;
  attr->max_cqe = c->max_cqe;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = EMU_MAX_RD_ATOMIC;
  attr->max_res_rd_atom = EMU_MAX_RD_ATOMIC * c->max_qp;
  attr->max_qp_init_rd_atom = EMU_MAX_RD_ATOMIC;
  attr->max_pkeys = EMU_PKEY_TBL_LEN;
  attr->local_ca_ack_delay = 16;
  attr->phys_port_cnt = (uint8_t)c->nports;
  return 0;
}

static const emu_port_cfg* port_cfg(emu_ctx* ctx, unsigned port) {
  if (port < 1 || port > (unsigned)ctx->dev.cfg.nports) return NULL;
  return &ctx->dev.cfg.ports[port - 1];
}

/* The exported ibv_query_port (IBVERBS_1.1) writes the compat part of the struct only,
 * up to link_layer (AGOQ_IBV_PORT_ATTR_COMPAT_SIZE bytes); returns 0 or an errno. */
EMU_EXPORT int ibv_query_port(struct agoq_ibv_context* ibctx, uint8_t port, struct agoq_ibv_port_attr* out) {
  if (!ibctx || !out) return errno = EINVAL;
  emu_ctx* ctx = (emu_ctx*)ibctx;
  const emu_port_cfg* p = port_cfg(ctx, port);
  if (!p) return errno = EINVAL;
  struct agoq_ibv_port_attr a;
  memset(&a, 0, sizeof a);
  pthread_mutex_lock(&ctx->lock);
  a.state = ctx->port_state[port];
  pthread_mutex_unlock(&ctx->lock);
  a.max_mtu = p->mtu;
  a.active_mtu = p->mtu;
  a.gid_tbl_len = p->ngid;
  a.port_cap_flags = p->link == AGOQ_IBV_LINK_LAYER_ETHERNET ? 0x04010000u : 0x02514868u;
  a.max_msg_sz = 0x40000000u;
  a.pkey_tbl_len = EMU_PKEY_TBL_LEN;
  a.lid = p->lid;
  a.sm_lid = p->link == AGOQ_IBV_LINK_LAYER_ETHERNET ? 0 : 1;
  a.max_vl_num = 4;
  a.subnet_timeout = 18;
  a.active_width = (uint8_t)p->width;
  a.active_speed = (uint8_t)p->speed;
  a.phys_state = a.state == AGOQ_IBV_PORT_ACTIVE ? 5 /* LinkUp */ : 3 /* Disabled */;
  a.link_layer = (uint8_t)p->link;
  memcpy(out, &a, AGOQ_IBV_PORT_ATTR_COMPAT_SIZE);
  return 0;
}

/* ibv_query_gid(3): 0, or -1 with errno. It returns the GID even where the type is not
 * readable (the GID table itself is readable in containers; only gid_attrs/types is not). */
EMU_EXPORT int ibv_query_gid(struct agoq_ibv_context* ibctx, uint8_t port, int index, agoq_ibv_gid* gid) {
  const emu_port_cfg* p = ibctx ? port_cfg((emu_ctx*)ibctx, port) : NULL;
  if (!p || !gid || index < 0 || index >= p->ngid) {
    errno = EINVAL;
    return -1;
  }
  *gid = p->gids[index].gid;
  return 0;
}

/* ibv_query_gid_ex(3): 0 or an errno. flags must be 0; an empty entry is ENODATA; a type
 * the emulated sysfs cannot read is EINVAL. */
EMU_EXPORT int _ibv_query_gid_ex(struct agoq_ibv_context* ibctx, uint32_t port, uint32_t index,
                                 struct agoq_ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  const emu_port_cfg* p = ibctx && port <= 255 ? port_cfg((emu_ctx*)ibctx, port) : NULL;
  if (!p || !entry || flags || entry_size < sizeof *entry || index >= (uint32_t)p->ngid) return errno = EINVAL;
  const emu_gid* g = &p->gids[index];
  static const uint8_t zero[16];
  if (!memcmp(g->gid.raw, zero, 16)) return errno = ENODATA;
  if (g->unreadable) return errno = EINVAL;
  memset(entry, 0, sizeof *entry);
  entry->gid = g->gid;
  entry->gid_index = index;
  entry->port_num = port;
  entry->gid_type = (uint32_t)g->type;
  entry->ndev_ifindex = p->link == AGOQ_IBV_LINK_LAYER_ETHERNET ? 2 : 0;
  return 0;
}

/* ---- asynchronous events ------------------------------------------------------------ */

void emu_async_push(emu_ctx* ctx, int type, void* element, int port) {
  emu_async* a = calloc(1, sizeof *a);
  if (!a) return;
  a->ev.event_type = type;
  if (type == AGOQ_IBV_EVENT_PORT_ERR || type == AGOQ_IBV_EVENT_PORT_ACTIVE)
    a->ev.element.port_num = port;
  else
    a->ev.element.cq = element; /* the union's pointer members alias */
  if (ctx->aq_tail)
    ctx->aq_tail->next = a;
  else
    ctx->aq_head = a;
  ctx->aq_tail = a;
  uint64_t one = 1;
  ssize_t w = write(ctx->ibv.async_fd, &one, sizeof one);
  (void)w;
}

/* Blocks until an event is queued, as the real one does (unless async_fd was made
 * non-blocking: then -1 with EAGAIN). */
EMU_EXPORT int ibv_get_async_event(struct agoq_ibv_context* ibctx, struct agoq_ibv_async_event* ev) {
  if (!ibctx || !ev) {
    errno = EINVAL;
    return -1;
  }
  emu_ctx* ctx = (emu_ctx*)ibctx;
  uint64_t v;
  if (read(ctx->ibv.async_fd, &v, sizeof v) != (ssize_t)sizeof v) return -1;
  pthread_mutex_lock(&ctx->lock);
  emu_async* a = ctx->aq_head;
  if (a) {
    ctx->aq_head = a->next;
    if (!ctx->aq_head) ctx->aq_tail = NULL;
  }
  pthread_mutex_unlock(&ctx->lock);
  if (!a) {
    errno = EAGAIN;
    return -1;
  }
  *ev = a->ev;
  free(a);
  return 0;
}

EMU_EXPORT void ibv_ack_async_event(struct agoq_ibv_async_event* ev) { (void)ev; }

EMU_EXPORT const char* ibv_event_type_str(int event) {
  static const char* const names[] = {
      "CQ error",           "local work queue catastrophic error",
      "invalid request local work queue error", "local access violation work queue error",
      "communication established", "send queue drained",
      "path migrated",      "path migration request error",
      "local catastrophic error", "port active",
      "port error",         "LID change",
      "P_Key change",       "SM change",
      "SRQ catastrophic error", "SRQ limit reached",
      "last WQE reached",   "client reregistration",
      "GID table change",   "WQ fatal"};
  if (event < 0 || event >= (int)(sizeof names / sizeof names[0])) return "unknown";
  return names[event];
}

EMU_EXPORT const char* ibv_wc_status_str(int status) {
  static const char* const names[] = {"success",
                                      "local length error",
                                      "local QP operation error",
                                      "local EE context operation error",
                                      "local protection error",
                                      "Work Request Flushed Error",
                                      "memory management operation error",
                                      "bad response error",
                                      "local access error",
                                      "remote invalid request error",
                                      "remote access error",
                                      "remote operation error",
                                      "transport retry counter exceeded",
                                      "RNR retry counter exceeded",
                                      "local RDD violation error",
                                      "remote invalid RD request",
                                      "operation aborted",
                                      "invalid EE context number",
                                      "invalid EE context state",
                                      "fatal error",
                                      "response timeout error",
                                      "general error",
                                      "TM error",
                                      "TM rendezvous pending"};
  if (status < 0 || status >= (int)(sizeof names / sizeof names[0])) return "unknown";
  return names[status];
}

/* Nothing to do: the emulator never maps memory for DMA. */
EMU_EXPORT int ibv_fork_init(void) { return 0; }

/* ---- control API: device events and port state ----------------------------------------- */

/* Raises an unaffiliated device event, as the driver does: IBV_EVENT_DEVICE_FATAL, or a
 * LID, P_Key, SM or GID table change or client reregistration (port-scoped: port names
 * it). Only the event: what a device does after a catastrophic error is undefined (it may
 * complete nothing more), so nothing here pretends to know. 0 or an errno. */
EMU_EXPORT int agoq_ibv_emu_device_event(struct agoq_ibv_context* ibctx, int type, uint8_t port) {
  emu_ctx* ctx = (emu_ctx*)ibctx;
  int port_scoped = type == AGOQ_IBV_EVENT_LID_CHANGE || type == AGOQ_IBV_EVENT_PKEY_CHANGE ||
                     type == AGOQ_IBV_EVENT_SM_CHANGE || type == AGOQ_IBV_EVENT_CLIENT_REREGISTER ||
                     type == AGOQ_IBV_EVENT_GID_CHANGE;
  if (!ctx || (type != AGOQ_IBV_EVENT_DEVICE_FATAL && !port_scoped) || (port_scoped && !port_cfg(ctx, port)))
    return EINVAL;
  pthread_mutex_lock(&ctx->lock);
  emu_async_push(ctx, type, NULL, port_scoped ? port : 0);
  pthread_mutex_unlock(&ctx->lock);
  emu_wake(ctx);
  return 0;
}

/* Sets a port's state as a cable pull or an SM would: DOWN raises IBV_EVENT_PORT_ERR and
 * moves the port's QPs to ERR; ACTIVE raises IBV_EVENT_PORT_ACTIVE. 0 or an errno. */
EMU_EXPORT int agoq_ibv_emu_port_set_state(struct agoq_ibv_context* ibctx, uint8_t port, int state) {
  emu_ctx* ctx = (emu_ctx*)ibctx;
  if (!ctx || !port_cfg(ctx, port) || state < AGOQ_IBV_PORT_DOWN || state > AGOQ_IBV_PORT_ACTIVE_DEFER)
    return EINVAL;
  pthread_mutex_lock(&ctx->lock);
  int was = ctx->port_state[port];
  ctx->port_state[port] = state;
  if (was == AGOQ_IBV_PORT_ACTIVE && state != AGOQ_IBV_PORT_ACTIVE) {
    emu_async_push(ctx, AGOQ_IBV_EVENT_PORT_ERR, NULL, port);
  } else if (was != AGOQ_IBV_PORT_ACTIVE && state == AGOQ_IBV_PORT_ACTIVE) {
    emu_async_push(ctx, AGOQ_IBV_EVENT_PORT_ACTIVE, NULL, port);
  }
  pthread_mutex_unlock(&ctx->lock);
  emu_wake(ctx);
  return 0;
}
