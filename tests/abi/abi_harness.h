/*
 * Conformance harness: dlopens the built plugin and drives every exported net version
 * the way NCCL's proxy does, with the two ends of each connection in two processes.
 *
 * The orchestrator (abi_main.c) never initialises the plugin: for each (version,
 * scenario) it fork+execs two workers that talk over a socketpair (handle exchange,
 * barriers) and report a failure reason on a pipe. A scenario is one function both
 * workers run; w->role says which end it plays: 0 listens/receives, 1 connects/sends.
 */
#ifndef AGOQ_ABI_HARNESS_H
#define AGOQ_ABI_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agoq_loader.h"

#define ABI_HANDLE_SIZE 128
#define ABI_MAX_REQUESTS 32 /* NCCL_NET_MAX_REQUESTS */
#define ABI_MAX_RECVS 8
/* A survivor must see its pending requests fail within this long after the peer died. */
#define ABI_PEER_DEATH_LIMIT_MS 10000

struct abi_worker;
typedef int (*abi_role_fn)(struct abi_worker* w);

enum {
  ABI_SC_SINGLE = 1u << 0,      /* one process: role 1 is not started */
  ABI_SC_ROLE0_DIES = 1u << 1,  /* role 0 ends itself with SIGKILL on purpose */
  ABI_SC_ROLE1_DIES = 1u << 2,
};

typedef struct {
  const char* name;
  const char* summary;
  abi_role_fn run;
  int timeout_s; /* per version, both workers together */
  unsigned flags;
  const char* env; /* extra "NAME=value" for both workers, or NULL */
} abi_scenario;

typedef struct abi_worker {
  int role;
  int ctrl_fd;   /* stream socket to the other worker */
  int result_fd; /* pipe to the orchestrator: the failure reason */
  const abi_scenario* sc;
  const char* lib_path;
  agoq_netlib* lib;
  agoq_net_view view;
  void* ctx;
  uint64_t comm_id;
  int dev;
  int ndev;
  bool newest; /* the newest exported version: the expensive cases run only here */
  bool failed;
  char why[1024];
} abi_worker;

/* ---- scenario table (abi_scenarios.c) ---- */
extern const abi_scenario abi_scenarios[];
extern const size_t abi_scenario_count;

/* ---- processes and control channel (abi_proc.c) ---- */
typedef struct {
  bool passed;
  char reason[2048];
} abi_outcome;

/* Runs one scenario for one version in fresh worker processes, within sc->timeout_s. */
void abi_run_scenario(const char* self_exe, const char* lib_path, int version, bool newest,
                      const abi_scenario* sc, abi_outcome* out);
/* Kills every worker still alive (watchdog). Async-signal-safe. */
void abi_kill_all_workers(void);

/* Messages between the two workers: a 4-byte kind, a 4-byte length, the payload. */
enum {
  ABI_MSG_HANDLE = 1,
  ABI_MSG_READY,
  ABI_MSG_DONE,
  ABI_MSG_DATA,
};
int abi_ctrl_send(abi_worker* w, uint32_t kind, const void* buf, uint32_t len);
/* Waits up to timeout_ms for a message of `kind` holding exactly `len` bytes. */
int abi_ctrl_recv(abi_worker* w, uint32_t kind, void* buf, uint32_t len, int timeout_ms);
/* Non-blocking: 1 if the peer closed its end (it exited or was killed), 0 if not. */
int abi_ctrl_peer_gone(abi_worker* w);
/* Non-blocking: 1 if a message (or EOF) is waiting, 0 if not. */
int abi_ctrl_readable(abi_worker* w);
/* Both workers send `kind` and wait for the other's: a barrier. */
int abi_ctrl_barrier(abi_worker* w, uint32_t kind, int timeout_ms);

/* ---- failure recording (abi_checks.c) ---- */
void abi_fail(abi_worker* w, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define ABI_REQUIRE(w, cond, ...)                        \
  do {                                                   \
    if (!(cond)) {                                       \
      abi_fail((w), __FILE__, __LINE__, __VA_ARGS__);    \
      goto fail;                                         \
    }                                                    \
  } while (0)

/* A plugin call that must succeed. */
#define ABI_NCCL_OK(w, call)                                                               \
  do {                                                                                     \
    ncclResult_t abi_res_ = (call);                                                        \
    if (abi_res_ != ncclSuccess) {                                                         \
      abi_fail((w), __FILE__, __LINE__, "%s returned %s", #call, abi_result_str(abi_res_)); \
      goto fail;                                                                           \
    }                                                                                      \
  } while (0)

const char* abi_result_str(ncclResult_t r);

/* ---- time ---- */
int64_t abi_now_ms(void);
void abi_sleep_us(unsigned us);

/* ---- payload patterns and guards (abi_checks.c) ---- */
/* Position-dependent pattern: word i of a message is a hash of (seed, i), so a byte in the
 * wrong place, a message in the wrong buffer or a stale buffer shows up. */
void abi_pattern_fill(void* buf, size_t size, uint64_t seed);
/* SIZE_MAX if buf holds the pattern, else the offset of the first wrong byte. */
size_t abi_pattern_check(const void* buf, size_t size, uint64_t seed);

#define ABI_GUARD_BYTE 0xA7
#define ABI_GUARD_SIZE 4096
/* A buffer with ABI_GUARD_SIZE guard bytes on each side of `size` usable bytes. */
typedef struct {
  uint8_t* base;
  uint8_t* data;
  size_t size;
} abi_buf;
int abi_buf_alloc(abi_buf* b, size_t size);
void abi_buf_free(abi_buf* b);
/* 0 if both guards are intact, else -1 with the first overwritten byte described. */
int abi_buf_guard_check(const abi_buf* b, char* what, size_t cap);

/* ---- device buffers (abi_device.c; --device) ---- */
/* The workers run with NCCL's buffers in (emulated) device memory. */
bool abi_device_mode(void);
/* The device twin of b (same layout, guards included). */
int abi_device_alloc(abi_buf* b);
void abi_device_free(abi_buf* b);
/* The twin's address for a host address inside an abi_buf; others unchanged. */
void* abi_device_ptr(void* host);
/* Host bytes [host, host + n) and the twin's guards to the device; 0 ok. */
int abi_device_push(const void* host, size_t n);
/* A receive's buffers, copied back (with the guards) when test() says it is done. */
int abi_device_track_recv(void* req, int n, void** host, const size_t* sizes);
int abi_device_recv_done(void* req);
/* The largest message the harness sends from device memory (256 MiB: the staging bounds
 * none); SIZE_MAX in host mode. */
size_t abi_device_max_message(void);
/* AGOQ_GPU_STAGING, which still bounds a device message over verbs without DMA-BUF and a
 * CollNet device call over verbs; SIZE_MAX in host mode. */
size_t abi_device_max_coll(void);
/* The dma-buf of the device allocation holding device pointer p, as NCCL gets it from the
 * driver (cuMemGetHandleForAddressRange over the allocation's whole pages): *fd (the
 * caller closes it) and *offset, p's byte in it. 0 ok. */
int abi_device_dmabuf(const void* p, int* fd, uint64_t* offset);
/* cudaDeviceFlushGPUDirectRDMAWrites calls so far in this process (the emulation counts). */
long abi_device_rdma_flushes(void);

/* One isend / irecv attempt as NCCL makes it (*req NULL: try again), host pointers
 * translated to device ones in device mode. */
ncclResult_t abi_net_isend(abi_worker* w, void* comm, void* data, size_t size, int tag, void* mh, void** req);
ncclResult_t abi_net_irecv(abi_worker* w, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                           void** req);

/* ---- driving the plugin like NCCL's proxy (abi_checks.c) ---- */
int abi_worker_setup(abi_worker* w, const char* lib_path, int version);
void abi_worker_teardown(abi_worker* w);

/* listen on w->dev, send the handle to the peer, return the listen comm. */
int abi_listen_publish(abi_worker* w, void** listen_comm);
/* Receive the peer's handle into `handle` (ABI_HANDLE_SIZE bytes). */
int abi_handle_receive(abi_worker* w, void* handle);
/* Polls connect (same handle buffer each call, as NCCL does) until a comm or a deadline. */
int abi_connect_poll(abi_worker* w, void* ctx, void* handle, void** send_comm, int timeout_ms);
int abi_accept_poll(abi_worker* w, void* listen_comm, void** recv_comm, int timeout_ms);
/* listen+publish+accept on role 0, receive+connect on role 1: one connection 1 -> 0. */
int abi_pair_connect(abi_worker* w, void** comm);
/* Both directions: each worker gets a send comm and a recv comm. */
int abi_pair_connect_both(abi_worker* w, void** send_comm, void** recv_comm);

/* isend/irecv retried while they return a NULL request, as NCCL does. */
int abi_isend(abi_worker* w, void* comm, void* data, size_t size, int tag, void* mh, void** req,
              int timeout_ms);
int abi_irecv(abi_worker* w, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
              void** req, int timeout_ms);

/* Polls test() until done: 0 done (sizes filled), -1 on a failure already recorded
 * (error return or timeout). */
int abi_wait(abi_worker* w, void* req, int* sizes, int timeout_ms);
/* Polls test() once. 1 done, 0 not yet, <0 the plugin's error as -(ncclResult_t). */
int abi_test_once(abi_worker* w, void* req, int* sizes);

/* regMr of host memory; 0 ok, -1 failure recorded. */
int abi_reg(abi_worker* w, void* comm, void* data, size_t size, void** mhandle);
/* deregMr; records a failure but keeps going (cleanup paths). */
void abi_dereg(abi_worker* w, void* comm, void* mhandle);
/* closeSend/closeRecv/closeListen of a non-NULL comm; records a failure, keeps going. */
void abi_close_send(abi_worker* w, void** comm);
void abi_close_recv(abi_worker* w, void** comm);
void abi_close_listen(abi_worker* w, void** comm);

/* A request list polled the way the proxy does: the oldest not-done request of each list. */
typedef struct {
  void* req[ABI_MAX_REQUESTS];
  int sizes[ABI_MAX_REQUESTS][ABI_MAX_RECVS];
  int count;
  int done; /* requests [0, done) completed */
} abi_reqlist;
/* Progresses the lists (any may be NULL) until all complete. 0 ok, -1 failure recorded. */
int abi_wait_lists(abi_worker* w, abi_reqlist* a, abi_reqlist* b, int timeout_ms);

#endif
