/*
 * agoq-perf codec: throughput of the CPU codec (kernels/agoq_codec.h) for every format and
 * operation, one thread and all threads, next to memcpy of the same size measured in the
 * same process. Throughput counts the operation's uncompressed side: the DTYPE array a
 * quantize reads or a dequantize produces (fp32 for quantize-fp32), so every row moves the
 * same -s bytes as the memcpy it is compared with. Each figure is the best of -r runs: on a
 * shared machine the fastest run is the one least disturbed by others. Each run times a
 * memcpy right before the operation, so a ratio never compares two different moments of a
 * machine whose load changes.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agoq_args.h"
#include "agoq_codec.h"
#include "perf.h"

/* --isa's names (agoq_codec_set_isa). */
static const char* const cp_isas[] = {"portable", "avx2", "avx512"};
#define CP_NISAS ((int)(sizeof cp_isas / sizeof cp_isas[0]))

enum { CP_QUANTIZE, CP_DEQUANTIZE, CP_DEQUANT_ACC, CP_QUANTIZE_FP32, CP_NOPS };
static const char* const cp_op_names[CP_NOPS] = {"quantize", "dequantize",
                                                 "dequantize-accumulate", "quantize-fp32"};

/* Formats in the order people read them: the compressing ones first, raw last. */
static const agoq_format cp_formats[] = {AGOQ_FORMAT_INT8, AGOQ_FORMAT_INT4, AGOQ_FORMAT_FP8E4M3,
                                         AGOQ_FORMAT_FP8E5M2, AGOQ_FORMAT_NONE};
#define CP_NFORMATS (sizeof(cp_formats) / sizeof(cp_formats[0]))
#define CP_MAX_THREADS 256

typedef struct {
  agoq_dtype dtype;     /* -t */
  uint32_t block;       /* -b */
  size_t bytes;         /* -s: input bytes per operation */
  int repeats;          /* -r */
  int threads;          /* -j: for the all-threads column; 0 = online CPUs */
  unsigned format_mask; /* -f: bit per agoq_format */
  unsigned op_mask;     /* -o: bit per CP_* */
  const char* isa;      /* --isa */
  bool json;
} cp_opts;

typedef struct {
  size_t n;            /* elements of dtype in -s bytes */
  size_t n32;          /* elements of fp32 in -s bytes */
  uint8_t* src;        /* n elements of dtype */
  float* src32;        /* n32 fp32 elements */
  uint8_t* body;       /* room for any format's body of either input */
  size_t body_cap;
  uint8_t* dst;        /* -s bytes: dequantize output and memcpy target */
  float* acc;          /* n fp32 accumulators */
} cp_bufs;

/* ---- options ---- */

static void cp_usage(FILE* f) {
  fprintf(f,
          "usage: agoq-perf codec [options]\n"
          "  -d, --dtype DTYPE     input / output type: fp32, bf16 (default), fp16\n"
          "      --block N         elements per scale: 32 .. 1024, power of two (default 128)\n"
          "  -s, --size SIZE       input bytes per operation (default 256M; K/M/G suffixes;\n"
          "                        rounded down to a multiple of 4)\n"
          "      --formats LIST    comma list of int8,int4,fp8e4m3,fp8e5m2,none (default all)\n"
          "      --ops LIST        comma list of quantize,dequantize,dequantize-accumulate,\n"
          "                        quantize-fp32 (default all; quantize-fp32 is skipped with\n"
          "                        -d fp32, where it is quantize)\n"
          "      --repeats N       runs per measurement, the best is reported (default 5)\n"
          "  -j, --threads N       threads of the all-threads column (default 0: online CPUs;\n"
          "                        never more than those)\n"
          "      --isa ISA         pin the CPU path: portable, avx2, avx512 (default: the best\n"
          "                        this CPU has)\n"
          "      --json            one JSON object per line and measurement, nothing else\n"
          "-t -b -e -f -o -r mean something else in nccl-tests (threads, sizes, step factor, op,\n"
          "root), so this mode has only the long spellings of those options.\n"
          "GB/s counts the uncompressed side of each operation (the -s bytes a quantize reads\n"
          "or a dequantize writes), compared with memcpy of -s bytes measured in the same run.\n");
}

/* A comma list of names; name(i) for i in [0, count) gives the spellings. A name outside
 * them is printed with the whole set (0 ok, -1 printed). */
static int cp_parse_list(const char* opt, const char* s, int count, const char* (*name)(int), unsigned* mask) {
  const char* names[32];
  for (int i = 0; i < count && i < 32; i++) names[i] = name(i);
  *mask = 0;
  const char* p = s;
  while (*p) {
    size_t len = strcspn(p, ",");
    int found = -1;
    for (int i = 0; i < count; i++)
      if (strlen(name(i)) == len && strncmp(p, name(i), len) == 0) found = i;
    if (found < 0) {
      char item[64];
      snprintf(item, sizeof item, "%.*s", (int)(len < 63 ? len : 63), p);
      char what[96];
      snprintf(what, sizeof what, "%s (a comma list)", opt);
      perf_not_one_of("codec", what, item, names, count);
      return -1;
    }
    *mask |= 1u << found;
    p += len;
    if (*p == ',') p++;
  }
  if (*mask == 0) {
    perf_not_one_of("codec", opt, s, names, count);
    return -1;
  }
  return 0;
}
static const char* cp_format_name_i(int i) { return agoq_format_name((agoq_format)i); }
static const char* cp_op_name_i(int i) { return cp_op_names[i]; }

static int cp_opts_parse(int argc, char** argv, cp_opts* o) {
  *o = (cp_opts){.dtype = AGOQ_DTYPE_BF16,
                 .block = AGOQ_CODEC_BLOCK_DEFAULT,
                 .bytes = 256u << 20,
                 .repeats = 5,
                 .threads = 0,
                 .format_mask = (1u << AGOQ_FORMAT_COUNT) - 1,
                 .op_mask = (1u << CP_NOPS) - 1};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      cp_usage(stdout);
      return 1;
    }
    if (strcmp(a, "--json") == 0) {
      o->json = true;
      continue;
    }
    /* nccl-tests' letters keep nccl-tests' meaning in every agoq-perf mode; the ones this
     * mode once used for something else are refused with the spelling that replaced them,
     * never silently read with another meaning. */
    static const struct {
      const char* flag;
      const char* now;
    } moved[] = {{"-t", "-d/--dtype"},  {"-b", "--block"}, {"-f", "--formats"},
                 {"-o", "--ops"},       {"-r", "--repeats"}, {"-e", "-s/--size"}};
    for (size_t k = 0; k < sizeof moved / sizeof moved[0]; k++)
      if (strcmp(a, moved[k].flag) == 0) {
        fprintf(stderr, "agoq-perf codec: %s means what it means in nccl-tests, which has no codec "
                        "benchmark; use %s\n", a, moved[k].now);
        return -1;
      }
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "agoq-perf codec: %s needs a value (or is unknown)\n", a);
      return -1;
    }
    i++;
    int bad = 0;
    if (strcmp(a, "-d") == 0 || strcmp(a, "--dtype") == 0) {
      if (agoq_dtype_from_name(v, &o->dtype) != 0) {
        const char* names[AGOQ_DTYPE_COUNT];
        for (int k = 0; k < AGOQ_DTYPE_COUNT; k++) names[k] = agoq_dtype_name((agoq_dtype)k);
        perf_not_one_of("codec", a, v, names, AGOQ_DTYPE_COUNT);
        return -1;
      }
    } else if (strcmp(a, "--block") == 0) {
      int b = 0;
      bad = perf_parse_int(v, AGOQ_CODEC_BLOCK_MIN, AGOQ_CODEC_BLOCK_MAX, &b);
      if (!bad && (b & (b - 1)) != 0) bad = -1;
      o->block = (uint32_t)b;
    } else if (strcmp(a, "-s") == 0 || strcmp(a, "--size") == 0) {
      bad = perf_parse_size(v, &o->bytes);
      if (!bad && o->bytes < 4) bad = -1;
      o->bytes &= ~(size_t)3; /* whole elements of every dtype */
    } else if (strcmp(a, "--formats") == 0) {
      if (cp_parse_list(a, v, AGOQ_FORMAT_COUNT, cp_format_name_i, &o->format_mask) != 0) return -1;
    } else if (strcmp(a, "--ops") == 0) {
      if (cp_parse_list(a, v, CP_NOPS, cp_op_name_i, &o->op_mask) != 0) return -1;
    } else if (strcmp(a, "--repeats") == 0) {
      bad = perf_parse_int(v, 1, 1000, &o->repeats);
    } else if (strcmp(a, "-j") == 0 || strcmp(a, "--threads") == 0) {
      bad = perf_parse_int(v, 0, CP_MAX_THREADS, &o->threads);
    } else if (strcmp(a, "--isa") == 0) {
      /* Whether this CPU has it is checked when the run starts (perf_codec_main). */
      int k = 0;
      while (k < CP_NISAS && strcmp(v, cp_isas[k]) != 0) k++;
      if (k == CP_NISAS) {
        perf_not_one_of("codec", a, v, cp_isas, CP_NISAS);
        return -1;
      }
      o->isa = v;
    } else {
      fprintf(stderr, "agoq-perf codec: unknown option %s\n", a);
      cp_usage(stderr);
      return -1;
    }
    if (bad) {
      fprintf(stderr, "agoq-perf codec: bad value for %s: '%s'\n", a, v);
      return -1;
    }
  }
  return 0;
}

/* ---- memcpy, one thread and many ---- */

/* The all-threads memcpy keeps its helpers for the whole run, as the codec keeps its pool,
 * so neither side pays thread start-up per call. Two barriers frame each copy. */
typedef struct cp_copier cp_copier;
typedef struct {
  cp_copier* c;
  int t;
} cp_helper;

struct cp_copier {
  pthread_t th[CP_MAX_THREADS];
  cp_helper helper[CP_MAX_THREADS];
  pthread_barrier_t start, done;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool released; /* every helper started (or some failed to: then stop is set) */
  int nthreads;  /* the caller included */
  bool stop;
  uint8_t* dst;
  const uint8_t* src;
  size_t len;
};

/* Slice t of the copy, on 4 KiB boundaries. */
static void cp_copy_slice(cp_copier* c, int t) {
  size_t per = (c->len / (size_t)c->nthreads + 4095) & ~(size_t)4095;
  size_t off = per * (size_t)t;
  if (off < c->len) memcpy(c->dst + off, c->src + off, c->len - off < per ? c->len - off : per);
}

static void* cp_copier_main(void* arg) {
  cp_helper* h = arg;
  cp_copier* c = h->c;
  /* No barrier before all helpers exist: a failed start must not strand the others. */
  pthread_mutex_lock(&c->mu);
  while (!c->released) pthread_cond_wait(&c->cv, &c->mu);
  bool stop = c->stop;
  pthread_mutex_unlock(&c->mu);
  while (!stop) {
    pthread_barrier_wait(&c->start);
    stop = c->stop;
    if (!stop) {
      cp_copy_slice(c, h->t);
      pthread_barrier_wait(&c->done);
    }
  }
  return NULL;
}

static void cp_copier_release(cp_copier* c, bool stop) {
  pthread_mutex_lock(&c->mu);
  c->stop = stop;
  c->released = true;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static int cp_copier_start(cp_copier* c, int nthreads) {
  memset(c, 0, sizeof(*c));
  c->nthreads = nthreads;
  if (nthreads == 1) return 0;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_barrier_init(&c->start, NULL, (unsigned)nthreads);
  pthread_barrier_init(&c->done, NULL, (unsigned)nthreads);
  int started = 1;
  for (; started < nthreads; started++) {
    c->helper[started] = (cp_helper){c, started};
    if (pthread_create(&c->th[started], NULL, cp_copier_main, &c->helper[started]) != 0) break;
  }
  cp_copier_release(c, started < nthreads);
  if (started == nthreads) return 0;
  fprintf(stderr, "agoq-perf codec: cannot start memcpy thread %d of %d\n", started, nthreads);
  for (int t = 1; t < started; t++) pthread_join(c->th[t], NULL);
  pthread_barrier_destroy(&c->start);
  pthread_barrier_destroy(&c->done);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  c->nthreads = 1; /* nothing left to stop */
  return -1;
}

static void cp_copier_run(cp_copier* c, uint8_t* dst, const uint8_t* src, size_t len) {
  c->dst = dst;
  c->src = src;
  c->len = len;
  if (c->nthreads == 1) {
    memcpy(dst, src, len);
    return;
  }
  pthread_barrier_wait(&c->start);
  cp_copy_slice(c, 0);
  pthread_barrier_wait(&c->done);
}

static void cp_copier_stop(cp_copier* c) {
  if (c->nthreads <= 1) return;
  c->stop = true; /* read by the helpers after the barrier: ordered by it */
  pthread_barrier_wait(&c->start);
  for (int t = 1; t < c->nthreads; t++) pthread_join(c->th[t], NULL);
  pthread_barrier_destroy(&c->start);
  pthread_barrier_destroy(&c->done);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  c->nthreads = 1;
}

/* ---- buffers ---- */

/* N(0,1) by Box-Muller, as fp32: a 1 Mi-element table, repeated. The codec's speed does
 * not depend on the values as long as no block is escaped, and this keeps set-up short. */
static int cp_fill(cp_bufs* b, agoq_dtype t) {
  enum { TABLE = 1 << 20 };
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < b->n32 && i < TABLE; i += 2) {
    double u[2];
    for (int k = 0; k < 2; k++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      u[k] = (double)(x >> 11) * 0x1p-53;
    }
    double rad = sqrt(-2.0 * log(1.0 - u[0])), ang = 2.0 * M_PI * u[1];
    b->src32[i] = (float)(rad * cos(ang));
    if (i + 1 < b->n32) b->src32[i + 1] = (float)(rad * sin(ang));
  }
  for (size_t i = TABLE; i < b->n32; i++) b->src32[i] = b->src32[i - TABLE];
  /* The DTYPE input: the same values, narrowed by the codec itself (format none). */
  agoq_codec_params raw = {.format = AGOQ_FORMAT_NONE, .dtype = AGOQ_DTYPE_FP32,
                           .block = AGOQ_CODEC_BLOCK_DEFAULT};
  size_t done = 0;
  while (done < b->n) {
    size_t k = b->n - done < b->n32 ? b->n - done : b->n32;
    agoq_codec_status st = agoq_dequantize(&raw, b->src32, k * sizeof(float), k, t,
                                           b->src + done * agoq_dtype_size(t));
    if (st != AGOQ_CODEC_OK) {
      fprintf(stderr, "agoq-perf codec: converting the input to %s failed: %s\n",
              agoq_dtype_name(t), agoq_codec_status_str(st));
      return -1;
    }
    done += k;
  }
  return 0;
}

static int cp_bufs_alloc(const cp_opts* o, cp_bufs* b) {
  memset(b, 0, sizeof(*b));
  size_t es = agoq_dtype_size(o->dtype);
  b->n = o->bytes / es;
  b->n32 = o->bytes / sizeof(float);
  for (size_t i = 0; i < CP_NFORMATS; i++) {
    agoq_codec_params p = {.format = cp_formats[i], .dtype = o->dtype, .block = o->block};
    size_t c = agoq_codec_body_size_max(&p, b->n);
    if (c > b->body_cap) b->body_cap = c;
    p.dtype = AGOQ_DTYPE_FP32;
    c = agoq_codec_body_size_max(&p, b->n32);
    if (c > b->body_cap) b->body_cap = c;
  }
  b->src = malloc(b->n * es);
  b->src32 = malloc(b->n32 * sizeof(float));
  b->body = malloc(b->body_cap);
  b->dst = malloc(o->bytes);
  b->acc = malloc(b->n * sizeof(float));
  if (!b->src || !b->src32 || !b->body || !b->dst || !b->acc) {
    fprintf(stderr, "agoq-perf codec: cannot allocate the buffers for -s %zu (about %zu MiB)\n",
            o->bytes, (b->n * es + o->bytes * 2 + b->body_cap + b->n * 4) >> 20);
    return -1;
  }
  /* Touch every page now, so first-touch faults are not timed. */
  memset(b->body, 0, b->body_cap);
  memset(b->dst, 0, o->bytes);
  memset(b->acc, 0, b->n * sizeof(float));
  return cp_fill(b, o->dtype);
}

static void cp_bufs_free(cp_bufs* b) {
  free(b->src);
  free(b->src32);
  free(b->body);
  free(b->dst);
  free(b->acc);
  memset(b, 0, sizeof(*b));
}

/* ---- measurements ---- */

typedef struct {
  const cp_opts* o;
  cp_bufs* b;
  agoq_codec_params p; /* format, dtype (fp32 for quantize-fp32), block */
  size_t n;            /* elements the operation covers */
  size_t body_len;     /* set by a quantize, used by the decoders */
  size_t escaped;
  int nthreads;        /* < 0: the single-threaded entry point */
} cp_run;

static agoq_codec_status cp_run_once(cp_run* r, int op) {
  cp_bufs* b = r->b;
  const void* src = op == CP_QUANTIZE_FP32 ? (const void*)b->src32 : (const void*)b->src;
  switch (op) {
    case CP_QUANTIZE:
    case CP_QUANTIZE_FP32:
      return r->nthreads < 0 ? agoq_quantize(&r->p, src, r->n, b->body, b->body_cap,
                                             &r->body_len, &r->escaped)
                             : agoq_quantize_mt(&r->p, src, r->n, b->body, b->body_cap,
                                                &r->body_len, &r->escaped, r->nthreads);
    case CP_DEQUANTIZE:
      return r->nthreads < 0
                 ? agoq_dequantize(&r->p, b->body, r->body_len, r->n, r->p.dtype, b->dst)
                 : agoq_dequantize_mt(&r->p, b->body, r->body_len, r->n, r->p.dtype, b->dst,
                                      r->nthreads);
    default:
      return r->nthreads < 0
                 ? agoq_dequantize_accumulate(&r->p, b->body, r->body_len, r->n, b->acc)
                 : agoq_dequantize_accumulate_mt(&r->p, b->body, r->body_len, r->n, b->acc,
                                                 r->nthreads);
  }
}

/* One figure: every run copies the same bytes with memcpy and then runs the operation, back
 * to back, so both see the same machine; the best of each is kept. nthreads < 0: the
 * single-threaded entry point and memcpy. 0 ok, -1 on a codec error (printed). */
static int cp_measure(cp_run* r, int op, cp_copier* copier, double* op_us, double* copy_us) {
  cp_bufs* b = r->b;
  size_t bytes = r->o->bytes;
  *op_us = *copy_us = INFINITY;
  for (int i = 0; i < r->o->repeats; i++) {
    double t0 = perf_now_us();
    if (r->nthreads < 0)
      memcpy(b->dst, b->src32, bytes);
    else
      cp_copier_run(copier, b->dst, (const uint8_t*)b->src32, bytes);
    double t1 = perf_now_us();
    agoq_codec_status st = cp_run_once(r, op);
    double t2 = perf_now_us();
    if (st != AGOQ_CODEC_OK) {
      fprintf(stderr, "agoq-perf codec: %s %s of %zu x %s failed: %s\n", cp_op_names[op],
              agoq_format_name(r->p.format), r->n, agoq_dtype_name(r->p.dtype),
              agoq_codec_status_str(st));
      return -1;
    }
    if (t1 - t0 < *copy_us) *copy_us = t1 - t0;
    if (t2 - t1 < *op_us) *op_us = t2 - t1;
  }
  return 0;
}

/* ---- output ---- */

typedef struct {
  const char* op;
  const char* format;
  double st_us, st_copy_us, mt_us, mt_copy_us;
  size_t body_len, escaped;
} cp_row;

static double cp_gbps(size_t bytes, double us) { return us > 0 ? (double)bytes / (us * 1e3) : 0; }

static void cp_header(const cp_opts* o, int nthreads) {
  if (o->json) return;
  char size[32];
  perf_format_size(o->bytes, size, sizeof(size));
  printf("# agoq-perf codec: dtype %s, block %u, %s of input per operation, isa %s (available:",
         agoq_dtype_name(o->dtype), o->block, size, agoq_codec_isa());
  for (int i = 0; i < CP_NISAS; i++)
    if (agoq_codec_isa_available(cp_isas[i])) printf(" %s", cp_isas[i]);
  printf("), %d threads in the Nthr columns\n", nthreads);
  printf("# GB/s = input bytes / time: the %s array a quantize reads or a dequantize writes (fp32 "
         "for quantize-fp32). memcpy: the same bytes, 1 thread or %d threads.\n",
         agoq_dtype_name(o->dtype), nthreads);
  printf("# Each figure is the best of %d runs (the machine is noisy: the best run is the least "
         "disturbed).\n# Every run times a memcpy right before the operation: x memcpy compares "
         "figures measured side by side.\n",
         o->repeats);
  printf("# body/in: encoded body bytes / input bytes.\n#\n");
  printf("# %-8s %-22s %10s %8s %8s %10s %8s %8s %8s\n", "format", "operation", "1thr GB/s",
         "memcpy", "x memcpy", "Nthr GB/s", "memcpy", "x memcpy", "body/in");
}

static void cp_line(const cp_opts* o, int nthreads, const cp_row* r) {
  double st = cp_gbps(o->bytes, r->st_us), mt = cp_gbps(o->bytes, r->mt_us);
  double mst = cp_gbps(o->bytes, r->st_copy_us), mmt = cp_gbps(o->bytes, r->mt_copy_us);
  double ratio_st = mst > 0 ? st / mst : 0, ratio_mt = mmt > 0 ? mt / mmt : 0;
  double body_in = (double)r->body_len / (double)o->bytes;
  if (!o->json) {
    printf("  %-8s %-22s %10.3f %8.3f %8.3f %10.3f %8.3f %8.3f %8.4f\n", r->format, r->op, st, mst,
           ratio_st, mt, mmt, ratio_mt, body_in);
    return;
  }
  printf("{\"test\":\"codec\",\"op\":\"%s\",\"format\":\"%s\",\"dtype\":\"%s\",\"block\":%u,"
         "\"bytes\":%zu,\"isa\":\"%s\",\"repeats\":%d,\"threads\":%d,\"st_GBps\":%.4f,"
         "\"st_memcpy_GBps\":%.4f,\"st_x_memcpy\":%.4f,\"mt_GBps\":%.4f,\"mt_memcpy_GBps\":%.4f,"
         "\"mt_x_memcpy\":%.4f,\"body_bytes\":%zu,\"escaped_blocks\":%zu}\n",
         r->op, r->format, agoq_dtype_name(o->dtype), o->block, o->bytes, agoq_codec_isa(),
         o->repeats, nthreads, st, mst, ratio_st, mt, mmt, ratio_mt, r->body_len, r->escaped);
}

/* ---- the run ---- */

/* Measures and prints the selected operations of one format. */
static int cp_format(const cp_opts* o, cp_bufs* b, cp_copier* copier, agoq_format f,
                     int nthreads) {
  cp_run r = {.o = o,
              .b = b,
              .p = {.format = f, .dtype = o->dtype, .block = o->block},
              .n = b->n,
              .nthreads = 0};
  bool decoders = (o->op_mask & (1u << CP_DEQUANTIZE | 1u << CP_DEQUANT_ACC)) != 0;
  if (decoders && (o->op_mask & (1u << CP_QUANTIZE)) == 0) {
    /* The decoders still need a body. */
    agoq_codec_status st = cp_run_once(&r, CP_QUANTIZE);
    if (st != AGOQ_CODEC_OK) {
      fprintf(stderr, "agoq-perf codec: quantize %s failed: %s\n", agoq_format_name(f),
              agoq_codec_status_str(st));
      return -1;
    }
  }
  for (int op = 0; op < CP_NOPS; op++) {
    if ((o->op_mask & (1u << op)) == 0) continue;
    if (op == CP_QUANTIZE_FP32) {
      if (o->dtype == AGOQ_DTYPE_FP32) continue;
      r.p.dtype = AGOQ_DTYPE_FP32;
      r.n = b->n32;
    }
    cp_row row = {.op = cp_op_names[op], .format = agoq_format_name(f)};
    r.nthreads = -1;
    if (cp_measure(&r, op, copier, &row.st_us, &row.st_copy_us) != 0) return -1;
    r.nthreads = nthreads;
    if (cp_measure(&r, op, copier, &row.mt_us, &row.mt_copy_us) != 0) return -1;
    row.body_len = r.body_len;
    row.escaped = r.escaped;
    cp_line(o, nthreads, &row);
    fflush(stdout);
  }
  return 0;
}

int perf_codec_main(int argc, char** argv) {
  cp_opts o;
  int rc = cp_opts_parse(argc, argv, &o);
  if (rc != 0) return rc > 0 ? 0 : 2;
  if (o.isa != NULL && agoq_codec_set_isa(o.isa) != 0) {
    const char* have[CP_NISAS];
    int n = 0;
    for (int i = 0; i < CP_NISAS; i++)
      if (agoq_codec_isa_available(cp_isas[i])) have[n++] = cp_isas[i];
    char list[96];
    agoq_args_join(list, sizeof list, have, n);
    fprintf(stderr, "agoq-perf codec: --isa: \"%s\" is not available in this build or on this CPU "
            "(available: %s)\n", o.isa, list);
    return 2;
  }
  /* The codec never runs more threads than there are CPUs; neither does the memcpy it is
   * compared with. */
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int ncpu = online < 1 ? 1 : online > CP_MAX_THREADS ? CP_MAX_THREADS : (int)online;
  int nthreads = o.threads == 0 || o.threads > ncpu ? ncpu : o.threads;

  cp_bufs b;
  cp_copier copier = {.nthreads = 1};
  rc = 1;
  if (cp_bufs_alloc(&o, &b) != 0 || cp_copier_start(&copier, nthreads) != 0) goto out;
  cp_header(&o, nthreads);
  fflush(stdout);
  for (size_t i = 0; i < CP_NFORMATS; i++)
    if ((o.format_mask & (1u << cp_formats[i])) &&
        cp_format(&o, &b, &copier, cp_formats[i], nthreads) != 0)
      goto out;
  rc = 0;
out:
  cp_copier_stop(&copier);
  cp_bufs_free(&b);
  return rc;
}
