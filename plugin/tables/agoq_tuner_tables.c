/*
 * The exported ncclTunerPlugin_v5 (NCCL 2.27/2.28) and ncclTunerPlugin_v6 (2.29+) tables,
 * named "AGOQ". NCCL finds them in the net plugin's library when NCCL_TUNER_PLUGIN is
 * unset. Thin adapters over plugin/tuner/agoq_tuner.h.
 */
#include "abi/agoq_nccl_tuner_v6.h"
#include "tables/agoq_tables.h"
#include "tuner/agoq_tuner.h"

/* The NVLink-domain facts and NCCL's latency/bandwidth constants are left as NCCL made
 * them: agoq only edits per-collective costs. */
static ncclResult_t agoq_tuner_init_v5(void** ctx, uint64_t comm_id, size_t nranks,
                                       size_t nnodes, ncclDebugLogger_t log_fn,
                                       ncclNvlDomainInfo_v5_t* nvl,
                                       ncclTunerConstants_v5_t* constants) {
  return agoq_tuner_init(ctx, comm_id, nranks, nnodes, log_fn);
}

static ncclResult_t agoq_tuner_get_coll_info_v5(void* ctx, ncclFunc_t coll_type, size_t nbytes,
                                                int num_pipe_ops, float** cost_table,
                                                int num_algo, int num_proto, int reg_buff,
                                                int* nchannels) {
  return agoq_tuner_get_coll_info(ctx, (int)coll_type, nbytes, cost_table, num_algo, num_proto,
                                  nchannels);
}

static ncclResult_t agoq_tuner_get_chunk_size_v6(void* ctx, ncclFunc_t coll_type, size_t nbytes,
                                                 int algo, int proto, int nchannels,
                                                 size_t* chunk_size) {
  return agoq_tuner_get_chunk_size(ctx, (int)coll_type, nbytes, algo, proto, nchannels, chunk_size);
}

AGOQ_EXPORT const ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = AGOQ_TUNER_NAME,
    .init = agoq_tuner_init_v5,
    .getCollInfo = agoq_tuner_get_coll_info_v5,
    .finalize = agoq_tuner_finalize,
};

AGOQ_EXPORT const ncclTuner_v6_t ncclTunerPlugin_v6 = {
    .name = AGOQ_TUNER_NAME,
    .init = agoq_tuner_init_v5,
    .getCollInfo = agoq_tuner_get_coll_info_v5,
    .finalize = agoq_tuner_finalize,
    .getChunkSize = agoq_tuner_get_chunk_size_v6,
};
