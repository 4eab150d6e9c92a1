/*
 * ncclProfiler_v6 (NCCL 2.29+): v5 plus copy-engine (CE) collective events. The descriptor
 * keeps every v5 member at the same offset (only groupApi.graphCaptured became a bool, in a
 * slot agoq never reads) and adds three CE members to the union; the state arguments are
 * v5's. The event-type bits and states of v5 keep their values; v6 appends to both.
 */
#ifndef AGOQ_NCCL_PROFILER_V6_H
#define AGOQ_NCCL_PROFILER_V6_H

#include "abi/agoq_nccl_profiler_v5.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  ncclProfileCeColl = (1 << 12),  /* a collective run by the copy engines */
  ncclProfileCeSync = (1 << 13),  /* a CE synchronisation */
  ncclProfileCeBatch = (1 << 14)  /* a CE batch */
};

/* v6 states: v5's values plus CE ones (25..30: CeColl/CeSync/CeBatch start and complete,
 * never recorded on events agoq tracks). Same int-sized enum, so v5's type serves. */
typedef ncclProfilerEventState_v5_t ncclProfilerEventState_v6_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
    /* v6: copy-engine collectives (intra-node; never on the net path). */
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v6_t;

#if !defined(__cplusplus) && defined(__LP64__)
/* Every v5 member agoq reads sits where v5 has it; the CE members fit in v5's 88-byte union
 * (ceColl is exactly 88), so the whole descriptor is still 112 bytes on LP64. */
#define AGOQ_PROF_V6_SAME(m)                                                              \
  _Static_assert(offsetof(ncclProfilerEventDescr_v6_t, m) ==                              \
                     offsetof(ncclProfilerEventDescr_v5_t, m),                            \
                 "profiler v6 ABI: " #m " moved")
AGOQ_PROF_V6_SAME(parentObj);
AGOQ_PROF_V6_SAME(rank);
AGOQ_PROF_V6_SAME(coll.datatype);
AGOQ_PROF_V6_SAME(coll.proto);
AGOQ_PROF_V6_SAME(p2p.func);
AGOQ_PROF_V6_SAME(p2p.datatype);
AGOQ_PROF_V6_SAME(p2p.count);
AGOQ_PROF_V6_SAME(p2p.peer);
AGOQ_PROF_V6_SAME(p2p.nChannels);
AGOQ_PROF_V6_SAME(proxyOp.pid);
AGOQ_PROF_V6_SAME(proxyOp.peer);
AGOQ_PROF_V6_SAME(proxyOp.isSend);
AGOQ_PROF_V6_SAME(netPlugin.id);
AGOQ_PROF_V6_SAME(netPlugin.data);
#undef AGOQ_PROF_V6_SAME
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, ceColl.stream) == 24 + 80, "profiler v6 ABI");
_Static_assert(sizeof(ncclProfilerEventDescr_v6_t) == 112, "profiler v6 ABI");
_Static_assert(sizeof(ncclProfiler_v6_t) == 6 * sizeof(void*), "profiler v6 ABI");
#endif

#ifdef __cplusplus
}
#endif
#endif
