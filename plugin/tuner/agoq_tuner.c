/* The tuner: per-communicator policy read once at init; for each eligible collective NCCL's
 * CollNet entries become what agoq's compressed CollNet would cost (agoq_tuner_cost.h), so
 * that NCCL picks it only where it wins; an INFO line per communicator and outcome says
 * what it decided, with the numbers. */
#include "tuner/agoq_tuner.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <limits.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>

#include "abi/agoq_nccl_tuner_v5.h"
#include "core/agoq_check.h"
#include "core/agoq_nccl_env.h"
#include "core/agoq_params.h"
#include "profiler/agoq_prof_api.h"
#include "tuner/agoq_tuner_cost.h"

#define AGOQ_TUNER_MAGIC 0x4e555441u /* "ATUN" */
/* NCCL's constants for the chunk size (init.cc DEFAULT_BUFFSIZE, device.h NCCL_STEPS,
 * coll_net.cc COLLNET_GROUP_NSUBS: channels per CollNet call), and the chunks per channel
 * and GPU of the chain agoq's getChunkSize keeps (the bar of NCCL's own 128 KiB chunks). */
#define AGOQ_TUNER_NCCL_BUFFSIZE (4 << 20)
#define AGOQ_TUNER_NCCL_STEPS 8
#define AGOQ_TUNER_COLLNET_GROUP 8
#define AGOQ_TUNER_CHAIN_CHUNKS_PER_GPU 8

typedef struct {
  uint32_t magic;
  uint64_t comm_id;
  size_t nranks, nnodes;
  bool enabled;       /* AGOQ_FORMAT != none and the parameters loaded */
  uint64_t min_bytes; /* AGOQ_MIN_BYTES */
  agoq_format format; /* AGOQ_FORMAT */
  uint32_t block;     /* AGOQ_BLOCK */
  double codec_mbps;  /* AGOQ_CODEC_MBPS: the same on every rank, never a local measurement */
  /* agoq's CollNet schedule for this communicator's nodes (one CollNet rank per node): its
   * network time is the tuner's estimate (agoq_tuner_network_us). */
  agoq_tuner_sched sched;
  /* NCCL_COLLNET_ENABLE as NCCL read it: at this communicator's creation, which is when the
   * tuner is initialised. Programs change it in between: Megatron-Core sets it only around
   * its data-parallel group's creation (use_sharp) and deletes it otherwise. */
  bool collnet_env_set;
  char collnet_env[48];
  size_t chain_step; /* NCCL_BUFFSIZE / NCCL_STEPS as NCCL computes it: the largest chunk it takes */
  _Atomic int logged_chunk; /* the chunk line was printed */
  _Atomic int logged_steer; /* the per-communicator lines were printed: compression chosen */
  _Atomic int logged_cost;  /* ... NCCL's other choice cheaper */
  _Atomic int logged_keep;  /* ... and eligible but CollNet unusable */
  _Atomic int warned_inactive; /* the WARN: a float AllReduce that compression misses */
} agoq_tuner_ctx;

static double agoq_tuner_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pthread_once_t agoq_tuner_codec_once = PTHREAD_ONCE_INIT;
static double agoq_tuner_codec_measured;

/* The codec speed the cost model uses. NCCL runs a collective correctly only if every rank
 * picks the same algorithm for it, and nothing lets the ranks' tuners agree: so the model
 * takes a setting, the same everywhere (agoq_tuner_codec_setting: AGOQ_CODEC_MBPS, or
 * AGOQ_GPU_CODEC_MBPS where the reductions run on the GPU), and never this process's own
 * measurement, which differs from rank to rank and would split a decision near its
 * threshold (a hang or a wrong result). The CPU codec is still measured, once per process,
 * and printed next to the setting: it is the figure a user should give AGOQ_CODEC_MBPS. */
static void agoq_tuner_codec_measure(void) {
  const char* which = NULL;
  double mbps = agoq_tuner_codec_setting(&which);
  agoq_tuner_codec_measured = agoq_tuner_codec_mbps_measure(agoq_tuner_now_s, 4);
  AGOQ_INFO(NCCL_TUNING, "tuner: this process's CPU codec runs %.0f MB/s (int8 of bf16, quantize + dequantize, "
                         "measured once); the cost model uses %s=%.0f on every rank (%s; set it, the same "
                         "everywhere, to the figure of the codec your reductions use)",
            agoq_tuner_codec_measured, which, mbps,
            strcmp(which, "AGOQ_CODEC_MBPS") == 0 ? "the CPU codec's: the reductions run on the CPU"
                                                  : "the GPU codec's: AGOQ_GPU=on and AGOQ_COLLNET_GPU=1");
}

static double agoq_tuner_codec_mbps(void) {
  pthread_once(&agoq_tuner_codec_once, agoq_tuner_codec_measure);
  return agoq_tuner_codec_setting(NULL);
}

ncclResult_t agoq_tuner_init(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                             ncclDebugLogger_t log_fn) {
  ncclResult_t res = ncclSuccess;
  agoq_tuner_ctx* c = NULL;
  if (log_fn != NULL) agoq_log_set_logger(log_fn);
  AGOQ_ARG_CHECK(ctx != NULL, res, fail);
  *ctx = NULL;
  AGOQ_CALLOC_GOTO(c, 1, res, fail);
  c->magic = AGOQ_TUNER_MAGIC;
  c->comm_id = comm_id;
  c->nranks = nranks;
  c->nnodes = nnodes;
  /* An invalid AGOQ_* value was already reported (WARN) by the loader; the tuner then
   * steers nothing rather than fail the communicator. */
  c->enabled = agoq_params_load() == ncclSuccess && agoq_param_int(AGOQ_PARAM_FORMAT) != 0;
  c->min_bytes = (uint64_t)agoq_param_int(AGOQ_PARAM_MIN_BYTES);
  c->format = (agoq_format)agoq_param_int(AGOQ_PARAM_FORMAT);
  c->block = AGOQ_CODEC_BLOCK_MIN << agoq_param_int(AGOQ_PARAM_BLOCK); /* 32|64|...|1024 */
  if (c->enabled) c->codec_mbps = agoq_tuner_codec_mbps();
  if (c->enabled && nnodes >= 2) {
    agoq_tuner_sched_setting(nnodes, &c->sched);
    /* Without the schedule's cost there is nothing to weigh compression by: NCCL decides. */
    if (!c->sched.ok)
      AGOQ_INFO(NCCL_TUNING, "tuner: comm %llx: no memory to cost agoq's CollNet schedule for %zu nodes; NCCL's "
                             "algorithm choice stands", (unsigned long long)comm_id, nnodes);
  }
  const char* collnet_env = agoq_nccl_env_str("NCCL_COLLNET_ENABLE");
  c->collnet_env_set = collnet_env != NULL;
  if (collnet_env != NULL) snprintf(c->collnet_env, sizeof c->collnet_env, "%s", collnet_env);
  /* NCCL's buffSizes[SIMPLE]: NCCL_BUFFSIZE unless it is -2 (unset), then 4 MiB (init.cc
   * computeBuffSizes); a step is an eighth (NCCL_STEPS). */
  int64_t buffsize = agoq_nccl_param("NCCL_BUFFSIZE", -2);
  if (buffsize == -2) buffsize = AGOQ_TUNER_NCCL_BUFFSIZE;
  c->chain_step = buffsize > 0 ? (size_t)buffsize / AGOQ_TUNER_NCCL_STEPS : 0;
  atomic_init(&c->logged_chunk, 0);
  atomic_init(&c->logged_steer, 0);
  atomic_init(&c->logged_cost, 0);
  atomic_init(&c->logged_keep, 0);
  atomic_init(&c->warned_inactive, 0);
  *ctx = c;
  return ncclSuccess;
fail:
  free(c);
  return res;
}

/* The CollNet entry to make cheapest: COLLNET_CHAIN, else COLLNET_DIRECT, with SIMPLE
 * (agoq's CollNet moves whole buffers; LL lines would be flags, not data). -1: neither is
 * usable for this call. */
static int agoq_tuner_collnet_algo(const float* table, int num_algo, int num_proto) {
  static const int order[] = {AGOQ_NCCL_ALGO_COLLNET_CHAIN, AGOQ_NCCL_ALGO_COLLNET_DIRECT};
  if (num_proto <= AGOQ_NCCL_PROTO_SIMPLE) return -1;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    int a = order[i];
    /* NCCL marks unusable entries -1.0 (NCCL_ALGO_PROTO_IGNORE); any negative is unusable. */
    if (a < num_algo && table[a * num_proto + AGOQ_NCCL_PROTO_SIMPLE] >= 0.0f) return a;
  }
  return -1;
}

static const char* agoq_tuner_func_name(int coll_type) {
  return coll_type == ncclFuncAllReduce ? "AllReduce" : "ReduceScatter";
}

static bool agoq_tuner_dtype_is_float(int dtype) {
  return dtype == ncclFloat32 || dtype == ncclBfloat16 || dtype == ncclFloat16;
}

static const char* agoq_tuner_dtype_name(int dtype) {
  return dtype == ncclFloat32 ? "fp32" : dtype == ncclBfloat16 ? "bf16" : "fp16";
}

/* Said once per communicator, and only when it is known to be true: this AllReduce is of
 * fp32/bf16/fp16 (the profiler saw the call), compression is on, it is large enough, and
 * NCCL's cost table has no CollNet entry. agoq's CollNet accepts every (type, op) pair
 * (reduceSupport), so NCCL's collNetSupportMatrix never removes CollNet for one call: a
 * table without CollNet means CollNet is off for the whole communicator (enqueue.cc
 * getCollNetSupport / updateCollCostTable: config.collnetEnable, more than 8 GPUs per
 * node) or NCCL_ALGO excludes it. Neither NCCL's tuner nor its profiler events carry the
 * reduction op, so "float AllReduce" is as precise as the facts go; a float Sum is then
 * exact as well. */
static void agoq_tuner_warn_inactive(agoq_tuner_ctx* c, int dtype, size_t nbytes) {
  if (atomic_exchange_explicit(&c->warned_inactive, 1, memory_order_relaxed) != 0) return;
  char why[240];
  const char* env = c->collnet_env_set ? c->collnet_env : NULL;
  int enable = agoq_nccl_config_int_parse(env, INT_MIN);
  if (c->nnodes < 2)
    snprintf(why, sizeof why, "the communicator spans %zu node (CollNet needs 2 or more)",
             c->nnodes);
  else if (env == NULL)
    snprintf(why, sizeof why,
             "NCCL_COLLNET_ENABLE was unset when NCCL created the communicator and "
             "ncclConfig_t.collnetEnable is not 1 (Megatron-Core deletes NCCL_COLLNET_ENABLE "
             "unless initialize_model_parallel(use_sharp=True), Megatron-LM's --use-sharp)");
  else if (enable != 1)
    snprintf(why, sizeof why, "NCCL_COLLNET_ENABLE=\"%.40s\" (NCCL reads it as %d)", env, enable);
  else
    snprintf(why, sizeof why,
             "NCCL_COLLNET_ENABLE=1 but NCCL did not set CollNet up (more than 8 GPUs per node, "
             "NCCL_ALGO without CollNet, or a CollNet setup failure in NCCL's INFO lines)");
  AGOQ_WARN("gradient compression is inactive on comm %llx: NCCL cannot use CollNet for an %s "
            "AllReduce of %zu bytes (AGOQ_FORMAT=%s, AGOQ_MIN_BYTES=%llu), so it stays exact: %s. "
            "Fix: NCCL_COLLNET_ENABLE=1 on every rank, or ncclConfig_t.collnetEnable=1, on 2 or "
            "more nodes",
            (unsigned long long)c->comm_id, agoq_tuner_dtype_name(dtype), nbytes,
            agoq_param_str(AGOQ_PARAM_FORMAT), (unsigned long long)c->min_bytes, why);
}

ncclResult_t agoq_tuner_get_coll_info(void* ctx, int coll_type, size_t nbytes,
                                      float** cost_table, int num_algo, int num_proto,
                                      int* nchannels) {
  (void)nchannels; /* NCCL's channel count stands */
  agoq_tuner_ctx* c = ctx;
  if (c == NULL || c->magic != AGOQ_TUNER_MAGIC || cost_table == NULL || !c->enabled)
    return ncclSuccess;
  if (coll_type != ncclFuncAllReduce && coll_type != ncclFuncReduceScatter) return ncclSuccess;
  /* Every AllReduce takes its API call's record, used or not, so none answers a later one. */
  int dtype = coll_type == ncclFuncAllReduce ? agoq_prof_allreduce_take(c->comm_id, nbytes) : -1;
  if ((uint64_t)nbytes < c->min_bytes) return ncclSuccess;
  float* table = (float*)cost_table; /* really float[num_algo][num_proto] */
  int algo = agoq_tuner_collnet_algo(table, num_algo, num_proto);
  if (algo < 0) {
    if (agoq_tuner_dtype_is_float(dtype)) {
      agoq_tuner_warn_inactive(c, dtype, nbytes);
      return ncclSuccess;
    }
    /* Type unknown (or not a float): true, but no reason to alarm anyone. */
    if (atomic_exchange_explicit(&c->logged_keep, 1, memory_order_relaxed) == 0)
      AGOQ_INFO(NCCL_TUNING,
                "tuner: comm %llx: CollNet is not usable for %s of %zu bytes (nodes %zu, "
                "NCCL_COLLNET_ENABLE unset?); NCCL's algorithm choice stands",
                (unsigned long long)c->comm_id, agoq_tuner_func_name(coll_type), nbytes,
                c->nnodes);
    return ncclSuccess;
  }
  /* A type the profiler established as not a float goes exact on CollNet: NCCL's own
   * estimates hold. An unknown one (ReduceScatter, or no profiler) is costed as bf16, the
   * float type whose frames save least. */
  if (dtype >= 0 && !agoq_tuner_dtype_is_float(dtype)) return ncclSuccess;
  agoq_dtype t = dtype == ncclFloat32 ? AGOQ_DTYPE_FP32 : dtype == ncclFloat16 ? AGOQ_DTYPE_FP16 : AGOQ_DTYPE_BF16;
  if (!c->sched.ok) return ncclSuccess;
  double ratio = agoq_tuner_wire_ratio(c->format, t, c->block, nbytes);
  agoq_tuner_estimate e;
  agoq_tuner_estimate_collnet(table, num_algo, num_proto, algo, nbytes, ratio, c->codec_mbps, &c->sched,
                              coll_type == ncclFuncAllReduce, t, &e);
  if (e.net_us < 0.0) return ncclSuccess; /* NCCL's CollNet estimate is not positive: nothing to scale */
  /* Both CollNet rows, every usable protocol: whichever NCCL runs, agoq compresses it. Each
   * entry scales as the costed one does (agoq's network time over NCCL's), plus the codec. */
  double scale = e.net_us / e.collnet_us;
  static const int rows[] = {AGOQ_NCCL_ALGO_COLLNET_CHAIN, AGOQ_NCCL_ALGO_COLLNET_DIRECT};
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    if (rows[r] >= num_algo) continue;
    for (int p = 0; p < num_proto; p++) {
      float* v = &table[rows[r] * num_proto + p];
      if (*v >= 0.0f) *v = (float)((double)*v * scale + e.codec_us);
    }
  }
  const char* name = algo == AGOQ_NCCL_ALGO_COLLNET_CHAIN ? "COLLNET_CHAIN" : "COLLNET_DIRECT";
  _Atomic int* once = e.compress ? &c->logged_steer : &c->logged_cost;
  if (atomic_exchange_explicit(once, 1, memory_order_relaxed) == 0)
    AGOQ_INFO(NCCL_TUNING,
              "tuner: comm %llx: %s of %zu bytes (%s): %s, compressed to %s, estimated %.0f us = agoq's schedule "
              "(%d x %d grid of %zu nodes, wire ratio %.3f) %.0f us at the rate of NCCL's CollNet estimate %.0f us, "
              "+ codec %.0f us at %.0f MB/s, against NCCL's best other choice %.0f us (algorithm %d, protocol %d): "
              "%s",
              (unsigned long long)c->comm_id, agoq_tuner_func_name(coll_type), nbytes,
              dtype >= 0 ? agoq_tuner_dtype_name(dtype) : "type unknown, costed as bf16", name,
              agoq_param_str(AGOQ_PARAM_FORMAT), e.agoq_us, e.grid.a, e.grid.b, c->nnodes, e.ratio,
              e.net_us, e.collnet_us, e.codec_us, c->codec_mbps, e.best_other_us, e.algo, e.proto,
              e.compress ? "compression is cheaper, NCCL will pick it" : "NCCL's choice is cheaper and stands");
  return ncclSuccess;
}

ncclResult_t agoq_tuner_get_chunk_size(void* ctx, int coll_type, size_t nbytes, int algo, int proto, int nchannels,
                                       size_t* chunk) {
  agoq_tuner_ctx* c = ctx;
  if (c == NULL || c->magic != AGOQ_TUNER_MAGIC || chunk == NULL || *chunk == 0 || nchannels <= 0 ||
      c->nnodes < 2 || algo != AGOQ_NCCL_ALGO_COLLNET_CHAIN || proto != AGOQ_NCCL_PROTO_SIMPLE)
    return ncclSuccess;
  size_t gpus = c->nranks / c->nnodes > 0 ? c->nranks / c->nnodes : 1; /* the chain's depth */
  size_t want = *chunk;
  while (want * 2 <= c->chain_step &&
         nbytes / ((size_t)nchannels * want * 2) >= AGOQ_TUNER_CHAIN_CHUNKS_PER_GPU * gpus)
    want *= 2;
  if (want == *chunk) return ncclSuccess;
  if (atomic_exchange(&c->logged_chunk, 1) == 0)
    AGOQ_INFO(NCCL_TUNING, "tuner: comm %llx: %s of %zu bytes on CollNetChain in chunks of %zu bytes instead of "
                           "NCCL's %zu (CollNet calls of up to %zu bytes; at most NCCL_BUFFSIZE/8 = %zu, %d chunks "
                           "per channel and GPU of the chain at least); said once per communicator",
              (unsigned long long)c->comm_id, coll_type == ncclFuncAllReduce ? "AllReduce" : "a collective", nbytes,
              want, *chunk, AGOQ_TUNER_COLLNET_GROUP * want, c->chain_step, AGOQ_TUNER_CHAIN_CHUNKS_PER_GPU);
  *chunk = want;
  return ncclSuccess;
}

ncclResult_t agoq_tuner_finalize(void* ctx) {
  agoq_tuner_ctx* c = ctx;
  if (c == NULL || c->magic != AGOQ_TUNER_MAGIC) return ncclSuccess;
  c->magic = 0;
  free(c);
  return ncclSuccess;
}
