/*
 * Logging: every message goes through NCCL's logger (saved at init) with the prefix
 * "NET/AGOQ", so users see it next to NCCL's own lines under NCCL_DEBUG. Tools and tests
 * that have no NCCL get a stderr logger with the same format.
 */
#ifndef AGOQ_LOG_H
#define AGOQ_LOG_H

#include "abi/agoq_nccl_common.h"

#define AGOQ_LOG_PREFIX "NET/AGOQ "

/* Installs NCCL's logger; NULL restores the stderr logger. Safe to call repeatedly. */
void agoq_log_set_logger(ncclDebugLogger_t logger);

/* The stderr logger used when NCCL gave us none. It prints WARN always and INFO/TRACE
 * when NCCL_DEBUG (or AGOQ_DEBUG) says so, matching what users expect of NCCL. */
void agoq_log_stderr(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                     const char* fmt, ...) __attribute__((format(printf, 5, 6)));

/* For tools that read the plugin's own lines (agoq-info's summary of what is in effect,
 * agoq-perf's statistics): the stderr logger hands tap every line, formatted, at any level
 * and before its level filter, then prints as usual. One tap per process; NULL removes it. */
typedef void (*agoq_log_tap_fn)(ncclDebugLogLevel level, const char* msg);
void agoq_log_stderr_set_tap(agoq_log_tap_fn tap);

/* An NCCL result as people read it, for every message that reports one: the enum's name,
 * its number and a short meaning, "ncclRemoteError, 6: a peer failed or a connection
 * broke", so "failed (%s)" reads "failed (ncclRemoteError, 6: ...)". A value outside the
 * enum gives "unknown result N" (N kept: it is the only clue); that text lives in a
 * per-thread buffer, valid until this thread's next call with an unknown value. */
const char* agoq_result_str(ncclResult_t res);

void agoq_log_emit(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) __attribute__((format(printf, 5, 6)));

#define AGOQ_WARN(fmt, ...) \
  agoq_log_emit(NCCL_LOG_WARN, NCCL_ALL, __FILE__, __LINE__, AGOQ_LOG_PREFIX fmt, ##__VA_ARGS__)
#define AGOQ_INFO(flags, fmt, ...) \
  agoq_log_emit(NCCL_LOG_INFO, (flags), __FILE__, __LINE__, AGOQ_LOG_PREFIX fmt, ##__VA_ARGS__)
#ifdef AGOQ_ENABLE_TRACE
#define AGOQ_TRACE(flags, fmt, ...) \
  agoq_log_emit(NCCL_LOG_TRACE, (flags), __FILE__, __LINE__, AGOQ_LOG_PREFIX fmt, ##__VA_ARGS__)
#else
#define AGOQ_TRACE(flags, fmt, ...) \
  do {                              \
  } while (0)
#endif

#endif
