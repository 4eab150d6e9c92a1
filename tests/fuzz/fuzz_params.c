/* libFuzzer target: AGOQ_* values come from the user's environment. Every parameter's
 * parser must accept or reject any text with a message, never crash, and an accepted
 * INT/SIZE value must lie in its declared range. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/agoq_params.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

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
    if ((d->type == AGOQ_PARAM_TYPE_INT || d->type == AGOQ_PARAM_TYPE_SIZE) && (value < d->min || value > d->max))
      abort();
  } else if (err[0] == '\0' || strstr(err, d->name) == NULL) {
    abort(); /* a rejection must name the variable */
  }
  free(text);
  return 0;
}
