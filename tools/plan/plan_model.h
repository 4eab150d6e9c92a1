/*
 * agoq-plan's model of a Megatron-style training job: the bytes each parallel group puts
 * on the inter-node links per iteration, from the model's shapes and the parallel layout,
 * and what agoq's formats would leave of them. A model, not a measurement: no overlap, no
 * protocol overhead, the line rate as the only limit.
 *
 * Layout as Megatron-Core orders ranks by default (tp-cp-ep-dp-pp, no CP or EP here): rank =
 * tp + TP * (dp + DP * pp), nodes hold consecutive ranks. A group whose members all sit on
 * one node costs the NICs nothing (NVLink inside the node); one spanning k nodes with m
 * members per node runs NCCL's ring across them, each node's NIC carrying 2 (N-1)/N of
 * the buffer per all-reduce (N the group's size), (N-1)/N per reduce-scatter or
 * all-gather, once per group that has members on the node.
 */
#ifndef AGOQ_PLAN_MODEL_H
#define AGOQ_PLAN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  /* the model (GPT/LLaMA decoder): params_b > 0 replaces the shape-derived count */
  int layers, hidden, heads, ffn_hidden; /* ffn_hidden 0: 4 x hidden */
  bool swiglu;                           /* the MLP has three matrices (LLaMA) */
  int vocab;
  bool tied_embeddings;
  double params_b; /* billions; 0: from the shapes */
  /* the batch */
  long long seq, micro_batch, global_batch;
  /* the layout */
  int tp, pp, dp, gpus_per_node;
  bool dist_opt;  /* Megatron's distributed optimizer: reduce-scatter + all-gather */
  int grad_bytes; /* 4: gradients reduced in fp32 (Megatron's default), 2: in bf16 */
  double nic_gbps; /* per node */
} agoq_plan_job;

enum { AGOQ_PLAN_DP_GRADS = 0, AGOQ_PLAN_DP_PARAMS, AGOQ_PLAN_PP, AGOQ_PLAN_TP, AGOQ_PLAN_NGROUPS };

typedef struct {
  const char* name;       /* "DP gradients", ... */
  const char* collective; /* "AllReduce fp32", ... */
  double node_bytes;      /* sent by the busiest node's NIC per iteration */
  bool compressible;      /* agoq compresses it (float reductions, pipeline activations) */
  int elem_bytes;         /* of the data on the wire uncompressed (4 fp32, 2 bf16) */
} agoq_plan_group;

typedef struct {
  double params;            /* the whole model */
  double params_per_gpu;    /* the largest stage's share of one GPU (embeddings included) */
  long long micro_batches;  /* per pipeline per iteration */
  int nodes;
  agoq_plan_group g[AGOQ_PLAN_NGROUPS];
  double total_bytes;
} agoq_plan_result;

/* 0, or -1 with why (an inconsistent layout or batch). */
int agoq_plan_compute(const agoq_plan_job* j, agoq_plan_result* r, char* why, size_t why_len);
/* Seconds to send `bytes` at the job's NIC line rate. */
double agoq_plan_seconds(const agoq_plan_job* j, double bytes);

#endif
