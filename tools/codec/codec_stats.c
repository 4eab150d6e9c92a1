/*
 * stats A B: how far B (say, a round trip) is from the reference A, in double precision.
 * Pairs where one side is NaN and the other is not, or where an Inf differs, are counted
 * apart and left out of the error sums (they would make every figure NaN or Inf).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

typedef struct {
  size_t n, compared, differing, nan_mismatch, inf_mismatch;
  double max_abs, sum_d2, sum_a2;
} codec_stats;

static void codec_stats_run(agoq_dtype t, const uint8_t* a, const uint8_t* b, size_t n,
                            codec_stats* s) {
  size_t es = agoq_dtype_size(t);
  memset(s, 0, sizeof(*s));
  s->n = n;
  for (size_t i = 0; i < n; i++) {
    if (memcmp(a + i * es, b + i * es, es) != 0) s->differing++;
    double x = codec_elem_get(t, a, i), y = codec_elem_get(t, b, i);
    if (isnan(x) || isnan(y)) {
      if (!isnan(x) != !isnan(y)) s->nan_mismatch++;
      continue;
    }
    if (isinf(x) || isinf(y)) {
      if (x != y) s->inf_mismatch++;
      continue;
    }
    double d = fabs(y - x);
    if (d > s->max_abs) s->max_abs = d;
    s->sum_d2 += d * d;
    s->sum_a2 += x * x;
    s->compared++;
  }
}

int codec_stats_main(int argc, char** argv) {
  codec_opts o;
  int rc = codec_opts_parse(argc, argv, CODEC_OPT_DTYPE, CODEC_OPT_DTYPE, 2, &o);
  if (rc != 0) return rc > 0 ? 0 : CODEC_EXIT_USAGE;

  uint8_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  rc = CODEC_EXIT_FAIL;
  if (codec_array_read(o.cmd, o.path[0], o.dtype, &a, &na) != 0) goto done;
  if (codec_array_read(o.cmd, o.path[1], o.dtype, &b, &nb) != 0) goto done;
  if (na != nb) {
    codec_err(o.cmd, "size mismatch: %s has %zu %s elements, %s has %zu", o.path[0], na,
              agoq_dtype_name(o.dtype), o.path[1], nb);
    goto done;
  }
  codec_stats s;
  codec_stats_run(o.dtype, a, b, na, &s);
  double rms = s.compared ? sqrt(s.sum_d2 / (double)s.compared) : 0.0;
  /* Relative to A's norm; an all-zero A gives 0 when B matches it and Inf otherwise. */
  double rel = s.sum_a2 > 0 ? sqrt(s.sum_d2) / sqrt(s.sum_a2) : s.sum_d2 > 0 ? INFINITY : 0.0;
  printf("elements       %zu\n", s.n);
  printf("differing      %zu\n", s.differing);
  printf("max_abs_err    %.9g\n", s.max_abs);
  printf("rms_err        %.9g\n", rms);
  printf("rel_l2_err     %.9g (%.4f %%)\n", rel, rel * 100.0);
  printf("nan_mismatch   %zu\n", s.nan_mismatch);
  printf("inf_mismatch   %zu\n", s.inf_mismatch);
  rc = 0;
done:
  free(a);
  free(b);
  return rc;
}
