/*
 * CollNet conformance harness: dlopens the built plugin and drives its exported CollNet
 * tables with N processes, the way NCCL's proxy drives them on N node heads.
 *
 * The orchestrator (collnet_main.c) never loads the plugin. For a scenario it fork+execs
 * N workers, each with a control socket to it; the orchestrator is the workers' bootstrap
 * hub (all-gather of handles, hashes and verdicts, barriers) and their watchdog: a worker
 * that dies unexpectedly or a scenario that runs past its limit kills the group and fails
 * with every worker's reason.
 */
#ifndef AGOQ_COLLNET_HARNESS_H
#define AGOQ_COLLNET_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agoq_loader.h"
#include "collnet/agoq_coll_schedule.h"
#include "perf_dtype.h"

#define CN_HANDLE_SIZE 128
#define CN_MAX_RANKS 32 /* above 16 the group runs the two-level grid (issue 28) */
#define CN_MAX_INFLIGHT 8     /* NCCL groups up to 8 channels' calls (COLLNET_GROUP_NSUBS) */
#define CN_DEATH_LIMIT_MS 10000 /* survivors must see a dead rank's collective fail by then */
#define CN_WAIT_MS 120000     /* longest wait for one batch of calls or one hub exchange */

struct cn_worker;
typedef int (*cn_run_fn)(struct cn_worker* w);

enum {
  CN_SC_ALL_VERSIONS = 1u << 0, /* run once per exported CollNet version */
  CN_SC_VICTIM = 1u << 1,       /* one rank kills itself on purpose */
};

typedef struct {
  const char* name;
  const char* summary;
  cn_run_fn run;
  unsigned flags;
} cn_scenario;

extern const cn_scenario cn_scenarios[];
extern const size_t cn_scenario_count;

/* What a worker reports at the end (and the victim just before it dies). */
enum { CN_RESULT_PASS = 0, CN_RESULT_FAIL = 1, CN_RESULT_DYING = 2 };

typedef struct cn_worker {
  int rank, nranks;
  int ctrl_fd;
  const cn_scenario* sc;
  const char* lib_path;
  int version;
  uint64_t comm_id;
  agoq_netlib* lib;
  agoq_collnet_view view;
  void* ctx;
  int dev;
  agoq_view_props props;
  void* listen_comm;
  void* coll_comm;
  /* The plugin configuration the checks assume (AGOQ_* of this environment). */
  int format; /* 0 none, 1 int8, 2 int4, 3 fp8e4m3, 4 fp8e5m2 */
  size_t min_bytes;
  /* The schedule the group runs, as the plugin chooses it from the handles (cn_connect):
   * the order of the exact reference's sums. */
  agoq_coll_grid grid;
  bool failed;
  char why[2048];
  int64_t event_ns; /* kill scenario: when this worker saw the failure, or died */
} cn_worker;

/* ---- control channel (collnet_proc.c) ---- */
enum { CN_MSG_ALLGATHER = 1, CN_MSG_RESULT, CN_MSG_ABORT };
/* Every worker's len bytes, in rank order, to every worker. */
int cn_allgather(cn_worker* w, const void* mine, void* all, uint32_t len);
int cn_barrier(cn_worker* w);
/* The final verdict; the victim sends CN_RESULT_DYING with its time of death first. */
int cn_send_result(cn_worker* w, uint32_t status, int64_t event_ns, const char* text);

/* Runs a scenario in fresh processes; 0 when it passed, else the reason in why. */
int cn_run_scenario(const char* self_exe, const char* lib_path, const cn_scenario* sc,
                    int nranks, int version, int timeout_s, char* why, size_t cap);
/* The worker side of one process (argv from cn_run_scenario). */
int cn_worker_main(int argc, char** argv);

/* ---- failures and time (collnet_proc.c) ---- */
void cn_fail(cn_worker* w, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define CN_FAIL(w, ...) cn_fail((w), __FILE__, __LINE__, __VA_ARGS__)
#define CN_REQUIRE(w, cond, ...)   \
  do {                             \
    if (!(cond)) {                 \
      CN_FAIL((w), __VA_ARGS__);   \
      goto fail;                   \
    }                              \
  } while (0)
#define CN_OK(w, call)                                                                 \
  do {                                                                                 \
    ncclResult_t cn_res_ = (call);                                                     \
    if (cn_res_ != ncclSuccess) {                                                      \
      CN_FAIL((w), "%s returned %s", #call, cn_result_str(cn_res_));                   \
      goto fail;                                                                       \
    }                                                                                  \
  } while (0)
const char* cn_result_str(ncclResult_t r);
int64_t cn_now_ns(void);

/* ---- the group, set up as NCCL's proxy does (collnet_group.c) ---- */
/* init, devices (0 devices is a failure: this build claims CollNet), properties. */
int cn_open(cn_worker* w);
/* listen, all-gather the handles, connect once, closeListen. */
int cn_connect(cn_worker* w);
/* closeColl, finalize, dlclose; records failures but keeps going. */
void cn_close(cn_worker* w);

/* ---- collectives (collnet_cases.c) ---- */
typedef enum { CN_ALLREDUCE = 0, CN_REDUCESCATTER, CN_ALLGATHER } cn_kind;

/* One collective: its inputs, the calls it is cut into, its output. */
typedef struct {
  cn_kind kind;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  size_t count;   /* allreduce: elements; reducescatter/allgather: elements per rank */
  size_t window;  /* bytes per call; 0 = one call */
  uint64_t seed;  /* inputs: a function of (seed, rank, index) */
  bool inject;    /* rank 0's element 5 is +Inf, rank 1's element 300 NaN (float types) */
  bool overflow;  /* fp16/bf16 Sum: every third run of 1024 elements sums beyond the type's
                     range in about half its elements (collnet_cases.c, cn_overflow_*) */
  /* filled by cn_batch_run */
  size_t send_bytes, recv_bytes;
  uint8_t* send;
  uint8_t* recv;
  int ncalls;
  bool quantized; /* some call takes the quantized path by the plugin's rules */
  double rel_l2;  /* against the fp64 reference, when quantized */
  uint64_t hash;  /* of recv, compared between ranks */
} cn_case;

typedef struct {
  cn_case* cases;
  int ncases, cap;
  int inflight;     /* calls outstanding at most (1..CN_MAX_INFLIGHT) */
  bool test_lifo;   /* test the newest outstanding call first (progress without test) */
  double max_rel_l2; /* bound for quantized cases */
  int device_skipped; /* --device: cases left out, a call of theirs above AGOQ_GPU_STAGING */
} cn_batch;

int cn_batch_add(cn_worker* w, cn_batch* b, cn_kind kind, ncclDataType_t dtype, ncclRedOp_t op,
                 size_t count, size_t window, uint64_t seed);
/* Allocates and registers the buffers, posts every call (at most b->inflight
 * outstanding), waits, checks every case (exact: bit for bit against the rank-order
 * reduction; quantized: relative L2 within b->max_rel_l2), checks the guard bytes around
 * every buffer, and compares every case's result bits with the other ranks'. */
int cn_batch_run(cn_worker* w, cn_batch* b);
void cn_batch_free(cn_worker* w, cn_batch* b);

/* ---- device buffers (collnet_device.c; --device) ---- */
/* This build has the CUDA emulation (CN_HAVE_DEVICE). */
bool cn_device_available(void);
/* The workers run with NCCL's buffers in (emulated) device memory: AGOQ_COLLNET_DEVICE=1,
 * set by --device. */
bool cn_device_mode(void);
/* A device twin of [host, host + size), filled with its bytes; 0 ok. */
int cn_device_alloc(void* host, size_t size);
void cn_device_free(void* host);
/* The twin's address of a host address in a twinned buffer; the address itself otherwise. */
void* cn_device_ptr(void* host);
/* Host bytes [host, host + n) to the twin / the twin's bytes back into them; 0 ok, also
 * without a twin. */
int cn_device_push(void* host, size_t n);
int cn_device_pull(void* host, size_t n);
/* The twin's bytes at host's place into out, leaving the host buffer alone; 0 ok. */
int cn_device_read(const void* host, void* out, size_t n);
/* The most staging one call may need (AGOQ_GPU_STAGING) in device mode; SIZE_MAX else. */
size_t cn_device_max_call(void);

/* Whether the plugin's supported matrix has (dtype, op), as this rank's reduceSupport says
 * (the support scenario checks that all ranks and versions agree). */
int cn_supported(cn_worker* w, ncclDataType_t dtype, ncclRedOp_t op, bool* yes);
/* The relative L2 bound of a quantized result per AGOQ_FORMAT (index as above). */
double cn_quant_bound(int format);

#endif
