/* The net side's question to the profiler chain (agoq_oracle.h). Runs on the proxy thread
 * inside isend/irecv, once per transfer: no logging, no allocation. */
#include <stddef.h>

#include "profiler/agoq_oracle.h"

bool agoq_oracle_query(ncclProfilerCallback_t prof_fn, void* phandle, agoq_xfer_desc* out) {
  if (out == NULL) return false;
  *out = (agoq_xfer_desc){.magic = AGOQ_XFER_DESC_MAGIC,
                          .filled = 0,
                          .kind = AGOQ_XFER_UNKNOWN,
                          .dtype = -1,
                          .proto = AGOQ_XFER_PROTO_UNKNOWN,
                          .is_send = -1,
                          .peer = -1,
                          .task_bytes = 0,
                          .two_way = 0};
  if (prof_fn == NULL || phandle == NULL) return false;
  /* NCCL's callback starts our NetPlugin event only when a profiler is loaded and the
   * task's mask has the NetPlugin bit; otherwise eH stays NULL and there is nothing to
   * stop (NCCL's stop would pass NULL to the profiler). Results are ignored: a failed
   * callback only means "unknown". */
  void* eh = NULL;
  (void)prof_fn(&eh, AGOQ_PROF_NET_EVENT_START, phandle, AGOQ_PROF_NET_PLUGIN_ID, out);
  if (eh != NULL) (void)prof_fn(&eh, AGOQ_PROF_NET_EVENT_STOP, phandle, AGOQ_PROF_NET_PLUGIN_ID, out);
  return out->filled != 0;
}
