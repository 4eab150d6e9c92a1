#!/bin/sh
# collnet.ring_depth.ib (issue 28 item 2): over the verbs emulator, every CollNet connection
# has rings of AGOQ_TP_FEW_DEPTH (16) slots, 132,096 bytes pinned, where a p2p connection of
# the net table keeps one slot per transfer NCCL can post (256: 2,113,536 bytes). A CollNet
# group of n ranks on the mesh holds 2(n-1) connections per rank, one each way per peer (it
# held 4(n-1), one per phase, before they were multiplexed): 3 ranks log 12 connection ends.
# usage: check_ring_depth.sh COLLNET_HARNESS AGOQ_PERF LIB   (the ib test environment set)
set -u
harness=$1 perf=$2 lib=$3
out=$(mktemp "${TMPDIR:-/tmp}/agoq-ring.XXXXXX")
trap 'rm -f "$out"' EXIT
if ! AGOQ_DEBUG=INFO "$harness" --lib "$lib" --scenario quant --nranks 3 --timeout-s 100 > "$out" 2>&1; then
  cat "$out"; echo "FAIL: the CollNet group over verbs failed"; exit 1
fi
few=$(grep -c 'over verbs.*rings of 16 slots: 132096 bytes pinned\|verbs connection from.*rings of 16 slots: 132096 bytes pinned' "$out")
deep=$(grep -c 'rings of 256 slots' "$out")
if [ "$few" -ne 12 ] || [ "$deep" -ne 0 ]; then
  grep 'rings of' "$out"; echo "FAIL: CollNet: $few connections with 16-slot rings (expected 12), $deep with 256"; exit 1
fi
echo "CollNet, 3 ranks: 12 connection ends, rings of 16 slots, 132096 bytes pinned each"
if ! AGOQ_DEBUG=INFO "$perf" p2p -b 64K -e 64K -n 2 -w 0 --lib "$lib" > "$out" 2>&1; then
  cat "$out"; echo "FAIL: p2p over verbs failed"; exit 1
fi
deep=$(grep -c 'rings of 256 slots: 2113536 bytes pinned' "$out")
if [ "$deep" -ne 2 ]; then
  grep 'rings of' "$out"; echo "FAIL: p2p: $deep connections with 256-slot rings (expected 2)"; exit 1
fi
echo "p2p: 2 connections, rings of 256 slots, 2113536 bytes pinned each"
