/*
 * What the verbs transport puts on the wire, encoded little-endian field by field and
 * decoded with every field validated (pure functions: unit-tested and fuzzed).
 *
 * Metadata (over the TCP bootstrap connection, each side once): the queue pairs and the
 * address of the ring the peer writes into. The connector (the sender of the data) offers
 * its CTS ring; the acceptor (the receiver) offers its RTS ring.
 *
 * RTS slot (sender -> receiver ring, by RDMA WRITE_WITH_IMM): one message's description
 * (sequence number, tag, size, flags), followed by its bytes when it is small enough to
 * travel inline (eager).
 * CTS entry (receiver -> sender ring, by RDMA WRITE_WITH_IMM): the answer to an RTS:
 * "consumed" (eager), "write here" (address, key; the payload follows by RDMA WRITE), or
 * "refused" (the receiver failed the connection, with its reason code).
 * Immediate data: kind in the top 2 bits, the message's sequence number below.
 */
#ifndef AGOQ_IB_WIRE_H
#define AGOQ_IB_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AGOQ_IB_WIRE_VERSION 1
#define AGOQ_IB_META_MAGIC 0x49514741u /* "AGQI" */
#define AGOQ_IB_RTS_MAGIC 0x52514741u  /* "AGQR" */
#define AGOQ_IB_CTS_MAGIC 0x43514741u  /* "AGQC" */
#define AGOQ_IB_MAX_QPS 8
#define AGOQ_IB_META_SIZE 192
#define AGOQ_IB_RTS_HDR_SIZE 32
#define AGOQ_IB_CTS_SIZE 32

typedef enum {
  AGOQ_IB_WIRE_OK = 0,
  AGOQ_IB_WIRE_BAD_MAGIC,
  AGOQ_IB_WIRE_BAD_VERSION,
  AGOQ_IB_WIRE_BAD_FIELD,
} agoq_ib_wire_status;

typedef struct {
  uint8_t role; /* 0: connector (sender), 1: acceptor (receiver) */
  uint8_t nqps;
  uint8_t link_layer; /* AGOQ_IBV_LINK_LAYER_* */
  uint8_t mtu;        /* AGOQ_IBV_MTU_*: the port's active MTU */
  uint8_t port;
  uint8_t gid_index;  /* informational: the peer's choice, for log lines */
  uint16_t lid;
  uint8_t gid[16];
  uint32_t qpn[AGOQ_IB_MAX_QPS];
  uint64_t ring_addr; /* the ring this side lets the peer write into */
  uint32_t ring_rkey;
  uint32_t ring_slots;
  uint32_t slot_size; /* bytes per slot (RTS: header + eager bytes; CTS: AGOQ_IB_CTS_SIZE) */
  uint32_t eager_max; /* acceptor: the largest payload an RTS slot carries */
} agoq_ib_meta;

#define AGOQ_IB_RTS_FLAG_FRAME 0x1u /* the payload is a codec frame (AGOQ_XFER_FRAME) */
#define AGOQ_IB_RTS_FLAG_EAGER 0x2u /* the payload follows the header in the slot */
/* The payload lies in GPU memory: written by RDMA even when small enough to go inline. */
#define AGOQ_IB_RTS_FLAG_DEVICE 0x4u
#define AGOQ_IB_RTS_FLAGS_KNOWN (AGOQ_IB_RTS_FLAG_FRAME | AGOQ_IB_RTS_FLAG_EAGER | AGOQ_IB_RTS_FLAG_DEVICE)

typedef struct {
  uint32_t seq;
  int32_t tag;
  uint64_t size;
  uint32_t flags;
} agoq_ib_rts;

typedef enum { AGOQ_IB_CTS_CONSUMED = 1, AGOQ_IB_CTS_WRITE = 2, AGOQ_IB_CTS_REFUSED = 3 } agoq_ib_cts_kind;

typedef struct {
  uint32_t seq;
  uint32_t kind; /* agoq_ib_cts_kind */
  uint64_t addr; /* WRITE: where the payload goes */
  uint32_t rkey; /* WRITE: its key */
  uint32_t code; /* REFUSED: the receiver's ncclResult_t */
  uint64_t size; /* WRITE: bytes expected (the RTS's size) */
} agoq_ib_cts;

typedef enum { AGOQ_IB_IMM_RTS = 1, AGOQ_IB_IMM_CTS = 2, AGOQ_IB_IMM_DATA = 3 } agoq_ib_imm_kind;
#define AGOQ_IB_IMM_SEQ_MASK 0x3fffffffu

static inline uint32_t agoq_ib_imm(agoq_ib_imm_kind kind, uint32_t seq) {
  return ((uint32_t)kind << 30) | (seq & AGOQ_IB_IMM_SEQ_MASK);
}
static inline agoq_ib_imm_kind agoq_ib_imm_kind_of(uint32_t imm) { return (agoq_ib_imm_kind)(imm >> 30); }
static inline uint32_t agoq_ib_imm_seq(uint32_t imm) { return imm & AGOQ_IB_IMM_SEQ_MASK; }

void agoq_ib_meta_encode(const agoq_ib_meta* m, uint8_t out[AGOQ_IB_META_SIZE]);
agoq_ib_wire_status agoq_ib_meta_decode(const uint8_t* in, size_t len, agoq_ib_meta* m);
void agoq_ib_rts_encode(const agoq_ib_rts* r, uint8_t out[AGOQ_IB_RTS_HDR_SIZE]);
/* eager_max: the receiver's own limit, which an eager RTS may not exceed. */
agoq_ib_wire_status agoq_ib_rts_decode(const uint8_t* in, size_t len, uint32_t eager_max, agoq_ib_rts* r);
void agoq_ib_cts_encode(const agoq_ib_cts* c, uint8_t out[AGOQ_IB_CTS_SIZE]);
agoq_ib_wire_status agoq_ib_cts_decode(const uint8_t* in, size_t len, agoq_ib_cts* c);
const char* agoq_ib_wire_status_str(agoq_ib_wire_status s);

#endif
