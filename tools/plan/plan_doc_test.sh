#!/bin/sh
# Runs every example of a document as written and compares the output with what the
# document shows. An example is a fenced block whose first line is "$ agoq-plan ARGS"; the
# rest of the block is the expected output, byte for byte.
#   plan_doc_test.sh AGOQ_PLAN DOC.md
set -eu
plan=$1 doc=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Split the examples into tmp/N.cmd (the arguments) and tmp/N.expected.
awk -v dir="$tmp" '
  /^```/ { if (inblock) { inblock = 0; if (ex) close(dir "/" n ".expected"); ex = 0; next } inblock = 1; first = 1; next }
  inblock && first { first = 0; if ($0 ~ /^\$ agoq-plan /) { ex = 1; n++; sub(/^\$ agoq-plan /, ""); print > (dir "/" n ".cmd"); close(dir "/" n ".cmd"); printf "" > (dir "/" n ".expected") } next }
  inblock && ex { print >> (dir "/" n ".expected") }
' "$doc"
count=0
fail=0
for cmd in "$tmp"/*.cmd; do
  [ -e "$cmd" ] || break
  count=$((count + 1))
  base=${cmd%.cmd}
  # shellcheck disable=SC2046
  "$plan" $(cat "$cmd") >"$base.out" 2>&1 || true
  if ! diff -u "$base.expected" "$base.out"; then
    echo "plan_doc_test: example $(basename "$base") (agoq-plan $(cat "$cmd")) differs from the document" >&2
    fail=1
  fi
done
if [ "$count" -eq 0 ]; then
  echo "plan_doc_test: no example in $doc" >&2
  exit 1
fi
[ "$fail" -eq 0 ] || exit 1
echo "plan_doc_test: $count examples of $(basename "$doc") reproduced"
