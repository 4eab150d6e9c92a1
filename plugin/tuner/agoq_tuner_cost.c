/* The tuner's cost model (agoq_tuner_cost.h). */
#include "tuner/agoq_tuner_cost.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "abi/agoq_nccl_tuner_v5.h"
#include "agoq_frame.h"
#include "core/agoq_params.h"

double agoq_tuner_wire_ratio(agoq_format f, agoq_dtype t, uint32_t block, size_t nbytes) {
  agoq_codec_params p = {.format = f, .dtype = t, .block = block};
  return agoq_frame_wire_ratio(&p, nbytes / agoq_dtype_size(t));
}

double agoq_tuner_codec_setting(const char** which) {
  /* AGOQ_GPU's value as set, not the process's decision (auto turns the path on or off on
   * this machine's facts, which a rank's neighbours need not share). */
  bool gpu = agoq_param_int(AGOQ_PARAM_GPU) == 1 /* on */ && agoq_param_int(AGOQ_PARAM_COLLNET_GPU) != 0;
  agoq_param_id id = gpu ? AGOQ_PARAM_GPU_CODEC_MBPS : AGOQ_PARAM_CODEC_MBPS;
  if (which != NULL) *which = gpu ? "AGOQ_GPU_CODEC_MBPS" : "AGOQ_CODEC_MBPS";
  return (double)agoq_param_int(id);
}

double agoq_tuner_codec_us(double nbytes, double codec_mbps) {
  if (codec_mbps <= 0.0) return INFINITY;
  return 2.0 * nbytes / codec_mbps; /* bytes / (MB/s) = microseconds */
}

void agoq_tuner_sched_setting(size_t nodes, agoq_tuner_sched* s) {
  memset(s, 0, sizeof *s);
  if (nodes < 2 || nodes > AGOQ_COLL_GRID_COLS_MAX * (size_t)AGOQ_COLL_GRID_COLS_MAX) return;
  int n = (int)nodes, a = 0, b = 0;
  char why[160];
  long long chunk = agoq_param_int(AGOQ_PARAM_COLLNET_CHUNK);
  double chunk_bytes = chunk < 0 ? 0.0 : (double)chunk; /* auto: per schedule, as the group resolves it */
  /* The grid's own parser, as the group's creation reads it: a value it refuses, or a grid
   * that does not hold n, is costed as the automatic choice. */
  if (agoq_coll_grid_parse(agoq_param_str(AGOQ_PARAM_COLLNET_GRID), &a, &b, why, sizeof why) != 0 ||
      agoq_coll_plans_make(n, a, b, chunk_bytes, &s->plans, why, sizeof why) != 0) {
    if (agoq_coll_plans_make(n, 0, 0, chunk_bytes, &s->plans, why, sizeof why) != 0) return;
  }
  s->pick = (agoq_coll_pick_in){.format = (agoq_format)agoq_param_int(AGOQ_PARAM_FORMAT),
                                .block = AGOQ_CODEC_BLOCK_MIN << agoq_param_int(AGOQ_PARAM_BLOCK), /* 32|...|1024 */
                                .frame_partials = agoq_param_int(AGOQ_PARAM_COLLNET_PARTIALS) == 1,
                                .io_threads = (int)agoq_param_int(AGOQ_PARAM_COLLNET_IO_THREADS)};
  s->ok = true;
}

double agoq_tuner_network_us(const agoq_tuner_sched* s, bool allreduce, agoq_dtype t, double ratio, double nbytes,
                             double collnet_us, agoq_coll_grid* grid) {
  if (!s->ok || nbytes <= 0.0 || collnet_us <= 0.0) return -1.0;
  int nccl_type = t == AGOQ_DTYPE_FP32 ? ncclFloat32 : t == AGOQ_DTYPE_FP16 ? ncclFloat16 : ncclBfloat16;
  double link_Bps = 2.0 * nbytes / (collnet_us * 1e-6);
  /* The schedule the group would run on links of this rate. */
  agoq_coll_pick_in pick = s->pick;
  pick.link_Bps = link_Bps;
  const agoq_coll_plan* pl = &s->plans.plan[agoq_coll_plans_pick(&s->plans, &pick, NULL)];
  if (grid != NULL) *grid = pl->grid;
  double chunk = agoq_coll_cost_chunk(pl->chunk_bytes, AGOQ_TUNER_COLLNET_CALL_BYTES, nbytes);
  agoq_coll_cost_in in = {
      .chunk_bytes = chunk,
      .wire_ratio = ratio,
      .partial_ratio = agoq_coll_cost_partial_ratio(nccl_type, ncclSum, ratio < 1.0, pick.frame_partials, ratio),
      .link_Bps = link_Bps,
      .alpha_s = AGOQ_COLL_COST_ALPHA_S,
      .o_s = AGOQ_COLL_COST_O_S,
      .steps = allreduce ? 0 : AGOQ_COLL_COST_RS,
      .io_threads = pick.io_threads,
      .peers = agoq_coll_cost_peers(&pl->grid),
  };
  agoq_coll_cost c;
  agoq_coll_cost_eval(&pl->prof, &in, &c);
  return agoq_coll_cost_seconds(&c, chunk, nbytes, AGOQ_TUNER_COLLNET_CALL_BYTES, AGOQ_COLL_COST_CALLS,
                                AGOQ_COLL_COST_CALLS) * 1e6;
}

void agoq_tuner_cost_compare(double best_other_us, double collnet_us, double net_us, double ratio, double nbytes,
                             double codec_mbps, agoq_tuner_estimate* e) {
  memset(e, 0, sizeof *e);
  e->algo = e->proto = -1;
  e->best_other_us = best_other_us;
  e->collnet_us = collnet_us;
  e->ratio = ratio;
  e->net_us = net_us;
  e->codec_us = agoq_tuner_codec_us(nbytes, codec_mbps);
  e->agoq_us = net_us + e->codec_us;
  e->compress = net_us >= 0.0 && (best_other_us < 0.0 || e->agoq_us < best_other_us);
}

void agoq_tuner_estimate_collnet(const float* table, int num_algo, int num_proto, int collnet_algo, size_t nbytes,
                                 double ratio, double codec_mbps, const agoq_tuner_sched* s, bool allreduce,
                                 agoq_dtype t, agoq_tuner_estimate* e) {
  int best_a = -1, best_p = -1;
  double best = -1.0;
  for (int a = 0; a < num_algo; a++) {
    if (a == AGOQ_NCCL_ALGO_COLLNET_CHAIN || a == AGOQ_NCCL_ALGO_COLLNET_DIRECT) continue;
    for (int p = 0; p < num_proto; p++) {
      float v = table[a * num_proto + p];
      if (v >= 0.0f && (best < 0.0 || v < best)) {
        best = v;
        best_a = a;
        best_p = p;
      }
    }
  }
  double collnet_us = table[collnet_algo * num_proto + AGOQ_NCCL_PROTO_SIMPLE];
  agoq_coll_grid grid = {0};
  agoq_tuner_cost_compare(best, collnet_us,
                          agoq_tuner_network_us(s, allreduce, t, ratio, (double)nbytes, collnet_us, &grid), ratio,
                          (double)nbytes, codec_mbps, e);
  e->grid = grid;
  e->algo = best_a;
  e->proto = best_p;
}

double agoq_tuner_codec_mbps_measure(double (*clock_s)(void), int rounds) {
  enum { N = 512 * 1024 }; /* 1 MiB of bf16 */
  agoq_codec_params p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 128};
  size_t cap = agoq_codec_body_size_max(&p, N);
  uint16_t* src = malloc((size_t)N * sizeof *src);
  uint16_t* dst = malloc((size_t)N * sizeof *dst);
  uint8_t* body = malloc(cap);
  double mbps = 0.0;
  if (src == NULL || dst == NULL || body == NULL || rounds < 1) goto out;
  /* Gradient-like values: bf16 of a slowly varying sign and magnitude. */
  uint32_t x = 12345;
  for (size_t i = 0; i < N; i++) {
    x = x * 1664525u + 1013904223u;
    src[i] = (uint16_t)(0x3c00u + ((x >> 20) & 0x7ffu)) | (uint16_t)((x >> 31) << 15);
  }
  double t0 = 0.0;
  for (int r = -1; r < rounds; r++) {
    if (r == 0) t0 = clock_s();
    size_t len = 0;
    if (agoq_quantize(&p, src, N, body, cap, &len, NULL) != AGOQ_CODEC_OK ||
        agoq_dequantize(&p, body, len, N, AGOQ_DTYPE_BF16, dst) != AGOQ_CODEC_OK)
      goto out;
  }
  double dt = clock_s() - t0;
  if (dt > 0.0) mbps = (double)rounds * (double)N * 2.0 / dt / 1e6;
out:
  free(src);
  free(dst);
  free(body);
  return mbps;
}
