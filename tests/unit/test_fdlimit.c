/* RLIMIT_NOFILE (plugin/core/agoq_fdlimit.c): a setup that needs more descriptors than the soft
 * limit raises it toward the hard one (INFO); where the hard one is short, the error names the
 * limit and who needs what; a socket call out of descriptors (EMFILE) raises it and is worth
 * trying again. Cases that lower the hard limit (irreversible without privileges) run in a
 * child process. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/agoq_fdlimit.h"
#include "core/agoq_log.h"

static char log_buf[8192];

static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) __attribute__((format(printf, 5, 6)));
static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) {
  (void)level;
  (void)flags;
  (void)file;
  (void)line;
  size_t used = strlen(log_buf);
  if (used + 2 >= sizeof log_buf) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(log_buf + used, sizeof log_buf - used - 1, fmt, ap);
  va_end(ap);
  strcat(log_buf, "\n");
}

static struct rlimit limits(void) {
  struct rlimit lim;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &lim), 0);
  return lim;
}

/* The soft limit far below what a setup needs, the hard one above it: raised, said once. */
static void test_reserve_raises_the_soft_limit(void** state) {
  (void)state;
  struct rlimit saved = limits();
  size_t open_now = agoq_fd_open_count();
  assert_true(open_now >= 3); /* stdin, stdout, stderr at least */
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < open_now + 2000) skip(); /* no room to show it */
  struct rlimit low = {.rlim_cur = open_now + 16, .rlim_max = saved.rlim_max};
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
  log_buf[0] = '\0';
  agoq_log_set_logger(capture_log);
  assert_int_equal(agoq_fd_reserve(1000, "a CollNet group of 251 ranks (1000 connections)"), ncclSuccess);
  struct rlimit now = limits();
  assert_true(now.rlim_cur == RLIM_INFINITY || now.rlim_cur >= open_now + 1000);
  assert_true(now.rlim_max == saved.rlim_max);
  assert_non_null(strstr(log_buf, "raised this process's RLIMIT_NOFILE soft limit"));
  assert_non_null(strstr(log_buf, "a CollNet group of 251 ranks"));
  /* Room already: nothing to say. */
  log_buf[0] = '\0';
  assert_int_equal(agoq_fd_reserve(10, "a small group"), ncclSuccess);
  assert_string_equal(log_buf, "");
  agoq_log_set_logger(NULL);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

/* Runs body in a child process; the child's assertion failures make its exit status nonzero. */
static void in_child(void (*body)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

#define CHILD_CHECK(cond)                                          \
  do {                                                             \
    if (!(cond)) {                                                 \
      fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      _exit(1);                                                    \
    }                                                              \
  } while (0)

static void hard_limit_short(void) {
  size_t open_now = agoq_fd_open_count();
  struct rlimit low = {.rlim_cur = open_now + 64, .rlim_max = open_now + 64};
  CHILD_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  log_buf[0] = '\0';
  agoq_log_set_logger(capture_log);
  CHILD_CHECK(agoq_fd_reserve(252, "a CollNet group of 64 ranks (252 connections)") == ncclSystemError);
  CHILD_CHECK(strstr(log_buf, "RLIMIT_NOFILE") != NULL);
  CHILD_CHECK(strstr(log_buf, "a CollNet group of 64 ranks (252 connections) needs 252 file descriptors") != NULL);
  CHILD_CHECK(strstr(log_buf, "ulimit -Hn") != NULL);
  /* Nothing was changed. */
  struct rlimit now;
  CHILD_CHECK(getrlimit(RLIMIT_NOFILE, &now) == 0 && now.rlim_cur == low.rlim_cur && now.rlim_max == low.rlim_max);
  /* Out of descriptors at the hard limit: no raise, and the hint names the limit. */
  CHILD_CHECK(!agoq_fd_raise_after_emfile());
  char hint[256];
  CHILD_CHECK(strstr(agoq_fd_exhausted_hint(hint, sizeof hint), "RLIMIT_NOFILE: soft") != NULL);
  agoq_log_set_logger(NULL);
}

/* The hard limit below what the setup needs: an error naming the limit, nothing changed. */
static void test_reserve_names_the_hard_limit(void** state) {
  (void)state;
  in_child(hard_limit_short);
}

static void emfile_then_raise(void) {
  struct rlimit saved;
  CHILD_CHECK(getrlimit(RLIMIT_NOFILE, &saved) == 0);
  size_t open_now = agoq_fd_open_count();
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < open_now + 64) _exit(0); /* no room to show it */
  struct rlimit low = {.rlim_cur = open_now + 8, .rlim_max = saved.rlim_max};
  CHILD_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  int fds[64];
  int n = 0;
  int fd = -1;
  while (n < 64 && (fd = socket(AF_INET, SOCK_STREAM, 0)) >= 0) fds[n++] = fd;
  CHILD_CHECK(fd < 0 && errno == EMFILE); /* the soft limit was reached */
  log_buf[0] = '\0';
  agoq_log_set_logger(capture_log);
  CHILD_CHECK(agoq_fd_raise_after_emfile());
  CHILD_CHECK(strstr(log_buf, "EMFILE") != NULL);
  fd = socket(AF_INET, SOCK_STREAM, 0);
  CHILD_CHECK(fd >= 0);
  close(fd);
  for (int i = 0; i < n; i++) close(fds[i]);
  agoq_log_set_logger(NULL);
}

/* A socket call out of descriptors below the hard limit: raised, and the next call works. */
static void test_emfile_raises_toward_the_hard_limit(void** state) {
  (void)state;
  in_child(emfile_then_raise);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reserve_raises_the_soft_limit),
      cmocka_unit_test(test_reserve_names_the_hard_limit),
      cmocka_unit_test(test_emfile_raises_toward_the_hard_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
