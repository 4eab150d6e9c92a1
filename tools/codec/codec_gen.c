/*
 * gen: reproducible test input. xoshiro256** seeded through splitmix64; normal values by
 * Box-Muller. The same seed gives the same file on the same libm.
 */
#include <math.h>
#include <stdlib.h>

#include "codec.h"

typedef struct {
  uint64_t s[4];
} codec_rng;

static uint64_t codec_splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t codec_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t codec_rng_next(codec_rng* r) {
  uint64_t* s = r->s;
  uint64_t out = codec_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = codec_rotl(s[3], 45);
  return out;
}

/* [0, 1) with 53 random bits. */
static double codec_rng_unit(codec_rng* r) { return (double)(codec_rng_next(r) >> 11) * 0x1p-53; }

int codec_gen_main(int argc, char** argv) {
  codec_opts o;
  int rc = codec_opts_parse(argc, argv, CODEC_OPT_DTYPE | CODEC_OPT_COUNT | CODEC_OPT_DIST |
                                            CODEC_OPT_SEED,
                            CODEC_OPT_DTYPE | CODEC_OPT_COUNT, 1, &o);
  if (rc != 0) return rc > 0 ? 0 : CODEC_EXIT_USAGE;
  size_t es = agoq_dtype_size(o.dtype);
  if (o.count > SIZE_MAX / es) {
    codec_err(o.cmd, "-n %zu elements of %s do not fit in memory", o.count,
              agoq_dtype_name(o.dtype));
    return CODEC_EXIT_USAGE;
  }
  uint8_t* out = malloc(o.count ? o.count * es : 1);
  if (out == NULL) {
    codec_err(o.cmd, "out of memory for %zu elements", o.count);
    return CODEC_EXIT_FAIL;
  }
  codec_rng r;
  uint64_t x = o.seed;
  for (int i = 0; i < 4; i++) r.s[i] = codec_splitmix64(&x);
  for (size_t i = 0; i < o.count; i += 2) {
    double v[2];
    if (o.dist == CODEC_DIST_UNIFORM) {
      v[0] = 2.0 * codec_rng_unit(&r) - 1.0;
      v[1] = 2.0 * codec_rng_unit(&r) - 1.0;
    } else {
      double u1 = 1.0 - codec_rng_unit(&r); /* (0, 1]: log stays finite */
      double u2 = codec_rng_unit(&r);
      double rad = sqrt(-2.0 * log(u1)), ang = 2.0 * M_PI * u2;
      v[0] = rad * cos(ang);
      v[1] = rad * sin(ang);
    }
    codec_elem_put(o.dtype, out, i, (float)v[0]);
    if (i + 1 < o.count) codec_elem_put(o.dtype, out, i + 1, (float)v[1]);
  }
  rc = codec_file_write(o.cmd, o.path[0], out, o.count * es) == 0 ? 0 : CODEC_EXIT_FAIL;
  free(out);
  return rc;
}
