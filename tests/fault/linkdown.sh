#!/usr/bin/env bash
# fault.linkdown: a link set down in the middle of a transfer must end in an error on both
# ends, never a hang. Two network namespaces joined by a veth pair; agoq-perf p2p streams
# from node 0 to node 1 (AGOQ_TIMEOUT_S=3); after ~2 s one end goes down: SIDE "local" pulls
# the sender's veth (its route goes: the kernel reports the network unreachable), "remote" the
# receiver's (the sender's side only loses carrier and its packets vanish silently, as with a
# cable pulled at the far end: only AGOQ_TIMEOUT_S can end the wait).
#   - the sender has unacknowledged data: TCP_USER_TIMEOUT (AGOQ_TIMEOUT_S) fails it;
#   - the receiver has nothing in flight: TCP keepalive (AGOQ_KEEPALIVE_S=2 here) fails it.
# Each must exit non-zero within its bound; the test measures and asserts both.
# Needs root and `ip netns`; otherwise exits 77 (skipped).
# usage: linkdown.sh local|remote AGOQ_PERF [PLUGIN]
set -uo pipefail
side=$1
perf=$2
lib=${3:-}
if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
  echo "fault.linkdown: needs root and ip netns: skipped"
  exit 77
fi
id=ld$$
ns0=agoq-$id-0 ns1=agoq-$id-1
cleanup() {
  [[ -n "${p0:-}" ]] && kill -9 "$p0" 2>/dev/null
  [[ -n "${p1:-}" ]] && kill -9 "$p1" 2>/dev/null
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  rm -rf "$tmp"
}
tmp=$(mktemp -d)
trap cleanup EXIT
ip netns add "$ns0" && ip netns add "$ns1" || { echo "fault.linkdown: cannot create namespaces: skipped"; exit 77; }
ip link add "v$id" type veth peer name "w$id" || exit 1
ip link set "v$id" netns "$ns0" && ip link set "w$id" netns "$ns1" || exit 1
ip -n "$ns0" addr add 10.79.0.1/24 dev "v$id" && ip -n "$ns1" addr add 10.79.0.2/24 dev "w$id" || exit 1
for n in "$ns0" "$ns1"; do ip -n "$n" link set lo up; done
ip -n "$ns0" link set "v$id" up && ip -n "$ns1" link set "w$id" up || exit 1

args=(--addr 10.79.0.2:29555 -b 64M -e 64M -n 100000 -w 0 --boot-timeout 30)
[[ -n "$lib" ]] && args+=(--lib "$lib")
export AGOQ_TIMEOUT_S=3 AGOQ_KEEPALIVE_S=2 AGOQ_DEBUG=WARN
AGOQ_SOCKET_IFNAME="=w$id" ip netns exec "$ns1" timeout -s KILL 120 "$perf" p2p --rank 1 "${args[@]}" \
  >"$tmp/r1.log" 2>&1 &
p1=$!
AGOQ_SOCKET_IFNAME="=v$id" ip netns exec "$ns0" timeout -s KILL 120 "$perf" p2p --rank 0 "${args[@]}" \
  >"$tmp/r0.log" 2>&1 &
p0=$!
# Wait for data to flow, then pull the link.
for _ in $(seq 1 100); do
  grep -q "size(B)" "$tmp/r0.log" 2>/dev/null && break
  sleep 0.1
done
sleep 2
if ! kill -0 "$p0" 2>/dev/null; then
  echo "fault.linkdown: the sender ended before the link went down:"; cat "$tmp/r0.log" "$tmp/r1.log"
  exit 1
fi
if [[ "$side" == local ]]; then
  ip -n "$ns0" link set "v$id" down
else
  ip -n "$ns1" link set "w$id" down
fi
t0=$(date +%s.%N)
echo "fault.linkdown: $side end of the link set down mid-transfer"
wait_for() { # pid bound_s name -> prints seconds, returns its exit code (124 if still running)
  local pid=$1 bound=$2 name=$3 rc
  while kill -0 "$pid" 2>/dev/null; do
    if awk -v a="$(date +%s.%N)" -v b="$t0" -v c="$bound" 'BEGIN { exit !(a - b > c) }'; then
      echo "fault.linkdown: $name still running ${bound} s after the link went down: HANG"
      return 124
    fi
    sleep 0.1
  done
  wait "$pid"
  rc=$?
  printf 'fault.linkdown: %s exited %d after %.1f s\n' "$name" "$rc" \
    "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')"
  return "$rc"
}
wait_for "$p0" 20 "sender (AGOQ_TIMEOUT_S=3)"
rc0=$?
wait_for "$p1" 40 "receiver (keepalive 2 s + 5 probes x 2 s)"
rc1=$?
p0= p1=
grep -h "WARN" "$tmp/r0.log" "$tmp/r1.log" | cut -c1-200 | head -4
fail=0
((rc0 == 0 || rc0 == 124 || rc0 == 137)) && { echo "fault.linkdown: sender did not fail cleanly (exit $rc0)"; fail=1; }
((rc1 == 0 || rc1 == 124 || rc1 == 137)) && { echo "fault.linkdown: receiver did not fail cleanly (exit $rc1)"; fail=1; }
((fail)) && { tail -n 5 "$tmp/r0.log" "$tmp/r1.log"; exit 1; }
echo "fault.linkdown: PASSED (both ends failed with an error, no hang)"
