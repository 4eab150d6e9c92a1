/*
 * A CPU emulation of the part of the CUDA execution model that agoq_codec_cuda.cu uses, so
 * that its kernels run, unchanged, in tests on machines without a GPU (and under ASan).
 *
 * A launch is queued on its stream with its arguments moved onto the device's view of memory
 * (emu/include/cuda_runtime_api.h says how strict that is); when the device runs it, its CTAs
 * run one after another; the threads of a CTA are fibers on the running thread, switched only
 * at __syncthreads, __syncthreads_or and warp shuffles, which are real
 * barriers (a shuffle: every lane of the warp deposits its value, all wait, each reads its
 * source lane, all wait). __shared__ variables are function statics: one CTA at a time uses
 * them. Device code sees the host arithmetic of agoq_codec_cuda_math.cuh (__CUDA_ARCH__ is
 * not defined), which test_codec_cuda_math checks against the CPU codec; what this adds is
 * the kernels' indexing, reductions, layout and control flow.
 *
 * A kernel runs only if it was loaded on the device first (cudaFuncGetAttributes, as
 * agoq_cuda_codec_load_all does): a launch of one that was not is refused with
 * cudaErrorFunctionNotLoaded and a line on stderr, where a GPU under lazy loading would load it
 * at that launch, possibly while NCCL's kernel runs (kernels/cuda/emu/include/cuda_runtime_api.h).
 *
 * Not emulated: warp divergence (every shuffle in the codec is executed by all 32 lanes, and
 * a shuffle by fewer lanes deadlocks here, which the scheduler reports), memory ordering
 * between CTAs (they run in sequence), and anything the codec does not use.
 */
#ifndef AGOQ_CUDA_EMU_H
#define AGOQ_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct uint2 {
  unsigned x, y;
};
struct uint4 {
  unsigned x, y, z, w;
};
struct float4 {
  float x, y, z, w;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace agoq_emu {

struct dim3 {
  unsigned x, y, z;
};

extern dim3 g_block_idx, g_block_dim, g_grid_dim;
unsigned thread_x();
void syncthreads();
int syncthreads_or(int pred);
/* Every lane of the calling warp passes its value; returns the one of lane `src`. */
uint64_t warp_exchange(uint64_t v, unsigned src);
/* Runs fn(ctx) as `threads` fibers of one CTA; returns when all have finished. */
void run_cta(unsigned threads, void (*fn)(void*), void* ctx);

template <typename T>
inline uint64_t to_u64(T v) {
  uint64_t u = 0;
  memcpy(&u, &v, sizeof v);
  return u;
}

template <typename T>
inline T from_u64(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof v);
  return v;
}

template <typename F>
void invoke(void* f) {
  (*static_cast<F*>(f))();
}

/* ---- launches: queued on a stream, arguments moved onto the device's view of memory ---- */

/* p (device or pinned memory, or NULL) as a kernel reaches it; false for anything else
 * (pageable host memory: a real kernel would fault on it). */
bool device_view(const void* p, void** out);
/* Queues fn on stream st (0: the legacy default stream, run at once after all queued work). */
void enqueue(cudaStream_t st, void (*run)(void*), void* ctx, void (*drop)(void*));
/* A launch whose arguments the device cannot address: the launch error, and a line saying which. */
void launch_refused(const void* p);
/* A launch with an empty grid or one past CUDA's limits: cudaErrorInvalidConfiguration (as a GPU
 * answers), and a line naming the kernel. */
void launch_bad_grid(const char* name, unsigned grid, unsigned grid_y);
/* Lazy loading, adversarially: true when kernel `fn` was loaded on the current device
 * (cudaFuncGetAttributes). Otherwise the launch error, cudaErrorFunctionNotLoaded, and a line
 * naming `name`: on a GPU this first launch would load it, and a load may wait for the kernels
 * running on the device (NCCL's, waiting for this one). Counts the launch either way. */
bool launch_loaded(const void* fn, const char* name);

/* The .cu says where the pointers of each argument struct are, with agoq_emu_rebase(S&, bool&)
 * (found by argument-dependent lookup); a struct without one does not compile. */
template <typename T>
void rebase_ptr(T*& p, bool& ok) {
  void* v = nullptr;
  if (!device_view(p, &v)) {
    if (ok) launch_refused(p);
    ok = false;
    return;
  }
  p = static_cast<T*>(v);
}

template <typename T>
void rebase_arg(T& v, bool& ok) {
  if constexpr (std::is_pointer_v<T>)
    rebase_ptr(v, ok);
  else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>)
    (void)ok;
  else
    agoq_emu_rebase(v, ok);
}

template <typename K, typename Tuple>
struct LaunchJob {
  K kernel;
  unsigned grid, grid_y, block;
  Tuple args;
};

/* The CTAs in the order y, then x (any order is one a GPU may pick). */
template <typename J>
void run_job(void* p) {
  J* j = static_cast<J*>(p);
  g_grid_dim = {j->grid, j->grid_y, 1};
  g_block_dim = {j->block, 1, 1};
  auto body = [j]() { std::apply(j->kernel, j->args); };
  for (unsigned y = 0; y < j->grid_y; y++)
    for (unsigned b = 0; b < j->grid; b++) {
      g_block_idx = {b, y, 0};
      run_cta(j->block, &invoke<decltype(body)>, &body);
    }
}

template <typename J>
void drop_job(void* p) {
  delete static_cast<J*>(p);
}

/* kernel<<<(grid, grid_y), block>>>; a CUDA grid's y dimension is at most 65535 (a launch past
 * it fails on a GPU: refused here too). */
template <typename... P, typename... A>
void launch_2d(cudaStream_t st, void (*kernel)(P...), const char* name, unsigned grid, unsigned grid_y,
               unsigned block, A... args) {
  if (!launch_loaded(reinterpret_cast<const void*>(kernel), name)) return;
  if (grid_y == 0 || grid_y > 65535u || grid == 0) {
    launch_bad_grid(name, grid, grid_y);
    return;
  }
  using Tuple = std::tuple<std::decay_t<P>...>;
  using Job = LaunchJob<void (*)(P...), Tuple>;
  Job* j = new Job{kernel, grid, grid_y, block, Tuple(static_cast<std::decay_t<P>>(args)...)};
  bool ok = true;
  std::apply([&ok](auto&... a) { (rebase_arg(a, ok), ...); }, j->args);
  if (!ok) {
    delete j;
    return;
  }
  enqueue(st, &run_job<Job>, j, &drop_job<Job>);
}

template <typename... P, typename... A>
void launch(cudaStream_t st, void (*kernel)(P...), const char* name, unsigned grid, unsigned block, A... args) {
  launch_2d(st, kernel, name, grid, 1, block, args...);
}

}  // namespace agoq_emu

#define threadIdx (agoq_emu::dim3{agoq_emu::thread_x(), 0, 0})
#define blockIdx (agoq_emu::g_block_idx)
#define blockDim (agoq_emu::g_block_dim)
#define gridDim (agoq_emu::g_grid_dim)

inline void __syncthreads() { agoq_emu::syncthreads(); }
inline int __syncthreads_or(int pred) { return agoq_emu::syncthreads_or(pred); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  unsigned lane = agoq_emu::thread_x() & 31u;
  return agoq_emu::from_u64<T>(agoq_emu::warp_exchange(agoq_emu::to_u64(v), lane ^ (unsigned)lane_mask));
}

template <typename T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
  unsigned lane = agoq_emu::thread_x() & 31u;
  return agoq_emu::from_u64<T>(agoq_emu::warp_exchange(agoq_emu::to_u64(v), lane >= delta ? lane - delta : lane));
}

inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }

template <typename T>
inline T __ldcs(const T* p) {
  return *p;
}

template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
  return a < b ? b : a;
}

#endif
