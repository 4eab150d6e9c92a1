/*
 * agoq-ibv-emu: a soft-RC emulation of libibverbs for tests (written from scratch).
 *
 * The objects handed out are the real agoq_ibv_* structs of agoq_ibv.h, embedded as the
 * first member of the emulator's own records, so a pointer to one is a pointer to the
 * other. Everything of one context (its PDs, MRs, CQs, QPs, queues, connections) is
 * guarded by the context's lock; the only process-wide state is emu_g (fault injection,
 * counters, key generator) behind its own mutex. Lock order: context lock, then emu_g.lock.
 *
 * Each open context runs a NIC thread (emu_nic.c): the requester and responder engine of
 * the emulated HCA. Requester QPs reach their peer through one ordered Unix stream per
 * connected QP pair, found through the fabric directory (<dir>/qpn-<n> files).
 */
#ifndef AGOQ_IBV_EMU_H
#define AGOQ_IBV_EMU_H

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/un.h>

#include "transport/ib/agoq_ibv.h"

#define EMU_EXPORT __attribute__((visibility("default")))

#define EMU_MAX_DEV 16
#define EMU_MAX_PORT 4
#define EMU_MAX_GID 32
#define EMU_MAX_SGE 16
#define EMU_MAX_INLINE 256
#define EMU_MAX_RD_ATOMIC 16
#define EMU_PKEY_TBL_LEN 128

/* ---- fixture ------------------------------------------------------------------------ */
typedef struct emu_gid {
  agoq_ibv_gid gid;
  int type;       /* AGOQ_IBV_GID_TYPE_* */
  int unreadable; /* _ibv_query_gid_ex fails with EINVAL (what containers show) */
} emu_gid;

typedef struct emu_port_cfg {
  int state, link, mtu, width, speed;
  uint16_t lid;
  int ngid; /* gid_tbl_len: highest listed index + 1 */
  emu_gid gids[EMU_MAX_GID];
} emu_port_cfg;

typedef struct emu_dev_cfg {
  char name[AGOQ_IBV_SYSFS_NAME_MAX];
  uint64_t guid; /* host order */
  int max_qp, max_qp_wr, max_cqe, dmabuf;
  int nports;
  emu_port_cfg ports[EMU_MAX_PORT]; /* ports[i] is port i + 1 */
} emu_dev_cfg;

/* Parses the fixture named by AGOQ_IBV_EMU_FIXTURE (or the default). 0 or an errno. */
int emu_fixture_load(emu_dev_cfg* devs, int* ndev);

typedef struct emu_device {
  struct agoq_ibv_device ibv; /* first: the pointer handed out */
  emu_dev_cfg cfg;
} emu_device;

/* ---- objects ------------------------------------------------------------------------ */
struct emu_ctx;

typedef struct emu_pd {
  struct agoq_ibv_pd ibv;
  int nmr, nqp;
  struct emu_pd* next;
} emu_pd;

typedef struct emu_mr {
  struct agoq_ibv_mr ibv;
  uint64_t iova;  /* start of the MR in the address space of its lkey and rkey */
  uint8_t* bytes; /* where the MR's first byte lives in this process */
  void* map;      /* a dma-buf MR's own mapping of the buffer (munmap at dereg), or NULL */
  size_t map_len;
  unsigned int access;
  struct emu_mr* next;
} emu_mr;

typedef struct emu_cqe {
  struct agoq_ibv_wc wc;
  uint64_t seq; /* send CQE: the WR's send-queue sequence number */
  int is_send;
} emu_cqe;

typedef struct emu_cq {
  struct agoq_ibv_cq ibv;
  emu_cqe* ring;
  int cap, head, count, overflowed, nqp;
  struct emu_cq* next;
} emu_cq;

typedef struct emu_swr {
  uint64_t wr_id, seq, raddr;
  int opcode, signaled, nsge, transmitted, result, forced, port_down_after;
  uint32_t imm, rkey, len, byte_len;
  uint32_t rd_off; /* RDMA READ: bytes of the response placed so far */
  int is_inline;
  struct agoq_ibv_sge* sge; /* cap.max_send_sge entries */
  uint8_t* inl;             /* cap.max_inline_data bytes */
} emu_swr;

typedef struct emu_rwr {
  uint64_t wr_id;
  int nsge;
  struct agoq_ibv_sge* sge;
} emu_rwr;

struct emu_conn;

typedef struct emu_qp {
  struct agoq_ibv_qp ibv;
  struct emu_ctx* ctx;
  struct agoq_ibv_qp_cap cap;
  int sq_sig_all;
  /* the state the emulator works with; ibv.state is written only by create/modify (in
   * the caller's thread, as libibverbs does), so an asynchronous ERR does not show there */
  int st;
  /* attributes */
  int port, path_mtu;
  unsigned int access;
  uint16_t pkey_index;
  struct agoq_ibv_ah_attr ah;
  uint32_t dest_qpn, rq_psn, sq_psn;
  uint8_t min_rnr_timer, timeout, retry_cnt, rnr_retry, max_rd_atomic, max_dest_rd_atomic;
  /* send queue, by sequence number: [head, ack) completed but not retired,
   * [ack, exec) transmitted or failed, [exec, next) queued */
  emu_swr* sq;
  uint32_t sq_cap;
  uint64_t sq_head, sq_ack, sq_exec, sq_next;
  int tx_halt; /* a local error stopped transmission; the QP goes to ERR at its CQE */
  /* receive queue */
  emu_rwr* rq;
  uint32_t rq_cap, rq_head, rq_count;
  /* requester connection */
  struct emu_conn* conn;
  int unreachable, peer_lost, rnr_count;
  int64_t reach_deadline, next_connect, ack_deadline, rnr_until;
  char qpn_path[PATH_MAX];
  struct emu_qp* next;
} emu_qp;

typedef struct emu_buf {
  uint8_t* p;
  size_t off, len, cap;
} emu_buf;

enum { EMU_CONN_REQ = 1, EMU_CONN_RESP = 2 };
enum { EMU_CS_HELLO = 1, EMU_CS_OPEN = 2 };

typedef struct emu_conn {
  int fd, role, state, closing;
  uint32_t qpn;      /* the local QP (requester's own, or the responder QP) */
  uint32_t peer_qpn; /* responder side: the requester's QPN (src_qp of recv CQEs) */
  uint16_t peer_lid;
  uint64_t expect_seq;
  emu_buf in, out;
  /* Messages travel in segments (emu_nic.c). Requester: the WRITE/SEND being streamed,
   * whose next segment starts at tx_off. */
  int tx_active;
  uint64_t tx_seq;
  uint32_t tx_off;
  /* responder: the WRITE/SEND being received (rx_off bytes placed so far) */
  int rx_active;
  uint32_t rx_type, rx_flags, rx_off, rx_total;
  uint64_t rx_seq;
  /* responder: the READ response being streamed; later requests wait in the stream */
  int rd_active;
  uint64_t rd_seq, rd_raddr;
  uint32_t rd_rkey, rd_off, rd_total;
  int want_more; /* streaming stopped because out holds enough: continue as it drains */
  struct emu_conn* next;
} emu_conn;

typedef struct emu_async {
  struct agoq_ibv_async_event ev;
  struct emu_async* next;
} emu_async;

typedef struct emu_ctx {
  struct agoq_ibv_context ibv; /* first */
  emu_device dev;              /* the context's own copy; ibv.device points here */
  int port_state[EMU_MAX_PORT + 1];
  pthread_mutex_t lock;
  int wake_fd, listen_fd, stop, nic_started;
  pthread_t nic;
  char sock_path[sizeof(((struct sockaddr_un*)0)->sun_path)];
  /* read from the environment at open, so the NIC thread never calls getenv */
  char dir[PATH_MAX - 64];
  double time_scale;
  emu_pd* pds;
  emu_mr* mrs;
  emu_cq* cqs;
  emu_qp* qps;
  emu_conn* conns;
  emu_async *aq_head, *aq_tail;
  uint32_t next_handle;
} emu_ctx;

/* ---- process-wide fabric state ------------------------------------------------------ */
typedef struct emu_fabric {
  pthread_mutex_t lock;
  uint64_t rng;
  uint32_t key_counter, ctx_counter;
  int env_applied;
  char env_seen[256];
  /* faults */
  int f_nodev, f_reg_enomem, f_wc_status;
  uint64_t f_wc_n, f_port_down_n, f_dead_n, f_reg_freeze_n;
  uint64_t send_count, incoming_writes;
  int dead;
} emu_fabric;
extern emu_fabric emu_g;

/* emu_fault.c */
int emu_fault_parse_apply(const char* spec); /* under emu_g.lock; 0 or -1 */
void emu_fault_sync_env(void);               /* applies AGOQ_IBV_EMU_FAULT if it changed */
uint64_t emu_random(void);                   /* under emu_g.lock */
double emu_time_scale(void);
int64_t emu_now_ns(void);
int emu_fabric_dir(char* out, size_t len);   /* creates it; 0 or an errno */

/* emu_device.c */
void emu_async_push(emu_ctx* ctx, int type, void* element, int port); /* ctx lock held */
void emu_wake(emu_ctx* ctx);
emu_qp* emu_qp_find(emu_ctx* ctx, uint32_t qpn); /* ctx lock held */

/* emu_mem.c */
void emu_mem_free_all(emu_ctx* ctx);
/* The MR of the QP's PD holding [addr, addr+len) in lkey (local) or rkey (remote) space
 * with all of `need` access bits; NULL when none. Returns the local pointer in *ptr. */
emu_mr* emu_mr_check(emu_ctx* ctx, struct agoq_ibv_pd* pd, uint32_t key, int remote, uint64_t addr,
                     uint64_t len, unsigned int need, uint8_t** ptr);

/* emu_cq.c */
int emu_cq_poll(struct agoq_ibv_cq* cq, int n, struct agoq_ibv_wc* wc);
void emu_cq_push(emu_ctx* ctx, emu_cq* cq, const emu_cqe* e); /* ctx lock held */
void emu_cq_free_all(emu_ctx* ctx);
uint32_t emu_vendor_err(int status);

/* emu_qp.c */
int emu_post_send(struct agoq_ibv_qp* qp, struct agoq_ibv_send_wr* wr, struct agoq_ibv_send_wr** bad);
int emu_post_recv(struct agoq_ibv_qp* qp, struct agoq_ibv_recv_wr* wr, struct agoq_ibv_recv_wr** bad);
void emu_qp_set_err(emu_qp* qp); /* ctx lock held: ERR, flush the RQ, wake the NIC for the SQ */
void emu_qp_retire(emu_qp* qp, uint64_t seq);
void emu_qp_free_all(emu_ctx* ctx);
int64_t emu_qp_timeout_ns(const emu_qp* qp); /* 0: infinite */
emu_swr* emu_swr_at(emu_qp* qp, uint64_t seq);

/* emu_nic.c */
void* emu_nic_main(void* arg);
void emu_conn_close_qp(emu_ctx* ctx, uint32_t qpn); /* ctx lock held: mark its streams closing */
void emu_conn_free_all(emu_ctx* ctx);

#endif
