/*
 * Strict numbers on command lines, for every tool and test harness: the whole string is the
 * number (no leading blanks, no trailing text: "1x" and "abc" are errors, never 0 or 1), it
 * fits its range, and a bad value says which option and what it accepts. atoi/strtol alone
 * turn "abc" into 0 and let a run do nothing and report success.
 *
 * Integers are decimal or 0x-prefixed hex (never octal: "010" is ten). The *_or_exit forms
 * print "PROG: bad value for OPT: 'S' (...)" on stderr and exit with status 2, the usage
 * error status every tool uses.
 */
#ifndef AGOQ_ARGS_H
#define AGOQ_ARGS_H

#include <stddef.h>
#include <stdint.h>

/* 0 and *out set, or -1 (nothing printed, *out untouched). */
int agoq_args_parse_ll(const char* s, long long min, long long max, long long* out);
int agoq_args_parse_ull(const char* s, unsigned long long max, unsigned long long* out);
/* A finite decimal floating-point number in [min, max]. */
int agoq_args_parse_double(const char* s, double min, double max, double* out);

/* The same, or a message naming prog and opt and exit(2). */
long long agoq_args_ll_or_exit(const char* prog, const char* opt, const char* s, long long min,
                               long long max);
int agoq_args_int_or_exit(const char* prog, const char* opt, const char* s, int min, int max);
unsigned long long agoq_args_ull_or_exit(const char* prog, const char* opt, const char* s,
                                         unsigned long long max);

/* Flags whose value is one of a fixed set of names (a datatype, a format, an op, a mode):
 * a bad value is answered with the whole set, so the user never has to guess or open the
 * help. Matching stays with each parser (some names have aliases, some compare case). */
/* "a, b, c" (truncated to fit cap; buf is always terminated). */
void agoq_args_join(char* buf, size_t cap, const char* const* names, int n);
/* On stderr: PROG: OPT: "S" is not one of a, b, c */
void agoq_args_not_one_of(const char* prog, const char* opt, const char* s, const char* const* names,
                          int n);

#endif
