/* Shared by the loader's sources; not part of its interface. */
#ifndef AGOQ_LOADER_INTERNAL_H
#define AGOQ_LOADER_INTERNAL_H

#include "abi/agoq_nccl_net_v12.h"
#include "abi/agoq_nccl_net_v6.h"
#include "agoq_loader.h"

/* Calls table member `member` of a view whose table has type T, or reports a NULL
 * member instead of jumping through it. */
#define AGOQ_VIEW_CALL(T, view, member, ...)                                       \
  (((const T*)(view)->table)->member != NULL                                       \
       ? ((const T*)(view)->table)->member(__VA_ARGS__)                            \
       : agoq_view_missing((view)->version, #member))

ncclResult_t agoq_view_missing(int version, const char* member);
ncclResult_t agoq_view_bad_version(int version);

/* getProperties of a net (is_coll 0) or collnet table of any version, converted. */
ncclResult_t agoq_view_props_get(int version, int is_coll, const void* table, int dev,
                                 agoq_view_props* out);

#endif
