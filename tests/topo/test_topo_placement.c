/* AGOQ_PLACEMENT: progress threads pinned to the CPUs of their interface's NUMA node, only
 * inside the process's allowed set, and not at all with none. Drives the real worker pool
 * with a loopback TCP stream; the interface's NUMA node is set by hand. */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/agoq_params.h"
#include "transport/tcp/agoq_tcp.h"
#include "transport/tcp/agoq_tcp_progress.h"

static int fds[3] = {-1, -1, -1}; /* listener, client, server side */

/* A connected loopback TCP pair: the stream's local address is 127.0.0.1 = ifs[0]. */
static void loopback_pair(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(bind(fds[0], (struct sockaddr*)&a, sizeof a), 0);
  assert_int_equal(listen(fds[0], 1), 0);
  assert_int_equal(getsockname(fds[0], (struct sockaddr*)&a, &len), 0);
  fds[1] = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(fds[1], (struct sockaddr*)&a, sizeof a), 0);
  fds[2] = accept(fds[0], NULL, NULL);
  assert_true(fds[2] >= 0);
}

static void config_lo(int numa, const cpu_set_t* cpus) {
  memset(&agoq_config, 0, sizeof agoq_config);
  agoq_config.nifs = 1;
  agoq_netif* nif = &agoq_config.ifs[0];
  strcpy(nif->name, "lo");
  struct sockaddr_in* in = (struct sockaddr_in*)&nif->addr;
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  nif->addr_len = sizeof *in;
  nif->numa_node = numa;
  nif->has_local_cpus = cpus != NULL;
  if (cpus != NULL) nif->local_cpus = *cpus;
}

/* Starts the pool by attaching one stream, returns the workers' NUMA nodes in numa[]. */
static int run_pool(const char* placement, int* numa, cpu_set_t* aff) {
  setenv("AGOQ_PLACEMENT", placement, 1);
  setenv("AGOQ_SOCKET_NTHREADS", "2", 1);
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclSuccess);
  agoq_stream* s = calloc(1, sizeof *s);
  assert_non_null(s);
  atomic_int err = 0;
  s->fd = fds[1];
  s->is_send = true;
  s->comm_error = &err;
  s->peer = "test";
  assert_int_equal(agoq_progress_attach(s), ncclSuccess);
  int n = agoq_progress_nworkers();
  for (int i = 0; i < n; i++) numa[i] = agoq_progress_worker_numa(i, &aff[i]);
  agoq_progress_detach(s);
  agoq_progress_shutdown();
  free(s);
  return n;
}

static void test_pinned_inside_allowed(void** state) {
  (void)state;
  cpu_set_t allowed, node;
  assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  /* The "node" holds the first allowed CPU and one CPU the process may not use. */
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
    if (CPU_ISSET(c, &allowed)) first = c;
  CPU_ZERO(&node);
  CPU_SET(first, &node);
  if (!CPU_ISSET(CPU_SETSIZE - 1, &allowed)) CPU_SET(CPU_SETSIZE - 1, &node);
  config_lo(3, &node);
  int numa[2];
  cpu_set_t aff[2];
  assert_int_equal(run_pool("auto", numa, aff), 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(numa[i], 3);
    assert_int_equal(CPU_COUNT(&aff[i]), 1);
    assert_true(CPU_ISSET(first, &aff[i]));
  }
}

static void test_no_pinning(void** state) {
  (void)state;
  cpu_set_t allowed, outside;
  assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int numa[2];
  cpu_set_t aff[2];
  /* none: not pinned, whatever the topology says. */
  config_lo(0, &allowed);
  assert_int_equal(run_pool("none", numa, aff), 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(numa[i], -1);
    assert_true(CPU_EQUAL(&aff[i], &allowed));
  }
  /* auto, but the node's CPUs are all outside the allowed set: not pinned. */
  CPU_ZERO(&outside);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (!CPU_ISSET(c, &allowed)) CPU_SET(c, &outside);
  config_lo(1, &outside);
  assert_int_equal(run_pool("auto", numa, aff), 2);
  for (int i = 0; i < 2; i++) assert_int_equal(numa[i], -1);
  /* auto, NUMA node unknown: not pinned. */
  config_lo(-1, NULL);
  assert_int_equal(run_pool("auto", numa, aff), 2);
  for (int i = 0; i < 2; i++) assert_int_equal(numa[i], -1);
}

static void test_bad_value_rejected(void** state) {
  (void)state;
  setenv("AGOQ_PLACEMENT", "socket", 1);
  agoq_params_reset();
  assert_int_equal(agoq_params_load(), ncclInvalidUsage);
  unsetenv("AGOQ_PLACEMENT");
  agoq_params_reset();
}

static int setup(void** state) {
  (void)state;
  loopback_pair();
  return 0;
}

static int teardown(void** state) {
  (void)state;
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0) close(fds[i]);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pinned_inside_allowed),
      cmocka_unit_test(test_no_pinning),
      cmocka_unit_test(test_bad_value_rejected),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
