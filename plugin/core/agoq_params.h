/*
 * AGOQ_* parameters: one table (agoq_params.def) feeds parsing, validation, the NCCL_ENV
 * log lines, `agoq-info -c` and docs/configuration.md.
 */
#ifndef AGOQ_PARAMS_H
#define AGOQ_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/agoq_nccl_common.h"

/* Longest STRING value accepted (after trimming blanks). */
#define AGOQ_PARAM_STRING_MAX 255

typedef enum {
  AGOQ_PARAM_TYPE_INT,
  AGOQ_PARAM_TYPE_SIZE,
  AGOQ_PARAM_TYPE_BOOL,
  AGOQ_PARAM_TYPE_STRING,
  AGOQ_PARAM_TYPE_ENUM
} agoq_param_type;

typedef enum {
#define AGOQ_PARAM(id, type, def, min, max, choices, fallback, doc) AGOQ_PARAM_##id,
#include "core/agoq_params.def"
#undef AGOQ_PARAM
  AGOQ_PARAM_COUNT
} agoq_param_id;

typedef struct {
  const char* name;           /* "AGOQ_SOCKET_IFNAME" */
  agoq_param_type type;
  const char* default_value;  /* as text */
  int64_t min, max;           /* INT and SIZE */
  const char* choices;        /* ENUM: "a|b|c", else NULL */
  const char* nccl_fallback;  /* NCCL variable honoured when ours is unset, or NULL */
  const char* doc;
} agoq_param_desc;

const agoq_param_desc* agoq_param_describe(agoq_param_id id);
const char* agoq_param_type_name(agoq_param_type type);

/* Parses `text` as a value of `desc`; on success stores the integer form (INT, SIZE,
 * BOOL, ENUM index; 0 for STRING) in *value. On failure writes a message naming the
 * variable and the allowed values into err and returns ncclInvalidUsage. Pure: no
 * environment, no logging (fuzzed). */
ncclResult_t agoq_param_parse(const agoq_param_desc* desc, const char* text, int64_t* value,
                              char* err, size_t errlen);

/* Reads every AGOQ_* variable once per process (later calls return the first outcome),
 * validates it, logs "AGOQ_X set by environment to V." under NCCL_ENV. An invalid value
 * is a WARN naming the variable and the allowed values, and ncclInvalidUsage. */
ncclResult_t agoq_params_load(void);

/* Calls fn for every AGOQ_* variable of the environment that no part of agoq reads, with
 * its name (len bytes, not NUL-terminated there) and the closest parameter or NULL; returns
 * how many. The load WARNs for each through it; agoq-info -c lists them through it. */
int agoq_params_unknown_each(void (*fn)(void* arg, const char* name, size_t len, const char* closest), void* arg);

/* True when the first len bytes of name are a parameter, or a name agoq's tools and tests
 * read (agoq_env_other.def). */
bool agoq_param_name_known(const char* name, size_t len);

/* The parameter name closest to the first len bytes of name, when close enough to be a
 * plausible misspelling; else NULL. */
const char* agoq_param_closest(const char* name, size_t len);

/* Forgets the loaded values so the next agoq_params_load reads the environment again
 * (tests). Not thread-safe against concurrent readers. */
void agoq_params_reset(void);
/* Changes with every agoq_params_reset. */
unsigned agoq_params_generation(void);

/* Values after a successful load. Reading before any load loads first. After a failed
 * load an invalid parameter reports its text and variable but the default's number. */
int64_t agoq_param_int(agoq_param_id id);
const char* agoq_param_str(agoq_param_id id);
/* Where the value came from: "default", "AGOQ_X" or the NCCL fallback variable's name. */
const char* agoq_param_source(agoq_param_id id);

#endif
