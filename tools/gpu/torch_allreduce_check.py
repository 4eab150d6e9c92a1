#!/usr/bin/env python3
"""PyTorch all_reduce through agoq's CollNet: N processes on one GPU, each its own "node".

Each rank is a separate process with its own NCCL_HOSTID, so NCCL counts N nodes and routes
AllReduce through the net plugin's CollNet (NCCL_COLLNET_ENABLE=1, NCCL_ALGO=CollNetChain by
default). For every size the ranks all-reduce (sum) N(0,1) tensors of the chosen type
(bf16 by default) and check that:
  - every rank received the same bits (the parent compares each rank's SHA-256 of the result),
  - the relative L2 error against an fp64 reference of the same inputs is within --bound
    (default 1.2%), and no value is NaN or Inf,
and, from NCCL's own INFO logs, that the run went through agoq's CollNet ("via COLLNET/AGOQ"),
unless --no-require-collnet.

Every rank regenerates every rank's input from a seeded CUDA generator, so each one computes
the fp64 reference itself; nothing but the AllReduce goes through NCCL.

usage: torch_allreduce_check.py [--plugin PATH] [--nranks N] [--sizes LIST] [--dtype T]
                                [--bound X] [--algo A] [--format F] [--iters N]
                                [--log-dir DIR] [--timeout S] [--device N]
                                [--no-require-collnet] [--nan-at I]
Exit status: 0 all checks passed; 1 a check failed (different bits, error above the bound,
non-finite values, not through CollNet, a rank failed or timed out); 2 usage or setup error
(no plugin); 77 skipped: torch, torch.distributed with NCCL, or a CUDA device is absent.
"""
import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

EXIT_OK, EXIT_FAIL, EXIT_SETUP, EXIT_SKIP = 0, 1, 2, 77
DEFAULT_SIZES = "1024,32771,1000003,8M,32M"  # elements: small (exact path), odd, 64 MiB of bf16
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def log(msg):
    print("torch-check: " + msg, flush=True)


def parse_count(text):
    """'32M' -> 33554432 (elements; K/M/G are powers of 1024)."""
    m = re.fullmatch(r"([0-9]+)([kKmMgG]?)", text.strip())
    if not m:
        raise ValueError("bad element count '%s'" % text)
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    n = int(m.group(1)) * mult
    if n <= 0:
        raise ValueError("element count must be positive: '%s'" % text)
    return n


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch bf16 all_reduce through agoq's CollNet, N processes on one GPU.")
    p.add_argument("--plugin", help="libnccl-net-agoq.so (default: $AGOQ_PLUGIN_PATH, else "
                   "<repo>/build/lib, else <repo>/build*/lib)")
    p.add_argument("--nranks", type=int, default=4, help="processes (default 4)")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="comma-separated element counts, K/M suffixes (default %s)" % DEFAULT_SIZES)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--bound", type=float, default=0.012,
                   help="largest allowed relative L2 error vs fp64 (default 0.012)")
    p.add_argument("--algo", default="CollNetChain",
                   help="NCCL_ALGO for the ranks (default CollNetChain; '' leaves it unset)")
    p.add_argument("--format", help="AGOQ_FORMAT for the ranks (default: the environment's, "
                   "else the plugin's default, int8)")
    p.add_argument("--iters", type=int, default=5,
                   help="timed all_reduces per size of 1M elements or more (default 5; 0: none)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--nan-at", type=int, default=-1,
                   help="rank 0 puts a NaN at this element of every size's input (sizes that have it): "
                        "the result must be NaN there on every rank, bit-identical, and the other "
                        "elements within the bound (quantized blocks holding a NaN travel raw: the "
                        "codec's escape path, on the GPU its raw decode kernel); default -1: none")
    p.add_argument("--log-dir", help="keep per-rank and NCCL logs here (default: a temporary "
                   "directory, removed when the check passes)")
    p.add_argument("--timeout", type=int, default=300, help="seconds for the whole run")
    p.add_argument("--device", type=int, default=0, help="CUDA device all ranks share")
    p.add_argument("--no-require-collnet", dest="require_collnet", action="store_false",
                   help="do not fail when NCCL's logs show no CollNet through agoq")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        a.size_list = [parse_count(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError as e:
        p.error(str(e))
    if not a.size_list:
        p.error("--sizes is empty")
    if not 2 <= a.nranks <= 64:
        p.error("--nranks must be 2..64")
    if a.timeout < 10:
        p.error("--timeout must be at least 10 s")
    return a


# ---- worker: one rank -----------------------------------------------------------------------

def digest(torch, t):
    """SHA-256 of the tensor's bytes; without numpy, a position-weighted checksum on the GPU."""
    ints = {2: torch.int16, 4: torch.int32}[t.element_size()]
    bits = t.contiguous().view(ints)
    try:
        import numpy  # noqa: F401 (only to know .numpy() works)
        return "sha256:" + hashlib.sha256(bits.cpu().numpy().tobytes()).hexdigest()
    except ImportError:
        v = bits.to(torch.int64)
        idx = torch.arange(v.numel(), device=v.device, dtype=torch.int64)
        w = (idx * 2654435761 + 97) % 4294967291
        return "sum:%d:%d:%d" % (v.sum().item(), (v * w).sum().item(), (v * (w ^ 0x5bd1e995)).sum().item())


def worker_main(cfg):
    import datetime

    import torch
    import torch.distributed as dist

    rank, nranks = cfg["rank"], cfg["nranks"]
    dev = torch.device("cuda", cfg["device"])
    torch.cuda.set_device(dev)
    timeout = datetime.timedelta(seconds=cfg["timeout"])
    try:
        dist.init_process_group(backend="nccl", rank=rank, world_size=nranks, timeout=timeout,
                                device_id=dev)
    except TypeError:  # torch without device_id (< 2.3): the communicator is created lazily
        dist.init_process_group(backend="nccl", rank=rank, world_size=nranks, timeout=timeout)
    dtype = getattr(torch, DTYPES[cfg["dtype"]])
    out = {"rank": rank, "torch": torch.__version__, "sizes": []}
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:  # version query is informational only
        out["nccl"] = "?"
    out["gpu"] = torch.cuda.get_device_name(dev)

    for i, n in enumerate(cfg["sizes"]):
        ref = torch.zeros(n, dtype=torch.float64, device=dev)
        mine = None
        for q in range(nranks):
            g = torch.Generator(device=dev)
            g.manual_seed(cfg["seed"] * 1000003 + i * 1009 + q)
            x = torch.randn(n, generator=g, device=dev, dtype=torch.float32).to(dtype)
            if q == 0 and 0 <= cfg.get("nan_at", -1) < n:
                x[cfg["nan_at"]] = float("nan")
            ref += x.double()
            if q == rank:
                mine = x
            del x
        y = mine.clone()
        dist.all_reduce(y)
        torch.cuda.synchronize()
        # The planted NaN (--nan-at) must come out as NaN; the error is over the other elements.
        planted = 0 <= cfg.get("nan_at", -1) < n
        keep = torch.isfinite(ref)
        diff = (y.double() - ref)[keep]
        rel = (diff.norm() / ref[keep].norm()).item()
        maxabs = diff.abs().max().item()
        nonfinite = int(torch.isfinite(y[keep]).logical_not().sum().item())
        del diff, ref, keep
        entry = {"elements": n, "bytes": n * y.element_size(), "rel_l2": rel, "max_abs": maxabs,
                 "nonfinite": nonfinite, "digest": digest(torch, y),
                 "nan_lost": planted and not bool(torch.isnan(y[cfg["nan_at"]]).item())}
        if cfg["iters"] > 0 and n >= (1 << 20):
            total_ms = 0.0
            z = mine.clone()
            for it in range(cfg["iters"] + 1):  # the first one warms up
                z.copy_(mine)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dist.all_reduce(z)
                end.record()
                torch.cuda.synchronize()
                if it > 0:
                    total_ms += start.elapsed_time(end)
            entry["time_ms"] = total_ms / cfg["iters"]
            del z
        out["sizes"].append(entry)
        del y, mine
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    with open(cfg["result"] + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(cfg["result"] + ".tmp", cfg["result"])
    return 0


# ---- parent ---------------------------------------------------------------------------------

def probe_torch(device):
    """None when usable, else why not (the check is then skipped)."""
    try:
        import torch
    except ImportError as e:
        return "torch is not installed (%s)" % e
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_nccl_available():
            return "torch.distributed with NCCL is not available in torch %s" % torch.__version__
        if not torch.cuda.is_available():
            return "CUDA is not available to torch %s" % torch.__version__
        if torch.cuda.device_count() <= device:
            return "no CUDA device %d (torch sees %d)" % (device, torch.cuda.device_count())
    except Exception as e:  # a broken driver is "no GPU" here, as in the other GPU checks
        return "CUDA probe failed: %s" % e
    return None


def find_plugin(explicit):
    if explicit:
        return os.path.abspath(explicit) if os.path.isfile(explicit) else None
    env = os.environ.get("AGOQ_PLUGIN_PATH")
    if env:
        return os.path.abspath(env) if os.path.isfile(env) else None
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for d in [os.path.join(repo, "build", "lib")] + sorted(glob.glob(os.path.join(repo, "build*", "lib"))):
        cand = os.path.join(d, "libnccl-net-agoq.so")
        if os.path.isfile(cand):
            return cand
    return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rank_env(args, rank, plugin, port, log_dir):
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(args.nranks), "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        # A distinct host id per process: NCCL counts one node per rank, so every byte
        # between ranks goes through the plugin and CollNet's 2-node minimum is met.
        "NCCL_HOSTID": "agoq-torch-%d" % rank,
        "NCCL_NET_PLUGIN": plugin, "NCCL_NET": "AGOQ", "NCCL_COLLNET_ENABLE": "1",
        "NCCL_MNNVL_ENABLE": "0",
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV,TUNING",
        "NCCL_DEBUG_FILE": os.path.join(log_dir, "nccl.rank%d.%%h.%%p.log" % rank),
    })
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    env.setdefault("AGOQ_SOCKET_IFNAME", "lo")
    env.setdefault("AGOQ_STATS", "1")
    if args.algo:
        env["NCCL_ALGO"] = args.algo
    else:
        env.pop("NCCL_ALGO", None)
    if args.format:
        env["AGOQ_FORMAT"] = args.format
    return env


def stop(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.time() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()


def run_ranks(args, plugin, log_dir, script=None, cfg_base=None, env_fn=None):
    """Starts the ranks (`script --worker CFG`, this file's by default) and waits; returns
    (exit codes, why it stopped early or None). Other checks reuse it with their own
    worker script, configuration and environment."""
    port = free_port()
    script = os.path.abspath(script or __file__)
    env_fn = env_fn or rank_env
    if cfg_base is None:
        cfg_base = {"nranks": args.nranks, "device": args.device, "sizes": args.size_list,
                    "dtype": args.dtype, "seed": args.seed, "iters": args.iters, "nan_at": args.nan_at,
                    "timeout": args.timeout}
    procs, outs = [], []
    try:
        for r in range(args.nranks):
            cfg = dict(cfg_base, rank=r, result=os.path.join(log_dir, "rank%d.json" % r))
            out = open(os.path.join(log_dir, "rank%d.log" % r), "w")
            outs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, script, "--worker", json.dumps(cfg)],
                env=env_fn(args, r, plugin, port, log_dir), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.time() + args.timeout
        why = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed and why is None:
                # The others wait for it in NCCL forever: give them a moment to report, then stop.
                why = "rank %d exited with %d" % (failed[0], codes[failed[0]])
                deadline = min(deadline, time.time() + 10)
            if time.time() > deadline:
                why = why or "timed out after %d s" % args.timeout
                stop(procs)
                break
            time.sleep(0.2)
        return [p.poll() for p in procs], why
    finally:
        stop(procs)
        for out in outs:
            out.close()


def nccl_log_facts(log_dir):
    text = ""
    for path in sorted(glob.glob(os.path.join(log_dir, "nccl.rank*.log"))):
        with open(path, errors="replace") as f:
            text += f.read()
    return {
        "collnet_agoq": len(re.findall(r"via COLLNET/AGOQ", text)),
        "network_agoq": len(re.findall(r"Using network AGOQ", text)),
        "algo_collnet": len(re.findall(r"Algo CollNetChain", text)),
        "collnet_disabled": re.findall(r"[^\n]*(?:Cannot initialize CollNet|disabling CollNet)[^\n]*", text)[:2],
        "warn": re.findall(r"[^\n]*NCCL WARN[^\n]*", text)[:4],
    }


def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            return f.readlines()[-n:]
    except OSError:
        return []


def parent_main(args):
    why_not = probe_torch(args.device)
    if why_not:
        log("SKIPPED: " + why_not)
        return EXIT_SKIP
    plugin = find_plugin(args.plugin)
    if plugin is None:
        log("no plugin found (%s): build it, or pass --plugin PATH"
            % (args.plugin or os.environ.get("AGOQ_PLUGIN_PATH") or "<repo>/build*/lib/libnccl-net-agoq.so"))
        return EXIT_SETUP
    keep = args.log_dir is not None
    log_dir = os.path.abspath(args.log_dir) if keep else tempfile.mkdtemp(prefix="agoq-torch-check.")
    os.makedirs(log_dir, exist_ok=True)
    for old in glob.glob(os.path.join(log_dir, "rank*.json")) + glob.glob(os.path.join(log_dir, "nccl.rank*.log")):
        os.remove(old)
    fmt = args.format or os.environ.get("AGOQ_FORMAT") or "plugin default"
    log("%d ranks on cuda:%d, %s, sizes %s elements, NCCL_ALGO=%s, AGOQ_FORMAT=%s, bound %.4g"
        % (args.nranks, args.device, args.dtype, ",".join(str(n) for n in args.size_list),
           args.algo or "(unset)", fmt, args.bound))
    log("plugin " + plugin)
    t0 = time.time()
    codes, why = run_ranks(args, plugin, log_dir)
    elapsed = time.time() - t0

    results = {}
    for r in range(args.nranks):
        path = os.path.join(log_dir, "rank%d.json" % r)
        if os.path.isfile(path):
            with open(path) as f:
                results[r] = json.load(f)
    facts = nccl_log_facts(log_dir)
    failures = []
    if why:
        failures.append(why)
    for r, c in enumerate(codes):
        if c != 0:
            failures.append("rank %d exit %s" % (r, c))
        elif r not in results:
            failures.append("rank %d wrote no results" % r)

    info = results.get(0, {})
    if info:
        log("torch %s, NCCL %s, %s" % (info.get("torch"), info.get("nccl"), info.get("gpu")))
    print("%12s %12s %10s %10s %9s %9s %11s  %s" % ("elements", "bytes", "rel_l2", "max_abs",
                                                    "identical", "time(ms)", "busbw(GB/s)", "verdict"))
    for i, n in enumerate(args.size_list):
        per_rank = [results[r]["sizes"][i] for r in sorted(results) if i < len(results[r]["sizes"])]
        if len(per_rank) < args.nranks:
            print("%12d %12s %10s %10s %9s %9s %11s  %s" % (n, "-", "-", "-", "-", "-", "-", "NO RESULT"))
            continue
        digests = set(e["digest"] for e in per_rank)
        rel = max(e["rel_l2"] for e in per_rank)
        maxabs = max(e["max_abs"] for e in per_rank)
        nonfinite = sum(e["nonfinite"] for e in per_rank)
        times = [e["time_ms"] for e in per_rank if "time_ms" in e]
        t_ms = max(times) if times else None
        busbw = (per_rank[0]["bytes"] / (t_ms * 1e6) * 2 * (args.nranks - 1) / args.nranks) if t_ms else None
        bad = []
        if len(digests) != 1:
            bad.append("%d DIFFERENT RESULTS" % len(digests))
        if not rel <= args.bound:  # also catches NaN
            bad.append("ERROR %.4g > %.4g" % (rel, args.bound))
        if nonfinite:
            bad.append("%d NON-FINITE" % nonfinite)
        lost = sum(1 for e in per_rank if e.get("nan_lost"))
        if lost:
            bad.append("the planted NaN did not arrive on %d rank(s)" % lost)
        failures += ["%d elements: %s" % (n, b) for b in bad]
        print("%12d %12d %10.3e %10.3e %9s %9s %11s  %s" % (
            n, per_rank[0]["bytes"], rel, maxabs, "yes" if len(digests) == 1 else "NO",
            "%.2f" % t_ms if t_ms else "-", "%.3f" % busbw if busbw else "-",
            "ok" if not bad else "; ".join(bad)))

    log("NCCL logs: %d 'via COLLNET/AGOQ', %d 'Using network AGOQ', %d 'Algo CollNetChain'"
        % (facts["collnet_agoq"], facts["network_agoq"], facts["algo_collnet"]))
    for line in facts["collnet_disabled"] + facts["warn"]:
        log("  " + line.strip()[:200])
    if args.require_collnet and facts["collnet_agoq"] == 0:
        failures.append("NOT THROUGH COLLNET: no 'via COLLNET/AGOQ' line in NCCL's logs")
    if facts["network_agoq"] == 0:
        failures.append("NOT THROUGH AGOQ: no 'Using network AGOQ' line in NCCL's logs")

    if failures:
        for r in range(args.nranks):
            lines = tail(os.path.join(log_dir, "rank%d.log" % r), 6)
            if codes[r] != 0 and lines:
                log("rank %d (exit %s), last lines:" % (r, codes[r]))
                for line in lines:
                    print("    " + line.rstrip()[:200])
        log("FAILED (%.0f s): %s" % (elapsed, "; ".join(failures[:6])))
        log("logs kept in " + log_dir)
        return EXIT_FAIL
    log("PASSED (%.0f s): %d sizes, identical on all %d ranks, rel L2 error <= %.4g"
        % (elapsed, len(args.size_list), args.nranks, args.bound))
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
