#!/bin/sh
# log_lines_whole.sh AGOQ_INFO: `agoq-info -c >f 2>&1` with settings that log while stdout is
# being written (a fully buffered file, stderr unbuffered) must leave every line of f whole:
# a log line ("[pid] WARN ...") starts a line, it is never spliced into a stdout line.
info=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
check() {
  name=$1
  shift
  f=$dir/$name.out
  env "$@" "$info" -c >"$f" 2>&1
  # The case must log at all, or it proves nothing.
  if ! grep -Eq '\[[0-9]+\] (WARN|INFO) ' "$f"; then
    echo "FAIL: $name: no log line at all (the case tests nothing); the output ends:"
    tail -n 5 "$f"
    fail=1
    return
  fi
  spliced=$(grep -En '.\[[0-9]+\] (WARN|INFO|TRACE) ' "$f" | cut -c1-240)
  if [ -n "$spliced" ]; then
    echo "$spliced"
    echo "FAIL: $name: the lines above have a log line spliced into a stdout line"
    fail=1
    return
  fi
  echo "ok: $name: $(grep -Ec '^\[[0-9]+\] (WARN|INFO) ' "$f") log line(s), all whole"
}
# WARNs while -c resolves the interfaces and sockets, after most of the table is printed.
check bad_ifname AGOQ_SOCKET_IFNAME=nosuchif
check bad_cc AGOQ_SOCKET_IFNAME=lo AGOQ_SOCKET_CC=Bad
# A bad parameter value: WARNed at load, before the table.
check bad_format AGOQ_SOCKET_IFNAME=lo AGOQ_FORMAT=bogus
# INFO lines of device discovery, mid-output.
check info AGOQ_SOCKET_IFNAME=lo NCCL_DEBUG=INFO
exit $fail
