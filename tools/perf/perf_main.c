/*
 * agoq-perf: benchmarks through the built plugin. One table of subcommands; each owns its
 * options beyond the shared ones (perf_opts.c).
 */
#include <stdio.h>
#include <string.h>

#include "perf.h"

typedef struct {
  const char* name;
  const char* summary;
  int (*main)(int argc, char** argv);
} perf_command;

static const perf_command perf_commands[] = {
    {"p2p", "point-to-point bandwidth between two ranks through the plugin's net table",
     perf_p2p_main},
    {"allreduce", "CollNet all-reduce between N ranks: bandwidth, error, divergence",
     perf_allreduce_main},
    {"reducescatter", "CollNet reduce-scatter between N ranks", perf_reducescatter_main},
    {"allgather", "CollNet all-gather between N ranks", perf_allgather_main},
#ifdef AGOQ_PERF_CODEC
    {"codec", "CPU codec throughput per format and operation, next to memcpy", perf_codec_main},
#endif
};

static void perf_usage(FILE* f) {
  fprintf(f, "usage: agoq-perf <command> [options]   (agoq-perf <command> -h for options)\n");
  for (size_t i = 0; i < sizeof(perf_commands) / sizeof(perf_commands[0]); i++)
    fprintf(f, "  %-14s %s\n", perf_commands[i].name, perf_commands[i].summary);
  fprintf(f,
          "Flags that nccl-tests has mean the same here: -b -e -f -i sizes, -n iterations, -w\n"
          "warm-up iterations, -c N check (0 = off), -d datatype, -o op, -t threads per process\n"
          "(only 1); ranks are -N/--nranks. (Before, -n was ranks and -t the datatype.)\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    perf_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof(perf_commands) / sizeof(perf_commands[0]); i++)
    if (strcmp(argv[1], perf_commands[i].name) == 0) return perf_commands[i].main(argc - 1, argv + 1);
  fprintf(stderr, "agoq-perf: unknown command '%s'\n", argv[1]);
  perf_usage(stderr);
  return 2;
}
