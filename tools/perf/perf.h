/*
 * agoq-perf: benchmarks that drive the built plugin through its own exported tables, the
 * way NCCL's proxy does. p2p drives the net table between two ranks; allreduce,
 * reducescatter and allgather drive the CollNet table between N ranks (perf_coll.h). They
 * share the size parsing and the bootstrap (perf_boot.c);
 * `codec` (perf_codec.c) measures the CPU codec alone, with its own options.
 */
#ifndef AGOQ_PERF_H
#define AGOQ_PERF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agoq_loader.h"

#define PERF_HANDLE_SIZE 128

/* ---- options (perf_opts.c) ---- */

typedef struct {
  size_t min_bytes, max_bytes; /* -b, -e */
  double factor;               /* -f: multiply the size by this each step */
  size_t step_bytes;           /* -i: or add this (0 = use factor) */
  int iters, warmup;           /* -n, -w (nccl-tests' letters) */
  size_t target_bytes;         /* --target-bytes: timed bytes per size at least (0 = -n only) */
  int inflight;                /* --inflight: requests kept posted per rank */
  int dev;                     /* --dev: plugin device */
  bool json;                   /* --json: one JSON object per line and size */
  bool check;                  /* -c N (N > 0): verify every received message */
  double max_rel_l2;           /* --max-rel-l2: typed runs fail above it, < 0 = no limit */
  const char* lib;             /* --lib */
  int rank;                    /* --rank 0|1, -1 = fork a local peer */
  const char* addr;            /* --addr HOST:PORT (with --rank) */
  int boot_timeout_s;          /* --boot-timeout: how long ranks wait for each other */
  /* Typed p2p (perf_p2p_typed.h). */
  int dtype;                   /* -d/--dtype: ncclDataType_t; -1 = untyped bytes */
  const char* format;          /* --format: AGOQ_P2P_FORMAT for the run */
  bool no_oracle;              /* --oracle none: NCCL without a profiler */
  bool coll_traffic;           /* --traffic coll: a collective's ring traffic */
  size_t chunk;                /* --chunk: each transfer goes as isends of this size (0: one) */
  bool pingpong;               /* --pingpong: rank 1 echoes each message; half a round trip */
  bool device;                 /* --device: NCCL's buffers in (emulated) device memory */
  int flow;                    /* --flow: perf_p2p_flow, what receives the sender's profiler saw */
} perf_opts;

/* --flow: before each send, the sender's emulated NCCL also starts a Recv P2p task (as an
 * irecv in the same group would), for AGOQ_P2P_SCOPE=pipeline: of the same datatype and
 * count from the same peer (twoway), or one that differs in one of them. */
typedef enum {
  PERF_FLOW_ONEWAY = 0,
  PERF_FLOW_TWOWAY,
  PERF_FLOW_OTHER_COUNT,
  PERF_FLOW_OTHER_DTYPE,
  PERF_FLOW_OTHER_PEER,
  PERF_FLOW_COUNT
} perf_p2p_flow;

/* Parses argv[1..] (argv[0] is the subcommand). 0 ok, 1 help printed, -1 error printed. */
int perf_opts_parse(int argc, char** argv, const char* cmd, perf_opts* o);
/* "1M" -> 1048576; K/M/G/T (powers of 1024), optional trailing B. -1 on a bad value. */
int perf_parse_size(const char* s, size_t* out);
/* Decimal integer in [min, max]; -1 otherwise. */
int perf_parse_int(const char* s, long min, long max, int* out);
/* The argv walk of every subcommand: "--name=value" and "-Xvalue" split as getopt does. */
typedef struct {
  int argc;
  char** argv;
  int i;               /* index of the current argument */
  const char* name;    /* the option: argv[i], or its name part */
  const char* inline_val; /* the "=value" / "-Xvalue" part, NULL when none */
  char key[40];
} perf_argv;
/* Advances to the next argument; false at the end. */
bool perf_argv_next(perf_argv* p);
/* The current option's value (inline or the next argument); NULL when there is none. */
const char* perf_argv_value(perf_argv* p);
/* -c/--check [N], nccl-tests' check count: N, or 1 when no number follows. -1 on a bad N
 * (printed). */
int perf_argv_check(perf_argv* p, const char* cmd, int* out);
/* -t/--nthreads and -g/--ngpus: nccl-tests' threads per process and GPUs per thread;
 * only 1 here. 0 ok, -1 printed. */
int perf_argv_threads(perf_argv* p, const char* cmd, const char* v);
/* A value outside a flag's set of names: "agoq-perf CMD: OPT: "V" is not one of a, b, c"
 * (tools/common/agoq_args.h). The dtype and op sets are NCCL's (perf_dtype.h). */
void perf_not_one_of(const char* cmd, const char* opt, const char* v, const char* const* names, int n);
void perf_bad_dtype(const char* cmd, const char* opt, const char* v);
void perf_bad_op(const char* cmd, const char* opt, const char* v);
/* Timed messages of one size: -n, or more with --target-bytes so that small sizes move
 * enough bytes to be timed above the noise: max(-n, min(ceil(target / size), 1e6)). */
#define PERF_TARGET_ITERS_MAX 1000000
int perf_timed_iters(const perf_opts* o, size_t size);
/* Next size in the sweep, 0 when past max. */
size_t perf_next_size(const perf_opts* o, size_t size);
void perf_format_size(size_t bytes, char* buf, size_t cap);

/* ---- bootstrap between the two ranks (perf_boot.c) ---- */

/* A byte stream between rank 0 and rank 1: a socketpair to a forked child, or TCP. */
typedef struct {
  int fd;
  int rank;
  int child_pid; /* fork mode, rank 0: the peer process; 0 otherwise */
} perf_boot;

/* Fork mode: returns twice, as rank 0 in the parent and rank 1 in the child. */
int perf_boot_fork(perf_boot* b);
/* TCP mode: rank 1 listens on addr and accepts rank 0; rank 0 connects (retrying). */
int perf_boot_tcp(perf_boot* b, int rank, const char* addr, int timeout_s);
/* Fork mode, rank 0: waits for the child; its exit status (0 ok). */
int perf_boot_finish(perf_boot* b);
void perf_boot_close(perf_boot* b);

enum {
  PERF_MSG_CONFIG = 1,
  PERF_MSG_HANDLE,
  PERF_MSG_READY,
  PERF_MSG_DONE,
  PERF_MSG_ERROR,
  PERF_MSG_HELLO,  /* N ranks over TCP: a rank introduces itself to rank 0 */
  PERF_MSG_GATHER, /* a contribution to rank 0 */
  PERF_MSG_BCAST,  /* rank 0's answer to everyone */
  PERF_MSG_DATA,   /* point to point between rank 0 and one rank */
};
int perf_boot_send(perf_boot* b, uint32_t kind, const void* buf, uint32_t len);
/* Waits for a message of `kind` of exactly `len` bytes; an ERROR from the peer or any
 * other message is a failure. */
int perf_boot_recv(perf_boot* b, uint32_t kind, void* buf, uint32_t len, int timeout_ms);
/* Non-blocking: 1 if the other rank went away or reported an error (it has nothing else
 * to say while a connection is being set up), 0 otherwise. */
int perf_boot_peer_failed(perf_boot* b);

/* ---- bootstrap between N ranks (perf_boot.c) ----
 * A star around rank 0; every call below is collective (all ranks call it in the same
 * order) except send_to/recv_from, which pair rank 0 with one rank. */
typedef struct {
  int rank, nranks;
  perf_boot up;     /* ranks > 0: the link to rank 0 */
  perf_boot* links; /* rank 0: links[k] to rank k (k >= 1); child_pid set in fork mode */
} perf_group;

/* Fork mode: rank 0 forks ranks 1..nranks-1; returns once in every process. */
int perf_group_fork(perf_group* g, int nranks);
/* TCP mode: rank 0 listens on addr and accepts the others, who dial it (retrying). */
int perf_group_tcp(perf_group* g, int rank, int nranks, const char* addr, int timeout_s);
/* Rank 0 receives every rank's len bytes into all (rank order, its own first). */
int perf_group_gather(perf_group* g, const void* mine, void* all, uint32_t len, int timeout_ms);
/* Rank 0's buf to every rank. */
int perf_group_bcast(perf_group* g, void* buf, uint32_t len, int timeout_ms);
int perf_group_allgather(perf_group* g, const void* mine, void* all, uint32_t len,
                         int timeout_ms);
int perf_group_barrier(perf_group* g, int timeout_ms);
/* Rank 0 <-> rank peer (rank > 0 ignores peer: its only link is to rank 0). */
int perf_group_send_to(perf_group* g, int peer, const void* buf, uint32_t len);
int perf_group_recv_from(perf_group* g, int peer, void* buf, uint32_t len, int timeout_ms);
/* Non-blocking: non-zero if a linked rank went away or reported an error. */
int perf_group_peer_failed(perf_group* g);
/* Tells the linked ranks this one failed (best effort). */
void perf_group_abort(perf_group* g);
/* Fork mode, rank 0: closes the links and waits for every child; 0 when all exited 0. */
int perf_group_finish(perf_group* g);
/* Closes every link; in fork mode, rank 0 kills children still running. */
void perf_group_close(perf_group* g);

/* ---- plugin session (perf_net.c) ---- */

typedef struct {
  agoq_netlib* lib;
  agoq_net_view view;
  void* ctx;
  int dev;
  agoq_view_props props;
  void* listen_comm;
  void* send_comm;
  void* recv_comm;
} perf_net;

/* dlopen, newest net version, init (comm id shared by both ranks), properties of dev. */
int perf_net_open(perf_net* n, const char* lib_path, int dev, uint64_t comm_id);
/* The same with the logger and profiler callback to hand the plugin's init. */
int perf_net_open_ex(perf_net* n, const char* lib_path, int dev, uint64_t comm_id, ncclDebugLogger_t log,
                     ncclProfilerCallback_t prof);
/* Rank 1: listen and hand the handle to rank 0, then accept. Rank 0: connect. */
int perf_net_connect_pair(perf_net* n, perf_boot* b);
/* The same for a connection whose sending end is rank `sender` (its send_comm; the other
 * rank's recv_comm): perf_net_connect_pair is sender 0, ping-pong adds sender 1. */
int perf_net_connect_from(perf_net* n, perf_boot* b, int sender);
void perf_net_close(perf_net* n);

/* ---- output (perf_report.c) ---- */

typedef struct {
  const char* test;
  size_t bytes;
  int iters;
  int inflight;
  double time_us; /* per message */
  bool checked;
  bool typed;     /* p2p --dtype: rel_l2 and exact are the receiver's verdict */
  double rel_l2;
  bool exact;
} perf_result;

void perf_report_header(const perf_opts* o, const perf_net* n, const char* test);
void perf_report_line(const perf_opts* o, const perf_net* n, const perf_result* r);
/* Typed p2p: what the plugin's statistics say went on the wire (after it was closed). */
void perf_report_wire(const perf_opts* o);

/* ---- p2p payload pattern (perf_p2p.c), shared with ping-pong ---- */
void perf_p2p_fill(uint8_t* p, size_t size, uint64_t seed);
/* Offset of the first wrong byte's 8-byte word, SIZE_MAX when all match. */
size_t perf_p2p_verify(const uint8_t* p, size_t size, uint64_t seed);
uint64_t perf_p2p_seed(size_t size, int msg);

/* ---- ping-pong (perf_p2p_pingpong.c) ----
 * `count` round trips of `size` bytes over n's connections both ways (rank 0 sends and
 * receives the echo, rank 1 echoes), framed by READY and DONE like a p2p run. bufs[0] is
 * rank 0's send buffer and rank 1's receive-and-echo buffer; bufs[1] rank 0's receive
 * buffer; mh[k][0] their handles on send_comm, mh[k][1] on recv_comm. Rank 0: *elapsed_us
 * from READY to the last echo. */
typedef struct {
  uint8_t* buf[2];
  uint8_t* dev[2]; /* --device: their device twins, which the plugin gets (else NULL) */
  void* mh[2][2];
} perf_pp_bufs;
int perf_pp_bufs_alloc(perf_net* n, size_t bytes, bool device, perf_pp_bufs* b);
void perf_pp_bufs_free(perf_net* n, perf_pp_bufs* b);
int perf_pp_run(perf_net* n, perf_boot* boot, const perf_opts* o, perf_pp_bufs* b, size_t size,
                int count, int msg_base, double* elapsed_us);

/* ---- --device (perf_device.c): device twins of the host buffers, over the CUDA
 * emulation this build links (none: --device is refused) ---- */
/* A device buffer of `bytes` holding host's bytes; NULL (printed) on failure. */
void* perf_device_twin(const void* host, size_t bytes);
void perf_device_free(void* dev);
/* Synchronous copies host -> device and back; 0 ok, -1 printed. */
int perf_device_push(void* dev, const void* host, size_t bytes);
int perf_device_pull(void* host, const void* dev, size_t bytes);

/* ---- time ---- */
double perf_now_us(void);

/* ---- subcommands ---- */
int perf_p2p_main(int argc, char** argv);
int perf_codec_main(int argc, char** argv); /* perf_codec.c, built with kernels/agoq_codec */
int perf_allreduce_main(int argc, char** argv); /* perf_coll.c */
int perf_reducescatter_main(int argc, char** argv);
int perf_allgather_main(int argc, char** argv);

#endif
