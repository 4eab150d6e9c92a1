/*
 * ncclTuner_v5 (NCCL 2.27 .. 2.28; NCCL looks up "ncclTunerPlugin_v5"): per-communicator
 * init with NVLink-domain facts and in/out tuning constants, getCollInfo that edits the
 * collective's algorithm x protocol cost table, finalize.
 *
 * Declared from the facts of NCCL 2.28.9's tuner interface, in our own words; only ids and
 * layouts NCCL fixes are here.
 */
#ifndef AGOQ_NCCL_TUNER_V5_H
#define AGOQ_NCCL_TUNER_V5_H

#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NCCL's function ids (nccl_common.h). Only the first five are collectives the tuner is
 * asked about; 2.29+ append AllGatherV and the signal functions after Gather. */
#ifndef AGOQ_NCCL_FUNC_DEFINED
#define AGOQ_NCCL_FUNC_DEFINED
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
  ncclFuncAlltoAll = 8,
  ncclFuncScatter = 9,
  ncclFuncGather = 10
} ncclFunc_t;
#endif

/* Rows and columns of the cost table (NCCL_ALGO_* / NCCL_PROTO_*). */
#define AGOQ_NCCL_ALGO_TREE 0
#define AGOQ_NCCL_ALGO_RING 1
#define AGOQ_NCCL_ALGO_COLLNET_DIRECT 2
#define AGOQ_NCCL_ALGO_COLLNET_CHAIN 3
#define AGOQ_NCCL_ALGO_NVLS 4
#define AGOQ_NCCL_ALGO_NVLS_TREE 5
#define AGOQ_NCCL_ALGO_PAT 6
#define AGOQ_NCCL_PROTO_LL 0
#define AGOQ_NCCL_PROTO_LL128 1
#define AGOQ_NCCL_PROTO_SIMPLE 2
/* A cost-table entry NCCL will not use (algorithm/protocol unavailable for this call). */
#define AGOQ_NCCL_ALGO_PROTO_IGNORE (-1.0f)

#define NCCL_NUM_ALGORITHMS_V5 7
#define NCCL_NUM_PROTOCOLS_V5 3
#define NCCL_NUM_HW_LINKS_V5 3
#define NCCL_NUM_COMPCAPS_V5 4
#define NCCL_NUM_TUNING_SCALES_V5 3

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

/* In/out: NCCL's latency and bandwidth model, which a tuner may rescale. agoq leaves it. */
typedef struct {
  double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  /* Called on the user thread for every collective (never for send/recv). collCostTable is
   * really a float[numAlgo][numProto] passed as float**: entry (a, p) is
   * ((float*)collCostTable)[a * numProto + p]; the lowest non-negative time wins. 2.28
   * propagates an error from here to the collective, so agoq always returns success. */
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
} ncclTuner_v5_t;

#if !defined(__cplusplus) && defined(__LP64__)
_Static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12, "tuner v5 ABI");
/* 21 + 63 + 5 x 12 doubles. */
_Static_assert(sizeof(ncclTunerConstants_v5_t) == 144 * sizeof(double), "tuner v5 ABI");
_Static_assert(offsetof(ncclTunerConstants_v5_t, llMaxBws) == 84 * sizeof(double), "tuner v5 ABI");
_Static_assert(sizeof(ncclTuner_v5_t) == 4 * sizeof(void*), "tuner v5 ABI");
_Static_assert(sizeof(ncclFunc_t) == sizeof(int), "tuner v5 ABI: ncclFunc_t is an int enum");
#endif

#ifdef __cplusplus
}
#endif
#endif
