/*
 * The libibverbs ABI as agoq uses it, declared here from rdma-core's public verbs.h
 * (IBVERBS_1.1 structs, unchanged since rdma-core v13) so that the plugin builds without
 * libibverbs-dev and loads without libibverbs: the library is dlopened at run time
 * (agoq_ibv_load.c) and the soft-RC emulator (tests/ibv_emu) implements the same names.
 *
 * Every struct keeps the exact layout of its libibverbs counterpart (tests/ib/test_ibv_abi.c
 * checks each size and offset against <infiniband/verbs.h> where that header exists). Only
 * what agoq touches is spelled out; the rest is kept as opaque members of the right size.
 * The names carry an agoq_ prefix so this header and verbs.h can be included together.
 */
#ifndef AGOQ_IBV_H
#define AGOQ_IBV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* ---- enums (values from verbs.h) ---------------------------------------------------- */
enum {
  AGOQ_IBV_PORT_DOWN = 1,
  AGOQ_IBV_PORT_INIT = 2,
  AGOQ_IBV_PORT_ARMED = 3,
  AGOQ_IBV_PORT_ACTIVE = 4,
  AGOQ_IBV_PORT_ACTIVE_DEFER = 5,
};
enum { AGOQ_IBV_LINK_LAYER_UNSPECIFIED = 0, AGOQ_IBV_LINK_LAYER_INFINIBAND = 1, AGOQ_IBV_LINK_LAYER_ETHERNET = 2 };
enum { AGOQ_IBV_MTU_256 = 1, AGOQ_IBV_MTU_512, AGOQ_IBV_MTU_1024, AGOQ_IBV_MTU_2048, AGOQ_IBV_MTU_4096 };
enum { AGOQ_IBV_GID_TYPE_IB = 0, AGOQ_IBV_GID_TYPE_ROCE_V1 = 1, AGOQ_IBV_GID_TYPE_ROCE_V2 = 2 };
enum { AGOQ_IBV_NODE_CA = 1 };
enum { AGOQ_IBV_TRANSPORT_IB = 0 };

enum {
  AGOQ_IBV_ACCESS_LOCAL_WRITE = 1,
  AGOQ_IBV_ACCESS_REMOTE_WRITE = 1 << 1,
  AGOQ_IBV_ACCESS_REMOTE_READ = 1 << 2,
  AGOQ_IBV_ACCESS_REMOTE_ATOMIC = 1 << 3,
  AGOQ_IBV_ACCESS_RELAXED_ORDERING = 1 << 20, /* IBV_ACCESS_OPTIONAL_FIRST */
};

enum { AGOQ_IBV_QPT_RC = 2 };
enum {
  AGOQ_IBV_QPS_RESET = 0,
  AGOQ_IBV_QPS_INIT,
  AGOQ_IBV_QPS_RTR,
  AGOQ_IBV_QPS_RTS,
  AGOQ_IBV_QPS_SQD,
  AGOQ_IBV_QPS_SQE,
  AGOQ_IBV_QPS_ERR,
  AGOQ_IBV_QPS_UNKNOWN,
};
enum {
  AGOQ_IBV_QP_STATE = 1 << 0,
  AGOQ_IBV_QP_CUR_STATE = 1 << 1,
  AGOQ_IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2,
  AGOQ_IBV_QP_ACCESS_FLAGS = 1 << 3,
  AGOQ_IBV_QP_PKEY_INDEX = 1 << 4,
  AGOQ_IBV_QP_PORT = 1 << 5,
  AGOQ_IBV_QP_QKEY = 1 << 6,
  AGOQ_IBV_QP_AV = 1 << 7,
  AGOQ_IBV_QP_PATH_MTU = 1 << 8,
  AGOQ_IBV_QP_TIMEOUT = 1 << 9,
  AGOQ_IBV_QP_RETRY_CNT = 1 << 10,
  AGOQ_IBV_QP_RNR_RETRY = 1 << 11,
  AGOQ_IBV_QP_RQ_PSN = 1 << 12,
  AGOQ_IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
  AGOQ_IBV_QP_ALT_PATH = 1 << 14,
  AGOQ_IBV_QP_MIN_RNR_TIMER = 1 << 15,
  AGOQ_IBV_QP_SQ_PSN = 1 << 16,
  AGOQ_IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
  AGOQ_IBV_QP_PATH_MIG_STATE = 1 << 18,
  AGOQ_IBV_QP_CAP = 1 << 19,
  AGOQ_IBV_QP_DEST_QPN = 1 << 20,
  AGOQ_IBV_QP_RATE_LIMIT = 1 << 25,
};

enum {
  AGOQ_IBV_WR_RDMA_WRITE = 0,
  AGOQ_IBV_WR_RDMA_WRITE_WITH_IMM = 1,
  AGOQ_IBV_WR_SEND = 2,
  AGOQ_IBV_WR_SEND_WITH_IMM = 3,
  AGOQ_IBV_WR_RDMA_READ = 4,
};
enum {
  AGOQ_IBV_SEND_FENCE = 1 << 0,
  AGOQ_IBV_SEND_SIGNALED = 1 << 1,
  AGOQ_IBV_SEND_SOLICITED = 1 << 2,
  AGOQ_IBV_SEND_INLINE = 1 << 3,
};

enum {
  AGOQ_IBV_WC_SUCCESS = 0,
  AGOQ_IBV_WC_LOC_LEN_ERR = 1,
  AGOQ_IBV_WC_LOC_QP_OP_ERR = 2,
  AGOQ_IBV_WC_LOC_EEC_OP_ERR = 3,
  AGOQ_IBV_WC_LOC_PROT_ERR = 4,
  AGOQ_IBV_WC_WR_FLUSH_ERR = 5,
  AGOQ_IBV_WC_MW_BIND_ERR = 6,
  AGOQ_IBV_WC_BAD_RESP_ERR = 7,
  AGOQ_IBV_WC_LOC_ACCESS_ERR = 8,
  AGOQ_IBV_WC_REM_INV_REQ_ERR = 9,
  AGOQ_IBV_WC_REM_ACCESS_ERR = 10,
  AGOQ_IBV_WC_REM_OP_ERR = 11,
  AGOQ_IBV_WC_RETRY_EXC_ERR = 12,
  AGOQ_IBV_WC_RNR_RETRY_EXC_ERR = 13,
  AGOQ_IBV_WC_LOC_RDD_VIOL_ERR = 14,
  AGOQ_IBV_WC_REM_INV_RD_REQ_ERR = 15,
  AGOQ_IBV_WC_REM_ABORT_ERR = 16,
  AGOQ_IBV_WC_INV_EECN_ERR = 17,
  AGOQ_IBV_WC_INV_EEC_STATE_ERR = 18,
  AGOQ_IBV_WC_FATAL_ERR = 19,
  AGOQ_IBV_WC_RESP_TIMEOUT_ERR = 20,
  AGOQ_IBV_WC_GENERAL_ERR = 21,
};
enum {
  AGOQ_IBV_WC_SEND = 0,
  AGOQ_IBV_WC_RDMA_WRITE = 1,
  AGOQ_IBV_WC_RDMA_READ = 2,
  AGOQ_IBV_WC_RECV = 1 << 7,
  AGOQ_IBV_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1,
};
enum { AGOQ_IBV_WC_GRH = 1 << 0, AGOQ_IBV_WC_WITH_IMM = 1 << 1 };

enum {
  AGOQ_IBV_EVENT_CQ_ERR = 0,
  AGOQ_IBV_EVENT_QP_FATAL = 1,
  AGOQ_IBV_EVENT_QP_REQ_ERR = 2,
  AGOQ_IBV_EVENT_QP_ACCESS_ERR = 3,
  AGOQ_IBV_EVENT_COMM_EST = 4,
  AGOQ_IBV_EVENT_SQ_DRAINED = 5,
  AGOQ_IBV_EVENT_PATH_MIG = 6,
  AGOQ_IBV_EVENT_PATH_MIG_ERR = 7,
  AGOQ_IBV_EVENT_DEVICE_FATAL = 8,
  AGOQ_IBV_EVENT_PORT_ACTIVE = 9,
  AGOQ_IBV_EVENT_PORT_ERR = 10,
  AGOQ_IBV_EVENT_LID_CHANGE = 11,
  AGOQ_IBV_EVENT_PKEY_CHANGE = 12,
  AGOQ_IBV_EVENT_SM_CHANGE = 13,
  AGOQ_IBV_EVENT_SRQ_ERR = 14,
  AGOQ_IBV_EVENT_SRQ_LIMIT_REACHED = 15,
  AGOQ_IBV_EVENT_QP_LAST_WQE_REACHED = 16,
  AGOQ_IBV_EVENT_CLIENT_REREGISTER = 17,
  AGOQ_IBV_EVENT_GID_CHANGE = 18,
};

/* ---- objects ------------------------------------------------------------------------ */
struct agoq_ibv_context;
struct agoq_ibv_cq;
struct agoq_ibv_qp;
struct agoq_ibv_srq;

typedef union agoq_ibv_gid {
  uint8_t raw[16];
  struct {
    uint64_t subnet_prefix; /* big endian */
    uint64_t interface_id;  /* big endian */
  } global;
} agoq_ibv_gid;

struct agoq_ibv_gid_entry {
  agoq_ibv_gid gid;
  uint32_t gid_index;
  uint32_t port_num;
  uint32_t gid_type; /* AGOQ_IBV_GID_TYPE_* */
  uint32_t ndev_ifindex;
};

#define AGOQ_IBV_SYSFS_NAME_MAX 64
#define AGOQ_IBV_SYSFS_PATH_MAX 256

struct agoq_ibv_device {
  void* _obsolete_ops[2];
  int node_type;      /* enum ibv_node_type */
  int transport_type; /* enum ibv_transport_type */
  char name[AGOQ_IBV_SYSFS_NAME_MAX];
  char dev_name[AGOQ_IBV_SYSFS_NAME_MAX];
  char dev_path[AGOQ_IBV_SYSFS_PATH_MAX];
  char ibdev_path[AGOQ_IBV_SYSFS_PATH_MAX];
};

struct agoq_ibv_device_attr {
  char fw_ver[64];
  uint64_t node_guid;      /* big endian */
  uint64_t sys_image_guid; /* big endian */
  uint64_t max_mr_size;
  uint64_t page_size_cap;
  uint32_t vendor_id;
  uint32_t vendor_part_id;
  uint32_t hw_ver;
  int max_qp;
  int max_qp_wr;
  unsigned int device_cap_flags;
  int max_sge;
  int max_sge_rd;
  int max_cq;
  int max_cqe;
  int max_mr;
  int max_pd;
  int max_qp_rd_atom;
  int max_ee_rd_atom;
  int max_res_rd_atom;
  int max_qp_init_rd_atom;
  int max_ee_init_rd_atom;
  int atomic_cap;
  int max_ee;
  int max_rdd;
  int max_mw;
  int max_raw_ipv6_qp;
  int max_raw_ethy_qp;
  int max_mcast_grp;
  int max_mcast_qp_attach;
  int max_total_mcast_qp_attach;
  int max_ah;
  int max_fmr;
  int max_map_per_fmr;
  int max_srq;
  int max_srq_wr;
  int max_srq_sge;
  uint16_t max_pkeys;
  uint8_t local_ca_ack_delay;
  uint8_t phys_port_cnt;
};

/* The exported ibv_query_port (IBVERBS_1.1) fills the fields up to link_layer only (its
 * "_compat_ibv_port_attr"); callers zero the struct first, so flags and port_cap_flags2
 * read as 0 from the exported entry point. */
struct agoq_ibv_port_attr {
  int state;      /* AGOQ_IBV_PORT_* */
  int max_mtu;    /* AGOQ_IBV_MTU_* */
  int active_mtu; /* AGOQ_IBV_MTU_* */
  int gid_tbl_len;
  uint32_t port_cap_flags;
  uint32_t max_msg_sz;
  uint32_t bad_pkey_cntr;
  uint32_t qkey_viol_cntr;
  uint16_t pkey_tbl_len;
  uint16_t lid;
  uint16_t sm_lid;
  uint8_t lmc;
  uint8_t max_vl_num;
  uint8_t sm_sl;
  uint8_t subnet_timeout;
  uint8_t init_type_reply;
  uint8_t active_width;
  uint8_t active_speed;
  uint8_t phys_state;
  uint8_t link_layer;
  uint8_t flags;
  uint16_t port_cap_flags2;
};
/* Bytes the exported ibv_query_port writes: the struct up to and including link_layer,
 * rounded to its 4-byte alignment. */
#define AGOQ_IBV_PORT_ATTR_COMPAT_SIZE 48

struct agoq_ibv_pd {
  struct agoq_ibv_context* context;
  uint32_t handle;
};

struct agoq_ibv_mr {
  struct agoq_ibv_context* context;
  struct agoq_ibv_pd* pd;
  void* addr;
  size_t length;
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
};

struct agoq_ibv_comp_channel {
  struct agoq_ibv_context* context;
  int fd;
  int refcnt;
};

struct agoq_ibv_cq {
  struct agoq_ibv_context* context;
  struct agoq_ibv_comp_channel* channel;
  void* cq_context;
  uint32_t handle;
  int cqe;
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint32_t comp_events_completed;
  uint32_t async_events_completed;
};

struct agoq_ibv_qp_cap {
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
};

struct agoq_ibv_qp_init_attr {
  void* qp_context;
  struct agoq_ibv_cq* send_cq;
  struct agoq_ibv_cq* recv_cq;
  struct agoq_ibv_srq* srq;
  struct agoq_ibv_qp_cap cap;
  int qp_type; /* AGOQ_IBV_QPT_* */
  int sq_sig_all;
};

struct agoq_ibv_global_route {
  agoq_ibv_gid dgid;
  uint32_t flow_label;
  uint8_t sgid_index;
  uint8_t hop_limit;
  uint8_t traffic_class;
};

struct agoq_ibv_ah_attr {
  struct agoq_ibv_global_route grh;
  uint16_t dlid;
  uint8_t sl;
  uint8_t src_path_bits;
  uint8_t static_rate;
  uint8_t is_global;
  uint8_t port_num;
};

struct agoq_ibv_qp_attr {
  int qp_state;     /* AGOQ_IBV_QPS_* */
  int cur_qp_state; /* AGOQ_IBV_QPS_* */
  int path_mtu;     /* AGOQ_IBV_MTU_* */
  int path_mig_state;
  uint32_t qkey;
  uint32_t rq_psn;
  uint32_t sq_psn;
  uint32_t dest_qp_num;
  unsigned int qp_access_flags;
  struct agoq_ibv_qp_cap cap;
  struct agoq_ibv_ah_attr ah_attr;
  struct agoq_ibv_ah_attr alt_ah_attr;
  uint16_t pkey_index;
  uint16_t alt_pkey_index;
  uint8_t en_sqd_async_notify;
  uint8_t sq_draining;
  uint8_t max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t min_rnr_timer;
  uint8_t port_num;
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint8_t alt_port_num;
  uint8_t alt_timeout;
  uint32_t rate_limit;
};

struct agoq_ibv_qp {
  struct agoq_ibv_context* context;
  void* qp_context;
  struct agoq_ibv_pd* pd;
  struct agoq_ibv_cq* send_cq;
  struct agoq_ibv_cq* recv_cq;
  struct agoq_ibv_srq* srq;
  uint32_t handle;
  uint32_t qp_num;
  int state;   /* AGOQ_IBV_QPS_* */
  int qp_type; /* AGOQ_IBV_QPT_* */
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint32_t events_completed;
};

struct agoq_ibv_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct agoq_ibv_send_wr {
  uint64_t wr_id;
  struct agoq_ibv_send_wr* next;
  struct agoq_ibv_sge* sg_list;
  int num_sge;
  int opcode; /* AGOQ_IBV_WR_* */
  unsigned int send_flags;
  uint32_t imm_data; /* network byte order */
  union {
    struct {
      uint64_t remote_addr;
      uint32_t rkey;
    } rdma;
    struct {
      uint64_t remote_addr;
      uint64_t compare_add;
      uint64_t swap;
      uint32_t rkey;
    } atomic;
    struct {
      void* ah;
      uint32_t remote_qpn;
      uint32_t remote_qkey;
    } ud;
  } wr;
  union {
    struct {
      uint32_t remote_srqn;
    } xrc;
  } qp_type;
  /* bind_mw / tso: unused by agoq; kept for the size (a pointer, a key and a bind info). */
  union {
    struct {
      void* mw;
      uint32_t rkey;
      struct {
        void* mr;
        uint64_t addr;
        uint64_t length;
        unsigned int mw_access_flags;
      } bind_info;
    } bind_mw;
    struct {
      void* hdr;
      uint16_t hdr_sz;
      uint16_t mss;
    } tso;
  } ext;
};

struct agoq_ibv_recv_wr {
  uint64_t wr_id;
  struct agoq_ibv_recv_wr* next;
  struct agoq_ibv_sge* sg_list;
  int num_sge;
};

struct agoq_ibv_wc {
  uint64_t wr_id;
  int status; /* AGOQ_IBV_WC_* status */
  int opcode; /* AGOQ_IBV_WC_* opcode */
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_data; /* network byte order; only with AGOQ_IBV_WC_WITH_IMM */
  uint32_t qp_num;
  uint32_t src_qp;
  unsigned int wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
};

struct agoq_ibv_async_event {
  union {
    struct agoq_ibv_cq* cq;
    struct agoq_ibv_qp* qp;
    struct agoq_ibv_srq* srq;
    void* wq;
    int port_num;
  } element;
  int event_type; /* AGOQ_IBV_EVENT_* */
};

/* The context's operations: 32 entries in verbs.h's order. agoq calls three of them, as
 * the inline ibv_post_send / ibv_post_recv / ibv_poll_cq of verbs.h do; the others are
 * legacy slots a provider may leave NULL. */
struct agoq_ibv_context_ops {
  void* _slots_0_10[11]; /* _compat_query_device .. _compat_create_cq */
  int (*poll_cq)(struct agoq_ibv_cq* cq, int num_entries, struct agoq_ibv_wc* wc);
  int (*req_notify_cq)(struct agoq_ibv_cq* cq, int solicited_only);
  void* _slots_13_24[12]; /* _compat_cq_event .. _compat_destroy_qp */
  int (*post_send)(struct agoq_ibv_qp* qp, struct agoq_ibv_send_wr* wr, struct agoq_ibv_send_wr** bad_wr);
  int (*post_recv)(struct agoq_ibv_qp* qp, struct agoq_ibv_recv_wr* wr, struct agoq_ibv_recv_wr** bad_wr);
  void* _slots_27_31[5]; /* _compat_create_ah .. _compat_async_event */
};

struct agoq_ibv_context {
  struct agoq_ibv_device* device;
  struct agoq_ibv_context_ops ops;
  int cmd_fd;
  int async_fd;
  int num_comp_vectors;
  pthread_mutex_t mutex;
  void* abi_compat;
};

/* ---- exported functions, by the versions agoq binds them to ------------------------- */
#define AGOQ_IBV_FUNCTIONS(X)                                                                         \
  /* name, symbol, version, required, return type, parameters */                                     \
  X(get_device_list, "ibv_get_device_list", "IBVERBS_1.1", 1, struct agoq_ibv_device**, (int* num))  \
  X(free_device_list, "ibv_free_device_list", "IBVERBS_1.1", 1, void, (struct agoq_ibv_device** list)) \
  X(open_device, "ibv_open_device", "IBVERBS_1.1", 1, struct agoq_ibv_context*,                      \
    (struct agoq_ibv_device * dev))                                                                  \
  X(close_device, "ibv_close_device", "IBVERBS_1.1", 1, int, (struct agoq_ibv_context * ctx))        \
  X(query_device, "ibv_query_device", "IBVERBS_1.1", 1, int,                                         \
    (struct agoq_ibv_context * ctx, struct agoq_ibv_device_attr * attr))                             \
  X(query_port, "ibv_query_port", "IBVERBS_1.1", 1, int,                                             \
    (struct agoq_ibv_context * ctx, uint8_t port, struct agoq_ibv_port_attr * attr))                 \
  X(query_gid, "ibv_query_gid", "IBVERBS_1.1", 1, int,                                               \
    (struct agoq_ibv_context * ctx, uint8_t port, int index, agoq_ibv_gid* gid))                     \
  X(query_gid_ex, "_ibv_query_gid_ex", "IBVERBS_1.11", 0, int,                                       \
    (struct agoq_ibv_context * ctx, uint32_t port, uint32_t index, struct agoq_ibv_gid_entry * entry, \
     uint32_t flags, size_t entry_size))                                                             \
  X(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1", 1, struct agoq_ibv_pd*, (struct agoq_ibv_context * ctx)) \
  X(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1", 1, int, (struct agoq_ibv_pd * pd))                  \
  X(reg_mr, "ibv_reg_mr", "IBVERBS_1.1", 1, struct agoq_ibv_mr*,                                     \
    (struct agoq_ibv_pd * pd, void* addr, size_t length, int access))                                \
  X(reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8", 0, struct agoq_ibv_mr*,                         \
    (struct agoq_ibv_pd * pd, void* addr, size_t length, uint64_t iova, unsigned int access))        \
  X(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", 0, struct agoq_ibv_mr*,                      \
    (struct agoq_ibv_pd * pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access))    \
  X(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1", 1, int, (struct agoq_ibv_mr * mr))                      \
  X(create_cq, "ibv_create_cq", "IBVERBS_1.1", 1, struct agoq_ibv_cq*,                               \
    (struct agoq_ibv_context * ctx, int cqe, void* cq_context, struct agoq_ibv_comp_channel* channel, \
     int comp_vector))                                                                               \
  X(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1", 1, int, (struct agoq_ibv_cq * cq))                  \
  X(create_qp, "ibv_create_qp", "IBVERBS_1.1", 1, struct agoq_ibv_qp*,                               \
    (struct agoq_ibv_pd * pd, struct agoq_ibv_qp_init_attr * attr))                                  \
  X(modify_qp, "ibv_modify_qp", "IBVERBS_1.1", 1, int,                                               \
    (struct agoq_ibv_qp * qp, struct agoq_ibv_qp_attr * attr, int mask))                             \
  X(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1", 1, int, (struct agoq_ibv_qp * qp))                  \
  X(get_async_event, "ibv_get_async_event", "IBVERBS_1.1", 1, int,                                   \
    (struct agoq_ibv_context * ctx, struct agoq_ibv_async_event * event))                            \
  X(ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1", 1, void,                                  \
    (struct agoq_ibv_async_event * event))                                                           \
  X(event_type_str, "ibv_event_type_str", "IBVERBS_1.1", 1, const char*, (int event))                \
  X(wc_status_str, "ibv_wc_status_str", "IBVERBS_1.1", 1, const char*, (int status))                 \
  X(fork_init, "ibv_fork_init", "IBVERBS_1.1", 1, int, (void))

#endif
