#!/usr/bin/env python3
"""Unit tests of gpu_check_summary.py (tools/gpu-check.sh's summary and verdict) on synthetic
log directories: stdlib only, no GPU.

usage: python3 tools/gpu/test_gpu_check_summary.py [-v]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_check_summary as gs  # noqa: E402

SCRIPT = os.path.join(HERE, "..", "gpu-check.sh")

HEADER = """\
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def table(rows, oob=None, avg=None):
    """An nccl-tests result table: rows of (size, busbw_out, wrong_out, busbw_in, wrong_in);
    the footer unless oob is None ("stopped early")."""
    text = HEADER
    for size, bo, wo, bi, wi in rows:
        text += ("%12d %13d     float     sum      -1   100.0   %6.2f  %6s  %5s   99.0   %6.2f"
                 "  %6s  %5s\n" % (size, size // 4, 1.0, bo, wo, 1.0, bi, wi))
    if oob is not None:
        text += "# Out of bounds values : %s %s\n" % (oob, "OK" if oob == 0 else "FAILED")
        text += "# Avg bus bandwidth    : %s \n" % avg
    return text


OK_TABLE = table([(8, "0.01", "0", "0.02", "0"), (1048576, "10.00", "0", "12.00", "0"),
                  (16777216, "20.00", "0", "19.00", "0")], oob=0, avg="10.5")


def nccl_log(net="AGOQ", gdr=False, collnet=False, extra=""):
    path = "NET/%s/0%s" % (net, "/GDRDMA" if gdr else "")
    text = "h:1:1 [0] NCCL INFO Using network %s\n" % net
    if net == "AGOQ":
        text += "h:1:1 [0] NCCL INFO NET/AGOQ : plugin loaded, 1 device\n"
    text += "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via %s\n" % path
    if collnet:
        text += "h:1:1 [0] NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/AGOQ/0%s\n" % (
            "/GDRDMA" if gdr else "")
    return text + extra


def stats_line(pid, kind, bytes_in, pcie=0, device_calls=0, event="exit", path="quantized"):
    """One line of the plugin's statistics (docs/usage.md); one communicator per kind."""
    cid = {"collnet": 1, "p2p_send": 2, "p2p_recv": 3}[kind]
    return ("agoq-stats pid=%d host=h event=%s id=%d comm=0x1 kind=%s path=%s calls=1 "
            "bytes_in=%d wire_bytes=1 device_calls=%d pcie_d2h=%d pcie_h2d=%d format=int8\n"
            % (pid, event, cid, kind, path, bytes_in, device_calls, pcie // 2, pcie - pcie // 2))


class LogDir:
    """A synthetic OUT_DIR/logs, as gpu-check.sh leaves it."""

    def __init__(self, nranks=2):
        self.out_dir = tempfile.mkdtemp(prefix="gpu-check-summary-")
        self.logs = os.path.join(self.out_dir, "logs")
        os.makedirs(self.logs)
        self.write("runs.txt", "")
        self.write("settings.txt", "nranks %d\n" % nranks)
        self.write("env.txt",
                   "host: Linux 6.8 x86_64, 16 CPUs\ngpu: 0, NVIDIA H200, 570, Default\n")

    def write(self, name, text, mode="w"):
        path = os.path.join(self.logs, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, mode) as f:
            f.write(text)

    def run(self, config, test, rc="0", out=OK_TABLE, nccl=None, stats="", cpu="1.50 0.50",
            nprocs=2):
        """One run; nccl: the text of each process's NCCL log (default: through the network
        the configuration asks for, GDRDMA for -gdr, CollNet for collnet*)."""
        run = config + "." + test
        self.write("runs.txt", "%s %s %s\n" % (run, config, test), mode="a")
        self.write(run + ".rc", "%s\n" % rc)
        self.write(run + ".out", out)
        if cpu is not None:
            self.write(run + ".cpu", cpu + "\n")
        if nccl is None:
            net = "AGOQ" if gs.is_agoq_config(config) else "Socket"
            nccl = nccl_log(net, gs.is_gdr_config(config), gs.is_collnet_config(config))
        if nccl:
            for p in range(nprocs):
                self.write("%s.nccl.h.%d.log" % (run, 100 + p), nccl)
        if stats:
            self.write(run + ".stats.100", stats)
        return run

    def check(self, name, rc, out=""):
        self.write(name + ".rc", "%s\n" % rc)
        self.write(name + ".out", out)

    def summarize(self):
        text, status = gs.summarize(self.out_dir, elapsed="12")
        return text, status

    def cleanup(self):
        shutil.rmtree(self.out_dir)


def row_of(text, run):
    """The table row of a run (its first line starting with the run's name and a blank)."""
    for ln in text.split("\n"):
        if ln.startswith(run + " "):
            return ln
    raise AssertionError("no row for %s in:\n%s" % (run, text))


def verdict_of(text):
    return [ln for ln in text.split("\n") if ln.startswith("VERDICT: ")][0]


class Base(unittest.TestCase):
    def setUp(self):
        self.d = LogDir()
        self.addCleanup(self.d.cleanup)


class AllPassing(Base):
    """Every kind of run and check present and passing."""

    def setUp(self):
        super().setUp()
        d = self.d
        lossy = table([(8, "0.01", "0", "0.02", "0"), (1048576, "10.50", "12", "12.60", "1.2e+06"),
                       (16777216, "19.20", "0", "18.00", "3")], oob=3, avg="10.7")
        d.run("agoq-exact", "all_reduce", stats=stats_line(100, "collnet", 0)
              + stats_line(100, "p2p_send", 4000000) + stats_line(100, "p2p_recv", 4000000))
        d.run("agoq-int8", "all_reduce", rc="7", out=lossy,
              stats=stats_line(100, "collnet", 1000000000))
        d.run("socket", "all_reduce", out=table([(8, "0.01", "0", "0.01", "0"),
                                                 (1048576, "5.00", "0", "6.00", "0")],
                                                oob=0, avg="5.25"))
        d.run("agoq-exact-gdr", "all_reduce",
              stats=stats_line(100, "p2p_send", 2000000, pcie=1000000, device_calls=5)
              + stats_line(100, "p2p_recv", 2000000, pcie=1000000, device_calls=5))
        d.run("collnet-gdr", "all_reduce",
              stats=stats_line(100, "collnet", 4000000, pcie=2000000, device_calls=3))
        d.run("agoq-exact", "sendrecv", stats=stats_line(100, "p2p_send", 1000))
        d.run("socket", "sendrecv")
        d.write("hazards.out", "fact: driver CUDA 12.8, runtime 12.8\nhazard: hwq "
                "CUDA_DEVICE_MAX_CONNECTIONS=8 priority=greatest streams=18: OK\nnoise\n")
        d.check("codec", 0, "codec_gpu_check: device 0\nthroughput: memcpy D2D 2000.0 GB/s\n"
                "codec verdict: CUDA codec bit-identical to the CPU codec (1234 checks)\n")
        d.check("torch", 0, "torch-check: torch 2.6.0, NCCL 2.28.9\n"
                "    elements        bytes     rel_l2\n     1048576      2097152  3.1e-03\n"
                "torch-check: PASSED (3 s): 1 sizes\ntorch-check: chatter\n")
        d.check("torch-gdr", 0, "torch-check: PASSED (3 s)\n")
        d.write("torch-gdr/rank0.log", "NCCL INFO Channel 00 via NET/AGOQ/0/GDRDMA\n")
        d.write("torch-gdr/stats.1", "agoq-stats kind=collnet device_calls=4\n")
        d.check("mcore", 0, "mcore-check: run socket iter 1 loss 6.9\nmcore-check: exact vs "
                "socket: identical\nmcore-check: PASSED\n")

    def test_verdict_and_status(self):
        text, status = self.d.summarize()
        self.assertEqual(status, 0, text)
        self.assertEqual(verdict_of(text), "VERDICT: agoq runs correct")
        self.assertTrue(text.startswith("agoq GPU check: 2 processes on one GPU, each its own "
                                        "NCCL_HOSTID; loopback\n  host: Linux 6.8"))
        self.assertTrue(text.endswith("elapsed: 12 s; logs: %s/logs.tar.gz\n" % self.d.out_dir))

    def test_table_rows(self):
        text, _ = self.d.summarize()
        self.assertRegex(row_of(text, "agoq-exact.all_reduce"),
                         r"^agoq-exact\.all_reduce +0 +AGOQx2 +0 +10\.500 +20\.000 +3  ok; "
                         r"NET/AGOQ log lines: 4$")
        self.assertRegex(row_of(text, "socket.all_reduce"),
                         r"^socket\.all_reduce +0 +Socketx2 +0 +5\.250 +6\.000 +2  ok$")
        self.assertRegex(row_of(text, "collnet-gdr.all_reduce"),
                         r"ok; NET/AGOQ log lines: 4; via COLLNET/AGOQ: 2$")

    def test_costs(self):
        text, _ = self.d.summarize()
        # p2p: 4 MB of payload, 2 MB of PCIe over 4 MB at the ends; collnet: 4 MB in, 8 MB
        # at the ends (input and result).
        self.assertRegex(text, r"\nagoq-exact-gdr\.all_reduce +2\.000 +0\.002 +1000 +0\.500 +yes"
                         r"  device_calls=10 stats_entries=2\n")
        self.assertRegex(text, r"\ncollnet-gdr\.all_reduce +2\.000 +0\.004 +500 +0\.250 +yes")
        self.assertRegex(text, r"\nagoq-exact\.all_reduce +2\.000 +0\.004 +500 +n/a \(NCCL's "
                         r"copies\) +no  device_calls=0 stats_entries=3\n")
        self.assertRegex(text, r"\nsocket\.sendrecv +2\.000 +- +- +- +no  \n")
        self.assertIn("ratio cpu s/GB %-34s %-10s 0.50x\n"
                      % ("agoq-exact / agoq-exact-gdr", "all_reduce"), text)

    def test_ratios_and_perf(self):
        text, _ = self.d.summarize()
        self.assertIn("ratio agoq-exact/socket                  all_reduce avg busbw 2.00   "
                      "busbw@max 3.33\n", text)
        self.assertIn("ratio agoq-exact/socket                  sendrecv   avg busbw 1.00   "
                      "busbw@max 1.00\n", text)
        # int8 over exact per size: 8 B 1.0, 1 MiB 12.6/12 = 1.05, 16 MiB 19.2/20 = 0.96.
        perf = "PERF: all_reduce agoq-int8 / agoq-exact: >= 0.95 at all 3 sizes (lowest 0.960 " \
               "at 16777216 B): met"
        self.assertEqual(text.count(perf + "\n"), 2)  # the list, and again under the verdict
        self.assertIn("\n" + perf + "\nelapsed: ", text)

    def test_checks_quoted(self):
        text, _ = self.d.summarize()
        self.assertIn("\ncodec (CUDA vs CPU): bit-identical to the CPU codec (1234 checks)\n"
                      "  throughput: memcpy D2D 2000.0 GB/s\n", text)
        self.assertIn("\ntorch all_reduce through CollNet: PASSED: identical on all ranks, within"
                      " the error bound\n  torch-check: torch 2.6.0, NCCL 2.28.9\n  "
                      "    elements        bytes     rel_l2\n       1048576      2097152  3.1e-03\n"
                      "  torch-check: PASSED (3 s): 1 sizes\n\n", text)
        self.assertIn("  device path: 1 NCCL lines naming GDRDMA, 1 stats lines with device "
                      "calls\n", text)
        self.assertIn("\nMegatron-Core training (tools/gpu/megatron_check.py): PASSED: exact runs"
                      " match Socket, int8 within its tolerance\n  mcore-check: exact vs socket:"
                      " identical\n  mcore-check: PASSED\n\nVERDICT", text)

    def test_main_writes_summary_and_returns_status(self):
        self.assertEqual(gs.main([self.d.out_dir, "--elapsed", "5"]), 0)
        with open(os.path.join(self.d.out_dir, "summary.txt")) as f:
            self.assertIn("VERDICT: agoq runs correct\n", f.read())
        # A failure seen by main too (a run's rc changed).
        self.d.write("agoq-exact.sendrecv.rc", "2\n")
        self.assertEqual(gs.main([self.d.out_dir]), 1)


class ExactWrong(Base):
    def test_wrong_values_fail(self):
        bad = table([(8, "0.01", "0", "0.02", "0"), (1024, "1.00", "7", "1.00", "0")], oob=1,
                    avg="0.5")
        self.d.run("agoq-exact", "all_reduce", rc="1", out=bad,
                   nccl=nccl_log(extra="h:1:1 [1] NCCL WARN NET/AGOQ : data check failed\n"))
        self.d.run("socket", "all_reduce")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertRegex(row_of(text, "agoq-exact.all_reduce"),
                         r" +1 +AGOQx2 +1 +0\.500 +1\.000 +2  WRONG VALUES \(exit 1\); NET/AGOQ "
                         r"log lines: 6$")
        self.assertIn("\nagoq-exact.all_reduce, first NET/Plugin / WARN / ERROR lines:\n"
                      "  h:1:1 [1] NCCL WARN NET/AGOQ : data check failed\n", text)
        self.assertEqual(verdict_of(text), "VERDICT: FAILED (an agoq run failed, had wrong "
                         "values, did not use AGOQ or its CollNet, or used GDRDMA where it should"
                         " not or not where it should)")

    def test_socket_wrong_does_not_fail(self):
        # Socket is the comparison, not the thing checked: reported, not failed.
        bad = table([(1024, "1.00", "7", "1.00", "0")], oob=1, avg="1.0")
        self.d.run("socket", "all_reduce", rc="1", out=bad)
        text, status = self.d.summarize()
        self.assertEqual(status, 0)
        self.assertRegex(row_of(text, "socket.all_reduce"), r"WRONG VALUES \(exit 1\)$")


class Quantized(Base):
    def test_int8_wrong_is_expected(self):
        lossy = table([(1024, "1.00", "1.2e+06", "1.00", "10"), (2048, "2.00", "5", "2.00",
                                                                  "0")], oob=2, avg="1.5")
        self.d.run("agoq-int8", "all_reduce", rc="7", out=lossy)
        text, status = self.d.summarize()
        self.assertEqual(status, 0, text)
        self.assertRegex(row_of(text, "agoq-int8.all_reduce"),
                         r" +7 +AGOQx2 +2 +1\.500 +2\.000 +2  ok \(lossy: #wrong 1200015 "
                         r"values, expected; agoq's int8 bound: relative L2 error <= 0\.7% fp32,"
                         r" 0\.8% bf16 per pass\); NET/AGOQ log lines: 4$")
        # Its costs: no stats lines.
        self.assertRegex(text, r"\nagoq-int8\.all_reduce +2\.000 +n/a +n/a \(no stats\) +n/a "
                         r"\(NCCL's copies\) +no  device_calls=0 stats_entries=0\n")

    def test_int8_crash_with_wrong_values_fails(self):
        # Exit 2 (a crash) is not the exact check's verdict: the wrong values count.
        lossy = table([(1024, "1.00", "3", "1.00", "0")], oob=1, avg="1.0")
        self.d.run("agoq-int8", "all_reduce", rc="2", out=lossy)
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("WRONG VALUES (exit 2)", row_of(text, "agoq-int8.all_reduce"))

    def test_perf_not_met(self):
        self.d.run("agoq-exact", "all_reduce")
        self.d.run("agoq-int8", "all_reduce", out=table([
            (8, "0.01", "0", "0.02", "0"), (1048576, "5.00", "0", "11.00", "0"),
            (16777216, "18.00", "0", "18.00", "0")], oob=0, avg="9"))
        text, status = self.d.summarize()
        self.assertEqual(status, 0)  # PERF lines do not change the verdict
        self.assertIn("PERF: all_reduce agoq-int8 / agoq-exact: lowest 0.900 at 16777216 B; "
                      "under 0.95 at 1048576,16777216 B of 3 sizes: NOT MET\n", text)


class Hung(Base):
    def test_timeout_mid_table(self):
        partial = table([(8, "0.01", "0", "0.02", "0"), (1024, "1.00", "0", "1.00", "0")])
        self.d.run("agoq-exact", "all_reduce", rc="124", out=partial)
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        # No footer: the wrong count is that of the rows, the average n/a.
        self.assertRegex(row_of(text, "agoq-exact.all_reduce"),
                         r" 124 +AGOQx2 +0 +n/a +1\.000 +2  FAILED \(exit 124\)")

    def test_timeout_before_any_row(self):
        # A hang is a failure, not an UNRUN (that needs the CUDA start-up message).
        self.d.run("agoq-exact", "sendrecv", rc="124", out="")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertRegex(row_of(text, "agoq-exact.sendrecv"),
                         r" 124 +AGOQx2 +0 +n/a +n/a +0  FAILED \(exit 124\)")

    def test_skipped_out_of_budget_fails(self):
        self.d.run("agoq-exact", "all_gather", rc="skipped out of time budget", out="",
                   nccl="", cpu=None)
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertRegex(row_of(text, "agoq-exact.all_gather"),
                         r" - +unknown +0 +n/a +n/a +0  SKIPPED \(out of time budget\); "
                         r"NET/AGOQ log lines: 0$")
        self.assertNotRegex(text, r"\nagoq-exact\.all_gather +n/a")  # no cost row


class Gdr(Base):
    def test_missing_gdrdma_fails(self):
        self.d.run("agoq-exact-gdr", "all_reduce", nccl=nccl_log(gdr=False))
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("  NO GDRDMA; NET/AGOQ log lines: 4",
                      row_of(text, "agoq-exact-gdr.all_reduce"))
        self.assertIn("VERDICT: FAILED (an agoq run failed", text)

    def test_gdrdma_in_host_staged_run_fails(self):
        self.d.run("agoq-int8", "sendrecv", nccl=nccl_log(gdr=True))
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("  GDRDMA IN HOST-STAGED RUN;", row_of(text, "agoq-int8.sendrecv"))

    def test_torch_gdr_without_device_path_fails(self):
        self.d.run("agoq-exact", "all_reduce")
        self.d.check("torch-gdr", 0, "torch-check: PASSED (3 s)\n")
        self.d.write("torch-gdr/rank0.log", "NCCL INFO Channel 00 via NET/AGOQ/0\n")
        self.d.write("torch-gdr/stats.1", "agoq-stats kind=collnet device_calls=3\n")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("\ntorch all_reduce through CollNet, device buffers (AGOQ_GPU=on, "
                      "NCCL_NET_GDR_LEVEL=SYS), a NaN planted: PASSED: identical on all ranks, "
                      "within the error bound\n  torch-check: PASSED (3 s)\n  device path: 0 "
                      "NCCL lines naming GDRDMA, 1 stats lines with device calls\n  FAILED: "
                      "the device path was not exercised\n", text)
        self.assertEqual(verdict_of(text), "VERDICT: FAILED (a PyTorch check failed: see its "
                         "line)")

    def test_torch_p2p_gdr_without_device_calls_fails(self):
        self.d.run("agoq-exact", "sendrecv")
        self.d.check("torch-p2p-gdr", 0, "agoq-stats kind=p2p_send device_calls=0\n")
        self.d.write("torch-p2p-gdr/rank0.log", "via NET/AGOQ/0/GDRDMA\n")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("device path: 1 NCCL lines naming GDRDMA, 0 stats lines", text)

    def test_failed_torch_gdr_has_no_device_path_line(self):
        self.d.run("agoq-exact", "all_reduce")
        self.d.check("torch-gdr", 1, "torch-check: FAILED (3 s): rank 1 differs\n")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertNotIn("device path:", text)
        self.assertIn("a NaN planted: FAILED (exit 1)\n  torch-check: FAILED (3 s): rank 1 "
                      "differs\n", text)

    def test_not_through_agoq_or_collnet(self):
        self.d.run("agoq-exact", "all_reduce", nccl=nccl_log(net="Socket"))
        self.d.run("collnet", "all_reduce", nccl=nccl_log())
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertRegex(row_of(text, "agoq-exact.all_reduce"), r"Socketx2 .*  NOT THROUGH AGOQ;")
        self.assertRegex(row_of(text, "collnet.all_reduce"),
                         r"  NOT THROUGH COLLNET; NET/AGOQ log lines: 4; via COLLNET/AGOQ: 0$")


class Codec(Base):
    def setUp(self):
        super().setUp()
        self.d.run("agoq-exact", "all_reduce")

    def test_mismatch_fails(self):
        self.d.check("codec", 1, "codec_gpu_check: device 0: Fake GPU\nMISMATCH [int8/bf16] "
                     "quantize: first difference at byte 9\nthroughput: quantize 2400 GB/s\n"
                     "codec verdict: MISMATCH: 1 of 1234 checks differ from the CPU codec\n")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("\ncodec (CUDA vs CPU): MISMATCH with the CPU codec, or a CUDA error (exit"
                      " 1)\n  throughput: quantize 2400 GB/s\n  codec_gpu_check: device 0: Fake"
                      " GPU\n  MISMATCH [int8/bf16] quantize: first difference at byte 9\n", text)
        self.assertEqual(verdict_of(text),
                         "VERDICT: FAILED (the CUDA codec check failed: see the codec line)")

    def test_timeout_names_the_recorded_limit(self):
        self.d.write("settings.txt", "codec_limit 240\n", mode="a")
        self.d.check("codec", 124)
        text, status = gs.summarize(self.d.out_dir, codec_timeout="300")
        self.assertEqual(status, 1)
        self.assertIn("codec (CUDA vs CPU): TIMED OUT after 240 s (exit 124)\n", text)

    def test_skipped_and_not_built(self):
        self.d.check("codec", "skipped: AGOQ_GPU_CHECK_CODEC=0")
        text, status = self.d.summarize()
        self.assertEqual(status, 0)
        self.assertIn("codec (CUDA vs CPU): SKIPPED (AGOQ_GPU_CHECK_CODEC=0)\n", text)
        self.d.check("codec", "not built")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("codec (CUDA vs CPU): NOT BUILT (no CUDA compiler", text)


class Torch(Base):
    def setUp(self):
        super().setUp()
        self.d.run("agoq-exact", "all_reduce")

    def test_failing(self):
        self.d.check("torch-p2p", 1, "torch-p2p-check: FAILED (5 s): bf16 error 3%\n"
                     "torch-p2p-check: unrelated\n")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("\ntorch send/recv through the typed net path: FAILED (exit 1)\n"
                      "  torch-p2p-check: FAILED (5 s): bf16 error 3%\n\nVERDICT: FAILED (a "
                      "PyTorch check failed: see its line)\n", text)

    def test_timeout_fails_skip_does_not(self):
        self.d.check("torch", 137)
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("torch all_reduce through CollNet: TIMED OUT (exit 137)\n", text)
        self.d.check("torch", 77, "torch-check: SKIPPED: no torch\ntorch-check: SKIPPED: b\n")
        text, status = self.d.summarize()
        self.assertEqual(status, 0)
        self.assertIn("torch all_reduce through CollNet: SKIPPED (no torch)\n", text)


class Megatron(Base):
    def test_failing(self):
        self.d.run("agoq-exact", "all_reduce")
        self.d.check("mcore", 1, "mcore-check: SKIPPED: nothing\nmcore-check: run exact iter 3 "
                     "loss 5.1\nmcore-check: exact vs socket: loss differs at iter 2\n"
                     "mcore-check: FAILED\nnot ours\n")
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("\nMegatron-Core training (tools/gpu/megatron_check.py): FAILED (exit 1)\n"
                      "  mcore-check: FAILED\n\nVERDICT: FAILED (the Megatron-Core check "
                      "failed: see its line)\n", text)

    def test_all_reasons_joined(self):
        self.d.run("agoq-exact", "all_reduce", rc="3")
        self.d.check("codec", 2)
        self.d.check("torch", 1)
        self.d.check("mcore", 124)
        text, status = self.d.summarize()
        self.assertEqual(status, 1)
        self.assertIn("Megatron-Core training (tools/gpu/megatron_check.py): TIMED OUT (exit "
                      "124)\n", text)
        self.assertEqual(verdict_of(text), "VERDICT: FAILED (an agoq run failed, had wrong "
                         "values, did not use AGOQ or its CollNet, or used GDRDMA where it should"
                         " not or not where it should; the CUDA codec check failed: see the "
                         "codec line; a PyTorch check failed: see its line; the Megatron-Core "
                         "check failed: see its line)")


class Hazards(Base):
    def test_lines_quoted_verdict_unchanged(self):
        self.d.run("agoq-exact", "all_reduce")
        long_tail = "x" * 400
        self.d.write("hazards.out", "\n".join([
            "fact: driver CUDA 12.8, runtime 12.8, device 0 NVIDIA H200 (sm_90, 132 SMs)",
            "hazard: hwq CUDA_DEVICE_MAX_CONNECTIONS=1 priority=greatest streams=4: BLOCKED "
            "(the copy on link stream(s) 1,2 of 0..3 waited)",
            "hazard: hwq CUDA_DEVICE_MAX_CONNECTIONS=8 priority=greatest streams=18: OK",
            "hazard: ctx --action lazy CUDA_MODULE_LOADING=LAZY: exit 124 (a timeout, 124 or "
            "137, means the process hung) " + long_tail,
            "Terminated", "hazard: phase took 41 s", ""]))
        text, status = self.d.summarize()
        self.assertEqual(status, 0)
        quoted = text.split("facts and hazards (tools/gpu/gpu_hazards; BLOCKED: that case would"
                            " hang a real job):\n")[1].split("\n\n")[0].split("\n")
        self.assertEqual(len(quoted), 5, quoted)  # "Terminated" left out
        self.assertTrue(quoted[1].startswith("  hazard: hwq CUDA_DEVICE_MAX_CONNECTIONS=1 "))
        self.assertTrue(quoted[1].endswith(": BLOCKED (the copy on link stream(s) 1,2 of 0..3 "
                                           "waited)"))
        self.assertTrue(quoted[2].endswith("streams=18: OK"))
        self.assertIn("means the process hung", quoted[3])
        self.assertEqual(len(quoted[3]), 2 + 300)  # cut at 300 columns
        self.assertEqual(quoted[4], "  hazard: phase took 41 s")

    def test_absent_means_no_section(self):
        self.d.run("agoq-exact", "all_reduce")
        text, _ = self.d.summarize()
        self.assertNotIn("facts and hazards", text)


class Unrun(Base):
    def test_no_gpu(self):
        out = "h: Test CUDA failure common.cu:1000 'no CUDA-capable device is detected'\n"
        self.d.run("agoq-exact", "all_reduce", rc="2", out=out, nccl="")
        self.d.run("agoq-exact", "sendrecv", rc="77", out="", nccl="")
        self.d.run("agoq-exact", "reduce_scatter", rc="unrun: the driver runs all_reduce and "
                   "sendrecv only", out="", nccl="", cpu=None)
        self.d.run("socket", "reduce_scatter", rc="unrun: no", out="", nccl="", cpu=None)
        text, status = self.d.summarize()
        self.assertEqual(status, 3)
        self.assertRegex(row_of(text, "agoq-exact.all_reduce"), r" 2 +unknown +0 +n/a +n/a +0  "
                         r"UNRUN \(no GPU: CUDA start-up failed: 'no CUDA-capable device is "
                         r"detected'\); NET/AGOQ log lines: 0$")
        self.assertIn("UNRUN (no usable GPU (exit 77))", row_of(text, "agoq-exact.sendrecv"))
        self.assertEqual(verdict_of(text), "VERDICT: UNRUN: 2 of 4 runs need a GPU (no GPU: CUDA"
                         " start-up failed: 'no CUDA-capable device is detected'); nothing that "
                         "could run failed; UNRUN by this launcher: reduce_scatter")

    def test_launcher_unrun_note_on_pass(self):
        self.d.run("agoq-exact", "all_reduce")
        self.d.run("agoq-exact", "all_gather", rc="unrun: x", out="", nccl="", cpu=None)
        text, status = self.d.summarize()
        self.assertEqual(status, 0)
        self.assertEqual(verdict_of(text),
                         "VERDICT: agoq runs correct; UNRUN by this launcher: all_gather")


class Setup(Base):
    def test_setup_failed(self):
        self.d.write("setup-failed.txt", "plugin build failed (logs/build-plugin.log)\n")
        self.assertEqual(gs.main([self.d.out_dir]), 2)
        with open(os.path.join(self.d.out_dir, "summary.txt")) as f:
            self.assertEqual(f.read(), "VERDICT: SETUP FAILED: plugin build failed "
                             "(logs/build-plugin.log)\n")

    def test_no_runs_is_not_a_pass(self):
        text, status = self.d.summarize()  # runs.txt empty
        self.assertEqual(status, 2)
        self.assertTrue(text.startswith("VERDICT: SETUP FAILED: no runs in logs/runs.txt"))
        os.remove(os.path.join(self.d.logs, "runs.txt"))
        self.assertEqual(self.d.summarize()[1], 2)

    def test_nranks_fallback(self):
        self.d.run("agoq-exact", "all_reduce")
        os.remove(os.path.join(self.d.logs, "settings.txt"))
        text, _ = gs.summarize(self.d.out_dir, nranks="8")
        self.assertTrue(text.startswith("agoq GPU check: 8 processes"))


class Parsing(unittest.TestCase):
    def test_parse_table_footer_and_counts(self):
        wrong, avg, last, rows, wvals = gs.parse_table(table(
            [(8, "0.01", "0", "0.50", "2"), (64, "0.90", "1e+03", "0.10", "N/A")], oob=2,
            avg="0.4"))
        self.assertEqual((wrong, avg, last, rows, wvals), ("2", "0.400", "0.900", 2, "1002"))

    def test_parse_table_empty(self):
        self.assertEqual(gs.parse_table(""), ("0", "n/a", "n/a", 0, "0"))

    def test_network_mixed(self):
        d = LogDir()
        self.addCleanup(d.cleanup)
        d.write("r.nccl.h.1.log", "x Using network Socket\nx Using network AGOQ\n")
        d.write("r.out", "y Using network AGOQ\n")
        self.assertEqual(gs.RunLogs(d.logs, "r").network_used(), "AGOQx2,Socketx1")

    def test_stats_last_line_per_entry(self):
        d = LogDir()
        self.addCleanup(d.cleanup)
        d.write("r.stats.1", stats_line(1, "collnet", 100, event="interval")
                + stats_line(1, "collnet", 300, pcie=600, device_calls=2)
                + stats_line(1, "p2p_recv", 50, path="exact"))
        self.assertEqual(gs.RunLogs(d.logs, "r").stats(), ("300", "600", "2", 2, "650"))


class SameFamiliesAsTheScript(unittest.TestCase):
    """The configuration families here are gpu-check.sh's is_agoq_config and is_gdr_config."""

    def test_against_the_script(self):
        with open(SCRIPT) as f:
            src = f.read()
        funcs = "".join(re.findall(r"^(is_agoq_config\(\) \{.*?^\}\n|is_gdr_config\(\) \{.*?^\}\n)",
                                   src, re.S | re.M))
        self.assertIn("is_gdr_config", funcs)
        names = ["agoq-exact", "agoq-int8", "socket", "socket-tuned", "collnet", "collnet-exact", "collnet-grid",
                 "agoq-exact-ll128", "agoq-exact-flush", "agoq-exact-reg", "bogus"]
        names += [n + "-gdr" for n in names]
        probe = funcs + "".join(
            'is_agoq_config %s && printf A; is_gdr_config %s && printf G; echo\n' % (n, n)
            for n in names)
        got = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                             check=True).stdout.split("\n")
        for n, flags in zip(names, got):
            want = ("A" if gs.is_agoq_config(n) else "") + ("G" if gs.is_gdr_config(n) else "")
            self.assertEqual(flags, want, n)


if __name__ == "__main__":
    unittest.main()
