#!/bin/sh
# Checks what the built plugin exposes to the dynamic linker.
#   check_exports.sh symbols NM LIB   defined dynamic symbols are exactly the plugin tables
#                                     (net, collnet, profiler, tuner)
#   check_exports.sh needed READELF LIB   no NEEDED entry for NCCL, CUDA or hwloc libraries
# NCCL resolves the tables by name with RTLD_LOCAL; anything else exported could clash
# with the application, and a NEEDED libnccl/libcuda would stop the library loading on
# hosts without them (or load a second NCCL). hwloc is dlopened for the same reason.
set -eu

usage() {
  echo "usage: $0 symbols NM LIB | needed READELF LIB" >&2
  exit 2
}

[ $# -eq 3 ] || usage
mode=$1
tool=$2
lib=$3
[ -f "$lib" ] || { echo "FAIL: $lib does not exist" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case $mode in
symbols)
  v=6
  while [ "$v" -le 12 ]; do
    echo "ncclNetPlugin_v$v"
    echo "ncclCollNetPlugin_v$v"
    v=$((v + 1))
  done >"$tmp/expected.in"
  # The type oracle and the tuner live in the same library (NCCL 2.28.3+ looks there).
  printf '%s\n' ncclProfiler_v5 ncclProfiler_v6 ncclTunerPlugin_v5 ncclTunerPlugin_v6 >>"$tmp/expected.in"
  LC_ALL=C sort "$tmp/expected.in" >"$tmp/expected"
  "$tool" -D --defined-only "$lib" >"$tmp/nm"
  awk 'NF { print $NF }' "$tmp/nm" | LC_ALL=C sort >"$tmp/actual"
  if ! diff -u "$tmp/expected" "$tmp/actual" >"$tmp/diff"; then
    echo "FAIL: defined dynamic symbols of $lib differ from the plugin tables" >&2
    echo "(- missing, + unexpected)" >&2
    tail -n +3 "$tmp/diff" | grep '^[-+]' >&2 || true
    exit 1
  fi
  echo "OK: $(wc -l <"$tmp/actual") symbols, exactly ncclNetPlugin_v6..v12, ncclCollNetPlugin_v6..v12, ncclProfiler_v5..v6, ncclTunerPlugin_v5..v6"
  ;;
needed)
  "$tool" -d "$lib" >"$tmp/dyn"
  sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' "$tmp/dyn" >"$tmp/needed"
  # Every shared library here needs at least libc; none means readelf output we did not parse.
  [ -s "$tmp/needed" ] || { echo "FAIL: no NEEDED entries parsed from $lib" >&2; exit 1; }
  if grep -E '^(libnccl|libcudart|libcuda|libhwloc)([.-]|$)' "$tmp/needed" >"$tmp/bad"; then
    echo "FAIL: $lib must not depend on:" >&2
    cat "$tmp/bad" >&2
    exit 1
  fi
  echo "OK: NEEDED = $(tr '\n' ' ' <"$tmp/needed")"
  ;;
*)
  usage
  ;;
esac
