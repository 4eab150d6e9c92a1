/* The verbs transport on real hardware: where the system's libibverbs finds an ACTIVE
 * port, the conformance harness runs over it (AGOQ_TRANSPORT=ib, the real library);
 * elsewhere the test skips (exit 77) with the first rung that failed as its reason.
 *   test_ib_real_device HARNESS PLUGIN */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/ib/agoq_ibv_load.h"

#define SKIP 77

/* 1 when some port of some device is ACTIVE; else 0 with why. */
static int find_active_port(agoq_ibv_api* api, char* why, size_t why_len) {
  int n = 0;
  errno = 0;
  struct agoq_ibv_device** list = api->get_device_list(&n);
  if (list == NULL) {
    int err = errno;
    snprintf(why, why_len, "no RDMA device (ibv_get_device_list: %s%s)", strerror(err),
             err == ENOSYS ? "; the kernel has no RDMA support" : "");
    return 0;
  }
  int found = 0;
  size_t len = (size_t)snprintf(why, why_len, "no RDMA device with an ACTIVE port (%d device%s:", n, n == 1 ? "" : "s");
  for (int i = 0; i < n && !found; i++) {
    struct agoq_ibv_context* ctx = api->open_device(list[i]);
    if (ctx == NULL) {
      len += (size_t)snprintf(why + len, len < why_len ? why_len - len : 0, " %s cannot be opened: %s;",
                              list[i]->name, strerror(errno));
      continue;
    }
    struct agoq_ibv_device_attr dattr;
    memset(&dattr, 0, sizeof dattr);
    if (api->query_device(ctx, &dattr) == 0) {
      for (int p = 1; p <= dattr.phys_port_cnt && !found; p++) {
        struct agoq_ibv_port_attr pa;
        memset(&pa, 0, sizeof pa);
        if (api->query_port(ctx, (uint8_t)p, &pa) != 0) continue;
        found = pa.state == AGOQ_IBV_PORT_ACTIVE;
        if (!found)
          len += (size_t)snprintf(why + len, len < why_len ? why_len - len : 0, " %s:%d state %d;", list[i]->name, p,
                                  pa.state);
      }
    }
    api->close_device(ctx);
  }
  if (len < why_len) snprintf(why + len, why_len - len, ")");
  api->free_device_list(list);
  return found;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s HARNESS PLUGIN\n", argv[0]);
    return 2;
  }
  agoq_ibv_api api;
  char why[1024];
  if (agoq_ibv_api_load(AGOQ_IBV_DEFAULT_LIBRARY, &api, why, sizeof why) != 0) {
    printf("skip: no RDMA device (%s)\n", why);
    return SKIP;
  }
  int active = find_active_port(&api, why, sizeof why);
  agoq_ibv_api_unload(&api);
  if (!active) {
    printf("skip: %s\n", why);
    return SKIP;
  }
  printf("an ACTIVE port exists: the conformance harness runs over the real device\n");
  fflush(stdout);
  setenv("AGOQ_TRANSPORT", "ib", 1);
  unsetenv("AGOQ_IB_LIBRARY");
  char* args[] = {argv[1], "--lib", argv[2], "--scenario", "sizes", "--scenario", "inflight", "--scenario", "grouped",
                  "--scenario", "order", "--scenario", "truncation", "--timeout-s", "280", NULL};
  execv(argv[1], args);
  fprintf(stderr, "cannot run %s: %s\n", argv[1], strerror(errno));
  return 1;
}
