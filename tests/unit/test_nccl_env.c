/* NCCL's variables read as NCCL 2.28.9 reads them: NCCL_PARAM integers (ncclLoadParam:
 * empty = unset, strtoll(value, NULL, 0) on the prefix, a range error = the default),
 * communicator-config overrides (init.cc: (int)strtol, any set value counts) and
 * NCCL_DEBUG's level names (debug.cc). The expected values are NCCL's rules written out,
 * not computed with strtoll here. */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "abi/agoq_nccl_common.h"
#include "core/agoq_log.h"
#include "core/agoq_nccl_env.h"

#define DEF 16384

static void test_param_parse_table(void** state) {
  (void)state;
  static const struct {
    const char* value;
    int64_t want;
  } cases[] = {
      {NULL, DEF},                     /* unset */
      {"", DEF},                       /* empty = unset */
      {"1048576", 1048576},
      {"1048576 ", 1048576},           /* trailing space: the prefix counts */
      {"1048576\n", 1048576},
      {" 12", 12},                     /* leading white space skipped */
      {"\t 12", 12},
      {"+7", 7},
      {"0x10", 16},                    /* base 0: hex */
      {"0X1f", 31},
      {"010", 8},                      /* base 0: a leading 0 is octal */
      {"09", 0},                       /* octal stops at the 9 */
      {"0", 0},
      {"abc", 0},                      /* no digits: 0, and no errno, so not the default */
      {" ", 0},                        /* not empty: converted, to 0 */
      {"12abc", 12},
      {"1M", 1},                       /* no unit suffixes in NCCL */
      {"-1", -1},                      /* negatives stand */
      {"-16384", -16384},
      {"9223372036854775807", INT64_MAX},
      {"-9223372036854775808", INT64_MIN},
      {"9223372036854775808", DEF},    /* overflow: ERANGE, the default */
      {"99999999999999999999", DEF},
      {"-99999999999999999999", DEF},
      {"0xffffffffffffffffff", DEF},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t got = agoq_nccl_param_parse(cases[i].value, DEF);
    if (got != cases[i].want)
      fail_msg("\"%s\": got %lld, NCCL reads %lld", cases[i].value ? cases[i].value : "(unset)",
               (long long)got, (long long)cases[i].want);
  }
  /* errno is the caller's again afterwards. */
  errno = EINTR;
  (void)agoq_nccl_param_parse("99999999999999999999", DEF);
  assert_int_equal(errno, EINTR);
}

static void test_param_from_environment(void** state) {
  (void)state;
  unsetenv("AGOQ_TEST_NCCL_X");
  assert_int_equal(agoq_nccl_param("AGOQ_TEST_NCCL_X", 5), 5);
  assert_null(agoq_nccl_env_str("AGOQ_TEST_NCCL_X"));
  setenv("AGOQ_TEST_NCCL_X", "", 1);
  assert_int_equal(agoq_nccl_param("AGOQ_TEST_NCCL_X", 5), 5);
  assert_non_null(agoq_nccl_env_str("AGOQ_TEST_NCCL_X")); /* set, empty: a string */
  assert_string_equal(agoq_nccl_env_str("AGOQ_TEST_NCCL_X"), "");
  setenv("AGOQ_TEST_NCCL_X", "1048576 ", 1);
  assert_int_equal(agoq_nccl_param("AGOQ_TEST_NCCL_X", 5), 1048576);
  unsetenv("AGOQ_TEST_NCCL_X");
  assert_null(agoq_nccl_env_str(NULL));
}

static void test_config_int(void** state) {
  (void)state;
  const int undef = INT_MIN; /* NCCL_CONFIG_UNDEF_INT */
  static const struct {
    const char* value;
    int want;
  } cases[] = {
      {"1", 1}, {" 1", 1}, {"1 ", 1}, {"0x1", 1}, {"01", 1},
      {"0", 0}, {"", 0},   {"abc", 0}, {"2", 2},  {"-1", -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (agoq_nccl_config_int_parse(cases[i].value, undef) != cases[i].want)
      fail_msg("\"%s\": NCCL reads %d", cases[i].value, cases[i].want);
  assert_int_equal(agoq_nccl_config_int_parse(NULL, undef), undef);
  unsetenv("AGOQ_TEST_NCCL_Y");
  assert_int_equal(agoq_nccl_config_int("AGOQ_TEST_NCCL_Y", undef), undef);
  setenv("AGOQ_TEST_NCCL_Y", "1\n", 1);
  assert_int_equal(agoq_nccl_config_int("AGOQ_TEST_NCCL_Y", undef), 1);
  unsetenv("AGOQ_TEST_NCCL_Y");
}

static void test_debug_level(void** state) {
  (void)state;
  assert_int_equal(agoq_nccl_debug_level_parse(NULL), NCCL_LOG_NONE);
  assert_int_equal(agoq_nccl_debug_level_parse("VERSION"), NCCL_LOG_VERSION);
  assert_int_equal(agoq_nccl_debug_level_parse("warn"), NCCL_LOG_WARN);
  assert_int_equal(agoq_nccl_debug_level_parse("Info"), NCCL_LOG_INFO);
  assert_int_equal(agoq_nccl_debug_level_parse("ABORT"), NCCL_LOG_ABORT);
  assert_int_equal(agoq_nccl_debug_level_parse("trace"), NCCL_LOG_TRACE);
  /* Anything else is below NONE for NCCL: nothing printed. */
  assert_int_equal(agoq_nccl_debug_level_parse(""), -1);
  assert_int_equal(agoq_nccl_debug_level_parse("NONE"), -1);
  assert_int_equal(agoq_nccl_debug_level_parse("INFO "), -1);
  assert_int_equal(agoq_nccl_debug_level_parse("1"), -1);
}

/* What the stderr logger (agoq's tools, no NCCL) prints for one WARN and one INFO under a
 * given NCCL_DEBUG (NULL: unset): 0, 1 (WARN) or 2 lines. */
static int stderr_lines(const char* nccl_debug) {
  if (nccl_debug != NULL)
    setenv("NCCL_DEBUG", nccl_debug, 1);
  else
    unsetenv("NCCL_DEBUG");
  FILE* tmp = tmpfile();
  assert_non_null(tmp);
  fflush(stderr);
  int saved = dup(2);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(tmp), 2) >= 0);
  AGOQ_WARN("probe warn");
  AGOQ_INFO(NCCL_INIT, "probe info");
  fflush(stderr);
  assert_true(dup2(saved, 2) >= 0);
  close(saved);
  rewind(tmp);
  int lines = 0;
  char buf[512];
  while (fgets(buf, sizeof buf, tmp) != NULL)
    if (strstr(buf, "probe") != NULL) lines++;
  fclose(tmp);
  return lines;
}

/* NCCL_DEBUG is read as NCCL reads it: its names without case; anything else silences, as
 * in NCCL. Unset, agoq's tools still print WARN (NCCL would print nothing: a tool's errors
 * must be seen). AGOQ_DEBUG, agoq's own, is set by CTest: unset it here. */
static void test_log_reads_nccl_debug(void** state) {
  (void)state;
  char* agoq_debug = getenv("AGOQ_DEBUG") != NULL ? strdup(getenv("AGOQ_DEBUG")) : NULL;
  unsetenv("AGOQ_DEBUG");
  agoq_log_set_logger(NULL);
  assert_int_equal(stderr_lines(NULL), 1);
  assert_int_equal(stderr_lines("WARN"), 1);
  assert_int_equal(stderr_lines("info"), 2);
  assert_int_equal(stderr_lines("ABORT"), 2); /* above INFO in NCCL's order */
  assert_int_equal(stderr_lines("VERSION"), 0);
  assert_int_equal(stderr_lines("bogus"), 0);
  assert_int_equal(stderr_lines(""), 0);
  assert_int_equal(stderr_lines("NONE"), 0);
  unsetenv("NCCL_DEBUG");
  if (agoq_debug != NULL) setenv("AGOQ_DEBUG", agoq_debug, 1);
  free(agoq_debug);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_param_parse_table),
      cmocka_unit_test(test_param_from_environment),
      cmocka_unit_test(test_config_int),
      cmocka_unit_test(test_debug_level),
      cmocka_unit_test(test_log_reads_nccl_debug),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
