/* NCCL's variables read as NCCL reads them (see agoq_nccl_env.h for the sources). The
 * conversions are libc's own strtoll/strtol, the functions NCCL calls, so prefixes, bases,
 * white space and range errors behave identically in the same process. */
#include "core/agoq_nccl_env.h"

#include <errno.h>
#include <stdlib.h>
#include <strings.h>

#include "abi/agoq_nccl_common.h"

const char* agoq_nccl_env_str(const char* name) { return name != NULL ? getenv(name) : NULL; }

int64_t agoq_nccl_param_parse(const char* value, int64_t deflt) {
  if (value == NULL || value[0] == '\0') return deflt;
  /* errno is the only error NCCL looks at: "abc" converts to 0 without one. */
  int saved = errno;
  errno = 0;
  long long v = strtoll(value, NULL, 0);
  int64_t out = errno != 0 ? deflt : (int64_t)v;
  errno = saved;
  return out;
}

int64_t agoq_nccl_param(const char* name, int64_t deflt) {
  return agoq_nccl_param_parse(agoq_nccl_env_str(name), deflt);
}

int agoq_nccl_config_int_parse(const char* value, int undef) {
  if (value == NULL) return undef;
  int saved = errno;
  int v = (int)strtol(value, NULL, 0); /* NCCL's cast: no range check */
  errno = saved;
  return v;
}

int agoq_nccl_config_int(const char* name, int undef) {
  return agoq_nccl_config_int_parse(agoq_nccl_env_str(name), undef);
}

int agoq_nccl_debug_level_parse(const char* value) {
  static const struct {
    const char* name;
    int level;
  } levels[] = {{"VERSION", NCCL_LOG_VERSION}, {"WARN", NCCL_LOG_WARN},
                {"INFO", NCCL_LOG_INFO},       {"ABORT", NCCL_LOG_ABORT},
                {"TRACE", NCCL_LOG_TRACE}};
  if (value == NULL) return NCCL_LOG_NONE;
  for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
    if (strcasecmp(value, levels[i].name) == 0) return levels[i].level;
  return -1;
}
