#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "collnet/agoq_collnet.h"
#include "core/agoq_log.h"
#include "fault.h"
#include "net/agoq_net.h"

int64_t fault_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fault_sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

uint64_t fault_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fault_rand(uint64_t* s) {
  uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

int fault_spawn(fault_child* c, fault_worker_fn fn, void* arg) {
  int sv[2];
  memset(c, 0, sizeof *c);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  if (pid == 0) {
    close(sv[0]);
    int rc = fn(sv[1], arg);
    fflush(NULL);
    _exit(rc);
  }
  close(sv[1]);
  c->pid = pid;
  c->fd = sv[0];
  return 0;
}

int fault_reap(fault_child* c, int timeout_ms) {
  if (c->pid <= 0 || c->reaped) return 0;
  int64_t end = fault_now_ms() + timeout_ms;
  for (;;) {
    pid_t r = waitpid(c->pid, &c->status, WNOHANG);
    if (r == c->pid) {
      c->reaped = true;
      break;
    }
    if (fault_now_ms() > end) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &c->status, 0);
      c->reaped = true;
      if (c->fd >= 0) close(c->fd);
      c->fd = -1;
      return -1;
    }
    fault_sleep_ms(5);
  }
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  return 0;
}

void fault_kill(fault_child* c) {
  if (c->pid > 0 && !c->reaped) kill(c->pid, SIGKILL);
}

static int fault_write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int fault_read_all(int fd, void* p, size_t n, int64_t end) {
  char* c = p;
  while (n > 0) {
    int left = (int)(end - fault_now_ms());
    if (left < 0) return -1;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr = poll(&pfd, 1, left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) return -1;
    ssize_t r = recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -2;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

int fault_send(int fd, uint32_t kind, const void* buf, uint32_t len) {
  uint32_t hdr[2] = {kind, len};
  if (fault_write_all(fd, hdr, sizeof hdr) != 0) return -1;
  return len > 0 ? fault_write_all(fd, buf, len) : 0;
}

int fault_recv(int fd, uint32_t* kind, void* buf, uint32_t cap, int timeout_ms) {
  int64_t end = fault_now_ms() + timeout_ms;
  uint32_t hdr[2];
  int rc = fault_read_all(fd, hdr, sizeof hdr, end);
  if (rc != 0) return rc;
  *kind = hdr[0];
  char sink[256];
  uint32_t len = hdr[1];
  uint32_t take = len < cap ? len : cap;
  if (take > 0 && (rc = fault_read_all(fd, buf, take, end + 5000)) != 0) return rc;
  for (uint32_t left = len - take; left > 0;) {
    uint32_t n = left < sizeof sink ? left : (uint32_t)sizeof sink;
    if ((rc = fault_read_all(fd, sink, n, end + 5000)) != 0) return rc;
    left -= n;
  }
  return (int)len;
}

int fault_recv_kind(int fd, uint32_t kind, void* buf, uint32_t cap, int timeout_ms) {
  int64_t end = fault_now_ms() + timeout_ms;
  for (;;) {
    uint32_t k = 0;
    int left = (int)(end - fault_now_ms());
    int n = fault_recv(fd, &k, buf, cap, left > 0 ? left : 0);
    if (n < 0) return n;
    if (k == kind) return n;
    if (k == FAULT_MSG_FAIL) {
      fprintf(stderr, "fault: worker failed: %.*s\n", (int)(n < (int)cap ? n : (int)cap), (const char*)buf);
      return -3;
    }
  }
}

int fault_event_send(int fd, uint32_t kind, int32_t phase, int64_t value) {
  fault_event e = {.t_ms = fault_now_ms(), .value = value, .phase = phase};
  return fault_send(fd, kind, &e, sizeof e);
}

bool fault_stop_requested(int fd) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  return poll(&pfd, 1, 0) > 0;
}

int fault_report_fail(int fd, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "fault[%d]: %s\n", (int)getpid(), msg);
  fault_send(fd, FAULT_MSG_FAIL, msg, (uint32_t)strlen(msg));
  return 1;
}

long fault_rss_kb(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, pid ? "/proc/%d/status" : "/proc/self/status", (int)pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
  fclose(f);
  return kb;
}

long fault_fd_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, pid ? "/proc/%d/fd" : "/proc/self/fd", (int)pid);
  DIR* d = opendir(path);
  if (d == NULL) return -1;
  long n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

void fault_path_set(fault_path path) {
  /* 1G is AGOQ_SOCKET_INLINE's maximum: every payload a scenario sends fits under it. */
  setenv("AGOQ_SOCKET_INLINE", path == FAULT_PATH_INLINE ? "1G" : "0", 1);
}

const char* fault_path_name(fault_path path) { return path == FAULT_PATH_INLINE ? "inline" : "pieces"; }

int fault_net_init(void** ctx, ncclProfilerCallback_t prof) {
  ncclResult_t r = agoq_net_init(ctx, FAULT_COMM_ID, -1, agoq_log_stderr, prof);
  return r == ncclSuccess ? 0 : (int)r;
}

int fault_connect(void* ctx, void* handle, void** comm, int timeout_ms) {
  int64_t end = fault_now_ms() + timeout_ms;
  *comm = NULL;
  for (;;) {
    ncclResult_t r = agoq_net_connect(ctx, 0, handle, comm);
    if (r != ncclSuccess) return (int)r;
    if (*comm != NULL) return 0;
    if (fault_now_ms() > end) return -1;
    usleep(200);
  }
}

int fault_accept(void* listen, void** comm, int timeout_ms, int stop_fd) {
  int64_t end = fault_now_ms() + timeout_ms;
  *comm = NULL;
  for (;;) {
    ncclResult_t r = agoq_net_accept(listen, comm);
    if (r != ncclSuccess) return (int)r;
    if (*comm != NULL) return 0;
    if (fault_now_ms() > end) return -1;
    if (stop_fd >= 0 && fault_stop_requested(stop_fd)) return -2;
    usleep(200);
  }
}

int fault_coll_join(int fd, int nranks, void** ctx, void** lc, uint8_t* all, void** hp) {
  uint8_t handle[FAULT_HANDLE_SIZE] = {0};
  uint32_t size = (uint32_t)nranks * FAULT_HANDLE_SIZE;
  if (agoq_coll_init(ctx, FAULT_COMM_ID, agoq_log_stderr) != ncclSuccess) return fault_report_fail(fd, "coll init");
  if (agoq_coll_listen(*ctx, 0, handle, lc) != ncclSuccess) return fault_report_fail(fd, "coll listen");
  fault_send(fd, FAULT_MSG_HANDLE, handle, sizeof handle);
  if (fault_recv_kind(fd, FAULT_MSG_HANDLES, all, size, 20000) != (int)size) return fault_report_fail(fd, "no handles");
  for (int i = 0; i < nranks; i++) hp[i] = all + (size_t)i * FAULT_HANDLE_SIZE;
  return 0;
}
