#!/usr/bin/env python3
"""Checks that two results databases hold the same per-sample outputs (a refactor's regression check).

    scripts/same-outputs.py A.sqlite B.sqlite [--grid NAME] [--ignore-param METHOD.PARAM=VALUE ...]

Runs are paired by their resolved config (the same cell of the same grid). A change that appends a
parameter to a method changes its configs; --ignore-param drops that parameter where it has the given
(default) value before pairing, so the old run pairs with the new one (e.g. --ignore-param
snapkv.allocator=uniform). Each pair's
samples are compared key by key after dropping what legitimately differs between two runs of the same
code: wall-clock timings (throughput, latencies, seconds) and whether a baseline came from the on-disk
cache. Everything else (predictions, scores, NLL, KL, bytes, tokens held, counters) must be equal to the
bit. Exit 0: identical; 1: a difference (the first few are printed); 2: bad input.
Standard library only.
"""
import argparse
import json
import re
import sqlite3
import sys

# Keys that hold a timing or a cache-hit flag: they differ between two runs of identical code.
VOLATILE = re.compile(r"(tok_s|_ms|_ms_|ttft|tpot|timing|wall|seconds|_s$|_s_|baseline_from_cache|from_cache|elapsed)")


def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not VOLATILE.search(k)}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v


def first_diff(a, b, path=""):
    if type(a) is not type(b):
        return f"{path}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'B' if k not in a else 'A'}"
            d = first_diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def pair_key(config_json, ignored):
    c = json.loads(config_json)
    m = c.get("method", {})
    params = m.get("params", {})
    for (method, param), value in ignored.items():
        if m.get("name") == method and param in params and json.dumps(params[param]) == json.dumps(value):
            del params[param]
    return json.dumps(c, sort_keys=True)


def runs(db, grid, ignored):
    q = "SELECT id, config_json, method, protocol FROM runs WHERE status = 'done'"
    args = ()
    if grid:
        q += " AND grid = ?"
        args = (grid,)
    return {pair_key(c, ignored): (i, m, p) for i, c, m, p in db.execute(q, args)}


def parse_ignored(items):
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        method, _, param = key.partition(".")
        if not method or not param or not value:
            raise ValueError(f"--ignore-param {item!r}: want METHOD.PARAM=VALUE")
        try:
            out[(method, param)] = json.loads(value)
        except json.JSONDecodeError:
            out[(method, param)] = value
    return out


def samples(db, run_id):
    return {i: json.loads(o) for i, o in db.execute(
        "SELECT sample_index, output_json FROM samples WHERE run_id = ?", (run_id,))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--grid")
    ap.add_argument("--ignore-param", action="append", default=[], metavar="METHOD.PARAM=VALUE")
    args = ap.parse_args()
    try:
        ignored = parse_ignored(args.ignore_param)
        da = sqlite3.connect(f"file:{args.a}?mode=ro", uri=True)
        db = sqlite3.connect(f"file:{args.b}?mode=ro", uri=True)
        ra, rb = runs(da, args.grid, ignored), runs(db, args.grid, ignored)
    except (sqlite3.Error, ValueError) as e:
        print(f"same-outputs: {e}", file=sys.stderr)
        return 2
    shared = sorted(set(ra) & set(rb))
    diffs = []
    for h in sorted(set(ra) ^ set(rb)):
        side, (_, m, p) = ("A", ra[h]) if h in ra else ("B", rb[h])
        diffs.append(f"run ({m}, {p}) only in {side}: {h[:160]}")
    n_samples = 0
    for h in shared:
        (ia, m, p), (ib, _, _) = ra[h], rb[h]
        sa, sb = samples(da, ia), samples(db, ib)
        if set(sa) != set(sb):
            diffs.append(f"run {ia} / {ib} ({m}, {p}): sample sets differ")
            continue
        for i in sorted(sa):
            n_samples += 1
            d = first_diff(strip(sa[i]), strip(sb[i]))
            if d:
                diffs.append(f"run {ia} / {ib} ({m}, {p}) sample {i}{d}")
    print(f"{len(shared)} shared runs, {n_samples} samples compared, {len(diffs)} differences")
    for d in diffs[:20]:
        print("  " + d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
