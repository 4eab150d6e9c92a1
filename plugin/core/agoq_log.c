#include "core/agoq_log.h"

#include "core/agoq_nccl_env.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdio_ext.h>
#include <unistd.h>

static _Atomic(ncclDebugLogger_t) agoq_logger; /* zero: no NCCL logger yet */

void agoq_log_set_logger(ncclDebugLogger_t logger) { atomic_store(&agoq_logger, logger); }

static ncclDebugLogLevel agoq_log_stderr_level(void) {
  /* Read each time: tools set the variable before the first line and it costs nothing
   * next to the write itself. */
  const char* v = getenv("AGOQ_DEBUG");
  if (v == NULL || *v == '\0') {
    /* NCCL_DEBUG as NCCL reads it: its five names, any other value (NONE, a typo, "")
     * prints nothing. Unset, NCCL prints nothing either; agoq's tools, which have no NCCL,
     * still show WARN lines then, so that their errors are never silent. */
    const char* nccl = agoq_nccl_env_str("NCCL_DEBUG");
    if (nccl == NULL) return NCCL_LOG_WARN;
    int level = agoq_nccl_debug_level_parse(nccl);
    return level < 0 ? NCCL_LOG_NONE : (ncclDebugLogLevel)level;
  }
  if (strcasecmp(v, "TRACE") == 0) return NCCL_LOG_TRACE;
  if (strcasecmp(v, "INFO") == 0) return NCCL_LOG_INFO;
  if (strcasecmp(v, "VERSION") == 0) return NCCL_LOG_VERSION;
  if (strcasecmp(v, "NONE") == 0) return NCCL_LOG_NONE;
  return NCCL_LOG_WARN;
}

static _Atomic(agoq_log_tap_fn) agoq_log_tap;

void agoq_log_stderr_set_tap(agoq_log_tap_fn tap) { atomic_store(&agoq_log_tap, tap); }

void agoq_log_stderr(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                     const char* fmt, ...) {
  (void)flags;
  ncclDebugLogLevel max = agoq_log_stderr_level();
  bool shown = level != NCCL_LOG_NONE && (level <= max || level == NCCL_LOG_ABORT);
  agoq_log_tap_fn tap = atomic_load(&agoq_log_tap);
  if (!shown && tap == NULL) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (tap != NULL) tap(level, msg); /* every line, whatever the level shows */
  if (!shown) return;
  /* A tool's stdout into a file is fully buffered while stderr is not: without this its
   * pending bytes would go out after our line and a buffer written out mid-line would
   * have this line spliced into it (`agoq-info -c >f 2>&1`). A line-buffered stdout has
   * written every whole line already and holds at most a partial one, which must stay
   * put until its newline, so only a fully buffered one is flushed. */
  if (!__flbf(stdout)) fflush(stdout);
  const char* tag = level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "TRACE";
  if (level == NCCL_LOG_WARN || level == NCCL_LOG_TRACE)
    fprintf(stderr, "[%d] %s %s:%d %s\n", (int)getpid(), tag, file, line, msg);
  else
    fprintf(stderr, "[%d] %s %s\n", (int)getpid(), tag, msg);
}

const char* agoq_result_str(ncclResult_t res) {
  /* Meanings as NCCL's own documentation words them, from the caller's side. */
  static const char* const names[] = {
      [ncclSuccess] = "ncclSuccess, 0: no error",
      [ncclUnhandledCudaError] = "ncclUnhandledCudaError, 1: a CUDA call failed",
      [ncclSystemError] = "ncclSystemError, 2: a system call, socket or allocation failed",
      [ncclInternalError] = "ncclInternalError, 3: an internal error (a bug or a corrupted message)",
      [ncclInvalidArgument] = "ncclInvalidArgument, 4: an invalid argument",
      [ncclInvalidUsage] = "ncclInvalidUsage, 5: invalid usage (a call out of order or a bad setting)",
      [ncclRemoteError] = "ncclRemoteError, 6: a peer failed or a connection broke",
      [ncclInProgress] = "ncclInProgress, 7: still in progress",
  };
  if ((unsigned)res < sizeof(names) / sizeof(names[0]) && names[res] != NULL) return names[res];
  static _Thread_local char unknown[40];
  snprintf(unknown, sizeof unknown, "unknown result %d", (int)res);
  return unknown;
}

void agoq_log_emit(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ncclDebugLogger_t logger = atomic_load(&agoq_logger);
  /* NCCL's logger is variadic; hand it a preformatted string so a '%' in our text
   * (an interface name, a path) is never interpreted twice. */
  if (logger != NULL)
    logger(level, flags, file, line, "%s", msg);
  else
    agoq_log_stderr(level, flags, file, line, "%s", msg);
}
