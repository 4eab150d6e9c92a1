/* The collnet view: enough to initialise a CollNet table and list its devices. */
#include "agoq_loader_internal.h"

#define AGOQ_COLL_CALL(N, member, ...) \
  AGOQ_VIEW_CALL(ncclCollNet_v##N##_t, v, member, __VA_ARGS__)

ncclResult_t agoq_collnet_view_init(const agoq_collnet_view* v, void** ctx, uint64_t comm_id,
                                    ncclDebugLogger_t log) {
  if (v->version == 11) return AGOQ_COLL_CALL(11, init, ctx, comm_id, log);
  if (v->version == 12) return AGOQ_COLL_CALL(12, init, ctx, comm_id, log);
  *ctx = NULL;
  switch (v->version) {
    case 6: return AGOQ_COLL_CALL(6, init, log);
    case 7: return AGOQ_COLL_CALL(7, init, log);
    case 8: return AGOQ_COLL_CALL(8, init, log);
    case 9: return AGOQ_COLL_CALL(9, init, log);
    case 10: return AGOQ_COLL_CALL(10, init, log);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_collnet_view_finalize(const agoq_collnet_view* v, void* ctx) {
  if (v->version == 11) return AGOQ_COLL_CALL(11, finalize, ctx);
  if (v->version == 12) return AGOQ_COLL_CALL(12, finalize, ctx);
  return ncclSuccess;
}

ncclResult_t agoq_collnet_view_devices(const agoq_collnet_view* v, int* ndev) {
  switch (v->version) {
    case 6: return AGOQ_COLL_CALL(6, devices, ndev);
    case 7: return AGOQ_COLL_CALL(7, devices, ndev);
    case 8: return AGOQ_COLL_CALL(8, devices, ndev);
    case 9: return AGOQ_COLL_CALL(9, devices, ndev);
    case 10: return AGOQ_COLL_CALL(10, devices, ndev);
    case 11: return AGOQ_COLL_CALL(11, devices, ndev);
    case 12: return AGOQ_COLL_CALL(12, devices, ndev);
    default: return agoq_view_bad_version(v->version);
  }
}

ncclResult_t agoq_collnet_view_get_properties(const agoq_collnet_view* v, int dev,
                                              agoq_view_props* p) {
  return agoq_view_props_get(v->version, 1, v->table, dev, p);
}
