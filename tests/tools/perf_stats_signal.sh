#!/bin/sh
# perf_stats_signal.sh AGOQ_PERF PLUGIN: an agoq-perf allreduce stopped by SIGTERM leaves no
# agoq-perf-stats-* file in TMPDIR (its ranks' statistics files), and dies of the signal.
# Twice: as soon as the files exist, and once rank 0 has loaded the plugin (its threads
# run). The run itself would take hours; nothing here waits a fixed time, every wait polls
# for a condition under a generous deadline.
perf=$1
lib=$2
dir=$(mktemp -d)
pid=
trap 'if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null; fi; rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  [ -f "$dir/err" ] && tail -n 5 "$dir/err"
  exit 1
}
# wait_for WHAT CONDITION: polls CONDITION (a shell command) for up to 120 s while agoq-perf runs.
wait_for() {
  i=0
  while ! eval "$2"; do
    kill -0 "$pid" 2>/dev/null || fail "agoq-perf ended before $1"
    i=$((i + 1))
    [ $i -le 1200 ] || fail "not $1 within 120 s"
    sleep 0.1
  done
}
threads() {
  sed -n 's/^Threads:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null || echo 0
}

for when in files plugin; do
  rm -rf "$dir/tmp"
  mkdir "$dir/tmp"
  TMPDIR="$dir/tmp" "$perf" allreduce -N 2 -b 64K -e 64K -n 1000000000 -w 0 --lib "$lib" \
    >"$dir/out" 2>"$dir/err" &
  pid=$!
  wait_for "its statistics files appeared" '[ -n "$(ls "$dir/tmp")" ]'
  if [ "$when" = plugin ]; then
    wait_for "the plugin's threads started" '[ "$(threads)" -gt 1 ]'
  fi
  seen=$(ls "$dir/tmp" | tr '\n' ' ')
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  pid=
  [ "$rc" = 143 ] || fail "($when) agoq-perf exited $rc after SIGTERM, want 143 (killed by it)"
  left=$(ls "$dir/tmp")
  [ -z "$left" ] || fail "($when) left in TMPDIR after SIGTERM: $left (seen before: $seen)"
  echo "ok: SIGTERM once $when: exit $rc, TMPDIR empty (held: $seen)"
done
