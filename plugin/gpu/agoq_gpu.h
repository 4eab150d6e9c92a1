/*
 * The GPU layer: what the net core and CollNet need of a CUDA device, behind types that
 * name nothing of CUDA, so that their callers compile once. This folder's C sources are
 * compiled against the toolkit's runtime with the static cudart (the shipped plugin, which
 * keeps no link-time dependency on CUDA), against the CPU emulation's runtime
 * (kernels/cuda/emu: the test-only plugin libnccl-net-agoq-emu.so), or replaced by
 * agoq_gpu_none.c where CUDA is not built. Knows the CUDA runtime, not NCCL's tables.
 *
 * Rules (ARCHITECTURE.md section 4, shared/reference/gpu-data-path.md): every resource is
 * created at setup (init, regMr, connect), never in isend/irecv/test; work goes on the
 * link's own non-blocking stream, never the legacy default stream; the data path only
 * queues copies and queries events, it never waits for the device.
 */
#ifndef AGOQ_GPU_H
#define AGOQ_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"
#include "agoq_codec.h"
#include "gpu/agoq_gpu_pool.h"
#include "gpu/agoq_gpu_ring.h"

/* ---- the process --------------------------------------------------------------------- */

/* AGOQ_GPU's choices, in the parameter table's order. */
enum { AGOQ_GPU_MODE_AUTO = 0, AGOQ_GPU_MODE_ON = 1, AGOQ_GPU_MODE_OFF = 2 };

/* Once per process, after the parameters are loaded: applies AGOQ_GPU (auto: on where the
 * runtime finds a device; on: no device fails with the reason; off: host only). Logs the
 * outcome once. Idempotent. */
ncclResult_t agoq_gpu_init(void);
/* Device memory can be registered (init succeeded with a device). */
bool agoq_gpu_active(void);
/* One line for logs and agoq-info: "on: 1 device (agoq CPU emulation)" or "off: why". */
const char* agoq_gpu_describe(void);
/* Which implementation this build carries: "cuda", "emulation" or "none". */
const char* agoq_gpu_backend(void);

/* [p, p + size) lies in one device allocation of this process: *device receives its
 * ordinal. A range the runtime does not know as device memory, or that runs past it, is
 * ncclInvalidUsage with the reason in why. */
ncclResult_t agoq_gpu_range_check(const void* p, size_t size, int* device, char* why, size_t why_len);

/* ---- one connection -------------------------------------------------------------------- */

/* A connection's device resources: a stream, one event per request slot, a pinned host
 * staging ring, the codec's workspace, `parts` codec results per slot, and whatever memory
 * its owner allocated through it. What the link copied and coded is counted for the
 * statistics. */
typedef struct agoq_gpu_link agoq_gpu_link;

/* Codec results per slot of a net connection: one per buffer of a grouped receive. */
#define AGOQ_GPU_PARTS_PER_SLOT 8

typedef struct {
  uint64_t d2h_bytes, h2d_bytes; /* copied between device memory and pinned memory */
  uint64_t d2h_copies, h2d_copies;
  uint64_t encodes, decodes;     /* codec operations run (a batch counts its items) */
  uint64_t codec_calls;          /* codec calls queued: a single call or a whole batch is one */
  uint64_t encoded_bytes;        /* frames the GPU wrote into pinned memory (crossed PCIe) */
  uint64_t decoded_bytes;        /* frame bodies the GPU read from pinned memory (crossed PCIe) */
  uint64_t codec_ns;             /* GPU time of the codec calls seen complete (timing events) */
  uint64_t untimed;              /* codec calls run while `timed` others awaited their time */
} agoq_gpu_link_stats;

typedef struct {
  size_t staging; /* bytes of the pinned ring: the link's own share */
  uint32_t slots; /* events: one per request (or step) the owner tracks */
  uint32_t parts; /* codec results per slot */
  uint32_t timed; /* codec calls whose GPU time may await collection at once */
  /* Batched codec calls (agoq_gpu_frame_encode_batch and the others): slots [batch_from,
   * slots) each get a table and a workspace for batches of up to batch_items items of up to
   * batch_max_n elements (codec blocks of batch_block elements). batch_items 0: none. */
  uint32_t batch_from, batch_items, batch_block;
  size_t batch_max_n;
  /* The GPU's pinned pool the link joins (agoq_gpu_pool.h): pool.chunk 0 for none. */
  agoq_gpu_pool_config pool;
  int pool_net_dev;               /* the NIC its pieces are registered with; -1 none */
  const agoq_gpu_pool_ops* pool_ops; /* NULL: no registration (TCP) */
} agoq_gpu_link_config;

/* Creates the stream (non-blocking, the greatest priority), the slots' events, their codec
 * results, the timing events and the pinned ring, on `device`, in the caller's CUDA context
 * where it is on that device (NCCL's proxy threads may run in a private one), else in the
 * device's primary context; every later call of the link runs in that context, whatever the
 * caller's. Loads every kernel of the CUDA codec there (agoq_cuda_codec_load_all), launching
 * none: under CUDA's lazy module loading (the driver's default) a kernel's first launch
 * loads it, and that load can wait for the kernel NCCL runs meanwhile, which waits for this
 * codec's work (a deadlock, seen on an H200). Setup only. */
ncclResult_t agoq_gpu_link_create(int device, const agoq_gpu_link_config* cfg, agoq_gpu_link** out);
/* Waits for the link's queued work (close only: NCCL's buffers may be gone after it), then
 * frees everything, the memory allocated through it included. NULL is a no-op. */
void agoq_gpu_link_destroy(agoq_gpu_link* l);
/* Close only: waits for the link's queued work, so that the pinned memory its copies use can
 * be handed on (pool pieces of requests NCCL never saw complete). */
void agoq_gpu_link_quiesce(agoq_gpu_link* l);
int agoq_gpu_link_device(const agoq_gpu_link* l);
agoq_gpu_ring* agoq_gpu_link_ring(agoq_gpu_link* l);
/* The GPU's pinned pool the link joined, NULL for none. */
agoq_gpu_pool* agoq_gpu_link_pool(agoq_gpu_link* l);
const agoq_gpu_link_stats* agoq_gpu_link_stats_get(const agoq_gpu_link* l);
/* Setup only: `size` bytes of device memory (device) or of pinned host memory the device
 * reaches (!device), owned by the link and freed with it. */
ncclResult_t agoq_gpu_link_alloc(agoq_gpu_link* l, bool device, size_t size, void** p);

/* GPUDirect RDMA: whether the device can be asked to make a NIC's writes into its memory
 * visible to it (cudaDevAttrGPUDirectRDMAFlushWritesOptions; false for NULL), and the
 * request itself (cudaDeviceFlushGPUDirectRDMAWrites, to the owning context; only where
 * the first says yes): what NCCL's iflush needs after a receive the NIC wrote straight
 * into device memory. Short, but it waits. */
bool agoq_gpu_link_rdma_flush(const agoq_gpu_link* l);
ncclResult_t agoq_gpu_flush_rdma_writes(agoq_gpu_link* l);

/* Queue work on the link's stream (never blocks). dev: device memory on the link's device;
 * host: pinned memory (the staging, or the link's own). */
ncclResult_t agoq_gpu_copy_d2h(agoq_gpu_link* l, void* host, const void* dev, size_t size);
ncclResult_t agoq_gpu_copy_h2d(agoq_gpu_link* l, void* dev, const void* host, size_t size);
/* As agoq_gpu_copy_h2d into a buffer NCCL's kernel polls without waiting for the receive
 * (LL/LL128: NCCL_NET_OPTIONAL_RECV_COMPLETION): the last 8 bytes of every 128-byte line (by
 * device address: LL128's flag word) land after the rest of the line. One copy may write a
 * line in any order (undocumented), so the data go first and the flags in a second copy
 * behind them on the stream. LL's flags share 8-byte words with their data: any order of
 * whole words is safe for it. */
ncclResult_t agoq_gpu_copy_h2d_flags_last(agoq_gpu_link* l, void* dev, const void* host, size_t size);
/* Records slot's event behind everything queued so far. */
ncclResult_t agoq_gpu_mark(agoq_gpu_link* l, uint32_t slot);
/* *done = the work queued before slot's mark has completed. Only queries events: the slot's,
 * and those of completed codec calls, whose GPU time it adds to stats.codec_ns. */
ncclResult_t agoq_gpu_poll(agoq_gpu_link* l, uint32_t slot, bool* done);

/* The CUDA codec (kernels/cuda, the same bits as the CPU codec) on the link's stream. The
 * kernels read and write device memory and pinned memory alike: a frame written into
 * pinned memory, or a body read from it, is what crosses PCIe (counted when the memory is
 * the link's). The device's verdict lands in result `part` of `slot`, readable once slot's
 * mark is done. Each call is bracketed by timing events (its GPU time: agoq_gpu_poll). */
ncclResult_t agoq_gpu_frame_encode(agoq_gpu_link* l, uint32_t slot, int part, const agoq_codec_params* p,
                                   const void* src, size_t n, void* frame, size_t cap);
/* Decodes a body of n elements made with p into dst of type out. */
ncclResult_t agoq_gpu_dequantize(agoq_gpu_link* l, uint32_t slot, int part, const agoq_codec_params* p,
                                 const void* body, size_t body_len, size_t n, agoq_dtype out, void* dst);
/* Batches: k items of one codec step in one launch of each kernel (kernels/cuda's
 * agoq_cuda_*_batch and agoq_cuda_dequantize_sum), item i's verdict in result part0 + i of
 * slot, the same bits as the single calls above. The slot's batch table and workspace are
 * taken until the slot's next mark is seen done (agoq_gpu_mark, then agoq_gpu_poll): a batch
 * before then, or on a slot without them, or with more items than it holds, is refused
 * (ncclInternalError) with nothing queued. Counted as k encodes or decodes. */
typedef struct {
  const void* src; /* n elements of the batch's type */
  size_t n;
  void* frame;     /* their frame: at most cap bytes */
  size_t cap;
} agoq_gpu_encode_item;

typedef struct {
  const void* body; /* a body of body_len bytes of n elements */
  size_t body_len;
  size_t n;
  void* dst;        /* agoq_gpu_dequantize_batch: n elements of out; agoq_gpu_dequantize_sum: unused */
} agoq_gpu_decode_item;

ncclResult_t agoq_gpu_frame_encode_batch(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                         const agoq_gpu_encode_item* items, size_t k);
ncclResult_t agoq_gpu_dequantize_batch(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                       const agoq_gpu_decode_item* items, size_t k, agoq_dtype out);
/* The fp32 sum of the k bodies (n elements each) in item order into acc: item 0 decoded into
 * fp32, the others added, the bits of agoq_cuda_dequantize_accumulate's additions. */
ncclResult_t agoq_gpu_dequantize_sum(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                     const agoq_gpu_decode_item* items, size_t k, size_t n, float* acc);
/* ngroups independent sums in one batch (a grid's row reduce: one per piece): sum i adds
 * items [i * k, i * k + k) (groups[i].n elements each) into groups[i].acc, as
 * agoq_gpu_dequantize_sum; k * ngroups items, results from part0 in item order. The
 * accumulators must not overlap. */
typedef struct {
  size_t n;
  float* acc;
} agoq_gpu_sum_group;

ncclResult_t agoq_gpu_dequantize_sums(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                      const agoq_gpu_decode_item* items, size_t k, const agoq_gpu_sum_group* groups,
                                      size_t ngroups);

/* A reduction owner's steps on fp32 sums in device memory (agoq_codec_overflow_to_inf and
 * agoq_codec_narrow_fp32, the same bits); no result is reported, arguments are checked now. */
ncclResult_t agoq_gpu_overflow_to_inf(agoq_gpu_link* l, agoq_dtype out, float* acc, size_t n);
ncclResult_t agoq_gpu_narrow(agoq_gpu_link* l, agoq_dtype out, const float* acc, size_t n, void* dst);
/* GPU time of codec calls (ns) seen complete since the last take: for the owner's statistics. */
uint64_t agoq_gpu_codec_ns_take(agoq_gpu_link* l);
/* After slot's mark is done: the codec's status (agoq_codec_status) of result `part` and,
 * for an encode, the frame body's length. */
void agoq_gpu_codec_result(const agoq_gpu_link* l, uint32_t slot, int part, uint32_t* status, uint64_t* body_len);
/* Counts a frame the GPU wrote into pinned memory (its length is known only afterwards). */
void agoq_gpu_note_encoded(agoq_gpu_link* l, uint64_t frame_bytes);

/* Why cudaGetDeviceCount failed, in words that are right: the runtime reports a missing
 * driver as "CUDA driver version is insufficient for CUDA runtime version"
 * (cudaErrorInsufficientDriver, 35), so for that error the driver library (driver_lib,
 * "libcuda.so.1" in the plugin) is looked for: absent, "no CUDA driver (...)"; present, the
 * CUDA version it supports against the runtime's. Any other error: the runtime's text. Defined by
 * the CUDA-runtime builds of plugin/gpu only (agoq_gpu_runtime.c). */
void agoq_gpu_start_failure(int cuda_error, const char* runtime_text, const char* driver_lib, char* out,
                            size_t len);

#endif
