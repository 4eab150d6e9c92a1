#!/usr/bin/env bash
# tools/bench-net-vs-nccl-socket.sh with agoq's own plugin on both sides (a plugin against
# itself: no NCCL code needed): a table row per size and sweep (inflight 1, 8, ping-pong)
# with numbers in every figure column, the latency verdict on the ping-pong table only, the raw files, the alternating order; a missing --socket fails
# clearly; a failed run makes the exit status 1 and is named, retries included.
# usage: bench_net_vs_socket_check.sh BENCH_SCRIPT AGOQ_PERF PLUGIN
set -u
bench=$1 perf=$2 lib=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; cat "$work/out" "$work/err" 2>/dev/null; exit 1; }
unset NCCL_SOCKET_PLUGIN_PATH AGOQ_SOCKET_IFNAME NCCL_SOCKET_IFNAME

# 1. Two rounds, 8 B..64 KiB (14 sizes), inflight 1 and 8 and ping-pong (the default sweeps).
bash "$bench" --socket "$lib" --lib "$lib" --perf "$perf" --rounds 2 -b 8 -e 64K -f 2 \
  --target-bytes 64K --pp-target-bytes 64K -n 2 -w 1 --out "$work/raw" >"$work/out" 2>"$work/err"
rc=$?
[ $rc = 0 ] || fail "plugin against itself exited $rc"
python3 - "$work/out" <<'EOF' || fail "table check"
import re, sys
sizes = ["%d B" % (8 << k) for k in range(7)] + ["%d KiB" % (1 << k) for k in range(7)]
num = re.compile(r"^[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?$")
tables, cur = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"^### (inflight (\d+)|ping-pong) \(", line)
    if m:
        cur = tables.setdefault(int(m.group(2)) if m.group(2) else "pp", [])
    elif cur is not None and line.startswith("| ") and not line.startswith("| size"):
        cur.append([c.strip() for c in line.strip().strip("|").split("|")])
assert sorted(tables, key=str) == [1, 8, "pp"], "tables: %s" % sorted(tables, key=str)
for i, rows in tables.items():
    assert [r[0] for r in rows] == sizes, "inflight %d sizes: %s" % (i, [r[0] for r in rows])
    for r in rows:
        assert len(r) == (5 if i == 8 else 8), "inflight %s row %s" % (i, r)
        per_round = r[3].split()
        assert len(per_round) == 2, "inflight %s: 2 per-round ratios expected: %s" % (i, r)
        for cell in [r[1], r[2], r[4]] + per_round + r[5:]:
            assert num.match(cell) and float(cell) > 0, "inflight %s: not a number: %r in %s" % (i, cell, r)
# The latency target is judged once, on the ping-pong table (the last one).
verdicts = [l for l in open(sys.argv[1]) if "<= 1.05 for 8 B-4 KiB: " in l]
assert len(verdicts) == 1 and verdicts[0].startswith("latency, agoq_time/Socket_time <= 1.05"), verdicts
print("table ok")
EOF
for r in 1 2; do
  for i in 1 8 pp; do
    t=p2p
    [ $i = pp ] && t=pingpong
    for s in agoq socket; do
      grep -q "\"test\":\"$t\".*\"size\":65536," "$work/raw/r$r-i$i-$s.json" || fail "raw r$r-i$i-$s.json lacks $t 64 KiB"
    done
  done
done
[ -s "$work/raw/summary.md" ] && [ -s "$work/raw/meta.txt" ] || fail "no summary.md / meta.txt in --out"
# Order: round 1 agoq first, round 2 Socket first, for each sweep.
order=$(sed 's/:.*//' "$work/raw/uptime.txt" | tr '\n' ,)
want="round 1 inflight 1 agoq,round 1 inflight 1 socket,round 1 inflight 8 agoq,round 1 inflight 8 socket,"
want="${want}round 1 inflight pp agoq,round 1 inflight pp socket,"
want="${want}round 2 inflight 1 socket,round 2 inflight 1 agoq,round 2 inflight 8 socket,round 2 inflight 8 agoq,"
want="${want}round 2 inflight pp socket,round 2 inflight pp agoq,"
[ "$order" = "$want" ] || fail "run order: $order"

# 2. No Socket plugin, or a path that is not there: a clear message, status 2.
bash "$bench" --perf "$perf" --lib "$lib" >"$work/out" 2>"$work/err"
rc=$?
[ $rc = 2 ] && grep -q "no NCCL Socket plugin: pass --socket PATH" "$work/err" || fail "no --socket: exit $rc"
bash "$bench" --socket "$work/nosuch.so" --perf "$perf" --lib "$lib" >"$work/out" 2>"$work/err"
rc=$?
[ $rc = 2 ] && grep -q "no readable file at '$work/nosuch.so'" "$work/err" || fail "missing --socket file: exit $rc"

# 3. A Socket side that cannot start (no such interface): exit 1, the run named, each
#    attempt reported; the agoq side's figures still printed.
bash "$bench" --socket "$lib" --lib "$lib" --perf "$perf" --rounds 1 --inflight 1 -b 8 -e 8 \
  -n 2 -w 1 --retries 1 --env-b AGOQ_SOCKET_IFNAME=nosuchif >"$work/out" 2>"$work/err"
rc=$?
[ $rc = 1 ] || fail "a failing Socket side exited $rc, expected 1"
grep -q "1 run(s) failed" "$work/err" && grep -q "^  round 1 inflight 1 socket (exit 1" "$work/err" ||
  fail "the failed run is not named"
[ "$(grep -c 'FAILED: round 1 inflight 1 socket' "$work/err")" = 2 ] || fail "expected 2 failed attempts"
grep -q "^| 8 B | [0-9.]* | - |" "$work/out" || fail "agoq's figures missing next to the failed side"
echo "PASS"
