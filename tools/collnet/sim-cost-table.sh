#!/bin/sh
# Measures the table tests/unit/test_coll_cost.c holds the CollNet cost model against:
# agoq-collnet-sim's virtual time for the mesh and the grid from 2 to 1024 ranks at 10, 25,
# 100 and 400 Gbit/s. Virtual time does not depend on the machine, so the table is the same
# wherever it is made; 1024 ranks need about 12 GB of memory and 8 minutes.
#   tools/collnet/sim-cost-table.sh build/bin/agoq-collnet-sim > tests/unit/data/coll_cost_sim.tsv
# SIM_MIN_RANKS / SIM_MAX_RANKS=N leave out the runs below / above N ranks.
set -eu
sim=${1:?usage: sim-cost-table.sh path/to/agoq-collnet-sim}
min=${SIM_MIN_RANKS:-1}
max=${SIM_MAX_RANKS:-1024}
rates=10,25,100,400
echo "# measured by tools/collnet/sim-cost-table.sh with $(basename "$sim"); chunks of 1 MiB, alpha and o the defaults"
echo "# n a b dtype format bytes call inflight gbps vtime_us"
run() { # n grid dtype format bytes inflight
  [ "$1" -ge "$min" ] && [ "$1" -le "$max" ] || return 0
  # One process per rate: a run fills two more of a group's 8 pipeline slots, whose staging
  # each rank keeps (at 1024 ranks about 4 GB per run).
  out=""
  for rate in $(echo "$rates" | tr , ' '); do
    o=$("$sim" -N "$1" --grid "$2" -d "$3" --format "$4" -b "$5" --inflight "$6" --gbps "$rate" --chunk 1048576 \
           --check) ||
      { echo "sim-cost-table: agoq-collnet-sim failed at $1 ranks ($2), $rate Gbit/s" >&2; exit 1; }
    out="$out$o
"
  done
  printf '%s' "$out" |
    awk -v n="$1" -v d="$3" -v f="$4" -v bytes="$5" -v infl="$6" '
      /^# [0-9]+ ranks,/ { s = $0; sub(/.*\(/, "", s); split(s, w, " "); a = w[1]; b = w[3]; sub(/,/, "", b);
                           c = $0; sub(/.* in calls of /, "", c); sub(/,.*/, "", c); call = c }
      /^ *[0-9]/ { print n, a, b, d, f, bytes, call, infl, $1, $2 }'
}
# One NCCL call (2 MiB: two chunks), nothing else in flight: fill and latency.
for n in 2 3 4 8 16 17 23 32 64 97 128 256 512 1024; do run "$n" auto bf16 int8 2097152 1; done
# The mesh where the grid would be chosen, and a grid where the mesh would.
for n in 32 64; do run "$n" "${n}x1" bf16 int8 2097152 1; done
run 16 4x4 bf16 int8 2097152 1
# Exact fp32 (no codec, partial sums of the type itself).
for n in 8 64; do run "$n" auto fp32 none 2097152 1; done
# A pipeline: 16 MiB in calls of 2 MiB, 8 in flight.
for n in 4 16 64 256; do run "$n" auto bf16 int8 16777216 8; done
