/*
 * agoq-perf allreduce | reducescatter | allgather: N ranks drive the built plugin's CollNet
 * table the way NCCL's proxy does (coll_net.cc): every rank listens, the 128-byte handles
 * are all-gathered, every rank calls connect(handles, nranks, rank, listenComm) once, the
 * buffers are registered once, and each collective is cut into calls of at most --chunk
 * bytes with up to --inflight of them outstanding, tested oldest first.
 *
 * Sizes are nccl-tests': the whole buffer (allreduce), or all ranks' parts together
 * (reducescatter input, allgather output). Every size is checked against an fp64 reference
 * built from every rank's input, which any rank can regenerate (perf_dtype.h), and the
 * ranks' results are compared bit for bit (`diverged`).
 */
#ifndef AGOQ_PERF_COLL_H
#define AGOQ_PERF_COLL_H

#include "perf.h"
#include "perf_dtype.h"

typedef enum {
  PERF_COLL_ALLREDUCE = 0,
  PERF_COLL_REDUCESCATTER,
  PERF_COLL_ALLGATHER,
} perf_coll_kind;

const char* perf_coll_kind_name(perf_coll_kind k);

#define PERF_COLL_MAX_RANKS 1024
#define PERF_COLL_MAX_INFLIGHT 32 /* NCCL_NET_MAX_REQUESTS */

/* ---- options (perf_coll_opts.c) ---- */

typedef struct {
  perf_coll_kind kind;
  int nranks;                  /* -N, --nranks */
  ncclDataType_t dtype;        /* -d, --dtype */
  ncclRedOp_t op;              /* -o, --op */
  size_t min_bytes, max_bytes; /* -b, -e */
  double factor;               /* -f */
  size_t step_bytes;           /* -i */
  int iters, warmup;           /* -n/--iters, -w */
  int inflight;                /* --inflight */
  size_t chunk;                /* --chunk: bytes per call, 0 = one call per buffer */
  int format;                  /* --format: index into perf_coll_formats, -1 = unset */
  int abi;                     /* --abi: CollNet table version, 0 = newest exported */
  bool json;
  const char* lib;
  int dev;
  int rank; /* --rank, -1 = fork every rank on this host */
  const char* addr;
  int boot_timeout_s;
  double max_rel_l2; /* --max-rel-l2: fail above it, < 0 = no limit */
  long max_diverged; /* --max-diverged: fail above it, < 0 = no limit */
  uint64_t seed;     /* --seed: base of every rank's input stream */
} perf_coll_opts;

/* AGOQ_FORMAT's values, in the plugin's enum order. */
extern const char* const perf_coll_formats[];
extern const int perf_coll_nformats;

int perf_coll_opts_parse(int argc, char** argv, perf_coll_kind kind, perf_coll_opts* o);
/* Rank 0's choices travel to every rank; each keeps its own --lib, --dev and addresses. */
#define PERF_COLL_CONFIG_BYTES (20 * 8)
void perf_coll_config_encode(const perf_coll_opts* o, uint64_t comm_id, uint8_t* out);
void perf_coll_config_decode(const uint8_t* in, perf_coll_opts* o, uint64_t* comm_id);

/* ---- the plugin's CollNet group (perf_coll_net.c) ---- */

typedef struct {
  agoq_netlib* lib;
  agoq_collnet_view view;
  void* ctx;
  int dev;
  agoq_view_props props;
  void* listen_comm;
  void* coll_comm;
  void* send_mh;
  void* recv_mh;
} perf_coll_net;

/* dlopen, the CollNet table (abi 0: newest), init, devices, properties. On failure a
 * message says why (0 devices: CollNet unavailable in this build). */
int perf_coll_open(perf_coll_net* c, const char* lib_path, int abi, int dev, uint64_t comm_id,
                   int rank);
/* listen, all-gather the handles, connect, closeListen: NCCL's order. */
int perf_coll_connect(perf_coll_net* c, perf_group* g);
int perf_coll_register(perf_coll_net* c, void* send, size_t send_bytes, void* recv,
                       size_t recv_bytes);
/* Deregisters the buffers and closes the group (the listen comm and context stay);
 * closeColl's result. */
ncclResult_t perf_coll_close_group(perf_coll_net* c);
void perf_coll_close(perf_coll_net* c);

/* ---- one size: the calls, as NCCL's proxy would make them (perf_coll_run.c) ---- */

typedef struct {
  size_t off, bytes; /* a window of the global buffer (allreduce: of the buffer) */
} perf_window;

typedef struct {
  perf_coll_kind kind;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  int rank, nranks;
  size_t elt;          /* element size */
  size_t count;        /* elements of the whole buffer (allreduce) or of all parts */
  size_t per_rank;     /* elements of one rank's part (reducescatter, allgather) */
  size_t bytes;        /* count * elt: the size column */
  perf_window* win;    /* one per call of a collective */
  int nwin;
} perf_coll_plan;

/* The calls for `bytes` (rounded down to whole elements, and for reducescatter and
 * allgather to a multiple of nranks elements); chunk 0 means one call, never more than
 * max_call bytes each. */
int perf_coll_plan_make(perf_coll_plan* p, const perf_coll_opts* o, int rank, size_t bytes,
                        size_t max_call);
void perf_coll_plan_free(perf_coll_plan* p);
/* Runs `iters` collectives back to back; a call of collective i+1 on a window starts once
 * the same window of collective i is done, so no two calls in flight share bytes. */
int perf_coll_stream(perf_coll_net* c, perf_group* g, const perf_coll_opts* o,
                     const perf_coll_plan* p, uint8_t* send, uint8_t* recv, int iters);

/* ---- results (perf_coll_check.c) ---- */

/* Error of this rank's share of the result against the fp64 reference. */
void perf_coll_error(const perf_coll_opts* o, const perf_coll_plan* p, const uint8_t* recv,
                     perf_err* e);
/* Elements whose bits differ between ranks (allreduce, allgather; -1 for reducescatter,
 * where every part has one holder). Collective; the count is valid on rank 0. */
int perf_coll_diverged(perf_group* g, const perf_coll_plan* p, const uint8_t* recv,
                       int64_t* diverged);

/* ---- the wire column, measured by the plugin (perf_coll_wire.c) ---- */

#define PERF_WIRE_PATH_MAX 512

typedef struct {
  char path[PERF_WIRE_PATH_MAX]; /* this rank's AGOQ_STATS_FILE, the tool's */
  long offset;    /* bytes of it already read */
  /* The user's AGOQ_STATS=1: where the lines are copied (user_path, "" = stderr). */
  bool forward;
  char user_path[4096];
  int user_fd; /* opened at the first line, -1 until then */
  /* The plugin's configuration, from its statistics lines (after the first cycle). */
  char format[16];
  unsigned block;
  uint64_t min_bytes, pipeline_chunk;
  /* The registered buffers, registered again with each new group. */
  void* send;
  void* recv;
  size_t send_bytes, recv_bytes;
} perf_coll_wire;

/* Before the ranks exist: the statistics files of every rank of this process group
 * (nfiles: all ranks in fork mode, 1 with --rank), the user's AGOQ_STATS settings read,
 * and SIGINT/SIGTERM/SIGHUP/SIGPIPE handlers that remove the files. -1 printed. */
int perf_coll_stats_prepare(int nfiles);
/* Fork mode, rank 0, right after the fork: the ranks the handler stops before it removes
 * their files. */
void perf_coll_stats_children(const perf_group* g);
/* Every exit path, after the group is closed: removes the files (rank 0 of a fork run:
 * all; any other process: its own) and restores the signal handlers. */
void perf_coll_stats_cleanup(void);
/* Before the plugin is loaded: this rank's prepared file as AGOQ_STATS_FILE, AGOQ_STATS=1. */
int perf_coll_wire_begin(perf_coll_wire* w, int rank);
/* Copies the lines not yet read on to the user's destination, removes this rank's file. */
void perf_coll_wire_end(perf_coll_wire* w);
/* What the plugin counted for one size, summed over every rank's both paths. */
typedef struct {
  double ratio;     /* wire bytes over raw bytes */
  double codec_ms;  /* codec work (quantize, decode, accumulate, exact reductions) */
  double crc_ms;    /* of codec_ms: payload CRC32C computed and checked */
} perf_coll_wire_figures;

/* Collective, after a size's calls: closes the group (the plugin writes its figures),
 * reads them, connects and registers a new group. */
int perf_coll_wire_cycle(perf_coll_net* c, perf_group* g, perf_coll_wire* w, int timeout_ms,
                         perf_coll_wire_figures* out);

/* ---- output (perf_coll_report.c) ---- */

typedef struct {
  size_t bytes, count;
  double time_us; /* per collective: the slowest rank's average */
  double wire_ratio;
  double codec_ms, crc_ms; /* the plugin's, all ranks (perf_coll_wire_figures) */
  double cpu_s; /* CPU seconds of all ranks' processes over the timed collectives; < 0 unknown */
  perf_err err;
  int64_t diverged;
} perf_coll_result;

/* The header comes with the first line: the plugin's configuration is known by then. */
void perf_coll_report_line(const perf_coll_opts* o, const perf_coll_net* c,
                           const perf_coll_wire* w, const perf_coll_result* r);
double perf_coll_busbw_factor(perf_coll_kind kind, int nranks);

#endif
