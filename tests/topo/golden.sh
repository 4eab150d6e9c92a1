#!/bin/sh
# Golden test: agoq-topo on one hwloc XML fixture must print exactly the expected file.
#   golden.sh AGOQ_TOPO FIXTURE.xml EXPECTED json|text [AGOQ_TOPO OPTIONS...]
# (the options, e.g. --nvml FAKE_LIB, go to agoq-topo after --xml FIXTURE)
# AGOQ_UPDATE_GOLDEN=1 rewrites EXPECTED from the current output instead of comparing
# (then review the diff with git before committing it).
set -eu
[ $# -ge 4 ] || { echo "usage: $0 AGOQ_TOPO FIXTURE EXPECTED json|text [OPTIONS...]" >&2; exit 2; }
tool=$1 fixture=$2 expected=$3 mode=$4
shift 4
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
case $mode in
json) "$tool" --xml "$fixture" "$@" --json >"$tmp" ;;
text) "$tool" --xml "$fixture" "$@" >"$tmp" ;;
*) echo "golden.sh: mode must be json or text" >&2; exit 2 ;;
esac
if [ "${AGOQ_UPDATE_GOLDEN:-0}" = 1 ]; then
  cp "$tmp" "$expected"
  echo "updated $expected"
  exit 0
fi
[ -f "$expected" ] || { echo "FAIL: $expected missing; run with AGOQ_UPDATE_GOLDEN=1" >&2; exit 1; }
if ! diff -u "$expected" "$tmp"; then
  echo "FAIL: agoq-topo output for $fixture differs from $expected" >&2
  echo "(if the change is intended: AGOQ_UPDATE_GOLDEN=1 ctest -L topo, then review git diff)" >&2
  exit 1
fi
echo "OK: $(basename "$expected")"
