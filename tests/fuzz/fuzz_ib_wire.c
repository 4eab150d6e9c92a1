/* libFuzzer target: the verbs transport's decoders of bytes a peer writes (queue-pair
 * metadata over the bootstrap, RTS slots and CTS entries in the rings). A decoded value
 * must re-encode to bytes that decode to the same value; no input may crash or read out
 * of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/ib/agoq_ib_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  uint8_t which = data[0] % 3;
  data++;
  size--;
  uint8_t* in = malloc(size ? size : 1);
  if (in == NULL) return 0;
  memcpy(in, data, size);
  switch (which) {
    case 0: {
      agoq_ib_meta m, m2;
      if (agoq_ib_meta_decode(in, size, &m) == AGOQ_IB_WIRE_OK) {
        uint8_t out[AGOQ_IB_META_SIZE];
        agoq_ib_meta_encode(&m, out);
        if (agoq_ib_meta_decode(out, sizeof out, &m2) != AGOQ_IB_WIRE_OK || memcmp(&m, &m2, sizeof m) != 0) abort();
        if (memcmp(out, in, sizeof out) != 0) abort(); /* one encoding per value */
      }
      break;
    }
    case 1: {
      agoq_ib_rts r, r2;
      uint32_t eager = size > 0 ? (uint32_t)in[0] << 8 : 0;
      if (agoq_ib_rts_decode(in, size, eager, &r) == AGOQ_IB_WIRE_OK) {
        uint8_t out[AGOQ_IB_RTS_HDR_SIZE];
        agoq_ib_rts_encode(&r, out);
        if (agoq_ib_rts_decode(out, sizeof out, eager, &r2) != AGOQ_IB_WIRE_OK || r2.seq != r.seq ||
            r2.tag != r.tag || r2.size != r.size || r2.flags != r.flags)
          abort();
      }
      break;
    }
    default: {
      agoq_ib_cts c, c2;
      if (agoq_ib_cts_decode(in, size, &c) == AGOQ_IB_WIRE_OK) {
        uint8_t out[AGOQ_IB_CTS_SIZE];
        agoq_ib_cts_encode(&c, out);
        if (agoq_ib_cts_decode(out, sizeof out, &c2) != AGOQ_IB_WIRE_OK || memcmp(&c, &c2, sizeof c) != 0) abort();
      }
      break;
    }
  }
  free(in);
  return 0;
}
