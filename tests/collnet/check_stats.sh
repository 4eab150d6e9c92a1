#!/bin/sh
# collnet.stats_exit: ranks run the `stats` scenario with AGOQ_STATS=1, AGOQ_STATS_FILE=DIR/%p.txt
# and no NCCL_DEBUG, and exit without closing their group. Each rank's file must hold the
# event=exit lines of its group with the scenario's counts.
# usage: check_stats.sh HARNESS LIB NRANKS
set -eu
harness=$1 lib=$2 nranks=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/agoq-stats.XXXXXX")
trap 'rm -rf "$dir"' EXIT
unset NCCL_DEBUG AGOQ_DEBUG AGOQ_STATS_INTERVAL_S
AGOQ_STATS=1 AGOQ_STATS_FILE="$dir/%p.txt" AGOQ_MIN_BYTES=64K AGOQ_FORMAT=int8 \
  "$harness" --lib "$lib" --scenario stats --nranks "$nranks" --timeout-s 90
nfiles=$(ls "$dir" | wc -l)
if [ "$nfiles" -ne "$nranks" ]; then
  echo "check_stats: $nfiles statistics files for $nranks ranks:"; ls -l "$dir"; exit 1
fi
fail=0
for f in "$dir"/*.txt; do
  pid=$(basename "$f" .txt)
  q=$(grep -c "^agoq-stats pid=$pid .* event=exit .* kind=collnet .* path=quantized calls=3 bytes_in=600000 " "$f" || true)
  e=$(grep -c "^agoq-stats pid=$pid .* event=exit .* kind=collnet .* path=exact calls=4 .* exact_type=1 exact_op=1 exact_small=2 exact_ll=0 exact_unknown=0 exact_format_none=0 " "$f" || true)
  ratio=$(sed -n 's/.* path=quantized .* ratio=\([0-9.]*\) .*/\1/p' "$f")
  total=$(grep -c "^agoq-stats " "$f" || true)
  if [ "$q" -ne 1 ] || [ "$e" -ne 1 ] || [ "$total" -ne 2 ]; then
    echo "check_stats: $f: expected one quantized and one exact event=exit line with the scenario's counts:"
    cat "$f"; fail=1
  fi
  case "$ratio" in 0.5[0-3]*) ;; *) echo "check_stats: $f: bf16 int8 wire ratio $ratio, expected ~0.516"; fail=1 ;; esac
  # Frames carry a payload CRC32C, so the quantized path spent measured time on it (less than
  # its whole codec time); the exact path computes none.
  qcrc=$(sed -n 's/.* path=quantized .* codec_ms=\([0-9.]*\) crc_ms=\([0-9.]*\) .*/\1 \2/p' "$f")
  ecrc=$(sed -n 's/.* path=exact .* crc_ms=\([0-9.]*\) .*/\1/p' "$f")
  if ! echo "$qcrc" | awk '{ exit !(NF == 2 && $2 > 0 && $2 < $1) }' || [ "$ecrc" != "0.000" ]; then
    echo "check_stats: $f: expected 0 < crc_ms < codec_ms on the quantized line (got '$qcrc') and crc_ms=0.000 on the exact one (got '$ecrc')"
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "check_stats: $nranks ranks wrote their event=exit lines"
exit "$fail"
