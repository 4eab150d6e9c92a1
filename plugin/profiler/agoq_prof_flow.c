/* The receives a communicator carried (agoq_prof.h, agoq_prof_flows): recorded on the user
 * thread when NCCL starts a Recv P2p event, looked up on proxy threads when a send's net
 * event asks whether its flow is two-way (AGOQ_P2P_SCOPE=pipeline). No locks: each slot is
 * one atomic word, so a reader sees a whole key or another whole key, never a mix. */
#include "profiler/agoq_prof.h"

bool agoq_prof_flow_key(int peer, int dtype, uint64_t bytes, uint64_t* key) {
  if (peer < 0 || peer >= (1 << AGOQ_PROF_FLOW_PEER_BITS) || dtype < 0 ||
      dtype >= (1 << AGOQ_PROF_FLOW_DTYPE_BITS) || bytes == 0 ||
      bytes >= ((uint64_t)1 << AGOQ_PROF_FLOW_BYTES_BITS))
    return false;
  *key = bytes << (AGOQ_PROF_FLOW_PEER_BITS + AGOQ_PROF_FLOW_DTYPE_BITS) |
         (uint64_t)dtype << AGOQ_PROF_FLOW_PEER_BITS | (uint64_t)peer;
  return true;
}

bool agoq_prof_flow_seen(const agoq_prof_flows* f, uint64_t key) {
  if (key == 0) return false; /* an empty slot is not a flow */
  for (unsigned i = 0; i < AGOQ_PROF_FLOW_SLOTS; i++)
    if (atomic_load_explicit(&f->keys[i], memory_order_acquire) == key) return true;
  return false;
}

void agoq_prof_flow_record(agoq_prof_flows* f, uint64_t key) {
  /* A pipeline receives the same shape every microbatch: writing it again would only push
   * out another live flow. Two threads racing here may both write it; that costs a slot,
   * never a wrong answer. */
  if (key == 0 || agoq_prof_flow_seen(f, key)) return;
  uint32_t i = atomic_fetch_add_explicit(&f->cursor, 1, memory_order_relaxed) % AGOQ_PROF_FLOW_SLOTS;
  atomic_store_explicit(&f->keys[i], key, memory_order_release);
}
