/*
 * Options of the collective subcommands. Flags that exist in nccl-tests mean the same here
 * (-b -e -f -i sizes, -n iterations, -w warm-up, -c check, -d datatype, -o op, -t threads);
 * the number of ranks, which nccl-tests takes from MPI, is -N/--nranks.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agoq_args.h"
#include "perf_coll.h"

const char* const perf_coll_formats[] = {"none", "int8", "int4", "fp8e4m3", "fp8e5m2"};
const int perf_coll_nformats = (int)(sizeof(perf_coll_formats) / sizeof(perf_coll_formats[0]));

const char* perf_coll_kind_name(perf_coll_kind k) {
  switch (k) {
    case PERF_COLL_ALLREDUCE: return "allreduce";
    case PERF_COLL_REDUCESCATTER: return "reducescatter";
    default: return "allgather";
  }
}

static void perf_coll_usage(FILE* f, perf_coll_kind kind) {
  const char* cmd = perf_coll_kind_name(kind);
  fprintf(f,
          "usage: agoq-perf %s [options]\n"
          "Drives the plugin's CollNet table with N ranks as NCCL's proxy does, checks every\n"
          "size against an fp64 reference and compares the ranks' result bits.\n"
          "  -N, --nranks N          ranks (default 2; without --rank all run on this host)\n"
          "  -d, --dtype T           int8 uint8 int32 uint32 int64 uint64 fp16 fp32 fp64 bf16\n"
          "      --datatype T        fp8e4m3 fp8e5m2 (default fp32)\n"
          "  -o, --op OP             sum prod max min (default sum)%s\n"
          "  -b, --minbytes SIZE     smallest size (default 1M; K/M/G suffixes)\n"
          "  -e, --maxbytes SIZE     largest size (default 64M)\n"
          "  -f, --stepfactor F      multiply the size by F each step (default 2)\n"
          "  -i, --stepbytes SIZE    or add SIZE each step\n"
          "  -n, --iters N           timed collectives per size (default 20)\n"
          "  -w, --warmup_iters N    untimed collectives per size first (default 5)\n"
          "  -c, --check 1           every size is checked (nccl-tests' default); 0 is refused:\n"
          "                          the check is what the rel_l2 and diverged columns report\n"
          "  -t, --nthreads 1        nccl-tests' threads per process (-g, --ngpus: GPUs per\n"
          "                          thread): one rank per process here, so only 1\n"
          "      --format F          int8 int4 fp8e4m3 fp8e5m2 none: sets AGOQ_FORMAT for every\n"
          "                          rank (none = the exact path); default: the environment's\n"
          "      --chunk SIZE        bytes per plugin call (default 2M, NCCL's largest; 0 = one\n"
          "                          call per buffer, at most the device's maxCollBytes)\n"
          "      --inflight N        calls outstanding per rank (default 8, max 32)\n"
          "      --json              one JSON object per line and size, nothing else on stdout\n"
          "      --lib PATH          plugin (default $AGOQ_PLUGIN_PATH, else\n"
          "                          <exe dir>/../lib/libnccl-net-agoq.so)\n"
          "      --dev N             CollNet device (default 0)\n"
          "      --abi V             CollNet table version 6..12 (default the newest exported)\n"
          "      --rank R            multi-host mode: this process is rank R of --nranks\n"
          "      --addr HOST:PORT    rank 0 serves the bootstrap there; the others dial it\n"
          "      --boot-timeout S    how long a rank waits for the others (default 120)\n"
          "      --max-rel-l2 X      exit 1 if a size's relative L2 error exceeds X\n"
          "      --max-diverged N    exit 1 if more than N elements differ between ranks\n"
          "      --seed N            base of the input streams (default 1)\n"
          "Columns: time is the slowest rank's average per collective; algbw = size / time;\n"
          "busbw = algbw * %s (nccl-tests); wire = bytes on the wire / bytes in the input\n"
          "type, as the plugin counted them (AGOQ_STATS), all ranks; rel_l2 and max_abs\n"
          "compare the result with an fp64 reduction of every rank's N(0,1) input; diverged\n"
          "counts elements whose bits differ between ranks; crc%% is the plugin's payload CRC32C\n"
          "time over its codec time; cpu_s/GB is the CPU time (user + system, getrusage) of\n"
          "every rank's process, all threads, over the timed collectives, per GB (1e9 B) of\n"
          "size x iters (JSON: cpu_s, the sum, and cpu_s_per_GB).\n"
          "Without --rank the ranks are forked on this host and, unless AGOQ_SOCKET_IFNAME or\n"
          "NCCL_SOCKET_IFNAME says otherwise, talk over loopback.\n"
          "The plugin writes its statistics to a file of each rank's own (in TMPDIR, removed at\n"
          "exit or on SIGINT/SIGTERM); with AGOQ_STATS=1 every line is copied on to your\n"
          "AGOQ_STATS_FILE (%%h, %%p expanded per rank) or to stderr, as the plugin would.\n"
          "Short flags mean what they mean in nccl-tests; \"--name=value\" and \"-Xvalue\" work.\n",
          cmd, kind == PERF_COLL_ALLGATHER ? " (ignored: allgather moves bytes)" : "",
          kind == PERF_COLL_ALLREDUCE ? "2(n-1)/n" : "(n-1)/n");
}

static int perf_coll_parse_double(const char* s, double* out) {
  return agoq_args_parse_double(s, -1e300, 1e300, out);
}

int perf_coll_opts_parse(int argc, char** argv, perf_coll_kind kind, perf_coll_opts* o) {
  const char* cmd = perf_coll_kind_name(kind);
  *o = (perf_coll_opts){.kind = kind,
                        .nranks = 2,
                        .dtype = ncclFloat32,
                        .op = ncclSum,
                        .min_bytes = 1u << 20,
                        .max_bytes = 64u << 20,
                        .factor = 2.0,
                        .iters = 20,
                        .warmup = 5,
                        .inflight = 8,
                        .chunk = 2u << 20,
                        .format = -1,
                        .rank = -1,
                        .boot_timeout_s = 120,
                        .max_rel_l2 = -1,
                        .max_diverged = -1,
                        .seed = 1};
  bool nranks_given = false;
  perf_argv p = {.argc = argc, .argv = argv, .i = 0};
  while (perf_argv_next(&p)) {
    const char* a = p.name;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      perf_coll_usage(stdout, kind);
      return 1;
    }
    if (strcmp(a, "--json") == 0 && p.inline_val == NULL) {
      o->json = true;
      continue;
    }
    if (strcmp(a, "-c") == 0 || strcmp(a, "--check") == 0) {
      int n = 0;
      if (perf_argv_check(&p, cmd, &n) != 0) return -1;
      if (n == 0) {
        fprintf(stderr, "agoq-perf %s: %s 0: collective runs always check every size (the "
                "rel_l2 and diverged columns)\n", cmd, a);
        return -1;
      }
      continue;
    }
    const char* v = perf_argv_value(&p);
    if (v == NULL) {
      fprintf(stderr, "agoq-perf %s: %s needs a value (or is unknown)\n", cmd, a);
      return -1;
    }
    int bad = 0;
    if (strcmp(a, "-N") == 0 || strcmp(a, "--nranks") == 0) {
      bad = perf_parse_int(v, 1, PERF_COLL_MAX_RANKS, &o->nranks);
      nranks_given = true;
    } else if (strcmp(a, "-t") == 0 || strcmp(a, "--nthreads") == 0 || strcmp(a, "-g") == 0 ||
               strcmp(a, "--ngpus") == 0) {
      if (perf_argv_threads(&p, cmd, v) != 0) return -1;
    } else if (strcmp(a, "-d") == 0 || strcmp(a, "--dtype") == 0 || strcmp(a, "--datatype") == 0) {
      if (perf_dtype_parse(v, &o->dtype) != 0) {
        perf_bad_dtype(cmd, a, v);
        return -1;
      }
    } else if (strcmp(a, "-o") == 0 || strcmp(a, "--op") == 0) {
      if (perf_op_parse(v, &o->op) != 0) {
        perf_bad_op(cmd, a, v);
        return -1;
      }
    } else if (strcmp(a, "-b") == 0 || strcmp(a, "--minbytes") == 0) {
      bad = perf_parse_size(v, &o->min_bytes);
    } else if (strcmp(a, "-e") == 0 || strcmp(a, "--maxbytes") == 0) {
      bad = perf_parse_size(v, &o->max_bytes);
    } else if (strcmp(a, "-i") == 0 || strcmp(a, "--stepbytes") == 0) {
      bad = perf_parse_size(v, &o->step_bytes);
    } else if (strcmp(a, "-f") == 0 || strcmp(a, "--stepfactor") == 0) {
      bad = perf_coll_parse_double(v, &o->factor) != 0 || !(o->factor > 1.0);
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--iters") == 0) {
      bad = perf_parse_int(v, 1, INT_MAX / 2, &o->iters);
    } else if (strcmp(a, "-w") == 0 || strcmp(a, "--warmup_iters") == 0) {
      bad = perf_parse_int(v, 0, INT_MAX / 2, &o->warmup);
    } else if (strcmp(a, "--inflight") == 0) {
      bad = perf_parse_int(v, 1, PERF_COLL_MAX_INFLIGHT, &o->inflight);
    } else if (strcmp(a, "--chunk") == 0) {
      bad = perf_parse_size(v, &o->chunk);
    } else if (strcmp(a, "--format") == 0) {
      o->format = -1;
      for (int f = 0; f < perf_coll_nformats; f++)
        if (strcasecmp(v, perf_coll_formats[f]) == 0) o->format = f;
      if (o->format < 0) {
        perf_not_one_of(cmd, a, v, perf_coll_formats, perf_coll_nformats);
        return -1;
      }
    } else if (strcmp(a, "--abi") == 0) {
      bad = perf_parse_int(v, AGOQ_LOADER_MIN_VERSION, AGOQ_LOADER_MAX_VERSION, &o->abi);
    } else if (strcmp(a, "--lib") == 0) {
      o->lib = v;
    } else if (strcmp(a, "--dev") == 0) {
      bad = perf_parse_int(v, 0, 1023, &o->dev);
    } else if (strcmp(a, "--rank") == 0) {
      bad = perf_parse_int(v, 0, PERF_COLL_MAX_RANKS - 1, &o->rank);
    } else if (strcmp(a, "--addr") == 0) {
      o->addr = v;
    } else if (strcmp(a, "--boot-timeout") == 0) {
      bad = perf_parse_int(v, 1, 86400, &o->boot_timeout_s);
    } else if (strcmp(a, "--max-rel-l2") == 0) {
      bad = perf_coll_parse_double(v, &o->max_rel_l2) != 0 || o->max_rel_l2 < 0;
    } else if (strcmp(a, "--max-diverged") == 0) {
      int n = 0;
      bad = perf_parse_int(v, 0, INT_MAX, &n);
      o->max_diverged = n;
    } else if (strcmp(a, "--seed") == 0) {
      unsigned long long s = 0;
      bad = agoq_args_parse_ull(v, UINT64_MAX, &s);
      o->seed = s;
    } else {
      fprintf(stderr, "agoq-perf %s: unknown option %s\n", cmd, a);
      perf_coll_usage(stderr, kind);
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
  if ((o->rank >= 0) != (o->addr != NULL)) {
    fprintf(stderr, "agoq-perf %s: --rank and --addr go together\n", cmd);
    return -1;
  }
  if (o->rank >= 0 && !nranks_given) {
    fprintf(stderr, "agoq-perf %s: --rank needs --nranks\n", cmd);
    return -1;
  }
  if (o->rank >= o->nranks) {
    fprintf(stderr, "agoq-perf %s: --rank %d is not below --nranks %d\n", cmd, o->rank,
            o->nranks);
    return -1;
  }
  return 0;
}

/* ---- the configuration rank 0 hands everyone ---- */

enum {
  CFG_KIND, CFG_NRANKS, CFG_DTYPE, CFG_OP, CFG_MIN, CFG_MAX, CFG_STEP, CFG_FACTOR, CFG_ITERS,
  CFG_WARMUP, CFG_INFLIGHT, CFG_CHUNK, CFG_FORMAT, CFG_ABI, CFG_MAXL2, CFG_MAXDIV, CFG_SEED,
  CFG_COMM, CFG_WORDS
};

void perf_coll_config_encode(const perf_coll_opts* o, uint64_t comm_id, uint8_t* out) {
  uint64_t w[CFG_WORDS] = {0};
  w[CFG_KIND] = (uint64_t)o->kind;
  w[CFG_NRANKS] = (uint64_t)o->nranks;
  w[CFG_DTYPE] = (uint64_t)o->dtype;
  w[CFG_OP] = (uint64_t)o->op;
  w[CFG_MIN] = o->min_bytes;
  w[CFG_MAX] = o->max_bytes;
  w[CFG_STEP] = o->step_bytes;
  memcpy(&w[CFG_FACTOR], &o->factor, 8);
  w[CFG_ITERS] = (uint64_t)o->iters;
  w[CFG_WARMUP] = (uint64_t)o->warmup;
  w[CFG_INFLIGHT] = (uint64_t)o->inflight;
  w[CFG_CHUNK] = o->chunk;
  w[CFG_FORMAT] = (uint64_t)(int64_t)o->format;
  w[CFG_ABI] = (uint64_t)o->abi;
  memcpy(&w[CFG_MAXL2], &o->max_rel_l2, 8);
  w[CFG_MAXDIV] = (uint64_t)(int64_t)o->max_diverged;
  w[CFG_SEED] = o->seed;
  w[CFG_COMM] = comm_id;
  memset(out, 0, PERF_COLL_CONFIG_BYTES);
  for (int i = 0; i < CFG_WORDS; i++)
    for (int k = 0; k < 8; k++) out[i * 8 + k] = (uint8_t)(w[i] >> (8 * k));
}

void perf_coll_config_decode(const uint8_t* in, perf_coll_opts* o, uint64_t* comm_id) {
  uint64_t w[CFG_WORDS] = {0};
  for (int i = 0; i < CFG_WORDS; i++)
    for (int k = 7; k >= 0; k--) w[i] = (w[i] << 8) | in[i * 8 + k];
  o->kind = (perf_coll_kind)w[CFG_KIND];
  o->nranks = (int)w[CFG_NRANKS];
  o->dtype = (ncclDataType_t)w[CFG_DTYPE];
  o->op = (ncclRedOp_t)w[CFG_OP];
  o->min_bytes = w[CFG_MIN];
  o->max_bytes = w[CFG_MAX];
  o->step_bytes = w[CFG_STEP];
  memcpy(&o->factor, &w[CFG_FACTOR], 8);
  o->iters = (int)w[CFG_ITERS];
  o->warmup = (int)w[CFG_WARMUP];
  o->inflight = (int)w[CFG_INFLIGHT];
  o->chunk = w[CFG_CHUNK];
  o->format = (int)(int64_t)w[CFG_FORMAT];
  o->abi = (int)w[CFG_ABI];
  memcpy(&o->max_rel_l2, &w[CFG_MAXL2], 8);
  o->max_diverged = (long)(int64_t)w[CFG_MAXDIV];
  o->seed = w[CFG_SEED];
  *comm_id = w[CFG_COMM];
}
