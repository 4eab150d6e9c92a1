/*
 * Internal state of the CollNet core: contexts, listen comms, groups (collComms), their
 * requests, the engine's pipeline slots, and the helpers each lifecycle file provides.
 */
#ifndef AGOQ_COLL_INTERNAL_H
#define AGOQ_COLL_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agoq_codec.h"
#include "agoq_frame.h"
#include "collnet/agoq_coll_schedule.h"
#include "collnet/agoq_collnet.h"
#include "core/agoq_stats.h"
#include "gpu/agoq_gpu.h"

#define AGOQ_COLL_CTX_MAGIC 0x58434341u    /* "ACCX" */
#define AGOQ_COLL_LISTEN_MAGIC 0x4c434341u /* "ACCL" */
#define AGOQ_COLL_COMM_MAGIC 0x4d434341u   /* "ACCM" */
#define AGOQ_COLL_REQ_MAGIC 0x51434341u    /* "ACCQ" */
#define AGOQ_COLL_MR_MAGIC 0x52434341u     /* "ACCR" */

/* Requests a group holds at once: NCCL keeps at most NCCL_STEPS per group of 8 channels
 * in flight, so 128 covers 16 such groups; beyond it the caller gets "busy". */
#define AGOQ_COLL_MAX_REQUESTS 128
/* Pipeline chunks in flight per group. */
#define AGOQ_COLL_SLOTS 8
/* On a grid, a chunk's row reduce-scatter sends wait until the chunk this many before it has
 * summed its row and posted its column sends (agoq_coll_grid_post). A NIC that serves
 * messages in the order they reach it (a verbs send queue; the simulation's NIC) queued
 * every chunk's column steps behind all the row messages posted at admission, then idled
 * while the last chunks' columns ran: 512 simulated ranks at 400 Gbit/s reached 0.833 of
 * the floor, 0.936 with this lead (docs/design-collnet.md, "The row lead"). The oldest
 * unreduced chunk and two more keep the NIC busy while that chunk's columns run; a lead of
 * 1 leaves it idle while a row is summed, and 4 brings part of the queueing back. */
#define AGOQ_COLL_ROW_LEAD 3

/* The settings a group runs with, read once per context; everything in the handle's
 * fingerprint must agree on every rank, because it decides slicing and blocks. */
typedef struct {
  agoq_format format;
  uint32_t block;
  uint64_t min_bytes;
  uint64_t chunk_bytes; /* 0 = auto in the context and the handle; a group's is resolved */
  int grid_a, grid_b; /* AGOQ_COLLNET_GRID: columns and rows; 0 and 0 = automatic */
  bool quant_partials; /* AGOQ_COLLNET_PARTIALS=quantized: the column reduce-scatter in AGOQ_FORMAT */
  int io_threads;      /* AGOQ_COLLNET_IO_THREADS: threads that do the messages; 0 = the engine */
  int timeout_s;
  int codec_threads; /* AGOQ_COLLNET_CODEC_THREADS; 0 = the engine resolves it */
  bool assist;       /* AGOQ_COLLNET_ASSIST: test() runs passes of the pipeline */
  bool gpu_reduce;   /* AGOQ_COLLNET_GPU: quantized calls on device buffers reduced there */
} agoq_coll_config;

typedef struct agoq_coll_ctx {
  uint32_t magic;
  void* net_ctx;
  bool owns_net_ctx; /* v11+: created with the context, finalized with it */
  agoq_coll_config cfg;
} agoq_coll_ctx;

typedef struct {
  uint32_t magic;
  agoq_coll_ctx* ctx;
  void* net_listen;
  int dev;
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE]; /* what listen gave NCCL: our own entry */
} agoq_coll_listen_comm;

typedef enum { AGOQ_COLL_ALLREDUCE = 0, AGOQ_COLL_REDUCESCATTER, AGOQ_COLL_ALLGATHER } agoq_coll_kind;
/* COPY_OUT: the host result is complete and its copies into NCCL's device buffers are
 * queued; test() says done once their event is (agoq_coll_device.c). */
typedef enum {
  AGOQ_COLL_REQ_PENDING = 0,
  AGOQ_COLL_REQ_DONE,
  AGOQ_COLL_REQ_FAILED,
  AGOQ_COLL_REQ_COPY_OUT
} agoq_coll_req_state;

/* Per-path statistics (AGOQ_STATS_EXACT, AGOQ_STATS_QUANT) in the group's stats entry:
 * relaxed atomics written by the engine, readable by the interval and exit printers. */
typedef agoq_stats_path agoq_coll_path_stats;

struct agoq_coll_comm;

typedef struct agoq_coll_req {
  uint32_t magic;
  struct agoq_coll_comm* comm;
  agoq_coll_kind kind;
  int dtype, op;
  bool quantized;
  uint8_t exact_reason;   /* agoq_exact_reason when not quantized */
  agoq_dtype codec_dtype; /* quantized path only */
  size_t esz;             /* element size; 1 for allgather (bytes) */
  size_t count;           /* elements of the request's element space */
  size_t bpr, wo;         /* reducescatter/allgather: bytes per rank, window offset */
  size_t my_begin;        /* first element of this rank's range (reducescatter/allgather) */
  size_t chunk_elems;     /* allreduce: per chunk; others: per rank per chunk */
  size_t nchunks;
  const uint8_t* src;     /* allreduce: send buffer; RS: window input; AG: this rank's bytes */
  uint8_t* dst;           /* allreduce: receive buffer; RS: this rank's part; AG: window output */
  int nparts;             /* SGE parts when more than one: staged through `flat` */
  agoq_coll_sge parts[AGOQ_COLL_MAX_PARTS];
  uint8_t* flat;          /* owned; host parts only: the parts concatenated */
  uint8_t* joined;        /* nparts > 1 or staged parts: where the parts are concatenated */
  size_t result_bytes;
  /* NCCL's buffers in device memory, staged through the group's GPU link
   * (agoq_coll_device.c): src/dst then point into the link's pinned staging. */
  int ring_id;            /* the staging allocation; -1 when nothing is staged */
  bool in_copy;           /* the input's D2H copy is queued and not yet seen complete */
  uint8_t* dev_dst;       /* allreduce/reducescatter: NCCL's receive buffer, in device memory */
  uint32_t dev_parts;     /* bit i: parts[i] is in device memory */
  /* A call larger than the staging: src/dst point into `bounce` (malloc'd, the call's
   * size; registered with a transport that moves only registered memory, bounce_key),
   * filled and emptied across PCIe in pieces through piece_host, piece_cap bytes of the
   * staging (ring_id), one piece behind the request's event at a time. */
  uint8_t* bounce;
  void* bounce_key;
  uint8_t* piece_host;
  size_t piece_cap;
  const uint8_t* dev_src; /* allreduce/allgather: NCCL's device input */
  uint8_t* bounce_in;     /* the input's and the result's places in `bounce` */
  uint8_t* bounce_out;
  bool pieces_in, pieces_out; /* pieces of the input / the result still to move */
  int piece_seg;          /* the segment moving (agoq_coll_device.c), its bytes done and */
  size_t piece_off, piece_len; /* the piece in flight (0: none) */
  /* Quantized with every buffer in device memory, reduced on the GPU (agoq_coll_gpu.c):
   * src and dst are NCCL's device buffers, nothing is staged. */
  bool gpu;
  /* Engine-private progress. */
  size_t chunks_admitted, chunks_done;
  struct agoq_coll_req* next; /* queue / active list link */
  /* Completion, published last (release) after everything above is final. */
  atomic_int state;
  int error;
} agoq_coll_req;

typedef struct {
  uint8_t* p;
  size_t cap;
  void* key; /* own memory: its registration with the transport (agoq_net_reg_host) */
} agoq_coll_buf;

/* A slot's buffers: the frames sent (sbuf), the contributions received (rbuf), the owner's
 * accumulator (acc), its result message (res), the results received (gbuf). */
typedef struct {
  agoq_coll_buf sbuf, rbuf, acc, res, gbuf;
} agoq_coll_slot_bufs;

/* Frames sit at 16-byte offsets in their messages and regions. */
static inline size_t agoq_coll_align16(size_t v) { return (v + 15) & ~(size_t)15; }

/* Where a GPU slot's device work stands (agoq_coll_gpu.c). */
typedef enum {
  AGOQ_GPU_STEP_NONE = 0,
  AGOQ_GPU_STEP_ENCODING, /* every slice's frame queued */
  AGOQ_GPU_STEP_REDO_WAIT, /* frames outgrew their nominal room: waiting for the spill area */
  AGOQ_GPU_STEP_REENCODING, /* those frames coded again, at their largest, into the spill area */
  AGOQ_GPU_STEP_ENCODED,  /* frames checked and sealed: the sends may go */
  AGOQ_GPU_STEP_SUMMING,  /* contributions decoded and summed, the sum's frame encoded */
  AGOQ_GPU_STEP_SHARING,  /* the sum's frame copied to pinned memory and decoded into place */
  AGOQ_GPU_STEP_REDUCED   /* the result message is sealed */
} agoq_coll_gpu_step;

typedef enum {
  AGOQ_SLOT_FREE = 0,
  AGOQ_SLOT_POSTING, /* posting receives, encoding and posting phase-1 sends */
  AGOQ_SLOT_WAIT_P1, /* waiting for the contributions to this rank's slice */
  AGOQ_SLOT_POST_P2, /* reduced; posting phase-2 sends */
  /* A grid chunk's stages between POSTING and WAIT_ALL, in this order (agoq_coll_grid.c). */
  AGOQ_SLOT_G_ROW,
  AGOQ_SLOT_G_COL,
  AGOQ_SLOT_G_AG,
  AGOQ_SLOT_WAIT_ALL /* waiting for every send and the phase-2 receives */
} agoq_slot_stage;

/* One pipeline chunk in flight. Arrays are indexed by rank. */
typedef struct {
  agoq_slot_stage stage;
  agoq_coll_req* req;
  uint64_t seq;
  size_t* sb; /* slice j: elements [sb[j], sb[j] + sl[j]) of the request */
  size_t* sl;
  void** p1s;  /* net requests: phase-1 send to j, receive from j; phase-2 the same */
  void** p1r;
  void** p2s;
  void** p2r;
  int* p1r_size; /* bytes received */
  /* Where each receive's bytes are: its region of the slot's buffers, posted at the size of
   * frames whose blocks compress, or the buffer its message spilled into when larger
   * (agoq_net_irecv_spill; listed in spills, freed when the chunk retires). */
  uint8_t** p1r_at;
  uint8_t** p2r_at;
  /* Where the quantized phase-1 message for peer j (or this rank's own frame) is: its region
   * of sbuf, sized alike, or a buffer of its own when its frames did not fit (listed in
   * spills too). */
  uint8_t** s_at;
  uint8_t** spills; /* at most 3 per peer (two receives, one send) and a grid's row message */
  int nspills;
  size_t spill_bytes;
  int post_recvs; /* next peer whose receives to post (POSTING) */
  int post_sends; /* sends posted so far (POSTING / POST_P2), in rotated order */
  int pend_p1s, pend_p1r, pend_p2s, pend_p2r; /* not yet completed */
  /* The buffers this chunk uses: the slot's own (host memory, grown to the largest chunk)
   * or, for a GPU request, the group's pinned ones (agoq_coll_gpu.c). */
  agoq_coll_slot_bufs own;
  /* Quantized phase-1 frames (every slice, own included; a GPU request keeps its own
   * slice's frame in device memory). */
  agoq_coll_buf sbuf;
  size_t* s_off;
  size_t* s_len;
  agoq_coll_buf rbuf; /* phase-1 receives, one region per rank */
  size_t r_stride;
  size_t r_max;       /* the largest phase-1 message a region takes, spilling past r_stride */
  bool nominal;       /* the mesh's frame regions are sized for nominal frames (host quantized) */
  agoq_coll_buf acc;  /* fp32 (or typed) accumulator of this rank's slice */
  agoq_coll_buf res;  /* this rank's phase-2 message */
  size_t res_len;
  agoq_coll_buf gbuf; /* quantized phase-2 receives, one region per rank */
  size_t* g_off;
  agoq_coll_gpu_step gpu_step; /* GPU requests */
  struct agoq_coll_gslot* gs;  /* a grid group's chunk state (agoq_coll_grid.c); NULL on the mesh */
  const struct agoq_coll_step_impl* step; /* the mesh: how the chunk's slice work runs (agoq_coll_step.h) */
} agoq_coll_slot;

/* A frame the GPU makes for a grid chunk (agoq_coll_grid_gpu.c): whose message (peer; this
 * rank for its own pieces), where in it (off) with room for cap bytes, and its length once
 * made. */
struct agoq_coll_gpu_frame {
  int peer;
  size_t off, cap, len;
  uint8_t* base; /* where off counts from: the message's region, or the spill area (a redo) */
};

/* A pipeline slot's memory for GPU requests, carved when the group's link is created:
 * pinned frames (the kernels write and read them, the network sends and receives them)
 * and device scratch: the fp32 sum, this rank's own frame, the sum's frame. */
typedef struct {
  agoq_coll_slot_bufs pinned; /* acc unused */
  agoq_coll_buf dacc, down, dres;
  /* The chunk's batches (agoq_gpu_*_batch), n items each: its slices' encodes, the
   * contributions to its sum, and the result frames checked as they arrive (nres of them),
   * decoded together once every one is in (res_queued). */
  agoq_gpu_encode_item* enc;
  agoq_gpu_decode_item* sum;
  agoq_gpu_decode_item* res;
  int nres;
  bool res_queued;
  /* A grid's chunk (agoq_coll_grid_gpu.c): the row sums' host copy in pinned.acc; the
   * frames of its row messages (frames[0, nframes)) and of its own pieces (own[0, nown), in
   * down), the groups of its row sums, and which peers' messages are coded again (redo). */
  struct agoq_coll_gpu_frame* frames;
  struct agoq_coll_gpu_frame* own;
  int nframes, nown, nsum; /* nsum: the row sums' items */
  agoq_gpu_sum_group* groups;
  uint8_t* redo; /* [rank]: its message (a grid) or frame (the mesh) is coded again */
  int cap_items; /* of enc, sum, res, frames, own and groups */
} agoq_coll_gpu_slot;

/* Pending net operations of one connection, in posting order (slot indices). */
typedef struct {
  uint8_t slot[AGOQ_COLL_SLOTS];
  unsigned head, count;
} agoq_coll_connq;

enum { AGOQ_CQ_P1S = 0, AGOQ_CQ_P1R, AGOQ_CQ_P2S, AGOQ_CQ_P2R, AGOQ_CQ_COUNT };

typedef struct agoq_coll_comm {
  uint32_t magic;
  const void* ctx; /* identity only (finalize stops its groups); never dereferenced */
  agoq_coll_config cfg;
  int rank, nranks, dev;
  /* The schedule's grid (b == 1: the one-level mesh) and the peers it exchanges messages
   * with, ascending: the only ranks it has connections to. */
  agoq_coll_grid grid;
  int* peers;
  int npeers;
  /* [peer] net comms, one each way per peer; NULL for self and non-peers. A chunk's
   * phase-1 and phase-2 messages share them, matched by tag (agoq_coll_tag). */
  void** send;
  void** recv;
  /* Shared between the proxy thread (enqueue, pool) and the engine. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  agoq_coll_req* q_head;
  agoq_coll_req* q_tail;
  agoq_coll_req* free_reqs;
  agoq_coll_req* reqs; /* pool */
  bool stop;
  bool held;          /* tests only (agoq_coll_engine_hold): the engine runs no pass */
  bool parked;        /* the engine has seen `held` and waits on parked_cv */
  pthread_cond_t parked_cv;
  bool has_thread;
  pthread_t thread;
  /* The engine sleeps in poll() on its connections while it waits on the network; a new
   * request or stop wakes it through this eventfd (written only while it sleeps). */
  int wake_fd;
  atomic_bool sleeping;
  atomic_int error; /* first failure of the group (ncclResult_t) */
  /* Held by whichever thread runs a pass of the pipeline (agoq_coll_engine_step): the
   * engine, or NCCL's proxy thread assisting from test(). Everything below is guarded by
   * it. The engine also holds it while it waits for work, when there is nothing to assist. */
  pthread_mutex_t step_mu;
  bool assisted;          /* a test() pass moved something since the engine last looked */
  int64_t idle_since;     /* first pass that found nothing to do since the last progress; 0 = busy */
  int idle_path;          /* stats path the idle time is charged to */
  agoq_coll_req* act_head; /* taken from the queue, not complete */
  agoq_coll_req* act_tail;
  agoq_coll_req* admit;    /* request whose next chunk is admitted next */
  int codec_threads;       /* threads of one slice's codec call, the engine included */
  agoq_coll_slot slots[AGOQ_COLL_SLOTS];
  uint64_t next_seq, reduce_seq;
  /* Messages that spilled past their receive's region (blocks that escaped raw): bytes held
   * now, at most, and in all. While more is held than the slots' own receive staging, no new
   * chunk is admitted until the chunks in flight retire: data that stops compressing costs
   * pipelining, not unbounded memory. */
  size_t spill_held, spill_peak;
  uint64_t spill_msgs;
  uint64_t spill_waits; /* admission passes that found the spills over the cap */
  /* A grid group (grid.b > 1): its messages per step, and the chunk each stage (row reduce,
   * column reduce, row all-gather) works on next, each in chunk order (agoq_coll_grid.c). */
  struct agoq_coll_gplan* plan;
  uint64_t grid_seq[3];
  uint64_t row_lead;   /* AGOQ_COLL_ROW_LEAD (set at the engine's start; the simulation varies it) */
  uint64_t lead_waits; /* chunks whose row sends waited for the row lead */
  agoq_coll_connq* cq; /* [peer * AGOQ_CQ_COUNT + kind]; unused with I/O threads */
  /* AGOQ_COLLNET_IO_THREADS > 0: the threads that post and test every net operation of the
   * group (agoq_coll_io.h); NULL: the engine does (cq). io_cpus: where they run (io_pinned). */
  struct agoq_coll_io* io;
  bool io_pinned;
  cpu_set_t io_cpus;
  const void** reduce_in; /* nranks input pointers of the slice being reduced */
  struct pollfd* pfds;    /* the engine's sleep: its connections' descriptors and wake_fd */
  int pfds_cap;
  agoq_stats_entry* st; /* never NULL once the engine runs (private when AGOQ_STATS=0) */
  /* Device buffers: the GPU link, created by the first regMr(NCCL_PTR_CUDA). gpu_mu guards
   * it (the pointer, its stream order, ring and counters): NCCL's proxy threads (regMr, the
   * collective calls, test) and whichever thread runs a pass use it. A leaf lock: nothing
   * else is taken while it is held, and only non-blocking calls run under it. */
  pthread_mutex_t gpu_mu;
  agoq_gpu_link* gpu;
  /* GPU requests' memory per pipeline slot; set with the link (NULL: that path is off). */
  agoq_coll_gpu_slot* gslots;
  /* The link's staging ring and gslots' pinned frames, registered with the transport. */
  void* gpu_keys[2];
  /* The GPU path's memory: every slot's pinned regions (gpin) and device scratch (gdev), and
   * the spill area (gspill: pinned, never on the wire). The regions are sized for frames
   * whose blocks compress; a batch that reads or writes larger ones (blocks escaped raw: NaN,
   * Inf) uses the spill area, which one slot holds at a time (gspill_holder: its index + 1,
   * 0 when free) from its batch's queuing until that batch's mark is seen done, so it is
   * sized for one batch at its largest, not for every slot (agoq_coll_gpu_spill_*). */
  agoq_coll_buf gpin, gdev, gspill;
  int gspill_holder;
  size_t gspill_used;
  uint64_t gspill_batches, gspill_waits; /* batches that used it; times a slot found it held */
  uint32_t bounce_reqs; /* requests holding a bounce buffer (at most one at a time) */
  uint64_t bounce_regs; /* bounce buffers registered with the transport for their call */
  struct agoq_coll_comm* reg_next; /* registry of open groups */
} agoq_coll_comm;

typedef struct {
  uint32_t magic;
  int type;   /* NCCL_PTR_HOST or NCCL_PTR_CUDA */
  int device; /* NCCL_PTR_CUDA: the GPU; -1 for host memory */
  void* addr;
  size_t size;
  void* net_key; /* host memory: its registration with the transport */
} agoq_coll_mr;

/* The tag of chunk seq's phase-1 or phase-2 message (AGOQ_CQ_P1* / P2*) on a connection:
 * the receiver's tagged comm hands each message to the receive of its tag, however they
 * interleave (a peer ahead sends chunk k+1's contributions before chunk k's results).
 * Chunks in flight on a connection lie within 2 * AGOQ_COLL_SLOTS of each other, far inside
 * the 2^29 sequence numbers a tag tells apart; setup's messages have a tag of their own. */
#define AGOQ_COLL_TAG_SETUP INT32_MAX
static inline int agoq_coll_tag(int kind, uint64_t seq) {
  uint64_t phase = (kind == AGOQ_CQ_P2S || kind == AGOQ_CQ_P2R) ? 1u : 0u;
  return (int)(((seq & 0x1fffffffu) << 1) | phase);
}

static inline bool agoq_coll_has_p1(const agoq_coll_req* r) { return r->kind != AGOQ_COLL_ALLGATHER; }
static inline bool agoq_coll_has_p2(const agoq_coll_req* r) { return r->kind != AGOQ_COLL_REDUCESCATTER; }

static inline agoq_codec_params agoq_coll_params(const agoq_coll_comm* g, agoq_dtype dtype) {
  agoq_codec_params p = {.format = g->cfg.format, .dtype = dtype, .block = g->cfg.block};
  return p;
}

static inline agoq_coll_path_stats* agoq_coll_req_stats(agoq_coll_comm* g, const agoq_coll_req* r) {
  return &g->st->path[r->quantized ? AGOQ_STATS_QUANT : AGOQ_STATS_EXACT];
}

/* ---- agoq_coll_init.c ---- */
void agoq_coll_registry_add(agoq_coll_comm* comm);
void agoq_coll_registry_remove(agoq_coll_comm* comm);


/* ---- agoq_coll_engine.c ---- */
/* Wakes the engine if it sleeps (after a request was queued or stop was set). */
void agoq_coll_engine_wake(agoq_coll_comm* comm);
/* One pass of the pipeline on the caller's thread (NCCL's proxy, in test()) unless
 * another thread is running one: never waits. A failure fails the group; the engine ends
 * its requests. */
void agoq_coll_engine_assist(agoq_coll_comm* comm);
/* Tests only: with hold, returns once the engine thread runs no pass any more (so test()
 * alone moves the pipeline); without, lets it run again. */
void agoq_coll_engine_hold(agoq_coll_comm* comm, bool hold);
ncclResult_t agoq_coll_engine_start(agoq_coll_comm* comm);
/* Stops and joins the engine (idempotent); requests it had not completed fail. */
void agoq_coll_engine_stop(agoq_coll_comm* comm);
void agoq_coll_engine_free(agoq_coll_comm* comm);
/* Bytes of staging the group's pipeline slots hold now (every buffer they grew), for the
 * simulation's and tests' figures; under step_mu or with the engine held. */
size_t agoq_coll_staging_bytes(const agoq_coll_comm* comm);


/* ---- agoq_coll_post.c ---- */
/* Closes every net connection of the group (idempotent). */
void agoq_coll_close_conns(agoq_coll_comm* comm);
/* Records the group's first failure; returns true for the caller that set it. */
bool agoq_coll_fail(agoq_coll_comm* comm, ncclResult_t res);
/* Peer's queue of pending operations of one kind (AGOQ_CQ_*), and slot s's net request of that
 * kind with peer. */
agoq_coll_connq* agoq_coll_cq(agoq_coll_comm* g, int peer, int kind);
void** agoq_coll_op_req(agoq_coll_slot* s, int kind, int peer);
/* Posts a receive / send of one connection of slot s (kind AGOQ_CQ_*); *posted is false when
 * the net core is busy (NCCL's NULL request), so the caller retries the same operation. */
ncclResult_t agoq_coll_post_recv(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, void* data, size_t size,
                                 bool* posted);
/* The same for a message of up to max bytes (max > size: a larger one spills, and the
 * receive's p1r_at / p2r_at entry then points at its own buffer once it completes). */
ncclResult_t agoq_coll_post_recv_max(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, void* data, size_t size,
                                     size_t max, bool* posted);
/* Slot s's completed receive of kind from j spilled into buf (len bytes): taken into its list. */
void agoq_coll_spill_take(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, uint8_t* buf, size_t len);
/* A buffer of len bytes for a message of slot s that outgrew its region (NULL: out of memory,
 * warned); freed when the chunk retires. */
uint8_t* agoq_coll_spill_alloc(agoq_coll_comm* g, agoq_coll_slot* s, size_t len);
/* Frees the slot's spilled messages (the chunk retired or was abandoned). */
void agoq_coll_spill_free(agoq_coll_comm* g, agoq_coll_slot* s);
ncclResult_t agoq_coll_post_send(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, const void* data,
                                 size_t size, size_t raw, bool* posted);

/* ---- agoq_coll_grid.c: a chunk on a two-level grid (grid.b > 1), host memory ---- */
static inline bool agoq_coll_on_grid(const agoq_coll_comm* g) { return g->grid.b > 1; }
/* The plan and every slot's grid state (engine start), and their release (idempotent). */
ncclResult_t agoq_coll_grid_start(agoq_coll_comm* g);
void agoq_coll_grid_free(agoq_coll_comm* g);
/* Bytes of the grid state's own buffers in slot s (agoq_coll_staging_bytes). */
size_t agoq_coll_grid_staging(const agoq_coll_slot* s);
/* Chunk c of r in slot s: its pieces, pending counts and buffers. */
ncclResult_t agoq_coll_grid_slot_setup(agoq_coll_comm* g, agoq_coll_slot* s, agoq_coll_req* r, size_t c);
/* POSTING: every receive, then the row reduce-scatter's sends. */
ncclResult_t agoq_coll_grid_post(agoq_coll_comm* g, agoq_coll_slot* s);
/* A completed receive (AGOQ_CQ_P1R or P2R) from peer j of size bytes, after the engine's
 * common bookkeeping (pending counts, p1r_size). */
ncclResult_t agoq_coll_grid_received(agoq_coll_comm* g, agoq_coll_slot* s, int kind, int j, int size);
/* Moves every chunk it can through the row, column and all-gather stages, in chunk order. */
ncclResult_t agoq_coll_grid_advance(agoq_coll_comm* g, bool* progressed);
/* WAIT_ALL with every send and receive complete: *done once the results are in place (a
 * GPU request's decodes). */
ncclResult_t agoq_coll_grid_retire(agoq_coll_comm* g, agoq_coll_slot* s, bool* done);

/* ---- agoq_coll_reqpool.c ---- */
ncclResult_t agoq_coll_pool_init(agoq_coll_comm* comm);
void agoq_coll_pool_fini(agoq_coll_comm* comm);
void agoq_coll_req_finish(agoq_coll_req* req, ncclResult_t res);

/* ---- agoq_coll_layout.c ---- */
size_t agoq_coll_type_size(int dtype);
/* First element of rank j's range in a reducescatter/allgather window. */
size_t agoq_coll_rank_begin(const agoq_coll_req* req, int j);
/* Slice starts and lengths of chunk c of req among n ranks. */
void agoq_coll_chunk_layout(const agoq_coll_req* req, size_t c, int n, size_t* sb, size_t* sl);
const uint8_t* agoq_coll_src_at(const agoq_coll_req* req, size_t elem);
uint8_t* agoq_coll_dst_at(const agoq_coll_req* req, size_t elem);

/* ---- agoq_coll_quant.c: the quantized path of a chunk ---- */
size_t agoq_coll_quant_result_cap(const agoq_coll_comm* g, size_t n);
/* The buffers a chunk with slices sl[] of type dtype needs (each need's cap; p unused), the
 * frames' offsets in sbuf (s_off) and gbuf (g_off) when given, and rbuf's stride. With
 * nominal, the frame regions are sized for frames none of whose blocks escapes (a larger one
 * spills: the host path); without, for the worst case (the GPU path's pinned slots). */
void agoq_coll_quant_sizes(const agoq_coll_comm* g, agoq_dtype dtype, bool p2, bool nominal, const size_t* sl,
                           size_t* s_off, size_t* g_off, size_t* r_stride, agoq_coll_slot_bufs* need);
/* A frame of n elements of params p, none of whose blocks escapes / in the worst case. */
size_t agoq_coll_frame_cap(const agoq_codec_params* p, size_t n, bool nominal);
ncclResult_t agoq_coll_quant_reserve(agoq_coll_comm* g, agoq_coll_slot* s);
/* Quantizes slice j of the chunk into its phase-1 frame. */
ncclResult_t agoq_coll_quant_encode(agoq_coll_comm* g, agoq_coll_slot* s, int j);
/* Accumulates this rank's slice in fp32 and re-quantizes it (reducescatter: rounds it). */
ncclResult_t agoq_coll_quant_reduce(agoq_coll_comm* g, agoq_coll_slot* s);
/* Where the result frame of slice j's owner lands, host or GPU path alike: its region of
 * the slot's gbuf, at most *cap bytes. */
void agoq_coll_quant_p2_place(agoq_coll_comm* g, agoq_coll_slot* s, int j, uint8_t** p, size_t* cap, size_t* max);
/* Decodes rank j's result frame (size bytes) into place. */
ncclResult_t agoq_coll_quant_decode(agoq_coll_comm* g, agoq_coll_slot* s, int j, int size);
/* A received quantized frame: a contribution to this rank's slice (phase 1), or its owner's
 * result frame of a slice (phase 2). */
typedef enum { AGOQ_COLL_FRAME_CONTRIBUTION, AGOQ_COLL_FRAME_RESULT } agoq_coll_frame_kind;
/* What is done with a frame once it may be read (parsed, decoded); its status is the verdict. */
typedef agoq_codec_status (*agoq_coll_frame_step_fn)(void* arg, const uint8_t* f, size_t len);
/* Rank k's frame f of len bytes, for the host and the GPU path alike: refused unless it
 * carries a payload CRC when sealed (it crossed the wire), then step(arg, f, len); a refusal
 * or a failed step is warned about and fails the call (ncclSystemError). */
ncclResult_t agoq_coll_quant_frame_check(agoq_coll_comm* g, const agoq_coll_slot* s, agoq_coll_frame_kind kind, int k,
                                         bool sealed, const uint8_t* f, size_t len, agoq_coll_frame_step_fn step,
                                         void* arg);

/* ---- agoq_coll_gpu.c: the quantized path on the GPU (requests with r->gpu) ---- */
/* With the group's link, under gpu_mu: the link's codec results per slot it needs, and its
 * pipeline slots' memory (AGOQ_COLLNET_GPU=1; a no-op otherwise). */
uint32_t agoq_coll_gpu_parts(const agoq_coll_comm* g);
/* Before the link is made: whether the group's device reduction will run (so the link needs
 * batch memory), and the most elements of any slice it codes. */
bool agoq_coll_gpu_wanted(const agoq_coll_comm* g);
size_t agoq_coll_gpu_slice_elems(const agoq_coll_comm* g);
ncclResult_t agoq_coll_gpu_setup(agoq_coll_comm* g);
/* The pipeline slots' GPU path state (at close, after the link). */
void agoq_coll_gpu_release(agoq_coll_comm* g);
/* At the call, under gpu_mu: whether r runs on the GPU (quantized, every buffer on the
 * device, the path set up); if so r->gpu is set. */
bool agoq_coll_gpu_takes(agoq_coll_comm* g, agoq_coll_req* r, bool in_dev, bool out_dev);
/* The slot's buffers are the group's pinned ones (sizes as agoq_coll_quant_reserve's). */
ncclResult_t agoq_coll_gpu_reserve(agoq_coll_comm* g, agoq_coll_slot* s);
/* Every slice's frame from NCCL's buffer: *ready once they are sealed (POSTING). */
ncclResult_t agoq_coll_gpu_encode(agoq_coll_comm* g, agoq_coll_slot* s, bool* ready);
/* The owner's sum in rank order and its result message: *done once it can be sent. */
ncclResult_t agoq_coll_gpu_reduce(agoq_coll_comm* g, agoq_coll_slot* s, bool* done);
/* Rank j's result frame (size bytes) checked, for the slot's one batched decode into place. */
ncclResult_t agoq_coll_gpu_decode(agoq_coll_comm* g, agoq_coll_slot* s, int j, int size);
/* The result frames' batched decode queued (once), then *done = it has completed without
 * error (WAIT_ALL). */
ncclResult_t agoq_coll_gpu_retire(agoq_coll_comm* g, agoq_coll_slot* s, bool* done);

/* The GPU step's plumbing, for the grid's GPU stages too: the slot's link slot; work queued
 * under gpu_mu (with mark, the slot's mark after it); the slot's mark polled (its GPU time
 * collected); a result's status (and an encode's body length); a failure for any result in
 * [from, to); the CPU time of a GPU step's host part. */
typedef ncclResult_t (*agoq_coll_gpu_queue_fn)(agoq_coll_comm* g, agoq_coll_slot* s, const void* arg);
uint32_t agoq_coll_gpu_link_slot(const agoq_coll_comm* g, const agoq_coll_slot* s);
ncclResult_t agoq_coll_gpu_queue(agoq_coll_comm* g, agoq_coll_slot* s, bool mark, agoq_coll_gpu_queue_fn fn,
                                 const void* arg);
ncclResult_t agoq_coll_gpu_poll(agoq_coll_comm* g, const agoq_coll_slot* s, bool* done);
uint32_t agoq_coll_gpu_status(agoq_coll_comm* g, const agoq_coll_slot* s, int part, uint64_t* body_len);
ncclResult_t agoq_coll_gpu_check_parts(agoq_coll_comm* g, agoq_coll_slot* s, int from, int to, const char* what);
void agoq_coll_gpu_cpu_time(agoq_coll_comm* g, const agoq_coll_req* r, int64_t t0, uint64_t crc0);
/* A GPU encode stage, the mesh's and the grid's: start queues the batch (redo: of the frames
 * that outgrew their room, into the spill area; *queued false while another slot holds it),
 * done takes the completed batch's verdicts (first: the first batch's; *redo: some frame did
 * not fit). encode_steps runs them: NONE, ENCODING, then ENCODED or REDO_WAIT, REENCODING,
 * ENCODED; *ready once the frames are sealed. */
typedef ncclResult_t (*agoq_coll_gpu_start_fn)(agoq_coll_comm* g, agoq_coll_slot* s, bool redo, bool* queued);
typedef ncclResult_t (*agoq_coll_gpu_done_fn)(agoq_coll_comm* g, agoq_coll_slot* s, bool first, bool* redo);
ncclResult_t agoq_coll_gpu_encode_steps(agoq_coll_comm* g, agoq_coll_slot* s, agoq_coll_gpu_start_fn start,
                                        agoq_coll_gpu_done_fn done, bool* ready);
/* Frames the GPU wrote into pinned memory (d2h bytes), sealed by the CPU since t0/crc0:
 * counted as PCIe traffic, and the CPU's time as codec time. */
void agoq_coll_gpu_sealed(agoq_coll_comm* g, const agoq_coll_req* r, uint64_t d2h, int64_t t0, uint64_t crc0);
/* The pipeline slots' item arrays: enc, sum and res of `items` each, redo of `peers` and, on
 * a grid, frames, own and groups; NULL (with a WARN) when out of memory. Freed with
 * agoq_coll_gpu_slots_free (the memory they point into is the link's). */
agoq_coll_gpu_slot* agoq_coll_gpu_slots_alloc(size_t items, size_t peers, bool grid);
void agoq_coll_gpu_slots_free(agoq_coll_gpu_slot* gs);
/* Setup, under gpu_mu: every slot's pinned buffers (pin's caps: sbuf, rbuf, gbuf, acc, res)
 * and device buffers (dev: dacc, down, dres), 256-byte aligned, allocated through the link,
 * the pinned part registered with the transport; a size of 0 takes no room; and the group's
 * spill area of `spill` pinned bytes. *pinned_bytes (the spill area included) and
 * *device_bytes: what that took. */
ncclResult_t agoq_coll_gpu_slots_carve(agoq_coll_comm* g, agoq_coll_gpu_slot* gs, const agoq_coll_slot_bufs* pin,
                                       const size_t dev[3], size_t spill, size_t* pinned_bytes, size_t* device_bytes);
/* The spill area (agoq_coll_comm.gspill), under step_mu. Before a batch that reads the bodies
 * of items[0, k): those in neither the slots' pinned regions nor device memory (messages the
 * transport spilled into host memory of its own, which the device cannot read) are copied
 * into the spill area and the items pointed there; *ready is false, with nothing done, when
 * another slot holds it (a later pass tries again). Its batch must be queued, with the slot's
 * mark behind it, in the same pass: the mark seen done (agoq_coll_gpu_poll) gives the area
 * back. */
ncclResult_t agoq_coll_gpu_spill_stage(agoq_coll_comm* g, agoq_coll_slot* s, agoq_gpu_decode_item* items, size_t k,
                                       bool* ready);
/* Whether slot s may take the spill area now (free, or already its own). */
bool agoq_coll_gpu_spill_ready(agoq_coll_comm* g, const agoq_coll_slot* s);
/* Whether the device can read [p, p + len) where it is: in the GPU path's pinned or device
 * memory. */
bool agoq_coll_gpu_reachable(const agoq_coll_comm* g, const void* p, size_t len);
/* A received message at [p, p + len) the device cannot read where it is, while another slot
 * holds the spill area: its batch must wait (checked before any work for the batch). */
bool agoq_coll_gpu_spill_blocked(agoq_coll_comm* g, const agoq_coll_slot* s, const void* p, size_t len);
/* `bytes` more of the spill area for s's batch (the area taken for s if it was free: only
 * after agoq_coll_gpu_spill_ready said so); NULL with *res set when it does not hold them,
 * which an area sized for the largest batch never does (an internal error). As with
 * agoq_coll_gpu_spill_stage, the area comes back when the slot's next mark is seen done. */
uint8_t* agoq_coll_gpu_spill_room(agoq_coll_comm* g, agoq_coll_slot* s, size_t bytes, ncclResult_t* res);
/* A frame received for a GPU decode, checked on the host as the CPU decoder checks it
 * (agoq_frame_parse: header and payload CRC32C, lengths, bitmap, scales), its count against
 * the piece's and its format, type and block against want (a batch decodes with one set). */
agoq_codec_status agoq_coll_gpu_frame_check(const uint8_t* f, size_t len, size_t count, const agoq_codec_params* want,
                                            agoq_frame_info* info, const void** body);

/* ---- agoq_coll_grid_gpu.c: a grid's quantized calls on the GPU ---- */
/* Before the link is made: whether a grid group's device reduction will run, and what its
 * batches need (items and results per slot, the most elements of an item). */
bool agoq_coll_grid_gpu_wanted(const agoq_coll_comm* g);
void agoq_coll_grid_gpu_needs(const agoq_coll_comm* g, uint32_t* items, size_t* max_n);
/* With the link, under gpu_mu: the pipeline slots' pinned and device memory (at their
 * largest chunk) and item arrays. */
ncclResult_t agoq_coll_grid_gpu_setup(agoq_coll_comm* g);
/* Slot s's buffers for its chunk (sizes from the grid's layout): the group's pinned ones. */
ncclResult_t agoq_coll_grid_gpu_bufs(agoq_coll_comm* g, agoq_coll_slot* s, size_t sb, size_t rb, size_t gb,
                                     size_t acc, size_t res);
/* POSTING, before the row sends: every frame of this rank's input, one batch; *ready once
 * they are sealed. */
ncclResult_t agoq_coll_grid_gpu_encode(agoq_coll_comm* g, agoq_coll_slot* s, bool* ready);
/* G_ROW: the row's sums of this rank's pieces, one batch, copied to s->acc; *done then. */
ncclResult_t agoq_coll_grid_gpu_row(agoq_coll_comm* g, agoq_coll_slot* s, bool* done);
/* A final piece's frame (len bytes, m elements) for the chunk's one decode into dst:
 * `travelled` frames are checked first (header, payload CRC, count, parameters). */
agoq_codec_status agoq_coll_grid_gpu_final(agoq_coll_comm* g, agoq_coll_slot* s, const uint8_t* f, size_t len,
                                           size_t m, void* dst, bool travelled);
/* A reduce-scatter's final piece: the fp32 sum of m elements rounded into pinned (the slot's
 * region), then copied into dst (NCCL's device buffer) behind the slot's next mark. */
ncclResult_t agoq_coll_grid_gpu_narrow(agoq_coll_comm* g, agoq_coll_slot* s, const float* sum, size_t m,
                                       uint8_t* pinned, void* dst);
/* WAIT_ALL: the final frames' decode queued (once) and the slot's mark; *done once it has
 * completed. */
ncclResult_t agoq_coll_grid_gpu_retire(agoq_coll_comm* g, agoq_coll_slot* s, bool* done);

/* ---- agoq_coll_reduce.c: the exact path ---- */
ncclResult_t agoq_coll_exact_reserve(agoq_coll_comm* g, agoq_coll_slot* s);
ncclResult_t agoq_coll_exact_reduce(agoq_coll_comm* g, agoq_coll_slot* s);
/* out[i] = in[0][i] op in[1][i] op ... op in[n-1][i] in rank order (agoq_collnet.h rules).
 * scratch holds m fp32 values (narrow float types). out must not alias any input. */
void agoq_coll_reduce_exact(int dtype, int op, const void* const* in, int n, size_t m, void* out,
                            float* scratch);
/* The two levels of an exact reduction on a grid: partial results are fp32 for the narrow
 * float types' Sum and Prod (rounded once, at the end, as on the mesh), the type itself
 * otherwise; agoq_coll_partial_size gives their size. reduce_partial: out (partials) =
 * in[0] op ... op in[n-1], inputs of the type. reduce_final: inputs are partials; dst gets
 * the result in the type (scratch: m fp32 values). Neither output may alias an input. */
size_t agoq_coll_partial_size(int dtype, int op);
void agoq_coll_reduce_partial(int dtype, int op, const void* const* in, int n, size_t m, void* out);
void agoq_coll_reduce_final(int dtype, int op, const void* const* in, int n, size_t m, float* scratch, void* dst);

/* ---- agoq_coll_stats.c ---- */
int64_t agoq_coll_now_ns(void); /* the stats clock (injectable in tests) */
/* The group's stats entry (before its engine starts); its lines at close / finalize. */
ncclResult_t agoq_coll_stats_open(agoq_coll_comm* comm);
void agoq_coll_stats_print(agoq_coll_comm* comm);
/* Once per process: a WARN when AGOQ_MIN_BYTES is above every call NCCL's staged CollNet
 * path makes, so compression would silently never happen. True when it warned now. */
bool agoq_coll_min_bytes_check(uint64_t min_bytes);

/* ---- agoq_coll_device.c: NCCL's buffers in device memory ---- */
/* regMr(NCCL_PTR_CUDA): checks the range, creates the group's link on the first one. */
ncclResult_t agoq_coll_dev_reg(agoq_coll_comm* g, void* data, size_t size, agoq_coll_mr* mr);
/* *device = mhandle is a device registration; [data, data + size) must lie inside it. */
ncclResult_t agoq_coll_dev_is_device(const void* mhandle, const void* data, size_t size, bool* device);
/* At the call: stages the request's device buffers (src/dst/joined point into the staging,
 * the input's D2H copy is queued). *busy: the staging is full now (NCCL calls again).
 * in_dev/out_dev: src (or some send part) / dst (or some receive part) in device memory;
 * src/dst hold NCCL's pointers, result_bytes and the window are set. A failed copy fails
 * the group. */
ncclResult_t agoq_coll_dev_stage(agoq_coll_comm* g, agoq_coll_req* r, bool in_dev, bool out_dev, bool* busy);
/* Under step_mu: *ready = the request's input is in host memory (its D2H copy is done). */
ncclResult_t agoq_coll_dev_input_ready(agoq_coll_comm* g, agoq_coll_req* r, bool* ready);
/* Under step_mu, once the host result is complete: queues its copies into NCCL's device
 * buffers; *queued = there were some (the request then goes COPY_OUT, not DONE). */
ncclResult_t agoq_coll_dev_copy_out(agoq_coll_comm* g, agoq_coll_req* r, bool* queued);
/* test(): *done = the copies into NCCL's buffers have completed. */
ncclResult_t agoq_coll_dev_copied(agoq_coll_comm* g, agoq_coll_req* r, bool* done);
/* Gives the request's staging back (test, at release). */
void agoq_coll_dev_release(agoq_coll_comm* g, agoq_coll_req* r);
/* Close, after the engine stopped: waits for the link's copies, logs and frees it. */
void agoq_coll_dev_close(agoq_coll_comm* g);

/* ---- buffers (agoq_coll_post.c) ---- */
/* Drops the registrations of the GPU link's memory (before the link goes). */
void agoq_coll_gpu_unregister(agoq_coll_comm* g);
/* Grows b to size bytes, registered with the transport of device dev once per growth
 * (dev -1: memory that never goes on the wire, not registered). */
ncclResult_t agoq_coll_buf_reserve(int dev, agoq_coll_buf* b, size_t size);
void agoq_coll_buf_free(agoq_coll_buf* b);

#endif
