#!/usr/bin/env bash
# Soak benchmark (not a CI test): N minutes of rounds of mixed CollNet collectives and p2p
# through agoq-perf, each round with a random operation, size range, format and dtype,
# over netlab namespaces when run as root (tools/netlab.sh, unshaped), else over loopback.
# While a round runs, the VmRSS and open fd count of every rank process are sampled every
# second from /proc. Reports rounds, operations, errors (must be 0), the RSS drift of each
# long round's ranks (mean of the last quarter of samples vs the first) and the fd drift.
# Every other round on average runs with AGOQ_SOCKET_INLINE=0 (path=pieces: every payload
# on the data sockets, moved by the progress threads); the others keep the default
# (path=default: payloads up to AGOQ_SOCKET_INLINE inline on the control socket, among them
# every CollNet slice; its auto is every payload on loopback under a non-pacing congestion
# control, 4 MiB elsewhere), so both data paths are soaked.
#
# usage: tools/soak.sh [--minutes M] [--ranks N] [--round-seconds S] [--seed S]
#                      [--perf PATH] [--lib PATH] [--loopback]
#   --minutes M        total duration (default 30)
#   --ranks N          collective ranks (default 3)
#   --round-seconds S  approximate length of one round (default 40)
#   --loopback         do not use netlab even as root
# Exit status: 0 when every round succeeded, 1 otherwise.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
minutes=30 ranks=3 round_s=40 seed=$RANDOM perf="" lib="" loopback=0
while (($#)); do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --round-seconds) round_s=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --loopback) loopback=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "soak: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z $perf ]]; then
  for d in "$repo"/build/bin "$repo"/build*/bin; do [[ -x $d/agoq-perf ]] && { perf=$d/agoq-perf; break; }; done
fi
[[ -x $perf ]] || { echo "soak: agoq-perf not found (--perf)" >&2; exit 2; }
[[ -z $lib ]] && lib=$(cd "$(dirname "$perf")/../lib" && pwd)/libnccl-net-agoq.so
use_netlab=0
if ((loopback == 0)) && [[ $(id -u) == 0 ]] && ip netns list >/dev/null 2>&1; then
  use_netlab=1
else
  echo "# soak: not root or no ip netns: loopback (the netlab variant needs root)"
fi
RANDOM=$seed
work=$(mktemp -d /tmp/agoq-soak.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "# soak: ${minutes} min, ranks=$ranks, seed=$seed, transport=$([[ $use_netlab == 1 ]] && echo netlab || echo loopback), perf=$perf"

# Every descendant process of $1 whose command is agoq-perf.
ranks_of() {
  local root=$1
  ps -e -o pid=,ppid=,comm= | awk -v root="$root" '
    { pid[NR]=$1; ppid[NR]=$2; comm[NR]=$3 }
    END { keep[root]=1; changed=1
          while (changed) { changed=0
            for (i in pid) if (!(pid[i] in keep) && (ppid[i] in keep)) { keep[pid[i]]=1; changed=1 } }
          for (i in pid) if ((pid[i] in keep) && comm[i] == "agoq-perf") print pid[i] }'
}

sizes=(4K 64K 256K 1M 4M 16M 64M)
formats=(int8 int4 fp8e4m3 fp8e5m2 none)
dtypes=(bf16 fp32 fp16)
ops=(allreduce reducescatter allgather p2p)
t_end=$(($(date +%s) + minutes * 60))
rounds=0 errors=0 ops_total=0
samples=$work/samples   # round pid rss_kb fds t
: >"$samples"
while (($(date +%s) < t_end)); do
  op=${ops[RANDOM % 4]}
  fmt=${formats[RANDOM % 5]}
  dt=${dtypes[RANDOM % 3]}
  # One size per round (the ranks' buffers are then allocated once, so RSS drift within a
  # round means a leak, not a bigger size); sizes vary between rounds.
  b=${sizes[RANDOM % 7]} e=$b
  path=default penv=()
  ((RANDOM % 2)) && path=pieces penv=(AGOQ_SOCKET_INLINE=0)
  nsteps=1
  # Iterations sized so a round lasts about round_s on 2 cores (a rough model: 1 GB/s).
  top=$(numfmt --from=iec "$e")
  iters=$(( round_s * 500000000 / (top * nsteps + 1) ))
  ((iters < 5)) && iters=5; ((iters > 2000)) && iters=2000
  log=$work/round$rounds.log
  if [[ $op == p2p ]]; then
    # Typed p2p (the profiler-oracle path, quantized with $fmt) with NCCL's 128 KiB chunks.
    args=(p2p -d "$dt" --format "$fmt" --flow twoway --chunk 128K -b "$b" -e "$e" -f 4 --iters "$iters" -w 2)
    desc="p2p $dt $fmt $b..$e iters=$iters path=$path"
    nops=$(( (nsteps) * (iters + 2) ))
  else
    args=("$op" -d "$dt" -b "$b" -e "$e" -f 4 --iters "$iters" -w 2 --format "$fmt")
    [[ $fmt != none ]] && args+=(--max-rel-l2 0.2)
    args+=(--max-diverged 0)
    desc="$op $dt $fmt $b..$e iters=$iters path=$path"
    nops=$(( nsteps * (iters + 2) ))
  fi
  t0=$(date +%s)
  if ((use_netlab)); then
    if [[ $op == p2p ]]; then
      env "${penv[@]}" "$repo"/tools/netlab.sh --op p2p --rate none --perf "$perf" --lib "$lib" -d "$dt" \
        --format "$fmt" -b "$b" -e "$e" -f 4 --iters "$iters" --warmup 2 -- --chunk 128K >"$log" 2>&1 &
    else
      extra=(); [[ $fmt != none ]] && extra=(-- --max-rel-l2 0.2 --max-diverged 0)
      [[ $fmt == none ]] && extra=(-- --max-diverged 0)
      env "${penv[@]}" "$repo"/tools/netlab.sh --op "$op" --nranks "$ranks" --rate none --perf "$perf" --lib "$lib" \
        -d "$dt" -b "$b" -e "$e" -f 4 --iters "$iters" --warmup 2 --format "$fmt" "${extra[@]}" >"$log" 2>&1 &
    fi
  else
    [[ $op != p2p ]] && args+=(-N "$ranks")
    env "${penv[@]}" AGOQ_SOCKET_IFNAME="${AGOQ_SOCKET_IFNAME:-lo}" "$perf" "${args[@]}" --lib "$lib" >"$log" 2>&1 &
  fi
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    now=$(date +%s)
    for r in $(ranks_of "$pid"); do
      rss=$(awk '/^VmRSS:/ {print $2}' /proc/"$r"/status 2>/dev/null)
      fds=$(ls /proc/"$r"/fd 2>/dev/null | wc -l)
      [[ -n $rss ]] && echo "$rounds $r $rss $fds $now" >>"$samples"
    done
    sleep 1
  done
  wait "$pid"; rc=$?
  dt_s=$(($(date +%s) - t0))
  if ((rc != 0)); then
    errors=$((errors + 1))
    echo "# soak: round $rounds FAILED (rc=$rc): $desc"; tail -5 "$log" | sed 's/^/#   /'
  else
    ops_total=$((ops_total + nops))
    echo "# soak: round $rounds ok in ${dt_s}s: $desc"
  fi
  rounds=$((rounds + 1))
done

# Drift per rank process with at least 8 samples after its first 3 (start-up: bootstrap,
# connections, buffers): mean of the last quarter minus the first.
awk -v rounds="$rounds" -v errors="$errors" -v ops="$ops_total" -v minutes="$minutes" '
  { k=$1" "$2; seen[k]++; if (seen[k] <= 3) next; n[k]++; rss[k, n[k]]=$3; fd[k, n[k]]=$4 }
  END {
    procs=0; worst=0; worstfd=0; sum=0; cnt=0
    for (k in n) {
      if (n[k] < 8) continue
      q=int(n[k]/4); a=0; b=0; fa=0; fb=0
      for (i=1; i<=q; i++) { a+=rss[k,i]; fa+=fd[k,i] }
      for (i=n[k]-q+1; i<=n[k]; i++) { b+=rss[k,i]; fb+=fd[k,i] }
      d=(b-a)/q; df=(fb-fa)/q; procs++; sum+=d; cnt++
      if (d > worst) worst=d
      if (df > worstfd) worstfd=df
    }
    printf "soak: minutes=%s rounds=%d operations=%d errors=%d\n", minutes, rounds, ops, errors
    printf "soak: rank processes with >=8 samples after start-up: %d; RSS drift (last vs first quarter) mean %+.0f KiB, worst %+.0f KiB; fd drift worst %+.1f\n", procs, (cnt ? sum/cnt : 0), worst, worstfd
  }' "$samples"
((errors == 0))
