#!/bin/sh
# expect_fail.sh PATTERN CMD...: passes when CMD exits non-zero, prints PATTERN (grep -E)
# on stderr, and prints nothing on stdout (no topology of this machine as a fallback).
set -u
pattern=$1
shift
err=$(mktemp)
out=$(mktemp)
trap 'rm -f "$err" "$out"' EXIT
"$@" >"$out" 2>"$err"
rc=$?
cat "$err"
[ "$rc" -ne 0 ] || { echo "FAIL: '$*' exited 0" >&2; exit 1; }
[ ! -s "$out" ] || { echo "FAIL: '$*' printed a topology:" >&2; head -5 "$out" >&2; exit 1; }
grep -Eq "$pattern" "$err" || { echo "FAIL: stderr lacks /$pattern/" >&2; exit 1; }
echo "OK: exit $rc with /$pattern/"
