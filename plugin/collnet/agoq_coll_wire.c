#include "collnet/agoq_coll_wire.h"

#include <string.h>

static void agoq_cw_put16(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void agoq_cw_put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void agoq_cw_put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t agoq_cw_get32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Settings layout: magic 0, version 4, format 5, block 6, min_bytes 8, chunk_bytes 16,
 * zero 24..31. */
void agoq_coll_settings_encode(const agoq_coll_config* cfg, uint8_t out[AGOQ_COLL_SETTINGS_SIZE]) {
  memset(out, 0, AGOQ_COLL_SETTINGS_SIZE);
  agoq_cw_put32(out + 0, AGOQ_COLL_HANDLE_MAGIC);
  out[4] = AGOQ_COLL_HANDLE_VERSION;
  out[5] = (uint8_t)cfg->format;
  agoq_cw_put16(out + 6, (uint16_t)cfg->block);
  agoq_cw_put64(out + 8, cfg->min_bytes);
  agoq_cw_put64(out + 16, cfg->chunk_bytes);
}

agoq_coll_settings_status agoq_coll_settings_check(const uint8_t* theirs, const uint8_t* mine) {
  if (agoq_cw_get32(theirs) != AGOQ_COLL_HANDLE_MAGIC || theirs[4] != AGOQ_COLL_HANDLE_VERSION)
    return AGOQ_COLL_SETTINGS_FOREIGN;
  if (memcmp(theirs, mine, AGOQ_COLL_SETTINGS_SIZE) != 0) return AGOQ_COLL_SETTINGS_MISMATCH;
  return AGOQ_COLL_SETTINGS_OK;
}

/* Message layout: magic 0, kind 4, phase 5, zero 6..7, rank 8, nranks 12. */
void agoq_coll_msg_encode(uint8_t out[AGOQ_COLL_MSG_SIZE], int kind, int phase, int rank, int nranks) {
  memset(out, 0, AGOQ_COLL_MSG_SIZE);
  agoq_cw_put32(out, AGOQ_COLL_MSG_MAGIC);
  out[4] = (uint8_t)kind;
  out[5] = (uint8_t)phase;
  agoq_cw_put32(out + 8, (uint32_t)rank);
  agoq_cw_put32(out + 12, (uint32_t)nranks);
}

bool agoq_coll_msg_decode(const uint8_t* in, size_t size, int kind, agoq_coll_msg* m) {
  if (size != AGOQ_COLL_MSG_SIZE || agoq_cw_get32(in) != AGOQ_COLL_MSG_MAGIC || in[4] != (uint8_t)kind)
    return false;
  m->kind = kind;
  m->phase = in[5];
  m->rank = agoq_cw_get32(in + 8);
  m->nranks = agoq_cw_get32(in + 12);
  return true;
}

bool agoq_coll_ident_valid(const agoq_coll_msg* m, int my_rank, int nranks) {
  return m->kind == AGOQ_COLL_MSG_IDENT && m->nranks == (uint32_t)nranks && m->rank < m->nranks &&
         m->rank != (uint32_t)my_rank && m->phase <= 1;
}
