#!/usr/bin/env bash
# From a fresh checkout to a first measurement, in one command:
#   installs the build dependencies, configures and builds ./build, shows what the plugin
#   sees (agoq-info), measures point-to-point bandwidth through the plugin over the
#   loopback interface (agoq-perf p2p) and runs the main demo: a 4-rank bf16 all-reduce
#   quantized to int8 on the wire (agoq-perf allreduce). Safe to re-run.
#
# Environment knobs (all optional):
#   AGOQ_JOBS              parallel build jobs (default: nproc)
#   AGOQ_SOCKET_IFNAME     interface for the demo (default: lo)
#   AGOQ_SKIP_DEPS=1       do not check/install packages
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
jobs=${AGOQ_JOBS:-$(nproc)}

# Prints the command, then runs it, so the output doubles as a how-to.
run() {
  echo
  echo "+ $*"
  "$@"
}

if [[ "${AGOQ_SKIP_DEPS:-0}" != 1 ]]; then
  run tools/install-deps.sh
fi

run cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
run cmake --build build -j "$jobs"

plugin=$repo/build/lib/libnccl-net-agoq.so
if [[ ! -f "$plugin" ]]; then
  echo "quickstart: $plugin was not built" >&2
  exit 1
fi
echo
echo "quickstart: built $plugin"

export AGOQ_SOCKET_IFNAME=${AGOQ_SOCKET_IFNAME:-lo}
if [[ -x build/bin/agoq-info ]]; then
  run build/bin/agoq-info
fi
if [[ ! -x build/bin/agoq-perf ]]; then
  echo "quickstart: build/bin/agoq-perf was not built" >&2
  exit 1
fi
echo
echo "quickstart: point-to-point bandwidth through the plugin, 1 MiB .. 256 MiB, over $AGOQ_SOCKET_IFNAME"
run env AGOQ_SOCKET_IFNAME="$AGOQ_SOCKET_IFNAME" build/bin/agoq-perf p2p -b 1M -e 256M -f 4
# The main demo: a 4-rank bf16 all-reduce through the plugin's CollNet table, quantized to
# int8 (block 128) on the wire; the table shows bandwidth, wire-bytes ratio, the error
# against an fp64 reference and `diverged` (elements whose bits differ between ranks: 0).
run env AGOQ_SOCKET_IFNAME="$AGOQ_SOCKET_IFNAME" build/bin/agoq-perf allreduce -N 4 -d bf16 -b 64K -e 64M -f 4 --format int8

cat <<EOF

quickstart: done. To use the plugin with NCCL:
  export NCCL_NET_PLUGIN=$plugin   # or NCCL_NET_PLUGIN=agoq with $repo/build/lib in LD_LIBRARY_PATH
  export NCCL_NET=AGOQ                 # fail instead of silently falling back to IB/Socket
Run the full test suite with: tools/test.sh
EOF
