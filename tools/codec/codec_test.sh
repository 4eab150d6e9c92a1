#!/bin/sh
# agoq-codec end to end: codec_test.sh AGOQ_CODEC WORKDIR SCENARIO
#   accuracy    gen -> roundtrip -> stats: int8 block 128 on N(0,1) within the issue's
#               relative L2 bounds (fp32 <= 0.7 %, bf16 <= 0.8 %); stats itself sane
#   formats     every format x dtype (and the extreme block sizes): round trip within a
#               per-format bound, encode -> decode gives the round trip's bits
#   frames      frame details: CRC flag, output dtypes, empty arrays, and every damaged
#               frame (truncated, corrupted, trailing bytes, garbage) -> one-line error
#   stochastic  same seed same bits, other seed other bits, threads change nothing
#   errors      bad command lines and bad files -> non-zero exit, one line on stderr
set -eu

if [ $# -ne 3 ]; then
  echo "usage: $0 AGOQ_CODEC WORKDIR SCENARIO" >&2
  exit 2
fi
codec=$1
case $codec in /*) ;; */*) codec=$PWD/$codec ;; esac # the script changes folder
work=$2
scenario=$3
rm -rf "$work"
mkdir -p "$work"
cd "$work"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# stat_of FILE KEY: one figure from `agoq-codec stats` output.
stat_of() {
  awk -v k="$2" '$1 == k { print $2 }' "$1"
}

# below X LIMIT: X < LIMIT as numbers.
below() {
  awk -v x="$1" -v l="$2" 'BEGIN { exit !(x + 0 < l + 0) }'
}

# check_rel A B DTYPE LIMIT WHAT: stats of B against A; relative L2 below LIMIT and no
# NaN/Inf mismatches.
check_rel() {
  "$codec" stats -t "$3" "$1" "$2" > stats.out || fail "$5: stats failed"
  rel=$(stat_of stats.out rel_l2_err)
  [ -n "$rel" ] || fail "$5: no rel_l2_err in stats output"
  [ "$(stat_of stats.out nan_mismatch)" = 0 ] || fail "$5: NaN mismatches"
  [ "$(stat_of stats.out inf_mismatch)" = 0 ] || fail "$5: Inf mismatches"
  below "$rel" "$4" || fail "$5: relative L2 error $rel is not below $4"
  echo "ok: $5: relative L2 error $rel (limit $4)"
}

# expect_fail WHAT CMD...: CMD exits non-zero and says why in exactly one line on stderr.
expect_fail() {
  what=$1
  shift
  if "$@" > fail.out 2> fail.err; then
    fail "$what: exited 0"
  fi
  lines=$(wc -l < fail.err | tr -d ' ')
  [ "$lines" = 1 ] || { cat fail.err >&2; fail "$what: $lines lines on stderr, want 1"; }
  grep -q '^agoq-codec' fail.err || fail "$what: message without the tool's name: $(cat fail.err)"
  echo "ok: $what: $(cat fail.err)"
}

# size_of FILE
size_of() {
  wc -c < "$1" | tr -d ' '
}

# copy_head IN BYTES OUT: the first BYTES bytes of IN.
copy_head() {
  if [ "$2" -eq 0 ]; then
    : > "$3"
  else
    dd if="$1" of="$3" bs="$2" count=1 2> /dev/null
  fi
  [ "$(size_of "$3")" = "$2" ] || fail "copy_head: short copy"
}

# poke FILE OFFSET: flips the top bit of the byte at OFFSET.
poke() {
  old=$(od -An -tu1 -j "$2" -N 1 "$1" | tr -d ' ')
  new=$(( (old + 128) % 256 ))
  # The byte is written through an octal escape, which only a format string interprets.
  # shellcheck disable=SC2059
  printf "$(printf '\\%03o' "$new")" | dd of="$1" bs=1 seek="$2" conv=notrunc 2> /dev/null
}

case $scenario in
accuracy)
  n=1000003
  for t in fp32 bf16; do
    "$codec" gen -t $t -n $n --seed 11 in.$t
    [ "$(size_of in.$t)" = $((n * $([ $t = fp32 ] && echo 4 || echo 2))) ] || fail "gen size"
    "$codec" roundtrip -f int8 -t $t -b 128 in.$t rt.$t
    [ "$(size_of rt.$t)" = "$(size_of in.$t)" ] || fail "roundtrip size"
  done
  check_rel in.fp32 rt.fp32 fp32 0.007 "fp32 int8 block 128"
  check_rel in.bf16 rt.bf16 bf16 0.008 "bf16 int8 block 128"
  # The bound can fail: stats sees identical files as identical, other data as far off.
  "$codec" stats -t bf16 in.bf16 in.bf16 > self.out
  [ "$(stat_of self.out differing)" = 0 ] || fail "stats: a file differs from itself"
  [ "$(stat_of self.out rel_l2_err)" = 0 ] || fail "stats: nonzero error against itself"
  "$codec" gen -t bf16 -n $n --seed 12 other.bf16
  "$codec" stats -t bf16 in.bf16 other.bf16 > other.out
  below 1.2 "$(stat_of other.out rel_l2_err)" || fail "stats: unrelated data look close"
  "$codec" gen -t bf16 -n $n --seed 11 again.bf16
  cmp -s in.bf16 again.bf16 || fail "gen: the same seed gave different data"
  ;;

formats)
  n=100003
  for t in fp32 bf16 fp16; do
    "$codec" gen -t $t -n $n --seed 3 in.$t
    for f in int8 int4 fp8e4m3 fp8e5m2 none; do
      case $f in
        int8) lim=0.008 ;;
        int4) lim=0.13 ;;
        fp8e4m3) lim=0.03 ;;
        fp8e5m2) lim=0.06 ;;
        none) lim=0.000001 ;;
      esac
      "$codec" roundtrip -f $f -t $t in.$t rt
      check_rel in.$t rt $t "$lim" "$t $f"
      "$codec" encode -f $f -t $t in.$t frame
      "$codec" decode frame dec
      cmp -s rt dec || fail "$t $f: decode of the frame differs from the round trip"
      if [ $f = none ]; then
        cmp -s in.$t rt || fail "$t none: the round trip changed bits"
      fi
    done
    for b in 32 1024; do
      "$codec" roundtrip -f int8 -t $t -b $b in.$t rt
      check_rel in.$t rt $t 0.01 "$t int8 block $b"
      "$codec" encode -f int8 -t $t -b $b in.$t frame
      "$codec" decode frame dec
      cmp -s rt dec || fail "$t int8 block $b: decode differs from the round trip"
    done
  done
  ;;

frames)
  n=4099
  "$codec" gen -t bf16 -n $n --seed 5 in.bf16
  "$codec" roundtrip -f int8 -t bf16 in.bf16 rt.bf16
  "$codec" encode -f int8 -t bf16 --crc in.bf16 crc.frame
  "$codec" decode -v crc.frame dec.bf16 2> info.txt
  grep -q 'format int8, dtype bf16, block 128, count 4099' info.txt || fail "decode -v: $(cat info.txt)"
  grep -q 'payload CRC32C' info.txt || fail "decode -v: no CRC flag: $(cat info.txt)"
  cmp -s rt.bf16 dec.bf16 || fail "decode of a CRC frame differs from the round trip"
  "$codec" decode -t fp32 crc.frame dec.fp32
  [ "$(size_of dec.fp32)" = $((n * 4)) ] || fail "decode -t fp32: wrong size"
  "$codec" stats -t fp32 dec.fp32 dec.fp32 > /dev/null
  "$codec" decode -t fp16 crc.frame dec.fp16
  [ "$(size_of dec.fp16)" = $((n * 2)) ] || fail "decode -t fp16: wrong size"
  # An empty array is a valid 48-byte frame.
  "$codec" gen -t fp16 -n 0 empty.fp16
  "$codec" encode -f int4 -t fp16 empty.fp16 empty.frame
  [ "$(size_of empty.frame)" = 48 ] || fail "empty frame is $(size_of empty.frame) bytes"
  "$codec" decode empty.frame empty.out
  [ "$(size_of empty.out)" = 0 ] || fail "empty frame decoded to data"

  # A block with a signalling NaN travels raw, every bit kept; the others are quantized.
  printf '\001\000\240\177' > nan.fp32
  "$codec" gen -t fp32 -n 299 --seed 8 rest.fp32
  cat nan.fp32 rest.fp32 > mixed.fp32
  "$codec" encode -v -f int4 -t fp32 mixed.fp32 mixed.frame 2> info.txt
  grep -q '1 of 3 blocks escaped' info.txt || fail "encode -v: $(cat info.txt)"
  "$codec" decode mixed.frame mixed.out
  copy_head mixed.fp32 512 block0.in
  copy_head mixed.out 512 block0.out
  cmp -s block0.in block0.out || fail "the NaN block did not round-trip bit for bit"
  cmp -s mixed.fp32 mixed.out && fail "the finite int4 blocks came back exact"
  "$codec" stats -t fp32 mixed.fp32 mixed.out > stats.out
  [ "$(stat_of stats.out nan_mismatch)" = 0 ] || fail "NaN mismatch after an escaped block"

  "$codec" encode -f int8 -t bf16 in.bf16 plain.frame
  len=$(size_of plain.frame)
  copy_head plain.frame $((len - 1)) trunc.frame
  expect_fail "frame short by one byte" "$codec" decode trunc.frame out
  copy_head plain.frame 48 hdr.frame
  expect_fail "header without its payload" "$codec" decode hdr.frame out
  copy_head plain.frame 20 short.frame
  expect_fail "half a header" "$codec" decode short.frame out
  : > zero.frame
  expect_fail "empty file" "$codec" decode zero.frame out
  for off in 0 4 5 6 8 16 24 44; do
    cp plain.frame bad.frame
    poke bad.frame $off
    expect_fail "header byte $off damaged" "$codec" decode bad.frame out
  done
  cp crc.frame bad.frame
  poke bad.frame $((len - 100))
  expect_fail "payload damaged under a CRC" "$codec" decode bad.frame out
  cp plain.frame long.frame
  printf 'x' >> long.frame
  expect_fail "a byte after the frame" "$codec" decode long.frame out
  expect_fail "an array instead of a frame" "$codec" decode in.bf16 out
  [ ! -e out ] || fail "a failed decode wrote its output file"
  ;;

stochastic)
  n=300007
  "$codec" gen -t bf16 -n $n --seed 9 in.bf16
  "$codec" roundtrip -f int8 -t bf16 --stochastic --seed 5 in.bf16 s5a
  "$codec" roundtrip -f int8 -t bf16 --stochastic --seed 5 -j 1 in.bf16 s5b
  cmp -s s5a s5b || fail "stochastic: same seed, different bits (all threads vs one)"
  "$codec" roundtrip -f int8 -t bf16 --stochastic --seed 6 in.bf16 s6
  cmp -s s5a s6 && fail "stochastic: seeds 5 and 6 gave the same bits"
  "$codec" roundtrip -f int8 -t bf16 in.bf16 rne
  cmp -s s5a rne && fail "stochastic: same bits as round-to-nearest"
  check_rel in.bf16 s5a bf16 0.012 "bf16 int8 stochastic"
  "$codec" roundtrip -f int4 -t bf16 --stochastic --seed 5 -j 2 in.bf16 i4a
  "$codec" roundtrip -f int4 -t bf16 --stochastic --seed 5 -j 1 in.bf16 i4b
  cmp -s i4a i4b || fail "stochastic int4: thread count changed the bits"
  "$codec" encode -f int8 -t bf16 --stochastic --seed 5 in.bf16 s5.frame
  "$codec" decode -v s5.frame s5.dec 2> info.txt
  grep -q 'stochastic rounding' info.txt || fail "decode -v: no stochastic flag: $(cat info.txt)"
  cmp -s s5a s5.dec || fail "stochastic: frame decode differs from the round trip"
  "$codec" roundtrip -f fp8e4m3 -t bf16 -j 2 in.bf16 f8a
  "$codec" roundtrip -f fp8e4m3 -t bf16 -j 1 in.bf16 f8b
  cmp -s f8a f8b || fail "fp8e4m3: thread count changed the bits"
  ;;

errors)
  "$codec" gen -t bf16 -n 1000 in.bf16
  printf 'z' > odd.bin
  cat in.bf16 odd.bin > odd.bf16
  "$codec" gen -t bf16 -n 999 short.bf16
  "$codec" -h | grep -q '^usage: agoq-codec' || fail "-h"
  "$codec" roundtrip -h | grep -q 'stochastic' || fail "roundtrip -h"
  if "$codec" > /dev/null 2>&1; then fail "no arguments: exited 0"; fi
  expect_fail "unknown command" "$codec" frobnicate
  expect_fail "unknown format" "$codec" roundtrip -f int7 -t bf16 in.bf16 out
  expect_fail "unknown dtype" "$codec" roundtrip -f int8 -t fp64 in.bf16 out
  expect_fail "block not a power of two" "$codec" roundtrip -f int8 -t bf16 -b 100 in.bf16 out
  expect_fail "block too large" "$codec" roundtrip -f int8 -t bf16 -b 2048 in.bf16 out
  expect_fail "block too small" "$codec" encode -f int8 -t bf16 -b 16 in.bf16 out
  expect_fail "block not a number" "$codec" roundtrip -f int8 -t bf16 -b x in.bf16 out
  expect_fail "missing -f" "$codec" roundtrip -t bf16 in.bf16 out
  expect_fail "missing -t" "$codec" encode -f int8 in.bf16 out
  expect_fail "missing option value" "$codec" roundtrip -f int8 in.bf16 out -t
  expect_fail "one file" "$codec" roundtrip -f int8 -t bf16 in.bf16
  expect_fail "three files" "$codec" roundtrip -f int8 -t bf16 in.bf16 out extra
  expect_fail "unknown option" "$codec" roundtrip --fast -f int8 -t bf16 in.bf16 out
  expect_fail "option of another command" "$codec" stats -f int8 -t bf16 in.bf16 in.bf16
  expect_fail "--crc on roundtrip" "$codec" roundtrip --crc -f int8 -t bf16 in.bf16 out
  expect_fail "fp8 stochastic" "$codec" roundtrip -f fp8e4m3 -t bf16 --stochastic in.bf16 out
  expect_fail "--seed without --stochastic" "$codec" roundtrip -f int8 -t bf16 --seed 3 in.bf16 out
  expect_fail "odd-sized input" "$codec" roundtrip -f int8 -t bf16 odd.bf16 out
  expect_fail "odd-sized encode input" "$codec" encode -f int8 -t fp32 odd.bf16 out2 -b 64
  expect_fail "missing input" "$codec" roundtrip -f int8 -t bf16 nonexistent out
  expect_fail "input is a folder" "$codec" encode -f int8 -t bf16 . out
  expect_fail "unwritable output" "$codec" roundtrip -f int8 -t bf16 in.bf16 no/such/dir/out
  expect_fail "stats size mismatch" "$codec" stats -t bf16 in.bf16 short.bf16
  expect_fail "stats odd size" "$codec" stats -t bf16 in.bf16 odd.bf16
  expect_fail "stats without -t" "$codec" stats in.bf16 in.bf16
  expect_fail "gen bad count" "$codec" gen -t bf16 -n 12q out
  expect_fail "gen negative count" "$codec" gen -t bf16 -n -5 out
  expect_fail "gen bad dist" "$codec" gen -t bf16 -n 10 --dist cauchy out
  expect_fail "decode missing input" "$codec" decode nonexistent out
  if [ -e out ] || [ -e out2 ]; then fail "a failed command wrote its output file"; fi
  ;;

*)
  fail "unknown scenario $scenario"
  ;;
esac
echo "PASS: $scenario"
