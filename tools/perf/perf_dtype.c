/*
 * Datatypes, conversions, inputs and references for the collective benchmarks and tests
 * (perf_dtype.h). Float arithmetic here must be plain IEEE with no contraction: the
 * exact-path reference is compared bit for bit (built with -ffp-contract=off).
 */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "perf_dtype.h"

static const struct {
  const char* name;
  const char* alias[3];
  size_t size;
} perf_dtypes[PERF_NUM_DTYPES] = {
    [ncclInt8] = {"int8", {"char", "i8", NULL}, 1},
    [ncclUint8] = {"uint8", {"u8", NULL, NULL}, 1},
    [ncclInt32] = {"int32", {"int", "i32", NULL}, 4},
    [ncclUint32] = {"uint32", {"u32", NULL, NULL}, 4},
    [ncclInt64] = {"int64", {"i64", NULL, NULL}, 8},
    [ncclUint64] = {"uint64", {"u64", NULL, NULL}, 8},
    [ncclFloat16] = {"fp16", {"float16", "half", NULL}, 2},
    [ncclFloat32] = {"fp32", {"float32", "float", NULL}, 4},
    [ncclFloat64] = {"fp64", {"float64", "double", NULL}, 8},
    [ncclBfloat16] = {"bf16", {"bfloat16", NULL, NULL}, 2},
    [ncclFloat8e4m3] = {"fp8e4m3", {"e4m3", "float8e4m3", NULL}, 1},
    [ncclFloat8e5m2] = {"fp8e5m2", {"e5m2", "float8e5m2", NULL}, 1},
};

static const char* const perf_ops[PERF_NUM_OPS] = {"sum", "prod", "max", "min"};

static bool perf_dtype_valid(ncclDataType_t t) { return (unsigned)t < PERF_NUM_DTYPES; }

const char* perf_dtype_name(ncclDataType_t t) {
  return perf_dtype_valid(t) ? perf_dtypes[t].name : "?";
}

int perf_dtype_parse(const char* s, ncclDataType_t* t) {
  for (int i = 0; i < PERF_NUM_DTYPES; i++) {
    bool hit = strcasecmp(s, perf_dtypes[i].name) == 0;
    for (int a = 0; a < 3 && !hit && perf_dtypes[i].alias[a] != NULL; a++)
      hit = strcasecmp(s, perf_dtypes[i].alias[a]) == 0;
    if (hit) {
      *t = (ncclDataType_t)i;
      return 0;
    }
  }
  return -1;
}

size_t perf_dtype_size(ncclDataType_t t) { return perf_dtype_valid(t) ? perf_dtypes[t].size : 0; }

bool perf_dtype_is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
         t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

bool perf_dtype_is_signed_int(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
}

const char* perf_op_name(ncclRedOp_t op) {
  return (unsigned)op < PERF_NUM_OPS ? perf_ops[op] : "?";
}

int perf_op_parse(const char* s, ncclRedOp_t* op) {
  for (int i = 0; i < PERF_NUM_OPS; i++)
    if (strcasecmp(s, perf_ops[i]) == 0) {
      *op = (ncclRedOp_t)i;
      return 0;
    }
  return -1;
}

/* ---- conversions ---- */

/* Elements are read and written as typed accesses through may_alias types and unions rather
 * than memcpy: the same bits, but under ThreadSanitizer one aligned, instrumented load per
 * element where memcpy (and unaligned access) go through its range check, which made the
 * CollNet harness's references 90 % of a TSan test. Misaligned elements take the memcpy. */
typedef uint16_t perf_a16 __attribute__((may_alias));
typedef uint32_t perf_a32 __attribute__((may_alias));
typedef uint64_t perf_a64 __attribute__((may_alias));
#define PERF_ALIGNED(p, n) (((uintptr_t)(p) & ((n) - 1)) == 0)
#define PERF_LD(bits)                                                   \
  static inline uint##bits##_t perf_ld##bits(const void* p) {           \
    if (PERF_ALIGNED(p, bits / 8)) return *(const perf_a##bits*)p;      \
    uint##bits##_t v;                                                   \
    memcpy(&v, p, bits / 8);                                            \
    return v;                                                           \
  }                                                                     \
  static inline void perf_st##bits(void* p, uint##bits##_t v) {         \
    if (PERF_ALIGNED(p, bits / 8))                                      \
      *(perf_a##bits*)p = v;                                            \
    else                                                                \
      memcpy(p, &v, bits / 8);                                          \
  }
PERF_LD(16)
PERF_LD(32)
PERF_LD(64)
#undef PERF_LD

static uint32_t perf_f32_bits(float f) {
  union { float f; uint32_t u; } b = {.f = f};
  return b.u;
}

static float perf_bits_f32(uint32_t u) {
  union { uint32_t u; float f; } b = {.u = u};
  return b.f;
}

static uint64_t perf_f64_bits(double d) {
  union { double d; uint64_t u; } b = {.d = d};
  return b.u;
}

static double perf_bits_f64(uint64_t u) {
  union { uint64_t u; double d; } b = {.u = u};
  return b.d;
}

uint16_t perf_f32_to_bf16(float f) {
  uint32_t x = perf_f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float perf_bf16_to_f32(uint16_t h) { return perf_bits_f32((uint32_t)h << 16); }

uint16_t perf_f32_to_fp16(float f) {
  uint32_t x = perf_f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
  if (ax < 0x38800000u) {
    /* Below fp16's smallest normal: multiples of 2^-24; the scaling is exact, and a result
     * of 1024 is the smallest normal's encoding. */
    float m = nearbyintf(perf_bits_f32(ax) * 16777216.0f);
    return (uint16_t)(sign | (uint16_t)m);
  }
  uint32_t h = ((((ax >> 23) - 127u + 15u)) << 10) | ((ax >> 13) & 0x3ffu);
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry moves into the exponent */
  return (uint16_t)(sign | h);
}

float perf_fp16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return perf_bits_f32(sign | 0x7f800000u | (m << 13));
  float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400u), (int)e - 25);
  return sign ? -v : v;
}

uint8_t perf_f32_to_fp8(float f, bool e5m2) {
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const float maxv = e5m2 ? 57344.0f : 448.0f;
  const uint8_t maxcode = e5m2 ? 0x7b : 0x7e;
  uint8_t sign = signbit(f) ? 0x80 : 0;
  if (isnan(f)) return (uint8_t)(sign | 0x7f);
  float a = fabsf(f);
  if (a >= maxv) return (uint8_t)(sign | maxcode);
  if (a == 0.0f) return sign;
  int e;
  frexpf(a, &e);
  int exp = e - 1;
  const int min_exp = 1 - bias;
  bool subnormal = exp < min_exp;
  if (subnormal) exp = min_exp;
  float n = nearbyintf(ldexpf(a, mbits - exp)); /* exact scaling by a power of two */
  unsigned code = subnormal ? (unsigned)n
                            : (((unsigned)(exp + bias)) << mbits) + (unsigned)n - (1u << mbits);
  if (code > maxcode) code = maxcode;
  return (uint8_t)(sign | code);
}

float perf_fp8_to_f32(uint8_t c, bool e5m2) {
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  unsigned ebits = e5m2 ? 5 : 4;
  unsigned E = (c >> mbits) & ((1u << ebits) - 1), m = c & ((1u << mbits) - 1);
  bool neg = (c & 0x80) != 0;
  float v;
  if (e5m2 && E == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else if (!e5m2 && E == 15 && m == 7) {
    v = NAN;
  } else if (E == 0) {
    v = ldexpf((float)m, 1 - bias - mbits);
  } else {
    v = ldexpf((float)(m | (1u << mbits)), (int)E - bias - mbits);
  }
  return neg ? -v : v;
}

/* ---- element access ---- */

double perf_elem_get(ncclDataType_t t, const void* buf, size_t i) {
  const uint8_t* p = (const uint8_t*)buf + i * perf_dtype_size(t);
  switch (t) {
    case ncclInt8: return (double)(int8_t)p[0];
    case ncclUint8: return (double)p[0];
    case ncclInt32: return (double)(int32_t)perf_ld32(p);
    case ncclUint32: return (double)perf_ld32(p);
    case ncclInt64: return (double)(int64_t)perf_ld64(p);
    case ncclUint64: return (double)perf_ld64(p);
    case ncclFloat64: return perf_bits_f64(perf_ld64(p));
    default: return (double)perf_elem_get_f32(t, buf, i);
  }
}

float perf_elem_get_f32(ncclDataType_t t, const void* buf, size_t i) {
  const uint8_t* p = (const uint8_t*)buf + i * perf_dtype_size(t);
  switch (t) {
    case ncclFloat32: return perf_bits_f32(perf_ld32(p));
    case ncclFloat64: return (float)perf_bits_f64(perf_ld64(p));
    case ncclBfloat16: return perf_bf16_to_f32(perf_ld16(p));
    case ncclFloat16: return perf_fp16_to_f32(perf_ld16(p));
    case ncclFloat8e4m3: return perf_fp8_to_f32(p[0], false);
    case ncclFloat8e5m2: return perf_fp8_to_f32(p[0], true);
    default: return (float)perf_elem_get(t, buf, i);
  }
}

void perf_elem_set_f32(ncclDataType_t t, void* buf, size_t i, float v) {
  uint8_t* p = (uint8_t*)buf + i * perf_dtype_size(t);
  switch (t) {
    case ncclFloat32: perf_st32(p, perf_f32_bits(v)); return;
    case ncclFloat64: perf_st64(p, perf_f64_bits((double)v)); return;
    case ncclBfloat16: perf_st16(p, perf_f32_to_bf16(v)); return;
    case ncclFloat16: perf_st16(p, perf_f32_to_fp16(v)); return;
    case ncclFloat8e4m3: p[0] = perf_f32_to_fp8(v, false); return;
    case ncclFloat8e5m2: p[0] = perf_f32_to_fp8(v, true); return;
    default: perf_elem_set(t, buf, i, (double)v); return;
  }
}

void perf_elem_set(ncclDataType_t t, void* buf, size_t i, double v) {
  uint8_t* p = (uint8_t*)buf + i * perf_dtype_size(t);
  if (t == ncclFloat64) {
    perf_st64(p, perf_f64_bits(v));
    return;
  }
  if (perf_dtype_is_float(t)) {
    /* Through fp32 first: inputs made here only need to be some value of the type. */
    perf_elem_set_f32(t, buf, i, (float)v);
    return;
  }
  double r = nearbyint(v);
  /* Wrap modulo 2^64 through the signed or unsigned range that holds r. */
  uint64_t u = r < 0 ? (uint64_t)(int64_t)r : (uint64_t)r;
  switch (t) {
    case ncclInt8: case ncclUint8: p[0] = (uint8_t)u; return;
    case ncclInt32: case ncclUint32: perf_st32(p, (uint32_t)u); return;
    default: perf_st64(p, u); return;
  }
}

/* ---- inputs ---- */

uint64_t perf_mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Box-Muller on a counter-based pair: elements 2j and 2j+1 share one pair, so any range
 * of a stream can be regenerated on its own. */
static void perf_normal_pair(uint64_t seed, uint64_t j, double* even, double* odd) {
  /* In fp32: twice as fast as in double, and finer than any type but fp64 needs. Both
   * 32-bit halves of one hash feed the two uniforms. */
  uint64_t h = perf_mix64(seed ^ perf_mix64(j));
  float u1 = ((float)(uint32_t)(h >> 40) + 1.0f) * 0x1.0p-24f; /* (0, 1] */
  float u2 = (float)(uint32_t)(h & 0xffffffu) * 0x1.0p-24f;
  float r = sqrtf(-2.0f * logf(u1));
  float sn, cs;
  sincosf(6.2831853f * u2, &sn, &cs);
  *even = (double)(r * cs);
  *odd = (double)(r * sn);
}

double perf_normal(uint64_t seed, uint64_t i) {
  double e, o;
  perf_normal_pair(seed, i >> 1, &e, &o);
  return (i & 1) ? o : e;
}

uint64_t perf_rank_seed(uint64_t base, int rank) {
  return perf_mix64(base ^ (0x5851F42D4C957F2Dull * (uint64_t)(rank + 1)));
}

static double perf_input_shape(ncclDataType_t t, int nranks, double x) {
  if (perf_dtype_is_float(t)) return x;
  double lim = t == ncclInt8 ? floor(127.0 / nranks) : t == ncclUint8 ? floor(255.0 / nranks) : 1e9;
  double v = nearbyint(x * 4.0);
  if (!perf_dtype_is_signed_int(t)) v = fabs(v);
  if (v > lim) v = lim;
  if (v < -lim) v = -lim;
  return v;
}

double perf_round_to(ncclDataType_t t, double v) {
  switch (t) {
    case ncclFloat64: return v;
    case ncclFloat32: return (double)(float)v;
    case ncclBfloat16: return (double)perf_bf16_to_f32(perf_f32_to_bf16((float)v));
    case ncclFloat16: return (double)perf_fp16_to_f32(perf_f32_to_fp16((float)v));
    default: {
      uint64_t tmp = 0;
      perf_elem_set(t, &tmp, 0, v);
      return perf_elem_get(t, &tmp, 0);
    }
  }
}

/* STORE(i, value) of indices first .. first + count - 1: one normal pair serves two. */
#define PERF_INPUT_FOR_EACH(t, seed, nranks, first, count, STORE)               \
  do {                                                                          \
    for (size_t i_ = 0; i_ < (count);) {                                        \
      uint64_t g_ = (first) + i_;                                               \
      double e_, o_;                                                            \
      perf_normal_pair((seed), g_ >> 1, &e_, &o_);                              \
      if ((g_ & 1) == 0) {                                                      \
        STORE(i_, perf_input_shape((t), (nranks), e_));                         \
        if (++i_ == (count)) break;                                             \
      }                                                                         \
      STORE(i_, perf_input_shape((t), (nranks), o_));                           \
      i_++;                                                                     \
    }                                                                           \
  } while (0)

void perf_input_values(ncclDataType_t t, uint64_t seed, int nranks, uint64_t first, size_t count,
                       double* out) {
#define PERF_STORE_VALUE(i, v) (out[(i)] = perf_round_to(t, (v)))
  PERF_INPUT_FOR_EACH(t, seed, nranks, first, count, PERF_STORE_VALUE);
#undef PERF_STORE_VALUE
}

void perf_input_fill(ncclDataType_t t, void* buf, size_t count, uint64_t seed, int nranks,
                     uint64_t first) {
#define PERF_STORE_ELEM(i, v) perf_elem_set(t, buf, (i), (v))
  PERF_INPUT_FOR_EACH(t, seed, nranks, first, count, PERF_STORE_ELEM);
#undef PERF_STORE_ELEM
}

/* ---- references ---- */

#define PERF_REDUCE_INT(T)                                                              \
  do {                                                                                  \
    for (size_t i = 0; i < count; i++) {                                                \
      T acc;                                                                            \
      memcpy(&acc, (const uint8_t*)inputs[0] + i * sizeof(T), sizeof(T));              \
      for (int k = 1; k < n; k++) {                                                     \
        T x;                                                                            \
        memcpy(&x, (const uint8_t*)inputs[k] + i * sizeof(T), sizeof(T));              \
        switch (op) {                                                                   \
          case ncclSum: acc = (T)((uint64_t)acc + (uint64_t)x); break;                  \
          case ncclProd: acc = (T)((uint64_t)acc * (uint64_t)x); break;                 \
          case ncclMax: acc = x > acc ? x : acc; break;                                 \
          default: acc = x < acc ? x : acc; break;                                      \
        }                                                                               \
      }                                                                                 \
      memcpy((uint8_t*)out + i * sizeof(T), &acc, sizeof(T));                           \
    }                                                                                   \
  } while (0)

static float perf_op_f32(ncclRedOp_t op, float acc, float x) {
  switch (op) {
    case ncclSum: return acc + x;
    case ncclProd: return acc * x;
    case ncclMax: return x > acc ? x : acc;
    default: return x < acc ? x : acc;
  }
}

static double perf_op_f64(ncclRedOp_t op, double acc, double x) {
  switch (op) {
    case ncclSum: return acc + x;
    case ncclProd: return acc * x;
    case ncclMax: return x > acc ? x : acc;
    default: return x < acc ? x : acc;
  }
}

void perf_reduce_exact(ncclDataType_t t, ncclRedOp_t op, const void* const* inputs, int n,
                       size_t count, void* out) {
  switch (t) {
    case ncclInt8: PERF_REDUCE_INT(int8_t); return;
    case ncclUint8: PERF_REDUCE_INT(uint8_t); return;
    case ncclInt32: PERF_REDUCE_INT(int32_t); return;
    case ncclUint32: PERF_REDUCE_INT(uint32_t); return;
    case ncclInt64: PERF_REDUCE_INT(int64_t); return;
    case ncclUint64: PERF_REDUCE_INT(uint64_t); return;
    case ncclFloat64:
      for (size_t i = 0; i < count; i++) {
        double acc = perf_elem_get(t, inputs[0], i);
        for (int k = 1; k < n; k++) acc = perf_op_f64(op, acc, perf_elem_get(t, inputs[k], i));
        perf_elem_set(t, out, i, acc);
      }
      return;
    default: /* fp32 in float; narrower floats widened, reduced in fp32, rounded once */
      for (size_t i = 0; i < count; i++) {
        float acc = perf_elem_get_f32(t, inputs[0], i);
        for (int k = 1; k < n; k++)
          acc = perf_op_f32(op, acc, perf_elem_get_f32(t, inputs[k], i));
        perf_elem_set_f32(t, out, i, acc);
      }
      return;
  }
}

double perf_reduce_f64(ncclRedOp_t op, const double* v, int n) {
  double acc = v[0];
  for (int k = 1; k < n; k++) acc = perf_op_f64(op, acc, v[k]);
  return acc;
}

/* ---- comparison ---- */

void perf_err_add(perf_err* e, double out, double ref) {
  e->count++;
  if (!isfinite(ref)) return;
  if (!isfinite(out)) {
    e->nonfinite++;
    return;
  }
  double d = out - ref;
  e->err2 += d * d;
  e->ref2 += ref * ref;
  if (fabs(d) > e->max_abs) e->max_abs = fabs(d);
}

void perf_err_merge(perf_err* into, const perf_err* from) {
  into->err2 += from->err2;
  into->ref2 += from->ref2;
  if (from->max_abs > into->max_abs) into->max_abs = from->max_abs;
  into->nonfinite += from->nonfinite;
  into->count += from->count;
}

double perf_err_rel_l2(const perf_err* e) {
  if (e->ref2 <= 0) return e->err2 > 0 ? INFINITY : 0.0;
  return sqrt(e->err2 / e->ref2);
}

uint64_t perf_hash64(const void* buf, size_t len, uint64_t seed) {
  const uint8_t* p = buf;
  uint64_t h = perf_mix64(seed ^ (uint64_t)len);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w = perf_ld64(p + i);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  memcpy(&tail, p + i, len - i);
  return perf_mix64(h ^ tail);
}
