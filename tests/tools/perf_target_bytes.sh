#!/bin/sh
# agoq-perf p2p --target-bytes SIZE: each size's timed count is max(-n, ceil(SIZE / size)),
# at most 1000000, and the count reported (JSON "iters", table "count") is the count run.
# usage: perf_target_bytes.sh AGOQ_PERF PLUGIN
perf=$1
lib=$2
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
fail() { echo "FAIL: $*"; cat "$out" "$err"; exit 1; }
run() { "$perf" p2p --lib "$lib" -w 1 "$@" >"$out" 2>"$err" || fail "agoq-perf p2p $* exited $?"; }
has() { grep -q "$1" "$out" || fail "no line with $1"; }

# 1. 64 KiB per size: 8 B -> 8192, 64 -> 1024, 512 -> 128, 4 KiB -> 16; 32 KiB would need
#    2 = -n; 64 KiB would need 1, below -n 2, so -n wins.
run -b 8 -e 64K -f 8 -n 2 --target-bytes 64K --json
for pair in 8:8192 64:1024 512:128 4096:16 32768:2; do
  has "\"size\":${pair%%:*},\"iters\":${pair##*:},"
done
[ "$(grep -c '"iters"' "$out")" = 5 ] || fail "expected 5 sizes"

# 2. Without it, every size runs -n (the option really is what changed the counts).
run -b 8 -e 64K -f 8 -n 2 --json
[ "$(grep -c '"iters":2,' "$out")" = 5 ] || fail "without --target-bytes not every size ran -n 2"

# 3. The table's count column, with the M suffix and the --name=value spelling: 256 KiB
#    needs 4 messages for 1 MiB (more than -n 3), 1 MiB needs 1 and keeps -n 3.
run -b 256K -e 1M -f 4 -n 3 --target-bytes=1M
awk '$1 == 262144 && $2 == 4 {a = 1} $1 == 1048576 && $2 == 3 {b = 1} END {exit !(a && b)}' "$out" ||
  fail "table count column: expected 262144 -> 4 and 1048576 -> 3"

# 4. The cap: 1 GiB in 8 B messages would be 134217728 of them; 1000000 run.
run -b 8 -e 8 -n 2 --target-bytes 1G --json
has '"size":8,"iters":1000000,'
echo "PASS"
