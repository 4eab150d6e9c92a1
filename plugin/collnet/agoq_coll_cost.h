/* What a CollNet chunk costs on the schedule (agoq_coll_schedule.h): per rank and step, the
 * bytes and messages the schedule gives, and from them the time of one chunk alone and of
 * the pipeline's steady state under the clock model of agoq-collnet-sim (per rank one CPU
 * paying o per message sent or received, one NIC of B bytes/s each way, alpha per message).
 * Pure arithmetic over the schedule's own enumeration, from inputs that are the same on
 * every rank (the grid, settings, one link rate), so that a decision made from it is too.
 * tools/collnet/sim_main.c prints it next to the simulated time; tests/unit hold it against
 * the simulation from 2 to 1024 ranks and 10 to 400 Gbit/s. */
#ifndef AGOQ_COLL_COST_H
#define AGOQ_COLL_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "agoq_codec.h"
#include "collnet/agoq_coll_schedule.h"

/* The clock model's per-message figures: what agoq-collnet-sim assumes unless told (issue 28:
 * o of 1 to 2.5 us per message on one engine thread, TCP and verbs alike). */
#define AGOQ_COLL_COST_ALPHA_S 2e-6
#define AGOQ_COLL_COST_O_S 1.5e-6
/* A group's pipeline slots (AGOQ_COLL_SLOTS, checked where that is defined): the most chunks
 * in flight, and the calls a tuner may assume NCCL keeps outstanding. */
#define AGOQ_COLL_COST_CALLS 8

/* What the schedule moves per chunk, made once per group size (agoq_coll_profile_make): per
 * step, the most any one rank sends and receives, as a fraction of the chunk's pieces (bytes
 * follow from the chunk and the step's wire ratio), and the most messages any one rank sends
 * plus receives. The mesh and exact grids are symmetric, so these are every rank's; on a
 * ragged grid they bound the busiest rank. */
typedef struct {
  double tx[AGOQ_COLL_STEPS], rx[AGOQ_COLL_STEPS], msgs[AGOQ_COLL_STEPS];
} agoq_coll_profile;

/* 0, or -1 when memory for the enumeration cannot be had (3 doubles per rank). An exact grid
 * (a b = n, the mesh included) in closed form; another, agoq_coll_profile_count. */
int agoq_coll_profile_make(const agoq_coll_grid* g, agoq_coll_profile* p);
/* The same by enumerating the schedule's every message: O(n (a + b)). */
int agoq_coll_profile_count(const agoq_coll_grid* g, agoq_coll_profile* p);

typedef struct {
  double chunk_bytes;   /* input bytes of one pipeline chunk (AGOQ_COLLNET_CHUNK) */
  double wire_ratio;    /* bytes on the wire per input byte: frames (quantized) or 1 (exact) */
  double partial_ratio; /* the same for a grid's column reduce-scatter: its partial sums */
  double link_Bps;      /* one NIC, each way */
  double alpha_s, o_s;  /* per message: latency, and CPU time to send or to receive it */
  /* Input bytes per second of one quantization plus one dequantization; 0: no codec (exact). */
  double codec_Bps;
  bool codec_on_cpu; /* the codec runs on the engine's CPU (false: a GPU) */
  /* AGOQ_COLLNET_IO_THREADS: threads that do the messages, peers split among them (0: the
   * engine does them, sharing its CPU with the codec), and the peers they split. */
  int io_threads;
  int peers;
  /* The steps the call runs, bit (1 << agoq_coll_step) each; 0: all four (an all-reduce). A
   * reduce-scatter runs the two reduce-scatters, an all-gather the two all-gathers. */
  unsigned steps;
} agoq_coll_cost_in;

#define AGOQ_COLL_COST_RS ((1u << AGOQ_COLL_ROW_RS) | (1u << AGOQ_COLL_COL_RS))
#define AGOQ_COLL_COST_AG ((1u << AGOQ_COLL_COL_AG) | (1u << AGOQ_COLL_ROW_AG))

typedef struct {
  /* Per chunk at the busiest rank. */
  double tx_bytes, rx_bytes;
  double msgs; /* sent and received */
  double codec_s;
  int levels; /* steps that move messages: 2 on the mesh, 4 on a grid (fewer for RS or AG) */
  double first_s; /* one chunk alone: each step's latency, bytes and messages in turn */
  double chunk_s; /* a chunk in the pipeline's steady state: its busiest resource */
} agoq_coll_cost;

/* The share of a rank's messages the busiest of k I/O threads handles, peers split by peer
 * (every peer carries as many messages per chunk on the mesh and on exact grids):
 * ceil(peers / k) / peers; 1 with k = 0 (the engine alone) or no peers. */
double agoq_coll_cost_io_share(int peers, int k);
/* The most peers of any rank on grid g (an exact grid: its row and its column; the mesh's
 * n - 1): the cost's peers, and the tie-break of the automatic choice. */
static inline int agoq_coll_cost_peers(const agoq_coll_grid* g) { return g->a + g->b - 2; }

/* partial_ratio for a call of NCCL type `dtype` reduced with `op`: the partial sums the
 * engine sends (agoq_coll_partial_size: fp32 for the narrow floats' Sum and Prod, the type
 * itself otherwise), or frames of wire_ratio where a quantized call has
 * AGOQ_COLLNET_PARTIALS=quantized (frame_partials). */
double agoq_coll_cost_partial_ratio(int dtype, int op, bool quantized, bool frame_partials, double wire_ratio);

/* A chunk's cost on the profile: arithmetic only. */
void agoq_coll_cost_eval(const agoq_coll_profile* p, const agoq_coll_cost_in* in, agoq_coll_cost* out);

/* The chunk the engine really cuts from calls of call_bytes (bytes in all, when fewer): the
 * configured chunk, or the whole call when that is smaller (a call is never joined with the
 * next). Evaluate a call's cost with it, not with the configured chunk. */
static inline double agoq_coll_cost_chunk(double chunk_bytes, double call_bytes, double bytes) {
  double call = call_bytes > 0 && call_bytes < bytes ? call_bytes : bytes;
  return chunk_bytes < call ? chunk_bytes : call;
}
/* Seconds for `bytes` per rank posted as calls of call_bytes, at most `calls` outstanding
 * (NCCL's CollNet: calls of up to 2 MiB, several in flight), each cut into chunks of
 * chunk_bytes, at most `slots` chunks in the pipeline: one chunk's time, then one period per
 * further chunk (the steady state, or one chunk's time over the chunks in flight where
 * fewer overlap); calls one at a time pay the first chunk again each. */
double agoq_coll_cost_seconds(const agoq_coll_cost* c, double chunk_bytes, double bytes, double call_bytes, int calls,
                              int slots);

/* ---- the automatic schedule: the mesh or a grid, by cost ------------------------------
 * Up to AGOQ_COLL_GRID_DIRECT_MAX ranks the mesh (where the GPU data path runs). Above, the
 * candidates are the mesh (up to AGOQ_COLL_MESH_AUTO_MAX ranks), the grid n decides alone
 * (agoq_coll_grid_auto), and every exact grid a x b = n with rows no shorter than columns are
 * tall and at most AGOQ_COLL_MESH_AUTO_MAX - 1 peers; the group runs whichever the model
 * makes fastest at the slowest rank's link rate, or the grid of n alone where a rate is not
 * known. Long rows move fewer bytes (the column's fp32 partial sums shrink with 1/a), square
 * grids fewer messages (2(a+b-2)): at 64 ranks 32x2 wins at 25 Gbit/s, 16x4 at 100, 8x8 at
 * 400 (agoq-collnet-sim). */
/* At most this many peers per rank: the mesh's 2(n-1) connections are 126 at 64 ranks, within
 * the 200 per rank a group of 1024 ranks holds on its grid. */
enum { AGOQ_COLL_MESH_AUTO_MAX = 64, AGOQ_COLL_PLANS_MAX = 40 };

/* One candidate: its grid, the profile of its messages, the chunk it cuts. */
typedef struct {
  agoq_coll_grid grid;
  agoq_coll_profile prof;
  double chunk_bytes;
} agoq_coll_plan;

typedef struct {
  int count; /* 1 where AGOQ_COLLNET_GRID names the grid or n <= AGOQ_COLL_GRID_DIRECT_MAX */
  int rule;  /* the plan n decides alone: the mesh up to AGOQ_COLL_GRID_DIRECT_MAX, else the automatic grid */
  agoq_coll_plan plan[AGOQ_COLL_PLANS_MAX];
} agoq_coll_plans;

/* The candidates for n ranks under AGOQ_COLLNET_GRID=a x b (0 x 0: automatic) and
 * AGOQ_COLLNET_CHUNK (0: automatic, per candidate). 0, or with why filled
 * AGOQ_COLL_PLANS_BAD_GRID (a grid that does not hold n: agoq_coll_grid_make's error) or
 * AGOQ_COLL_PLANS_NO_MEMORY (for a profile). */
enum { AGOQ_COLL_PLANS_BAD_GRID = -1, AGOQ_COLL_PLANS_NO_MEMORY = -2 };
int agoq_coll_plans_make(int n, int a, int b, double chunk_bytes, agoq_coll_plans* p, char* why, size_t why_len);

/* The reference traffic the candidates are costed on: bf16 (the training case) in
 * AGOQ_FORMAT frames, 8 calls of 4 MiB in flight per rank. Those are the calls of the
 * messages whose time a shape decides: agoq's tuner raises CollNetChain's chunks for large
 * messages to NCCL_BUFFSIZE/8, so their calls are 4 MiB at NCCL's default NCCL_BUFFSIZE
 * (CollNetDirect's are NCCL_BUFFSIZE), and a data-parallel gradient bucket grows with the
 * group (Megatron-LM's default: max(40M, 1M x data-parallel size) elements, about 256 MB of
 * bf16 at 128 ranks). The codec is left out: every candidate quantizes and dequantizes the
 * same bytes per rank. */
typedef struct {
  agoq_format format;
  uint32_t block;
  bool frame_partials; /* AGOQ_COLLNET_PARTIALS=quantized */
  double link_Bps;     /* the slowest rank's NIC, each way; 0: not known */
  int io_threads;      /* AGOQ_COLLNET_IO_THREADS */
} agoq_coll_pick_in;

/* The same call a grid's automatic chunk is sized for (agoq_coll_schedule.h): one fact. */
#define AGOQ_COLL_PICK_CALL_BYTES ((double)AGOQ_COLL_CHUNK_GRID)
/* Seconds of the reference traffic on plan pl at in->link_Bps (> 0). */
double agoq_coll_plan_seconds(const agoq_coll_plan* pl, const agoq_coll_pick_in* in);
/* Which plan runs: the fastest for the reference traffic at in->link_Bps, the one with fewer
 * peers on a tie; with one candidate or no rate, p->rule. secs[i] (room for p->count, may be
 * NULL) gets each candidate's model time, or -1 where not costed. Pure arithmetic on inputs
 * every rank shares. */
int agoq_coll_plans_pick(const agoq_coll_plans* p, const agoq_coll_pick_in* in, double* secs);

#endif
