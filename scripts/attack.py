#!/usr/bin/env python3
"""Runs hostile and careless inputs against a built kvbench and writes results/reliability.md from
what it observed: for every case the exit status, wall time, peak memory (the child's maximum
resident set) and the rows the results database holds afterwards, against what the case expects.

    scripts/attack.py [--kvbench build/kvbench] [--out results/reliability.md] [--only CLASS]
                      [--fuzz-log FILE] [--sanitize-log FILE] [--keep]

Attack classes: crashes from nested JSON, hangs from FIFOs, devices and huge files, unbounded
resources from small inputs, exit 2 with nothing written for config errors found at run time,
silent acceptance, several processes on one DB, a full disk, plus the fuzzers' and the sanitized
suite's last runs when their logs are given (scripts/fuzz.sh and scripts/sanitize.sh output). The
page is written only when every case ran (a case that does not behave as expected is reported as
FAIL on the page and makes the exit status 1). Models and data: $KVBENCH_MODELS / $KVBENCH_DATA,
else ../shared beside the checkout (stories260K, tinystories-valid-sample), and the repository's
kvb-testbed. Standard library only.
"""
import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Obs:
    """What one kvbench process did."""

    def __init__(self, code, wall_s, peak_mb, out, err):
        self.code, self.wall_s, self.peak_mb, self.out, self.err = code, wall_s, peak_mb, out, err

    def first_err_line(self):
        lines = [l for l in self.err.splitlines() if l.strip()]
        return lines[-1] if lines else ""


# An ASan build's resident set is about 3x the release binary's (shadow memory, redzones, the free
# quarantine: AddressSanitizer's documented typical overhead; 550 against 170 MiB for a config error
# here). Memory bounds are scaled by it on the sanitized binary, where they still tell a bounded
# process from one that reads a 4 GiB input.
ASAN_MEMORY_FACTOR = 3


class Ctx:
    def __init__(self, kvbench, work, sanitized=False):
        self.kvbench = os.path.abspath(kvbench)
        self.work = work
        self.sanitized = sanitized
        shared = os.path.join(os.path.dirname(ROOT), "shared")
        self.models = os.environ.get("KVBENCH_MODELS") or os.path.join(shared, "models")
        self.data = os.environ.get("KVBENCH_DATA") or os.path.join(shared, "data")
        self.stories = os.path.join(self.models, "stories260K")
        self.testbed = os.path.join(ROOT, "models", "kvb-testbed")
        self.n = 0
        self.seen = []  # every stderr, for sanitizer reports

    def small_memory(self, obs, mib):
        """Whether `obs` stayed under `mib` MiB of resident memory (scaled on a sanitized binary)."""
        return obs.peak_mb < mib * (ASAN_MEMORY_FACTOR if self.sanitized else 1)

    def dir(self, tag):
        self.n += 1
        d = os.path.join(self.work, "%02d-%s" % (self.n, tag))
        os.makedirs(d)
        return d

    def write(self, path, text, mode="w"):
        with open(path, mode) as f:
            f.write(text)
        return path

    def run(self, args, timeout=120, fsize=None, env=None, stdin=None, cwd=None, ignore_sigxfsz=True,
            stdout_path=""):
        """Runs kvbench with `args`; peak memory from wait4's rusage of that one child. stdout goes to
        a captured file, or to `stdout_path`, or is closed when that is None."""
        def limits():
            if fsize is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN if ignore_sigxfsz else signal.SIG_DFL)
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            if stdout_path is None:
                os.close(1)
        e = dict(os.environ, OMP_NUM_THREADS="2", KVBENCH_DATA=self.data)
        e.update(env or {})
        out_f = tempfile.TemporaryFile() if stdout_path == "" else (
            open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL)
        err_f = tempfile.TemporaryFile()
        t0 = time.monotonic()
        p = subprocess.Popen([self.kvbench] + args, stdout=out_f, stderr=err_f, env=e,
                             stdin=stdin if stdin is not None else subprocess.DEVNULL,
                             preexec_fn=limits, cwd=cwd or self.work)
        deadline = t0 + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.005)
        p.returncode = status
        wall = time.monotonic() - t0
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            code = 128 - code
        out = ""
        if stdout_path == "":
            out_f.seek(0)
            out = out_f.read().decode(errors="replace")
        elif stdout_path:
            out_f.close()
        err_f.seek(0)
        o = Obs(code, wall, ru.ru_maxrss / 1024.0, out, err_f.read().decode(errors="replace"))
        self.seen.append(o.err)
        return o

    def spawn(self, args, tag):
        out = open(os.path.join(self.work, tag + ".out"), "w")
        err = open(os.path.join(self.work, tag + ".err"), "w")
        return subprocess.Popen([self.kvbench] + args, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, cwd=self.work,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))


SANITIZER_REPORT = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error: ")


def sanitizer_reports(ctx):
    """Sanitizer reports in every stderr the cases produced (captured, and spawned processes' logs)."""
    texts = list(ctx.seen)
    for dirpath, _, files in os.walk(ctx.work):
        for f in files:
            if f.endswith(".err") or f == "err":
                texts.append(open(os.path.join(dirpath, f), errors="replace").read())
    return [line for t in texts for line in t.splitlines() if SANITIZER_REPORT.search(line)]


def db_rows(path):
    """'no DB', or 'R runs, S samples' as another program reads the file."""
    if not os.path.exists(path):
        return "no DB"
    c = sqlite3.connect(path)
    try:
        runs = c.execute("SELECT count(*) FROM runs").fetchone()[0]
        samples = c.execute("SELECT count(*) FROM samples").fetchone()[0]
    except sqlite3.DatabaseError:
        return "unreadable"
    finally:
        c.close()
    return "%d runs, %d samples" % (runs, samples)


def one_line(text):
    """The error is one line, the last one ("kvbench: loaded ..." notes may come before it)."""
    lines = [l for l in text.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("kvbench: error") or l.startswith("kvbench: internal")]
    return len(errors) == 1 and lines[-1] == errors[0] and errors[0].startswith("kvbench: error")


# ------------------------------------------------------------------------------------------------
# Cases. Each returns (Obs or None, rows text, ok, outcome note). `expect` is what passes.

CASES = []


def case(cls, name, expect):
    def wrap(fn):
        CASES.append((cls, name, expect, fn))
        return fn
    return wrap


def nested(depth, open_="[", close="]"):
    return open_ * depth + close * depth


def stream_cfg(ctx, method="full", window=64, windows=2, extra=""):
    return ('{"model": "%s", "method": "%s", "protocol": {"name": "stream", '
            '"dataset": "tinystories-valid-sample", "window": %d, "max_windows": %d%s}}'
            % (ctx.stories, method, window, windows, extra))


def expect_exit2(ctx, d, args, needles=(), max_s=10.0, db=None):
    o = ctx.run(args)
    rows = db_rows(db) if db else "-"
    msg = o.first_err_line()
    ok = (o.code == 2 and one_line(o.err) and o.wall_s < max_s and
          all(n in o.err for n in needles) and (db is None or rows in ("no DB", "0 runs, 0 samples")))
    return o, rows, ok, msg


CRASH = "crash: nested JSON"


@case(CRASH, "run config, 10^6 nested arrays", "exit 2, one line, nothing written")
def _(ctx):
    d = ctx.dir("nest-run")
    cfg = ctx.write(d + "/c.json", '{"model": "x", "method": ' + nested(1000000) + "}")
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"], ["nest"], db=d + "/db.sqlite")


@case(CRASH, "grid config, 10^6 nested objects in base", "exit 2, one line, nothing written")
def _(ctx):
    d = ctx.dir("nest-grid")
    cfg = ctx.write(d + "/g.json", '{"base": ' + '{"a":' * 1000000 + "1" + "}" * 1000000 + "}")
    return expect_exit2(ctx, d, ["grid", "-c", cfg, "--db", d + "/db.sqlite"], ["nest"], db=d + "/db.sqlite")


@case(CRASH, "--set value, 30,000 nested arrays", "exit 2, one line, nothing written")
def _(ctx):
    d = ctx.dir("nest-set")
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--set", "method.params.x=" + nested(30000),
                                 "--db", d + "/db.sqlite"], ["nest"], db=d + "/db.sqlite")


@case(CRASH, "model config.json, 10^6 nested arrays", "exit 2, one line")
def _(ctx):
    d = ctx.dir("nest-model")
    m = d + "/model"
    shutil.copytree(ctx.testbed, m)
    ctx.write(m + "/config.json", '{"hidden_size": ' + nested(1000000) + "}")
    return expect_exit2(ctx, d, ["inspect", "--model", m], ["config.json"])


@case(CRASH, "LongBench JSONL line, 10^6 nested arrays", "exit 2, one line, nothing written")
def _(ctx):
    d = ctx.dir("nest-jsonl")
    data = ctx.write(d + "/lb.jsonl", '{"input": ' + nested(1000000) + "}\n")
    tasks = os.path.join(ROOT, "tests", "fixtures", "longbench", "tasks.json")
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "qa", '
                    '"source": "longbench", "length": 0, "path": "%s", "tasks": "%s"}}' % (ctx.stories, data, tasks))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"], ["lb.jsonl"], db=d + "/db.sqlite")


@case(CRASH, "request trace, 10^6 nested arrays", "exit 2, one line, nothing written")
def _(ctx):
    d = ctx.dir("nest-trace")
    trace = ctx.write(d + "/t.jsonl", '{"timestamp": ' + nested(1000000) + "}\n")
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "serve", '
                    '"trace": "%s", "probe_lengths": "16,32"}}' % (ctx.stories, trace))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"], ["t.jsonl"], db=d + "/db.sqlite")


@case(CRASH, "results DB config_json column, 900 nested arrays (valid for SQLite)",
      "leaderboard exits 2 naming the run, nothing changed")
def _(ctx):
    d = ctx.dir("nest-db")
    db = d + "/db.sqlite"
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx))
    o = ctx.run(["run", "-q", "-c", cfg, "--db", db, "--data-dir", ctx.data])
    if o.code != 0:
        return o, db_rows(db), False, "setup run failed: " + o.first_err_line()
    c = sqlite3.connect(db)
    c.execute("UPDATE runs SET config_json = ?", (json.dumps({"method": {"name": "full"}})[:-1] +
                                                   ', "x": ' + nested(900) + "}",))
    c.commit()
    c.close()
    before = db_rows(db)
    o = ctx.run(["leaderboard", "--db", db])
    rows = db_rows(db)
    ok = o.code == 2 and one_line(o.err) and "run 1" in o.err and "nested" in o.err and rows == before
    return o, rows, ok, o.first_err_line()


HANG = "hang: FIFOs, devices, huge files"


def fifo(path):
    os.mkfifo(path)
    return path


@case(HANG, "FIFO as the run config", "exit 2 at once (nobody writes the FIFO)")
def _(ctx):
    d = ctx.dir("fifo-config")
    return expect_exit2(ctx, d, ["run", "-c", fifo(d + "/c.json"), "--db", d + "/db.sqlite"],
                        ["c.json"], db=d + "/db.sqlite")


@case(HANG, "FIFO as a LongBench data file", "exit 2 at once, nothing written")
def _(ctx):
    d = ctx.dir("fifo-data")
    data = fifo(d + "/lb.jsonl")
    tasks = os.path.join(ROOT, "tests", "fixtures", "longbench", "tasks.json")
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "qa", '
                    '"source": "longbench", "length": 0, "path": "%s", "tasks": "%s"}}' % (ctx.stories, data, tasks))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"], ["lb.jsonl"], db=d + "/db.sqlite")


@case(HANG, "FIFO as a serve request trace", "exit 2 at once, nothing written")
def _(ctx):
    d = ctx.dir("fifo-trace")
    trace = fifo(d + "/t.jsonl")
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "serve", '
                    '"trace": "%s", "probe_lengths": "16,32"}}' % (ctx.stories, trace))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"], ["t.jsonl"], db=d + "/db.sqlite")


@case(HANG, "/dev/zero as the grid config", "exit 2 at once")
def _(ctx):
    d = ctx.dir("devzero")
    return expect_exit2(ctx, d, ["grid", "-c", "/dev/zero", "--db", d + "/db.sqlite"], ["/dev/zero"],
                        db=d + "/db.sqlite")


@case(HANG, "a 4 GiB sparse file as the run config", "exit 2 at once, small memory")
def _(ctx):
    d = ctx.dir("huge")
    p = d + "/c.json"
    with open(p, "wb") as f:
        f.truncate(4 << 30)
    o, rows, ok, msg = expect_exit2(ctx, d, ["run", "-c", p, "--db", d + "/db.sqlite"], ["c.json"],
                                    db=d + "/db.sqlite")
    return o, rows, ok and ctx.small_memory(o, 400), msg


@case(HANG, "--threads 1000000", "exit 2 at once")
def _(ctx):
    d = ctx.dir("threads")
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--threads", "1000000", "--db", d + "/db.sqlite"],
                        ["threads", "1024"], db=d + "/db.sqlite")


@case(HANG, "score a text 40x the model's context", "exit 2 at once")
def _(ctx):
    d = ctx.dir("score-long")
    text = ctx.write(d + "/t.txt", "Once upon a time there was a cat. " * 2500)
    return expect_exit2(ctx, d, ["score", "--model", ctx.stories, "--file", text], ["context"])


RES = "unbounded resources from small inputs"


@case(RES, "grid whose method parameter lists multiply to 216,000 cells (1 KB)",
      "exit 2 fast, small memory")
def _(ctx):
    d = ctx.dir("grid-params")
    vals = list(range(1, 61))
    g = {"base": json.loads(stream_cfg(ctx)), "axes": {"method": [
        {"name": "snapkv", "params": {"window": vals, "kernel_size": vals, "budget": vals}}]}}
    cfg = ctx.write(d + "/g.json", json.dumps(g))
    o, rows, ok, msg = expect_exit2(ctx, d, ["grid", "-n", "-c", cfg], ["cells"], max_s=5)
    return o, rows, ok and ctx.small_memory(o, 400), msg


@case(RES, "grid of three 100-value axes (10^6 cells, 1.3 KB)", "exit 2 fast (over the 100,000-cell limit)")
def _(ctx):
    d = ctx.dir("grid-axes")
    g = {"base": json.loads(stream_cfg(ctx)),
         "axes": {"seed": list(range(100)), "protocol.max_windows": list(range(1, 101)),
                  "protocol.window": list(range(16, 116))}}
    cfg = ctx.write(d + "/g.json", json.dumps(g))
    o, rows, ok, msg = expect_exit2(ctx, d, ["grid", "-n", "--schema-only", "-c", cfg], ["100000 cells"])
    return o, rows, ok and ctx.small_memory(o, 400), msg


@case(RES, "grid of exactly 100,000 cells (the limit; 1 KB)", "planned: exit 0, time and memory as measured")
def _(ctx):
    d = ctx.dir("grid-limit")
    g = {"base": json.loads(stream_cfg(ctx)),
         "axes": {"seed": list(range(100)), "protocol.max_windows": list(range(1, 101)),
                  "protocol.window": list(range(16, 26))}}
    cfg = ctx.write(d + "/g.json", json.dumps(g))
    o = ctx.run(["grid", "-n", "--schema-only", "-c", cfg], timeout=600)
    m = re.match(r"grid '\w+': (\d+) of", o.out)
    cells = int(m.group(1)) if o.code == 0 and m else 0
    return o, "-", o.code == 0 and cells == 100000, "%d cells planned" % cells if cells else o.first_err_line()


@case(RES, "model config.json with max_position_embeddings 2^40", "exit 2 at once, small memory")
def _(ctx):
    d = ctx.dir("maxpos")
    m = d + "/model"
    shutil.copytree(ctx.testbed, m)
    c = json.load(open(m + "/config.json"))
    c["max_position_embeddings"] = 1 << 40
    ctx.write(m + "/config.json", json.dumps(c))
    o, rows, ok, msg = expect_exit2(ctx, d, ["inspect", "--model", m], ["max_position_embeddings"])
    return o, rows, ok and ctx.small_memory(o, 600), msg


@case(RES, "perf batch size 10^9", "exit 2 at once, nothing written")
def _(ctx):
    d = ctx.dir("perf-batch")
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "perf", '
                    '"context": 32, "decode_tokens": 4, "batch_sizes": "1000000000"}}' % ctx.stories)
    o, rows, ok, msg = expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"],
                                    ["batch_sizes"], db=d + "/db.sqlite")
    return o, rows, ok and ctx.small_memory(o, 600), msg


NOTHING = "exit 2, nothing written"


def nothing_written(ctx, tag, protocol, needles, method='"snapkv"'):
    d = ctx.dir(tag)
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": %s, "protocol": %s}'
                    % (ctx.stories, method, protocol))
    return expect_exit2(ctx, d, ["run", "-q", "-c", cfg, "--db", d + "/db.sqlite", "--data-dir",
                                 ctx.data], needles, db=d + "/db.sqlite")


NOTHING_CASES = [
    ("budget 7 (a ratio)", "budget", "{\"name\": \"stream\", \"window\": 64}",
     ["budget"], '{"name": "snapkv", "params": {"budget": 7}}'),
    ("unknown method parameter", "param", "{\"name\": \"stream\", \"window\": 64}",
     ["blok_size"], '{"name": "paged", "params": {"blok_size": 8}}'),
    ("unknown dataset", "dataset", "{\"name\": \"stream\", \"dataset\": \"no-such-corpus\", \"window\": 64}",
     ["no-such-corpus"], '"full"'),
    ("window longer than the context", "window", "{\"name\": \"stream\", \"window\": 4096}",
     ["window"], '"full"'),
    ("perf batch list '1,x'", "batches", "{\"name\": \"perf\", \"context\": 32, \"decode_tokens\": 4, \"batch_sizes\": \"1,x\"}",
     ["batch_sizes"], '"full"'),
    ("qa depths '0,1.5'", "depths", "{\"name\": \"qa\", \"source\": \"synthetic\", \"task\": \"passkey\", \"length\": 256, \"depths\": \"0,1.5\"}",
     ["depths"], '"full"'),
    ("qa task that does not exist", "task", "{\"name\": \"qa\", \"source\": \"synthetic\", \"task\": \"passkee\", \"length\": 256}",
     ["passkee"], '"full"'),
    ("serve target preset that does not exist", "target", "{\"name\": \"serve\", \"target\": \"llama-9z\", \"probe_lengths\": \"16,32\"}",
     ["target"], '"full"'),
    ("serve trace that does not exist", "trace", "{\"name\": \"serve\", \"trace\": \"/nonexistent/t.jsonl\", \"probe_lengths\": \"16,32\"}",
     ["/nonexistent/t.jsonl"], '"full"'),
    ("integer parameter given as 1e300", "int1e300", "{\"name\": \"stream\", \"window\": 1e300}",
     ["window"], '"full"'),
]

for _label, _tag, _proto, _needles, _method in NOTHING_CASES:
    case(NOTHING, _label, "exit 2, one line naming the input, no DB or no run row")(
        lambda ctx, t=_tag, p=_proto, n=_needles, m=_method: nothing_written(ctx, t, p, n, m))


SILENT = "silent acceptance"


@case(SILENT, "a weight holding NaN", "exit 2 naming the tensor, nothing written")
def _(ctx):
    d = ctx.dir("nan")
    m = d + "/model"
    shutil.copytree(ctx.testbed, m)
    p = m + "/model.safetensors"
    with open(p, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        name = sorted(k for k in header if k != "__metadata__")[0]
        f.seek(8 + n + header[name]["data_offsets"][0])
        f.write(struct.pack("<f", float("nan")))
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx).replace(ctx.stories, m))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite", "--data-dir", ctx.data],
                        [name], db=d + "/db.sqlite", max_s=20)


@case(SILENT, "a LongBench file of only blank lines", "exit 2 'yields no samples', nothing written")
def _(ctx):
    d = ctx.dir("empty-jsonl")
    data = ctx.write(d + "/lb.jsonl", "\n\n\n")
    tasks = os.path.join(ROOT, "tests", "fixtures", "longbench", "tasks.json")
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "qa", '
                    '"source": "longbench", "length": 0, "path": "%s", "tasks": "%s"}}' % (ctx.stories, data, tasks))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"], ["no samples"],
                        db=d + "/db.sqlite")


@case(SILENT, "--db :memory:", "exit 2 (results would be lost)")
def _(ctx):
    d = ctx.dir("memdb")
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", ":memory:"], ["results would be lost"])


@case(SILENT, "leaderboard over a DB with a damaged page", "exit 2 naming the DB and quick_check")
def _(ctx):
    d = ctx.dir("corrupt-db")
    db = d + "/db.sqlite"
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, windows=6))
    o = ctx.run(["run", "-q", "-c", cfg, "--db", db, "--data-dir", ctx.data])
    if o.code != 0:
        return o, db_rows(db), False, "setup run failed: " + o.first_err_line()
    c = sqlite3.connect(db)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    size = os.path.getsize(db)
    with open(db, "r+b") as f:  # scribble over the middle of the last page
        f.seek(size - 4096 + 1000)
        f.write(b"\xff" * 2000)
    o = ctx.run(["leaderboard", "--db", db])
    ok = o.code == 2 and db in o.err and one_line(o.err)
    return o, "damaged", ok, o.first_err_line()


CONC = "several processes, one DB"


def lease_grid(ctx, d, windows):
    g = {"name": "lease", "base": json.loads(stream_cfg(ctx, window=192, windows=windows)),
         "axes": {"method": ["full", "static", {"name": "paged", "params": {"block_size": [4, 16]}}]}}
    return ctx.write(d + "/g.json", json.dumps(g))


@case(CONC, "three `kvbench grid` on one grid and DB at once",
      "all exit 0; every run done, computed once (attempts 1), samples = a lone run's")
def _(ctx):
    d = ctx.dir("three-grids")
    cfg = lease_grid(ctx, d, 16)
    db = d + "/db.sqlite"
    t0 = time.monotonic()
    ps = [ctx.spawn(["grid", "--json", "--progress", "lines", "-c", cfg, "--db", db, "--data-dir",
                     ctx.data], "three-%d" % i) for i in range(3)]
    codes = [p.wait(timeout=600) for p in ps]
    wall = time.monotonic() - t0
    c = sqlite3.connect(db)
    runs = c.execute("SELECT status, attempts FROM runs").fetchall()
    samples = c.execute("SELECT count(*) FROM samples").fetchone()[0]
    c.close()
    held = sum(open(os.path.join(ctx.work, "three-%d.err" % i)).read().count("held elsewhere")
               for i in range(3))
    computed = 0
    for i in range(3):
        for cell in json.load(open(os.path.join(ctx.work, "three-%d.out" % i)))["cells"]:
            computed += cell["samples_computed"]
    ok = (codes == [0, 0, 0] and len(runs) == 4 and all(r == ("done", 1) for r in runs) and
          samples == 64 and computed == 64 and held > 0)
    o = Obs(max(codes), wall, float("nan"), "", "")
    note = "exits %s; %d runs done, attempts %s; %d samples computed in all; %d held-elsewhere lines" % (
        codes, len(runs), sorted(set(r[1] for r in runs)), computed, held)
    return o, "%d runs, %d samples" % (len(runs), samples), ok, note


@case(CONC, "a holder SIGKILLed while a second grid waits for its cell",
      "the second takes it over from its samples, exits 0; nothing lost or redone")
def _(ctx):
    d = ctx.dir("kill-holder")
    cfg = lease_grid(ctx, d, 16)
    db = d + "/db.sqlite"
    args = ["grid", "--json", "--progress", "lines", "-c", cfg, "--db", db, "--data-dir", ctx.data]
    t0 = time.monotonic()
    a = ctx.spawn(args, "holder-a")

    def stored():
        try:
            c = sqlite3.connect(db)
            n = c.execute("SELECT count(*) FROM samples").fetchone()[0]
            c.close()
            return n
        except sqlite3.Error:
            return 0
    while stored() < 3 and time.monotonic() - t0 < 120:
        time.sleep(0.01)
    b = ctx.spawn(args, "holder-b")
    err_b = os.path.join(ctx.work, "holder-b.err")
    while "held elsewhere" not in open(err_b).read() and time.monotonic() - t0 < 120:
        time.sleep(0.01)
    a.send_signal(signal.SIGKILL)
    code_a = a.wait()
    code_b = b.wait(timeout=600)
    wall = time.monotonic() - t0
    text_b = open(err_b).read()
    c = sqlite3.connect(db)
    runs = c.execute("SELECT status, attempts FROM runs").fetchall()
    samples = c.execute("SELECT count(*) FROM samples").fetchone()[0]
    c.close()
    computed = sum(cell["samples_computed"] for cell in
                   json.load(open(os.path.join(ctx.work, "holder-b.out")))["cells"])
    ok = (code_a == -signal.SIGKILL and code_b == 0 and "taking over run" in text_b and
          len(runs) == 4 and all(r[0] == "done" for r in runs) and samples == 64 and computed < 64)
    taken = [l for l in text_b.splitlines() if "taking over" in l]
    return (Obs(code_b, wall, float("nan"), "", ""), "%d runs, %d samples" % (len(runs), samples), ok,
            (taken[0].replace("kvbench: ", "") if taken else "no takeover line") +
            "; B computed %d of 64 samples" % computed)


DISK = "disk full"


@case(DISK, "baseline cache file past the file size limit (RLIMIT_FSIZE 200 KiB, EFBIG)",
      "exit 2, one line naming the cache file; run failed with it; no temporary file")
def _(ctx):
    d = ctx.dir("fsize-cache")
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, window=192, windows=3))
    db = d + "/db.sqlite"
    o = ctx.run(["run", "-q", "-c", cfg, "--db", db, "--cache-dir", d + "/cache", "--data-dir",
                 ctx.data], fsize=200 * 1024)
    tmp = [f for _, _, fs in os.walk(d) for f in fs if ".tmp" in f]
    c = sqlite3.connect(db)
    status, error = c.execute("SELECT status, error FROM runs").fetchone()
    c.close()
    ok = (o.code == 2 and one_line(o.err) and (d + "/cache/") in o.err and status == "failed" and
          (d + "/cache/") in error and not tmp)
    return o, db_rows(db) + ", run " + status, ok, o.first_err_line()


@case(DISK, "results DB that cannot grow (RLIMIT_FSIZE 160 KiB, EFBIG)",
      "grid stops, exit 3, message naming the DB; samples kept; a re-run finishes")
def _(ctx):
    d = ctx.dir("fsize-db")
    g = {"name": "full", "base": json.loads(stream_cfg(ctx, window=32, windows=120)),
         "axes": {"method": ["full", "static"]}}
    cfg = ctx.write(d + "/g.json", json.dumps(g))
    db = d + "/db.sqlite"
    o = ctx.run(["grid", "-c", cfg, "--db", db, "--data-dir", ctx.data], fsize=160 * 1024)
    rows = db_rows(db)
    tmp = [f for _, _, fs in os.walk(d) for f in fs if ".tmp" in f]
    again = ctx.run(["grid", "-q", "-c", cfg, "--db", db, "--data-dir", ctx.data])
    final = db_rows(db)
    ok = (o.code == 3 and "no room left to write it" in o.out and db in o.out and not tmp and
          again.code == 0 and final == "2 runs, 240 samples")
    failed = [l.strip() for l in o.out.splitlines() if "FAILED" in l]
    return o, rows + " (re-run: " + final + ")", ok, failed[0][:200] if failed else o.first_err_line()


@case(DISK, "results DB on a full 256 KiB tmpfs (ENOSPC; needs unshare -rm)",
      "grid stops, exit 3, message naming the DB; nothing else written there")
def _(ctx):
    d = ctx.dir("tmpfs")
    if shutil.which("unshare") is None or subprocess.call(
            ["unshare", "-rm", "true"], stderr=subprocess.DEVNULL) != 0:
        return None, "-", None, "skipped: no user and mount namespaces here"
    g = {"name": "full", "base": json.loads(stream_cfg(ctx, window=32, windows=120)),
         "axes": {"method": ["full", "static"]}}
    cfg = ctx.write(d + "/g.json", json.dumps(g))
    mnt = d + "/mnt"
    os.makedirs(mnt)
    script = ("mount -t tmpfs -o size=256k kvbench-full %s && cd %s && %s grid -c %s --db %s/db.sqlite "
              "--cache-dir %s/cache --data-dir %s > %s/out 2> %s/err; echo $? > %s/code; "
              "ls -a %s > %s/ls; cp %s/db.sqlite* %s/ 2>/dev/null; true" %
              (mnt, d, ctx.kvbench, cfg, mnt, d, ctx.data, d, d, d, mnt, d, mnt, d))
    t0 = time.monotonic()
    subprocess.call(["unshare", "-rm", "sh", "-c", script])
    wall = time.monotonic() - t0
    code = int(open(d + "/code").read())
    out = open(d + "/out").read()
    listing = open(d + "/ls").read().split()
    rows = db_rows(d + "/db.sqlite")
    ok = (code == 3 and "no room left to write it" in out and
          all(f in (".", "..", "db.sqlite", "db.sqlite-wal", "db.sqlite-shm") for f in listing))
    failed = [l.strip() for l in out.splitlines() if "FAILED" in l]
    return Obs(code, wall, float("nan"), out, ""), rows, ok, failed[0][:200] if failed else out[-200:]


FOREIGN = "foreign code: libraries, plugins, scheduler variables"


def hostile_library(ctx, d):
    """A shared library whose constructor creates $KVB_HOSTILE_MARKER; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src = ctx.write(d + "/hostile.c", "#include <fcntl.h>\n#include <stdlib.h>\n#include <unistd.h>\n"
                    "__attribute__((constructor)) static void loaded(void) {\n"
                    "  const char* m = getenv(\"KVB_HOSTILE_MARKER\");\n"
                    "  if (m) close(open(m, O_WRONLY | O_CREAT, 0644));\n}\n")
    lib = d + "/hostile.so"
    if subprocess.call([cc, "-shared", "-fPIC", "-o", lib, src]) != 0:
        return None
    return lib


def needed_libraries(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@case(FOREIGN, "a hostile copy of every library kvbench needs (libz.so.1, ...) in the working directory",
      "exit 0, none of them loaded")
def _(ctx):
    d = ctx.dir("cwd-libs")
    lib = hostile_library(ctx, d)
    if lib is None:
        return None, "-", None, "skipped: no C compiler"
    names = needed_libraries(ctx.kvbench)
    for n in names:
        shutil.copy(lib, os.path.join(d, n))
    marker = d + "/loaded"
    o = ctx.run(["--version"], env={"KVB_HOSTILE_MARKER": marker}, cwd=d)
    ok = o.code == 0 and not os.path.exists(marker) and len(names) > 3
    return o, "-", ok, "%d libraries planted; %s" % (len(names), o.out.strip() or o.first_err_line())


@case(FOREIGN, "RUNPATH of the binary", "every entry absolute (an empty one is the working directory)")
def _(ctx):
    out = subprocess.run(["readelf", "-d", ctx.kvbench], capture_output=True, text=True).stdout
    paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[([^\]]*)\]", out)
    entries = [e for p in paths for e in p.split(":")]
    ok = all(e.startswith("/") or e.startswith("$ORIGIN") for e in entries)
    return None, "-", ok, "RUNPATH %s" % (":".join(paths) if paths else "(none)")


@case(FOREIGN, "--plugin p.so (a bare name) with another p.so on LD_LIBRARY_PATH",
      "the p.so in the working directory is loaded, not the other")
def _(ctx):
    d = ctx.dir("plugin-name")
    lib = hostile_library(ctx, d)
    if lib is None:
        return None, "-", None, "skipped: no C compiler"
    os.makedirs(d + "/cwd")
    os.makedirs(d + "/other")
    shutil.copy(lib, d + "/other/p.so")
    ctx.write(d + "/cwd/p.so", "not a shared library")
    marker = d + "/loaded"
    o = ctx.run(["--plugin", "p.so", "methods"], cwd=d + "/cwd",
                env={"KVB_HOSTILE_MARKER": marker, "LD_LIBRARY_PATH": d + "/other"})
    ok = o.code == 2 and one_line(o.err) and "p.so" in o.err and not os.path.exists(marker)
    return o, "-", ok, o.first_err_line()


def shard_script(ctx, d, env):
    """scripts/grid_shard.sh under `env` (a stand-in kvbench that records being started)."""
    fake = ctx.write(d + "/fake-kvbench", "#!/bin/sh\ntouch %s/started\n" % d)
    os.chmod(fake, 0o755)
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KVB": fake}
    e.update(env)
    t0 = time.monotonic()
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "grid_shard.sh"), d + "/g.json", d + "/out"],
                       env=e, capture_output=True, text=True, cwd=d)
    o = Obs(p.returncode, time.monotonic() - t0, float("nan"), p.stdout, p.stderr)
    return o, os.path.exists(d + "/started")


SHARD_CASES = [
    ("SLURM_ARRAY_TASK_ID holding a command substitution", "inject-id",
     {"SLURM_ARRAY_TASK_ID": "a[$(touch pwned)]", "SLURM_ARRAY_TASK_COUNT": "4"}),
    ("SLURM_ARRAY_TASK_MIN holding a command substitution", "inject-min",
     {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "x[$(touch pwned)]", "SLURM_ARRAY_TASK_COUNT": "4"}),
    ("one task resubmitted (--array=2) without KVB_SHARD_COUNT", "resubmit",
     {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "2", "SLURM_ARRAY_TASK_MAX": "2",
      "SLURM_ARRAY_TASK_COUNT": "1"}),
    ("stepped array (--array=0-6:2) without KVB_SHARD_COUNT", "stepped",
     {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6",
      "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "4"}),
]


def shard_refused(ctx, tag, env):
    d = ctx.dir("shard-" + tag)
    o, started = shard_script(ctx, d, env)
    ok = o.code == 2 and not started and not os.path.exists(d + "/pwned") and not os.path.exists(d + "/out")
    return o, "-", ok, o.first_err_line()


for _label, _tag, _env in SHARD_CASES:
    case(FOREIGN, "grid_shard.sh: " + _label, "exit 2 naming the variable, nothing run")(
        lambda ctx, t=_tag, e=_env: shard_refused(ctx, t, e))


@case(FOREIGN, "grid_shard.sh: resubmitted task 2 with KVB_SHARD_COUNT=4", "runs shard 2/4")
def _(ctx):
    d = ctx.dir("shard-resume")
    o, started = shard_script(ctx, d, {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "2",
                                       "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_COUNT": "1",
                                       "KVB_SHARD_COUNT": "4"})
    ok = o.code == 0 and started and "shard 2/4" in o.err
    return o, "-", ok, o.first_err_line()


OUTPUT = "output: standard output and file size limits"


@case(OUTPUT, "kvbench methods > /dev/full", "exit non-zero, one line naming standard output")
def _(ctx):
    o = ctx.run(["methods"], stdout_path="/dev/full")
    ok = o.code != 0 and one_line(o.err) and "standard output" in o.err
    return o, "-", ok, o.first_err_line()


@case(OUTPUT, "kvbench leaderboard with standard output closed", "exit non-zero, one line naming standard output")
def _(ctx):
    d = ctx.dir("stdout-closed")
    db = d + "/db.sqlite"
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, windows=1))
    ctx.run(["run", "-q", "-c", cfg, "--db", db, "--data-dir", ctx.data])
    o = ctx.run(["leaderboard", "--db", db], stdout_path=None)
    ok = o.code != 0 and one_line(o.err) and "standard output" in o.err
    return o, db_rows(db), ok, o.first_err_line()


@case(OUTPUT, "run under a 200 KiB file size limit with SIGXFSZ at its default (a batch scheduler's limit)",
      "not killed by the signal: exit 2, one line naming the file")
def _(ctx):
    d = ctx.dir("sigxfsz")
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, window=192, windows=3))
    db = d + "/db.sqlite"
    o = ctx.run(["run", "-q", "-c", cfg, "--db", db, "--cache-dir", d + "/cache", "--data-dir", ctx.data],
                fsize=200 * 1024, ignore_sigxfsz=False)
    ok = o.code == 2 and one_line(o.err) and (d + "/cache/") in o.err
    return o, db_rows(db), ok, o.first_err_line()


STALE = "stale results: on-disk caches"


def run_level(db, name):
    c = sqlite3.connect(db)
    try:
        row = c.execute("SELECT value FROM metrics WHERE name = ? AND layer IS NULL AND head IS NULL "
                        "ORDER BY run_id DESC LIMIT 1", (name,)).fetchone()
    finally:
        c.close()
    return None if row is None else row[0]


def perturb_weights(model_dir):
    """Negates every float of the first tensor of model.safetensors: same size, other weights."""
    p = model_dir + "/model.safetensors"
    with open(p, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        name = sorted(k for k in header if k != "__metadata__")[0]
        a, b = header[name]["data_offsets"]
        f.seek(8 + n + a)
        raw = bytearray(f.read(b - a))
        for i in range(3, len(raw), 4):
            raw[i] ^= 0x80
        f.seek(8 + n + a)
        f.write(raw)


@case(STALE, "model weights replaced in place by others of the same size, then `full` again",
      "the baseline is the new model's: full's KL exactly 0")
def _(ctx):
    d = ctx.dir("stale-weights")
    m = d + "/model"
    shutil.copytree(ctx.testbed, m)
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, windows=2).replace(ctx.stories, m))
    first = ctx.run(["run", "-q", "-c", cfg, "--db", d + "/a.sqlite", "--cache-dir", d + "/cache",
                     "--data-dir", ctx.data])
    size = os.path.getsize(m + "/model.safetensors")
    perturb_weights(m)
    o = ctx.run(["run", "-q", "-c", cfg, "--db", d + "/b.sqlite", "--cache-dir", d + "/cache",
                 "--data-dir", ctx.data])
    kl = run_level(d + "/b.sqlite", "kl_mean")
    ok = first.code == 0 and o.code == 0 and size == os.path.getsize(m + "/model.safetensors") and kl == 0
    return o, db_rows(d + "/b.sqlite"), ok, "full's kl_mean %s" % kl


@case(STALE, "every baseline cache file zero-filled at its size, then `full` again",
      "the damaged entries are recomputed: full's KL exactly 0")
def _(ctx):
    d = ctx.dir("stale-zero")
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, windows=2))
    first = ctx.run(["run", "-q", "-c", cfg, "--db", d + "/a.sqlite", "--cache-dir", d + "/cache",
                     "--data-dir", ctx.data])
    files = [os.path.join(r, f) for r, _, fs in os.walk(d + "/cache") for f in fs]
    for f in files:
        size = os.path.getsize(f)
        with open(f, "r+b") as fh:
            fh.write(b"\0" * size)
    o = ctx.run(["run", "-q", "-c", cfg, "--db", d + "/b.sqlite", "--cache-dir", d + "/cache",
                 "--data-dir", ctx.data])
    kl = run_level(d + "/b.sqlite", "kl_mean")
    ok = first.code == 0 and o.code == 0 and files and kl == 0
    return o, db_rows(d + "/b.sqlite"), ok, "%d files zeroed; full's kl_mean %s" % (len(files), kl)


READONLY = "read commands: read-only archives, nothing written"


def archive(ctx, d, methods=("full", "static")):
    """A results DB with one stream run per method, checkpointed; returns its path."""
    db = d + "/archive/db.sqlite"
    for m in methods:
        cfg = ctx.write(d + "/%s.json" % m, stream_cfg(ctx, method=m, windows=2))
        o = ctx.run(["run", "-q", "-c", cfg, "--db", db, "--cache-dir", d + "/cache", "--data-dir", ctx.data])
        if o.code != 0:
            raise RuntimeError("setup run failed: " + o.first_err_line())
    c = sqlite3.connect(db)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    for f in os.listdir(d + "/archive"):
        if f != "db.sqlite":
            os.remove(os.path.join(d + "/archive", f))
    return db


def snapshot(folder):
    """Names, sizes, mtimes and bytes of every file in `folder`."""
    out = {}
    for f in sorted(os.listdir(folder)):
        p = os.path.join(folder, f)
        st = os.stat(p)
        out[f] = (st.st_size, st.st_mtime_ns, open(p, "rb").read() if os.path.isfile(p) else b"")
    return out


def damage(db):
    """Overwrites the b-tree header of page 2 (the first table's root): quick_check must see it."""
    with open(db, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 100)


def unchanged_after(ctx, d, db, commands):
    """Runs `commands`; the DB file must keep its bytes and mtime. SQLite's shared-memory index and
    an empty write-ahead log may appear beside a WAL database a reader opened (they hold no data)."""
    before = snapshot(os.path.dirname(db))
    obs = [ctx.run(c) for c in commands]
    after = snapshot(os.path.dirname(db))
    bad = [(c, o) for c, o in zip(commands, obs) if o.code != 0]
    base = os.path.basename(db)
    extra = [f for f in set(after) - set(before)
             if not (f == base + "-shm" or (f == base + "-wal" and after[f][0] == 0))]
    changed = sorted(extra) or [f for f in before if before[f] != after.get(f)]
    ok = not bad and not changed
    note = ("%d commands, the folder byte-identical" % len(commands) if ok else
            "changed: %s; failed: %s" % (changed, ["%s -> %d %s" % (c[0], o.code, o.first_err_line())
                                                    for c, o in bad]))
    return obs[-1], db_rows(db), ok, note


@case(READONLY, "leaderboard, show, compare, grid --dry-run, merge (as input) on an archived DB",
      "each exits 0; the DB file byte-identical, its mtime unchanged, no other file but SQLite's -shm / an empty -wal")
def _(ctx):
    d = ctx.dir("ro-archive")
    db = archive(ctx, d)
    g = {"name": "x", "base": json.loads(stream_cfg(ctx, windows=2)), "axes": {"method": ["full", "static"]}}
    grid = ctx.write(d + "/g.json", json.dumps(g))
    return unchanged_after(ctx, d, db, [
        ["leaderboard", "--db", db], ["show", "1", "--db", db], ["compare", "1", "2", "--db", db],
        ["grid", "--dry-run", "-c", grid, "--db", db], ["merge", d + "/out.sqlite", db]])


@case(READONLY, "the same commands on a read-only mount (unshare -rm, bind mount ro)",
      "each exits 0 (a reader never needs to write)")
def _(ctx):
    d = ctx.dir("ro-mount")
    if shutil.which("unshare") is None or subprocess.call(
            ["unshare", "-rm", "true"], stderr=subprocess.DEVNULL) != 0:
        return None, "-", None, "skipped: no user and mount namespaces here"
    db = archive(ctx, d)
    cmds = [["leaderboard", "--db", db], ["show", "1", "--db", db], ["compare", "1", "2", "--db", db],
            ["merge", d + "/out.sqlite", db]]
    script = "mount --bind -o ro %s/archive %s/archive && mount -o remount,ro,bind %s/archive && " % (d, d, d)
    script += " && ".join("%s %s > /dev/null 2>> %s/err" % (ctx.kvbench, " ".join(c), d) for c in cmds)
    t0 = time.monotonic()
    code = subprocess.call(["unshare", "-rm", "sh", "-c", script], env=dict(os.environ, OMP_NUM_THREADS="2"))
    err = open(d + "/err").read() if os.path.exists(d + "/err") else ""
    o = Obs(code, time.monotonic() - t0, float("nan"), "", err)
    return o, db_rows(db), code == 0, o.first_err_line() or "all read"


@case(READONLY, "leaderboard on a 0-byte file", "exit 2 naming it; the file stays 0 bytes")
def _(ctx):
    d = ctx.dir("zero-db")
    db = ctx.write(d + "/db.sqlite", "")
    o = ctx.run(["leaderboard", "--db", db])
    ok = o.code == 2 and one_line(o.err) and db in o.err and os.path.getsize(db) == 0 and \
        sorted(os.listdir(d)) == ["db.sqlite"]
    return o, "%d bytes" % os.path.getsize(db), ok, o.first_err_line()


@case(READONLY, "leaderboard while another process holds the DB's write lock",
      "exit 0 within seconds (a WAL reader does not wait for a writer)")
def _(ctx):
    d = ctx.dir("ro-locked")
    db = archive(ctx, d)
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("BEGIN IMMEDIATE")
    c.execute("UPDATE runs SET worker = worker")
    try:
        o = ctx.run(["leaderboard", "--db", db], timeout=60)
    finally:
        c.execute("ROLLBACK")
        c.close()
    ok = o.code == 0 and o.wall_s < 5
    return o, db_rows(db), ok, o.first_err_line() or "read in %.2f s" % o.wall_s


@case(READONLY, "run into a DB with a damaged page", "exit 2 naming the DB; the file unchanged")
def _(ctx):
    d = ctx.dir("corrupt-run")
    db = archive(ctx, d, methods=("full",))
    damage(db)
    before = snapshot(d + "/archive")
    cfg = ctx.write(d + "/s.json", stream_cfg(ctx, method="static", windows=2))
    o = ctx.run(["run", "-q", "-c", cfg, "--db", db, "--data-dir", ctx.data])
    after = snapshot(d + "/archive")
    ok = o.code == 2 and one_line(o.err) and db in o.err and before["db.sqlite"] == after.get("db.sqlite")
    return o, "damaged", ok, o.first_err_line()


@case(READONLY, "show and merge (as input) over a DB with a damaged page", "exit 2 naming the DB")
def _(ctx):
    d = ctx.dir("corrupt-show")
    db = archive(ctx, d, methods=("full",))
    damage(db)
    a = ctx.run(["show", "1", "--db", db])
    o = ctx.run(["merge", d + "/out.sqlite", db])
    ok = a.code == 2 and o.code == 2 and db in a.err and db in o.err
    return o, "damaged", ok, a.first_err_line()


@case(READONLY, "merge into a DB a live grid is writing", "the grid finishes every cell (exit 0)")
def _(ctx):
    d = ctx.dir("merge-live")
    other = archive(ctx, d, methods=("full",))
    g = {"name": "live", "base": json.loads(stream_cfg(ctx, window=48, windows=40)),
         "axes": {"method": ["full", "static", "streaming_llm"]}}
    cfg = ctx.write(d + "/g.json", json.dumps(g))
    db = d + "/live.sqlite"
    p = ctx.spawn(["grid", "--progress", "lines", "-c", cfg, "--db", db, "--data-dir", ctx.data], "merge-live-grid")
    merges = []
    t0 = time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < 120:
        merges.append(ctx.run(["merge", db, other]).code)
        time.sleep(0.2)
    code = p.wait()
    out = open(os.path.join(ctx.work, "merge-live-grid.out")).read()
    ok = code == 0 and "FAILED" not in out
    return Obs(code, time.monotonic() - t0, float("nan"), out, ""), db_rows(db), ok, \
        "%d merges during the grid (exits %s)" % (len(merges), sorted(set(merges)))


CONFIG = "config errors in grid, reproduce and serve: nothing written"


@case(CONFIG, "grid with a method parameter out of range (snapkv budget 7)",
      "exit 2 naming the cell and parameter, no DB; --dry-run says the same")
def _(ctx):
    d = ctx.dir("grid-param")
    g = {"name": "bad", "base": json.loads(stream_cfg(ctx, windows=1)),
         "axes": {"method": ["full", {"name": "snapkv", "params": {"budget": [0.5, 7]}}]}}
    cfg = ctx.write(d + "/g.json", json.dumps(g))
    dry = ctx.run(["grid", "--dry-run", "-c", cfg, "--db", d + "/db.sqlite"])
    o, rows, ok, msg = expect_exit2(ctx, d, ["grid", "-c", cfg, "--db", d + "/db.sqlite", "--data-dir", ctx.data],
                                    ["budget"], db=d + "/db.sqlite")
    return o, rows, ok and dry.code == 2 and "budget" in dry.err, msg


@case(CONFIG, "reproduce suite whose cell has a method parameter out of range",
      "exit 2 naming the parameter, no DB")
def _(ctx):
    d = ctx.dir("repro-param")
    os.makedirs(d + "/suites")
    cell = json.loads(stream_cfg(ctx, windows=1))
    bad = dict(cell, method={"name": "snapkv", "params": {"budget": 7}})
    suite = {"paper": "bad", "title": "bad", "reference": "-", "setting": "-", "claims": [{
        "id": "c", "statement": "s", "paper_value": "-", "source": "-",
        "predicate": {"metric": "kl_mean", "kind": "difference", "direction": "greater", "threshold": 0.0},
        "a": {"config": cell}, "b": {"config": bad}, "caveat": "-"}]}
    ctx.write(d + "/suites/bad.json", json.dumps(suite))
    return expect_exit2(ctx, d, ["reproduce", "bad", "--suites-dir", d + "/suites", "--db", d + "/db.sqlite",
                                 "--out-dir", d + "/pages", "--data-dir", ctx.data],
                        ["budget"], db=d + "/db.sqlite")


@case(CONFIG, "serve with prefix_store 'redis://:notaport'", "exit 2 naming the URL, nothing written")
def _(ctx):
    return nothing_written(ctx, "serve-url", '{"name": "serve", "prefix_store": "redis://:notaport", '
                           '"prefix_cache_gib": 1, "probe_lengths": "16,32"}', ["redis://:notaport"], '"full"')


@case(CONFIG, "LongBench qa, `length: 0`, a context 40x the model's (10 MB)",
      "exit 2 naming the sample and the context within seconds, nothing written")
def _(ctx):
    d = ctx.dir("lb-long")
    ctx.write(d + "/lb.jsonl", json.dumps({"_id": "x", "dataset": "storyqa", "input": "What?", "answers": ["a"],
                                           "context": "Once upon a time. " * 600000, "length": 1,
                                           "all_classes": None}) + "\n")
    ctx.write(d + "/tasks.json", open(os.path.join(ROOT, "configs", "examples", "longbench", "tasks.json")).read())
    cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "qa", '
                    '"source": "longbench", "length": 0, "path": "%s/lb.jsonl", "tasks": "%s/tasks.json"}}'
                    % (ctx.stories, d, d))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite"], ["context"], max_s=30,
                        db=d + "/db.sqlite")


@case(CONFIG, "the shipped LongBench example (configs/examples/qa_longbench.json)", "runs within the context: exit 0")
def _(ctx):
    d = ctx.dir("lb-example")
    o = ctx.run(["run", "-q", "-c", os.path.join(ROOT, "configs", "examples", "qa_longbench.json"),
                 "--db", d + "/db.sqlite"], timeout=300, cwd=ROOT)
    return o, db_rows(d + "/db.sqlite"), o.code == 0, o.first_err_line() or "done"


SIZES = "sizes read from input or flags"


def fake_redis(reply):
    """A one-shot loopback server answering any request with `reply`; returns (port, thread)."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(60)

    def serve():
        try:
            while True:
                conn, _ = srv.accept()
                conn.settimeout(5)
                try:
                    while conn.recv(65536):
                        conn.sendall(reply)
                except OSError:
                    pass
                conn.close()
        except OSError:
            pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, srv.getsockname()[1]


@case(SIZES, "a Redis prefix store answering every request with a 16 GiB bulk length",
      "exit 2 naming the reply, small memory")
def _(ctx):
    d = ctx.dir("redis-huge")
    srv, port = fake_redis(b"$17179869184\r\nabc")
    try:
        cfg = ctx.write(d + "/c.json", '{"model": "%s", "method": "full", "protocol": {"name": "serve", '
                        '"prefix_store": "redis://127.0.0.1:%d", "prefix_cache_gib": 1, '
                        '"probe_lengths": "16,32"}}' % (ctx.stories, port))
        o = ctx.run(["run", "-q", "-c", cfg, "--db", d + "/db.sqlite", "--data-dir", ctx.data], timeout=120)
    finally:
        srv.close()
    ok = o.code == 2 and one_line(o.err) and ctx.small_memory(o, 600)
    return o, db_rows(d + "/db.sqlite"), ok, o.first_err_line()


@case(SIZES, "tokenizer.json with 40 chained ByteLevel pre-tokenizers", "exit 2 within seconds, small memory")
def _(ctx):
    d = ctx.dir("bytelevel-chain")
    tok = {"version": "1.0", "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}] * 40},
           "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}
    path = ctx.write(d + "/tokenizer.json", json.dumps(tok))
    o = ctx.run(["tokenize", "--tokenizer", path, "--text", "hello world " * 50], timeout=60)
    ok = o.code == 2 and one_line(o.err) and o.wall_s < 10 and ctx.small_memory(o, 600)
    return o, "-", ok, o.first_err_line()


@case(SIZES, "a one-word 50 MB corpus as the stream dataset", "bounded memory (< 1 GiB), a clear outcome")
def _(ctx):
    d = ctx.dir("one-word")
    with open(d + "/w.txt", "w") as f:
        f.write("a" * (50 << 20))
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, windows=1).replace('"tinystories-valid-sample"', '"%s/w.txt"' % d))
    o = ctx.run(["run", "-q", "-c", cfg, "--db", d + "/db.sqlite"], timeout=300)
    ok = o.code in (0, 2) and ctx.small_memory(o, 1024) and (o.code == 0 or one_line(o.err))
    return o, db_rows(d + "/db.sqlite"), ok, o.first_err_line() or "done"


@case(SIZES, "--set with a dotted key path of 50,000 components (near argv's 128 KiB per argument)", "exit 2 at once")
def _(ctx):
    d = ctx.dir("dotted-set")
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, windows=1))
    return expect_exit2(ctx, d, ["run", "-c", cfg, "--db", d + "/db.sqlite", "--set", ".".join(["a"] * 50000) + "=1"],
                        [], db=d + "/db.sqlite")


@case(SIZES, "grid axis with a dotted key path of 100,000 components", "exit 2 at once")
def _(ctx):
    d = ctx.dir("dotted-axis")
    g = '{"name": "x", "base": %s, "axes": {"%s": [1, 2]}}' % (stream_cfg(ctx, windows=1), ".".join(["a"] * 100000))
    cfg = ctx.write(d + "/g.json", g)
    return expect_exit2(ctx, d, ["grid", "--dry-run", "-c", cfg, "--db", d + "/db.sqlite"], [], db=d + "/db.sqlite")


FLAG_CASES = [
    ("compare --resamples 10^12", ["compare", "1", "2", "--resamples", "1000000000000"], "--resamples"),
    ("bench --batch 1000000000", ["bench", "--batch", "1000000000"], "--batch"),
    ("bench --context 10^12", ["bench", "--context", "1000000000000"], "--context"),
    ("bench --repeats 10^12", ["bench", "--repeats", "1000000000000"], "--repeats"),
]

for _label, _args, _flag in FLAG_CASES:
    case(SIZES, _label, "exit 2 naming the flag and its range, at once")(
        lambda ctx, a=_args, f=_flag: expect_exit2(ctx, ctx.dir("flag"), a + ["--db", ctx.work + "/none.sqlite"]
                                                   if a[0] == "compare" else a, [f]))


SMALL = "messages and terminal output"


@case(SMALL, "a method name holding NUL and 10 MB of text", "exit 2, one bounded line (< 1 KB), NUL shown escaped")
def _(ctx):
    d = ctx.dir("long-name")
    cfg = ctx.write(d + "/c.json", json.dumps({"model": ctx.stories, "method": "a\u0000b" + "x" * (10 << 20),
                                               "protocol": "stream"}))
    o = ctx.run(["run", "-c", cfg, "--db", d + "/db.sqlite"])
    ok = o.code == 2 and one_line(o.err) and len(o.err) < 1024 and ("\\0" in o.err or "\\u0000" in o.err)
    return o, db_rows(d + "/db.sqlite"), ok, o.first_err_line()[:160]


@case(SMALL, "show of a run whose stored error holds terminal escape sequences",
      "no ESC or BEL byte reaches the terminal")
def _(ctx):
    d = ctx.dir("escapes")
    db = archive(ctx, d, methods=("full",))
    c = sqlite3.connect(db)
    c.execute("UPDATE runs SET error = ?, worker = ?", ("\x1b]0;owned\x07\x1b[2J", "\x1b[31mred"))
    c.commit()
    c.close()
    o = ctx.run(["show", "1", "--db", db])
    ok = o.code == 0 and "\x1b" not in o.out and "\x07" not in o.out
    return o, db_rows(db), ok, "escaped" if ok else repr(o.out[:120])


@case(SMALL, "leaderboard --format md over a dataset path holding HTML", "the cell escaped (&lt;)")
def _(ctx):
    d = ctx.dir("md-html")
    os.makedirs(d + "/<img src=x onerror=alert(1)>")
    text = d + "/<img src=x onerror=alert(1)>/t.txt"
    ctx.write(text, "Once upon a time there was a little cat. It liked to play in the sun. " * 100)
    cfg = ctx.write(d + "/c.json", stream_cfg(ctx, windows=1).replace('"tinystories-valid-sample"', json.dumps(text)))
    r = ctx.run(["run", "-q", "-c", cfg, "--db", d + "/db.sqlite"])
    o = ctx.run(["leaderboard", "--db", d + "/db.sqlite", "--format", "md"])
    ok = r.code == 0 and o.code == 0 and "<img" not in o.out
    return o, db_rows(d + "/db.sqlite"), ok, "escaped" if ok else (r.first_err_line() or "raw <img in the page")


# ------------------------------------------------------------------------------------------------
# Logs of the expensive runs: the fuzzers (scripts/fuzz.sh) and the sanitized suite
# (scripts/sanitize.sh), summarised from their output.

def fuzz_summary(path):
    rows, cur = [], None
    for line in open(path, errors="replace"):
        m = re.match(r"== (fuzz_\w+): (\d+)s", line)
        if m:
            cur = {"name": m.group(1), "seconds": int(m.group(2)), "execs": None, "finding": False,
                   "cov": None, "corpus": None}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.match(r"stat::number_of_executed_units: (\d+)", line)
        if m:
            cur["execs"] = int(m.group(1))
        m = re.search(r"#\d+\s+DONE\s+(?:cov: (\d+) )?ft: (\d+) corp: (\d+)/", line)
        if m:
            cur["cov"] = m.group(2)
            cur["corpus"] = m.group(3)
        if "FINDING" in line:
            cur["finding"] = True
    return rows


def sanitize_summary(path):
    text = open(path, errors="replace").read()
    out = {}
    m = re.search(r"sanitize: build (\d+) s, tests (\d+) s, (\d+) tests run, (\d+) failed, "
                  r"(\d+) not started, exit (\d+)", text)
    if m:
        out.update(build_s=int(m.group(1)), tests_s=int(m.group(2)), total=int(m.group(3)),
                   failed=int(m.group(4)), not_run=int(m.group(5)), exit=int(m.group(6)))
    out["failed_names"] = re.findall(r"^\s*\d+ - (\S+) \((?:Failed|SEGFAULT|Subprocess aborted|"
                                     r"Timeout|Child aborted)\)", text, re.M)
    return out


# ------------------------------------------------------------------------------------------------

def fmt_s(x):
    return "%.2f" % x if x == x else "-"


def fmt_mb(x):
    return "%.0f" % x if x == x else "-"


def git(*args):
    try:
        return subprocess.check_output(["git", "-C", ROOT] + list(args), text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return "%s, %d cores (%s)" % (cpu, os.cpu_count() or 0, platform.platform())


def md_cell(text):
    return text.replace("|", "\\|").replace("\n", " ")[:220]


def write_page(path, results, args, started, load, sanitized):
    lines = []
    add = lines.append
    add("# Reliability: hostile and careless input")
    add("")
    add("Generated by `scripts/attack.py` from what it observed running the cases below against the "
        "built binary; do not edit by hand. Re-run: `python3 scripts/attack.py` (after `scripts/build.sh`;"
        " `--only CLASS` for one class, `--fuzz-log` / `--sanitize-log` to summarise those runs).")
    add("")
    add("- commit `%s`%s, binary `%s`" % (git("rev-parse", "--short=12", "HEAD"),
                                         " (dirty tree)" if git("status", "--porcelain", "--", ".", ":!results/reliability.md") else "",
                                         os.path.relpath(args.kvbench, ROOT)))
    add("- machine: %s; load average when started %s (times are wall clock on a shared machine: "
        "upper bounds)" % (machine(), load))
    add("- run %s UTC" % started)
    add("")
    add("Each case passes when kvbench does what *expected* says. Time is the whole process's wall "
        "time, memory its peak resident set (MiB), rows what the results DB holds afterwards, read by "
        "another program.")
    classes = []
    for r in results:
        if r["cls"] not in classes:
            classes.append(r["cls"])
    total = sum(1 for r in results if r["ok"] is not None)
    passed = sum(1 for r in results if r["ok"])
    add("")
    add("**%d of %d cases behave as expected**%s." % (
        passed, total, "" if passed == total else " (FAIL rows below)"))
    for cls in classes:
        add("")
        add("## %s" % cls)
        add("")
        add("| case | expected | exit | time s | peak MiB | rows afterwards | outcome | what kvbench said |")
        add("|---|---|---:|---:|---:|---|---|---|")
        for r in results:
            if r["cls"] != cls:
                continue
            o = r["obs"]
            outcome = "skipped" if r["ok"] is None else ("pass" if r["ok"] else "**FAIL**")
            add("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                md_cell(r["name"]), md_cell(r["expect"]), o.code if o else "-",
                fmt_s(o.wall_s) if o else "-", fmt_mb(o.peak_mb) if o else "-", md_cell(r["rows"]),
                outcome, "`%s`" % md_cell(r["note"]).replace("`", "'") if r["note"] else ""))
    add("")
    add("## The same cases against an ASan + UBSan build")
    add("")
    if sanitized:
        res, reports = sanitized
        add("Every case again against `%s` (KVB_SANITIZE=ON, `scripts/sanitize.sh`), with "
            "LeakSanitizer on and `halt_on_error`; a case's memory bound is %dx the release binary's "
            "(AddressSanitizer's typical overhead: shadow memory, redzones, the free quarantine):"
            % (os.path.relpath(args.sanitized_kvbench, ROOT), ASAN_MEMORY_FACTOR))
        add("")
        add("| class | cases | behave as expected | sanitizer reports |")
        add("|---|---:|---:|---:|")
        for cls in classes:
            rs = [r for r in res if r["cls"] == cls and r["ok"] is not None]
            add("| %s | %d | %d | - |" % (cls, len(rs), sum(1 for r in rs if r["ok"])))
        add("| **all** | %d | %d | %d |" % (sum(1 for r in res if r["ok"] is not None),
                                           sum(1 for r in res if r["ok"]), len(reports)))
        for r in res:
            if r["ok"] is False:
                add("")
                add("- %s / %s: `%s`" % (r["cls"], r["name"], md_cell(r["note"]).replace("`", "'")))
        for line in reports[:10]:
            add("")
            add("- report: `%s`" % md_cell(line).replace("`", "'"))
    else:
        add("Not run (`--sanitized-kvbench build-sanitize/kvbench` after `scripts/sanitize.sh`).")
    add("")
    add("## Fuzzing")
    add("")
    if args.fuzz_log and os.path.exists(args.fuzz_log):
        rows = fuzz_summary(args.fuzz_log)
        add("From `%s` (`scripts/fuzz.sh`: libFuzzer, ASan + UBSan; the corpus grows in "
            "`~/.cache/kvbench/fuzz-corpus/<fuzzer>`):" % os.path.basename(args.fuzz_log))
        add("")
        add("| fuzzer | seconds | executions | features | corpus | finding |")
        add("|---|---:|---:|---:|---:|---|")
        for f in rows:
            add("| %s | %d | %s | %s | %s | %s |" % (f["name"], f["seconds"], f["execs"] or "-",
                                                   f["cov"] or "-", f["corpus"] or "-",
                                                   "**yes**" if f["finding"] else "none"))
    else:
        add("No fuzz log given (`scripts/fuzz.sh SECONDS 2>&1 | tee fuzz.log`, then "
            "`--fuzz-log fuzz.log`).")
    add("")
    add("## Sanitizers over the whole suite")
    add("")
    if args.sanitize_log and os.path.exists(args.sanitize_log):
        s = sanitize_summary(args.sanitize_log)
        add("From `%s` (`scripts/sanitize.sh`: every target built with ASan + UBSan, the ctest suite "
            "without the fuzz label):" % os.path.basename(args.sanitize_log))
        add("")
        add("| build s | tests s | tests run | failed | not started (budget) | exit |")
        add("|---:|---:|---:|---:|---:|---:|")
        add("| %s | %s | %s | %s | %s | %s |" % (s.get("build_s", "-"), s.get("tests_s", "-"),
                                                s.get("total", "-"), s.get("failed", "-"),
                                                s.get("not_run", "-"), s.get("exit", "-")))
        if s.get("failed_names"):
            add("")
            add("Failed: " + ", ".join("`%s`" % n for n in s["failed_names"]))
    else:
        add("No sanitizer log given (`scripts/sanitize.sh 2>&1 | tee sanitize.log`, then "
            "`--sanitize-log sanitize.log`).")
    add("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def run_cases(kvbench, only, keep, sanitized=False):
    """Every case against `kvbench`; returns (results, sanitizer report lines)."""
    work = tempfile.mkdtemp(prefix="kvb-attack-")
    ctx = Ctx(kvbench, work, sanitized)
    results = []
    for cls, name, expect, fn in CASES:
        if only and not any(o in cls for o in only.split(",")):
            continue
        try:
            obs, rows, ok, note = fn(ctx)
        except Exception as e:  # the harness itself failed: report it as a failed case
            obs, rows, ok, note = None, "-", False, "attack.py: %s: %s" % (type(e).__name__, e)
        results.append(dict(cls=cls, name=name, expect=expect, obs=obs, rows=rows, ok=ok, note=note))
        print("%-6s %-40s %-60s %s" % ("skip" if ok is None else "pass" if ok else "FAIL", cls[:40],
                                      name[:60], note[:160]), flush=True)
    reports = sanitizer_reports(ctx)
    if keep:
        print("attack.py: scratch kept in %s" % work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return results, reports


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvbench", default=os.path.join(ROOT, "build", "kvbench"))
    ap.add_argument("--sanitized-kvbench",
                    help="also run every case against this ASan + UBSan build of kvbench "
                         "(build-sanitize/kvbench from scripts/sanitize.sh) and report its findings")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "reliability.md"))
    ap.add_argument("--only", help="run only the cases of these classes (comma-separated substrings); "
                    "writes no page")
    ap.add_argument("--fuzz-log")
    ap.add_argument("--sanitize-log")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    for b in [args.kvbench] + ([args.sanitized_kvbench] if args.sanitized_kvbench else []):
        if not os.access(b, os.X_OK):
            sys.exit("attack.py: no kvbench binary at %s (scripts/build.sh)" % b)
    load = "%.2f" % os.getloadavg()[0]
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    results, _ = run_cases(args.kvbench, args.only, args.keep)
    sanitized = None
    if args.sanitized_kvbench:
        supp = os.path.join(ROOT, "tests", "sanitize")
        os.environ.update(
            ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:suppressions=%s/asan.supp" % supp,
            LSAN_OPTIONS="suppressions=%s/lsan.supp:print_suppressions=0" % supp,
            UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=%s/ubsan.supp" % supp)
        print("attack.py: the same cases against %s" % args.sanitized_kvbench, flush=True)
        sanitized = run_cases(args.sanitized_kvbench, args.only, args.keep, sanitized=True)
    if not args.only:
        write_page(args.out, results, args, started, load, sanitized)
        print("attack.py: wrote %s" % args.out)
    ok = all(r["ok"] is not False for r in results)
    if sanitized:
        ok = ok and not sanitized[1] and all(r["ok"] is not False for r in sanitized[0])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
