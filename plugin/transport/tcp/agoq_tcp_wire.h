/*
 * Everything agoq's TCP transport puts on the wire or into NCCL's handle, encoded
 * explicitly little-endian field by field (never by struct copy), and decoded with every
 * field validated. Pure functions: unit-tested and fuzzed.
 *
 * Handle   (listen -> NCCL -> connector, <= 128 B): where to connect and which listen
 *          port instance (comm id + random nonce) the connector must prove it knows.
 * Hello    (connector -> acceptor, first bytes of every socket): binds the socket to the
 *          communicator, the listen instance and one connection (conn id, socket index).
 * Ack      (acceptor -> connector, control socket, once all sockets arrived).
 * Msg hdr  (sender -> receiver, control socket, one per message): size, tag, how the
 *          payload is spread over the data sockets; a CRC-8 of the header.
 */
#ifndef AGOQ_TCP_WIRE_H
#define AGOQ_TCP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define AGOQ_WIRE_VERSION 2 /* 2: message headers carry a CRC-8 */
#define AGOQ_WIRE_MAX_DATA_SOCKS 64

#define AGOQ_HANDLE_MAGIC 0x48514741u /* "AGQH" */
#define AGOQ_HELLO_MAGIC 0x43514741u  /* "AGQC" */
#define AGOQ_ACK_MAGIC 0x41514741u    /* "AGQA" */
#define AGOQ_MSG_MAGIC 0x4d514741u    /* "AGQM" */

#define AGOQ_HANDLE_WIRE_SIZE 64     /* encoded fields; the rest of NCCL's 128 B is ours */
#define AGOQ_HANDLE_STATE_OFFSET 96  /* connector keeps its in-progress state pointer here */
#define AGOQ_HELLO_SIZE 40
#define AGOQ_ACK_SIZE 8
#define AGOQ_MSG_HDR_SIZE 32

typedef enum {
  AGOQ_WIRE_OK = 0,
  AGOQ_WIRE_BAD_MAGIC,
  AGOQ_WIRE_BAD_VERSION,
  AGOQ_WIRE_BAD_FIELD,
} agoq_wire_status;

typedef struct {
  struct sockaddr_storage addr; /* listen address and port */
  socklen_t addr_len;
  uint64_t comm_id;
  uint64_t nonce;
  uint16_t nsocks; /* data sockets the listener expects */
} agoq_handle;

typedef struct {
  uint64_t comm_id;
  uint64_t nonce;
  uint64_t conn_id; /* random per connect: groups the sockets of one connection */
  uint8_t sock_index; /* 0 = control, 1..nsocks = data */
  uint8_t nsocks;
} agoq_hello;

typedef enum { AGOQ_ACK_ACCEPTED = 0, AGOQ_ACK_REJECTED = 1 } agoq_ack_status;

#define AGOQ_MSG_FLAG_INLINE 0x1u
/* The payload is a codec frame (agoq_frame.h) of a typed p2p transfer: the receiver
 * decodes it into the posted buffer and reports the decoded size. */
#define AGOQ_MSG_FLAG_FRAME 0x2u
#define AGOQ_MSG_FLAGS_KNOWN (AGOQ_MSG_FLAG_INLINE | AGOQ_MSG_FLAG_FRAME)
typedef struct {
  uint64_t size;       /* payload bytes */
  uint64_t chunk;      /* bytes per data socket piece (last may be shorter); 0 when inline */
  int32_t tag;
  uint32_t seq;        /* message number on this connection, low 32 bits */
  uint16_t first_sock; /* data socket of the first piece */
  uint16_t nchunks;    /* pieces, each on the next data socket */
  uint32_t flags;
} agoq_msg_hdr;

/* Handle: encode into NCCL's 128-byte buffer (zeroing the rest); decode validates magic,
 * version, address family and nsocks. */
void agoq_handle_encode(const agoq_handle* h, uint8_t out[AGOQ_HANDLE_WIRE_SIZE]);
agoq_wire_status agoq_handle_decode(const uint8_t* in, size_t len, agoq_handle* h);

void agoq_hello_encode(const agoq_hello* h, uint8_t out[AGOQ_HELLO_SIZE]);
/* Validates the magic as soon as 4 bytes exist, so garbage is rejected without waiting for
 * a whole hello: with len < AGOQ_HELLO_SIZE returns OK if the prefix is plausible. */
agoq_wire_status agoq_hello_check_prefix(const uint8_t* in, size_t len);
agoq_wire_status agoq_hello_decode(const uint8_t* in, size_t len, agoq_hello* h);

void agoq_ack_encode(agoq_ack_status status, uint8_t out[AGOQ_ACK_SIZE]);
agoq_wire_status agoq_ack_decode(const uint8_t* in, size_t len, agoq_ack_status* status);

void agoq_msg_hdr_encode(const agoq_msg_hdr* m, uint8_t out[AGOQ_MSG_HDR_SIZE]);
/* Checks internal consistency (inline vs chunked, chunk * nchunks covers size, first_sock
 * and nchunks within nsocks); the caller checks seq and the posted size. */
agoq_wire_status agoq_msg_hdr_decode(const uint8_t* in, size_t len, unsigned nsocks, agoq_msg_hdr* m);

/* How a sender spreads `size` bytes: inline when size <= inline_max or there is no data
 * socket, else pieces of
 * max(min_chunk, ceil(size / nsocks)) bytes. */
void agoq_msg_plan(uint64_t size, uint64_t inline_max, uint64_t min_chunk, unsigned nsocks,
                   agoq_msg_hdr* m);

const char* agoq_wire_status_str(agoq_wire_status s);

#endif
