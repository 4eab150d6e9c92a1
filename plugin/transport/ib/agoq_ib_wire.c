#include "transport/ib/agoq_ib_wire.h"
#include "transport/agoq_wire_le.h"

#include <string.h>

/* Metadata layout: magic 0, version 4, role 6, nqps 7, link_layer 8, mtu 9, port 10,
 * gid_index 11, lid 12, gid 16..31, qpn[8] 32..63, ring_addr 64, ring_rkey 72,
 * ring_slots 76, slot_size 80, eager_max 84; zero to the end. */
void agoq_ib_meta_encode(const agoq_ib_meta* m, uint8_t out[AGOQ_IB_META_SIZE]) {
  memset(out, 0, AGOQ_IB_META_SIZE);
  agoq_put32(out, AGOQ_IB_META_MAGIC);
  agoq_put16(out + 4, AGOQ_IB_WIRE_VERSION);
  out[6] = m->role;
  out[7] = m->nqps;
  out[8] = m->link_layer;
  out[9] = m->mtu;
  out[10] = m->port;
  out[11] = m->gid_index;
  agoq_put16(out + 12, m->lid);
  memcpy(out + 16, m->gid, 16);
  for (int i = 0; i < AGOQ_IB_MAX_QPS; i++) agoq_put32(out + 32 + 4 * i, m->qpn[i]);
  agoq_put64(out + 64, m->ring_addr);
  agoq_put32(out + 72, m->ring_rkey);
  agoq_put32(out + 76, m->ring_slots);
  agoq_put32(out + 80, m->slot_size);
  agoq_put32(out + 84, m->eager_max);
}

agoq_ib_wire_status agoq_ib_meta_decode(const uint8_t* in, size_t len, agoq_ib_meta* m) {
  if (len < AGOQ_IB_META_SIZE) return AGOQ_IB_WIRE_BAD_FIELD;
  if (agoq_get32(in) != AGOQ_IB_META_MAGIC) return AGOQ_IB_WIRE_BAD_MAGIC;
  if (agoq_get16(in + 4) != AGOQ_IB_WIRE_VERSION) return AGOQ_IB_WIRE_BAD_VERSION;
  memset(m, 0, sizeof *m);
  m->role = in[6];
  m->nqps = in[7];
  m->link_layer = in[8];
  m->mtu = in[9];
  m->port = in[10];
  m->gid_index = in[11];
  m->lid = agoq_get16(in + 12);
  if (agoq_get16(in + 14) != 0) return AGOQ_IB_WIRE_BAD_FIELD;
  memcpy(m->gid, in + 16, 16);
  for (int i = 0; i < AGOQ_IB_MAX_QPS; i++) m->qpn[i] = agoq_get32(in + 32 + 4 * i);
  m->ring_addr = agoq_get64(in + 64);
  m->ring_rkey = agoq_get32(in + 72);
  m->ring_slots = agoq_get32(in + 76);
  m->slot_size = agoq_get32(in + 80);
  m->eager_max = agoq_get32(in + 84);
  if (m->role > 1 || m->nqps == 0 || m->nqps > AGOQ_IB_MAX_QPS) return AGOQ_IB_WIRE_BAD_FIELD;
  if (m->link_layer < 1 || m->link_layer > 2 || m->mtu < 1 || m->mtu > 5 || m->port == 0)
    return AGOQ_IB_WIRE_BAD_FIELD;
  for (int i = 0; i < AGOQ_IB_MAX_QPS; i++) {
    bool used = i < m->nqps;
    /* QP numbers are 24 bits; 0 and 1 are the special QPs. */
    if (used && (m->qpn[i] < 2 || m->qpn[i] > 0xffffffu)) return AGOQ_IB_WIRE_BAD_FIELD;
    if (!used && m->qpn[i] != 0) return AGOQ_IB_WIRE_BAD_FIELD;
  }
  if (m->ring_addr == 0 || m->ring_slots == 0 || m->ring_slots > 65536 || m->slot_size < AGOQ_IB_CTS_SIZE ||
      m->slot_size > (1u << 20))
    return AGOQ_IB_WIRE_BAD_FIELD;
  if (m->role == 1 && m->eager_max + AGOQ_IB_RTS_HDR_SIZE > m->slot_size) return AGOQ_IB_WIRE_BAD_FIELD;
  if (m->role == 0 && m->eager_max != 0) return AGOQ_IB_WIRE_BAD_FIELD;
  for (int i = 88; i < AGOQ_IB_META_SIZE; i++)
    if (in[i] != 0) return AGOQ_IB_WIRE_BAD_FIELD;
  return AGOQ_IB_WIRE_OK;
}

/* RTS header layout: magic 0, seq 4, tag 8, flags 12, size 16, zero 24..31. */
void agoq_ib_rts_encode(const agoq_ib_rts* r, uint8_t out[AGOQ_IB_RTS_HDR_SIZE]) {
  memset(out, 0, AGOQ_IB_RTS_HDR_SIZE);
  agoq_put32(out, AGOQ_IB_RTS_MAGIC);
  agoq_put32(out + 4, r->seq);
  agoq_put32(out + 8, (uint32_t)r->tag);
  agoq_put32(out + 12, r->flags);
  agoq_put64(out + 16, r->size);
}

agoq_ib_wire_status agoq_ib_rts_decode(const uint8_t* in, size_t len, uint32_t eager_max, agoq_ib_rts* r) {
  if (len < AGOQ_IB_RTS_HDR_SIZE) return AGOQ_IB_WIRE_BAD_FIELD;
  if (agoq_get32(in) != AGOQ_IB_RTS_MAGIC) return AGOQ_IB_WIRE_BAD_MAGIC;
  r->seq = agoq_get32(in + 4);
  r->tag = (int32_t)agoq_get32(in + 8);
  r->flags = agoq_get32(in + 12);
  r->size = agoq_get64(in + 16);
  if ((r->flags & ~AGOQ_IB_RTS_FLAGS_KNOWN) != 0 || agoq_get64(in + 24) != 0) return AGOQ_IB_WIRE_BAD_FIELD;
  bool eager = (r->flags & AGOQ_IB_RTS_FLAG_EAGER) != 0, device = (r->flags & AGOQ_IB_RTS_FLAG_DEVICE) != 0;
  if (eager && (device || r->size > eager_max)) return AGOQ_IB_WIRE_BAD_FIELD;
  if (device && r->size == 0) return AGOQ_IB_WIRE_BAD_FIELD; /* nothing to write: inline */
  /* A small message goes inline unless its bytes are GPU memory the CPU cannot copy. */
  if (!eager && !device && r->size <= eager_max) return AGOQ_IB_WIRE_BAD_FIELD;
  return AGOQ_IB_WIRE_OK;
}

/* CTS layout: magic 0, seq 4, kind 8, rkey 12, addr 16, size 24; code in the rkey's place
 * for REFUSED. Fits 32 bytes exactly. */
void agoq_ib_cts_encode(const agoq_ib_cts* c, uint8_t out[AGOQ_IB_CTS_SIZE]) {
  memset(out, 0, AGOQ_IB_CTS_SIZE);
  agoq_put32(out, AGOQ_IB_CTS_MAGIC);
  agoq_put32(out + 4, c->seq);
  agoq_put32(out + 8, c->kind);
  agoq_put32(out + 12, c->kind == AGOQ_IB_CTS_REFUSED ? c->code : c->rkey);
  agoq_put64(out + 16, c->addr);
  agoq_put64(out + 24, c->size);
}

agoq_ib_wire_status agoq_ib_cts_decode(const uint8_t* in, size_t len, agoq_ib_cts* c) {
  if (len < AGOQ_IB_CTS_SIZE) return AGOQ_IB_WIRE_BAD_FIELD;
  if (agoq_get32(in) != AGOQ_IB_CTS_MAGIC) return AGOQ_IB_WIRE_BAD_MAGIC;
  memset(c, 0, sizeof *c);
  c->seq = agoq_get32(in + 4);
  c->kind = agoq_get32(in + 8);
  c->addr = agoq_get64(in + 16);
  c->size = agoq_get64(in + 24);
  switch (c->kind) {
    case AGOQ_IB_CTS_CONSUMED:
      if (agoq_get32(in + 12) != 0 || c->addr != 0 || c->size != 0) return AGOQ_IB_WIRE_BAD_FIELD;
      return AGOQ_IB_WIRE_OK;
    case AGOQ_IB_CTS_WRITE:
      c->rkey = agoq_get32(in + 12);
      /* A write of 0 bytes never asks for an address: such messages always go eager. */
      if (c->addr == 0 || c->size == 0) return AGOQ_IB_WIRE_BAD_FIELD;
      return AGOQ_IB_WIRE_OK;
    case AGOQ_IB_CTS_REFUSED:
      c->code = agoq_get32(in + 12);
      if (c->code == 0 || c->addr != 0 || c->size != 0) return AGOQ_IB_WIRE_BAD_FIELD;
      return AGOQ_IB_WIRE_OK;
    default:
      return AGOQ_IB_WIRE_BAD_FIELD;
  }
}

const char* agoq_ib_wire_status_str(agoq_ib_wire_status s) {
  switch (s) {
    case AGOQ_IB_WIRE_OK: return "ok";
    case AGOQ_IB_WIRE_BAD_MAGIC: return "bad magic (not an agoq verbs peer)";
    case AGOQ_IB_WIRE_BAD_VERSION: return "unsupported verbs wire version";
    case AGOQ_IB_WIRE_BAD_FIELD: return "invalid field";
  }
  return "unknown";
}
