/*
 * agoq-codec: one table of subcommands; each parses its options with codec_opts.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codec.h"

typedef struct {
  const char* name;
  const char* synopsis;
  const char* summary;
  unsigned options; /* CODEC_OPT_* it accepts, for its -h */
  int (*main)(int argc, char** argv);
} codec_command;

static const codec_command codec_commands[] = {
    {"roundtrip", "-f FORMAT -t DTYPE [-b BLOCK] [--stochastic [--seed N]] [-j N] [-v] IN OUT",
     "quantize and dequantize a raw array; OUT is the decoded array of DTYPE",
     CODEC_OPT_FORMAT | CODEC_OPT_DTYPE | CODEC_OPT_BLOCK | CODEC_OPT_STOCHASTIC | CODEC_OPT_SEED |
         CODEC_OPT_THREADS | CODEC_OPT_VERBOSE,
     codec_roundtrip_main},
    {"encode", "-f FORMAT -t DTYPE [-b BLOCK] [--stochastic [--seed N]] [--crc] [-v] IN OUT",
     "quantize a raw array into a frame (kernels/agoq_frame.h)",
     CODEC_OPT_FORMAT | CODEC_OPT_DTYPE | CODEC_OPT_BLOCK | CODEC_OPT_STOCHASTIC | CODEC_OPT_SEED |
         CODEC_OPT_CRC | CODEC_OPT_VERBOSE,
     codec_encode_main},
    {"decode", "[-t OUTDTYPE] [-v] IN OUT",
     "validate a frame and decode it to OUTDTYPE (default: the frame's dtype)",
     CODEC_OPT_DTYPE | CODEC_OPT_VERBOSE, codec_decode_main},
    {"stats", "-t DTYPE A B", "compare two raw arrays of DTYPE (B against the reference A)",
     CODEC_OPT_DTYPE, codec_stats_main},
    {"gen", "-t DTYPE -n COUNT [--dist normal|uniform] [--seed N] OUT",
     "write COUNT random elements of DTYPE (test input)",
     CODEC_OPT_DTYPE | CODEC_OPT_COUNT | CODEC_OPT_DIST | CODEC_OPT_SEED, codec_gen_main},
};
#define CODEC_NCOMMANDS (sizeof(codec_commands) / sizeof(codec_commands[0]))

void codec_err(const char* cmd, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* One line, whatever a file name or a status string holds. */
  for (char* c = msg; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  fprintf(stderr, "agoq-codec%s%s: %s\n", cmd ? " " : "", cmd ? cmd : "", msg);
}

static void codec_list_names(FILE* f, const char* what, int count,
                             const char* (*name)(int)) {
  fprintf(f, "%s", what);
  for (int i = 0; i < count; i++) fprintf(f, "%s%s", i ? ", " : " ", name(i));
  fprintf(f, "\n");
}
static const char* codec_format_name_i(int i) { return agoq_format_name((agoq_format)i); }
static const char* codec_dtype_name_i(int i) { return agoq_dtype_name((agoq_dtype)i); }

static void codec_option_help(FILE* f, unsigned opts) {
  static const struct {
    unsigned bit;
    const char* text;
  } help[] = {
      {CODEC_OPT_FORMAT, "  -f, --format FORMAT  int8, int4, fp8e4m3, fp8e5m2 or none (raw)"},
      {CODEC_OPT_DTYPE, "  -t, --dtype DTYPE    fp32, bf16 or fp16 (also float32, bfloat16, float16)"},
      {CODEC_OPT_BLOCK, "  -b, --block N        elements per scale: 32, 64, 128 (default), 256, 512, 1024"},
      {CODEC_OPT_STOCHASTIC, "      --stochastic     stochastic rounding (int8 / int4 only)"},
      {CODEC_OPT_SEED, "      --seed N         random seed (default 0)"},
      {CODEC_OPT_CRC, "      --crc            add a CRC32C of the payload to the frame"},
      {CODEC_OPT_COUNT, "  -n, --count N        number of elements (K/M/G: powers of 1024)"},
      {CODEC_OPT_DIST, "      --dist D         normal (N(0,1), default) or uniform ([-1, 1))"},
      {CODEC_OPT_THREADS, "  -j, --threads N      threads (default 0: all online CPUs)"},
      {CODEC_OPT_VERBOSE, "  -v, --verbose        print sizes and the frame header on stderr"},
  };
  for (size_t i = 0; i < sizeof(help) / sizeof(help[0]); i++)
    if (opts & help[i].bit) fprintf(f, "%s\n", help[i].text);
  fprintf(f, "  -h, --help           this help\n");
}

void codec_usage(FILE* f, const char* cmd) {
  for (size_t i = 0; i < CODEC_NCOMMANDS; i++) {
    const codec_command* c = &codec_commands[i];
    if (cmd != NULL && strcmp(cmd, c->name) != 0) continue;
    fprintf(f, "%sagoq-codec %s %s\n", cmd ? "usage: " : "  ", c->name, c->synopsis);
    fprintf(f, "%s%s\n", cmd ? "" : "      ", c->summary);
    if (cmd != NULL) codec_option_help(f, c->options);
  }
  if (cmd != NULL) return;
  fprintf(f, "Arrays are raw little-endian elements, as in memory. \"-\" is stdin / stdout.\n");
  codec_list_names(f, "formats:", AGOQ_FORMAT_COUNT, codec_format_name_i);
  codec_list_names(f, "dtypes:", AGOQ_DTYPE_COUNT, codec_dtype_name_i);
}

int main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    FILE* f = argc < 2 ? stderr : stdout;
    fprintf(f, "usage: agoq-codec <command> [options]   (agoq-codec <command> -h for options)\n");
    codec_usage(f, NULL);
    return argc < 2 ? CODEC_EXIT_USAGE : 0;
  }
  for (size_t i = 0; i < CODEC_NCOMMANDS; i++)
    if (strcmp(argv[1], codec_commands[i].name) == 0)
      return codec_commands[i].main(argc - 1, argv + 1);
  char names[256] = "";
  for (size_t i = 0, off = 0; i < CODEC_NCOMMANDS && off < sizeof(names); i++)
    off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%s", i ? ", " : "",
                            codec_commands[i].name);
  codec_err(NULL, "unknown command '%s' (%s; -h for help)", argv[1], names);
  return CODEC_EXIT_USAGE;
}
