/* Typed payloads on the net path, in one process: a stand-in for NCCL's profiler callback
 * (which, with agoq's profiler loaded, fills our descriptor) decides what each isend is;
 * the transport must send exactly what it may not quantize and decode frames within the
 * codec's bound. The real profiler chain is tested in test_profiler and the typed harness. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agoq_frame.h"
#include "core/agoq_params.h"
#include "net/agoq_net_comm.h"
#include "transport/tcp/agoq_tcp.h"
#include "net/agoq_net.h"
#include "profiler/agoq_oracle.h"

#define COMM_ID 0x7e7e7e7e00000001ull

#include "net_pair.h"

static int setup_env(void** state) {
  (void)state;
  p2p_env();
  setenv("AGOQ_SOCKET_FAMILY", "ipv4", 1);
  return 0;
}

static void pair_open(pair* p, ncclProfilerCallback_t prof) { pair_open_ex(p, COMM_ID, prof); }

static const agoq_typed_stats* send_stats(const pair* p) { return &((agoq_comm*)p->send)->typed_stats; }

/* One message: isend of `n` bytes with `step` as its profiler handle, a single receive of
 * `posted` bytes. Returns the receive's test() result; *rsize gets the reported size. */
static ncclResult_t one_message(pair* p, const void* src, size_t n, fake_step* step, void* dst, size_t posted,
                                int* rsize) {
  void *sreq = NULL, *rreq = NULL;
  int tag = 9;
  while (rreq == NULL)
    assert_int_equal(agoq_net_irecv(p->recv, 1, &dst, &posted, &tag, NULL, NULL, &rreq), ncclSuccess);
  while (sreq == NULL)
    assert_int_equal(agoq_net_isend(p->send, (void*)src, n, tag, NULL, step, &sreq), ncclSuccess);
  int sdone = 0, rdone = 0, ssize = -1;
  ncclResult_t rres = ncclSuccess;
  double deadline = now_s() + 30;
  *rsize = -1;
  while ((!sdone || !rdone) && now_s() < deadline) {
    if (!sdone) assert_int_equal(agoq_net_test(sreq, &sdone, &ssize), ncclSuccess);
    if (!rdone) {
      rres = agoq_net_test(rreq, &rdone, rsize);
      if (rres != ncclSuccess) return rres;
    }
  }
  assert_true(sdone && rdone);
  assert_int_equal(ssize, (int)n); /* the sender reports what NCCL gave it */
  return rres;
}

static uint32_t rng = 12345;
static float normal(void) {
  float s = 0;
  for (int i = 0; i < 12; i++) {
    rng = rng * 1664525u + 1013904223u;
    s += (float)(rng >> 8) / 16777216.0f;
  }
  return s - 6.0f;
}
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* bf16 activations go as an int8 frame (~1.94x fewer bytes) and decode within the bound. */
static void test_bf16_p2p_is_quantized(void** state) {
  (void)state;
  pair p;
  pair_open(&p, fake_prof);
  const size_t n = 1u << 19; /* 1 MiB of bf16 */
  uint16_t* src = malloc(n * 2);
  uint16_t* dst = malloc(n * 2 + 64);
  for (size_t i = 0; i < n; i++) src[i] = to_bf16(normal());
  memset(dst, 0xee, n * 2 + 64);
  fake_step step = step_of(AGOQ_XFER_P2P, 9 /* ncclBfloat16 */, AGOQ_XFER_PROTO_SIMPLE, 1);
  int starts0 = starts, stops0 = stops, rsize;
  assert_int_equal(one_message(&p, src, n * 2, &step, dst, n * 2 + 64, &rsize), ncclSuccess);
  assert_int_equal(rsize, (int)(n * 2));
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; i++) {
    double a = from_bf16(src[i]), b = from_bf16(dst[i]);
    err += (a - b) * (a - b);
    ref += a * a;
  }
  assert_true(sqrt(err / ref) < 0.012);
  assert_true(sqrt(err / ref) > 0.0); /* it really went through the codec */
  for (size_t g = n * 2; g < n * 2 + 64; g++) assert_int_equal(((uint8_t*)dst)[g], 0xee);
  const agoq_typed_stats* st = send_stats(&p);
  assert_int_equal(st->frames, 1);
  double ratio = (double)st->frame_in_bytes / (double)st->frame_wire_bytes;
  assert_true(ratio > 1.90 && ratio < 1.95);
  assert_int_equal(starts - starts0, 1);
  assert_int_equal(stops - stops0, 1); /* every started NetPlugin event is stopped */
  free(src);
  free(dst);
  pair_close(&p);
}

/* fp32 and fp16 too; the receiver learns the type from the frame. */
static void test_fp32_fp16_p2p(void** state) {
  (void)state;
  pair p;
  pair_open(&p, fake_prof);
  const size_t n = 100003; /* not a block multiple */
  float* f = malloc(n * 4);
  float* g = malloc(n * 4);
  for (size_t i = 0; i < n; i++) f[i] = normal();
  fake_step step = step_of(AGOQ_XFER_P2P, 7 /* ncclFloat32 */, AGOQ_XFER_PROTO_SIMPLE, 1);
  int rsize;
  assert_int_equal(one_message(&p, f, n * 4, &step, g, n * 4, &rsize), ncclSuccess);
  assert_int_equal(rsize, (int)(n * 4));
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; i++) err += (f[i] - g[i]) * (double)(f[i] - g[i]), ref += f[i] * (double)f[i];
  assert_true(sqrt(err / ref) < 0.012);
  assert_int_equal(send_stats(&p)->frames, 1);
  uint16_t* h = malloc(n * 2);
  uint16_t* k = malloc(n * 2);
  for (size_t i = 0; i < n; i++) h[i] = (uint16_t)(0x3c00u + (i % 1000)); /* fp16 1.0 .. 1.97 */
  step = step_of(AGOQ_XFER_P2P, 6 /* ncclFloat16 */, AGOQ_XFER_PROTO_SIMPLE, 1);
  assert_int_equal(one_message(&p, h, n * 2, &step, k, n * 2, &rsize), ncclSuccess);
  assert_int_equal(rsize, (int)(n * 2));
  assert_int_equal(send_stats(&p)->frames, 2);
  assert_memory_not_equal(h, k, n * 2); /* lossy, but close: */
  for (size_t i = 0; i < n; i++) assert_true(abs((int)h[i] - (int)k[i]) < 16);
  free(f);
  free(g);
  free(h);
  free(k);
  pair_close(&p);
}

/* Everything the transport may not quantize arrives bit for bit. */
static void test_exact_cases(void** state) {
  (void)state;
  pair p;
  pair_open(&p, fake_prof);
  const size_t bytes = 1u << 20;
  uint8_t* src = malloc(bytes);
  uint8_t* dst = malloc(bytes);
  for (size_t i = 0; i < bytes / 2; i++) ((uint16_t*)src)[i] = to_bf16(normal());
  fake_step cases[] = {
      step_of(AGOQ_XFER_P2P, 2 /* ncclInt32 */, AGOQ_XFER_PROTO_SIMPLE, 1),
      step_of(AGOQ_XFER_P2P, 4 /* ncclInt64 */, AGOQ_XFER_PROTO_SIMPLE, 1),
      step_of(AGOQ_XFER_P2P, 8 /* ncclFloat64 */, AGOQ_XFER_PROTO_SIMPLE, 1),
      step_of(AGOQ_XFER_P2P, 10 /* ncclFloat8e4m3 */, AGOQ_XFER_PROTO_SIMPLE, 1),
      step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_LL, 1),      /* LL lines carry flags */
      step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_UNKNOWN, 1), /* protocol not established */
      {.answer = false},                    /* no profiler: nothing filled */
  };
  cases[5].desc.proto = AGOQ_XFER_PROTO_UNKNOWN;
  fake_step coll = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  coll.desc.kind = AGOQ_XFER_COLL; /* ring/tree traffic: every rank must keep the same bits */
  fake_step recvside = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  recvside.desc.is_send = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0] + 2; c++) {
    fake_step* step = c < sizeof cases / sizeof cases[0] ? &cases[c] : c == sizeof cases / sizeof cases[0] ? &coll
                                                                                                         : &recvside;
    memset(dst, 0, bytes);
    int rsize;
    assert_int_equal(one_message(&p, src, bytes, step, dst, bytes, &rsize), ncclSuccess);
    assert_int_equal(rsize, (int)bytes);
    assert_memory_equal(src, dst, bytes);
  }
  /* A NULL profiler handle, an odd size for bf16, and a payload below AGOQ_MIN_BYTES. */
  fake_step bf = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  size_t sizes[] = {bytes, bytes - 1, 65534};
  for (int k = 0; k < 3; k++) {
    void *sreq = NULL, *rreq = NULL;
    void* d = dst;
    size_t posted = bytes;
    int tag = 1, done = 0, rs = -1;
    memset(dst, 0, bytes);
    while (rreq == NULL) assert_int_equal(agoq_net_irecv(p.recv, 1, &d, &posted, &tag, NULL, NULL, &rreq), ncclSuccess);
    while (sreq == NULL)
      assert_int_equal(agoq_net_isend(p.send, src, sizes[k], 1, NULL, k == 0 ? NULL : &bf, &sreq), ncclSuccess);
    int sdone = 0;
    while (!sdone || !done) {
      if (!sdone) assert_int_equal(agoq_net_test(sreq, &sdone, NULL), ncclSuccess);
      if (!done) assert_int_equal(agoq_net_test(rreq, &done, &rs), ncclSuccess);
    }
    assert_int_equal(rs, (int)sizes[k]);
    assert_memory_equal(src, dst, sizes[k]);
  }
  assert_int_equal(send_stats(&p)->frames, 0);
  free(src);
  free(dst);
  pair_close(&p);
}

/* With AGOQ_P2P_FORMAT=none nothing is quantized and the oracle is not even asked. */
static void test_format_none(void** state) {
  (void)state;
  setenv("AGOQ_P2P_FORMAT", "none", 1);
  agoq_params_reset();
  pair p;
  pair_open(&p, fake_prof);
  /* The transport configuration is fixed at the first init of the process; the p2p policy
   * follows it, so reload it explicitly as a new process would. */
  agoq_typed_policy_load();
  const size_t bytes = 1u << 20;
  uint8_t* src = malloc(bytes);
  uint8_t* dst = malloc(bytes);
  for (size_t i = 0; i < bytes / 2; i++) ((uint16_t*)src)[i] = to_bf16(normal());
  fake_step step = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  int s0 = starts, rsize;
  assert_int_equal(one_message(&p, src, bytes, &step, dst, bytes, &rsize), ncclSuccess);
  assert_memory_equal(src, dst, bytes);
  assert_int_equal(starts, s0);
  assert_int_equal(send_stats(&p)->frames, 0);
  free(src);
  free(dst);
  pair_close(&p);
  setenv("AGOQ_P2P_FORMAT", "int8", 1);
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_typed_policy_load();
}

/* AGOQ_P2P_SCOPE: with the default (pipeline) a float p2p send the profiler did not find a
 * matching receive for (two_way 0) goes exact as one-way; a two-way one is quantized; with
 * all both are. The decision is the sender's plan, so no message needs to travel. */
static void test_scope_pipeline(void** state) {
  (void)state;
  unsetenv("AGOQ_P2P_SCOPE");
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_typed_policy_load();
  agoq_typed_stats st = {0};
  agoq_codec_params cp;
  size_t n = 0, cap = 0;
  agoq_exact_reason why;
  fake_step one = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  one.desc.two_way = 0;
  fake_step two = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  assert_false(agoq_typed_plan(&st, fake_prof, &one, 1u << 20, &cp, &n, &cap, &why));
  assert_int_equal(why, AGOQ_EXACT_ONE_WAY);
  assert_int_equal(st.not_eligible, 1);
  assert_true(agoq_typed_plan(&st, fake_prof, &two, 1u << 20, &cp, &n, &cap, &why));
  assert_int_equal(n, (1u << 20) / 2);
  /* Rules before it still say why first: an LL-sized or integer send is not "one-way". */
  fake_step ll = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_LL, 1);
  ll.desc.two_way = 0;
  assert_false(agoq_typed_plan(&st, fake_prof, &ll, 1u << 20, &cp, &n, &cap, &why));
  assert_int_equal(why, AGOQ_EXACT_LL);
  setenv("AGOQ_P2P_SCOPE", "all", 1);
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_typed_policy_load();
  assert_true(agoq_typed_plan(&st, fake_prof, &one, 1u << 20, &cp, &n, &cap, &why));
  unsetenv("AGOQ_P2P_SCOPE");
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_typed_policy_load();
}

/* A frame that decodes to more than the receive posted is an error, not an overflow. */
static void test_frame_larger_than_posted(void** state) {
  (void)state;
  pair p;
  pair_open(&p, fake_prof);
  const size_t n = 1u << 17; /* 256 KiB of bf16: frame ~132 KiB */
  uint16_t* src = malloc(n * 2);
  uint8_t* dst = malloc(n * 2);
  for (size_t i = 0; i < n; i++) src[i] = to_bf16(normal());
  memset(dst, 0x5a, n * 2);
  fake_step step = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  void *sreq = NULL, *rreq = NULL;
  void* d = dst;
  size_t posted = 200u << 10; /* the frame fits, its decode (256 KiB) does not */
  int tag = 2, sdone = 0, rdone = 0;
  while (rreq == NULL) assert_int_equal(agoq_net_irecv(p.recv, 1, &d, &posted, &tag, NULL, NULL, &rreq), ncclSuccess);
  while (sreq == NULL) assert_int_equal(agoq_net_isend(p.send, src, n * 2, 2, NULL, &step, &sreq), ncclSuccess);
  ncclResult_t r = ncclSuccess;
  double deadline = now_s() + 20;
  while (r == ncclSuccess && !rdone && now_s() < deadline) {
    if (!sdone) assert_int_equal(agoq_net_test(sreq, &sdone, NULL), ncclSuccess);
    r = agoq_net_test(rreq, &rdone, NULL);
  }
  assert_int_equal(r, ncclInvalidUsage);
  for (size_t i = 0; i < n * 2; i++) assert_int_equal(dst[i], 0x5a); /* nothing delivered */
  free(src);
  free(dst);
  pair_close(&p);
}

/* A damaged frame is rejected by its checksums; the destination stays untouched. */
static void test_corrupt_frame_rejected(void** state) {
  (void)state;
  const size_t n = 4096;
  uint16_t* src = malloc(n * 2);
  for (size_t i = 0; i < n; i++) src[i] = to_bf16(normal());
  agoq_codec_params cp = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_BF16, .block = 128};
  size_t cap = agoq_frame_size_max(&cp, n), len = 0;
  uint8_t* frame = malloc(cap);
  assert_int_equal(agoq_frame_encode(&cp, src, n, true, frame, cap, &len), AGOQ_CODEC_OK);
  uint16_t* dst = malloc(n * 2);
  agoq_typed_stats st = {0};
  size_t decoded = 0;
  assert_int_equal(agoq_typed_decode(&st, frame, len, dst, n * 2, &decoded, "test"), ncclSuccess);
  assert_int_equal(decoded, n * 2);
  const size_t flips[] = {3, 20, 47, 60, len / 2, len - 1};
  for (size_t k = 0; k < sizeof flips / sizeof flips[0]; k++) {
    frame[flips[k]] ^= 0x10;
    memset(dst, 0x77, n * 2);
    assert_int_not_equal(agoq_typed_decode(&st, frame, len, dst, n * 2, &decoded, "test"), ncclSuccess);
    for (size_t i = 0; i < n; i++) assert_int_equal(dst[i], 0x7777);
    frame[flips[k]] ^= 0x10;
  }
  assert_int_not_equal(agoq_typed_decode(&st, frame, len - 1, dst, n * 2, &decoded, "test"), ncclSuccess);
  free(src);
  free(frame);
  free(dst);
}

/* A grouped receive where one buffer gets a frame and another exact bytes. */
static void test_grouped_mixed(void** state) {
  (void)state;
  pair p;
  pair_open(&p, fake_prof);
  const size_t bytes = 256u << 10;
  uint8_t* a = malloc(bytes);
  uint8_t* b = malloc(bytes);
  uint8_t* ra = calloc(1, bytes);
  uint8_t* rb = calloc(1, bytes);
  for (size_t i = 0; i < bytes / 2; i++) ((uint16_t*)a)[i] = to_bf16(normal());
  for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)(i * 7);
  void* data[2] = {ra, rb};
  size_t sizes[2] = {bytes, bytes};
  int tags[2] = {10, 11};
  void *rreq = NULL, *s1 = NULL, *s2 = NULL;
  while (rreq == NULL) assert_int_equal(agoq_net_irecv(p.recv, 2, data, sizes, tags, NULL, NULL, &rreq), ncclSuccess);
  fake_step fbf = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  fake_step fint = step_of(AGOQ_XFER_P2P, 3, AGOQ_XFER_PROTO_SIMPLE, 1);
  while (s1 == NULL) assert_int_equal(agoq_net_isend(p.send, b, bytes, 11, NULL, &fint, &s1), ncclSuccess);
  while (s2 == NULL) assert_int_equal(agoq_net_isend(p.send, a, bytes, 10, NULL, &fbf, &s2), ncclSuccess);
  int d1 = 0, d2 = 0, dr = 0, rs[2] = {-1, -1};
  while (!d1 || !d2 || !dr) {
    if (!d1) assert_int_equal(agoq_net_test(s1, &d1, NULL), ncclSuccess);
    if (!d2) assert_int_equal(agoq_net_test(s2, &d2, NULL), ncclSuccess);
    if (!dr) assert_int_equal(agoq_net_test(rreq, &dr, rs), ncclSuccess);
  }
  assert_int_equal(rs[0], (int)bytes);
  assert_int_equal(rs[1], (int)bytes);
  assert_memory_equal(b, rb, bytes);
  assert_memory_not_equal(a, ra, bytes);
  assert_int_equal(send_stats(&p)->frames, 1);
  free(a);
  free(b);
  free(ra);
  free(rb);
  pair_close(&p);
}

/* Lengths on the wire are checked against the posted receive before anything is allocated
 * or written: a header claiming 2^63 bytes (inline, in pieces, or as a frame) is a
 * truncation error at once, with the destination untouched. */
static void test_huge_lengths_rejected_before_allocation(void** state) {
  (void)state;
  const uint32_t flags[] = {AGOQ_MSG_FLAG_INLINE, 0, AGOQ_MSG_FLAG_FRAME};
  for (int k = 0; k < 3; k++) {
    pair p;
    pair_open(&p, fake_prof);
    agoq_msg_hdr h = {.size = 1ull << 63, .tag = 5, .seq = 0, .flags = flags[k]};
    if (!(flags[k] & AGOQ_MSG_FLAG_INLINE)) {
      h.chunk = 1ull << 62;
      h.nchunks = 2;
    }
    uint8_t wire[AGOQ_MSG_HDR_SIZE];
    agoq_msg_hdr_encode(&h, wire);
    /* Written straight into the sender's control socket, as a rogue peer would. */
    assert_int_equal(write(((agoq_comm*)p.send)->tp->ctrl_fd, wire, sizeof wire), (ssize_t)sizeof wire);
    uint8_t dst[4096];
    memset(dst, 0x33, sizeof dst);
    void *rreq = NULL, *d = dst;
    size_t posted = sizeof dst;
    int tag = 5, done = 0;
    while (rreq == NULL) assert_int_equal(agoq_net_irecv(p.recv, 1, &d, &posted, &tag, NULL, NULL, &rreq), ncclSuccess);
    ncclResult_t r = ncclSuccess;
    double deadline = now_s() + 5;
    while (r == ncclSuccess && !done && now_s() < deadline) r = agoq_net_test(rreq, &done, NULL);
    assert_int_equal(r, ncclInvalidUsage);
    for (size_t i = 0; i < sizeof dst; i++) assert_int_equal(dst[i], 0x33);
    assert_int_equal(((agoq_comm*)p.recv)->stage.n, 0); /* no staging buffer was made */
    pair_close(&p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_p2p_is_quantized),  cmocka_unit_test(test_fp32_fp16_p2p),
      cmocka_unit_test(test_exact_cases),            cmocka_unit_test(test_format_none),
      cmocka_unit_test(test_scope_pipeline),
      cmocka_unit_test(test_frame_larger_than_posted), cmocka_unit_test(test_corrupt_frame_rejected),
      cmocka_unit_test(test_grouped_mixed),          cmocka_unit_test(test_huge_lengths_rejected_before_allocation),
  };
  return cmocka_run_group_tests(tests, setup_env, NULL);
}
