/* agoq-collnet-error: the error of a quantized CollNet allreduce as the group grows, measured
 * with agoq's CPU codec (issue 28 item 6, tier E). For each n, n contributions of m fp32
 * elements are generated one at a time (memory O(m * rows), not O(m * n)) and reduced three
 * ways:
 *   direct  the one-level mesh as the plugin runs it: each contribution quantized once,
 *           decoded and summed in fp32 in rank order, the sum quantized once;
 *   grid    the two-level schedule (plugin/collnet/agoq_coll_schedule.h, its automatic grid):
 *           the same quantizations, summed in fp32 per row in rank order, then the row sums
 *           in row order, the total quantized once;
 *   hop     a ring that requantizes at every hop (what agoq does not do), for contrast.
 * Reported, per n: eps, the relative RMS error of quantizing one contribution (over all of
 * them), and each result's relative RMS error against the fp64 sum, over eps. With
 * independent contributions direct and grid stay near sqrt(2) at any n; hop grows as
 * sqrt((n+1)/2). Everything printed is measured; the generator is seeded, so a run is
 * reproducible bit for bit. --check N1 N2: exit 1 unless grid's ratio at N2 is within 5% of
 * that at N1 (both must be in the sweep). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_args.h"
#include "agoq_frame.h"
#include "collnet/agoq_coll_schedule.h"

typedef struct {
  uint64_t s;
} rng;

static double rng_unit(rng* r) {
  r->s ^= r->s << 13;
  r->s ^= r->s >> 7;
  r->s ^= r->s << 17;
  return ((double)(r->s >> 11) + 0.5) * 0x1p-53;
}

static double rng_gauss(rng* r) {
  double u = rng_unit(r), v = rng_unit(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

typedef struct {
  agoq_codec_params p;
  size_t m, cap;
  uint8_t* frame;
} codec;

/* y = decode(quantize(x)); acc: y added into dst instead (first: dst = y). */
static void quant_into(codec* c, const float* x, float* dst, bool add) {
  size_t len = 0;
  if (agoq_frame_encode(&c->p, x, c->m, false, c->frame, c->cap, &len) != AGOQ_CODEC_OK ||
      (add ? agoq_frame_decode_accumulate(c->frame, len, dst, c->m)
           : agoq_frame_decode(c->frame, len, AGOQ_DTYPE_FP32, dst, c->m)) != AGOQ_CODEC_OK) {
    fprintf(stderr, "agoq-collnet-error: the codec failed\n");
    exit(1);
  }
}

typedef struct {
  int n;
  agoq_coll_grid g;
  double eps, direct, grid, hop;
} sweep_row;

static double rel_rms(const float* got, const double* want, size_t m) {
  double e = 0, w = 0;
  for (size_t i = 0; i < m; i++) {
    double d = (double)got[i] - want[i];
    e += d * d;
    w += want[i] * want[i];
  }
  return w > 0 ? sqrt(e / w) : 0;
}

static void sweep_one(int n, size_t m, double rho, uint64_t seed, bool hop, sweep_row* out) {
  codec c = {.p = {.format = AGOQ_FORMAT_INT8, .dtype = AGOQ_DTYPE_FP32, .block = 128}, .m = m};
  c.cap = agoq_frame_size_max(&c.p, m);
  c.frame = malloc(c.cap);
  agoq_coll_grid g;
  agoq_coll_grid_auto(n, &g);
  float* x = malloc(m * sizeof *x);
  float* y = malloc(m * sizeof *y);
  float* shared = malloc(m * sizeof *shared);
  float* direct = malloc(m * sizeof *direct);
  float* rows = malloc((size_t)g.b * m * sizeof *rows);
  float* ring = malloc(m * sizeof *ring);
  float* tmp = malloc(m * sizeof *tmp);
  double* exact = calloc(m, sizeof *exact);
  if (!c.frame || !x || !y || !shared || !direct || !rows || !ring || !tmp || !exact) {
    fprintf(stderr, "agoq-collnet-error: out of memory at n %d\n", n);
    exit(1);
  }
  rng r = {.s = seed * 0x9e3779b97f4a7c15ull + 1};
  for (size_t i = 0; i < m; i++) shared[i] = (float)rng_gauss(&r);
  double qe = 0, qw = 0;
  double a = sqrt(rho), b = sqrt(1.0 - rho);
  for (int k = 0; k < n; k++) {
    for (size_t i = 0; i < m; i++) x[i] = (float)(a * shared[i] + b * rng_gauss(&r));
    quant_into(&c, x, y, false);
    for (size_t i = 0; i < m; i++) {
      double d = (double)y[i] - x[i];
      qe += d * d;
      qw += (double)x[i] * x[i];
      exact[i] += x[i];
    }
    /* direct: rank order; grid: this rank's row, in rank order (the row's player sums its
     * row's decoded contributions as they are: y is what the frame decodes to). */
    if (k == 0) memcpy(direct, y, m * sizeof *y);
    else for (size_t i = 0; i < m; i++) direct[i] += y[i];
    int row = agoq_coll_grid_row(&g, k);
    float* rs = rows + (size_t)row * m;
    if (k == row * g.a) memcpy(rs, y, m * sizeof *y);
    else for (size_t i = 0; i < m; i++) rs[i] += y[i];
    if (hop) {
      if (k == 0) memcpy(ring, y, m * sizeof *y);
      else {
        for (size_t i = 0; i < m; i++) tmp[i] = ring[i] + y[i];
        quant_into(&c, tmp, ring, false);
      }
    }
  }
  /* grid: the row sums in row order (each column player's fp32 sum of its piece). */
  float* total = rows;
  for (int row = 1; row < g.b; row++)
    for (size_t i = 0; i < m; i++) total[i] += rows[(size_t)row * m + i];
  quant_into(&c, direct, tmp, false);
  out->direct = rel_rms(tmp, exact, m);
  quant_into(&c, total, tmp, false);
  out->grid = rel_rms(tmp, exact, m);
  out->hop = hop ? rel_rms(ring, exact, m) : NAN;
  out->eps = sqrt(qe / qw);
  out->n = n;
  out->g = g;
  free(c.frame);
  free(x);
  free(y);
  free(shared);
  free(direct);
  free(rows);
  free(ring);
  free(tmp);
  free(exact);
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: agoq-collnet-error [--n N,N,...] [--elems M] [--rho R] [--seed S] [--no-hop] [--check N1 N2]\n"
          "  --n      group sizes (default 2,4,8,16,32,64,128,256,512,1024,2048,4096)\n"
          "  --elems  elements per contribution (default 65536)\n"
          "  --rho    share of a component common to every rank, 0..1 (default 0: independent)\n"
          "  --check  exit 1 unless the grid's error ratio at N2 is within 5%% of that at N1\n");
}

int main(int argc, char** argv) {
  const char* prog = "agoq-collnet-error";
  int ns[64], nn = 0;
  size_t m = 65536;
  double rho = 0;
  uint64_t seed = 1;
  bool hop = true;
  int check[2] = {0, 0};
  static const int def[] = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  for (int i = 1; i < argc; i++) {
    const char* o = argv[i];
    if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(o, "--no-hop") == 0) {
      hop = false;
      continue;
    }
    if (i + 1 >= argc) {
      usage(stderr);
      return 2;
    }
    const char* v = argv[++i];
    if (strcmp(o, "--n") == 0) {
      char* copy = strdup(v);
      for (char* t = strtok(copy, ","); t != NULL; t = strtok(NULL, ",")) {
        if (nn == 64) {
          fprintf(stderr, "%s: --n: at most 64 sizes\n", prog);
          return 2;
        }
        ns[nn++] = agoq_args_int_or_exit(prog, "--n", t, 1, 65536);
      }
      free(copy);
    } else if (strcmp(o, "--elems") == 0) {
      m = (size_t)agoq_args_ll_or_exit(prog, "--elems", v, 128, 1 << 24);
    } else if (strcmp(o, "--rho") == 0) {
      if (agoq_args_parse_double(v, 0, 1, &rho) != 0) {
        fprintf(stderr, "%s: bad value for --rho: '%s' (0 to 1)\n", prog, v);
        return 2;
      }
    } else if (strcmp(o, "--seed") == 0) {
      seed = agoq_args_ull_or_exit(prog, "--seed", v, UINT64_MAX);
    } else if (strcmp(o, "--check") == 0) {
      if (i + 1 >= argc) {
        usage(stderr);
        return 2;
      }
      check[0] = agoq_args_int_or_exit(prog, "--check", v, 1, 65536);
      check[1] = agoq_args_int_or_exit(prog, "--check", argv[++i], 1, 65536);
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (nn == 0) {
    nn = (int)(sizeof def / sizeof def[0]);
    memcpy(ns, def, sizeof def);
  }
  printf("# int8 block 128, fp32 contributions of %zu elements, rho %.2f, seed %llu\n", m, rho,
         (unsigned long long)seed);
  printf("# error = relative RMS error against the fp64 sum; eps = that of one quantization\n");
  printf("%6s %9s %9s %12s %10s %10s\n", "n", "grid", "eps", "direct/eps", "grid/eps", "hop/eps");
  double at[2] = {NAN, NAN};
  for (int i = 0; i < nn; i++) {
    sweep_row row;
    sweep_one(ns[i], m, rho, seed + (uint64_t)i, hop, &row);
    char shape[24];
    snprintf(shape, sizeof shape, "%dx%d", row.g.a, row.g.b);
    printf("%6d %9s %9.3e %12.4f %10.4f %10.4f\n", row.n, shape, row.eps, row.direct / row.eps, row.grid / row.eps,
           row.hop / row.eps);
    fflush(stdout);
    for (int j = 0; j < 2; j++)
      if (ns[i] == check[j]) at[j] = row.grid / row.eps;
  }
  if (check[0] > 0) {
    if (isnan(at[0]) || isnan(at[1])) {
      fprintf(stderr, "%s: --check %d %d: both sizes must be swept\n", prog, check[0], check[1]);
      return 2;
    }
    double rel = at[1] / at[0] - 1;
    printf("# check: grid/eps at n=%d is %.4f, at n=%d %.4f: %+.1f%% (limit 5%%)\n", check[1], at[1], check[0], at[0],
           100 * rel);
    return fabs(rel) <= 0.05 ? 0 : 1;
  }
  return 0;
}
