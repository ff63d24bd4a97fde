"""Shared by the peer benchmark reports: the machine and build lines every page starts with, and the
cores' arithmetic peak the limits are read against."""

import datetime
import os
import subprocess


def _run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def load_warning(loadavg):
    """A line for the page when the machine was busy before the run (1-minute load over a quarter of
    the cores): multi-threaded timings are then unreliable (OpenMP workers wait on busy cores)."""
    one = float(loadavg.split()[0])
    if one <= 0.25 * (os.cpu_count() or 1):
        return []
    return [f"- **The machine was busy** (1-minute load {one:.2f} on {os.cpu_count()} cores before the run): "
            "these numbers, the multi-threaded ones most, are not a clean measurement; rerun on an idle "
            "machine."]


def machine_lines(kvbench, loadavg):
    """Machine, load and kvbench lines; the commit is this checkout's (the binary is named by path)."""
    commit = _run("git", "rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = " with uncommitted changes" if _run("git", "status", "--porcelain", "--untracked-files=no") else ""
    mem = ""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f", {int(line.split()[1]) / 2**20:.0f} GiB memory"
    return [
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores (`nproc`){mem}; load average before the run: "
        f"{loadavg} (1, 5, 15 min)",
        f"- kvbench {_run(kvbench, '--version').replace('kvbench ', '')} (`{kvbench}`), checkout at commit {commit}{dirty}; "
        f"run {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
    ] + load_warning(loadavg)


def cpu_peak_gflops():
    """AVX2 + FMA peak of this machine's cores: 2 FMA units x 8 fp32 lanes x 2 flops per cycle."""
    mhz = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                mhz = float(line.split(":")[1])
                break
    return (os.cpu_count() or 1) * (mhz or 0) * 1e-3 * 32, mhz
