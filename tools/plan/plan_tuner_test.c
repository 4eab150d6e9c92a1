/* agoq-plan and agoq's tuner must decide alike: for each documented job of
 * docs/when-it-helps.md (and a few around them: 10 Gbit/s, a faster codec, the distributed
 * optimizer with and without NVSwitch, TP across nodes), the plan's choice for every
 * reduction group is compared with what the real tuner (its exported v6 table, linked in)
 * does to an NCCL cost table built from the same modelled estimates. Also: the layouts the
 * plan refuses, and grouped-query attention's parameter count. Plain C (no cmocka: tools/
 * is configured before tests/ finds it); exits 1 on the first failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/agoq_nccl_profiler_v6.h"
#include "abi/agoq_nccl_tuner_v6.h"
#include "core/agoq_params.h"
#include "tuner/agoq_tuner_cost.h"
#include "plan_model.h"

extern const ncclTuner_v6_t ncclTunerPlugin_v6;
extern const ncclProfiler_v6_t ncclProfiler_v6;

static int failures;
#define CHECK(cond, ...)                                       \
  do {                                                         \
    if (!(cond)) {                                             \
      fprintf(stderr, "plan_tuner_test:%d: ", __LINE__);       \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, " [%s]\n", #cond);                       \
      failures++;                                              \
    }                                                          \
  } while (0)

enum { NA = NCCL_NUM_ALGORITHMS_V5, NP = NCCL_NUM_PROTOCOLS_V5 };

/* LLaMA2-13B as in docs/when-it-helps.md: 8 nodes of 8, TP 8, PP 4, DP 2, 32K tokens. */
static agoq_plan_job job_13b(double gbps) {
  agoq_plan_job j = {.layers = 40, .hidden = 5120, .heads = 40, .ffn_hidden = 13824, .swiglu = true,
                     .vocab = 32000, .seq = 32768, .micro_batch = 1, .global_batch = 16, .tp = 8, .pp = 4,
                     .dp = 2, .gpus_per_node = 8, .grad_bytes = 4, .nic_gbps = gbps};
  return j;
}

/* What the tuner does with one collective whose NCCL estimates are the plan's: ring (and a
 * slower tree) at the group's bytes at line rate, CollNet the same where NCCL would offer it
 * (AllReduce: CollNet-Chain; ReduceScatter: CollNet-Direct, with NVSwitch only). Returns
 * whether NCCL then picks CollNet. */
static int tuner_decides(const agoq_plan_job* j, const agoq_plan_group* g, bool allreduce, uint64_t comm) {
  void* ctx = NULL;
  ncclTunerConstants_v6_t constants;
  memset(&constants, 0, sizeof constants);
  ncclNvlDomainInfo_v6_t nvl = {1, 8, 8};
  /* NCCL's nNodes for this group: the nodes it spans (its CollNet group's size). */
  if (ncclTunerPlugin_v6.init(&ctx, comm, (size_t)j->dp, (size_t)g->nodes, NULL, &nvl, &constants) != ncclSuccess)
    return -1;
  size_t nbytes = (size_t)g->codec_bytes;
  if (allreduce) { /* the profiler tells the tuner an AllReduce's type, as NCCL's enqueue does */
    void* pctx = NULL;
    int mask = 0;
    if (ncclProfiler_v6.init(&pctx, comm, &mask, "c", 2, 8, 0, NULL) != ncclSuccess) return -1;
    ncclProfilerEventDescr_v6_t d = {.type = ncclProfileCollApi};
    d.collApi.func = "AllReduce";
    d.collApi.datatype = g->elem_bytes == 4 ? "ncclFloat32" : "ncclBfloat16";
    d.collApi.count = nbytes / (size_t)g->elem_bytes;
    void* h = NULL;
    ncclProfiler_v6.startEvent(pctx, &h, &d);
    ncclProfiler_v6.finalize(pctx);
  }
  float us = (float)(agoq_plan_seconds(j, g->comm_bytes) * 1e6);
  float t[NA][NP];
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++) t[a][p] = AGOQ_NCCL_ALGO_PROTO_IGNORE;
  t[AGOQ_NCCL_ALGO_RING][AGOQ_NCCL_PROTO_SIMPLE] = us;
  t[AGOQ_NCCL_ALGO_TREE][AGOQ_NCCL_PROTO_SIMPLE] = us * 1.1f;
  if (allreduce)
    t[AGOQ_NCCL_ALGO_COLLNET_CHAIN][AGOQ_NCCL_PROTO_SIMPLE] = us;
  else if (j->nvswitch)
    t[AGOQ_NCCL_ALGO_COLLNET_DIRECT][AGOQ_NCCL_PROTO_SIMPLE] = us;
  int nch = 0;
  ncclTunerPlugin_v6.getCollInfo(ctx, allreduce ? ncclFuncAllReduce : ncclFuncReduceScatter, nbytes, 1,
                                 (float**)t, NA, NP, 0, &nch);
  ncclTunerPlugin_v6.finalize(ctx);
  int best_a = -1;
  float best = -1.0f;
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++)
      if (t[a][p] >= 0.0f && (best < 0.0f || t[a][p] < best)) best = t[a][p], best_a = a;
  return best_a == AGOQ_NCCL_ALGO_COLLNET_CHAIN || best_a == AGOQ_NCCL_ALGO_COLLNET_DIRECT;
}

static int seen_compress, seen_exact;

/* Every reduction group of the job, in each format: plan and tuner agree. Returns the DP
 * gradients' decision in the last format. */
static bool agree(const char* what, const agoq_plan_job* j, const char* formats) {
  static uint64_t comm = 1000;
  agoq_plan_result r;
  char why[320];
  CHECK(agoq_plan_compute(j, &r, why, sizeof why) == 0, "%s: %s", what, why);
  bool dp = false;
  char list[64];
  snprintf(list, sizeof list, "%s", formats);
  for (char *save = NULL, *name = strtok_r(list, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
    setenv("AGOQ_FORMAT", name, 1);
    agoq_params_reset();
    CHECK(agoq_params_load() == ncclSuccess, "%s: AGOQ_* invalid", what);
    /* the plan's codec speed is the tuner's setting, chosen the same way */
    double mbps = agoq_tuner_codec_setting(NULL);
    agoq_format f = (agoq_format)agoq_param_int(AGOQ_PARAM_FORMAT);
    for (int i = 0; i < AGOQ_PLAN_NGROUPS; i++) {
      const agoq_plan_group* g = &r.g[i];
      if (g->node_bytes <= 0 || (g->path != AGOQ_PLAN_TUNER && g->path != AGOQ_PLAN_NO_COLLNET)) continue;
      agoq_plan_choice c;
      agoq_plan_choose(j, g, f, 128, mbps, &c);
      bool allreduce = strncmp(g->collective, "AllReduce", 9) == 0;
      int t = tuner_decides(j, g, allreduce, comm++);
      CHECK(t == (int)c.compressed, "%s, %s, %s: plan says %s, tuner %s", what, g->name, name,
            c.compressed ? "compressed" : "exact", t ? "compressed" : "exact");
      if (c.compressed) seen_compress++;
      else seen_exact++;
      if (i == AGOQ_PLAN_DP_GRADS) dp = c.compressed;
    }
  }
  unsetenv("AGOQ_FORMAT");
  agoq_params_reset();
  return dp;
}

static void test_documented_examples(void) {
  unsetenv("AGOQ_CODEC_MBPS");
  /* docs/when-it-helps.md: 200 Gbit/s InfiniBand and 25 Gbit/s Ethernet, int8 and int4; at
   * the default 5000 MB/s the tuner keeps NCCL's ring for the gradients in both (the page
   * says so, with the numbers). */
  agoq_plan_job j = job_13b(200);
  CHECK(!agree("13B, 200 Gbit/s", &j, "int8,int4"), "200 Gbit/s: gradients should stay exact");
  j = job_13b(25);
  CHECK(!agree("13B, 25 Gbit/s", &j, "int8,int4"), "25 Gbit/s: gradients should stay exact");
  j.dist_opt = true;
  CHECK(!agree("13B, 25 Gbit/s, distributed optimizer, no NVSwitch", &j, "int8"), "RS without NVSwitch is exact");
  j.nvswitch = true;
  agree("13B, 25 Gbit/s, distributed optimizer, NVSwitch", &j, "int8,int4");
  /* 10 Gbit/s: the codec's 0.67 s is less than the wire saves; the page's example. */
  j = job_13b(10);
  CHECK(agree("13B, 10 Gbit/s", &j, "int8,int4"), "10 Gbit/s: gradients should be compressed");
  j.dist_opt = true, j.nvswitch = true;
  agree("13B, 10 Gbit/s, distributed optimizer, NVSwitch", &j, "int8,int4");
  /* A GPU-speed codec set through the same parameter the tuner reads: 25 Gbit/s pays. */
  setenv("AGOQ_CODEC_MBPS", "50000", 1);
  j = job_13b(25);
  CHECK(agree("13B, 25 Gbit/s, AGOQ_CODEC_MBPS=50000", &j, "int8,int4"), "a fast codec should compress");
  unsetenv("AGOQ_CODEC_MBPS");
  /* The reductions on the GPU (AGOQ_GPU=on, AGOQ_COLLNET_GPU=1, settings): the model takes
   * the GPU codec's figure, and 25 Gbit/s pays at AGOQ_CODEC_MBPS's default; AGOQ_GPU=auto
   * (this machine's facts decide, not a setting) or AGOQ_COLLNET_GPU=0 keep the CPU's. */
  setenv("AGOQ_GPU", "on", 1);
  j = job_13b(25);
  CHECK(agree("13B, 25 Gbit/s, AGOQ_GPU=on", &j, "int8,int4"), "the GPU codec should compress");
  const char* which = NULL;
  agoq_params_reset();
  CHECK(agoq_params_load() == ncclSuccess && agoq_tuner_codec_setting(&which) == 1e6 &&
            strcmp(which, "AGOQ_GPU_CODEC_MBPS") == 0,
        "AGOQ_GPU=on: the GPU codec's default figure, got %s", which);
  setenv("AGOQ_COLLNET_GPU", "0", 1);
  CHECK(!agree("13B, 25 Gbit/s, AGOQ_GPU=on, AGOQ_COLLNET_GPU=0", &j, "int8,int4"), "CPU reductions stay exact");
  unsetenv("AGOQ_COLLNET_GPU");
  setenv("AGOQ_GPU", "auto", 1);
  CHECK(!agree("13B, 25 Gbit/s, AGOQ_GPU=auto", &j, "int8,int4"), "auto costs the CPU codec");
  unsetenv("AGOQ_GPU");
  /* TP across nodes: its bf16 AllReduces are the tuner's too. */
  j = job_13b(25);
  j.tp = 16, j.pp = 2, j.dp = 2, j.heads = 80;
  agree("13B, TP 16 over 2 nodes, 25 Gbit/s", &j, "int8,int4");
  j.nic_gbps = 2;
  agree("13B, TP 16 over 2 nodes, 2 Gbit/s", &j, "int8,int4");
  CHECK(seen_compress > 0 && seen_exact > 0, "both decisions covered (%d compressed, %d exact)", seen_compress,
        seen_exact);
}

static void refused(const char* what, agoq_plan_job j, const char* flag) {
  agoq_plan_result r;
  char why[320] = "";
  CHECK(agoq_plan_compute(&j, &r, why, sizeof why) != 0, "%s: not refused", what);
  CHECK(strstr(why, flag) != NULL, "%s: the reason '%s' does not name %s", what, why, flag);
}

static void test_irregular_layouts(void) {
  agoq_plan_job j = job_13b(100);
  j.tp = 3, j.pp = 1, j.dp = 8, j.heads = 39, j.hidden = 5112; /* TP 3 of 8-GPU nodes straddles them */
  refused("TP 3 on 8-GPU nodes", j, "--tp 3");
  j = job_13b(100);
  j.tp = 2, j.dp = 3, j.pp = 4, j.global_batch = 12; /* 24 GPUs, 3 nodes, DP groups straddle */
  refused("TP 2 x DP 3 on 8-GPU nodes", j, "--dp 3");
  j = job_13b(100);
  j.pp = 3, j.layers = 39; /* 48 GPUs: 6 nodes, fine */
  agoq_plan_result r;
  char why[320];
  CHECK(agoq_plan_compute(&j, &r, why, sizeof why) == 0, "TP 8 PP 3 DP 2 refused: %s", why);
  j = job_13b(100);
  j.tp = 8, j.pp = 3, j.dp = 1, j.gpus_per_node = 16; /* 24 GPUs on 16-GPU nodes */
  refused("24 GPUs on 16-GPU nodes", j, "--gpus-per-node 16");
  j = job_13b(100);
  j.kv_heads = 6; /* does not divide 40 heads */
  refused("6 K/V heads of 40", j, "--kv-heads 6");
  j.kv_heads = 4; /* divides 40 but not a multiple of TP 8 */
  refused("4 K/V heads on TP 8", j, "--kv-heads 4");
  /* TP across whole nodes is modelled: its AllReduces are on the NIC. */
  j = job_13b(100);
  j.tp = 16, j.pp = 2, j.dp = 2, j.kv_heads = 0, j.heads = 80;
  CHECK(agoq_plan_compute(&j, &r, why, sizeof why) == 0, "TP 16 refused: %s", why);
  CHECK(r.g[AGOQ_PLAN_TP].node_bytes > 0, "TP 16 over 8-GPU nodes puts nothing on the NIC");
}

static void test_gqa_parameters(void) {
  /* LLaMA2-70B: 8 K/V heads of 64; about 69 B parameters (78 B with K/V at full width). */
  agoq_plan_job j = {.layers = 80, .hidden = 8192, .heads = 64, .kv_heads = 8, .ffn_hidden = 28672, .swiglu = true,
                     .vocab = 32000, .seq = 4096, .micro_batch = 1, .global_batch = 16, .tp = 8, .pp = 4, .dp = 2,
                     .gpus_per_node = 8, .grad_bytes = 4, .nic_gbps = 100};
  agoq_plan_result r;
  char why[320];
  CHECK(agoq_plan_compute(&j, &r, why, sizeof why) == 0, "70B refused: %s", why);
  CHECK(fabs(r.params / 1e9 - 68.98) < 0.01, "LLaMA2-70B: %.3f B parameters, expected 68.98", r.params / 1e9);
  j.kv_heads = 0; /* full-width K/V: the old, wrong count */
  CHECK(agoq_plan_compute(&j, &r, why, sizeof why) == 0, "70B MHA refused: %s", why);
  CHECK(r.params / 1e9 > 77.0, "70B with 64 K/V heads: %.3f B", r.params / 1e9);
  /* K/V heads equal to the heads are plain multi-head attention: LLaMA2-13B's 13.02 B. */
  j = job_13b(100);
  j.kv_heads = 40;
  CHECK(agoq_plan_compute(&j, &r, why, sizeof why) == 0, "13B refused: %s", why);
  CHECK(fabs(r.params / 1e9 - 13.016) < 0.005, "LLaMA2-13B: %.3f B parameters", r.params / 1e9);
}

int main(void) {
  setenv("AGOQ_MIN_BYTES", "0", 1);
  test_documented_examples();
  test_irregular_layouts();
  test_gqa_parameters();
  if (failures > 0) {
    fprintf(stderr, "plan_tuner_test: %d failures\n", failures);
    return 1;
  }
  printf("plan_tuner_test: plan and tuner agree (%d compressed, %d exact); layouts and GQA checked\n", seen_compress,
         seen_exact);
  return 0;
}
