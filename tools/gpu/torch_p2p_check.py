#!/usr/bin/env python3
"""PyTorch send/recv through agoq's typed net path: N processes on one GPU, each its own "node".

Each rank is a separate process with its own NCCL_HOSTID, so every byte between ranks goes
through the net plugin. NCCL finds agoq's profiler (the type oracle) in the same library
(NCCL_PROFILER_PLUGIN unset). The ranks form a pipeline ring: rank r sends to r+1 and
receives from r-1 with batch_isend_irecv, for each size:
  - bf16 activations (N(0,1)): the received tensor is within --bound (relative L2, default
    1.2%) of what the sender sent, finite, and NOT bit-identical (it really was quantized);
  - int64 tensors: bit for bit (integers are never quantized);
then a bf16 all_reduce must give the same bits on every rank. From the plugin's own INFO
lines (AGOQ_STATS=1) it checks that quantized p2p frames were sent ("p2p stats ... N frames",
N > 0) and that the profiler oracle was active.

Exit status: 0 passed; 1 a check failed; 2 setup error (no plugin); 77 skipped (no torch,
no NCCL in torch, or no CUDA device).
"""
import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_allreduce_check as common  # noqa: E402  (shared launcher and helpers)

EXIT_OK, EXIT_FAIL, EXIT_SETUP, EXIT_SKIP = 0, 1, 2, 77
DEFAULT_SIZES = "65536,1000003,8M,32M"  # elements: one p2p chunk, odd, 16 and 64 MiB of bf16


def log(msg):
    print("torch-p2p-check: " + msg, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description="PyTorch send/recv through agoq's typed net path.")
    p.add_argument("--plugin", help="libnccl-net-agoq.so (default as torch_allreduce_check.py)")
    p.add_argument("--nranks", type=int, default=4)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="element counts (default %s)" % DEFAULT_SIZES)
    p.add_argument("--bound", type=float, default=0.012)
    p.add_argument("--format", default="int8",
                   help="AGOQ_P2P_FORMAT for the ranks (default int8: the check is of the typed path, which is "
                        "opt-in; the plugin's own default is none)")
    p.add_argument("--iters", type=int, default=5, help="timed bf16 exchanges per size >= 1M elements")
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--log-dir")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        a.size_list = [common.parse_count(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError as e:
        p.error(str(e))
    if not a.size_list or not 2 <= a.nranks <= 64 or a.timeout < 10:
        p.error("need sizes, 2..64 ranks and a timeout of at least 10 s")
    return a


def worker_main(cfg):
    import datetime

    import torch
    import torch.distributed as dist

    rank, n = cfg["rank"], cfg["nranks"]
    dev = torch.device("cuda", cfg["device"])
    torch.cuda.set_device(dev)
    timeout = datetime.timedelta(seconds=cfg["timeout"])
    try:
        dist.init_process_group(backend="nccl", rank=rank, world_size=n, timeout=timeout, device_id=dev)
    except TypeError:
        dist.init_process_group(backend="nccl", rank=rank, world_size=n, timeout=timeout)
    nxt, prv = (rank + 1) % n, (rank - 1) % n

    def tensor_of(src_rank, i, count, kind):
        g = torch.Generator(device=dev)
        g.manual_seed(cfg["seed"] * 1000003 + i * 1009 + src_rank * 7 + (1 if kind == "int64" else 0))
        if kind == "int64":
            return torch.randint(-(1 << 62), 1 << 62, (count,), generator=g, device=dev, dtype=torch.int64)
        return torch.randn(count, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)

    def exchange(x, y):
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prv)])
        for r in reqs:
            r.wait()
        torch.cuda.synchronize()

    out = {"rank": rank, "sizes": []}
    for i, count in enumerate(cfg["sizes"]):
        entry = {"elements": count}
        # bf16 activations: lossy but within the bound.
        x, y = tensor_of(rank, i, count, "bf16"), torch.empty(count, dtype=torch.bfloat16, device=dev)
        exchange(x, y)
        want = tensor_of(prv, i, count, "bf16").double()
        diff = y.double() - want
        entry["bf16_rel_l2"] = (diff.norm() / want.norm()).item()
        entry["bf16_nonfinite"] = int(torch.isfinite(y).logical_not().sum().item())
        entry["bf16_identical"] = bool(torch.equal(y, want.to(torch.bfloat16)))
        if cfg["iters"] > 0 and count >= (1 << 20):
            total = 0.0
            for it in range(cfg["iters"] + 1):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                exchange(x, y)
                e.record()
                torch.cuda.synchronize()
                if it:
                    total += s.elapsed_time(e)
            entry["bf16_ms"] = total / cfg["iters"]
        del x, y, want, diff
        # int64: exact.
        x, y = tensor_of(rank, i, count, "int64"), torch.empty(count, dtype=torch.int64, device=dev)
        exchange(x, y)
        entry["int64_exact"] = bool(torch.equal(y, tensor_of(prv, i, count, "int64")))
        del x, y
        out["sizes"].append(entry)
    # all_reduce: the same bits on every rank.
    z = tensor_of(rank, 99, 1 << 20, "bf16")
    dist.all_reduce(z)
    torch.cuda.synchronize()
    out["allreduce_digest"] = common.digest(torch, z)
    dist.destroy_process_group()
    with open(cfg["result"] + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(cfg["result"] + ".tmp", cfg["result"])
    return 0


def rank_env(args, rank, plugin, port, log_dir):
    env = common.rank_env(argparse.Namespace(nranks=args.nranks, algo="", format=None), rank, plugin, port,
                          log_dir)
    env["NCCL_DEBUG_SUBSYS"] = "INIT,NET,ENV,P2P,PROFILE"
    env["AGOQ_STATS"] = "1"
    env.pop("NCCL_PROFILER_PLUGIN", None)  # NCCL then finds agoq's profiler in the net library
    if args.format:
        env["AGOQ_P2P_FORMAT"] = args.format
        # The ring sends to r+1 and receives from r-1: one-way flows, which the default
        # AGOQ_P2P_SCOPE=pipeline keeps exact. This checks the typed path itself.
        env["AGOQ_P2P_SCOPE"] = "all"
    return env


def plugin_facts(log_dir):
    text = ""
    for path in sorted(glob.glob(os.path.join(log_dir, "nccl.rank*.log"))):
        with open(path, errors="replace") as f:
            text += f.read()
    frames = [int(m) for m in re.findall(r"p2p stats to \S+: (\d+) frames", text)]
    ratios = [float(m) for m in re.findall(r"p2p stats to \S+: \d+ frames, [0-9.]+ MiB in [0-9.]+ MiB on the wire "
                                            r"\(ratio ([0-9.]+)\)", text)]
    return {"frames": sum(frames), "ratios": ratios,
            "oracle": len(re.findall(r"NET/AGOQ[^\n]*(?:type oracle|profiler)[^\n]*active", text, re.I)),
            "exact_why": re.findall(r"[^\n]*p2p payloads go exact[^\n]*", text)[:1],
            "network_agoq": len(re.findall(r"Using network AGOQ", text)),
            "warn": re.findall(r"[^\n]*NCCL WARN[^\n]*", text)[:4]}


def parent_main(args):
    why_not = common.probe_torch(args.device)
    if why_not:
        log("SKIPPED: " + why_not)
        return EXIT_SKIP
    plugin = common.find_plugin(args.plugin)
    if plugin is None:
        log("no plugin found: build it, or pass --plugin PATH")
        return EXIT_SETUP
    keep = args.log_dir is not None
    log_dir = os.path.abspath(args.log_dir) if keep else tempfile.mkdtemp(prefix="agoq-torch-p2p.")
    os.makedirs(log_dir, exist_ok=True)
    for old in glob.glob(os.path.join(log_dir, "rank*.json")) + glob.glob(os.path.join(log_dir, "nccl.rank*.log")):
        os.remove(old)
    log("%d ranks on cuda:%d, ring send/recv, sizes %s elements, bound %.4g, plugin %s"
        % (args.nranks, args.device, ",".join(str(n) for n in args.size_list), args.bound, plugin))
    cfg = {"nranks": args.nranks, "device": args.device, "sizes": args.size_list, "seed": args.seed,
           "iters": args.iters, "timeout": args.timeout}
    t0 = time.time()
    codes, why = common.run_ranks(args, plugin, log_dir, script=__file__, cfg_base=cfg, env_fn=rank_env)
    elapsed = time.time() - t0
    results = {}
    for r in range(args.nranks):
        path = os.path.join(log_dir, "rank%d.json" % r)
        if os.path.isfile(path):
            with open(path) as f:
                results[r] = json.load(f)
    failures = [why] if why else []
    failures += ["rank %d exit %s" % (r, c) for r, c in enumerate(codes) if c != 0]
    failures += ["rank %d wrote no results" % r for r, c in enumerate(codes) if c == 0 and r not in results]
    print("%12s %12s %10s %10s %11s %9s %12s  %s" % ("elements", "bf16 bytes", "rel_l2", "lossy", "int64", "time(ms)",
                                                      "algbw(GB/s)", "verdict"))
    for i, count in enumerate(args.size_list):
        rows = [results[r]["sizes"][i] for r in sorted(results) if i < len(results[r]["sizes"])]
        if len(rows) < args.nranks:
            print("%12d %s" % (count, "NO RESULT"))
            continue
        rel = max(e["bf16_rel_l2"] for e in rows)
        lossy = not any(e["bf16_identical"] for e in rows)
        exact = all(e["int64_exact"] for e in rows)
        nonfinite = sum(e["bf16_nonfinite"] for e in rows)
        times = [e["bf16_ms"] for e in rows if "bf16_ms" in e]
        t_ms = max(times) if times else None
        bad = []
        if not rel <= args.bound:
            bad.append("bf16 ERROR %.4g > %.4g" % (rel, args.bound))
        if nonfinite:
            bad.append("%d NON-FINITE" % nonfinite)
        if not exact:
            bad.append("int64 NOT EXACT")
        failures += ["%d elements: %s" % (count, b) for b in bad]
        print("%12d %12d %10.3e %10s %11s %9s %12s  %s" % (
            count, count * 2, rel, "yes" if lossy else "no", "exact" if exact else "DIFFERENT",
            "%.2f" % t_ms if t_ms else "-", "%.3f" % (count * 2 / (t_ms * 1e6)) if t_ms else "-",
            "ok" if not bad else "; ".join(bad)))
    digests = set(results[r].get("allreduce_digest") for r in results)
    print("all_reduce bf16 1M elements: %s" % ("identical on all ranks" if len(digests) == 1 else "DIFFERENT"))
    if len(digests) != 1:
        failures.append("all_reduce results differ between ranks")
    facts = plugin_facts(log_dir)
    log("plugin logs: %d quantized p2p frames sent, wire ratios %s, oracle-active lines %d, 'Using network AGOQ' %d"
        % (facts["frames"], ",".join("%.3f" % r for r in facts["ratios"][:4]) or "-", facts["oracle"],
           facts["network_agoq"]))
    for line in facts["exact_why"] + facts["warn"]:
        log("  " + line.strip()[:200])
    if facts["network_agoq"] == 0:
        failures.append("NOT THROUGH AGOQ: no 'Using network AGOQ' line")
    if facts["frames"] == 0:
        failures.append("NO QUANTIZED P2P: the plugin sent no frames (is the profiler loaded?)")
    if failures:
        log("FAILED (%.0f s): %s" % (elapsed, "; ".join(failures[:6])))
        log("logs kept in " + log_dir)
        return EXIT_FAIL
    log("PASSED (%.0f s): bf16 within %.4g and quantized, int64 exact, all_reduce identical on %d ranks"
        % (elapsed, args.bound, args.nranks))
    if not keep:
        shutil.rmtree(log_dir, ignore_errors=True)
    return EXIT_OK


def main(argv):
    args = parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
