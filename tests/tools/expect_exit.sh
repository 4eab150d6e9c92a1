#!/bin/sh
# expect_exit.sh CODE PATTERN COMMAND...: COMMAND must exit with CODE (not crash, not 0) and
# print PATTERN (grep -E) on stdout or stderr.
want=$1
pattern=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
if [ "$rc" != "$want" ]; then
  echo "FAIL: '$*' exited $rc, expected $want"
  cat "$out"
  exit 1
fi
if ! grep -Eq -- "$pattern" "$out"; then
  echo "FAIL: '$*' did not print /$pattern/"
  cat "$out"
  exit 1
fi
echo "PASS: exit $rc, /$pattern/"
