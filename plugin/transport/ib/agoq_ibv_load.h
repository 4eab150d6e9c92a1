/*
 * libibverbs at run time: the library is dlopened (AGOQ_IB_LIBRARY, default
 * libibverbs.so.1) and every entry point bound with dlvsym to the version agoq was written
 * against, so a newer library with a changed default symbol still gives the old ABI. The
 * data path (post_send, post_recv, poll_cq) is not exported by libibverbs: as verbs.h's
 * inline functions do, it goes through the context's ops.
 *
 * No NCCL here: failures come back as an errno and a one-line reason the caller logs.
 */
#ifndef AGOQ_IBV_LOAD_H
#define AGOQ_IBV_LOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "transport/ib/agoq_ibv.h"

#define AGOQ_IBV_DEFAULT_LIBRARY "libibverbs.so.1"

typedef struct agoq_ibv_api {
#define AGOQ_IBV_API_MEMBER(name, sym, ver, required, ret, params) ret(*name) params;
  AGOQ_IBV_FUNCTIONS(AGOQ_IBV_API_MEMBER)
#undef AGOQ_IBV_API_MEMBER
  void* handle;   /* dlopen handle; NULL when not loaded */
  char path[256]; /* what was loaded, for log lines */
} agoq_ibv_api;

/* Loads `path` (NULL: AGOQ_IBV_DEFAULT_LIBRARY) and binds every entry point; optional ones
 * (query_gid_ex, reg_mr_iova2, reg_dmabuf_mr) stay NULL when the library predates them.
 * Returns 0, or an errno with `why` saying what is missing (ENOENT: the library could not
 * be opened; ENOSYS: a required symbol at its version is absent). */
int agoq_ibv_api_load(const char* path, agoq_ibv_api* api, char* why, size_t why_len);
void agoq_ibv_api_unload(agoq_ibv_api* api);

static inline int agoq_ibv_post_send(struct agoq_ibv_qp* qp, struct agoq_ibv_send_wr* wr,
                                     struct agoq_ibv_send_wr** bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
static inline int agoq_ibv_post_recv(struct agoq_ibv_qp* qp, struct agoq_ibv_recv_wr* wr,
                                     struct agoq_ibv_recv_wr** bad) {
  return qp->context->ops.post_recv(qp, wr, bad);
}
static inline int agoq_ibv_poll_cq(struct agoq_ibv_cq* cq, int n, struct agoq_ibv_wc* wc) {
  return cq->context->ops.poll_cq(cq, n, wc);
}

#endif
