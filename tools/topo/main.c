/* agoq-topo: what topology/ sees and decides, for people (text) and scripts (JSON). */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "agoq_topo.h"

static void agoq_topo_usage(FILE* out) {
  fputs("usage: agoq-topo [--xml FILE | --sysfs [DIR]] [--json]\n"
        "\n"
        "Prints the GPUs, NICs and NUMA nodes of this machine (hwloc when it can be loaded,\n"
        "else sysfs), the GPU x NIC path matrix in NCCL's terms (PIX, PXB, PHB, SYS), and\n"
        "the NIC and CPUs chosen for each GPU.\n"
        "\n"
        "  --xml FILE     read an hwloc XML topology instead of this machine (an error if\n"
        "                 the file is missing or hwloc rejects it; never this machine)\n"
        "  --sysfs [DIR]  skip hwloc and read sysfs below DIR (default /sys)\n"
        "  --json         print JSON instead of text\n"
        "  -h, --help     this text\n",
        out);
}

int main(int argc, char** argv) {
  enum { OPT_XML = 256, OPT_JSON, OPT_SYSFS };
  static const struct option options[] = {
      {"xml", required_argument, NULL, OPT_XML},
      {"json", no_argument, NULL, OPT_JSON},
      {"sysfs", optional_argument, NULL, OPT_SYSFS},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char* xml = NULL;
  const char* sysfs = NULL;
  bool json = false;
  int opt;
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    switch (opt) {
      case OPT_XML: xml = optarg; break;
      case OPT_JSON: json = true; break;
      case OPT_SYSFS: sysfs = optarg != NULL ? optarg : "/sys"; break;
      case 'h': agoq_topo_usage(stdout); return 0;
      default: agoq_topo_usage(stderr); return 2;
    }
  }
  if (optind != argc || (xml != NULL && sysfs != NULL)) {
    agoq_topo_usage(stderr);
    return 2;
  }

  agoq_topo* t = calloc(1, sizeof *t);
  if (t == NULL) {
    fputs("agoq-topo: out of memory\n", stderr);
    return 1;
  }
  int rc;
  if (xml != NULL) {
    rc = agoq_topo_load_xml(xml, t);
    if (rc == AGOQ_TOPO_ENOHWLOC) {
      char why[256];
      agoq_topo_hwloc_available(why, sizeof why);
      fprintf(stderr, "agoq-topo: --xml needs hwloc: %s\n", why);
    } else if (rc != AGOQ_TOPO_OK) {
      fprintf(stderr, "agoq-topo: %s: %s\n", xml, agoq_topo_strerror(rc));
    }
  } else if (sysfs != NULL) {
    rc = agoq_topo_discover_sysfs(sysfs, t);
    if (rc != AGOQ_TOPO_OK) fprintf(stderr, "agoq-topo: sysfs %s: %s\n", sysfs, agoq_topo_strerror(rc));
  } else {
    bool fallback = false;
    rc = agoq_topo_discover(t, &fallback);
    if (fallback) {
      char why[256];
      agoq_topo_hwloc_available(why, sizeof why);
      fprintf(stderr, "agoq-topo: hwloc unavailable (%s); using sysfs\n", why);
    }
    if (rc != AGOQ_TOPO_OK) fprintf(stderr, "agoq-topo: %s\n", agoq_topo_strerror(rc));
  }
  if (rc != AGOQ_TOPO_OK) {
    free(t);
    return 1;
  }
  agoq_topo_choice choice;
  agoq_topo_choose(t, &choice);
  if (json) agoq_topo_print_json(stdout, t, &choice);
  else agoq_topo_print_text(stdout, t, &choice);
  free(t);
  return ferror(stdout) ? 1 : 0;
}
