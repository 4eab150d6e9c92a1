/*
 * Types NCCL shares with every plugin ABI version: result codes, the logger, the
 * profiler callback, datatypes and reduction ops, pointer-support flags and limits.
 *
 * Declared here from the facts of NCCL's plugin interface (values checked against
 * NCCL 2.28.9 and 2.29/2.30); we never include NCCL's own headers, so the plugin
 * builds and loads where NCCL is not installed.
 */
#ifndef AGOQ_NCCL_COMMON_H
#define AGOQ_NCCL_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Guarded so a translation unit that also sees nccl.h (tests on a GPU host) does not
 * redefine the enum; the values are fixed by NCCL's ABI. */
#ifndef NCCL_H_
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5
} ncclRedOp_t;
#endif

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

typedef enum {
  NCCL_INIT = 0x1,
  NCCL_COLL = 0x2,
  NCCL_P2P = 0x4,
  NCCL_SHM = 0x8,
  NCCL_NET = 0x10,
  NCCL_GRAPH = 0x20,
  NCCL_TUNING = 0x40,
  NCCL_ENV = 0x80,
  NCCL_ALLOC = 0x100,
  NCCL_CALL = 0x200,
  NCCL_PROXY = 0x400,
  NCCL_NVLS = 0x800,
  NCCL_BOOTSTRAP = 0x1000,
  NCCL_REG = 0x2000,
  NCCL_PROFILE = 0x4000,
  NCCL_RAS = 0x8000,
  NCCL_ALL = ~0
} ncclDebugLogSubSys;

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Profiler callback handed to net init (v10+): eHandle out, type start/stop/update. */
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                               int64_t pluginId, void* extData);

#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_MAX_NET_SIZE_BYTES (1ULL << 40) /* largest maxP2pBytes/maxCollBytes NCCL accepts */
#define AGOQ_NCCL_MAX_NET_SIZE (1ULL << 30)  /* MAX_NET_SIZE: int-size ABIs (v6..v8) */
#define AGOQ_NCCL_MAX_COLLNET_SIZE (512ULL << 20)
/* The largest call NCCL's staged CollNet path makes (nccl-plugin-api.md 2.5): a proxy groups
 * up to 8 channels (COLLNET_GROUP_NSUBS) of at most 256 KiB each per iallreduce with the
 * default NCCL_BUFFSIZE of 4 MiB. Only user-registered buffers with one rank per node give
 * bigger calls (up to maxCollBytes). */
#define AGOQ_NCCL_STAGED_COLLNET_CALL_MAX (2ULL << 20)

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1
} ncclNetDeviceType;
#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
#define NCCL_NET_ID_UNDEF (-1)

#ifdef __cplusplus
}
#endif
#endif
