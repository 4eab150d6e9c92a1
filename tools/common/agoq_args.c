/* Strict command-line numbers (agoq_args.h). */
#include "agoq_args.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The digits of s (after an optional '-' when allowed) in base 10 or, after 0x, base 16.
 * strtoull alone accepts blanks, '+', '-' (negating an unsigned!) and octal. */
static int agoq_args_digits(const char* s, bool allow_minus, bool* neg, unsigned long long* mag) {
  if (s == NULL) return -1;
  *neg = false;
  if (allow_minus && *s == '-') {
    *neg = true;
    s++;
  }
  int base = 10;
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s += 2;
  }
  if (!(base == 16 ? isxdigit((unsigned char)*s) : isdigit((unsigned char)*s))) return -1;
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, base);
  if (errno != 0 || end == s || *end != '\0') return -1;
  *mag = v;
  return 0;
}

int agoq_args_parse_ll(const char* s, long long min, long long max, long long* out) {
  bool neg;
  unsigned long long mag;
  if (agoq_args_digits(s, true, &neg, &mag) != 0) return -1;
  long long v;
  if (neg) {
    if (mag > (unsigned long long)LLONG_MAX + 1ull) return -1;
    v = mag == (unsigned long long)LLONG_MAX + 1ull ? LLONG_MIN : -(long long)mag;
  } else {
    if (mag > (unsigned long long)LLONG_MAX) return -1;
    v = (long long)mag;
  }
  if (v < min || v > max) return -1;
  *out = v;
  return 0;
}

int agoq_args_parse_ull(const char* s, unsigned long long max, unsigned long long* out) {
  bool neg;
  unsigned long long mag;
  if (agoq_args_digits(s, false, &neg, &mag) != 0 || mag > max) return -1;
  *out = mag;
  return 0;
}

int agoq_args_parse_double(const char* s, double min, double max, double* out) {
  if (s == NULL || *s == '\0' || isspace((unsigned char)*s)) return -1;
  char* end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < min || v > max) return -1;
  *out = v;
  return 0;
}

static void agoq_args_fail(const char* prog, const char* opt, const char* s, const char* what) {
  fprintf(stderr, "%s: bad value for %s: '%s' (expected %s)\n", prog, opt, s ? s : "(none)", what);
  exit(2);
}

long long agoq_args_ll_or_exit(const char* prog, const char* opt, const char* s, long long min,
                               long long max) {
  long long v = 0;
  if (agoq_args_parse_ll(s, min, max, &v) != 0) {
    char what[96];
    snprintf(what, sizeof what, "an integer from %lld to %lld", min, max);
    agoq_args_fail(prog, opt, s, what);
  }
  return v;
}

int agoq_args_int_or_exit(const char* prog, const char* opt, const char* s, int min, int max) {
  return (int)agoq_args_ll_or_exit(prog, opt, s, min, max);
}

unsigned long long agoq_args_ull_or_exit(const char* prog, const char* opt, const char* s,
                                         unsigned long long max) {
  unsigned long long v = 0;
  if (agoq_args_parse_ull(s, max, &v) != 0) {
    char what[96];
    snprintf(what, sizeof what, "an unsigned integer up to %llu, decimal or 0x hex", max);
    agoq_args_fail(prog, opt, s, what);
  }
  return v;
}

void agoq_args_join(char* buf, size_t cap, const char* const* names, int n) {
  size_t off = 0;
  if (cap == 0) return;
  buf[0] = '\0';
  for (int i = 0; i < n && off < cap; i++) {
    int w = snprintf(buf + off, cap - off, "%s%s", i ? ", " : "", names[i]);
    if (w < 0) break;
    off += (size_t)w;
  }
}

void agoq_args_not_one_of(const char* prog, const char* opt, const char* s, const char* const* names,
                          int n) {
  char list[512];
  agoq_args_join(list, sizeof list, names, n);
  fprintf(stderr, "%s: %s: \"%s\" is not one of %s\n", prog, opt, s ? s : "(none)", list);
}
