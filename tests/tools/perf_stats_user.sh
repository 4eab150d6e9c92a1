#!/bin/sh
# perf_stats_user.sh AGOQ_PERF PLUGIN: agoq-perf allreduce reads the plugin's statistics from
# files of its own (AGOQ_STATS_FILE in TMPDIR, one per rank), yet a user's AGOQ_STATS=1
# still gets every line: in their AGOQ_STATS_FILE, expanded per rank as the plugin does
# (%p: the rank's pid), or on stderr without one; and no agoq-perf-stats-* file stays
# behind in TMPDIR.
perf=$1
lib=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/tmp"
fail() {
  echo "FAIL: $*"
  exit 1
}
# Two sizes; after each the ranks close their group, two lines (quantized, exact) per rank,
# and the group connected after the last size closes at the end: 6 lines per rank.
run() {
  TMPDIR="$dir/tmp" "$perf" allreduce -N 2 -b 4K -e 8K -n 2 -w 1 --lib "$lib" >"$dir/out" 2>"$dir/err" || {
    cat "$dir/out" "$dir/err"
    fail "agoq-perf allreduce failed ($*)"
  }
  left=$(ls "$dir/tmp")
  [ -z "$left" ] || fail "left in TMPDIR ($*): $left"
}

AGOQ_STATS=1 AGOQ_STATS_FILE="$dir/user-%p.stats" run "a file of the user's"
n=$(ls "$dir" | grep -c '^user-[0-9]*\.stats$')
[ "$n" = 2 ] || fail "expected one user-PID.stats per rank, found $n: $(ls "$dir" | tr '\n' ' ')"
for f in "$dir"/user-*.stats; do
  pid=${f##*/user-}
  pid=${pid%.stats}
  c=$(grep -c "^agoq-stats pid=$pid .*event=close .*kind=collnet " "$f")
  [ "$c" = 6 ] || fail "$f: $c CollNet close lines of pid $pid, want 6 (3 groups x 2 paths): $(cat "$f")"
done
! grep -q '^agoq-stats' "$dir/err" || fail "with a file the lines went to stderr too"
echo "ok: AGOQ_STATS_FILE=user-%p.stats: one file per rank, 6 lines each"

AGOQ_STATS=1 run "stderr"
c=$(grep -c '^agoq-stats .*event=close .*kind=collnet ' "$dir/err")
[ "$c" = 12 ] || fail "stderr has $c CollNet close lines, want 12 (2 ranks x 3 groups x 2 paths)"
echo "ok: AGOQ_STATS=1 without a file: $c lines on stderr"

AGOQ_STATS=0 AGOQ_STATS_FILE="$dir/off-%p.stats" run "statistics off"
! grep -q '^agoq-stats' "$dir/err" || fail "AGOQ_STATS=0: statistics on stderr"
[ -z "$(ls "$dir" | grep '^off-')" ] || fail "AGOQ_STATS=0: a statistics file was written"
echo "ok: AGOQ_STATS=0: no lines anywhere"
