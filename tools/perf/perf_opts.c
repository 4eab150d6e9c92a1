/*
 * Options every subcommand shares, spelled as nccl-tests spells them (-b -e -f -i -n -w -c)
 * so numbers can be compared line by line.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "perf.h"
#include "perf_dtype.h"

int perf_parse_size(const char* s, size_t* out) {
  char* end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || v < 0) return -1;
  double mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
  }
  if (*end == 'b' || *end == 'B') end++;
  if (*end != '\0') return -1;
  double bytes = v * mult;
  if (bytes != floor(bytes) || bytes > (double)(SIZE_MAX / 2)) return -1;
  *out = (size_t)bytes;
  return 0;
}

size_t perf_next_size(const perf_opts* o, size_t size) {
  size_t next;
  if (o->step_bytes > 0) {
    next = size + o->step_bytes;
  } else {
    double d = (double)size * o->factor;
    next = d > (double)(SIZE_MAX / 2) ? 0 : (size_t)d;
    if (next <= size) next = size + 1; /* from 0 B, or a factor barely above 1 */
  }
  return next > o->max_bytes || next <= size ? 0 : next;
}

void perf_format_size(size_t bytes, char* buf, size_t cap) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  size_t v = bytes;
  while (u < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    u++;
  }
  snprintf(buf, cap, "%zu %s", v, units[u]);
}

static void perf_usage(FILE* f, const char* cmd) {
  fprintf(f,
          "usage: agoq-perf %s [options]\n"
          "  -b, --minbytes SIZE     smallest message (default 1M; K/M/G suffixes)\n"
          "  -e, --maxbytes SIZE     largest message (default 64M)\n"
          "  -f, --stepfactor F      multiply the size by F each step (default 2)\n"
          "  -i, --stepbytes SIZE    or add SIZE each step\n"
          "  -n, --iters N           timed messages per size (default 20)\n"
          "  -w, --warmup_iters N    untimed messages per size first (default 5)\n"
          "      --inflight N        requests kept posted per rank (default 8, max 32)\n"
          "  -c, --check             verify every received byte (needs inflight x maxbytes\n"
          "                          of memory on the receiver)\n"
          "      --json              one JSON object per line and size, nothing else on stdout\n"
          "      --lib PATH          plugin (default $AGOQ_PLUGIN_PATH, else\n"
          "                          <exe dir>/../lib/libnccl-net-agoq.so)\n"
          "      --dev N             plugin net device (default 0)\n"
          "      --nsocks N          data sockets per connection (sets AGOQ_SOCKET_NSOCKS)\n"
          "      --rank 0|1          two-host mode: this process is rank 0 (sends, reports)\n"
          "                          or rank 1 (receives, listens on --addr)\n"
          "      --addr HOST:PORT    bootstrap address rank 1 listens on and rank 0 dials\n"
          "      --boot-timeout S    how long a rank waits for the other (default 120)\n"
          "  -t, --dtype T           p2p of a datatype (bf16, fp16, fp32, int32, int64, ...): each\n"
          "                          isend carries the profiler handle of an emulated NCCL P2p task\n"
          "                          whose datatype agoq's profiler reports; warm-up messages are\n"
          "                          checked (exact, or the rel. L2 error of quantized payloads)\n"
          "      --format F          AGOQ_P2P_FORMAT for the run: none|int8|int4|fp8e4m3|fp8e5m2\n"
          "      --oracle profiler|none  agoq's profiler loaded (default) or no profiler at all\n"
          "      --traffic p2p|coll  the transfers are a p2p (default) or a collective's ring\n"
          "      --chunk SIZE        send each transfer as isends of SIZE bytes, as NCCL cuts a\n"
          "                          p2p into steps (NCCL_P2P_NET_CHUNKSIZE; default: one isend)\n"
          "Without --rank a receiver is forked on this host and, unless AGOQ_SOCKET_IFNAME or\n"
          "NCCL_SOCKET_IFNAME says otherwise, traffic goes over loopback.\n"
          "In two-host mode rank 0's size and iteration options apply to both ranks.\n",
          cmd);
}

int perf_parse_int(const char* s, long min, long max, int* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max) return -1;
  *out = (int)v;
  return 0;
}

int perf_opts_parse(int argc, char** argv, const char* cmd, perf_opts* o) {
  *o = (perf_opts){.min_bytes = 1u << 20,
                   .max_bytes = 64u << 20,
                   .factor = 2.0,
                   .iters = 20,
                   .warmup = 5,
                   .inflight = 8,
                   .rank = -1,
                   .boot_timeout_s = 120,
                   .dtype = -1};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      perf_usage(stdout, cmd);
      return 1;
    }
    if (strcmp(a, "--json") == 0) {
      o->json = true;
      continue;
    }
    if (strcmp(a, "-c") == 0 || strcmp(a, "--check") == 0) {
      o->check = true;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "agoq-perf %s: %s needs a value (or is unknown)\n", cmd, a);
      return -1;
    }
    i++;
    int bad = 0;
    if (strcmp(a, "-b") == 0 || strcmp(a, "--minbytes") == 0) {
      bad = perf_parse_size(v, &o->min_bytes);
    } else if (strcmp(a, "-e") == 0 || strcmp(a, "--maxbytes") == 0) {
      bad = perf_parse_size(v, &o->max_bytes);
    } else if (strcmp(a, "-i") == 0 || strcmp(a, "--stepbytes") == 0) {
      bad = perf_parse_size(v, &o->step_bytes);
    } else if (strcmp(a, "-f") == 0 || strcmp(a, "--stepfactor") == 0) {
      char* end = NULL;
      o->factor = strtod(v, &end);
      bad = (end == v || *end != '\0' || !(o->factor > 1.0)) ? -1 : 0;
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--iters") == 0) {
      bad = perf_parse_int(v, 1, INT_MAX / 2, &o->iters);
    } else if (strcmp(a, "-w") == 0 || strcmp(a, "--warmup_iters") == 0) {
      bad = perf_parse_int(v, 0, INT_MAX / 2, &o->warmup);
    } else if (strcmp(a, "--inflight") == 0) {
      bad = perf_parse_int(v, 1, 32, &o->inflight);
    } else if (strcmp(a, "--dev") == 0) {
      bad = perf_parse_int(v, 0, 1023, &o->dev);
    } else if (strcmp(a, "--lib") == 0) {
      o->lib = v;
    } else if (strcmp(a, "--nsocks") == 0) {
      int n = 0;
      bad = perf_parse_int(v, 0, 64, &n);
      if (!bad) setenv("AGOQ_SOCKET_NSOCKS", v, 1);
    } else if (strcmp(a, "--rank") == 0) {
      bad = perf_parse_int(v, 0, 1, &o->rank);
    } else if (strcmp(a, "--addr") == 0) {
      o->addr = v;
    } else if (strcmp(a, "--boot-timeout") == 0) {
      bad = perf_parse_int(v, 1, 86400, &o->boot_timeout_s);
    } else if (strcmp(a, "-t") == 0 || strcmp(a, "--dtype") == 0) {
      ncclDataType_t t;
      bad = perf_dtype_parse(v, &t);
      o->dtype = (int)t;
    } else if (strcmp(a, "--format") == 0) {
      static const char* const formats[] = {"none", "int8", "int4", "fp8e4m3", "fp8e5m2"};
      bad = -1;
      for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++)
        if (strcmp(v, formats[k]) == 0) bad = 0;
      o->format = v;
    } else if (strcmp(a, "--oracle") == 0) {
      bad = strcmp(v, "profiler") != 0 && strcmp(v, "none") != 0 ? -1 : 0;
      o->no_oracle = strcmp(v, "none") == 0;
    } else if (strcmp(a, "--chunk") == 0) {
      bad = perf_parse_size(v, &o->chunk);
      if (!bad && o->chunk != 0 && (o->chunk < 64 || o->chunk % 64 != 0)) bad = -1;
    } else if (strcmp(a, "--traffic") == 0) {
      bad = strcmp(v, "p2p") != 0 && strcmp(v, "coll") != 0 ? -1 : 0;
      o->coll_traffic = strcmp(v, "coll") == 0;
    } else {
      fprintf(stderr, "agoq-perf %s: unknown option %s\n", cmd, a);
      perf_usage(stderr, cmd);
      return -1;
    }
    if (bad) {
      fprintf(stderr, "agoq-perf %s: bad value for %s: '%s'\n", cmd, a, v);
      return -1;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "agoq-perf %s: -b (%zu) is larger than -e (%zu)\n", cmd, o->min_bytes,
            o->max_bytes);
    return -1;
  }
  if (o->dtype < 0 && (o->format != NULL || o->no_oracle || o->coll_traffic || o->chunk != 0)) {
    fprintf(stderr, "agoq-perf %s: --format, --oracle, --traffic and --chunk need --dtype\n", cmd);
    return -1;
  }
  if ((o->rank >= 0) != (o->addr != NULL)) {
    fprintf(stderr, "agoq-perf %s: --rank and --addr go together\n", cmd);
    return -1;
  }
  return 0;
}
