/* NCCL hands the profiler strings, not enum values: the datatype from
 * ncclDatatypeToString, the function from ncclFuncToString, the protocol from
 * ncclProtoToString. These map them back; anything unrecognised is "unknown" and the
 * transfer stays exact. */
#include <string.h>

#include "profiler/agoq_prof.h"

/* Index = ncclDataType_t. ncclUint8 is listed although NCCL 2.28.9 prints "Unknown" for it
 * (its ncclDatatypeToString has no case): a later NCCL that names it is still understood. */
static const struct {
  const char* name;
  size_t size;
} agoq_prof_dtypes[ncclNumTypes] = {
    [ncclInt8] = {"ncclInt8", 1},          [ncclUint8] = {"ncclUint8", 1},
    [ncclInt32] = {"ncclInt32", 4},        [ncclUint32] = {"ncclUint32", 4},
    [ncclInt64] = {"ncclInt64", 8},        [ncclUint64] = {"ncclUint64", 8},
    [ncclFloat16] = {"ncclFloat16", 2},    [ncclFloat32] = {"ncclFloat32", 4},
    [ncclFloat64] = {"ncclFloat64", 8},    [ncclBfloat16] = {"ncclBfloat16", 2},
    [ncclFloat8e4m3] = {"ncclFloat8e4m3", 1}, [ncclFloat8e5m2] = {"ncclFloat8e5m2", 1},
};

int agoq_prof_parse_dtype(const char* s) {
  if (s == NULL || strncmp(s, "nccl", 4) != 0) return -1;
  for (int t = 0; t < ncclNumTypes; t++)
    if (strcmp(s, agoq_prof_dtypes[t].name) == 0) return t;
  return -1;
}

size_t agoq_prof_dtype_size(int dtype) {
  return dtype >= 0 && dtype < ncclNumTypes ? agoq_prof_dtypes[dtype].size : 0;
}

agoq_xfer_proto agoq_prof_parse_proto(const char* s) {
  if (s == NULL) return AGOQ_XFER_PROTO_UNKNOWN;
  if (strcmp(s, "SIMPLE") == 0 || strcmp(s, "Simple") == 0) return AGOQ_XFER_PROTO_SIMPLE;
  if (strcmp(s, "LL") == 0) return AGOQ_XFER_PROTO_LL;
  if (strcmp(s, "LL128") == 0) return AGOQ_XFER_PROTO_LL128;
  return AGOQ_XFER_PROTO_UNKNOWN;
}

int agoq_prof_parse_p2p_func(const char* s) {
  if (s == NULL) return -1;
  if (strcmp(s, "Send") == 0) return 1;
  if (strcmp(s, "Recv") == 0) return 0;
  return -1;
}
