/* agoq-plan's model (plan_model.h). */
#include "plan_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parameters of one decoder layer: attention (QKV and output projection, with biases for
 * GPT, none for LLaMA), the MLP, and two norms. */
static double agoq_plan_layer_params(const agoq_plan_job* j) {
  double h = j->hidden, f = j->ffn_hidden > 0 ? j->ffn_hidden : 4.0 * j->hidden;
  if (j->swiglu) return 4.0 * h * h + 3.0 * h * f + 2.0 * h;         /* LLaMA: no biases, RMSNorm */
  return 4.0 * h * h + 4.0 * h + 2.0 * h * f + f + h + 4.0 * h;      /* GPT: biases, LayerNorm */
}

/* Distinct nodes the ranks {base + stride * i, i < n} sit on, and members on each (the
 * groups are regular: every node holds the same count). */
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

int agoq_plan_compute(const agoq_plan_job* j, agoq_plan_result* r, char* why, size_t why_len) {
  memset(r, 0, sizeof *r);
  long long world = (long long)j->tp * j->pp * j->dp;
  if (j->tp < 1 || j->pp < 1 || j->dp < 1 || j->gpus_per_node < 1 || world % j->gpus_per_node != 0) {
    snprintf(why, why_len, "TP x PP x DP = %lld GPUs is not a whole number of %d-GPU nodes", world, j->gpus_per_node);
    return -1;
  }
  if (j->layers < j->pp || j->layers % j->pp != 0) {
    snprintf(why, why_len, "%d layers do not split evenly over %d pipeline stages", j->layers, j->pp);
    return -1;
  }
  if (j->micro_batch < 1 || j->global_batch % (j->micro_batch * j->dp) != 0) {
    snprintf(why, why_len, "global batch %lld is not a multiple of micro batch %lld x DP %d", j->global_batch,
             j->micro_batch, j->dp);
    return -1;
  }
  if (j->hidden % j->tp != 0) {
    snprintf(why, why_len, "hidden %d does not split over TP %d", j->hidden, j->tp);
    return -1;
  }
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
  double groups_on_node = (double)j->gpus_per_node / per_node;
  double n = j->dp, G = r->params_per_gpu * j->grad_bytes;
  agoq_plan_group* g = &r->g[AGOQ_PLAN_DP_GRADS];
  g->name = "DP gradients";
  g->compressible = true;
  g->elem_bytes = j->grad_bytes;
  g->collective = j->dist_opt ? (j->grad_bytes == 4 ? "ReduceScatter fp32" : "ReduceScatter bf16")
                              : (j->grad_bytes == 4 ? "AllReduce fp32" : "AllReduce bf16");
  if (nodes > 1) g->node_bytes = groups_on_node * (j->dist_opt ? 1.0 : 2.0) * (n - 1) / n * G;
  g = &r->g[AGOQ_PLAN_DP_PARAMS];
  g->name = "DP parameters";
  g->collective = j->dist_opt ? "AllGather bf16" : "(none: no distributed optimizer)";
  g->elem_bytes = 2;
  if (nodes > 1 && j->dist_opt) g->node_bytes = groups_on_node * (n - 1) / n * r->params_per_gpu * 2.0;

  /* Pipeline: each micro-batch's activations (bf16, split over TP as Megatron scatters
   * them) go forward across each stage boundary and their gradients come back. A node
   * holding stage s sends forward to s+1 and backward to s-1; the busiest sends both. */
  g = &r->g[AGOQ_PLAN_PP];
  g->name = "PP activations";
  g->collective = "Send/Recv bf16";
  g->compressible = true;
  g->elem_bytes = 2;
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
      if (pos + 1 < j->pp && (rank + stride) / j->gpus_per_node != node) sent[node] += act; /* forward */
      if (pos > 0 && (rank - stride) / j->gpus_per_node != node) sent[node] += act;        /* backward */
    }
    for (int k = 0; k < r->nodes; k++)
      if (sent[k] > g->node_bytes) g->node_bytes = sent[k];
    free(sent);
  }

  /* Tensor parallel: inside a node unless TP exceeds it; then four all-reduces of the
   * activations per layer and micro-batch (two forward, two backward). */
  g = &r->g[AGOQ_PLAN_TP];
  g->name = "TP activations";
  g->collective = "AllReduce bf16";
  g->elem_bytes = 2;
  g->compressible = true; /* a float AllReduce: agoq's CollNet compresses it like gradients */
  if (j->tp > j->gpus_per_node) {
    agoq_plan_span(0, 1, j->tp, j->gpus_per_node, &nodes, &per_node);
    double s = (double)j->seq * j->micro_batch * j->hidden * 2.0;
    double per = 2.0 * (j->tp - 1) / j->tp * s;
    g->node_bytes = ((double)j->gpus_per_node / per_node) * 4.0 * (j->layers / j->pp) * per * (double)r->micro_batches;
  }
  for (int i = 0; i < AGOQ_PLAN_NGROUPS; i++) r->total_bytes += r->g[i].node_bytes;
  return 0;
}

double agoq_plan_seconds(const agoq_plan_job* j, double bytes) { return bytes * 8.0 / (j->nic_gbps * 1e9); }
