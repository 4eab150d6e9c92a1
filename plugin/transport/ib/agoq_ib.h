/*
 * Internal state of the verbs (InfiniBand / RoCE) transport.
 *
 * Devices: one per ACTIVE port that passes AGOQ_IB_HCA, each with its own verbs context,
 * protection domain and chosen GID (agoq_ib_init.c).
 *
 * Connections (one direction each) are bootstrapped over a TCP transport connection: its
 * handshake binds the connection to the communicator and the listen instance and rejects
 * rogue peers; the two sides then trade queue-pair metadata (agoq_ib_wire.h) over it, bring
 * their RC queue pairs to RTS and keep it to notice a peer that is gone (agoq_ib_setup.c).
 *
 * Data (agoq_ib_data.c), a rendezvous that keeps matching in the net core: the sender
 * writes each message's description (RTS: sequence number, tag, size, flags, and the bytes
 * themselves when small) into the receiver's RTS ring with RDMA WRITE_WITH_IMM; the
 * receiver matches it against its oldest posted receive (agoq_tp_match_fn) and answers in
 * the sender's CTS ring: "consumed" for an inline message, or the address and key to write
 * to; the sender then RDMA WRITEs the payload, striped over the connection's queue pairs,
 * each stripe ending with WRITE_WITH_IMM so the receiver counts the stripes that landed.
 * A ring slot is reused only by the message AGOQ_IB_RING_SLOTS later, and a message is
 * done only once its receiver has answered, so a slot is never overwritten while in use.
 */
#ifndef AGOQ_IB_H
#define AGOQ_IB_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "agoq_ibport.h"
#include "transport/agoq_transport.h"
#include "transport/ib/agoq_ib_wire.h"
#include "transport/ib/agoq_ibv_load.h"

#define AGOQ_IB_MAX_DEVS 32
/* Ring slots per connection: one per transfer the net core can have posted. */
#define AGOQ_IB_RING_SLOTS AGOQ_XFER_MAX_POSTED
/* Largest message that travels inside its RTS slot (no registration, one round trip). */
#define AGOQ_IB_EAGER_MAX 8192u
#define AGOQ_IB_RTS_SLOT_SIZE (AGOQ_IB_RTS_HDR_SIZE + AGOQ_IB_EAGER_MAX)
/* A payload is striped over the queue pairs in stripes of at least this many bytes. */
#define AGOQ_IB_STRIPE_MIN (128u << 10)
/* One work request moves at most this many bytes (the port's max_msg_sz is 2 GiB or more). */
#define AGOQ_IB_WR_MAX_BYTES (1u << 30)
/* Work requests each queue pair can hold: every ring slot's notification plus one payload
 * stripe of up to 2 work requests per slot. */
#define AGOQ_IB_QP_SEND_WR (3 * AGOQ_IB_RING_SLOTS)
#define AGOQ_IB_QP_RECV_WR (2 * AGOQ_IB_RING_SLOTS)
/* The first completion error is logged in full; flushes after it are only counted. */

typedef struct agoq_ib_mr agoq_ib_mr;

/* One usable port: a NCCL net device. */
typedef struct agoq_ib_dev {
  char dev_name[64];
  int port;
  struct agoq_ibv_context* ctx;
  struct agoq_ibv_pd* pd;
  int link_layer; /* AGOQ_IBV_LINK_LAYER_* */
  int active_mtu; /* AGOQ_IBV_MTU_* */
  uint16_t lid;
  int gid_index;
  uint8_t gid[16];
  int speed_mbps;
  bool speed_known; /* false: AGOQ_IB_DEFAULT_SPEED_MBPS stands in */
  uint64_t guid;
  bool has_pci_path;
  char pci_path[PATH_MAX];
  int max_qp;
  int max_qp_wr;
  int max_cqe;
  char describe[192]; /* one line for INFO and agoq-info */
  /* GPUDirect RDMA: the device registers dma-bufs (ibv_reg_dmabuf_mr), so GPU memory that
   * the CUDA driver exports as one is written and read by the HCA itself; gdr says which
   * way GPU memory is reached and why (agoq-info, INFO). */
  bool dmabuf;
  char gdr[256];
  /* Live registrations in pd (agoq_ib_mr.c, under its lock) and how they were had. */
  agoq_ib_mr* mrs;
  uint64_t mr_made, mr_shared;
  /* What the asynchronous events said (agoq_ib_async.c; written by the helper thread). */
  atomic_int port_down;  /* IBV_EVENT_PORT_ERR, until IBV_EVENT_PORT_ACTIVE */
  int64_t port_down_ms;  /* when (set before port_down) */
  atomic_int fatal;      /* IBV_EVENT_DEVICE_FATAL: the device carries nothing more */
} agoq_ib_dev;

/* A registration shared by everything that uses its pages (agoq_ib_mr.c); the transport's
 * reg key. */
struct agoq_ib_mr {
  uint32_t magic;
  agoq_ib_dev* dev;
  uintptr_t start, end; /* whole pages (a dma-buf's: the bytes registered) */
  bool dmabuf;          /* GPU memory (ibv_reg_dmabuf_mr): a dma-buf is shared only with dma-bufs */
  struct agoq_ibv_mr* mr;
  int refs;
  struct agoq_ib_mr* next;
};

/* Process-wide state, fixed after the first successful init. */
typedef struct {
  agoq_ibv_api api;
  agoq_ib_dev devs[AGOQ_IB_MAX_DEVS];
  int ndevs;
  int tc, sl, timeout, retry_cnt, nqps;
  int64_t answer_timeout_ms; /* AGOQ_TIMEOUT_S: a sender waiting this long for its peer fails; 0 waits */
  agoq_ib_gid_policy gid_policy;
} agoq_ib_state;

extern agoq_ib_state agoq_ib;

/* Discovery as init does it, for init and agoq-info: loads the library, lists the ports,
 * applies AGOQ_IB_HCA and chooses each port's GID, logging every port's fate at INFO (and
 * through report, when not NULL, one line per port and per decision). Returns ncclSuccess
 * with st->ndevs > 0; otherwise an error with why (no library, no device, no ACTIVE port,
 * an invalid setting) in why. Opened contexts are closed again on failure. */
typedef void (*agoq_ib_report_fn)(void* arg, const char* line);
ncclResult_t agoq_ib_discover(agoq_ib_state* st, agoq_ib_report_fn report, void* report_arg, char* why,
                              size_t why_len);
void agoq_ib_release(agoq_ib_state* st);

/* Work request ids: what the completion is for, in the top byte; its ring slot or queue
 * pair below. */
typedef enum { AGOQ_IB_WR_RTS = 1, AGOQ_IB_WR_CTS = 2, AGOQ_IB_WR_DATA = 3, AGOQ_IB_WR_RECV = 4 } agoq_ib_wr_kind;
static inline uint64_t agoq_ib_wr_id(agoq_ib_wr_kind kind, uint32_t index) {
  return ((uint64_t)kind << 56) | index;
}

/* Sender's view of one message, by ring slot (seq % AGOQ_IB_RING_SLOTS). */
typedef struct {
  agoq_xfer* x;            /* NULL: the slot is free */
  uint32_t seq;
  int writes_pending;      /* payload work requests not completed yet */
  bool eager;              /* the payload went inline with the RTS */
  agoq_ib_mr* mr;          /* a reference on the payload's registration until it is done */
} agoq_ib_send_slot;

/* Receiver's view of one message, by ring slot. */
typedef struct {
  agoq_xfer* x;            /* NULL: no payload expected in this slot */
  uint32_t seq;
  int buf;                 /* which buffer of x it fills */
  uint64_t size;
  uint32_t stripes_expected, stripes_done;
  agoq_ib_mr* mr; /* a reference, as the sender's */
} agoq_ib_recv_slot;

/* Per posted transfer (by agoq_xfer.index). */
typedef struct {
  bool done;
  int pending; /* receive: buffers whose bytes have not all landed */
  /* References taken at post on the caller's keys (agoq_xfer.reg): the caller may
   * deregister while the transfer is in flight (NCCL closing with requests posted), so the
   * region must live until the transfer is done with it. */
  agoq_ib_mr* mr[AGOQ_XFER_MAX_BUFS];
} agoq_ib_xfer;

typedef struct agoq_ib_conn {
  uint32_t magic;
  /* Everything below is the owner's and the progress helper's: both hold mu. */
  pthread_mutex_t mu;
  struct agoq_ib_conn* helper_next; /* the helper's list (its own lock) */
  bool is_send;
  int dev;
  agoq_ib_dev* d;
  int nqps;
  struct agoq_ibv_qp* qps[AGOQ_IB_MAX_QPS];
  struct agoq_ibv_cq* cq;
  /* The ring the peer writes into (sender: CTS, receiver: RTS), and the area this side
   * composes its own writes in (sender: RTS slots, receiver: CTS entries). */
  uint8_t* ring;
  size_t ring_slot;
  /* Slots of both rings: AGOQ_IB_RING_SLOTS, or AGOQ_TP_FEW_DEPTH for a connection that keeps
   * few messages in flight (the connecting side's choice, carried in its metadata). A
   * power of two: slot = seq % nslots across the sequence's wrap. */
  uint32_t nslots;
  struct agoq_ibv_mr* ring_mr;
  uint8_t* out;
  size_t out_slot;
  struct agoq_ibv_mr* out_mr;
  uint64_t peer_ring_addr;
  uint32_t peer_ring_rkey;
  size_t peer_slot;
  uint32_t eager_max;
  char peer_gid[48];
  int peer_mtu;
  /* The TCP bootstrap connection, kept open: its end (the peer closed its side or died)
   * is how a connection with transfers in flight learns that no answer will come. */
  agoq_tp_conn* boot;
  int64_t peer_gone_ms;   /* when the bootstrap ended, 0 while it is open */
  int64_t last_answer_ms; /* sender: the last completion of any kind (AGOQ_TIMEOUT_S) */
  uint32_t liveness_tick;
  atomic_int error;       /* first failure (ncclResult_t) */
  bool error_logged;
  uint64_t flushed;       /* work requests flushed after the first error */
  uint64_t transient_regs; /* payloads nothing had registered, registered for one message */
  agoq_ib_xfer xs[AGOQ_XFER_MAX_POSTED];
  /* Sender: sends whose RTS waits for its ring slot; receiver: posted receives not fully
   * matched yet. Oldest first. */
  agoq_xfer* fifo[AGOQ_XFER_MAX_POSTED];
  uint32_t fifo_head, fifo_count;
  uint32_t busy_slots;    /* ring slots whose message is not done (sends, or payloads expected) */
  /* Sender. */
  uint32_t send_seq;      /* next message number */
  agoq_ib_send_slot sends[AGOQ_IB_RING_SLOTS];
  /* Receiver. */
  uint32_t rts_arrived;   /* RTS notifications received (in order, on queue pair 0) */
  uint32_t rts_matched;   /* RTS matched to a receive */
  agoq_ib_recv_slot rslots[AGOQ_IB_RING_SLOTS];
  agoq_tp_match_fn match;
  void* match_arg;
  char peer[96];
} agoq_ib_conn;

#define AGOQ_IB_CONN_MAGIC 0x4e434241u /* "ABCN" */

/* Setup (agoq_ib_setup.c). */
ncclResult_t agoq_ib_listen(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_listen** out);
/* Its TCP bootstrap's, inline-only: one (queue pairs and completion queues are not files). */
unsigned agoq_ib_conn_fds(unsigned listen_flags);
ncclResult_t agoq_ib_accept(agoq_tp_listen* l, agoq_tp_conn** out);
ncclResult_t agoq_ib_close_listen(agoq_tp_listen* l);
ncclResult_t agoq_ib_connect(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_conn** out);
void agoq_ib_connect_abort(void* handle);
void agoq_ib_conn_destroy(agoq_ib_conn* c);
int64_t agoq_ib_now_ms(void);

/* Bytes of the connection's two rings (registered, pinned): what its depth costs. */
size_t agoq_ib_conn_ring_bytes(const agoq_ib_conn* c);
/* Queue pairs (agoq_ib_qp.c): the connection's CQ, QPs in INIT with their receives posted,
 * its rings registered; then RTR and RTS against the peer's metadata. */
ncclResult_t agoq_ib_conn_resources(agoq_ib_conn* c, int nqps);
void agoq_ib_meta_fill(const agoq_ib_conn* c, agoq_ib_meta* m);
ncclResult_t agoq_ib_conn_ready(agoq_ib_conn* c, const agoq_ib_meta* peer);
ncclResult_t agoq_ib_post_recv_wr(agoq_ib_conn* c, int qp);
/* Registers [addr, addr+bytes) in the connection's protection domain; a failure is logged
 * (what: "ring", "payload", ...) and fails the connection. */
ncclResult_t agoq_ib_reg(agoq_ib_conn* c, void* addr, size_t bytes, int access, struct agoq_ibv_mr** out,
                         const char* what);

/* Registrations (agoq_ib_mr.c). agoq_ib_mr_get takes a reference on a live registration
 * of d covering [addr, addr+size) or makes one (*made, when not NULL; logged on failure);
 * agoq_ib_mr_put drops it, and the last reference deregisters. */
ncclResult_t agoq_ib_mr_get(agoq_ib_dev* d, void* addr, size_t size, agoq_ib_mr** out, bool* made);
void agoq_ib_mr_put(agoq_ib_mr* m);
/* GPU memory [addr, addr + size), bytes [offset, offset + size) of dma-buf fd: registered
 * with iova addr (the address NCCL and the peer use), shared with a live dma-buf
 * registration that covers it. */
ncclResult_t agoq_ib_mr_get_dmabuf(agoq_ib_dev* d, void* addr, size_t size, uint64_t offset, int fd,
                                   agoq_ib_mr** out);
bool agoq_ib_mr_covers(const agoq_ib_mr* m, const void* addr, size_t size);
/* Unload: whatever the caller never deregistered (said at INFO). */
void agoq_ib_mr_release_dev(agoq_ib_state* st, agoq_ib_dev* d);
/* The transport's reg and dereg (agoq_transport.h). */
ncclResult_t agoq_ib_reg_key(int dev, void* addr, size_t size, void** key);
ncclResult_t agoq_ib_reg_dmabuf_key(int dev, void* addr, size_t size, uint64_t offset, int fd, void** key);
void agoq_ib_dereg_key(void* key);
/* A reference on the registration a caller's key names (NULL: none, or not ours). */
agoq_ib_mr* agoq_ib_mr_ref(void* key);
/* The registration a transfer's buffer uses, as a reference for the caller to put when the
 * message is done: `held` (a reference, taken over) when it covers the buffer on this
 * connection's device, else a live region covering it, else one made for this message
 * (counted, said once). A failure fails the connection. */
ncclResult_t agoq_ib_mr_for(agoq_ib_conn* c, agoq_ib_mr* held, void* addr, size_t size, agoq_ib_mr** out);

/* Data (agoq_ib_data.c). */
ncclResult_t agoq_ib_post_send(agoq_tp_conn* c, agoq_xfer* x);
ncclResult_t agoq_ib_post_recv(agoq_tp_conn* c, agoq_xfer* x);
ncclResult_t agoq_ib_progress(agoq_tp_conn* c, agoq_xfer* x);
bool agoq_ib_done(agoq_tp_conn* c, const agoq_xfer* x);
/* Fails the connection with res after logging what; the first failure wins. */
void agoq_ib_conn_fail(agoq_ib_conn* c, ncclResult_t res);

/* Polls the completion queue and handles what arrived; with match, also matches arrived
 * messages to posted receives (the owner only: it calls into the net core). Caller holds
 * c->mu. Returns whether transfers are in flight. */
bool agoq_ib_conn_poll(agoq_ib_conn* c, bool match);

/* The progress helper (agoq_ib_helper.c). */
void agoq_ib_helper_attach(agoq_ib_conn* c);
void agoq_ib_helper_detach(agoq_ib_conn* c);
int agoq_ib_helper_threads(void);
void agoq_ib_helper_stop_when_idle(void);
void agoq_ib_helper_shutdown(void); /* stops it even with connections attached */

/* Asynchronous events (agoq_ib_async.c): handles the events queued on the devices' contexts
 * without blocking (logs each; keeps what it says about ports; a device error marks the
 * device fatal). Returns how many it handled. */
int agoq_ib_async_drain(agoq_ib_state* st);

/* Completion errors (agoq_ib_errors.c): logs the first in full, with a hint for the known
 * causes, and counts the flushes after it. */
void agoq_ib_completion_error(agoq_ib_conn* c, const struct agoq_ibv_wc* wc);

#endif
