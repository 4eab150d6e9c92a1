/*
 * One option parser for every subcommand: each accepts a subset (CODEC_OPT_*), and an
 * option outside it is an error rather than silently ignored. Options and file names may
 * come in any order (GNU getopt permutes).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_args.h"
#include "codec.h"

enum { OPT_STOCHASTIC = 256, OPT_SEED, OPT_CRC, OPT_DIST };

static const struct option codec_long_opts[] = {
    {"format", required_argument, NULL, 'f'},
    {"dtype", required_argument, NULL, 't'},
    {"block", required_argument, NULL, 'b'},
    {"stochastic", no_argument, NULL, OPT_STOCHASTIC},
    {"seed", required_argument, NULL, OPT_SEED},
    {"crc", no_argument, NULL, OPT_CRC},
    {"count", required_argument, NULL, 'n'},
    {"dist", required_argument, NULL, OPT_DIST},
    {"threads", required_argument, NULL, 'j'},
    {"verbose", no_argument, NULL, 'v'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static unsigned codec_opt_bit(int c) {
  switch (c) {
    case 'f': return CODEC_OPT_FORMAT;
    case 't': return CODEC_OPT_DTYPE;
    case 'b': return CODEC_OPT_BLOCK;
    case OPT_STOCHASTIC: return CODEC_OPT_STOCHASTIC;
    case OPT_SEED: return CODEC_OPT_SEED;
    case OPT_CRC: return CODEC_OPT_CRC;
    case 'n': return CODEC_OPT_COUNT;
    case OPT_DIST: return CODEC_OPT_DIST;
    case 'j': return CODEC_OPT_THREADS;
    case 'v': return CODEC_OPT_VERBOSE;
    default: return 0;
  }
}

static const char* codec_opt_spelling(unsigned bit) {
  switch (bit) {
    case CODEC_OPT_FORMAT: return "-f FORMAT";
    case CODEC_OPT_DTYPE: return "-t DTYPE";
    case CODEC_OPT_BLOCK: return "-b BLOCK";
    case CODEC_OPT_STOCHASTIC: return "--stochastic";
    case CODEC_OPT_SEED: return "--seed";
    case CODEC_OPT_CRC: return "--crc";
    case CODEC_OPT_COUNT: return "-n COUNT";
    case CODEC_OPT_DIST: return "--dist";
    case CODEC_OPT_THREADS: return "-j";
    case CODEC_OPT_VERBOSE: return "-v";
    default: return "?";
  }
}

/* A value outside a flag's set: OPT: "V" is not one of a, b, c (the set in full, as every
 * agoq tool answers, tools/common/agoq_args.h). */
static void codec_not_one_of(const char* cmd, const char* opt, const char* v, const char* const* names, int n) {
  char list[256];
  agoq_args_join(list, sizeof list, names, n);
  codec_err(cmd, "%s: \"%s\" is not one of %s", opt, v, list);
}

/* Decimal or 0x hex, no sign, the whole string (tools/common/agoq_args.h; never octal). */
static int codec_parse_u64(const char* s, uint64_t* out) {
  unsigned long long v = 0;
  if (agoq_args_parse_ull(s, UINT64_MAX, &v) != 0) return -1;
  *out = v;
  return 0;
}

/* An integer with an optional K/M/G/T suffix (powers of 1024). */
static int codec_parse_count(const char* s, size_t* out) {
  char* end = NULL;
  if (!isdigit((unsigned char)s[0])) return -1; /* no blank, sign or empty string */
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return -1;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
  }
  if (*end != '\0' || v > (SIZE_MAX >> shift)) return -1;
  *out = (size_t)(v << shift);
  return 0;
}

static int codec_opt_value(codec_opts* o, int c, const char* v) {
  uint64_t u = 0;
  switch (c) {
    case 'f':
      if (agoq_format_from_name(v, &o->format) != 0) {
        const char* names[AGOQ_FORMAT_COUNT];
        for (int i = 0; i < AGOQ_FORMAT_COUNT; i++) names[i] = agoq_format_name((agoq_format)i);
        codec_not_one_of(o->cmd, "-f/--format", v, names, AGOQ_FORMAT_COUNT);
        return -1;
      }
      return 0;
    case 't':
      if (agoq_dtype_from_name(v, &o->dtype) != 0) {
        const char* names[AGOQ_DTYPE_COUNT];
        for (int i = 0; i < AGOQ_DTYPE_COUNT; i++) names[i] = agoq_dtype_name((agoq_dtype)i);
        codec_not_one_of(o->cmd, "-t/--dtype", v, names, AGOQ_DTYPE_COUNT);
        return -1;
      }
      return 0;
    case 'b':
      if (codec_parse_u64(v, &u) != 0 || u < AGOQ_CODEC_BLOCK_MIN || u > AGOQ_CODEC_BLOCK_MAX ||
          (u & (u - 1)) != 0) {
        codec_err(o->cmd, "bad block size '%s' (a power of two from %u to %u)", v,
                  AGOQ_CODEC_BLOCK_MIN, AGOQ_CODEC_BLOCK_MAX);
        return -1;
      }
      o->block = (uint32_t)u;
      return 0;
    case OPT_SEED:
      if (codec_parse_u64(v, &o->seed) != 0) {
        codec_err(o->cmd, "bad seed '%s' (an unsigned 64-bit integer)", v);
        return -1;
      }
      return 0;
    case 'n':
      if (codec_parse_count(v, &o->count) != 0) {
        codec_err(o->cmd, "bad count '%s' (an integer, optional K/M/G suffix)", v);
        return -1;
      }
      return 0;
    case OPT_DIST:
      if (strcmp(v, "normal") == 0) {
        o->dist = CODEC_DIST_NORMAL;
      } else if (strcmp(v, "uniform") == 0) {
        o->dist = CODEC_DIST_UNIFORM;
      } else {
        static const char* const dists[] = {"normal", "uniform"};
        codec_not_one_of(o->cmd, "--dist", v, dists, 2);
        return -1;
      }
      return 0;
    case 'j':
      if (codec_parse_u64(v, &u) != 0 || u > 1024) {
        codec_err(o->cmd, "bad thread count '%s' (0 = all CPUs, at most 1024)", v);
        return -1;
      }
      o->threads = (int)u;
      return 0;
    default:
      return 0;
  }
}

int codec_opts_parse(int argc, char** argv, unsigned allowed, unsigned required, int npath,
                     codec_opts* o) {
  *o = (codec_opts){.cmd = argv[0],
                    .format = AGOQ_FORMAT_INT8,
                    .dtype = AGOQ_DTYPE_FP32,
                    .block = AGOQ_CODEC_BLOCK_DEFAULT,
                    .dist = CODEC_DIST_NORMAL};
  optind = 1;
  opterr = 0; /* our own one-line messages */
  int c;
  while ((c = getopt_long(argc, argv, ":f:t:b:n:j:vh", codec_long_opts, NULL)) != -1) {
    if (c == 'h') {
      codec_usage(stdout, o->cmd);
      return 1;
    }
    if (c == '?' || c == ':') {
      const char* what = argv[optind - 1];
      if (c == '?' && optopt != 0)
        codec_err(o->cmd, "unknown option -%c (-h for help)", optopt);
      else if (c == '?')
        codec_err(o->cmd, "unknown option %s (-h for help)", what);
      else
        codec_err(o->cmd, "%s needs a value", what);
      return -1;
    }
    unsigned bit = codec_opt_bit(c);
    if ((allowed & bit) == 0) {
      codec_err(o->cmd, "%s does not apply to this command (-h for help)", codec_opt_spelling(bit));
      return -1;
    }
    o->given |= bit;
    if (c == OPT_STOCHASTIC) o->stochastic = true;
    if (c == OPT_CRC) o->crc = true;
    if (c == 'v') o->verbose = true;
    if (codec_opt_value(o, c, optarg) != 0) return -1;
  }
  unsigned missing = required & ~o->given;
  if (missing != 0) {
    codec_err(o->cmd, "%s is required (-h for help)", codec_opt_spelling(missing & -missing));
    return -1;
  }
  if ((o->given & CODEC_OPT_SEED) && (allowed & CODEC_OPT_STOCHASTIC) && !o->stochastic) {
    codec_err(o->cmd, "--seed only applies with --stochastic");
    return -1;
  }
  int got = argc - optind;
  if (got != npath) {
    codec_err(o->cmd, "expected %d file argument%s, got %d (-h for help)", npath,
              npath == 1 ? "" : "s", got);
    return -1;
  }
  for (int i = 0; i < npath; i++) o->path[i] = argv[optind + i];
  o->npath = npath;
  return 0;
}

int codec_opts_params(const codec_opts* o, agoq_codec_params* p) {
  *p = (agoq_codec_params){.format = o->format,
                           .dtype = o->dtype,
                           .block = o->block,
                           .stochastic = o->stochastic,
                           .seed = o->seed,
                           .first_index = 0};
  agoq_codec_status st = agoq_codec_params_check(p);
  if (st == AGOQ_CODEC_OK) return 0;
  if (o->stochastic && o->format != AGOQ_FORMAT_INT8 && o->format != AGOQ_FORMAT_INT4)
    codec_err(o->cmd, "--stochastic applies to int8 and int4 only, not %s",
              agoq_format_name(o->format));
  else
    codec_err(o->cmd, "the codec rejects format %s, dtype %s, block %u: %s",
              agoq_format_name(o->format), agoq_dtype_name(o->dtype), o->block,
              agoq_codec_status_str(st));
  return -1;
}
