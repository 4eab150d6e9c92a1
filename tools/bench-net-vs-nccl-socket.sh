#!/usr/bin/env bash
# Puts agoq's p2p net transport next to an NCCL Socket net plugin in one run: agoq-perf p2p
# drives each plugin .so through its newest ncclNetPlugin table (a sender and a forked
# receiver on this host), the two sides alternating. The Socket plugin is a .so you build
# from NCCL's socket transport yourself; agoq contains no NCCL code.
#
#   tools/bench-net-vs-nccl-socket.sh --socket PATH [--lib PATH] [--perf PATH] [--rounds R]
#       [-b SIZE] [-e SIZE] [-f F] [--inflight "1 8 pp"] [--target-bytes SIZE]
#       [--pp-target-bytes SIZE] [-n N] [-w N]
#       [--out DIR] [--env-a VAR=value]... [--env-b VAR=value]... [--timeout S] [--retries N]
#
#   --socket PATH        the NCCL Socket plugin .so (or env NCCL_SOCKET_PLUGIN_PATH); required
#   --lib PATH           agoq's plugin (default <build>/lib/libnccl-net-agoq.so next to --perf)
#   --perf PATH          agoq-perf (default env AGOQ_PERF, else build/bin/agoq-perf of this repo)
#   --rounds R           rounds (default 5); each runs both sides for every inflight value
#   -b, -e, -f           sizes, as agoq-perf's (default 8 B to 256 MiB, factor 2: 26 sizes)
#   --inflight LIST      requests in flight per side, one sweep each; "pp" is a ping-pong
#                        sweep (agoq-perf --pingpong: the receiver sends every message
#                        back, time_us is half a round trip, the latency) (default "1 8 pp")
#   --target-bytes SIZE  agoq-perf --target-bytes: timed messages per size at least -n and
#                        enough to carry SIZE, at most 1000000 (default 256M)
#   --pp-target-bytes SIZE  the same for the ping-pong sweep (default 2M: 262144 round
#                        trips of 8 B, -n of the large sizes)
#   -n N, -w N           agoq-perf's timed and warm-up messages per size (default 10 and 2)
#   --out DIR            keep the raw JSON and stderr of every run, the uptime load before
#                        each, the settings (meta.txt) and the summary (summary.md) in DIR
#   --env-a VAR=value    extra environment for the agoq side (repeatable)
#   --env-b VAR=value    extra environment for the Socket side (repeatable), e.g.
#                        --env-b NCCL_SOCKET_NTHREADS=2 --env-b NCCL_NSOCKS_PERTHREAD=2
#   --timeout S          a run taking longer than S seconds is killed and failed (default 600)
#   --retries N          run a failed run again, up to N times (default 0); every failed
#                        attempt is named at the end and kept in --out as *.failK.*
#
# Both sides use loopback: AGOQ_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are set to lo unless
# one of them is set (then the other gets the same value).
#
# Rounds alternate the order (odd rounds agoq then Socket, even rounds Socket then agoq; the
# first run of a pair is systematically disturbed on small hosts). Per inflight value it
# prints a markdown table: per size the medians over rounds of both sides' GB/s, each round's
# agoq/Socket ratio and the median of those ratios; for inflight 1 and ping-pong also both
# medians of time_us and the median per-round ratio agoq_time/Socket_time. Ping-pong's
# time_us is the latency (half a round trip), and its 8 B-4 KiB rows are checked against the
# target (<= 1.05). Inflight 1's time_us is the time per message of a stream whose sender
# never waits for its receiver, so the kernel may coalesce many small messages into one TCP
# segment: a send rate, printed but not judged as latency. Every figure is one agoq-perf
# printed in its JSON; the script only takes medians and ratios.
#
# Sizes: factor 2 (26 sizes), not 4. On a 2-CPU VM one sweep of the 26 sizes with
# --target-bytes 256M took 18-19 s for agoq and 11-12 s for NCCL 2.28.9's Socket (the
# 1000000-message cap binds up to 256 B), and a ping-pong sweep about 10 s, so the default
# run (5 rounds x 3 sweeps x 2 sides) takes about 7 minutes, well under 15.
#
# NCCL's Socket transport (2.28.9, ncclNetSocketTest) loses its framing now and then when a
# sender runs ahead of its receiver with messages of at most NCCL_SOCKET_INLINE (128) bytes:
# the receiver reads the size, finds the inline bytes not there yet, returns, and on its
# next test() reads them as the next size ("message truncated : receiving N bytes instead
# of 8"). agoq-perf's sender is not held back by its receiver, and on the VM above 7 of 10
# Socket runs of 1048576 8-byte messages failed so (0 of 10 with NCCL_SOCKET_INLINE=0).
# Such a run fails here like any other; --retries N runs it again, --env-b
# NCCL_SOCKET_INLINE=0 avoids it but measures Socket without its inline path.
# Exit status: 0 when every run succeeded; 1 when one failed (each is named); 2 bad usage.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
perf="${AGOQ_PERF:-}"
socket="${NCCL_SOCKET_PLUGIN_PATH:-}"
lib=""
rounds=5
minb=8 maxb=256M factor=2
inflight_list="1 8 pp"
target=256M
pp_target=2M
iters=10 warmup=2
out=""
timeout_s=600
retries=0
env_a=() env_b=()
failed=() attempts=()

die() { echo "bench-net-vs-nccl-socket: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
env_arg() { [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "bad VAR=value: '$1'"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --socket) need "$@"; socket="$2"; shift 2 ;;
    --lib) need "$@"; lib="$2"; shift 2 ;;
    --perf) need "$@"; perf="$2"; shift 2 ;;
    --rounds) need "$@"; rounds="$2"; shift 2 ;;
    -b) need "$@"; minb="$2"; shift 2 ;;
    -e) need "$@"; maxb="$2"; shift 2 ;;
    -f) need "$@"; factor="$2"; shift 2 ;;
    --inflight) need "$@"; inflight_list="$2"; shift 2 ;;
    --target-bytes) need "$@"; target="$2"; shift 2 ;;
    --pp-target-bytes) need "$@"; pp_target="$2"; shift 2 ;;
    -n) need "$@"; iters="$2"; shift 2 ;;
    -w) need "$@"; warmup="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --env-a) need "$@"; env_arg "$2"; env_a+=("$2"); shift 2 ;;
    --env-b) need "$@"; env_arg "$2"; env_b+=("$2"); shift 2 ;;
    --timeout) need "$@"; timeout_s="$2"; shift 2 ;;
    --retries) need "$@"; retries="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

# ---- what to run ----
[[ -n "$socket" ]] || die "no NCCL Socket plugin: pass --socket PATH (or set NCCL_SOCKET_PLUGIN_PATH) to a .so built from NCCL's socket transport"
[[ -f "$socket" && -r "$socket" ]] || die "--socket: no readable file at '$socket'"
if [[ -z "$perf" ]]; then
  for d in "$repo/build/bin" "$repo"/build*/bin; do
    if [[ -x "$d/agoq-perf" ]]; then perf="$d/agoq-perf"; break; fi
  done
fi
[[ -n "$perf" && -x "$perf" ]] || die "agoq-perf not found at '${perf:-$repo/build/bin/agoq-perf}' (build it, or pass --perf)"
[[ -n "$lib" ]] || lib="$(cd "$(dirname "$perf")/.." && pwd)/lib/libnccl-net-agoq.so"
[[ -f "$lib" ]] || die "--lib: no agoq plugin at '$lib'"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "bad --rounds '$rounds'"
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || die "bad --timeout '$timeout_s'"
[[ "$retries" =~ ^[0-9]$ ]] || die "bad --retries '$retries' (0..9)"
inflights=()
for i in ${inflight_list//,/ }; do
  if [[ "$i" == pp ]]; then inflights+=(pp); continue; fi
  if ! [[ "$i" =~ ^[1-9][0-9]*$ ]] || ((i > 32)); then die "bad --inflight value '$i' (1..32 or pp)"; fi
  inflights+=("$i")
done
((${#inflights[@]} > 0)) || die "--inflight: empty list"
command -v python3 >/dev/null || die "python3 is needed to read the JSON"
command -v timeout >/dev/null || die "timeout (coreutils) is needed"

# Loopback on both sides unless the user chose an interface for either.
if [[ -z "${AGOQ_SOCKET_IFNAME:-}" && -z "${NCCL_SOCKET_IFNAME:-}" ]]; then
  export AGOQ_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo
else
  export AGOQ_SOCKET_IFNAME="${AGOQ_SOCKET_IFNAME:-$NCCL_SOCKET_IFNAME}"
  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$AGOQ_SOCKET_IFNAME}"
fi

if [[ -n "$out" ]]; then
  # Never mixed with an earlier run's files, which the summary would read as this run's.
  if [[ -e "$out" && -n "$(ls -A "$out" 2>/dev/null)" ]]; then die "--out '$out' is not empty"; fi
  mkdir -p "$out" || die "cannot create --out '$out'"
  raw="$out"
else
  raw="$(mktemp -d /tmp/agoq-bench-socket.XXXXXX)"
  trap 'rm -rf "$raw"' EXIT
fi
trap 'exit 130' INT TERM

# The system's TCP congestion control: it decides much on loopback (bbr paces each socket;
# see AGOQ_SOCKET_CC in docs/configuration.md), so every summary names it.
cc=$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown)

# Let agoq-perf reject bad sizes or counts once, before any round starts.
perf_args=(p2p -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" --target-bytes "$target" --json)
"$perf" "${perf_args[@]}" --inflight 1 --lib "$lib" -h >/dev/null 2>"$raw/usage.err" ||
  die "agoq-perf rejects the options: $(cat "$raw/usage.err")"
{
  echo "date: $(date -Iseconds)"
  echo "host: $(uname -n), $(nproc) CPUs"
  echo "perf: $perf ${perf_args[*]}"
  echo "agoq: $lib ${env_a[*]:-}"
  echo "socket: $socket ${env_b[*]:-}"
  echo "AGOQ_SOCKET_IFNAME=$AGOQ_SOCKET_IFNAME NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME"
  echo "net.ipv4.tcp_congestion_control: $cc"
} >"$raw/meta.txt"

# The lines of a failed run's stderr that say why: the plugins' WARN lines and agoq-perf's
# own (the first is the cause; later ones are the other rank noticing), else its last line.
why_failed() { # file [lines]
  grep -E 'WARN|agoq-perf' "$1" | head -n "${2:-1}" | grep . || tail -n 1 "$1"
}

run_side() { # round inflight agoq|socket
  local r=$1 i=$2 side=$3 so envs=()
  if [[ $side == agoq ]]; then so=$lib; envs=("${env_a[@]+"${env_a[@]}"}"); else so=$socket; envs=("${env_b[@]+"${env_b[@]}"}"); fi
  local base="$raw/r$r-i$i-$side" name="round $r inflight $i $side" try rc why
  for ((try = 0; try <= retries; try++)); do
    echo "$name$( ((try > 0)) && echo " (retry $try)"): $(uptime 2>/dev/null || cat /proc/loadavg)" >>"$raw/uptime.txt"
    rc=0
    local mode=(--inflight "$i")
    [[ $i == pp ]] && mode=(--pingpong --target-bytes "$pp_target")
    env "${envs[@]+"${envs[@]}"}" timeout --kill-after=10 "$timeout_s" \
      "$perf" "${perf_args[@]}" "${mode[@]}" --lib "$so" >"$base.json" 2>"$base.err" || rc=$?
    ((rc == 0)) && return 0
    why="exit $rc"
    ((rc == 124)) && why="timed out after $timeout_s s"
    # Keep the failed attempt's output; the run's own files are the last attempt's.
    mv "$base.err" "$base.fail$((try + 1)).err"
    mv "$base.json" "$base.fail$((try + 1)).json"
    echo "bench-net-vs-nccl-socket: FAILED: $name ($why, attempt $((try + 1)) of $((retries + 1))):" >&2
    why_failed "$base.fail$((try + 1)).err" 4 | sed 's/^/  /' >&2
    if grep -q "message truncated" "$base.fail$((try + 1)).err"; then
      echo "  (NCCL Socket's inline path lost its framing: see --help, NCCL_SOCKET_INLINE)" >&2
    fi
    attempts+=("$name: attempt $((try + 1)) failed ($why; $(why_failed "$base.fail$((try + 1)).err"))")
  done
  failed+=("$name ($why: $(why_failed "$base.fail$try.err"))")
  return 0
}

title="agoq vs NCCL Socket p2p: $rounds round(s), the order alternating, inflight ${inflights[*]}, sizes $minb..$maxb x$factor, --target-bytes $target -n $iters -w $warmup, ifname $AGOQ_SOCKET_IFNAME, TCP congestion control $cc, $(uname -n) with $(nproc) CPUs"
echo "# $title" >&2
for r in $(seq "$rounds"); do
  for i in "${inflights[@]}"; do
    if ((r % 2)); then order=(agoq socket); else order=(socket agoq); fi
    for side in "${order[@]}"; do run_side "$r" "$i" "$side"; done
  done
  echo "# round $r of $rounds done" >&2
done

summary_rc=0
python3 - "$raw" "$rounds" "$lib" "$socket" "$title" "${inflights[@]}" >"$raw/summary.md" <<'EOF' || summary_rc=$?
import json, os, statistics, sys

raw, rounds, lib, sock, title = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
inflights = [x if x == "pp" else int(x) for x in sys.argv[6:]]
med = statistics.median
missing = {}

ran = set()  # runs that exited 0 (a failed run's files were renamed: the script names it)

def load(r, i, side):
    path = os.path.join(raw, "r%d-i%s-%s.json" % (r, i, side))
    rows = {}
    if not os.path.exists(path):
        return rows
    ran.add((r, i, side))
    for line in open(path):
        if line.startswith("{"):
            d = json.loads(line)
            if d.get("test") == ("pingpong" if i == "pp" else "p2p"):
                rows[d["size"]] = d
    return rows

def fmt_size(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or b % 1024:
            return "%d %s" % (b, unit)
        b //= 1024
    return "%d TiB" % b

def fmt_bw(x):
    return "%.4g" % x

runs = {(r, i, s): load(r, i, s) for r in range(1, rounds + 1) for i in inflights
        for s in ("agoq", "socket")}
about = {}
for (r, i, s), rows in runs.items():
    for d in rows.values():
        about.setdefault(s, set()).add("net v%s, device %s" % (d.get("net_version"), d.get("device")))
print("## " + title)
print()
print("agoq:   %s (%s)" % (lib, "; ".join(sorted(about.get("agoq", {"no results"})))))
print()
print("Socket: %s (%s)" % (sock, "; ".join(sorted(about.get("socket", {"no results"})))))

for i in inflights:
    sizes = sorted(set().union(*(set(runs[(r, i, s)]) for r in range(1, rounds + 1)
                                 for s in ("agoq", "socket"))))
    timed = i in (1, "pp")
    judged = i == "pp"  # latency; a stream's time per message is a send rate
    print()
    what = "ping-pong (latency: time_us is half a round trip)" if i == "pp" else "inflight %d" % i
    if i == 1:
        what += " (time_us: per message of a stream, a send rate, not latency)"
    print("### %s (%d round%s)" % (what, rounds, "" if rounds == 1 else "s"))
    print()
    head = "| size | agoq GB/s (median) | Socket GB/s (median) | agoq/Socket per round | median ratio |"
    rule = "|---:|---:|---:|:---|---:|"
    if timed:
        head += " agoq time_us (median) | Socket time_us (median) | agoq_time/Socket_time (median) |"
        rule += "---:|---:|---:|"
    print(head)
    print(rule)
    target_seen, target_miss = [], []
    for size in sizes:
        a = {r: runs[(r, i, "agoq")][size] for r in range(1, rounds + 1) if size in runs[(r, i, "agoq")]}
        b = {r: runs[(r, i, "socket")][size] for r in range(1, rounds + 1) if size in runs[(r, i, "socket")]}
        for side, got in (("agoq", a), ("socket", b)):
            for r in range(1, rounds + 1):
                if r not in got and (r, i, side) in ran:
                    missing.setdefault("round %d inflight %s %s" % (r, i, side), []).append(fmt_size(size))
        both = [r for r in range(1, rounds + 1) if r in a and r in b]
        bw_ratios = [a[r]["bw_GBps"] / b[r]["bw_GBps"] for r in both if b[r]["bw_GBps"] > 0]
        cells = [fmt_size(size),
                 fmt_bw(med([d["bw_GBps"] for d in a.values()])) if a else "-",
                 fmt_bw(med([d["bw_GBps"] for d in b.values()])) if b else "-",
                 " ".join("%.2f" % x for x in bw_ratios) or "-",
                 "%.2f" % med(bw_ratios) if bw_ratios else "-"]
        if timed:
            t_ratios = [a[r]["time_us"] / b[r]["time_us"] for r in both if b[r]["time_us"] > 0]
            cells += ["%.3f" % med([d["time_us"] for d in a.values()]) if a else "-",
                      "%.3f" % med([d["time_us"] for d in b.values()]) if b else "-",
                      "%.2f" % med(t_ratios) if t_ratios else "-"]
            if judged and 8 <= size <= 4096 and t_ratios:
                target_seen.append(fmt_size(size))
                if med(t_ratios) > 1.05:
                    target_miss.append(fmt_size(size))
        print("| " + " | ".join(cells) + " |")
    if judged and any(8 <= s <= 4096 for s in sizes):
        if not target_seen:
            verdict = "no size had both sides measured"
        elif target_miss:
            verdict = "not met at %s (of %d sizes compared)" % (", ".join(target_miss), len(target_seen))
        else:
            verdict = "met at all %d sizes compared" % len(target_seen)
        print()
        print("latency, agoq_time/Socket_time <= 1.05 for 8 B-4 KiB: " + verdict)
for run, lost in missing.items():
    print("MISSING: %s: no result for %s" % (run, ", ".join(lost)), file=sys.stderr)
sys.exit(1 if missing else 0)
EOF
cat "$raw/summary.md"
[[ -n "$out" ]] && echo "# raw JSON, stderr, uptime load and this summary: $out" >&2

if ((retries > 0 && ${#attempts[@]} > 0)); then
  echo "bench-net-vs-nccl-socket: ${#attempts[@]} failed attempt(s) (--retries $retries), kept as *.fail*.err/json:" >&2
  for f in "${attempts[@]}"; do echo "  $f" >&2; done
fi
if ((${#failed[@]} > 0)); then
  echo "bench-net-vs-nccl-socket: ${#failed[@]} run(s) failed:" >&2
  for f in "${failed[@]}"; do echo "  $f" >&2; done
  exit 1
fi
if ((summary_rc != 0)); then
  echo "bench-net-vs-nccl-socket: a run exited 0 but its results are incomplete (see MISSING above)" >&2
  exit 1
fi
