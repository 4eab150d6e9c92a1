#!/usr/bin/env python3
"""Unit tests of megatron_check.py's pure logic: stdlib only, no torch, no megatron-core.

usage: python3 tools/gpu/test_megatron_check.py [-v]
"""
import contextlib
import io
import math
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_check as mc  # noqa: E402

NAN = float("nan")
BASE = [6.970888137817383, 6.25628137588501, 5.80191707611084]

# The plugin's own lines (docs/usage.md, "Statistics"), plus an earlier interval line of the
# same communicator whose counters the exit line supersedes.
STATS = """\
agoq-stats pid=4079 host=vm event=interval id=3 comm=0x55da7cd77ea0 kind=collnet rank=0 nranks=2 path=quantized calls=1 bytes_in=200000 wire_raw=200000 wire_bytes=103336 ratio=0.517 codec_ms=1.0 crc_ms=0.0 wire_ms=1.0 device_calls=0 pcie_d2h=0 pcie_h2d=0 gpu_ms=0.000 format=int8 block=128 min_bytes=65536 chunk=1048576
agoq-stats pid=4079 host=vm event=exit id=3 comm=0x55da7cd77ea0 kind=collnet rank=0 nranks=2 path=quantized calls=3 bytes_in=600000 wire_raw=600000 wire_bytes=310008 ratio=0.517 codec_ms=4.664 crc_ms=0.098 wire_ms=5.070 device_calls=0 pcie_d2h=0 pcie_h2d=0 gpu_ms=0.000 format=int8 block=128 min_bytes=65536 chunk=1048576
agoq-stats pid=4079 host=vm event=exit id=3 comm=0x55da7cd77ea0 kind=collnet rank=0 nranks=2 path=exact calls=4 bytes_in=469534 wire_raw=469534 wire_bytes=469534 ratio=1.000 codec_ms=0.492 crc_ms=0.000 wire_ms=0.212 device_calls=0 pcie_d2h=0 pcie_h2d=0 gpu_ms=0.000 format=int8 block=128 min_bytes=65536 chunk=1048576 exact_type=1 exact_op=1 exact_small=2 exact_ll=0 exact_unknown=0 exact_format_none=0 exact_collective=0 exact_nogain=0 exact_one_way=0
agoq-stats pid=4105 host=vm event=exit id=1 comm=0x5623270792e0 kind=p2p_send path=quantized calls=2 bytes_in=4194304 wire_raw=4194304 wire_bytes=2164736 ratio=0.516 codec_ms=1.0 crc_ms=0.1 wire_ms=2.0 device_calls=2 pcie_d2h=0 pcie_h2d=0 gpu_ms=0.5 format=int8 block=128 min_bytes=1048576
unrelated line
"""

NCCL_LOG = """\
gpu:100:100 [0] NCCL INFO Using network AGOQ
gpu:100:100 [0] NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/AGOQ/0
gpu:100:100 [0] NCCL INFO CollNet 00/0 : 0 [receive] via COLLNET/AGOQ/0
gpu:100:100 [0] NCCL INFO AllReduce: 7432192 Bytes -> Algo CollNetChain proto Simple channel{Lo..Hi}={0..1}
gpu:100:100 [0] NCCL INFO AllReduce: 4 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..0}
gpu:100:100 [0] NCCL INFO AllReduce: 7432192 Bytes -> Algo CollNetChain proto Simple channel{Lo..Hi}={0..1}
gpu:100:100 [0] NCCL INFO ReduceScatter: 3716096 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..3}
gpu:100:100 [0] NCCL WARN NET/AGOQ something odd
"""


class ComparisonRule(unittest.TestCase):
    def test_identical_passes(self):
        v, text = mc.judge_exact(BASE, list(BASE), None)
        self.assertEqual(v, "pass")
        self.assertIn("identical (3 iterations)", text)

    def test_within_noise_passes(self):
        again = [BASE[0], BASE[1] * (1 + 4e-7), BASE[2]]
        exact = [BASE[0] * (1 + 2e-7), BASE[1], BASE[2]]
        v, text = mc.judge_exact(BASE, exact, again)
        self.assertEqual(v, "pass", text)
        self.assertIn("within noise", text)

    def test_outside_noise_fails(self):
        again = [BASE[0], BASE[1] * (1 + 1e-7), BASE[2]]
        exact = [BASE[0], BASE[1], BASE[2] * (1 + 1e-5)]
        self.assertEqual(mc.judge_exact(BASE, exact, again)[0], "fail")

    def test_zero_noise_demands_identity(self):
        exact = [BASE[0], BASE[1], math.nextafter(BASE[2], 10.0)]
        v, text = mc.judge_exact(BASE, exact, list(BASE))
        self.assertEqual(v, "fail", text)

    def test_difference_without_noise_floor_is_inconclusive(self):
        exact = [BASE[0], BASE[1], BASE[2] * (1 + 1e-6)]
        self.assertEqual(mc.judge_exact(BASE, exact, None)[0], "inconclusive")

    def test_nan_fails(self):
        self.assertEqual(mc.judge_exact(BASE, [BASE[0], NAN, BASE[2]], list(BASE))[0], "fail")
        self.assertEqual(mc.judge_int8(BASE, [BASE[0], BASE[1], float("inf")], 0.02),
                         ("fail", "NON-FINITE loss"))

    def test_short_run_fails(self):
        self.assertEqual(mc.judge_exact(BASE, BASE[:2], list(BASE))[0], "fail")
        self.assertTrue(math.isnan(mc.max_rel_diff(BASE[:2], BASE)))

    def test_int8_tolerance(self):
        inside = [x * (1 + 0.019) for x in BASE]
        outside = [BASE[0], BASE[1] * (1 - 0.021), BASE[2]]
        self.assertEqual(mc.judge_int8(BASE, inside, 0.02)[0], "pass")
        v, text = mc.judge_int8(BASE, outside, 0.02)
        self.assertEqual(v, "fail")
        self.assertIn("0.021", text)

    def test_missing_run_is_unrun(self):
        self.assertEqual(mc.judge_exact(BASE, None, None)[0], "unrun")
        self.assertEqual(mc.judge_exact(None, BASE, BASE)[0], "unrun")
        self.assertEqual(mc.judge_int8(BASE, None, 0.02)[0], "unrun")


class AgoqStats(unittest.TestCase):
    def test_last_line_per_communicator_counts(self):
        t = mc.parse_stats(STATS)
        self.assertEqual(t[("collnet", "quantized")],
                         {"calls": 3, "bytes_in": 600000, "wire_raw": 600000, "wire_bytes": 310008})
        self.assertEqual(t[("collnet", "exact")]["calls"], 4)
        self.assertEqual(t[("p2p_send", "quantized")]["wire_bytes"], 2164736)
        self.assertEqual(len(t), 3)

    def test_description_gives_ratios(self):
        text = mc.describe_stats(mc.parse_stats(STATS))
        self.assertIn("collnet quantized 3 calls 0.6 MB ratio 0.517", text)
        self.assertIn("p2p_send quantized 2 calls 4.2 MB ratio 0.516", text)

    def test_verdicts(self):
        t = mc.parse_stats(STATS)
        self.assertIsNone(mc.judge_stats("agoq-int8", t))
        self.assertIn("QUANTIZED", mc.judge_stats("agoq-exact", t))
        exact_only = {k: v for k, v in t.items() if k[1] == "exact"}
        self.assertIsNone(mc.judge_stats("agoq-exact", exact_only))
        self.assertIn("nothing went quantized", mc.judge_stats("agoq-int8", exact_only))
        self.assertIn("no agoq-stats", mc.judge_stats("agoq-exact", {}))
        idle = {("collnet", "exact"): {"calls": 0, "bytes_in": 0, "wire_raw": 0, "wire_bytes": 0}}
        self.assertIn("carried nothing", mc.judge_stats("agoq-exact", idle))


class NcclLogs(unittest.TestCase):
    def test_tuning_counts(self):
        f = mc.parse_nccl_logs(NCCL_LOG)
        self.assertEqual(f["algos"], {"AllReduce CollNetChain": 2, "AllReduce Ring": 1, "ReduceScatter Ring": 1})
        self.assertEqual(f["collnet_agoq"], 2)
        self.assertEqual(f["networks"], ["AGOQ"])
        self.assertEqual(len(f["warn"]), 1)

    def test_loss_lines_round_trip(self):
        text = "noise\niter 1 loss %r grad_norm %r ms 12.5\niter 2 loss nan grad_norm 1.0 ms 3.0\n" % (BASE[0], 3.89)
        lines = mc.parse_loss_lines(text)
        self.assertEqual(lines[0], (1, BASE[0], 3.89, 12.5))
        self.assertTrue(math.isnan(lines[1][1]))


class Planning(unittest.TestCase):
    def test_layouts(self):
        self.assertEqual(mc.parse_layout("pp2dp2"), (1, 2, 2))
        self.assertEqual(mc.parse_layout("tp2dp2"), (2, 1, 2))
        self.assertEqual(mc.parse_layout("tp2pp2"), (2, 2, 1))
        for bad in ("", "dp2tp2", "pp0dp4", "xx"):
            self.assertRaises(ValueError, mc.parse_layout, bad)

    def test_run_order_leaves_pairs(self):
        plan = mc.plan_runs(["pp2dp2", "tp2dp2"], ["ddp", "distopt"],
                            ["socket-again", "agoq-int8", "mine", "socket", "agoq-exact"])
        self.assertEqual(plan[:5], ["pp2dp2.ddp.socket", "pp2dp2.ddp.agoq-exact", "pp2dp2.ddp.agoq-int8",
                                    "pp2dp2.ddp.socket-again", "pp2dp2.ddp.mine"])
        self.assertEqual(plan[5], "tp2dp2.ddp.socket")
        self.assertEqual(plan[10], "pp2dp2.distopt.socket")
        self.assertEqual(plan[-1], "tp2dp2.distopt.mine")
        self.assertEqual(len(plan), 20)

    def test_budget(self):
        self.assertTrue(mc.budget_allows(float("inf"), 500))
        self.assertTrue(mc.budget_allows(10, None))
        self.assertTrue(mc.budget_allows(100, 100))
        self.assertFalse(mc.budget_allows(99, 100))
        self.assertFalse(mc.budget_allows(0, None))

    def test_config_env(self):
        s, drop = mc.config_env("socket-again", "/p.so", "/l", "r", False)
        self.assertEqual(s, {"NCCL_NET_PLUGIN": "none", "NCCL_NET": "Socket"})
        self.assertIn("AGOQ_FORMAT", drop)
        s, drop = mc.config_env("agoq-exact", "/p.so", "/l", "r", False)
        self.assertEqual((s["AGOQ_FORMAT"], s["AGOQ_P2P_FORMAT"], s[mc.DP_NCCL_ALGO]),
                         ("none", "none", "allreduce:CollNetChain"))
        self.assertEqual(s["AGOQ_STATS_FILE"], "/l/r.stats.%p")
        s, drop = mc.config_env("agoq-int8", "/p.so", "/l", "r", False)
        self.assertEqual((s["AGOQ_FORMAT"], s["NCCL_NET_PLUGIN"]), ("int8", "/p.so"))
        # Megatron-Core's initialize_model_parallel(use_sharp=True) sets NCCL_COLLNET_ENABLE for
        # the data-parallel group only; a global NCCL_ALGO=allreduce:CollNetChain failed every
        # AllReduce of the other communicators on an H200 (2026-12-04: "no algorithm/protocol
        # available for function AllReduce").
        self.assertNotIn("NCCL_COLLNET_ENABLE", s)
        self.assertIn("NCCL_COLLNET_ENABLE", drop)
        self.assertNotIn("NCCL_ALGO", s)
        self.assertIn("NCCL_ALGO", drop)
        self.assertEqual(s[mc.DP_NCCL_ALGO], "allreduce:CollNetChain")
        self.assertNotIn(mc.DP_NCCL_ALGO, drop)
        self.assertEqual(s["AGOQ_P2P_FORMAT"], "int8")  # opt-in: the plugin's default is none
        self.assertNotIn("AGOQ_P2P_FORMAT", drop)
        self.assertIn("AGOQ_P2P_SCOPE", drop)  # the plugin's default, pipeline
        self.assertEqual(mc.config_env("agoq-int8", "/p.so", "/l", "r", True)[0], {})

    def test_args(self):
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertRaises(SystemExit, mc.parse_args, ["--layouts", "tp2dp4"])       # 8 ranks, not 4
            self.assertRaises(SystemExit, mc.parse_args, ["--configs", "socket,mine"])  # GPU: unknown
        a = mc.parse_args(["--cpu", "--configs", "socket,mine"])
        self.assertEqual(a.config_list, ["socket", "mine"])
        self.assertEqual(mc.parse_args([]).config_list, mc.CONFIG_ORDER)


class Collect(unittest.TestCase):
    """collect() on the files a GPU run leaves, written here by hand."""

    def setUp(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="test-mcore-collect.")
        self.args = mc.parse_args(["--iters", "3"])

    def tearDown(self):
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def fake_run(self, run, nccl, stats):
        import json
        for r in range(4):
            res = {"rank": r, "reporter": r == 2, "losses": BASE, "ms": [5.0, 4.0, 4.0], "params": 1842176,
                   "buckets": [{"numel": 1842176, "dtype": "float32", "bytes": 7368704}], "torch": "t", "mcore": "m"}
            self.write("%s.rank%d.json" % (run, r), json.dumps(res))
            self.write("%s.rank%d.log" % (run, r), "iter 1 loss %r grad_norm 1.5 ms 5.0\n" % BASE[0] if r == 2 else "")
        self.write("%s.nccl.gpu.100.log" % run, nccl)
        if stats:
            self.write("%s.stats.100" % run, stats)
        return mc.collect(self.args, run, run.split(".")[2], [0] * 4, None, self.dir)

    def test_int8_run(self):
        r = self.fake_run("pp2dp2.ddp.agoq-int8", NCCL_LOG, STATS)
        self.assertEqual(r["failures"], [])
        self.assertEqual(r["losses"], BASE)
        self.assertEqual(r["lines"], [(1, BASE[0], 1.5, 5.0)])
        self.assertEqual(r["stats"][("collnet", "quantized")]["calls"], 3)
        self.assertEqual(r["nccl"]["algos"]["AllReduce CollNetChain"], 2)

    def test_exact_run_that_quantized_fails(self):
        r = self.fake_run("pp2dp2.ddp.agoq-exact", NCCL_LOG, STATS)
        self.assertTrue(any("QUANTIZED" in f for f in r["failures"]), r["failures"])

    def test_int8_run_without_stats_fails(self):
        r = self.fake_run("pp2dp2.ddp.agoq-int8", NCCL_LOG, "")
        self.assertTrue(any("no agoq-stats" in f for f in r["failures"]), r["failures"])

    def test_socket_run_through_agoq_fails(self):
        r = self.fake_run("tp2dp2.ddp.socket", NCCL_LOG, "")
        self.assertTrue(any("not Socket" in f for f in r["failures"]), r["failures"])
        r = self.fake_run("tp2dp2.ddp.socket-again", NCCL_LOG.replace("AGOQ", "Socket"), "")
        self.assertEqual(r["failures"], [])

    def test_missing_rank_result_fails(self):
        r = self.fake_run("pp2dp2.ddp.agoq-int8", NCCL_LOG, STATS)
        os.remove(os.path.join(self.dir, "pp2dp2.ddp.agoq-int8.rank1.json"))
        with contextlib.redirect_stdout(io.StringIO()):
            r = mc.collect(self.args, "pp2dp2.ddp.agoq-int8", "agoq-int8", [0] * 4, None, self.dir)
        self.assertTrue(any("rank 1" in f for f in r["failures"]), r["failures"])


class Parent(unittest.TestCase):
    """parent_main with the runs faked: each takes 100 s of a fake clock."""

    def run_parent(self, argv, losses_by_config):
        clock = [0.0]
        fake_time = types.SimpleNamespace(time=lambda: clock[0], sleep=lambda s: None)

        def launch(args, run, config, plugin, log_dir, pythonpath, timeout):
            clock[0] += min(100.0, timeout)
            return [0] * args.nranks, None, timeout < 100.0

        def collect(args, run, config, codes, why, log_dir):
            losses = losses_by_config[config]
            return {"name": run, "config": config, "losses": losses, "ms": [1.0] * len(losses),
                    "failures": [] if all(math.isfinite(x) for x in losses) else ["NON-FINITE loss"],
                    "buckets": {}, "params": {}}

        saved = (mc.time, mc.launch, mc.collect, mc.probe, mc.common.find_plugin)
        mc.time, mc.launch, mc.collect = fake_time, launch, collect
        mc.probe, mc.common.find_plugin = (lambda cpu, device: None), (lambda explicit: "/fake/plugin.so")
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                rc = mc.parent_main(mc.parse_args(argv + ["--log-dir", self.log_dir, "--iters", "3"]))
        finally:
            mc.time, mc.launch, mc.collect, mc.probe, mc.common.find_plugin = saved
        return rc, out.getvalue()

    def setUp(self):
        import tempfile
        self.log_dir = tempfile.mkdtemp(prefix="test-mcore-check.")

    def tearDown(self):
        import shutil
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def test_budget_cut_is_unrun_not_failed(self):
        losses = {"socket": BASE, "agoq-exact": list(BASE), "agoq-int8": [x * 1.001 for x in BASE],
                  "socket-again": list(BASE)}
        rc, out = self.run_parent(["--layouts", "pp2dp2", "--optimizers", "ddp", "--budget", "250"], losses)
        self.assertEqual(rc, mc.EXIT_OK, out)
        self.assertIn("pp2dp2.ddp.agoq-int8: unrun (budget)", out)
        self.assertIn("pp2dp2.ddp.socket-again: unrun (budget)", out)
        self.assertIn("agoq-exact vs socket: identical", out)
        self.assertIn("PASSED", out)
        self.assertIn("2 unrun (budget)", out)

    def test_int8_outside_tolerance_fails(self):
        losses = {"socket": BASE, "agoq-exact": list(BASE), "agoq-int8": [x * 1.05 for x in BASE],
                  "socket-again": list(BASE)}
        rc, out = self.run_parent(["--layouts", "pp2dp2", "--optimizers", "ddp"], losses)
        self.assertEqual(rc, mc.EXIT_FAIL, out)
        self.assertIn("OUTSIDE TOLERANCE", out)

    def test_nan_in_a_run_fails(self):
        losses = {"socket": BASE, "agoq-exact": list(BASE), "agoq-int8": [BASE[0], NAN, BASE[2]],
                  "socket-again": list(BASE)}
        rc, out = self.run_parent(["--layouts", "tp2dp2", "--optimizers", "distopt"], losses)
        self.assertEqual(rc, mc.EXIT_FAIL, out)
        self.assertIn("FAILED", out)

    def test_cpu_repeats_must_be_identical(self):
        losses = {"socket": BASE, "socket-again": [BASE[0], BASE[1], BASE[2] * (1 + 1e-7)]}
        rc, out = self.run_parent(["--cpu", "--layouts", "pp2dp2", "--optimizers", "ddp"], losses)
        self.assertEqual(rc, mc.EXIT_FAIL, out)
        losses["socket-again"] = list(BASE)
        rc, out = self.run_parent(["--cpu", "--layouts", "pp2dp2", "--optimizers", "ddp"], losses)
        self.assertEqual(rc, mc.EXIT_OK, out)


if __name__ == "__main__":
    unittest.main()
