#!/usr/bin/env bash
# A polluted environment: every AGOQ_* parameter of plugin/core/agoq_params.def, every NCCL
# variable agoq reads (the parameters' NCCL fallbacks and the NCCL_* rows of
# plugin/core/agoq_env_other.def) and the other variables the plugin and its tools read
# (agoq_env_other.def rows without '*' that are not "never the plugin": AGOQ_DEBUG,
# AGOQ_PLUGIN_PATH) set to a valid value other than the default, as a user's shell might
# have them. The test suite must pass under it: ctest clears them (tests/agoq_test_env.cmake)
# and each test sets what it needs.
#
#   tools/polluted-env.sh [--build DIR]                 print the 'export NAME=value' lines
#   tools/polluted-env.sh [--build DIR] -- COMMAND...   run COMMAND under them
#
# --build DIR: the build whose bin/agoq-info checks the set and whose soft-RC emulator
# (lib/libagoq-ibv-emu.so) AGOQ_IB_LIBRARY names (default: build-ci).
# Fails (exit 1), before running anything, when a variable of the tables has no polluted
# value here (add one when a parameter is added) or when `agoq-info -c` does not accept the
# set (an invalid value, an unknown AGOQ_* name). A value here for a variable the tables no
# longer list is left out, with a note on stderr.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=build-ci
if (($# >= 2)) && [[ $1 == --build ]]; then
  build=$2
  shift 2
fi
if (($# > 0)) && [[ $1 != -- ]]; then
  sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  [[ $1 == -h || $1 == --help ]] && exit 0
  exit 2
fi
(($# > 0)) && shift # --
[[ $build == /* ]] || build=$repo/$build
info=$build/bin/agoq-info
emu=$build/lib/libagoq-ibv-emu.so
plugin=$build/lib/libnccl-net-agoq.so
for f in "$info" "$emu" "$plugin"; do
  [[ -e $f ]] || { echo "polluted-env: $f missing (build $build first)" >&2; exit 1; }
done

# Valid, not the default, and the plugin stays usable on loopback (over the soft-RC
# emulator for the verbs transport).
declare -A val=(
  [AGOQ_SOCKET_IFNAME]=lo
  [AGOQ_SOCKET_FAMILY]=ipv4
  [AGOQ_SOCKET_NSOCKS]=3
  [AGOQ_SOCKET_NTHREADS]=3
  [AGOQ_PLACEMENT]=none
  [AGOQ_SOCKET_MIN_CHUNK]=32K
  [AGOQ_SOCKET_INLINE]=8K
  [AGOQ_SOCKET_SNDBUF]=512K
  [AGOQ_SOCKET_RCVBUF]=512K
  [AGOQ_SOCKET_CC]=system
  [AGOQ_HANDSHAKE_TIMEOUT_MS]=5000
  [AGOQ_MAX_PENDING_CONNECTIONS]=64
  [AGOQ_KEEPALIVE_S]=30
  [AGOQ_TIMEOUT_S]=600
  [AGOQ_TRANSPORT]=ib
  [AGOQ_IB_LIBRARY]=$emu
  [AGOQ_IB_HCA]==emu0:1
  [AGOQ_IB_GID_INDEX]=0
  [AGOQ_IB_ADDR_FAMILY]=any
  [AGOQ_IB_ROCE_VERSION]=1
  [AGOQ_IB_TC]=106
  [AGOQ_IB_SL]=3
  [AGOQ_IB_TIMEOUT]=18
  [AGOQ_IB_RETRY_CNT]=5
  [AGOQ_IB_QPS_PER_CONNECTION]=2
  [AGOQ_FORMAT]=int4
  [AGOQ_CODEC_MBPS]=2500
  [AGOQ_BLOCK]=64
  [AGOQ_MIN_BYTES]=128K
  [AGOQ_P2P_FORMAT]=int8
  [AGOQ_P2P_SCOPE]=all
  [AGOQ_STATS]=1
  [AGOQ_STATS_INTERVAL_S]=3600
  [AGOQ_STATS_FILE]=/dev/null
  [AGOQ_COLLNET_CHUNK]=512K
  [AGOQ_COLLNET_CODEC_THREADS]=1
  [AGOQ_COLLNET_ASSIST]=0
  [AGOQ_COLLNET_IO_THREADS]=2
  [AGOQ_COLLNET_GPU]=0
  [AGOQ_COLLNET_TIMEOUT_S]=60
  [AGOQ_COLLNET_GRID]=4x2
  [AGOQ_COLLNET_PARTIALS]=quantized
  [AGOQ_GPU]=off
  [AGOQ_GPU_CODEC_MBPS]=500000
  [AGOQ_GPU_PINNED_MAX]=96M
  [AGOQ_GPU_STAGING]=4M
  [AGOQ_DEBUG]=INFO
  [AGOQ_PLUGIN_PATH]=$plugin
  [NCCL_SOCKET_IFNAME]=lo
  [NCCL_IB_HCA]=emu
  [NCCL_IB_GID_INDEX]=1
  [NCCL_IB_ROCE_VERSION_NUM]=1
  [NCCL_IB_TC]=41
  [NCCL_IB_SL]=1
  [NCCL_IB_TIMEOUT]=22
  [NCCL_IB_RETRY_CNT]=6
  [NCCL_IB_QPS_PER_CONNECTION]=4
  [NCCL_P2P_LL_THRESHOLD]=65536
  [NCCL_SOCKET_RETRY_CNT]=5
  [NCCL_SOCKET_RETRY_SLEEP_MSEC]=20
  [NCCL_COLLNET_ENABLE]=1
  [NCCL_BUFFSIZE]=8388608
  [NCCL_PROFILER_PLUGIN]=none
  [NCCL_DEBUG]=INFO
)

# The names the tables list, by the same rules as tests/agoq_test_env.cmake.
params=$repo/plugin/core/agoq_params.def
other=$repo/plugin/core/agoq_env_other.def
names=()
while IFS= read -r line; do
  names+=("$line")
done < <(
  # A row's first line: AGOQ_PARAM(ID, TYPE, DEFAULT, MIN, MAX, CHOICES, NCCL_FALLBACK, ...
  sed -n 's/^AGOQ_PARAM(\([A-Z0-9_]*\),.*/AGOQ_\1/p' "$params"
  tr '\n' ' ' <"$params" | grep -o 'AGOQ_PARAM([^"]*"[^"]*"[^"]*\("[^"]*"\)\{0,1\}[^"]*"\(NCCL_[A-Z0-9_]*\)"' |
    sed 's/.*"\(NCCL_[A-Z0-9_]*\)"$/\1/'
  # AGOQ_ENV_OTHER("NAME", "READ_BY", ...: every NCCL_* row, and the rows without '*' whose
  # reader is not "never the plugin"
  sed -n 's/^AGOQ_ENV_OTHER("\(NCCL_[A-Z0-9_]*\)".*/\1/p' "$other"
  grep '^AGOQ_ENV_OTHER("AGOQ_[A-Z0-9_]*",' "$other" | grep -v 'never the plugin' |
    sed 's/^AGOQ_ENV_OTHER("\([A-Z0-9_]*\)".*/\1/'
)
nparams=$(grep -c '^AGOQ_PARAM(' "$params")
nparsed=$(sed -n 's/^AGOQ_PARAM(\([A-Z0-9_]*\),.*/\1/p' "$params" | wc -l)
if ((nparams == 0 || nparams != nparsed)); then
  echo "polluted-env: $params: $nparams rows, $nparsed parsed (row format changed?)" >&2
  exit 1
fi
declare -A listed=()
bad=0
for n in "${names[@]}"; do
  listed[$n]=1
  if [[ -z ${val[$n]+x} ]]; then
    echo "polluted-env: $n (plugin/core/agoq_*.def) has no polluted value in ${BASH_SOURCE[0]}" >&2
    bad=1
  fi
done
((bad == 0)) || exit 1
# A value for a name the tables no longer list (a parameter removed or renamed, or one
# added here before the table has it) is not set: agoq-info -c would call it unknown.
for n in "${!val[@]}"; do
  if [[ -z ${listed[$n]+x} ]]; then
    echo "polluted-env: $n is in neither table (removed or renamed?): not set" >&2
    unset "val[$n]"
  fi
done

for n in "${!val[@]}"; do
  export "$n=${val[$n]}"
done

# Accepted as a whole: every value valid, no unknown AGOQ_* name (the caller's included).
if ! out=$("$info" -c 2>&1 >/dev/null); then
  echo "polluted-env: $info -c refuses the polluted environment:" >&2
  printf '%s\n' "$out" >&2
  exit 1
fi

if (($# == 0)); then
  for n in $(printf '%s\n' "${!val[@]}" | sort); do
    printf 'export %s=%q\n' "$n" "${val[$n]}"
  done
  exit 0
fi
echo "polluted-env: ${#val[@]} variables set (tools/polluted-env.sh --build $build lists them)" >&2
exec "$@"
