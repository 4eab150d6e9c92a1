#!/usr/bin/env bash
# Puts agoq's point-to-point bandwidth next to plain TCP on the same host: agoq-perf p2p
# with 1 GiB messages over loopback, iperf3 with as many parallel streams as the plugin
# has data sockets per connection, and iperf3 with one stream. Prints the three rates and
# the ratios. The iperf3 server runs on 127.0.0.1 on a free port and is stopped on exit.
#
#   tools/bench-p2p-vs-iperf.sh [--perf PATH] [--lib PATH] [--info PATH] [--seconds S]
#                               [--iters N] [--size SIZE] [--rounds R]
#
# This machine class is noisy (2x swings between runs are common), so the three
# measurements are interleaved R times (default 3) and the ratios are medians of the
# per-round ratios.
#
# The stream count N is AGOQ_SOCKET_NSOCKS when set (else what agoq-info reports, else
# the plugin's documented default: 4, or 2 with fewer than 4 CPUs); agoq-perf is run with
# --nsocks N so both sides use the same N.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
perf="${AGOQ_PERF:-}"
info="${AGOQ_INFO:-}"
lib=""
seconds=5
iters=10
size=1G
rounds=3

die() { echo "bench-p2p-vs-iperf: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --perf) perf="$2"; shift 2 ;;
    --info) info="$2"; shift 2 ;;
    --lib) lib="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

find_tool() { # name, explicit path
  if [[ -n "$2" ]]; then echo "$2"; return; fi
  local d
  for d in "$here/../build/bin" "$here"/../build*/bin; do
    if [[ -x "$d/$1" ]]; then echo "$d/$1"; return; fi
  done
  command -v "$1" || true
}
perf="$(find_tool agoq-perf "$perf")"
info="$(find_tool agoq-info "$info")"
[[ -n "$perf" && -x "$perf" ]] || die "agoq-perf not found (build it, or pass --perf)"
command -v iperf3 >/dev/null || die "iperf3 not installed (tools/install-deps.sh)"
command -v python3 >/dev/null || die "python3 is needed to read JSON"

# ---- the plugin's data sockets per connection ----
nsocks="${AGOQ_SOCKET_NSOCKS:-}"
source="AGOQ_SOCKET_NSOCKS"
if [[ -z "$nsocks" || "$nsocks" == "0" ]] && [[ -n "$info" && -x "$info" ]]; then
  # The count the plugin resolves (0 = automatic included), as agoq-info -c reports it.
  # awk reads to the end: exiting at the match could kill agoq-info with SIGPIPE, which
  # pipefail turns into a silent exit of this script.
  nsocks="$(AGOQ_SOCKET_IFNAME="${AGOQ_SOCKET_IFNAME:-lo}" "$info" -c 2>/dev/null | awk '/^data sockets:/ && !n {print $3; n = 1}')"
  source="agoq-info -c (the plugin's resolved count)"
fi
[[ "$nsocks" =~ ^[0-9]+$ && "$nsocks" -ge 1 ]] || die "bad data socket count '$nsocks'"

# ---- iperf3 server on a free loopback port ----
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
workdir="$(mktemp -d)"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
iperf3 -s -B 127.0.0.1 -p "$port" >"$workdir/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 50); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  kill -0 "$server_pid" 2>/dev/null || die "iperf3 server failed: $(cat "$workdir/server.log")"
  sleep 0.1
done

iperf_gbits() { # streams
  iperf3 -c 127.0.0.1 -p "$port" -P "$1" -l 1M -t "$seconds" -J >"$workdir/iperf-$1.json" ||
    die "iperf3 -P $1 failed: $(cat "$workdir/iperf-$1.json")"
  python3 - "$workdir/iperf-$1.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("%.3f" % (d["end"]["sum_received"]["bits_per_second"] / 1e9))
EOF
}

# ---- measurements ----
echo "# agoq p2p vs iperf3 over loopback: $(nproc) CPUs, $nsocks data sockets ($source)"
perf_args=(p2p -b "$size" -e "$size" -n "$iters" -w 2 --json --nsocks "$nsocks")
[[ -n "$lib" ]] && perf_args+=(--lib "$lib")
agoq_gbits() {
  AGOQ_SOCKET_IFNAME="${AGOQ_SOCKET_IFNAME:-lo}" "$perf" "${perf_args[@]}" >"$workdir/perf.json" ||
    die "agoq-perf failed (output: $(cat "$workdir/perf.json"))"
  python3 - "$workdir/perf.json" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("%.3f" % rows[-1]["bw_Gbps"])
EOF
}

results=()
for round in $(seq "$rounds"); do
  a="$(agoq_gbits)"
  n_="$(iperf_gbits "$nsocks")"
  o_="$(iperf_gbits 1)"
  results+=("$a,$n_,$o_")
  printf 'round %d: agoq %s  iperf3 -P %s %s  iperf3 -P 1 %s Gbit/s\n' "$round" "$a" "$nsocks" "$n_" "$o_"
done

python3 - "$nsocks" "$size" "$iters" "$seconds" "${results[@]}" <<'EOF'
import statistics, sys
n, size, iters, secs = sys.argv[1:5]
rows = [tuple(map(float, r.split(","))) for r in sys.argv[5:]]
med = statistics.median
agoq, ipn, ip1 = (med([r[i] for r in rows]) for i in range(3))
print("%-44s %9.3f Gbit/s (median)" % ("agoq-perf p2p (%s x %s, inflight 8)" % (iters, size), agoq))
print("%-44s %9.3f Gbit/s (median)" % ("iperf3 -P %s -l 1M (%s s)" % (n, secs), ipn))
print("%-44s %9.3f Gbit/s (median)" % ("iperf3 -P 1 -l 1M (%s s)" % secs, ip1))
rn = med([r[0] / r[1] for r in rows if r[1] > 0])
r1 = med([r[0] / r[2] for r in rows if r[2] > 0])
print("ratio agoq / iperf3 -P %-3s %6.2f (median of %d rounds)" % (n, rn, len(rows)))
print("ratio agoq / iperf3 -P 1   %6.2f (median of %d rounds)" % (r1, len(rows)))
EOF
