/* The codec must give its specified bits whatever floating-point environment the caller
 * runs in: frameworks turn on flush-to-zero / denormals-are-zero, and threads inherit it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xmmintrin.h>

#include <cmocka.h>

#include "agoq_codec.h"

#define N 100003u
#define FTZ_DAZ 0x8040u

static void fill_with_denormals(float* x) {
  uint32_t r = 12345;
  for (size_t i = 0; i < N; i++) {
    r = r * 1664525u + 1013904223u;
    /* Blocks alternate between denormal-only magnitudes and normal ones. */
    float scale = ((i / 128) % 2) ? 1e-39f : 1.0f;
    x[i] = ((float)(r >> 8) / 16777216.0f - 0.5f) * scale;
  }
}

static void run_all(const agoq_codec_params* p, const float* x, uint8_t* body, size_t* len, float* y,
                    float* acc, int mt) {
  size_t esc;
  size_t cap = agoq_codec_body_size_max(p, N);
  if (mt) {
    assert_int_equal(agoq_quantize_mt(p, x, N, body, cap, len, &esc, 2), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize_mt(p, body, *len, N, AGOQ_DTYPE_FP32, y, 2), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize_accumulate_mt(p, body, *len, N, acc, 2), AGOQ_CODEC_OK);
  } else {
    assert_int_equal(agoq_quantize(p, x, N, body, cap, len, &esc), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize(p, body, *len, N, AGOQ_DTYPE_FP32, y), AGOQ_CODEC_OK);
    assert_int_equal(agoq_dequantize_accumulate(p, body, *len, N, acc), AGOQ_CODEC_OK);
  }
}

static void test_ftz_daz_caller_gets_exact_bits(void** state) {
  (void)state;
  float* x = malloc(N * sizeof *x);
  fill_with_denormals(x);
  for (int f = AGOQ_FORMAT_INT8; f < AGOQ_FORMAT_COUNT; f++) {
    agoq_codec_params p = {.format = (agoq_format)f, .dtype = AGOQ_DTYPE_FP32, .block = 128};
    size_t cap = agoq_codec_body_size_max(&p, N), len_ref, len;
    uint8_t *ref = malloc(cap), *got = malloc(cap);
    float *y_ref = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    float *acc_ref = calloc(N, sizeof(float)), *acc = calloc(N, sizeof(float));
    run_all(&p, x, ref, &len_ref, y_ref, acc_ref, 0);
    for (int mt = 0; mt < 2; mt++) {
      memset(acc, 0, N * sizeof(float));
      unsigned saved = _mm_getcsr();
      _mm_setcsr(saved | FTZ_DAZ);
      run_all(&p, x, got, &len, y, acc, mt);
      unsigned after = _mm_getcsr();
      _mm_setcsr(saved);
      assert_int_equal(after & FTZ_DAZ, FTZ_DAZ); /* the caller's environment is restored */
      assert_int_equal(len, len_ref);
      assert_memory_equal(got, ref, len);
      assert_memory_equal(y, y_ref, N * sizeof(float));
      assert_memory_equal(acc, acc_ref, N * sizeof(float));
    }
    free(ref);
    free(got);
    free(y_ref);
    free(y);
    free(acc_ref);
    free(acc);
  }
  free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_ftz_daz_caller_gets_exact_bits)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
