/*
 * The version-neutral CollNet core. Every exported ncclCollNetPlugin_vN table is a thin
 * adapter over these functions (plugin/tables/agoq_collnet_tables.c).
 *
 * A collective group is a full mesh of net-core connections between the nranks node heads,
 * one connection each way per peer. It carries phase 0 (the scatter-reduce messages) and
 * phase 1 (the all-gather messages) alike, each message matched to its receive by tag (the
 * chunk and the phase: AGOQ_NET_TAGGED), since a peer ahead may send one chunk's phase 0
 * before an earlier chunk's phase 1. One engine thread per
 * group does all the work (posts, polls, codec, fp32 accumulation); the collective calls
 * only enqueue, test() only reads the request's state, so NCCL's proxy thread never runs
 * codec work.
 *
 * Results are identical on every rank by construction: slice j of each pipeline chunk is
 * reduced by rank j alone, in rank order 0..n-1, and everyone (rank j included) takes the
 * same bytes of the result.
 *  - quantized path (fp32/bf16/fp16 Sum, at least AGOQ_MIN_BYTES, AGOQ_FORMAT != none):
 *    every contribution is quantized once (its owner's too), the owner decodes them into
 *    fp32 (acc = y_0, then acc += y_k), quantizes the sum once as fp32, and every rank
 *    decodes that frame into the output type. ReduceScatter stops at the fp32 sum, which the
 *    owner rounds (RNE) to the output type.
 *  - exact path (everything else): raw bytes, the owner reduces in rank order: integers wrap
 *    around, fp32 in float, fp64 in double, bf16/fp16/fp8 in fp32 rounded once at the end
 *    (RNE; fp8 saturates to its largest finite value, as NCCL's own fp8 reductions do).
 *    Max/Min return one of the inputs' bits: NaN loses against a number, -0 < +0.
 */
#ifndef AGOQ_COLLNET_H
#define AGOQ_COLLNET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"
#include "net/agoq_net.h"

#define AGOQ_COLL_MAX_RANKS 4096 /* nodes in one group (beyond 16 on a grid: 252 connections per rank at 4096) */
#define AGOQ_COLL_MAX_PARTS 16   /* SGE parts per iallgather/ireducescatter (NCCL passes 1) */

/* One scatter/gather element, as NCCL's ncclNetSGE_vN_t (its memory handle last, so that
 * {address, size} initializers leave it NULL: host memory). */
typedef struct {
  void* address;
  size_t size;
  void* mhandle; /* regMr's handle, or NULL */
} agoq_coll_sge;

/* ---- lifecycle ---------------------------------------------------------------------- */

/* v11+: once per communicator (comm_id = NCCL's commHash). Loads the AGOQ_* parameters and
 * the net core's configuration (a CollNet needs the net core's devices), and warns once per
 * process when NCCL_COLLNET_ENABLE does not enable CollNet. */
ncclResult_t agoq_coll_init(void** ctx, uint64_t comm_id, ncclDebugLogger_t log_fn);
/* The checks of CollNet's settings that init makes (after the net's agoq_net_config_load),
 * for `agoq-info -c` to run the same code: AGOQ_MIN_BYTES above NCCL's largest staged call
 * is a WARN (once per process). Fails only where the parameters do not load. */
ncclResult_t agoq_coll_config_check(void);
/* v6..v10: one process-wide context, created by the first call. */
ncclResult_t agoq_coll_legacy_init(ncclDebugLogger_t log_fn);
void* agoq_coll_legacy_ctx(void);
/* Tolerates NULL. Stops the engine threads of this context's groups that are still open
 * (their pending requests fail); a later close_coll only frees them. */
ncclResult_t agoq_coll_finalize(void* ctx);
/* The net core's devices, so CollNet and net device indices line up. */
ncclResult_t agoq_coll_devices(int* ndev);
ncclResult_t agoq_coll_get_properties(int dev, agoq_net_props* props);

/* ---- group creation ------------------------------------------------------------------ */

/* Fills NCCL's 128-byte handle: the net listen handle plus the settings every rank must
 * share (format, block, thresholds, chunk). Never blocks. */
ncclResult_t agoq_coll_listen(void* ctx, int dev, void* handle, void** listen_comm);
/* Builds the full mesh among the nranks heads; blocks until done or AGOQ_COLLNET_TIMEOUT_S.
 * On any failure everything is closed and an error returned; a final barrier makes every
 * rank learn that every peer completed its mesh before anyone returns success. */
ncclResult_t agoq_coll_connect(void* handles[], int nranks, int rank, void* listen_comm,
                               void** coll_comm);
ncclResult_t agoq_coll_close_listen(void* listen_comm);
/* Safe with requests in flight: stops the engine, then closes the connections. */
ncclResult_t agoq_coll_close_coll(void* coll_comm);

/* ---- capabilities and memory ---------------------------------------------------------- */

/* A pure function: all 12 NCCL types x Sum/Prod/Max/Min. */
ncclResult_t agoq_coll_reduce_support(int data_type, int red_op, int* supported);
/* NCCL_PTR_HOST, and NCCL_PTR_CUDA where the GPU layer is active: the range must be device
 * memory of one GPU (else ncclInvalidUsage with the reason), the same GPU for the whole
 * group; the first one creates the group's GPU link (AGOQ_GPU_STAGING bytes of pinned
 * staging). DMA-BUF is refused (NCCL then registers without it or uses its own buffers). */
ncclResult_t agoq_coll_reg_mr(void* coll_comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t agoq_coll_reg_mr_dmabuf(void* coll_comm, void* data, size_t size, int type,
                                     uint64_t offset, int fd, void** mhandle);
ncclResult_t agoq_coll_dereg_mr(void* coll_comm, void* mhandle);

/* ---- collectives: enqueue only; *request NULL means "busy, call again" ----------------- */
/* A buffer whose memory handle is a device registration (it must lie inside it) is staged
 * through the group's pinned memory: its input is copied there at the call, its result
 * copied back before test() says done; the bits are the host path's. A call needing more
 * staging than AGOQ_GPU_STAGING is ncclInvalidUsage; a full staging is "busy". NULL or host
 * handles: host memory. */

ncclResult_t agoq_coll_iallreduce(void* coll_comm, void* send_data, void* recv_data, size_t count, int data_type,
                                  int red_op, void* send_mhandle, void* recv_mhandle, void** request);
/* The global output is the concatenation of every rank's bytes_per_rank bytes; this call
 * covers [window_offset, window_offset + window_bytes) of it, received into recv_parts
 * (concatenated, window_bytes in total). send_data holds this rank's bytes of the window:
 * the global range [max(window_offset, rank * bpr), min(window end, (rank + 1) * bpr)). */
ncclResult_t agoq_coll_iallgather(void* coll_comm, void* send_data, int n_recv_parts, const agoq_coll_sge* recv_parts,
                                  size_t bytes_per_rank, size_t window_offset, size_t window_bytes,
                                  void* send_mhandle, void** request);
/* The mirror image: send_parts hold the window of the global input (every rank's
 * bytes_per_rank in rank order); recv_data receives this rank's part of the window, reduced. */
ncclResult_t agoq_coll_ireducescatter(void* coll_comm, int n_send_parts,
                                      const agoq_coll_sge* send_parts, void* recv_data,
                                      size_t bytes_per_rank, size_t window_offset,
                                      size_t window_bytes, int data_type, int red_op, void* recv_mhandle,
                                      void** request);
/* NCCL flushes only device receives (GPUDirect): their result was copied into NCCL's
 * buffer before test() said done, so *request = NULL (done). Anything else is refused. */
ncclResult_t agoq_coll_iflush(void* coll_comm, void* data, int size, void* mhandle, void** request);
/* Non-blocking. On completion *done = 1 and *size = the bytes written into the receive
 * buffer(s) (allreduce: count x type size; allgather: window_bytes; reducescatter: this
 * rank's part of the window). A failed group (peer lost, corrupt frame) returns its error. */
ncclResult_t agoq_coll_test(void* request, int* done, int* size);

/* ---- the slicing rule (exposed so tests can build the exact reference) ----------------- */

/* Elements per pipeline chunk for a chunk size in bytes: a whole number of blocks when
 * block > 0 (quantized path), at least one element (or block). */
size_t agoq_coll_chunk_elems(size_t chunk_bytes, size_t elem_size, uint32_t block);
/* AllReduce slices of a chunk of m elements among n ranks: bounds[0..n], bounds[0] = 0,
 * bounds[n] = m, balanced; with block > 0 every inner bound is a multiple of block.
 * AllReduce chunk c is elements [c * E, (c + 1) * E) of the call, E = agoq_coll_chunk_elems(
 * AGOQ_COLLNET_CHUNK, type size, block): quantization blocks therefore always start at
 * multiples of the block from the call's first element, whatever the chunk size or rank count.
 * ReduceScatter/AllGather chunk c holds elements [c * P, (c + 1) * P) of every rank's part of
 * the window, P = agoq_coll_chunk_elems(AGOQ_COLLNET_CHUNK / nranks, type size, block): blocks
 * start at each rank's part. */
void agoq_coll_slices(size_t m, int n, uint32_t block, size_t* bounds);

#endif
