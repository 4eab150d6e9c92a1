/*
 * The type oracle: what the net data path asks NCCL's profiler chain about one transfer.
 *
 * NCCL's net isend/irecv carry no datatype. When agoq's own profiler (ncclProfiler_v5/v6,
 * exported from this .so) is the one NCCL loaded, a net transfer's profiler handle leads
 * through NCCL's callback to a NetPlugin event whose parent chain (ProxyStep -> ProxyOp ->
 * Coll or P2p task) consists of agoq's own event objects. agoq_oracle_query() starts and
 * stops that NetPlugin event with an agoq_xfer_desc as its data; the profiler's startEvent
 * fills the descriptor synchronously. Anything it cannot establish leaves the descriptor
 * unfilled, and the caller then sends the bytes exactly as they are.
 *
 * Shared by plugin/net (the caller) and plugin/profiler (the filler); knows nothing of the
 * transport.
 */
#ifndef AGOQ_ORACLE_H
#define AGOQ_ORACLE_H

#include <stdbool.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

/* "XAG2": a descriptor the net side owns. Changed with the descriptor's layout (two_way
 * added): a profiler of another agoq build that NCCL might load beside this net plugin
 * never writes past a descriptor of a layout it does not know; it leaves it unfilled,
 * and the transfer goes exact. */
#define AGOQ_XFER_DESC_MAGIC 0x32474158u

/* NCCL's profiler callback types (ncclProfilerNetEvent*). */
#define AGOQ_PROF_NET_EVENT_START 0
#define AGOQ_PROF_NET_EVENT_STOP 1
/* pluginId we pass with the NetPlugin event: (type << 16) | version, a type of our own so
 * that no other profiler mistakes our data for an IB or socket event's. */
#define AGOQ_PROF_NET_PLUGIN_ID ((int64_t)((0x41u << 16) | 1u))

typedef enum {
  AGOQ_XFER_UNKNOWN = 0, /* not filled: no agoq profiler, a dropped event, a foreign parent */
  AGOQ_XFER_P2P = 1,     /* part of an ncclSend/ncclRecv */
  AGOQ_XFER_COLL = 2     /* ring/tree traffic of a collective */
} agoq_xfer_kind;

typedef enum {
  AGOQ_XFER_PROTO_UNKNOWN = 0,
  AGOQ_XFER_PROTO_SIMPLE = 1,
  AGOQ_XFER_PROTO_LL = 2, /* LL, or a p2p small enough that NCCL may have chosen LL */
  AGOQ_XFER_PROTO_LL128 = 3
} agoq_xfer_proto;

typedef struct {
  uint32_t magic;       /* AGOQ_XFER_DESC_MAGIC, set by the caller */
  uint32_t filled;      /* 1 once the profiler recognised the whole chain */
  agoq_xfer_kind kind;
  int dtype;            /* ncclDataType_t value (ncclFloat32 = 7, ...), -1 unknown */
  agoq_xfer_proto proto;
  int is_send;          /* from the ProxyOp */
  int peer;             /* from the ProxyOp */
  uint64_t task_bytes;  /* count x datatype size of the whole p2p or collective */
  /* 1: a tracked p2p send whose communicator already carried a receive of the same
   * datatype and task bytes from the same peer (a two-way flow, as pipeline activations
   * and their gradients are; AGOQ_P2P_SCOPE=pipeline). 0 otherwise, and whenever unsure. */
  uint32_t two_way;
} agoq_xfer_desc;

/* Asks the profiler chain about the transfer whose NCCL profiler handle is `phandle`.
 * Returns true with *out filled, or false (out->filled == 0) when the type is unknown.
 * Never fails a transfer: any inconsistency means "unknown". Cheap: target < 1 us.
 * `prof_fn` is the callback NCCL passed to the net init (NULL: always unknown). */
bool agoq_oracle_query(ncclProfilerCallback_t prof_fn, void* phandle, agoq_xfer_desc* out);

/* True when agoq's profiler has been initialised by NCCL in this process (for the one-time
 * INFO that says why p2p payloads go exact). */
bool agoq_oracle_profiler_loaded(void);

#endif
