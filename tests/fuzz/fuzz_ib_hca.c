/* libFuzzer target: NCCL_IB_HCA (or its agoq counterpart) comes from the user's
 * environment. The parser must accept or refuse any text, a refusal must say why, and an
 * accepted filter must hold only what the syntax allows (1..32 entries, names of 1..63
 * bytes, ports -1 or 1..255). On an accepted filter, match and describe must agree on
 * every device and port asked about, and describe must stay inside its buffer,
 * NUL-terminated, however small the buffer. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_ibport.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static void fuzz_ib_hca_probe(const agoq_ib_hca_filter* f, const char* dev) {
  static const int ports[] = {-1, 1, 2, 255};
  for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++) {
    bool match = agoq_ib_hca_filter_match(f, dev, ports[i]);
    char why[512], tiny[8];
    memset(why, 0x5a, sizeof why);
    memset(tiny, 0x5a, sizeof tiny);
    if (agoq_ib_hca_filter_describe(f, dev, ports[i], why, sizeof why) != (match ? 1 : 0)) abort();
    if (memchr(why, '\0', sizeof why) == NULL || why[0] == '\0') abort();
    if (agoq_ib_hca_filter_describe(f, dev, ports[i], tiny, sizeof tiny) != (match ? 1 : 0)) abort();
    if (memchr(tiny, '\0', sizeof tiny) == NULL) abort();
    if (agoq_ib_hca_filter_describe(f, dev, ports[i], NULL, 0) != (match ? 1 : 0)) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* spec = malloc(size + 1);
  if (spec == NULL) return 0;
  memcpy(spec, data, size);
  spec[size] = '\0';
  agoq_ib_hca_filter f;
  char err[256];
  memset(err, 0x5a, sizeof err);
  if (agoq_ib_hca_filter_parse(spec, &f, err, sizeof err) != 0) {
    if (memchr(err, '\0', sizeof err) == NULL || err[0] == '\0') abort(); /* a refusal says why */
    if (f.count != 0) abort();
    free(spec);
    return 0;
  }
  if (f.count < 0 || f.count > AGOQ_IB_HCA_FILTER_MAX) abort();
  if (f.count == 0 && spec[0] != '\0') abort(); /* only "" is no filter */
  for (int i = 0; i < f.count; i++) {
    size_t len = strnlen(f.entries[i].name, sizeof f.entries[i].name);
    if (len == 0 || len >= sizeof f.entries[i].name) abort();
    if (f.entries[i].port != -1 && (f.entries[i].port < 1 || f.entries[i].port > 255)) abort();
  }
  static const char* const devs[] = {"mlx5_0", "mlx5_1", "mlx5_11", "", "bnxt_re0"};
  for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) fuzz_ib_hca_probe(&f, devs[i]);
  fuzz_ib_hca_probe(&f, NULL);
  /* Each entry's own name, and a longer name it is a prefix of: the pitfall's two sides. */
  for (int i = 0; i < f.count && i < 4; i++) {
    char dev[AGOQ_IB_HCA_NAME_MAX + 2];
    snprintf(dev, sizeof dev, "%s", f.entries[i].name);
    fuzz_ib_hca_probe(&f, dev);
    if (!agoq_ib_hca_filter_match(&f, dev, f.entries[i].port) == !f.exclude) abort(); /* listed, so in or out */
    snprintf(dev, sizeof dev, "%s1", f.entries[i].name);
    fuzz_ib_hca_probe(&f, dev);
  }
  free(spec);
  return 0;
}
