#!/bin/sh
# expect_ok.sh PATTERN CMD...: passes when CMD exits 0 and prints PATTERN (grep -E) on stdout.
set -u
pattern=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out"
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: '$*' exited $rc" >&2; exit 1; }
grep -Eq "$pattern" "$out" || { echo "FAIL: stdout lacks /$pattern/:" >&2; head -5 "$out" >&2; exit 1; }
echo "OK: exit 0 with /$pattern/"
