/*
 * The tuner's cost model: what agoq's compressed CollNet would cost for one collective,
 * next to what NCCL estimates for everything else, from NCCL's own cost table. Pure
 * functions of their arguments (the codec speed is one), so that tests give them the cost
 * tables of fast and slow links and check the decision.
 *
 * agoq's CollNet is not an in-network reduction: its network time is agoq's own schedule
 * (plugin/collnet/agoq_coll_cost.h: the mesh or the grid this group runs, its levels,
 * messages and bytes of frames per chunk, pipelined), at the link rate NCCL's CollNet
 * estimate implies. NCCL converts CollNet's bus bandwidth to algorithm bandwidth at 0.5
 * (graph/tuning.cc): its estimate moves the buffer twice through the link, reduced and
 * broadcast, so the rate is 2 x nBytes / its time. On top of that the codec runs twice over
 * the buffer on each rank (its contribution quantized and the reduced result dequantized;
 * the owner's share of decoding and re-encoding is about one more pass, spread over the
 * ranks): two encode+decode round trips' worth of work at AGOQ_CODEC_MBPS, none of it
 * overlapped with the wire here (agoq-collnet-sim, which the schedule's cost is held against,
 * charges no codec time: the overlap would be a claim nothing measured).
 *
 * The one cost model of agoq: the tuner applies it to NCCL's cost table, and agoq-plan
 * (tools/plan) to its modelled times, through agoq_tuner_cost_compare, so that the plan
 * shows compressed exactly what the tuner would let NCCL compress. No NCCL-process state;
 * the one reader of settings is agoq_tuner_codec_setting, so that both take the codec speed
 * from the same parameters by the same rule.
 */
#ifndef AGOQ_TUNER_COST_H
#define AGOQ_TUNER_COST_H

#include <stdbool.h>
#include <stddef.h>

#include "agoq_codec.h"
#include "collnet/agoq_coll_cost.h"

/* Bytes on the wire over bytes of input for nbytes of type t in format f (one frame header,
 * no escaped block). */
double agoq_tuner_wire_ratio(agoq_format f, agoq_dtype t, uint32_t block, size_t nbytes);

/* Microseconds of codec work per rank for a reduction of nbytes at codec_mbps (MB/s of
 * input for one quantization plus one dequantization). A double, not a size_t: agoq-plan
 * costs a whole iteration's bytes. */
double agoq_tuner_codec_us(double nbytes, double codec_mbps);

/* agoq's CollNet schedules for a group of `nodes` ranks (NCCL's CollNet groups hold one rank
 * per node) under this process's settings: AGOQ_COLLNET_GRID (a grid that does not hold the
 * group is costed as the automatic one; the group's creation refuses it anyway),
 * AGOQ_COLLNET_CHUNK, AGOQ_COLLNET_PARTIALS, AGOQ_FORMAT and AGOQ_BLOCK. Where the group
 * chooses its shape by its slowest link (agoq_coll_plans_pick), every candidate is kept, and
 * each estimate costs the one the group would run at the rate it implies. The
 * parameters must be loaded. The same on every rank: settings and the node count only. */
typedef struct {
  bool ok; /* false: fewer than 2 nodes, or no memory for the schedule's enumeration */
  agoq_coll_plans plans;
  agoq_coll_pick_in pick; /* link_Bps left 0: each estimate sets its own */
} agoq_tuner_sched;

void agoq_tuner_sched_setting(size_t nodes, agoq_tuner_sched* s);

/* The calls NCCL's CollNet proxy posts (coll_net.cc): at most 2 MiB each on CollNet-Chain,
 * up to 8 in flight per group of 8 channels. */
#define AGOQ_TUNER_COLLNET_CALL_BYTES (2.0 * 1024 * 1024)

/* Microseconds on the network for agoq's CollNet moving nbytes (an AllReduce, else a
 * ReduceScatter) of type t in frames of wire ratio `ratio` (1: exact), at the link rate
 * NCCL's CollNet estimate collnet_us (> 0) implies for them, on the schedule the group would
 * choose at that rate (*grid, may be NULL). */
double agoq_tuner_network_us(const agoq_tuner_sched* s, bool allreduce, agoq_dtype t, double ratio, double nbytes,
                             double collnet_us, agoq_coll_grid* grid);

typedef struct {
  int algo, proto;      /* NCCL's cheapest entry outside CollNet; -1 when none is usable */
  double best_other_us; /* its time */
  double collnet_us;    /* NCCL's estimate for the CollNet entry the tuner would use */
  double ratio, codec_us;
  double net_us;        /* agoq's schedule at the rate collnet_us implies (agoq_tuner_network_us) */
  agoq_coll_grid grid;  /* that schedule */
  double agoq_us;       /* net_us + codec_us */
  bool compress;        /* agoq_us beats best_other_us (or nothing else is usable) */
} agoq_tuner_estimate;

/* The decision: best_other_us (NCCL's cheapest choice outside CollNet; negative: none) against
 * net_us (agoq_tuner_network_us for collnet_us, NCCL's CollNet estimate for the uncompressed
 * bytes) + the codec's time for nbytes at codec_mbps. Fills all of e but algo and proto
 * (left -1). */
void agoq_tuner_cost_compare(double best_other_us, double collnet_us, double net_us, double ratio, double nbytes,
                             double codec_mbps, agoq_tuner_estimate* e);

/* table is NCCL's float[num_algo][num_proto] (negative: unusable); collnet_algo is the
 * CollNet row the tuner uses, with SIMPLE; s, allreduce and t as for agoq_tuner_network_us. */
void agoq_tuner_estimate_collnet(const float* table, int num_algo, int num_proto, int collnet_algo, size_t nbytes,
                                 double ratio, double codec_mbps, const agoq_tuner_sched* s, bool allreduce,
                                 agoq_dtype t, agoq_tuner_estimate* e);

/* The codec speed the model takes in a job started from this environment, from settings
 * only (the same on every rank): AGOQ_GPU_CODEC_MBPS where quantized CollNet reductions run
 * on the GPU (AGOQ_GPU=on and AGOQ_COLLNET_GPU=1), else AGOQ_CODEC_MBPS. *which names the
 * parameter taken. The parameters must be loaded. The tuner and agoq-plan both use it. */
double agoq_tuner_codec_setting(const char** which);

/* MB/s of one quantization plus one dequantization of 1 MiB of bf16 (int8, block 128) with
 * the CPU codec, timed with clock_s (seconds) over `rounds` rounds after one untimed round. */
double agoq_tuner_codec_mbps_measure(double (*clock_s)(void), int rounds);

#endif
