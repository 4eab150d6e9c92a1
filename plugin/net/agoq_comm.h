/*
 * Internal state of the TCP transport: per-communicator context, listen comms, and the
 * send/recv comms of one connection (one control socket + N data sockets).
 */
#ifndef AGOQ_COMM_H
#define AGOQ_COMM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "net/agoq_net.h"
#include "net/agoq_progress.h"
#include "net/agoq_request.h"
#include "net/agoq_wire.h"
#include "agoq_netif.h"
#include "net/agoq_typed.h"
#include "core/agoq_stats.h"

#define AGOQ_CTX_MAGIC 0x58544341u    /* "ACTX" */
#define AGOQ_LISTEN_MAGIC 0x4e534c41u /* "ALSN" */
#define AGOQ_SEND_MAGIC 0x444e5341u   /* "ASND" */
#define AGOQ_RECV_MAGIC 0x56435241u   /* "ARCV" */
#define AGOQ_MR_MAGIC 0x52524d41u     /* "AMRR" */

/* Read-ahead buffer of a receiving control socket: room for a burst of headers and small
 * inline payloads; a larger payload is read straight into its destination. */
#define AGOQ_RX_BUF_SIZE (64u << 10)

typedef struct {
  uint32_t magic;
  uint64_t comm_id;
  int traffic_class;
  agoq_net_attr attr;
  ncclProfilerCallback_t prof_fn; /* NCCL's profiler callback (v10+), NULL before */
  agoq_stats_entry* st_send;      /* AGOQ_STATS: this context's p2p lines, else NULL */
  agoq_stats_entry* st_recv;
} agoq_ctx;

/* Process-wide transport state, fixed after the first successful init. */
typedef struct {
  agoq_netif ifs[AGOQ_NETIF_MAX];
  int nifs;
  unsigned nsocks;     /* data sockets per connection this process asks for */
  uint64_t inline_max;
  uint64_t min_chunk;
  int sndbuf, rcvbuf;
  int keepalive_s;
  int timeout_s;
  int64_t handshake_timeout_ms;
  int max_pending;
} agoq_transport_config;

extern agoq_transport_config agoq_config;

typedef struct {
  uint32_t magic;
  int type;
  void* addr;
  size_t size;
} agoq_mr;

/* A connection the listener accepted whose handshake is still incomplete. */
typedef struct {
  int fd;
  uint8_t hello[AGOQ_HELLO_SIZE];
  size_t got;
  int64_t deadline_ms;
  char peer[64];
} agoq_pending_sock;

/* Sockets of one connection collected so far, by index (0 = control). */
typedef struct agoq_conn_group {
  uint64_t conn_id;
  unsigned nsocks;
  unsigned have;
  int fds[AGOQ_WIRE_MAX_DATA_SOCKS + 1];
  int64_t deadline_ms;
  char peer[64];
  struct agoq_conn_group* next;
} agoq_conn_group;

typedef struct {
  uint32_t magic;
  int dev;
  int fd;
  uint64_t comm_id;
  uint64_t nonce;
  agoq_pending_sock* pending; /* array of max_pending */
  int npending;
  agoq_conn_group* groups;
  int ngroups;
  unsigned accepted;
  agoq_stats_entry* st_recv; /* its context's, for the comms it accepts */
  char addr[64];
} agoq_listen_comm;

typedef struct agoq_comm {
  uint32_t magic;
  bool is_send;
  int dev;
  int ctrl_fd;
  unsigned nsocks;
  agoq_stream* streams;   /* nsocks data streams */
  atomic_int error;       /* first failure (ncclResult_t); shared with the streams */
  bool error_reported;
  agoq_request_pool pool;
  agoq_request_fifo ctrl_fifo; /* send: headers to write; recv: receives to match */
  uint32_t seq;           /* next message number */
  unsigned next_sock;     /* data socket of the next message's first piece */
  uint64_t inline_max, min_chunk; /* sender's plan; the receiver follows each header */
  /* Receiver control state. */
  /* Control-socket bytes read ahead: one recv takes in several headers and the small
   * payloads behind them. rx_buf[rx_off, rx_len) is not consumed yet. */
  uint8_t* rx_buf;
  size_t rx_off, rx_len;
  agoq_request* rx_inline_req; /* inline payload being read, if any */
  int rx_inline_slot;
  size_t rx_inline_got;
  /* Typed payloads (agoq_typed.h). */
  ncclProfilerCallback_t prof_fn; /* sender: the oracle's way into NCCL's profiler */
  agoq_stage_cache stage;
  agoq_typed_stats typed_stats;
  agoq_stats_entry* st; /* AGOQ_STATS: the context's p2p send or receive entry, else NULL */
  char peer[64];
} agoq_comm;

/* Sender-side per-request control bytes (header) live in the request. */
int64_t agoq_now_ms(void);
ncclResult_t agoq_socket_configure(int fd, const char* peer);
ncclResult_t agoq_comm_create(bool is_send, int dev, int ctrl_fd, const int* data_fds, unsigned nsocks,
                              const char* peer, agoq_comm** out);
void agoq_comm_destroy(agoq_comm* comm);

#endif
