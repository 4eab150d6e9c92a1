/*
 * The exported ncclProfiler_v5 and ncclProfiler_v6 tables, named "AGOQ". NCCL finds them in
 * the net plugin's library when NCCL_PROFILER_PLUGIN is unset (2.28.3+). Each table unpacks
 * its version's descriptor and calls the version-neutral core (plugin/profiler/agoq_prof.h);
 * v6 differs only in the descriptor type, whose v5 members sit at v5's offsets.
 */
#include <stddef.h>

#include "profiler/agoq_prof.h"
#include "abi/agoq_nccl_profiler_v6.h"
#include "tables/agoq_tables.h"

/* Unpacks descriptor `d` (either version) into the core's start functions. Event types the
 * oracle does not need (groups, other API events, kernel channels, CE events) get a NULL
 * handle: NCCL accepts it and passes NULL as their children's parent. CollApi events are
 * only remembered for the tuner (their handle is NULL too). NCCL starts them already
 * under the NetPlugin mask bit (profiler.cc collApiMask includes it): no extra events. */
#define AGOQ_PROF_START(ctx, d)                                                            \
  ((d)->type == ncclProfileNetPlugin                                                       \
       ? agoq_prof_start_net((ctx), (d)->parentObj, (d)->netPlugin.id, (d)->netPlugin.data) \
   : (d)->type == ncclProfileProxyStep                                                     \
       ? agoq_prof_start_step((ctx), (d)->parentObj)                                       \
   : (d)->type == ncclProfileProxyOp                                                       \
       ? agoq_prof_start_op((ctx), (d)->parentObj, (d)->proxyOp.pid, (d)->proxyOp.peer,    \
                            (d)->proxyOp.isSend)                                           \
   : (d)->type == ncclProfileP2p                                                           \
       ? agoq_prof_start_p2p((ctx), (d)->p2p.func, (d)->p2p.datatype, (d)->p2p.count,      \
                             (d)->p2p.peer)                                                \
   : (d)->type == ncclProfileColl                                                          \
       ? agoq_prof_start_coll((ctx), (d)->coll.datatype, (d)->coll.proto)                  \
   : (d)->type == ncclProfileCollApi                                                       \
       ? agoq_prof_start_coll_api((ctx), (d)->collApi.func, (d)->collApi.datatype,         \
                                  (d)->collApi.count)                                      \
       : NULL)

/* The CollApi members the macro reads sit at the same place in both versions. */
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, collApi.func) ==
                       offsetof(ncclProfilerEventDescr_v6_t, collApi.func) &&
                   offsetof(ncclProfilerEventDescr_v5_t, collApi.count) ==
                       offsetof(ncclProfilerEventDescr_v6_t, collApi.count) &&
                   offsetof(ncclProfilerEventDescr_v5_t, collApi.datatype) ==
                       offsetof(ncclProfilerEventDescr_v6_t, collApi.datatype),
               "profiler v5/v6 collApi layout");

static ncclResult_t agoq_prof_start_v5(void* ctx, void** handle,
                                       ncclProfilerEventDescr_v5_t* d) {
  if (handle == NULL) return ncclSuccess;
  *handle = d != NULL ? AGOQ_PROF_START(ctx, d) : NULL;
  return ncclSuccess;
}

static ncclResult_t agoq_prof_start_v6(void* ctx, void** handle,
                                       ncclProfilerEventDescr_v6_t* d) {
  if (handle == NULL) return ncclSuccess;
  *handle = d != NULL ? AGOQ_PROF_START(ctx, d) : NULL;
  return ncclSuccess;
}

/* agoq records no state transitions; NetPlugin updates carry nothing it needs. */
static ncclResult_t agoq_prof_record_v5(void* handle, ncclProfilerEventState_v5_t state,
                                        ncclProfilerEventStateArgs_v5_t* args) {
  return ncclSuccess;
}

AGOQ_EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {
    .name = AGOQ_PROF_NAME,
    .init = agoq_prof_init,
    .startEvent = agoq_prof_start_v5,
    .stopEvent = agoq_prof_stop,
    .recordEventState = agoq_prof_record_v5,
    .finalize = agoq_prof_finalize,
};

AGOQ_EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {
    .name = AGOQ_PROF_NAME,
    .init = agoq_prof_init,
    .startEvent = agoq_prof_start_v6,
    .stopEvent = agoq_prof_stop,
    .recordEventState = agoq_prof_record_v5,
    .finalize = agoq_prof_finalize,
};
