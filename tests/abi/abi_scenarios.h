/*
 * The scenario functions (each plays w->role's end), and checks they share.
 */
#ifndef AGOQ_ABI_SCENARIOS_H
#define AGOQ_ABI_SCENARIOS_H

#include "abi_harness.h"

/* abi_scen_data.c */
int abi_sc_props(abi_worker* w);
int abi_sc_sizes(abi_worker* w);
int abi_sc_inflight(abi_worker* w);
int abi_sc_grouped(abi_worker* w);
int abi_sc_order(abi_worker* w);
int abi_sc_many(abi_worker* w);
int abi_sc_reload(abi_worker* w);

/* abi_scen_fault.c */
int abi_sc_truncation(abi_worker* w);
int abi_sc_rogue(abi_worker* w);
int abi_sc_kill_sender(abi_worker* w);
int abi_sc_kill_receiver(abi_worker* w);
int abi_sc_close_inflight(abi_worker* w);
int abi_sc_gpu_hazard_cuda_free(abi_worker* w);

/* A received message: test() reported `expect` bytes, they hold the pattern of `seed`, the
 * rest of the `posted` area still holds the canary the receiver wrote, the guards around
 * the buffer are intact. 0 ok, -1 failure recorded. */
int abi_check_received(abi_worker* w, const abi_buf* b, size_t posted, size_t expect,
                       int reported, uint64_t seed, const char* what);

#endif
