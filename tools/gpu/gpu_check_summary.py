#!/usr/bin/env python3
"""The summary and verdict of tools/gpu-check.sh, computed from OUT_DIR/logs alone.

usage: python3 tools/gpu/gpu_check_summary.py OUT_DIR [--elapsed S] [--nranks N]
                                              [--codec-timeout S]

Writes OUT_DIR/summary.txt and exits with the check's verdict: 0 every agoq run correct,
1 a failure (an agoq run, the codec, a PyTorch or the Megatron-Core check), 2 a setup
failure (logs/setup-failed.txt, or no runs in logs/runs.txt), 3 nothing failed but runs were UNRUN
for want of a GPU. gpu-check.sh calls it at the end of a check and for --summarize; the
meaning of each line is documented in gpu-check.sh's header.

What it reads under OUT_DIR/logs (gpu-check.sh writes them):
  runs.txt                 "<run> <config> <test>" per run, in run order
  <run>.rc                 the run's exit status, or "skipped ...", "unrun: why"
  <run>.out                the launcher's output: nccl-tests' result table
  <run>.nccl.*.log         NCCL_DEBUG_FILE per process; <run>.rank*.log (the driver's)
  <run>.cpu                "user sys" CPU seconds of the whole run
  <run>.stats.*            AGOQ_STATS_FILE lines (agoq runs)
  env.txt                  host, GPU, NCCL, MPI lines, quoted in the header
  settings.txt             "nranks N", "codec_limit S": the settings the summary quotes,
                           as the run had them (so that --summarize elsewhere agrees)
  hazards.out              tools/gpu/gpu_hazards' "fact:" and "hazard:" lines, quoted
  codec.{rc,out}           tools/gpu/codec_gpu_check
  torch{,-p2p,-gdr,-p2p-gdr}.{rc,out} and torch*-gdr/ (their per-process logs)
  mcore.{rc,out}           tools/gpu/megatron_check.py
  setup-failed.txt         gpu-check.sh's die() message, when setup failed

The text is byte for byte what gpu-check.sh's bash version wrote before (the same lines and
columns, the same verdicts and exit statuses): files are read and written as latin-1, so every byte passes through and cut -c's byte columns stay
byte columns; fields split as awk splits them (blanks and tabs only).

Standard library only: it runs on the GPU host's plain python3.
"""
import argparse
import glob
import os
import re
import sys

# ---- Configuration names -------------------------------------------------------------------
# agoq-exact, agoq-int8, collnet, collnet-exact, collnet-grid and the GPU path's variants, each also as
# <name>-gdr (device buffers); socket and socket-tuned. These are the names gpu-check.sh's
# config_env knows; the summary needs only which family a name is in.
AGOQ_CONFIGS = ("agoq-exact", "agoq-int8", "collnet", "collnet-exact", "collnet-grid", "agoq-exact-ll128",
                "agoq-exact-flush", "agoq-exact-reg")


def base_config(config):
    """The name without its "-gdr" (bash's ${config%-gdr})."""
    return config[:-4] if config.endswith("-gdr") else config


def is_agoq_config(config):
    return base_config(config) in AGOQ_CONFIGS


def is_lossy_config(config):
    """Compression on: nccl-tests' exact check counts the quantization error, as expected."""
    return base_config(config) in ("agoq-int8", "collnet", "collnet-grid")


def is_collnet_config(config):
    return base_config(config) in ("collnet", "collnet-exact", "collnet-grid")


def is_gdr_config(config):
    return config.endswith("-gdr") and is_agoq_config(config)


# ---- Text helpers (the shell tools' semantics) -----------------------------------------------
def read(path):
    """A file's text, "" when absent (the shell pipelines drop the error)."""
    try:
        with open(path, "r", encoding="latin-1", newline="") as f:
            return f.read()
    except OSError:
        return ""


def cat(paths):
    """cat PATHS: the files concatenated, absent ones left out."""
    return "".join(read(p) for p in paths)


def lines(text):
    """The lines of a text as grep, awk and sed see them (a last line without "\\n" counts)."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return parts


def files(pattern):
    """A shell glob's files, sorted; the pattern's own text matches nothing here."""
    return sorted(glob.glob(pattern))


def subst(path):
    """$(cat FILE): the text without its trailing newlines; None when the file is absent."""
    try:
        with open(path, "r", encoding="latin-1", newline="") as f:
            return f.read().rstrip("\n")
    except OSError:
        return None


def fields(line):
    """awk's fields: runs of anything but blanks, tabs and newlines."""
    return re.findall(r"[^ \t\n]+", line)


_NUM = re.compile(r"[ \t\n]*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)")


def num(s):
    """awk's string to number: the longest leading decimal number, else 0."""
    m = _NUM.match(s or "")
    return float(m.group(1)) if m else 0.0


def field(fs, i):
    """awk's $i (1-based) of a field list: "" beyond NF."""
    return fs[i - 1] if 1 <= i <= len(fs) else ""


def quote(text_lines, prefix="  "):
    """sed 's/^/  /' over lines."""
    return [prefix + ln for ln in text_lines]


_TABLE_ROW = re.compile(r"^ *[0-9]+ +[0-9]+ ")
_NUMERIC = re.compile(r"^[0-9.eE+-]+$")


# ---- A run's result table --------------------------------------------------------------------
def parse_table(text):
    """(wrong, avg, last, rows, wrong_values) of a result table in nccl-tests' columns: size
    count type redop root time algbw busbw #wrong [time algbw busbw #wrong].

    wrong: the footer's "Out of bounds values" (checks that found wrong values), else the rows'
    count; wrong_values: the #wrong columns summed (values, not checks). nccl-tests prints
    #wrong with %g, so large counts come as 1.2e+06. avg and last (busbw at the largest size,
    the better of out-of-place and in-place) are "%.3f" or "n/a"."""
    def count(x):
        return num(x) if re.match(r"^[0-9.]+([eE][+]?[0-9]+)?$", x) else 0.0

    oob = avg = last = ""
    rows = badrows = 0
    rowwrong = 0.0
    for ln in lines(text):
        fs = fields(ln)
        if re.match(r"^# *Out of bounds values", ln):
            oob = field(fs, len(fs) - 1) if len(fs) > 1 else ln
        if re.match(r"^# *Avg bus bandwidth", ln):
            avg = field(fs, len(fs))
            if not _NUMERIC.match(avg):
                avg = field(fs, len(fs) - 1) if len(fs) > 1 else ln
        if _TABLE_ROW.match(ln):
            rows += 1
            w = count(field(fs, 9))
            if len(fs) >= 13:
                w += count(field(fs, 13))
            if w > 0:
                badrows += 1
            rowwrong += w
            last = field(fs, 8)
            if len(fs) >= 12 and num(field(fs, 12)) > num(last):
                last = field(fs, 12)
    # A run that printed no footer (it stopped early) has no "Out of bounds" line: its count
    # is that of the rows, 0 when there are none, and never an empty field.
    if oob == "":
        oob = str(badrows)
    avg = "%.3f" % num(avg) if _NUMERIC.match(avg) else "n/a"
    last = "%.3f" % num(last) if _NUMERIC.match(last) else "n/a"
    return oob, avg, last, rows, "%.0f" % rowwrong


def size_busbw(text):
    """[(size, busbw)] per row of a result table, busbw the better of out-of-place and
    in-place, both as the table's text."""
    out = []
    for ln in lines(text):
        if _TABLE_ROW.match(ln):
            fs = fields(ln)
            b = field(fs, 8)
            if len(fs) >= 12 and num(field(fs, 12)) > num(b):
                b = field(fs, 12)
            out.append((fs[0], b))
    return out


def per_size_ratio(top_text, base_text, threshold):
    """Compares two runs size by size: (min_ratio, size_at_min, below, sizes) with below the
    sizes whose ratio top/base is under THRESHOLD ("-" when none); None when no size is in
    both."""
    base = {}
    for size, b in size_busbw(base_text):
        base[size] = b
    n = 0
    low = at = None
    below = []
    for size, t in size_busbw(top_text):
        if size in base and num(base[size]) > 0:
            r = num(t) / num(base[size])
            n += 1
            if n == 1 or r < low:
                low, at = r, size
            if r < threshold:
                below.append(size)
    if n == 0:
        return None
    return "%.3f" % low, at, ",".join(below) if below else "-", n


def ratio(a, b):
    """a/b as "%.2f", "n/a" unless both are numbers and b > 0."""
    if _NUMERIC.match(a) and _NUMERIC.match(b) and num(b) > 0:
        return "%.2f" % (num(a) / num(b))
    return "n/a"


# ---- A run's logs -----------------------------------------------------------------------------
class RunLogs:
    """The log files of one run, logs/<run>.*."""

    def __init__(self, logs, run):
        self.logs, self.run = logs, run
        p = os.path.join(logs, run)
        self.out = read(p + ".out")
        self.nccl = cat(files(glob.escape(p) + ".nccl.*.log"))
        self.ranks = cat(files(glob.escape(p) + ".rank*.log"))

    def network_used(self):
        """How the run chose its network, from NCCL's "Using network X" lines: "AGOQx4",
        "AGOQx2,Socketx2", or "unknown"."""
        counts = {}
        for ln in lines(self.nccl + self.out):
            m = re.match(r".*Using network ([A-Za-z0-9_-]*)", ln)
            if m:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        net = ",".join("%sx%d" % (k, counts[k]) for k in sorted(counts))
        return net or "unknown"

    def agoq_log_lines(self):
        """agoq's own lines; NCCL's "via COLLNET/AGOQ" lines contain the same text and are not
        agoq's."""
        return sum(1 for ln in lines(self.nccl + self.out)
                   if "NET/AGOQ" in ln and "COLLNET/AGOQ" not in ln)

    def collnet_log_lines(self):
        """NCCL's "CollNet 00/0 : 0 [send] via COLLNET/AGOQ/0" lines: CollNet through agoq."""
        return sum(1 for ln in lines(self.nccl + self.out) if "via COLLNET/AGOQ" in ln)

    def gdr_log_lines(self):
        """NCCL's lines naming a GPUDirect path ("[send] via NET/AGOQ/0/GDRDMA", "via
        COLLNET/AGOQ/0/GDRDMA")."""
        return sum(1 for ln in lines(self.nccl + self.out + self.ranks) if "GDRDMA" in ln)

    def problem_lines(self):
        """NCCL's own words about plugin loading and failures: the first four."""
        pat = re.compile(r"NET/Plugin|Failed to initialize|NCCL WARN|ERROR")
        found = [ln for ln in lines(self.nccl + self.out + self.ranks) if pat.search(ln)]
        return [ln[:150] for ln in found[:4]]

    def unrun_reason(self, rc):
        """Why a run that printed no results did not run: the GPU it needs is absent.
        nccl-tests reports a failed CUDA start-up as "<host>: Test CUDA failure
        <file>:<line> '<error>'"; the driver exits 77. "" when not stopped by that."""
        if rc == "77":
            return "no usable GPU (exit 77)"
        m = re.search(r"Test CUDA failure [^ \n]+ ('(CUDA driver version is insufficient for "
                      r"CUDA runtime version|no CUDA-capable device is detected|CUDA driver is "
                      r"a stub library|system has unsupported display driver / cuda driver "
                      r"combination|forward compatibility was attempted on non supported HW)')",
                      self.out)
        return "no GPU: CUDA start-up failed: " + m.group(1) if m else ""

    def cpu_seconds(self):
        """CPU seconds (user + sys) of the whole run, from logs/<run>.cpu; "n/a" without it."""
        s = None
        for ln in lines(read(os.path.join(self.logs, self.run + ".cpu"))):
            fs = fields(ln)
            if (len(fs) == 2 and re.match(r"^[0-9.]+$", fs[0])
                    and re.match(r"^[0-9.]+$", fs[1])):
                s = num(fs[0]) + num(fs[1])
        return "n/a" if s is None else "%.3f" % s

    def stats(self):
        """The plugin's statistics of the run: (payload, pcie, device_calls, entries, ends)
        with payload the bytes_in of the kind=collnet and kind=p2p_send entries, pcie the
        pcie_d2h + pcie_h2d of all entries, ends what NCCL's buffers gave the plugin and took
        from it (p2p_send + p2p_recv bytes_in, collnet bytes_in twice: all-reduces); each
        entry (host, pid, id, path) counts once, by its last line. All numbers "%.0f" but
        entries (an int), as bash's awk printed them."""
        p = os.path.join(self.logs, self.run)
        text = cat(files(glob.escape(p) + ".stats.*")) + self.out
        entries = {}  # key -> (kind, bytes_in, pcie, device_calls); dicts keep first order
        for ln in lines(text):
            if not ln.startswith("agoq-stats "):
                continue
            f = {}
            for tok in fields(ln)[1:]:
                eq = tok.find("=")
                if eq > 0:
                    f[tok[:eq]] = tok[eq + 1:]
            key = (f.get("host", ""), f.get("pid", ""), f.get("id", ""), f.get("path", ""))
            entries[key] = (f.get("kind", ""), num(f.get("bytes_in")),
                            num(f.get("pcie_d2h")) + num(f.get("pcie_h2d")),
                            num(f.get("device_calls")))
        payload = pcie = dev = ends = 0.0
        for kind, nbytes, pc, dc in entries.values():
            if kind in ("collnet", "p2p_send"):
                payload += nbytes
            if kind == "collnet":
                ends += 2 * nbytes
            if kind in ("p2p_send", "p2p_recv"):
                ends += nbytes
            pcie += pc
            dev += dc
        return "%.0f" % payload, "%.0f" % pcie, "%.0f" % dev, len(entries), "%.0f" % ends


# ---- The Python checks and the codec check --------------------------------------------------
def python_check_status(logs, name, prefix, passed):
    """(status, failed) of a Python check from logs/NAME.{rc,out}: "PASSED: PASSED-TEXT",
    "SKIPPED (why)", "TIMED OUT ..." or "FAILED ..."; failed for the last two. PREFIX is the
    check's own line prefix."""
    rc = subst(os.path.join(logs, name + ".rc")) or ""
    if rc == "0":
        return "PASSED: " + passed, False
    if rc == "77":
        why = ""
        for ln in lines(read(os.path.join(logs, name + ".out"))):
            if ln.startswith(prefix + ": SKIPPED: "):
                why = ln[len(prefix + ": SKIPPED: "):]
                break
        return "SKIPPED (%s)" % why, False
    if rc.startswith("skipped"):
        return "SKIPPED (%s)" % rc.removeprefix("skipped: "), False
    if rc in ("124", "137"):
        return "TIMED OUT (exit %s)" % rc, True
    return "FAILED (exit %s)" % rc, True


def torch_summary(logs, name, prefix, title, passed):
    """(lines, failed) of a PyTorch check: its status, then its per-size table and its log
    facts as the check printed them."""
    status, failed = python_check_status(logs, name, prefix, passed)
    out = [title + ": " + status]
    pat = re.compile(r"^ +[0-9]+ |^ +elements|^all_reduce|^" + re.escape(prefix)
                     + r": (torch |NCCL logs|plugin logs|FAILED|PASSED)")
    out += quote(ln[:160] for ln in lines(read(os.path.join(logs, name + ".out")))
                 if pat.search(ln))
    return out, failed


def torch_device_path(logs, name):
    """(lines, failed) for a device-buffer variant that ran and passed: it exists to run the
    device path, so NCCL must have chosen GDRDMA and the plugin must have made device calls,
    else it proved nothing."""
    d = os.path.join(logs, name)
    own = [p for p in files(os.path.join(glob.escape(d), "*")) if os.path.isfile(p)]
    ngdr = sum(1 for ln in lines(cat(p for p in own if p.endswith(".log"))) if "GDRDMA" in ln)
    ndev = sum(1 for ln in lines(cat(own + [d + ".out"]))
               if re.search(r"device_calls=[1-9]", ln))
    out = ["  device path: %d NCCL lines naming GDRDMA, %d stats lines with device calls"
           % (ngdr, ndev)]
    if ngdr == 0 or ndev == 0:
        out.append("  FAILED: the device path was not exercised")
        return out, True
    return out, False


def mcore_summary(logs):
    """(lines, failed) of the Megatron-Core check: its verdict, and its comparison and
    statistics lines (not the per-iteration losses, which stay in the log)."""
    status, failed = python_check_status(
        logs, "mcore", "mcore-check", "exact runs match Socket, int8 within its tolerance")
    out = ["Megatron-Core training (tools/gpu/megatron_check.py): " + status]
    keep = [ln for ln in lines(read(os.path.join(logs, "mcore.out")))
            if ln.startswith("mcore-check: ") and not ln.startswith("mcore-check: SKIPPED")
            and not re.search(r" iter [0-9]", ln)]
    out += quote(ln[:180] for ln in keep[-40:])
    return out, failed


def codec_summary(logs, codec_limit):
    """(lines, failed) of the codec check (CUDA codec vs CPU codec) from logs/codec.{rc,out}.
    codec_limit: the seconds it was given, None when not known."""
    rc = subst(os.path.join(logs, "codec.rc")) or ""
    text = read(os.path.join(logs, "codec.out"))
    checks = "\n".join(m.group(1) for m in (
        re.match(r"^codec verdict: .*\(([0-9]* checks)\)$", ln) for ln in lines(text)) if m)
    failed = True
    if rc == "0":
        status = "bit-identical to the CPU codec" + (" (%s)" % checks if checks else "")
        failed = False
    elif rc == "77":
        status = "SKIPPED (no usable GPU, exit 77)"
        failed = False
    elif rc.startswith("skipped"):
        status = "SKIPPED (%s)" % rc.removeprefix("skipped: ")
        failed = False
    elif rc == "not built":
        status = "NOT BUILT (no CUDA compiler for the build: set CUDA_HOME)"
    elif rc == "1":
        status = "MISMATCH with the CPU codec, or a CUDA error (exit 1)"
    elif rc in ("124", "137"):
        after = " after %s s" % codec_limit if codec_limit is not None else ""
        status = "TIMED OUT%s (exit %s)" % (after, rc)
    else:
        status = "FAILED (exit %s)" % rc
    out = ["codec (CUDA vs CPU): " + status]
    out += quote(ln for ln in lines(text) if ln.startswith("throughput:"))
    if failed:
        out += quote([ln[:200] for ln in lines(text)
                      if ln.startswith("MISMATCH") or ln.startswith("codec_gpu_check:")][:6])
    return out, failed


# ---- The summary ------------------------------------------------------------------------------
# The busbw ratios reported, top/base; and host CPU per GB, host-staged over device (how
# much CPU GPUDirect saves).
BUSBW_PAIRS = ("agoq-exact/socket", "agoq-exact/socket-tuned", "agoq-int8/agoq-exact",
               "agoq-int8/socket", "collnet/agoq-exact", "collnet/collnet-exact",
               "collnet-exact/agoq-exact", "agoq-exact-gdr/agoq-exact",
               "agoq-int8-gdr/agoq-int8", "agoq-int8-gdr/agoq-exact-gdr", "collnet-gdr/collnet",
               "collnet-exact-gdr/collnet-exact", "collnet-grid-gdr/collnet-gdr")
CPU_PAIRS = ("agoq-exact/agoq-exact-gdr", "agoq-int8/agoq-int8-gdr", "collnet/collnet-gdr",
             "collnet-exact/collnet-exact-gdr")
# The performance criterion: with compression on (the tuner deciding), AllReduce
# keeps at least 0.95x the busbw of agoq's exact net at every size, because the tuner leaves
# NCCL's choice wherever compression does not pay. Reported; it does not change the verdict.
PERF_PAIRS = ("agoq-int8/agoq-exact", "agoq-int8-gdr/agoq-exact-gdr")
PERF_TARGET = 0.95

LOSSY_NOTE = ("ok (lossy: #wrong {} values, expected; agoq's int8 bound: relative L2 error "
              "<= 0.7% fp32, 0.8% bf16 per pass)")


def read_runs(logs):
    """runs.txt as [(run, config, test)] (read -r run config test: test takes the rest of the
    line); [] when there is no runs.txt."""
    text = read(os.path.join(logs, "runs.txt"))
    runs = []
    for ln in lines(text):
        parts = re.split(r"[ \t]+", ln.strip(" \t"), maxsplit=2) + ["", ""]
        if parts[0]:
            runs.append(tuple(parts[:3]))
    return runs


def read_settings(logs):
    """logs/settings.txt: "key value" lines gpu-check.sh records for the summary."""
    settings = {}
    for ln in lines(read(os.path.join(logs, "settings.txt"))):
        key, _, value = ln.strip().partition(" ")
        if key:
            settings[key] = value.strip()
    return settings


def summarize(out_dir, elapsed=None, nranks=None, codec_timeout=None):
    """(text, exit status) of the summary of OUT_DIR's logs. nranks and codec_timeout are
    used where logs/settings.txt does not record them (logs of an older gpu-check.sh)."""
    logs = os.path.join(out_dir, "logs")
    # Setup failed: gpu-check.sh's die() wrote the same line to summary.txt then.
    failed_setup = subst(os.path.join(logs, "setup-failed.txt"))
    if failed_setup is not None:
        return "VERDICT: SETUP FAILED: %s\n" % failed_setup, 2
    runs = read_runs(logs)
    if not runs:
        # (The bash version called that "agoq runs correct": nothing had run.)
        return ("VERDICT: SETUP FAILED: no runs in logs/runs.txt: the check stopped before "
                "its runs\n", 2)

    settings = read_settings(logs)
    nranks = settings.get("nranks", nranks if nranks is not None else "?")
    codec_limit = settings.get("codec_limit", codec_timeout)

    head = "agoq GPU check: %s processes on one GPU, each its own NCCL_HOSTID; loopback\n" % (
        nranks)
    # env.txt quoted; as with sed 's/^/  /', a missing last newline stays missing (the blank
    # line that follows then ends that line).
    *env, env_tail = read(os.path.join(logs, "env.txt")).split("\n")
    head += "".join("  " + ln + "\n" for ln in env) + ("  " + env_tail if env_tail else "")
    table_fmt = "%-34s %-5s %-16s %6s %10s %10s %6s  %s"
    cost_fmt = "%-34s %8s %10s %12s %19s %6s  %s"
    body = ["", table_fmt % ("run", "rc", "network", "wrong", "avg busbw", "busbw@max", "sizes",
                             "verdict")]

    failed = False
    problems, cost_rows, unrun_gpu, unrun_other = [], [], [], []
    unrun_why = ""
    avg_of, last_of, cpugb_of = {}, {}, {}
    tests = []  # in run order: gpu-check.sh runs its tests in AGOQ_GPU_CHECK_TESTS' order
    for run, config, test in runs:
        if test not in tests:
            tests.append(test)
        r = RunLogs(logs, run)
        rc = subst(os.path.join(logs, run + ".rc"))
        rc = "?" if rc is None else rc
        wrong, avg, last, rows, wvals = parse_table(r.out)
        net = r.network_used()
        status = "ok"
        unrun = r.unrun_reason(rc) if rows == 0 else ""
        if rc.startswith("skipped"):
            status = "SKIPPED (%s)" % rc.removeprefix("skipped ")
            rc = "-"
        elif rc.startswith("unrun"):
            # Not started: the launcher cannot run this test (the driver has no
            # reduce_scatter).
            status = "UNRUN (%s)" % rc.removeprefix("unrun: ")
            if test not in unrun_other:
                unrun_other.append(test)
            rc = "-"
        elif unrun:
            status = "UNRUN (%s)" % unrun
            unrun_gpu.append(run)
            unrun_why = unrun_why or unrun
        elif is_lossy_config(config) and wrong != "0" and rc in ("0", "1", "7") and rows > 0:
            # Compressed: the exact check of nccl-tests (exit 7) or of the driver (exit 1)
            # counts every value the quantization moved beyond 2 ulp; it measures no
            # magnitude. The bound is the codec's (docs/codec.md), and the PyTorch checks
            # measure against it.
            status = LOSSY_NOTE.format(wvals)
        elif wrong != "0":
            status = "WRONG VALUES (exit %s)" % rc
        elif rc != "0":
            status = "FAILED (exit %s)" % rc
        elif rows == 0:
            status = "NO RESULTS"
        gdr = r.gdr_log_lines()
        if is_agoq_config(config):
            # Checked in this order; each replaces only an "ok", so the first problem found
            # is the one reported.
            checks = (
                ("NOT THROUGH AGOQ", lambda: not net.startswith("AGOQx") or "," in net),
                ("NOT THROUGH COLLNET", lambda: is_collnet_config(config) and rc != "-"
                 and r.collnet_log_lines() == 0),
                ("NO GDRDMA", lambda: rc != "-" and is_gdr_config(config) and gdr == 0),
                ("GDRDMA IN HOST-STAGED RUN",
                 lambda: rc != "-" and not is_gdr_config(config) and gdr > 0))
            for problem, found in checks:
                if status.startswith("ok") and found():
                    status = problem
            # A run the machine could not start is reported, not failed (nor passed).
            if not (status.startswith("ok") or status.startswith("UNRUN")):
                failed = True
            status += "; NET/AGOQ log lines: %d" % r.agoq_log_lines()
            if is_collnet_config(config):
                status += "; via COLLNET/AGOQ: %d" % r.collnet_log_lines()
        # Costs: CPU seconds of the run; per GB and PCIe bytes from the plugin's statistics.
        cpu = r.cpu_seconds()
        payload, pcie, devcalls, entries, ends = r.stats()
        gb = cpu_gb = pcie_b = "-"
        if is_agoq_config(config):
            no_stats = entries == 0 or payload == "0"
            if no_stats:
                gb, cpu_gb = "n/a", "n/a (no stats)"
            else:
                gb = "%.4g" % (num(payload) / 1e9)
                cpu_gb = ("%.4g" % (num(cpu) / (num(payload) / 1e9))
                          if re.match(r"^[0-9.]+$", cpu) else "n/a")
            if not is_gdr_config(config):
                pcie_b = "n/a (NCCL's copies)"
            elif no_stats:
                pcie_b = "n/a (no stats)"
            else:
                pcie_b = "%.3f" % (num(pcie) / num(ends)) if num(ends) > 0 else "n/a"
        # Runs that never started have no costs.
        if not (status.startswith("UNRUN") or status.startswith("SKIPPED")):
            cost_rows.append(cost_fmt % (
                run, cpu, gb, cpu_gb, pcie_b, "yes" if gdr > 0 else "no",
                "device_calls=%s stats_entries=%d" % (devcalls, entries)
                if is_agoq_config(config) else ""))
        key = config + "." + test
        cpugb_of[key] = cpu_gb
        body.append(table_fmt % (run, rc, net, wrong, avg, last, rows, status))
        avg_of[key], last_of[key] = avg, last
        if not (status.startswith("ok") or status.startswith("UNRUN")):
            problems.append(r)

    body += ["",
             "Host cost per run: CPU s = user+sys seconds of the launcher and its rank processes;",
             "GB = payload the plugin was given (stats bytes_in, collnet + p2p_send); PCIe B/B =",
             "the plugin's pcie_d2h+pcie_h2d per byte NCCL's buffers gave it or took from it "
             "(p2p both ends,",
             "collnet input and result; 1.0 when every byte is copied; device runs; host-staged: "
             "NCCL copies).",
             cost_fmt % ("run", "CPU s", "GB", "CPU s/GB", "PCIe B/B", "GDRDMA", "")]
    # (bash's printf '%s\n' of an empty list printed one empty line; kept.)
    body += cost_rows or [""]
    # NCCL's own words about plugin loading and failures, for the runs that went wrong.
    for r in problems:
        found = r.problem_lines()
        if found:
            body += ["", "%s, first NET/Plugin / WARN / ERROR lines:" % r.run] + quote(found)
    body += ["", "busbw in GB/s (nccl-tests definitions); busbw@max = at the largest size."]
    for pair in BUSBW_PAIRS:
        top, base = pair.split("/")
        for t in tests:
            a, b = avg_of.get(top + "." + t), avg_of.get(base + "." + t)
            if not a or not b or a == "n/a" or b == "n/a":
                continue
            body.append("ratio %-34s %-10s avg busbw %s   busbw@max %s" % (
                pair, t, ratio(a, b), ratio(last_of[top + "." + t], last_of[base + "." + t])))
    for pair in CPU_PAIRS:
        top, base = pair.split("/")
        for t in tests:
            a, b = cpugb_of.get(top + "." + t), cpugb_of.get(base + "." + t)
            if not a or not b or a.startswith("n/a") or b.startswith("n/a"):
                continue
            x = ratio(a, b)
            body.append("ratio cpu s/GB %-34s %-10s %s" % (
                top + " / " + base, t, x if x == "n/a" else x + "x"))
    perf_lines = []
    for pair in PERF_PAIRS:
        top, base = pair.split("/")
        top_text = read(os.path.join(logs, top + ".all_reduce.out"))
        base_text = read(os.path.join(logs, base + ".all_reduce.out"))
        if not top_text or not base_text:
            continue
        cmp = per_size_ratio(top_text, base_text, PERF_TARGET)
        if cmp is None:
            continue
        low, at, below, n = cmp
        if below == "-":
            perf_lines.append("PERF: all_reduce %s / %s: >= 0.95 at all %d sizes (lowest %s at %s"
                              " B): met" % (top, base, n, low, at))
        else:
            perf_lines.append("PERF: all_reduce %s / %s: lowest %s at %s B; under 0.95 at %s B of"
                              " %d sizes: NOT MET" % (top, base, low, at, below, n))
    if perf_lines:
        body += ["", "busbw size by size, compression on (tuner deciding) over agoq's exact net:"]
        body += perf_lines
    # The hazard phase's facts and verdicts, quoted: they measure the driver, not agoq, and
    # do not change the verdict (a BLOCKED case is one agoq's device path must avoid).
    hazards = os.path.join(logs, "hazards.out")
    if os.path.isfile(hazards):
        body += ["", "facts and hazards (tools/gpu/gpu_hazards; BLOCKED: that case would hang a "
                 "real job):"]
        body += quote(ln[:300] for ln in lines(read(hazards))
                      if ln.startswith("fact:") or ln.startswith("hazard:"))
    codec_failed = torch_failed = mcore_failed = False
    if os.path.isfile(os.path.join(logs, "codec.rc")):
        more, codec_failed = codec_summary(logs, codec_limit)
        body += [""] + more
    torch_checks = (
        ("torch", "torch-check", "torch all_reduce through CollNet",
         "identical on all ranks, within the error bound"),
        ("torch-p2p", "torch-p2p-check", "torch send/recv through the typed net path",
         "bf16 quantized within the bound, int64 exact, all_reduce identical"),
        ("torch-gdr", "torch-check", "torch all_reduce through CollNet, device buffers "
         "(AGOQ_GPU=on, NCCL_NET_GDR_LEVEL=SYS), a NaN planted",
         "identical on all ranks, within the error bound"),
        ("torch-p2p-gdr", "torch-p2p-check", "torch send/recv, device buffers (AGOQ_GPU=on, "
         "NCCL_NET_GDR_LEVEL=SYS)",
         "bf16 quantized within the bound, int64 exact, all_reduce identical"))
    for name, prefix, title, passed in torch_checks:
        if not os.path.isfile(os.path.join(logs, name + ".rc")):
            continue
        more, bad = torch_summary(logs, name, prefix, title, passed)
        body += [""] + more
        torch_failed = torch_failed or bad
        # The device-buffer variants exist to run the device path (when they ran and passed).
        if name.endswith("-gdr") and subst(os.path.join(logs, name + ".rc")) == "0":
            more, bad = torch_device_path(logs, name)
            body += more
            torch_failed = torch_failed or bad
    if os.path.isfile(os.path.join(logs, "mcore.rc")):
        more, mcore_failed = mcore_summary(logs)
        body += [""] + more

    reasons = []
    if failed:
        reasons.append("an agoq run failed, had wrong values, did not use AGOQ or its CollNet, "
                       "or used GDRDMA where it should not or not where it should")
    if codec_failed:
        reasons.append("the CUDA codec check failed: see the codec line")
    if torch_failed:
        reasons.append("a PyTorch check failed: see its line")
    if mcore_failed:
        reasons.append("the Megatron-Core check failed: see its line")
    unrun_note = "; UNRUN by this launcher: " + " ".join(unrun_other) if unrun_other else ""
    body.append("")
    if reasons:
        body.append("VERDICT: FAILED (%s)%s" % ("; ".join(reasons), unrun_note))
        status = 1
    elif unrun_gpu:
        nruns = sum(1 for ln in lines(read(os.path.join(logs, "runs.txt"))) if ln)
        body.append("VERDICT: UNRUN: %d of %d runs need a GPU (%s); nothing that could run failed%s"
                    % (len(unrun_gpu), nruns, unrun_why, unrun_note))
        status = 3
    else:
        body.append("VERDICT: agoq runs correct" + unrun_note)
        status = 0
    body += perf_lines
    body.append("elapsed: %s s; logs: %s/logs.tar.gz" % (
        "n/a" if elapsed is None else elapsed, out_dir))
    return head + "\n".join(body) + "\n", status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", help="gpu-check.sh's OUT_DIR (with logs/)")
    ap.add_argument("--elapsed", help="seconds the check took, for the last line")
    ap.add_argument("--nranks", help="processes, where logs/settings.txt does not say")
    ap.add_argument("--codec-timeout",
                    help="the codec check's limit in s, where logs/settings.txt does not say")
    args = ap.parse_args(argv)
    out_dir = os.path.abspath(args.out_dir)
    path = os.path.join(out_dir, "summary.txt")
    try:
        text, status = summarize(out_dir, args.elapsed, args.nranks, args.codec_timeout)
    except Exception as e:  # noqa: BLE001 - a summary that says why beats none
        # A crash here must not read as a pass, nor leave the last check's summary behind.
        import traceback
        traceback.print_exc()
        text = "VERDICT: FAILED (the summary could not be computed: %s: %s)\n" % (
            type(e).__name__, e)
        status = 1
    with open(path, "w", encoding="latin-1", newline="") as f:
        f.write(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
