/*
 * Options of agoq-perf p2p, and the argv walk every subcommand shares. Flags that exist in
 * nccl-tests (src/common.cu) mean the same here, so a command line can be carried over:
 * -b -e -f -i sizes, -n iterations, -w warm-up iterations, -c N check (0 = off), -d
 * datatype, -o op, -t threads per process (one here). Ranks are -N. getopt's spellings
 * work too: "--iters=5", "-n5".
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agoq_args.h"
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

int perf_timed_iters(const perf_opts* o, size_t size) {
  if (o->target_bytes == 0) return o->iters;
  /* A 0-byte message moves nothing: only the cap bounds it. */
  size_t want = size == 0 ? PERF_TARGET_ITERS_MAX : o->target_bytes / size + (o->target_bytes % size != 0);
  if (want > PERF_TARGET_ITERS_MAX) want = PERF_TARGET_ITERS_MAX;
  return (size_t)o->iters > want ? o->iters : (int)want;
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
          "      --target-bytes SIZE timed messages per size: at least -n, and enough that\n"
          "                          they carry SIZE bytes, ceil(SIZE / size), at most 1000000\n"
          "                          (K/M/G suffixes; 0 = off, the default): small sizes run\n"
          "                          long enough to time, large ones keep -n. The count column\n"
          "                          (JSON: iters) says how many ran; warm-up stays -w\n"
          "  -w, --warmup_iters N    untimed messages per size first (default 5)\n"
          "      --inflight N        requests kept posted per rank (default 8, max 32)\n"
          "  -c, --check 0|N         N > 0: fill every buffer and verify every message, warm-up\n"
          "                          and timed (inflight x maxbytes of memory on each side); a\n"
          "                          failed check exits 1. Default 0 (a bare -c means 1)\n"
          "      --json              one JSON object per line and size, nothing else on stdout\n"
          "      --pingpong          latency: rank 1 sends every message back; -n round trips per\n"
          "                          size, time(us) is half a round trip (JSON test \"pingpong\").\n"
          "                          One message in flight each way; not with -d or --inflight\n"
          "      --device            NCCL's buffers (send and receive, both ranks) in device\n"
          "                          memory, registered as NCCL_PTR_CUDA: device buffers through\n"
          "                          the CUDA emulation build (libagoq-cuda-emu.so, which this\n"
          "                          agoq-perf links), so --lib must be the plugin built over it,\n"
          "                          libnccl-net-agoq-emu.so. Not the real CUDA runtime: on a GPU\n"
          "                          machine this flag would need agoq-perf built against it.\n"
          "                          Payloads are written and checked on the host and copied to\n"
          "                          and from the device buffers outside the plugin (synchronous\n"
          "                          copies, timed with the messages they go with). Messages must fit\n"
          "                          the plugin's AGOQ_GPU_STAGING (default 8M). Refused (exit 2)\n"
          "                          by a build without the emulation\n"
          "      --lib PATH          plugin (default $AGOQ_PLUGIN_PATH, else\n"
          "                          <exe dir>/../lib/libnccl-net-agoq.so)\n"
          "      --dev N             plugin net device (default 0)\n"
          "      --nsocks N          data sockets per connection (sets AGOQ_SOCKET_NSOCKS)\n"
          "      --rank 0|1          two-host mode: this process is rank 0 (sends, reports)\n"
          "                          or rank 1 (receives, listens on --addr)\n"
          "      --addr HOST:PORT    bootstrap address rank 1 listens on and rank 0 dials\n"
          "      --boot-timeout S    how long a rank waits for the other (default 120)\n"
          "  -d, --dtype T           p2p of a datatype (bf16, fp16, fp32, int32, int64, ...): each\n"
          "      --datatype T        isend carries the profiler handle of an emulated NCCL P2p task\n"
          "                          whose datatype agoq's profiler reports; warm-up messages are\n"
          "                          checked (with -c every message): an integer or fp64 message\n"
          "                          that is not bit-exact fails the run (exit 1)\n"
          "      --max-rel-l2 X      with -d: exit 1 if a checked message's relative L2 error\n"
          "                          exceeds X (as in the collective runs)\n"
          "  -t, --nthreads 1        nccl-tests' threads per process (-g, --ngpus: GPUs per\n"
          "                          thread): one rank per process here, so only 1\n"
          "  -N, --nranks 2          ranks: p2p is always a sender and a receiver\n"
          "      --format F          AGOQ_P2P_FORMAT for the run: none|int8|int4|fp8e4m3|fp8e5m2\n"
          "      --oracle profiler|none  agoq's profiler loaded (default) or no profiler at all\n"
          "      --traffic p2p|coll  the transfers are a p2p (default) or a collective's ring\n"
          "      --chunk SIZE        send each transfer as isends of SIZE bytes, as NCCL cuts a\n"
          "                          p2p into steps (NCCL_P2P_NET_CHUNKSIZE; default: one isend)\n"
          "      --flow oneway|twoway|other-count|other-dtype|other-peer\n"
          "                          receives the sender's profiler also sees, one per send as an\n"
          "                          irecv in the same group (AGOQ_P2P_SCOPE=pipeline quantizes\n"
          "                          two-way flows only): none (oneway, default), of the same\n"
          "                          dtype, count and peer (twoway), or differing in one of them\n"
          "Without --rank a receiver is forked on this host and, unless AGOQ_SOCKET_IFNAME or\n"
          "NCCL_SOCKET_IFNAME says otherwise, traffic goes over loopback.\n"
          "In two-host mode rank 0's size and iteration options apply to both ranks.\n"
          "Short flags mean what they mean in nccl-tests; \"--name=value\" and \"-Xvalue\" work.\n",
          cmd);
}

int perf_parse_int(const char* s, long min, long max, int* out) {
  long long v = 0;
  if (agoq_args_parse_ll(s, min, max, &v) != 0) return -1;
  *out = (int)v;
  return 0;
}

/* ---- the argv walk ---- */

bool perf_argv_next(perf_argv* p) {
  if (++p->i >= p->argc) return false;
  const char* a = p->argv[p->i];
  p->name = a;
  p->inline_val = NULL;
  const char* eq = strchr(a, '=');
  size_t n = eq != NULL ? (size_t)(eq - a) : 0;
  if (a[0] == '-' && a[1] == '-' && eq != NULL && n < sizeof p->key) {
    memcpy(p->key, a, n); /* --name=value */
    p->key[n] = '\0';
    p->name = p->key;
    p->inline_val = eq + 1;
  } else if (a[0] == '-' && a[1] != '-' && a[1] != '\0' && a[2] != '\0') {
    p->key[0] = '-'; /* -Xvalue */
    p->key[1] = a[1];
    p->key[2] = '\0';
    p->name = p->key;
    p->inline_val = a + 2;
  }
  return true;
}

const char* perf_argv_value(perf_argv* p) {
  if (p->inline_val != NULL) return p->inline_val;
  if (p->i + 1 >= p->argc) return NULL;
  return p->argv[++p->i];
}

int perf_argv_check(perf_argv* p, const char* cmd, int* out) {
  /* nccl-tests' -c takes a count (0 = no check); a bare -c, followed by another option
   * or nothing, is this tool's older spelling of -c 1. */
  const char* v = p->inline_val;
  if (v == NULL && p->i + 1 < p->argc && p->argv[p->i + 1][0] != '-') v = p->argv[++p->i];
  if (v == NULL) {
    *out = 1;
    return 0;
  }
  if (perf_parse_int(v, 0, INT_MAX, out) != 0) {
    fprintf(stderr, "agoq-perf %s: bad value for %s: '%s' (0 = no check, N > 0 = check)\n", cmd,
            p->name, v);
    return -1;
  }
  return 0;
}

int perf_argv_threads(perf_argv* p, const char* cmd, const char* v) {
  /* nccl-tests' -t (threads per process) and -g (GPUs per thread): one each here. Before
   * the nccl-tests spellings, -t was the datatype; say so rather than fail obscurely. */
  int n = 0;
  if (perf_parse_int(v, 1, 1, &n) == 0) return 0;
  if (strcmp(p->name, "-t") == 0 || strcmp(p->name, "--nthreads") == 0)
    fprintf(stderr, "agoq-perf %s: %s is threads per process as in nccl-tests (only 1 here); "
            "the datatype is -d/--dtype\n", cmd, p->name);
  else
    fprintf(stderr, "agoq-perf %s: %s: only 1 is supported (one rank per process)\n", cmd, p->name);
  return -1;
}

void perf_not_one_of(const char* cmd, const char* opt, const char* v, const char* const* names, int n) {
  char prog[64];
  snprintf(prog, sizeof prog, "agoq-perf %s", cmd);
  agoq_args_not_one_of(prog, opt, v, names, n);
}

void perf_bad_dtype(const char* cmd, const char* opt, const char* v) {
  const char* names[PERF_NUM_DTYPES];
  for (int i = 0; i < PERF_NUM_DTYPES; i++) names[i] = perf_dtype_name((ncclDataType_t)i);
  perf_not_one_of(cmd, opt, v, names, PERF_NUM_DTYPES);
}

void perf_bad_op(const char* cmd, const char* opt, const char* v) {
  const char* names[PERF_NUM_OPS];
  for (int i = 0; i < PERF_NUM_OPS; i++) names[i] = perf_op_name((ncclRedOp_t)i);
  perf_not_one_of(cmd, opt, v, names, PERF_NUM_OPS);
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
                   .max_rel_l2 = -1,
                   .dtype = -1};
  perf_argv p = {.argc = argc, .argv = argv, .i = 0};
  bool inflight_set = false;
  while (perf_argv_next(&p)) {
    const char* a = p.name;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      perf_usage(stdout, cmd);
      return 1;
    }
    if (strcmp(a, "--json") == 0 && p.inline_val == NULL) {
      o->json = true;
      continue;
    }
    if (strcmp(a, "--pingpong") == 0 && p.inline_val == NULL) {
      o->pingpong = true;
      continue;
    }
    if (strcmp(a, "--device") == 0 && p.inline_val == NULL) {
#ifdef AGOQ_PERF_DEVICE /* agoq-perf links the CUDA emulation (perf_device.c) */
      o->device = true;
      /* Device buffers reach the plugin only with its GPU data path on, which AGOQ_GPU=auto
       * keeps off (docs/design-gpu.md): --device asks for it unless the caller set AGOQ_GPU. */
      setenv("AGOQ_GPU", "on", 0);
      continue;
#else
      fprintf(stderr, "agoq-perf %s: --device needs the CUDA emulation (device buffers through the "
              "CUDA emulation build), which this build lacks\n", cmd);
      return -1;
#endif
    }
    if (strcmp(a, "-c") == 0 || strcmp(a, "--check") == 0) {
      int n = 0;
      if (perf_argv_check(&p, cmd, &n) != 0) return -1;
      o->check = n > 0;
      continue;
    }
    const char* v = perf_argv_value(&p);
    if (v == NULL) {
      fprintf(stderr, "agoq-perf %s: %s needs a value (or is unknown)\n", cmd, a);
      return -1;
    }
    int bad = 0;
    if (strcmp(a, "-b") == 0 || strcmp(a, "--minbytes") == 0) {
      bad = perf_parse_size(v, &o->min_bytes);
    } else if (strcmp(a, "-e") == 0 || strcmp(a, "--maxbytes") == 0) {
      bad = perf_parse_size(v, &o->max_bytes);
    } else if (strcmp(a, "-i") == 0 || strcmp(a, "--stepbytes") == 0) {
      bad = perf_parse_size(v, &o->step_bytes);
    } else if (strcmp(a, "-f") == 0 || strcmp(a, "--stepfactor") == 0) {
      bad = agoq_args_parse_double(v, 1.0, 1e9, &o->factor) != 0 || !(o->factor > 1.0);
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--iters") == 0) {
      bad = perf_parse_int(v, 1, INT_MAX / 2, &o->iters);
    } else if (strcmp(a, "--target-bytes") == 0) {
      bad = perf_parse_size(v, &o->target_bytes);
    } else if (strcmp(a, "-w") == 0 || strcmp(a, "--warmup_iters") == 0) {
      bad = perf_parse_int(v, 0, INT_MAX / 2, &o->warmup);
    } else if (strcmp(a, "--inflight") == 0) {
      bad = perf_parse_int(v, 1, 32, &o->inflight);
      inflight_set = true;
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
    } else if (strcmp(a, "-d") == 0 || strcmp(a, "--dtype") == 0 || strcmp(a, "--datatype") == 0) {
      ncclDataType_t t;
      if (perf_dtype_parse(v, &t) != 0) {
        perf_bad_dtype(cmd, a, v);
        return -1;
      }
      o->dtype = (int)t;
    } else if (strcmp(a, "-t") == 0 || strcmp(a, "--nthreads") == 0 || strcmp(a, "-g") == 0 ||
               strcmp(a, "--ngpus") == 0) {
      if (perf_argv_threads(&p, cmd, v) != 0) return -1;
    } else if (strcmp(a, "-N") == 0 || strcmp(a, "--nranks") == 0) {
      int n = 0;
      bad = perf_parse_int(v, 2, 2, &n); /* p2p: a sender and a receiver */
    } else if (strcmp(a, "--max-rel-l2") == 0) {
      bad = agoq_args_parse_double(v, 0, 1e300, &o->max_rel_l2);
    } else if (strcmp(a, "--format") == 0) {
      static const char* const formats[] = {"none", "int8", "int4", "fp8e4m3", "fp8e5m2"};
      const int nformats = (int)(sizeof formats / sizeof formats[0]);
      int k = 0;
      while (k < nformats && strcmp(v, formats[k]) != 0) k++;
      if (k == nformats) {
        perf_not_one_of(cmd, a, v, formats, nformats);
        return -1;
      }
      o->format = v;
    } else if (strcmp(a, "--oracle") == 0) {
      static const char* const oracles[] = {"profiler", "none"};
      if (strcmp(v, oracles[0]) != 0 && strcmp(v, oracles[1]) != 0) {
        perf_not_one_of(cmd, a, v, oracles, 2);
        return -1;
      }
      o->no_oracle = strcmp(v, "none") == 0;
    } else if (strcmp(a, "--chunk") == 0) {
      bad = perf_parse_size(v, &o->chunk);
      if (!bad && o->chunk != 0 && (o->chunk < 64 || o->chunk % 64 != 0)) bad = -1;
    } else if (strcmp(a, "--flow") == 0) {
      static const char* const flows[PERF_FLOW_COUNT] = {
          [PERF_FLOW_ONEWAY] = "oneway",           [PERF_FLOW_TWOWAY] = "twoway",
          [PERF_FLOW_OTHER_COUNT] = "other-count", [PERF_FLOW_OTHER_DTYPE] = "other-dtype",
          [PERF_FLOW_OTHER_PEER] = "other-peer"};
      int k = 0;
      while (k < PERF_FLOW_COUNT && strcmp(v, flows[k]) != 0) k++;
      if (k == PERF_FLOW_COUNT) {
        perf_not_one_of(cmd, a, v, flows, PERF_FLOW_COUNT);
        return -1;
      }
      o->flow = k;
    } else if (strcmp(a, "--traffic") == 0) {
      static const char* const traffic[] = {"p2p", "coll"};
      if (strcmp(v, traffic[0]) != 0 && strcmp(v, traffic[1]) != 0) {
        perf_not_one_of(cmd, a, v, traffic, 2);
        return -1;
      }
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
  if (o->dtype < 0 && (o->format != NULL || o->no_oracle || o->coll_traffic || o->chunk != 0 ||
                       o->max_rel_l2 >= 0)) {
    fprintf(stderr, "agoq-perf %s: --format, --oracle, --traffic, --chunk and --max-rel-l2 need "
            "-d/--dtype\n", cmd);
    return -1;
  }
  /* The receives a flow adds are p2p tasks of the sender's datatype. */
  if (o->flow != PERF_FLOW_ONEWAY && (o->dtype < 0 || o->coll_traffic)) {
    fprintf(stderr, "agoq-perf %s: --flow needs -d/--dtype and p2p traffic\n", cmd);
    return -1;
  }
  if (o->pingpong && (o->dtype >= 0 || inflight_set)) {
    fprintf(stderr, "agoq-perf %s: --pingpong keeps one message in flight each way and sends bytes: "
            "no --inflight, no -d/--dtype\n", cmd);
    return -1;
  }
  if (o->pingpong) o->inflight = 1;
  if ((o->rank >= 0) != (o->addr != NULL)) {
    fprintf(stderr, "agoq-perf %s: --rank and --addr go together\n", cmd);
    return -1;
  }
  return 0;
}
