/*
 * The bootstrap between the two ranks: how the plugin's handle travels from the listening
 * rank to the connecting one, and how the ranks meet before and after each timed run.
 * A socketpair to a forked child on one host, plain TCP between two hosts (or network
 * namespaces). Messages are a little-endian kind and length, then the payload.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"

double perf_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int perf_boot_fork(perf_boot* b) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    fprintf(stderr, "agoq-perf: socketpair: %s\n", strerror(errno));
    return -1;
  }
  fflush(NULL); /* or buffered output would print twice */
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "agoq-perf: fork: %s\n", strerror(errno));
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive rank 0 */
    close(sv[0]);
    *b = (perf_boot){.fd = sv[1], .rank = 1, .child_pid = 0};
    return 0;
  }
  close(sv[1]);
  *b = (perf_boot){.fd = sv[0], .rank = 0, .child_pid = pid};
  return 0;
}

/* "host:port", "[v6addr]:port" or ":port" (any address). */
static int perf_split_addr(const char* addr, char* host, size_t hcap, char* port, size_t pcap) {
  const char* colon;
  if (addr[0] == '[') {
    const char* close_br = strchr(addr, ']');
    if (close_br == NULL || close_br[1] != ':') return -1;
    snprintf(host, hcap, "%.*s", (int)(close_br - addr - 1), addr + 1);
    colon = close_br + 1;
  } else {
    colon = strrchr(addr, ':');
    if (colon == NULL) return -1;
    snprintf(host, hcap, "%.*s", (int)(colon - addr), addr);
  }
  snprintf(port, pcap, "%s", colon + 1);
  return port[0] == '\0' ? -1 : 0;
}

static void perf_tune_tcp(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int perf_boot_tcp(perf_boot* b, int rank, const char* addr, int timeout_s) {
  char host[256], port[32];
  if (perf_split_addr(addr, host, sizeof(host), port, sizeof(port)) != 0) {
    fprintf(stderr, "agoq-perf: --addr '%s' is not HOST:PORT\n", addr);
    return -1;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  if (rank == 1) hints.ai_flags = AI_PASSIVE;
  struct addrinfo* res = NULL;
  int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (gai != 0) {
    fprintf(stderr, "agoq-perf: cannot resolve '%s': %s\n", addr, gai_strerror(gai));
    return -1;
  }
  int fd = -1;
  double deadline = perf_now_us() + timeout_s * 1e6;
  if (rank == 1) {
    int lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (lfd >= 0) setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (lfd < 0 || bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, 1) != 0) {
      fprintf(stderr, "agoq-perf: rank 1 cannot listen on %s: %s\n", addr, strerror(errno));
      if (lfd >= 0) close(lfd);
      freeaddrinfo(res);
      return -1;
    }
    fprintf(stderr, "agoq-perf: rank 1 waiting for rank 0 on %s\n", addr);
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int rc = poll(&pfd, 1, timeout_s * 1000);
    if (rc > 0) fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      fprintf(stderr, "agoq-perf: rank 1: no rank 0 within %d s (%s)\n", timeout_s,
              rc == 0 ? "timeout" : strerror(errno));
    close(lfd);
  } else {
    /* Rank 1 may not be up yet: keep dialling until the boot timeout. */
    while (fd < 0) {
      for (struct addrinfo* ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
          close(fd);
          fd = -1;
        }
      }
      if (fd >= 0) break;
      if (perf_now_us() > deadline) {
        fprintf(stderr, "agoq-perf: rank 0 could not reach rank 1 at %s within %d s\n", addr,
                timeout_s);
        break;
      }
      usleep(200000);
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return -1;
  perf_tune_tcp(fd);
  *b = (perf_boot){.fd = fd, .rank = rank, .child_pid = 0};
  return 0;
}

int perf_boot_finish(perf_boot* b) {
  if (b->child_pid <= 0) return 0;
  int status = 0;
  while (waitpid(b->child_pid, &status, 0) < 0 && errno == EINTR) {
  }
  b->child_pid = 0;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fprintf(stderr, "agoq-perf: receiver process died: signal %d\n",
          WIFSIGNALED(status) ? WTERMSIG(status) : -1);
  return 1;
}

void perf_boot_close(perf_boot* b) {
  if (b->fd >= 0) close(b->fd);
  b->fd = -1;
  if (b->child_pid > 0) {
    kill(b->child_pid, SIGKILL);
    waitpid(b->child_pid, NULL, 0);
    b->child_pid = 0;
  }
}

static void perf_put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t perf_get32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int perf_write_all(int fd, const void* buf, size_t len) {
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

static int perf_read_all(int fd, void* buf, size_t len, double deadline) {
  uint8_t* p = buf;
  while (len > 0) {
    double left_ms = (deadline - perf_now_us()) / 1000.0;
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

int perf_boot_send(perf_boot* b, uint32_t kind, const void* buf, uint32_t len) {
  uint8_t hdr[8];
  perf_put32(hdr, kind);
  perf_put32(hdr + 4, len);
  if (perf_write_all(b->fd, hdr, sizeof(hdr)) != 0 ||
      (len > 0 && perf_write_all(b->fd, buf, len) != 0)) {
    fprintf(stderr, "agoq-perf: rank %d: bootstrap send failed: %s (peer gone?)\n", b->rank,
            strerror(errno));
    return -1;
  }
  return 0;
}

int perf_boot_recv(perf_boot* b, uint32_t kind, void* buf, uint32_t len, int timeout_ms) {
  double deadline = perf_now_us() + timeout_ms * 1e3;
  uint8_t hdr[8];
  int rc = perf_read_all(b->fd, hdr, sizeof(hdr), deadline);
  if (rc == 0) {
    uint32_t k = perf_get32(hdr), l = perf_get32(hdr + 4);
    if (k == PERF_MSG_ERROR) {
      fprintf(stderr, "agoq-perf: rank %d: the other rank reported an error\n", b->rank);
      return -1;
    }
    if (k != kind || l != len) {
      fprintf(stderr, "agoq-perf: rank %d: bootstrap expected message %u (%u B), got %u (%u B)\n",
              b->rank, kind, len, k, l);
      return -1;
    }
    if (len > 0) rc = perf_read_all(b->fd, buf, len, deadline);
  }
  if (rc != 0) {
    fprintf(stderr, "agoq-perf: rank %d: waiting for the other rank: %s\n", b->rank,
            rc == -2 ? "timed out" : rc == -3 ? "it exited" : strerror(errno));
    return -1;
  }
  return 0;
}

int perf_boot_peer_failed(perf_boot* b) {
  struct pollfd pfd = {.fd = b->fd, .events = POLLIN};
  if (poll(&pfd, 1, 0) <= 0) return 0;
  uint8_t hdr[8];
  ssize_t n = recv(b->fd, hdr, sizeof(hdr), MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return 1;
  return n >= 4 && perf_get32(hdr) == PERF_MSG_ERROR;
}
