#!/bin/sh
# What agoq-info says is in effect, and what its pre-launch check refuses (issue 26):
#   info_effect.sh AGOQ_INFO PLUGIN IBV_EMU
# Each case runs with a cleared AGOQ_* environment plus its own settings.
info=$1 plugin=$2 emu=$3 gpu_plugin=${4:-}
fail=0
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

# run EXPECTED_RC VAR=VALUE... -- ARGS...: agoq-info under exactly these AGOQ_* settings.
run() {
  want=$1
  shift
  set -- "$@"
  vars=""
  while [ "$1" != "--" ]; do vars="$vars $1"; shift; done
  shift
  # shellcheck disable=SC2046 # the names of every AGOQ_* variable, unset for the run
  env $(env | sed -n 's/^\(AGOQ_[A-Za-z0-9_]*\)=.*/-u \1/p') -u NCCL_SOCKET_IFNAME -u NCCL_DEBUG \
    AGOQ_SOCKET_IFNAME=lo $vars "$info" "$@" >"$out" 2>"$err"
  rc=$?
  case_name="agoq-info $*:$vars"
  if [ "$rc" != "$want" ]; then
    echo "FAIL: $case_name exited $rc, expected $want"
    cat "$out" "$err"
    fail=1
  fi
}
# has FILE PATTERN: grep -E, else a failure naming the case.
has() {
  if ! grep -Eq -- "$2" "$1"; then
    echo "FAIL: $case_name: no line matches /$2/"
    cat "$1"
    fail=1
  fi
}
hasnt() {
  if grep -Eq -- "$2" "$1"; then
    echo "FAIL: $case_name: a line matches /$2/:"
    grep -E -- "$2" "$1"
    fail=1
  fi
}
# once FILE PATTERN: exactly one line matches.
once() {
  n=$(grep -Ec -- "$2" "$1")
  if [ "$n" != 1 ]; then
    echo "FAIL: $case_name: $n lines match /$2/, expected exactly 1"
    cat "$1"
    fail=1
  fi
}

# The defaults: five lines, nothing lossy outside CollNet, p2p exact.
run 0 -- -c
has "$out" "^  transport: tcp on lo \(verbs off: "
has "$out" "^  GPU data path: off: "
has "$out" "^  CollNet reductions: int8 .* only where the job enables CollNet"
has "$out" "^  p2p sends: exact \(AGOQ_P2P_FORMAT=none, the default\)"
has "$out" "^  hardware: every path in use"
hasnt "$err" "WARN"

# p2p compression takes one variable, and the summary says what it then covers.
run 0 AGOQ_P2P_FORMAT=int8 -- -c
has "$out" "^  p2p sends: int8 .*AGOQ_P2P_FORMAT, set.*two-way flows \(AGOQ_P2P_SCOPE=pipeline.*one-way sends exact"
run 0 AGOQ_P2P_FORMAT=int8 AGOQ_P2P_SCOPE=all -- -c
has "$out" "^  p2p sends: int8 .*every fp32/bf16/fp16 send.*AGOQ_P2P_SCOPE=all.*scatter, gather and all_to_all"

# A misspelt name: a WARN with the closest name at init, and -c fails.
run 1 AGOQ_FOMRAT=int4 -- -c
has "$out" "UNKNOWN: AGOQ_FOMRAT is not an agoq setting and is ignored; did you mean AGOQ_FORMAT\?"
once "$err" "WARN .*AGOQ_FOMRAT is not an agoq setting.*did you mean AGOQ_FORMAT"
# Test and tool switches are known names.
run 0 AGOQ_TEST_ANYTHING=1 AGOQ_IBV_EMU_DIR=/x AGOQ_SKIP_TSAN=1 -- -c
hasnt "$err" "not an agoq setting"

# AGOQ_GPU=on where no GPU can be used: init fails, so -c fails, with the reason once.
run 1 AGOQ_GPU=on -- -c
has "$out" "INIT FAILS: ncclInvalidUsage"
once "$err" "AGOQ_GPU=on but the GPU data path cannot start"
hasnt "$err" "insufficient"

# A congestion control the kernel refuses fails init (the kernel is asked at init).
run 1 AGOQ_SOCKET_CC=nosuchcc -- -c
once "$err" "AGOQ_SOCKET_CC=nosuchcc: this kernel refuses it"
hasnt "$err" "no interface matches"

# A size that leaves every CollNet reduction exact is said, in the summary and at WARN.
run 0 AGOQ_MIN_BYTES=1GiB -- -c
has "$out" "^  CollNet reductions: .*in practice every reduction is exact"
once "$err" "AGOQ_MIN_BYTES=1073741824 bytes .* is above the largest CollNet call"

# The device view: the loaded plugin's own summary; each WARN once (net and CollNet init).
run 0 -- --lib "$plugin"
has "$out" "^in effect \(the plugin's init says\):"
has "$out" "^  transport: tcp on lo"
has "$out" "^  p2p sends: exact"
run 1 AGOQ_GPU=on -- --lib "$plugin"
once "$err" "AGOQ_GPU=on but the GPU data path cannot start"

# Over verbs: no TCP-only fields, no unexplained '?', and the unvalidated path is a WARN.
if [ -n "$emu" ] && [ -e "$emu" ]; then
  run 0 AGOQ_TRANSPORT=ib "AGOQ_IB_LIBRARY=$emu" -- --lib "$plugin"
  has "$out" "^  transport: verbs on "
  has "$out" "^  WARN: not yet run on hardware: the verbs transport"
  once "$err" "WARN .*not yet run on hardware: the verbs transport"
  hasnt "$out" "\?"
  hasnt "$out" "data sockets|progress threads|address  "
fi

# A host where a device is found (the plugin over the CUDA emulation): auto keeps the GPU
# data path off and says why and what turns it on; on turns it on with the hazards at WARN,
# and the summary says the path is known to hang on hardware.
if [ -n "$gpu_plugin" ] && [ -e "$gpu_plugin" ]; then
  run 0 -- --lib "$gpu_plugin"
  has "$out" "^  GPU data path: off \(AGOQ_GPU=auto\): .*cudaFree.*AGOQ_GPU=on turns it on"
  hasnt "$err" "AGOQ_GPU=on: the GPU data path is on"
  run 0 AGOQ_GPU=on -- --lib "$gpu_plugin"
  has "$out" "^  GPU data path: on \(AGOQ_GPU=on\)"
  has "$out" "^  WARN: known to hang on hardware: the GPU data path"
  once "$err" "AGOQ_GPU=on: the GPU data path is on although .*cudaFree"
fi

[ "$fail" = 0 ] && echo "info_effect: all cases passed"
exit "$fail"
