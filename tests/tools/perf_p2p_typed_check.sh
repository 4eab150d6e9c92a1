#!/bin/sh
# agoq-perf p2p -d T -c: every in-flight buffer is filled and every message checked; an
# integer that is not bit-exact or an error above --max-rel-l2 exits non-zero.
# usage: perf_p2p_typed_check.sh AGOQ_PERF PLUGIN
perf=$1
lib=$2
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
fail() { echo "FAIL: $*"; cat "$out" "$err"; exit 1; }

# 1. int32 through 8 in-flight buffers: every message exact (before the fix, 7 of the 8
#    sender buffers were never filled: "exact":false with exit 0).
"$perf" p2p --lib "$lib" -d int32 --inflight 8 -c 1 -b 64K -e 1M -f 4 -n 3 -w 2 --json >"$out" 2>"$err" ||
  fail "int32 -c 1 exited $?"
[ "$(grep -c '"exact":true' "$out")" = 3 ] || fail "int32: not every size exact"
grep -q '"exact":false' "$out" && fail "int32: a size reported lossy"

# 2. Negative control: quantized bf16 can never meet --max-rel-l2 0: must exit 1, saying why.
#    (--flow twoway: AGOQ_P2P_SCOPE=pipeline, the default, quantizes two-way flows only.)
"$perf" p2p --lib "$lib" -d bf16 --format int8 --flow twoway --chunk 128K -b 4M -e 4M -n 2 -w 1 -c 1 \
  --max-rel-l2 0 --json >"$out" 2>"$err"
rc=$?
[ $rc = 1 ] || fail "bf16 --max-rel-l2 0 exited $rc, expected 1"
grep -q "exceeds --max-rel-l2" "$err" || fail "bf16 --max-rel-l2 0: no reason given"

# 3. The same run within a bound int8 meets (rel. L2 ~7e-3): exit 0.
"$perf" p2p --lib "$lib" -d bf16 --format int8 --flow twoway --chunk 128K -b 4M -e 4M -n 2 -w 1 -c 1 \
  --max-rel-l2 0.05 --json >"$out" 2>"$err" || fail "bf16 --max-rel-l2 0.05 exited $?"
grep -q '"exact":false' "$out" || fail "bf16 int8: expected a quantized (inexact) result"
echo "PASS"
