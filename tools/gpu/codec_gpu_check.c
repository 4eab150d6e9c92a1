/*
 * codec_gpu_check: the CUDA codec (kernels/cuda/agoq_codec_cuda.h) against the CPU codec
 * (kernels/agoq_codec.h), bit for bit, then its throughput on 1 GiB next to a device-to-device
 * copy measured in the same run.
 *
 * Identity: every format x dtype x a spread of block sizes and lengths (0, 1, tails, 10^6 + 3),
 * on data with NaN/Inf blocks, zeros, denormals, values at the dtype's maximum, exact rounding
 * ties, arbitrary bit patterns, with stochastic rounding for the int formats, and on
 * misaligned buffers. For each case the GPU body (length, escaped count, every byte, nothing
 * written past it), the decoded outputs in all three dtypes, decode-accumulate, and the
 * frame (encode and decode) are compared with the CPU's. Then corrupt inputs: a bitmap that
 * disagrees with the body length, a bit past the last block, a body length that fits no
 * escape count, a frame with a bad scale, a body too small for its escaped blocks, random
 * body bytes (fp8 NaN codes, NaN scales). Batches (agoq_cuda_frame_encode_batch,
 * agoq_cuda_dequantize_batch, agoq_cuda_dequantize_sum) against the single calls they stand
 * for, byte for byte, on items of every length at uneven offsets, a corrupt body in a sum, and
 * the refusals the host makes.
 *
 * Throughput: bf16 -> int8, block 128, 1 GiB of input: quantize (GB/s of input) and
 * dequantize to bf16 (GB/s of output), next to cudaMemcpy device-to-device of 1 GiB (GB/s
 * copied), best of three rounds; the 1 GiB body and its decode are also checked against the
 * multi-threaded CPU codec.
 *
 * usage: codec_gpu_check [--quick] [--no-perf] [--perf-only] [--perf-mib N] [--max-n N]
 *                        [--ranges-n N] [--perf-iters N] [-v]
 * Exit status: 0 identical, 1 a mismatch or a CUDA error, 2 usage, 77 no usable GPU.
 */
#include <cuda_runtime_api.h>

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agoq_args.h"
#include "agoq_codec.h"
#include "agoq_codec_cuda.h"
#include "agoq_cuda_probe.h"
#include "agoq_frame.h"

#define EXIT_MISMATCH 1
#define EXIT_USAGE 2
#define EXIT_NO_GPU 77

#define GUARD 64             /* bytes checked past every output */
/* The largest length of the identity matrix (10^6 + 3), and the length of the cases with
 * more than kRangesMax bitmap words (several words per range in the escape scan and copy):
 * B = 32 needs n > 2^21 for that. */
static size_t max_n = 1000000 + 3;
static size_t ranges_n = 3 * (1u << 20) + 77;
/* Lengths of the corrupt-input cases (check_corrupt). */
#define CORRUPT_N (64 * 200 + 17)
#define RANDOM_BODY_N (32 * 300 + 5)
static size_t case_n_max(void) {
  size_t m = max_n > ranges_n ? max_n : ranges_n;
  return m > CORRUPT_N ? m : CORRUPT_N; /* CORRUPT_N > RANDOM_BODY_N */
}
#define PERF_TARGET 0.80     /* issue 3: >= 80% of the device-to-device copy */

static bool verbose;
static int perf_iters = 10;
static long cases, mismatches;

/* ---- CUDA calls: any failure is a failed check -------------------------------------------- */

static void cuda_ok(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "codec_gpu_check:%d: %s: %s (%s)\n", line, what, cudaGetErrorName(e),
          cudaGetErrorString(e));
  exit(EXIT_MISMATCH);
}
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)

static void codec_ok(int rc, const char* what, int line) {
  if (rc == AGOQ_CODEC_OK) return;
  if (rc == AGOQ_CUDA_CODEC_ECUDA)
    fprintf(stderr, "codec_gpu_check:%d: %s: CUDA error %s\n", line, what,
            agoq_cuda_codec_last_error_string());
  else
    fprintf(stderr, "codec_gpu_check:%d: %s: %s\n", line, what,
            agoq_codec_status_str((agoq_codec_status)rc));
  exit(EXIT_MISMATCH);
}
#define CODEC_OK(call) codec_ok((call), #call, __LINE__)

static void* host_alloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "codec_gpu_check: out of host memory (%zu bytes)\n", bytes);
    exit(EXIT_MISMATCH);
  }
  return p;
}

/* ---- data ------------------------------------------------------------------------------------ */

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static uint32_t rnd32(void) { return (uint32_t)(rnd64() >> 32); }

static float rnd_normal(void) {
  double u1 = ((double)(rnd64() >> 11) + 1.0) * 0x1p-53, u2 = (double)(rnd64() >> 11) * 0x1p-53;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float f32_from(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Test data is made as fp32 and narrowed by truncation: exact for the values chosen below,
 * and any bit pattern is a legitimate input anyway. */
static uint32_t narrow(agoq_dtype t, float f) {
  uint32_t u = f32_bits(f);
  if (t == AGOQ_DTYPE_FP32) return u;
  if (t == AGOQ_DTYPE_BF16) return u >> 16;
  /* fp16 by value for normal range, saturating at the top. */
  uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return s | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x1ffu) : 0u);
  if (a >= 0x477fe000u) return s | 0x7bffu;
  if (a < 0x38800000u) { /* subnormal or zero: truncate */
    float m = f32_from(a) * 0x1p24f;
    return s | (uint32_t)m;
  }
  return s | ((a - 0x38000000u) >> 13);
}

static void put_elem(void* buf, agoq_dtype t, size_t i, uint32_t bits) {
  if (t == AGOQ_DTYPE_FP32)
    ((uint32_t*)buf)[i] = bits;
  else
    ((uint16_t*)buf)[i] = (uint16_t)bits;
}

enum {
  PAT_NORMAL,    /* N(0,1) times a per-block power of two */
  PAT_ESCAPES,   /* like NORMAL, some blocks with a NaN (several payloads) or an Inf */
  PAT_ZEROS,     /* +0 / -0 */
  PAT_DENORMAL,  /* the dtype's subnormals, alone and mixed with normals */
  PAT_MAXVAL,    /* values at and near the dtype's largest finite value */
  PAT_TIES,      /* exact half-integers of the int scale: round-half-even ties */
  PAT_BITS,      /* arbitrary bit patterns */
  PAT_COUNT
};
static const char* const pattern_names[PAT_COUNT] = {"normal", "escapes", "zeros", "denormal",
                                                     "maxval", "ties", "bits"};

static void fill_pattern(void* buf, agoq_dtype t, size_t n, uint32_t block, int pat,
                         agoq_format f) {
  const uint32_t b = block ? block : 128;
  float shift = 1.0f;
  for (size_t i = 0; i < n; i++) {
    if (i % b == 0) shift = ldexpf(1.0f, (int)(rnd32() % 41) - 20);
    uint32_t bits;
    switch (pat) {
      case PAT_NORMAL: bits = narrow(t, rnd_normal() * shift); break;
      case PAT_ESCAPES: {
        bits = narrow(t, rnd_normal() * shift);
        if (rnd32() % (2 * b) == 0) {
          static const uint32_t nan32[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,
                                           0x7fbfffffu, 0x7f800000u, 0xff800000u};
          static const uint32_t nan16[] = {0x7fc0u, 0xffc1u, 0x7f81u, 0x7f80u, 0xff80u};
          static const uint32_t nanh[] = {0x7e00u, 0xfe01u, 0x7c01u, 0x7c00u, 0xfc00u, 0x7fffu};
          if (t == AGOQ_DTYPE_FP32) bits = nan32[rnd32() % 7];
          else if (t == AGOQ_DTYPE_BF16) bits = nan16[rnd32() % 5];
          else bits = nanh[rnd32() % 6];
        }
        break;
      }
      case PAT_ZEROS: bits = (rnd32() & 1) ? (t == AGOQ_DTYPE_FP32 ? 0x80000000u : 0x8000u) : 0; break;
      case PAT_DENORMAL: {
        uint32_t mant_bits = t == AGOQ_DTYPE_FP32 ? 23 : t == AGOQ_DTYPE_BF16 ? 7 : 10;
        uint32_t sign = (rnd32() & 1) << (t == AGOQ_DTYPE_FP32 ? 31 : 15);
        bits = sign | (rnd32() & ((1u << mant_bits) - 1));
        if ((i / b) % 3 == 2 && rnd32() % 4 == 0) bits = narrow(t, rnd_normal() * 1e-3f);
        break;
      }
      case PAT_MAXVAL: {
        uint32_t maxb = t == AGOQ_DTYPE_FP32 ? 0x7f7fffffu : t == AGOQ_DTYPE_BF16 ? 0x7f7fu : 0x7bffu;
        uint32_t sign = (rnd32() & 1) << (t == AGOQ_DTYPE_FP32 ? 31 : 15);
        bits = sign | (maxb - (rnd32() % 4 == 0 ? rnd32() % 64 : 0));
        break;
      }
      case PAT_TIES: {
        /* Block amax = M * 2^e, others (k/2) * 2^e: x / s hits exact halves. */
        float m = f == AGOQ_FORMAT_INT4 ? 7.0f : 127.0f;
        int32_t k = (int32_t)(rnd32() % (uint32_t)(4 * m + 1)) - (int32_t)(2 * m);
        float v = i % b == 0 ? m : (float)k * 0.5f;
        bits = narrow(t, v * shift);
        break;
      }
      default:
        bits = t == AGOQ_DTYPE_FP32 ? rnd32() : (rnd32() & 0xffffu);
        /* Mostly finite, so that not every block escapes. */
        if (rnd32() % 8 != 0) bits &= t == AGOQ_DTYPE_FP32 ? 0xbf7fffffu : 0xbf7fu;
        break;
    }
    put_elem(buf, t, i, bits);
  }
}

/* fp32 accumulators: normals, +-0, +-Inf, large values (no NaN: x86 and the codec pick the
 * first of two NaN operands, which depends on operand order). */
static void fill_acc(float* acc, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t r = rnd32() % 64;
    if (r == 0) acc[i] = 0.0f;
    else if (r == 1) acc[i] = -0.0f;
    else if (r == 2) acc[i] = f32_from(0x7f800000u);
    else if (r == 3) acc[i] = f32_from(0xff800000u);
    else if (r == 4) acc[i] = f32_from(0x7f7fffffu);
    else acc[i] = rnd_normal();
  }
}

/* ---- buffers ----------------------------------------------------------------------------------- */

typedef struct {
  size_t cap_body;  /* bytes of every body / frame buffer */
  uint8_t *hsrc, *hbody, *hbody2, *hdst, *hdst2, *hacc, *hacc2;
  uint8_t *dsrc, *dbody, *ddst;
  void* ws;
  agoq_cuda_codec_result* res; /* pinned host memory the device writes */
} bufs;

static void bufs_init(bufs* B) {
  /* The largest frame of any case, plus room for the offsets and guards. */
  B->cap_body = 0;
  for (int f = 0; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP32, .block = 32};
    size_t s = agoq_frame_size_max(&p, case_n_max());
    if (s > B->cap_body) B->cap_body = s;
  }
  B->cap_body += 4096;
  const size_t data = case_n_max() * 4 + 4096;
  B->hsrc = host_alloc(data);
  B->hbody = host_alloc(B->cap_body);
  B->hbody2 = host_alloc(B->cap_body);
  B->hdst = host_alloc(data);
  B->hdst2 = host_alloc(data);
  B->hacc = host_alloc(data);
  B->hacc2 = host_alloc(data);
  CUDA_OK(cudaMalloc((void**)&B->dsrc, data));
  CUDA_OK(cudaMalloc((void**)&B->dbody, B->cap_body));
  CUDA_OK(cudaMalloc((void**)&B->ddst, data));
  CUDA_OK(cudaMalloc(&B->ws, AGOQ_CUDA_CODEC_WORKSPACE_SIZE));
  CUDA_OK(cudaMallocHost((void**)&B->res, sizeof *B->res));
}

static void bufs_free(bufs* B) {
  free(B->hsrc);
  free(B->hbody);
  free(B->hbody2);
  free(B->hdst);
  free(B->hdst2);
  free(B->hacc);
  free(B->hacc2);
  cudaFree(B->dsrc);
  cudaFree(B->dbody);
  cudaFree(B->ddst);
  cudaFree(B->ws);
  cudaFreeHost(B->res);
}

/* ---- one case ------------------------------------------------------------------------------------ */

typedef struct {
  agoq_codec_params p;
  size_t n;
  int pattern;
  size_t src_off;  /* elements: 1 makes src not 16-byte aligned */
  size_t body_off; /* bytes, multiple of 4 */
  size_t dst_off;  /* elements */
} codec_case;

static void describe(const codec_case* k, char* buf, size_t len) {
  snprintf(buf, len, "%s/%s b%u n=%zu %s%s seed=%" PRIu64 " first=%" PRIu64 " off=%zu/%zu/%zu",
           agoq_format_name(k->p.format), agoq_dtype_name(k->p.dtype), k->p.block, k->n,
           pattern_names[k->pattern], k->p.stochastic ? " stochastic" : "", k->p.seed,
           k->p.first_index, k->src_off, k->body_off, k->dst_off);
}

static void mismatch(const codec_case* k, const char* what, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void mismatch(const codec_case* k, const char* what, const char* fmt, ...) {
  if (mismatches++ >= 25) return;
  char d[256];
  if (k) describe(k, d, sizeof d);
  else snprintf(d, sizeof d, "-");
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "MISMATCH [%s] %s: ", d, what);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* Compares len bytes plus GUARD bytes after them (both sides prefilled alike). */
static bool same_bytes(const codec_case* k, const char* what, const uint8_t* cpu, const uint8_t* gpu,
                       size_t len) {
  if (memcmp(cpu, gpu, len + GUARD) == 0) return true;
  size_t i = 0;
  while (cpu[i] == gpu[i]) i++;
  if (i >= len)
    mismatch(k, what, "GPU wrote past the end: byte %zu (of %zu) is 0x%02x, was 0x%02x", i, len, gpu[i],
             cpu[i]);
  else
    mismatch(k, what, "first difference at byte %zu of %zu: CPU 0x%02x, GPU 0x%02x", i, len, cpu[i],
             gpu[i]);
  return false;
}

static size_t osize(int out) { return out == 3 ? 4 : agoq_dtype_size((agoq_dtype)out); }

/* Decode body (host copy in B->hbody, length len) with the CPU and the GPU into every output
 * and into an accumulator; the GPU decodes its own copy at dbody + body_off. */
static void check_decodes(bufs* B, const codec_case* k, size_t len) {
  const size_t n = k->n;
  uint8_t* dbody = B->dbody + k->body_off;
  CUDA_OK(cudaMemcpy(dbody, B->hbody, len, cudaMemcpyHostToDevice));
  for (int out = 0; out <= 3; out++) {
    const size_t os = osize(out), bytes = n * os;
    uint8_t* ddst = B->ddst + k->dst_off * os;
    int fill = 0xc0 + out;
    memset(B->hdst, fill, bytes + GUARD);
    memset(B->hdst2, fill, bytes + GUARD);
    if (out == 3) {
      fill_acc((float*)B->hdst, n);
      memcpy(B->hdst2, B->hdst, bytes);
    }
    CUDA_OK(cudaMemcpy(ddst, B->hdst2, bytes + GUARD, cudaMemcpyHostToDevice));
    agoq_codec_status st =
        out == 3 ? agoq_dequantize_accumulate(&k->p, B->hbody, len, n, (float*)B->hdst)
                 : agoq_dequantize(&k->p, B->hbody, len, n, (agoq_dtype)out, B->hdst);
    B->res->status = 0xdead;
    int rc = out == 3 ? agoq_cuda_dequantize_accumulate(&k->p, dbody, len, n, (float*)ddst, B->ws,
                                                        B->res, NULL)
                      : agoq_cuda_dequantize(&k->p, dbody, len, n, (agoq_dtype)out, ddst, B->ws,
                                             B->res, NULL);
    CUDA_OK(cudaDeviceSynchronize());
    const char* what = out == 3 ? "dequantize_accumulate" : out == 0 ? "dequantize fp32"
                                                         : out == 1 ? "dequantize bf16"
                                                                    : "dequantize fp16";
    cases++;
    if (rc != (int)st || (st == AGOQ_CODEC_OK && B->res->status != AGOQ_CODEC_OK)) {
      mismatch(k, what, "status: CPU %d, GPU rc %d result %u", (int)st, rc, B->res->status);
      continue;
    }
    if (st != AGOQ_CODEC_OK) continue;
    CUDA_OK(cudaMemcpy(B->hdst2, ddst, bytes + GUARD, cudaMemcpyDeviceToHost));
    if (!same_bytes(k, what, B->hdst, B->hdst2, bytes) && verbose && os == 4) {
      for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, B->hdst + 4 * i, 4);
        memcpy(&b, B->hdst2 + 4 * i, 4);
        if (a != b) {
          fprintf(stderr, "  element %zu: CPU 0x%08x GPU 0x%08x\n", i, a, b);
          break;
        }
      }
    }
  }
}

static void check_frames(bufs* B, const codec_case* k, size_t flen_max) {
  const size_t n = k->n, es = agoq_dtype_size(k->p.dtype);
  uint8_t* dframe = B->dbody + k->body_off;
  size_t flen = 0;
  agoq_codec_status st = agoq_frame_encode(&k->p, B->hsrc, n, false, B->hbody, flen_max, &flen);
  if (st != AGOQ_CODEC_OK) {
    mismatch(k, "frame encode", "CPU failed: %s", agoq_codec_status_str(st));
    return;
  }
  memset(B->hbody2, 0x3c, flen + GUARD);
  CUDA_OK(cudaMemcpy(dframe, B->hbody2, flen + GUARD, cudaMemcpyHostToDevice));
  CODEC_OK(agoq_cuda_frame_encode(&k->p, B->dsrc + k->src_off * es, n, dframe, flen_max, B->ws,
                                  B->res, NULL));
  CUDA_OK(cudaDeviceSynchronize());
  cases++;
  if (B->res->status != AGOQ_CODEC_OK || B->res->body_len + AGOQ_FRAME_HEADER_SIZE != flen) {
    mismatch(k, "frame encode", "GPU status %u frame length %" PRIu64 ", CPU length %zu", B->res->status,
             B->res->body_len + AGOQ_FRAME_HEADER_SIZE, flen);
  } else {
    memset(B->hbody2, 0, flen + GUARD);
    CUDA_OK(cudaMemcpy(B->hbody2, dframe, flen + GUARD, cudaMemcpyDeviceToHost));
    memset(B->hbody + flen, 0x3c, GUARD);
    same_bytes(k, "frame encode", B->hbody, B->hbody2, flen);
  }
  /* Decode the CPU's frame on the GPU: as dtype, and accumulating. */
  CUDA_OK(cudaMemcpy(dframe, B->hbody, flen, cudaMemcpyHostToDevice));
  for (int acc = 0; acc <= 1; acc++) {
    const size_t os = acc ? 4 : es, bytes = n * os;
    memset(B->hdst, 0x77, bytes + GUARD);
    if (acc) fill_acc((float*)B->hdst, n);
    memcpy(B->hdst2, B->hdst, bytes + GUARD);
    CUDA_OK(cudaMemcpy(B->ddst, B->hdst2, bytes + GUARD, cudaMemcpyHostToDevice));
    st = acc ? agoq_frame_decode_accumulate(B->hbody, flen, (float*)B->hdst, n)
             : agoq_frame_decode(B->hbody, flen, k->p.dtype, B->hdst, n);
    int rc = acc ? agoq_cuda_frame_decode_accumulate(B->hbody, dframe, flen, (float*)B->ddst, n, B->ws,
                                                     B->res, NULL)
                 : agoq_cuda_frame_decode(B->hbody, dframe, flen, k->p.dtype, B->ddst, n, B->ws, B->res,
                                          NULL);
    CUDA_OK(cudaDeviceSynchronize());
    cases++;
    if (rc != (int)st || (st == AGOQ_CODEC_OK && B->res->status != AGOQ_CODEC_OK)) {
      mismatch(k, acc ? "frame decode_accumulate" : "frame decode", "status: CPU %d, GPU rc %d result %u",
               (int)st, rc, B->res->status);
      continue;
    }
    CUDA_OK(cudaMemcpy(B->hdst2, B->ddst, bytes + GUARD, cudaMemcpyDeviceToHost));
    same_bytes(k, acc ? "frame decode_accumulate" : "frame decode", B->hdst, B->hdst2, bytes);
  }
}

static void run_case(bufs* B, const codec_case* k, bool frames) {
  const size_t n = k->n, es = agoq_dtype_size(k->p.dtype);
  if (verbose) {
    char d[256];
    describe(k, d, sizeof d);
    printf("case %s\n", d);
  }
  fill_pattern(B->hsrc, k->p.dtype, n, k->p.block, k->pattern, k->p.format);
  CUDA_OK(cudaMemcpy(B->dsrc + k->src_off * es, B->hsrc, n * es, cudaMemcpyHostToDevice));

  /* Quantize on both; the GPU body buffer is prefilled so that unwritten bytes show. */
  const size_t cap = agoq_codec_body_size_max(&k->p, n);
  size_t len = 0, esc = 0;
  agoq_codec_status st = agoq_quantize(&k->p, B->hsrc, n, B->hbody, cap, &len, &esc);
  if (st != AGOQ_CODEC_OK) {
    mismatch(k, "quantize", "CPU failed: %s", agoq_codec_status_str(st));
    return;
  }
  const int fill = (cases & 1) ? 0xa5 : 0x5a;
  uint8_t* dbody = B->dbody + k->body_off;
  memset(B->hbody + len, fill, GUARD);
  CUDA_OK(cudaMemset(dbody, fill, len + GUARD));
  memset(B->res, 0xee, sizeof *B->res);
  CODEC_OK(agoq_cuda_quantize(&k->p, B->dsrc + k->src_off * es, n, dbody, cap, B->ws, B->res, NULL));
  CUDA_OK(cudaDeviceSynchronize());
  cases++;
  if (B->res->status != AGOQ_CODEC_OK || B->res->body_len != len || B->res->escaped_blocks != esc) {
    mismatch(k, "quantize", "GPU status %u length %" PRIu64 " escaped %" PRIu64 "; CPU length %zu escaped %zu",
             B->res->status, B->res->body_len, B->res->escaped_blocks, len, esc);
  } else {
    CUDA_OK(cudaMemcpy(B->hbody2, dbody, len + GUARD, cudaMemcpyDeviceToHost));
    same_bytes(k, "quantize", B->hbody, B->hbody2, len);
  }
  check_decodes(B, k, len);
  if (frames) check_frames(B, k, agoq_frame_size_max(&k->p, n));
}

/* ---- corrupt and unusual inputs ------------------------------------------------------------------- */

static void set_bit(uint8_t* body, size_t b) { body[b / 8] |= (uint8_t)(1u << (b % 8)); }

/* A decode the CPU refuses with ECORRUPT: the GPU reports it in result->status (or at once)
 * and leaves dst alone. */
static void expect_corrupt(bufs* B, const codec_case* k, const char* what, const uint8_t* body,
                           size_t len) {
  const size_t n = k->n, bytes = n * 4;
  cases++;
  agoq_codec_status st = agoq_dequantize(&k->p, body, len, n, AGOQ_DTYPE_FP32, B->hdst);
  if (st != AGOQ_CODEC_ECORRUPT) mismatch(k, what, "CPU returned %d, expected ECORRUPT", (int)st);
  CUDA_OK(cudaMemcpy(B->dbody + k->body_off, body, len, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(B->ddst, 0x6b, bytes + GUARD));
  B->res->status = 0xdead;
  int rc = agoq_cuda_dequantize(&k->p, B->dbody + k->body_off, len, n, AGOQ_DTYPE_FP32, B->ddst, B->ws,
                                B->res, NULL);
  CUDA_OK(cudaDeviceSynchronize());
  if (rc == AGOQ_CODEC_ECORRUPT) return;
  if (rc != AGOQ_CODEC_OK || B->res->status != AGOQ_CODEC_ECORRUPT) {
    mismatch(k, what, "GPU rc %d result %u, expected ECORRUPT", rc, B->res->status);
    return;
  }
  CUDA_OK(cudaMemcpy(B->hdst2, B->ddst, bytes + GUARD, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < bytes + GUARD; i++) {
    if (B->hdst2[i] != 0x6b) {
      mismatch(k, what, "GPU wrote byte %zu of dst for a corrupt body", i);
      return;
    }
  }
}

static void check_corrupt(bufs* B) {
  codec_case k = {.p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 64},
                  .n = CORRUPT_N, .pattern = PAT_ESCAPES};
  fill_pattern(B->hsrc, k.p.dtype, k.n, k.p.block, k.pattern, k.p.format);
  size_t cap = agoq_codec_body_size_max(&k.p, k.n), len, esc;
  CODEC_OK(agoq_quantize(&k.p, B->hsrc, k.n, B->hbody, cap, &len, &esc));
  const size_t nb = agoq_codec_nblocks(&k.p, k.n);
  if (esc == 0 || esc == nb) mismatch(&k, "corrupt setup", "expected some escaped blocks, got %zu", esc);

  /* 1. A bitmap bit set that the length does not account for. */
  memcpy(B->hbody2, B->hbody, len);
  for (size_t b = 0; b < nb; b++) {
    if (!((B->hbody2[b / 8] >> (b % 8)) & 1u)) {
      set_bit(B->hbody2, b);
      break;
    }
  }
  expect_corrupt(B, &k, "bitmap disagrees with length", B->hbody2, len);
  /* 2. A bit past the last block. */
  memcpy(B->hbody2, B->hbody, len);
  set_bit(B->hbody2, nb);
  expect_corrupt(B, &k, "bit past the last block", B->hbody2, len);
  /* 3. A length that fits no escape count, and one a block too short. */
  expect_corrupt(B, &k, "odd length", B->hbody, len - 1);
  expect_corrupt(B, &k, "short length", B->hbody, len - 64 * 2);

  /* 4. Capacity: room for no escaped block, one byte short of the body, exactly the body. */
  {
    CUDA_OK(cudaMemcpy(B->dsrc, B->hsrc, k.n * 2, cudaMemcpyHostToDevice));
    const size_t caps[] = {agoq_codec_body_size(&k.p, k.n, 0), len - 1, len};
    for (size_t i = 0; i < 3; i++) {
      const size_t c = caps[i];
      size_t l2 = 0;
      cases++;
      agoq_codec_status st = agoq_quantize(&k.p, B->hsrc, k.n, B->hbody2, c, &l2, NULL);
      CUDA_OK(cudaMemset(B->dbody, 0x11, c + GUARD));
      B->res->status = 0xdead;
      CODEC_OK(agoq_cuda_quantize(&k.p, B->dsrc, k.n, B->dbody, c, B->ws, B->res, NULL));
      CUDA_OK(cudaDeviceSynchronize());
      const agoq_codec_status want = i < 2 ? AGOQ_CODEC_ESPACE : AGOQ_CODEC_OK;
      if (st != want || B->res->status != (uint32_t)want)
        mismatch(&k, "quantize capacity", "cap %zu of %zu: CPU %d, GPU result %u, expected %d", c, len,
                 (int)st, B->res->status, (int)want);
      CUDA_OK(cudaMemcpy(B->hbody2, B->dbody + c, GUARD, cudaMemcpyDeviceToHost));
      for (int g = 0; g < GUARD; g++) {
        if (B->hbody2[g] != 0x11) {
          mismatch(&k, "quantize capacity", "cap %zu: GPU wrote past cap", c);
          break;
        }
      }
    }
  }

  /* 5. Frames: scales agoq_frame_parse refuses (NaN, Inf, negative, nonzero on an escaped
   * block), bad magic, a later version, a bad header CRC, a payload CRC. */
  {
    size_t flen;
    CODEC_OK(agoq_frame_encode(&k.p, B->hsrc, k.n, false, B->hbody, agoq_frame_size_max(&k.p, k.n), &flen));
    const size_t bitmap = (nb + 63) / 64 * 8;
    const uint8_t* bm = B->hbody + AGOQ_FRAME_HEADER_SIZE;
    size_t coded = 0, escaped_b = 0;
    while ((bm[coded / 8] >> (coded % 8)) & 1u) coded++;
    while (!((bm[escaped_b / 8] >> (escaped_b % 8)) & 1u)) escaped_b++;
    const struct {
      const char* what;
      size_t block;
      uint32_t bits;
    } bad_scales[] = {{"frame with a NaN scale", coded, 0x7fc00000u},
                      {"frame with an Inf scale", coded, 0x7f800000u},
                      {"frame with a negative scale", coded, 0xbf800000u},
                      {"frame with a scale on an escaped block", escaped_b, 0x3f800000u}};
    agoq_codec_status st;
    int rc;
    for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++) {
      memcpy(B->hbody2, B->hbody, flen);
      memcpy(B->hbody2 + AGOQ_FRAME_HEADER_SIZE + bitmap + 4 * bad_scales[i].block, &bad_scales[i].bits, 4);
      CUDA_OK(cudaMemcpy(B->dbody, B->hbody2, flen, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(B->ddst, 0x6b, k.n * 2 + GUARD));
      cases++;
      st = agoq_frame_decode(B->hbody2, flen, AGOQ_DTYPE_BF16, B->hdst, k.n);
      B->res->status = 0xdead;
      rc = agoq_cuda_frame_decode(B->hbody2, B->dbody, flen, AGOQ_DTYPE_BF16, B->ddst, k.n, B->ws, B->res,
                                  NULL);
      CUDA_OK(cudaDeviceSynchronize());
      if (st != AGOQ_CODEC_ECORRUPT || rc != AGOQ_CODEC_OK || B->res->status != AGOQ_CODEC_ECORRUPT)
        mismatch(&k, bad_scales[i].what, "CPU %d, GPU rc %d result %u, expected ECORRUPT", (int)st, rc,
                 B->res->status);
    }
    struct {
      const char* what;
      size_t off;
      uint8_t val;
      int want;
    } bad[] = {{"bad magic", 0, 0x42, AGOQ_CODEC_ECORRUPT},
               {"later version", 4, 2, AGOQ_CODEC_EVERSION},
               {"header CRC", 20, 0x01, AGOQ_CODEC_ECORRUPT}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      memcpy(B->hbody2, B->hbody, flen);
      B->hbody2[bad[i].off] ^= bad[i].val;
      cases++;
      st = agoq_frame_decode(B->hbody2, flen, AGOQ_DTYPE_BF16, B->hdst, k.n);
      rc = agoq_cuda_frame_decode(B->hbody2, B->dbody, flen, AGOQ_DTYPE_BF16, B->ddst, k.n, B->ws, B->res,
                                  NULL);
      if ((int)st != bad[i].want || rc != bad[i].want)
        mismatch(&k, bad[i].what, "CPU %d, GPU %d, expected %d", (int)st, rc, bad[i].want);
    }
    /* A payload CRC cannot be checked on the device: refused, not skipped. */
    CODEC_OK(agoq_frame_encode(&k.p, B->hsrc, k.n, true, B->hbody2, agoq_frame_size_max(&k.p, k.n), &flen));
    cases++;
    rc = agoq_cuda_frame_decode(B->hbody2, B->dbody, flen, AGOQ_DTYPE_BF16, B->ddst, k.n, B->ws, B->res, NULL);
    if (rc != AGOQ_CODEC_EARG) mismatch(&k, "frame with payload CRC", "GPU %d, expected EARG", rc);
  }

  /* 6. Bodies of random bytes with a clear bitmap: every code, NaN/Inf/negative scales. An
   * fp8 NaN code times a NaN scale is left out: x86 returns the first NaN operand, and which
   * one is first is the compiler's choice in the CPU codec. */
  for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++) {
    for (int t = 0; t < AGOQ_DTYPE_COUNT; t++) {
      codec_case r = {.p = {.format = (agoq_format)f, .dtype = (agoq_dtype)t, .block = 32},
                      .n = RANDOM_BODY_N, .pattern = PAT_BITS};
      size_t blen = agoq_codec_body_size(&r.p, r.n, 0), rnb = agoq_codec_nblocks(&r.p, r.n);
      for (size_t i = 0; i < blen; i++) B->hbody[i] = (uint8_t)rnd32();
      memset(B->hbody, 0, (rnb + 63) / 64 * 8);
      /* Some scales at the edges: NaN, Inf, -0, the largest finite, a subnormal. */
      static const uint32_t edge[] = {0x7fc00000u, 0xff812345u, 0x7f800000u, 0x80000000u,
                                      0x7f7fffffu, 0x00000001u, 0x3f800000u, 0xff800000u};
      const bool fp8 = f == AGOQ_FORMAT_FP8E4M3 || f == AGOQ_FORMAT_FP8E5M2;
      uint8_t* scales = B->hbody + (rnb + 63) / 64 * 8;
      for (size_t b = 0; b < rnb; b++) {
        uint32_t v;
        memcpy(&v, scales + 4 * b, 4);
        if (b < 8) v = edge[b];
        if (fp8 && (v & 0x7fffffffu) > 0x7f800000u) v &= 0xbfffffffu; /* finite */
        memcpy(scales + 4 * b, &v, 4);
      }
      check_decodes(B, &r, blen);
    }
  }
}

/* ---- a reduction owner's element-wise steps --------------------------------------------------------- */

/* agoq_cuda_overflow_to_inf and agoq_cuda_narrow_fp32 against the CPU's, on fp32 sums of every
 * kind (fill_acc) plus every magnitude around the bf16 and fp16 Inf thresholds and arbitrary
 * bit patterns (NaN payloads included: both sides only move bits), at lengths with tails and
 * at an offset of one element; nothing may be written past the n outputs. */
static void check_reduce_steps(bufs* B) {
  static const uint32_t edges[] = {0x7f7f7fffu, 0x7f7f8000u, 0x7f7f8001u, 0x7f7fffffu, 0x477fefffu, 0x477ff000u,
                                   0x477ff001u, 0x477fe000u, 0x7f800000u, 0x7fc00001u, 0x7f800001u, 0x00000001u};
  const size_t lens[] = {0, 1, 255, 256, 257, 65536 * 3 + 7, max_n};
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    if (lens[li] > max_n) continue; /* the buffers hold max_n elements (--max-n) */
    for (int t = 0; t < AGOQ_DTYPE_COUNT; t++) {
      for (size_t off = 0; off <= 1; off++) {
        const size_t n = lens[li];
        const agoq_dtype dt = (agoq_dtype)t;
        codec_case k;
        memset(&k, 0, sizeof k);
        k.p.dtype = dt;
        k.n = n;
        k.src_off = k.dst_off = off;
        float* acc = (float*)B->hacc;
        fill_acc(acc, n);
        for (size_t i = 0; i < n; i++) {
          uint32_t r = rnd32();
          if (r % 8 == 0) acc[i] = f32_from(edges[(r >> 3) % (sizeof edges / sizeof edges[0])] | (r & 0x80000000u));
          else if (r % 8 == 1) acc[i] = f32_from(rnd32());
        }
        /* overflow_to_inf, in place */
        float* dacc = (float*)B->dsrc + off;
        memcpy(B->hacc2, acc, n * 4);
        memset(B->hacc2 + n * 4, 0x5a, GUARD);
        CUDA_OK(cudaMemcpy(dacc, B->hacc2, n * 4 + GUARD, cudaMemcpyHostToDevice));
        agoq_codec_overflow_to_inf(dt, (float*)B->hacc2, n);
        CODEC_OK(agoq_cuda_overflow_to_inf(dt, dacc, n, NULL));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(B->hdst2, dacc, n * 4 + GUARD, cudaMemcpyDeviceToHost));
        cases++;
        same_bytes(&k, "overflow_to_inf", B->hacc2, B->hdst2, n * 4);
        /* narrow the (overflowed) sums into the type */
        const size_t es = agoq_dtype_size(dt);
        uint8_t* ddst = B->ddst + off * es;
        memset(B->hdst, 0xa5, n * es + GUARD);
        CUDA_OK(cudaMemcpy(ddst, B->hdst, n * es + GUARD, cudaMemcpyHostToDevice));
        agoq_codec_narrow_fp32(dt, (const float*)B->hacc2, n, B->hdst);
        CODEC_OK(agoq_cuda_narrow_fp32(dt, dacc, n, ddst, NULL));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(B->hdst2, ddst, n * es + GUARD, cudaMemcpyDeviceToHost));
        cases++;
        same_bytes(&k, "narrow_fp32", B->hdst, B->hdst2, n * es);
      }
    }
  }
  /* Refused before anything runs: a dtype out of range, misaligned pointers. */
  cases++;
  if (agoq_cuda_overflow_to_inf((agoq_dtype)AGOQ_DTYPE_COUNT, (float*)B->dsrc, 4, NULL) != AGOQ_CODEC_EARG ||
      agoq_cuda_narrow_fp32(AGOQ_DTYPE_BF16, (const float*)(B->dsrc + 2), 4, B->ddst, NULL) != AGOQ_CODEC_EARG ||
      agoq_cuda_narrow_fp32(AGOQ_DTYPE_FP16, (const float*)B->dsrc, 4, B->ddst + 1, NULL) != AGOQ_CODEC_EARG)
    mismatch(NULL, "reduce steps", "a bad argument was not refused");
  printf("codec: reduction steps (overflow to Inf, narrowing) done, %ld checks, %ld mismatches\n", cases, mismatches);
  fflush(stdout);
}

/* ---- batches ------------------------------------------------------------------------------------------ */

/* A batch of k items against the k single calls it stands for, on the GPU: the frames (every
 * byte, results, nothing written past them), the decodes into every type, and, where the
 * items have one length, the rank-order sum against a decode into fp32 followed by
 * decode-accumulates; then the sum with one body made corrupt on the device, which must leave
 * the sum untouched and say which item. Items sit at uneven offsets (odd items: src one element
 * off, frame 4 bytes off 16-byte alignment). */
enum { BATCH_K_MAX = 12 };

typedef struct {
  size_t max_n, src_bytes, frame_bytes, dst_bytes;
  uint8_t *dsrc, *dframe, *dframe1, *ddst, *ddst1;
  uint8_t *h, *h1;
  void* ws;
  agoq_cuda_batch_mem mem;
  agoq_cuda_codec_result *res, *res1;
} batch_env;

static size_t batch_frame_max(size_t n) {
  size_t m = 0;
  for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP32, .block = 32};
    size_t s = agoq_frame_size_max(&p, n);
    if (s > m) m = s;
  }
  return m;
}

static void batch_env_init(batch_env* E, size_t item_max) {
  memset(E, 0, sizeof *E);
  E->max_n = item_max;
  E->src_bytes = BATCH_K_MAX * (item_max + 8) * 4 + GUARD;
  E->frame_bytes = BATCH_K_MAX * (batch_frame_max(item_max) + 32) + GUARD;
  E->dst_bytes = E->src_bytes;
  size_t hb = E->frame_bytes > E->src_bytes ? E->frame_bytes : E->src_bytes;
  E->h = host_alloc(hb);
  E->h1 = host_alloc(hb);
  CUDA_OK(cudaMalloc((void**)&E->dsrc, E->src_bytes));
  CUDA_OK(cudaMalloc((void**)&E->dframe, E->frame_bytes));
  CUDA_OK(cudaMalloc((void**)&E->dframe1, E->frame_bytes));
  CUDA_OK(cudaMalloc((void**)&E->ddst, E->dst_bytes));
  CUDA_OK(cudaMalloc((void**)&E->ddst1, E->dst_bytes));
  CUDA_OK(cudaMalloc(&E->ws, AGOQ_CUDA_CODEC_WORKSPACE_SIZE));
  /* Block 1 is the worst case of the workspace's size. */
  E->mem.table_cap = agoq_cuda_batch_table_size(BATCH_K_MAX);
  E->mem.workspace_cap = agoq_cuda_batch_workspace_size(NULL, BATCH_K_MAX, item_max);
  CUDA_OK(cudaMallocHost(&E->mem.table_host, E->mem.table_cap));
  CUDA_OK(cudaMalloc(&E->mem.table_dev, E->mem.table_cap));
  CUDA_OK(cudaMalloc(&E->mem.workspace, E->mem.workspace_cap));
  CUDA_OK(cudaMallocHost((void**)&E->res, BATCH_K_MAX * sizeof *E->res));
  CUDA_OK(cudaMallocHost((void**)&E->res1, BATCH_K_MAX * sizeof *E->res1));
}

static void batch_env_free(batch_env* E) {
  free(E->h);
  free(E->h1);
  cudaFree(E->dsrc);
  cudaFree(E->dframe);
  cudaFree(E->dframe1);
  cudaFree(E->ddst);
  cudaFree(E->ddst1);
  cudaFree(E->ws);
  cudaFreeHost(E->mem.table_host);
  cudaFree(E->mem.table_dev);
  cudaFree(E->mem.workspace);
  cudaFreeHost(E->res);
  cudaFreeHost(E->res1);
}

/* Both device buffers of `bytes` bytes filled with the same byte. */
static void batch_prefill(uint8_t* a, uint8_t* b, size_t bytes, int v) {
  CUDA_OK(cudaMemset(a, v, bytes));
  CUDA_OK(cudaMemset(b, v, bytes));
}

/* The two device buffers compared over `bytes` (guards included). */
static void batch_compare(batch_env* E, const codec_case* kc, const char* what, const uint8_t* d_single,
                          const uint8_t* d_batch, size_t bytes) {
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(E->h1, d_single, bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(E->h, d_batch, bytes, cudaMemcpyDeviceToHost));
  cases++;
  same_bytes(kc, what, E->h1, E->h, bytes - GUARD);
}

static void batch_results(const codec_case* kc, const char* what, const agoq_cuda_codec_result* single,
                          const agoq_cuda_codec_result* batch, size_t k) {
  for (size_t i = 0; i < k; i++) {
    cases++;
    if (single[i].status != batch[i].status || single[i].body_len != batch[i].body_len ||
        single[i].escaped_blocks != batch[i].escaped_blocks)
      mismatch(kc, what, "item %zu: single call status %u length %" PRIu64 " escaped %" PRIu64
               ", batch status %u length %" PRIu64 " escaped %" PRIu64, i, single[i].status, single[i].body_len,
               single[i].escaped_blocks, batch[i].status, batch[i].body_len, batch[i].escaped_blocks);
  }
}

static void check_batch_case(batch_env* E, const agoq_codec_params* p, int pat, size_t k, const size_t* lens) {
  const size_t es = agoq_dtype_size(p->dtype);
  size_t so[BATCH_K_MAX], fo[BATCH_K_MAX], cap[BATCH_K_MAX], src_end = 0, frame_end = 0, nmax = 0;
  bool same_n = true;
  codec_case kc;
  memset(&kc, 0, sizeof kc);
  kc.p = *p;
  kc.pattern = pat;
  for (size_t i = 0; i < k; i++) {
    so[i] = src_end + (i & 1);
    src_end = so[i] + lens[i] + 1;
    fo[i] = ((frame_end + 15) & ~(size_t)15) + 4 * (i & 1);
    cap[i] = agoq_frame_size_max(p, lens[i]);
    frame_end = fo[i] + cap[i];
    if (lens[i] > nmax) nmax = lens[i];
    same_n = same_n && lens[i] == lens[0];
  }
  kc.n = nmax;
  for (size_t i = 0; i < k; i++) fill_pattern(E->h + so[i] * es, p->dtype, lens[i], p->block, pat, p->format);
  CUDA_OK(cudaMemcpy(E->dsrc, E->h, src_end * es, cudaMemcpyHostToDevice));

  /* Encode. */
  const size_t fbytes = frame_end + GUARD;
  batch_prefill(E->dframe1, E->dframe, fbytes, 0x5a);
  agoq_cuda_encode_item items[BATCH_K_MAX];
  for (size_t i = 0; i < k; i++) {
    items[i] = (agoq_cuda_encode_item){.src = E->dsrc + so[i] * es, .n = lens[i], .frame = E->dframe + fo[i],
                                       .cap = cap[i]};
    CODEC_OK(agoq_cuda_frame_encode(p, items[i].src, lens[i], E->dframe1 + fo[i], cap[i], E->ws, &E->res1[i], NULL));
  }
  CODEC_OK(agoq_cuda_frame_encode_batch(p, items, k, &E->mem, E->res, NULL));
  batch_compare(E, &kc, "batch encode", E->dframe1, E->dframe, fbytes);
  batch_results(&kc, "batch encode", E->res1, E->res, k);

  /* Decode into every type. */
  agoq_cuda_decode_item d[BATCH_K_MAX];
  for (int out = 0; out < AGOQ_DTYPE_COUNT; out++) {
    const size_t os = agoq_dtype_size((agoq_dtype)out), dbytes = src_end * os + GUARD;
    batch_prefill(E->ddst1, E->ddst, dbytes, 0xa5);
    for (size_t i = 0; i < k; i++) {
      d[i] = (agoq_cuda_decode_item){.body = E->dframe + fo[i] + AGOQ_FRAME_HEADER_SIZE,
                                     .body_len = (size_t)E->res[i].body_len, .n = lens[i], .dst = E->ddst + so[i] * os};
      CODEC_OK(agoq_cuda_dequantize(p, d[i].body, d[i].body_len, lens[i], (agoq_dtype)out, E->ddst1 + so[i] * os,
                                    E->ws, &E->res1[i], NULL));
    }
    CODEC_OK(agoq_cuda_dequantize_batch(p, d, k, (agoq_dtype)out, &E->mem, E->res, NULL));
    batch_compare(E, &kc, "batch decode", E->ddst1, E->ddst, dbytes);
    batch_results(&kc, "batch decode", E->res1, E->res, k);
  }
  if (!same_n) return;

  /* The rank-order sum. */
  const size_t n = lens[0], abytes = n * 4 + GUARD;
  batch_prefill(E->ddst1, E->ddst, abytes, 0xa5);
  for (size_t i = 0; i < k; i++) {
    if (i == 0)
      CODEC_OK(agoq_cuda_dequantize(p, d[i].body, d[i].body_len, n, AGOQ_DTYPE_FP32, E->ddst1, E->ws, &E->res1[i], NULL));
    else
      CODEC_OK(agoq_cuda_dequantize_accumulate(p, d[i].body, d[i].body_len, n, (float*)E->ddst1, E->ws, &E->res1[i],
                                               NULL));
  }
  CODEC_OK(agoq_cuda_dequantize_sum(p, d, k, n, (float*)E->ddst, &E->mem, E->res, NULL));
  batch_compare(E, &kc, "batch sum", E->ddst1, E->ddst, abytes);
  batch_results(&kc, "batch sum", E->res1, E->res, k);
  if (n == 0) return;

  /* One body made corrupt: a bitmap bit set on a block that was not escaped, so the bitmap
   * disagrees with the body length. */
  const size_t bad = k > 1 ? 1 : 0;
  uint8_t* body = E->dframe + fo[bad] + AGOQ_FRAME_HEADER_SIZE;
  const size_t nb = (n + p->block - 1) / p->block;
  uint8_t bitmap[8];
  CUDA_OK(cudaMemcpy(bitmap, body, 8, cudaMemcpyDeviceToHost));
  size_t b = 0;
  while (b < nb && b < 64 && (bitmap[b / 8] >> (b % 8)) & 1u) b++;
  if (b == nb || b == 64) return; /* every block of the first word escaped: nothing to flip */
  bitmap[b / 8] |= (uint8_t)(1u << (b % 8));
  CUDA_OK(cudaMemcpy(body, bitmap, 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(E->ddst, 0x3c, abytes));
  CODEC_OK(agoq_cuda_dequantize_sum(p, d, k, n, (float*)E->ddst, &E->mem, E->res, NULL));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(E->h, E->ddst, abytes, cudaMemcpyDeviceToHost));
  memset(E->h1, 0x3c, abytes);
  cases++;
  same_bytes(&kc, "batch sum with a corrupt body (nothing written)", E->h1, E->h, n * 4);
  for (size_t i = 0; i < k; i++) {
    cases++;
    const uint32_t want = i == bad ? AGOQ_CODEC_ECORRUPT : AGOQ_CODEC_OK;
    if (E->res[i].status != want)
      mismatch(&kc, "batch sum with a corrupt body", "item %zu: status %u, expected %u", i, E->res[i].status, want);
  }
}

/* Several sums in one launch (agoq_cuda_dequantize_sums): groups of k items of their own length
 * (an empty one among them), each against a decode into fp32 and decode-accumulates; then one
 * group's body made corrupt, which leaves that group's sum untouched and the others' written. */
static void check_batch_sums(batch_env* E, const agoq_codec_params* p, int pat) {
  enum { K = 3, G = 4 };
  const size_t es = agoq_dtype_size(p->dtype), b = p->block;
  size_t gn[G] = {b + 1, 0, 3 * b + 5, 64 * b + 3};
  for (size_t g = 0; g < G; g++)
    if (gn[g] > E->max_n) gn[g] = E->max_n;
  codec_case kc;
  memset(&kc, 0, sizeof kc);
  kc.p = *p;
  kc.pattern = pat;
  kc.n = gn[G - 1];
  /* Item i = (g, j): its source, frame and the group's accumulator, at uneven offsets. */
  size_t so[G * K], fo[G * K], ao[G], src_end = 0, frame_end = 0, acc_end = 0;
  agoq_cuda_encode_item enc[G * K];
  for (size_t g = 0; g < G; g++) {
    ao[g] = acc_end + (g & 1);
    acc_end = ao[g] + gn[g] + 1;
    for (size_t j = 0; j < K; j++) {
      size_t i = g * K + j;
      so[i] = src_end + (i & 1);
      src_end = so[i] + gn[g] + 1;
      fo[i] = ((frame_end + 15) & ~(size_t)15) + 4 * (i & 1);
      frame_end = fo[i] + agoq_frame_size_max(p, gn[g]);
      fill_pattern(E->h + so[i] * es, p->dtype, gn[g], p->block, pat, p->format);
      enc[i] = (agoq_cuda_encode_item){.src = E->dsrc + so[i] * es, .n = gn[g], .frame = E->dframe + fo[i],
                                       .cap = agoq_frame_size_max(p, gn[g])};
    }
  }
  CUDA_OK(cudaMemcpy(E->dsrc, E->h, src_end * es, cudaMemcpyHostToDevice));
  CODEC_OK(agoq_cuda_frame_encode_batch(p, enc, G * K, &E->mem, E->res, NULL));
  CUDA_OK(cudaDeviceSynchronize());
  agoq_cuda_decode_item d[G * K];
  agoq_cuda_sum_group grp[G];
  for (size_t i = 0; i < G * K; i++)
    d[i] = (agoq_cuda_decode_item){.body = E->dframe + fo[i] + AGOQ_FRAME_HEADER_SIZE,
                                   .body_len = (size_t)E->res[i].body_len, .n = enc[i].n};
  const size_t abytes = acc_end * 4 + GUARD;
  batch_prefill(E->ddst1, E->ddst, abytes, 0xa5);
  for (size_t g = 0; g < G; g++) {
    grp[g] = (agoq_cuda_sum_group){.n = gn[g], .acc = (float*)E->ddst + ao[g]};
    float* acc1 = (float*)E->ddst1 + ao[g];
    for (size_t j = 0; j < K; j++) {
      const agoq_cuda_decode_item* it = &d[g * K + j];
      if (j == 0)
        CODEC_OK(agoq_cuda_dequantize(p, it->body, it->body_len, gn[g], AGOQ_DTYPE_FP32, acc1, E->ws, &E->res1[g * K + j], NULL));
      else
        CODEC_OK(agoq_cuda_dequantize_accumulate(p, it->body, it->body_len, gn[g], acc1, E->ws, &E->res1[g * K + j], NULL));
    }
  }
  CODEC_OK(agoq_cuda_dequantize_sums(p, d, K, grp, G, &E->mem, E->res, NULL));
  batch_compare(E, &kc, "batch sums", E->ddst1, E->ddst, abytes);
  batch_results(&kc, "batch sums", E->res1, E->res, G * K);
  /* Group 2's second body corrupt: a bitmap bit set on its first block, which did not escape
   * (so the bitmap disagrees with the body length). Group 2's sum is left untouched, the others
   * are the single calls' (batch_compare left those in E->h1). */
  const size_t bad = 2 * K + 1;
  uint8_t bit0;
  CUDA_OK(cudaMemcpy(&bit0, d[bad].body, 1, cudaMemcpyDeviceToHost));
  if (bit0 & 1u) return; /* the first block escaped: nothing to flip */
  bit0 |= 1u;
  CUDA_OK(cudaMemcpy((void*)d[bad].body, &bit0, 1, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(E->ddst, 0x3c, abytes));
  CODEC_OK(agoq_cuda_dequantize_sums(p, d, K, grp, G, &E->mem, E->res, NULL));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(E->h, E->ddst, abytes, cudaMemcpyDeviceToHost));
  for (size_t g = 0; g < G; g++) {
    const uint8_t* got = E->h + ao[g] * 4;
    cases++;
    if (g == 2) {
      for (size_t i = 0; i < gn[g] * 4; i++)
        if (got[i] != 0x3c) {
          mismatch(&kc, "batch sums with a corrupt body", "byte %zu of the corrupt group's sum was written", i);
          break;
        }
    } else if (memcmp(got, E->h1 + ao[g] * 4, gn[g] * 4) != 0) {
      mismatch(&kc, "batch sums with a corrupt body", "group %zu's sum differs from the single calls'", g);
    }
  }
  for (size_t i = 0; i < G * K; i++) {
    cases++;
    const uint32_t want = i == bad ? AGOQ_CODEC_ECORRUPT : AGOQ_CODEC_OK;
    if (E->res[i].status != want)
      mismatch(&kc, "batch sums with a corrupt body", "item %zu: status %u, expected %u", i, E->res[i].status, want);
  }
}

/* What the host can refuse queues nothing and says so. */
static void check_batch_refusals(batch_env* E) {
  const agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 32};
  const agoq_codec_params none = {.format = AGOQ_FORMAT_NONE, .dtype = AGOQ_DTYPE_BF16};
  agoq_cuda_encode_item e[2] = {{.src = E->dsrc, .n = 64, .frame = E->dframe, .cap = agoq_frame_size_max(&p, 64)},
                                {.src = E->dsrc + 256, .n = 64, .frame = E->dframe + 4096, .cap = agoq_frame_size_max(&p, 64)}};
  size_t head = agoq_codec_body_size(&p, 64, 0);
  agoq_cuda_decode_item d[2] = {{.body = E->dframe + 64, .body_len = head, .n = 64, .dst = E->ddst},
                                {.body = E->dframe + 4160, .body_len = head, .n = 33, .dst = E->ddst + 512}};
  agoq_cuda_batch_mem small_table = E->mem, small_ws = E->mem, odd_ws = E->mem;
  small_table.table_cap = agoq_cuda_batch_table_size(1);
  small_ws.workspace_cap = 16;
  odd_ws.workspace = (uint8_t*)E->mem.workspace + 8;
  struct {
    const char* what;
    int got, want;
  } r[] = {
      {"no items", agoq_cuda_frame_encode_batch(&p, e, 0, &E->mem, E->res, NULL), AGOQ_CODEC_EARG},
      {"format NONE", agoq_cuda_frame_encode_batch(&none, e, 2, &E->mem, E->res, NULL), AGOQ_CODEC_EARG},
      {"a table too small", agoq_cuda_frame_encode_batch(&p, e, 2, &small_table, E->res, NULL), AGOQ_CODEC_EARG},
      {"a workspace too small", agoq_cuda_frame_encode_batch(&p, e, 2, &small_ws, E->res, NULL), AGOQ_CODEC_EARG},
      {"a misaligned workspace", agoq_cuda_frame_encode_batch(&p, e, 2, &odd_ws, E->res, NULL), AGOQ_CODEC_EARG},
      {"no results", agoq_cuda_frame_encode_batch(&p, e, 2, &E->mem, NULL, NULL), AGOQ_CODEC_EARG},
      {"too many items", agoq_cuda_frame_encode_batch(&p, e, AGOQ_CUDA_BATCH_MAX_ITEMS + 1, &E->mem, E->res, NULL),
       AGOQ_CODEC_EARG},
      {"an output type out of range",
       agoq_cuda_dequantize_batch(&p, d, 1, (agoq_dtype)AGOQ_DTYPE_COUNT, &E->mem, E->res, NULL), AGOQ_CODEC_EARG},
      {"sum of bodies of two lengths", agoq_cuda_dequantize_sum(&p, d, 2, 64, (float*)E->ddst, &E->mem, E->res, NULL),
       AGOQ_CODEC_EARG},
  };
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    cases++;
    if (r[i].got != r[i].want) mismatch(NULL, "batch refusal", "%s: returned %d, expected %d", r[i].what, r[i].got, r[i].want);
  }
  /* A body length that fits no number of escaped blocks: corrupt, found on the host. */
  d[1].n = 64;
  d[1].body_len = head + 1;
  cases++;
  int rc = agoq_cuda_dequantize_batch(&p, d, 2, AGOQ_DTYPE_BF16, &E->mem, E->res, NULL);
  if (rc != AGOQ_CODEC_ECORRUPT) mismatch(NULL, "batch refusal", "a body length of no escape count: returned %d", rc);
}

static void check_batches(bool quick) {
  batch_env E;
  const size_t cap_n = max_n < 5000 ? max_n : 5000;
  batch_env_init(&E, ranges_n > cap_n ? ranges_n : cap_n);
  static const uint32_t blocks[] = {32, 256};
  for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++)
    for (int t = 0; t < AGOQ_DTYPE_COUNT; t++)
      for (size_t bi = 0; bi < (quick ? 1u : 2u); bi++)
        for (int pat = PAT_NORMAL; pat <= PAT_ESCAPES; pat++) {
          const uint32_t b = blocks[bi];
          const bool is_int = f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4;
          agoq_codec_params p = {.format = (agoq_format)f, .dtype = (agoq_dtype)t, .block = b,
                                 .stochastic = is_int && pat == PAT_ESCAPES, .seed = rnd64()};
          /* Lengths of every kind in one batch: empty, one element, tails, several bitmap words. */
          size_t lens[BATCH_K_MAX] = {0, 1, b - 1, b + 1, 3 * (size_t)b + 5, 64 * (size_t)b + 3, cap_n};
          size_t k = 0;
          for (size_t i = 0; i < 7; i++)
            if (lens[i] <= cap_n) lens[k++] = lens[i];
          check_batch_case(&E, &p, pat, k, lens);
          /* One length: the sum of 5 items of a few blocks, and of 3 of several bitmap words. */
          const size_t n5 = 3 * (size_t)b + 5, n3 = 64 * (size_t)b + 3;
          size_t same[BATCH_K_MAX];
          for (size_t i = 0; i < 5; i++) same[i] = n5;
          check_batch_case(&E, &p, pat, 5, same);
          if (n3 <= cap_n) {
            for (size_t i = 0; i < 3; i++) same[i] = n3;
            check_batch_case(&E, &p, pat, 3, same);
          }
          check_batch_sums(&E, &p, pat);
        }
  /* Several bitmap words per range of the escape scan: the sum's escaped-block rank counts the
   * words before a block within its range. */
  if (ranges_n != 0) {
    agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 32};
    size_t same[2] = {ranges_n, ranges_n};
    check_batch_case(&E, &p, PAT_ESCAPES, 2, same);
  }
  check_batch_refusals(&E);
  batch_env_free(&E);
  printf("codec: batches done, %ld checks, %ld mismatches\n", cases, mismatches);
  fflush(stdout);
}

/* ---- the identity matrix ---------------------------------------------------------------------------- */

static void check_identity(bufs* B, bool quick) {
  static const uint32_t blocks_all[] = {32, 64, 128, 256, 512, 1024};
  static const uint32_t blocks_quick[] = {32, 128, 1024};
  const uint32_t* blocks = quick ? blocks_quick : blocks_all;
  const size_t nblocks = quick ? 3 : 6;
  for (int f = 0; f < AGOQ_FORMAT_COUNT; f++) {
    for (int t = 0; t < AGOQ_DTYPE_COUNT; t++) {
      for (size_t bi = 0; bi < nblocks; bi++) {
        const uint32_t b = blocks[bi];
        if (f == AGOQ_FORMAT_NONE && bi > 0) break;
        const size_t lens[] = {0, 1, 7, b - 1, b, b + 1, 3 * (size_t)b + 5, 64 * (size_t)b + 3, max_n};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
          if (lens[li] > max_n) continue;
          for (int pat = 0; pat < PAT_COUNT; pat++) {
            const bool big = lens[li] == max_n;
            /* The large length with every pattern only for the default block size. */
            if (big && quick && pat != PAT_ESCAPES) continue;
            if (big && b != 128 && pat != PAT_ESCAPES && pat != PAT_NORMAL) continue;
            const bool is_int = f == AGOQ_FORMAT_INT8 || f == AGOQ_FORMAT_INT4;
            for (int sto = 0; sto <= (is_int ? 1 : 0); sto++) {
              codec_case k;
              memset(&k, 0, sizeof k);
              k.p.format = (agoq_format)f;
              k.p.dtype = (agoq_dtype)t;
              k.p.block = f == AGOQ_FORMAT_NONE ? 0 : b;
              k.p.stochastic = sto;
              k.p.seed = rnd64();
              k.p.first_index = (li & 1) ? rnd64() >> 20 : 0;
              k.n = lens[li];
              k.pattern = pat;
              /* Alignment variants on every third case: src and dst off by one element,
               * the body 4 bytes off its 16-byte alignment. */
              if ((cases / 7) % 3 == 1) {
                k.src_off = 1;
                k.dst_off = 1;
                k.body_off = 4;
              }
              run_case(B, &k, !big || pat == PAT_ESCAPES);
            }
          }
        }
      }
    }
    printf("codec: %-8s done, %ld checks, %ld mismatches\n", agoq_format_name((agoq_format)f), cases,
           mismatches);
    fflush(stdout);
  }
  /* Several bitmap words per range of the escape scan and raw copy. */
  if (ranges_n != 0) {
    static const agoq_format rf[] = {AGOQ_FORMAT_INT8, AGOQ_FORMAT_FP8E4M3, AGOQ_FORMAT_INT4};
    for (size_t i = 0; i < sizeof rf / sizeof rf[0]; i++) {
      codec_case k;
      memset(&k, 0, sizeof k);
      k.p.format = rf[i];
      k.p.dtype = i == 1 ? AGOQ_DTYPE_FP32 : AGOQ_DTYPE_BF16;
      k.p.block = 32;
      k.p.stochastic = rf[i] == AGOQ_FORMAT_INT4;
      k.p.seed = rnd64();
      k.n = ranges_n;
      k.pattern = PAT_ESCAPES;
      run_case(B, &k, true);
    }
    printf("codec: %zu-element cases done, %ld checks, %ld mismatches\n", ranges_n, cases, mismatches);
  }
  check_corrupt(B);
  check_reduce_steps(B);
  check_batches(quick);
}

/* ---- throughput ---------------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  const agoq_codec_params* p;
  const void *src, *body;
  void *body_out, *dst, *ws;
  size_t n, cap, body_len;
  agoq_cuda_codec_result* res;
  int op; /* 0 memcpy, 1 quantize, 2 dequantize bf16, 3 dequantize-accumulate */
} perf_op;

static void perf_launch(const perf_op* o) {
  switch (o->op) {
    case 0: CUDA_OK(cudaMemcpyAsync(o->dst, o->src, o->n * 2, cudaMemcpyDeviceToDevice, NULL)); break;
    case 1: CODEC_OK(agoq_cuda_quantize(o->p, o->src, o->n, o->body_out, o->cap, o->ws, o->res, NULL)); break;
    case 2:
      CODEC_OK(agoq_cuda_dequantize(o->p, o->body, o->body_len, o->n, AGOQ_DTYPE_BF16, o->dst, o->ws, o->res, NULL));
      break;
    default:
      CODEC_OK(agoq_cuda_dequantize_accumulate(o->p, o->body, o->body_len, o->n, (float*)o->dst, o->ws, o->res,
                                               NULL));
      break;
  }
}

/* Seconds per call: mean over `iters` back-to-back calls after warm-up, by CUDA events. */
static double perf_time(const perf_op* o, int iters) {
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; i++) perf_launch(o);
  CUDA_OK(cudaEventRecord(e0, NULL));
  for (int i = 0; i < iters; i++) perf_launch(o);
  CUDA_OK(cudaEventRecord(e1, NULL));
  CUDA_OK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return (double)ms * 1e-3 / iters;
}

static void check_perf(size_t mib) {
  const size_t n = mib * (1024 * 1024 / 2); /* bf16 elements */
  const size_t bytes = n * 2;
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 128};
  const size_t cap = agoq_codec_body_size_max(&p, n);
  printf("throughput: bf16 -> int8, block 128, %zu MiB (%zu elements)\n", mib, n);
  fflush(stdout);

  /* N(0,1) data: a 4 Mi-element tile made on the host, repeated on the device. */
  const size_t tile = n < ((size_t)4 << 20) ? n : ((size_t)4 << 20);
  uint16_t* htile = host_alloc(tile * 2);
  for (size_t i = 0; i < tile; i++) htile[i] = (uint16_t)(f32_bits(rnd_normal()) >> 16);
  uint8_t *dsrc, *dbody, *ddst;
  void* ws;
  agoq_cuda_codec_result* res;
  CUDA_OK(cudaMalloc((void**)&dsrc, bytes));
  CUDA_OK(cudaMalloc((void**)&dbody, cap));
  CUDA_OK(cudaMalloc((void**)&ddst, n * 4)); /* room for an fp32 accumulator */
  CUDA_OK(cudaMalloc(&ws, AGOQ_CUDA_CODEC_WORKSPACE_SIZE));
  CUDA_OK(cudaMallocHost((void**)&res, sizeof *res));
  for (size_t off = 0; off < n; off += tile) {
    size_t c = n - off < tile ? n - off : tile;
    CUDA_OK(cudaMemcpy(dsrc + off * 2, htile, c * 2, cudaMemcpyHostToDevice));
  }
  free(htile);

  perf_op o = {.p = &p, .src = dsrc, .body = dbody, .body_out = dbody, .dst = ddst, .ws = ws, .n = n, .cap = cap,
               .res = res};
  /* One quantize first: the body the decodes read, and its length. */
  o.op = 1;
  perf_launch(&o);
  CUDA_OK(cudaDeviceSynchronize());
  if (res->status != AGOQ_CODEC_OK) {
    fprintf(stderr, "codec_gpu_check: perf quantize status %u\n", res->status);
    exit(EXIT_MISMATCH);
  }
  o.body_len = res->body_len;

  double best[4] = {0, 0, 0, 0};
  const int iters = perf_iters;
  for (int round = 0; round < 3; round++) {
    for (int op = 0; op < 4; op++) {
      o.op = op;
      if (op == 3) CUDA_OK(cudaMemset(ddst, 0, n * 4)); /* a finite accumulator */
      double t = perf_time(&o, iters);
      /* GB/s of the 1 GiB side: copied bytes, quantize input, dequantize output. */
      double gbs = (double)bytes / t * 1e-9;
      if (gbs > best[op]) best[op] = gbs;
    }
  }
  const double q = best[1] / best[0], d = best[2] / best[0], a = best[3] / best[0];
  printf("throughput: memcpy D2D           %8.1f GB/s\n", best[0]);
  printf("throughput: quantize             %8.1f GB/s of input   %.2f x memcpy  %s\n", best[1], q,
         q >= PERF_TARGET ? "(target >= 0.80 met)" : "(target >= 0.80 NOT MET)");
  printf("throughput: dequantize -> bf16   %8.1f GB/s of output  %.2f x memcpy  %s\n", best[2], d,
         d >= PERF_TARGET ? "(target >= 0.80 met)" : "(target >= 0.80 NOT MET)");
  printf("throughput: dequantize-accumulate %7.1f GB/s of bf16-equivalent output  %.2f x memcpy (fp32 acc, informational)\n",
         best[3], a);
  fflush(stdout);

  /* The 1 GiB body and its bf16 decode, against the multi-threaded CPU codec. */
  double t0 = now_s();
  uint8_t* hsrc = host_alloc(bytes);
  uint8_t* hbody = host_alloc(cap);
  uint8_t* gbody = host_alloc(o.body_len);
  CUDA_OK(cudaMemcpy(hsrc, dsrc, bytes, cudaMemcpyDeviceToHost));
  o.op = 1;
  perf_launch(&o);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(gbody, dbody, o.body_len, cudaMemcpyDeviceToHost));
  size_t len = 0;
  CODEC_OK(agoq_quantize_mt(&p, hsrc, n, hbody, cap, &len, NULL, 0));
  cases++;
  if (len != o.body_len || memcmp(hbody, gbody, len) != 0)
    mismatch(NULL, "quantize 1 GiB", "GPU body differs from the CPU's (lengths %zu / %zu)", (size_t)o.body_len,
             len);
  o.op = 2;
  perf_launch(&o);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(hsrc, ddst, bytes, cudaMemcpyDeviceToHost)); /* hsrc now: GPU decode */
  free(gbody);
  uint8_t* hdst = host_alloc(bytes);
  CODEC_OK(agoq_dequantize_mt(&p, hbody, len, n, AGOQ_DTYPE_BF16, hdst, 0));
  cases++;
  if (memcmp(hdst, hsrc, bytes) != 0) mismatch(NULL, "dequantize 1 GiB", "GPU decode differs from the CPU's");
  printf("throughput: %zu MiB body and decode compared with the CPU codec (%.1f s)\n", mib, now_s() - t0);
  free(hsrc);
  free(hbody);
  free(hdst);
  cudaFree(dsrc);
  cudaFree(dbody);
  cudaFree(ddst);
  cudaFree(ws);
  cudaFreeHost(res);
}

/* A CollNet chunk's codec work on the GPU, per peer against batched (informational: the time the
 * batches save depends on the GPU, and is measured only where one runs this): a chunk of
 * `mib` MiB of bf16 (int8, block 128) split into k slices, the k frames encoded, the k bodies
 * decoded into bf16, and the k contributions summed in fp32 (one slice's worth: the owner's
 * reduction), each as k single calls and as one batch, by CUDA events, best of 3 rounds. The
 * batch's results are compared with the single calls' too. */
typedef struct {
  const agoq_codec_params* p;
  size_t k, m; /* slices, elements per slice */
  uint8_t *src, *frames, *dst, *dst1;
  size_t cap;
  void* ws;
  agoq_cuda_batch_mem mem;
  agoq_cuda_codec_result *res, *res1;
  agoq_cuda_encode_item* enc;
  agoq_cuda_decode_item* dec;
} perf_chunk;

/* op: 0 encodes, 1 decodes, 2 sum; batch or k single calls. */
static void perf_chunk_run(const perf_chunk* c, int op, bool batch) {
  if (batch) {
    if (op == 0) CODEC_OK(agoq_cuda_frame_encode_batch(c->p, c->enc, c->k, &c->mem, c->res, NULL));
    else if (op == 1) CODEC_OK(agoq_cuda_dequantize_batch(c->p, c->dec, c->k, AGOQ_DTYPE_BF16, &c->mem, c->res, NULL));
    else CODEC_OK(agoq_cuda_dequantize_sum(c->p, c->dec, c->k, c->m, (float*)c->dst, &c->mem, c->res, NULL));
    /* The next batch may rewrite the pinned table only once this one's copy has run. */
    CUDA_OK(cudaStreamSynchronize(NULL));
    return;
  }
  for (size_t i = 0; i < c->k; i++) {
    const agoq_cuda_encode_item* e = &c->enc[i];
    const agoq_cuda_decode_item* d = &c->dec[i];
    if (op == 0) CODEC_OK(agoq_cuda_frame_encode(c->p, e->src, e->n, e->frame, e->cap, c->ws, &c->res1[i], NULL));
    else if (op == 1)
      CODEC_OK(agoq_cuda_dequantize(c->p, d->body, d->body_len, d->n, AGOQ_DTYPE_BF16, d->dst, c->ws, &c->res1[i], NULL));
    else if (i == 0)
      CODEC_OK(agoq_cuda_dequantize(c->p, d->body, d->body_len, c->m, AGOQ_DTYPE_FP32, c->dst1, c->ws, &c->res1[i], NULL));
    else
      CODEC_OK(agoq_cuda_dequantize_accumulate(c->p, d->body, d->body_len, c->m, (float*)c->dst1, c->ws, &c->res1[i],
                                               NULL));
  }
  CUDA_OK(cudaStreamSynchronize(NULL));
}

/* Seconds per run (the synchronisation of each run included on both sides). */
static double perf_chunk_time(const perf_chunk* c, int op, bool batch, int iters) {
  perf_chunk_run(c, op, batch);
  double t0 = now_s();
  for (int i = 0; i < iters; i++) perf_chunk_run(c, op, batch);
  return (now_s() - t0) / iters;
}

static void check_perf_batches(size_t mib) {
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 128};
  const size_t n = mib * (1024 * 1024 / 2);
  static const size_t ks[] = {8, 64};
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
    perf_chunk c;
    memset(&c, 0, sizeof c);
    c.p = &p;
    c.k = ks[ki];
    c.m = (n / c.k + p.block - 1) / p.block * p.block;
    c.cap = (agoq_frame_size_max(&p, c.m) + 15) & ~(size_t)15;
    CUDA_OK(cudaMalloc((void**)&c.src, c.k * c.m * 2));
    CUDA_OK(cudaMalloc((void**)&c.frames, c.k * c.cap));
    CUDA_OK(cudaMalloc((void**)&c.dst, c.k * c.m * 4));
    CUDA_OK(cudaMalloc((void**)&c.dst1, c.k * c.m * 4));
    CUDA_OK(cudaMalloc(&c.ws, AGOQ_CUDA_CODEC_WORKSPACE_SIZE));
    c.mem.table_cap = agoq_cuda_batch_table_size(c.k);
    c.mem.workspace_cap = agoq_cuda_batch_workspace_size(&p, c.k, c.m);
    CUDA_OK(cudaMallocHost(&c.mem.table_host, c.mem.table_cap));
    CUDA_OK(cudaMalloc(&c.mem.table_dev, c.mem.table_cap));
    CUDA_OK(cudaMalloc(&c.mem.workspace, c.mem.workspace_cap));
    CUDA_OK(cudaMallocHost((void**)&c.res, c.k * sizeof *c.res));
    CUDA_OK(cudaMallocHost((void**)&c.res1, c.k * sizeof *c.res1));
    c.enc = host_alloc(c.k * sizeof *c.enc);
    c.dec = host_alloc(c.k * sizeof *c.dec);
    uint16_t* h = host_alloc(c.k * c.m * 2);
    for (size_t i = 0; i < c.k * c.m; i++) h[i] = (uint16_t)(f32_bits(rnd_normal()) >> 16);
    CUDA_OK(cudaMemcpy(c.src, h, c.k * c.m * 2, cudaMemcpyHostToDevice));
    free(h);
    for (size_t i = 0; i < c.k; i++)
      c.enc[i] = (agoq_cuda_encode_item){.src = c.src + i * c.m * 2, .n = c.m, .frame = c.frames + i * c.cap, .cap = c.cap};
    perf_chunk_run(&c, 0, true);
    for (size_t i = 0; i < c.k; i++)
      c.dec[i] = (agoq_cuda_decode_item){.body = c.frames + i * c.cap + AGOQ_FRAME_HEADER_SIZE,
                                         .body_len = (size_t)c.res[i].body_len, .n = c.m, .dst = c.dst + i * c.m * 2};
    static const char* const names[] = {"encode", "decode", "sum"};
    for (int op = 0; op < 3; op++) {
      double single = 0, batch = 0;
      for (int round = 0; round < 3; round++) {
        double ts = perf_chunk_time(&c, op, false, perf_iters), tb = perf_chunk_time(&c, op, true, perf_iters);
        if (round == 0 || ts < single) single = ts;
        if (round == 0 || tb < batch) batch = tb;
      }
      printf("throughput: chunk of %zu MiB in %3zu slices, %-6s: %3zu single calls %8.1f us, one batch %8.1f us "
             "(%.2f x)\n", mib, c.k, names[op], c.k, single * 1e6, batch * 1e6, single / batch);
    }
    /* The sum's bits: the batch's (dst) against the single calls' (dst1), from the last runs. */
    CUDA_OK(cudaMemcpy(c.dst + c.m * 4, c.dst1, c.m * 4, cudaMemcpyDeviceToDevice));
    uint8_t* a = host_alloc(c.m * 8);
    CUDA_OK(cudaMemcpy(a, c.dst, c.m * 8, cudaMemcpyDeviceToHost));
    cases++;
    if (memcmp(a, a + c.m * 4, c.m * 4) != 0) mismatch(NULL, "perf chunk", "the batched sum differs from the single calls'");
    free(a);
    fflush(stdout);
    free(c.enc);
    free(c.dec);
    cudaFree(c.src);
    cudaFree(c.frames);
    cudaFree(c.dst);
    cudaFree(c.dst1);
    cudaFree(c.ws);
    cudaFreeHost(c.mem.table_host);
    cudaFree(c.mem.table_dev);
    cudaFree(c.mem.workspace);
    cudaFreeHost(c.res);
    cudaFreeHost(c.res1);
  }
}

/* ---- main ------------------------------------------------------------------------------------------------ */

static void usage(FILE* f) {
  fprintf(f,
          "usage: codec_gpu_check [--quick] [--no-perf] [--perf-only] [--perf-mib N] [--max-n N]\n"
          "                       [--ranges-n N] [--perf-iters N] [-v]\n"
          "  CUDA codec vs CPU codec bit for bit, then throughput next to cudaMemcpy D2D.\n"
          "  --max-n N     largest length of the identity matrix (default 1000003)\n"
          "  --ranges-n N  length of the multi-word-range cases (default 3145805; 0: none)\n"
          "  --perf-iters N  timed calls per operation and round (default 10)\n"
          "  exit 0 identical, 1 mismatch or CUDA error, 2 usage, 77 no usable GPU\n");
}

int main(int argc, char** argv) {
  bool quick = false, perf = true, identity = true;
  size_t perf_mib = 1024;
  static const struct option opts[] = {{"quick", no_argument, NULL, 'q'},
                                       {"no-perf", no_argument, NULL, 'P'},
                                       {"perf-only", no_argument, NULL, 'I'},
                                       {"perf-mib", required_argument, NULL, 'm'},
                                       {"max-n", required_argument, NULL, 'n'},
                                       {"ranges-n", required_argument, NULL, 'r'},
                                       {"perf-iters", required_argument, NULL, 'i'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "vh", opts, NULL)) != -1) {
    switch (c) {
      case 'q': quick = true; break;
      case 'P': perf = false; break;
      case 'I': identity = false; break;
      /* Strict numbers (tools/common/agoq_args.h): a bad value says so and exits 2. */
      case 'm': perf_mib = (size_t)agoq_args_ll_or_exit("codec_gpu_check", "--perf-mib", optarg, 1, 65536); break;
      case 'n':
        max_n = (size_t)agoq_args_ll_or_exit("codec_gpu_check", "--max-n", optarg, 1024, 1ll << 32);
        break;
      case 'r':
        ranges_n = (size_t)agoq_args_ll_or_exit("codec_gpu_check", "--ranges-n", optarg, 0, 1ll << 32);
        break;
      case 'i': perf_iters = agoq_args_int_or_exit("codec_gpu_check", "--perf-iters", optarg, 1, 1000); break;
      case 'v': verbose = true; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return EXIT_USAGE;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return EXIT_USAGE;
  }

  int ndev = agoq_cuda_device_count();
  if (ndev == 0) {
    printf("codec_gpu_check: no usable CUDA device (no GPU or no driver): skipped\n");
    return EXIT_NO_GPU;
  }
  struct cudaDeviceProp prop;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  printf("codec_gpu_check: device 0: %s, sm_%d%d, %d SMs, %.1f GiB; CPU codec ISA %s\n", prop.name, prop.major,
         prop.minor, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024),
         agoq_codec_isa());
  fflush(stdout);
  /* Every codec kernel loaded up front, as the plugin does at setup: on a GPU this checks that
   * each has an image for it; in the emulation a kernel launched without being loaded is a
   * failure, so a kernel the loader misses fails this check. */
  size_t nkernels = 0;
  const char* failed = NULL;
  if (agoq_cuda_codec_load_all(&nkernels, &failed) != AGOQ_CODEC_OK) {
    fprintf(stderr, "codec_gpu_check: loading kernel %s failed: %s\n", failed ? failed : "?",
            agoq_cuda_codec_last_error_string());
    return EXIT_MISMATCH;
  }
  printf("codec_gpu_check: %zu codec kernels loaded\n", nkernels);

  double t0 = now_s();
  if (identity) {
    bufs B;
    bufs_init(&B);
    check_identity(&B, quick);
    bufs_free(&B);
    printf("codec: identity checks: %ld, mismatches: %ld (%.1f s)\n", cases, mismatches, now_s() - t0);
  }
  if (perf) {
    check_perf(perf_mib);
    check_perf_batches(perf_mib < 4 ? perf_mib : 4);
  }

  if (mismatches != 0) {
    printf("codec verdict: MISMATCH: %ld of %ld checks differ from the CPU codec\n", mismatches, cases);
    return EXIT_MISMATCH;
  }
  printf("codec verdict: CUDA codec bit-identical to the CPU codec (%ld checks)\n", cases);
  return 0;
}
