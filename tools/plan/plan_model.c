/* agoq-plan's model (plan_model.h). */
#include "plan_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parameters of one decoder layer: attention (Q and output projections hidden x hidden, K
 * and V hidden x kv_heads x head size, so grouped-query attention's smaller K/V count as
 * such; biases for GPT, none for LLaMA), the MLP, and two norms. */
static double agoq_plan_layer_params(const agoq_plan_job* j) {
  double h = j->hidden, f = j->ffn_hidden > 0 ? j->ffn_hidden : 4.0 * j->hidden;
  double kv = j->kv_heads > 0 && j->heads > 0 ? (double)j->kv_heads * (h / j->heads) : h; /* K (or V) width */
  if (j->swiglu) return 2.0 * h * h + 2.0 * h * kv + 3.0 * h * f + 2.0 * h; /* LLaMA: no biases, RMSNorm */
  return 2.0 * h * h + 2.0 * h * kv + (2.0 * h + 2.0 * kv) + 2.0 * h * f + f + h + 4.0 * h; /* GPT: biases, LayerNorm */
}

/* Distinct nodes the ranks {base + stride * i, i < n} sit on, and members on each (the
 * groups are regular, agoq_plan_compute refuses other layouts: every node holds the same
 * count). */
static void agoq_plan_span(long long base, long long stride, int n, int gpus_per_node, int* nodes, int* per_node) {
  int count = 0;
  long long last = -1;
  for (int i = 0; i < n; i++) {
    long long node = (base + stride * i) / gpus_per_node;
    if (node != last) count++;
    last = node;
  }
  *nodes = count;
  *per_node = n / count;
}

/* a divides b or b divides a: the groups of a consecutive ranks tile nodes of b evenly. */
static bool agoq_plan_nests(long long a, long long b) { return a % b == 0 || b % a == 0; }

/* The refusals: each names the flags to change. */
static int agoq_plan_check(const agoq_plan_job* j, char* why, size_t why_len) {
  long long world = (long long)j->tp * j->pp * j->dp, td = (long long)j->tp * j->dp;
  if (j->tp < 1 || j->pp < 1 || j->dp < 1 || j->gpus_per_node < 1 || world % j->gpus_per_node != 0) {
    snprintf(why, why_len, "--tp %d x --pp %d x --dp %d = %lld GPUs is not a whole number of nodes of --gpus-per-node %d",
             j->tp, j->pp, j->dp, world, j->gpus_per_node);
    return -1;
  }
  /* A TP group of 3 on 8-GPU nodes straddles a node boundary in some groups and not in
   * others; the busiest node's traffic then depends on which, and NCCL's ring inside such a
   * group is not what this model counts. Refused rather than reported as 0 bytes. */
  if (!agoq_plan_nests(j->tp, j->gpus_per_node)) {
    snprintf(why, why_len,
             "--tp %d neither divides --gpus-per-node %d nor is a multiple of it: some tensor-parallel groups would "
             "straddle nodes and others not, which this model does not cover",
             j->tp, j->gpus_per_node);
    return -1;
  }
  if (!agoq_plan_nests(td, j->gpus_per_node)) {
    snprintf(why, why_len,
             "--tp %d x --dp %d = %lld neither divides --gpus-per-node %d nor is a multiple of it: data-parallel groups "
             "(and pipeline stages) would straddle nodes unevenly, which this model does not cover",
             j->tp, j->dp, td, j->gpus_per_node);
    return -1;
  }
  if (j->layers < j->pp || j->layers % j->pp != 0) {
    snprintf(why, why_len, "--layers %d do not split evenly over --pp %d pipeline stages", j->layers, j->pp);
    return -1;
  }
  if (j->micro_batch < 1 || j->global_batch % (j->micro_batch * j->dp) != 0) {
    snprintf(why, why_len, "global batch %lld is not a multiple of micro batch %lld x DP %d", j->global_batch,
             j->micro_batch, j->dp);
    return -1;
  }
  if (j->hidden % j->tp != 0) {
    snprintf(why, why_len, "--hidden %d does not split over --tp %d", j->hidden, j->tp);
    return -1;
  }
  if (j->heads > 0 && (j->hidden % j->heads != 0 || j->heads % j->tp != 0)) {
    snprintf(why, why_len, "--heads %d must divide --hidden %d and be a multiple of --tp %d", j->heads, j->hidden,
             j->tp);
    return -1;
  }
  if (j->kv_heads > 0 && (j->heads == 0 || j->kv_heads > j->heads || j->heads % j->kv_heads != 0)) {
    snprintf(why, why_len, "--kv-heads %d must divide --heads %d", j->kv_heads, j->heads);
    return -1;
  }
  /* Megatron-Core splits the K/V heads (query groups) over TP and requires it to divide. */
  if (j->kv_heads > 0 && j->kv_heads % j->tp != 0) {
    snprintf(why, why_len, "--kv-heads %d is not a multiple of --tp %d (Megatron splits the query groups over TP)",
             j->kv_heads, j->tp);
    return -1;
  }
  return 0;
}

int agoq_plan_compute(const agoq_plan_job* j, agoq_plan_result* r, char* why, size_t why_len) {
  memset(r, 0, sizeof *r);
  if (agoq_plan_check(j, why, why_len) != 0) return -1;
  long long world = (long long)j->tp * j->pp * j->dp;
  r->nodes = (int)(world / j->gpus_per_node);
  r->micro_batches = j->global_batch / (j->micro_batch * j->dp);
  double layer = agoq_plan_layer_params(j);
  double embed = (double)j->vocab * j->hidden;
  double shapes = layer * j->layers + embed * (j->tied_embeddings ? 1 : 2) + 2.0 * j->hidden;
  double scale = j->params_b > 0 ? j->params_b * 1e9 / shapes : 1.0;
  r->params = shapes * scale;
  /* The largest stage: its layers plus an embedding (the first stage's input, the last's
   * output; both on one stage when PP is 1), all split over TP. */
  double stage = layer * (j->layers / j->pp) + embed * (j->pp == 1 && !j->tied_embeddings ? 2 : 1);
  r->params_per_gpu = stage * scale / j->tp;

  /* Data parallel: the groups {tp + TP*(dp + DP*pp), dp = 0..DP-1}. */
  int nodes = 0, per_node = 0;
  agoq_plan_span(0, j->tp, j->dp, j->gpus_per_node, &nodes, &per_node);
  int groups_on_node = j->gpus_per_node / per_node;
  double n = j->dp, G = r->params_per_gpu * j->grad_bytes;
  agoq_plan_group* g = &r->g[AGOQ_PLAN_DP_GRADS];
  g->name = "DP gradients";
  g->elem_bytes = j->grad_bytes;
  g->groups_on_node = groups_on_node;
  g->nodes = nodes;
  g->collective = j->dist_opt ? (j->grad_bytes == 4 ? "ReduceScatter fp32" : "ReduceScatter bf16")
                              : (j->grad_bytes == 4 ? "AllReduce fp32" : "AllReduce bf16");
  /* AllReduce runs on CollNet-Chain anywhere; ReduceScatter only on CollNet-Direct, which
   * NCCL sets up only with NVSwitch (NVLS) in the node (docs/usage.md). */
  g->path = !j->dist_opt || j->nvswitch ? AGOQ_PLAN_TUNER : AGOQ_PLAN_NO_COLLNET;
  g->tuner_as_bf16 = j->dist_opt; /* NCCL's profiler tells agoq only an AllReduce's type */
  g->no_collnet = "NCCL runs ReduceScatter on CollNet only as CollNet-Direct, which needs NVSwitch in the node "
                  "(--nvswitch no)";
  if (nodes > 1) {
    g->node_bytes = groups_on_node * (j->dist_opt ? 1.0 : 2.0) * (n - 1) / n * G;
    g->comm_bytes = g->node_bytes / groups_on_node;
    g->codec_bytes = G; /* the whole buffer: NCCL's nBytes of a ReduceScatter is too */
  }
  g = &r->g[AGOQ_PLAN_DP_PARAMS];
  g->name = "DP parameters";
  g->collective = j->dist_opt ? "AllGather bf16" : "(none: no distributed optimizer)";
  g->elem_bytes = 2;
  g->path = AGOQ_PLAN_EXACT;
  g->groups_on_node = groups_on_node;
  if (nodes > 1 && j->dist_opt) {
    g->node_bytes = groups_on_node * (n - 1) / n * r->params_per_gpu * 2.0;
    g->comm_bytes = g->node_bytes / groups_on_node;
  }

  /* Pipeline: each micro-batch's activations (bf16, split over TP as Megatron scatters
   * them) go forward across each stage boundary and their gradients come back. A node
   * holding stage s sends forward to s+1 and backward to s-1; the busiest sends both. Each
   * rank quantizes what it sends and dequantizes what it receives across nodes. */
  g = &r->g[AGOQ_PLAN_PP];
  g->name = "PP activations";
  g->collective = "Send/Recv bf16";
  g->path = AGOQ_PLAN_P2P;
  g->elem_bytes = 2;
  g->groups_on_node = 1;
  if (j->pp > 1) {
    double act = (double)j->seq * j->micro_batch * j->hidden * 2.0 / j->tp * (double)r->micro_batches;
    long long stride = (long long)j->tp * j->dp;
    double* sent = calloc((size_t)r->nodes, sizeof *sent);
    if (sent == NULL) {
      snprintf(why, why_len, "out of memory");
      return -1;
    }
    for (long long rank = 0; rank < world; rank++) {
      long long pos = rank / stride, node = rank / j->gpus_per_node;
      bool next = pos + 1 < j->pp && (rank + stride) / j->gpus_per_node != node;
      bool prev = pos > 0 && (rank - stride) / j->gpus_per_node != node;
      /* to and from each neighbour across a node boundary: activations one way, their
       * gradients the other */
      double rank_bytes = (next ? act : 0.0) + (prev ? act : 0.0);
      sent[node] += rank_bytes;
      if (rank_bytes > g->codec_bytes) g->codec_bytes = rank_bytes; /* sent = received */
    }
    for (int k = 0; k < r->nodes; k++)
      if (sent[k] > g->node_bytes) g->node_bytes = sent[k];
    free(sent);
    g->comm_bytes = g->node_bytes;
  }

  /* Tensor parallel: inside a node unless TP exceeds it (then a multiple of it); then four
   * all-reduces of the activations per layer and micro-batch (two forward, two backward). */
  g = &r->g[AGOQ_PLAN_TP];
  g->name = "TP activations";
  g->collective = "AllReduce bf16";
  g->elem_bytes = 2;
  g->path = AGOQ_PLAN_TUNER; /* a float AllReduce: agoq's CollNet compresses it like gradients */
  if (j->tp > j->gpus_per_node) {
    agoq_plan_span(0, 1, j->tp, j->gpus_per_node, &nodes, &per_node);
    double s = (double)j->seq * j->micro_batch * j->hidden * 2.0;
    double calls = 4.0 * (j->layers / j->pp) * (double)r->micro_batches;
    double per = 2.0 * (j->tp - 1) / j->tp * s;
    g->groups_on_node = j->gpus_per_node / per_node;
    g->nodes = nodes;
    g->comm_bytes = calls * per;
    g->node_bytes = g->groups_on_node * g->comm_bytes;
    g->codec_bytes = calls * s;
  }
  for (int i = 0; i < AGOQ_PLAN_NGROUPS; i++) r->total_bytes += r->g[i].node_bytes;
  return 0;
}

double agoq_plan_seconds(const agoq_plan_job* j, double bytes) { return bytes * 8.0 / (j->nic_gbps * 1e9); }

void agoq_plan_choose(const agoq_plan_job* j, const agoq_plan_group* g, agoq_format f, uint32_t block,
                      double codec_mbps, agoq_plan_choice* c) {
  memset(c, 0, sizeof *c);
  agoq_dtype t = g->elem_bytes == 4 ? AGOQ_DTYPE_FP32 : AGOQ_DTYPE_BF16;
  /* A large buffer's ratio (2^24 elements): the bucket sizes are not known here, and one
   * frame header is nothing on any bucket worth compressing. */
  c->ratio = agoq_tuner_wire_ratio(f, t, block, ((size_t)1 << 24) * (size_t)g->elem_bytes);
  c->exact_s = agoq_plan_seconds(j, g->node_bytes);
  c->wire_s = c->exact_s * c->ratio;
  c->time_s = c->exact_s;
  c->tuner.algo = c->tuner.proto = -1;
  if (g->node_bytes <= 0.0) return;
  if (g->path == AGOQ_PLAN_TUNER) {
    /* NCCL's estimates as modelled: the group's own bytes at the NIC's whole line rate, for
     * the ring and for CollNet alike; the decision is then the tuner's, by its own code. */
    double us = agoq_plan_seconds(j, g->comm_bytes) * 1e6;
    agoq_dtype tt = g->tuner_as_bf16 ? AGOQ_DTYPE_BF16 : t;
    double ratio = g->tuner_as_bf16 ? agoq_tuner_wire_ratio(f, AGOQ_DTYPE_BF16, block, ((size_t)1 << 24) * 2) : c->ratio;
    /* The tuner's own schedule cost for a group of this many nodes, at the rate NCCL's
     * CollNet estimate (modelled here as the ring's) implies. */
    agoq_tuner_sched sched;
    agoq_tuner_sched_setting((size_t)g->nodes, &sched);
    bool allreduce = strncmp(g->collective, "AllReduce", 9) == 0;
    double net_us = agoq_tuner_network_us(&sched, allreduce, tt, ratio, g->codec_bytes, us, NULL);
    agoq_tuner_cost_compare(us, us, net_us, ratio, g->codec_bytes, codec_mbps, &c->tuner);
    c->compressed = c->tuner.compress;
    c->codec_s = c->tuner.codec_us / 1e6;
  } else if (g->path == AGOQ_PLAN_P2P) {
    /* One quantization (sender) and one dequantization (receiver) per byte: half the
     * reduction's two round trips. */
    c->compressed = true;
    c->codec_s = agoq_tuner_codec_us(g->codec_bytes, codec_mbps) / 2.0 / 1e6;
  }
  if (c->compressed) c->time_s = c->wire_s + c->codec_s;
}
