#!/usr/bin/env bash
# Regenerates docs/configuration.md from the parameter table (plugin/core/agoq_params.def).
# usage: tools/gen-config-doc.sh BUILD_DIR
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build_dir=$1
src_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cmake --build "$build_dir" --target agoq-info
tmp=$(mktemp "$src_dir/docs/.configuration.md.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# Written to a temporary file first so a failing agoq-info never leaves a truncated doc.
"$build_dir/bin/agoq-info" -c --markdown > "$tmp"
chmod 644 "$tmp"
mv "$tmp" "$src_dir/docs/configuration.md"
trap - EXIT
echo "wrote $src_dir/docs/configuration.md"
