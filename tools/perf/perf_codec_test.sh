#!/bin/sh
# agoq-perf codec smoke test: perf_codec_test.sh AGOQ_PERF ISA
# Every format and operation on a small buffer through one CPU path: a JSON line per
# measurement (5 formats x 4 operations for bf16, no quantize-fp32 row for fp32),
# the same rows in the human table, and a bad command line refused. Exit 77 (skipped) when
# this CPU or build lacks ISA.
set -eu
perf=$1
isa=$2
out=${TMPDIR:-/tmp}/agoq-perf-codec-$$
trap 'rm -f "$out" "$out.err"' EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

if ! "$perf" codec --isa "$isa" -s 2M --repeats 1 --json > "$out" 2> "$out.err"; then
  if grep -q 'is not available' "$out.err"; then
    echo "SKIP: isa $isa not available here"
    exit 77
  fi
  cat "$out.err" >&2
  fail "agoq-perf codec --isa $isa failed"
fi
rows=$(grep -c "^{\"test\":\"codec\",.*\"isa\":\"$isa\"" "$out" || true)
[ "$rows" = 20 ] || fail "$rows JSON lines for isa $isa, want 20"
[ "$(wc -l < "$out" | tr -d ' ')" = 20 ] || fail "--json printed something else"
grep -q '"mt_GBps":0\.0000' "$out" && fail "a zero throughput"

"$perf" codec --isa "$isa" -d fp32 --formats int8,none -s 1M --repeats 1 > "$out"
grep -q '^# .*best of 1 runs' "$out" || fail "the header does not say it reports the best run"
rows=$(grep -c '^  \(int8\|none\) ' "$out" || true)
[ "$rows" = 6 ] || fail "fp32 table: $rows rows, want 6 (3 operations x 2 formats)"

# Bad values, and nccl-tests' letters this mode once used for something else (-t was the
# datatype, -b the block, -f the formats, -o the operations, -r the repeats).
for bad in "-d fp64" "--block 100" "-s 1X" "--formats int9" "--ops squash" "--repeats 0" "--isa mmx" \
           "--frobnicate 1" "-t fp32" "-b 128" "-f int8" "-o quantize" "-r 1"; do
  # shellcheck disable=SC2086
  if "$perf" codec $bad > /dev/null 2>&1; then fail "agoq-perf codec $bad exited 0"; fi
done
echo "PASS: $isa"
