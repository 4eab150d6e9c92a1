/*
 * The bootstrap between the ranks: how the plugin's handles travel between them, and how
 * the ranks meet before and after each timed run. Two ranks (p2p) or N ranks in a star
 * around rank 0 (collectives). A socketpair to a forked child on one host, plain TCP
 * between hosts (or network namespaces). Messages are a little-endian kind and length,
 * then the payload.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
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

/* Resolves --addr HOST:PORT; `passive` for the side that listens. 0 ok, -1 with a message. */
static int perf_resolve_addr(const char* addr, bool passive, struct addrinfo** res) {
  char host[256], port[32];
  if (perf_split_addr(addr, host, sizeof(host), port, sizeof(port)) != 0) {
    fprintf(stderr, "agoq-perf: --addr '%s' is not HOST:PORT\n", addr);
    return -1;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  if (passive) hints.ai_flags = AI_PASSIVE;
  *res = NULL;
  int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, res);
  if (gai != 0) {
    fprintf(stderr, "agoq-perf: cannot resolve '%s': %s\n", addr, gai_strerror(gai));
    return -1;
  }
  return 0;
}

int perf_boot_tcp(perf_boot* b, int rank, const char* addr, int timeout_s) {
  struct addrinfo* res = NULL;
  if (perf_resolve_addr(addr, rank == 1, &res) != 0) return -1;
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
  fprintf(stderr, "agoq-perf: a forked rank died: signal %d\n",
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

/* ---- N ranks: a star around rank 0 ----
 * Rank 0 holds one link per other rank (a socketpair to a forked child, or a TCP
 * connection it accepted); every collective of the bootstrap is a gather to rank 0
 * followed, where everyone needs the answer, by a broadcast from it. */

int perf_group_fork(perf_group* g, int nranks) {
  memset(g, 0, sizeof(*g));
  g->nranks = nranks;
  g->up = (perf_boot){.fd = -1};
  g->links = calloc((size_t)nranks, sizeof(perf_boot));
  if (g->links == NULL) return -1;
  for (int k = 0; k < nranks; k++) g->links[k] = (perf_boot){.fd = -1};
  fflush(NULL); /* or buffered output would print once per process */
  for (int k = 1; k < nranks; k++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      fprintf(stderr, "agoq-perf: socketpair: %s\n", strerror(errno));
      perf_group_close(g);
      return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "agoq-perf: fork: %s\n", strerror(errno));
      close(sv[0]);
      close(sv[1]);
      perf_group_close(g);
      return -1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive rank 0 */
      close(sv[0]);
      /* The links to the earlier children are rank 0's ends, not ours to hold. */
      for (int j = 1; j < k; j++) close(g->links[j].fd);
      free(g->links);
      g->links = NULL;
      g->rank = k;
      g->up = (perf_boot){.fd = sv[1], .rank = k, .child_pid = 0};
      return 0;
    }
    close(sv[1]);
    g->links[k] = (perf_boot){.fd = sv[0], .rank = 0, .child_pid = pid};
  }
  g->rank = 0;
  return 0;
}

int perf_group_tcp(perf_group* g, int rank, int nranks, const char* addr, int timeout_s) {
  memset(g, 0, sizeof(*g));
  g->rank = rank;
  g->nranks = nranks;
  g->up = (perf_boot){.fd = -1};
  struct addrinfo* res = NULL;
  if (perf_resolve_addr(addr, rank == 0, &res) != 0) return -1;
  double deadline = perf_now_us() + timeout_s * 1e6;
  uint8_t hello[8];
  int rc = -1;
  if (rank != 0) {
    /* Rank 0 may not be up yet: keep dialling until the boot timeout. */
    int fd = -1;
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
        fprintf(stderr, "agoq-perf: rank %d could not reach rank 0 at %s within %d s\n", rank,
                addr, timeout_s);
        goto out;
      }
      usleep(200000);
    }
    perf_tune_tcp(fd);
    g->up = (perf_boot){.fd = fd, .rank = rank, .child_pid = 0};
    perf_put32(hello, (uint32_t)rank);
    perf_put32(hello + 4, (uint32_t)nranks);
    rc = perf_boot_send(&g->up, PERF_MSG_HELLO, hello, sizeof(hello));
    goto out;
  }
  g->links = calloc((size_t)nranks, sizeof(perf_boot));
  if (g->links == NULL) goto out;
  for (int k = 0; k < nranks; k++) g->links[k] = (perf_boot){.fd = -1};
  int lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (lfd >= 0) setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (lfd < 0 || bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, nranks) != 0) {
    fprintf(stderr, "agoq-perf: rank 0 cannot listen on %s: %s\n", addr, strerror(errno));
    if (lfd >= 0) close(lfd);
    goto out;
  }
  fprintf(stderr, "agoq-perf: rank 0 waiting for %d rank(s) on %s\n", nranks - 1, addr);
  int joined = 1;
  while (joined < nranks) {
    int left_ms = (int)((deadline - perf_now_us()) / 1000);
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int prc = left_ms > 0 ? poll(&pfd, 1, left_ms) : 0;
    if (prc < 0 && errno == EINTR) continue;
    if (prc <= 0) {
      fprintf(stderr, "agoq-perf: rank 0: only %d of %d ranks joined within %d s\n", joined,
              nranks, timeout_s);
      break;
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    perf_tune_tcp(fd);
    perf_boot link = {.fd = fd, .rank = 0, .child_pid = 0};
    if (perf_boot_recv(&link, PERF_MSG_HELLO, hello, sizeof(hello), 10000) != 0) {
      close(fd);
      continue;
    }
    uint32_t peer = perf_get32(hello), peer_n = perf_get32(hello + 4);
    if (peer_n != (uint32_t)nranks || peer == 0 || peer >= (uint32_t)nranks ||
        g->links[peer].fd >= 0) {
      fprintf(stderr, "agoq-perf: rank 0: a peer claims rank %u of %u (expected 1..%d of %d, "
              "each once)\n", peer, peer_n, nranks - 1, nranks);
      perf_boot_send(&link, PERF_MSG_ERROR, NULL, 0);
      close(fd);
      continue;
    }
    g->links[peer] = link;
    joined++;
  }
  close(lfd);
  rc = joined == nranks ? 0 : -1;
out:
  freeaddrinfo(res);
  if (rc != 0) perf_group_close(g);
  return rc;
}

int perf_group_gather(perf_group* g, const void* mine, void* all, uint32_t len, int timeout_ms) {
  if (g->rank != 0) return perf_boot_send(&g->up, PERF_MSG_GATHER, mine, len);
  if (len > 0) memcpy(all, mine, len);
  for (int k = 1; k < g->nranks; k++)
    if (perf_boot_recv(&g->links[k], PERF_MSG_GATHER, (uint8_t*)all + (size_t)k * len, len,
                       timeout_ms) != 0) {
      fprintf(stderr, "agoq-perf: rank 0: no answer from rank %d\n", k);
      return -1;
    }
  return 0;
}

int perf_group_bcast(perf_group* g, void* buf, uint32_t len, int timeout_ms) {
  if (g->rank != 0) return perf_boot_recv(&g->up, PERF_MSG_BCAST, buf, len, timeout_ms);
  for (int k = 1; k < g->nranks; k++)
    if (perf_boot_send(&g->links[k], PERF_MSG_BCAST, buf, len) != 0) return -1;
  return 0;
}

int perf_group_allgather(perf_group* g, const void* mine, void* all, uint32_t len,
                         int timeout_ms) {
  if (perf_group_gather(g, mine, all, len, timeout_ms) != 0) return -1;
  uint64_t total = (uint64_t)len * (uint64_t)g->nranks;
  if (total > UINT32_MAX) return -1;
  return perf_group_bcast(g, all, (uint32_t)total, timeout_ms);
}

int perf_group_barrier(perf_group* g, int timeout_ms) {
  uint8_t none = 0;
  return perf_group_allgather(g, &none, NULL, 0, timeout_ms);
}

int perf_group_send_to(perf_group* g, int peer, const void* buf, uint32_t len) {
  perf_boot* b = g->rank == 0 ? &g->links[peer] : &g->up;
  return perf_boot_send(b, PERF_MSG_DATA, buf, len);
}

int perf_group_recv_from(perf_group* g, int peer, void* buf, uint32_t len, int timeout_ms) {
  perf_boot* b = g->rank == 0 ? &g->links[peer] : &g->up;
  return perf_boot_recv(b, PERF_MSG_DATA, buf, len, timeout_ms);
}

int perf_group_peer_failed(perf_group* g) {
  if (g->rank != 0) return g->up.fd >= 0 && perf_boot_peer_failed(&g->up);
  for (int k = 1; k < g->nranks; k++)
    if (g->links[k].fd >= 0 && perf_boot_peer_failed(&g->links[k])) return k;
  return 0;
}

void perf_group_abort(perf_group* g) {
  if (g->rank != 0) {
    if (g->up.fd >= 0) perf_boot_send(&g->up, PERF_MSG_ERROR, NULL, 0);
    return;
  }
  for (int k = 1; k < g->nranks; k++)
    if (g->links[k].fd >= 0) {
      /* A rank that is gone makes this send fail; that is expected here. */
      uint8_t hdr[8];
      perf_put32(hdr, PERF_MSG_ERROR);
      perf_put32(hdr + 4, 0);
      (void)!send(g->links[k].fd, hdr, sizeof(hdr), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
}

int perf_group_finish(perf_group* g) {
  int worst = 0;
  if (g->rank != 0 || g->links == NULL) return 0;
  for (int k = 1; k < g->nranks; k++) {
    if (g->links[k].fd >= 0) {
      close(g->links[k].fd);
      g->links[k].fd = -1;
    }
    int rc = perf_boot_finish(&g->links[k]);
    if (rc != 0) {
      fprintf(stderr, "agoq-perf: rank %d exited with %d\n", k, rc);
      worst = 1;
    }
  }
  return worst;
}

void perf_group_close(perf_group* g) {
  perf_boot_close(&g->up);
  if (g->links != NULL) {
    for (int k = 1; k < g->nranks; k++) perf_boot_close(&g->links[k]);
    free(g->links);
    g->links = NULL;
  }
}
