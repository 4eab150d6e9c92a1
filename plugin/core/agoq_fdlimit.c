#include "core/agoq_fdlimit.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "core/agoq_log.h"

/* Descriptors left for NCCL and the application on top of what a setup asks for. */
#define AGOQ_FD_MARGIN 256
/* Where the hard limit is unlimited, the soft one goes no higher than this (the kernel's
 * fs.nr_open, 1048576 by default, refuses more). */
#define AGOQ_FD_UNLIMITED_TARGET 1048576

/* One raise at a time: proxy threads of several communicators may set up at once. */
static pthread_mutex_t agoq_fd_mu = PTHREAD_MUTEX_INITIALIZER;

size_t agoq_fd_open_count(void) {
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return 0;
  size_t n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n > 0 ? n - 1 : 0; /* the directory's own descriptor */
}

static const char* agoq_fd_limit_str(rlim_t v, char* buf, size_t len) {
  if (v == RLIM_INFINITY) snprintf(buf, len, "unlimited");
  else snprintf(buf, len, "%llu", (unsigned long long)v);
  return buf;
}

/* Raises the soft limit to at least `want` (up to the hard one); under agoq_fd_mu. */
static bool agoq_fd_raise_locked(rlim_t want, const char* why) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur >= want) return true;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < want) return false;
  /* Straight to the hard limit where it is finite: one raise, one line, for every setup. */
  rlim_t target = lim.rlim_max != RLIM_INFINITY ? lim.rlim_max
                  : want > AGOQ_FD_UNLIMITED_TARGET ? want
                                                    : AGOQ_FD_UNLIMITED_TARGET;
  struct rlimit next = {.rlim_cur = target, .rlim_max = lim.rlim_max};
  if (setrlimit(RLIMIT_NOFILE, &next) != 0) {
    next.rlim_cur = want; /* fs.nr_open below the target: what is needed, no more */
    if (setrlimit(RLIMIT_NOFILE, &next) != 0) return false;
  }
  char a[24], b[24], c[24];
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "raised this process's RLIMIT_NOFILE soft limit from %s to %s (hard %s): %s",
            agoq_fd_limit_str(lim.rlim_cur, a, sizeof a), agoq_fd_limit_str(next.rlim_cur, b, sizeof b),
            agoq_fd_limit_str(lim.rlim_max, c, sizeof c), why);
  return true;
}

ncclResult_t agoq_fd_reserve(size_t need, const char* what) {
  size_t open_now = agoq_fd_open_count();
  rlim_t want = (rlim_t)(open_now + need + AGOQ_FD_MARGIN);
  char why[256];
  snprintf(why, sizeof why, "%s needs %zu descriptors, %zu are open", what, need, open_now);
  pthread_mutex_lock(&agoq_fd_mu);
  bool ok = agoq_fd_raise_locked(want, why);
  pthread_mutex_unlock(&agoq_fd_mu);
  if (ok) return ncclSuccess;
  struct rlimit lim = {0, 0};
  (void)getrlimit(RLIMIT_NOFILE, &lim);
  char a[24], b[24];
  AGOQ_WARN("%s needs %zu file descriptors, and %zu are open: RLIMIT_NOFILE (soft %s, hard %s) is below the %llu "
            "that needs with room for NCCL and the application; raise the hard limit (ulimit -Hn, LimitNOFILE= in a "
            "systemd unit, --ulimit nofile= for a container, /etc/security/limits.conf)",
            what, need, open_now, agoq_fd_limit_str(lim.rlim_cur, a, sizeof a),
            agoq_fd_limit_str(lim.rlim_max, b, sizeof b), (unsigned long long)want);
  return ncclSystemError;
}

bool agoq_fd_raise_after_emfile(void) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return false;
  /* At the hard limit the raise answers false; raised meanwhile by another thread, true. */
  pthread_mutex_lock(&agoq_fd_mu);
  bool ok = agoq_fd_raise_locked(lim.rlim_cur + 1, "a socket call ran out of descriptors (EMFILE)");
  pthread_mutex_unlock(&agoq_fd_mu);
  return ok;
}

const char* agoq_fd_exhausted_hint(char* buf, size_t len) {
  struct rlimit lim = {0, 0};
  (void)getrlimit(RLIMIT_NOFILE, &lim);
  char a[24], b[24];
  snprintf(buf, len,
           " (RLIMIT_NOFILE: soft %s, hard %s, %zu open: raise it with ulimit -n, LimitNOFILE= in a systemd unit or "
           "--ulimit nofile= for a container)",
           agoq_fd_limit_str(lim.rlim_cur, a, sizeof a), agoq_fd_limit_str(lim.rlim_max, b, sizeof b),
           agoq_fd_open_count());
  return buf;
}
