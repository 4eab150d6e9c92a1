#!/bin/sh
# expect_exit.sh CODE PATTERN [PATTERN...] -- COMMAND...: COMMAND must exit with CODE (not
# crash) and print every PATTERN (grep -E, one line each) on stdout or stderr.
want=$1
shift
n=0
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  n=$((n + 1))
  eval "pat_$n=\$1"
  shift
done
[ "$1" = "--" ] || { echo "usage: expect_exit.sh CODE PATTERN... -- COMMAND..."; exit 2; }
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
if [ "$rc" != "$want" ]; then
  echo "FAIL: '$*' exited $rc, expected $want"
  cat "$out"
  exit 1
fi
i=1
while [ $i -le $n ]; do
  eval "pat=\$pat_$i"
  if ! grep -Eq -- "$pat" "$out"; then
    echo "FAIL: '$*' did not print /$pat/"
    cat "$out"
    exit 1
  fi
  i=$((i + 1))
done
echo "PASS: exit $rc, $n pattern(s)"
