/*
 * agoq-codec: the codec (kernels/agoq_codec.h, agoq_frame.h) on files. Raw arrays are
 * little-endian fp32 / bf16 / fp16 as they lie in memory; frames are agoq_frame.h frames.
 * Every failure prints one line "agoq-codec CMD: ..." on stderr and exits non-zero:
 * 2 for a bad command line, 1 for anything else (unreadable file, bad frame, ...).
 */
#ifndef AGOQ_CODEC_TOOL_H
#define AGOQ_CODEC_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "agoq_codec.h"
#include "agoq_frame.h"

enum { CODEC_EXIT_FAIL = 1, CODEC_EXIT_USAGE = 2 };

/* ---- options (codec_opts.c) ---- */

/* Which options a subcommand accepts. */
enum {
  CODEC_OPT_FORMAT = 1u << 0,     /* -f */
  CODEC_OPT_DTYPE = 1u << 1,      /* -t */
  CODEC_OPT_BLOCK = 1u << 2,      /* -b */
  CODEC_OPT_STOCHASTIC = 1u << 3, /* --stochastic */
  CODEC_OPT_SEED = 1u << 4,       /* --seed */
  CODEC_OPT_CRC = 1u << 5,        /* --crc */
  CODEC_OPT_COUNT = 1u << 6,      /* -n */
  CODEC_OPT_DIST = 1u << 7,       /* --dist */
  CODEC_OPT_THREADS = 1u << 8,    /* -j */
  CODEC_OPT_VERBOSE = 1u << 9,    /* -v */
};

typedef enum { CODEC_DIST_NORMAL, CODEC_DIST_UNIFORM } codec_dist;

typedef struct {
  const char* cmd;     /* subcommand name, for messages */
  unsigned given;      /* CODEC_OPT_* seen on the command line */
  agoq_format format;
  agoq_dtype dtype;
  uint32_t block;
  bool stochastic;
  uint64_t seed;
  bool crc;
  size_t count;
  codec_dist dist;
  int threads;         /* 0 = all online CPUs */
  bool verbose;
  const char* path[2]; /* positional arguments */
  int npath;
} codec_opts;

/* Parses argv[1..] (argv[0] is the subcommand) against `allowed`, then checks that the
 * `required` options and exactly `npath` positional arguments are there.
 * 0 ok, 1 help printed, -1 error printed. */
int codec_opts_parse(int argc, char** argv, unsigned allowed, unsigned required, int npath,
                     codec_opts* o);
/* The codec parameters the options describe (format, dtype, block, stochastic, seed); a
 * combination the codec rejects is reported. 0 ok, -1 error printed. */
int codec_opts_params(const codec_opts* o, agoq_codec_params* p);

/* ---- messages (codec_main.c) ---- */

/* One line "agoq-codec CMD: ..." on stderr. */
void codec_err(const char* cmd, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* The synopsis and options of one subcommand (cmd NULL: of all). */
void codec_usage(FILE* f, const char* cmd);

/* ---- files (codec_io.c); "-" is stdin / stdout ---- */

/* Reads a whole file into a new buffer (never NULL on success, even when empty). */
int codec_file_read(const char* cmd, const char* path, uint8_t** buf, size_t* len);
int codec_file_write(const char* cmd, const char* path, const void* buf, size_t len);
/* Reads an array of dtype: the size must be a multiple of the element size. */
int codec_array_read(const char* cmd, const char* path, agoq_dtype t, uint8_t** buf, size_t* n);

/* ---- element conversions for stats and gen (codec_fp.c) ----
 * Independent of the codec on purpose: the tools judge its output. */

double codec_elem_get(agoq_dtype t, const uint8_t* p, size_t i);
/* Stores v rounded to t (round to nearest even; Inf beyond the range, as a cast would). */
void codec_elem_put(agoq_dtype t, uint8_t* p, size_t i, float v);

/* ---- subcommands ---- */
int codec_roundtrip_main(int argc, char** argv);
int codec_encode_main(int argc, char** argv);
int codec_decode_main(int argc, char** argv);
int codec_stats_main(int argc, char** argv);
int codec_gen_main(int argc, char** argv);

#endif
