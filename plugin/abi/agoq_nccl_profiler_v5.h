/*
 * ncclProfiler_v5 (NCCL 2.26 .. 2.28; still accepted by 2.29+): the event-type bits, the
 * state enum, the event descriptor, the state arguments and the table NCCL finds under the
 * symbol "ncclProfiler_v5" (no "Plugin" in the name).
 *
 * Declared from the facts of NCCL 2.28.9's profiler interface, in our own words. agoq uses
 * only what the type oracle needs: the Coll and P2p task descriptors (function, datatype,
 * count, algorithm, protocol), the ProxyOp and ProxyStep children and the NetPlugin event
 * that a net plugin starts through NCCL's callback. The layout is pinned below for x86-64
 * and aarch64 LP64 because NCCL hands the descriptor by pointer.
 */
#ifndef AGOQ_NCCL_PROFILER_V5_H
#define AGOQ_NCCL_PROFILER_V5_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "abi/agoq_nccl_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Event types: one bit each, also the bits of the activation mask the plugin sets in init.
 * NCCL samples the mask when a task is enqueued, so a change applies to later tasks. */
enum {
  ncclProfileGroup = (1 << 0),        /* a group of tasks launched together */
  ncclProfileColl = (1 << 1),         /* a collective task (ring/tree/CollNet traffic) */
  ncclProfileP2p = (1 << 2),          /* an ncclSend or ncclRecv task */
  ncclProfileProxyOp = (1 << 3),      /* one channel's share of a task, on a proxy thread */
  ncclProfileProxyStep = (1 << 4),    /* one network step of a proxy op */
  ncclProfileProxyCtrl = (1 << 5),    /* proxy thread state */
  ncclProfileKernelCh = (1 << 6),     /* a kernel channel (GPU timestamps) */
  ncclProfileNetPlugin = (1 << 7),    /* an event the net plugin starts through the callback */
  ncclProfileGroupApi = (1 << 8),     /* ncclGroupStart/End */
  ncclProfileCollApi = (1 << 9),      /* the collective API call */
  ncclProfileP2pApi = (1 << 10),      /* the send/recv API call */
  ncclProfileKernelLaunch = (1 << 11) /* a kernel launch */
};

/* State transitions reported through recordEventState; agoq records none of them. Values
 * are fixed by the ABI (the gaps are states retired in v4). */
typedef enum {
  ncclProfilerProxyOpSendPosted = 0,
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24
} ncclProfilerEventState_v5_t;

/* What the net plugin passes as `type` to NCCL's profiler callback (agoq_oracle.h repeats
 * the two it uses). */
enum {
  ncclProfilerNetEventStart = 0,
  ncclProfilerNetEventStop = 1,
  ncclProfilerNetEventUpdate = 2,
  ncclProfilerNetEventUpdateAndStop = 3
};

/* The descriptor of an event being started. `parentObj` is the handle this profiler returned
 * for the parent event (the task for a ProxyOp, the op for a ProxyStep, the step for a
 * NetPlugin event), or whatever another process's profiler returned (PXN: proxyOp.pid
 * differs from ours). Strings point at NCCL's static tables: "ncclBfloat16", "Send", "RING",
 * "SIMPLE", ... */
typedef struct {
  uint64_t type; /* one ncclProfile* bit */
  void* parentObj;
  int rank; /* originating rank */
  union {
    struct {
      int graphCaptured;
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
      const char* func; /* "AllReduce", "ReduceScatter", ... */
      void const* sendBuff;
      void* recvBuff;
      size_t count; /* elements of `datatype` */
      int root;
      const char* datatype; /* ncclDatatypeToString: "ncclFloat32", ... */
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;  /* "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", ... */
      const char* proto; /* "LL", "LL128", "SIMPLE" */
      void* parentGroup;
    } coll;
    struct {
      const char* func; /* "Send" or "Recv" */
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid; /* process that started the parent task (PXN: not ours) */
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
      int64_t id;  /* (plugin type << 16) | plugin version, chosen by the net plugin */
      void* data;  /* the net plugin's extData, meaningful only to a profiler knowing `id` */
    } netPlugin;
  };
} ncclProfilerEventDescr_v5_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} ncclProfilerEventStateArgs_v5_t;

typedef struct {
  const char* name;
  /* Per communicator; sets the process-wide activation mask through eActivationMask. */
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  /* Called from the user thread (tasks) and the proxy threads (ops, steps, net events);
   * a NULL *eHandle means "not tracked" and NCCL then passes NULL as children's parent. */
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

#if !defined(__cplusplus) && defined(__LP64__)
/* LP64 layout (x86-64, aarch64): the union starts at 24 and its largest member, coll, is
 * 88 bytes; these are the offsets agoq reads. */
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, parentObj) == 8, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, rank) == 16, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll) == 24, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.datatype) == 24 + 48, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.nChannels) == 24 + 56, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.algo) == 24 + 64, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.proto) == 24 + 72, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, p2p.datatype) == 24 + 16, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, p2p.count) == 24 + 24, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, p2p.peer) == 24 + 32, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, p2p.nChannels) == 24 + 36, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, proxyOp.channelId) == 24 + 4, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, proxyOp.peer) == 24 + 8, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, proxyOp.isSend) == 24 + 20, "profiler v5 ABI");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, netPlugin.data) == 24 + 8, "profiler v5 ABI");
_Static_assert(sizeof(ncclProfilerEventDescr_v5_t) == 112, "profiler v5 ABI");
_Static_assert(sizeof(ncclProfilerEventStateArgs_v5_t) == 8, "profiler v5 ABI");
_Static_assert(sizeof(pid_t) == 4, "profiler v5 ABI: pid_t is an int");
_Static_assert(sizeof(ncclProfiler_v5_t) == 6 * sizeof(void*), "profiler v5 ABI");
#endif

#ifdef __cplusplus
}
#endif
#endif
