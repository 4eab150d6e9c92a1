#!/usr/bin/env python3
"""Megatron-Core training through agoq: a tiny GPT on one GPU played as N "nodes".

Each rank is its own process with its own NCCL_HOSTID, so NCCL counts one node per rank and
every byte between ranks goes through the network plugin. For every layout (--layouts,
default pp2dp2 and tp2dp2), optimizer variant (--optimizers: ddp, and distopt = Megatron's
distributed optimizer) and configuration (--configs) it trains the same tiny GPT from the
same seed on the same synthetic data and compares the per-iteration losses:

  socket, socket-again  NCCL's own Socket transport, no agoq (socket-again: the noise floor)
  agoq-exact            agoq's CollNet with AGOQ_FORMAT=none AGOQ_P2P_FORMAT=none and
                        NCCL_ALGO=allreduce:CollNetChain on the data-parallel communicator
                        (the tuner steers nothing when the format is none)
  agoq-int8             agoq with AGOQ_FORMAT=int8, AGOQ_P2P_FORMAT=int8 (opt-in; the
                        default AGOQ_P2P_SCOPE=pipeline keeps it to the pipeline's two-way
                        flows), and NCCL_ALGO=allreduce:CollNetChain on the data-parallel
                        communicator: every gradient AllReduce goes through the compressed
                        CollNet, as it would where the
                        network is the bottleneck. On this one-GPU loopback layout agoq's
                        tuner would rightly keep most of them on NCCL's ring (loopback is
                        fast), and the question here is what int8 does to training, not
                        where it pays: tools/gpu-check.sh's nccl-tests PERF lines judge that

The model uses megatron-core's local transformer spec (no TransformerEngine, no apex), bf16
parameters (Float16Module), DDP with overlap_grad_reduce and, as Megatron-LM's --bf16 does
unless told --grad-reduce-in-bf16, gradients reduced in fp32: so fp32 CollNet is exercised.
The last pipeline stage's first TP/DP rank prints one line per iteration, `iter N loss X
grad_norm G ms T` (X, the loss averaged over the data-parallel ranks, and G as Python's repr,
so equal lines mean equal bits); the parent echoes them, and each rank writes a JSON result
(losses, grad norms, ms per iteration, parameter count, gradient buckets) to the log dir.

Verdicts per (layout, optimizer):
  - agoq-exact must be bit-identical to socket, or its largest relative loss difference must
    not exceed that between socket and socket-again (a noise floor of 0 demands identity);
    without a socket-again run a difference is "inconclusive" (reported, not failed);
  - agoq-int8's loss must stay within --int8-tolerance (relative, every iteration) of
    socket's. Why 0.02: one int8 round trip (block 128) costs 0.65% relative L2 and a
    4-node CollNet all-reduce about 1% (docs/codec.md, docs/usage.md); that is noise on
    each gradient, which Adam's normalisation and clipping keep from compounding, while the
    loss itself is a mean over 4 x 8 x 512 tokens. So 2% (twice one all-reduce's error) on
    a loss that falls from 7.0 to 2.1 in 20 iterations (measured with --cpu) is the same
    training; a broken codec (wrong scale, lost block, bad sign) moves it by far more, or
    gives NaN;
  - every loss is finite;
  - from agoq's statistics (AGOQ_STATS=1, `agoq-stats` lines): agoq-exact carried no
    quantized bytes; agoq-int8 carried some (fp32 CollNet ratio ~0.26, bf16 ~0.52). The report
    says, per run, which kinds (collnet, p2p_send, p2p_recv) went quantized or exact, and from
    NCCL's TUNING lines which algorithm each collective took and how many CollNet channels
    went "via COLLNET/AGOQ".
A run that --budget left no time for is "unrun (budget)", not a failure.

--cpu rehearses everything but NCCL on a machine without a GPU: gloo, CPU tensors, and
patch_for_cpu() pointing megatron-core's hard-coded CUDA uses at the CPU. The configurations
are then just repeated gloo runs (default socket,socket-again; any names), which must be
bit-identical; agoq's statistics are not required.

usage: megatron_check.py [--plugin PATH] [--nranks N] [--layouts L] [--optimizers O]
                         [--configs C] [--iters N] [--layers N] [--hidden N] [--heads N]
                         [--vocab N] [--seq N] [--micro-batch N] [--micro-batches N]
                         [--seed N] [--grad-reduce-bf16] [--no-deterministic]
                         [--int8-tolerance X] [--mcore-wheel WHL] [--budget S]
                         [--log-dir DIR] [--timeout S] [--device N] [--cpu]
Exit status: 0 all checks passed; 1 a check failed (a rank failed or timed out, a loss is
not finite or outside its bound, agoq's statistics show the wrong path); 2 usage or setup
error (no plugin, a layout that does not fit --nranks, an unknown configuration, a bad
wheel); 77 skipped: torch, megatron-core, or (without --cpu) a CUDA device is absent.
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_allreduce_check as common  # noqa: E402  (plugin lookup, ports, process stop)

EXIT_OK, EXIT_FAIL, EXIT_SETUP, EXIT_SKIP = 0, 1, 2, 77
# Canonical configurations, in the order that leaves comparable pairs when --budget cuts.
CONFIG_ORDER = ["socket", "agoq-exact", "agoq-int8", "socket-again"]
LOSS_LINE = re.compile(r"^iter (\d+) loss (\S+) grad_norm (\S+) ms (\S+)$")
TUNING_LINE = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)")


def log(msg):
    print("mcore-check: " + msg, flush=True)


# ---- pure logic (unit-tested in test_megatron_check.py) -----------------------------------

def parse_layout(name):
    """'pp2dp2' -> (tp, pp, dp) = (1, 2, 2); missing factors are 1."""
    m = re.fullmatch(r"(?:tp(\d+))?(?:pp(\d+))?(?:dp(\d+))?", name)
    if not name or not m or any(g is not None and int(g) < 1 for g in m.groups()):
        raise ValueError("bad layout '%s' (want e.g. pp2dp2, tp2dp2, tp2pp2dp1)" % name)
    return tuple(int(g) if g else 1 for g in m.groups())


def config_kind(name):
    """socket / agoq-exact / agoq-int8 for 'socket', 'socket-again', 'agoq-int8-2', ...;
    None for other names (allowed only with --cpu)."""
    for kind in ("socket", "agoq-exact", "agoq-int8"):
        if name == kind or name.startswith(kind + "-"):
            return kind
    return None


def plan_runs(layouts, optimizers, configs):
    """Run names `<layout>.<optimizer>.<config>`: optimizer-major, then layout, then the
    configurations in CONFIG_ORDER (others after, as given), so a budget cut loses whole
    tails and what it keeps is the most useful: every layout with the first optimizer
    (plain DDP's AllReduces) before the second, socket and agoq-exact first in each."""
    def rank(c):
        return (CONFIG_ORDER.index(c), 0) if c in CONFIG_ORDER else (len(CONFIG_ORDER), configs.index(c))
    ordered = sorted(configs, key=rank)
    return ["%s.%s.%s" % (l, o, c) for o in optimizers for l in layouts for c in ordered]


def budget_allows(remaining_s, estimate_s):
    """Start another run? Before any run has finished there is no estimate: start it if
    any time is left (it is then cut by the budget, not failed)."""
    if remaining_s <= 0:
        return False
    return estimate_s is None or remaining_s >= estimate_s


# The NCCL_ALGO of the data-parallel communicator only (child_main sets it around that
# communicator's creation and removes it after).
DP_NCCL_ALGO = "MCORE_CHECK_DP_NCCL_ALGO"


def config_env(name, plugin, log_dir, run, cpu):
    """(variables to set, variables to remove) for one configuration."""
    drop = ["NCCL_ALGO", DP_NCCL_ALGO, "NCCL_COLLNET_ENABLE", "AGOQ_FORMAT", "AGOQ_P2P_FORMAT", "AGOQ_P2P_SCOPE", "AGOQ_STATS",
            "AGOQ_STATS_FILE", "NCCL_NET", "NCCL_NET_PLUGIN"]
    kind = config_kind(name)
    if cpu or kind is None:
        return {}, drop
    if kind == "socket":
        return {"NCCL_NET_PLUGIN": "none", "NCCL_NET": "Socket"}, drop
    # NCCL_COLLNET_ENABLE is not set here: Megatron-Core's initialize_model_parallel removes
    # it from the environment and sets it to 1 only around the data-parallel group's creation
    # when told use_sharp=True (child_main passes it), as Megatron-LM's --use-sharp does.
    # NCCL_ALGO likewise applies to that group alone (DP_NCCL_ALGO): NCCL reads both when it
    # creates a communicator, and a CollNet-only NCCL_ALGO on a communicator without CollNet
    # (tensor/pipeline groups, the world) fails every AllReduce there.
    env = {"NCCL_NET_PLUGIN": plugin, "NCCL_NET": "AGOQ", "AGOQ_SOCKET_IFNAME": "lo",
           "AGOQ_STATS": "1", "AGOQ_STATS_FILE": os.path.join(log_dir, run + ".stats.%p"),
           DP_NCCL_ALGO: "allreduce:CollNetChain"}
    if kind == "agoq-exact":
        env.update({"AGOQ_FORMAT": "none", "AGOQ_P2P_FORMAT": "none"})
    else:
        env.update({"AGOQ_FORMAT": "int8", "AGOQ_P2P_FORMAT": "int8"})
    return env, [k for k in drop if k not in env]


def max_rel_diff(a, b):
    """Largest |a_i - b_i| / |b_i| (b the reference); NaN if any value is not finite or the
    lengths differ; 0 only for bit-equal floats (or equal zeros)."""
    if len(a) != len(b) or not a:
        return float("nan")
    worst = 0.0
    for x, y in zip(a, b):
        if not (math.isfinite(x) and math.isfinite(y)):
            return float("nan")
        if x != y:
            worst = max(worst, abs(x - y) / abs(y) if y != 0 else float("inf"))
    return worst


def judge_exact(base, exact, again):
    """(verdict, text) for agoq-exact against socket; verdict is 'pass', 'fail',
    'inconclusive' or 'unrun'. Each argument is a list of losses, or None if not run."""
    if base is None or exact is None:
        return "unrun", "not compared (a run is missing: unrun or failed)"
    if not all(math.isfinite(x) for x in exact):
        return "fail", "NON-FINITE loss"
    diff = max_rel_diff(exact, base)
    if diff == 0.0:
        return "pass", "identical (%d iterations)" % len(base)
    if math.isnan(diff):
        return "fail", "not comparable (%d vs %d iterations)" % (len(exact), len(base))
    if again is None:
        return "inconclusive", "max rel diff %.3g, no noise floor (socket-again unrun)" % diff
    noise = max_rel_diff(again, base)
    if math.isnan(noise):
        return "inconclusive", "max rel diff %.3g, noise floor not comparable" % diff
    text = "max rel diff %.3g, noise floor (socket vs socket-again) %.3g" % (diff, noise)
    if noise > 0 and diff <= noise:
        return "pass", text + ": within noise"
    return "fail", text + (": OUTSIDE NOISE" if noise > 0 else ": socket is reproducible, agoq-exact is NOT")


def judge_int8(base, int8, tolerance):
    if base is None or int8 is None:
        return "unrun", "not compared (a run is missing: unrun or failed)"
    if not all(math.isfinite(x) for x in int8):
        return "fail", "NON-FINITE loss"
    diff = max_rel_diff(int8, base)
    if math.isnan(diff):
        return "fail", "not comparable (%d vs %d iterations)" % (len(int8), len(base))
    text = "max rel loss diff %.3g (tolerance %.3g)" % (diff, tolerance)
    return ("pass", text) if diff <= tolerance else ("fail", text + ": OUTSIDE TOLERANCE")


def parse_stats(text):
    """Totals per (kind, path) from `agoq-stats` lines. Counters are totals since the
    communicator was created and interval lines repeat them, so only the last line of each
    (pid, id, kind, path) counts."""
    last = {}
    for line in text.splitlines():
        if not line.startswith("agoq-stats "):
            continue
        f = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        if "kind" in f and "path" in f:
            last[(f.get("pid"), f.get("id"), f["kind"], f["path"])] = f
    totals = {}
    for (_, _, kind, path), f in last.items():
        t = totals.setdefault((kind, path), {"calls": 0, "bytes_in": 0, "wire_raw": 0, "wire_bytes": 0})
        for k in t:
            t[k] += int(f.get(k, 0))
    return totals


def describe_stats(totals):
    parts = []
    for (kind, path), t in sorted(totals.items()):
        if t["calls"]:
            ratio = t["wire_bytes"] / t["wire_raw"] if t["wire_raw"] else 1.0
            parts.append("%s %s %d calls %.1f MB ratio %.3f"
                         % (kind, path, t["calls"], t["bytes_in"] / 1e6, ratio))
    return "; ".join(parts) or "no traffic"


def judge_stats(kind, totals):
    """None if agoq's statistics fit the configuration, else why not."""
    if not totals:
        return "no agoq-stats lines (was agoq loaded?)"
    quant = sum(t["calls"] for (_, path), t in totals.items() if path == "quantized")
    if kind == "agoq-exact" and quant:
        return "%d calls/messages went QUANTIZED under AGOQ_FORMAT=none" % quant
    if kind == "agoq-exact" and not sum(t["calls"] for t in totals.values()):
        return "agoq carried nothing (no CollNet call, no p2p message)"
    if kind == "agoq-int8" and not quant:
        return "nothing went quantized: agoq compressed no collective or p2p"
    return None


def parse_nccl_logs(text):
    """TUNING choices per (collective, algorithm), CollNet channels through agoq, the
    networks NCCL picked, and its first WARN lines."""
    algos = {}
    for m in TUNING_LINE.finditer(text):
        key = "%s %s" % (m.group(1), m.group(3))
        algos[key] = algos.get(key, 0) + 1
    return {"algos": algos, "collnet_agoq": text.count("via COLLNET/AGOQ"),
            "networks": sorted(set(re.findall(r"Using network (\S+)", text))),
            "warn": re.findall(r"[^\n]*NCCL WARN[^\n]*", text)[:3]}


def parse_loss_lines(text):
    """[(iter, loss, grad_norm, ms)] from a rank's output."""
    out = []
    for line in text.splitlines():
        m = LOSS_LINE.match(line.strip())
        if m:
            out.append((int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))))
    return out


# ---- child: one rank ------------------------------------------------------------------------

def patch_for_cpu(torch):
    """Points megatron-core's hard-coded CUDA uses at the CPU (the --cpu rehearsal only):
    device="cuda" literals (token counters, the causal mask, optimizer scalars),
    torch.cuda.current_device() buffers, streams/events/synchronize, the CUDA RNG that the
    tracker forks, and the optimizers' `param.type() == 'torch.cuda.FloatTensor'` checks."""
    import contextlib
    import functools

    cpu = torch.device("cpu")

    def cudaish(d):
        return (isinstance(d, int) and not isinstance(d, bool)) or \
            (isinstance(d, torch.device) and d.type == "cuda") or (isinstance(d, str) and d.startswith("cuda"))

    def redirect(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            if cudaish(k.get("device")):
                k["device"] = cpu
            return fn(*a, **k)
        return wrapper

    for name in ("zeros", "ones", "empty", "full", "tensor", "arange", "rand", "randn", "randint",
                 "zeros_like", "ones_like", "empty_like", "as_tensor"):
        setattr(torch, name, redirect(getattr(torch, name)))
    tensor_to = torch.Tensor.to

    def to(self, *a, **k):
        if a and cudaish(a[0]):
            a = (cpu,) + a[1:]
        if cudaish(k.get("device")):
            k["device"] = cpu
        return tensor_to(self, *a, **k)
    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, *a, **k: self
    tensor_type = torch.Tensor.type

    def type_(self, *a, **k):  # 'torch.FloatTensor' -> 'torch.cuda.FloatTensor' when asked
        t = tensor_type(self, *a, **k)
        return t.replace("torch.", "torch.cuda.", 1) if not a and not k and isinstance(t, str) else t
    torch.Tensor.type = type_

    class Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a):
            pass

        def wait_event(self, *a):
            pass

        def synchronize(self):
            pass

        def record_event(self, *a):
            return Event()

    class Event:
        def __init__(self, *a, **k):
            self.t = time.perf_counter()

        def record(self, *a):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def wait(self, *a):
            pass

        def query(self):
            return True

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.Stream, cuda.Event = Stream, Event
    cuda.current_stream = cuda.default_stream = lambda *a, **k: Stream()
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    cuda.synchronize = cuda.empty_cache = lambda *a, **k: None
    cuda.get_rng_state = cuda.random.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = cuda.random.set_rng_state = lambda s, *a, **k: torch.set_rng_state(s)
    cuda.manual_seed = cuda.random.manual_seed = lambda s: torch.manual_seed(s)
    from megatron.core.tensor_parallel import random as mrandom
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)


class BigramData:
    """A synthetic bigram language: token t+1 is a fixed random successor of token t 90% of
    the time, else uniform. Micro-batch k of data-parallel rank d is a pure function of
    (seed, d, k), so every configuration sees the same data and TP/PP peers agree."""

    def __init__(self, torch, seed, dp_rank, vocab, seq, micro_batch, device):
        self.torch, self.seed, self.dp_rank, self.vocab = torch, seed, dp_rank, vocab
        self.seq, self.mb, self.device, self.index = seq, micro_batch, device, 0
        g = torch.Generator().manual_seed(seed)
        self.successor = torch.randint(vocab, (vocab,), generator=g)

    def __iter__(self):
        return self

    def __next__(self):
        torch = self.torch
        g = torch.Generator().manual_seed((self.seed * 1000003 + self.dp_rank * 7919 + self.index) % (1 << 62))
        self.index += 1
        tok = torch.empty(self.mb, self.seq + 1, dtype=torch.long)
        tok[:, 0] = torch.randint(self.vocab, (self.mb,), generator=g)
        follow = torch.rand(self.mb, self.seq, generator=g) < 0.9
        noise = torch.randint(self.vocab, (self.mb, self.seq), generator=g)
        for t in range(self.seq):
            tok[:, t + 1] = torch.where(follow[:, t], self.successor[tok[:, t]], noise[:, t])
        pos = torch.arange(self.seq, dtype=torch.long).unsqueeze(0).expand(self.mb, -1)
        return {"tokens": tok[:, :-1].contiguous().to(self.device),
                "labels": tok[:, 1:].contiguous().to(self.device),
                "position_ids": pos.contiguous().to(self.device),
                "loss_mask": torch.ones(self.mb, self.seq, dtype=torch.float).to(self.device)}


def child_main(cfg):
    import datetime
    import functools
    import random

    import torch
    import torch.distributed as dist

    if cfg["deterministic"]:
        # Embedding and other backward kernels use atomics on CUDA; without this, two socket
        # runs already differ and agoq-exact can only be judged against a noise floor.
        torch.use_deterministic_algorithms(True, warn_only=True)
    if cfg["cpu"]:
        import megatron.core.tensor_parallel  # noqa: F401 (patch_for_cpu patches into it)
        patch_for_cpu(torch)
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", cfg["device"])
        torch.cuda.set_device(device)
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig
    try:
        from megatron.core.package_info import __version__ as mcore_version
    except ImportError:
        mcore_version = "?"

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]
    # Lazy communicators (no device_id): only the groups actually used get one, which keeps
    # CollNet set-up (one per communicator) to what the training needs.
    dist.init_process_group(backend="gloo" if cfg["cpu"] else "nccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg["timeout"]))
    # CollNet as Megatron-LM's --use-sharp gets it: initialize_model_parallel deletes
    # NCCL_COLLNET_ENABLE, sets it to 1 for the data-parallel(-with-CP) group, creates that
    # communicator with a barrier and deletes it again; without use_sharp no communicator has
    # CollNet and agoq's gradient compression never runs (its tuner WARNs). The forced
    # CollNet algorithm of the agoq runs is scoped the same way.
    dp_algo = os.environ.pop(DP_NCCL_ALGO, None)
    if dp_algo and not cfg["cpu"]:
        os.environ["NCCL_ALGO"] = dp_algo
    try:
        ps.initialize_model_parallel(tp, pp, create_gloo_process_groups=False, use_sharp=not cfg["cpu"])
    finally:
        os.environ.pop("NCCL_ALGO", None)
    pp_rank, tp_rank, dp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(), \
        ps.get_data_parallel_rank()
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()

    seed = cfg["seed"] + 100 * pp_rank  # as Megatron-LM's _set_random_seed
    random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)

    tcfg = TransformerConfig(
        num_layers=cfg["layers"], hidden_size=cfg["hidden"], num_attention_heads=cfg["heads"],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02,
        # These need TransformerEngine, apex or compiled kernels; the local spec has none.
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False)
    model = GPTModel(config=tcfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=cfg["vocab"], max_sequence_length=cfg["seq"],
                     pre_process=first, post_process=last)
    if not cfg["cpu"]:
        model.cuda(device)
    model = Float16Module(tcfg, model)
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=not cfg["grad_reduce_bf16"], overlap_grad_reduce=True,
        use_distributed_optimizer=cfg["distopt"])
    model = DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=model)
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=1.0, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=cfg["distopt"]),
        [model], use_gloo_process_groups=False)
    # Wired as Megatron-LM's train() does.
    tcfg.grad_scale_func = opt.scale_loss
    tcfg.finalize_model_grads_func = finalize_model_grads
    tcfg.no_sync_func = model.no_sync
    tcfg.grad_sync_func = model.start_grad_sync

    def loss_func(loss_mask, output):
        losses = output.float().view(-1)
        mask = loss_mask.view(-1)
        loss = torch.sum(losses * mask) / mask.sum()
        # clone(): the schedule divides the returned loss in place by num_microbatches.
        return loss, {"lm loss": loss.detach().clone()}

    def forward_step(data_iterator, model):
        b = next(data_iterator)
        out = model(b["tokens"], b["position_ids"], None, labels=b["labels"])
        return out, functools.partial(loss_func, b["loss_mask"])

    data = BigramData(torch, cfg["seed"], dp_rank, cfg["vocab"], cfg["seq"], cfg["micro_batch"], device)
    fwd_bwd = get_forward_backward_func()
    reporter = last and tp_rank == 0 and dp_rank == 0
    res = {"rank": rank, "tp_rank": tp_rank, "pp_rank": pp_rank, "dp_rank": dp_rank, "reporter": reporter,
           "torch": torch.__version__, "mcore": mcore_version, "losses": [], "grad_norms": [], "ms": [],
           "params": sum(p.numel() for p in model.parameters()),
           "buckets": [{"numel": b.grad_data.numel(), "dtype": str(b.grad_data.dtype).replace("torch.", ""),
                        "bytes": b.grad_data.numel() * b.grad_data.element_size()}
                       for g in model.bucket_groups for b in g.buckets]}
    if not cfg["cpu"]:
        res["gpu"] = torch.cuda.get_device_name(device)
        v = torch.cuda.nccl.version()
        res["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    for it in range(1, cfg["iters"] + 1):
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        out = fwd_bwd(forward_step_func=forward_step, data_iterator=data, model=[model],
                      num_microbatches=cfg["micro_batches"], seq_length=cfg["seq"],
                      micro_batch_size=cfg["micro_batch"], decoder_seq_length=cfg["seq"], forward_only=False)
        _, grad_norm, _ = opt.step()
        loss = torch.zeros(1, dtype=torch.float, device=device)
        if last:
            loss += torch.stack([x["lm loss"] for x in out]).mean()
            # The global batch's loss, as Megatron-LM averages it across data-parallel ranks.
            dist.all_reduce(loss, group=ps.get_data_parallel_group())
            loss /= dp
        if not cfg["cpu"]:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        res["losses"].append(float(loss.item()))
        res["grad_norms"].append(float(grad_norm) if grad_norm is not None else float("nan"))
        res["ms"].append(ms)
        if reporter:
            print("iter %d loss %r grad_norm %r ms %.1f" % (it, res["losses"][-1], res["grad_norms"][-1], ms),
                  flush=True)
    with open(cfg["result"] + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(cfg["result"] + ".tmp", cfg["result"])
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


# ---- parent ---------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description="Megatron-Core tiny GPT through agoq, N processes on one GPU.")
    p.add_argument("--plugin", help="libnccl-net-agoq.so (default as torch_allreduce_check.py)")
    p.add_argument("--nranks", type=int, default=4, help="processes; tp*pp*dp of every layout (default 4)")
    p.add_argument("--layouts", default="pp2dp2,tp2dp2", help="comma-separated (default pp2dp2,tp2dp2)")
    p.add_argument("--optimizers", default="ddp,distopt",
                   help="ddp and/or distopt (the distributed optimizer) (default ddp,distopt)")
    p.add_argument("--configs", help="default socket,agoq-exact,agoq-int8,socket-again; "
                   "with --cpu socket,socket-again")
    p.add_argument("--iters", type=int, default=20, help="training iterations (default 20)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--micro-batches", type=int, default=4, help="per iteration (default 4)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--grad-reduce-bf16", action="store_true",
                   help="reduce gradients in bf16 (default fp32, as Megatron-LM's --bf16)")
    p.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                   help="do not ask torch for deterministic kernels")
    p.add_argument("--int8-tolerance", type=float, default=0.02,
                   help="largest relative loss difference agoq-int8 vs socket, any iteration (default 0.02)")
    p.add_argument("--mcore-wheel",
                   help="megatron-core wheel to unpack under the log dir and put first on the path")
    p.add_argument("--budget", type=float, default=0, help="seconds for all runs; 0: no limit (default)")
    p.add_argument("--log-dir", help="keep logs here (default: a temporary directory, removed when passed)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run (default 600)")
    p.add_argument("--device", type=int, default=0, help="CUDA device all ranks share")
    p.add_argument("--cpu", action="store_true", help="rehearse with gloo on the CPU (no NCCL, no agoq)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return a
    a.configs = a.configs or ("socket,socket-again" if a.cpu else ",".join(CONFIG_ORDER))
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    a.layout_list, a.optimizer_list, a.config_list = split(a.layouts), split(a.optimizers), split(a.configs)
    if not a.layout_list or not a.optimizer_list or not a.config_list:
        p.error("--layouts, --optimizers and --configs must not be empty")
    a.shapes = {}
    for name in a.layout_list:
        try:
            a.shapes[name] = parse_layout(name)
        except ValueError as e:
            p.error(str(e))
        tp, pp, dp = a.shapes[name]
        if tp * pp * dp != a.nranks:
            p.error("layout %s needs %d ranks, --nranks is %d" % (name, tp * pp * dp, a.nranks))
        if a.heads % tp or a.vocab % tp or a.layers % pp:
            p.error("layout %s: --heads and --vocab must divide by tp, --layers by pp" % name)
    for o in a.optimizer_list:
        if o not in ("ddp", "distopt"):
            p.error("unknown optimizer '%s' (ddp, distopt)" % o)
    for c in a.config_list:
        if not a.cpu and config_kind(c) is None:
            p.error("unknown configuration '%s' (socket*, agoq-exact*, agoq-int8*)" % c)
    if len(set(a.config_list)) != len(a.config_list):
        p.error("--configs repeats a name")
    if a.iters < 1 or a.timeout < 10 or a.nranks < 2:
        p.error("need --iters >= 1, --timeout >= 10 and --nranks >= 2")
    return a


def unpack_wheel(wheel, log_dir):
    """Extracts the wheel (pure Python apart from a dataset helper this does not use) once."""
    dest = os.path.join(log_dir, "mcore-wheel", os.path.basename(wheel)[:-4])
    if not os.path.isfile(os.path.join(dest, ".unpacked")):
        shutil.rmtree(dest, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
        open(os.path.join(dest, ".unpacked"), "w").close()
    return dest


def probe(cpu, device):
    """None when usable, else why not (the check is then skipped)."""
    try:
        import torch
    except ImportError as e:
        return "torch is not installed (%s)" % e
    try:
        with warnings.catch_warnings():  # "Apex is not installed" and the like, said again by every rank
            warnings.simplefilter("ignore")
            import megatron.core  # noqa: F401
            from megatron.core.models.gpt import GPTModel  # noqa: F401
    except Exception as e:  # ImportError, or a dependency of it (triton) that fails to load
        return "megatron-core is not importable (%s: %s); pass --mcore-wheel" % (type(e).__name__, e)
    if cpu:
        return None if torch.distributed.is_gloo_available() else "torch has no gloo"
    try:
        if not torch.distributed.is_nccl_available():
            return "torch.distributed has no NCCL in torch %s" % torch.__version__
        if not torch.cuda.is_available() or torch.cuda.device_count() <= device:
            return "no CUDA device %d for torch %s" % (device, torch.__version__)
    except Exception as e:
        return "CUDA probe failed: %s" % e
    return None


def child_env(args, rank, run, config, plugin, port, log_dir, pythonpath):
    env = dict(os.environ)
    sets, drops = config_env(config, plugin, log_dir, run, args.cpu)
    for k in drops:
        env.pop(k, None)
    env.update(sets)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(args.nranks), "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        # One host id per process: NCCL counts one node per rank, all bytes go over the net.
        "NCCL_HOSTID": "agoq-mcore-%d" % rank, "NCCL_SOCKET_IFNAME": "lo", "NCCL_MNNVL_ENABLE": "0",
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,TUNING",
        "NCCL_DEBUG_FILE": os.path.join(log_dir, run + ".nccl.%h.%p.log"),
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # cuBLAS' condition for deterministic kernels
    })
    # As torchrun does: N ranks each with all cores' OpenMP threads oversubscribe the CPU
    # (10x slower iterations in the --cpu rehearsal on 2 cores).
    env.setdefault("OMP_NUM_THREADS", "1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch(args, run, config, plugin, log_dir, pythonpath, timeout):
    """Runs one configuration's ranks; returns (exit codes, why it stopped early or None,
    whether the stop was the budget's timeout)."""
    layout, optimizer = run.split(".")[:2]
    tp, pp, dp = args.shapes[layout]
    base = {"cpu": args.cpu, "device": args.device, "tp": tp, "pp": pp, "dp": dp,
            "distopt": optimizer == "distopt",
            "iters": args.iters, "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
            "vocab": args.vocab, "seq": args.seq, "micro_batch": args.micro_batch,
            "micro_batches": args.micro_batches, "seed": args.seed, "grad_reduce_bf16": args.grad_reduce_bf16,
            "deterministic": args.deterministic, "timeout": args.timeout}
    port = common.free_port()
    procs, outs = [], []
    try:
        for r in range(args.nranks):
            cfg = dict(base, result=os.path.join(log_dir, "%s.rank%d.json" % (run, r)))
            out = open(os.path.join(log_dir, "%s.rank%d.log" % (run, r)), "w")
            outs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
                env=child_env(args, r, run, config, plugin, port, log_dir, pythonpath),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        deadline, why = time.time() + timeout, None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                return codes, why, False
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed and why is None:
                # The others wait for it in a collective forever: give them a moment, then stop.
                why = "rank %d exited with %d" % (failed[0], codes[failed[0]])
                deadline = min(deadline, time.time() + 10)
            if time.time() > deadline:
                cut = why is None and timeout < args.timeout
                why = why or "timed out after %.0f s" % timeout
                common.stop(procs)
                return [p.poll() for p in procs], why, cut
            time.sleep(0.5)
    finally:
        common.stop(procs)
        for out in outs:
            out.close()


def read_text(pattern):
    text = ""
    for path in sorted(glob.glob(pattern)):
        with open(path, errors="replace") as f:
            text += f.read()
    return text


def collect(args, run, config, codes, why, log_dir):
    """Everything the verdict needs about one finished run."""
    r = {"name": run, "config": config, "failures": [], "losses": None}
    results = {}
    for rank in range(args.nranks):
        path = os.path.join(log_dir, "%s.rank%d.json" % (run, rank))
        if os.path.isfile(path):
            with open(path) as f:
                results[rank] = json.load(f)
    if why:
        r["failures"].append(why)
    for rank, c in enumerate(codes):
        if c != 0 or rank not in results:
            if not (why and c in (-15, -9)):  # those we stopped are said by `why`
                r["failures"].append("rank %d exit %s%s" % (rank, c, "" if rank in results else ", no result"))
            for line in common.tail(os.path.join(log_dir, "%s.rank%d.log" % (run, rank)), 5):
                print("    rank %d: %s" % (rank, line.rstrip()[:220]))
    rep = [x for x in results.values() if x.get("reporter")]
    if rep:
        r["losses"], r["ms"] = rep[0]["losses"], rep[0]["ms"]
        r["info"] = rep[0]
        r["lines"] = parse_loss_lines(read_text(os.path.join(log_dir, "%s.rank%d.log" % (run, rep[0]["rank"]))))
        if len(r["losses"]) != args.iters:
            r["failures"].append("%d of %d iterations" % (len(r["losses"]), args.iters))
        if not all(math.isfinite(x) for x in r["losses"]):
            r["failures"].append("NON-FINITE loss")
    elif not r["failures"]:
        r["failures"].append("no reporting rank wrote results")
    r["buckets"] = {rank: x["buckets"] for rank, x in sorted(results.items())}
    r["params"] = {rank: x["params"] for rank, x in sorted(results.items())}
    if not args.cpu:
        r["nccl"] = parse_nccl_logs(read_text(os.path.join(log_dir, run + ".nccl.*.log")))
        kind = config_kind(config)
        want = "Socket" if kind == "socket" else "AGOQ"
        if r["nccl"]["networks"] and want not in r["nccl"]["networks"]:
            r["failures"].append("NCCL used network %s, not %s" % ("/".join(r["nccl"]["networks"]), want))
        if kind != "socket":
            r["stats"] = parse_stats(read_text(os.path.join(log_dir, run + ".stats.*")))
            bad = judge_stats(kind, r["stats"])
            if bad and codes and all(c == 0 for c in codes):
                r["failures"].append(bad)
    return r


def report_run(r, elapsed):
    for it, loss, gn, ms in r.get("lines", []):
        print("  %s iter %d loss %r grad_norm %r ms %.1f" % (r["name"], it, loss, gn, ms))
    ms = sorted((r.get("ms") or [])[1:] or r.get("ms") or [])  # the first iteration warms up
    info = r.get("info", {})
    buckets = sorted(set("%d %s (%.1f MB)" % (b["numel"], b["dtype"], b["bytes"] / 1e6)
                         for bs in r["buckets"].values() for b in bs))
    log("%s: %s in %.0f s%s; params per rank %s; grad buckets %s" % (
        r["name"], "%d iterations, loss %.4f -> %.4f" % (len(r["losses"]), r["losses"][0], r["losses"][-1])
        if r["losses"] else "no losses", elapsed,
        ", median %.0f ms/iteration" % ms[len(ms) // 2] if ms else "",
        "/".join(str(v) for v in sorted(set(r["params"].values()))) or "?", ", ".join(buckets) or "?"))
    if info.get("nccl"):
        log("%s: torch %s, megatron-core %s, NCCL %s, %s" % (r["name"], info["torch"], info["mcore"], info["nccl"],
                                                            info.get("gpu")))
    if "nccl" in r:
        n = r["nccl"]
        log("%s: network %s, %d 'via COLLNET/AGOQ', algorithms: %s" % (
            r["name"], "/".join(n["networks"]) or "?", n["collnet_agoq"],
            ", ".join("%s x%d" % kv for kv in sorted(n["algos"].items())) or "no TUNING lines"))
        for w in n["warn"]:
            log("%s:   %s" % (r["name"], w.strip()[:200]))
    if "stats" in r:
        log("%s: agoq compressed: %s" % (r["name"], describe_stats(r["stats"])))
    for f in r["failures"]:
        log("%s: FAILED: %s" % (r["name"], f))


def compare(args, runs):
    """One line per comparison; returns (failures, inconclusive)."""
    failures, inconclusive = [], []

    def losses(name):
        r = runs.get(name)
        return r["losses"] if r and not r["failures"] else None

    for layout in args.layout_list:
        for opt in args.optimizer_list:
            pre = "%s.%s" % (layout, opt)
            if args.cpu:  # repeated gloo runs must be bit-identical
                names = plan_runs([layout], [opt], args.config_list)
                ref = losses(names[0])
                for n in names[1:]:
                    v, text = judge_exact(ref, losses(n), None)
                    log("%s: %s vs %s: %s" % (pre, n.split(".")[2], names[0].split(".")[2], text))
                    if v in ("fail", "inconclusive"):
                        failures.append("%s %s" % (n, text))
                continue
            base, again = losses(pre + ".socket"), losses(pre + ".socket-again")
            if base is not None and again is not None:
                log("%s: socket-again vs socket: %s" % (pre, judge_exact(base, again, None)[1]))
            if "agoq-exact" in args.config_list:
                v, text = judge_exact(base, losses(pre + ".agoq-exact"), again)
                log("%s: agoq-exact vs socket: %s" % (pre, text))
                (failures if v == "fail" else inconclusive if v == "inconclusive" else []).append(
                    "%s.agoq-exact: %s" % (pre, text))
            if "agoq-int8" in args.config_list:
                v, text = judge_int8(base, losses(pre + ".agoq-int8"), args.int8_tolerance)
                log("%s: agoq-int8 vs socket: %s" % (pre, text))
                if v == "fail":
                    failures.append("%s.agoq-int8: %s" % (pre, text))
    return failures, inconclusive


def parent_main(args):
    keep = args.log_dir is not None
    log_dir = os.path.abspath(args.log_dir) if keep else tempfile.mkdtemp(prefix="agoq-mcore-check.")
    os.makedirs(log_dir, exist_ok=True)
    rc = check(args, log_dir)
    if rc != EXIT_FAIL and not keep:  # a failure's logs are kept, whatever --log-dir says
        shutil.rmtree(log_dir, ignore_errors=True)
    return rc


def check(args, log_dir):
    pythonpath = None
    if args.mcore_wheel:
        try:
            pythonpath = unpack_wheel(os.path.abspath(args.mcore_wheel), log_dir)
        except (OSError, zipfile.BadZipFile) as e:
            log("cannot unpack %s: %s" % (args.mcore_wheel, e))
            return EXIT_SETUP
        sys.path.insert(0, pythonpath)
    why_not = probe(args.cpu, args.device)
    if why_not:
        log("SKIPPED: " + why_not)
        return EXIT_SKIP
    plugin = None
    if not args.cpu and any(config_kind(c) != "socket" for c in args.config_list):
        plugin = common.find_plugin(args.plugin)
        if plugin is None:
            log("no plugin found (%s): build it, or pass --plugin PATH"
                % (args.plugin or os.environ.get("AGOQ_PLUGIN_PATH") or "<repo>/build*/lib/libnccl-net-agoq.so"))
            return EXIT_SETUP
    plan = plan_runs(args.layout_list, args.optimizer_list, args.config_list)
    for name in plan:
        for old in glob.glob(os.path.join(log_dir, name + ".*")):
            os.remove(old)
    where = " on the CPU (gloo)" if args.cpu else " on cuda:%d" % args.device
    log("%d runs x %d ranks%s: %d iterations of %d x %d x %d tokens, %d layers, hidden %d, %s gradient "
        "reduction; plugin %s" % (len(plan), args.nranks, where, args.iters, args.micro_batches,
                                  args.micro_batch, args.seq, args.layers, args.hidden,
                                  "bf16" if args.grad_reduce_bf16 else "fp32", plugin or "-"))
    t0 = time.time()
    runs, unrun, failures, estimate = {}, [], [], None
    for name in plan:
        remaining = args.budget - (time.time() - t0) if args.budget > 0 else float("inf")
        if not budget_allows(remaining, estimate):
            log("%s: unrun (budget)" % name)
            unrun.append(name)
            continue
        start = time.time()
        codes, why, cut = launch(args, name, name.split(".")[2], plugin, log_dir, pythonpath,
                                 min(args.timeout, remaining))
        elapsed = time.time() - start
        if cut:
            log("%s: unrun (budget: cut after %.0f s)" % (name, elapsed))
            unrun.append(name)
            continue
        r = collect(args, name, name.split(".")[2], codes, why, log_dir)
        runs[name] = r
        estimate = max(estimate or 0, elapsed)
        report_run(r, elapsed)
        failures += ["%s: %s" % (name, f) for f in r["failures"]]
    cmp_fail, inconclusive = compare(args, runs)
    failures += cmp_fail
    total = time.time() - t0
    if failures:
        log("logs kept in " + log_dir)
        log("FAILED (%.0f s, %d runs, %d unrun): %s"
            % (total, len(runs), len(unrun), "; ".join(failures[:6])))
        return EXIT_FAIL
    note = ", %d unrun (budget)" % len(unrun) if unrun else ""
    if inconclusive:
        note += ", %d inconclusive: %s" % (len(inconclusive), "; ".join(inconclusive))
    log("PASSED (%.0f s, %d runs%s)" % (total, len(runs), note))
    return EXIT_OK


def main(argv):
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
