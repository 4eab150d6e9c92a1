/*
 * The scenario table: name, what it proves, its function, its time limit per version.
 */
#include "abi_harness.h"
#include "abi_scenarios.h"

const abi_scenario abi_scenarios[] = {
    {"props", "init (twice), devices, getProperties sanity, finalize(NULL) on v11+",
     abi_sc_props, 20, ABI_SC_SINGLE, NULL},
    {"sizes", "0 B, 1 B, 4097 B, 1000003 B, 1 MiB, 64 MiB (1 GiB on the newest version), posted exact and larger",
     abi_sc_sizes, 150, 0, NULL},
    {"inflight", "32 receives and 32 sends posted at once, each way", abi_sc_inflight, 60, 0,
     NULL},
    {"grouped", "grouped receives (n = maxRecvs, up to 8) matched by tag, shuffled sends, 2 groups",
     abi_sc_grouped, 30, 0, NULL},
    {"order", "n = 1 receives match in posting order whatever the tag; 400-message window of 8",
     abi_sc_order, 60, 0, NULL},
    {"many", "16 connects to one handle, 16 accepts on one listen comm, a transfer on each",
     abi_sc_many, 30, 0, NULL},
    {"reload", "3 cycles of connect, transfer, finalize, dlclose, dlopen, init: the unload NCCL does",
     abi_sc_reload, 30, 0, NULL},
    {"truncation", "a send larger than its receive fails the receive (ncclInvalidUsage), no overflow",
     abi_sc_truncation, 60, 0, NULL},
    {"rogue", "garbage, bad/half hellos, silent and foreign connections on the listen port",
     abi_sc_rogue, 40, 0, "AGOQ_HANDSHAKE_TIMEOUT_MS=500"},
    {"kill_sender", "sender SIGKILLed mid-transfer: the receiver's requests fail within 10 s",
     abi_sc_kill_sender, 45, ABI_SC_ROLE1_DIES, NULL},
    {"kill_receiver", "receiver SIGKILLed mid-transfer: the sender's requests fail within 10 s",
     abi_sc_kill_receiver, 45, ABI_SC_ROLE0_DIES, NULL},
    {"close_inflight", "close comms with 32 requests in flight each way, then connect again",
     abi_sc_close_inflight, 60, 0, NULL},
    {"gpu_hazard_cuda_free",
     "a receive pending, NCCL's kernel waiting for its bytes, cudaFree on another thread (needs --device)",
     abi_sc_gpu_hazard_cuda_free, 60, 0, "CUDAEMU_HANG_S=20"},
};

const size_t abi_scenario_count = sizeof(abi_scenarios) / sizeof(abi_scenarios[0]);
