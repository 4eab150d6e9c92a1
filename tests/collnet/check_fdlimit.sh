#!/bin/sh
# collnet.fdlimit (issue 28): a CollNet group of 16 ranks holds 2(n-1) = 30 connections per
# rank (one each way per peer). Below the descriptors it needs (with room for NCCL and the application):
#  - hard limit too low: every rank fails at once with an error naming RLIMIT_NOFILE and the
#    count, before any connection (it used to be handshake timeouts on other ranks);
#  - only the soft limit low: the plugin raises it toward the hard one (an INFO line naming
#    the group) and the group forms, bits equal on every rank.
# usage: check_fdlimit.sh AGOQ_PERF LIB
set -u
perf=$1 lib=$2
out=$(mktemp "${TMPDIR:-/tmp}/agoq-fdlimit.XXXXXX")
trap 'rm -f "$out"' EXIT
run() {
  "$perf" allreduce -N 16 -d bf16 -b 64K -e 64K --iters 1 -w 0 --format int8 --max-diverged 0 --lib "$lib" \
    > "$out" 2>&1
}
hard=$(ulimit -Hn)
# 1. soft = hard = 200.
if (ulimit -n 200 && run); then
  cat "$out"; echo "FAIL: 16 ranks formed a group under a hard limit of 200 descriptors"; exit 1
fi
if ! grep -q "a CollNet group of 16 ranks (30 connections to 15 peers) needs 30 file descriptors.*RLIMIT_NOFILE" "$out"; then
  cat "$out"; echo "FAIL: no error naming RLIMIT_NOFILE and what the group needs"; exit 1
fi
if grep -q -i "timed out\|handshake" "$out"; then
  cat "$out"; echo "FAIL: a handshake failure or timeout instead of the limit"; exit 1
fi
echo "hard limit 200: refused by name, as expected"
# 2. soft = 200, hard as it is (it must leave room: 16 processes x about 330).
if [ "$hard" != unlimited ] && [ "$hard" -lt 1024 ]; then echo "hard limit $hard: step 2 skipped"; exit 0; fi
if ! (ulimit -Sn 200 && AGOQ_DEBUG=INFO run); then
  cat "$out"; echo "FAIL: the group did not form with the soft limit at 200 and the hard one at $hard"; exit 1
fi
if ! grep -q "raised this process's RLIMIT_NOFILE soft limit from 200 to .*a CollNet group of 16 ranks" "$out"; then
  cat "$out"; echo "FAIL: no INFO line about the raised soft limit"; exit 1
fi
echo "soft limit 200, hard $hard: raised and formed"
