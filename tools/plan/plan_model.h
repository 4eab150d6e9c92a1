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
 * all-gather, once per group that has members on the node. Layouts whose groups would not
 * fill nodes evenly (TP not dividing the node, or TP x DP neither dividing nor a multiple
 * of it) are refused, not modelled.
 *
 * What agoq then does with each group is decided by the tuner's own cost model
 * (plugin/tuner/agoq_tuner_cost.h, agoq_tuner_cost_compare), fed with modelled NCCL
 * estimates: a reduction goes compressed only where the tuner would let NCCL pick CollNet.
 */
#ifndef AGOQ_PLAN_MODEL_H
#define AGOQ_PLAN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agoq_codec.h"
#include "tuner/agoq_tuner_cost.h"

typedef struct {
  /* the model (GPT/LLaMA decoder): params_b > 0 replaces the shape-derived count */
  int layers, hidden, heads, ffn_hidden; /* ffn_hidden 0: 4 x hidden */
  int kv_heads;                          /* grouped-query attention's K/V heads; 0: heads */
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
  double nic_gbps; /* per node: every GPU of the node shares it */
  bool nvswitch;   /* NVSwitch in the node: NCCL's CollNet-Direct, which ReduceScatter needs */
} agoq_plan_job;

enum { AGOQ_PLAN_DP_GRADS = 0, AGOQ_PLAN_DP_PARAMS, AGOQ_PLAN_PP, AGOQ_PLAN_TP, AGOQ_PLAN_NGROUPS };

/* How agoq can carry a group's traffic. */
typedef enum {
  AGOQ_PLAN_EXACT = 0,   /* never compressed (parameter all-gathers, nothing to send) */
  AGOQ_PLAN_TUNER,       /* a float reduction on CollNet: the tuner decides */
  AGOQ_PLAN_NO_COLLNET,  /* a float reduction NCCL cannot run on CollNet here: exact */
  AGOQ_PLAN_P2P,         /* typed p2p (send/recv): compressed, NCCL never asks the tuner */
} agoq_plan_path;

typedef struct {
  const char* name;       /* "DP gradients", ... */
  const char* collective; /* "AllReduce fp32", ... */
  double node_bytes;      /* sent by the busiest node's NIC per iteration */
  agoq_plan_path path;
  const char* no_collnet; /* AGOQ_PLAN_NO_COLLNET: why */
  int elem_bytes;         /* of the data on the wire uncompressed (4 fp32, 2 bf16) */
  bool tuner_as_bf16;     /* the tuner is not told the type (ReduceScatter) and costs it as bf16 */
  int groups_on_node;     /* groups of this kind sharing the busiest node's NIC */
  int nodes;              /* nodes one group spans: its CollNet group's size */
  double comm_bytes;      /* one group's share of node_bytes: what NCCL's estimate sees */
  double codec_bytes;     /* per rank per iteration, input of the codec (one q+dq each) */
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

/* What agoq does with one group in format f, and why. */
typedef struct {
  bool compressed;
  double ratio;   /* wire bytes over input bytes of the format (agoq_tuner_wire_ratio) */
  double exact_s; /* node_bytes at line rate */
  double wire_s;  /* exact_s x ratio */
  double codec_s; /* per rank, at codec_mbps, nothing overlapped */
  double time_s;  /* compressed ? wire_s + codec_s : exact_s */
  /* AGOQ_PLAN_TUNER: the tuner's comparison, per iteration (us), on modelled NCCL estimates:
   * one group's comm_bytes at the whole NIC's line rate, ring and CollNet alike (NCCL's
   * estimate of one communicator does not know of the others sharing the NIC). */
  agoq_tuner_estimate tuner;
} agoq_plan_choice;

void agoq_plan_choose(const agoq_plan_job* j, const agoq_plan_group* g, agoq_format f, uint32_t block,
                      double codec_mbps, agoq_plan_choice* c);

#endif
