/*
 * AGOQ_* parameters: the parser of each type, the table's own defaults, the environment
 * (own variable, NCCL fallback, empty = unset), error reporting and load-once semantics.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/agoq_log.h"
#include "core/agoq_params.h"

/* ---- Log capture --------------------------------------------------------------------- */

#define CAPTURE_MAX 64

typedef struct {
  ncclDebugLogLevel level;
  unsigned long flags;
  char msg[1024];
} captured_line;

static pthread_mutex_t capture_mutex = PTHREAD_MUTEX_INITIALIZER;
static captured_line captured[CAPTURE_MAX];
static int captured_count;

static void capture_logger(ncclDebugLogLevel level, unsigned long flags, const char* file,
                           int line, const char* fmt, ...) __attribute__((format(printf, 5, 6)));
static void capture_logger(ncclDebugLogLevel level, unsigned long flags, const char* file,
                           int line, const char* fmt, ...) {
  pthread_mutex_lock(&capture_mutex);
  if (captured_count < CAPTURE_MAX) {
    captured_line* c = &captured[captured_count++];
    c->level = level;
    c->flags = flags;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&capture_mutex);
}

static int count_lines(ncclDebugLogLevel level, const char* needle) {
  int n = 0;
  for (int i = 0; i < captured_count; i++)
    if (captured[i].level == level && strstr(captured[i].msg, needle) != NULL) n++;
  return n;
}

/* ---- Fixture ------------------------------------------------------------------------- */

/* The test runs in whatever environment CTest or a developer gave it; every variable the
 * table reads is cleared so only what a test sets counts. */
static void clear_param_env(void) {
  for (int id = 0; id < AGOQ_PARAM_COUNT; id++) {
    const agoq_param_desc* d = agoq_param_describe((agoq_param_id)id);
    unsetenv(d->name);
    if (d->nccl_fallback != NULL) unsetenv(d->nccl_fallback);
  }
}

static int setup(void** state) {
  (void)state;
  clear_param_env();
  agoq_params_reset();
  captured_count = 0;
  agoq_log_set_logger(capture_logger);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  clear_param_env();
  agoq_params_reset();
  agoq_log_set_logger(NULL);
  return 0;
}

static const agoq_param_desc* desc_of(agoq_param_id id) {
  const agoq_param_desc* d = agoq_param_describe(id);
  assert_non_null(d);
  return d;
}

static void expect_ok(const agoq_param_desc* d, const char* text, int64_t want) {
  int64_t v = -12345;
  char err[256];
  ncclResult_t r = agoq_param_parse(d, text, &v, err, sizeof err);
  if (r != ncclSuccess) fail_msg("%s: \"%s\" rejected: %s", d->name, text, err);
  if (v != want) fail_msg("%s: \"%s\" parsed as %lld, want %lld", d->name, text, (long long)v,
                          (long long)want);
}

static void expect_bad(const agoq_param_desc* d, const char* text) {
  int64_t v = -12345;
  char err[256];
  ncclResult_t r = agoq_param_parse(d, text, &v, err, sizeof err);
  if (r != ncclInvalidUsage)
    fail_msg("%s: \"%s\" accepted (%lld), want ncclInvalidUsage", d->name, text, (long long)v);
  assert_int_equal(v, -12345);
  /* Every rejection names the variable. */
  assert_non_null(strstr(err, d->name));
}

static const agoq_param_desc wide_int = {"AGOQ_TEST_WIDE", AGOQ_PARAM_TYPE_INT, "0", INT64_MIN,
                                         INT64_MAX, NULL, NULL, "test"};
static const agoq_param_desc wide_size = {"AGOQ_TEST_SIZE", AGOQ_PARAM_TYPE_SIZE, "0", 0,
                                          INT64_MAX, NULL, NULL, "test"};

/* A size with keywords: a number, or the k-th keyword as -(k + 1); nothing else. */
static void test_size_keyword(void** state) {
  (void)state;
  const agoq_param_desc* d = desc_of(AGOQ_PARAM_SOCKET_SNDBUF); /* [0, 1G] or auto */
  expect_ok(d, "auto", -1);
  expect_ok(d, " AUTO ", -1);
  expect_ok(d, "0", 0);
  expect_ok(d, "256K", 256 << 10);
  const char* bad[] = {"automatic", "au", "-1", "auto1", "2G", "", "auto,0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_bad(d, bad[i]);
  int64_t v;
  char err[256];
  assert_int_equal(agoq_param_parse(d, "x", &v, err, sizeof err), ncclInvalidUsage);
  assert_non_null(strstr(err, "or auto")); /* the message offers the keyword */
  /* A size without keywords has no such value. */
  expect_bad(&wide_size, "auto");
}

/* ---- INT ----------------------------------------------------------------------------- */

static void test_int_valid(void** state) {
  (void)state;
  const agoq_param_desc* d = desc_of(AGOQ_PARAM_SOCKET_NSOCKS); /* [0, 64] */
  expect_ok(d, "0", 0);
  expect_ok(d, "64", 64);
  expect_ok(d, "+7", 7);
  expect_ok(d, "-0", 0);
  expect_ok(d, "007", 7);
  expect_ok(d, "  12\t\n", 12);
  expect_ok(&wide_int, "9223372036854775807", INT64_MAX);
  expect_ok(&wide_int, "-9223372036854775808", INT64_MIN);
  expect_ok(&wide_int, "-42", -42);
}

static void test_int_invalid(void** state) {
  (void)state;
  const agoq_param_desc* d = desc_of(AGOQ_PARAM_SOCKET_NSOCKS);
  const char* bad[] = {"65", "-1", "0x10", "1e3", "12abc", "", "   ", "+", "-", "--1", "+-1",
                       "1 2", "4K", "1.0", "99999999999999999999", "٣"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_bad(d, bad[i]);
  expect_bad(&wide_int, "9223372036854775808");
  expect_bad(&wide_int, "-9223372036854775809");
  expect_bad(&wide_int, "99999999999999999999");
  expect_bad(&wide_int, "-99999999999999999999");
}

static void test_int_message(void** state) {
  (void)state;
  int64_t v;
  char err[256];
  assert_int_equal(agoq_param_parse(desc_of(AGOQ_PARAM_SOCKET_NSOCKS), "99", &v, err, sizeof err),
                   ncclInvalidUsage);
  assert_string_equal(err, "AGOQ_SOCKET_NSOCKS=\"99\": expected an integer in [0, 64]");
}

/* ---- SIZE ---------------------------------------------------------------------------- */

static void test_size_valid(void** state) {
  (void)state;
  expect_ok(&wide_size, "0", 0);
  expect_ok(&wide_size, "4096", 4096);
  expect_ok(&wide_size, "4096B", 4096);
  expect_ok(&wide_size, "64K", 64 << 10);
  expect_ok(&wide_size, "64k", 64 << 10);
  expect_ok(&wide_size, "64KB", 64 << 10);
  expect_ok(&wide_size, "64kb", 64 << 10);
  expect_ok(&wide_size, "64KiB", 64 << 10);
  expect_ok(&wide_size, "64kIb", 64 << 10);
  expect_ok(&wide_size, "3M", 3 << 20);
  expect_ok(&wide_size, "2g", 2LL << 30);
  expect_ok(&wide_size, "1TiB", 1LL << 40);
  expect_ok(&wide_size, " 1G ", 1LL << 30);
  expect_ok(&wide_size, "9223372036854775807", INT64_MAX);
  /* The largest multiple of 1 TiB that fits in int64. */
  expect_ok(&wide_size, "8388607T", 8388607LL << 40);
}

static void test_size_invalid(void** state) {
  (void)state;
  const char* bad[] = {"", "K", "-1", "+1", "64X", "64P", "4096iB", "64KK", "64KBB", "64 K",
                       "1.5M", "0x1000", "1e6", "64Kib2", "9223372036854775808",
                       "99999999999999999999", "8388608T", "8796093022208M",
                       "9007199254740992K",
                       /* Shifts that would wrap past 2^64 back to a small positive size. */
                       "16777217T", "18014398509481985K", "17592186044417M"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_bad(&wide_size, bad[i]);
}

static void test_size_range(void** state) {
  (void)state;
  const agoq_param_desc* d = desc_of(AGOQ_PARAM_SOCKET_MIN_CHUNK); /* [4096, 1 GiB] */
  expect_ok(d, "4096", 4096);
  expect_ok(d, "4K", 4096);
  expect_ok(d, "1G", 1LL << 30);
  expect_ok(d, "1073741824", 1LL << 30);
  expect_bad(d, "4095");
  expect_bad(d, "3K");
  expect_bad(d, "1073741825");
  expect_bad(d, "1025M");
  expect_bad(d, "1T");
  expect_bad(d, "0");
}

/* ---- BOOL, ENUM, STRING -------------------------------------------------------------- */

static void test_bool(void** state) {
  (void)state;
  const agoq_param_desc d = {"AGOQ_TEST_BOOL", AGOQ_PARAM_TYPE_BOOL, "0", 0, 0, NULL, NULL, "t"};
  const char* yes[] = {"1", "true", "TRUE", "True", "yes", "YES", "on", "On", " on\t"};
  const char* no[] = {"0", "false", "FALSE", "no", "No", "off", "OFF", " 0 "};
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) expect_ok(&d, yes[i], 1);
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) expect_ok(&d, no[i], 0);
  const char* bad[] = {"", "2", "-1", "y", "n", "t", "tru", "truee", "enabled", "00", "0x1",
                       "on off"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_bad(&d, bad[i]);
}

static void test_enum(void** state) {
  (void)state;
  const agoq_param_desc* d = desc_of(AGOQ_PARAM_SOCKET_FAMILY); /* auto|ipv4|ipv6 */
  expect_ok(d, "auto", 0);
  expect_ok(d, "ipv4", 1);
  expect_ok(d, "ipv6", 2);
  expect_ok(d, "IPv6", 2);
  expect_ok(d, " AUTO ", 0);
  const char* bad[] = {"", "ipv", "ipv44", "ipv5", "auto|ipv4", "|", "auto ipv4", "1", "0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_bad(d, bad[i]);
  int64_t v;
  char err[256];
  assert_int_equal(agoq_param_parse(d, "ipv5", &v, err, sizeof err), ncclInvalidUsage);
  assert_non_null(strstr(err, "auto|ipv4|ipv6"));
}

static void test_string(void** state) {
  (void)state;
  const agoq_param_desc* d = desc_of(AGOQ_PARAM_SOCKET_IFNAME);
  char text[300];
  expect_ok(d, "", 0);
  expect_ok(d, "^docker,lo", 0);
  memset(text, 'e', 255);
  text[255] = '\0';
  expect_ok(d, text, 0);
  /* Surrounding blanks do not count against the limit. */
  char padded[320];
  snprintf(padded, sizeof padded, "  %s  ", text);
  expect_ok(d, padded, 0);
  memset(text, 'e', 256);
  text[256] = '\0';
  expect_bad(d, text);
}

/* ---- Messages ------------------------------------------------------------------------ */

static void test_message_truncation(void** state) {
  (void)state;
  const agoq_param_desc* d = desc_of(AGOQ_PARAM_SOCKET_NSOCKS);
  char value[200];
  memset(value, '7', sizeof value - 1);
  value[sizeof value - 1] = '\0';
  int64_t v;
  char err[256];
  assert_int_equal(agoq_param_parse(d, value, &v, err, sizeof err), ncclInvalidUsage);
  /* The quoted value is cut and marked, and the allowed range still follows it. */
  assert_non_null(strstr(err, "...\": expected an integer in [0, 64]"));
  assert_true(strlen(err) < 160);

  /* Control characters cannot reach the log line. */
  assert_int_equal(agoq_param_parse(d, "1\n\x1b[2J", &v, err, sizeof err), ncclInvalidUsage);
  assert_null(strchr(err, '\n'));
  assert_null(strchr(err, '\x1b'));

  /* A tiny buffer is filled and terminated, never overrun. */
  char tiny[12];
  memset(tiny, 'X', sizeof tiny);
  assert_int_equal(agoq_param_parse(d, "99", &v, tiny, 8), ncclInvalidUsage);
  assert_int_equal(strlen(tiny), 7);
  assert_int_equal(tiny[8], 'X');
  assert_int_equal(agoq_param_parse(d, "99", &v, NULL, 0), ncclInvalidUsage);
  assert_int_equal(agoq_param_parse(d, NULL, &v, tiny, sizeof tiny), ncclInternalError);
  assert_int_equal(agoq_param_parse(NULL, "1", &v, tiny, sizeof tiny), ncclInternalError);
}

/* ---- The table ----------------------------------------------------------------------- */

static void test_table_defaults(void** state) {
  (void)state;
  assert_true(AGOQ_PARAM_COUNT > 0);
  for (int id = 0; id < AGOQ_PARAM_COUNT; id++) {
    const agoq_param_desc* d = desc_of((agoq_param_id)id);
    assert_non_null(d->name);
    assert_int_equal(strncmp(d->name, "AGOQ_", 5), 0);
    assert_non_null(d->default_value);
    assert_non_null(d->doc);
    assert_true(strlen(d->doc) > 10);
    if (d->nccl_fallback != NULL) assert_int_equal(strncmp(d->nccl_fallback, "NCCL_", 5), 0);
    int64_t v = 0;
    char err[256];
    if (agoq_param_parse(d, d->default_value, &v, err, sizeof err) != ncclSuccess)
      fail_msg("default of %s does not parse: %s", d->name, err);
    switch (d->type) {
      case AGOQ_PARAM_TYPE_INT:
        assert_true(d->min <= d->max);
        /* Signed comparison: cmocka's assert_in_range works on unsigned values. */
        if (v < d->min || v > d->max) fail_msg("default of %s is out of range", d->name);
        assert_null(d->choices);
        break;
      case AGOQ_PARAM_TYPE_SIZE:
        assert_true(d->min <= d->max);
        /* In range, or one of the size's keywords (negative, only where it has some). */
        if ((v < d->min || v > d->max) && !(d->choices != NULL && v < 0))
          fail_msg("default of %s is out of range", d->name);
        break;
      case AGOQ_PARAM_TYPE_ENUM:
        assert_non_null(d->choices);
        assert_true(v >= 0);
        break;
      case AGOQ_PARAM_TYPE_BOOL:
        assert_true(v == 0 || v == 1);
        break;
      case AGOQ_PARAM_TYPE_STRING:
        break;
    }
    /* Names are unique. */
    for (int other = 0; other < id; other++)
      assert_string_not_equal(d->name, desc_of((agoq_param_id)other)->name);
  }
  assert_null(agoq_param_describe(AGOQ_PARAM_COUNT));
  assert_null(agoq_param_describe((agoq_param_id)-1));
}

static void test_type_names(void** state) {
  (void)state;
  assert_string_equal(agoq_param_type_name(AGOQ_PARAM_TYPE_INT), "int");
  assert_string_equal(agoq_param_type_name(AGOQ_PARAM_TYPE_SIZE), "size");
  assert_string_equal(agoq_param_type_name(AGOQ_PARAM_TYPE_BOOL), "bool");
  assert_string_equal(agoq_param_type_name(AGOQ_PARAM_TYPE_STRING), "string");
  assert_string_equal(agoq_param_type_name(AGOQ_PARAM_TYPE_ENUM), "enum");
}

/* ---- Loading from the environment ---------------------------------------------------- */

static void test_load_defaults(void** state) {
  (void)state;
  assert_int_equal(agoq_params_load(), ncclSuccess);
  for (int id = 0; id < AGOQ_PARAM_COUNT; id++) {
    const agoq_param_desc* d = desc_of((agoq_param_id)id);
    assert_string_equal(agoq_param_source((agoq_param_id)id), "default");
    assert_string_equal(agoq_param_str((agoq_param_id)id), d->default_value);
  }
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_MIN_CHUNK), 64 << 10);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_FAMILY), 0);
  assert_int_equal(captured_count, 0);
}

static void test_load_env(void** state) {
  (void)state;
  setenv("AGOQ_SOCKET_NSOCKS", " 8 ", 1);
  setenv("AGOQ_SOCKET_FAMILY", "IPv6", 1);
  setenv("AGOQ_SOCKET_INLINE", "2k", 1);
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS), 8);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_FAMILY), 2);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_INLINE), 2048);
  assert_string_equal(agoq_param_str(AGOQ_PARAM_SOCKET_INLINE), "2k");
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_NSOCKS), "AGOQ_SOCKET_NSOCKS");
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_NTHREADS), "default");
  /* NCCL's wording, under NCCL_ENV, once per variable taken from the environment. */
  assert_int_equal(count_lines(NCCL_LOG_INFO, "NET/AGOQ AGOQ_SOCKET_NSOCKS set by environment to 8."), 1);
  assert_int_equal(count_lines(NCCL_LOG_INFO, "AGOQ_SOCKET_FAMILY set by environment to IPv6."), 1);
  assert_int_equal(count_lines(NCCL_LOG_INFO, "set by environment"), 3);
  for (int i = 0; i < captured_count; i++) assert_int_equal(captured[i].flags, NCCL_ENV);
}

static void test_empty_is_unset(void** state) {
  (void)state;
  setenv("AGOQ_SOCKET_NSOCKS", "", 1);
  setenv("AGOQ_SOCKET_FAMILY", "  ", 1);
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS), 0);
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_NSOCKS), "default");
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_FAMILY), "default");
  assert_int_equal(captured_count, 0);
}

static void test_nccl_fallback(void** state) {
  (void)state;
  /* Ours unset: NCCL's variable is honoured and named as the source. */
  setenv("NCCL_SOCKET_IFNAME", "=eth0", 1);
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_string_equal(agoq_param_str(AGOQ_PARAM_SOCKET_IFNAME), "=eth0");
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_IFNAME), "NCCL_SOCKET_IFNAME");
  assert_int_equal(count_lines(NCCL_LOG_INFO, "NCCL_SOCKET_IFNAME set by environment to =eth0."), 1);

  /* Ours set: NCCL's variable is ignored. */
  agoq_params_reset();
  setenv("AGOQ_SOCKET_IFNAME", "ib", 1);
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_string_equal(agoq_param_str(AGOQ_PARAM_SOCKET_IFNAME), "ib");
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_IFNAME), "AGOQ_SOCKET_IFNAME");

  /* Ours empty counts as unset, so NCCL's applies again. */
  agoq_params_reset();
  setenv("AGOQ_SOCKET_IFNAME", "", 1);
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_string_equal(agoq_param_str(AGOQ_PARAM_SOCKET_IFNAME), "=eth0");
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_IFNAME), "NCCL_SOCKET_IFNAME");

  /* A fallback value is validated like ours, and the message names NCCL's variable. */
  agoq_params_reset();
  captured_count = 0;
  char longname[300];
  memset(longname, 'x', 299);
  longname[299] = '\0';
  setenv("NCCL_SOCKET_IFNAME", longname, 1);
  assert_int_equal(agoq_params_load(), ncclInvalidUsage);
  assert_int_equal(count_lines(NCCL_LOG_WARN, "NCCL_SOCKET_IFNAME=\"xxx"), 1);
  assert_int_equal(count_lines(NCCL_LOG_WARN, "AGOQ_SOCKET_IFNAME"), 0);
}

static void test_invalid_env(void** state) {
  (void)state;
  setenv("AGOQ_SOCKET_NSOCKS", "99", 1);
  assert_int_equal(agoq_params_load(), ncclInvalidUsage);
  assert_int_equal(count_lines(NCCL_LOG_WARN,
                               "NET/AGOQ AGOQ_SOCKET_NSOCKS=\"99\": expected an integer in [0, 64]"),
                   1);
  /* Sticky: every later init fails the same way, without repeating the warning. */
  int warns = count_lines(NCCL_LOG_WARN, "");
  assert_int_equal(agoq_params_load(), ncclInvalidUsage);
  unsetenv("AGOQ_SOCKET_NSOCKS");
  assert_int_equal(agoq_params_load(), ncclInvalidUsage);
  assert_int_equal(count_lines(NCCL_LOG_WARN, ""), warns);
  /* The bad text and its variable stay visible (agoq-info -c shows them); the number
   * stays the default's. */
  assert_string_equal(agoq_param_str(AGOQ_PARAM_SOCKET_NSOCKS), "99");
  assert_string_equal(agoq_param_source(AGOQ_PARAM_SOCKET_NSOCKS), "AGOQ_SOCKET_NSOCKS");
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS), 0);

  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
}

static void test_every_invalid_value_reported(void** state) {
  (void)state;
  setenv("AGOQ_SOCKET_FAMILY", "ipv5", 1);
  setenv("AGOQ_KEEPALIVE_S", "0x10", 1);
  setenv("AGOQ_SOCKET_NTHREADS", "4", 1);
  assert_int_equal(agoq_params_load(), ncclInvalidUsage);
  assert_int_equal(count_lines(NCCL_LOG_WARN, "AGOQ_SOCKET_FAMILY=\"ipv5\": expected one of auto|ipv4|ipv6"), 1);
  assert_int_equal(count_lines(NCCL_LOG_WARN, "AGOQ_KEEPALIVE_S=\"0x10\""), 1);
  assert_int_equal(count_lines(NCCL_LOG_WARN, ""), 2);
  /* Valid neighbours are still read. */
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_NTHREADS), 4);
}

static void test_load_once_and_reset(void** state) {
  (void)state;
  setenv("AGOQ_SOCKET_NSOCKS", "3", 1);
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS), 3);
  setenv("AGOQ_SOCKET_NSOCKS", "5", 1);
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS), 3);
  assert_int_equal(count_lines(NCCL_LOG_INFO, "set by environment"), 1);

  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS), 5);
  assert_int_equal(count_lines(NCCL_LOG_INFO, "set by environment"), 2);
}

static void test_accessor_loads(void** state) {
  (void)state;
  /* Reading before any agoq_params_load sees the environment, not zeroed storage. */
  setenv("AGOQ_HANDSHAKE_TIMEOUT_MS", "2500", 1);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_HANDSHAKE_TIMEOUT_MS), 2500);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_MAX_PENDING_CONNECTIONS), 1024);
  assert_int_equal(agoq_param_int(AGOQ_PARAM_COUNT), 0);
  assert_string_equal(agoq_param_str(AGOQ_PARAM_COUNT), "");
}

#define RACE_THREADS 8
static pthread_barrier_t race_barrier;
static ncclResult_t race_results[RACE_THREADS];

static void* race_load(void* arg) {
  int i = (int)(intptr_t)arg;
  pthread_barrier_wait(&race_barrier);
  race_results[i] = agoq_params_load();
  return NULL;
}

static void test_concurrent_load(void** state) {
  (void)state;
  setenv("AGOQ_TIMEOUT_S", "30", 1);
  for (int round = 0; round < 20; round++) {
    agoq_params_reset();
    captured_count = 0;
    pthread_t threads[RACE_THREADS];
    assert_int_equal(pthread_barrier_init(&race_barrier, NULL, RACE_THREADS), 0);
    for (int i = 0; i < RACE_THREADS; i++)
      assert_int_equal(pthread_create(&threads[i], NULL, race_load, (void*)(intptr_t)i), 0);
    for (int i = 0; i < RACE_THREADS; i++) pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&race_barrier);
    for (int i = 0; i < RACE_THREADS; i++) assert_int_equal(race_results[i], ncclSuccess);
    /* Exactly one thread read the environment. */
    assert_int_equal(count_lines(NCCL_LOG_INFO, "AGOQ_TIMEOUT_S set by environment to 30."), 1);
    assert_int_equal(agoq_param_int(AGOQ_PARAM_TIMEOUT_S), 30);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_int_valid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_int_invalid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_int_message, setup, teardown),
      cmocka_unit_test_setup_teardown(test_size_keyword, setup, teardown),
      cmocka_unit_test_setup_teardown(test_size_valid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_size_invalid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_size_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bool, setup, teardown),
      cmocka_unit_test_setup_teardown(test_enum, setup, teardown),
      cmocka_unit_test_setup_teardown(test_string, setup, teardown),
      cmocka_unit_test_setup_teardown(test_message_truncation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_table_defaults, setup, teardown),
      cmocka_unit_test_setup_teardown(test_type_names, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_defaults, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_env, setup, teardown),
      cmocka_unit_test_setup_teardown(test_empty_is_unset, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nccl_fallback, setup, teardown),
      cmocka_unit_test_setup_teardown(test_invalid_env, setup, teardown),
      cmocka_unit_test_setup_teardown(test_every_invalid_value_reported, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_once_and_reset, setup, teardown),
      cmocka_unit_test_setup_teardown(test_accessor_loads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_load, setup, teardown),
  };
  return cmocka_run_group_tests_name("params", tests, NULL, NULL);
}
