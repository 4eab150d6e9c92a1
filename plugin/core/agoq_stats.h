/*
 * Statistics users can see (AGOQ_STATS=1): a process-wide registry of counters, one entry
 * per CollNet group and per net context direction (typed p2p send / receive), printed as
 * `agoq-stats key=value ...` lines (docs/usage.md, "Statistics") to stderr or to
 * AGOQ_STATS_FILE:
 *  - when the communicator closes (event=close),
 *  - every AGOQ_STATS_INTERVAL_S seconds while it is open (event=interval), from one
 *    sleeping thread,
 *  - at process exit, for those still open (event=exit).
 * Independent of NCCL_DEBUG: the lines are written with write(2), not through the logger.
 *
 * Counters are relaxed atomics, so the data path pays one uncontended atomic add per
 * message or chunk and any thread (interval, exit) can read them without a lock. Entries
 * are never freed once registered: the registry is a push-only list that the exit hook
 * walks without locks, whatever NCCL's threads are doing then.
 * Knows nothing of NCCL beyond its result codes.
 */
#ifndef AGOQ_STATS_H
#define AGOQ_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { AGOQ_STATS_COLLNET = 0, AGOQ_STATS_P2P_SEND, AGOQ_STATS_P2P_RECV } agoq_stats_kind;

/* Paths of an entry. */
enum { AGOQ_STATS_EXACT = 0, AGOQ_STATS_QUANT = 1 };

/* Why a call or message went exact; one counter each on the exact line. */
typedef enum {
  AGOQ_EXACT_TYPE = 0,     /* datatype not fp32/bf16/fp16 (AllGather: bytes, no type) */
  AGOQ_EXACT_OP,           /* reduction op not Sum */
  AGOQ_EXACT_SMALL,        /* below AGOQ_MIN_BYTES */
  AGOQ_EXACT_LL,           /* LL / LL128 protocol (lines carry flags) */
  AGOQ_EXACT_UNKNOWN,      /* no datatype known: no oracle answer, or no profiler handle */
  AGOQ_EXACT_FORMAT_NONE,  /* AGOQ_FORMAT / AGOQ_P2P_FORMAT is none */
  AGOQ_EXACT_COLLECTIVE,   /* p2p path: a collective's ring/tree transfer, or not a send */
  AGOQ_EXACT_NOGAIN,       /* a frame would not be smaller (escaped blocks), or no staging */
  AGOQ_EXACT_ONE_WAY,      /* p2p send with no receive of its shape from its peer (AGOQ_P2P_SCOPE=pipeline) */
  AGOQ_EXACT_UNALIGNED,    /* p2p send from device memory not aligned to its element size (the CUDA codec reads whole elements) */
  AGOQ_EXACT_REASONS
} agoq_exact_reason;

typedef struct {
  atomic_uint_least64_t calls;      /* calls (CollNet) or messages (p2p) */
  atomic_uint_least64_t bytes_in;   /* payload bytes they covered, in the input type */
  atomic_uint_least64_t wire_raw;   /* bytes the messages would have been in the input type */
  atomic_uint_least64_t wire_bytes; /* bytes they were on the wire (frames or raw) */
  atomic_uint_least64_t codec_ns;   /* quantize, decode, accumulate, exact reductions */
  atomic_uint_least64_t crc_ns;     /* of codec_ns: payload CRC32C computed and checked */
  atomic_uint_least64_t wire_ns;    /* CollNet: engine waiting on the network; p2p: post to completion */
  /* NCCL's buffers in device memory (the GPU data path): how many of the calls or
   * messages, and the bytes the plugin moved across PCIe for them (copies and the codec's
   * reads and writes of pinned staging), GPU to host and host to GPU. */
  atomic_uint_least64_t device_calls;
  atomic_uint_least64_t pcie_d2h;
  atomic_uint_least64_t pcie_h2d;
  atomic_uint_least64_t gpu_ns; /* the CUDA codec's time on the GPU (timing events) */
} agoq_stats_path;

typedef struct agoq_stats_entry {
  agoq_stats_path path[2];
  atomic_uint_least64_t exact[AGOQ_EXACT_REASONS];
  /* Fixed at registration. */
  agoq_stats_kind kind;
  uint64_t id;            /* 1, 2, ... in registration order, per process */
  uintptr_t comm;         /* the communicator's address, as NCCL knows it */
  int rank, nranks;       /* CollNet: the group's; p2p: -1 */
  int pid;                /* the process that registered it (a fork child skips it) */
  char config[96];        /* "format=int8 block=128 min_bytes=65536" */
  bool registered;        /* false: a private entry (statistics off), freed at close */
  atomic_int closed;
  struct agoq_stats_entry* next;
} agoq_stats_entry;

static inline void agoq_stats_add(atomic_uint_least64_t* c, uint64_t v) {
  atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}
static inline uint64_t agoq_stats_get(const atomic_uint_least64_t* c) {
  return atomic_load_explicit((atomic_uint_least64_t*)c, memory_order_relaxed);
}
/* One call or message of `bytes` input bytes, sent as `wire` bytes on `path`. */
static inline void agoq_stats_count(agoq_stats_entry* e, int path, uint64_t bytes_in) {
  if (e == NULL) return;
  agoq_stats_add(&e->path[path].calls, 1);
  agoq_stats_add(&e->path[path].bytes_in, bytes_in);
}
static inline void agoq_stats_wire(agoq_stats_entry* e, int path, uint64_t raw, uint64_t wire) {
  if (e == NULL) return;
  agoq_stats_add(&e->path[path].wire_raw, raw);
  agoq_stats_add(&e->path[path].wire_bytes, wire);
}
/* One call or message on device buffers and the PCIe bytes the plugin moved for it. */
static inline void agoq_stats_device(agoq_stats_entry* e, int path, uint64_t d2h, uint64_t h2d) {
  if (e == NULL) return;
  agoq_stats_add(&e->path[path].device_calls, 1);
  agoq_stats_add(&e->path[path].pcie_d2h, d2h);
  agoq_stats_add(&e->path[path].pcie_h2d, h2d);
}
static inline void agoq_stats_exact(agoq_stats_entry* e, agoq_exact_reason why) {
  if (e != NULL && (unsigned)why < AGOQ_EXACT_REASONS) agoq_stats_add(&e->exact[why], 1);
}

/* CLOCK_MONOTONIC in nanoseconds (wire times). */
int64_t agoq_stats_clock_ns(void);

/* True when AGOQ_STATS=1 (parameters loaded). */
bool agoq_stats_enabled(void);

/* A new entry for one communicator. With statistics on it joins the registry (the first
 * one opens the output and starts the interval thread). With them off: a private entry
 * the caller counts into and agoq_stats_close frees when `always` (CollNet keeps its
 * figures either way), else NULL (callers skip counting). NULL also on out of memory
 * (logged). `config` ("format=int8 block=128 ...") may be NULL. */
agoq_stats_entry* agoq_stats_open(agoq_stats_kind kind, const void* comm, int rank, int nranks,
                                  const char* config, bool always);
/* The communicator is closing: prints its lines (event=close) once and keeps the counters
 * in the registry. A private entry: nothing. NULL is ignored. */
void agoq_stats_close(agoq_stats_entry* e);
/* The owner lets go: a private entry is freed, a registered one closed (if it was not). */
void agoq_stats_release(agoq_stats_entry* e);

/* ---- pure helpers (unit-tested) ------------------------------------------------------ */

/* Expands %h (host name), %p (pid) and %% in pattern into out. False when out is too
 * small or a '%' is followed by anything else (the message says which). */
bool agoq_stats_expand_path(const char* pattern, const char* host, int pid, char* out, size_t outlen,
                            char* err, size_t errlen);

/* Interval schedule on an injected clock: true when a report is due at now_ns, and then
 * *next_ns moves to the first deadline after now (missed ones are skipped, never
 * replayed). *next_ns == 0 starts the schedule: the first report is one interval later. */
bool agoq_stats_interval_due(int64_t now_ns, int64_t interval_ns, int64_t* next_ns);

/* Nanoseconds to sleep until *next_ns (0 when due). */
int64_t agoq_stats_interval_wait(int64_t now_ns, int64_t next_ns);

/* One line (with '\n') of entry path `path` into out; returns its length (0 if out is
 * too small). */
size_t agoq_stats_format(const agoq_stats_entry* e, int path, const char* event, const char* host, int pid,
                         char* out, size_t outlen);

/* Lines of every entry of this process, open ones only when `open_only`, to fd. */
void agoq_stats_print_all(int fd, const char* event, bool open_only);

/* The exit hook's work (the library destructor calls it): stops the interval thread, prints
 * the event=exit lines of every open entry (once), and frees the registry when every entry
 * is closed (dlclose after a clean teardown). Safe to call again after closing more. */
void agoq_stats_at_exit(void);

/* Tests: the output fd the registry writes to (-1: not opened yet). */
int agoq_stats_output_fd(void);

#endif
