/*
 * ncclTuner_v6 (NCCL 2.29+; "ncclTunerPlugin_v6"): v5's members in the same order plus an
 * optional getChunkSize that may override the chunk size NCCL computed. Constants and
 * NVLink-domain info are v5's.
 */
#ifndef AGOQ_NCCL_TUNER_V6_H
#define AGOQ_NCCL_TUNER_V6_H

#include "abi/agoq_nccl_tuner_v5.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;
typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v6_t* nvlDomainInfo,
                       ncclTunerConstants_v6_t* constants);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
  /* Optional (NULL: NCCL keeps its own). *chunkSize holds NCCL's value on entry; leaving
   * it unchanged is "no opinion". NCCL clamps whatever comes back to its buffer limit. */
  ncclResult_t (*getChunkSize)(void* ctx, ncclFunc_t collType, size_t nBytes, int algo,
                               int proto, int nChannels, size_t* chunkSize);
} ncclTuner_v6_t;

#if !defined(__cplusplus) && defined(__LP64__)
_Static_assert(offsetof(ncclTuner_v6_t, finalize) == offsetof(ncclTuner_v5_t, finalize),
               "tuner v6 ABI");
_Static_assert(sizeof(ncclTuner_v6_t) == 5 * sizeof(void*), "tuner v6 ABI");
#endif

#ifdef __cplusplus
}
#endif
#endif
