/* The CollNet settings block as pure functions (agoq_coll_wire.c): encode and decode agree,
 * blocks of another layout version or with values no listen writes are refused by kind, and
 * a settings mismatch is described naming every differing variable with both values as a
 * user writes them. Group creation's use of it (each rank's WARN) is test_collnet's
 * test_mismatched_settings_fail_everywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "collnet/agoq_coll_wire.h"

static agoq_coll_config cfg_of(agoq_format format, uint32_t block, uint64_t min_bytes, uint64_t chunk_bytes) {
  agoq_coll_config c;
  memset(&c, 0, sizeof c);
  c.format = format;
  c.block = block;
  c.min_bytes = min_bytes;
  c.chunk_bytes = chunk_bytes;
  c.timeout_s = 60; /* per rank, not in the block */
  return c;
}

static agoq_coll_settings settings_of(agoq_format format, uint32_t block, uint64_t min_bytes, uint64_t chunk_bytes) {
  agoq_coll_config c = cfg_of(format, block, min_bytes, chunk_bytes);
  uint8_t b[AGOQ_COLL_SETTINGS_SIZE];
  agoq_coll_settings_encode(&c, b);
  agoq_coll_settings s;
  assert_int_equal(agoq_coll_settings_decode(b, &s), AGOQ_COLL_SETTINGS_OK);
  return s;
}

static void test_settings_roundtrip(void** state) {
  (void)state;
  const agoq_format formats[] = {AGOQ_FORMAT_NONE, AGOQ_FORMAT_INT8, AGOQ_FORMAT_INT4, AGOQ_FORMAT_FP8E4M3,
                                 AGOQ_FORMAT_FP8E5M2};
  for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
    for (uint32_t block = AGOQ_CODEC_BLOCK_MIN; block <= AGOQ_CODEC_BLOCK_MAX; block *= 2) {
      agoq_coll_config c = cfg_of(formats[f], block, 1099511627776ull, 268435456ull);
      uint8_t b[AGOQ_COLL_SETTINGS_SIZE];
      agoq_coll_settings_encode(&c, b);
      agoq_coll_settings s;
      assert_int_equal(agoq_coll_settings_decode(b, &s), AGOQ_COLL_SETTINGS_OK);
      assert_int_equal(s.version, AGOQ_COLL_HANDLE_VERSION);
      assert_int_equal(s.format, formats[f]);
      assert_int_equal(s.block, block);
      assert_true(s.min_bytes == 1099511627776ull);
      assert_true(s.chunk_bytes == 268435456ull);
      assert_int_equal(agoq_coll_settings_check(b, b), AGOQ_COLL_SETTINGS_OK);
    }
  }
}

/* Each kind of unusable block gets its own status, so the WARN can say what is wrong. */
static void test_settings_refused_by_kind(void** state) {
  (void)state;
  agoq_coll_config c = cfg_of(AGOQ_FORMAT_INT8, 128, 65536, 1 << 20);
  uint8_t mine[AGOQ_COLL_SETTINGS_SIZE], b[AGOQ_COLL_SETTINGS_SIZE];
  agoq_coll_settings_encode(&c, mine);
  agoq_coll_settings s;

  memset(b, 0, sizeof b); /* another plugin's handle: nothing there */
  assert_int_equal(agoq_coll_settings_decode(b, &s), AGOQ_COLL_SETTINGS_FOREIGN);
  assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_FOREIGN);

  /* Another layout version: its fields may be elsewhere, only the version is reported. */
  memcpy(b, mine, sizeof b);
  b[4] = AGOQ_COLL_HANDLE_VERSION + 1;
  assert_int_equal(agoq_coll_settings_decode(b, &s), AGOQ_COLL_SETTINGS_VERSION);
  assert_int_equal(s.version, AGOQ_COLL_HANDLE_VERSION + 1);
  assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_VERSION);
  b[4] = 0;
  assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_VERSION);

  /* Values no listen writes are never printed as if a user had set them. */
  memcpy(b, mine, sizeof b);
  b[5] = AGOQ_FORMAT_COUNT;
  assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_MALFORMED);
  const uint16_t bad_blocks[] = {0, 16, 100, 2048, 0xffff};
  for (size_t i = 0; i < sizeof bad_blocks / sizeof bad_blocks[0]; i++) {
    memcpy(b, mine, sizeof b);
    b[6] = (uint8_t)bad_blocks[i];
    b[7] = (uint8_t)(bad_blocks[i] >> 8);
    assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_MALFORMED);
  }
  memcpy(b, mine, sizeof b);
  b[28] = 2; /* AGOQ_COLLNET_PARTIALS has two values */
  assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_MALFORMED);
  memcpy(b, mine, sizeof b);
  b[29] = AGOQ_COLL_IO_MAX + 1; /* more I/O threads than AGOQ_COLLNET_IO_THREADS allows */
  assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_MALFORMED);
  for (int i = 30; i < AGOQ_COLL_SETTINGS_SIZE; i++) {
    memcpy(b, mine, sizeof b);
    b[i] = 1;
    assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_MALFORMED);
  }
  /* A grid has both dimensions or neither (automatic). */
  for (int i = 24; i < 28; i += 2) {
    memcpy(b, mine, sizeof b);
    b[i] = 4;
    assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_MALFORMED);
  }

  /* A well-formed block with another value is a mismatch. */
  c.chunk_bytes = 2 << 20;
  agoq_coll_settings_encode(&c, b);
  assert_int_equal(agoq_coll_settings_check(b, mine), AGOQ_COLL_SETTINGS_MISMATCH);
}

/* AGOQ_COLLNET_GRID travels in the block: automatic is 0x0, a given grid its two sizes;
 * a difference is a mismatch named as the user writes it. */
static void test_settings_grid(void** state) {
  (void)state;
  agoq_coll_config c = cfg_of(AGOQ_FORMAT_INT8, 128, 65536, 1 << 20);
  uint8_t autob[AGOQ_COLL_SETTINGS_SIZE], gridb[AGOQ_COLL_SETTINGS_SIZE];
  agoq_coll_settings_encode(&c, autob);
  c.grid_a = 65535;
  c.grid_b = 3;
  agoq_coll_settings_encode(&c, gridb);
  agoq_coll_settings sa, sg;
  assert_int_equal(agoq_coll_settings_decode(autob, &sa), AGOQ_COLL_SETTINGS_OK);
  assert_int_equal(agoq_coll_settings_decode(gridb, &sg), AGOQ_COLL_SETTINGS_OK);
  assert_int_equal(sa.grid_a, 0);
  assert_int_equal(sa.grid_b, 0);
  assert_int_equal(sg.grid_a, 65535);
  assert_int_equal(sg.grid_b, 3);
  assert_int_equal(agoq_coll_settings_check(gridb, autob), AGOQ_COLL_SETTINGS_MISMATCH);
  char msg[512];
  assert_int_equal(agoq_coll_settings_describe(&sg, 5, &sa, 0, msg, sizeof msg), 1);
  assert_string_equal(msg, "CollNet group: rank 5 has AGOQ_COLLNET_GRID=65535x3, this rank (0) has "
                           "AGOQ_COLLNET_GRID=auto; every rank must use the same value");
  /* AGOQ_COLLNET_PARTIALS travels at byte 28. */
  c.quant_partials = true;
  uint8_t qb[AGOQ_COLL_SETTINGS_SIZE];
  agoq_coll_settings_encode(&c, qb);
  agoq_coll_settings sq;
  assert_int_equal(agoq_coll_settings_decode(qb, &sq), AGOQ_COLL_SETTINGS_OK);
  assert_true(sq.quant_partials);
  assert_int_equal(agoq_coll_settings_describe(&sq, 2, &sg, 1, msg, sizeof msg), 1);
  assert_string_equal(msg, "CollNet group: rank 2 has AGOQ_COLLNET_PARTIALS=quantized, this rank (1) has "
                           "AGOQ_COLLNET_PARTIALS=fp32; every rank must use the same value");
  /* AGOQ_COLLNET_IO_THREADS travels at byte 29: the schedule's choice weighs it. */
  c.io_threads = AGOQ_COLL_IO_MAX;
  uint8_t ib[AGOQ_COLL_SETTINGS_SIZE];
  agoq_coll_settings_encode(&c, ib);
  assert_int_equal(ib[29], AGOQ_COLL_IO_MAX);
  agoq_coll_settings si;
  assert_int_equal(agoq_coll_settings_decode(ib, &si), AGOQ_COLL_SETTINGS_OK);
  assert_int_equal(si.io_threads, AGOQ_COLL_IO_MAX);
  assert_int_equal(agoq_coll_settings_check(ib, qb), AGOQ_COLL_SETTINGS_MISMATCH);
  assert_int_equal(agoq_coll_settings_describe(&si, 4, &sq, 0, msg, sizeof msg), 1);
  assert_string_equal(msg, "CollNet group: rank 4 has AGOQ_COLLNET_IO_THREADS=16, this rank (0) has "
                           "AGOQ_COLLNET_IO_THREADS=0; every rank must use the same value");
}

static void test_describe_one_variable(void** state) {
  (void)state;
  agoq_coll_settings int8 = settings_of(AGOQ_FORMAT_INT8, 128, 65536, 1 << 20);
  agoq_coll_settings int4 = settings_of(AGOQ_FORMAT_INT4, 128, 65536, 1 << 20);
  char msg[512];
  assert_int_equal(agoq_coll_settings_describe(&int4, 3, &int8, 0, msg, sizeof msg), 1);
  assert_string_equal(msg, "CollNet group: rank 3 has AGOQ_FORMAT=int4, this rank (0) has AGOQ_FORMAT=int8; "
                           "every rank must use the same value");
  /* The other side's WARN: the same variable, the values swapped. */
  assert_int_equal(agoq_coll_settings_describe(&int8, 0, &int4, 3, msg, sizeof msg), 1);
  assert_string_equal(msg, "CollNet group: rank 0 has AGOQ_FORMAT=int8, this rank (3) has AGOQ_FORMAT=int4; "
                           "every rank must use the same value");

  agoq_coll_settings b64 = settings_of(AGOQ_FORMAT_INT8, 64, 65536, 1 << 20);
  assert_int_equal(agoq_coll_settings_describe(&b64, 1, &int8, 0, msg, sizeof msg), 1);
  assert_string_equal(msg, "CollNet group: rank 1 has AGOQ_BLOCK=64, this rank (0) has AGOQ_BLOCK=128; "
                           "every rank must use the same value");
}

static void test_describe_every_variable(void** state) {
  (void)state;
  agoq_coll_settings a = settings_of(AGOQ_FORMAT_FP8E4M3, 32, 0, 4096);
  agoq_coll_settings b = settings_of(AGOQ_FORMAT_NONE, 1024, 65536, 1 << 20);
  char msg[512];
  assert_int_equal(agoq_coll_settings_describe(&a, 7, &b, 2, msg, sizeof msg), 4);
  assert_string_equal(msg,
                      "CollNet group: rank 7 has AGOQ_FORMAT=fp8e4m3 and AGOQ_BLOCK=32 and AGOQ_MIN_BYTES=0 and "
                      "AGOQ_COLLNET_CHUNK=4K (4096 bytes), this rank (2) has AGOQ_FORMAT=none and AGOQ_BLOCK=1024 "
                      "and AGOQ_MIN_BYTES=64K (65536 bytes) and AGOQ_COLLNET_CHUNK=1M (1048576 bytes); every rank "
                      "must use the same values");
  /* Two of four: only those are named, in the parameters' order. */
  agoq_coll_settings c = settings_of(AGOQ_FORMAT_NONE, 1024, 1000, 3ull << 20);
  assert_int_equal(agoq_coll_settings_describe(&c, 1, &b, 0, msg, sizeof msg), 2);
  assert_string_equal(msg, "CollNet group: rank 1 has AGOQ_MIN_BYTES=1000 and AGOQ_COLLNET_CHUNK=3M (3145728 bytes), "
                           "this rank (0) has AGOQ_MIN_BYTES=64K (65536 bytes) and AGOQ_COLLNET_CHUNK=1M (1048576 "
                           "bytes); every rank must use the same values");
}

/* Sizes as AGOQ_* SIZE values are written: the largest 1024-based suffix that divides. */
static void test_describe_sizes(void** state) {
  (void)state;
  static const struct {
    uint64_t bytes;
    const char* text;
  } cases[] = {
      {1, "1"},
      {1536, "1536"},
      {2048, "2K (2048 bytes)"},
      {1536ull << 10, "1536K (1572864 bytes)"},
      {1ull << 30, "1G (1073741824 bytes)"},
      {1ull << 40, "1T (1099511627776 bytes)"},
      {1ull << 50, "1024T (1125899906842624 bytes)"},
      {UINT64_MAX, "18446744073709551615"},
  };
  agoq_coll_settings zero = settings_of(AGOQ_FORMAT_INT8, 128, 0, 1 << 20);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    agoq_coll_settings s = settings_of(AGOQ_FORMAT_INT8, 128, cases[i].bytes, 1 << 20);
    char msg[512], want[512];
    assert_int_equal(agoq_coll_settings_describe(&s, 1, &zero, 0, msg, sizeof msg), 1);
    snprintf(want, sizeof want,
             "CollNet group: rank 1 has AGOQ_MIN_BYTES=%s, this rank (0) has AGOQ_MIN_BYTES=0; every rank must use "
             "the same value",
             cases[i].text);
    assert_string_equal(msg, want);
  }
}

static void test_describe_same_and_short_buffers(void** state) {
  (void)state;
  agoq_coll_settings a = settings_of(AGOQ_FORMAT_INT8, 128, 65536, 1 << 20);
  agoq_coll_settings b = settings_of(AGOQ_FORMAT_INT4, 64, 0, 4096);
  char msg[512];
  memset(msg, 'x', sizeof msg);
  assert_int_equal(agoq_coll_settings_describe(&a, 1, &a, 0, msg, sizeof msg), 0);
  assert_string_equal(msg, "");
  char full[512];
  assert_int_equal(agoq_coll_settings_describe(&a, 1, &b, 0, full, sizeof full), 4);
  /* Every length cuts the same text, always terminated, never past the buffer. */
  for (size_t len = 1; len <= strlen(full) + 1; len++) {
    memset(msg, 'x', sizeof msg);
    assert_int_equal(agoq_coll_settings_describe(&a, 1, &b, 0, msg, len), 4);
    assert_int_equal(strlen(msg), len - 1);
    assert_memory_equal(msg, full, len - 1);
    assert_int_equal(msg[len], 'x');
  }
  assert_int_equal(agoq_coll_settings_describe(&a, 1, &b, 0, NULL, 0), 4);
}

/* The rank block: a rate and zero padding; anything else is corrupt, never a rate. */
static void test_rank_block(void** state) {
  (void)state;
  uint8_t b[AGOQ_COLL_RANK_SIZE];
  uint32_t mbps = 7;
  agoq_coll_rank_encode(0, b);
  assert_true(agoq_coll_rank_decode(b, &mbps));
  assert_int_equal(mbps, 0);
  agoq_coll_rank_encode(400000, b);
  assert_true(agoq_coll_rank_decode(b, &mbps));
  assert_int_equal(mbps, 400000);
  agoq_coll_rank_encode(AGOQ_COLL_LINK_MBPS_MAX, b);
  assert_true(agoq_coll_rank_decode(b, &mbps));
  agoq_coll_rank_encode(AGOQ_COLL_LINK_MBPS_MAX + 1, b);
  assert_false(agoq_coll_rank_decode(b, &mbps));
  for (int i = 4; i < AGOQ_COLL_RANK_SIZE; i++) {
    agoq_coll_rank_encode(25000, b);
    b[i] = 1;
    mbps = 7;
    assert_false(agoq_coll_rank_decode(b, &mbps));
    assert_int_equal(mbps, 7);
  }
}

/* The group's rate: the slowest rank's, unknown (0) as soon as one rank's is, and the first
 * rank whose block is corrupt named. Mixed NICs are the real case: a 25G rank among 400G ones
 * sets the group's rate. */
static void test_rank_slowest(void** state) {
  (void)state;
  uint8_t h[3][128];
  void* hp[3] = {h[0], h[1], h[2]};
  memset(h, 0, sizeof h);
  agoq_coll_rank_encode(400000, h[0] + AGOQ_COLL_RANK_OFFSET);
  agoq_coll_rank_encode(25000, h[1] + AGOQ_COLL_RANK_OFFSET);
  agoq_coll_rank_encode(100000, h[2] + AGOQ_COLL_RANK_OFFSET);
  uint32_t mbps = 7;
  assert_int_equal(agoq_coll_rank_slowest(hp, 3, &mbps), -1);
  assert_int_equal(mbps, 25000);
  agoq_coll_rank_encode(0, h[2] + AGOQ_COLL_RANK_OFFSET);
  assert_int_equal(agoq_coll_rank_slowest(hp, 3, &mbps), -1);
  assert_int_equal(mbps, 0);
  h[1][AGOQ_COLL_RANK_OFFSET + 31] = 1;
  mbps = 7;
  assert_int_equal(agoq_coll_rank_slowest(hp, 3, &mbps), 1);
  assert_int_equal(mbps, 7);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_block),
      cmocka_unit_test(test_rank_slowest),
      cmocka_unit_test(test_settings_roundtrip),
      cmocka_unit_test(test_settings_refused_by_kind),
      cmocka_unit_test(test_settings_grid),
      cmocka_unit_test(test_describe_one_variable),
      cmocka_unit_test(test_describe_every_variable),
      cmocka_unit_test(test_describe_sizes),
      cmocka_unit_test(test_describe_same_and_short_buffers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
