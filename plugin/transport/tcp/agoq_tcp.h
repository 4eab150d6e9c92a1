/*
 * Internal state of the TCP transport: process-wide settings, listen endpoints, and the
 * connections (one control socket + N data sockets, one direction each).
 */
#ifndef AGOQ_TCP_H
#define AGOQ_TCP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "agoq_netif.h"
#include "transport/agoq_transport.h"
#include "transport/tcp/agoq_tcp_progress.h"
#include "transport/tcp/agoq_tcp_wire.h"

_Static_assert(AGOQ_HANDLE_WIRE_SIZE <= AGOQ_TP_HANDLE_WIRE_MAX, "the TCP handle fits the transport's share");
_Static_assert(AGOQ_HANDLE_STATE_OFFSET == AGOQ_TP_HANDLE_STATE_OFFSET, "connect state where the interface says");

/* Read-ahead buffer of a receiving control socket: room for a burst of headers and small
 * inline payloads; a larger payload is read straight into its destination. */
#define AGOQ_RX_BUF_SIZE (64u << 10)

/* Process-wide transport state, fixed after the first successful init. */
typedef struct {
  agoq_netif ifs[AGOQ_NETIF_MAX];
  int nifs;
  unsigned nsocks;     /* data sockets per connection this process asks for */
  int64_t inline_max;   /* bytes, AGOQ_TCP_INLINE_AUTO = by interface and algorithm */
  uint64_t min_chunk;
  int sndbuf, rcvbuf;   /* bytes, 0 = autotuning, AGOQ_TCP_BUF_AUTO = by interface */
  bool cc_auto;         /* AGOQ_SOCKET_CC=auto: a non-pacing algorithm on loopback */
  char cc[16];          /* AGOQ_SOCKET_CC=<name> for every socket; "" = see cc_auto */
  int keepalive_s;
  int timeout_s;
  int64_t handshake_timeout_ms;
  int max_pending;
  /* A refused, unreachable or dropped connect is tried again (NCCL_SOCKET_RETRY_CNT times,
   * waiting attempt x NCCL_SOCKET_RETRY_SLEEP_MSEC before each, as NCCL's own sockets do). */
  int64_t connect_retries, connect_retry_ms;
} agoq_transport_config;

extern agoq_transport_config agoq_config;

/* AGOQ_SOCKET_SNDBUF / RCVBUF / INLINE "auto" (the size parameter's first keyword). */
#define AGOQ_TCP_BUF_AUTO (-1)
#define AGOQ_TCP_INLINE_AUTO (-1)
/* What "auto" means (measured, agoq_params.def): buffers on a loopback interface under a
 * pacing congestion control; the inline threshold wherever messages are not all inline. */
#define AGOQ_TCP_LOOPBACK_SNDBUF (256 << 10)
#define AGOQ_TCP_LOOPBACK_RCVBUF (1 << 20)
#define AGOQ_TCP_INLINE_DEFAULT ((int64_t)4 << 20)
/* Whether congestion control `name` paces each socket by its own bandwidth estimate (bbr
 * and its versions): per-socket rates are then capped, so spreading over sockets pays. */
bool agoq_tcp_cc_paces(const char* name);
/* The algorithm a new socket of this process on device `dev` gets under AGOQ_SOCKET_CC
 * (the system's default is a fresh socket's); "" when it cannot be read. */
void agoq_tcp_cc_effective(const agoq_transport_config* c, int dev, char out[16]);
/* The socket buffer sizes to set on a socket of device `dev` under config c whose
 * congestion control paces or not (0: leave autotuning). */
void agoq_tcp_buffer_sizes(const agoq_transport_config* c, int dev, bool paces, int* sndbuf, int* rcvbuf);
/* The inline threshold of a connection on device `dev` whose control socket's algorithm
 * paces or not (UINT64_MAX: every message inline). */
uint64_t agoq_tcp_inline_max(const agoq_transport_config* c, int dev, bool paces);
/* The algorithms to try, in order, on a socket whose algorithm is now `current` (loopback:
 * its device is a loopback interface): up to 2 names into out, 0 when it keeps `current`. */
int agoq_tcp_cc_choice(const agoq_transport_config* c, bool loopback, const char* current, const char* out[2]);
/* AGOQ_SOCKET_CC's value into c (cc_auto, cc); an invalid name is logged, ncclInvalidArgument. */
ncclResult_t agoq_tcp_cc_resolve(agoq_transport_config* c, const char* value);

/* Loads the parameters and fills c as init does (interface discovery, topology, socket
 * options), so agoq-info shows the values the plugin uses, never a second copy of the
 * rules. A filter that matches nothing is ncclSystemError, logged with the interfaces that
 * exist; an invalid parameter value is ncclInvalidUsage. Starts nothing. */
ncclResult_t agoq_tcp_config_resolve(agoq_transport_config* c);

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

struct agoq_tp_listen {
  int dev;
  int fd;
  uint64_t comm_id;
  uint64_t nonce;
  agoq_pending_sock* pending; /* array of max_pending */
  int npending;
  agoq_conn_group* groups;
  int ngroups;
  unsigned accepted;
  bool said_emfile; /* accept ran out of descriptors: warned once */
  char addr[64];
};

/* Progress of one posted transfer (by agoq_xfer.index). */
typedef struct {
  /* Payload pieces handed to data sockets and not finished yet. */
  atomic_int pending_pieces;
  /* Sender: the header and inline payload are written (a receive is done when the net
   * core's match has placed all its buffers: agoq_tcp_done). */
  bool control_done;
  uint8_t wire_hdr[AGOQ_MSG_HDR_SIZE];
  size_t ctrl_sent, ctrl_total;
} agoq_tcp_xfer;

/* Transfers in posting order (headers to write, receives to match). */
typedef struct {
  agoq_xfer* items[AGOQ_XFER_MAX_POSTED];
  uint32_t head, count;
} agoq_xfer_fifo;

static inline bool agoq_fifo_push(agoq_xfer_fifo* f, agoq_xfer* x) {
  if (f->count == AGOQ_XFER_MAX_POSTED) return false;
  f->items[(f->head + f->count) % AGOQ_XFER_MAX_POSTED] = x;
  f->count++;
  return true;
}
/* The i-th oldest transfer, NULL past the end. */
static inline agoq_xfer* agoq_fifo_at(const agoq_xfer_fifo* f, uint32_t i) {
  return i < f->count ? f->items[(f->head + i) % AGOQ_XFER_MAX_POSTED] : NULL;
}
static inline void agoq_fifo_pop(agoq_xfer_fifo* f) {
  f->head = (f->head + 1) % AGOQ_XFER_MAX_POSTED;
  f->count--;
}

struct agoq_tp_conn {
  bool is_send;
  int dev;
  int ctrl_fd;
  unsigned nsocks;
  agoq_stream* streams;   /* nsocks data streams */
  atomic_int error;       /* first failure (ncclResult_t); shared with the streams */
  agoq_tcp_xfer xs[AGOQ_XFER_MAX_POSTED];
  agoq_xfer_fifo ctrl_fifo; /* send: headers to write; recv: receives to match */
  uint32_t seq;           /* next message number */
  unsigned next_sock;     /* data socket of the next message's first piece */
  uint64_t inline_max, min_chunk; /* sender's plan; the receiver follows each header */
  /* Receiver: control bytes read ahead, rx_buf[rx_off, rx_len) not consumed yet (one recv
   * takes in several headers and the small payloads behind them). */
  uint8_t* rx_buf;
  size_t rx_off, rx_len;
  /* Bytes taken from the control socket by the progress call under way (its budget). */
  size_t rx_moved;
  bool rx_last_large;     /* the last message's payload went straight to its destination */
  agoq_xfer* rx_inline;   /* inline payload being read, if any */
  int rx_inline_slot;
  uint8_t* rx_inline_dst;
  size_t rx_inline_got;
  agoq_tp_match_fn match;
  void* match_arg;
  /* agoq_tcp_exchange in progress: bytes sent and received so far. */
  size_t xchg_sent, xchg_got;
  char peer[64];
};

int64_t agoq_now_ms(void);
ncclResult_t agoq_socket_configure(int fd, int dev, const char* peer);
ncclResult_t agoq_tcp_conn_create(bool is_send, int dev, int ctrl_fd, const int* data_fds, unsigned nsocks,
                                  const char* peer, agoq_tp_conn** out);
void agoq_tcp_conn_destroy(agoq_tp_conn* c);

/* The bootstrap of another transport over the control socket (agoq_tcp_data.c). */
ncclResult_t agoq_tcp_exchange(agoq_tp_conn* c, const void* out, size_t out_len, void* in, size_t in_len, bool* done);

/* The data path (agoq_tcp_data.c). */
ncclResult_t agoq_tcp_post_send(agoq_tp_conn* c, agoq_xfer* x);
ncclResult_t agoq_tcp_post_recv(agoq_tp_conn* c, agoq_xfer* x);
ncclResult_t agoq_tcp_progress(agoq_tp_conn* c, agoq_xfer* x);
bool agoq_tcp_done(agoq_tp_conn* c, const agoq_xfer* x);
int agoq_tcp_wait_fds(agoq_tp_conn* c, struct pollfd* out, int max, bool* hidden);

/* Setup (agoq_tcp_setup.c). */
ncclResult_t agoq_tcp_listen(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_listen** out);
unsigned agoq_tcp_conn_fds(unsigned listen_flags);
ncclResult_t agoq_tcp_accept(agoq_tp_listen* l, agoq_tp_conn** out);
ncclResult_t agoq_tcp_close_listen(agoq_tp_listen* l);
ncclResult_t agoq_tcp_connect(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_conn** out);
void agoq_tcp_connect_abort(void* handle);

#endif
