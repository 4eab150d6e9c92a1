/*
 * Process orchestration: two fresh worker processes per (version, scenario), a control
 * socketpair between them, a result pipe from each, a deadline, and the control-channel
 * framing the workers use to exchange handles and meet at barriers.
 *
 * Workers are fork+exec'd rather than forked: the plugin starts threads at init, and a
 * fresh image per side is what two NCCL ranks look like.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "abi_harness.h"

/* Pids the watchdog must kill; 0 = free slot. Read from a signal handler. */
static volatile sig_atomic_t abi_live_pids[2];

void abi_kill_all_workers(void) {
  for (int i = 0; i < 2; i++) {
    pid_t pid = (pid_t)abi_live_pids[i];
    if (pid > 0) kill(pid, SIGKILL);
  }
}

int64_t abi_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void abi_sleep_us(unsigned us) {
  struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static pid_t abi_spawn_worker(const char* self_exe, const char* lib_path, int version,
                              bool newest, const abi_scenario* sc, int role, uint64_t comm_id,
                              int ctrl_fd, int result_fd) {
  pid_t pid = fork();
  if (pid != 0) return pid;

  /* Child. Die with the orchestrator, so a killed ctest leaves no workers behind. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  /* Everything the orchestrator opened is close-on-exec except the two ends this worker
   * owns: a worker must not hold its peer's end, or the peer's death would go unseen. */
  fcntl(ctrl_fd, F_SETFD, 0);
  fcntl(result_fd, F_SETFD, 0);
  if (sc->env != NULL) {
    char env[256];
    snprintf(env, sizeof(env), "%s", sc->env);
    char* eq = strchr(env, '=');
    if (eq != NULL) {
      *eq = '\0';
      setenv(env, eq + 1, 1);
    }
  }
  char a_role[16], a_ver[16], a_ctrl[16], a_res[16], a_comm[32];
  snprintf(a_role, sizeof(a_role), "%d", role);
  snprintf(a_ver, sizeof(a_ver), "%d", version);
  snprintf(a_ctrl, sizeof(a_ctrl), "%d", ctrl_fd);
  snprintf(a_res, sizeof(a_res), "%d", result_fd);
  snprintf(a_comm, sizeof(a_comm), "%llu", (unsigned long long)comm_id);
  char* argv[] = {(char*)self_exe, "--worker", a_role, "--version", a_ver,
                  "--scenario", (char*)sc->name, "--lib", (char*)lib_path,
                  "--ctrl-fd", a_ctrl, "--result-fd", a_res, "--comm-id", a_comm,
                  newest ? "--newest" : NULL, NULL};
  execv(self_exe, argv);
  fprintf(stderr, "abi: exec %s failed: %s\n", self_exe, strerror(errno));
  _exit(127);
}

__attribute__((format(printf, 2, 3))) static void abi_appendf(abi_outcome* out, const char* fmt,
                                                               ...) {
  size_t used = strlen(out->reason);
  if (used + 1 >= sizeof(out->reason)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->reason + used, sizeof(out->reason) - used, fmt, ap);
  va_end(ap);
}

static void abi_read_reason(int fd, char* buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (;;) {
    if (used + 1 >= cap) break;
    ssize_t n = read(fd, buf + used, cap - 1 - used);
    if (n > 0) {
      used += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  buf[used] = '\0';
  while (used > 0 && (buf[used - 1] == '\n' || buf[used - 1] == ' ')) buf[--used] = '\0';
}

static const char* const abi_role_names[2] = {"listener/receiver", "connector/sender"};

void abi_run_scenario(const char* self_exe, const char* lib_path, int version, bool newest,
                      const abi_scenario* sc, abi_outcome* out) {
  memset(out, 0, sizeof(*out));
  bool single = (sc->flags & ABI_SC_SINGLE) != 0;
  int nworkers = single ? 1 : 2;
  int ctrl[2] = {-1, -1}, res[2][2] = {{-1, -1}, {-1, -1}};
  pid_t pid[2] = {0, 0};
  int status[2] = {0, 0};
  bool exited[2] = {false, false};

  /* The comm id both sides share, as NCCL's commHash is; different per run so a stale
   * process from an earlier run could never pass for a peer. */
  uint64_t comm_id = ((uint64_t)getpid() << 32) ^ (uint64_t)abi_now_ms() ^ ((uint64_t)version << 56);

  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctrl) != 0 ||
      pipe2(res[0], O_CLOEXEC) != 0 || pipe2(res[1], O_CLOEXEC) != 0) {
    snprintf(out->reason, sizeof(out->reason), "harness: socketpair/pipe: %s", strerror(errno));
    goto cleanup;
  }
  for (int r = 0; r < nworkers; r++) {
    pid[r] = abi_spawn_worker(self_exe, lib_path, version, newest, sc, r, comm_id, ctrl[r],
                              res[r][1]);
    if (pid[r] < 0) {
      snprintf(out->reason, sizeof(out->reason), "harness: fork: %s", strerror(errno));
      pid[r] = 0;
      goto cleanup;
    }
    abi_live_pids[r] = pid[r];
  }
  /* Only the workers hold these now: a worker's EOF on ctrl means its peer is gone. */
  close(ctrl[0]);
  close(ctrl[1]);
  ctrl[0] = ctrl[1] = -1;
  for (int r = 0; r < 2; r++) {
    close(res[r][1]);
    res[r][1] = -1;
  }

  int64_t deadline = abi_now_ms() + (int64_t)sc->timeout_s * 1000;
  bool timed_out = false;
  for (;;) {
    bool all = true;
    for (int r = 0; r < nworkers; r++) {
      if (exited[r]) continue;
      pid_t got = waitpid(pid[r], &status[r], WNOHANG);
      if (got == pid[r]) {
        exited[r] = true;
        abi_live_pids[r] = 0;
      } else {
        all = false;
      }
    }
    if (all) break;
    if (abi_now_ms() > deadline) {
      timed_out = true;
      for (int r = 0; r < nworkers; r++) {
        if (!exited[r]) {
          kill(pid[r], SIGKILL);
          waitpid(pid[r], &status[r], 0);
          exited[r] = true;
          abi_live_pids[r] = 0;
        }
      }
      break;
    }
    abi_sleep_us(2000);
  }

  out->passed = !timed_out;
  if (timed_out) {
    abi_appendf(out, "timed out after %d s (workers killed)", sc->timeout_s);
  }
  for (int r = 0; r < nworkers; r++) {
    char why[1536];
    abi_read_reason(res[r][0], why, sizeof(why));
    bool must_die = (r == 0 && (sc->flags & ABI_SC_ROLE0_DIES)) ||
                    (r == 1 && (sc->flags & ABI_SC_ROLE1_DIES));
    char what[128] = "";
    if (WIFSIGNALED(status[r])) {
      int sig = WTERMSIG(status[r]);
      if (!(must_die && sig == SIGKILL) && !timed_out) {
        out->passed = false;
        snprintf(what, sizeof(what), "killed by signal %d (%s)", sig, strsignal(sig));
      }
    } else if (WIFEXITED(status[r])) {
      int code = WEXITSTATUS(status[r]);
      if (must_die) {
        out->passed = false;
        snprintf(what, sizeof(what), "exited with %d before its planned SIGKILL", code);
      } else if (code != 0) {
        out->passed = false;
        snprintf(what, sizeof(what), "exited with %d", code);
      }
    }
    if (what[0] != '\0' || why[0] != '\0') {
      abi_appendf(out, "%s%s: %s%s%s", out->reason[0] ? "; " : "", abi_role_names[r], what,
                  (what[0] && why[0]) ? ": " : "", why);
    }
    if (why[0] != '\0') out->passed = false;
  }

cleanup:
  for (int r = 0; r < 2; r++) {
    if (pid[r] > 0 && !exited[r]) {
      kill(pid[r], SIGKILL);
      waitpid(pid[r], NULL, 0);
      abi_live_pids[r] = 0;
    }
    for (int k = 0; k < 2; k++)
      if (res[r][k] >= 0) close(res[r][k]);
  }
  for (int k = 0; k < 2; k++)
    if (ctrl[k] >= 0) close(ctrl[k]);
}

/* ---- control channel ---- */

static int abi_write_all(int fd, const void* buf, size_t len) {
  const uint8_t* p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int abi_read_all(int fd, void* buf, size_t len, int64_t deadline) {
  uint8_t* p = buf;
  while (len > 0) {
    int64_t left = deadline - abi_now_ms();
    if (left <= 0) return -2;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc = poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
    if (rc < 0 && errno != EINTR) return -1;
    if (rc <= 0) continue;
    ssize_t n = recv(fd, p, len, 0);
    if (n == 0) return -3;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int abi_ctrl_send(abi_worker* w, uint32_t kind, const void* buf, uint32_t len) {
  uint32_t hdr[2] = {kind, len};
  if (abi_write_all(w->ctrl_fd, hdr, sizeof(hdr)) != 0 ||
      (len > 0 && abi_write_all(w->ctrl_fd, buf, len) != 0)) {
    abi_fail(w, __FILE__, __LINE__, "control channel send (kind %u): %s (peer gone?)", kind,
             strerror(errno));
    return -1;
  }
  return 0;
}

int abi_ctrl_recv(abi_worker* w, uint32_t kind, void* buf, uint32_t len, int timeout_ms) {
  int64_t deadline = abi_now_ms() + timeout_ms;
  uint32_t hdr[2];
  int rc = abi_read_all(w->ctrl_fd, hdr, sizeof(hdr), deadline);
  if (rc == 0 && (hdr[0] != kind || hdr[1] != len)) {
    abi_fail(w, __FILE__, __LINE__,
             "control channel: expected message %u (%u B), got %u (%u B)", kind, len, hdr[0],
             hdr[1]);
    return -1;
  }
  if (rc == 0 && len > 0) rc = abi_read_all(w->ctrl_fd, buf, len, deadline);
  if (rc != 0) {
    abi_fail(w, __FILE__, __LINE__, "control channel: waiting for message %u: %s", kind,
             rc == -2 ? "timed out (peer stuck?)"
             : rc == -3 ? "peer exited"
                        : strerror(errno));
    return -1;
  }
  return 0;
}

int abi_ctrl_peer_gone(abi_worker* w) {
  struct pollfd pfd = {.fd = w->ctrl_fd, .events = POLLIN};
  if (poll(&pfd, 1, 0) <= 0) return 0;
  if (pfd.revents & (POLLHUP | POLLERR)) return 1;
  char c;
  ssize_t n = recv(w->ctrl_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 ? 1 : 0;
}

int abi_ctrl_readable(abi_worker* w) {
  struct pollfd pfd = {.fd = w->ctrl_fd, .events = POLLIN};
  return poll(&pfd, 1, 0) > 0 ? 1 : 0;
}

int abi_ctrl_barrier(abi_worker* w, uint32_t kind, int timeout_ms) {
  if (abi_ctrl_send(w, kind, NULL, 0) != 0) return -1;
  return abi_ctrl_recv(w, kind, NULL, 0, timeout_ms);
}
