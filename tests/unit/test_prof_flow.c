/*
 * AGOQ_P2P_SCOPE=pipeline's evidence: the receives a communicator carried (agoq_prof_flows,
 * plugin/profiler/agoq_prof_flow.c) and the two_way answer the net side gets. The key must
 * pack (peer, dtype, task bytes) exactly (a collision would call a one-way send two-way and
 * make it lossy), the table must forget old flows in ring order, and the answer must come
 * from the lookup at the send's net event, through agoq's profiler driven by the NCCL
 * emulator as NCCL drives it. One thread records while another looks up (run under TSan).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "abi/agoq_nccl_profiler_v6.h"
#include "agoq_nccl_emul.h"
#include "profiler/agoq_oracle.h"
#include "profiler/agoq_prof.h"

extern const ncclProfiler_v5_t ncclProfiler_v5;

#define BIG ((size_t)4 << 20) /* elements: far above the LL bound for every type */

static uint64_t key_of(int peer, int dtype, uint64_t bytes) {
  uint64_t k = 0;
  assert_true(agoq_prof_flow_key(peer, dtype, bytes, &k));
  assert_int_not_equal(k, 0);
  return k;
}

static void test_key_packing(void** state) {
  (void)state;
  uint64_t k;
  /* Exact packing: bytes above dtype above peer. */
  assert_int_equal(key_of(5, ncclBfloat16, 1000), (uint64_t)1000 << 24 | (uint64_t)ncclBfloat16 << 20 | 5);
  /* The largest values that fit, and the first that do not: not recorded, not two-way. */
  assert_int_equal(key_of((1 << 20) - 1, 15, ((uint64_t)1 << 40) - 1), UINT64_MAX);
  assert_false(agoq_prof_flow_key(1 << 20, ncclFloat32, 1000, &k));
  assert_false(agoq_prof_flow_key(-1, ncclFloat32, 1000, &k));
  assert_false(agoq_prof_flow_key(1, 16, 1000, &k));
  assert_false(agoq_prof_flow_key(1, -1, 1000, &k));
  assert_false(agoq_prof_flow_key(1, ncclFloat32, (uint64_t)1 << 40, &k));
  assert_false(agoq_prof_flow_key(1, ncclFloat32, 0, &k)); /* 0 is the empty slot */
  /* No two different fields give one key: neighbours in each field differ. */
  uint64_t base = key_of(7, ncclFloat16, 1 << 22);
  assert_int_not_equal(base, key_of(6, ncclFloat16, 1 << 22));
  assert_int_not_equal(base, key_of(8, ncclFloat16, 1 << 22));
  assert_int_not_equal(base, key_of(7, ncclBfloat16, 1 << 22));
  assert_int_not_equal(base, key_of(7, ncclFloat16, (1 << 22) + 2));
  /* A carry from one field into the next would collide here without exact packing. */
  assert_int_not_equal(key_of((1 << 20) - 1, 0, 1), key_of(0, 1, 1));
  assert_int_not_equal(key_of(0, 15, 1), key_of(0, 0, 2));
}

static void test_table_round_robin(void** state) {
  (void)state;
  static agoq_prof_flows f; /* zeroed: empty */
  assert_false(agoq_prof_flow_seen(&f, key_of(1, ncclBfloat16, 4096)));
  assert_false(agoq_prof_flow_seen(&f, 0));
  for (unsigned i = 0; i < AGOQ_PROF_FLOW_SLOTS; i++) agoq_prof_flow_record(&f, key_of(1, ncclBfloat16, 4096 + i));
  for (unsigned i = 0; i < AGOQ_PROF_FLOW_SLOTS; i++) assert_true(agoq_prof_flow_seen(&f, key_of(1, ncclBfloat16, 4096 + i)));
  /* A key already there is not written again: repeated receives of a pipeline's shape do
   * not push the other flows out. */
  for (int r = 0; r < 1000; r++) agoq_prof_flow_record(&f, key_of(1, ncclBfloat16, 4096));
  for (unsigned i = 0; i < AGOQ_PROF_FLOW_SLOTS; i++) assert_true(agoq_prof_flow_seen(&f, key_of(1, ncclBfloat16, 4096 + i)));
  /* One more shape overwrites the oldest (ring order). */
  agoq_prof_flow_record(&f, key_of(2, ncclFloat32, 1 << 21));
  assert_true(agoq_prof_flow_seen(&f, key_of(2, ncclFloat32, 1 << 21)));
  assert_false(agoq_prof_flow_seen(&f, key_of(1, ncclBfloat16, 4096)));
  assert_true(agoq_prof_flow_seen(&f, key_of(1, ncclBfloat16, 4097)));
  agoq_prof_flow_record(&f, 0); /* ignored */
  assert_false(agoq_prof_flow_seen(&f, 0));
}

/* ---- through the profiler, as NCCL drives it ---- */

static agoq_emul_comm* comm_new(uint64_t id) {
  agoq_emul_comm* c = agoq_emul_comm_create(&ncclProfiler_v5, 5, id, 4, 0);
  assert_non_null(c);
  assert_int_equal(agoq_emul_comm_init_result(c), ncclSuccess);
  return c;
}

static void recv_task(agoq_emul_comm* c, int dtype, size_t count, int peer) {
  agoq_emul_task* r = agoq_emul_p2p_start(c, false, dtype, count, peer, 2);
  assert_non_null(r);
  agoq_emul_task_free(r);
}

/* A send of `count` elements to `peer`; a receive `r_*` of the same group is started after
 * the send's task and before its net event when r_count != 0. Returns the descriptor's
 * two_way (the descriptor must be filled: the send itself is tracked). */
static uint32_t send_two_way(agoq_emul_comm* c, int dtype, size_t count, int peer, int r_dtype, size_t r_count,
                             int r_peer) {
  agoq_emul_task* t = agoq_emul_p2p_start(c, true, dtype, count, peer, 2);
  assert_non_null(t);
  if (r_count != 0) recv_task(c, r_dtype, r_count, r_peer);
  agoq_emul_task_stop(t);
  agoq_emul_op* op = agoq_emul_op_start(t, 0, 4, 1 << 19);
  assert_non_null(op);
  void* ph = agoq_emul_step_phandle(op, 0);
  agoq_xfer_desc d;
  assert_true(agoq_oracle_query(agoq_emul_callback(), ph, &d));
  assert_int_equal(d.kind, AGOQ_XFER_P2P);
  assert_int_equal(d.is_send, 1);
  assert_int_equal(d.proto, AGOQ_XFER_PROTO_SIMPLE);
  agoq_emul_step_stop(op, 0);
  agoq_emul_op_stop(op);
  agoq_emul_task_free(t);
  return d.two_way;
}

static void test_chain_two_way(void** state) {
  (void)state;
  agoq_emul_comm* c = comm_new(0x5101);
  /* One way: nothing received yet. */
  assert_int_equal(send_two_way(c, ncclBfloat16, BIG, 1, 0, 0, 0), 0);
  /* The receive of the same group, started after the send's task: two-way at the net event. */
  assert_int_equal(send_two_way(c, ncclBfloat16, BIG, 1, ncclBfloat16, BIG, 1), 1);
  /* And from then on (the flow is remembered). */
  assert_int_equal(send_two_way(c, ncclBfloat16, BIG, 1, 0, 0, 0), 1);
  /* Another count, datatype (same bytes) or peer is another flow. */
  assert_int_equal(send_two_way(c, ncclFloat32, BIG, 2, ncclFloat32, BIG + 64, 2), 0);
  assert_int_equal(send_two_way(c, ncclFloat16, BIG, 2, ncclBfloat16, BIG, 2), 0);
  assert_int_equal(send_two_way(c, ncclFloat32, BIG, 2, ncclFloat32, BIG, 3), 0);
  /* A receive too small to be SIMPLE, or of a type the codec does not take, is not
   * recorded; a later send of the same bytes is not two-way by it. */
  recv_task(c, ncclInt32, BIG, 5);
  assert_int_equal(send_two_way(c, ncclFloat32, BIG, 5, 0, 0, 0), 0);
  recv_task(c, ncclBfloat16, 1024, 5); /* 2 KiB: NCCL may send it as LL */
  assert_int_equal(send_two_way(c, ncclBfloat16, BIG, 5, 0, 0, 0), 0);
  /* The fp32 receive from peer 3 above is a flow of its own: its send is two-way. */
  assert_int_equal(send_two_way(c, ncclFloat32, BIG, 3, 0, 0, 0), 1);
  /* Another communicator has its own table. */
  agoq_emul_comm* c2 = comm_new(0x5102);
  assert_int_equal(send_two_way(c2, ncclBfloat16, BIG, 1, 0, 0, 0), 0);
  agoq_emul_comm_destroy(c2);
  /* A receive is answered from its tag: never two-way. */
  agoq_emul_task* r = agoq_emul_p2p_start(c, false, ncclBfloat16, BIG, 1, 2);
  agoq_emul_task_stop(r);
  agoq_emul_op* op = agoq_emul_op_start(r, 0, 4, 1 << 19);
  agoq_xfer_desc d;
  assert_true(agoq_oracle_query(agoq_emul_callback(), agoq_emul_step_phandle(op, 0), &d));
  assert_int_equal(d.is_send, 0);
  assert_int_equal(d.two_way, 0);
  agoq_emul_op_stop(op);
  agoq_emul_task_free(r);
  agoq_emul_comm_destroy(c);
}

/* A user thread records receives while a proxy thread looks them up: every answer is a
 * whole key (TSan: no race on the slots). */
typedef struct {
  agoq_prof_flows* f;
  int n;
} flow_arg;

static void* recorder(void* p) {
  flow_arg* a = p;
  for (int i = 0; i < a->n; i++) agoq_prof_flow_record(a->f, key_of(1, ncclBfloat16, 1024 + (uint64_t)i % 200));
  return NULL;
}

static void test_threads(void** state) {
  (void)state;
  static agoq_prof_flows f;
  flow_arg a = {&f, 20000};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, recorder, &a), 0);
  unsigned never = 0;
  for (int i = 0; i < 20000; i++) {
    /* A key never recorded is never seen, whatever the writer is doing. */
    if (agoq_prof_flow_seen(&f, key_of(2, ncclBfloat16, 1024 + (uint64_t)i % 200))) never++;
    (void)agoq_prof_flow_seen(&f, key_of(1, ncclBfloat16, 1024 + (uint64_t)i % 200));
  }
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(never, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_packing),
      cmocka_unit_test(test_table_round_robin),
      cmocka_unit_test(test_chain_two_way),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
