#!/usr/bin/env python3
"""The typed net path across processes, driven as NCCL 2.28 drives it.

agoq-perf p2p --dtype loads the built plugin, finds its ncclProfiler_v5 table (as NCCL does
in the net plugin's library), and for every isend creates a P2p task -> ProxyOp -> ProxyStep
chain through the emulated NCCL profiler plumbing; the plugin's isend asks its profiler
through NCCL's callback what the transfer is. A forked receiver checks the data. Each case
asserts what must hold:
  - bf16 / fp32 / fp16 p2p payloads go quantized: ~1.94x (bf16, fp16) or ~3.9x (fp32) fewer
    bytes on the wire, and decode within the codec's bound (rel. L2 <= 1.2%);
  - int32 / int64 p2p stay bit-exact, nothing quantized;
  - a p2p small enough that NCCL may use LL stays exact;
  - a collective's ring traffic stays exact;
  - with no profiler loaded everything is exact (and counted as of unknown type);
  - AGOQ_P2P_FORMAT=none sends everything exactly, and so does a run with AGOQ_P2P_FORMAT
    unset: p2p compression is opt-in (every other case asks for int8 with --format);
  - AGOQ_P2P_SCOPE=pipeline (the default) quantizes only two-way flows: the quantized cases
    run with --flow twoway (the sender's profiler also sees a Recv task of the same dtype and
    count from the peer, as an irecv in the same group); a one-way send goes exact, counted
    as exact_one_way in the statistics, and so does a flow whose receive differs in count,
    dtype or peer; with AGOQ_P2P_SCOPE=all the one-way send is quantized.
The oracle's cost per isend (the plugin's own measurement) is printed, not asserted.

With --device (or AGOQ_TYPED_DEVICE=1) every run is `agoq-perf p2p --device`: NCCL's buffers,
send and receive, in device memory (regMr NCCL_PTR_CUDA) through the CUDA emulation, so
PLUGIN must be the plugin built over it (libnccl-net-agoq-emu.so). The typed payloads are
then encoded and decoded by the (emulated) CUDA codec, and every assertion above must hold
on the bytes copied back from the receive buffers once test() said done. The plugin's
statistics must also say that every isend and irecv had device buffers. Messages go up to
12 MiB: AGOQ_GPU_STAGING defaults to 16M here, unless the environment sets it.
usage: typed_p2p_test.py [--device] AGOQ_PERF [PLUGIN]
"""
import re
import json
import os
import subprocess
import sys

BOUND = 0.012
DEVICE = False
DEVICE_RUNS = 0  # runs whose every isend and irecv had device buffers (plugin statistics)


def device_calls(stderr):
    """Per kind (p2p_send, p2p_recv): [calls, device_calls] over the plugin's close lines."""
    out = {}
    for m in re.finditer(r"kind=(p2p_send|p2p_recv) path=\w+ calls=(\d+) .*?device_calls=(\d+)", stderr):
        c = out.setdefault(m.group(1), [0, 0])
        c[0] += int(m.group(2))
        c[1] += int(m.group(3))
    return out


def exact_reasons(stderr):
    """The sender's exact_* counts summed over its agoq-stats lines (kind=p2p_send path=exact)."""
    out = {}
    for line in stderr.splitlines():
        if not line.startswith("agoq-stats ") or " kind=p2p_send path=exact " not in line:
            continue
        for m in re.finditer(r" (exact_\w+)=(\d+)", line):
            out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
    return out


def run(perf, lib, args, default_format=False, scope=None, stderr_out=None):
    """default_format: leave AGOQ_P2P_FORMAT unset (from the environment too), else the case
    asks for int8 unless it names a --format itself. scope: AGOQ_P2P_SCOPE for the run (else
    unset: the default). stderr_out: a list the run's stderr is appended to."""
    if not default_format and "--format" not in args:
        args = ["--format", "int8"] + args
    cmd = [perf, "p2p", "--json", "-n", "3", "-w", "2"] + (["--device"] if DEVICE else []) + \
        (["--lib", lib] if lib else []) + args
    env = dict(os.environ, AGOQ_SOCKET_IFNAME="lo")
    env.pop("AGOQ_P2P_FORMAT", None)
    env.pop("AGOQ_P2P_SCOPE", None)
    env.pop("AGOQ_STATS_FILE", None)  # the statistics lines are read from stderr
    if scope is not None:
        env["AGOQ_P2P_SCOPE"] = scope
    if DEVICE:
        env.setdefault("AGOQ_GPU_STAGING", "16M")
        env.setdefault("AGOQ_GPU", "on")  # agoq-perf --device asks for it too; said here for the reader
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit("FAILED: %s exited with %d" % (" ".join(cmd), p.returncode))
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    sizes = [d for d in lines if d.get("test") == "p2p"]
    wire = [d for d in lines if d.get("test") == "p2p-wire"]
    if not sizes or len(wire) != 1:
        raise SystemExit("FAILED: unexpected output of %s:\n%s" % (" ".join(cmd), p.stdout))
    if DEVICE:
        # Device buffers all the way: a run that fell back to host buffers tests nothing.
        calls = device_calls(p.stderr)
        for kind in ("p2p_send", "p2p_recv"):
            c = calls.get(kind, [0, 0])
            if c[0] == 0 or c[1] != c[0]:
                sys.stderr.write(p.stderr[-3000:])
                raise SystemExit("FAILED: %s: %s: %d of %d calls had device buffers" % (" ".join(cmd), kind,
                                                                                      c[1], c[0]))
        global DEVICE_RUNS
        DEVICE_RUNS += 1
    if stderr_out is not None:
        stderr_out.append(p.stderr)
    return sizes, wire[0]


def main():
    global DEVICE
    argv = sys.argv[1:]
    DEVICE = os.environ.get("AGOQ_TYPED_DEVICE") == "1"
    if argv and argv[0] == "--device":
        DEVICE = True
        argv = argv[1:]
    if not argv:
        raise SystemExit(__doc__)
    perf, lib = argv[0], argv[1] if len(argv) > 1 else None
    print("buffers: %s" % ("device (agoq-perf p2p --device, CUDA emulation)" if DEVICE else "host"))
    failures = []

    def check(name, cond, detail):
        print("%-58s %s  %s" % (name, "ok " if cond else "BAD", detail))
        if not cond:
            failures.append(name)

    quantized = [("bf16", 1.90, 1.95), ("fp16", 1.90, 1.95), ("fp32", 3.70, 3.90)]
    for dtype, lo, hi in quantized:
        sizes, w = run(perf, lib, ["-d", dtype, "--flow", "twoway", "--chunk", "128K", "-b", "3M", "-e", "12M",
                                   "-f", "4"])
        worst = max(d["rel_l2"] for d in sizes)
        check("%s p2p is quantized within the bound" % dtype,
              all(not d["exact"] for d in sizes) and worst <= BOUND,
              "rel_l2 max %.3e (bound %.3g)" % (worst, BOUND))
        check("%s p2p wire bytes %.2f..%.2fx fewer" % (dtype, lo, hi), w["frames"] > 0 and lo <= w["reduction"] <= hi,
              "%d frames, %.2fx fewer bytes; oracle %.0f ns per isend" % (w["frames"], w["reduction"], w["oracle_ns"]))
        if dtype == "bf16":
            oracle_ns = w["oracle_ns"]
    exact_cases = [
        ("int32 p2p is bit-exact", ["-d", "int32", "--flow", "twoway", "--chunk", "128K", "-b", "4M", "-e", "4M"]),
        ("int64 p2p is bit-exact", ["-d", "int64", "--flow", "twoway", "--chunk", "128K", "-b", "4M", "-e", "4M"]),
        ("fp64 p2p is bit-exact", ["-d", "fp64", "--flow", "twoway", "-b", "4M", "-e", "4M"]),
        ("bf16 p2p NCCL may send as LL (<= 1 MiB) is exact", ["-d", "bf16", "--flow", "twoway", "-b", "256K", "-e", "1M", "-f", "4"]),
        ("bf16 collective ring traffic is exact", ["-d", "bf16", "--traffic", "coll", "--chunk", "128K", "-b", "4M",
                                                   "-e", "4M"]),
        ("bf16 with no profiler loaded is exact", ["-d", "bf16", "--flow", "twoway", "--oracle", "none", "--chunk", "128K", "-b", "4M",
                                                   "-e", "4M"]),
        ("bf16 with AGOQ_P2P_FORMAT=none is exact", ["-d", "bf16", "--flow", "twoway", "--format", "none", "--chunk", "128K", "-b", "4M",
                                                     "-e", "4M"]),
    ]
    exact_cases.append(("bf16 with no AGOQ_P2P_FORMAT set is exact (opt-in)",
                        ["-d", "bf16", "--flow", "twoway", "--chunk", "128K", "-b", "4M", "-e", "4M"]))
    known_reasons = 0
    for name, args in exact_cases:
        sizes, w = run(perf, lib, args, default_format="opt-in" in name)
        check(name, all(d["exact"] for d in sizes) and w["frames"] == 0,
              "%d sizes exact, %d frames, %d of unknown type" % (sum(d["exact"] for d in sizes), w["frames"],
                                                                w["unknown"]))
        if "no profiler" in name:
            check("  ... and counted as of unknown type", w["unknown"] > 0, "%d unknown" % w["unknown"])
            known_reasons += 1
        elif "p2p" in name and "FORMAT" not in name:
            # The profiler knows why an integer, fp64 or LL-sized send goes exact: the
            # statistics must give that reason, not "unknown type".
            check("  ... with its reason known (not unknown type)", w["unknown"] == 0, "%d unknown" % w["unknown"])
            known_reasons += 1
    # AGOQ_P2P_SCOPE: the default quantizes two-way flows only (the quantized cases above
    # are two-way); a one-way send, or a flow whose receive has another shape or peer, stays
    # exact for that reason, and AGOQ_P2P_SCOPE=all quantizes the one-way send.
    scope_args = ["-d", "bf16", "--chunk", "128K", "-b", "4M", "-e", "4M"]
    scope_cases = [
        ("bf16 one-way p2p is exact (default AGOQ_P2P_SCOPE=pipeline)", ["--flow", "oneway"], None),
        ("bf16 one-way p2p is exact (AGOQ_P2P_SCOPE=pipeline)", [], "pipeline"),
        ("bf16 two-way flow, receive of another count, is exact", ["--flow", "other-count"], None),
        ("bf16 two-way flow, receive of another dtype, is exact", ["--flow", "other-dtype"], None),
        ("bf16 two-way flow, receive from another peer, is exact", ["--flow", "other-peer"], None),
    ]
    for name, extra, scope in scope_cases:
        err = []
        sizes, w = run(perf, lib, scope_args + extra, scope=scope, stderr_out=err)
        r = exact_reasons(err[0])
        others = sum(v for k, v in r.items() if k != "exact_one_way")
        check(name, all(d["exact"] for d in sizes) and w["frames"] == 0,
              "%d sizes exact, %d frames" % (sum(d["exact"] for d in sizes), w["frames"]))
        check("  ... counted as exact_one_way", r.get("exact_one_way", 0) > 0 and others == 0,
              "exact_one_way %d, other reasons %d" % (r.get("exact_one_way", 0), others))
    for name, extra, scope in [("bf16 one-way p2p is quantized with AGOQ_P2P_SCOPE=all", [], "all"),
                               ("bf16 two-way flow is quantized with AGOQ_P2P_SCOPE=pipeline", ["--flow", "twoway"],
                                "pipeline")]:
        err = []
        sizes, w = run(perf, lib, scope_args + extra, scope=scope, stderr_out=err)
        worst = max(d["rel_l2"] for d in sizes)
        r = exact_reasons(err[0])
        check(name, all(not d["exact"] for d in sizes) and worst <= BOUND and w["frames"] > 0 and
              r.get("exact_one_way", 0) == 0,
              "%d frames, rel_l2 max %.3e, exact_one_way %d" % (w["frames"], worst, r.get("exact_one_way", 0)))
    print("oracle cost inside isend (plugin statistics, bf16 runs): %.0f ns per query (target < 1000 ns)" % oracle_ns)
    if failures:
        raise SystemExit("FAILED: " + "; ".join(failures))
    if DEVICE:
        print("device buffers in every isend and irecv of all %d runs (plugin statistics)" % DEVICE_RUNS)
    print("PASSED: %d checks" % (2 * len(quantized) + len(exact_cases) + known_reasons + 2 * len(scope_cases) + 2))


if __name__ == "__main__":
    main()
