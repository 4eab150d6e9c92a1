/*
 * Fault injection, the process-wide fabric state, and the control API (AGOQ_IBV_EMU_1).
 *
 * AGOQ_IBV_EMU_FAULT (or agoq_ibv_emu_fault_set) is a comma-separated list of
 *   nodev            ibv_get_device_list returns NULL, errno ENOSYS (kernel without RDMA)
 *   reg_mr_enomem    ibv_reg_mr* fail with ENOMEM (what RLIMIT_MEMLOCK does)
 *   wc=<s>@<n>       the n-th send WR posted by this process completes with status s
 *                    (4, 5, 10, 12 or 13) and its QP goes to ERR
 *   port_down@<n>    once the n-th send WR has completed, its port goes DOWN
 *                    (IBV_EVENT_PORT_ERR; outstanding WRs end with 12, later ones flush)
 *   dead@<n>         this process's NIC stops answering after the n-th incoming write
 *   reg_mr_freeze@<n> once this process has posted n send WRs, ibv_reg_mr* fail with EPERM:
 *                    a check that a user registers nothing on its data path
 * Everything counts work requests, never time, so tests are deterministic.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

emu_fabric emu_g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int parse_u64(const char* s, const char* end, uint64_t* out) {
  if (s == end) return -1;
  uint64_t v = 0;
  for (const char* p = s; p < end; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (uint64_t)(*p - '0');
    if (v > (1ull << 40)) return -1;
  }
  *out = v;
  return 0;
}

int emu_fault_parse_apply(const char* spec) {
  int nodev = 0, enomem = 0, wc_status = 0;
  uint64_t wc_n = 0, pd_n = 0, dead_n = 0, freeze_n = 0;
  const char* p = spec ? spec : "";
  while (*p) {
    const char* end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    size_t n = (size_t)(end - p);
    const char* at = memchr(p, '@', n);
    if (n == 5 && !strncmp(p, "nodev", 5)) {
      nodev = 1;
    } else if (n == 13 && !strncmp(p, "reg_mr_enomem", 13)) {
      enomem = 1;
    } else if (n > 3 && !strncmp(p, "wc=", 3) && at) {
      uint64_t s;
      if (parse_u64(p + 3, at, &s) || parse_u64(at + 1, end, &wc_n) || wc_n == 0) return -1;
      if (s != 4 && s != 5 && s != 10 && s != 12 && s != 13) return -1;
      wc_status = (int)s;
    } else if (at && at - p == 9 && !strncmp(p, "port_down", 9)) {
      if (parse_u64(at + 1, end, &pd_n) || pd_n == 0) return -1;
    } else if (at && at - p == 4 && !strncmp(p, "dead", 4)) {
      if (parse_u64(at + 1, end, &dead_n) || dead_n == 0) return -1;
    } else if (at && at - p == 13 && !strncmp(p, "reg_mr_freeze", 13)) {
      if (parse_u64(at + 1, end, &freeze_n) || freeze_n == 0) return -1;
    } else if (n != 0) {
      return -1;
    }
    p = *end ? end + 1 : end;
  }
  emu_g.f_nodev = nodev;
  emu_g.f_reg_enomem = enomem;
  emu_g.f_wc_status = wc_status;
  emu_g.f_wc_n = wc_n;
  emu_g.f_port_down_n = pd_n;
  emu_g.f_dead_n = dead_n;
  emu_g.f_reg_freeze_n = freeze_n;
  emu_g.send_count = 0;
  emu_g.incoming_writes = 0;
  emu_g.dead = 0;
  return 0;
}

void emu_fault_sync_env(void) {
  const char* env = getenv("AGOQ_IBV_EMU_FAULT");
  if (!env) env = "";
  pthread_mutex_lock(&emu_g.lock);
  if (!emu_g.env_applied || strncmp(env, emu_g.env_seen, sizeof emu_g.env_seen)) {
    snprintf(emu_g.env_seen, sizeof emu_g.env_seen, "%s", env);
    emu_g.env_applied = 1;
    if (emu_fault_parse_apply(env))
      fprintf(stderr, "agoq-ibv-emu: AGOQ_IBV_EMU_FAULT: cannot parse '%s'\n", env);
  }
  pthread_mutex_unlock(&emu_g.lock);
}

uint64_t emu_random(void) {
  if (!emu_g.rng) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    emu_g.rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ 0x9E3779B97F4A7C15ull;
  }
  /* xorshift64* */
  uint64_t x = emu_g.rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  emu_g.rng = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* Spec times run at their real length unless a test asks otherwise: a shorter default
 * made a QP fail with status 12 whenever a loaded sanitizer run left a peer silent for a
 * third of a second, which hardware would never do at those timeouts. */
double emu_time_scale(void) {
  const char* s = getenv("AGOQ_IBV_EMU_TIME_SCALE");
  if (!s || !*s) return 1.0;
  char* end;
  double v = strtod(s, &end);
  return (*end || !(v > 0)) ? 1.0 : v;
}

int64_t emu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int mkdir_p(char* path) {
  for (char* p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int rc = mkdir(path, 0700);
    *p = '/';
    if (rc && errno != EEXIST) return errno;
  }
  if (mkdir(path, 0700) && errno != EEXIST) return errno;
  return 0;
}

int emu_fabric_dir(char* out, size_t len) {
  const char* env = getenv("AGOQ_IBV_EMU_DIR");
  int n = (env && *env) ? snprintf(out, len, "%s", env)
                        : snprintf(out, len, "/tmp/agoq-ibv-emu-%u", (unsigned)getuid());
  if (n < 0 || (size_t)n >= len) return ENAMETOOLONG;
  while (n > 1 && out[n - 1] == '/') out[--n] = 0;
  return mkdir_p(out);
}

/* ---- control API -------------------------------------------------------------------- */

/* Replaces the fault set (NULL or "" clears it) and restarts the WR counters. */
EMU_EXPORT int agoq_ibv_emu_fault_set(const char* spec) {
  pthread_mutex_lock(&emu_g.lock);
  int rc = emu_fault_parse_apply(spec);
  if (rc == 0) {
    /* the environment no longer overrides an in-process choice until it changes */
    const char* env = getenv("AGOQ_IBV_EMU_FAULT");
    snprintf(emu_g.env_seen, sizeof emu_g.env_seen, "%s", env ? env : "");
    emu_g.env_applied = 1;
  }
  pthread_mutex_unlock(&emu_g.lock);
  if (rc) errno = EINVAL;
  return rc;
}

/* Send WRs posted by this process since the fault set was last applied. */
EMU_EXPORT uint64_t agoq_ibv_emu_send_count(void) {
  pthread_mutex_lock(&emu_g.lock);
  uint64_t n = emu_g.send_count;
  pthread_mutex_unlock(&emu_g.lock);
  return n;
}

/* The fabric directory this process uses (created if needed); 0 or an errno. */
EMU_EXPORT int agoq_ibv_emu_fabric_dir(char* out, size_t len) { return emu_fabric_dir(out, len); }
