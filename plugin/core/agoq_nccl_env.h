/*
 * NCCL's own environment variables, read exactly as NCCL 2.28.9 reads them. agoq reads an
 * NCCL variable only to know what NCCL will do with it (e.g. which p2p sends NCCL runs as
 * LL); a different reading would make agoq's idea of NCCL's behaviour wrong, so every
 * such read in plugin/ goes through here. AGOQ_* parameters are not read here
 * (plugin/core/agoq_params.def).
 *
 * Where the values come from: NCCL's ncclGetEnv() is getenv() behind its env plugin. Before
 * anything else, NCCL's ncclInitEnv() (src/misc/param.cc initEnv) copies NCCL_CONF_FILE, or
 * else ~/.nccl.conf, and then /etc/nccl.conf into the environment with setenv(name, value,
 * 0): a variable already set wins. NCCL does that before it loads any plugin, so getenv()
 * in the plugin sees the files' values too. An external env plugin (NCCL_ENV_PLUGIN) may
 * answer differently; agoq cannot see it. agoq's own tools run without NCCL: there the
 * files are not applied.
 */
#ifndef AGOQ_NCCL_ENV_H
#define AGOQ_NCCL_ENV_H

#include <stdint.h>

/* The value as NCCL's ncclGetEnv() returns it: NULL when unset; an empty string is
 * returned as it is (callers that follow NCCL decide what empty means). */
const char* agoq_nccl_env_str(const char* name);

/* An NCCL_PARAM integer (src/include/param.h, src/misc/param.cc ncclLoadParam):
 * unset or empty: the default; otherwise strtoll(value, NULL, 0), i.e. leading white
 * space skipped, an optional sign, 0x = hex, a leading 0 = octal, the longest number
 * prefix taken and the rest ignored ("1048576 " = 1048576, "12abc" = 12), no digits at all
 * = 0 ("abc" = 0); out of int64_t range (errno set): the default. Negative values stand. */
int64_t agoq_nccl_param_parse(const char* value, int64_t deflt);
/* agoq_nccl_param_parse(getenv(name), deflt). Unlike NCCL it does not cache: callers read
 * once at init, where NCCL has read (and cached) it as well. */
int64_t agoq_nccl_param(const char* name, int64_t deflt);

/* A communicator-config override (src/init.cc envConfigOverride, e.g. NCCL_COLLNET_ENABLE):
 * unset: `undef`; set: (int)strtol(value, NULL, 0) with no error check, so "" and "abc"
 * are 0 and an out-of-range value is LONG_MIN/LONG_MAX truncated to int. NCCL re-reads
 * these at every communicator init. */
int agoq_nccl_config_int_parse(const char* value, int undef);
int agoq_nccl_config_int(const char* name, int undef);

/* NCCL_DEBUG's level (src/debug.cc ncclDebugInit): unset: NCCL_LOG_NONE; "VERSION",
 * "WARN", "INFO", "ABORT", "TRACE" compared without case; any other value, "" included:
 * -1, which NCCL treats as below NONE (nothing printed). Returns an ncclDebugLogLevel
 * value or -1. */
int agoq_nccl_debug_level_parse(const char* value);

#endif
