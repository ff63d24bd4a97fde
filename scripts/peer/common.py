"""Shared by the peer benchmark reports: the machine and build lines every page starts with."""

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


def provenance(db):
    """The kvbench build that wrote a results database: (git commit, dirty) from its first run."""
    import json
    import sqlite3
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    row = con.execute("SELECT provenance_json FROM runs ORDER BY id LIMIT 1").fetchone()
    con.close()
    p = json.loads(row[0]) if row and row[0] else {}
    return p.get("git_commit", "")[:12], bool(p.get("git_dirty"))


def machine_lines(kvbench, loadavg, db=None):
    """Machine, load, kvbench build and peer lines. The build's commit comes from the results database
    `db` when given (what the binary recorded), else from this checkout."""
    if db:
        commit, is_dirty = provenance(db)
        where = "built from commit"
    else:
        commit = _run("git", "rev-parse", "--short=12", "HEAD") or "unknown"
        is_dirty = bool(_run("git", "status", "--porcelain", "--untracked-files=no"))
        where = "checkout at commit"
    dirty = " with uncommitted changes" if is_dirty else ""
    mem = ""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f", {int(line.split()[1]) / 2**20:.0f} GiB memory"
    return [
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores (`nproc`){mem}; load average before the run: "
        f"{loadavg} (1, 5, 15 min)",
        f"- kvbench {_run(kvbench, '--version').replace('kvbench ', '')} (`{kvbench}`), {where} {commit}{dirty}; "
        f"run {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
    ] + load_warning(loadavg)
