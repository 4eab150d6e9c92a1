#!/usr/bin/env bash
# Latency of a small CollNet all-reduce on the exact path against --format none, measured side
# by side: rounds alternate the order of the two runs (the first run of a pair is
# systematically disturbed on small hosts), and the medians of both and of the per-round
# ratios are printed. "exact" = AGOQ_FORMAT int8 with AGOQ_MIN_BYTES above the size, i.e. the
# path a buffer below the threshold takes with compression on.
# usage: tools/bench-exact-latency.sh [--perf PATH] [--nranks N] [--size S] [--rounds R] [--iters I]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
perf=$repo/build/bin/agoq-perf nranks=4 size=64K rounds=12 iters=300
while (($#)); do
  case "$1" in
    --perf) perf=$2; shift 2 ;;
    --nranks) nranks=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x "$perf" ]] || { echo "agoq-perf not found at $perf (--perf)" >&2; exit 2; }
run() { # none|exact -> microseconds per call
  local env=() fmt=none
  [[ $1 == exact ]] && env=(AGOQ_MIN_BYTES=1T) && fmt=int8
  env "${env[@]}" AGOQ_SOCKET_IFNAME=lo "$perf" allreduce -N "$nranks" -d bf16 -b "$size" -e "$size" \
    --format "$fmt" --iters "$iters" -w $((iters / 10)) --json 2>/dev/null |
    python3 -c 'import json,sys; print([json.loads(l) for l in sys.stdin if l.startswith("{")][-1]["time_us"])'
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  if ((r % 2)); then a=$(run none); b=$(run exact); else b=$(run exact); a=$(run none); fi
  echo "$a $b" >>"$out"
done
python3 - "$out" "$nranks" "$size" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
none = [a for a, _ in rows]; exact = [b for _, b in rows]; ratio = sorted(b / a for a, b in rows)
print("# %s ranks, bf16 all-reduce of %s, %d alternating rounds" % (sys.argv[2], sys.argv[3], len(rows)))
print("none  median %.1f us" % statistics.median(none))
print("exact median %.1f us   (ratio of medians %.2f)" % (statistics.median(exact),
      statistics.median(exact) / statistics.median(none)))
print("per-round exact/none: median %.2f, range %.2f..%.2f" % (statistics.median(ratio), ratio[0], ratio[-1]))
PY
