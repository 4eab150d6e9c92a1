/*
 * The soft-RC emulator, loaded exactly as production loads libibverbs (agoq_ibv_api_load:
 * dlopen + dlvsym with versions), driven through the same data path (ctx->ops).
 * Two contexts of one process play two hosts; fork_write_imm uses two processes.
 * Usage: test_ibv_emu [case]   (CTest runs one case per test, each in its own fabric dir)
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/ib/agoq_ibv_load.h"

static agoq_ibv_api api;
static int (*emu_fault_set)(const char*);
static int (*emu_fabric_dir)(char*, size_t);
static int (*emu_port_set_state)(struct agoq_ibv_context*, uint8_t, int);

/* ---- helpers ------------------------------------------------------------------------ */

typedef struct host {
  struct agoq_ibv_context* ctx;
  struct agoq_ibv_pd* pd;
  struct agoq_ibv_cq* cq;
  struct agoq_ibv_qp* qp;
  struct agoq_ibv_mr* mr;
  uint8_t* buf;
  size_t len;
  int port, link;
  uint16_t lid;
  int sgid; /* RoCE: the GID index this host uses */
} host;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void tiny_sleep(void) {
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

static void use_fixture(const char* name) {
  if (name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", AGOQ_IBV_EMU_FIXTURES, name);
    setenv("AGOQ_IBV_EMU_FIXTURE", path, 1);
  } else {
    unsetenv("AGOQ_IBV_EMU_FIXTURE");
  }
}

static struct agoq_ibv_context* open_dev(const char* name) {
  int n = 0;
  struct agoq_ibv_device** list = api.get_device_list(&n);
  assert_non_null(list);
  struct agoq_ibv_context* ctx = NULL;
  for (int i = 0; i < n; i++)
    if (!name || !strcmp(list[i]->name, name)) {
      ctx = api.open_device(list[i]);
      break;
    }
  api.free_device_list(list);
  assert_non_null(ctx);
  return ctx;
}

static void host_open(host* h, const char* dev, int port, int cqe, uint32_t max_send_wr, int mr_access, size_t len) {
  memset(h, 0, sizeof *h);
  h->ctx = open_dev(dev);
  h->port = port;
  struct agoq_ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  assert_int_equal(api.query_port(h->ctx, (uint8_t)port, &pa), 0);
  h->link = pa.link_layer;
  h->lid = pa.lid;
  h->sgid = h->link == AGOQ_IBV_LINK_LAYER_ETHERNET ? 3 : -1;
  h->pd = api.alloc_pd(h->ctx);
  assert_non_null(h->pd);
  h->cq = api.create_cq(h->ctx, cqe, NULL, NULL, 0);
  assert_non_null(h->cq);
  assert_int_equal(h->cq->cqe, cqe);
  struct agoq_ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = h->cq;
  ia.recv_cq = h->cq;
  ia.qp_type = AGOQ_IBV_QPT_RC;
  ia.cap.max_send_wr = max_send_wr;
  ia.cap.max_recv_wr = 128;
  ia.cap.max_send_sge = 2;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = 64;
  h->qp = api.create_qp(h->pd, &ia);
  assert_non_null(h->qp);
  assert_int_equal(h->qp->state, AGOQ_IBV_QPS_RESET);
  assert_true(h->qp->qp_num >= 1 && h->qp->qp_num <= 0xFFFFFF);
  h->len = len;
  h->buf = calloc(1, len);
  assert_non_null(h->buf);
  h->mr = api.reg_mr(h->pd, h->buf, len, mr_access);
  assert_non_null(h->mr);
  assert_int_not_equal(h->mr->lkey, h->mr->rkey);
}

static void host_close(host* h) {
  if (h->qp) assert_int_equal(api.destroy_qp(h->qp), 0);
  if (h->mr) assert_int_equal(api.dereg_mr(h->mr), 0);
  assert_int_equal(api.destroy_cq(h->cq), 0);
  assert_int_equal(api.dealloc_pd(h->pd), 0);
  assert_int_equal(api.close_device(h->ctx), 0);
  free(h->buf);
}

enum { ALL_ACCESS = AGOQ_IBV_ACCESS_LOCAL_WRITE | AGOQ_IBV_ACCESS_REMOTE_WRITE | AGOQ_IBV_ACCESS_REMOTE_READ };
enum {
  INIT_MASK = AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_PKEY_INDEX | AGOQ_IBV_QP_PORT | AGOQ_IBV_QP_ACCESS_FLAGS,
  RTR_MASK = AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_AV | AGOQ_IBV_QP_PATH_MTU | AGOQ_IBV_QP_DEST_QPN | AGOQ_IBV_QP_RQ_PSN |
             AGOQ_IBV_QP_MAX_DEST_RD_ATOMIC | AGOQ_IBV_QP_MIN_RNR_TIMER,
  RTS_MASK = AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_SQ_PSN | AGOQ_IBV_QP_TIMEOUT | AGOQ_IBV_QP_RETRY_CNT |
             AGOQ_IBV_QP_RNR_RETRY | AGOQ_IBV_QP_MAX_QP_RD_ATOMIC,
};

static int to_init(host* h, int mask) {
  struct agoq_ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = AGOQ_IBV_QPS_INIT;
  a.port_num = (uint8_t)h->port;
  a.qp_access_flags = ALL_ACCESS;
  return api.modify_qp(h->qp, &a, mask);
}

static void rtr_attr(const host* h, const host* peer, uint32_t dest_qpn, struct agoq_ibv_qp_attr* a) {
  memset(a, 0, sizeof *a);
  a->qp_state = AGOQ_IBV_QPS_RTR;
  a->path_mtu = AGOQ_IBV_MTU_1024;
  a->dest_qp_num = dest_qpn;
  a->max_dest_rd_atomic = 1;
  a->min_rnr_timer = 1;
  a->ah_attr.port_num = (uint8_t)h->port;
  if (h->link == AGOQ_IBV_LINK_LAYER_ETHERNET) {
    a->ah_attr.is_global = 1;
    a->ah_attr.grh.sgid_index = (uint8_t)h->sgid;
    a->ah_attr.grh.hop_limit = 255;
    assert_int_equal(api.query_gid(peer->ctx, (uint8_t)peer->port, peer->sgid, &a->ah_attr.grh.dgid), 0);
  } else {
    a->ah_attr.dlid = peer->lid;
  }
}

static int to_rtr(host* h, const host* peer, uint32_t dest_qpn, int mask) {
  struct agoq_ibv_qp_attr a;
  rtr_attr(h, peer, dest_qpn, &a);
  return api.modify_qp(h->qp, &a, mask);
}

static int to_rts(host* h, uint8_t timeout, uint8_t retry, uint8_t rnr_retry, int mask) {
  struct agoq_ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = AGOQ_IBV_QPS_RTS;
  a.timeout = timeout;
  a.retry_cnt = retry;
  a.rnr_retry = rnr_retry;
  a.max_rd_atomic = 1;
  return api.modify_qp(h->qp, &a, mask);
}

/* Local ACK timeout for traffic that must succeed: 0, no ACK timer at all (IB spec
 * 9.7.6.1.3), so that no success depends on how fast the machine answers: a finite one
 * (55 ms of silence) failed a 64 MiB write under a loaded TSan run. */
#define T_OK 0
/* For cases that pass traffic and then wait for status 12 from a peer that went away:
 * 4.096 us * 2^29 * 8 retries at the tests' time scale (1e-4) is 1.8 s of silence, far
 * above any pause of a loaded sanitizer run before the first part succeeds. Cases whose
 * every WR must fail use small values. */
#define T_LOST 29

static void connect_pair(host* a, host* b, uint8_t timeout, uint8_t rnr_retry) {
  assert_int_equal(to_init(a, INIT_MASK), 0);
  assert_int_equal(to_init(b, INIT_MASK), 0);
  assert_int_equal(to_rtr(a, b, b->qp->qp_num, RTR_MASK), 0);
  assert_int_equal(to_rtr(b, a, a->qp->qp_num, RTR_MASK), 0);
  assert_int_equal(to_rts(a, timeout, 7, rnr_retry, RTS_MASK), 0);
  assert_int_equal(to_rts(b, timeout, 7, rnr_retry, RTS_MASK), 0);
  assert_int_equal(a->qp->state, AGOQ_IBV_QPS_RTS);
}

static void pair_open(host* a, host* b, int cqe, uint32_t sq, uint8_t timeout, uint8_t rnr_retry) {
  host_open(a, NULL, 1, cqe, sq, ALL_ACCESS, 1 << 16);
  host_open(b, NULL, 1, cqe, sq, ALL_ACCESS, 1 << 16);
  connect_pair(a, b, timeout, rnr_retry);
}

/* Polls until n completions arrived (a 300 s guard against a hang; ctest's timeout is
 * longer); returns how many did. */
static int poll_n(struct agoq_ibv_cq* cq, struct agoq_ibv_wc* wc, int n) {
  int got = 0;
  int64_t end = now_ms() + 300000;
  while (got < n && now_ms() < end) {
    int r = agoq_ibv_poll_cq(cq, n - got, wc + got);
    assert_true(r >= 0);
    got += r;
    if (got < n) tiny_sleep();
  }
  return got;
}

static int post_rdma(host* h, uint64_t wr_id, int opcode, size_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
                     uint32_t imm, unsigned flags) {
  struct agoq_ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(h->buf + off), .length = len, .lkey = h->mr->lkey};
  struct agoq_ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = len ? &sge : NULL;
  wr.num_sge = len ? 1 : 0;
  wr.opcode = opcode;
  wr.send_flags = flags;
  wr.imm_data = imm;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  int rc = agoq_ibv_post_send(h->qp, &wr, &bad);
  if (rc) assert_ptr_equal(bad, &wr);
  return rc;
}

static int post_write(host* a, host* b, uint64_t wr_id, size_t off, uint32_t len, int imm, uint32_t imm_data,
                      unsigned flags) {
  return post_rdma(a, wr_id, imm ? AGOQ_IBV_WR_RDMA_WRITE_WITH_IMM : AGOQ_IBV_WR_RDMA_WRITE, off, len,
                   (uint64_t)(uintptr_t)(b->buf + off), b->mr->rkey, imm_data, flags);
}

static int post_recv0(host* h, uint64_t wr_id) {
  struct agoq_ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  return agoq_ibv_post_recv(h->qp, &wr, &bad);
}

static void expect_async(host* h, int type, void* element) {
  struct pollfd p = {.fd = h->ctx->async_fd, .events = POLLIN};
  assert_int_equal(poll(&p, 1, 30000), 1);
  struct agoq_ibv_async_event ev;
  assert_int_equal(api.get_async_event(h->ctx, &ev), 0);
  assert_int_equal(ev.event_type, type);
  if (type == AGOQ_IBV_EVENT_PORT_ERR)
    assert_int_equal(ev.element.port_num, (int)(intptr_t)element);
  else
    assert_ptr_equal(ev.element.cq, element);
  api.ack_async_event(&ev);
}

static void gid_text(const agoq_ibv_gid* g, char* out, size_t len) { inet_ntop(AF_INET6, g->raw, out, (socklen_t)len); }

static void assert_gid(struct agoq_ibv_context* ctx, int port, int index, const char* text, int type) {
  agoq_ibv_gid g;
  char s[64];
  assert_int_equal(api.query_gid(ctx, (uint8_t)port, index, &g), 0);
  gid_text(&g, s, sizeof s);
  assert_string_equal(s, text);
  struct agoq_ibv_gid_entry e;
  int rc = api.query_gid_ex(ctx, (uint32_t)port, (uint32_t)index, &e, 0, sizeof e);
  if (type < 0) {
    assert_int_equal(rc, EINVAL);
  } else {
    assert_int_equal(rc, 0);
    assert_int_equal(e.gid_type, type);
    assert_memory_equal(e.gid.raw, g.raw, 16);
  }
}

/* ---- discovery ------------------------------------------------------------------------ */

static void fixture_default(void** state) {
  (void)state;
  use_fixture(NULL);
  int n = 0;
  struct agoq_ibv_device** list = api.get_device_list(&n);
  assert_non_null(list);
  assert_int_equal(n, 1);
  assert_string_equal(list[0]->name, "emu0");
  assert_null(list[1]);
  struct agoq_ibv_context* ctx = api.open_device(list[0]);
  api.free_device_list(list);
  assert_non_null(ctx);
  assert_string_equal(ctx->device->name, "emu0");
  struct agoq_ibv_device_attr da;
  assert_int_equal(api.query_device(ctx, &da), 0);
  assert_int_equal(da.phys_port_cnt, 1);
  assert_true(da.max_qp > 0 && da.sys_image_guid != 0);
  struct agoq_ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  assert_int_equal(api.query_port(ctx, 1, &pa), 0);
  assert_int_equal(pa.state, AGOQ_IBV_PORT_ACTIVE);
  assert_int_equal(pa.link_layer, AGOQ_IBV_LINK_LAYER_INFINIBAND);
  assert_int_equal(pa.active_width, 2);  /* 4x */
  assert_int_equal(pa.active_speed, 64); /* HDR */
  assert_int_equal(pa.active_mtu, AGOQ_IBV_MTU_4096);
  assert_int_equal(pa.lid, 1);
  assert_int_equal(pa.gid_tbl_len, 1);
  assert_int_equal(api.query_port(ctx, 2, &pa), EINVAL);
  agoq_ibv_gid g;
  assert_int_equal(api.query_gid(ctx, 1, 0, &g), 0);
  assert_int_equal(g.raw[0], 0xfe);
  assert_int_equal(g.raw[1], 0x80);
  assert_true(g.global.interface_id != 0);
  assert_int_equal(api.query_gid(ctx, 1, 1, &g), -1);
  struct agoq_ibv_gid_entry e;
  assert_int_equal(api.query_gid_ex(ctx, 1, 0, &e, 0, sizeof e), 0);
  assert_int_equal(e.gid_type, AGOQ_IBV_GID_TYPE_IB);
  assert_int_equal(api.query_gid_ex(ctx, 1, 0, &e, 1, sizeof e), EINVAL); /* flags must be 0 */
  assert_int_equal(api.close_device(ctx), 0);

  use_fixture("default-ib.txt");
  ctx = open_dev("emu0");
  assert_gid(ctx, 1, 0, "fe80::2:c903:a0:b0c0", AGOQ_IBV_GID_TYPE_IB);
  assert_int_equal(api.close_device(ctx), 0);
  use_fixture(NULL);
}

static void fixture_roce769(void** state) {
  (void)state;
  use_fixture("roce-769.txt");
  struct agoq_ibv_context* ctx = open_dev("mlx5_0");
  struct agoq_ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  assert_int_equal(api.query_port(ctx, 1, &pa), 0);
  assert_int_equal(pa.link_layer, AGOQ_IBV_LINK_LAYER_ETHERNET);
  assert_int_equal(pa.active_mtu, AGOQ_IBV_MTU_1024);
  assert_int_equal(pa.active_speed, 32); /* EDR */
  assert_int_equal(pa.gid_tbl_len, 4);
  assert_gid(ctx, 1, 0, "fe80::e42:a1ff:feaa:bbcc", AGOQ_IBV_GID_TYPE_ROCE_V1);
  assert_gid(ctx, 1, 1, "fe80::e42:a1ff:feaa:bbcc", AGOQ_IBV_GID_TYPE_ROCE_V2);
  assert_gid(ctx, 1, 2, "::ffff:10.1.0.5", AGOQ_IBV_GID_TYPE_ROCE_V1);
  assert_gid(ctx, 1, 3, "::ffff:10.1.0.5", AGOQ_IBV_GID_TYPE_ROCE_V2);
  assert_int_equal(api.close_device(ctx), 0);
  use_fixture(NULL);
}

static void fixture_container(void** state) {
  (void)state;
  use_fixture("roce-container-1573.txt");
  struct agoq_ibv_context* ctx = open_dev("mlx5_0");
  assert_gid(ctx, 1, 0, "fe80::e42:a1ff:fedd:eeff", -1);
  assert_gid(ctx, 1, 1, "::ffff:192.168.7.21", -1);
  assert_int_equal(api.close_device(ctx), 0);
  use_fixture(NULL);
}

static void fixture_mixed(void** state) {
  (void)state;
  use_fixture("mixed-2dev.txt");
  int n = 0;
  struct agoq_ibv_device** list = api.get_device_list(&n);
  assert_non_null(list);
  assert_int_equal(n, 3);
  assert_string_equal(list[0]->name, "mlx5_0");
  assert_string_equal(list[1]->name, "mlx5_1");
  assert_string_equal(list[2]->name, "mlx5_11");
  api.free_device_list(list);
  struct agoq_ibv_context* ctx = open_dev("mlx5_0");
  struct agoq_ibv_device_attr da;
  assert_int_equal(api.query_device(ctx, &da), 0);
  assert_int_equal(da.phys_port_cnt, 2);
  assert_int_equal(da.max_qp, 256);
  struct agoq_ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  assert_int_equal(api.query_port(ctx, 1, &pa), 0);
  assert_int_equal(pa.state, AGOQ_IBV_PORT_ACTIVE);
  assert_int_equal(pa.lid, 7);
  assert_int_equal(pa.active_speed, 128); /* NDR */
  assert_int_equal(api.query_port(ctx, 2, &pa), 0);
  assert_int_equal(pa.state, AGOQ_IBV_PORT_DOWN);
  assert_int_equal(pa.lid, 8);
  /* dmabuf=no: the probe plugins use (fd -1) says "not supported" */
  struct agoq_ibv_pd* pd = api.alloc_pd(ctx);
  errno = 0;
  assert_null(api.reg_dmabuf_mr(pd, 0, 4096, 0x1000, -1, AGOQ_IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, EOPNOTSUPP);
  assert_int_equal(api.dealloc_pd(pd), 0);
  assert_int_equal(api.close_device(ctx), 0);
  ctx = open_dev("mlx5_1");
  memset(&pa, 0, sizeof pa);
  assert_int_equal(api.query_port(ctx, 1, &pa), 0);
  assert_int_equal(pa.link_layer, AGOQ_IBV_LINK_LAYER_ETHERNET);
  assert_gid(ctx, 1, 3, "2001:db8:10::5", AGOQ_IBV_GID_TYPE_ROCE_V2);
  assert_gid(ctx, 1, 0, "fe80::e42:a1ff:fe00:200", AGOQ_IBV_GID_TYPE_ROCE_V1);
  assert_int_equal(api.close_device(ctx), 0);
  ctx = open_dev("mlx5_11");
  assert_int_equal(api.query_port(ctx, 1, &pa), 0);
  assert_int_equal(pa.lid, 12);
  assert_int_equal(api.close_device(ctx), 0);

  /* a QP cannot be bound to a DOWN port */
  host h;
  host_open(&h, "mlx5_0", 1, 4, 4, ALL_ACCESS, 4096);
  h.port = 2;
  assert_int_equal(to_init(&h, INIT_MASK), EINVAL);
  h.port = 1;
  assert_int_equal(to_init(&h, INIT_MASK), 0);
  host_close(&h);
  use_fixture(NULL);
}

static void fixture_nodev(void** state) {
  (void)state;
  use_fixture(NULL);
  setenv("AGOQ_IBV_EMU_FAULT", "nodev", 1);
  errno = 0;
  int n = 7;
  assert_null(api.get_device_list(&n));
  assert_int_equal(errno, ENOSYS);
  unsetenv("AGOQ_IBV_EMU_FAULT");
  struct agoq_ibv_device** list = api.get_device_list(&n);
  assert_non_null(list);
  api.free_device_list(list);
  assert_int_equal(emu_fault_set("nodev"), 0);
  errno = 0;
  assert_null(api.get_device_list(&n));
  assert_int_equal(errno, ENOSYS);
  assert_int_equal(emu_fault_set("no_such_fault"), -1);
  assert_int_equal(emu_fault_set("wc=7@1"), -1); /* not a status the emulator produces */
  assert_int_equal(emu_fault_set("wc=12@0"), -1);
  assert_int_equal(emu_fault_set(""), 0);
  list = api.get_device_list(&n);
  assert_non_null(list);
  api.free_device_list(list);
}

static void expect_malformed(const char* text, const char* message) {
  char dir[400], path[512], errpath[512];
  assert_int_equal(emu_fabric_dir(dir, sizeof dir), 0);
  snprintf(path, sizeof path, "%s/bad-fixture.txt", dir);
  snprintf(errpath, sizeof errpath, "%s/stderr.txt", dir);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  setenv("AGOQ_IBV_EMU_FIXTURE", path, 1);
  fflush(stderr);
  int saved = dup(2);
  int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  close(fd);
  errno = 0;
  struct agoq_ibv_device** list = api.get_device_list(NULL);
  int err = errno;
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  assert_null(list);
  assert_int_equal(err, EINVAL);
  char got[512] = {0}, want[700];
  f = fopen(errpath, "r");
  assert_non_null(f);
  assert_non_null(fgets(got, sizeof got, f));
  assert_null(fgets(want, sizeof want, f)); /* exactly one line */
  fclose(f);
  snprintf(want, sizeof want, "agoq-ibv-emu: %s:%s\n", path, message);
  assert_string_equal(got, want);
}

static void fixture_malformed(void** state) {
  (void)state;
  expect_malformed("port 1\n", "1: port before any device");
  expect_malformed("# ok\ndevice d0\nport 1 speed=warp\n", "3: bad speed 'warp'");
  expect_malformed("device d0\nport 1\ngid 0 not-an-address\n", "3: gid: bad address 'not-an-address'");
  expect_malformed("device d0\nport 2\n", "2: port 2: ports must be numbered 1, 2, ... in order");
  expect_malformed("device d0\nport 1 link=eth\ngid 0 ::ffff:1.2.3.4 type=roce-v3\n", "3: gid: bad 'type=roce-v3'");
  expect_malformed("frobnicate\n", "1: unknown directive 'frobnicate'");
  use_fixture(NULL);
}

/* ---- the QP state machine --------------------------------------------------------------- */

static void qp_transitions(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  host_open(&a, NULL, 1, 16, 16, ALL_ACCESS, 4096);
  host_open(&b, NULL, 1, 16, 16, ALL_ACCESS, 4096);
  /* skipping INIT, or RESET -> RTS */
  assert_int_equal(to_rtr(&a, &b, b.qp->qp_num, RTR_MASK), EINVAL);
  assert_int_equal(to_rts(&a, 14, 7, 7, RTS_MASK), EINVAL);
  /* RESET -> INIT: each required attribute missing; one not allowed */
  const int init_req[] = {AGOQ_IBV_QP_PKEY_INDEX, AGOQ_IBV_QP_PORT, AGOQ_IBV_QP_ACCESS_FLAGS};
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(to_init(&a, INIT_MASK & ~init_req[i]), EINVAL);
    assert_int_equal(a.qp->state, AGOQ_IBV_QPS_RESET);
  }
  assert_int_equal(to_init(&a, INIT_MASK | AGOQ_IBV_QP_PATH_MTU), EINVAL);
  assert_int_equal(to_init(&a, INIT_MASK), 0);
  assert_int_equal(a.qp->state, AGOQ_IBV_QPS_INIT);
  /* INIT -> INIT with an optional subset */
  assert_int_equal(to_init(&a, AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_ACCESS_FLAGS), 0);
  /* INIT -> RTS skips RTR */
  assert_int_equal(to_rts(&a, 14, 7, 7, RTS_MASK), EINVAL);
  const int rtr_req[] = {AGOQ_IBV_QP_AV,          AGOQ_IBV_QP_PATH_MTU,           AGOQ_IBV_QP_DEST_QPN,
                         AGOQ_IBV_QP_RQ_PSN,      AGOQ_IBV_QP_MAX_DEST_RD_ATOMIC, AGOQ_IBV_QP_MIN_RNR_TIMER};
  for (size_t i = 0; i < 6; i++) {
    assert_int_equal(to_rtr(&a, &b, b.qp->qp_num, RTR_MASK & ~rtr_req[i]), EINVAL);
    assert_int_equal(a.qp->state, AGOQ_IBV_QPS_INIT);
  }
  assert_int_equal(to_rtr(&a, &b, b.qp->qp_num, RTR_MASK | AGOQ_IBV_QP_TIMEOUT), EINVAL);
  struct agoq_ibv_qp_attr at;
  rtr_attr(&a, &b, b.qp->qp_num, &at);
  at.path_mtu = 6; /* no such MTU */
  assert_int_equal(api.modify_qp(a.qp, &at, RTR_MASK), EINVAL);
  rtr_attr(&a, &b, b.qp->qp_num, &at);
  at.ah_attr.dlid = 0; /* neither a LID nor a GRH */
  assert_int_equal(api.modify_qp(a.qp, &at, RTR_MASK), EINVAL);
  assert_int_equal(to_rtr(&a, &b, b.qp->qp_num, RTR_MASK | AGOQ_IBV_QP_PKEY_INDEX), 0);
  assert_int_equal(a.qp->state, AGOQ_IBV_QPS_RTR);
  const int rts_req[] = {AGOQ_IBV_QP_SQ_PSN, AGOQ_IBV_QP_TIMEOUT, AGOQ_IBV_QP_RETRY_CNT, AGOQ_IBV_QP_RNR_RETRY,
                         AGOQ_IBV_QP_MAX_QP_RD_ATOMIC};
  for (size_t i = 0; i < 5; i++) {
    assert_int_equal(to_rts(&a, 14, 7, 7, RTS_MASK & ~rts_req[i]), EINVAL);
    assert_int_equal(a.qp->state, AGOQ_IBV_QPS_RTR);
  }
  assert_int_equal(to_rts(&a, 14, 7, 7, RTS_MASK | AGOQ_IBV_QP_DEST_QPN), EINVAL);
  assert_int_equal(to_rts(&a, 14, 8, 7, RTS_MASK), EINVAL); /* retry_cnt is 3 bits */
  assert_int_equal(to_rts(&a, 14, 7, 7, RTS_MASK | AGOQ_IBV_QP_MIN_RNR_TIMER), 0);
  assert_int_equal(a.qp->state, AGOQ_IBV_QPS_RTS);
  /* RTS -> RTS: optional attributes only */
  memset(&at, 0, sizeof at);
  at.qp_state = AGOQ_IBV_QPS_RTS;
  at.min_rnr_timer = 3;
  assert_int_equal(api.modify_qp(a.qp, &at, AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_MIN_RNR_TIMER), 0);
  assert_int_equal(api.modify_qp(a.qp, &at, AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_SQ_PSN), EINVAL);
  /* a wrong cur_qp_state */
  at.cur_qp_state = AGOQ_IBV_QPS_RTR;
  assert_int_equal(api.modify_qp(a.qp, &at, AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_CUR_STATE), EINVAL);
  /* anything -> ERR and -> RESET with the state alone */
  at.qp_state = AGOQ_IBV_QPS_ERR;
  assert_int_equal(api.modify_qp(a.qp, &at, AGOQ_IBV_QP_STATE | AGOQ_IBV_QP_TIMEOUT), EINVAL);
  assert_int_equal(api.modify_qp(a.qp, &at, AGOQ_IBV_QP_STATE), 0);
  assert_int_equal(a.qp->state, AGOQ_IBV_QPS_ERR);
  at.qp_state = AGOQ_IBV_QPS_RTS;
  assert_int_equal(api.modify_qp(a.qp, &at, AGOQ_IBV_QP_STATE), EINVAL); /* ERR -> RTS: not in the table */
  at.qp_state = AGOQ_IBV_QPS_RESET;
  assert_int_equal(api.modify_qp(a.qp, &at, AGOQ_IBV_QP_STATE), 0);
  assert_int_equal(a.qp->state, AGOQ_IBV_QPS_RESET);
  /* and the whole path again after a reset */
  connect_pair(&a, &b, 14, 7);
  /* resources in use */
  assert_int_equal(api.destroy_cq(a.cq), EBUSY);
  assert_int_equal(api.dealloc_pd(a.pd), EBUSY);
  host_close(&a);
  host_close(&b);

  /* RoCE: the AV must be global, with a valid, non-empty source GID */
  use_fixture("roce-769.txt");
  host_open(&a, "mlx5_0", 1, 16, 16, ALL_ACCESS, 4096);
  host_open(&b, "mlx5_0", 1, 16, 16, ALL_ACCESS, 4096);
  assert_int_equal(to_init(&a, INIT_MASK), 0);
  rtr_attr(&a, &b, b.qp->qp_num, &at);
  at.ah_attr.is_global = 0;
  at.ah_attr.dlid = 1;
  assert_int_equal(api.modify_qp(a.qp, &at, RTR_MASK), EINVAL);
  rtr_attr(&a, &b, b.qp->qp_num, &at);
  at.ah_attr.grh.sgid_index = 9; /* beyond the table */
  assert_int_equal(api.modify_qp(a.qp, &at, RTR_MASK), EINVAL);
  rtr_attr(&a, &b, b.qp->qp_num, &at);
  at.path_mtu = AGOQ_IBV_MTU_2048; /* the port's MTU is 1024 */
  assert_int_equal(api.modify_qp(a.qp, &at, RTR_MASK), EINVAL);
  assert_int_equal(a.qp->state, AGOQ_IBV_QPS_INIT);
  rtr_attr(&a, &b, b.qp->qp_num, &at);
  assert_int_equal(api.modify_qp(a.qp, &at, RTR_MASK), 0);
  host_close(&a);
  host_close(&b);
  use_fixture(NULL);
}

static void post_before_rts(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  host_open(&a, NULL, 1, 16, 16, ALL_ACCESS, 4096);
  host_open(&b, NULL, 1, 16, 16, ALL_ACCESS, 4096);
  assert_int_equal(post_write(&a, &b, 1, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), EINVAL); /* RESET */
  assert_int_equal(post_recv0(&a, 1), EINVAL);                                         /* RESET */
  assert_int_equal(to_init(&a, INIT_MASK), 0);
  assert_int_equal(post_write(&a, &b, 1, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), EINVAL); /* INIT */
  assert_int_equal(post_recv0(&a, 1), 0);                                              /* INIT: fine */
  assert_int_equal(to_init(&b, INIT_MASK), 0);
  assert_int_equal(to_rtr(&a, &b, b.qp->qp_num, RTR_MASK), 0);
  assert_int_equal(post_write(&a, &b, 1, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), EINVAL); /* RTR */
  assert_int_equal(to_rtr(&b, &a, a.qp->qp_num, RTR_MASK), 0);
  assert_int_equal(to_rts(&a, T_OK, 7, 7, RTS_MASK), 0);
  assert_int_equal(to_rts(&b, T_OK, 7, 7, RTS_MASK), 0);
  /* synchronous checks in RTS: opcode, SGE count, inline size; *bad_wr names the culprit */
  assert_int_equal(post_rdma(&a, 1, AGOQ_IBV_WR_SEND_WITH_IMM, 0, 8, 0, 0, 0, 0), EINVAL);
  struct agoq_ibv_sge sg[3];
  for (int i = 0; i < 3; i++) sg[i] = (struct agoq_ibv_sge){(uint64_t)(uintptr_t)a.buf, 8, a.mr->lkey};
  struct agoq_ibv_send_wr w2, w1, *bad = NULL;
  memset(&w1, 0, sizeof w1);
  memset(&w2, 0, sizeof w2);
  w1.opcode = w2.opcode = AGOQ_IBV_WR_RDMA_WRITE;
  w1.sg_list = w2.sg_list = sg;
  w1.num_sge = 1;
  w1.wr.rdma.remote_addr = w2.wr.rdma.remote_addr = (uint64_t)(uintptr_t)b.buf;
  w1.wr.rdma.rkey = w2.wr.rdma.rkey = b.mr->rkey;
  w1.send_flags = AGOQ_IBV_SEND_SIGNALED;
  w1.next = &w2;
  w2.num_sge = 3; /* max_send_sge is 2 */
  assert_int_equal(agoq_ibv_post_send(a.qp, &w1, &bad), EINVAL);
  assert_ptr_equal(bad, &w2);
  w2.num_sge = 1;
  w2.send_flags = AGOQ_IBV_SEND_INLINE;
  sg[0].length = 65; /* max_inline_data is 64 */
  w1.next = NULL;
  assert_int_equal(agoq_ibv_post_send(a.qp, &w2, &bad), EINVAL);
  /* the valid first WR of the chain went out */
  struct agoq_ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  host_close(&a);
  host_close(&b);
}

/* ---- data path -------------------------------------------------------------------------- */

static void sq_depth_unsignaled(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 4, T_OK, 7);
  for (int i = 0; i < 3; i++) {
    a.buf[i] = (uint8_t)(0x10 + i);
    assert_int_equal(post_write(&a, &b, (uint64_t)i, (size_t)i, 1, 0, 0, 0), 0); /* unsignaled */
  }
  a.buf[3] = 0x13;
  assert_int_equal(post_recv0(&b, 600), 0);
  assert_int_equal(post_write(&a, &b, 3, 3, 1, 1, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  /* 4 slots held: a fifth is refused, even once all four have been executed (the
   * receiver has the last one's immediate) as long as no CQE was polled */
  assert_int_equal(post_write(&a, &b, 4, 4, 1, 0, 0, AGOQ_IBV_SEND_SIGNALED), ENOMEM);
  struct agoq_ibv_wc rwc;
  assert_int_equal(poll_n(b.cq, &rwc, 1), 1);
  assert_int_equal(rwc.wr_id, 600);
  assert_int_equal(b.buf[0], 0x10);
  assert_int_equal(b.buf[3], 0x13);
  assert_int_equal(post_write(&a, &b, 4, 4, 1, 0, 0, AGOQ_IBV_SEND_SIGNALED), ENOMEM);
  struct agoq_ibv_wc wc[4];
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].wr_id, 3); /* only the signaled WR completes */
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[0].opcode, AGOQ_IBV_WC_RDMA_WRITE);
  assert_int_equal(wc[0].qp_num, a.qp->qp_num);
  /* polling its CQE freed all four slots */
  for (int i = 0; i < 4; i++)
    assert_int_equal(post_write(&a, &b, (uint64_t)(10 + i), 0, 1, 0, 0, i == 3 ? AGOQ_IBV_SEND_SIGNALED : 0), 0);
  assert_int_equal(post_write(&a, &b, 20, 0, 1, 0, 0, 0), ENOMEM);
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].wr_id, 13);
  assert_int_equal(agoq_ibv_poll_cq(a.cq, 4, wc), 0);
  host_close(&a);
  host_close(&b);
}

static void write_bytes(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 7);
  for (size_t i = 0; i < a.len; i++) a.buf[i] = (uint8_t)(i * 7 + 3);
  assert_int_equal(post_write(&a, &b, 42, 0, (uint32_t)a.len, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc.wr_id, 42);
  assert_int_equal(wc.opcode, AGOQ_IBV_WC_RDMA_WRITE);
  assert_memory_equal(a.buf, b.buf, a.len);
  /* two SGEs gather into one remote range; inline data is taken at post time */
  struct agoq_ibv_sge sg[2] = {{(uint64_t)(uintptr_t)(a.buf + 100), 10, a.mr->lkey},
                               {(uint64_t)(uintptr_t)(a.buf + 500), 20, a.mr->lkey}};
  struct agoq_ibv_send_wr w, *bad;
  memset(&w, 0, sizeof w);
  w.wr_id = 43;
  w.opcode = AGOQ_IBV_WR_RDMA_WRITE;
  w.sg_list = sg;
  w.num_sge = 2;
  w.send_flags = AGOQ_IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = (uint64_t)(uintptr_t)(b.buf + 30000);
  w.wr.rdma.rkey = b.mr->rkey;
  assert_int_equal(agoq_ibv_post_send(a.qp, &w, &bad), 0);
  uint8_t inl[16];
  memset(inl, 0x5c, sizeof inl);
  struct agoq_ibv_sge is = {(uint64_t)(uintptr_t)inl, sizeof inl, 0 /* lkey unused */};
  w.wr_id = 44;
  w.sg_list = &is;
  w.num_sge = 1;
  w.send_flags = AGOQ_IBV_SEND_SIGNALED | AGOQ_IBV_SEND_INLINE;
  w.wr.rdma.remote_addr = (uint64_t)(uintptr_t)(b.buf + 40000);
  assert_int_equal(agoq_ibv_post_send(a.qp, &w, &bad), 0);
  memset(inl, 0, sizeof inl); /* already copied */
  struct agoq_ibv_wc two[2];
  assert_int_equal(poll_n(a.cq, two, 2), 2);
  assert_int_equal(two[0].wr_id, 43);
  assert_int_equal(two[1].wr_id, 44);
  assert_int_equal(two[1].status, AGOQ_IBV_WC_SUCCESS);
  assert_memory_equal(b.buf + 30000, a.buf + 100, 10);
  assert_memory_equal(b.buf + 30010, a.buf + 500, 20);
  for (int i = 0; i < 16; i++) assert_int_equal(b.buf[40000 + i], 0x5c);
  host_close(&a);
  host_close(&b);
}

static void write_imm(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 7);
  memset(a.buf, 0x77, 100);
  assert_int_equal(post_recv0(&b, 501), 0);
  assert_int_equal(post_recv0(&b, 502), 0);
  assert_int_equal(post_write(&a, &b, 1, 0, 100, 1, htonl(0x1234), AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(post_write(&a, &b, 2, 0, 0, 1, htonl(0xbeef), AGOQ_IBV_SEND_SIGNALED), 0); /* 0 bytes */
  struct agoq_ibv_wc wc[2];
  assert_int_equal(poll_n(b.cq, wc, 2), 2);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[0].wr_id, 501);
  assert_int_equal(wc[0].opcode, AGOQ_IBV_WC_RECV_RDMA_WITH_IMM);
  assert_int_equal(wc[0].byte_len, 100);
  assert_int_equal(ntohl(wc[0].imm_data), 0x1234);
  assert_true(wc[0].wc_flags & AGOQ_IBV_WC_WITH_IMM);
  assert_int_equal(wc[0].qp_num, b.qp->qp_num);
  assert_int_equal(wc[0].src_qp, a.qp->qp_num);
  assert_int_equal(wc[1].wr_id, 502);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[1].byte_len, 0);
  assert_int_equal(ntohl(wc[1].imm_data), 0xbeef);
  for (int i = 0; i < 100; i++) assert_int_equal(b.buf[i], 0x77);
  assert_int_equal(b.buf[100], 0);
  assert_int_equal(poll_n(a.cq, wc, 2), 2);
  assert_int_equal(wc[0].wr_id, 1);
  assert_int_equal(wc[1].wr_id, 2);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_SUCCESS);
  host_close(&a);
  host_close(&b);
}

static void read_bytes(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 7);
  for (int i = 0; i < 4096; i++) b.buf[1000 + i] = (uint8_t)(i ^ 0x3c);
  assert_int_equal(post_rdma(&a, 9, AGOQ_IBV_WR_RDMA_READ, 8192, 4096, (uint64_t)(uintptr_t)(b.buf + 1000),
                             b.mr->rkey, 0, AGOQ_IBV_SEND_SIGNALED),
                   0);
  struct agoq_ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc.opcode, AGOQ_IBV_WC_RDMA_READ);
  assert_int_equal(wc.byte_len, 4096);
  assert_memory_equal(a.buf + 8192, b.buf + 1000, 4096);
  host_close(&a);
  host_close(&b);
}

static void fill_pattern(uint8_t* p, size_t len, uint64_t seed) {
  for (size_t i = 0; i < len; i++) p[i] = (uint8_t)((i * 2654435761u + seed) >> 7);
}

/* 64 MiB with WRITE_WITH_IMM: carried in 1 MiB segments, placed as they arrive, one
 * receive WR consumed and one CQE at the end. */
static void write_imm_64m(void** state) {
  (void)state;
  use_fixture(NULL);
  const size_t len = (size_t)64 << 20;
  host a, b;
  host_open(&a, NULL, 1, 16, 16, ALL_ACCESS, len);
  host_open(&b, NULL, 1, 16, 16, ALL_ACCESS, len);
  connect_pair(&a, &b, T_OK, 7);
  fill_pattern(a.buf, len, 1);
  assert_int_equal(post_recv0(&b, 601), 0);
  assert_int_equal(post_recv0(&b, 602), 0);
  assert_int_equal(post_write(&a, &b, 71, 0, (uint32_t)len, 1, htonl(0x640064), AGOQ_IBV_SEND_SIGNALED), 0);
  /* a small one behind it completes after it */
  assert_int_equal(post_write(&a, &b, 72, 0, 16, 1, htonl(7), AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc[2];
  assert_int_equal(poll_n(b.cq, wc, 2), 2);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[0].wr_id, 601);
  assert_int_equal(wc[0].opcode, AGOQ_IBV_WC_RECV_RDMA_WITH_IMM);
  assert_int_equal(wc[0].byte_len, len);
  assert_true(wc[0].wc_flags & AGOQ_IBV_WC_WITH_IMM);
  assert_int_equal(ntohl(wc[0].imm_data), 0x640064);
  assert_int_equal(wc[0].qp_num, b.qp->qp_num);
  assert_int_equal(wc[0].src_qp, a.qp->qp_num);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[1].wr_id, 602);
  assert_int_equal(wc[1].byte_len, 16);
  assert_int_equal(agoq_ibv_poll_cq(b.cq, 2, wc), 0); /* one CQE per message, none per segment */
  assert_int_equal(poll_n(a.cq, wc, 2), 2);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[0].wr_id, 71);
  assert_int_equal(wc[0].opcode, AGOQ_IBV_WC_RDMA_WRITE);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[1].wr_id, 72);
  for (size_t i = 0; i < len; i++)
    if (a.buf[i] != b.buf[i]) fail_msg("byte %zu: %u != %u", i, b.buf[i], a.buf[i]);
  host_close(&a);
  host_close(&b);
}

/* An 8 MiB RDMA READ: the response comes in segments, scattered over two local SGEs
 * whose boundary falls inside a segment; a WRITE behind it is answered after it. */
static void read_8m(void** state) {
  (void)state;
  use_fixture(NULL);
  const size_t len = (size_t)8 << 20, mrlen = (size_t)9 << 20, split = ((size_t)3 << 20) + 123;
  host a, b;
  host_open(&a, NULL, 1, 16, 16, ALL_ACCESS, mrlen);
  host_open(&b, NULL, 1, 16, 16, ALL_ACCESS, mrlen);
  connect_pair(&a, &b, T_OK, 7);
  fill_pattern(b.buf, mrlen, 5);
  struct agoq_ibv_sge sg[2] = {{(uint64_t)(uintptr_t)(a.buf + 4096), (uint32_t)split, a.mr->lkey},
                               {(uint64_t)(uintptr_t)(a.buf + 4096 + split + 1000), (uint32_t)(len - split), a.mr->lkey}};
  struct agoq_ibv_send_wr w, *bad;
  memset(&w, 0, sizeof w);
  w.wr_id = 81;
  w.opcode = AGOQ_IBV_WR_RDMA_READ;
  w.sg_list = sg;
  w.num_sge = 2;
  w.send_flags = AGOQ_IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = (uint64_t)(uintptr_t)(b.buf + 100);
  w.wr.rdma.rkey = b.mr->rkey;
  assert_int_equal(agoq_ibv_post_send(a.qp, &w, &bad), 0);
  memset(a.buf + mrlen - 64, 0xa5, 64);
  assert_int_equal(post_rdma(&a, 82, AGOQ_IBV_WR_RDMA_WRITE, mrlen - 64, 64, (uint64_t)(uintptr_t)(b.buf + 16), b.mr->rkey,
                             0, AGOQ_IBV_SEND_SIGNALED),
                   0);
  struct agoq_ibv_wc wc[2];
  assert_int_equal(poll_n(a.cq, wc, 2), 2);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[0].wr_id, 81);
  assert_int_equal(wc[0].opcode, AGOQ_IBV_WC_RDMA_READ);
  assert_int_equal(wc[0].byte_len, len);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[1].wr_id, 82);
  for (size_t i = 0; i < len; i++) {
    uint8_t got = i < split ? a.buf[4096 + i] : a.buf[4096 + 1000 + i];
    uint8_t exp = (uint8_t)(((100 + i) * 2654435761u + 5) >> 7);
    if (got != exp) fail_msg("byte %zu: %u != %u", i, got, exp);
  }
  for (size_t i = 0; i < 4096; i++) assert_int_equal(a.buf[i], 0);
  for (size_t i = 0; i < 1000; i++) assert_int_equal(a.buf[4096 + split + i], 0);
  for (size_t i = 0; i < 64; i++) assert_int_equal(b.buf[16 + i], 0xa5);
  host_close(&a);
  host_close(&b);
}

static void in_order(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 256, 128, T_OK, 7);
  /* 100 writes, every other one with an immediate: slot i gets i, and the shared word at
   * offset 0 is overwritten by each; data of every earlier write is visible by the time
   * a later write's immediate completes */
  for (int i = 0; i < 50; i++) assert_int_equal(post_recv0(&b, (uint64_t)(1000 + i)), 0);
  for (int i = 0; i < 100; i++) {
    uint32_t v = (uint32_t)i + 1;
    memcpy(a.buf + 64 + 8 * i, &v, 4);
    memcpy(a.buf + 4096 + 8 * i, &v, 4);
  }
  for (int i = 0; i < 100; i++) {
    struct agoq_ibv_sge sge[2] = {{(uint64_t)(uintptr_t)(a.buf + 64 + 8 * i), 4, a.mr->lkey},
                                  {(uint64_t)(uintptr_t)(a.buf + 4096 + 8 * i), 4, a.mr->lkey}};
    struct agoq_ibv_send_wr w[2], *bad;
    memset(w, 0, sizeof w);
    for (int k = 0; k < 2; k++) {
      w[k].wr_id = (uint64_t)i;
      w[k].sg_list = &sge[k];
      w[k].num_sge = 1;
      w[k].wr.rdma.rkey = b.mr->rkey;
    }
    w[0].opcode = AGOQ_IBV_WR_RDMA_WRITE; /* its own slot */
    w[0].wr.rdma.remote_addr = (uint64_t)(uintptr_t)(b.buf + 64 + 8 * i);
    w[1].opcode = (i % 2) ? AGOQ_IBV_WR_RDMA_WRITE_WITH_IMM : AGOQ_IBV_WR_RDMA_WRITE;
    w[1].imm_data = htonl((uint32_t)i);
    w[1].send_flags = (i % 10 == 9) ? AGOQ_IBV_SEND_SIGNALED : 0;
    w[1].wr.rdma.remote_addr = (uint64_t)(uintptr_t)b.buf; /* the shared word */
    /* 128 slots for 200 WRs: drain signaled completions when the queue is full */
    for (int k = 0; k < 2; k++) {
      int rc;
      while ((rc = agoq_ibv_post_send(a.qp, &w[k], &bad)) == ENOMEM) {
        struct agoq_ibv_wc wc;
        assert_int_equal(poll_n(a.cq, &wc, 1), 1);
        assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
        assert_int_equal(wc.wr_id % 10, 9);
      }
      assert_int_equal(rc, 0);
    }
  }
  struct agoq_ibv_wc wc[50];
  assert_int_equal(poll_n(b.cq, wc, 50), 50);
  for (int k = 0; k < 50; k++) {
    assert_int_equal(wc[k].status, AGOQ_IBV_WC_SUCCESS);
    assert_int_equal(wc[k].wr_id, 1000 + k);
    assert_int_equal(ntohl(wc[k].imm_data), 2 * k + 1);
  }
  for (int i = 0; i < 100; i++) {
    uint32_t v;
    memcpy(&v, b.buf + 64 + 8 * i, 4);
    assert_int_equal(v, i + 1);
  }
  uint32_t last;
  memcpy(&last, b.buf, 4);
  assert_int_equal(last, 100);
  host_close(&a);
  host_close(&b);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void bad_lkey(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 7);
  struct agoq_ibv_sge sge = {(uint64_t)(uintptr_t)a.buf, 8, a.mr->lkey + 1};
  struct agoq_ibv_send_wr w, *bad;
  memset(&w, 0, sizeof w);
  w.wr_id = 1;
  w.sg_list = &sge;
  w.num_sge = 1;
  w.opcode = AGOQ_IBV_WR_RDMA_WRITE;
  w.wr.rdma.remote_addr = (uint64_t)(uintptr_t)b.buf;
  w.wr.rdma.rkey = b.mr->rkey;
  assert_int_equal(agoq_ibv_post_send(a.qp, &w, &bad), 0); /* unsignaled: an error completes anyway */
  assert_int_equal(post_write(&a, &b, 2, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(post_write(&a, &b, 3, 0, 8, 0, 0, 0), 0);
  struct agoq_ibv_wc wc[3];
  assert_int_equal(poll_n(a.cq, wc, 3), 3);
  assert_int_equal(wc[0].wr_id, 1);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_LOC_PROT_ERR);
  assert_int_not_equal(wc[0].vendor_err, 0);
  assert_int_equal(wc[0].qp_num, a.qp->qp_num);
  assert_int_equal(wc[1].wr_id, 2);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(wc[2].wr_id, 3);
  assert_int_equal(wc[2].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  /* the QP is in ERR: later WRs are accepted and flushed */
  assert_int_equal(post_write(&a, &b, 4, 0, 8, 0, 0, 0), 0);
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].wr_id, 4);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  /* a range beyond the MR is a local protection error too */
  host_close(&a);
  host_close(&b);
  pair_open(&a, &b, 64, 16, T_OK, 7);
  assert_int_equal(post_rdma(&a, 5, AGOQ_IBV_WR_RDMA_WRITE, a.len - 4, 8, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, 0,
                             AGOQ_IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_LOC_PROT_ERR);
  host_close(&a);
  host_close(&b);
}

static void error_wc_junk(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 7);
  assert_int_equal(post_rdma(&a, 77, AGOQ_IBV_WR_RDMA_WRITE, 0, 8, (uint64_t)(uintptr_t)b.buf, b.mr->rkey ^ 0x100,
                             0, AGOQ_IBV_SEND_SIGNALED),
                   0);
  struct agoq_ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.wr_id, 77);
  assert_int_equal(wc.status, AGOQ_IBV_WC_REM_ACCESS_ERR);
  assert_int_equal(wc.qp_num, a.qp->qp_num);
  assert_int_not_equal(wc.vendor_err, 0);
  /* ibv_poll_cq(3): nothing else is valid in an error completion */
  assert_int_not_equal(wc.opcode, AGOQ_IBV_WC_RDMA_WRITE);
  assert_int_not_equal(wc.opcode, 0);
  assert_int_not_equal(wc.byte_len, 0);
  assert_int_not_equal(wc.src_qp, 0);
  assert_int_not_equal(wc.wc_flags, 0);
  host_close(&a);
  host_close(&b);
}

static void one_remote_access(int mr_access, int64_t off, uint32_t len, int rkey_delta) {
  host a, b;
  host_open(&a, NULL, 1, 64, 16, ALL_ACCESS, 1 << 16);
  host_open(&b, NULL, 1, 64, 16, mr_access, 1 << 16);
  connect_pair(&a, &b, T_OK, 7);
  assert_int_equal(post_rdma(&a, 1, AGOQ_IBV_WR_RDMA_WRITE, 0, len, (uint64_t)(uintptr_t)b.buf + (uint64_t)off,
                             b.mr->rkey + (uint32_t)rkey_delta, 0, AGOQ_IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(post_write(&a, &b, 2, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc[2];
  assert_int_equal(poll_n(a.cq, wc, 2), 2);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_REM_ACCESS_ERR);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  /* the responder's QP went to ERR too: an access-error event, and its receives flush */
  expect_async(&b, AGOQ_IBV_EVENT_QP_ACCESS_ERR, b.qp);
  assert_int_equal(post_recv0(&b, 9), 0);
  assert_int_equal(poll_n(b.cq, wc, 1), 1);
  assert_int_equal(wc[0].wr_id, 9);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  host_close(&a);
  host_close(&b);
}

static void remote_access(void** state) {
  (void)state;
  use_fixture(NULL);
  one_remote_access(ALL_ACCESS, 0, 8, 1);                                  /* unknown rkey */
  one_remote_access(ALL_ACCESS, (1 << 16) - 4, 8, 0);                      /* past the end */
  one_remote_access(ALL_ACCESS, -8, 8, 0);                                 /* before the start */
  one_remote_access(AGOQ_IBV_ACCESS_LOCAL_WRITE | AGOQ_IBV_ACCESS_REMOTE_READ, 0, 8, 0); /* no REMOTE_WRITE */
}

static void wrong_dest_qpn(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  host_open(&a, NULL, 1, 64, 16, ALL_ACCESS, 4096);
  host_open(&b, NULL, 1, 64, 16, ALL_ACCESS, 4096);
  assert_int_equal(to_init(&a, INIT_MASK), 0);
  assert_int_equal(to_init(&b, INIT_MASK), 0);
  uint32_t wrong = b.qp->qp_num == 0xFFFFFF ? 2 : b.qp->qp_num + 1;
  assert_int_equal(to_rtr(&a, &b, wrong, RTR_MASK), 0); /* not detected here, as on hardware */
  assert_int_equal(to_rtr(&b, &a, a.qp->qp_num, RTR_MASK), 0);
  assert_int_equal(to_rts(&a, 10, 1, 7, RTS_MASK), 0);
  assert_int_equal(to_rts(&b, 10, 1, 7, RTS_MASK), 0);
  assert_int_equal(post_write(&a, &b, 1, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(post_write(&a, &b, 2, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc[2];
  assert_int_equal(poll_n(a.cq, wc, 2), 2);
  assert_int_equal(wc[0].wr_id, 1);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_RETRY_EXC_ERR);
  assert_int_equal(wc[0].vendor_err, 0x81);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  /* and b's QP, whose peer is right but whose peer does not point back, is unreachable too */
  assert_int_equal(post_write(&b, &a, 3, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(poll_n(b.cq, wc, 1), 1);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_RETRY_EXC_ERR);
  host_close(&a);
  host_close(&b);
}

static void roce_gid_type(void** state) {
  (void)state;
  use_fixture("roce-769.txt");
  host a, b;
  /* both on the IPv4-mapped RoCE v2 GID (index 3): traffic flows */
  host_open(&a, "mlx5_0", 1, 64, 16, ALL_ACCESS, 4096);
  host_open(&b, "mlx5_0", 1, 64, 16, ALL_ACCESS, 4096);
  connect_pair(&a, &b, T_OK, 7);
  a.buf[0] = 0x42;
  assert_int_equal(post_write(&a, &b, 1, 0, 1, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(b.buf[0], 0x42);
  host_close(&a);
  host_close(&b);
  /* a on RoCE v1 (index 2), b on v2 (index 3), same address: never reaches */
  host_open(&a, "mlx5_0", 1, 64, 16, ALL_ACCESS, 4096);
  host_open(&b, "mlx5_0", 1, 64, 16, ALL_ACCESS, 4096);
  a.sgid = 2;
  connect_pair(&a, &b, 10, 7);
  assert_int_equal(post_write(&a, &b, 1, 0, 1, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_RETRY_EXC_ERR);
  host_close(&a);
  host_close(&b);
  use_fixture(NULL);
}

static void rnr(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 0); /* rnr_retry 0 */
  assert_int_equal(post_write(&a, &b, 1, 0, 8, 1, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_RNR_RETRY_EXC_ERR);
  assert_int_equal(wc.vendor_err, 0x82);
  host_close(&a);
  host_close(&b);
  /* rnr_retry 7 retries forever: a receive posted later is consumed */
  pair_open(&a, &b, 64, 16, T_OK, 7);
  a.buf[0] = 0x99;
  assert_int_equal(post_write(&a, &b, 1, 0, 1, 1, htonl(5), AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(agoq_ibv_poll_cq(b.cq, 1, &wc), 0);
  assert_int_equal(post_recv0(&b, 11), 0);
  assert_int_equal(poll_n(b.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc.wr_id, 11);
  assert_int_equal(b.buf[0], 0x99);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  host_close(&a);
  host_close(&b);
}

static void cq_overflow(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  host_open(&a, NULL, 1, 64, 16, ALL_ACCESS, 4096);
  host_open(&b, NULL, 1, 2, 16, ALL_ACCESS, 4096); /* b's CQ holds 2 */
  connect_pair(&a, &b, T_OK, 7);
  for (int i = 0; i < 3; i++) assert_int_equal(post_recv0(&b, (uint64_t)i), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(post_write(&a, &b, (uint64_t)i, 0, 4, 1, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  expect_async(&b, AGOQ_IBV_EVENT_CQ_ERR, b.cq);
  host_close(&a);
  host_close(&b);
}

static void reg_mr_faults(void** state) {
  (void)state;
  use_fixture(NULL);
  struct agoq_ibv_context* ctx = open_dev(NULL);
  struct agoq_ibv_pd* pd = api.alloc_pd(ctx);
  static uint8_t mem[8192];
  errno = 0;
  assert_null(api.reg_mr(pd, mem, sizeof mem, AGOQ_IBV_ACCESS_REMOTE_WRITE)); /* REMOTE_WRITE needs LOCAL_WRITE */
  assert_int_equal(errno, EINVAL);
  errno = 0;
  assert_null(api.reg_mr(pd, mem, 0, AGOQ_IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, EINVAL);
  assert_int_equal(emu_fault_set("reg_mr_enomem"), 0);
  errno = 0;
  assert_null(api.reg_mr(pd, mem, sizeof mem, AGOQ_IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, ENOMEM);
  errno = 0;
  assert_null(api.reg_mr_iova2(pd, mem, sizeof mem, 0x10000, AGOQ_IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, ENOMEM);
  assert_int_equal(emu_fault_set(NULL), 0);
  struct agoq_ibv_mr* m1 = api.reg_mr(pd, mem, sizeof mem, ALL_ACCESS);
  struct agoq_ibv_mr* m2 = api.reg_mr_iova2(pd, mem, 4096, 0x10000, ALL_ACCESS);
  assert_non_null(m1);
  assert_non_null(m2);
  assert_int_not_equal(m1->lkey, m2->lkey);
  assert_int_not_equal(m1->rkey, m2->rkey);
  assert_ptr_equal(m1->addr, mem);
  assert_int_equal(m1->length, sizeof mem);
  assert_int_equal(api.dealloc_pd(pd), EBUSY);
  assert_int_equal(api.dereg_mr(m1), 0);
  assert_int_equal(api.dereg_mr(m2), 0);
  assert_int_equal(api.dealloc_pd(pd), 0);
  assert_int_equal(api.close_device(ctx), 0);
}

static void fault_wc12(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 7);
  assert_int_equal(emu_fault_set("wc=12@2"), 0);
  for (int i = 1; i <= 3; i++) assert_int_equal(post_write(&a, &b, (uint64_t)i, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc[3];
  assert_int_equal(poll_n(a.cq, wc, 3), 3);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[1].wr_id, 2);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_RETRY_EXC_ERR);
  assert_int_equal(wc[2].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(emu_fault_set(""), 0);
  host_close(&a);
  host_close(&b);
}

/* INIT on a DOWN port is refused (c lends only its port number; the QP lives in down_ctx). */
static void init_on_down_port_fails(host* c, struct agoq_ibv_context* down_ctx) {
  struct agoq_ibv_pd* pd = api.alloc_pd(down_ctx);
  struct agoq_ibv_cq* cq = api.create_cq(down_ctx, 4, NULL, NULL, 0);
  assert_non_null(pd);
  assert_non_null(cq);
  struct agoq_ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = AGOQ_IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  struct agoq_ibv_qp* qp = api.create_qp(pd, &ia);
  assert_non_null(qp);
  /* a CQ of another context is refused */
  ia.send_cq = c->cq;
  assert_null(api.create_qp(pd, &ia));
  struct agoq_ibv_qp* saved = c->qp;
  c->qp = qp;
  assert_int_equal(to_init(c, INIT_MASK), EINVAL);
  c->qp = saved;
  assert_int_equal(api.destroy_qp(qp), 0);
  assert_int_equal(api.destroy_cq(cq), 0);
  assert_int_equal(api.dealloc_pd(pd), 0);
}

static void port_down(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  host_open(&a, NULL, 1, 64, 16, ALL_ACCESS, 4096);
  host_open(&b, NULL, 1, 64, 16, ALL_ACCESS, 4096);
  connect_pair(&a, &b, T_LOST, 7);
  assert_int_equal(emu_fault_set("port_down@2"), 0);
  /* one chain, so that all four are outstanding when the port goes down after the 2nd */
  struct agoq_ibv_sge sge = {(uint64_t)(uintptr_t)a.buf, 8, a.mr->lkey};
  struct agoq_ibv_send_wr w[4], *bad;
  memset(w, 0, sizeof w);
  for (int i = 0; i < 4; i++) {
    w[i].wr_id = (uint64_t)i + 1;
    w[i].sg_list = &sge;
    w[i].num_sge = 1;
    w[i].opcode = AGOQ_IBV_WR_RDMA_WRITE;
    w[i].send_flags = AGOQ_IBV_SEND_SIGNALED;
    w[i].wr.rdma.remote_addr = (uint64_t)(uintptr_t)b.buf;
    w[i].wr.rdma.rkey = b.mr->rkey;
    w[i].next = i < 3 ? &w[i + 1] : NULL;
  }
  assert_int_equal(agoq_ibv_post_send(a.qp, w, &bad), 0);
  struct agoq_ibv_wc wc[4];
  assert_int_equal(poll_n(a.cq, wc, 4), 4);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[1].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(wc[2].status, AGOQ_IBV_WC_RETRY_EXC_ERR);
  assert_int_equal(wc[3].status, AGOQ_IBV_WC_WR_FLUSH_ERR);
  expect_async(&a, AGOQ_IBV_EVENT_PORT_ERR, (void*)(intptr_t)1);
  struct agoq_ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  assert_int_equal(api.query_port(a.ctx, 1, &pa), 0);
  assert_int_equal(pa.state, AGOQ_IBV_PORT_DOWN);
  assert_int_equal(emu_fault_set(""), 0);
  /* a QP cannot be brought up on the DOWN port; the control API brings it back */
  host c;
  host_open(&c, NULL, 1, 4, 4, ALL_ACCESS, 4096);
  init_on_down_port_fails(&c, a.ctx);
  assert_int_equal(emu_port_set_state(a.ctx, 1, AGOQ_IBV_PORT_ACTIVE), 0);
  expect_async(&a, AGOQ_IBV_EVENT_PORT_ACTIVE, (void*)(intptr_t)1);
  assert_int_equal(api.query_port(a.ctx, 1, &pa), 0);
  assert_int_equal(pa.state, AGOQ_IBV_PORT_ACTIVE);
  assert_int_equal(emu_port_set_state(a.ctx, 3, AGOQ_IBV_PORT_DOWN), EINVAL);
  host_close(&c);
  host_close(&a);
  host_close(&b);
}

static void dead_peer(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_LOST, 7);
  assert_int_equal(emu_fault_set("dead@1"), 0);
  assert_int_equal(post_write(&a, &b, 1, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc[2];
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(post_write(&a, &b, 2, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(post_write(&a, &b, 3, 0, 8, 0, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  assert_int_equal(poll_n(a.cq, wc, 2), 2);
  assert_int_equal(wc[0].wr_id, 2);
  assert_int_equal(wc[0].status, AGOQ_IBV_WC_RETRY_EXC_ERR);
  assert_int_not_equal(wc[1].status, AGOQ_IBV_WC_SUCCESS);
  assert_int_equal(emu_fault_set(""), 0);
  host_close(&a);
  host_close(&b);
}

/* ---- two processes ------------------------------------------------------------------------ */

typedef struct {
  uint32_t qpn;
  uint16_t lid;
  uint64_t addr;
  uint32_t rkey;
} wire_info;

static int read_full(int fd, void* p, size_t n) {
  for (size_t off = 0; off < n;) {
    ssize_t r = read(fd, (char*)p + off, n - off);
    if (r <= 0) return -1;
    off += (size_t)r;
  }
  return 0;
}

/* The child: a receiver; exits 0 when the write and its immediate arrived intact. */
static int child_main(int rfd, int wfd) {
  host b;
  memset(&b, 0, sizeof b);
  b.ctx = open_dev(NULL);
  b.port = 1;
  b.pd = api.alloc_pd(b.ctx);
  b.cq = api.create_cq(b.ctx, 16, NULL, NULL, 0);
  struct agoq_ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = b.cq;
  ia.qp_type = AGOQ_IBV_QPT_RC;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  b.qp = api.create_qp(b.pd, &ia);
  b.len = 4096;
  b.buf = calloc(1, b.len);
  if (!b.pd || !b.cq || !b.qp || !b.buf) return 10;
  b.mr = api.reg_mr(b.pd, b.buf, b.len, ALL_ACCESS);
  if (!b.mr) return 11;
  wire_info mine = {b.qp->qp_num, 1, (uint64_t)(uintptr_t)b.buf, b.mr->rkey}, peer;
  if (write(wfd, &mine, sizeof mine) != (ssize_t)sizeof mine || read_full(rfd, &peer, sizeof peer)) return 12;
  host a;
  memset(&a, 0, sizeof a);
  a.lid = peer.lid;
  if (to_init(&b, INIT_MASK)) return 13;
  struct agoq_ibv_qp_attr at;
  rtr_attr(&b, &a, peer.qpn, &at);
  if (api.modify_qp(b.qp, &at, RTR_MASK)) return 14;
  if (to_rts(&b, T_OK, 7, 7, RTS_MASK)) return 15;
  if (post_recv0(&b, 0xc0ffee)) return 16;
  char ready = 'r';
  if (write(wfd, &ready, 1) != 1) return 17;
  struct agoq_ibv_wc wc;
  int got = 0;
  int64_t end = now_ms() + 300000;
  while (!got && now_ms() < end) {
    got = agoq_ibv_poll_cq(b.cq, 1, &wc);
    if (!got) tiny_sleep();
  }
  if (got != 1) return 18;
  if (wc.status != AGOQ_IBV_WC_SUCCESS || wc.wr_id != 0xc0ffee || wc.opcode != AGOQ_IBV_WC_RECV_RDMA_WITH_IMM ||
      ntohl(wc.imm_data) != 0xfeedu || wc.byte_len != 1000 || wc.src_qp != peer.qpn)
    return 19;
  for (int i = 0; i < 1000; i++)
    if (b.buf[i] != (uint8_t)(i * 13)) return 20;
  if (b.buf[1000] != 0) return 21;
  char done;
  if (read_full(rfd, &done, 1)) return 22; /* the parent has its send CQE: tear down */
  if (api.destroy_qp(b.qp) || api.dereg_mr(b.mr) || api.destroy_cq(b.cq) || api.dealloc_pd(b.pd) ||
      api.close_device(b.ctx))
    return 23;
  free(b.buf);
  return 0;
}

static void fork_write_imm(void** state) {
  (void)state;
  use_fixture(NULL);
  int p2c[2], c2p[2];
  assert_int_equal(pipe(p2c), 0);
  assert_int_equal(pipe(c2p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p2c[1]);
    close(c2p[0]);
    _exit(child_main(p2c[0], c2p[1]));
  }
  close(p2c[0]);
  close(c2p[1]);
  host a;
  host_open(&a, NULL, 1, 16, 4, ALL_ACCESS, 4096);
  wire_info mine = {a.qp->qp_num, a.lid, (uint64_t)(uintptr_t)a.buf, a.mr->rkey}, peer;
  assert_int_equal(write(p2c[1], &mine, sizeof mine), (ssize_t)sizeof mine);
  assert_int_equal(read_full(c2p[0], &peer, sizeof peer), 0);
  host b;
  memset(&b, 0, sizeof b);
  b.lid = peer.lid;
  assert_int_equal(to_init(&a, INIT_MASK), 0);
  struct agoq_ibv_qp_attr at;
  rtr_attr(&a, &b, peer.qpn, &at);
  assert_int_equal(api.modify_qp(a.qp, &at, RTR_MASK), 0);
  assert_int_equal(to_rts(&a, T_OK, 7, 7, RTS_MASK), 0);
  char ready;
  assert_int_equal(read_full(c2p[0], &ready, 1), 0);
  for (int i = 0; i < 1000; i++) a.buf[i] = (uint8_t)(i * 13);
  assert_int_equal(post_rdma(&a, 1, AGOQ_IBV_WR_RDMA_WRITE_WITH_IMM, 0, 1000, peer.addr, peer.rkey, htonl(0xfeed),
                             AGOQ_IBV_SEND_SIGNALED),
                   0);
  struct agoq_ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  char done = 'd';
  assert_int_equal(write(p2c[1], &done, 1), 1);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  close(p2c[1]);
  close(c2p[0]);
  host_close(&a);
}

/* ---- names, exports, DMA-BUF -------------------------------------------------------------- */

static void strings_and_dmabuf(void** state) {
  (void)state;
  use_fixture(NULL);
  assert_string_equal(api.wc_status_str(AGOQ_IBV_WC_SUCCESS), "success");
  assert_string_equal(api.wc_status_str(AGOQ_IBV_WC_LOC_PROT_ERR), "local protection error");
  assert_string_equal(api.wc_status_str(AGOQ_IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
  assert_string_equal(api.wc_status_str(AGOQ_IBV_WC_REM_ACCESS_ERR), "remote access error");
  assert_string_equal(api.wc_status_str(AGOQ_IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  assert_string_equal(api.wc_status_str(AGOQ_IBV_WC_RNR_RETRY_EXC_ERR), "RNR retry counter exceeded");
  assert_string_equal(api.wc_status_str(999), "unknown");
  assert_string_equal(api.event_type_str(AGOQ_IBV_EVENT_CQ_ERR), "CQ error");
  assert_string_equal(api.event_type_str(AGOQ_IBV_EVENT_PORT_ERR), "port error");
  assert_int_equal(api.fork_init(), 0);
  /* versions as libibverbs has them: the 1.8 symbol does not exist at 1.1 */
  assert_non_null(api.query_gid_ex);
  assert_non_null(api.reg_mr_iova2);
  assert_non_null(api.reg_dmabuf_mr);
  assert_null(dlvsym(api.handle, "ibv_reg_mr_iova2", "IBVERBS_1.1"));
  assert_null(dlvsym(api.handle, "ibv_reg_dmabuf_mr", "IBVERBS_1.8"));
  assert_non_null(dlvsym(api.handle, "_ibv_query_gid_ex", "IBVERBS_1.11"));
  assert_null(dlsym(api.handle, "emu_qp_find")); /* internals stay local */
  /* DMA-BUF: fd -1 is EBADF (supported); a file too short for the range is EINVAL */
  struct agoq_ibv_context* ctx = open_dev(NULL);
  struct agoq_ibv_pd* pd = api.alloc_pd(ctx);
  errno = 0;
  assert_null(api.reg_dmabuf_mr(pd, 0, 0, 0, -1, 0));
  assert_int_equal(errno, EBADF);
  int fd = open("/dev/null", O_RDONLY);
  assert_true(fd >= 0);
  errno = 0;
  assert_null(api.reg_dmabuf_mr(pd, 0, 4096, 0x10000, fd, AGOQ_IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, EINVAL);
  close(fd);
  errno = 0;
  assert_null(api.reg_dmabuf_mr(pd, 0, 4096, 0x10000, fd, AGOQ_IBV_ACCESS_LOCAL_WRITE)); /* closed */
  assert_int_equal(errno, EBADF);
  assert_int_equal(api.dealloc_pd(pd), 0);
  assert_int_equal(api.close_device(ctx), 0);
}

/* A dma-buf MR is reached through its iova only, locally and remotely, and its bytes are
 * the file's, whatever the process maps at the iova (here: nothing). The fd may be closed
 * after the registration. */
static void dmabuf_data(void** state) {
  (void)state;
  use_fixture(NULL);
  host a, b;
  pair_open(&a, &b, 64, 16, T_OK, 7);
  enum { FILE_LEN = 3 * 4096, OFF = 5000, LEN = 6000 };
  int fd = memfd_create("dmabuf-test", 0);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, FILE_LEN), 0);
  uint8_t* view = mmap(NULL, FILE_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(view != MAP_FAILED);
  const uint64_t iova = 0x5a5a00000000ull; /* not mapped in this process */
  errno = 0;
  assert_null(api.reg_dmabuf_mr(b.pd, OFF, FILE_LEN, iova, fd, ALL_ACCESS)); /* past the end */
  assert_int_equal(errno, EINVAL);
  struct agoq_ibv_mr* dm = api.reg_dmabuf_mr(b.pd, OFF, LEN, iova, fd, ALL_ACCESS);
  assert_non_null(dm);
  close(fd);
  assert_ptr_equal(dm->addr, (void*)(uintptr_t)OFF); /* rdma-core: the offset */
  assert_int_equal(dm->length, LEN);
  fill_pattern(a.buf, LEN, 11);
  assert_int_equal(post_rdma(&a, 1, AGOQ_IBV_WR_RDMA_WRITE, 0, LEN, iova, dm->rkey, 0, AGOQ_IBV_SEND_SIGNALED), 0);
  struct agoq_ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  assert_memory_equal(view + OFF, a.buf, LEN);
  /* local access by lkey at iova: b reads a's bytes into the dma-buf */
  fill_pattern(a.buf + 8192, 1000, 77);
  struct agoq_ibv_sge sge = {.addr = iova + 100, .length = 1000, .lkey = dm->lkey};
  struct agoq_ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 2;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = AGOQ_IBV_WR_RDMA_READ;
  wr.send_flags = AGOQ_IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)(a.buf + 8192);
  wr.wr.rdma.rkey = a.mr->rkey;
  assert_int_equal(agoq_ibv_post_send(b.qp, &wr, &bad), 0);
  assert_int_equal(poll_n(b.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_SUCCESS);
  assert_memory_equal(view + OFF + 100, a.buf + 8192, 1000);
  /* a write one byte past the region is a remote access error */
  assert_int_equal(post_rdma(&a, 3, AGOQ_IBV_WR_RDMA_WRITE, 0, 2, iova + LEN - 1, dm->rkey, 0, AGOQ_IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, AGOQ_IBV_WC_REM_ACCESS_ERR);
  assert_int_equal(api.dereg_mr(dm), 0);
  munmap(view, FILE_LEN);
  host_close(&a);
  host_close(&b);
}

/* ---- main ------------------------------------------------------------------------------------ */

static int group_setup(void** state) {
  (void)state;
  char why[512] = "";
  int rc = agoq_ibv_api_load(AGOQ_IBV_EMU_PATH, &api, why, sizeof why);
  if (rc) {
    fprintf(stderr, "agoq_ibv_api_load: %s\n", why);
    return -1;
  }
  *(void**)&emu_fault_set = dlvsym(api.handle, "agoq_ibv_emu_fault_set", "AGOQ_IBV_EMU_1");
  *(void**)&emu_fabric_dir = dlvsym(api.handle, "agoq_ibv_emu_fabric_dir", "AGOQ_IBV_EMU_1");
  *(void**)&emu_port_set_state = dlvsym(api.handle, "agoq_ibv_emu_port_set_state", "AGOQ_IBV_EMU_1");
  if (!emu_fault_set || !emu_fabric_dir || !emu_port_set_state) return -1;
  return emu_fault_set("");
}

static int group_teardown(void** state) {
  (void)state;
  agoq_ibv_api_unload(&api);
  return 0;
}

int main(int argc, char** argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fixture_default),    cmocka_unit_test(fixture_roce769),
      cmocka_unit_test(fixture_container),  cmocka_unit_test(fixture_mixed),
      cmocka_unit_test(fixture_nodev),      cmocka_unit_test(fixture_malformed),
      cmocka_unit_test(qp_transitions),     cmocka_unit_test(post_before_rts),
      cmocka_unit_test(sq_depth_unsignaled), cmocka_unit_test(write_bytes),
      cmocka_unit_test(write_imm),          cmocka_unit_test(read_bytes),
      cmocka_unit_test(write_imm_64m),      cmocka_unit_test(read_8m),
      cmocka_unit_test(bad_lkey),           cmocka_unit_test(remote_access),
      cmocka_unit_test(wrong_dest_qpn),     cmocka_unit_test(roce_gid_type),
      cmocka_unit_test(rnr),                cmocka_unit_test(cq_overflow),
      cmocka_unit_test(error_wc_junk),      cmocka_unit_test(reg_mr_faults),
      cmocka_unit_test(fault_wc12),         cmocka_unit_test(in_order),
      cmocka_unit_test(fork_write_imm),     cmocka_unit_test(port_down),
      cmocka_unit_test(dead_peer),          cmocka_unit_test(strings_and_dmabuf), cmocka_unit_test(dmabuf_data),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
