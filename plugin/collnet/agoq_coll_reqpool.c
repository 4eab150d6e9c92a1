/* A group's requests: the pool they come from (its lifetime is the engine's) and a request's
 * published end, which the engine writes and test() reads. Calls nothing else of CollNet's. */
#include <stdlib.h>

#include "collnet/agoq_coll_internal.h"
#include "core/agoq_check.h"
#include "net/agoq_net.h"

ncclResult_t agoq_coll_pool_init(agoq_coll_comm* g) {
  g->reqs = calloc(AGOQ_COLL_MAX_REQUESTS, sizeof *g->reqs);
  if (g->reqs == NULL) {
    AGOQ_WARN("out of memory allocating CollNet requests");
    return ncclSystemError;
  }
  for (int i = AGOQ_COLL_MAX_REQUESTS - 1; i >= 0; i--) {
    g->reqs[i].next = g->free_reqs;
    g->free_reqs = &g->reqs[i];
  }
  return ncclSuccess;
}

void agoq_coll_pool_fini(agoq_coll_comm* g) {
  if (g->reqs == NULL) return;
  /* After the link's destruction: a bounce buffer a failed request kept is no longer read. */
  for (int i = 0; i < AGOQ_COLL_MAX_REQUESTS; i++) {
    free(g->reqs[i].flat);
    agoq_net_dereg_host(g->reqs[i].bounce_key);
    free(g->reqs[i].bounce);
  }
  free(g->reqs);
  g->reqs = NULL;
  g->free_reqs = NULL;
}

void agoq_coll_req_finish(agoq_coll_req* req, ncclResult_t res) {
  req->error = res;
  atomic_store_explicit(&req->state, res == ncclSuccess ? AGOQ_COLL_REQ_DONE : AGOQ_COLL_REQ_FAILED,
                        memory_order_release);
}

