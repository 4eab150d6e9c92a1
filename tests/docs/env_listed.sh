#!/usr/bin/env bash
# Every environment variable the plugin reads is documented: an AGOQ_* parameter of
# plugin/core/agoq_params.def, or a row of plugin/core/agoq_env_other.def (which feeds
# docs/configuration.md and agoq-info -c). Fails naming the variable read but not listed.
# usage: env_listed.sh SOURCE_DIR
set -euo pipefail
src=$1
listed=$( {
  sed -n 's/^AGOQ_PARAM(\([A-Z0-9_]*\),.*/AGOQ_\1/p' "$src/plugin/core/agoq_params.def"
  sed -n 's/^AGOQ_PARAM(.*"\(NCCL_[A-Z0-9_]*\)",$/\1/p' "$src/plugin/core/agoq_params.def"
  sed -n 's/^AGOQ_ENV_OTHER("\([A-Z0-9_]*\)".*/\1/p' "$src/plugin/core/agoq_env_other.def"
} | sort -u)
# Variables named in a read: getenv("X") and agoq_nccl_*("X", ...), in the plugin and the
# tools' shared loader.
read_vars=$(grep -rhoE '(getenv|agoq_nccl_[a-z_]+)\("[A-Z][A-Z0-9_]*"' \
              "$src/plugin" "$src/topology" "$src/kernels" "$src/tools/common" --include='*.c' |
            sed -E 's/.*\("([A-Z0-9_]*)"/\1/' | sort -u)
n=$(wc -w <<<"$read_vars")
if ((n < 5)); then
  echo "env_listed: found only $n variables read; the pattern no longer matches the code" >&2
  exit 1
fi
missing=$(comm -23 <(echo "$read_vars") <(echo "$listed"))
if [[ -n "$missing" ]]; then
  echo "env_listed: read by the code but documented nowhere (add to plugin/core/agoq_env_other.def):" >&2
  echo "$missing" >&2
  exit 1
fi
echo "env_listed: all $n variables read by the code are documented"
