/* An in-process transport for the CollNet simulation (agoq-collnet-sim): the plugin's own net
 * core, CollNet setup and engine run unchanged over it, many ranks in one process, with a
 * virtual clock instead of sockets. Ranks are told apart by the calling thread's
 * agoq_sim_rank, which the simulation sets before every call into the plugin for a rank.
 *
 * The clock model (enabled with agoq_sim_model; off, every message is there at once): per
 * rank one CPU per thread that handles messages (its own, and each CollNet I/O thread, told
 * apart by agoq_tp_cpu_lane), one NIC transmit and one receive side. A send posted at virtual
 * time t costs the sending thread's CPU o (it starts at max(t, cpu free)), then occupies its NIC for size/B from
 * max(then, tx free); the receiver's NIC takes it for size/B after the messages that started
 * before it (in the order their first bytes left, not the order they were posted), its last
 * byte in no earlier than alpha after it left; the receive completes o after that on the
 * receiver's CPU. A send completes when its last byte left the NIC.
 * agoq_sim_advance moves the clock to the next event when nothing can move at the present
 * one. Everything is guarded by one lock: setup runs one thread per rank. */
#ifndef AGOQ_SIM_TRANSPORT_H
#define AGOQ_SIM_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "transport/agoq_transport.h"

extern const agoq_transport agoq_sim_transport;
extern _Thread_local int agoq_sim_rank;

typedef struct {
  uint64_t msgs_sent, bytes_sent; /* data messages (model on) */
  uint64_t conns;                 /* connection ends this rank holds (send and receive) */
} agoq_sim_rank_stats;

/* Ranks the model tracks (before any connection); everything released (after the last
 * connection closed). */
int agoq_sim_init(int nranks);
void agoq_sim_fini(void);
/* alpha, o in seconds, bytes_per_s per NIC direction; on = false delivers at once. Resets
 * the clock, the NICs and the message counters. */
void agoq_sim_model(bool on, double alpha, double o, double bytes_per_s);
double agoq_sim_now(void);
/* A diagnostic: with bin_s > 0, every run of the model records how busy the NICs' transmit
 * and receive sides and the CPUs that handle messages are, summed over every rank, per bin of
 * bin_s seconds of virtual time; agoq_sim_timeline_print prints the last run's, as fractions
 * of the ranks (a CPU fraction above 1 is more than one thread busy). */
void agoq_sim_timeline(double bin_s);
void agoq_sim_timeline_print(FILE* f, int threads);
/* Counts everything that happened on any connection (posts, deliveries, completions seen):
 * a driver sweeps again at the same time while it changes. */
uint64_t agoq_sim_events(void);
/* Moves the clock to the next pending event and fills due[] (room for every rank) with the
 * ranks it concerns (a message's last byte in, a transfer complete); their count, or -1
 * when nothing is pending. */
int agoq_sim_advance(int* due);
const agoq_sim_rank_stats* agoq_sim_stats(int rank);
/* The link rate every rank's NIC reports (getProperties), which CollNet's listen puts in its
 * handle for the automatic schedule; 0 (the default): reported as a guess, not known. */
void agoq_sim_link(uint32_t mbps);

#endif
