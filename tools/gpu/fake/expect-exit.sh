#!/bin/sh
# expect-exit.sh CODE COMMAND...: passes when COMMAND exits with exactly CODE, so a test can
# demand one specific failure (wrong values: 1) rather than any failure.
want=$1
shift
"$@"
got=$?
if [ "$got" -ne "$want" ]; then
  echo "expect-exit: '$*' exited $got, expected $want" >&2
  exit 1
fi
