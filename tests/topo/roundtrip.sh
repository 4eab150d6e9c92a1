#!/bin/sh
# Live round trip: the fixture through this machine's `lstopo-no-graphics --of xml`, then
# agoq-topo on hwloc's output must print exactly the original's expected file.
#   roundtrip.sh AGOQ_TOPO FIXTURE.xml EXPECTED json|text
# Skips (exit 77) without lstopo-no-graphics. The committed roundtrip/*.xml fixtures make
# the same check without depending on the installed hwloc; this one catches what a newer
# hwloc writes.
set -eu
[ $# -eq 4 ] || { echo "usage: $0 AGOQ_TOPO FIXTURE EXPECTED json|text" >&2; exit 2; }
tool=$1 fixture=$2 expected=$3 mode=$4
command -v lstopo-no-graphics >/dev/null 2>&1 || { echo "SKIP: no lstopo-no-graphics"; exit 77; }
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
# HWLOC_XML_VERBOSE so that what hwloc dropped from the fixture shows in the test's log.
HWLOC_XML_VERBOSE=1 lstopo-no-graphics --input "$fixture" --of xml >"$tmp"
# Never rewrite the original's expected file from a round trip.
AGOQ_UPDATE_GOLDEN=0 exec sh "$(dirname "$0")/golden.sh" "$tool" "$tmp" "$expected" "$mode"
