#!/bin/sh
# Measures the table tests/unit/test_coll_cost.c holds the automatic schedule's choice
# against (agoq_coll_plans_pick): agoq-collnet-sim's virtual time of the choice's reference
# traffic (bf16 int8, 32 MiB per rank in calls of 4 MiB, 8 in flight, each schedule with its
# automatic chunk) on every candidate: the mesh (up to 64 ranks), the grid n alone gives, and
# every exact grid a x b = n with a >= b >= 2 and at most 63 peers (a + b - 2), at 10, 25, 100
# and 400 Gbit/s, for each AGOQ_COLLNET_IO_THREADS value in IO_THREADS (default 0; the
# sixth column). Virtual time does not depend on the machine; the whole table takes about
# 20 minutes per I/O thread value on one core and 12 GB of memory (128 ranks).
#   tools/collnet/sim-choice-table.sh build/bin/agoq-collnet-sim > tests/unit/data/coll_choice_sim.tsv
#   IO_THREADS="2 4" SIZES="24 32 48 64 128" tools/collnet/sim-choice-table.sh ... (rows to append)
set -eu
sim=${1:?usage: sim-choice-table.sh path/to/agoq-collnet-sim}
# The choice's reference traffic (AGOQ_COLL_COST_CALLS calls of AGOQ_COLL_PICK_CALL_BYTES,
# plugin/collnet/agoq_coll_cost.h): test_coll_cost reads the "traffic" line and fails on a
# table measured on other traffic than the model's.
calls=8
call=4194304
echo "# measured by tools/collnet/sim-choice-table.sh with $(basename "$sim"); bf16 int8, 32 MiB in calls of 4 MiB, 8 in flight, automatic chunks"
echo "# traffic: $calls calls of $call bytes, all in flight"
echo "# n a b gbps vtime_us io_threads"
for io in ${IO_THREADS:-0}; do
for n in ${SIZES:-17 24 32 48 64 128}; do
  grids=auto # first: its shape is then not run again
  [ "$n" -le 64 ] && grids="$grids ${n}x1"
  b=2
  while [ $((b * b)) -le "$n" ]; do
    a=$((n / b))
    [ $((a * b)) -eq "$n" ] && [ $((a + b - 2)) -le 63 ] && grids="$grids ${a}x${b}"
    b=$((b + 1))
  done
  inplace=""
  [ "$n" -ge 128 ] && inplace=--inplace # 32 MiB per rank once, not twice
  done_shapes=""
  for grid in $grids; do
    case " $done_shapes " in *" $grid "*) continue ;; esac # auto ran it already
    out=$("$sim" -N "$n" --grid "$grid" -b $((calls * call)) --call "$call" --inflight "$calls" --gbps 10,25,100,400 $inplace \
      --io-threads "$io" --check) ||
      { echo "sim-choice-table: agoq-collnet-sim failed at $n ranks ($grid)" >&2; exit 1; }
    rows=$(printf '%s\n' "$out" |
      awk -v n="$n" -v io="$io" '
        /^# [0-9]+ ranks,/ { s = $0; sub(/.*\(/, "", s); split(s, w, " "); a = w[1]; b = w[3]; sub(/,/, "", b) }
        /^ *[0-9]/ { print n, a, b, $1, $2, io }')
    printf '%s\n' "$rows"
    done_shapes="$done_shapes $(printf '%s\n' "$rows" | awk 'NR == 1 { print $2 "x" $3 }')"
  done
done
done
