#!/bin/sh
# The row lead (AGOQ_COLL_ROW_LEAD, plugin/collnet/agoq_coll_internal.h) against row messages
# posted at admission (--row-lead 0), in the simulation's virtual time, which does not depend
# on the machine: 64 ranks on 8x8 at 400 Gbit/s, 4 calls of 4 MiB in flight. Fails unless the
# lead held some chunks' row sends and saved at least 3% (439.5 against 415.4 us when made).
#   tools/collnet/sim-lead-check.sh build/bin/agoq-collnet-sim
set -eu
sim=${1:?usage: sim-lead-check.sh path/to/agoq-collnet-sim}
run() { "$sim" -N 64 --grid 8x8 -b 16777216 --call 4194304 --inplace --gbps 400 --check "$@"; }
none=$(run --row-lead 0)
printf '%s\n' "$none"
lead=$(run)
printf '%s\n' "$lead"
printf '%s\n' "$lead" | grep -Eq 'row lead: [0-9.]*[1-9][0-9.]* chunks per rank waited' ||
  { echo "sim-lead-check: the lead held no chunk's row sends" >&2; exit 1; }
t0=$(printf '%s\n' "$none" | awk '$1 == 400 { print $2 }')
t1=$(printf '%s\n' "$lead" | awk '$1 == 400 { print $2 }')
echo "sim-lead-check: virtual time without the lead ${t0:-?} us, with it ${t1:-?} us"
awk -v a="${t0:-0}" -v b="${t1:-0}" 'BEGIN { exit !(a > 0 && b > 0 && b <= 0.97 * a) }' ||
  { echo "sim-lead-check: the lead saved less than 3%" >&2; exit 1; }
