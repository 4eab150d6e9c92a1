#!/usr/bin/env bash
# A shaped network on one host: N network namespaces ("nodes"), each with one veth into a
# bridge that lives in its own "switch" namespace. `tc tbf` shapes BOTH ends of every veth
# to the given rate, so every node's egress and ingress are limited, like a NIC port on a
# switch. Nodes are 10.77.0.1 .. 10.77.0.N (/24). One agoq-perf rank runs per node with
# AGOQ_SOCKET_IFNAME set to that node's veth. Needs root (ip netns, tc); kernel netem is
# not needed (rate only: no delay or loss is injected).
#
# usage: tools/netlab.sh [options] [-- extra agoq-perf arguments]
#        tools/netlab.sh --clean [RUN_ID]
#   --op OP          allreduce (default) | reducescatter | allgather | p2p
#   --nranks N       namespaces and ranks (default 4; p2p always uses 2)
#   --rate RATE      tbf rate per veth end, tc syntax in bits (default 5gbit; "none": unshaped)
#   --burst SIZE     tbf burst (default 4mb, scaled up with the rate above 5gbit)
#   --latency T      tbf latency (default 10ms)
#   -d DTYPE         data type (default bf16; -t, the older spelling, still works)
#   -b SIZE -e SIZE -f FACTOR
#                    size sweep (default 64K..256M x4 for collectives, 1M..256M x4 for p2p)
#   --iters N --warmup N
#                    timed and untimed iterations per size (default: agoq-perf's)
#   --format F       the compressed run's format (default int8). Collectives run twice,
#                    with F and with "none", and the two tables are printed side by side
#                    with the busbw ratio F/none per size. "--format none": one run only.
#   --perf PATH      agoq-perf (default: <repo>/build/bin/agoq-perf, else build*/bin)
#   --lib PATH       plugin for agoq-perf --lib (default: agoq-perf's own default)
#   --iperf          first measure iperf3 from node 0 to node 1 (1 stream, and as many
#                    streams as agoq has data sockets) as a sanity line for the link rate
#   --iperf-seconds S  length of each iperf3 run (default 5)
#   --port P         bootstrap TCP port (default 29400; namespaces are private per run)
#   --timeout S      limit for one agoq-perf run of all ranks (default 900)
#   --json           print the merged per-size results as JSON lines instead of tables
#                    (the "# netlab:" lines then go to stderr)
#   --keep           keep the namespaces and logs after the run (prints how to remove them)
#   --clean [ID]     remove namespaces left by --keep or by a killed run: those of run ID,
#                    or without ID those whose netlab process is gone
#
# Collectives: rank 0 serves agoq-perf's bootstrap on 10.77.0.1:PORT and every rank runs
#   agoq-perf OP --rank R --nranks N --addr 10.77.0.1:PORT --dtype DTYPE -b -e -f --format F --json
# p2p: rank 1 listens on 10.77.0.2:PORT and rank 0 sends to it (agoq-perf p2p --rank/--addr).
# If any rank fails, the others are stopped at once and the tails of all rank logs are
# printed. Everything (processes, namespaces, veths, the bridge, logs) is removed on exit,
# on failure and on Ctrl-C, unless --keep. Names carry a per-run id (agoqnl-<pid>-<rand>-),
# so concurrent runs do not clash. Exit status: 0 ok, 1 a run failed, 2 usage or setup error.
#
# Examples (as root):
#   tools/netlab.sh --op p2p --iperf                       agoq's transport vs iperf3, 5 Gbit/s
#   tools/netlab.sh -b 256M -e 256M --iters 5              4-rank bf16 all-reduce, int8 vs none
#   tools/netlab.sh --rate 10gbit --nranks 8 --format int4 -- --inflight 4
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ns_prefix=agoqnl

usage() {
  sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
}

die() {
  echo "netlab: $*" >&2
  exit 2
}

# With --json, stdout carries JSON lines only; everything else goes to stderr.
log() {
  if ((${json:-0})); then
    echo "# netlab: $*" >&2
  else
    echo "# netlab: $*"
  fi
}

# ---- Cleanup of earlier runs (--clean) ------------------------------------------------------
# Namespaces are named agoqnl-<pid of the netlab run>-<random>-<role>.
clean_stale() {
  local want=${1:-} ns id pid n=0 p
  [[ "$(id -u)" == 0 ]] || die "--clean needs root"
  while read -r ns _; do
    [[ "$ns" =~ ^${ns_prefix}-(([0-9]+)-[0-9a-z]+)- ]] || continue
    id=${BASH_REMATCH[1]}
    pid=${BASH_REMATCH[2]}
    if [[ -n "$want" ]]; then
      [[ "$id" == "$want" ]] || continue
    elif kill -0 "$pid" 2>/dev/null; then
      continue # its run is still going
    fi
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      echo "netlab: stopping process $p in $ns"
      kill -KILL "$p" 2>/dev/null
    done
    ip netns del "$ns" && n=$((n + 1)) && echo "netlab: removed $ns"
  done < <(ip netns list 2>/dev/null)
  echo "netlab: removed $n namespace(s)"
}

# ---- Options ----------------------------------------------------------------------------------
op=allreduce
nranks=4
nranks_given=0
rate=5gbit
burst=""
latency=10ms
dtype=bf16
dtype_given=0
minb=""
maxb=""
factor=""
iters=""
warmup=""
format=int8
perf=""
lib=""
want_iperf=0
iperf_secs=5
port=29400
run_timeout=900
json=0
keep=0
extra=()

need() { (($# >= 2)) || die "$1 needs a value (see --help)"; }
while (($# > 0)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --clean) clean_stale "${2:-}"; exit 0 ;;
    --op) need "$@"; op=$2; shift 2 ;;
    --nranks) need "$@"; nranks=$2; nranks_given=1; shift 2 ;;
    --rate) need "$@"; rate=$2; shift 2 ;;
    --burst) need "$@"; burst=$2; shift 2 ;;
    --latency) need "$@"; latency=$2; shift 2 ;;
    -d|--dtype|-t) need "$@"; dtype=$2; dtype_given=1; shift 2 ;; # -t: the older spelling
    -b) need "$@"; minb=$2; shift 2 ;;
    -e) need "$@"; maxb=$2; shift 2 ;;
    -f) need "$@"; factor=$2; shift 2 ;;
    --iters) need "$@"; iters=$2; shift 2 ;;
    --warmup) need "$@"; warmup=$2; shift 2 ;;
    --format) need "$@"; format=$2; shift 2 ;;
    --perf) need "$@"; perf=$2; shift 2 ;;
    --lib) need "$@"; lib=$2; shift 2 ;;
    --iperf) want_iperf=1; shift ;;
    --iperf-seconds) need "$@"; iperf_secs=$2; shift 2 ;;
    --port) need "$@"; port=$2; shift 2 ;;
    --timeout) need "$@"; run_timeout=$2; shift 2 ;;
    --json) json=1; shift ;;
    --keep) keep=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

case "$op" in
  allreduce | reducescatter | allgather) ;;
  p2p)
    ((nranks_given && nranks != 2)) && die "--op p2p runs exactly 2 ranks (got --nranks $nranks)"
    nranks=2
    # With -t the p2p is typed (agoq-perf p2p --dtype): run with --format F and with none.
    ;;
  *) die "--op must be allreduce, reducescatter, allgather or p2p (got '$op')" ;;
esac
check_int() { # option value min max
  if [[ ! "$2" =~ ^[0-9]+$ ]] || ((10#$2 < $3 || 10#$2 > $4)); then
    die "$1 must be an integer in $3..$4 (got '$2')"
  fi
}
check_int --nranks "$nranks" 2 64
check_int --port "$port" 1024 65000
check_int --timeout "$run_timeout" 10 86400
check_int --iperf-seconds "$iperf_secs" 1 3600
[[ "$format" =~ ^[a-z0-9]+$ ]] || die "bad --format '$format'"
if [[ "$op" == p2p ]]; then
  minb=${minb:-1M} maxb=${maxb:-256M} factor=${factor:-4}
else
  minb=${minb:-64K} maxb=${maxb:-256M} factor=${factor:-4}
fi

# The rate in bits per second, for the printed link ceiling and the default burst.
rate_bits=0
if [[ "$rate" != none ]]; then
  rate_bits=$(awk -v r="$rate" 'BEGIN {
    if (match(tolower(r), /^[0-9]+(\.[0-9]+)?[kmgt]?bit$/) == 0) { print 0; exit }
    r = tolower(r); n = r + 0; u = substr(r, length(r) - 3, 1)
    m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : (u == "t") ? 1e12 : 1
    printf "%.0f", n * m }')
  ((rate_bits >= 1000000)) || die "--rate '$rate' must be in bits (e.g. 5gbit, 800mbit; >= 1mbit) or none"
  if [[ -z "$burst" ]]; then
    # 4 MiB reaches 5 Gbit/s here (machine-facts §5: 4.79 measured); keep the same time
    # window above that rate.
    burst=$(awk -v b="$rate_bits" 'BEGIN { k = 4096 * b / 5e9; if (k < 4096) k = 4096;
                                          printf "%dkb", k }')
  fi
fi
link_gbytes=$(awk -v b="$rate_bits" 'BEGIN { printf "%.3f", b / 8e9 }')

# ---- Tools --------------------------------------------------------------------------------------
[[ "$(id -u)" == 0 ]] || die "needs root (ip netns, tc); run it with sudo"
command -v ip >/dev/null 2>&1 || die "ip (iproute2) not found"
command -v tc >/dev/null 2>&1 || die "tc (iproute2) not found"
command -v python3 >/dev/null 2>&1 || die "python3 is needed to read agoq-perf's JSON"
if [[ -z "$perf" ]]; then
  for d in "$repo/build/bin" "$repo"/build*/bin; do
    [[ -x "$d/agoq-perf" ]] && { perf=$d/agoq-perf; break; }
  done
fi
[[ -n "$perf" && -x "$perf" ]] || die "agoq-perf not found (build it, or pass --perf PATH)"
perf=$(cd "$(dirname "$perf")" && pwd)/$(basename "$perf")
if ! "$perf" "$op" -h >/dev/null 2>&1; then
  die "$perf has no '$op' command ($("$perf" "$op" -h 2>&1 | head -n 1))"
fi
if ((want_iperf)); then
  command -v iperf3 >/dev/null 2>&1 || die "--iperf: iperf3 not installed (apt-get install iperf3)"
fi

# ---- State, and the cleanup that undoes it ------------------------------------------------------
run_id="$$-$(printf '%04x' $((RANDOM % 65536)))"
ns_switch=$ns_prefix-$run_id-sw
namespaces=() # created, in order
aux_pids=()   # iperf3 server, timers
run_pids=()   # agoq-perf ranks of the run in progress
logdir=$(mktemp -d "${TMPDIR:-/tmp}/netlab.$run_id.XXXX") || die "cannot create a log directory"

ns_rank() { echo "$ns_prefix-$run_id-r$1"; }
addr_of() { echo "10.77.0.$(($1 + 1))"; }

stop_pids() { # pids...: TERM, up to 3 s, then KILL; reaps them
  local p t
  (($# > 0)) || return 0
  kill -TERM "$@" 2>/dev/null
  for t in $(seq 30); do
    for p in "$@"; do
      kill -0 "$p" 2>/dev/null && break
      p=""
    done
    [[ -z "$p" ]] && break
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null
  for p in "$@"; do wait "$p" 2>/dev/null; done
  return 0
}

# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local rc=$? i
  trap '' INT TERM # a second Ctrl-C must not cut the cleanup short
  stop_pids "${run_pids[@]}" "${aux_pids[@]}"
  if ((keep)); then
    echo "# netlab: kept namespaces ${namespaces[*]:-(none)}"
    echo "# netlab: kept logs in $logdir"
    echo "# netlab: remove them with: $0 --clean $run_id; rm -rf $logdir"
  else
    for ((i = ${#namespaces[@]} - 1; i >= 0; i--)); do
      ip netns del "${namespaces[$i]}" 2>/dev/null
    done
    rm -rf "$logdir"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "netlab: interrupted" >&2; exit 130' INT
trap 'echo "netlab: terminated" >&2; exit 143' TERM

add_ns() {
  ip netns add "$1" || die "cannot create namespace $1"
  namespaces+=("$1")
  ip -n "$1" link set lo up || die "cannot bring up lo in $1"
  # No IPv6 autoconfiguration chatter on the shaped links.
  ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null
  ip netns exec "$1" sysctl -qw net.ipv6.conf.default.disable_ipv6=1 2>/dev/null
}

shape() { # namespace device
  [[ "$rate" == none ]] && return 0
  tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency "$latency" ||
    die "tc tbf on $2 in $1 failed (rate $rate burst $burst latency $latency)"
}

# ---- The network --------------------------------------------------------------------------------
setup_network() {
  local k ns
  add_ns "$ns_switch"
  ip -n "$ns_switch" link add nlbr type bridge || die "cannot create the bridge"
  # Bridged frames need not visit iptables in the switch.
  ip netns exec "$ns_switch" sysctl -qw net.bridge.bridge-nf-call-iptables=0 2>/dev/null
  ip -n "$ns_switch" link set nlbr up || die "cannot bring the bridge up"
  for ((k = 0; k < nranks; k++)); do
    ns=$(ns_rank "$k")
    add_ns "$ns"
    # Created inside the namespaces: nothing appears in the root namespace, not even briefly.
    ip -n "$ns" link add "nlr$k" type veth peer name "nls$k" netns "$ns_switch" ||
      die "cannot create veth nlr$k/nls$k"
    ip -n "$ns" addr add "$(addr_of "$k")/24" dev "nlr$k" || die "cannot address nlr$k"
    ip -n "$ns" link set "nlr$k" up || die "cannot bring nlr$k up"
    ip -n "$ns_switch" link set "nls$k" master nlbr || die "cannot attach nls$k to the bridge"
    ip -n "$ns_switch" link set "nls$k" up || die "cannot bring nls$k up"
    shape "$ns" "nlr$k"          # node k's egress
    shape "$ns_switch" "nls$k"   # node k's ingress
  done
}

# Node 0 reaches every other node: a TCP connect to a closed port is refused at once when
# the path works and times out when it does not.
check_reachability() {
  local k ip rc t
  for ((k = 1; k < nranks; k++)); do
    ip=$(addr_of "$k")
    for t in 1 2 3 4 5; do
      timeout 2 ip netns exec "$(ns_rank 0)" bash -c "exec 3<>/dev/tcp/$ip/9" 2>/dev/null
      rc=$?
      ((rc == 1 || rc == 0)) && break
      sleep 0.5
    done
    ((rc == 1 || rc == 0)) || die "node 0 cannot reach node $k ($ip) through the bridge"
  done
}

describe_network() {
  local ceiling="unshaped"
  [[ "$rate" != none ]] && ceiling="tbf rate $rate burst $burst latency $latency on both ends of each veth = $link_gbytes GB/s per node and direction"
  log "run $run_id: $nranks nodes 10.77.0.1..$(addr_of $((nranks - 1)))/24 on bridge nlbr ($ns_switch)"
  log "links: $ceiling"
}

# ---- iperf3 sanity line ---------------------------------------------------------------------------
agoq_nsocks() {
  local n=${AGOQ_SOCKET_NSOCKS:-0}
  [[ "$n" =~ ^[0-9]+$ ]] || n=0
  if ((n == 0)); then
    n=4
    (($(nproc) < 4)) && n=2 # the plugin's automatic default
  fi
  echo "$n"
}

iperf_results=() # "streams gbits"
run_iperf() {
  local ip srv t p nsocks streams gb
  ip=$(addr_of 1)
  ip netns exec "$(ns_rank 1)" iperf3 -s -B "$ip" -p 5201 >"$logdir/iperf-server.log" 2>&1 &
  srv=$!
  aux_pids+=("$srv")
  for t in $(seq 50); do
    ip netns exec "$(ns_rank 1)" ss -Hltn "sport = :5201" 2>/dev/null | grep -q . && break
    kill -0 "$srv" 2>/dev/null || die "iperf3 server failed: $(cat "$logdir/iperf-server.log")"
    sleep 0.1
  done
  nsocks=$(agoq_nsocks)
  streams=(1)
  ((nsocks != 1)) && streams+=("$nsocks")
  for p in "${streams[@]}"; do
    if ! ip netns exec "$(ns_rank 0)" iperf3 -c "$ip" -p 5201 -P "$p" -l 1M -t "$iperf_secs" -J \
      >"$logdir/iperf-P$p.json" 2>&1; then
      log "iperf3 -P $p failed: $(head -c 300 "$logdir/iperf-P$p.json")"
      continue
    fi
    gb=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"]/1e9))' \
         "$logdir/iperf-P$p.json" 2>/dev/null) || gb=""
    [[ -n "$gb" ]] && iperf_results+=("$p $gb")
  done
  stop_pids "$srv"
  aux_pids=()
}

print_iperf() {
  local r p gb pct
  for r in "${iperf_results[@]}"; do
    read -r p gb <<<"$r"
    pct=$(awk -v g="$gb" -v b="$rate_bits" 'BEGIN { if (b > 0) printf " (%.1f%% of the link)", 100 * g * 1e9 / b }')
    log "iperf3 node 0 -> node 1, -P $p -l 1M, $iperf_secs s: $gb Gbit/s$pct"
  done
}

# ---- agoq-perf runs --------------------------------------------------------------------------------
# Starts one rank in its namespace; `ip netns exec` and `env` exec, so $! is agoq-perf itself.
start_rank() { # tag rank args...
  local tag=$1 k=$2
  shift 2
  ip netns exec "$(ns_rank "$k")" env AGOQ_SOCKET_IFNAME="=nlr$k" "$perf" "$@" \
    >"$logdir/$tag.r$k.out" 2>"$logdir/$tag.r$k.err" &
  run_pids[k]=$!
}

# Waits for every rank of the run; when one fails or the time is up, stops the others.
# Writes $logdir/<tag>.r<k>.rc; returns 0 when all ranks exited 0.
wait_ranks() { # tag
  local tag=$1 k pid rc left deadline failed=0 why=""
  deadline=$(($(date +%s) + run_timeout))
  declare -A rc_of=()
  left=$nranks
  while ((left > 0)); do
    for ((k = 0; k < nranks; k++)); do
      [[ -n "${rc_of[$k]:-}" ]] && continue
      pid=${run_pids[k]}
      kill -0 "$pid" 2>/dev/null && continue
      wait "$pid"
      rc=$?
      rc_of[$k]=$rc
      echo "$rc" >"$logdir/$tag.r$k.rc"
      left=$((left - 1))
      if ((rc != 0 && !failed)); then
        failed=1
        why="rank $k exited with $rc"
      fi
    done
    ((left > 0)) || break
    if ((!failed && $(date +%s) >= deadline)); then
      failed=1
      why="timed out after $run_timeout s"
    fi
    if ((failed)); then
      for ((k = 0; k < nranks; k++)); do
        [[ -n "${rc_of[$k]:-}" ]] && continue
        stop_pids "${run_pids[k]}"
        rc_of[$k]=killed
        echo killed >"$logdir/$tag.r$k.rc"
      done
      break
    fi
    sleep 0.2
  done
  run_pids=()
  if ((failed)); then
    echo "netlab: $tag: FAILED: $why" >&2
    for ((k = 0; k < nranks; k++)); do
      echo "---- rank $k (exit ${rc_of[$k]}), last lines of stderr / stdout:" >&2
      tail -n 8 "$logdir/$tag.r$k.err" >&2
      tail -n 4 "$logdir/$tag.r$k.out" >&2
    done
    return 1
  fi
  return 0
}

sweep_args() {
  sweep=(-b "$minb" -e "$maxb" -f "$factor")
  [[ -n "$iters" ]] && sweep+=(--iters "$iters")
  [[ -n "$warmup" ]] && sweep+=(--warmup_iters "$warmup")
  [[ -n "$lib" ]] && sweep+=(--lib "$lib")
}

run_collective() { # tag format
  local tag=$1 fmt=$2 k addr sweep
  addr=$(addr_of 0):$port
  sweep_args
  local args=("$op" --nranks "$nranks" --addr "$addr" --dtype "$dtype" "${sweep[@]}"
              --format "$fmt" --json "${extra[@]}")
  log "$tag: in each node k: AGOQ_SOCKET_IFNAME==nlr<k> $perf ${args[*]:0:1} --rank <k> ${args[*]:1}"
  # Rank 0 serves the bootstrap: start it first; the others dial it.
  for ((k = 0; k < nranks; k++)); do
    start_rank "$tag" "$k" "${args[0]}" --rank "$k" "${args[@]:1}"
    ((k == 0)) && sleep 0.3
  done
  wait_ranks "$tag"
}

run_p2p() { # tag [typed p2p arguments...]
  local tag=$1 addr sweep
  shift
  addr=$(addr_of 1):$port
  sweep_args
  local args=(--addr "$addr" "${sweep[@]}" --json "$@" "${extra[@]}")
  log "$tag: node 1: AGOQ_SOCKET_IFNAME==nlr1 $perf p2p --rank 1 ${args[*]}"
  log "$tag: node 0: AGOQ_SOCKET_IFNAME==nlr0 $perf p2p --rank 0 ${args[*]}"
  # Rank 1 listens; rank 0 dials it (and retries until it is up).
  start_rank "$tag" 1 p2p --rank 1 "${args[@]}"
  start_rank "$tag" 0 p2p --rank 0 "${args[@]}"
  wait_ranks "$tag"
}

# ---- Tables -----------------------------------------------------------------------------------------
# Reads rank 0's JSON lines. Field names are looked up loosely (busbw*, *l2*, wire*), so the
# table follows agoq-perf's output as it evolves.
render() { # mode files...
  python3 - "$@" <<'EOF'
import json, os, sys

mode, rate_bits, fmt, json_out = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
files = sys.argv[5:]

def rows(path):
    out = []
    try:
        for line in open(path, errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out

def pick(d, names=(), contains=None, scale=None):
    for n in names:
        if n in d and isinstance(d[n], (int, float)):
            return float(d[n])
    if contains:
        for k, v in d.items():
            kl = k.lower()
            if all(c in kl for c in contains) and isinstance(v, (int, float)):
                # GB/s is the unit of the tables; a Gbit/s field is converted.
                if scale and kl.endswith("gbps") and "gbps" in k and "GBps" not in k:
                    return float(v) / 8.0
                return float(v)
    return None

def size_of(d):
    return pick(d, ("size", "bytes", "size_bytes", "nbytes"))

def fmt_num(v, spec):
    return "-" if v is None else format(v, spec)

link_gb = rate_bits / 8e9

if mode == "p2p" and len(files) == 2:
    # Typed p2p: --format F next to --format none, same sizes; speedup = time none / time F.
    runs = [[d for d in rows(f) if d.get("test") == "p2p"] for f in files]
    wires = [[d for d in rows(f) if d.get("test") == "p2p-wire"] for f in files]
    if not runs[0]:
        sys.exit(3)
    if json_out:
        for f, r, w in zip((fmt, "none"), runs, wires):
            for d in r + w:
                print(json.dumps(dict(d, format=f)))
        sys.exit(0)
    b = {int(size_of(d)): d for d in runs[1]}
    print("# %12s | %11s %9s %9s %5s | %11s %9s %5s | %7s" % (
        "size(B)", "time(us)", "GB/s", "rel_l2", "exact", "time(us)", "GB/s", "exact", "speedup"))
    for d in runs[0]:
        s = int(size_of(d))
        e = b.get(s, {})
        ta, tb = pick(d, ("time_us",)), pick(e, ("time_us",))
        print("  %12d | %11s %9s %9s %5s | %11s %9s %5s | %7s" % (
            s, fmt_num(ta, ".1f"), fmt_num(pick(d, ("bw_GBps",)), ".3f"), fmt_num(pick(d, ("rel_l2",)), ".2e"),
            "yes" if d.get("exact") else "no", fmt_num(tb, ".1f"), fmt_num(pick(e, ("bw_GBps",)), ".3f"),
            "yes" if e.get("exact") else "no", fmt_num(tb / ta if ta and tb else None, ".2f")))
    for f, w in zip((fmt, "none"), wires):
        for d in w:
            print("# --format %s: plugin p2p stats: %d quantized messages, %.1f MiB in %.1f MiB on the wire "
                  "(%.3fx fewer bytes)" % (f, d.get("frames", 0), d.get("in_MiB", 0), d.get("wire_MiB", 0),
                                           d.get("reduction", 1)))
    print("# link %.3f GB/s per direction; speedup = time with --format none / time with --format %s"
          % (link_gb, fmt))
    sys.exit(0)

if mode == "p2p":
    data = rows(files[0])
    if not data:
        sys.exit(3)
    iperf = [item.split() for item in os.environ.get("NETLAB_IPERF", "").split(";") if item]
    if json_out:
        for d in data:
            d = dict(d)
            if rate_bits > 0 and "bw_Gbps" in d:
                d["link_fraction"] = d["bw_Gbps"] * 1e9 / rate_bits
            print(json.dumps(d))
        for streams, gbit in iperf:
            print(json.dumps({"test": "iperf3", "streams": int(streams), "bw_Gbps": float(gbit)}))
        sys.exit(0)
    print("# %14s %10s %12s %11s %11s %9s" % ("size(B)", "iters", "time(us)", "bw(GB/s)",
                                                "bw(Gbit/s)", "of link"))
    for d in data:
        gbit = pick(d, ("bw_Gbps",))
        share = "%8.1f%%" % (100 * gbit * 1e9 / rate_bits) if gbit is not None and rate_bits > 0 else "-"
        print("  %14d %10s %12s %11s %11s %9s" % (
            int(size_of(d) or 0), d.get("iters", "-"), fmt_num(pick(d, ("time_us",)), ".1f"),
            fmt_num(pick(d, ("bw_GBps",)), ".3f"), fmt_num(gbit, ".3f"), share))
    # agoq at its largest size next to each iperf3 line measured on the same link.
    last = pick(data[-1], ("bw_Gbps",))
    for streams, gbit in iperf:
        if last and float(gbit) > 0:
            print("# ratio agoq p2p @ %d B / iperf3 -P %s: %.2f" % (
                int(size_of(data[-1]) or 0), streams, last / float(gbit)))
    sys.exit(0)

# Collectives: one or two runs (format F, then none).
runs = [rows(f) for f in files]
if not runs[0]:
    sys.exit(3)
def index(rs):
    return {int(size_of(d)): d for d in rs if size_of(d) is not None}
a = index(runs[0])
b = index(runs[1]) if len(runs) > 1 else {}
def busbw(d):
    return None if d is None else pick(d, ("busbw_GBps", "busbw"), ("busbw",), scale=True)
def metrics(d):
    if d is None:
        return dict(time=None, busbw=None, wire=None, l2=None, maxabs=None, div=None)
    return dict(time=pick(d, ("time_us",), ("time",)),
                busbw=busbw(d),
                wire=pick(d, ("wire_ratio",), ("wire",)),
                l2=pick(d, ("rel_l2", "rel_l2_err", "rel_err"), ("l2",)),
                maxabs=pick(d, ("max_abs", "max_abs_err"), ("abs",)),
                div=pick(d, ("diverged",), ("diverged",)))
sizes = sorted(set(a) | set(b))
if json_out:
    for s in sizes:
        ma, mb = metrics(a.get(s)), metrics(b.get(s))
        out = {"size": s, "format": fmt, fmt: a.get(s)}
        if b:
            out["none"] = b.get(s)
            if ma["busbw"] and mb["busbw"]:
                out["busbw_ratio"] = ma["busbw"] / mb["busbw"]
        print(json.dumps(out))
    sys.exit(0)
two = bool(b)
head = "# %12s | %11s %9s %7s %9s %8s" % ("size(B)", "time(us)", "busbw", "wire", "rel_l2", "diverged")
if two:
    head += " | %11s %9s %8s | %6s" % ("time(us)", "busbw", "diverged", "ratio")
w1 = 11 + 9 + 7 + 9 + 8 + 4
print("# %12s | %-*s" % ("", w1, (" --format " + fmt + " ").center(w1, "-")) +
      (" | %-*s |" % (11 + 9 + 8 + 2, " --format none ".center(11 + 9 + 8 + 2, "-")) if two else ""))
print(head)
for s in sizes:
    ma, mb = metrics(a.get(s)), metrics(b.get(s))
    line = "  %12d | %11s %9s %7s %9s %8s" % (
        s, fmt_num(ma["time"], ".1f"), fmt_num(ma["busbw"], ".3f"), fmt_num(ma["wire"], ".3f"),
        fmt_num(ma["l2"], ".2e"), fmt_num(ma["div"], ".0f"))
    if two:
        ratio = ma["busbw"] / mb["busbw"] if ma["busbw"] and mb["busbw"] else None
        line += " | %11s %9s %8s | %6s" % (fmt_num(mb["time"], ".1f"), fmt_num(mb["busbw"], ".3f"),
                                           fmt_num(mb["div"], ".0f"), fmt_num(ratio, ".2f"))
    print(line)
print("# busbw in GB/s (nccl-tests formula, from the uncompressed size)%s; ratio = busbw %s / busbw none"
      % ((", link %.3f GB/s per node and direction" % link_gb) if link_gb > 0 else "", fmt))
EOF
}

# Fallback when rank 0 printed no JSON (an agoq-perf whose output this script cannot read).
render_raw() { # files...
  if (($# == 2)); then
    pr -m -t -w 200 "$1" "$2"
  else
    cat "$1"
  fi
}

# ---- Main ---------------------------------------------------------------------------------------------
setup_network
check_reachability
describe_network
if ((want_iperf)); then
  run_iperf
fi

status=0
if [[ "$op" == p2p ]] && ((dtype_given)); then
  files=()
  tags=("$format")
  [[ "$format" != none ]] && tags+=(none)
  for t in "${tags[@]}"; do
    # --flow twoway: the sender's profiler also sees a receive of the same shape from its
    # peer, as a pipeline stage does, so the default AGOQ_P2P_SCOPE=pipeline quantizes it.
    if run_p2p "p2p.$t" --dtype "$dtype" --format "$t" --flow twoway; then
      files+=("$logdir/p2p.$t.r0.out")
    else
      status=1
      break
    fi
  done
  if ((status == 0)); then
    log "typed p2p, -t $dtype: node 0 -> node 1 through agoq's net table and its profiler"
    render p2p "$rate_bits" "$format" "$json" "${files[@]}"
    rc=$?
    ((rc == 3)) && { log "rank 0 printed no JSON; its output:"; render_raw "${files[@]}"; }
    ((rc != 0 && rc != 3)) && status=1
  fi
elif [[ "$op" == p2p ]]; then
  if run_p2p p2p; then
    log "p2p: node 0 -> node 1 through agoq's net table"
    print_iperf
    NETLAB_IPERF=$(IFS=';'; echo "${iperf_results[*]}") \
      render p2p "$rate_bits" - "$json" "$logdir/p2p.r0.out"
    rc=$?
    ((rc == 3)) && { log "rank 0 printed no JSON; its output:"; render_raw "$logdir/p2p.r0.out"; }
    ((rc != 0 && rc != 3)) && status=1
  else
    print_iperf
    status=1
  fi
else
  files=()
  tags=("$format")
  [[ "$format" != none ]] && tags+=(none)
  for t in "${tags[@]}"; do
    if run_collective "$op.$t" "$t"; then
      files+=("$logdir/$op.$t.r0.out")
    else
      status=1
      break
    fi
  done
  if ((status == 0)); then
    log "$op, $nranks ranks, -t $dtype"
    print_iperf
    render coll "$rate_bits" "$format" "$json" "${files[@]}"
    rc=$?
    ((rc == 3)) && { log "rank 0 printed no JSON; its output:"; render_raw "${files[@]}"; }
    ((rc != 0 && rc != 3)) && status=1
  else
    print_iperf
  fi
fi
exit "$status"
