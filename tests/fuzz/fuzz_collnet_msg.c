/* libFuzzer target: what CollNet group creation reads from other ranks (agoq_coll_wire.h):
 * the settings block of every rank's handle and the ident/ready messages on the mesh
 * connections. Byte 0 picks the decoder and, for messages, the group (my rank, nranks).
 * Invariants: nothing crashes or reads out of bounds; an accepted message re-encodes to
 * the same 16 bytes' fields; an accepted ident names an existing other rank and phase 0/1
 * (setup indexes arrays with them); settings are accepted only when byte-identical; a block
 * that decodes re-encodes to the same bytes (so the values a mismatch WARN prints are the
 * ones the peer set), and its mismatch text names at least one variable and stays
 * terminated within any buffer length. Also AGOQ_COLLNET_GRID's text (agoq_coll_grid_parse):
 * an accepted value is auto or two sizes in 1..65535 that print back to a text parsing the
 * same; a refusal always says why. And the rank block (byte 0 = 4): an accepted block names a
 * rate up to AGOQ_COLL_LINK_MBPS_MAX and re-encodes to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collnet/agoq_coll_schedule.h"
#include "collnet/agoq_coll_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint8_t which = data[0] % 5;
  int nranks = 1 + data[1] % 16;
  int me = (data[1] >> 4) % nranks;
  data += 2;
  size -= 2;
  /* A heap copy of exactly `size` bytes, so ASan sees any read past the input. */
  uint8_t* in = malloc(size ? size : 1);
  if (in == NULL) return 0;
  memcpy(in, data, size);
  switch (which) {
    case 0: {
      agoq_coll_config cfg = {.format = AGOQ_FORMAT_INT8, .block = 128, .min_bytes = 65536,
                              .chunk_bytes = 1u << 20, .timeout_s = 60};
      uint8_t mine[AGOQ_COLL_SETTINGS_SIZE];
      agoq_coll_settings_encode(&cfg, mine);
      if (size < AGOQ_COLL_SETTINGS_SIZE) break;
      agoq_coll_settings_status st = agoq_coll_settings_check(in, mine);
      if ((st == AGOQ_COLL_SETTINGS_OK) != (memcmp(in, mine, AGOQ_COLL_SETTINGS_SIZE) == 0)) abort();
      if (agoq_coll_settings_check(mine, mine) != AGOQ_COLL_SETTINGS_OK) abort();
      agoq_coll_settings theirs, ours;
      agoq_coll_settings_status dst = agoq_coll_settings_decode(in, &theirs);
      if (agoq_coll_settings_decode(mine, &ours) != AGOQ_COLL_SETTINGS_OK) abort();
      /* check refuses exactly what decode refuses, with the same status. */
      if (dst != AGOQ_COLL_SETTINGS_OK ? st != dst : st == AGOQ_COLL_SETTINGS_FOREIGN) abort();
      if (dst != AGOQ_COLL_SETTINGS_OK) break;
      agoq_coll_config back = cfg;
      back.format = theirs.format;
      back.block = theirs.block;
      back.min_bytes = theirs.min_bytes;
      back.chunk_bytes = theirs.chunk_bytes;
      back.grid_a = theirs.grid_a;
      back.grid_b = theirs.grid_b;
      back.quant_partials = theirs.quant_partials;
      back.io_threads = theirs.io_threads;
      uint8_t again[AGOQ_COLL_SETTINGS_SIZE];
      agoq_coll_settings_encode(&back, again);
      if (memcmp(again, in, AGOQ_COLL_SETTINGS_SIZE) != 0) abort();
      /* The message length comes from the input's last byte: every cut must stay in bounds. */
      size_t len = size > AGOQ_COLL_SETTINGS_SIZE ? in[AGOQ_COLL_SETTINGS_SIZE] : 512;
      char* msg = malloc(len ? len : 1);
      if (msg == NULL) break;
      int n = agoq_coll_settings_describe(&theirs, nranks - 1, &ours, me, msg, len);
      if ((n > 0) != (st == AGOQ_COLL_SETTINGS_MISMATCH) || n > 7) abort(); /* 7 variables in the block */
      if (len > 0 && strlen(msg) >= len) abort();
      if (n > 0 && len == 512 && strstr(msg, "AGOQ_") == NULL) abort();
      free(msg);
      break;
    }
    case 3: {
      char* text = malloc(size + 1);
      if (text == NULL) break;
      memcpy(text, in, size);
      text[size] = '\0';
      int a = -1, b = -1, a2 = -1, b2 = -1;
      char why[192] = "", printed[32];
      if (agoq_coll_grid_parse(text, &a, &b, why, sizeof why) == 0) {
        if ((a == 0) != (b == 0) || a < 0 || b < 0 || a > 65535 || b > 65535) abort();
        agoq_coll_grid_text(a, b, printed, sizeof printed);
        if (agoq_coll_grid_parse(printed, &a2, &b2, why, sizeof why) != 0 || a2 != a || b2 != b) abort();
      } else if (strstr(why, "AGOQ_COLLNET_GRID") == NULL) {
        abort();
      }
      free(text);
      break;
    }
    case 4: {
      uint32_t mbps = 0;
      if (size < AGOQ_COLL_RANK_SIZE || !agoq_coll_rank_decode(in, &mbps)) break;
      if (mbps > AGOQ_COLL_LINK_MBPS_MAX) abort();
      uint8_t again[AGOQ_COLL_RANK_SIZE];
      agoq_coll_rank_encode(mbps, again);
      if (memcmp(again, in, AGOQ_COLL_RANK_SIZE) != 0) abort();
      break;
    }
    default: {
      int kind = which == 1 ? AGOQ_COLL_MSG_IDENT : AGOQ_COLL_MSG_READY;
      agoq_coll_setup_msg m, m2;
      if (!agoq_coll_msg_decode(in, size, kind, &m)) break;
      if (size != AGOQ_COLL_MSG_SIZE || m.kind != kind) abort();
      uint8_t out[AGOQ_COLL_MSG_SIZE];
      agoq_coll_msg_encode(out, m.kind, (int)m.phase, (int)m.rank, (int)m.nranks);
      if (!agoq_coll_msg_decode(out, sizeof out, kind, &m2) || m2.phase != m.phase || m2.rank != m.rank ||
          m2.nranks != m.nranks)
        abort();
      if (agoq_coll_ident_valid(&m, me, nranks)) {
        if (kind != AGOQ_COLL_MSG_IDENT || m.phase > 1 || m.rank >= (uint32_t)nranks || m.rank == (uint32_t)me)
          abort();
        /* Setup indexes recv[phase][rank]: touch it as setup would. */
        void** recv[2] = {calloc((size_t)nranks, sizeof(void*)), calloc((size_t)nranks, sizeof(void*))};
        if (recv[0] != NULL && recv[1] != NULL) recv[m.phase][m.rank] = in;
        free(recv[0]);
        free(recv[1]);
      }
      break;
    }
  }
  free(in);
  return 0;
}
