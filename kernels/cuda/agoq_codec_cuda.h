/*
 * The codec (kernels/agoq_codec.h, agoq_frame.h) on CUDA device buffers: the same operations
 * and the same bits as the CPU codec, asynchronous on a caller's stream. Plain C; the stream
 * is a cudaStream_t passed as void* (NULL = the legacy default stream), so callers need no
 * CUDA headers.
 *
 * Pointers:
 *  - src, body, dst, acc, frame, workspace: device memory (or anything the device can address).
 *    Elements must be aligned to their size; body and frame to 4 bytes.
 *  - result: device-accessible memory the kernels write when the work completes: device
 *    memory, or pinned host memory (cudaHostAlloc / cudaMallocHost), which the host can read
 *    after synchronising with the stream.
 *  - workspace: AGOQ_CUDA_CODEC_WORKSPACE_SIZE bytes of device memory, used by one call at a
 *    time (calls on one stream may share one; concurrent streams need one each).
 *
 * Errors: the return value is an agoq_codec_status for what the host can check before
 * launching (parameters, sizes, a body length that fits no number of escaped blocks), or
 * AGOQ_CUDA_CODEC_ECUDA when a CUDA call failed (agoq_cuda_codec_last_error tells which).
 * What only the device can find out lands in result->status: a quantize whose escaped
 * blocks do not fit in cap (AGOQ_CODEC_ESPACE), a decode whose escape bitmap disagrees with
 * the body length or has a bit past the last block (AGOQ_CODEC_ECORRUPT). In both cases the
 * kernels write nothing past cap and, for a corrupt body, nothing into dst / acc at all.
 */
#ifndef AGOQ_CODEC_CUDA_H
#define AGOQ_CODEC_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "agoq_codec.h"
#include "agoq_frame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returned (as an int) when a CUDA runtime call or kernel launch failed. */
#define AGOQ_CUDA_CODEC_ECUDA 100

/* Bytes of device workspace every call below needs. */
#define AGOQ_CUDA_CODEC_WORKSPACE_SIZE 16384u

typedef struct {
  uint64_t body_len;       /* quantize / frame encode: exact body (payload) length */
  uint64_t escaped_blocks; /* quantize / frame encode: blocks stored raw; decode: as found */
  uint32_t status;         /* agoq_codec_status: OK, ESPACE (quantize), ECORRUPT (decode) */
  uint32_t reserved;
} agoq_cuda_codec_result;

/* Quantize n elements of p->dtype at src into body (capacity cap bytes). cap must hold the
 * body without escaped blocks (agoq_codec_body_size(p, n, 0)), else AGOQ_CODEC_ESPACE now;
 * agoq_codec_body_size_max(p, n) always suffices. result is required. */
int agoq_cuda_quantize(const agoq_codec_params* p, const void* src, size_t n, void* body,
                       size_t cap, void* workspace, agoq_cuda_codec_result* result, void* stream);

/* Decode a body of n elements (made with p's format, dtype, block) into dst of type out, or
 * add it to acc (fp32, before output rounding). result may be NULL (status then unreported;
 * a corrupt body still leaves dst / acc untouched). */
int agoq_cuda_dequantize(const agoq_codec_params* p, const void* body, size_t body_len, size_t n,
                         agoq_dtype out, void* dst, void* workspace,
                         agoq_cuda_codec_result* result, void* stream);
int agoq_cuda_dequantize_accumulate(const agoq_codec_params* p, const void* body, size_t body_len,
                                    size_t n, float* acc, void* workspace,
                                    agoq_cuda_codec_result* result, void* stream);

/* A complete frame (agoq_frame.h) without payload CRC: header and body, written by the
 * device. The frame length is AGOQ_FRAME_HEADER_SIZE + result->body_len. cap: as for
 * agoq_cuda_quantize plus the header (agoq_frame_size_max always suffices). */
int agoq_cuda_frame_encode(const agoq_codec_params* p, const void* src, size_t n, void* frame,
                           size_t cap, void* workspace, agoq_cuda_codec_result* result,
                           void* stream);

/* Decode a frame at `frame` (device, len bytes) whose first AGOQ_FRAME_HEADER_SIZE bytes the
 * host also holds at `header` (e.g. read with cudaMemcpy, or received there): the header is
 * validated on the host as agoq_frame_parse does (magic, version, fields, header CRC,
 * lengths), the escape bitmap on the device. A frame with a payload CRC is refused with
 * AGOQ_CODEC_EARG: the payload CRC is not computed on the device. dst_count / acc_count must
 * equal the frame's count. */
int agoq_cuda_frame_decode(const void* header, const void* frame, size_t len, agoq_dtype out,
                           void* dst, size_t dst_count, void* workspace,
                           agoq_cuda_codec_result* result, void* stream);
int agoq_cuda_frame_decode_accumulate(const void* header, const void* frame, size_t len, float* acc,
                                      size_t acc_count, void* workspace,
                                      agoq_cuda_codec_result* result, void* stream);

/* The two element-wise steps of a reduction's owner (agoq_codec.h, the same bits):
 * agoq_codec_overflow_to_inf on n fp32 sums in place (nothing to do for out = fp32), and
 * agoq_codec_narrow_fp32 of n fp32 sums into dst of type out. acc is 4-byte aligned, dst
 * aligned to its element size; acc and dst must not overlap. */
int agoq_cuda_overflow_to_inf(agoq_dtype out, float* acc, size_t n, void* stream);
int agoq_cuda_narrow_fp32(agoq_dtype out, const float* acc, size_t n, void* dst, void* stream);

/* ---- batches ------------------------------------------------------------------------------
 * Many items of one codec step in one launch of each of its kernels, whatever the number of
 * items (a CollNet step codes one slice per peer: per-item calls would launch 4 kernels per
 * peer). Each item gets exactly the bits and the result of the single call it stands for.
 * Every item has the batch's parameters p (format NONE has no batch: AGOQ_CODEC_EARG) and
 * its own result (results[i], device-accessible as for the single calls).
 *
 * The kernels read their arguments from a table: the host writes it into table_host (pinned
 * memory) at the call, and the call queues its copy into table_dev (device memory) ahead of
 * the kernels. table_host may be reused once that copy has run (the stream has passed the
 * call); table_dev and the workspace once the call's work has completed. Each item's escape
 * scan takes its share of the workspace (device memory, 16-byte aligned), sized for its own
 * length. Sizes: agoq_cuda_batch_table_size and agoq_cuda_batch_workspace_size; a table or
 * workspace too small is AGOQ_CODEC_EARG, with nothing queued. So is a batch of no items or
 * of more than AGOQ_CUDA_BATCH_MAX_ITEMS. Any refusal the host can find queues nothing. */
#define AGOQ_CUDA_BATCH_MAX_ITEMS 65535u

typedef struct {
  void* table_host;     /* pinned host memory: table_cap bytes */
  void* table_dev;      /* device memory: table_cap bytes */
  size_t table_cap;
  void* workspace;      /* device memory, 16-byte aligned */
  size_t workspace_cap;
} agoq_cuda_batch_mem;

/* Encode: n elements at src into a frame at frame (cap bytes), as agoq_cuda_frame_encode. */
typedef struct {
  const void* src;
  size_t n;
  void* frame;
  size_t cap;
} agoq_cuda_encode_item;

/* Decode: a body of body_len bytes of n elements (as agoq_cuda_dequantize), into dst. */
typedef struct {
  const void* body;
  size_t body_len;
  size_t n;
  void* dst; /* agoq_cuda_dequantize_batch: n elements of its out type; agoq_cuda_dequantize_sum: unused */
} agoq_cuda_decode_item;

/* Bytes of table for `items` items, and of workspace for `items` items of at most max_n
 * elements each with p's block. */
size_t agoq_cuda_batch_table_size(size_t items);
size_t agoq_cuda_batch_workspace_size(const agoq_codec_params* p, size_t items, size_t max_n);

/* k frames, each as agoq_cuda_frame_encode of its item (results[i] its result). */
int agoq_cuda_frame_encode_batch(const agoq_codec_params* p, const agoq_cuda_encode_item* items, size_t k,
                                 const agoq_cuda_batch_mem* mem, agoq_cuda_codec_result* results, void* stream);
/* k bodies, each decoded into its item's dst as agoq_cuda_dequantize into out. */
int agoq_cuda_dequantize_batch(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k,
                               agoq_dtype out, const agoq_cuda_batch_mem* mem, agoq_cuda_codec_result* results,
                               void* stream);
/* The fp32 sum of k bodies of n elements each, in item order, into acc (device memory, n
 * floats): the bits of agoq_cuda_dequantize of item 0 into fp32 followed by
 * agoq_cuda_dequantize_accumulate of items 1..k-1, read and written once. Every item's n must
 * be n. A body the device finds corrupt (its result says ECORRUPT) leaves acc untouched. */
int agoq_cuda_dequantize_sum(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k, size_t n,
                             float* acc, const agoq_cuda_batch_mem* mem, agoq_cuda_codec_result* results,
                             void* stream);

/* Several independent sums at once (a grid's row reduce sums each of a rank's pieces over its
 * row): sum g adds items [g * k, g * k + k) (each of groups[g].n elements) into groups[g].acc,
 * as agoq_cuda_dequantize_sum; results[g * k + i] are its items'. k * ngroups items in all;
 * the accumulators must not overlap. A corrupt body leaves its own sum's acc untouched. */
typedef struct {
  size_t n;
  float* acc;
} agoq_cuda_sum_group;

int agoq_cuda_dequantize_sums(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k,
                              const agoq_cuda_sum_group* groups, size_t ngroups, const agoq_cuda_batch_mem* mem,
                              agoq_cuda_codec_result* results, void* stream);

/* Makes the driver load, on the calling thread's current device, every kernel the calls above
 * can ever launch (every format, type, output, block size and rounding, the escaped-block and
 * NONE decodes included), launching none of them: with CUDA's lazy module loading a kernel's
 * first launch loads it, and that load can wait for the kernels running on the device, NCCL's
 * among them, which may be waiting for this codec (a deadlock). Call it at setup, once per
 * device and process, before any call above can run while NCCL's kernels do. Returns
 * AGOQ_CODEC_OK, or AGOQ_CUDA_CODEC_ECUDA with *failed naming the kernel that could not be
 * loaded (e.g. no image for this GPU). *loaded: how many distinct kernels were loaded. Both
 * may be NULL. */
int agoq_cuda_codec_load_all(size_t* loaded, const char** failed);

/* The cudaError_t of the last AGOQ_CUDA_CODEC_ECUDA in this thread and its name. */
int agoq_cuda_codec_last_error(void);
const char* agoq_cuda_codec_last_error_string(void);

#ifdef __cplusplus
}
#endif
#endif
