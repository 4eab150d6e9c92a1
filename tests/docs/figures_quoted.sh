#!/usr/bin/env bash
# Checks that measured figures quoted in the docs are the ones tools/figures.sh recorded.
# Runs no benchmark.
#
#   figures_quoted.sh ROOT          check ROOT/README.md, ROOT/docs/*.md, ROOT/docs/figures/*.md
#   figures_quoted.sh --selftest    check that the checker fails on broken copies and headers
#
# 1. Every docs/figures/*.md names its command, commit, date and machine, as the lines
#    "- command: ...", "- commit: <hex>[-dirty]", "- date: ...", "- machine: ...".
# 2. A table in README.md or docs/*.md preceded by the line
#        <!-- figures: docs/figures/<group>.md table <name> -->
#    claims to be copied from that file; it must equal, line for line, the block that follows
#    "<!-- table: <name> -->" there (a markdown table: the consecutive lines starting with
#    "|"; or a fenced block, from its ``` to the closing ```).
# 3. Every docs/figures/<group>.md that README.md or docs/*.md names exists.
set -uo pipefail

# block FILE MARKER: prints the table or fenced block on the lines after the line MARKER.
block() {
  awk -v m="$2" '
    !on && $0 == m {on = 1; next}
    on == 1 && /^```/ {fence = 1; on = 2; print; next}
    on == 1 && /^\|/ {on = 2}
    on == 1 {exit}
    on == 2 && fence {print; if (/^```/) exit; next}
    on == 2 && /^\|/ {print; next}
    on == 2 {exit}
  ' "$1"
}

check() { # ROOT -> prints one line per problem, exits 1 if any
  local root=$1 bad=0 f key doc line path name want got
  local figs=("$root"/docs/figures/*.md)
  if [[ ! -e "${figs[0]}" ]]; then echo "no figure files under $root/docs/figures"; return 1; fi
  for f in "${figs[@]}"; do
    for key in command commit date machine; do
      local re="^- $key: ."
      [[ $key == commit ]] && re='^- commit: [0-9a-f]{7,40}(-dirty)?$'
      if ! grep -Eq "$re" "$f"; then
        echo "${f#"$root"/}: no '- $key:' line (tools/figures.sh writes one)"; bad=1
      fi
    done
    if ! grep -q '^<!-- table: [A-Za-z0-9_-]* -->$' "$f"; then
      echo "${f#"$root"/}: no '<!-- table: NAME -->' marker"; bad=1
    fi
  done
  for doc in "$root/README.md" "$root"/docs/*.md; do
    [[ -f "$doc" ]] || continue
    # Names of figure files must resolve.
    while IFS= read -r path; do
      if [[ ! -f "$root/$path" ]]; then echo "${doc#"$root"/}: names $path, which does not exist"; bad=1; fi
    done < <(grep -o 'docs/figures/[A-Za-z0-9_.-]*\.md' "$doc" | sort -u)
    while IFS= read -r line; do
      if [[ ! "$line" =~ ^'<!-- figures: '(docs/figures/[A-Za-z0-9_.-]+\.md)' table '([A-Za-z0-9_-]+)' -->'$ ]]; then
        echo "${doc#"$root"/}: malformed marker '$line' (want '<!-- figures: docs/figures/G.md table NAME -->')"; bad=1; continue
      fi
      path=${BASH_REMATCH[1]} name=${BASH_REMATCH[2]}
      [[ -f "$root/$path" ]] || continue  # reported above
      want=$(block "$root/$path" "<!-- table: $name -->")
      got=$(block "$doc" "$line")
      if [[ -z "$want" ]]; then
        echo "${doc#"$root"/}: $path has no table '$name'"; bad=1
      elif [[ -z "$got" ]]; then
        echo "${doc#"$root"/}: no table right after '$line'"; bad=1
      elif [[ "$want" != "$got" ]]; then
        echo "${doc#"$root"/}: the table after '$line' differs from $path (rerun tools/figures.sh or copy the table again):"
        diff <(echo "$want") <(echo "$got") | sed 's/^/    /'
        bad=1
      fi
    done < <(grep '^<!-- figures:' "$doc")
  done
  return $bad
}

selftest() {
  local t rc=0
  t=$(mktemp -d /tmp/agoq-figtest.XXXXXX)
  trap 'rm -rf "$t"' RETURN
  mkdir -p "$t/docs/figures"
  cat >"$t/docs/figures/g.md" <<'EOF'
# Figures: g

- command: `tools/figures.sh g`
- commit: 0123abc-dirty
- date: 2026-12-03T00:00:00Z
- machine: Linux 6.1 x86_64; 2 CPUs

<!-- table: t -->
| a | b |
|---|---|
| 1.00 | 2.00 |

<!-- table: f -->
```
round 1: 3.0
```
EOF
  printf '%s\n' '# x' '<!-- figures: docs/figures/g.md table t -->' '| a | b |' '|---|---|' '| 1.00 | 2.00 |' '' \
    '<!-- figures: docs/figures/g.md table f -->' '```' 'round 1: 3.0' '```' >"$t/README.md"
  check "$t" >/dev/null || { echo "selftest: a faithful copy was rejected:"; check "$t"; rc=1; }
  sed -i 's/| 1.00 | 2.00 |/| 1.00 | 2.10 |/' "$t/README.md"
  check "$t" >/dev/null && { echo "selftest: an edited table was accepted"; rc=1; }
  sed -i 's/| 1.00 | 2.10 |/| 1.00 | 2.00 |/; s/round 1: 3.0/round 1: 3.1/' "$t/README.md"
  check "$t" >/dev/null && { echo "selftest: an edited fenced block was accepted"; rc=1; }
  sed -i 's/round 1: 3.1/round 1: 3.0/' "$t/README.md"
  check "$t" >/dev/null || { echo "selftest: restoring did not pass"; rc=1; }
  for key in command commit date machine; do
    cp "$t/docs/figures/g.md" "$t/g.bak"
    sed -i "/^- $key: /d" "$t/docs/figures/g.md"
    check "$t" >/dev/null && { echo "selftest: a figure file without '- $key:' was accepted"; rc=1; }
    cp "$t/g.bak" "$t/docs/figures/g.md"
  done
  sed -i 's/table t -->/table missing -->/' "$t/README.md"
  check "$t" >/dev/null && { echo "selftest: a marker naming a missing table was accepted"; rc=1; }
  sed -i 's/table missing -->/table t -->/; s#docs/figures/g.md table f#docs/figures/h.md table f#' "$t/README.md"
  check "$t" >/dev/null && { echo "selftest: a marker naming a missing file was accepted"; rc=1; }
  ((rc == 0)) && echo "selftest: ok"
  return $rc
}

case "${1:-}" in
  --selftest) selftest ;;
  "") echo "usage: figures_quoted.sh ROOT | --selftest" >&2; exit 2 ;;
  *) if check "$1"; then echo "figures: every quoted table matches docs/figures, every figure file has its header"; else exit 1; fi ;;
esac
