/* The net side of the type oracle: one NetPlugin event started and stopped through NCCL's
 * profiler callback, with our descriptor as its data (agoq_oracle.h). */
#include "profiler/agoq_oracle.h"

#include <stdatomic.h>
#include <stddef.h>

static atomic_bool agoq_oracle_loaded;

void agoq_oracle_mark_loaded(void) { atomic_store(&agoq_oracle_loaded, true); }

bool agoq_oracle_profiler_loaded(void) { return atomic_load(&agoq_oracle_loaded); }

bool agoq_oracle_query(ncclProfilerCallback_t prof_fn, void* phandle, agoq_xfer_desc* out) {
  *out = (agoq_xfer_desc){.magic = AGOQ_XFER_DESC_MAGIC, .kind = AGOQ_XFER_UNKNOWN, .dtype = -1};
  if (prof_fn == NULL || phandle == NULL) return false;
  /* NCCL leaves eHandle untouched when the NetPlugin bit is off (no agoq profiler): it must
   * start NULL so that we stop only what was started. */
  void* event = NULL;
  if (prof_fn(&event, AGOQ_PROF_NET_EVENT_START, phandle, AGOQ_PROF_NET_PLUGIN_ID, out) != ncclSuccess) {
    out->filled = 0;
    return false;
  }
  if (event != NULL) (void)prof_fn(&event, AGOQ_PROF_NET_EVENT_STOP, phandle, AGOQ_PROF_NET_PLUGIN_ID, out);
  return out->filled == 1;
}
