/* The verbs transport's wire (agoq_ib_wire.h): what encodes decodes to the same value, and
 * every field a peer could get wrong is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "transport/ib/agoq_ib_wire.h"

static agoq_ib_meta meta_receiver(void) {
  agoq_ib_meta m = {.role = 1, .nqps = 2, .link_layer = 2, .mtu = 5, .port = 1, .gid_index = 3, .lid = 0,
                    .ring_addr = 0x7f0000001000ull, .ring_rkey = 0xabcd, .ring_slots = 256, .slot_size = 8224,
                    .eager_max = 8192};
  m.gid[10] = m.gid[11] = 0xff;
  m.gid[12] = 10;
  m.gid[15] = 5;
  m.qpn[0] = 0x1234;
  m.qpn[1] = 0xffffff;
  return m;
}

static agoq_ib_wire_status meta_roundtrip(const agoq_ib_meta* m, agoq_ib_meta* out) {
  uint8_t b[AGOQ_IB_META_SIZE];
  agoq_ib_meta_encode(m, b);
  return agoq_ib_meta_decode(b, sizeof b, out);
}

static void test_meta_roundtrip(void** state) {
  (void)state;
  agoq_ib_meta m = meta_receiver(), d;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_OK);
  assert_memory_equal(&m, &d, sizeof m);
  m.role = 0;
  m.eager_max = 0;
  m.slot_size = AGOQ_IB_CTS_SIZE;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_OK);
  assert_memory_equal(&m, &d, sizeof m);
}

static void test_meta_refused(void** state) {
  (void)state;
  agoq_ib_meta d;
  agoq_ib_meta m = meta_receiver();
  m.nqps = 0;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.nqps = AGOQ_IB_MAX_QPS + 1;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.qpn[1] = 1; /* the special QPs are never ours */
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.qpn[1] = 0x1000000; /* 24 bits */
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.qpn[2] = 77; /* beyond nqps */
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.role = 2;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.link_layer = 0;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.mtu = 6;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.ring_addr = 0;
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.eager_max = m.slot_size; /* an inline payload must fit its slot behind the header */
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);
  m = meta_receiver();
  m.role = 0; /* a sender offers no inline limit */
  assert_int_equal(meta_roundtrip(&m, &d), AGOQ_IB_WIRE_BAD_FIELD);

  uint8_t b[AGOQ_IB_META_SIZE];
  m = meta_receiver();
  agoq_ib_meta_encode(&m, b);
  assert_int_equal(agoq_ib_meta_decode(b, sizeof b - 1, &d), AGOQ_IB_WIRE_BAD_FIELD);
  b[0] ^= 1;
  assert_int_equal(agoq_ib_meta_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_MAGIC);
  b[0] ^= 1;
  b[4] = 2;
  assert_int_equal(agoq_ib_meta_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_VERSION);
  b[4] = 1;
  for (size_t i = 0; i < sizeof b; i++) {
    /* The reserved bytes must be zero: the gap after the LID and the tail. */
    if (i != 14 && i != 15 && i < 88) continue;
    b[i] = 1;
    assert_int_equal(agoq_ib_meta_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_FIELD);
    b[i] = 0;
  }
  assert_int_equal(agoq_ib_meta_decode(b, sizeof b, &d), AGOQ_IB_WIRE_OK);
}

static void test_rts(void** state) {
  (void)state;
  uint8_t b[AGOQ_IB_RTS_HDR_SIZE];
  agoq_ib_rts r = {.seq = 0xfffffffe, .tag = -5, .size = 100, .flags = AGOQ_IB_RTS_FLAG_EAGER | AGOQ_IB_RTS_FLAG_FRAME};
  agoq_ib_rts d;
  agoq_ib_rts_encode(&r, b);
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_OK);
  assert_int_equal(d.seq, r.seq);
  assert_int_equal(d.tag, -5);
  assert_int_equal(d.size, 100);
  assert_int_equal(d.flags, r.flags);
  /* Inline beyond the receiver's limit, or a large message claimed inline. */
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 99, &d), AGOQ_IB_WIRE_BAD_FIELD);
  r.flags = 0;
  agoq_ib_rts_encode(&r, b);
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_BAD_FIELD);
  /* A small message from GPU memory goes by RDMA, and says why; never inline too. */
  r.flags = AGOQ_IB_RTS_FLAG_DEVICE;
  agoq_ib_rts_encode(&r, b);
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_OK);
  r.flags = AGOQ_IB_RTS_FLAG_DEVICE | AGOQ_IB_RTS_FLAG_EAGER;
  agoq_ib_rts_encode(&r, b);
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_BAD_FIELD);
  r.flags = 0;
  r.size = 8193;
  agoq_ib_rts_encode(&r, b);
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_OK);
  b[12] |= 0x80; /* unknown flag */
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_BAD_FIELD);
  b[12] &= 0x7f;
  b[30] = 1;
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_BAD_FIELD);
  b[30] = 0;
  b[1] ^= 0xff;
  assert_int_equal(agoq_ib_rts_decode(b, sizeof b, 8192, &d), AGOQ_IB_WIRE_BAD_MAGIC);
}

static void test_cts(void** state) {
  (void)state;
  uint8_t b[AGOQ_IB_CTS_SIZE];
  agoq_ib_cts d;
  agoq_ib_cts w = {.seq = 9, .kind = AGOQ_IB_CTS_WRITE, .addr = 0x7f0000200000ull, .rkey = 0x77, .size = 1 << 20};
  agoq_ib_cts_encode(&w, b);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_OK);
  assert_memory_equal(&w, &d, sizeof w);
  agoq_ib_cts c = {.seq = 10, .kind = AGOQ_IB_CTS_CONSUMED};
  agoq_ib_cts_encode(&c, b);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_OK);
  assert_memory_equal(&c, &d, sizeof c);
  agoq_ib_cts f = {.seq = 11, .kind = AGOQ_IB_CTS_REFUSED, .code = 5};
  agoq_ib_cts_encode(&f, b);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_OK);
  assert_int_equal(d.code, 5);
  assert_int_equal(d.rkey, 0);
  /* A write with no address or no size, a refusal without a reason, a kind unknown. */
  w.addr = 0;
  agoq_ib_cts_encode(&w, b);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_FIELD);
  w.addr = 1;
  w.size = 0;
  agoq_ib_cts_encode(&w, b);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_FIELD);
  f.code = 0;
  agoq_ib_cts_encode(&f, b);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_FIELD);
  c.kind = 4;
  agoq_ib_cts_encode(&c, b);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_FIELD);
  c.kind = AGOQ_IB_CTS_CONSUMED;
  agoq_ib_cts_encode(&c, b);
  b[20] = 1; /* "consumed" names no address */
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b, &d), AGOQ_IB_WIRE_BAD_FIELD);
  assert_int_equal(agoq_ib_cts_decode(b, sizeof b - 1, &d), AGOQ_IB_WIRE_BAD_FIELD);
}

static void test_imm(void** state) {
  (void)state;
  for (uint32_t k = AGOQ_IB_IMM_RTS; k <= AGOQ_IB_IMM_DATA; k++) {
    uint32_t imm = agoq_ib_imm((agoq_ib_imm_kind)k, 0xdeadbeefu);
    assert_int_equal(agoq_ib_imm_kind_of(imm), k);
    assert_int_equal(agoq_ib_imm_seq(imm), 0xdeadbeefu & AGOQ_IB_IMM_SEQ_MASK);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_meta_roundtrip), cmocka_unit_test(test_meta_refused), cmocka_unit_test(test_rts),
      cmocka_unit_test(test_cts),           cmocka_unit_test(test_imm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
