#include "collnet/agoq_coll_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "collnet/agoq_coll_schedule.h"

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
static uint16_t agoq_cw_get16(const uint8_t* p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t agoq_cw_get32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t agoq_cw_get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Settings layout: magic 0, version 4, format 5, block 6, min_bytes 8, chunk_bytes 16,
 * grid columns 24 and rows 26 (0 and 0: automatic), partials 28 (0 fp32, 1 quantized),
 * I/O threads 29, zero 30..31. */
void agoq_coll_settings_encode(const agoq_coll_config* cfg, uint8_t out[AGOQ_COLL_SETTINGS_SIZE]) {
  memset(out, 0, AGOQ_COLL_SETTINGS_SIZE);
  agoq_cw_put32(out + 0, AGOQ_COLL_HANDLE_MAGIC);
  out[4] = AGOQ_COLL_HANDLE_VERSION;
  out[5] = (uint8_t)cfg->format;
  agoq_cw_put16(out + 6, (uint16_t)cfg->block);
  agoq_cw_put64(out + 8, cfg->min_bytes);
  agoq_cw_put64(out + 16, cfg->chunk_bytes);
  agoq_cw_put16(out + 24, (uint16_t)cfg->grid_a);
  agoq_cw_put16(out + 26, (uint16_t)cfg->grid_b);
  out[28] = cfg->quant_partials ? 1 : 0;
  out[29] = (uint8_t)cfg->io_threads;
}

agoq_coll_settings_status agoq_coll_settings_decode(const uint8_t* in, agoq_coll_settings* out) {
  memset(out, 0, sizeof *out);
  if (agoq_cw_get32(in) != AGOQ_COLL_HANDLE_MAGIC) return AGOQ_COLL_SETTINGS_FOREIGN;
  out->version = in[4];
  /* Another layout's fields may sit elsewhere: reading them as ours would show garbage. */
  if (in[4] != AGOQ_COLL_HANDLE_VERSION) return AGOQ_COLL_SETTINGS_VERSION;
  uint32_t block = agoq_cw_get16(in + 6);
  /* The values a mismatch message prints must be ones a user could have set, so anything
   * this version's encode never writes is refused rather than shown. */
  if (in[5] >= AGOQ_FORMAT_COUNT || block < AGOQ_CODEC_BLOCK_MIN || block > AGOQ_CODEC_BLOCK_MAX ||
      (block & (block - 1)) != 0)
    return AGOQ_COLL_SETTINGS_MALFORMED;
  int grid_a = agoq_cw_get16(in + 24), grid_b = agoq_cw_get16(in + 26);
  if ((grid_a == 0) != (grid_b == 0) || in[28] > 1 || in[29] > AGOQ_COLL_IO_MAX) return AGOQ_COLL_SETTINGS_MALFORMED;
  for (int i = 30; i < AGOQ_COLL_SETTINGS_SIZE; i++)
    if (in[i] != 0) return AGOQ_COLL_SETTINGS_MALFORMED;
  out->format = (agoq_format)in[5];
  out->block = block;
  out->min_bytes = agoq_cw_get64(in + 8);
  out->chunk_bytes = agoq_cw_get64(in + 16);
  out->grid_a = grid_a;
  out->grid_b = grid_b;
  out->quant_partials = in[28] == 1;
  out->io_threads = in[29];
  return AGOQ_COLL_SETTINGS_OK;
}

agoq_coll_settings_status agoq_coll_settings_check(const uint8_t* theirs, const uint8_t* mine) {
  agoq_coll_settings t;
  agoq_coll_settings_status st = agoq_coll_settings_decode(theirs, &t);
  if (st != AGOQ_COLL_SETTINGS_OK) return st;
  if (memcmp(theirs, mine, AGOQ_COLL_SETTINGS_SIZE) != 0) return AGOQ_COLL_SETTINGS_MISMATCH;
  return AGOQ_COLL_SETTINGS_OK;
}

/* A byte count as AGOQ_* SIZE values are written (1024-based K/M/G/T suffixes, as the
 * parameter parser reads them), with the exact count beside a suffixed one so a user who
 * wrote 65536 recognises 64K too. */
static void agoq_cw_size_text(uint64_t v, char* buf, size_t len) {
  static const char units[] = "KMGT";
  int u = -1;
  uint64_t q = v;
  while (u < 3 && q != 0 && q % 1024 == 0) {
    q /= 1024;
    u++;
  }
  if (u < 0)
    snprintf(buf, len, "%llu", (unsigned long long)v);
  else
    snprintf(buf, len, "%llu%c (%llu bytes)", (unsigned long long)q, units[u], (unsigned long long)v);
}

/* Appends to buf at *used, never past len; *used may exceed len - 1 (then nothing more
 * fits and the text stays truncated but terminated). */
static void agoq_cw_append(char* buf, size_t len, size_t* used, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void agoq_cw_append(char* buf, size_t len, size_t* used, const char* fmt, ...) {
  if (*used >= len) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *used, len - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used += (size_t)n;
}

enum { AGOQ_CW_NVARS = 7, AGOQ_CW_VALUE_MAX = 48 };

/* The variables one side has, as "AGOQ_X=v and AGOQ_Y=w", for the differing ones only. */
static void agoq_cw_side(const agoq_coll_settings* s, const bool differs[AGOQ_CW_NVARS], char* buf, size_t len,
                         size_t* used) {
  static const char* const names[AGOQ_CW_NVARS] = {"AGOQ_FORMAT", "AGOQ_BLOCK", "AGOQ_MIN_BYTES",
                                                   "AGOQ_COLLNET_CHUNK", "AGOQ_COLLNET_GRID",
                                                   "AGOQ_COLLNET_PARTIALS", "AGOQ_COLLNET_IO_THREADS"};
  bool first = true;
  for (int v = 0; v < AGOQ_CW_NVARS; v++) {
    if (!differs[v]) continue;
    char value[AGOQ_CW_VALUE_MAX];
    switch (v) {
      case 0: snprintf(value, sizeof value, "%s", agoq_format_name(s->format)); break;
      case 1: snprintf(value, sizeof value, "%u", (unsigned)s->block); break;
      case 2: agoq_cw_size_text(s->min_bytes, value, sizeof value); break;
      case 3:
        if (s->chunk_bytes == 0) snprintf(value, sizeof value, "auto");
        else agoq_cw_size_text(s->chunk_bytes, value, sizeof value);
        break;
      case 4: agoq_coll_grid_text(s->grid_a, s->grid_b, value, sizeof value); break;
      case 5: snprintf(value, sizeof value, "%s", s->quant_partials ? "quantized" : "fp32"); break;
      default: snprintf(value, sizeof value, "%d", s->io_threads); break;
    }
    agoq_cw_append(buf, len, used, "%s%s=%s", first ? "" : " and ", names[v], value);
    first = false;
  }
}

int agoq_coll_settings_describe(const agoq_coll_settings* theirs, int their_rank, const agoq_coll_settings* mine,
                                int my_rank, char* buf, size_t len) {
  if (len > 0) buf[0] = '\0';
  bool differs[AGOQ_CW_NVARS] = {theirs->format != mine->format, theirs->block != mine->block,
                                 theirs->min_bytes != mine->min_bytes, theirs->chunk_bytes != mine->chunk_bytes,
                                 theirs->grid_a != mine->grid_a || theirs->grid_b != mine->grid_b,
                                 theirs->quant_partials != mine->quant_partials,
                                 theirs->io_threads != mine->io_threads};
  int n = 0;
  for (int v = 0; v < AGOQ_CW_NVARS; v++) n += differs[v];
  if (n == 0 || len == 0) return n;
  size_t used = 0;
  agoq_cw_append(buf, len, &used, "CollNet group: rank %d has ", their_rank);
  agoq_cw_side(theirs, differs, buf, len, &used);
  agoq_cw_append(buf, len, &used, ", this rank (%d) has ", my_rank);
  agoq_cw_side(mine, differs, buf, len, &used);
  agoq_cw_append(buf, len, &used, "; every rank must use the same value%s", n > 1 ? "s" : "");
  return n;
}

/* Rank block layout: link rate in Mbit/s 0, zero 4..31. */
void agoq_coll_rank_encode(uint32_t link_mbps, uint8_t out[AGOQ_COLL_RANK_SIZE]) {
  memset(out, 0, AGOQ_COLL_RANK_SIZE);
  agoq_cw_put32(out, link_mbps);
}

bool agoq_coll_rank_decode(const uint8_t* in, uint32_t* link_mbps) {
  uint32_t v = agoq_cw_get32(in);
  if (v > AGOQ_COLL_LINK_MBPS_MAX) return false;
  for (int i = 4; i < AGOQ_COLL_RANK_SIZE; i++)
    if (in[i] != 0) return false;
  *link_mbps = v;
  return true;
}

int agoq_coll_rank_slowest(void* const* handles, int nranks, uint32_t* link_mbps) {
  uint32_t slowest = UINT32_MAX;
  for (int i = 0; i < nranks; i++) {
    uint32_t mbps;
    if (!agoq_coll_rank_decode((const uint8_t*)handles[i] + AGOQ_COLL_RANK_OFFSET, &mbps)) return i;
    if (mbps < slowest) slowest = mbps; /* an unknown rate (0) wins */
  }
  *link_mbps = slowest;
  return -1;
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

bool agoq_coll_msg_decode(const uint8_t* in, size_t size, int kind, agoq_coll_setup_msg* m) {
  if (size != AGOQ_COLL_MSG_SIZE || agoq_cw_get32(in) != AGOQ_COLL_MSG_MAGIC || in[4] != (uint8_t)kind)
    return false;
  m->kind = kind;
  m->phase = in[5];
  m->rank = agoq_cw_get32(in + 8);
  m->nranks = agoq_cw_get32(in + 12);
  return true;
}

bool agoq_coll_ident_valid(const agoq_coll_setup_msg* m, int my_rank, int nranks) {
  return m->kind == AGOQ_COLL_MSG_IDENT && m->nranks == (uint32_t)nranks && m->rank < m->nranks &&
         m->rank != (uint32_t)my_rank && m->phase == 0;
}
