/* The tuner: per-communicator policy read once at init, one cost-table edit per eligible
 * collective, one INFO line per communicator saying what it did. */
#include "tuner/agoq_tuner.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "abi/agoq_nccl_tuner_v5.h"
#include "core/agoq_check.h"
#include "core/agoq_params.h"

#define AGOQ_TUNER_MAGIC 0x4e555441u /* "ATUN" */

typedef struct {
  uint32_t magic;
  uint64_t comm_id;
  size_t nranks, nnodes;
  bool enabled;       /* AGOQ_FORMAT != none and the parameters loaded */
  uint64_t min_bytes; /* AGOQ_MIN_BYTES */
  _Atomic int logged_steer; /* the per-communicator lines were printed: CollNet chosen */
  _Atomic int logged_keep;  /* ... and eligible but CollNet unusable */
} agoq_tuner_ctx;

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
  atomic_init(&c->logged_steer, 0);
  atomic_init(&c->logged_keep, 0);
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

ncclResult_t agoq_tuner_get_coll_info(void* ctx, int coll_type, size_t nbytes,
                                      float** cost_table, int num_algo, int num_proto,
                                      int* nchannels) {
  (void)nchannels; /* NCCL's channel count stands */
  agoq_tuner_ctx* c = ctx;
  if (c == NULL || c->magic != AGOQ_TUNER_MAGIC || cost_table == NULL || !c->enabled)
    return ncclSuccess;
  if (coll_type != ncclFuncAllReduce && coll_type != ncclFuncReduceScatter) return ncclSuccess;
  if ((uint64_t)nbytes < c->min_bytes) return ncclSuccess;
  float* table = (float*)cost_table; /* really float[num_algo][num_proto] */
  int algo = agoq_tuner_collnet_algo(table, num_algo, num_proto);
  if (algo < 0) {
    if (atomic_exchange_explicit(&c->logged_keep, 1, memory_order_relaxed) == 0)
      AGOQ_INFO(NCCL_TUNING,
                "tuner: comm %llx: CollNet is not usable for %s of %zu bytes (nodes %zu, "
                "NCCL_COLLNET_ENABLE unset?); NCCL's algorithm choice stands",
                (unsigned long long)c->comm_id, agoq_tuner_func_name(coll_type), nbytes,
                c->nnodes);
    return ncclSuccess;
  }
  /* Cheapest wins: every other usable entry is a positive time. */
  table[algo * num_proto + AGOQ_NCCL_PROTO_SIMPLE] = 0.0f;
  if (atomic_exchange_explicit(&c->logged_steer, 1, memory_order_relaxed) == 0)
    AGOQ_INFO(NCCL_TUNING,
              "tuner: comm %llx: AllReduce/ReduceScatter of at least %llu bytes go to %s/SIMPLE "
              "(AGOQ_FORMAT=%s); first: %s of %zu bytes",
              (unsigned long long)c->comm_id, (unsigned long long)c->min_bytes,
              algo == AGOQ_NCCL_ALGO_COLLNET_CHAIN ? "COLLNET_CHAIN" : "COLLNET_DIRECT",
              agoq_param_str(AGOQ_PARAM_FORMAT), agoq_tuner_func_name(coll_type), nbytes);
  return ncclSuccess;
}

ncclResult_t agoq_tuner_finalize(void* ctx) {
  agoq_tuner_ctx* c = ctx;
  if (c == NULL || c->magic != AGOQ_TUNER_MAGIC) return ncclSuccess;
  c->magic = 0;
  free(c);
  return ncclSuccess;
}
