#include "transport/tcp/agoq_tcp_wire.h"
#include "transport/agoq_wire_le.h"

#include <netinet/in.h>
#include <string.h>

/* Handle layout: magic 0, version 4, family 6, port 8, nsocks 10, scope_id 12,
 * comm_id 16, nonce 24, address 32..47 (IPv4 in the first 4 bytes). */
enum { AGOQ_FAMILY_WIRE_V4 = 4, AGOQ_FAMILY_WIRE_V6 = 6 };

void agoq_handle_encode(const agoq_handle* h, uint8_t out[AGOQ_HANDLE_WIRE_SIZE]) {
  memset(out, 0, AGOQ_HANDLE_WIRE_SIZE);
  agoq_put32(out + 0, AGOQ_HANDLE_MAGIC);
  agoq_put16(out + 4, AGOQ_WIRE_VERSION);
  agoq_put16(out + 10, h->nsocks);
  agoq_put64(out + 16, h->comm_id);
  agoq_put64(out + 24, h->nonce);
  if (h->addr.ss_family == AF_INET) {
    const struct sockaddr_in* in = (const struct sockaddr_in*)&h->addr;
    agoq_put16(out + 6, AGOQ_FAMILY_WIRE_V4);
    agoq_put16(out + 8, ntohs(in->sin_port));
    memcpy(out + 32, &in->sin_addr, 4);
  } else {
    const struct sockaddr_in6* in6 = (const struct sockaddr_in6*)&h->addr;
    agoq_put16(out + 6, AGOQ_FAMILY_WIRE_V6);
    agoq_put16(out + 8, ntohs(in6->sin6_port));
    agoq_put32(out + 12, in6->sin6_scope_id);
    memcpy(out + 32, &in6->sin6_addr, 16);
  }
}

agoq_wire_status agoq_handle_decode(const uint8_t* in, size_t len, agoq_handle* h) {
  if (len < AGOQ_HANDLE_WIRE_SIZE) return AGOQ_WIRE_BAD_FIELD;
  if (agoq_get32(in) != AGOQ_HANDLE_MAGIC) return AGOQ_WIRE_BAD_MAGIC;
  if (agoq_get16(in + 4) != AGOQ_WIRE_VERSION) return AGOQ_WIRE_BAD_VERSION;
  memset(h, 0, sizeof *h);
  uint16_t family = agoq_get16(in + 6), port = agoq_get16(in + 8);
  h->nsocks = agoq_get16(in + 10);
  h->comm_id = agoq_get64(in + 16);
  h->nonce = agoq_get64(in + 24);
  /* 0 data sockets: an inline-only listen (AGOQ_TP_LISTEN_INLINE). */
  if (port == 0 || h->nsocks > AGOQ_WIRE_MAX_DATA_SOCKS) return AGOQ_WIRE_BAD_FIELD;
  if (family == AGOQ_FAMILY_WIRE_V4) {
    struct sockaddr_in* sin = (struct sockaddr_in*)&h->addr;
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    memcpy(&sin->sin_addr, in + 32, 4);
    h->addr_len = sizeof *sin;
  } else if (family == AGOQ_FAMILY_WIRE_V6) {
    struct sockaddr_in6* sin6 = (struct sockaddr_in6*)&h->addr;
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    sin6->sin6_scope_id = agoq_get32(in + 12);
    memcpy(&sin6->sin6_addr, in + 32, 16);
    h->addr_len = sizeof *sin6;
  } else {
    return AGOQ_WIRE_BAD_FIELD;
  }
  return AGOQ_WIRE_OK;
}

/* Hello layout: magic 0, version 4, sock_index 6, nsocks 7, comm_id 8, nonce 16,
 * conn_id 24, reserved 32..39 (must be zero). */
void agoq_hello_encode(const agoq_hello* h, uint8_t out[AGOQ_HELLO_SIZE]) {
  memset(out, 0, AGOQ_HELLO_SIZE);
  agoq_put32(out + 0, AGOQ_HELLO_MAGIC);
  agoq_put16(out + 4, AGOQ_WIRE_VERSION);
  out[6] = h->sock_index;
  out[7] = h->nsocks;
  agoq_put64(out + 8, h->comm_id);
  agoq_put64(out + 16, h->nonce);
  agoq_put64(out + 24, h->conn_id);
}

agoq_wire_status agoq_hello_check_prefix(const uint8_t* in, size_t len) {
  uint8_t magic[4];
  agoq_put32(magic, AGOQ_HELLO_MAGIC);
  size_t n = len < 4 ? len : 4;
  if (memcmp(in, magic, n) != 0) return AGOQ_WIRE_BAD_MAGIC;
  if (len >= 6 && agoq_get16(in + 4) != AGOQ_WIRE_VERSION) return AGOQ_WIRE_BAD_VERSION;
  return AGOQ_WIRE_OK;
}

agoq_wire_status agoq_hello_decode(const uint8_t* in, size_t len, agoq_hello* h) {
  if (len < AGOQ_HELLO_SIZE) return AGOQ_WIRE_BAD_FIELD;
  agoq_wire_status st = agoq_hello_check_prefix(in, len);
  if (st != AGOQ_WIRE_OK) return st;
  h->sock_index = in[6];
  h->nsocks = in[7];
  h->comm_id = agoq_get64(in + 8);
  h->nonce = agoq_get64(in + 16);
  h->conn_id = agoq_get64(in + 24);
  if (agoq_get64(in + 32) != 0) return AGOQ_WIRE_BAD_FIELD;
  if (h->nsocks > AGOQ_WIRE_MAX_DATA_SOCKS || h->sock_index > h->nsocks) return AGOQ_WIRE_BAD_FIELD;
  return AGOQ_WIRE_OK;
}

void agoq_ack_encode(agoq_ack_status status, uint8_t out[AGOQ_ACK_SIZE]) {
  agoq_put32(out, AGOQ_ACK_MAGIC);
  agoq_put32(out + 4, (uint32_t)status);
}

agoq_wire_status agoq_ack_decode(const uint8_t* in, size_t len, agoq_ack_status* status) {
  if (len < AGOQ_ACK_SIZE) return AGOQ_WIRE_BAD_FIELD;
  if (agoq_get32(in) != AGOQ_ACK_MAGIC) return AGOQ_WIRE_BAD_MAGIC;
  uint32_t s = agoq_get32(in + 4);
  if (s > AGOQ_ACK_REJECTED) return AGOQ_WIRE_BAD_FIELD;
  *status = (agoq_ack_status)s;
  return AGOQ_WIRE_OK;
}

/* CRC-8 (polynomial x^8 + x^2 + x + 1) of a header with its checksum byte taken as 0: it
 * catches every burst of up to 8 bits, so a corrupted size, tag or piece layout is refused
 * instead of making the receiver wait for bytes that never come. */
static uint8_t agoq_msg_hdr_crc(const uint8_t* in) {
  uint8_t crc = 0;
  for (int i = 0; i < AGOQ_MSG_HDR_SIZE; i++) {
    crc ^= i == 7 ? 0 : in[i];
    for (int b = 0; b < 8; b++) crc = (uint8_t)(crc & 0x80 ? (crc << 1) ^ 0x07 : crc << 1);
  }
  return crc;
}

/* Message header layout: magic 0, flags 4, size 8, chunk 16, tag 24, seq 28. The socket
 * fields share the top of flags: first_sock in bits 8..15, nchunks-1 in bits 16..23, the
 * header's CRC-8 in bits 24..31. */
void agoq_msg_hdr_encode(const agoq_msg_hdr* m, uint8_t out[AGOQ_MSG_HDR_SIZE]) {
  uint32_t flags = (m->flags & 0xffu) | ((uint32_t)(m->first_sock & 0xff) << 8);
  if (m->nchunks > 0) flags |= (uint32_t)((m->nchunks - 1) & 0xff) << 16;
  agoq_put32(out + 0, AGOQ_MSG_MAGIC);
  agoq_put32(out + 4, flags);
  agoq_put64(out + 8, m->size);
  agoq_put64(out + 16, m->chunk);
  agoq_put32(out + 24, (uint32_t)m->tag);
  agoq_put32(out + 28, m->seq);
  out[7] = agoq_msg_hdr_crc(out);
}

agoq_wire_status agoq_msg_hdr_decode(const uint8_t* in, size_t len, unsigned nsocks, agoq_msg_hdr* m) {
  if (len < AGOQ_MSG_HDR_SIZE) return AGOQ_WIRE_BAD_FIELD;
  if (agoq_get32(in) != AGOQ_MSG_MAGIC) return AGOQ_WIRE_BAD_MAGIC;
  if (in[7] != agoq_msg_hdr_crc(in)) return AGOQ_WIRE_BAD_FIELD;
  uint32_t flags = agoq_get32(in + 4) & 0xffffffu;
  m->flags = flags & 0xffu;
  m->first_sock = (uint16_t)((flags >> 8) & 0xff);
  m->size = agoq_get64(in + 8);
  m->chunk = agoq_get64(in + 16);
  m->tag = (int32_t)agoq_get32(in + 24);
  m->seq = agoq_get32(in + 28);
  if ((m->flags & ~AGOQ_MSG_FLAGS_KNOWN) != 0) return AGOQ_WIRE_BAD_FIELD;
  if (m->flags & AGOQ_MSG_FLAG_INLINE) {
    m->nchunks = 0;
    if (m->chunk != 0 || m->first_sock != 0 || ((flags >> 16) & 0xff) != 0) return AGOQ_WIRE_BAD_FIELD;
    return AGOQ_WIRE_OK;
  }
  m->nchunks = (uint16_t)(((flags >> 16) & 0xff) + 1);
  if (m->first_sock >= nsocks || m->nchunks > nsocks || m->chunk == 0) return AGOQ_WIRE_BAD_FIELD;
  /* The pieces must cover the size exactly: all but the last full, the last non-empty,
   * i.e. nchunks == ceil(size / chunk). Computed by division: chunk and size come from the
   * wire, and a product could overflow. */
  if (m->size == 0 || m->chunk > m->size || (m->size - 1) / m->chunk + 1 != m->nchunks)
    return AGOQ_WIRE_BAD_FIELD;
  return AGOQ_WIRE_OK;
}

void agoq_msg_plan(uint64_t size, uint64_t inline_max, uint64_t min_chunk, unsigned nsocks,
                   agoq_msg_hdr* m) {
  m->size = size;
  m->first_sock = 0;
  /* Without data sockets (an inline-only connection) every message goes inline. */
  if (size <= inline_max || nsocks == 0) {
    m->flags = AGOQ_MSG_FLAG_INLINE;
    m->chunk = 0;
    m->nchunks = 0;
    return;
  }
  m->flags = 0;
  uint64_t chunk = (size + nsocks - 1) / nsocks;
  if (chunk < min_chunk) chunk = min_chunk;
  if (chunk > size) chunk = size;
  /* Whole pieces only: a remainder shorter than a piece is spread over the others rather
   * than sent as a small piece of its own, which would cost another socket and thread
   * hand-off for a few bytes (a 66 KiB frame would otherwise go as 64 KiB + 2 KiB). */
  uint64_t n = size / chunk;
  if (n == 0) n = 1;
  chunk = (size + n - 1) / n;
  m->chunk = chunk;
  m->nchunks = (uint16_t)n;
}

const char* agoq_wire_status_str(agoq_wire_status s) {
  switch (s) {
    case AGOQ_WIRE_OK: return "ok";
    case AGOQ_WIRE_BAD_MAGIC: return "bad magic (not an agoq peer)";
    case AGOQ_WIRE_BAD_VERSION: return "unsupported protocol version";
    case AGOQ_WIRE_BAD_FIELD: return "malformed field";
  }
  return "unknown";
}
