/* libFuzzer target: hwloc XML is what agoq-topo --xml and the golden tests read, and
 * anyone can write it. Every input goes through agoq_topo_xml_check (the strict validator
 * agoq-topo runs before hwloc); only documents it accepts reach hwloc, which must then not
 * crash (hwloc 2.9 does on many documents the check refuses). Whatever hwloc accepts, our
 * conversion, path rules, NIC choice and JSON output must neither crash nor produce
 * out-of-range results. The seed corpus is the fixtures of tests/fixtures/topo (hand-written,
 * their lstopo round trips, synthetic machines with distances and memattrs, hwloc 1.x)
 * plus inputs that crashed hwloc before the check existed (regress-hwloc-*). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_topo.h"
#include "agoq_topo_xml_check.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static agoq_topo t;
  static FILE* sink;
  if (size == 0 || size > (1u << 20)) return 0;
  if (sink == NULL) sink = fopen("/dev/null", "w");
  char why[256];
  if (agoq_topo_xml_check((const char*)data, size, why, sizeof why) != 0) {
    if (why[0] == '\0') abort(); /* a refusal always says why */
    return 0;
  }
  /* hwloc wants the terminating NUL counted in the size. */
  char* buf = malloc(size + 1);
  if (buf == NULL) return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';
  int rc = agoq_topo_load_xml_buffer(buf, (int)size + 1, &t);
  free(buf);
  if (rc != AGOQ_TOPO_OK) return 0;
  if (t.ngpus > AGOQ_TOPO_MAX_GPUS || t.nnics > AGOQ_TOPO_MAX_NICS || t.nnuma > AGOQ_TOPO_MAX_NUMA) abort();
  agoq_topo_choice c;
  agoq_topo_choose(&t, &c);
  for (int g = 0; g < t.ngpus; g++) {
    if (c.nic[g] < -1 || c.nic[g] >= t.nnics) abort();
    if (t.nnics > 0 && c.nic[g] < 0) abort(); /* a GPU always gets a NIC when there is one */
    if (c.path[g] < AGOQ_TOPO_PATH_LOC || c.path[g] > AGOQ_TOPO_PATH_SYS) abort();
  }
  if (sink != NULL) {
    agoq_topo_print_json(sink, &t, &c);
    agoq_topo_print_text(sink, &t, &c);
  }
  return 0;
}
