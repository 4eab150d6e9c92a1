/*
 * Processes: the orchestrator spawns N fresh workers (fork + exec, so each is a clean image
 * like an NCCL rank), serves as their hub over one socketpair each, and judges the scenario.
 * Messages both ways: a 4-byte kind, a 4-byte length, the payload (host byte order: one
 * host).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

#include "collnet_harness.h"

int64_t cn_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

const char* cn_result_str(ncclResult_t r) {
  static const char* const names[] = {"ncclSuccess",         "ncclUnhandledCudaError",
                                      "ncclSystemError",     "ncclInternalError",
                                      "ncclInvalidArgument", "ncclInvalidUsage",
                                      "ncclRemoteError",     "ncclInProgress"};
  return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "(unknown)";
}

void cn_fail(cn_worker* w, const char* file, int line, const char* fmt, ...) {
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  size_t used = strlen(w->why);
  if (used + 16 >= sizeof(w->why)) return; /* the first failures matter most */
  int n = snprintf(w->why + used, sizeof(w->why) - used, "%s[rank %d %s:%d] ",
                   used > 0 ? "; " : "", w->rank, base, line);
  if (n < 0 || (size_t)n >= sizeof(w->why) - used) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->why + used + n, sizeof(w->why) - used - (size_t)n, fmt, ap);
  va_end(ap);
  w->failed = true;
}

/* ---- framing ---- */

static int cn_write_all(int fd, const void* buf, size_t len) {
  const uint8_t* p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* -1 error, -2 timeout, -3 EOF. */
static int cn_read_all(int fd, void* buf, size_t len, int64_t deadline_ns) {
  uint8_t* p = buf;
  while (len > 0) {
    int64_t left_ms = (deadline_ns - cn_now_ns()) / 1000000;
    if (left_ms <= 0) return -2;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc = poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms + 1);
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

static int cn_msg_send(int fd, uint32_t kind, const void* buf, uint32_t len) {
  uint32_t hdr[2] = {kind, len};
  if (cn_write_all(fd, hdr, sizeof(hdr)) != 0) return -1;
  return len > 0 ? cn_write_all(fd, buf, len) : 0;
}

/* ---- worker side ---- */

int cn_allgather(cn_worker* w, const void* mine, void* all, uint32_t len) {
  if (cn_msg_send(w->ctrl_fd, CN_MSG_ALLGATHER, mine, len) != 0) {
    CN_FAIL(w, "all-gather: cannot reach the orchestrator");
    return -1;
  }
  uint32_t hdr[2];
  int64_t deadline = cn_now_ns() + (int64_t)CN_WAIT_MS * 1000000;
  int rc = cn_read_all(w->ctrl_fd, hdr, sizeof(hdr), deadline);
  if (rc == 0 && hdr[0] == CN_MSG_ABORT) {
    CN_FAIL(w, "all-gather aborted: another rank failed or died");
    return -1;
  }
  if (rc == 0 && (hdr[0] != CN_MSG_ALLGATHER || hdr[1] != len * (uint32_t)w->nranks)) {
    CN_FAIL(w, "all-gather: unexpected answer (kind %u, %u B)", hdr[0], hdr[1]);
    return -1;
  }
  if (rc == 0 && hdr[1] > 0) rc = cn_read_all(w->ctrl_fd, all, hdr[1], deadline);
  if (rc != 0) {
    CN_FAIL(w, "all-gather: %s", rc == -2 ? "timed out" : "the orchestrator went away");
    return -1;
  }
  return 0;
}

int cn_barrier(cn_worker* w) {
  uint8_t none = 0;
  return cn_allgather(w, &none, NULL, 0);
}

int cn_send_result(cn_worker* w, uint32_t status, int64_t event_ns, const char* text) {
  size_t tlen = text ? strlen(text) : 0;
  uint8_t* buf = malloc(12 + tlen);
  if (buf == NULL) return -1;
  memcpy(buf, &status, 4);
  memcpy(buf + 4, &event_ns, 8);
  if (tlen > 0) memcpy(buf + 12, text, tlen);
  int rc = cn_msg_send(w->ctrl_fd, CN_MSG_RESULT, buf, (uint32_t)(12 + tlen));
  free(buf);
  return rc;
}

/* ---- orchestrator side ---- */

typedef struct {
  pid_t pid;
  int fd;
  bool gathering;
  uint8_t* gather;
  uint32_t gather_len;
  bool has_result;
  uint32_t status;
  int64_t event_ns;
  char text[2048];
  bool exited;
  int wstatus;
} cn_child;

/* Pids the watchdog kills; 0 = free. Read from a signal handler. */
static volatile sig_atomic_t cn_live_pids[CN_MAX_RANKS];

static void cn_kill_all(void) {
  for (int i = 0; i < CN_MAX_RANKS; i++) {
    pid_t pid = (pid_t)cn_live_pids[i];
    if (pid > 0) kill(pid, SIGKILL);
  }
}

static void cn_on_signal(int sig) {
  cn_kill_all();
  signal(sig, SIG_DFL);
  raise(sig);
}

static pid_t cn_spawn(const char* self_exe, const char* lib_path, const cn_scenario* sc,
                      int nranks, int rank, int version, uint64_t comm_id, int fd) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* a killed ctest leaves no worker behind */
  fcntl(fd, F_SETFD, 0);           /* the only inherited descriptor besides stdio */
  char a_rank[16], a_n[16], a_ver[16], a_fd[16], a_comm[32];
  snprintf(a_rank, sizeof a_rank, "%d", rank);
  snprintf(a_n, sizeof a_n, "%d", nranks);
  snprintf(a_ver, sizeof a_ver, "%d", version);
  snprintf(a_fd, sizeof a_fd, "%d", fd);
  snprintf(a_comm, sizeof a_comm, "%" PRIu64, comm_id);
  char* argv[] = {(char*)self_exe, "--worker", a_rank, "--nranks", a_n, "--version", a_ver,
                  "--scenario", (char*)sc->name, "--lib", (char*)lib_path, "--ctrl-fd", a_fd,
                  "--comm-id", a_comm, NULL};
  execv(self_exe, argv);
  fprintf(stderr, "collnet: exec %s: %s\n", self_exe, strerror(errno));
  _exit(127);
}

/* Reads one message from a child; -1 when its end closed. */
static int cn_child_read(cn_child* c, int nranks, cn_child* all) {
  uint32_t hdr[2];
  int64_t deadline = cn_now_ns() + 30ll * 1000000000;
  if (cn_read_all(c->fd, hdr, sizeof(hdr), deadline) != 0) return -1;
  uint8_t* payload = hdr[1] > 0 ? malloc(hdr[1]) : NULL;
  if (hdr[1] > 0 && (payload == NULL || cn_read_all(c->fd, payload, hdr[1], deadline) != 0)) {
    free(payload);
    return -1;
  }
  if (hdr[0] == CN_MSG_RESULT && hdr[1] >= 12) {
    c->has_result = true;
    memcpy(&c->status, payload, 4);
    memcpy(&c->event_ns, payload + 4, 8);
    size_t tl = hdr[1] - 12 < sizeof(c->text) - 1 ? hdr[1] - 12 : sizeof(c->text) - 1;
    memcpy(c->text, payload + 12, tl);
    c->text[tl] = '\0';
    free(payload);
    return 0;
  }
  if (hdr[0] == CN_MSG_ALLGATHER) {
    c->gathering = true;
    c->gather = payload;
    c->gather_len = hdr[1];
    /* Complete when every rank has contributed the same length. */
    for (int k = 0; k < nranks; k++)
      if (!all[k].gathering || all[k].gather_len != hdr[1]) return 0;
    size_t total = (size_t)hdr[1] * (size_t)nranks;
    uint8_t* cat = total > 0 ? malloc(total) : NULL;
    for (int k = 0; k < nranks; k++) {
      if (cat != NULL) memcpy(cat + (size_t)k * hdr[1], all[k].gather, hdr[1]);
      free(all[k].gather);
      all[k].gather = NULL;
      all[k].gathering = false;
    }
    for (int k = 0; k < nranks; k++)
      if (all[k].fd >= 0) cn_msg_send(all[k].fd, CN_MSG_ALLGATHER, cat, (uint32_t)total);
    free(cat);
    return 0;
  }
  free(payload);
  return 0; /* unknown kinds are ignored */
}

__attribute__((format(printf, 3, 4))) static void cn_appendf(char* why, size_t cap,
                                                             const char* fmt, ...) {
  size_t used = strlen(why);
  if (used + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why + used, cap - used, fmt, ap);
  va_end(ap);
}

int cn_run_scenario(const char* self_exe, const char* lib_path, const cn_scenario* sc,
                    int nranks, int version, int timeout_s, char* why, size_t cap) {
  why[0] = '\0';
  cn_child ch[CN_MAX_RANKS];
  memset(ch, 0, sizeof(ch));
  signal(SIGTERM, cn_on_signal);
  signal(SIGINT, cn_on_signal);
  signal(SIGPIPE, SIG_IGN);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t comm_id = perf_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^
                                (uint64_t)version);
  int victim = (sc->flags & CN_SC_VICTIM) ? nranks / 2 : -1;
  for (int k = 0; k < nranks; k++) {
    int sv[2];
    ch[k].fd = -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      cn_appendf(why, cap, "socketpair: %s", strerror(errno));
      cn_kill_all();
      return -1;
    }
    fflush(NULL);
    ch[k].pid = cn_spawn(self_exe, lib_path, sc, nranks, k, version, comm_id, sv[1]);
    close(sv[1]);
    ch[k].fd = sv[0];
    if (ch[k].pid > 0) cn_live_pids[k] = ch[k].pid;
  }
  int64_t deadline = cn_now_ns() + (int64_t)timeout_s * 1000000000;
  bool timed_out = false;
  for (;;) {
    struct pollfd pfd[CN_MAX_RANKS];
    int map[CN_MAX_RANKS], np = 0;
    for (int k = 0; k < nranks; k++)
      if (ch[k].fd >= 0) {
        pfd[np] = (struct pollfd){.fd = ch[k].fd, .events = POLLIN};
        map[np++] = k;
      }
    if (np == 0) break;
    if (cn_now_ns() > deadline) {
      timed_out = true;
      break;
    }
    int rc = poll(pfd, (nfds_t)np, 200);
    if (rc < 0 && errno != EINTR) break;
    for (int i = 0; i < np && rc > 0; i++) {
      if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      cn_child* c = &ch[map[i]];
      if (cn_child_read(c, nranks, ch) != 0) {
        close(c->fd);
        c->fd = -1;
        /* A rank gone without passing (dead, or failed): nobody can finish an
         * all-gather with it, so the others are told instead of left waiting. */
        bool expected = map[i] == victim && c->has_result && c->status == CN_RESULT_DYING;
        bool passed = c->has_result && c->status == CN_RESULT_PASS;
        if (!expected && !passed)
          for (int k = 0; k < nranks; k++)
            if (ch[k].fd >= 0) cn_msg_send(ch[k].fd, CN_MSG_ABORT, NULL, 0);
      }
    }
    /* After an expected death the survivors never all-gather with the dead rank. */
    if (victim >= 0 && ch[victim].fd < 0)
      for (int k = 0; k < nranks; k++)
        if (ch[k].gathering && ch[k].fd >= 0) {
          cn_msg_send(ch[k].fd, CN_MSG_ABORT, NULL, 0);
          ch[k].gathering = false;
          free(ch[k].gather);
          ch[k].gather = NULL;
        }
  }
  if (timed_out) cn_kill_all();
  for (int k = 0; k < nranks; k++) {
    if (ch[k].fd >= 0) close(ch[k].fd);
    /* The deadline has passed or every worker closed its end: a worker still alive now
     * is stuck in a plugin call and is killed rather than waited for. */
    int64_t grace = cn_now_ns() + 10ll * 1000000000;
    while (waitpid(ch[k].pid, &ch[k].wstatus, WNOHANG) == 0) {
      if (cn_now_ns() > grace) {
        kill(ch[k].pid, SIGKILL);
        waitpid(ch[k].pid, &ch[k].wstatus, 0);
        cn_appendf(why, cap, "rank %d did not exit after its verdict (killed); ", k);
        break;
      }
      usleep(10000);
    }
    cn_live_pids[k] = 0;
    free(ch[k].gather);
  }
  if (timed_out) cn_appendf(why, cap, "timed out after %d s; ", timeout_s);
  int64_t death_ns = victim >= 0 && ch[victim].has_result ? ch[victim].event_ns : 0;
  for (int k = 0; k < nranks; k++) {
    cn_child* c = &ch[k];
    int st = c->wstatus;
    if (k == victim) {
      if (!c->has_result || c->status != CN_RESULT_DYING)
        cn_appendf(why, cap, "victim rank %d never reached its kill point%s%s; ", k,
                   c->has_result ? ": " : "", c->has_result ? c->text : "");
      else if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
        cn_appendf(why, cap, "victim rank %d was not killed; ", k);
      continue;
    }
    if (!c->has_result) {
      cn_appendf(why, cap, "rank %d ended without a verdict (%s %d); ", k,
                 WIFSIGNALED(st) ? "signal" : "exit",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      continue;
    }
    if (c->status != CN_RESULT_PASS) cn_appendf(why, cap, "%s; ", c->text);
    else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
      cn_appendf(why, cap, "rank %d passed but exited abnormally (%s %d); ", k,
                 WIFSIGNALED(st) ? "signal" : "exit",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    if (death_ns > 0 && c->status == CN_RESULT_PASS) {
      int64_t ms = (c->event_ns - death_ns) / 1000000;
      printf("collnet: rank %d saw its collective fail %lld ms after rank %d died\n", k,
             (long long)ms, victim);
      if (c->event_ns <= 0 || ms > CN_DEATH_LIMIT_MS)
        cn_appendf(why, cap, "rank %d saw the failure %lld ms after the death (limit %d); ", k,
                   (long long)ms, CN_DEATH_LIMIT_MS);
    }
  }
  return why[0] == '\0' ? 0 : -1;
}
