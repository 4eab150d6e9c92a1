/*
 * The codec on CUDA device buffers (agoq_codec_cuda.h): the bits of kernels/agoq_codec.c and
 * kernels/cpu/agoq_codec_portable.c, with the element arithmetic in agoq_codec_cuda_math.cuh.
 *
 * A quantize is four launches on the caller's stream:
 *   1. quantize_kernel  one pass over the input: per block the amax and escape flag (a group
 *                       of G lanes per block, one warp-shuffle reduction), the scale, the
 *                       codes and the escape bitmap. None of it depends on other blocks.
 *   2. count_kernel     escaped blocks per range of bitmap words (at most kRangesMax ranges)
 *   3. scan_kernel      one CTA: exclusive prefix over the ranges, the body length, the
 *                       status (ESPACE when the raw region does not fit), the result and,
 *                       for a frame, the header
 *   4. raw_copy_kernel  each range with escaped blocks copies them into the raw region at
 *                       their prefix rank; ranges without escapes return at once
 * A decode runs 2 and 3 first (they validate the bitmap against the body length, as the CPU
 * does before it writes anything), then decode_kernel for the coded blocks and
 * raw_decode_kernel for the escaped ones; both do nothing when 3 found the body corrupt.
 *
 * The input is read once and each output byte written once: the kernels are memory-bound
 * on large buffers, with 16-byte loads and 8-byte code stores where the alignment allows.
 */
#include "agoq_codec_cuda.h"

#if defined(AGOQ_CUDA_EMULATION)
/* The CPU emulation of the CUDA execution model that runs these kernels in tests without a
 * GPU (emu/agoq_cuda_emu.h). */
#include "emu/agoq_cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif

#include <stdint.h>
#include <string.h>

#include <algorithm>

#include "agoq_codec_cuda_math.cuh"

namespace agoq_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr uint32_t kRangesMax = 1024; /* == kScanThreads: the scan is one pass */
constexpr uint32_t kRangeInvalid = 0x80000000u;
/* Elements per call: keeps every grid below 2^31 CTAs and every size far from overflow. */
constexpr uint64_t kMaxCount = AGOQ_FRAME_MAX_COUNT;

enum : int { kFp32 = AGOQ_DTYPE_FP32, kBf16 = AGOQ_DTYPE_BF16, kFp16 = AGOQ_DTYPE_FP16 };
enum : int {
  kInt8 = AGOQ_FORMAT_INT8,
  kInt4 = AGOQ_FORMAT_INT4,
  kE4M3 = AGOQ_FORMAT_FP8E4M3,
  kE5M2 = AGOQ_FORMAT_FP8E5M2,
};
/* Decode destinations: an output dtype, or fp32 accumulation. */
enum : int { kOutFp32 = AGOQ_DTYPE_FP32, kOutBf16 = AGOQ_DTYPE_BF16, kOutFp16 = AGOQ_DTYPE_FP16, kOutAcc = 3 };

struct Workspace {
  unsigned long long prefix[kRangesMax + 1]; /* escaped blocks before range r; [ranges] = all */
  uint32_t count[kRangesMax];                /* escaped blocks in range r | kRangeInvalid */
  uint32_t status;                           /* agoq_codec_status of the current call */
  uint32_t reserved;
};
static_assert(sizeof(Workspace) <= AGOQ_CUDA_CODEC_WORKSPACE_SIZE, "workspace size");

/* Where a call's escape scan keeps its counts: a single call's Workspace, or an item's share
 * of a batch's workspace (sized for its ranges only, so that a batch of many small slices
 * needs little). */
struct Ws {
  unsigned long long* prefix; /* [ranges + 1] */
  uint32_t* count;            /* [ranges] */
  uint32_t* status;
};

/* The body layout of (params, n) (agoq_codec_layout in kernels/agoq_codec_internal.h). */
struct Layout {
  uint8_t* body;
  uint64_t n;
  uint64_t nb;
  uint64_t nwords; /* bitmap words of 64 blocks */
  uint64_t bitmap_bytes;
  uint64_t scales_off;
  uint64_t codes_off;
  uint64_t raw_off;
  uint64_t raw_block; /* bytes per escaped block in the raw region */
  uint64_t head;      /* body length without escaped blocks */
  uint32_t block;
  uint32_t log2b;
  uint32_t esize;
  uint32_t dtype;
  uint32_t words_per_range;
  uint32_t ranges;
};

template <int FMT>
__host__ __device__ constexpr float format_max() {
  return FMT == kInt8 ? kInt8Max : FMT == kInt4 ? kInt4Max : FMT == kE4M3 ? kE4M3Max : kE5M2Max;
}

/* ---- small device helpers ---------------------------------------------------------------- */

/* Bitmap word w: body offsets are only 4-byte aligned. */
__device__ __forceinline__ uint64_t bitmap_word(const uint8_t* body, uint64_t w) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(body + 8 * w);
  return (uint64_t)p[0] | ((uint64_t)p[1] << 32);
}

/* The word with the bits past the last block cleared. */
__device__ __forceinline__ uint64_t word_valid_mask(const Layout& L, uint64_t w) {
  uint32_t rem = (uint32_t)(L.nb & 63u);
  return (w == L.nwords - 1 && rem != 0) ? ((1ull << rem) - 1) : ~0ull;
}

__device__ __forceinline__ uint32_t bit_of(const uint8_t* body, uint64_t b) {
  return (body[b >> 3] >> (b & 7)) & 1u;
}

/* Exclusive sum over the CTA (blockDim.x == NT); *total receives the sum of all. Every
 * thread must call it (it synchronises the CTA). */
template <int NT, typename T>
__device__ __forceinline__ T cta_exclusive_sum(T v, T* total) {
  __shared__ T warp_sums[NT / 32];
  __shared__ T sum_all;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    T o = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += o;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    T s = lane < NT / 32 ? warp_sums[lane] : T(0);
    T si = s;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      T o = __shfl_up_sync(0xffffffffu, si, off);
      if (lane >= off) si += o;
    }
    if (lane < NT / 32) warp_sums[lane] = si - s;
    if (lane == NT / 32 - 1) sum_all = si;
  }
  __syncthreads();
  T r = warp_sums[warp] + incl - v;
  *total = sum_all;
  __syncthreads(); /* the shared sums are reused by the next call */
  return r;
}

/* ---- element types -------------------------------------------------------------------------- */

template <int DT>
struct Dt {
  static constexpr int kWords = DT == kFp32 ? 8 : 4; /* u32 words per chunk of 8 elements */
  static constexpr uint32_t kInfMag = DT == kFp32 ? 0x7f800000u : DT == kBf16 ? 0x7f80u : 0x7c00u;
  static constexpr uint32_t kSize = DT == kFp32 ? 4 : 2;
};

template <int DT>
__device__ __forceinline__ uint32_t elem(const uint32_t (&w)[Dt<DT>::kWords], int i) {
  if (DT == kFp32) return w[i];
  return (w[i >> 1] >> (16 * (i & 1))) & 0xffffu;
}

template <int DT>
__device__ __forceinline__ uint32_t mag_of(uint32_t e) {
  return DT == kFp32 ? (e & 0x7fffffffu) : (e & 0x7fffu);
}

/* Exact fp32 value of a finite element, and of a magnitude pattern (the amax). */
template <int DT>
__device__ __forceinline__ float widen_finite(uint32_t e) {
  if (DT == kFp32) return u2f(e);
  if (DT == kBf16) return u2f(e << 16);
  return u2f(f2u(fp16_mag_to_fp32(e & 0x7fffu)) | ((e & 0x8000u) << 16));
}

template <int DT>
__device__ __forceinline__ float widen_mag(uint32_t m) {
  if (DT == kFp32) return u2f(m);
  if (DT == kBf16) return u2f(m << 16);
  return fp16_mag_to_fp32(m);
}

/* Any element, NaN and Inf included, as agoq_codec.c's raw_load. */
__device__ __forceinline__ float widen_any(uint32_t dtype, uint32_t e) {
  if (dtype == kFp32) return u2f(e);
  if (dtype == kBf16) return bf16_to_fp32(e);
  return fp16_to_fp32(e);
}

/* Chunk of 8 elements starting at e0 into packed words; zeros past n. */
template <int DT>
__device__ __forceinline__ void load_chunk(const uint8_t* __restrict__ src, uint64_t e0, uint64_t n,
                                           bool vec, uint32_t (&w)[Dt<DT>::kWords]) {
  if (vec && e0 + 8 <= n) {
    const uint4* p = reinterpret_cast<const uint4*>(src + e0 * Dt<DT>::kSize);
    uint4 a = __ldcs(p);
    w[0] = a.x;
    w[1] = a.y;
    w[2] = a.z;
    w[3] = a.w;
    if (DT == kFp32) {
      uint4 c = __ldcs(p + 1);
      w[4 % Dt<DT>::kWords] = c.x;
      w[5 % Dt<DT>::kWords] = c.y;
      w[6 % Dt<DT>::kWords] = c.z;
      w[7 % Dt<DT>::kWords] = c.w;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < Dt<DT>::kWords; k++) w[k] = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    uint64_t e = e0 + i;
    if (e >= n) break;
    if (DT == kFp32) {
      w[i % Dt<DT>::kWords] = reinterpret_cast<const uint32_t*>(src)[e];
    } else {
      uint32_t h = reinterpret_cast<const uint16_t*>(src)[e];
      w[i >> 1] |= h << (16 * (i & 1));
    }
  }
}

/* ---- codes ---------------------------------------------------------------------------------- */

template <int FMT>
__device__ __forceinline__ uint32_t fp8_encode(float v) {
  return FMT == kE4M3 ? fp32_to_e4m3(v) : fp32_to_e5m2(v);
}

/* Two fp8 codes, lo in bits 0..7 and hi in 8..15, for finite v. Hardware conversion from
 * sm_89 (RNE, saturating to max finite: the definition), software before. */
template <int FMT>
__device__ __forceinline__ uint32_t fp8_encode2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(AGOQ_CUDA_SOFT_FP8)
  unsigned short r;
  if (FMT == kE4M3)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return fp8_encode<FMT>(lo) | (fp8_encode<FMT>(hi) << 8);
#endif
}

/* Codes of one chunk: int8/fp8 bytes in c[0..1], int4 nibbles in c[0]. */
template <int FMT, int DT, bool STOCH>
__device__ __forceinline__ void encode_chunk(const uint32_t (&w)[Dt<DT>::kWords], float s,
                                             uint64_t seed, uint64_t idx0, uint32_t (&c)[2]) {
  c[0] = 0;
  c[1] = 0;
  if (s == 0.0f) return; /* amax 0, underflow, or escaped: codes 0 */
  constexpr float m = format_max<FMT>();
  if (FMT == kInt8 || FMT == kInt4) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
      float x = widen_finite<DT>(elem<DT>(w, i));
      int32_t q = STOCH ? encode_int_stochastic(x, s, m, seed, idx0 + i) : encode_int(x, s, m);
      if (FMT == kInt8)
        c[i >> 2] |= ((uint32_t)q & 0xffu) << (8 * (i & 3));
      else
        c[0] |= ((uint32_t)q & 0xfu) << (4 * i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      float lo = div_rn(widen_finite<DT>(elem<DT>(w, i)), s);
      float hi = div_rn(widen_finite<DT>(elem<DT>(w, i + 1)), s);
      c[i >> 2] |= fp8_encode2<FMT>(lo, hi) << (8 * (i & 3));
    }
  }
}

template <int FMT>
__device__ __forceinline__ void store_codes(const Layout& L, uint64_t e0, bool codes8,
                                            const uint32_t (&c)[2]) {
  if (e0 >= L.n) return;
  uint64_t left = L.n - e0;
  if (FMT == kInt4) {
    uint8_t* p = L.body + L.codes_off + e0 / 2;
    if (left >= 8) {
      *reinterpret_cast<uint32_t*>(p) = c[0];
    } else {
#pragma unroll
      for (int k = 0; k < 4; k++)
        if ((uint64_t)k < (left + 1) / 2) p[k] = (uint8_t)(c[0] >> (8 * k));
    }
    return;
  }
  uint8_t* p = L.body + L.codes_off + e0;
  if (left >= 8) {
    if (codes8) {
      *reinterpret_cast<uint2*>(p) = make_uint2(c[0], c[1]);
    } else {
      reinterpret_cast<uint32_t*>(p)[0] = c[0];
      reinterpret_cast<uint32_t*>(p)[1] = c[1];
    }
  } else {
    /* Unrolled with constant indices: a runtime index would move c[] to local memory. */
#pragma unroll
    for (int k = 0; k < 8; k++)
      if ((uint64_t)k < left) p[k] = (uint8_t)(c[k >> 2] >> (8 * (k & 3)));
  }
}

/* ---- 1. quantize ---------------------------------------------------------------------------- */

struct QuantArgs {
  Layout L;
  const uint8_t* src;
  uint64_t seed;
  uint64_t first_index;
  bool src_vec; /* src 16-byte aligned */
  bool codes8;  /* codes region 8-byte aligned */
};

/* G lanes per block, C chunks of 8 elements per lane and block (B = 8 * G * C), U blocks per
 * group: a lane holds U * C chunks, loaded before any arithmetic so that they are in flight
 * together. Chunk k of a block is elements [8 * (k * G + li), +8): each load instruction of a
 * warp covers contiguous memory. */
template <int FMT, int DT, int G, int C, int U, bool STOCH>
__device__ __forceinline__ void quantize_cta(const QuantArgs& a, uint32_t cta, uint32_t ctas) {
  constexpr int kGroupsPerWarp = 32 / G;
  constexpr int kBlocksPerWarp = kGroupsPerWarp * U;
  constexpr int kBlocksPerCta = (kThreads / 32) * kBlocksPerWarp;
  constexpr uint32_t kB = 8u * G * C;
  constexpr int NW = Dt<DT>::kWords;
  __shared__ uint8_t esc_flags[kBlocksPerCta];

  const Layout& L = a.L;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gi = lane / G, li = lane % G;
  const uint64_t cta_b0 = (uint64_t)cta * kBlocksPerCta;

  uint32_t w[U][C][NW];
#pragma unroll
  for (int u = 0; u < U; u++) {
    uint64_t b = cta_b0 + warp * kBlocksPerWarp + u * kGroupsPerWarp + gi;
#pragma unroll
    for (int k = 0; k < C; k++) {
      uint64_t e0 = b * kB + 8u * (uint32_t)(k * G + li);
      load_chunk<DT>(a.src, b < L.nb ? e0 : L.n, L.n, a.src_vec, w[u][k]);
    }
  }

#pragma unroll
  for (int u = 0; u < U; u++) {
    const int local = warp * kBlocksPerWarp + u * kGroupsPerWarp + gi;
    const uint64_t b = cta_b0 + local;
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < C; k++) {
#pragma unroll
      for (int i = 0; i < 8; i++) m = max(m, mag_of<DT>(elem<DT>(w[u][k], i)));
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    const bool esc = m >= Dt<DT>::kInfMag;
    const float s = esc ? 0.0f : div_rn(widen_mag<DT>(m), format_max<FMT>());
    if (b < L.nb) {
#pragma unroll
      for (int k = 0; k < C; k++) {
        uint64_t e0 = b * kB + 8u * (uint32_t)(k * G + li);
        uint32_t c[2];
        encode_chunk<FMT, DT, STOCH>(w[u][k], s, a.seed, a.first_index + e0, c);
        store_codes<FMT>(L, e0, a.codes8, c);
      }
      if (li == 0) reinterpret_cast<float*>(L.body + L.scales_off)[b] = s;
    }
    if (li == 0) esc_flags[local] = (uint8_t)(esc && b < L.nb);
  }

  __syncthreads();
  /* kBlocksPerCta is a multiple of 8: this CTA owns whole bitmap bytes. */
  const uint64_t byte0 = cta_b0 / 8;
  for (int t = threadIdx.x; t < kBlocksPerCta / 8; t += kThreads) {
    if (byte0 + t >= L.bitmap_bytes) break;
    uint32_t v = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) v |= (uint32_t)esc_flags[8 * t + i] << i;
    L.body[byte0 + t] = (uint8_t)v;
  }
  if (cta == ctas - 1) { /* padding of the last bitmap word */
    for (uint64_t t = byte0 + kBlocksPerCta / 8 + threadIdx.x; t < L.bitmap_bytes; t += kThreads)
      L.body[t] = 0;
  }
}

template <int FMT, int DT, int G, int C, int U, bool STOCH>
__global__ void __launch_bounds__(kThreads) quantize_kernel(QuantArgs a) {
  quantize_cta<FMT, DT, G, C, U, STOCH>(a, blockIdx.x, gridDim.x);
}

/* ---- 2. escaped blocks per range ------------------------------------------------------------ */

/* Also marks a range invalid for a bit past the last block, and with check_scales (frames,
 * as agoq_frame_parse) for a scale that is not a finite non-negative fp32 or a nonzero
 * scale of an escaped block. */
__device__ __forceinline__ void count_cta(const Layout& L, const Ws& ws, int check_scales, uint32_t r) {
  const uint64_t w0 = (uint64_t)r * L.words_per_range;
  const uint64_t w1 = min(w0 + L.words_per_range, L.nwords);
  uint32_t cnt = 0, bad = 0;
  for (uint64_t w = w0 + threadIdx.x; w < w1; w += kThreads) {
    uint64_t word = bitmap_word(L.body, w), mask = word_valid_mask(L, w);
    bad |= (word & ~mask) != 0;
    cnt += (uint32_t)__popcll(word & mask);
  }
  if (check_scales) {
    const uint32_t* scales = reinterpret_cast<const uint32_t*>(L.body + L.scales_off);
    const uint64_t b1 = min(w1 * 64, L.nb);
    for (uint64_t b = w0 * 64 + threadIdx.x; b < b1; b += kThreads) {
      uint32_t bits = scales[b];
      bad |= bits >= 0x7f800000u || (bit_of(L.body, b) && bits != 0);
    }
  }
  uint32_t total;
  (void)cta_exclusive_sum<kThreads, uint32_t>(cnt, &total);
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) ws.count[r] = total | (bad ? kRangeInvalid : 0u);
}

__global__ void __launch_bounds__(kThreads) count_kernel(Layout L, Ws ws, int check_scales) {
  count_cta(L, ws, check_scales, blockIdx.x);
}

/* ---- 3. prefix, length, status, result, frame header ---------------------------------------- */

enum : int { kModeQuantize = 0, kModeDecode = 1 };

struct ScanArgs {
  Layout L;
  Ws ws;
  agoq_cuda_codec_result* result;
  int mode;
  uint64_t cap;      /* quantize: body capacity */
  uint64_t expected; /* decode: escaped blocks implied by the body length (or frame header) */
  uint8_t* header;   /* frame encode: where the header goes, else NULL */
  uint8_t header_format, header_dtype, header_flags;
  uint32_t header_block;
};

__device__ uint32_t crc32c_device(const uint8_t* p, int len) {
  uint32_t crc = 0xffffffffu;
  for (int i = 0; i < len; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

__device__ void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

__device__ __forceinline__ void scan_cta(const ScanArgs& a) {
  const Ws& ws = a.ws;
  const uint32_t t = threadIdx.x;
  uint32_t c = t < a.L.ranges ? ws.count[t] : 0u;
  const int bad = __syncthreads_or((c & kRangeInvalid) != 0);
  unsigned long long total;
  unsigned long long excl = cta_exclusive_sum<kScanThreads, unsigned long long>(
      (unsigned long long)(c & ~kRangeInvalid), &total);
  if (t < a.L.ranges) ws.prefix[t] = excl;
  if (t != 0) return;
  ws.prefix[a.L.ranges] = total;

  uint32_t status = AGOQ_CODEC_OK;
  uint64_t body_len;
  if (a.mode == kModeQuantize) {
    body_len = a.L.head + total * a.L.raw_block;
    if (body_len > a.cap) status = AGOQ_CODEC_ESPACE;
    else if (a.header != nullptr && total > 0xffffffffull) status = AGOQ_CODEC_EARG;
  } else {
    body_len = a.L.head + a.expected * a.L.raw_block;
    if (bad || total != a.expected) status = AGOQ_CODEC_ECORRUPT;
  }
  *ws.status = status;
  if (a.header != nullptr && status == AGOQ_CODEC_OK) {
    uint8_t h[AGOQ_FRAME_HEADER_SIZE];
    for (int i = 0; i < (int)AGOQ_FRAME_HEADER_SIZE; i++) h[i] = 0;
    put_le(h + 0, AGOQ_FRAME_MAGIC, 4);
    h[4] = (uint8_t)AGOQ_FRAME_VERSION;
    h[5] = a.header_format;
    h[6] = a.header_dtype;
    h[7] = a.header_flags;
    put_le(h + 8, a.header_block, 4);
    put_le(h + 12, total, 4);
    put_le(h + 16, a.L.n, 8);
    put_le(h + 24, body_len, 8);
    put_le(h + 44, crc32c_device(h, 44), 4);
    for (int i = 0; i < (int)AGOQ_FRAME_HEADER_SIZE; i++) a.header[i] = h[i];
  }
  if (a.result != nullptr) {
    a.result->body_len = body_len;
    a.result->escaped_blocks = total;
    a.result->status = status;
    a.result->reserved = 0;
  }
}

__global__ void __launch_bounds__(kScanThreads) scan_kernel(ScanArgs a) { scan_cta(a); }

/* ---- 4. escaped blocks ------------------------------------------------------------------------ */

/* Calls fn(warp-uniform block index, its rank among escaped blocks) for every escaped block
 * of range r (this CTA's), one warp per bitmap word. */
template <typename Fn>
__device__ __forceinline__ void for_each_escaped(const Layout& L, const Ws& ws, uint32_t r, Fn fn) {
  __shared__ unsigned long long words[kThreads];
  __shared__ uint32_t word_rank[kThreads];
  if ((ws.count[r] & ~kRangeInvalid) == 0) return;
  unsigned long long base = ws.prefix[r];
  const uint64_t w0 = (uint64_t)r * L.words_per_range;
  const uint64_t w1 = min(w0 + L.words_per_range, L.nwords);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (uint64_t c0 = w0; c0 < w1; c0 += kThreads) {
    uint64_t w = c0 + threadIdx.x;
    unsigned long long word = w < w1 ? bitmap_word(L.body, w) & word_valid_mask(L, w) : 0ull;
    uint32_t chunk_total;
    uint32_t rank = cta_exclusive_sum<kThreads, uint32_t>((uint32_t)__popcll(word), &chunk_total);
    words[threadIdx.x] = word;
    word_rank[threadIdx.x] = rank;
    __syncthreads();
    for (int i = warp; i < kThreads; i += kThreads / 32) {
      unsigned long long bits = words[i];
      unsigned long long k = base + word_rank[i];
      while (bits != 0) {
        int bit = __ffsll((long long)bits) - 1;
        fn((c0 + i) * 64 + bit, k, lane);
        k++;
        bits &= bits - 1;
      }
    }
    base += chunk_total;
    __syncthreads();
  }
}

__device__ __forceinline__ void raw_copy_cta(const Layout& L, const Ws& ws, const uint8_t* __restrict__ src,
                                             uint32_t r) {
  if (*ws.status != AGOQ_CODEC_OK) return;
  for_each_escaped(L, ws, r, [&](uint64_t b, unsigned long long rank, int lane) {
    const uint64_t start = b * L.block;
    const uint64_t len = min((uint64_t)L.block, L.n - start) * L.esize; /* bytes */
    const uint8_t* s = src + start * L.esize;
    uint8_t* d = L.body + L.raw_off + rank * L.raw_block;
    /* The raw region starts right after the codes: any alignment. */
    if ((reinterpret_cast<uintptr_t>(d) & 3u) == 0 && L.esize == 4) {
      for (uint64_t j = (uint64_t)lane * 4; j < L.raw_block; j += 32 * 4)
        *reinterpret_cast<uint32_t*>(d + j) = j < len ? *reinterpret_cast<const uint32_t*>(s + j) : 0u;
    } else if ((reinterpret_cast<uintptr_t>(d) & 1u) == 0) {
      for (uint64_t j = (uint64_t)lane * 2; j < L.raw_block; j += 32 * 2)
        *reinterpret_cast<uint16_t*>(d + j) = j < len ? *reinterpret_cast<const uint16_t*>(s + j) : 0u;
    } else {
      for (uint64_t j = lane; j < L.raw_block; j += 32) d[j] = j < len ? s[j] : 0u;
    }
  });
}

__global__ void __launch_bounds__(kThreads) raw_copy_kernel(Layout L, Ws ws, const uint8_t* __restrict__ src) {
  raw_copy_cta(L, ws, src, blockIdx.x);
}

/* Element i of a raw region that may be unaligned. */
__device__ __forceinline__ uint32_t raw_elem(const uint8_t* p, uint32_t esize, uint64_t i) {
  const uint8_t* q = p + i * esize;
  uint32_t v = 0;
  for (uint32_t k = 0; k < esize; k++) v |= (uint32_t)q[k] << (8 * k);
  return v;
}

/* One raw element converted as agoq_codec_raw_convert / _accumulate. */
template <int OUT>
__device__ __forceinline__ void raw_store(uint32_t in_dtype, uint32_t e, void* dst, uint64_t i) {
  if (OUT == kOutAcc) {
    float* acc = static_cast<float*>(dst);
    acc[i] = x86_add(acc[i], widen_any(in_dtype, e));
  } else if (OUT == kOutFp32) {
    static_cast<uint32_t*>(dst)[i] = in_dtype == kFp32 ? e : f2u(widen_any(in_dtype, e));
  } else {
    uint32_t h;
    if (in_dtype == (uint32_t)OUT) h = e;
    else if (OUT == kOutBf16) h = fp32_to_bf16(widen_any(in_dtype, e));
    else h = fp32_to_fp16(widen_any(in_dtype, e));
    static_cast<uint16_t*>(dst)[i] = (uint16_t)h;
  }
}

template <int OUT>
__device__ __forceinline__ void raw_decode_cta(const Layout& L, const Ws& ws, void* dst, uint32_t r) {
  if (*ws.status != AGOQ_CODEC_OK) return;
  for_each_escaped(L, ws, r, [&](uint64_t b, unsigned long long rank, int lane) {
    const uint64_t start = b * L.block;
    const uint64_t len = min((uint64_t)L.block, L.n - start);
    const uint8_t* s = L.body + L.raw_off + rank * L.raw_block;
    for (uint64_t j = lane; j < len; j += 32) raw_store<OUT>(L.dtype, raw_elem(s, L.esize, j), dst, start + j);
  });
}

template <int OUT>
__global__ void __launch_bounds__(kThreads) raw_decode_kernel(Layout L, Ws ws, void* dst) {
  raw_decode_cta<OUT>(L, ws, dst, blockIdx.x);
}

/* Format NONE: the body is the n raw elements. */
template <int OUT>
__global__ void __launch_bounds__(kThreads) none_decode_kernel(const uint8_t* __restrict__ body,
                                                               uint64_t n, uint32_t in_dtype, void* dst) {
  const uint32_t es = in_dtype == kFp32 ? 4u : 2u;
  for (uint64_t i = (uint64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * kThreads) {
    uint32_t e = es == 4 ? reinterpret_cast<const uint32_t*>(body)[i]
                         : reinterpret_cast<const uint16_t*>(body)[i];
    raw_store<OUT>(in_dtype, e, dst, i);
  }
}

__global__ void write_result_kernel(agoq_cuda_codec_result* r, uint64_t body_len, uint64_t escaped,
                                    uint32_t status) {
  r->body_len = body_len;
  r->escaped_blocks = escaped;
  r->status = status;
  r->reserved = 0;
}

/* A NONE frame's header: no device-side values in it, but written in stream order. */
__global__ void write_header_kernel(uint8_t* frame, uint8_t dtype, uint64_t n, uint64_t body_len) {
  uint8_t h[AGOQ_FRAME_HEADER_SIZE];
  for (int i = 0; i < (int)AGOQ_FRAME_HEADER_SIZE; i++) h[i] = 0;
  put_le(h + 0, AGOQ_FRAME_MAGIC, 4);
  h[4] = (uint8_t)AGOQ_FRAME_VERSION;
  h[5] = (uint8_t)AGOQ_FORMAT_NONE;
  h[6] = dtype;
  put_le(h + 16, n, 8);
  put_le(h + 24, body_len, 8);
  put_le(h + 44, crc32c_device(h, 44), 4);
  for (int i = 0; i < (int)AGOQ_FRAME_HEADER_SIZE; i++) frame[i] = h[i];
}

/* ---- a reduction owner's element-wise steps ------------------------------------------------------ */

/* Inf for a sum beyond the output type's range; only the rare lanes that change are stored. */
__global__ void __launch_bounds__(kThreads) overflow_inf_kernel(float* acc, uint64_t n, uint32_t from) {
  for (uint64_t i = (uint64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
    const float v = acc[i];
    const float y = fp32_overflow_inf(v, from);
    if (f2u(y) != f2u(v)) acc[i] = y;
  }
}

/* fp32 sums into the output type: fp32 bits unchanged, bf16 / fp16 round to nearest even. */
template <int OUT>
__global__ void __launch_bounds__(kThreads) narrow_kernel(const float* __restrict__ acc, uint64_t n, void* dst) {
  for (uint64_t i = (uint64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
    const float v = acc[i];
    if (OUT == kOutFp32) static_cast<uint32_t*>(dst)[i] = f2u(v);
    else if (OUT == kOutBf16) static_cast<uint16_t*>(dst)[i] = (uint16_t)fp32_to_bf16(v);
    else static_cast<uint16_t*>(dst)[i] = (uint16_t)fp32_to_fp16(v);
  }
}

/* ---- decode of the coded blocks --------------------------------------------------------------- */

struct DecodeArgs {
  Layout L;
  Ws ws;
  void* dst;
  bool codes8;  /* codes region 8-byte aligned */
  bool dst_vec; /* dst 16-byte aligned */
};

/* Chunks of 8 elements per thread: enough independent loads in flight to cover HBM latency
 * (a build-time knob only to measure other values: -DAGOQ_CUDA_DECODE_CHUNKS=N). */
#ifndef AGOQ_CUDA_DECODE_CHUNKS
#define AGOQ_CUDA_DECODE_CHUNKS 4
#endif
constexpr int kDecodeChunks = AGOQ_CUDA_DECODE_CHUNKS;

template <int FMT>
__device__ __forceinline__ uint32_t code_of(const uint32_t (&c)[2], int i) {
  if (FMT == kInt4) return (c[0] >> (4 * i)) & 0xfu;
  return (c[i >> 2] >> (8 * (i & 3))) & 0xffu;
}

/* q exactly as the CPU widens it (fp8 through its table). */
template <int FMT>
__device__ __forceinline__ float code_value(uint32_t code) {
  if (FMT == kInt8) return int8_code_to_fp32(code);
  if (FMT == kInt4) return int4_code_to_fp32(code);
  if (FMT == kE4M3) return e4m3_to_fp32(code);
  return e5m2_to_fp32(code);
}

/* q for codes known not to be fp8 NaN / Inf: no table, no branch. */
template <int FMT>
__device__ __forceinline__ float code_value_fast(uint32_t code) {
  if (FMT == kInt8) return int8_code_to_fp32(code);
  if (FMT == kInt4) return int4_code_to_fp32(code);
  const uint32_t sign = (code & 0x80u) << 24;
  if (FMT == kE4M3) return u2f(f2u(mul_rn(u2f((code & 0x7fu) << 20), 0x1p120f)) | sign);
  return u2f(f2u(mul_rn(u2f((code & 0x7fu) << 21), 0x1p112f)) | sign);
}

template <int FMT>
__device__ __forceinline__ bool codes_special(const uint32_t (&c)[2]) {
  if (FMT == kE4M3) return e4m3_any_special(c[0]) || e4m3_any_special(c[1]);
  if (FMT == kE5M2) return e5m2_any_special(c[0]) || e5m2_any_special(c[1]);
  return false;
}

/* Two finite, in-range values to bf16 / fp16, RNE: the hardware conversion; the emulation
 * uses the software one, equal on such values (test_codec_cuda_math checks NVIDIA's own
 * definition of the instruction against it). */
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return fp32_to_bf16(lo) | (fp32_to_bf16(hi) << 16);
#endif
}

__device__ __forceinline__ uint32_t cvt_f16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return fp32_to_fp16(lo) | (fp32_to_fp16(hi) << 16);
#endif
}

/* The 8 values y = q * s of a coded chunk, as the CPU computes them. Fast path: no fp8 NaN/Inf
 * code and no NaN product; then y saturates with min/max and narrows with the hardware RNE
 * conversions, which agree with the CPU on such values. Returns whether it took the slow path
 * (decode_y: the CPU's own saturation and NaN rules). */
template <int FMT>
__device__ __forceinline__ bool chunk_y(const uint32_t (&c)[2], float s, float (&y)[8]) {
  bool slow = codes_special<FMT>(c);
  bool nan = false;
  if (!slow) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
      y[i] = mul_rn(code_value_fast<FMT>(code_of<FMT>(c, i)), s);
      nan |= y[i] != y[i];
    }
    slow = nan;
  }
  if (slow) {
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = decode_y(code_value<FMT>(code_of<FMT>(c, i)), s);
  }
  return slow;
}

/* The fast path's y as fp32 (decoded into fp32, or accumulated): saturated to the finite range. */
__device__ __forceinline__ void chunk_saturate_fp32(float (&y)[8]) {
#pragma unroll
  for (int i = 0; i < 8; i++) y[i] = fminf(fmaxf(y[i], -kFp32MaxF), kFp32MaxF);
}

/* out = acc + y as the CPU adds: IEEE, and x86's NaN rules (x86_add) once any lane is NaN. */
__device__ __forceinline__ void chunk_add(const float (&acc)[8], const float (&y)[8], float (&out)[8]) {
  bool anynan = false;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    out[i] = add_rn(acc[i], y[i]);
    anynan |= out[i] != out[i];
  }
  if (anynan) {
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = x86_add(acc[i], y[i]);
  }
}

/* The codes of the chunk of 8 elements at e0 (left elements to the body's end) into c, which
 * the caller zeroed. */
template <int FMT>
__device__ __forceinline__ void load_codes(const uint8_t* __restrict__ body, uint64_t codes_off, uint64_t e0,
                                           uint64_t left, bool codes8, uint32_t (&c)[2]) {
  if (FMT == kInt4) {
    const uint8_t* p = body + codes_off + e0 / 2;
    if (left >= 8) {
      c[0] = __ldcs(reinterpret_cast<const unsigned int*>(p));
    } else {
      /* Constant indices only (unrolled, guarded): a runtime index into the caller's c[][]
       * would put the whole array in local memory for every chunk, not just the tail's. */
#pragma unroll
      for (int q = 0; q < 4; q++)
        if ((uint64_t)q < (left + 1) / 2) c[0] |= (uint32_t)p[q] << (8 * q);
    }
  } else {
    const uint8_t* p = body + codes_off + e0;
    if (left >= 8) {
      if (codes8) {
        uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
        c[0] = v.x;
        c[1] = v.y;
      } else {
        c[0] = __ldcs(reinterpret_cast<const unsigned int*>(p));
        c[1] = __ldcs(reinterpret_cast<const unsigned int*>(p) + 1);
      }
    } else {
#pragma unroll
      for (int q = 0; q < 8; q++)
        if ((uint64_t)q < left) c[q >> 2] |= (uint32_t)p[q] << (8 * (q & 3));
    }
  }
}

template <int FMT, int OUT>
__device__ __forceinline__ void decode_cta(const DecodeArgs& a, uint32_t cta) {
  const Layout& L = a.L;
  if (*a.ws.status != AGOQ_CODEC_OK) return;
  const uint8_t* __restrict__ body = L.body;
  const float* __restrict__ scales = reinterpret_cast<const float*>(body + L.scales_off);

  uint64_t e0[kDecodeChunks];
  bool live[kDecodeChunks];
  float s[kDecodeChunks];
  uint32_t c[kDecodeChunks][2];
  float acc[kDecodeChunks][8];

  /* Every load of every chunk is issued before any of them is used: the codes and the
   * scale do not wait for the escape bit (the codes region and the scales cover every block,
   * escaped or not, so the loads stay in bounds), which keeps 4 independent loads per chunk in
   * flight instead of a bitmap -> scale -> codes chain. Measured on an H200: 0.63x -> see
   * docs/codec.md for the current figure. */
  uint32_t bits[kDecodeChunks];
#pragma unroll
  for (int k = 0; k < kDecodeChunks; k++) {
    uint64_t j = ((uint64_t)cta * kDecodeChunks + k) * kThreads + threadIdx.x;
    e0[k] = j * 8;
    live[k] = e0[k] < L.n;
    c[k][0] = c[k][1] = 0;
    s[k] = 0.0f;
    bits[k] = 1;
    if (!live[k]) continue;
    const uint64_t b = e0[k] >> L.log2b;
    bits[k] = bit_of(body, b);
    s[k] = scales[b];
    const uint64_t left = L.n - e0[k];
    load_codes<FMT>(body, L.codes_off, e0[k], left, a.codes8, c[k]);
    if (OUT == kOutAcc) {
      const float* ap = static_cast<const float*>(a.dst) + e0[k];
      if (left >= 8 && a.dst_vec) {
        float4 x = reinterpret_cast<const float4*>(ap)[0], y = reinterpret_cast<const float4*>(ap)[1];
        acc[k][0] = x.x, acc[k][1] = x.y, acc[k][2] = x.z, acc[k][3] = x.w;
        acc[k][4] = y.x, acc[k][5] = y.y, acc[k][6] = y.z, acc[k][7] = y.w;
      } else {
#pragma unroll
        for (int i = 0; i < 8; i++) acc[k][i] = (uint64_t)i < left ? ap[i] : 0.0f;
      }
    }
  }
  /* Escaped blocks are raw_decode_kernel's: their codes are zero and must not be written. */
#pragma unroll
  for (int k = 0; k < kDecodeChunks; k++) live[k] = live[k] && bits[k] == 0;

#pragma unroll
  for (int k = 0; k < kDecodeChunks; k++) {
    if (!live[k]) continue;
    const uint64_t left = L.n - e0[k];
    float y[8];
    const bool slow = chunk_y<FMT>(c[k], s[k], y);

    if (OUT == kOutFp32 || OUT == kOutAcc) {
      float out[8];
      if (!slow) chunk_saturate_fp32(y);
      if (OUT == kOutAcc) {
        chunk_add(acc[k], y, out);
      } else {
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = y[i];
      }
      float* d = static_cast<float*>(a.dst) + e0[k];
      if (left >= 8 && a.dst_vec) {
        reinterpret_cast<float4*>(d)[0] = make_float4(out[0], out[1], out[2], out[3]);
        reinterpret_cast<float4*>(d)[1] = make_float4(out[4], out[5], out[6], out[7]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
          if ((uint64_t)i < left) d[i] = out[i];
      }
    } else {
      uint32_t h[4];
      if (!slow) {
        const float mx = OUT == kOutBf16 ? kBf16MaxF : kFp16MaxF;
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          float lo = fminf(fmaxf(y[i], -mx), mx), hi = fminf(fmaxf(y[i + 1], -mx), mx);
          h[i >> 1] = OUT == kOutBf16 ? cvt_bf16x2(lo, hi) : cvt_f16x2(lo, hi);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          uint32_t lo = OUT == kOutBf16 ? fp32_to_bf16_sat(y[i]) : fp32_to_fp16_sat(y[i]);
          uint32_t hi = OUT == kOutBf16 ? fp32_to_bf16_sat(y[i + 1]) : fp32_to_fp16_sat(y[i + 1]);
          h[i >> 1] = lo | (hi << 16);
        }
      }
      uint16_t* d = static_cast<uint16_t*>(a.dst) + e0[k];
      if (left >= 8 && a.dst_vec) {
        *reinterpret_cast<uint4*>(d) = make_uint4(h[0], h[1], h[2], h[3]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
          if ((uint64_t)i < left) d[i] = (uint16_t)(h[i >> 1] >> (16 * (i & 1)));
      }
    }
  }
}

template <int FMT, int OUT>
__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeArgs a) {
  decode_cta<FMT, OUT>(a, blockIdx.x);
}

/* ---- batches: one launch of each kernel for many items -------------------------------------- */

/* One item of a batch as the batched kernels read it (blockIdx.y picks the item): the single
 * call's arguments, and how many CTAs of each kernel the item needs. A batch's grid is its
 * largest item's; an item's CTAs past its own count return at once. The table lives in
 * device memory (copied there from the caller's pinned table before the launches). */
struct BatchEntry {
  ScanArgs scan;      /* layout, workspace share, result, mode, capacity / expected, header */
  const uint8_t* src; /* encode: the elements */
  void* dst;          /* decode: where the elements go */
  uint64_t seed, first_index;
  uint32_t quant_ctas;  /* encode: CTAs of the quantize kernel */
  uint32_t decode_ctas; /* decode: CTAs of the coded blocks' decode */
  bool src_vec, codes8, dst_vec;
};

__device__ __forceinline__ QuantArgs quant_args_of(const BatchEntry& e) {
  QuantArgs a;
  a.L = e.scan.L;
  a.src = e.src;
  a.seed = e.seed;
  a.first_index = e.first_index;
  a.src_vec = e.src_vec;
  a.codes8 = e.codes8;
  return a;
}

__device__ __forceinline__ DecodeArgs decode_args_of(const BatchEntry& e) {
  DecodeArgs a;
  a.L = e.scan.L;
  a.ws = e.scan.ws;
  a.dst = e.dst;
  a.codes8 = e.codes8;
  a.dst_vec = e.dst_vec;
  return a;
}

template <int FMT, int DT, int G, int C, int U, bool STOCH>
__global__ void __launch_bounds__(kThreads) quantize_batch_kernel(const BatchEntry* t) {
  const BatchEntry& e = t[blockIdx.y];
  if (blockIdx.x < e.quant_ctas) quantize_cta<FMT, DT, G, C, U, STOCH>(quant_args_of(e), blockIdx.x, e.quant_ctas);
}

__global__ void __launch_bounds__(kThreads) count_batch_kernel(const BatchEntry* t, int check_scales) {
  const BatchEntry& e = t[blockIdx.y];
  if (blockIdx.x < e.scan.L.ranges) count_cta(e.scan.L, e.scan.ws, check_scales, blockIdx.x);
}

__global__ void __launch_bounds__(kScanThreads) scan_batch_kernel(const BatchEntry* t) { scan_cta(t[blockIdx.y].scan); }

__global__ void __launch_bounds__(kThreads) raw_copy_batch_kernel(const BatchEntry* t) {
  const BatchEntry& e = t[blockIdx.y];
  if (blockIdx.x < e.scan.L.ranges) raw_copy_cta(e.scan.L, e.scan.ws, e.src, blockIdx.x);
}

template <int FMT, int OUT>
__global__ void __launch_bounds__(kThreads) decode_batch_kernel(const BatchEntry* t) {
  const BatchEntry& e = t[blockIdx.y];
  if (blockIdx.x < e.decode_ctas) decode_cta<FMT, OUT>(decode_args_of(e), blockIdx.x);
}

template <int OUT>
__global__ void __launch_bounds__(kThreads) raw_decode_batch_kernel(const BatchEntry* t) {
  const BatchEntry& e = t[blockIdx.y];
  if (blockIdx.x < e.scan.L.ranges && e.scan.expected != 0) raw_decode_cta<OUT>(e.scan.L, e.scan.ws, e.dst, blockIdx.x);
}

/* Block b's rank among the body's escaped blocks (b escaped): the escapes before its scan
 * range (the scan's prefix), then those before it in the range's words. Escapes are rare (a
 * block with NaN or Inf), so the words are counted where one is met. */
__device__ __forceinline__ uint64_t escaped_rank(const Layout& L, const Ws& ws, uint64_t b) {
  const uint64_t w = b >> 6, r = w / L.words_per_range;
  uint64_t rank = ws.prefix[r];
  for (uint64_t v = r * L.words_per_range; v < w; v++)
    rank += (uint64_t)__popcll(bitmap_word(L.body, v) & word_valid_mask(L, v));
  return rank + (uint64_t)__popcll(bitmap_word(L.body, w) & ((1ull << (b & 63)) - 1));
}

/* Sum blockIdx.y of a batch: its k bodies (one format, type, block and element count: one
 * layout but for the body and its escaped blocks; items [y * k, y * k + k) of the table, each
 * with the sum's accumulator as dst) summed into that accumulator in item order: item 0
 * decoded into fp32, each next one added. Element by element these are the operations of a
 * decode into fp32 followed by decode-accumulates in item order (the CPU's rank-order sum):
 * the same bits, in one pass that reads and writes the accumulator once. Nothing is written
 * unless every item's scan found its body valid, as a corrupt body leaves a single decode's
 * output untouched. */
template <int FMT>
__global__ void __launch_bounds__(kThreads) sum_kernel(const BatchEntry* all, uint32_t k) {
  const BatchEntry* t = all + (size_t)blockIdx.y * k;
  if (blockIdx.x >= t[0].decode_ctas) return;
  for (uint32_t j = 0; j < k; j++)
    if (*t[j].scan.ws.status != AGOQ_CODEC_OK) return;
  const Layout& L0 = t[0].scan.L;
  float* const acc_out = static_cast<float*>(t[0].dst);
  const bool acc_vec = t[0].dst_vec;
  for (int q = 0; q < kDecodeChunks; q++) {
    const uint64_t e0 = (((uint64_t)blockIdx.x * kDecodeChunks + q) * kThreads + threadIdx.x) * 8;
    if (e0 >= L0.n) break;
    const uint64_t left = L0.n - e0, b = e0 >> L0.log2b;
    float acc[8];
    for (uint32_t j = 0; j < k; j++) {
      const BatchEntry& e = t[j];
      const Layout& L = e.scan.L;
      float y[8];
      if (bit_of(L.body, b)) { /* an escaped block: its raw elements, widened exactly */
        const uint8_t* raw = L.body + L.raw_off + escaped_rank(L, e.scan.ws, b) * L.raw_block;
        const uint64_t off = e0 - b * L.block;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = (uint64_t)i < left ? widen_any(L.dtype, raw_elem(raw, L.esize, off + i)) : 0.0f;
        if (j == 0) {
#pragma unroll
          for (int i = 0; i < 8; i++) acc[i] = y[i];
        } else {
#pragma unroll
          for (int i = 0; i < 8; i++) acc[i] = x86_add(acc[i], y[i]);
        }
        continue;
      }
      uint32_t c[2] = {0, 0};
      load_codes<FMT>(L.body, L.codes_off, e0, left, e.codes8, c);
      const float s = reinterpret_cast<const float*>(L.body + L.scales_off)[b];
      if (!chunk_y<FMT>(c, s, y)) chunk_saturate_fp32(y);
      if (j == 0) {
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = y[i];
      } else {
        float out[8];
        chunk_add(acc, y, out);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = out[i];
      }
    }
    float* d = acc_out + e0;
    if (left >= 8 && acc_vec) {
      reinterpret_cast<float4*>(d)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(d)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; i++)
        if ((uint64_t)i < left) d[i] = acc[i];
    }
  }
}

/* ---- host side ---------------------------------------------------------------------------------- */

#if defined(AGOQ_CUDA_EMULATION)
/* Where the kernels' argument structs keep pointers: the emulation moves each one onto the
 * device's view of memory at launch (a pointer left out would fault in the kernel). */
inline void agoq_emu_rebase(Layout& L, bool& ok) { agoq_emu::rebase_ptr(L.body, ok); }
inline void agoq_emu_rebase(QuantArgs& a, bool& ok) {
  agoq_emu_rebase(a.L, ok);
  agoq_emu::rebase_ptr(a.src, ok);
}
inline void agoq_emu_rebase(Ws& w, bool& ok) {
  agoq_emu::rebase_ptr(w.prefix, ok);
  agoq_emu::rebase_ptr(w.count, ok);
  agoq_emu::rebase_ptr(w.status, ok);
}
inline void agoq_emu_rebase(ScanArgs& a, bool& ok) {
  agoq_emu_rebase(a.L, ok);
  agoq_emu_rebase(a.ws, ok);
  agoq_emu::rebase_ptr(a.result, ok);
  agoq_emu::rebase_ptr(a.header, ok);
}
inline void agoq_emu_rebase(DecodeArgs& a, bool& ok) {
  agoq_emu_rebase(a.L, ok);
  agoq_emu_rebase(a.ws, ok);
  agoq_emu::rebase_ptr(a.dst, ok);
}
/* A batch's table entries are written by the host with the device's view of each pointer,
 * as a launch's arguments are (the kernels read them from the table). */
inline void agoq_emu_rebase(BatchEntry& e, bool& ok) {
  agoq_emu_rebase(e.scan, ok);
  agoq_emu::rebase_ptr(e.src, ok);
  agoq_emu::rebase_ptr(e.dst, ok);
}
#endif

/* ---- the kernels, as the launch code and the loader see them -------------------------------- */

/* A kernel's address and, for messages, its name with its template arguments. Every launch
 * below takes one of these, made by kern<>() at the launch site or by a selector
 * (quantize_kernel_for, decode_kernel_for, ...), the same selectors agoq_cuda_codec_load_all
 * walks: the emulation refuses a launch of a kernel the loader did not load, so a kernel
 * added to the launch code but not reachable by the loader fails the emulated tests. */
template <typename F>
struct Kernel {
  F fn;
  const char* name;
};

struct KernelName {
  char s[192];
};

/* "... K = agoq_cuda::{anonymous}::decode_kernel<1, 3>]" (gcc; clang: "K = &...") -> "decode_kernel<1, 3>". */
KernelName kernel_name_from(const char* pretty) {
  KernelName n;
  memset(&n, 0, sizeof n);
  const char* p = strstr(pretty, "K = ");
  p = p != nullptr ? p + 4 : pretty;
  if (*p == '&') p++;
  static const char* const prefixes[] = {"agoq_cuda::", "{anonymous}::", "(anonymous namespace)::"};
  size_t o = 0;
  while (*p != '\0' && o + 1 < sizeof n.s) {
    bool skipped = false;
    for (const char* pre : prefixes) {
      const size_t len = strlen(pre);
      if (strncmp(p, pre, len) == 0) {
        p += len;
        skipped = true;
      }
    }
    if (skipped) continue;
    n.s[o++] = *p++;
  }
  /* The closing bracket of "[with ...]" (and what follows it). */
  char* end = strrchr(n.s, ']');
  if (end != nullptr) *end = '\0';
  return n;
}

template <auto K>
const char* kernel_name() {
  static const KernelName n = kernel_name_from(__PRETTY_FUNCTION__);
  return n.s;
}

template <auto K>
Kernel<decltype(K)> kern() {
  return {K, kernel_name<K>()};
}

/* k<<<grid, block, 0, st>>>(args), or its emulation. */
template <typename... P, typename... A>
void launch(Kernel<void (*)(P...)> k, unsigned grid, unsigned block, cudaStream_t st, A... args) {
#if defined(AGOQ_CUDA_EMULATION)
  agoq_emu::launch(st, k.fn, k.name, grid, block, static_cast<P>(args)...);
#else
  k.fn<<<grid, block, 0, st>>>(static_cast<P>(args)...);
#endif
}

/* k<<<(grid_x, grid_y), block, 0, st>>>(args): a batch, blockIdx.y its item. */
template <typename... P, typename... A>
void launch_2d(Kernel<void (*)(P...)> k, unsigned grid_x, unsigned grid_y, unsigned block, cudaStream_t st,
               A... args) {
#if defined(AGOQ_CUDA_EMULATION)
  agoq_emu::launch_2d(st, k.fn, k.name, grid_x, grid_y, block, static_cast<P>(args)...);
#else
  k.fn<<<dim3(grid_x, grid_y), block, 0, st>>>(static_cast<P>(args)...);
#endif
}

thread_local int g_last_error = 0;

int cuda_failed(cudaError_t e) {
  g_last_error = (int)e;
  return AGOQ_CUDA_CODEC_ECUDA;
}

int launched() {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? AGOQ_CODEC_OK : cuda_failed(e);
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

/* A single call's workspace as the kernels see it (addresses only: the host never reads it). */
Ws ws_of(void* workspace) {
  Workspace* w = static_cast<Workspace*>(workspace);
  return {w->prefix, w->count, &w->status};
}

uint32_t log2u(uint32_t v) {
  uint32_t r = 0;
  while ((1u << r) < v) r++;
  return r;
}

/* The layout of a non-NONE body; false when a size overflows. */
bool layout_init(Layout* L, const agoq_codec_params* p, size_t n, const void* body) {
  size_t head = agoq_codec_body_size(p, n, 0);
  if (head == SIZE_MAX || (head == 0 && n != 0)) return false;
  memset(L, 0, sizeof *L);
  L->body = static_cast<uint8_t*>(const_cast<void*>(body));
  L->n = n;
  L->block = p->block;
  L->log2b = log2u(p->block);
  L->esize = (uint32_t)agoq_dtype_size(p->dtype);
  L->dtype = (uint32_t)p->dtype;
  L->nb = agoq_codec_nblocks(p, n);
  L->nwords = (L->nb + 63) / 64;
  L->bitmap_bytes = L->nwords * 8;
  L->scales_off = L->bitmap_bytes;
  L->codes_off = L->scales_off + 4 * L->nb;
  L->raw_off = L->codes_off + (p->format == AGOQ_FORMAT_INT4 ? (n + 1) / 2 : n);
  L->raw_block = (uint64_t)p->block * L->esize;
  L->head = head;
  if (L->raw_off != head) return false; /* agrees with the CPU codec's own layout */
  uint64_t wpr = (L->nwords + kRangesMax - 1) / kRangesMax;
  if (wpr == 0) wpr = 1;
  if (wpr > 0xffffffffull) return false;
  L->words_per_range = (uint32_t)wpr;
  L->ranges = (uint32_t)((L->nwords + wpr - 1) / wpr);
  return true;
}

/* ---- selectors: which kernel a call launches (launch code and loader alike) ---------------- */

using QuantFn = void (*)(QuantArgs);
using DecodeFn = void (*)(DecodeArgs);
using BatchFn = void (*)(const BatchEntry*);
using SumFn = void (*)(const BatchEntry*, uint32_t);
using RawDecodeFn = void (*)(Layout, Ws, void*);
using NoneDecodeFn = void (*)(const uint8_t*, uint64_t, uint32_t, void*);
using NarrowFn = void (*)(const float*, uint64_t, void*);

struct QuantKernel {
  Kernel<QuantFn> k;
  Kernel<BatchFn> batch;   /* the same work for a batch's items */
  uint32_t blocks_per_cta; /* codec blocks one CTA quantizes */
};

template <int FMT, int DT, int G, int C, bool STOCH>
QuantKernel quantize_geom() {
  constexpr int kChunksPerLane = DT == kFp32 ? 2 : 4;
  constexpr int U = kChunksPerLane / C > 0 ? kChunksPerLane / C : 1;
  constexpr int kBlocksPerCta = (kThreads / 32) * (32 / G) * U;
  return {kern<quantize_kernel<FMT, DT, G, C, U, STOCH>>(), kern<quantize_batch_kernel<FMT, DT, G, C, U, STOCH>>(),
          (uint32_t)kBlocksPerCta};
}

template <int FMT, int DT, bool STOCH>
QuantKernel quantize_block(uint32_t block) {
  switch (block) {
    case 32: return quantize_geom<FMT, DT, 4, 1, STOCH>();
    case 64: return quantize_geom<FMT, DT, 8, 1, STOCH>();
    case 128: return quantize_geom<FMT, DT, 16, 1, STOCH>();
    case 256: return quantize_geom<FMT, DT, 32, 1, STOCH>();
    case 512: return quantize_geom<FMT, DT, 32, 2, STOCH>();
    default: return quantize_geom<FMT, DT, 32, 4, STOCH>();
  }
}

template <int FMT, int DT>
QuantKernel quantize_dt(uint32_t block, bool stochastic) {
  if constexpr (FMT == kInt8 || FMT == kInt4) {
    if (stochastic) return quantize_block<FMT, DT, true>(block);
  }
  return quantize_block<FMT, DT, false>(block);
}

template <int FMT>
QuantKernel quantize_fmt(agoq_dtype dt, uint32_t block, bool stochastic) {
  switch (dt) {
    case AGOQ_DTYPE_FP32: return quantize_dt<FMT, kFp32>(block, stochastic);
    case AGOQ_DTYPE_BF16: return quantize_dt<FMT, kBf16>(block, stochastic);
    default: return quantize_dt<FMT, kFp16>(block, stochastic);
  }
}

/* The quantize kernel of valid, non-NONE parameters. */
QuantKernel quantize_kernel_for(const agoq_codec_params* p) {
  switch (p->format) {
    case AGOQ_FORMAT_INT8: return quantize_fmt<kInt8>(p->dtype, p->block, p->stochastic);
    case AGOQ_FORMAT_INT4: return quantize_fmt<kInt4>(p->dtype, p->block, p->stochastic);
    case AGOQ_FORMAT_FP8E4M3: return quantize_fmt<kE4M3>(p->dtype, p->block, false);
    default: return quantize_fmt<kE5M2>(p->dtype, p->block, false);
  }
}

/* A single call's kernel, or (BATCH) its batched form. */
template <int FMT, int OUT, bool BATCH>
auto decode_one() {
  if constexpr (BATCH) return kern<decode_batch_kernel<FMT, OUT>>();
  else return kern<decode_kernel<FMT, OUT>>();
}

template <int OUT, bool BATCH>
auto raw_decode_one() {
  if constexpr (BATCH) return kern<raw_decode_batch_kernel<OUT>>();
  else return kern<raw_decode_kernel<OUT>>();
}

template <int FMT, bool BATCH>
auto decode_fmt(int out) {
  switch (out) {
    case kOutFp32: return decode_one<FMT, kOutFp32, BATCH>();
    case kOutBf16: return decode_one<FMT, kOutBf16, BATCH>();
    case kOutFp16: return decode_one<FMT, kOutFp16, BATCH>();
    default: return decode_one<FMT, kOutAcc, BATCH>();
  }
}

/* The coded blocks' decode of a non-NONE format into out (a dtype or kOutAcc). */
template <bool BATCH = false>
auto decode_kernel_for(agoq_format format, int out) {
  switch (format) {
    case AGOQ_FORMAT_INT8: return decode_fmt<kInt8, BATCH>(out);
    case AGOQ_FORMAT_INT4: return decode_fmt<kInt4, BATCH>(out);
    case AGOQ_FORMAT_FP8E4M3: return decode_fmt<kE4M3, BATCH>(out);
    default: return decode_fmt<kE5M2, BATCH>(out);
  }
}

/* The escaped (raw) blocks' decode: only for a body with escaped blocks (NaN or Inf). */
template <bool BATCH = false>
auto raw_decode_kernel_for(int out) {
  switch (out) {
    case kOutFp32: return raw_decode_one<kOutFp32, BATCH>();
    case kOutBf16: return raw_decode_one<kOutBf16, BATCH>();
    case kOutFp16: return raw_decode_one<kOutFp16, BATCH>();
    default: return raw_decode_one<kOutAcc, BATCH>();
  }
}

/* A batch's rank-order sum of a non-NONE format. */
Kernel<SumFn> sum_kernel_for(agoq_format format) {
  switch (format) {
    case AGOQ_FORMAT_INT8: return kern<sum_kernel<kInt8>>();
    case AGOQ_FORMAT_INT4: return kern<sum_kernel<kInt4>>();
    case AGOQ_FORMAT_FP8E4M3: return kern<sum_kernel<kE4M3>>();
    default: return kern<sum_kernel<kE5M2>>();
  }
}

/* Format NONE into another type than its own, or accumulated. */
Kernel<NoneDecodeFn> none_decode_kernel_for(int out) {
  switch (out) {
    case kOutFp32: return kern<none_decode_kernel<kOutFp32>>();
    case kOutBf16: return kern<none_decode_kernel<kOutBf16>>();
    case kOutFp16: return kern<none_decode_kernel<kOutFp16>>();
    default: return kern<none_decode_kernel<kOutAcc>>();
  }
}

Kernel<NarrowFn> narrow_kernel_for(agoq_dtype out) {
  switch (out) {
    case AGOQ_DTYPE_FP32: return kern<narrow_kernel<kOutFp32>>();
    case AGOQ_DTYPE_BF16: return kern<narrow_kernel<kOutBf16>>();
    default: return kern<narrow_kernel<kOutFp16>>();
  }
}

/* Calls f(Kernel<...>) for every kernel a call of this file can launch, over every parameter
 * the codec accepts (agoq_codec_params_check), through the selectors above; a kernel may come
 * more than once. What agoq_cuda_codec_load_all loads. */
template <typename Fn>
void for_each_kernel(Fn&& f) {
  for (int fmt = 0; fmt < AGOQ_FORMAT_COUNT; fmt++) {
    if (fmt == AGOQ_FORMAT_NONE) continue; /* no quantize kernel: a copy, or the kernels below */
    bool any = false;
    for (int dt = 0; dt < AGOQ_DTYPE_COUNT; dt++)
      for (uint32_t block = 1; block <= AGOQ_CODEC_BLOCK_MAX; block++)
        for (int stoch = 0; stoch < 2; stoch++) {
          agoq_codec_params p;
          memset(&p, 0, sizeof p);
          p.format = (agoq_format)fmt;
          p.dtype = (agoq_dtype)dt;
          p.block = block;
          p.stochastic = stoch != 0;
          if (agoq_codec_params_check(&p) != AGOQ_CODEC_OK) continue;
          f(quantize_kernel_for(&p).k);
          f(quantize_kernel_for(&p).batch);
          any = true;
        }
    if (any) {
      for (int out = kOutFp32; out <= kOutAcc; out++) f(decode_kernel_for((agoq_format)fmt, out));
      /* A batch decodes into a type, or sums (sum_kernel): no batched accumulate. */
      for (int out = kOutFp32; out <= kOutFp16; out++) f(decode_kernel_for<true>((agoq_format)fmt, out));
      f(sum_kernel_for((agoq_format)fmt));
    }
  }
  for (int out = kOutFp32; out <= kOutAcc; out++) {
    f(raw_decode_kernel_for(out));
    f(none_decode_kernel_for(out));
  }
  for (int out = kOutFp32; out <= kOutFp16; out++) f(raw_decode_kernel_for<true>(out));
  for (int dt = 0; dt < AGOQ_DTYPE_COUNT; dt++) f(narrow_kernel_for((agoq_dtype)dt));
  /* The kernels every parameter shares (launched below with kern<>()). */
  f(kern<count_kernel>());
  f(kern<scan_kernel>());
  f(kern<raw_copy_kernel>());
  f(kern<count_batch_kernel>());
  f(kern<scan_batch_kernel>());
  f(kern<raw_copy_batch_kernel>());
  f(kern<write_result_kernel>());
  f(kern<write_header_kernel>());
  f(kern<overflow_inf_kernel>());
}

/* ---- launches -------------------------------------------------------------------------------- */

void launch_quantize(const QuantArgs& a, const agoq_codec_params* p, cudaStream_t st) {
  const QuantKernel q = quantize_kernel_for(p);
  const uint64_t grid = (a.L.nb + q.blocks_per_cta - 1) / q.blocks_per_cta;
  launch(q.k, (unsigned)grid, kThreads, st, a);
}

void launch_decode(const DecodeArgs& a, agoq_format format, int out, cudaStream_t st) {
  const uint64_t per_cta = (uint64_t)kThreads * kDecodeChunks * 8;
  const unsigned grid = (unsigned)((a.L.n + per_cta - 1) / per_cta);
  launch(decode_kernel_for(format, out), grid, kThreads, st, a);
}

void launch_raw_decode(const Layout& L, const Ws& ws, void* dst, int out, cudaStream_t st) {
  launch(raw_decode_kernel_for(out), L.ranges, kThreads, st, L, ws, dst);
}

void launch_none_decode(const void* body, size_t n, agoq_dtype in, void* dst, int out, cudaStream_t st) {
  const uint64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = (unsigned)(blocks < 65536 ? blocks : 65536);
  launch(none_decode_kernel_for(out), grid, kThreads, st, static_cast<const uint8_t*>(body), n, in, dst);
}

bool params_ok(const agoq_codec_params* p) {
  return p != nullptr && agoq_codec_params_check(p) == AGOQ_CODEC_OK;
}

/* Quantize into body; header != NULL adds a frame header there (body = header + 48). */
int quantize_impl(const agoq_codec_params* p, const void* src, size_t n, void* body, size_t cap,
                  void* workspace, agoq_cuda_codec_result* result, cudaStream_t st,
                  uint8_t* header) {
  if (!params_ok(p) || result == nullptr || workspace == nullptr || (src == nullptr && n != 0) ||
      !aligned(src, agoq_dtype_size(p->dtype)) || !aligned(body, 4))
    return AGOQ_CODEC_EARG;
  if (n > kMaxCount) return AGOQ_CODEC_EARG;
  if (p->format == AGOQ_FORMAT_NONE) {
    const size_t bytes = n * agoq_dtype_size(p->dtype);
    if (cap < bytes || (body == nullptr && bytes != 0)) return AGOQ_CODEC_ESPACE;
    if (bytes != 0) {
      cudaError_t e = cudaMemcpyAsync(body, src, bytes, cudaMemcpyDeviceToDevice, st);
      if (e != cudaSuccess) return cuda_failed(e);
    }
    if (header != nullptr) launch(kern<write_header_kernel>(), 1, 1, st, header, (uint8_t)p->dtype, n, bytes);
    launch(kern<write_result_kernel>(), 1, 1, st, result, bytes, 0, AGOQ_CODEC_OK);
    return launched();
  }
  QuantArgs a;
  memset(&a, 0, sizeof a);
  if (!layout_init(&a.L, p, n, body)) return AGOQ_CODEC_EARG;
  if (cap < a.L.head || (body == nullptr && a.L.head != 0)) return AGOQ_CODEC_ESPACE;
  ScanArgs sa;
  memset(&sa, 0, sizeof sa);
  if (header != nullptr) {
    sa.header = header;
    sa.header_format = (uint8_t)p->format;
    sa.header_dtype = (uint8_t)p->dtype;
    sa.header_flags = p->stochastic ? AGOQ_FRAME_FLAG_STOCHASTIC : 0u;
    sa.header_block = p->block;
  }
  if (n == 0) { /* an empty body */
    if (header != nullptr) {
      /* A frame of 0 elements still has its header: the scan kernel over no ranges
       * writes it (and the result). */
      sa.L = a.L;
      sa.L.ranges = 0;
      sa.ws = ws_of(workspace);
      sa.result = result;
      sa.mode = kModeQuantize;
      sa.cap = cap;
      launch(kern<scan_kernel>(), 1, kScanThreads, st, sa);
      return launched();
    }
    launch(kern<write_result_kernel>(), 1, 1, st, result, 0, 0, AGOQ_CODEC_OK);
    return launched();
  }
  const Ws ws = ws_of(workspace);
  a.src = static_cast<const uint8_t*>(src);
  a.seed = p->seed;
  a.first_index = p->first_index;
  a.src_vec = aligned(src, 16);
  a.codes8 = aligned(a.L.body + a.L.codes_off, 8);
  launch_quantize(a, p, st);
  launch(kern<count_kernel>(), a.L.ranges, kThreads, st, a.L, ws, 0);
  sa.L = a.L;
  sa.ws = ws;
  sa.result = result;
  sa.mode = kModeQuantize;
  sa.cap = cap;
  launch(kern<scan_kernel>(), 1, kScanThreads, st, sa);
  launch(kern<raw_copy_kernel>(), a.L.ranges, kThreads, st, a.L, ws, a.src);
  return launched();
}

/* Decode into dst (out = dtype or kOutAcc). expected_escaped: from the frame header, or
 * SIZE_MAX to derive it from body_len. */
int decode_impl(const agoq_codec_params* p, const void* body, size_t body_len, size_t n, int out,
                void* dst, void* workspace, agoq_cuda_codec_result* result, cudaStream_t st,
                bool check_scales) {
  const size_t osize = out == kOutAcc ? 4 : agoq_dtype_size((agoq_dtype)out);
  if (!params_ok(p) || workspace == nullptr || (body == nullptr && body_len != 0) ||
      (dst == nullptr && n != 0) || !aligned(body, 4) || !aligned(dst, osize))
    return AGOQ_CODEC_EARG;
  if (n > kMaxCount) return AGOQ_CODEC_EARG;
  if (p->format == AGOQ_FORMAT_NONE) {
    const size_t es = agoq_dtype_size(p->dtype);
    if (body_len != n * es) return AGOQ_CODEC_ECORRUPT;
    if (n != 0) {
      if (out == (int)p->dtype) {
        cudaError_t e = cudaMemcpyAsync(dst, body, body_len, cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) return cuda_failed(e);
      } else {
        launch_none_decode(body, n, p->dtype, dst, out, st);
      }
    }
    if (result != nullptr) launch(kern<write_result_kernel>(), 1, 1, st, result, body_len, 0, AGOQ_CODEC_OK);
    return launched();
  }
  Layout L;
  if (!layout_init(&L, p, n, body)) return AGOQ_CODEC_EARG;
  /* The body length fixes the number of escaped blocks (whole blocks in the raw region);
   * the bitmap must then agree, which the device checks. */
  if (body_len < L.head || (body_len - L.head) % L.raw_block != 0 ||
      (body_len - L.head) / L.raw_block > L.nb)
    return AGOQ_CODEC_ECORRUPT;
  const uint64_t expected = (body_len - L.head) / L.raw_block;
  if (n == 0) {
    if (result != nullptr) launch(kern<write_result_kernel>(), 1, 1, st, result, body_len, 0, AGOQ_CODEC_OK);
    return launched();
  }
  const Ws ws = ws_of(workspace);
  launch(kern<count_kernel>(), L.ranges, kThreads, st, L, ws, check_scales ? 1 : 0);
  ScanArgs sa;
  memset(&sa, 0, sizeof sa);
  sa.L = L;
  sa.ws = ws;
  sa.result = result;
  sa.mode = kModeDecode;
  sa.expected = expected;
  launch(kern<scan_kernel>(), 1, kScanThreads, st, sa);
  DecodeArgs da;
  da.L = L;
  da.ws = ws;
  da.dst = dst;
  da.codes8 = aligned(L.body + L.codes_off, 8);
  da.dst_vec = aligned(dst, 16);
  launch_decode(da, p->format, out, st);
  if (expected != 0) launch_raw_decode(L, ws, dst, out, st);
  return launched();
}

uint32_t get_u32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t get_u64(const uint8_t* p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* The host half of agoq_frame_parse: everything but the payload CRC, the bitmap and the
 * scales. Fills p and *escaped. */
int frame_header_check(const void* header, size_t len, agoq_codec_params* p, uint64_t* count,
                       uint64_t* payload_len, uint32_t* escaped) {
  const uint8_t* h = static_cast<const uint8_t*>(header);
  if (h == nullptr) return AGOQ_CODEC_EARG;
  if (len < AGOQ_FRAME_HEADER_SIZE || get_u32(h) != AGOQ_FRAME_MAGIC) return AGOQ_CODEC_ECORRUPT;
  if (h[4] != AGOQ_FRAME_VERSION) return AGOQ_CODEC_EVERSION;
  if (agoq_crc32c(0, h, 44) != get_u32(h + 44)) return AGOQ_CODEC_ECORRUPT;
  const uint32_t flags = h[7], block = get_u32(h + 8);
  *escaped = get_u32(h + 12);
  *count = get_u64(h + 16);
  *payload_len = get_u64(h + 24);
  const uint32_t payload_crc = get_u32(h + 32);
  if (h[5] >= AGOQ_FORMAT_COUNT || h[6] >= AGOQ_DTYPE_COUNT ||
      (flags & ~(AGOQ_FRAME_FLAG_PAYLOAD_CRC | AGOQ_FRAME_FLAG_STOCHASTIC)) != 0 ||
      get_u32(h + 36) != 0 || get_u32(h + 40) != 0 || *count > AGOQ_FRAME_MAX_COUNT ||
      (!(flags & AGOQ_FRAME_FLAG_PAYLOAD_CRC) && payload_crc != 0))
    return AGOQ_CODEC_ECORRUPT;
  memset(p, 0, sizeof *p);
  p->format = (agoq_format)h[5];
  p->dtype = (agoq_dtype)h[6];
  p->block = block;
  p->stochastic = (flags & AGOQ_FRAME_FLAG_STOCHASTIC) != 0;
  if (p->format == AGOQ_FORMAT_NONE) {
    if (block != 0 || *escaped != 0 || p->stochastic) return AGOQ_CODEC_ECORRUPT;
  } else if (agoq_codec_params_check(p) != AGOQ_CODEC_OK) {
    return AGOQ_CODEC_ECORRUPT;
  }
  const size_t n = (size_t)*count;
  if (*escaped > agoq_codec_nblocks(p, n)) return AGOQ_CODEC_ECORRUPT;
  if (*payload_len != (uint64_t)agoq_codec_body_size(p, n, *escaped)) return AGOQ_CODEC_ECORRUPT;
  if (*payload_len > len - AGOQ_FRAME_HEADER_SIZE) return AGOQ_CODEC_ECORRUPT;
  /* Valid so far; the payload CRC cannot be checked here. */
  if (flags & AGOQ_FRAME_FLAG_PAYLOAD_CRC) return AGOQ_CODEC_EARG;
  return AGOQ_CODEC_OK;
}

int frame_decode_impl(const void* header, const void* frame, size_t len, int out, void* dst,
                      size_t dst_count, void* workspace, agoq_cuda_codec_result* result,
                      cudaStream_t st) {
  if (frame == nullptr || (dst == nullptr && dst_count != 0)) return AGOQ_CODEC_EARG;
  agoq_codec_params p;
  uint64_t count, payload_len;
  uint32_t escaped;
  int rc = frame_header_check(header, len, &p, &count, &payload_len, &escaped);
  if (rc != AGOQ_CODEC_OK) return rc;
  if (count != (uint64_t)dst_count) return AGOQ_CODEC_ECORRUPT;
  const uint8_t* body = static_cast<const uint8_t*>(frame) + AGOQ_FRAME_HEADER_SIZE;
  /* The payload length matches the header's escaped count (checked above), so the count the
   * device compares the bitmap with is the header's, as in agoq_frame_parse. */
  return decode_impl(&p, body, (size_t)payload_len, dst_count, out, dst, workspace, result, st,
                     true);
}

/* ---- batches (host) -------------------------------------------------------------------------- */

/* An item's share of a batch's workspace: the scan's prefix, counts and status for its ranges. */
size_t batch_ws_bytes(uint32_t ranges) {
  return ((size_t)8 * (ranges + 1) + (size_t)4 * ranges + 4 + 15) & ~(size_t)15;
}

/* Where a batch's table and workspace are being filled. */
struct BatchBuild {
  const agoq_cuda_batch_mem* mem;
  BatchEntry* host;
  size_t k;
  uint8_t* ws_next;
  size_t ws_left;
  uint32_t max_ranges, max_quant, max_decode;
  bool any_escaped;
};

int batch_begin(BatchBuild* b, const agoq_codec_params* p, size_t k, const agoq_cuda_batch_mem* mem,
                const agoq_cuda_codec_result* results) {
  if (!params_ok(p) || p->format == AGOQ_FORMAT_NONE || k == 0 || k > AGOQ_CUDA_BATCH_MAX_ITEMS || mem == nullptr ||
      results == nullptr || mem->table_host == nullptr || mem->table_dev == nullptr ||
      mem->table_cap < k * sizeof(BatchEntry) || !aligned(mem->table_host, alignof(BatchEntry)) ||
      !aligned(mem->table_dev, alignof(BatchEntry)) || mem->workspace == nullptr || !aligned(mem->workspace, 16))
    return AGOQ_CODEC_EARG;
  memset(b, 0, sizeof *b);
  b->mem = mem;
  b->host = static_cast<BatchEntry*>(mem->table_host);
  b->k = k;
  b->ws_next = static_cast<uint8_t*>(mem->workspace);
  b->ws_left = mem->workspace_cap;
  return AGOQ_CODEC_OK;
}

/* Item i's entry (its layout in e->scan.L), with its workspace share, into the pinned table. */
int batch_put(BatchBuild* b, size_t i, BatchEntry* e) {
  const size_t need = batch_ws_bytes(e->scan.L.ranges);
  if (need > b->ws_left) return AGOQ_CODEC_EARG;
  uint8_t* w = b->ws_next;
  e->scan.ws.prefix = reinterpret_cast<unsigned long long*>(w);
  e->scan.ws.count = reinterpret_cast<uint32_t*>(w + (size_t)8 * (e->scan.L.ranges + 1));
  e->scan.ws.status = reinterpret_cast<uint32_t*>(w + (size_t)8 * (e->scan.L.ranges + 1) + (size_t)4 * e->scan.L.ranges);
  b->ws_next += need;
  b->ws_left -= need;
  b->max_ranges = std::max(b->max_ranges, e->scan.L.ranges);
  b->max_quant = std::max(b->max_quant, e->quant_ctas);
  b->max_decode = std::max(b->max_decode, e->decode_ctas);
  b->any_escaped = b->any_escaped || e->scan.expected != 0;
#if defined(AGOQ_CUDA_EMULATION)
  bool ok = true;
  agoq_emu_rebase(*e, ok);
  if (!ok) return cuda_failed(cudaErrorInvalidDevicePointer);
#endif
  memcpy(&b->host[i], e, sizeof *e);
  return AGOQ_CODEC_OK;
}

/* The table into device memory, ahead of the kernels on the stream. */
int batch_copy(const BatchBuild* b, cudaStream_t st) {
  cudaError_t e = cudaMemcpyAsync(b->mem->table_dev, b->mem->table_host, b->k * sizeof(BatchEntry),
                                  cudaMemcpyHostToDevice, st);
  return e == cudaSuccess ? AGOQ_CODEC_OK : cuda_failed(e);
}

const BatchEntry* batch_table(const BatchBuild* b) { return static_cast<const BatchEntry*>(b->mem->table_dev); }

/* A decode item's entry, into dst (its own, or its sum's accumulator): the checks and layout
 * of decode_impl. */
int batch_decode_entry(const agoq_codec_params* p, const agoq_cuda_decode_item* it, int out, void* dst,
                       agoq_cuda_codec_result* result, BatchEntry* e) {
  const size_t osize = out == kOutAcc ? 4 : agoq_dtype_size((agoq_dtype)out);
  if ((it->body == nullptr && it->body_len != 0) || !aligned(it->body, 4) || it->n > kMaxCount ||
      (dst == nullptr && it->n != 0) || !aligned(dst, osize))
    return AGOQ_CODEC_EARG;
  memset(e, 0, sizeof *e);
  Layout& L = e->scan.L;
  if (!layout_init(&L, p, it->n, it->body)) return AGOQ_CODEC_EARG;
  if (it->body_len < L.head || (it->body_len - L.head) % L.raw_block != 0 ||
      (it->body_len - L.head) / L.raw_block > L.nb)
    return AGOQ_CODEC_ECORRUPT;
  e->scan.result = result;
  e->scan.mode = kModeDecode;
  e->scan.expected = (it->body_len - L.head) / L.raw_block;
  e->dst = dst;
  e->codes8 = aligned(L.body + L.codes_off, 8);
  e->dst_vec = aligned(dst, 16);
  const uint64_t per_cta = (uint64_t)kThreads * kDecodeChunks * 8;
  e->decode_ctas = (uint32_t)((it->n + per_cta - 1) / per_cta);
  return AGOQ_CODEC_OK;
}

/* The escape scans of a batch: counts (for a decode, the bitmap checked against each body's
 * length), then each item's prefix, status and result (and an encode's frame header). */
void batch_scan(const BatchBuild* b, cudaStream_t st) {
  if (b->max_ranges != 0) launch_2d(kern<count_batch_kernel>(), b->max_ranges, (unsigned)b->k, kThreads, st, batch_table(b), 0);
  launch_2d(kern<scan_batch_kernel>(), 1, (unsigned)b->k, kScanThreads, st, batch_table(b));
}

int encode_batch_impl(const agoq_codec_params* p, const agoq_cuda_encode_item* items, size_t k,
                      const agoq_cuda_batch_mem* mem, agoq_cuda_codec_result* results, cudaStream_t st) {
  BatchBuild b;
  if (items == nullptr) return AGOQ_CODEC_EARG;
  int rc = batch_begin(&b, p, k, mem, results);
  if (rc != AGOQ_CODEC_OK) return rc;
  const QuantKernel q = quantize_kernel_for(p);
  for (size_t i = 0; i < k; i++) {
    const agoq_cuda_encode_item& it = items[i];
    /* quantize_impl's and agoq_cuda_frame_encode's checks, in their order. */
    if (it.n > AGOQ_FRAME_MAX_COUNT) return AGOQ_CODEC_EARG;
    if (it.frame == nullptr || it.cap < AGOQ_FRAME_HEADER_SIZE) return AGOQ_CODEC_ESPACE;
    uint8_t* header = static_cast<uint8_t*>(it.frame);
    uint8_t* body = header + AGOQ_FRAME_HEADER_SIZE;
    if ((it.src == nullptr && it.n != 0) || !aligned(it.src, agoq_dtype_size(p->dtype)) || !aligned(body, 4))
      return AGOQ_CODEC_EARG;
    BatchEntry e;
    memset(&e, 0, sizeof e);
    if (!layout_init(&e.scan.L, p, it.n, body)) return AGOQ_CODEC_EARG;
    const size_t cap = it.cap - AGOQ_FRAME_HEADER_SIZE;
    if (cap < e.scan.L.head) return AGOQ_CODEC_ESPACE;
    e.scan.result = &results[i];
    e.scan.mode = kModeQuantize;
    e.scan.cap = cap;
    e.scan.header = header;
    e.scan.header_format = (uint8_t)p->format;
    e.scan.header_dtype = (uint8_t)p->dtype;
    e.scan.header_flags = p->stochastic ? AGOQ_FRAME_FLAG_STOCHASTIC : 0u;
    e.scan.header_block = p->block;
    e.src = static_cast<const uint8_t*>(it.src);
    e.seed = p->seed;
    e.first_index = p->first_index;
    e.src_vec = aligned(it.src, 16);
    e.codes8 = aligned(body + e.scan.L.codes_off, 8);
    e.quant_ctas = (uint32_t)((e.scan.L.nb + q.blocks_per_cta - 1) / q.blocks_per_cta);
    rc = batch_put(&b, i, &e);
    if (rc != AGOQ_CODEC_OK) return rc;
  }
  rc = batch_copy(&b, st);
  if (rc != AGOQ_CODEC_OK) return rc;
  const unsigned ky = (unsigned)k;
  if (b.max_quant != 0) launch_2d(q.batch, b.max_quant, ky, kThreads, st, batch_table(&b));
  batch_scan(&b, st); /* an empty item (no ranges) gets its header and result from the scan alone */
  if (b.max_ranges != 0) launch_2d(kern<raw_copy_batch_kernel>(), b.max_ranges, ky, kThreads, st, batch_table(&b));
  return launched();
}

int decode_batch_impl(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k, int out,
                      const agoq_cuda_batch_mem* mem, agoq_cuda_codec_result* results, cudaStream_t st) {
  BatchBuild b;
  if (items == nullptr) return AGOQ_CODEC_EARG;
  int rc = batch_begin(&b, p, k, mem, results);
  if (rc != AGOQ_CODEC_OK) return rc;
  for (size_t i = 0; i < k; i++) {
    BatchEntry e;
    rc = batch_decode_entry(p, &items[i], out, items[i].dst, &results[i], &e);
    if (rc == AGOQ_CODEC_OK) rc = batch_put(&b, i, &e);
    if (rc != AGOQ_CODEC_OK) return rc;
  }
  rc = batch_copy(&b, st);
  if (rc != AGOQ_CODEC_OK) return rc;
  batch_scan(&b, st);
  if (b.max_decode != 0)
    launch_2d(decode_kernel_for<true>(p->format, out), b.max_decode, (unsigned)k, kThreads, st, batch_table(&b));
  if (b.any_escaped)
    launch_2d(raw_decode_kernel_for<true>(out), b.max_ranges, (unsigned)k, kThreads, st, batch_table(&b));
  return launched();
}

int sum_batch_impl(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k,
                   const agoq_cuda_sum_group* groups, size_t ngroups, const agoq_cuda_batch_mem* mem,
                   agoq_cuda_codec_result* results, cudaStream_t st) {
  BatchBuild b;
  if (items == nullptr || groups == nullptr || k == 0 || ngroups == 0 || ngroups > AGOQ_CUDA_BATCH_MAX_ITEMS ||
      k > AGOQ_CUDA_BATCH_MAX_ITEMS / ngroups)
    return AGOQ_CODEC_EARG;
  int rc = batch_begin(&b, p, k * ngroups, mem, results);
  if (rc != AGOQ_CODEC_OK) return rc;
  for (size_t g = 0; g < ngroups; g++) {
    const size_t n = groups[g].n;
    float* acc = groups[g].acc;
    if (n > kMaxCount) return AGOQ_CODEC_EARG;
    for (size_t j = 0; j < k; j++) {
      const size_t i = g * k + j;
      if (items[i].n != n) return AGOQ_CODEC_EARG;
      BatchEntry e;
      /* Every item of a sum names its accumulator (the kernel reads the first's). */
      rc = batch_decode_entry(p, &items[i], kOutAcc, acc, &results[i], &e);
      if (rc == AGOQ_CODEC_OK) rc = batch_put(&b, i, &e);
      if (rc != AGOQ_CODEC_OK) return rc;
    }
  }
  rc = batch_copy(&b, st);
  if (rc != AGOQ_CODEC_OK) return rc;
  batch_scan(&b, st);
  if (b.max_decode != 0)
    launch_2d(sum_kernel_for(p->format), b.max_decode, (unsigned)ngroups, kThreads, st, batch_table(&b), (uint32_t)k);
  return launched();
}

}  // namespace
}  // namespace agoq_cuda

using namespace agoq_cuda;

extern "C" int agoq_cuda_quantize(const agoq_codec_params* p, const void* src, size_t n, void* body,
                                  size_t cap, void* workspace, agoq_cuda_codec_result* result,
                                  void* stream) {
  return quantize_impl(p, src, n, body, cap, workspace, result, static_cast<cudaStream_t>(stream),
                       nullptr);
}

extern "C" int agoq_cuda_dequantize(const agoq_codec_params* p, const void* body, size_t body_len,
                                    size_t n, agoq_dtype out, void* dst, void* workspace,
                                    agoq_cuda_codec_result* result, void* stream) {
  if ((unsigned)out >= AGOQ_DTYPE_COUNT) return AGOQ_CODEC_EARG;
  return decode_impl(p, body, body_len, n, (int)out, dst, workspace, result,
                     static_cast<cudaStream_t>(stream), false);
}

extern "C" int agoq_cuda_dequantize_accumulate(const agoq_codec_params* p, const void* body,
                                               size_t body_len, size_t n, float* acc, void* workspace,
                                               agoq_cuda_codec_result* result, void* stream) {
  return decode_impl(p, body, body_len, n, kOutAcc, acc, workspace, result,
                     static_cast<cudaStream_t>(stream), false);
}

extern "C" int agoq_cuda_frame_encode(const agoq_codec_params* p, const void* src, size_t n,
                                      void* frame, size_t cap, void* workspace,
                                      agoq_cuda_codec_result* result, void* stream) {
  if (!params_ok(p) || n > AGOQ_FRAME_MAX_COUNT) return AGOQ_CODEC_EARG;
  if (frame == nullptr || cap < AGOQ_FRAME_HEADER_SIZE) return AGOQ_CODEC_ESPACE;
  uint8_t* h = static_cast<uint8_t*>(frame);
  return quantize_impl(p, src, n, h + AGOQ_FRAME_HEADER_SIZE, cap - AGOQ_FRAME_HEADER_SIZE,
                       workspace, result, static_cast<cudaStream_t>(stream), h);
}

extern "C" int agoq_cuda_frame_decode(const void* header, const void* frame, size_t len,
                                      agoq_dtype out, void* dst, size_t dst_count, void* workspace,
                                      agoq_cuda_codec_result* result, void* stream) {
  if ((unsigned)out >= AGOQ_DTYPE_COUNT) return AGOQ_CODEC_EARG;
  return frame_decode_impl(header, frame, len, (int)out, dst, dst_count, workspace, result,
                           static_cast<cudaStream_t>(stream));
}

extern "C" int agoq_cuda_frame_decode_accumulate(const void* header, const void* frame, size_t len,
                                                 float* acc, size_t acc_count, void* workspace,
                                                 agoq_cuda_codec_result* result, void* stream) {
  return frame_decode_impl(header, frame, len, kOutAcc, acc, acc_count, workspace, result,
                           static_cast<cudaStream_t>(stream));
}

extern "C" size_t agoq_cuda_batch_table_size(size_t items) { return items * sizeof(BatchEntry); }

extern "C" size_t agoq_cuda_batch_workspace_size(const agoq_codec_params* p, size_t items, size_t max_n) {
  /* An item of n elements has ceil(ceil(n / block) / 64) bitmap words and at most kRangesMax
   * ranges of them; fewer elements never need more. */
  const size_t block = p != nullptr && p->block != 0 ? p->block : 1;
  const size_t words = ((max_n + block - 1) / block + 63) / 64;
  const uint32_t ranges = (uint32_t)std::min<size_t>(words, kRangesMax);
  return items * batch_ws_bytes(ranges);
}

extern "C" int agoq_cuda_frame_encode_batch(const agoq_codec_params* p, const agoq_cuda_encode_item* items, size_t k,
                                            const agoq_cuda_batch_mem* mem, agoq_cuda_codec_result* results,
                                            void* stream) {
  return encode_batch_impl(p, items, k, mem, results, static_cast<cudaStream_t>(stream));
}

extern "C" int agoq_cuda_dequantize_batch(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k,
                                          agoq_dtype out, const agoq_cuda_batch_mem* mem,
                                          agoq_cuda_codec_result* results, void* stream) {
  if ((unsigned)out >= AGOQ_DTYPE_COUNT) return AGOQ_CODEC_EARG;
  return decode_batch_impl(p, items, k, (int)out, mem, results, static_cast<cudaStream_t>(stream));
}

extern "C" int agoq_cuda_dequantize_sum(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k,
                                        size_t n, float* acc, const agoq_cuda_batch_mem* mem,
                                        agoq_cuda_codec_result* results, void* stream) {
  const agoq_cuda_sum_group one = {.n = n, .acc = acc};
  return sum_batch_impl(p, items, k, &one, 1, mem, results, static_cast<cudaStream_t>(stream));
}

extern "C" int agoq_cuda_dequantize_sums(const agoq_codec_params* p, const agoq_cuda_decode_item* items, size_t k,
                                         const agoq_cuda_sum_group* groups, size_t ngroups,
                                         const agoq_cuda_batch_mem* mem, agoq_cuda_codec_result* results,
                                         void* stream) {
  return sum_batch_impl(p, items, k, groups, ngroups, mem, results, static_cast<cudaStream_t>(stream));
}

/* A grid-stride launch over n elements: at most 65536 CTAs. */
static unsigned elementwise_grid(size_t n) {
  const uint64_t blocks = (n + kThreads - 1) / kThreads;
  return (unsigned)(blocks < 65536 ? blocks : 65536);
}

extern "C" int agoq_cuda_overflow_to_inf(agoq_dtype out, float* acc, size_t n, void* stream) {
  if ((unsigned)out >= AGOQ_DTYPE_COUNT || (acc == nullptr && n != 0) || !aligned(acc, 4) || n > kMaxCount)
    return AGOQ_CODEC_EARG;
  if (out == AGOQ_DTYPE_FP32 || n == 0) return AGOQ_CODEC_OK; /* fp32 overflows by itself */
  const uint32_t from = out == AGOQ_DTYPE_BF16 ? kBf16InfFromBits : kFp16InfFromBits;
  launch(kern<overflow_inf_kernel>(), elementwise_grid(n), kThreads, static_cast<cudaStream_t>(stream), acc, n, from);
  return launched();
}

extern "C" int agoq_cuda_narrow_fp32(agoq_dtype out, const float* acc, size_t n, void* dst, void* stream) {
  if ((unsigned)out >= AGOQ_DTYPE_COUNT || ((acc == nullptr || dst == nullptr) && n != 0) || !aligned(acc, 4) ||
      !aligned(dst, agoq_dtype_size(out)) || n > kMaxCount)
    return AGOQ_CODEC_EARG;
  if (n == 0) return AGOQ_CODEC_OK;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const unsigned grid = elementwise_grid(n);
  launch(narrow_kernel_for(out), grid, kThreads, st, acc, n, dst);
  return launched();
}

extern "C" int agoq_cuda_codec_last_error(void) { return g_last_error; }

extern "C" const char* agoq_cuda_codec_last_error_string(void) {
  return cudaGetErrorName(static_cast<cudaError_t>(g_last_error));
}

/* Lazy loading (the CUDA Programming Guide, "Lazy Loading": the default since CUDA 12.2 on
 * Linux) loads a kernel at its first launch, and that load may need the context to
 * synchronise: launched from NCCL's proxy thread while NCCL's kernel waits for this codec's
 * output, it waits for that kernel, which waits for it (the guide's "Potential Hazards",
 * concurrent execution; seen on an H200 with nccl-tests through CollNet). The guide's remedy
 * is to load every kernel that may run concurrently beforehand; cudaFuncGetAttributes forces
 * the load of the kernel it names on the current device, launching nothing (NCCL loads its
 * own kernels the same way, ncclInitKernelsForDevice in enqueue.cc). */
extern "C" int agoq_cuda_codec_load_all(size_t* loaded, const char** failed) {
  /* Each kernel once (a selector returns one kernel for several parameters); were there more
   * than this, the extra ones would only be asked for again. */
  const void* done[512];
  size_t ndone = 0;
  const char* bad = nullptr;
  cudaError_t err = cudaSuccess;
  for_each_kernel([&](auto k) {
    const void* fn = reinterpret_cast<const void*>(k.fn);
    if (err != cudaSuccess || std::find(done, done + ndone, fn) != done + ndone) return;
    cudaFuncAttributes attr;
    err = cudaFuncGetAttributes(&attr, fn);
    if (err != cudaSuccess) bad = k.name;
    else if (ndone < sizeof done / sizeof done[0]) done[ndone++] = fn;
  });
  if (loaded != nullptr) *loaded = ndone;
  if (failed != nullptr) *failed = bad;
  return err == cudaSuccess ? AGOQ_CODEC_OK : cuda_failed(err);
}
