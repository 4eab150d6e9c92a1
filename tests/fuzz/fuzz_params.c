/* libFuzzer target: AGOQ_* values come from the user's environment. Every parameter's
 * parser must accept or reject any text with a message, never crash, and an accepted
 * INT/SIZE value must lie in its declared range (or, for a size with keywords, name one of
 * them). The same text also goes through the
 * other readers of the environment: NCCL's variables as NCCL reads them (agoq_nccl_env.h)
 * and the AGOQ_STATS_FILE pattern expansion (%h, %p, %%), which must stay inside its
 * buffer and NUL-terminate whatever it accepts. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_nccl_env.h"
#include "core/agoq_params.h"
#include "core/agoq_stats.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int64_t fuzz_count_choices(const char* choices) {
  int64_t n = 1;
  for (const char* c = choices; *c != '\0'; c++) n += *c == '|';
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  agoq_param_id id = (agoq_param_id)(data[0] % AGOQ_PARAM_COUNT);
  char* text = malloc(size);
  if (text == NULL) return 0;
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  const agoq_param_desc* d = agoq_param_describe(id);
  int64_t value = 0;
  char err[512];
  if (agoq_param_parse(d, text, &value, err, sizeof err) == ncclSuccess) {
    /* A size's keyword k (its choices) is the value -(k + 1): in [-(choices), -1]. */
    bool keyword = d->type == AGOQ_PARAM_TYPE_SIZE && d->choices != NULL && value < 0;
    if (keyword && -value > fuzz_count_choices(d->choices)) abort();
    if (!keyword && (d->type == AGOQ_PARAM_TYPE_INT || d->type == AGOQ_PARAM_TYPE_SIZE) &&
        (value < d->min || value > d->max))
      abort();
  } else if (err[0] == '\0' || strstr(err, d->name) == NULL) {
    abort(); /* a rejection must name the variable */
  }
  (void)agoq_nccl_param_parse(text, 16384);
  (void)agoq_nccl_config_int_parse(text, -7);
  int level = agoq_nccl_debug_level_parse(text);
  if (level < -1 || level > NCCL_LOG_TRACE) abort();
  char path[64], why[128] = "";
  memset(path, 0x5a, sizeof path);
  if (agoq_stats_expand_path(text, "host-name", 4242, path, sizeof path, why, sizeof why)) {
    if (memchr(path, '\0', sizeof path) == NULL) abort();
  } else if (why[0] == '\0') {
    abort(); /* a refusal says why */
  }
  free(text);
  return 0;
}
