/* libFuzzer target: every decoder of bytes that arrive from the network (handle, hello,
 * ack, message header). A decoded value must re-encode to bytes that decode to the same
 * value, and no input may crash or read out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/tcp/agoq_tcp_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  uint8_t which = data[0] % 4;
  data++;
  size--;
  /* A heap copy of exactly `size` bytes, so ASan sees any read past the input. */
  uint8_t* in = malloc(size ? size : 1);
  if (in == NULL) return 0;
  memcpy(in, data, size);
  switch (which) {
    case 0: {
      agoq_handle h, h2;
      if (agoq_handle_decode(in, size, &h) == AGOQ_WIRE_OK) {
        uint8_t out[AGOQ_HANDLE_WIRE_SIZE];
        agoq_handle_encode(&h, out);
        if (agoq_handle_decode(out, sizeof out, &h2) != AGOQ_WIRE_OK || h2.comm_id != h.comm_id ||
            h2.nonce != h.nonce || h2.nsocks != h.nsocks || memcmp(&h2.addr, &h.addr, h.addr_len) != 0)
          abort();
      }
      break;
    }
    case 1: {
      agoq_hello h, h2;
      (void)agoq_hello_check_prefix(in, size);
      if (agoq_hello_decode(in, size, &h) == AGOQ_WIRE_OK) {
        uint8_t out[AGOQ_HELLO_SIZE];
        agoq_hello_encode(&h, out);
        if (agoq_hello_decode(out, sizeof out, &h2) != AGOQ_WIRE_OK || h2.comm_id != h.comm_id ||
            h2.nonce != h.nonce || h2.conn_id != h.conn_id || h2.sock_index != h.sock_index ||
            h2.nsocks != h.nsocks)
          abort();
      }
      break;
    }
    case 2: {
      agoq_ack_status st;
      (void)agoq_ack_decode(in, size, &st);
      break;
    }
    default: {
      if (size < 1) break;
      unsigned nsocks = (unsigned)(in[size - 1] % 64) + 1;
      agoq_msg_hdr m, m2;
      if (agoq_msg_hdr_decode(in, size - 1, nsocks, &m) == AGOQ_WIRE_OK) {
        /* A valid header describes pieces that exactly cover its size on existing sockets. */
        if (!(m.flags & AGOQ_MSG_FLAG_INLINE)) {
          if (m.nchunks == 0 || m.nchunks > nsocks || m.first_sock >= nsocks) abort();
          uint64_t covered = 0;
          for (unsigned k = 0; k < m.nchunks; k++) {
            uint64_t off = (uint64_t)k * m.chunk;
            if (off >= m.size) abort();
            covered += m.size - off < m.chunk ? m.size - off : m.chunk;
          }
          if (covered != m.size) abort();
        }
        uint8_t out[AGOQ_MSG_HDR_SIZE];
        agoq_msg_hdr_encode(&m, out);
        if (agoq_msg_hdr_decode(out, sizeof out, nsocks, &m2) != AGOQ_WIRE_OK || m2.size != m.size ||
            m2.chunk != m.chunk || m2.nchunks != m.nchunks || m2.tag != m.tag || m2.seq != m.seq)
          abort();
      }
      break;
    }
  }
  free(in);
  return 0;
}
