/*
 * The transport interface: what the net core (plugin/net/, NCCL's net contract) and CollNet
 * need from a way of moving bytes between hosts. One implementation per folder below
 * (tcp/, ib/); the net core never sees a socket or a queue pair.
 *
 * A transport provides devices and their properties, connection setup with its own
 * handshake through NCCL's 128-byte handle (listen/connect/accept never block: a NULL
 * result means "call again"), and ordered messages on a one-directional connection:
 * post_send of one byte range (or codec frame), post_recv of a grouped receive, progress
 * on the caller's thread, completion, the connection's first error, close.
 *
 * Matching rules (which buffer of a grouped receive takes a message, truncation, where a
 * frame is staged) belong to NCCL's contract, not to the transport: the transport asks the
 * net core through agoq_tp_match_fn when a message's description arrives.
 *
 * A transport includes no net or CollNet header (ARCHITECTURE.md section 5).
 */
#ifndef AGOQ_TRANSPORT_H
#define AGOQ_TRANSPORT_H

#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

#define AGOQ_XFER_MAX_BUFS 8 /* buffers of one grouped receive */
/* Transfers one connection can have posted at once: NCCL keeps NCCL_NET_MAX_REQUESTS
 * receives (each up to AGOQ_XFER_MAX_BUFS buffers) and as many times maxRecvs sends. */
#define AGOQ_XFER_MAX_POSTED (NCCL_NET_MAX_REQUESTS * AGOQ_XFER_MAX_BUFS)
#define AGOQ_TP_MAX_VDEVS 8

/* NCCL's handle: a transport encodes its address in [0, AGOQ_TP_HANDLE_WIRE_MAX) and may
 * keep a connect-in-progress pointer at AGOQ_TP_HANDLE_STATE_OFFSET; the bytes between are
 * free for the caller (CollNet keeps its group settings there). */
#define AGOQ_TP_HANDLE_WIRE_MAX 64
#define AGOQ_TP_HANDLE_STATE_OFFSET 96

/* Device properties in a version-neutral form; the tables copy them into
 * ncclNetProperties_vN_t. */
typedef struct {
  const char* name;
  const char* pci_path; /* NULL for a virtual interface */
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int force_flush;
  int speed_mbps;
  /* speed_mbps was reported by the link (sysfs, the port's rate), not a default. A choice
   * made from the rate (the CollNet schedule) ignores a guess. */
  bool speed_known;
  int port;
  float latency_us;
  int max_comms;
  int max_recvs;
  int net_device_type;
  int net_device_version;
  int vdev_count;
  int vdevs[AGOQ_TP_MAX_VDEVS];
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
  int16_t rail_id;
  int16_t plane_id;
} agoq_tp_props;

/* The message is a codec frame (the receiver decodes it and reports the decoded size). */
#define AGOQ_XFER_FRAME 0x1u
/* Send: the bytes lie in GPU memory registered by DMA-BUF (reg_dmabuf): only the HCA may
 * read them, never the CPU (no inline copy). */
#define AGOQ_XFER_DEVICE 0x2u
/* Match input: the transport will place the bytes with the HCA's DMA (an RDMA write into
 * the destination), not with the CPU, so GPU memory registered by DMA-BUF may take them. */
#define AGOQ_XFER_RDMA 0x4u

/* One posted transfer, owned by the caller until the transport reports it done. The
 * caller fills the buffers; the transport fills what arrived. `index` is unique among the
 * connection's posted transfers and below AGOQ_XFER_MAX_POSTED: the transport keeps its
 * per-transfer progress in its own table under that index. */
typedef struct {
  uint32_t index;
  int n;                               /* 1 for a send, 1..8 for a grouped receive */
  uint8_t* data[AGOQ_XFER_MAX_BUFS];   /* send: the bytes to send; receive: set by match */
  size_t size[AGOQ_XFER_MAX_BUFS];     /* send: bytes; receive: bytes that arrived */
  int tag;                             /* send only */
  uint32_t flags;                      /* send: AGOQ_XFER_FRAME or 0 */
  /* The caller's registration (agoq_transport.reg) of the memory holding data[i], NULL for
   * none: send, set with data; receive, set by the match function with the buffer. */
  void* reg[AGOQ_XFER_MAX_BUFS];
  uint32_t matched_mask;               /* receive: buffers a message has been matched to */
} agoq_xfer;

/* Receive side: a message of `size` bytes, `tag` and `flags` (AGOQ_XFER_FRAME as sent, plus
 * AGOQ_XFER_RDMA from the transport) arrived for the oldest posted receive `x`. The net core picks the buffer (*slot), checks the size against it and says
 * where the bytes go (*dst: NCCL's buffer or a staging buffer for a frame; x->reg[*slot]:
 * its registration or NULL). An error
 * result is already logged; the transport fails the connection with it. */
typedef ncclResult_t (*agoq_tp_match_fn)(void* arg, agoq_xfer* x, int tag, uint64_t size, uint32_t flags, int* slot,
                                         uint8_t** dst);

typedef struct agoq_tp_listen agoq_tp_listen;
typedef struct agoq_tp_conn agoq_tp_conn;

/* Which of its owner's I/O threads the calling thread's transport calls are working for: a
 * CollNet group's I/O thread number (AGOQ_COLLNET_IO_THREADS), or -1 for the owner's own
 * thread (the default). Only a transport that models each thread's CPU time reads it (the
 * CollNet simulation, tools/collnet/sim_transport.c); whoever sets it restores it. */
extern _Thread_local int agoq_tp_cpu_lane;

/* listen flags. INLINE: every message on the listen's connections is small and moves with
 * its header (CollNet frames, the verbs bootstrap): TCP opens no data sockets for them, so a
 * connection costs one descriptor (a CollNet group holds 2(n-1) connections on its mesh). */
#define AGOQ_TP_LISTEN_INLINE 1u
/* listen and connect flag. FEW: the owner keeps few messages in flight on each connection
 * (CollNet: at most AGOQ_COLL_SLOTS per connection), so verbs rings hold AGOQ_TP_FEW_DEPTH
 * slots instead of one per transfer the net core can post (a receiver's slot holds an
 * inline message: 8 KiB pinned each, 2.1 MB per connection at 256). More messages than
 * slots still go: they wait for a slot. The connecting side decides (its metadata carries
 * the ring's depth to the receiver); a listen passes it for the record. The net core gives
 * such a connection's comm AGOQ_TP_FEW_DEPTH requests instead of NCCL's 256 (a busy pool
 * is NCCL's "call again"). */
#define AGOQ_TP_FEW 2u
#define AGOQ_TP_FEW_DEPTH 16u

typedef struct {
  const char* name;
  /* Resolves devices and settings once per process (parameters already loaded); an invalid
   * setting or no usable device fails, logged. */
  ncclResult_t (*init)(void);
  /* The last communicator is gone: stop helper threads once no connection uses them. */
  void (*idle)(void);
  int (*ndevs)(void);
  /* Threads the transport keeps for itself (progress threads), for callers sizing their own. */
  int (*helper_threads)(void);
  ncclResult_t (*get_properties)(int dev, agoq_tp_props* props);
  /* CPUs of device `dev`'s NUMA node this process may use, for threads working for that
   * device; false when placement is off or unknown. */
  bool (*placement_cpus)(int dev, cpu_set_t* out);

  /* Setup. The net core checks NCCL's arguments (context, handle and result pointers, dev
   * below ndevs()) before it calls these, and hands back only the objects they returned:
   * a transport does not check them again. */
  ncclResult_t (*listen)(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_listen** out);
  /* File descriptors one connection of a listen with these flags holds at each end. */
  unsigned (*conn_fds)(unsigned listen_flags);
  ncclResult_t (*accept)(agoq_tp_listen* l, agoq_tp_conn** out);
  ncclResult_t (*close_listen)(agoq_tp_listen* l);
  ncclResult_t (*connect)(int dev, uint64_t comm_id, unsigned flags, void* handle, agoq_tp_conn** out);
  /* Abandons a connect in progress on this handle buffer (no-op when none). */
  void (*connect_abort)(void* handle);
  /* Receive side: how the transport asks where a message goes; set before the first post. */
  void (*set_match)(agoq_tp_conn* c, agoq_tp_match_fn fn, void* arg);

  /* Never block. A send or receive is posted in order; messages arrive in posting order. */
  ncclResult_t (*post_send)(agoq_tp_conn* c, agoq_xfer* x);
  ncclResult_t (*post_recv)(agoq_tp_conn* c, agoq_xfer* x);
  /* Moves what can move now on the caller's thread; `x` (may be NULL) is the transfer the
   * caller waits for. Returns the connection's error, if any. */
  ncclResult_t (*progress)(agoq_tp_conn* c, agoq_xfer* x);
  /* All of x's bytes are in place (receive) or handed to the network (send). */
  bool (*done)(agoq_tp_conn* c, const agoq_xfer* x);
  /* For a caller with nothing to do that would rather sleep than poll: the descriptors
   * whose readiness lets the connection's posted transfers progress on the caller's thread
   * (at most max, the count returned). *hidden is set when some progress is made by
   * helper threads instead, which no descriptor announces: then sleep briefly only. */
  int (*wait_fds)(agoq_tp_conn* c, struct pollfd* out, int max, bool* hidden);
  /* The first failure of the connection (ncclSuccess while healthy). */
  ncclResult_t (*error)(agoq_tp_conn* c);
  /* Fails the connection with res (the caller logged why). */
  void (*fail)(agoq_tp_conn* c, ncclResult_t res);
  /* Who is on the other end, for log lines. */
  const char* (*peer)(agoq_tp_conn* c);
  /* Releases everything; after it returns no helper thread touches posted buffers. */
  void (*close)(agoq_tp_conn* c);

  /* Bootstrap for another transport (NULL where unsupported): on a connection with nothing
   * posted, sends out[0, out_len) and receives exactly in_len bytes into in, both ways on
   * the connection's control channel, without blocking; call again until *done (the
   * buffers must stay the same until then). A closed or failed peer is ncclRemoteError,
   * logged at INFO only: the caller knows what it means and warns. */
  ncclResult_t (*exchange)(agoq_tp_conn* c, const void* out, size_t out_len, void* in, size_t in_len, bool* done);

  /* Memory registration, NULL where the transport reaches host memory without it (TCP).
   * Makes [addr, addr+size) usable by device dev's connections as a send source or a
   * receive destination; *key goes into agoq_xfer.reg of transfers inside it. Setup only
   * (regMr, a staging buffer's allocation): registering is slow on hardware. Registrations
   * of a range already registered are shared and counted. A transfer without a key still
   * works, at the cost of a registration per message. */
  ncclResult_t (*reg)(int dev, void* addr, size_t size, void** key);
  /* GPU memory [addr, addr + size) that the CUDA driver exported as dma-buf fd, whose byte
   * `offset` is addr's (NULL where the transport cannot, and its devices then do not
   * advertise NCCL_PTR_DMABUF). Transfers with the key move it without the CPU: sends with
   * AGOQ_XFER_DEVICE, receives matched with AGOQ_XFER_RDMA. The fd may be closed after. */
  ncclResult_t (*reg_dmabuf)(int dev, void* addr, size_t size, uint64_t offset, int fd, void** key);
  void (*dereg)(void* key); /* NULL is a no-op */
} agoq_transport;

extern const agoq_transport agoq_transport_tcp;
extern const agoq_transport agoq_transport_ib;

/* Clears p and fills what every transport's device shares: host pointers, NCCL's receive and
 * size limits, one physical device, no rail or plane (agoq_transport_choose.c). */
void agoq_tp_props_defaults(agoq_tp_props* p, int dev);

/* The transport AGOQ_TRANSPORT asks for, initialized (agoq_transport_choose.c): tcp, ib
 * (an error, logged with its reason, when no verbs port is usable), or auto (ib where a
 * port is usable, else tcp with the reason at INFO). */
ncclResult_t agoq_transport_choose(const agoq_transport** out);
/* Programs linking the plugin's internals (the CollNet simulation, tools/collnet): tp instead
 * of AGOQ_TRANSPORT's choice, for the whole process; call before the first init. Not
 * reachable through the plugin's exported tables. */
void agoq_transport_override(const agoq_transport* tp);

/* Why the last agoq_transport_choose took its transport, for the summary of what is in
 * effect ("AGOQ_TRANSPORT=tcp", "verbs off: no RDMA device ..."); "" before any choice. */
const char* agoq_transport_reason(void);

#endif
