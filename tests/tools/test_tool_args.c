/* Strict command-line numbers (tools/common/agoq_args.h) and agoq-perf's flags: nccl-tests'
 * short letters and today's long options give the same options. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_args.h"
#include "perf.h"
#include "perf_coll.h"

static void test_args_whole_string(void** state) {
  (void)state;
  long long v = 42;
  assert_int_equal(agoq_args_parse_ll("12", 0, 100, &v), 0);
  assert_int_equal(v, 12);
  assert_int_equal(agoq_args_parse_ll("-5", -10, 10, &v), 0);
  assert_int_equal(v, -5);
  assert_int_equal(agoq_args_parse_ll("0x10", 0, 100, &v), 0);
  assert_int_equal(v, 16);
  assert_int_equal(agoq_args_parse_ll("010", 0, 100, &v), 0); /* decimal, never octal */
  assert_int_equal(v, 10);
  v = 42;
  const char* bad[] = {"", "abc", "1x", "12 ", " 12", "+1", "0x", "--1", "1.5", "1e3", "9223372036854775808"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(agoq_args_parse_ll(bad[i], LLONG_MIN, LLONG_MAX, &v), -1);
    assert_int_equal(v, 42); /* untouched */
  }
  assert_int_equal(agoq_args_parse_ll(NULL, 0, 1, &v), -1);
  assert_int_equal(agoq_args_parse_ll("101", 0, 100, &v), -1); /* range */
  assert_int_equal(agoq_args_parse_ll("-1", 0, 100, &v), -1);
  assert_int_equal(agoq_args_parse_ll("-9223372036854775808", LLONG_MIN, 0, &v), 0);
  assert_true(v == LLONG_MIN);
}

static void test_args_unsigned_and_double(void** state) {
  (void)state;
  unsigned long long u = 7;
  assert_int_equal(agoq_args_parse_ull("18446744073709551615", UINT64_MAX, &u), 0);
  assert_true(u == UINT64_MAX);
  assert_int_equal(agoq_args_parse_ull("0xdeadBEEF", UINT64_MAX, &u), 0);
  assert_true(u == 0xdeadbeefull);
  assert_int_equal(agoq_args_parse_ull("-1", UINT64_MAX, &u), -1); /* strtoull would wrap it */
  assert_int_equal(agoq_args_parse_ull("18446744073709551616", UINT64_MAX, &u), -1);
  assert_int_equal(agoq_args_parse_ull("abc", UINT64_MAX, &u), -1);
  double d = 0;
  assert_int_equal(agoq_args_parse_double("0.25", 0, 1, &d), 0);
  assert_true(d == 0.25);
  assert_int_equal(agoq_args_parse_double("1e-3", 0, 1, &d), 0);
  assert_int_equal(agoq_args_parse_double("nan", -1e300, 1e300, &d), -1);
  assert_int_equal(agoq_args_parse_double("inf", -1e300, 1e300, &d), -1);
  assert_int_equal(agoq_args_parse_double("0.5x", 0, 1, &d), -1);
  assert_int_equal(agoq_args_parse_double(" 0.5", 0, 1, &d), -1);
  assert_int_equal(agoq_args_parse_double("2", 0, 1, &d), -1);
}

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])) - 1)

static void test_perf_p2p_both_spellings(void** state) {
  (void)state;
  char* s[] = {"p2p", "-b", "8", "-e", "1M", "-f", "4", "-n", "7", "-w", "3", "-c", "1", "-d", "bf16",
                  "--max-rel-l2", "0.01", NULL};
  char* l[] = {"p2p", "--minbytes", "8", "--maxbytes", "1M", "--stepfactor", "4", "--iters", "7",
                  "--warmup_iters", "3", "--check", "1", "--dtype", "bf16", "--max-rel-l2=0.01", NULL};
  char* g[] = {"p2p", "-b8", "-e1M", "-f4", "-n7", "-w3", "-c1", "--datatype=bfloat16", "--max-rel-l2", "0.01", NULL};
  perf_opts a, b, c;
  assert_int_equal(perf_opts_parse(ARGC(s), s, "p2p", &a), 0);
  assert_int_equal(perf_opts_parse(ARGC(l), l, "p2p", &b), 0);
  assert_int_equal(perf_opts_parse(ARGC(g), g, "p2p", &c), 0);
  const perf_opts* all[] = {&a, &b, &c};
  for (int i = 0; i < 3; i++) {
    const perf_opts* o = all[i];
    assert_int_equal(o->min_bytes, 8);
    assert_int_equal(o->max_bytes, 1 << 20);
    assert_true(o->factor == 4.0);
    assert_int_equal(o->iters, 7);
    assert_int_equal(o->warmup, 3);
    assert_true(o->check);
    assert_int_equal(o->dtype, ncclBfloat16);
    assert_true(o->max_rel_l2 == 0.01);
  }
  /* -c 0 is nccl-tests' "no check"; a bare -c (our older spelling) is -c 1. */
  char* off[] = {"p2p", "-c", "0", NULL};
  assert_int_equal(perf_opts_parse(ARGC(off), off, "p2p", &a), 0);
  assert_false(a.check);
  char* bare[] = {"p2p", "-c", "--json", NULL};
  assert_int_equal(perf_opts_parse(ARGC(bare), bare, "p2p", &a), 0);
  assert_true(a.check);
  assert_true(a.json);
  char* last[] = {"p2p", "-c", NULL};
  assert_int_equal(perf_opts_parse(ARGC(last), last, "p2p", &a), 0);
  assert_true(a.check);
}

static void test_perf_p2p_rejects(void** state) {
  (void)state;
  /* -t is nccl-tests' threads per process, not the datatype any more; strict numbers. */
  char* bad[][3] = {{"-t", "bf16"},  {"-t", "2"},       {"--iters", "1x"}, {"-n", "abc"},
                    {"-w", ""},      {"-c", "yes"},     {"-f", "1"},       {"--inflight", "33"},
                    {"-N", "3"},     {"--max-rel-l2", "-1"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char* argv[] = {"p2p", bad[i][0], bad[i][1], NULL};
    perf_opts o;
    assert_int_equal(perf_opts_parse(ARGC(argv), argv, "p2p", &o), -1);
  }
  char* one[] = {"p2p", "-t", "1", "-g", "1", "-N", "2", NULL};
  perf_opts o;
  assert_int_equal(perf_opts_parse(ARGC(one), one, "p2p", &o), 0);
  char* l2[] = {"p2p", "--max-rel-l2", "0.1", NULL}; /* needs a datatype */
  assert_int_equal(perf_opts_parse(ARGC(l2), l2, "p2p", &o), -1);
}

static void test_perf_coll_both_spellings(void** state) {
  (void)state;
  char* s[] = {"p2p", "-N", "4", "-n", "3", "-w", "1", "-d", "fp16", "-o", "max", "-b", "1K", "-e", "4K",
                  "-c", "1", NULL};
  char* l[] = {"p2p", "--nranks", "4", "--iters", "3", "--warmup_iters", "1", "--dtype", "fp16", "--op",
                  "max", "--minbytes", "1K", "--maxbytes", "4K", "--check=1", NULL};
  perf_coll_opts a, b;
  assert_int_equal(perf_coll_opts_parse(ARGC(s), s, PERF_COLL_ALLREDUCE, &a), 0);
  assert_int_equal(perf_coll_opts_parse(ARGC(l), l, PERF_COLL_ALLREDUCE, &b), 0);
  const perf_coll_opts* all[] = {&a, &b};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(all[i]->nranks, 4);
    assert_int_equal(all[i]->iters, 3);
    assert_int_equal(all[i]->warmup, 1);
    assert_int_equal(all[i]->dtype, ncclFloat16);
    assert_int_equal(all[i]->op, ncclMax);
    assert_int_equal(all[i]->min_bytes, 1024);
    assert_int_equal(all[i]->max_bytes, 4096);
  }
  char* bad[][3] = {{"-t", "bf16"}, {"-c", "0"}, {"--iters", "1x"}, {"-N", "0"}, {"--seed", "-1"},
                    {"--max-rel-l2", "abc"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char* argv[] = {"allreduce", bad[i][0], bad[i][1], NULL};
    perf_coll_opts o;
    assert_int_equal(perf_coll_opts_parse(ARGC(argv), argv, PERF_COLL_ALLREDUCE, &o), -1);
  }
}

/* Every message that reports an NCCL result names it and keeps its number. */
static void test_result_str(void** state) {
  (void)state;
  assert_string_equal(agoq_result_str(ncclRemoteError), "ncclRemoteError, 6: a peer failed or a connection broke");
  for (int r = ncclSuccess; r < ncclNumResults; r++) {
    const char* s = agoq_result_str((ncclResult_t)r);
    char num[16];
    snprintf(num, sizeof num, ", %d: ", r);
    assert_true(strncmp(s, "nccl", 4) == 0);
    assert_non_null(strstr(s, num));
  }
  assert_string_equal(agoq_result_str((ncclResult_t)42), "unknown result 42");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_args_whole_string),
      cmocka_unit_test(test_args_unsigned_and_double),
      cmocka_unit_test(test_perf_p2p_both_spellings),
      cmocka_unit_test(test_perf_p2p_rejects),
      cmocka_unit_test(test_perf_coll_both_spellings),
      cmocka_unit_test(test_result_str),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
