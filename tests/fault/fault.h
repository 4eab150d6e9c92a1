/*
 * Fault-injection tests (ctest label `fault`): multi-process, over loopback (netlab ones in
 * network namespaces when run as root). The orchestrator never initializes the plugin: it
 * forks workers that each call the net/CollNet core directly (agoq_internal), talk to the
 * orchestrator over a socketpair (handles, phase reports, errors, all timestamped with
 * CLOCK_MONOTONIC, which every process shares), and injects the fault itself: SIGKILL,
 * a stalled reader, rogue TCP connections, a bit-flipping TCP proxy, a link set down.
 * Every wait is bounded; a worker that does not report in time is a hang, and counted.
 */
#ifndef AGOQ_FAULT_H
#define AGOQ_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "abi/agoq_nccl_common.h"

#define FAULT_COMM_ID 0x6661756c74000001ull
#define FAULT_HANDLE_SIZE 128
/* How much slower than a release build this build runs (3 under the sanitizers): scales
 * the watchdogs that tell a hang from a slow run, never a detection limit agoq promises. */
#ifndef FAULT_SLOWDOWN
#define FAULT_SLOWDOWN 1
#endif
/* A whole bit-flip run (reference or flipped) ends within this long, or it hung. */
#define FAULT_RUN_LIMIT_MS (40000 * FAULT_SLOWDOWN)
/* A survivor's pending call must return an error within this long after the fault. */
#define FAULT_DETECT_LIMIT_MS 10000

/* Messages worker <-> orchestrator: 4-byte kind, 4-byte length, payload. */
enum {
  FAULT_MSG_HANDLE = 1, /* 128-byte net (or CollNet) handle */
  FAULT_MSG_HANDLES,    /* all ranks' handles */
  FAULT_MSG_PHASE,      /* fault_event: a worker entered a phase */
  FAULT_MSG_ERROR,      /* fault_event: a call returned an error (res in value) */
  FAULT_MSG_DONE,       /* fault_event: the worker's job finished (value: a measurement) */
  FAULT_MSG_STOP,       /* orchestrator -> worker: finish and exit */
  FAULT_MSG_FAIL,       /* text: the worker's own check failed */
};
enum { FAULT_PHASE_CONNECT = 1, FAULT_PHASE_TRANSFER = 2 };

typedef struct {
  int64_t t_ms; /* CLOCK_MONOTONIC */
  int64_t value;
  int32_t phase;
  int32_t rank;
} fault_event;

typedef struct {
  pid_t pid;
  int fd; /* orchestrator's end */
  bool reaped;
  int status;
} fault_child;

typedef int (*fault_worker_fn)(int fd, void* arg);

int64_t fault_now_ms(void);
void fault_sleep_ms(int ms);
/* xorshift64*, seeded per case. */
uint64_t fault_rand(uint64_t* state);
/* splitmix64: a well-spread state for case i of a run (fault_mix(seed + i)). */
uint64_t fault_mix(uint64_t x);

/* fork; the child runs fn(fd, arg) and _exits with its return value. */
int fault_spawn(fault_child* c, fault_worker_fn fn, void* arg);
/* Waits up to timeout_ms for the child to exit; on timeout SIGKILLs it and returns -1. */
int fault_reap(fault_child* c, int timeout_ms);
void fault_kill(fault_child* c);

int fault_send(int fd, uint32_t kind, const void* buf, uint32_t len);
/* Next message within timeout_ms: its length (payload copied up to cap), -1 on timeout,
 * -2 on EOF (the other end exited). */
int fault_recv(int fd, uint32_t* kind, void* buf, uint32_t cap, int timeout_ms);
/* Waits for a message of `kind`, skipping others (stored in *skipped_err when they are
 * FAULT_MSG_ERROR/FAIL, so a survivor's error is not lost). */
int fault_recv_kind(int fd, uint32_t kind, void* buf, uint32_t cap, int timeout_ms);
int fault_event_send(int fd, uint32_t kind, int32_t phase, int64_t value);
/* Non-blocking: true when the orchestrator sent STOP (or closed its end). */
bool fault_stop_requested(int fd);
int fault_report_fail(int fd, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* VmRSS of a process in KiB (pid 0: self), -1 if unknown. */
long fault_rss_kb(pid_t pid);
long fault_fd_count(pid_t pid);

/* Net core helpers for workers. */
int fault_net_init(void** ctx, ncclProfilerCallback_t prof);
/* Polls connect/accept until a comm, an error (returns the ncclResult_t, > 0) or the deadline (-1). */
int fault_connect(void* ctx, void* handle, void** comm, int timeout_ms);
int fault_accept(void* listen, void** comm, int timeout_ms, int stop_fd);
/* CollNet rank start-up: coll init, listen, send this rank's handle (FAULT_MSG_HANDLE),
 * receive all nranks handles (FAULT_MSG_HANDLES) into all (nranks * FAULT_HANDLE_SIZE
 * bytes) and point hp[i] at handle i. 0, or fault_report_fail's result (*ctx and *lc
 * set as far as they were made). */
int fault_coll_join(int fd, int nranks, void** ctx, void** lc, uint8_t* all, void** hp);

/* The TCP data path a scenario's payloads take (--path). The transport sends a message of
 * at most AGOQ_SOCKET_INLINE bytes inline on the control socket, anything larger in pieces
 * on the data sockets; a scenario pins one path so that what it injects hits the code it
 * means to test whatever the default of AGOQ_SOCKET_INLINE is. */
typedef enum {
  FAULT_PATH_PIECES = 0, /* AGOQ_SOCKET_INLINE=0: every payload on the data sockets */
  FAULT_PATH_INLINE,     /* AGOQ_SOCKET_INLINE=1G: every payload inline on the control socket */
} fault_path;
/* Sets AGOQ_SOCKET_INLINE in this process; every worker forked afterwards inherits it. */
void fault_path_set(fault_path path);
const char* fault_path_name(fault_path path);

/* Scenarios: return 0 on pass, 1 on failure, 77 on skip. Print a summary line that names
 * the path. */
int fault_sc_kill_p2p(int seeds, uint64_t seed0, fault_path path);
int fault_sc_kill_coll(int seeds, uint64_t seed0, fault_path path);
int fault_sc_stall(fault_path path);
int fault_sc_flood(int nrogue);
int fault_sc_bitflip(int seeds, uint64_t seed0, fault_path path);
/* The same proxy between CollNet peers. */
int fault_sc_bitflip_coll(int seeds, uint64_t seed0, fault_path path);

#endif
