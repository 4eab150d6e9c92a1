/*
 * The part of the CUDA runtime API that agoq uses, for the CPU emulation
 * (agoq_cuda_emu_runtime.cpp). Strict where the hardware is:
 *  - device memory (cudaMalloc) is not host memory: the pointer the host gets is mapped
 *    without access, so a host read or write of it faults; kernels and copies reach the
 *    bytes through a second mapping of the same pages;
 *  - a kernel argument must point into device memory or pinned host memory (cudaMallocHost,
 *    cudaHostAlloc), never into pageable memory;
 *  - a copy's direction must match where its pointers are;
 *  - work on a stream runs later, in order: it makes progress only when the host asks
 *    about it (a query runs at most one queued operation of its event's or stream's queue
 *    before it answers; a synchronize runs what it waits for), so a result is visible only
 *    after its event or stream says so; streams are joined only by cudaStreamWaitEvent;
 *  - lazy loading, at its worst, always: a kernel must be loaded on the current device
 *    (cudaFuncGetAttributes loads it) before it is launched there. A GPU would load it at its
 *    first launch, and that load may wait for every kernel running on the device (NCCL's,
 *    which may be waiting for the plugin: a deadlock); the emulation refuses that launch
 *    instead (cudaErrorFunctionNotLoaded, with a line on stderr naming the kernel). Always
 *    on: there is no permissive mode. The set of loaded kernels is kept per context;
 *  - contexts: each device's primary one (cudaSetDevice) and private ones
 *    (agoq_emu_context_create, as cuCtxCreate; NCCL_CREATE_THREAD_CONTEXT=1 runs NCCL's
 *    proxy threads in one); a stream or event of a private context is refused while another
 *    context is current, and the other way round.
 * Only the emulation targets have this directory on their include path.
 */
#ifndef AGOQ_EMU_CUDA_RUNTIME_API_H
#define AGOQ_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The runtime's own numbers. */
typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  /* The emulation's answer to a hang it can prove (agoq_emu_wait_item): a GPU would hang,
   * and a watchdog would end the kernel. */
  cudaErrorLaunchTimeout = 702,
  cudaErrorSymbolNotFound = 500,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorFunctionNotLoaded = 913,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorIllegalState = 401,
} cudaError_t;

/* Stream capture (CUDA graphs). The calls CUDA calls "potentially unsafe" during a capture
 * are not listed by the documentation beyond cudaMalloc; the emulation takes the adversarial
 * set: allocation and freeing (device and pinned), the synchronous copy and memset, every
 * synchronize, and the creation and destruction of streams and events. Such a call fails with
 * cudaErrorStreamCaptureUnsupported, and invalidates the captures it conflicts with
 * (cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated), when the calling
 * thread's mode (cudaThreadExchangeStreamCaptureMode, Global by default) is Global and another
 * thread captures in Global mode, or is Global or ThreadLocal and the thread itself captures in
 * a mode other than Relaxed. Work queued on a capturing stream is not recorded into a graph:
 * the emulation aborts, naming the call (tests capture only to make the capture exist). */
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
typedef struct agoq_emu_graph* cudaGraph_t;

/* cudaGetDriverEntryPointByVersion: the driver API without linking it. The emulation knows
 * "cuMemGetAddressRange" (the _v2 signature: int (*)(unsigned long long* base,
 * size_t* size, unsigned long long ptr), CUDA_SUCCESS 0, CUDA_ERROR_INVALID_VALUE 1 for a
 * pointer in no device allocation) and "cuMemGetHandleForAddressRange" (int (*)(void* fd,
 * unsigned long long dptr, size_t size, int type, unsigned long long flags): type 1, a
 * dma-buf fd of whole pages of one allocation, from its first page). */
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2,
};
#define cudaEnableDefault 0x0ull

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventBlockingSync 0x1u
#define cudaEventDisableTiming 0x2u
#define cudaHostAllocDefault 0x0u
#define cudaHostAllocPortable 0x1u

typedef struct agoq_emu_stream* cudaStream_t;
typedef struct agoq_emu_event* cudaEvent_t;

/* The device attributes the emulation answers (cudaDeviceGetAttribute). */
enum cudaDeviceAttr {
  cudaDevAttrGPUDirectRDMASupported = 116,
  cudaDevAttrGPUDirectRDMAFlushWritesOptions = 117,
};
enum cudaFlushGPUDirectRDMAWritesOptions { cudaFlushGPUDirectRDMAWritesOptionHost = 1 << 0 };
enum cudaFlushGPUDirectRDMAWritesTarget { cudaFlushGPUDirectRDMAWritesTargetCurrentDevice = 0 };
enum cudaFlushGPUDirectRDMAWritesScope {
  cudaFlushGPUDirectRDMAWritesToOwner = 100,
  cudaFlushGPUDirectRDMAWritesToAllDevices = 200,
};

/* The leading fields of the runtime's struct; the emulation fills maxThreadsPerBlock. */
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
};

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int* dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int dev);
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int dev);
/* Writes by a NIC into device memory are visible at once here; the call is counted. */
cudaError_t cudaDeviceFlushGPUDirectRDMAWrites(enum cudaFlushGPUDirectRDMAWritesTarget target,
                                               enum cudaFlushGPUDirectRDMAWritesScope scope);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attr, const void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest);
cudaError_t cudaGetLastError(void);
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
/* Loads kernel func (its address) on the current device, as the driver does under lazy
 * loading (the CUDA Programming Guide, "Lazy Loading"); launching it is allowed from then on. */
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func);
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int cuda_version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* status);

/* Not CUDA: what the emulation saw, for tests of code that must never use the legacy
 * default stream or block (NCCL's proxy thread). */
typedef struct {
  unsigned long long legacy_stream_ops; /* work queued on stream 0 (the legacy default stream) */
  unsigned long long sync_calls;        /* cudaMemcpy, cudaMemset, cudaDeviceSynchronize */
  unsigned long long ops_run;           /* queued operations the device has completed */
  unsigned long long device_allocs;     /* live cudaMalloc allocations */
  unsigned long long pinned_allocs;     /* live cudaMallocHost / cudaHostAlloc allocations */
  unsigned long long rdma_flushes;      /* cudaDeviceFlushGPUDirectRDMAWrites calls */
  unsigned long long kernel_launches;   /* kernel launches, refused ones included */
  unsigned long long kernels_refused;   /* launches of a kernel not loaded on its device */
  unsigned long long deadlocks;         /* hangs the emulation reported instead of hanging */
  unsigned long long capture_refused;   /* calls refused because a stream capture was under way */
  /* 128-byte lines of the watched range (agoq_emu_watch_ll128) that one copy wrote both the
   * data of and the flag word of: the order of a copy's writes inside a line is undocumented,
   * so the flag may land first and NCCL's LL128 poller read the line before its data. */
  unsigned long long ll128_flag_early;
  unsigned long long live_events; /* events created and not destroyed */
  unsigned long long pinned_bytes; /* bytes of the live pinned allocations */
} agoq_emu_counters;
void agoq_emu_counters_get(agoq_emu_counters* c);
/* Not CUDA: marks device range [dev, dev + bytes) as an LL128 receive buffer (NCCL's: 128-byte
 * lines, 120 bytes of data then an 8-byte flag the kernel polls); bytes 0 clears it. Copies
 * into it are counted in ll128_flag_early when one copy writes a line's data and its flag. */
void agoq_emu_watch_ll128(const void* dev, size_t bytes);
/* Not CUDA: copies device memory as it is now, running none of the queued work (a test's
 * look at what the plugin claims is already there). -1 unless [dev, dev + bytes) is device
 * memory. */
int agoq_emu_peek(void* host, const void* dev, size_t bytes);
/* Not CUDA: the clock (seconds) that stamps an event when the device reaches its record
 * (cudaEventElapsedTime's differences); NULL restores CLOCK_MONOTONIC. Tests inject a
 * counter so that GPU times are exact and do not depend on the machine. */
void agoq_emu_clock_set(double (*clock)(void));
/* Not CUDA: kernels in `device`'s primary context: distinct ones loaded (cudaFuncGetAttributes),
 * distinct ones launched (refused launches included). -1 for a device the emulation does not
 * have. */
int agoq_emu_kernels_get(int device, unsigned long long* loaded, unsigned long long* launched);
/* Not CUDA: launches so far, refused ones included, of the kernels whose name (as the codec
 * gives it, e.g. "raw_decode_kernel<3>") starts with `prefix`, on any device. */
unsigned long long agoq_emu_kernel_launches(const char* prefix);
/* Not CUDA: the number of emulated devices from now on (1 to 8; CUDAEMU_DEVICES, default 1,
 * otherwise); returns the previous number. Each thread has its own current device; device
 * memory, streams and events belong to the device current at their creation; a kernel goes
 * only to a stream of the current device and reaches only that device's memory (and pinned
 * memory); an event is recorded only on a stream of its own device. */
int agoq_emu_devices_set(int n);
/* Not CUDA: a new private context on `device`, made current on the calling thread, as the
 * driver's cuCtxCreate does (NCCL_CREATE_THREAD_CONTEXT=1 makes one for NCCL's proxy threads);
 * NULL for a device the emulation does not have. It lives as long as the process. Kernels are
 * loaded per context; a stream or event of a private context is refused while another
 * context is current (the driver's cuCtxGetCurrent and cuCtxSetCurrent, through
 * cudaGetDriverEntryPointByVersion, switch). */
void* agoq_emu_context_create(int device);
/* Not CUDA: the driver's cuCtxSetCurrent (ctx NULL: none bound; a thread bound to none gets
 * its current device's primary context at its next runtime call); 0, or 201 for a context
 * the emulation never made. */
int agoq_emu_context_set(void* ctx);
/* Not CUDA: forgets every kernel loaded and launched on every device, as a new process would
 * start: for a test of the refusal in a process that already loaded the codec. */
void agoq_emu_kernels_forget(void);

/* Not CUDA: a stand-in for NCCL's kernel, which spins on the device until a word changes
 * (the data or the flag the plugin's copy delivers). Queued on `stream` like a launch, it
 * starts when it reaches the head of its stream and of its hardware queue, then occupies
 * its stream (and so, for whatever is queued behind it on that stream, its hardware
 * queue) until the 32-bit word at `word` equals `value`. `word` is in device memory
 * (written by device work: copies, memsets) or pinned host memory (written by host
 * threads). cudaErrorLaunchTimeout rather than a hang where the emulation can prove the
 * word will never change (agoq_emu_deadlock_text says why). *item: the handle for
 * agoq_emu_wait_item_state, released with agoq_emu_wait_item_release. */
typedef struct agoq_emu_wait agoq_emu_wait;
cudaError_t agoq_emu_wait_item(cudaStream_t stream, const void* word, unsigned value, agoq_emu_wait** item);
enum agoq_emu_wait_state {
  AGOQ_EMU_WAIT_QUEUED = 0,  /* not yet started: work before it on its stream or queue */
  AGOQ_EMU_WAIT_RUNNING = 1, /* started, the word not yet seen */
  AGOQ_EMU_WAIT_DONE = 2,    /* saw the word: the kernel finished */
  AGOQ_EMU_WAIT_ABORTED = 3, /* ended by the emulation to break a deadlock it reported */
};
enum agoq_emu_wait_state agoq_emu_wait_item_state(const agoq_emu_wait* item);
void agoq_emu_wait_item_release(agoq_emu_wait* item);
/* Not CUDA: the last deadlock the emulation reported ("" if none), as printed to stderr. */
void agoq_emu_deadlock_text(char* buf, size_t len);
/* Not CUDA: the number of in-order hardware queues that streams created from now on are
 * spread over, round-robin (CUDA_DEVICE_MAX_CONNECTIONS, which the driver reads once when
 * it creates the context: the emulation reads it at its first stream; default 8, 1..32).
 * For tests that compare counts in one process; restarts the round-robin at queue 0.
 * n == 0: read CUDA_DEVICE_MAX_CONNECTIONS again, as a new context would. */
void agoq_emu_max_connections_set(int n);
/* Not CUDA, and lock-free: how many threads hold the context lock now while they wait for
 * the device to go idle (cudaFree, cudaFreeHost). Lets a test know another thread's call
 * got there without taking the lock itself. */
int agoq_emu_context_lock_holders_waiting(void);

#ifdef __cplusplus
}
#endif
#endif
