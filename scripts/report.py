#!/usr/bin/env python3
"""Writes the results pages (results/*.md) from the results database and the page sources.

    scripts/report.py [--db results/main.sqlite] [--kvbench build/kvbench] [PAGE ...]

Each page source `scripts/pages/NAME.md` is Markdown with directives that are filled in from the runs
in the database, so every figure on a page is the figure the database holds, and the page names the
commit, machine and command that produced it:

  {{leaderboard grid=G [protocol=P] [dataset=D] [model=M] [metric=X]}}   (alone on a line)
      `kvbench leaderboard` over those runs, its headings moved one level down.
  {{v grid=G metric=NAME [fmt=F] [selectors]}}                            (inline)
      One metric of the one finished run that the selectors pick. Selectors match the run's resolved
      config: method=NAME, protocol=NAME, model=NAME, dataset=LABEL, m.PARAM=V (method parameter),
      p.KEY=V (protocol field). fmt: .4f (default .4g), int, pct, x (2.09x), sec (ms shown in s), TB, frac (hits/n, for an
      accuracy over n samples), bytes (KiB/MiB). No run or more than one is an error naming the page.
  {{table cols=C1,C2,... [heads=H1|H2|...] [sort=COL] [desc=1] [selectors]}}    (alone on a line)
      A Markdown table, one row per matching finished run. A column is `label` (method and the
      parameters that vary among the selected runs of that method), `m.PARAM` / `p.KEY` (a config
      value), or a metric name, optionally with `:FMT` (as for v).
  {{pivot by=m.PARAM metric=NAME [fmt=F] [head=H] [selectors]}}           (alone on a line)
      A Markdown table of one metric: a row per method (label without PARAM), a column per value
      of PARAM (descending), "-" where a method has no run at that value; runs without PARAM (the
      full cache) show their value in every column.
  {{set k=v ...}}   defaults for every later directive of the page (e.g. grid=, model=)
  {{row k=v ...}}   defaults for the rest of its line (a table row's run)
  {{provenance grid=G[,G...]}}                                            (inline)
      How many runs, which commit(s) (and whether the tree was dirty), CPU, threads, device, dtype,
      when, and the summed run time.

A page whose runs are missing is not written (the error names the page and the directive), unless
--partial, which writes "n/a" in their place and lists them. Standard library only.
"""
import argparse
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = os.path.join(ROOT, "scripts", "pages")
DIRECTIVE = re.compile(r"\{\{(\w+)((?:\s+[\w.]+=(?:\"[^\"]*\"|[^\s}]+))*)\s*\}\}")


class PageError(Exception):
    pass


def parse_args(text):
    out = {}
    for tok in shlex.split(text):
        k, _, v = tok.partition("=")
        out[k] = v
    return out


def flatten(cfg):
    """The selector view of a resolved run config."""
    flat = {"method": cfg["method"]["name"], "protocol": cfg["protocol"]["name"], "model": cfg["model"]}
    for k, v in cfg["method"].get("params", {}).items():
        flat["m." + k] = v
    for k, v in cfg["protocol"].items():
        if k != "name":
            flat["p." + k] = v
    for k in ("device", "dtype", "seed", "threads", "label"):
        if k in cfg:
            flat[k] = cfg[k]
    return flat


def same(value, wanted):
    if isinstance(value, bool):
        return str(value).lower() == wanted.lower()
    if isinstance(value, (int, float)):
        try:
            return float(wanted) == float(value)
        except ValueError:
            return False
    return str(value) == wanted


class Db:
    def __init__(self, path, kvbench):
        if not os.path.isfile(path):
            raise PageError(f"{path}: no such results database (run the grids first)")
        self.path = path
        self.kvbench = kvbench
        self.grid_cells = {}
        self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self.runs = []
        for rid, chash, grid, dataset, cfg, prov, wall in self.con.execute(
                "SELECT id, config_hash, grid, dataset, config_json, provenance_json, wall_s FROM runs "
                "WHERE status = 'done'"):
            c = json.loads(cfg)
            f = flatten(c)
            f["dataset"] = dataset
            self.runs.append({"id": rid, "hash": chash, "grid": grid, "flat": f, "prov": json.loads(prov), "wall": wall or 0.0})

    def cells(self, grid):
        """The config hashes of a grid's cells as this kvbench resolves configs/grids/GRID.json: a run
        belongs to a grid when its config is one of the grid's cells, whichever grid ran it first (a
        cell two grids share runs once)."""
        if grid not in self.grid_cells:
            cfg = os.path.join(ROOT, "configs", "grids", grid + ".json")
            if not os.path.isfile(cfg):
                raise PageError(f"grid {grid}: no {os.path.relpath(cfg, ROOT)}")
            r = subprocess.run([self.kvbench, "grid", "-c", cfg, "--db", self.path, "--dry-run", "--json"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise PageError(f"grid {grid}: {r.stderr.strip()}")
            self.grid_cells[grid] = {c["config_hash"] for c in json.loads(r.stdout)["cells"]}
        return self.grid_cells[grid]

    def select(self, args):
        grids = [g for g in args.get("grid", "").split(",") if g]
        cells = set().union(*(self.cells(g) for g in grids)) if grids else None
        sel = {k: v for k, v in args.items() if k not in ("grid", "metric", "fmt")}
        hits = [r for r in self.runs if (cells is None or r["hash"] in cells)
                and all(k in r["flat"] and same(r["flat"][k], v) for k, v in sel.items())]
        return hits

    def metric(self, run_id, name):
        row = self.con.execute("SELECT value, n FROM metrics WHERE run_id = ? AND name = ? AND layer IS NULL "
                               "AND head IS NULL", (run_id, name)).fetchone()
        return row


def fmt_value(value, n, fmt):
    if value is None:
        return "n/a"
    if fmt in ("", None):
        return f"{value:.4g}"
    if fmt == "int":
        return f"{round(value):,}"
    if fmt == "pct":
        return f"{100 * value:.1f}%"
    if fmt == "sec":  # a milliseconds metric shown in seconds
        return f"{value / 1000:.2f}"
    if fmt == "TB":
        return f"{value / 1e12:.2f}"
    if fmt == "x":
        return f"{value:.2f}x"
    if fmt == "frac":
        if not n:
            raise PageError("fmt=frac needs a metric with a sample count")
        return f"{round(value * n)}/{n}"
    if fmt == "bytes":
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= scale:
                return f"{value / scale:.1f} {unit}"
        return f"{value:.0f} B"
    return format(value, fmt)


def provenance(db, args):
    runs = db.select({"grid": args.get("grid", "")})
    if not runs:
        raise PageError(f"no finished run of grid {args.get('grid')} in {db.path}")
    grids = [g for g in args.get("grid", "").split(",") if g]
    expected = len(set().union(*(db.cells(g) for g in grids))) if grids else len(runs)
    by_commit = {}
    for r in runs:
        key = r["prov"].get("git_commit", "?")[:10] + (" with uncommitted changes" if r["prov"].get("git_dirty") else "")
        by_commit[key] = by_commit.get(key, 0) + 1
    commits = [k if len(by_commit) == 1 else f"{k} ({n})" for k, n in sorted(by_commit.items())]
    cpus = sorted({r["prov"].get("cpu_model", "?") for r in runs})
    # threads 0 in a config is the machine's default; the provenance says how many that was.
    threads = sorted({str(r["flat"].get("threads") or r["prov"].get("threads", "?")) for r in runs})
    devices = sorted({f"{r['flat'].get('device', '?')} {r['flat'].get('dtype', '?')}" for r in runs})
    when = sorted(r["prov"].get("collected_at", "")[:10] for r in runs)
    wall = sum(r["wall"] for r in runs)
    span = when[0] if when[0] == when[-1] else f"{when[0]} to {when[-1]}"
    count = f"{len(runs)} runs" if expected == len(runs) else f"{len(runs)} of the {expected} cells"
    return (f"{count} at commit {', '.join(commits)}; {', '.join(cpus)}, {', '.join(devices)}, "
            f"threads {'/'.join(threads)}; collected {span}; {wall:,.0f} s of runs")


def run_label(run, runs):
    """Method name plus the parameters that vary among the selected runs of the same method."""
    m = run["flat"]["method"]
    same_method = [r["flat"] for r in runs if r["flat"]["method"] == m]
    keys = sorted({k for f in same_method for k in f if k.startswith("m.")})
    varying = [k for k in keys if len({json.dumps(f.get(k)) for f in same_method}) > 1]
    if not varying:
        return m
    return m + "(" + ", ".join(f"{k[2:]}={run['flat'].get(k)}" for k in varying) + ")"


def table(db, args):
    cols = [c for c in args.get("cols", "").split(",") if c]
    if not cols:
        raise PageError("{{table}} needs cols=")
    heads = args["heads"].split("|") if "heads" in args else [c.split(":")[0] for c in cols]
    if len(heads) != len(cols):
        raise PageError(f"{len(heads)} heads for {len(cols)} cols")
    sel = {k: v for k, v in args.items() if k not in ("cols", "heads", "sort", "desc", "fmt")}
    runs = db.select(sel)
    if not runs:
        raise PageError("no finished run matches")

    def cell(run, col):
        name, _, fmt = col.partition(":")
        if name == "label":
            return run_label(run, runs), None
        if name.startswith(("m.", "p.")) or name in ("method", "protocol", "model", "dataset"):
            v = run["flat"].get(name)
            return ("" if v is None else str(v)), v
        found = db.metric(run["id"], name)
        if found is None:
            return "n/a", None
        return fmt_value(found[0], found[1], fmt), found[0]

    rows = [[cell(r, c) for c in cols] for r in runs]
    if "sort" in args:
        i = [c.split(":")[0] for c in cols].index(args["sort"])
        rows.sort(key=lambda row: (row[i][1] is None, row[i][1] if isinstance(row[i][1], (int, float)) else str(row[i][1])),
                  reverse=args.get("desc") == "1")
    right = ["--:" if any(isinstance(r[i][1], (int, float)) for r in rows) else "---" for i in range(len(cols))]
    out = ["| " + " | ".join(heads) + " |", "|" + "|".join(right) + "|"]
    out += ["| " + " | ".join(c[0] for c in row) + " |" for row in rows]
    return "\n".join(out)


def pivot(db, args):
    by, metric = args.get("by", ""), args.get("metric", "")
    if not by.startswith(("m.", "p.")) or not metric:
        raise PageError("{{pivot}} needs by=m.PARAM (or p.KEY) and metric=")
    sel = {k: v for k, v in args.items() if k not in ("by", "metric", "fmt", "head")}
    runs = db.select(sel)
    if not runs:
        raise PageError("no finished run matches")
    values = sorted({r["flat"][by] for r in runs if r["flat"].get(by) is not None}, reverse=True)
    cells, order = {}, []
    for r in runs:
        stripped = dict(r, flat={k: v for k, v in r["flat"].items() if k != by})
        label = run_label(stripped, [dict(x, flat={k: v for k, v in x["flat"].items() if k != by}) for x in runs])
        if label not in cells:
            cells[label] = {}
            order.append(label)
        found = db.metric(r["id"], metric)
        text = "n/a" if found is None else fmt_value(found[0], found[1], args.get("fmt"))
        for v in ([r["flat"][by]] if r["flat"].get(by) is not None else values):
            cells[label][v] = text
    head = args.get("head", by[2:])
    out = ["| method | " + " | ".join(f"{head} {v}" for v in values) + " |",
           "|---|" + "|".join("--:" for _ in values) + "|"]
    out += ["| " + label + " | " + " | ".join(cells[label].get(v, "-") for v in values) + " |" for label in order]
    return "\n".join(out)


def leaderboard(db, args, kvbench):
    """`kvbench leaderboard` over the grid's cells: a copy of the database holding only them (a
    cell another grid ran first is still this grid's), so the full-cache baseline a table pairs with
    is the grid's own."""
    import tempfile
    grids = [g for g in args.get("grid", "").split(",") if g]
    with tempfile.TemporaryDirectory() as tmp:
        path = db.path
        if grids:
            keep = set().union(*(db.cells(g) for g in grids))
            path = os.path.join(tmp, "cells.sqlite")
            dst = sqlite3.connect(path)
            db.con.backup(dst)
            dst.execute("PRAGMA foreign_keys = ON")
            dst.execute("CREATE TEMP TABLE keep (h TEXT PRIMARY KEY)")
            dst.executemany("INSERT INTO keep VALUES (?)", [(h,) for h in keep])
            dst.execute("DELETE FROM runs WHERE config_hash NOT IN (SELECT h FROM keep)")
            dst.commit()
            dst.close()
        cmd = [kvbench, "leaderboard", "--db", path]
        for k in ("protocol", "dataset", "model", "metric"):
            if k in args:
                cmd += [f"--{k}", args[k]]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise PageError(f"kvbench leaderboard: {r.stderr.strip()}")
    lines = []
    for line in r.stdout.splitlines():
        if line.startswith("## kvbench leaderboard"):
            continue
        lines.append("#" + line if line.startswith("#") else line)
    return "\n".join(lines).strip()


def render(name, db, kvbench, partial, missing):
    src = os.path.join(PAGES, name + ".md")
    with open(src, encoding="utf-8") as f:
        text = f.read()

    defaults = {}  # {{set ...}}: for the rest of the page
    row = {}       # {{row ...}}: for the rest of the line

    def expand(m):
        kind, args = m.group(1), parse_args(m.group(2))
        if kind == "set":
            defaults.update(args)
            return ""
        if kind == "row":
            row.clear()
            row.update(args)
            return ""
        args = {**defaults, **row, **args}
        try:
            if kind == "leaderboard":
                return leaderboard(db, args, kvbench)
            if kind == "table":
                return table(db, args)
            if kind == "pivot":
                return pivot(db, args)
            if kind == "provenance":
                return provenance(db, args)
            if kind == "v":
                if "metric" not in args:
                    raise PageError("{{v}} needs metric=")
                hits = db.select(args)
                if len(hits) != 1:
                    sel = " ".join(f"{k}={v}" for k, v in args.items())
                    raise PageError(f"{len(hits)} finished runs match {sel} (want 1)")
                found = db.metric(hits[0]["id"], args["metric"])
                if found is None:
                    raise PageError(f"run {hits[0]['id']} has no metric {args['metric']}")
                return fmt_value(found[0], found[1], args.get("fmt"))
            raise PageError(f"unknown directive {kind}")
        except PageError as e:
            where = f"{os.path.relpath(src, ROOT)}: {m.group(0)}: {e}"
            if not partial:
                raise PageError(where)
            missing.append(where)
            return "n/a"

    lines = []
    for line in text.split("\n"):
        row.clear()
        out = DIRECTIVE.sub(expand, line)
        if out.strip() or not DIRECTIVE.search(line):  # a line of only set/row directives vanishes
            lines.append(out)
    body = "\n".join(lines)
    header = (f"<!-- Generated by scripts/report.py from scripts/pages/{name}.md and "
              f"{os.path.relpath(db.path, ROOT)}; edit the source, not this file. -->\n")
    return header + body


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="*", help="page names (default: every page in scripts/pages)")
    ap.add_argument("--db", default=os.path.join(ROOT, "results", "main.sqlite"))
    ap.add_argument("--kvbench", default=os.path.join(ROOT, os.environ.get("KVB_BUILD_DIR", "build"), "kvbench"))
    ap.add_argument("--partial", action="store_true", help="write pages with missing runs as n/a")
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    a = ap.parse_args()
    names = a.pages or sorted(p[:-3] for p in os.listdir(PAGES) if p.endswith(".md"))
    try:
        db = Db(a.db, a.kvbench)
    except PageError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    status = 0
    for name in names:
        missing = []
        try:
            page = render(name, db, a.kvbench, a.partial, missing)
        except (PageError, OSError) as e:
            print(f"report: {e}", file=sys.stderr)
            status = 1
            continue
        with open(os.path.join(a.out, name + ".md"), "w", encoding="utf-8") as f:
            f.write(page)
        print(f"results/{name}.md" + (f" ({len(missing)} figures n/a)" if missing else ""))
        for w in missing:
            print(f"  n/a: {w}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
