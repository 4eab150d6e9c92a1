/*
 * agoq's tuner core, behind the exported ncclTunerPlugin_v5/v6 tables
 * (plugin/tables/agoq_tuner_tables.c). When CollNet compression is on (AGOQ_FORMAT != none)
 * and NCCL can run a float (or untyped) AllReduce or ReduceScatter of at least
 * AGOQ_MIN_BYTES on CollNet, the CollNet entries of NCCL's cost table become what agoq's
 * compressed CollNet would cost (agoq_tuner_cost.h), and NCCL picks the cheapest as always;
 * otherwise NCCL's own table stands. It never fails a collective.
 */
#ifndef AGOQ_TUNER_H
#define AGOQ_TUNER_H

#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

#define AGOQ_TUNER_NAME "AGOQ"

ncclResult_t agoq_tuner_init(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                             ncclDebugLogger_t log_fn);
/* collCostTable is NCCL's float[num_algo][num_proto] (see agoq_nccl_tuner_v5.h). Always
 * returns ncclSuccess; nchannels is never changed. */
ncclResult_t agoq_tuner_get_coll_info(void* ctx, int coll_type, size_t nbytes,
                                      float** cost_table, int num_algo, int num_proto,
                                      int* nchannels);
ncclResult_t agoq_tuner_finalize(void* ctx);

#endif
