#!/bin/sh
# Golden test of port and GID choice: agoq-info -c's verbs section over the soft-RC
# emulator with one fixture (devices, ports, GID tables taken from reported failures) and
# the given settings, compared with the expected text. The RLIMIT_MEMLOCK line depends on
# the machine and is left out, as is whether nvidia-peermem is loaded.
#   golden_ports.sh AGOQ_INFO EMU_LIB FIXTURE EXPECTED [VAR=VALUE...]
#   GOLDEN_UPDATE=1 rewrites EXPECTED instead of comparing.
set -eu
info=$1 emu=$2 fixture=$3 expected=$4
shift 4
out=$(mktemp)
trap 'rm -f "$out"' EXIT
env AGOQ_IB_LIBRARY="$emu" AGOQ_IBV_EMU_FIXTURE="$fixture" "$@" "$info" -c >"$out.full" 2>/dev/null || true
sed -n '/^verbs ports/,$p' "$out.full" | grep -v -e 'RLIMIT_MEMLOCK' -e 'nvidia-peermem' | sed "s|$emu|EMU|" >"$out"
rm -f "$out.full"
if [ "${GOLDEN_UPDATE:-0}" = 1 ]; then
  cp "$out" "$expected"
  exit 0
fi
if ! diff -u "$expected" "$out"; then
  echo "golden_ports: output differs from $expected (GOLDEN_UPDATE=1 rewrites it)" >&2
  exit 1
fi
echo "golden_ports: $(basename "$expected") matches"
