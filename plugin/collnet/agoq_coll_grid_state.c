/* The frames of a grid message, one after the other (agoq_coll_grid_state.h): what the
 * host's stages and the GPU's checks read alike. */
#include "collnet/agoq_coll_grid_state.h"
#include "core/agoq_check.h"

ncclResult_t agoq_gframe_next(agoq_coll_comm* g, int from, const uint8_t* msg, size_t size, size_t* off,
                                     bool sealed, size_t m, agoq_gframe_fn fn, void* arg) {
  const char* why = NULL;
  agoq_codec_status st = AGOQ_CODEC_OK;
  size_t at = *off, len = 0;
  if (at > size || size - at < AGOQ_FRAME_HEADER_SIZE) {
    why = "the message ends before the frame";
  } else {
    uint64_t payload = 0;
    for (int i = 7; i >= 0; i--) payload = payload << 8 | msg[at + 24 + (size_t)i];
    if (payload > size - at - AGOQ_FRAME_HEADER_SIZE) {
      why = "the frame runs past the message";
    } else {
      len = AGOQ_FRAME_HEADER_SIZE + (size_t)payload;
      if (sealed && !agoq_frame_has_payload_crc(msg + at, len)) why = "no payload CRC (another agoq version?)";
      else st = fn(arg, msg + at, len, m);
    }
  }
  if (why == NULL && st == AGOQ_CODEC_OK) {
    *off = at + len;
    return ncclSuccess;
  }
  AGOQ_WARN("CollNet rank %d: frame from rank %d at byte %zu of a %zu-byte message (a piece of %zu elements) refused "
            "before decoding: %s; the call fails", g->rank, from, at, size, m,
            why != NULL ? why : agoq_codec_status_str(st));
  return ncclSystemError;
}
