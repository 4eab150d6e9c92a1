#!/usr/bin/env bash
# Reruns the measured figures that README.md quotes, one named group at a time, and writes
# each group's result to docs/figures/<group>.md: the tables the README copies, the exact
# commands, the commit (short hash, "-dirty" when tracked files differ from it), the date,
# the machine (uname -srm, CPUs, CPU model, the system's TCP congestion control) and the
# load average at start and end. README.md quotes figures only from these files;
# tests/docs/figures_quoted.sh (ctest docs.figures) checks the copies and the headers.
#
#   tools/figures.sh [options] GROUP...        GROUP: a name below, or "all"
#   tools/figures.sh --list
#
#   --build DIR     the agoq build folder (default build/): DIR/bin/agoq-perf, DIR/lib/
#   --socket PATH   NCCL's Socket transport as an external net plugin .so, for p2p-socket
#                   (or env NCCL_SOCKET_PLUGIN_PATH); agoq contains no NCCL code, build it
#                   yourself from NCCL's net_socket.cc
#   --rounds R      rounds of every group (default: the group's own, see --list)
#   --out DIR       where the figure files go (default docs/figures of this repo)
#   --no-build      measure the binaries as they are; by default the plugin, agoq-perf and
#                   agoq-info are first rebuilt (cmake --build DIR --target ...) so that they
#                   are the working tree the figure files name (commit, dirty files)
#   --dry-run       print the commands, run nothing, write nothing
#
# Groups (benchmarks run one after another, never two at once; every group alternates
# the sides it compares per round and reports medians over rounds):
#   p2p-socket   agoq vs NCCL Socket p2p over loopback (tools/bench-net-vs-nccl-socket.sh):
#                bandwidth, 8 in flight, 128 KiB..128 MiB x4; latency (ping-pong),
#                8 B..1 MiB x2. Default 5 rounds, about 4 minutes on 2 vCPUs.
#   demo         the quick start's main demo, agoq-perf allreduce -N 4 -d bf16 -b 64K
#                -e 64M -f 4 --format int8 over lo: busbw, wire, rel. L2, diverged, crc%,
#                cpu_s/GB, medians per size. Default 3 rounds, about 2 minutes.
#   collnet      4-rank bf16 all-reduce of 64 MiB through CollNet, int8 against none
#                alternated (-n 10 -w 2): busbw and cpu_s/GB. Default 5 rounds.
#   iperf        agoq p2p (1 GiB messages) against iperf3 (tools/bench-p2p-vs-iperf.sh).
#                Default 3 rounds.
#   netlab       needs root (network namespaces, tc): typed p2p bf16 64 MiB over a shaped
#                5 Gbit/s link, and the 4-rank all-reduce of 256 MiB, int8 vs none
#                (tools/netlab.sh). Default 1 round each (rounds repeat the runs).
#
# "all" runs every group (netlab only as root). Exit status: 0 every group ran and its
# file was written; 1 a benchmark failed (its file is not written); 2 bad usage.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo/build"
socket="${NCCL_SOCKET_PLUGIN_PATH:-}"
rounds=""
outdir="$repo/docs/figures"
dry=0
rebuild=1
built=""
groups=()
all_groups=(p2p-socket demo collnet iperf netlab)
invocation="tools/figures.sh $*"

die() { echo "figures: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) need "$@"; build="$2"; shift 2 ;;
    --socket) need "$@"; socket="$2"; shift 2 ;;
    --rounds) need "$@"; rounds="$2"; shift 2 ;;
    --out) need "$@"; outdir="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --no-build) rebuild=0; shift ;;
    --list)
      awk '/^# Groups/ {on = 1; next} on && /^#   [a-z0-9-]+ / {print $2} /^# "all"/ {exit}' "$0"
      exit 0 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    all) groups+=("${all_groups[@]}"); shift ;;
    -*) die "unknown option $1 (see --help)" ;;
    *)
      ok=0
      for g in "${all_groups[@]}"; do [[ "$1" == "$g" ]] && ok=1; done
      ((ok)) || die "unknown group '$1' (--list shows them)"
      groups+=("$1"); shift ;;
  esac
done
((${#groups[@]} > 0)) || die "name a group, or all (--list shows them)"
[[ -z "$rounds" || "$rounds" =~ ^[1-9][0-9]*$ ]] || die "bad --rounds '$rounds'"
build="$(cd "$build" 2>/dev/null && pwd)" || die "--build: no folder '$build'"
perf="$build/bin/agoq-perf"
if ((rebuild && !dry)); then
  echo "+ cmake --build $build --target nccl-net-agoq agoq-perf agoq-info -j $(nproc)" >&2
  cmake --build "$build" --target nccl-net-agoq agoq-perf agoq-info -j "$(nproc)" >"$build/figures-build.log" 2>&1 ||
    die "rebuilding $build failed (see $build/figures-build.log); fix it, or measure as is with --no-build"
  built="rebuilt from the working tree at the start (cmake --build, the targets the benchmarks use)"
else
  built="not rebuilt (--no-build): binaries as built before"
fi
lib="$build/lib/libnccl-net-agoq.so"
[[ -x "$perf" && -f "$lib" ]] || die "no agoq-perf or plugin under '$build' (build it, or pass --build)"
command -v python3 >/dev/null || die "python3 is needed to read the benchmarks' JSON"
# Relative paths in the recorded commands, when the build is inside the repo.
rel() { local p="$1"; [[ "$p" == "$repo"/* ]] && p="${p#"$repo"/}"; echo "$p"; }

# ---- what every figure file records ----
commit_id() {
  local c
  c=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
  if [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then c="$c-dirty"; fi
  echo "$c"
}
dirty_files() { # the tracked files that differ from the commit, at most 12 named
  git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null |
    awk '{print $NF}' | awk 'NR <= 12 {printf "%s%s", (NR > 1 ? ", " : ""), $0} END {if (NR > 12) printf ", and %d more", NR - 12; if (NR == 0) printf "none"}'
}
machine() {
  local model cc
  model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null)
  cc=$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown)
  echo "$(uname -srm); $(nproc) CPUs; ${model:-unknown CPU}; net.ipv4.tcp_congestion_control $cc"
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

run_log() { # prints the command, runs it unless --dry-run
  echo "+ $*" >&2
  ((dry)) && return 0
  "$@"
}

# The tree as built and measured: named when the run starts, not when a file is written.
commit_at_start=$(commit_id)
dirty_at_start=$(dirty_files)

work="$(mktemp -d /tmp/agoq-figures.XXXXXX)"
# Kept when something failed, so the raw results of a long run are not lost.
trap 'rc=$?; if ((rc == 0)); then rm -rf "$work"; else echo "figures: raw results kept in $work" >&2; fi' EXIT
trap 'exit 130' INT TERM

# write_figure GROUP TITLE LOAD0 COMMANDS_FILE BODY_FILE
write_figure() {
  local g=$1 title=$2 load0=$3 cmds=$4 body=$5 f="$outdir/$1.md"
  ((dry)) && return 0
  mkdir -p "$outdir"
  {
    echo "# Figures: $g"
    echo
    echo "$title"
    echo
    echo "Written by \`tools/figures.sh\`; rerun with the command below. README.md copies the"
    echo "tables marked \`<!-- table: NAME -->\` verbatim (checked by ctest \`docs.figures\`)."
    echo
    echo "- command: \`$invocation\`"
    echo "- commit: $commit_at_start"
    echo "- dirty files: $dirty_at_start"
    echo "- build: $(rel "$build"), $built; plugin built $(date -u -r "$lib" +%Y-%m-%dT%H:%M:%SZ)"
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- machine: $(machine)"
    echo "- load average (1/5/15 min): $load0 at start, $(loadavg) at end"
    echo "- benchmark commands:"
    sed 's/^/  - `/; s/$/`/' "$cmds"
    echo
    cat "$body"
  } >"$f.tmp"
  mv "$f.tmp" "$f"
  echo "figures: wrote $(rel "$f")" >&2
}

# ---- p2p-socket ----
group_p2p_socket() {
  local r=${rounds:-5} load0 d="$work/p2p-socket" rc=0
  [[ -n "$socket" ]] || die "p2p-socket needs --socket PATH (NCCL's Socket transport built as a net plugin)"
  [[ -f "$socket" ]] || die "--socket: no file '$socket'"
  mkdir -p "$d"
  load0=$(loadavg)
  local bw=(tools/bench-net-vs-nccl-socket.sh --perf "$(rel "$perf")" --lib "$(rel "$lib")" --socket "$socket"
            --rounds "$r" --retries 5 --inflight 8 -b 128K -e 128M -f 4)
  local pp=(tools/bench-net-vs-nccl-socket.sh --perf "$(rel "$perf")" --lib "$(rel "$lib")" --socket "$socket"
            --rounds "$r" --retries 5 --inflight pp -b 8 -e 1M -f 2)
  printf '%s\n' "${bw[*]}" "${pp[*]}" >"$d/cmds"
  (cd "$repo" && run_log "${bw[@]}" --out "$d/bw") >"$d/bw.txt" || rc=1
  (cd "$repo" && run_log "${pp[@]}" --out "$d/pp") >"$d/pp.txt" || rc=1
  ((dry)) && return 0
  ((rc == 0)) || { echo "figures: p2p-socket: a benchmark failed; $(rel "$outdir")/p2p-socket.md not written" >&2; return 1; }
  python3 - "$d" "$r" >"$d/body.md" <<'EOF' || return 1
import json, os, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
def load(sub, r, i, side):
    rows = {}
    for line in open(os.path.join(d, sub, "r%d-i%s-%s.json" % (r, i, side))):
        if line.startswith("{"):
            x = json.loads(line)
            if x.get("test") in ("p2p", "pingpong"):
                rows[x["size"]] = x
    return rows
def name(b):
    for u in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or b % 1024: return "%d %s" % (b, u)
        b //= 1024
def stats(sub, i, key):
    a = [load(sub, r, i, "agoq") for r in range(1, rounds + 1)]
    s = [load(sub, r, i, "socket") for r in range(1, rounds + 1)]
    out = {}
    for size in sorted(set(a[0]) & set(s[0])):
        ra = [x[size][key] for x in a if size in x]
        rs = [x[size][key] for x in s if size in x]
        ratio = [x[size][key] / y[size][key] for x, y in zip(a, s) if size in x and size in y and y[size][key] > 0]
        out[size] = (med(ra), med(rs), med(ratio), min(ratio), max(ratio))
    return out
bw = stats("bw", "8", "bw_GBps")
pp = stats("pp", "pp", "time_us")
print("## Bandwidth, 8 in flight: agoq / Socket, median of per-round ratios (%d rounds)" % rounds)
print()
print("<!-- table: bw -->")
print("| agoq / Socket, 8 in flight | " + " | ".join(name(s) for s in bw) + " |")
print("|---|" + "---|" * len(bw))
print("| ratio (median) | " + " | ".join("%.2f" % v[2] for v in bw.values()) + " |")
print("| agoq GB/s (median) | " + " | ".join("%.2f" % v[0] for v in bw.values()) + " |")
print("| Socket GB/s (median) | " + " | ".join("%.2f" % v[1] for v in bw.values()) + " |")
print("| ratio, lowest-highest round | " + " | ".join("%.2f-%.2f" % (v[3], v[4]) for v in bw.values()) + " |")
print()
cols = [s for s in (8, 128, 4096, 65536, 1048576) if s in pp]
print("## Latency (ping-pong, half a round trip): agoq / Socket us (median of per-round ratios, %d rounds)" % rounds)
print()
print("<!-- table: latency -->")
print("| latency, agoq / Socket | " + " | ".join(name(s) for s in cols) + " |")
print("|---|" + "---|" * len(cols))
def us(x): return "%.3g" % x
print("| us (ratio) | " + " | ".join("%s / %s (%.2f)" % (us(pp[s][0]), us(pp[s][1]), pp[s][2]) for s in cols) + " |")
small = [pp[s][2] for s in pp if s <= 4096]
print()
print("Median latency ratio over every size 8 B-4 KiB: %.2f-%.2f; 8 B-1 MiB: %.2f-%.2f." % (
    min(small), max(small), min(v[2] for v in pp.values()), max(v[2] for v in pp.values())))
EOF
  {
    echo
    echo "## Full output of the two benchmark runs"
    echo
    sed 's/^## /### /; s/^### /#### /' "$d/bw/summary.md"
    echo
    sed 's/^## /### /; s/^### /#### /' "$d/pp/summary.md"
  } >>"$d/body.md"
  write_figure p2p-socket "agoq's p2p against NCCL's Socket transport (NCCL 2.28.9 net_socket.cc as an external plugin, its defaults), loopback, agoq's defaults; rounds alternate the two sides." \
    "$load0" "$d/cmds" "$d/body.md"
}

# ---- allreduce rounds, shared by demo and collnet ----
# allreduce_rounds DIR ROUNDS "FORMAT..." ARGS...: round r runs every format, the order
# alternating per round; writes DIR/r<R>-<format>.json
allreduce_rounds() {
  local d=$1 r=$2 fmts=($3) f order rc=0
  shift 3
  local args=("$@")
  for ((i = 1; i <= r; i++)); do
    order=("${fmts[@]}")
    if ((i % 2 == 0)); then order=(); for ((k = ${#fmts[@]} - 1; k >= 0; k--)); do order+=("${fmts[k]}"); done; fi
    for f in "${order[@]}"; do
      echo "# round $i of $r: --format $f" >&2
      ( ((dry)) && { echo "+ AGOQ_SOCKET_IFNAME=lo $(rel "$perf") ${args[*]} --format $f --json" >&2; exit 0; }
        AGOQ_SOCKET_IFNAME=lo timeout --kill-after=10 900 "$perf" "${args[@]}" --format "$f" --json \
          >"$d/r$i-$f.json" 2>"$d/r$i-$f.err" ) || { echo "figures: round $i --format $f failed:" >&2; tail -n 5 "$d/r$i-$f.err" >&2; rc=1; }
    done
  done
  return $rc
}

group_demo() {
  local r=${rounds:-3} load0 d="$work/demo"
  local args=(allreduce -N 4 -d bf16 -b 64K -e 64M -f 4)
  mkdir -p "$d"
  load0=$(loadavg)
  echo "AGOQ_SOCKET_IFNAME=lo $(rel "$perf") ${args[*]} --format int8 --json  ($r rounds)" >"$d/cmds"
  allreduce_rounds "$d" "$r" int8 "${args[@]}" || { echo "figures: demo failed; file not written" >&2; return 1; }
  ((dry)) && return 0
  python3 - "$d" "$r" >"$d/body.md" <<'EOF' || return 1
import json, os, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
runs = []
for r in range(1, rounds + 1):
    rows = {}
    for line in open(os.path.join(d, "r%d-int8.json" % r)):
        if line.startswith("{"):
            x = json.loads(line); rows[x["size"]] = x
    runs.append(rows)
def name(b):
    for u in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or b % 1024: return "%d %s" % (b, u)
        b //= 1024
def m(size, key):
    v = [x[size][key] for x in runs if size in x and x[size].get(key) is not None]
    return med(v) if v else None
def rng(size, f):
    v = [f(x[size]) for x in runs if size in x and f(x[size]) is not None]
    return (min(v), max(v)) if v else None
def crc(x): return 100.0 * x["crc_ms"] / x["codec_ms"] if x["codec_ms"] > 0 and x["crc_ms"] > 0 else None
print("## 4-rank bf16 all-reduce through CollNet, int8 on the wire, loopback (medians of %d runs; crc%% and cpu_s/GB: lowest-highest run)" % rounds)
print()
print("<!-- table: demo -->")
print("| size | busbw GB/s | wire | rel. L2 | diverged | crc% | cpu_s/GB |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for size in sorted(runs[0]):
    c, cpu = rng(size, crc), rng(size, lambda x: x.get("cpu_s_per_GB"))
    div = [x[size].get("diverged") for x in runs if size in x]
    print("| %s | %.3f | %.3f | %.2f%% | %s | %s | %s |" % (
        name(size), m(size, "busbw_GBps"), m(size, "wire_ratio"), 100 * m(size, "rel_l2"),
        max(div) if None not in div else "-",
        "%.1f-%.1f" % c if c else "-", "%.3g-%.3g" % cpu if cpu else "-"))
EOF
  write_figure demo "The quick start's main demo (tools/quickstart.sh): agoq-perf allreduce over loopback, AGOQ_SOCKET_IFNAME=lo, the plugin's defaults but --format int8." \
    "$load0" "$d/cmds" "$d/body.md"
}

group_collnet() {
  local r=${rounds:-5} load0 d="$work/collnet"
  local args=(allreduce -N 4 -d bf16 -b 64M -e 64M -n 10 -w 2)
  mkdir -p "$d"
  load0=$(loadavg)
  echo "AGOQ_SOCKET_IFNAME=lo $(rel "$perf") ${args[*]} --format int8|none --json  ($r rounds, the two formats alternating)" >"$d/cmds"
  allreduce_rounds "$d" "$r" "int8 none" "${args[@]}" || { echo "figures: collnet failed; file not written" >&2; return 1; }
  ((dry)) && return 0
  python3 - "$d" "$r" >"$d/body.md" <<'EOF' || return 1
import json, os, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
def one(r, f):
    for line in open(os.path.join(d, "r%d-%s.json" % (r, f))):
        if line.startswith("{"): return json.loads(line)
a = [one(r, "int8") for r in range(1, rounds + 1)]
b = [one(r, "none") for r in range(1, rounds + 1)]
print("## 4-rank bf16 all-reduce of 64 MiB through CollNet, loopback, int8 against none (%d alternated rounds, medians)" % rounds)
print()
print("<!-- table: collnet -->")
print("| format | busbw GB/s (median) | busbw, lowest-highest | cpu_s/GB (median) | wire |")
print("|---|---:|---:|---:|---:|")
for f, x in (("int8", a), ("none", b)):
    bw = [y["busbw_GBps"] for y in x]
    print("| %s | %.3f | %.3f-%.3f | %.3g | %.3f |" % (f, med(bw), min(bw), max(bw),
          med([y["cpu_s_per_GB"] for y in x]), med([y["wire_ratio"] for y in x])))
ratio = [p["busbw_GBps"] / q["busbw_GBps"] for p, q in zip(a, b)]
print("| int8 / none, per-round ratio (median) | %.2f | %.2f-%.2f | | |" % (med(ratio), min(ratio), max(ratio)))
EOF
  write_figure collnet "CollNet all-reduce, int8 against none, over loopback (AGOQ_SOCKET_IFNAME=lo), the plugin's defaults otherwise." \
    "$load0" "$d/cmds" "$d/body.md"
}

group_iperf() {
  local r=${rounds:-3} load0 d="$work/iperf"
  mkdir -p "$d"
  local cmd=(tools/bench-p2p-vs-iperf.sh --perf "$(rel "$perf")" --lib "$(rel "$lib")" --info "$(rel "$build/bin/agoq-info")" --seconds 3 --iters 5 --rounds "$r")
  echo "${cmd[*]}" >"$d/cmds"
  load0=$(loadavg)
  (cd "$repo" && run_log "${cmd[@]}") >"$d/out.txt" 2>&1 || { echo "figures: iperf failed; file not written" >&2; tail -n 5 "$d/out.txt" >&2; return 1; }
  ((dry)) && return 0
  { echo "## Output"; echo; echo "<!-- table: iperf -->"; echo '```'; grep -v '^+ ' "$d/out.txt"; echo '```'; } >"$d/body.md"
  write_figure iperf "agoq p2p (1 GiB messages) against iperf3 over loopback, interleaved rounds." "$load0" "$d/cmds" "$d/body.md"
}

group_netlab() {
  local r=${rounds:-1} load0 d="$work/netlab" i
  if [[ $(id -u) != 0 ]]; then
    echo "figures: netlab needs root (network namespaces, tc); skipped" >&2
    return 1
  fi
  mkdir -p "$d"
  local p2p=(tools/netlab.sh --perf "$(rel "$perf")" --lib "$(rel "$lib")" --op p2p -d bf16 -b 64M -e 64M --iters 5 --warmup 1 -- --chunk 128K)
  local coll=(tools/netlab.sh --perf "$(rel "$perf")" --lib "$(rel "$lib")" --nranks 4 -b 256M -e 256M --iters 3 --warmup 1)
  printf '%s\n' "${p2p[*]}" "${coll[*]}" >"$d/cmds"
  load0=$(loadavg)
  : >"$d/body.md"
  for ((i = 1; i <= r; i++)); do
    for c in p2p coll; do
      local cmd=("${p2p[@]}")
      [[ $c == coll ]] && cmd=("${coll[@]}")
      (cd "$repo" && run_log "${cmd[@]}") >"$d/$c-$i.txt" 2>&1 || { echo "figures: netlab $c failed; file not written" >&2; tail -n 8 "$d/$c-$i.txt" >&2; return 1; }
      ((dry)) || { echo "## $c, run $i of $r"; echo; echo "<!-- table: $c-$i -->"; echo '```'; grep -v '^+ ' "$d/$c-$i.txt"; echo '```'; echo; } >>"$d/body.md"
    done
  done
  ((dry)) && return 0
  write_figure netlab "Shaped 5 Gbit/s links between network namespaces on this host (tools/netlab.sh, tc tbf), as root." "$load0" "$d/cmds" "$d/body.md"
}

status=0
for g in "${groups[@]}"; do
  if [[ $g == netlab && $(id -u) != 0 && ${#groups[@]} -gt 1 ]]; then
    echo "figures: netlab skipped (not root)" >&2; continue
  fi
  echo "figures: group $g" >&2
  case "$g" in
    p2p-socket) group_p2p_socket || status=1 ;;
    demo) group_demo || status=1 ;;
    collnet) group_collnet || status=1 ;;
    iperf) group_iperf || status=1 ;;
    netlab) group_netlab || status=1 ;;
  esac
done
exit $status
