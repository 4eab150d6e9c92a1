/* agoq-info: options and dispatch. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "agoq_info.h"
#include "core/agoq_log.h"

static void agoq_info_usage(FILE* out) {
  fputs("usage: agoq-info [--lib PATH] [--json]\n"
        "       agoq-info -c [--markdown]\n"
        "\n"
        "Without -c: loads the plugin as NCCL would and prints its version, features, the\n"
        "exported net/collnet/profiler/tuner ABI versions and every device as NCCL will\n"
        "see it.\n"
        "\n"
        "  --lib PATH     plugin to load (default: $AGOQ_PLUGIN_PATH, else\n"
        "                 ../lib/libnccl-net-agoq.so relative to agoq-info)\n"
        "  --json         print the device view as JSON\n"
        "  -c, --config   print every AGOQ_* parameter: value in effect, its source, default,\n"
        "                 allowed values, documentation; exit 1 if a value is invalid\n"
        "  --markdown     with -c: print docs/configuration.md instead (independent of the\n"
        "                 environment)\n"
        "  -h, --help     this text\n"
        "\n"
        "Log lines follow NCCL_DEBUG (or AGOQ_DEBUG): WARN by default, INFO for more.\n",
        out);
}

int main(int argc, char** argv) {
  enum { OPT_LIB = 256, OPT_JSON, OPT_MARKDOWN };
  static const struct option options[] = {
      {"config", no_argument, NULL, 'c'},
      {"help", no_argument, NULL, 'h'},
      {"lib", required_argument, NULL, OPT_LIB},
      {"json", no_argument, NULL, OPT_JSON},
      {"markdown", no_argument, NULL, OPT_MARKDOWN},
      {NULL, 0, NULL, 0},
  };
  bool config = false, markdown = false, json = false;
  const char* lib = NULL;
  int opt;
  while ((opt = getopt_long(argc, argv, "ch", options, NULL)) != -1) {
    switch (opt) {
      case 'c': config = true; break;
      case 'h': agoq_info_usage(stdout); return 0;
      case OPT_LIB: lib = optarg; break;
      case OPT_JSON: json = true; break;
      case OPT_MARKDOWN: markdown = true; break;
      default: agoq_info_usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "agoq-info: unexpected argument '%s'\n", argv[optind]);
    agoq_info_usage(stderr);
    return 2;
  }
  if (markdown && !config) {
    fputs("agoq-info: --markdown goes with -c\n", stderr);
    return 2;
  }
  if (config && (json || lib != NULL)) {
    fputs("agoq-info: -c takes neither --json nor --lib\n", stderr);
    return 2;
  }

  /* NCCL-style lines on stderr, leaving stdout to the report. */
  agoq_log_set_logger(agoq_log_stderr);

  int rc;
  if (config && markdown) {
    agoq_info_config_markdown(stdout);
    rc = 0;
  } else if (config) {
    rc = agoq_info_config_text(stdout);
  } else {
    rc = agoq_info_devices(stdout, lib, json);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    perror("agoq-info: writing stdout");
    return 1;
  }
  return rc;
}
