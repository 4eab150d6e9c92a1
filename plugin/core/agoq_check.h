/*
 * One set of check macros for the whole plugin. Every NCCL-facing function returns an
 * ncclResult_t; internal calls propagate it with AGOQ_CHECK (early return) or
 * AGOQ_CHECK_GOTO (unwind through a cleanup label). System calls use AGOQ_SYSCHECK_GOTO,
 * which logs errno and maps it to ncclSystemError.
 */
#ifndef AGOQ_CHECK_H
#define AGOQ_CHECK_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_log.h"

#define AGOQ_CHECK(call)                                                 \
  do {                                                                   \
    ncclResult_t agoq_res_ = (call);                                     \
    if (agoq_res_ != ncclSuccess && agoq_res_ != ncclInProgress) {       \
      AGOQ_INFO(NCCL_NET, "%s:%d -> %s", __FILE__, __LINE__, agoq_result_str(agoq_res_)); \
      return agoq_res_;                                                  \
    }                                                                    \
  } while (0)

#define AGOQ_CHECK_GOTO(call, res, label)                           \
  do {                                                              \
    (res) = (call);                                                 \
    if ((res) != ncclSuccess && (res) != ncclInProgress) {          \
      AGOQ_INFO(NCCL_NET, "%s:%d -> %s", __FILE__, __LINE__, agoq_result_str(res)); \
      goto label;                                                   \
    }                                                               \
  } while (0)

/* For calls returning -1 and setting errno. */
#define AGOQ_SYSCHECK_GOTO(expr, what, res, label)                                   \
  do {                                                                               \
    if ((expr) < 0) {                                                                \
      int agoq_errno_ = errno;                                                       \
      AGOQ_WARN("%s failed: %s (errno %d)", (what), strerror(agoq_errno_), agoq_errno_); \
      (res) = ncclSystemError;                                                       \
      goto label;                                                                    \
    }                                                                                \
  } while (0)

/* Zeroed allocation of n objects of *ptr's type; failure is a logged ncclSystemError. */
#define AGOQ_CALLOC_GOTO(ptr, n, res, label)                                         \
  do {                                                                               \
    (ptr) = calloc((n), sizeof(*(ptr)));                                             \
    if ((ptr) == NULL) {                                                             \
      AGOQ_WARN("out of memory allocating %zu bytes", (size_t)(n) * sizeof(*(ptr))); \
      (res) = ncclSystemError;                                                       \
      goto label;                                                                    \
    }                                                                                \
  } while (0)

/* An argument NCCL should never pass: log it and fail with ncclInternalError (misuse by core). */
#define AGOQ_ARG_CHECK(cond, res, label)                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      AGOQ_WARN("%s: invalid argument (%s)", __func__, #cond);            \
      (res) = ncclInternalError;                                          \
      goto label;                                                         \
    }                                                                     \
  } while (0)

#endif
