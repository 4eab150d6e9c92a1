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
/* v6 getChunkSize. NCCL cuts a CollNetChain AllReduce into chunks of at most 256 KiB per
 * channel and halves them unless a channel gets 64 (then 8) chunks per GPU of the chain; the
 * proxy hands agoq one CollNet call per 8 channels and chunk, so a 64 MiB reduction reaches
 * agoq as calls of 1 MiB, each cut again into a piece per peer. Where the communicator spans
 * nodes, the chunk is doubled, up to NCCL's step (NCCL_BUFFSIZE / 8, the most NCCL takes),
 * while each channel still gets 8 chunks per GPU of the chain, the bar NCCL itself accepts
 * for its 128 KiB chunks (the chain's fill then costs at most an eighth). Other algorithms,
 * protocols and communicators keep NCCL's value. Always ncclSuccess. */
ncclResult_t agoq_tuner_get_chunk_size(void* ctx, int coll_type, size_t nbytes, int algo, int proto, int nchannels,
                                       size_t* chunk);
ncclResult_t agoq_tuner_finalize(void* ctx);

#endif
