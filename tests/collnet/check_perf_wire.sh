#!/bin/sh
# perf.wire_measured: agoq-perf's wire column is the plugin's own count, not a model.
# With AGOQ_MIN_BYTES=1MiB every call of a sweep below 1 MiB goes exact: wire must be 1.0000
# (the old model said 0.516). With the defaults, bf16 -> int8 with block 128 sends
# 8.25 / 16 = 0.516 of the bytes from 64 KiB up, and 1.0000 below.
# Both runs also carry the measured CPU figures: every size has a finite cpu_s_per_GB > 0
# (the ranks' getrusage time over the timed collectives, per GB) and a cpu_s >= 0; a
# missing field, null, inf or nan fails.
# usage: check_perf_wire.sh AGOQ_PERF LIB
set -eu
perf=$1 lib=$2
out=$(mktemp "${TMPDIR:-/tmp}/agoq-perf-wire.XXXXXX")
trap 'rm -f "$out"' EXIT
unset AGOQ_MIN_BYTES AGOQ_FORMAT AGOQ_BLOCK AGOQ_COLLNET_CHUNK
run() {
  "$perf" allreduce --nranks 2 --dtype bf16 --minbytes 16K --maxbytes 512K --stepfactor 4 --iters 2 \
    --warmup_iters 1 --json --lib "$lib" > "$out"
}
ratios() { sed -n 's/.*"size":\([0-9]*\),.*"wire_ratio":\([0-9.]*\),.*/\1 \2/p' "$out"; }
# Prints what is wrong with each line's cpu_s and cpu_s_per_GB; nothing when all are fine.
cpu_problems() {
  awk '{
    s = $0; sub(/.*"size":/, "", s); sub(/,.*/, "", s)
    c = "missing"; if (match($0, /"cpu_s":[^,}]*/)) c = substr($0, RSTART + 8, RLENGTH - 8)
    g = "missing"; if (match($0, /"cpu_s_per_GB":[^,}]*/)) g = substr($0, RSTART + 15, RLENGTH - 15)
    num = "^[0-9]+(\\.[0-9]+)?(e[-+][0-9]+)?$"
    if (c !~ num) print s " B: cpu_s " c ", expected a number >= 0"
    if (g !~ num || g + 0 <= 0) print s " B: cpu_s_per_GB " g ", expected a finite number > 0"
  }' "$out"
}
check_cpu() {
  bad=$(cpu_problems)
  [ -z "$bad" ] || { echo "perf.wire_measured: $1:"; echo "$bad"; fail=1; }
}
fail=0
AGOQ_MIN_BYTES=1MiB run
check_cpu "AGOQ_MIN_BYTES=1MiB"
n=0
for r in $(ratios | awk '{print $2}'); do
  n=$((n + 1))
  [ "$r" = "1.0000" ] || { echo "perf.wire_measured: AGOQ_MIN_BYTES=1MiB, every call exact, yet wire $r"; fail=1; }
done
[ "$n" -eq 3 ] || { echo "perf.wire_measured: expected 3 sizes, got $n:"; cat "$out"; fail=1; }
run
check_cpu "defaults"
ratios | while read -r size r; do
  if [ "$size" -lt 65536 ]; then
    [ "$r" = "1.0000" ] || { echo "perf.wire_measured: $size B is below 64K but wire $r"; exit 1; }
  else
    case "$r" in 0.51[5-8]*) ;; *) echo "perf.wire_measured: $size B bf16 int8: wire $r, expected ~0.516"; exit 1 ;; esac
  fi
done || fail=1
[ "$fail" -eq 0 ] && echo "perf.wire_measured: wire column follows what the plugin did, cpu_s/GB set for every size"
exit "$fail"
