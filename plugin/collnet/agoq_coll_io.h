/*
 * A CollNet group's I/O threads (AGOQ_COLLNET_IO_THREADS): the message work of its
 * connections spread over a few threads, by peer.
 *
 * Why: every message costs a rank CPU time o in the net core and the transport (a system call
 * on TCP, a post and a poll on verbs), whatever its size. On one engine thread a chunk on a
 * 16x8 grid pays 44 messages each way, 132 us at 1.5 us, which binds 100 Gbit/s at 128 ranks
 * and above (docs/design-collnet.md). With k threads the busiest one pays ceil(peers/k) peers'
 * messages, and the engine keeps the codec and the sums.
 *
 * Each thread owns a fixed set of the group's peers, dealt round-robin in the order this rank
 * sends in (from the peer after it, around): it alone calls the net core on their connections, as the net core's contract
 * wants one thread per comm at a time. The engine hands it operations (a receive or a send of
 * one pipeline slot) through its inbox and takes back completions in posting order per
 * connection and kind; nothing here knows the slots, the schedule or the engine, which wakes
 * on the callback it registered.
 *
 * Until the engine spawns the threads (on its first request) and while they are held (tests,
 * the simulation), the engine runs each thread's pass itself (agoq_coll_io_run_parked), so the
 * same code moves the messages either way; agoq_tp_cpu_lane tells the transport which thread's
 * work a call is, for the simulation's clock.
 */
#ifndef AGOQ_COLL_IO_H
#define AGOQ_COLL_IO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

/* The most I/O threads a group may have (AGOQ_COLLNET_IO_THREADS' range). */
#define AGOQ_COLL_IO_MAX 16

/* An operation the engine hands over: a receive (of up to max bytes into data, size of it
 * posted) or a send (size bytes of data) on net comm `comm` with `tag`. */
typedef struct {
  void* comm;
  void* data;
  size_t size, max;
  int tag;
  int peer;
  uint8_t slot, kind;
  bool is_send;
} agoq_coll_io_op;

/* A completed operation: bytes received (sends: 0) and, for a receive whose message outgrew
 * its buffer, the buffer it went into (agoq_net_test_spill), now the engine's. */
typedef struct {
  int peer;
  int size;
  uint8_t* spill;
  uint8_t slot, kind;
} agoq_coll_io_done;

typedef struct agoq_coll_io agoq_coll_io;

/* k threads' state for the group's peers (ascending ranks, npeers of them), at most `depth`
 * operations per peer outstanding (handed over and not yet taken back). Failures are recorded
 * in *error (first one wins, as agoq_coll_fail) with a WARN naming rank and peer; wake(arg) is
 * called after completions were added or a failure recorded. No thread starts here. */
ncclResult_t agoq_coll_io_create(int k, int rank, const int* peers, int npeers, int depth, atomic_int* error,
                                 void (*wake)(void*), void* wake_arg, agoq_coll_io** out);
/* Starts the threads (once; later calls do nothing). pinned: their CPU set, or NULL. */
ncclResult_t agoq_coll_io_spawn(agoq_coll_io* io, const void* pinned_cpus);
/* Hands op over to its peer's thread (never blocks on the network; *queued false only when
 * the inbox is full, a broken invariant the caller reports). */
bool agoq_coll_io_post(agoq_coll_io* io, const agoq_coll_io_op* op);
/* Takes one completion back, if any, from any thread. */
bool agoq_coll_io_take(agoq_coll_io* io, agoq_coll_io_done* out);
/* Runs a pass of every thread that is not running (never spawned, or held) on the caller's
 * thread; returns whether any operation was posted or completed. */
bool agoq_coll_io_run_parked(agoq_coll_io* io);
/* Parks the threads (returns once none runs a pass) or lets them run again. */
void agoq_coll_io_hold(agoq_coll_io* io, bool hold);
/* After a failure: waits out every pass in progress and drops every operation; no net call is
 * made on the group's connections afterwards, so they can be closed. */
void agoq_coll_io_quiesce(agoq_coll_io* io);
/* Whether some thread has completions the engine has not taken (its sleep checks this after
 * announcing it sleeps: a completion added later wakes it). */
bool agoq_coll_io_pending(agoq_coll_io* io);
/* Whether every thread runs on its own (spawned, not held): else the engine must keep
 * running passes for the others (agoq_coll_io_run_parked). */
bool agoq_coll_io_all_running(agoq_coll_io* io);
/* Stops and joins the threads and quiesces (idempotent; the group's connections may then be
 * closed); passes run by agoq_coll_io_run_parked then do nothing. */
void agoq_coll_io_stop(agoq_coll_io* io);
/* agoq_coll_io_stop, then frees everything (NULL: nothing). */
void agoq_coll_io_destroy(agoq_coll_io* io);
#endif
