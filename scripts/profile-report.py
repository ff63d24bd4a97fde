#!/usr/bin/env python3
"""Writes results/profile-<model>.md and .html from the profile runs in a results database.

    scripts/profile-report.py --db DB --model MODEL [--leaderboard LB.json ...] [--command CMD ...]
                              [--out results/profile-MODEL.md]

The runs are those of `kvbench profile` (protocol profile, method full) of MODEL (as the run configs
name it), one per dataset and context length. The page shows, per workload (dataset), the mean of
each measure over layers x KV heads at each length, a per-layer table, heatmaps layer x KV head and
recency curves by age (HTML: inline SVG, no script), and a VERDICT: temporal, content, speculative or
mixed locality, by the rule written on the page (DECISION_RULE below). With --leaderboard (the JSON
of `kvbench leaderboard --format json`), the verdict is checked against the family whose methods
actually rank best on that model and dataset. Standard library only.
"""
import argparse
import html
import json
import math
import os
import sqlite3
import sys

MEASURES = [
    ("recency_16", "mass on the last 16 tokens"),
    ("recency_64", "mass on the last 64 tokens"),
    ("recency_256", "mass on the last 256 tokens"),
    ("recency_1024", "mass on the last 1024 tokens"),
    ("sink_mass", "mass on the first 4 tokens"),
    ("entropy", "attention entropy (nats)"),
    ("entropy_norm", "entropy / log(n)"),
    ("support90", "tokens holding 90% of the mass"),
    ("support90_frac", "support90 / n"),
    ("topk_mass", "mass on the exact top-k rows"),
    ("temporal_capture", "sink + recent window of k rows, share of the top-k mass"),
    ("topk_jaccard", "Jaccard of consecutive steps' top-k"),
    ("speculative_capture", "previous step's top-k, share of the top-k mass"),
    ("reuse_distance", "steps since a top-k row was last in a top-k"),
    ("topk_fresh_share", "top-k rows in no earlier top-k"),
    ("cluster_recall", "top-k rows the clustered index scans"),
    ("content_capture", "top-k of the scanned rows, share of the top-k mass"),
    ("key_quant_err_4", "attention output rel. error, keys 4-bit"),
    ("key_quant_err_2", "attention output rel. error, keys 2-bit"),
    ("value_quant_err_4", "attention output rel. error, values 4-bit"),
    ("value_quant_err_2", "attention output rel. error, values 2-bit"),
]
HEATMAPS = ["temporal_capture", "speculative_capture", "content_capture", "sink_mass", "entropy_norm",
            "key_quant_err_2"]
PER_LAYER = ["recency_64", "sink_mass", "entropy_norm", "support90_frac", "temporal_capture",
             "speculative_capture", "content_capture", "key_quant_err_2", "value_quant_err_2"]
AGES = [16, 64, 256, 1024]

# The verdict, from the means over layers x KV heads at the longest context profiled. Each capture
# is the attention mass a family's read of top_k rows keeps, as a share of the exact top-k's mass.
CAPTURE_BAR = 0.90   # a family "covers" the workload when its capture reaches this
LEAD_MARGIN = 0.03   # ... and the runner-up trails it by more than this (else: mixed)
DIFFUSE_SUPPORT = 0.5  # a mixed workload this flat is marked diffuse
DECISION_RULE = f"""\
Let T = temporal_capture, C = content_capture, S = speculative_capture (means over layers x KV heads
at the longest context length profiled; each is the mass a family's read of top_k rows keeps, as a
share of the exact top-k's mass).
1. T >= {CAPTURE_BAR:.2f}: **temporal** (a static sink + recent window already keeps what the exact
   top-k would: the cheapest family, no index and no prefetch, wins; checked first for that reason).
2. Else let X be the larger of C and S. X >= {CAPTURE_BAR:.2f} and X - max(the other two) > {LEAD_MARGIN:.2f}:
   **content** (X = C) or **speculative** (X = S).
3. Otherwise **mixed**: no family's read covers the workload alone, or two are within {LEAD_MARGIN:.2f}.
   A mixed workload whose support90_frac >= {DIFFUSE_SUPPORT:.2f} (90% of the mass needs half the rows or more)
   is marked **diffuse**: no sparse read holds its mass, so selection of any family loses, and
   quantization (KIVI, KVTuner) is the compression that fits."""
FAMILIES = {
    "temporal": ["streaming_llm", "h2o", "ttkv"],
    "content": ["retroinfer", "quest", "snapkv"],
    "speculative": ["specache"],
}
FAVOURS = {
    "temporal": "StreamingLLM / H2O / TTKV",
    "content": "RetroInfer / Quest / SnapKV",
    "speculative": "SpeCache",
    "mixed": "no single family; a hybrid (recent window + retrieval)",
    "mixed (diffuse)": "no selection family; quantization (KIVI / KVTuner)",
}


def fail(msg):
    print(f"profile-report.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load_runs(db_path, model):
    if not os.path.isfile(db_path):
        fail(f"{db_path}: no such database")
    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        rows = con.execute(
            "SELECT id, dataset, config_json, provenance_json, wall_s FROM runs "
            "WHERE protocol = 'profile' AND model = ? AND status = 'done' ORDER BY id", (model,)).fetchall()
    except sqlite3.Error as e:
        fail(f"{db_path}: cannot read the runs: {e}")
    if not rows:
        fail(f"{db_path}: no finished profile run of model '{model}'")
    runs = []
    for rid, dataset, cfg, prov, wall in rows:
        cfg = json.loads(cfg)
        m = {}
        for name, layer, head, value in con.execute(
                "SELECT name, layer, head, value FROM metrics WHERE run_id = ?", (rid,)):
            m[(name, layer, head)] = value
        runs.append({"id": rid, "dataset": dataset, "protocol": cfg["protocol"],
                     "provenance": json.loads(prov), "wall_s": wall or 0.0, "metrics": m})
    return runs


def mean_of(run, name):
    return run["metrics"].get((name, None, None))


def grid_of(run, name):
    """{(layer, head): value} of one measure."""
    return {(l, h): v for (n, l, h), v in run["metrics"].items() if n == name and l is not None}


def fmt(v, name=""):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if name in ("support90",):
        return f"{v:.1f}"
    if name == "reuse_distance" or name == "entropy":
        return f"{v:.2f}"
    return f"{v:.3f}"


def verdict(run):
    v, tcs = verdict_of(*(mean_of(run, n) for n in ("temporal_capture", "content_capture", "speculative_capture")))
    support = mean_of(run, "support90_frac")
    if v == "mixed" and support is not None and support >= DIFFUSE_SUPPORT:
        v = "mixed (diffuse)"
    return v, tcs


def verdict_of(t, c, s):
    if None in (t, c, s):
        return "mixed", (t, c, s)
    if t >= CAPTURE_BAR:
        return "temporal", (t, c, s)
    best, other = ("content", c) if c >= s else ("speculative", s)
    runner_up = max(t, s if best == "content" else c)
    if other >= CAPTURE_BAR and other - runner_up > LEAD_MARGIN:
        return best, (t, c, s)
    return "mixed", (t, c, s)


def family_of(method):
    for fam, methods in FAMILIES.items():
        if method in methods:
            return fam
    return None


def leaderboard_check(lb_paths, model, dataset):
    """The best row per family in the leaderboard tables of (model, dataset); stacked codec rows
    (codec other than none) are left out: they measure the codec as much as the family."""
    for path in lb_paths:
        try:
            with open(path) as f:
                lb = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"{path}: not a leaderboard JSON: {e}")
        for t in lb.get("tables", []):
            if t.get("model") != model or t.get("dataset") != dataset:
                continue
            best = {}
            for r in t["rows"]:
                fam = family_of(r.get("method"))
                codec = (r.get("params") or {}).get("codec", "none")
                if fam is None or codec not in ("none", None) or r.get("value") is None:
                    continue
                lower = t["direction"] == "lower"
                if fam not in best or (r["value"] < best[fam]["value"] if lower else r["value"] > best[fam]["value"]):
                    best[fam] = r
            if best:
                return t, best
    return None, {}


def svg_heatmap(grid, title, vmax=None):
    if not grid:
        return ""
    layers = sorted({l for l, _ in grid})
    heads = sorted({h for _, h in grid})
    vals = [v for v in grid.values() if v is not None]
    lo, hi = 0.0, vmax if vmax is not None else max(max(vals), 1e-12)
    cw, ch, left, top = 28, 14, 54, 30
    w, h = max(left + cw * len(heads) + 70, 300), top + ch * len(layers) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">',
           f'<text x="{left}" y="12" font-size="11">{html.escape(title)}</text>']
    for i, l in enumerate(layers):
        out.append(f'<text x="{left - 4}" y="{top + ch * i + 10}" text-anchor="end">L{l}</text>')
        for j, hd in enumerate(heads):
            v = grid.get((l, hd))
            f = 0.0 if v is None else min(max((v - lo) / (hi - lo or 1), 0.0), 1.0)
            r, g, b = int(255 - 200 * f), int(255 - 150 * f), int(255 - 40 * f)
            tip = f"layer {l}, KV head {hd}: {fmt(v)}"
            out.append(f'<rect x="{left + cw * j}" y="{top + ch * i}" width="{cw - 1}" height="{ch - 1}" '
                       f'fill="rgb({r},{g},{b})"><title>{html.escape(tip)}</title></rect>')
    for j, hd in enumerate(heads):
        out.append(f'<text x="{left + cw * j + cw / 2}" y="{top - 4}" text-anchor="middle">h{hd}</text>')
    x = left + cw * len(heads) + 8
    out.append(f'<text x="{x}" y="{top + 10}">max {fmt(hi)}</text><text x="{x}" y="{top + 24}">min {fmt(lo)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def svg_recency(run, title):
    """Recency CDF by age, one line per layer (mean over KV heads) and the mean in black."""
    layers = sorted({l for (n, l, h) in run["metrics"] if n == "recency_16" and l is not None})
    if not layers:
        return ""
    window = run["protocol"]["window"]
    ages = [a for a in AGES if a < window] + [window]
    def val(name_age, layer):
        name = f"recency_{name_age}" if name_age in AGES else None
        if name is None:
            return 1.0
        g = grid_of(run, name)
        vs = [v for (l, h), v in g.items() if l == layer]
        return sum(vs) / len(vs) if vs else None
    w, h, left, top, pw, ph = 420, 240, 50, 24, 330, 170
    lx = lambda a: left + pw * (math.log(a) - math.log(ages[0])) / ((math.log(ages[-1]) - math.log(ages[0])) or 1)
    ly = lambda v: top + ph * (1 - v)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">',
           f'<text x="{left}" y="14" font-size="11">{html.escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<text x="{left - 4}" y="{ly(v) + 3}" text-anchor="end">{v:.2f}</text>')
    for a in ages:
        out.append(f'<text x="{lx(a)}" y="{top + ph + 12}" text-anchor="middle">{a}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 26}" text-anchor="middle">age (tokens, log scale); y: attention mass younger than age</text>')
    for i, l in enumerate(layers):
        pts = [(lx(a), ly(val(a, l))) for a in ages if val(a, l) is not None]
        hue = int(360 * i / max(len(layers), 1))
        out.append(f'<polyline fill="none" stroke="hsl({hue},60%,55%)" stroke-width="1" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + f'"><title>layer {l}</title></polyline>')
    mean_at = lambda a: mean_of(run, f"recency_{a}") if a in AGES else 1.0
    means = [(lx(a), ly(mean_at(a))) for a in ages if mean_at(a) is not None]
    out.append('<polyline fill="none" stroke="black" stroke-width="2" points="' +
               " ".join(f"{x:.1f},{y:.1f}" for x, y in means) + '"><title>mean</title></polyline>')
    out.append("</svg>")
    return "\n".join(out)


def md_table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "--:" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def build(args):
    runs = load_runs(args.db, args.model)
    by_ds = {}
    for r in runs:
        by_ds.setdefault(r["dataset"], []).append(r)
    for ds in by_ds:
        by_ds[ds].sort(key=lambda r: r["protocol"]["window"])
    prov = runs[-1]["provenance"]
    commits = sorted({r["provenance"].get("git_commit", "")[:10] + ("+dirty" if r["provenance"].get("git_dirty") else "") for r in runs})
    md, hb = [], []  # Markdown lines, HTML body parts
    src = f"scripts/profile-report.py from {args.db}"
    md.append(f"<!-- Generated by {src}; edit the script, not this file. -->")
    title = f"Attention workload profile: {args.model}"
    md.append(f"# {title}\n")
    intro = (f"`kvbench profile` measures the attention of {args.model} on the exact cache, per layer and KV head, over "
             f"the last decode_steps tokens of each window (teacher-forced), at each context length; a KV head's "
             f"distribution is the mean of its query heads' softmax distributions (what a KV-head-granular store keeps "
             f"or reads for the group). Definitions: harness/eval/profile.h; docs/DESIGN.md §8.")
    md.append(intro + "\n")
    if args.command:
        md.append("```\n" + "\n".join(args.command) + "\n```\n")
    p = runs[0]["protocol"]
    prov_line = (f"{len(runs)} runs at commit {', '.join(commits)}; {prov.get('cpu_model', '?')}, "
                 f"{prov.get('device_name', '?')}, threads {prov.get('threads', '?')}; collected "
                 f"{prov.get('collected_at', '?')[:10]}; {sum(r['wall_s'] for r in runs):.0f} s of runs. "
                 f"top_k={p['top_k']}, cluster_rows={p['cluster_rows']}, scan_share={p['scan_share']}, "
                 f"quant_group={p['quant_group']}.")
    if args.note:
        prov_line += " " + args.note
    md.append(prov_line + "\n")
    md.append("## Decision rule\n\n" + DECISION_RULE + "\n\nFamilies: temporal -> " + FAVOURS["temporal"] +
              "; content -> " + FAVOURS["content"] + "; speculative -> " + FAVOURS["speculative"] + ".\n")

    for ds, rs in by_ds.items():
        longest = rs[-1]
        v, (t, c, s) = verdict(longest)
        md.append(f"## {ds}\n")
        md.append(f"**VERDICT: {v} locality** at {longest['protocol']['window']} tokens "
                  f"(T = {fmt(t)}, C = {fmt(c)}, S = {fmt(s)}); favours {FAVOURS[v]}.\n")
        rows = []
        for r in rs:
            vv, (tt, cc, ss) = verdict(r)
            rows.append([str(r["protocol"]["window"]), fmt(tt), fmt(cc), fmt(ss), fmt(mean_of(r, "topk_jaccard")),
                         fmt(mean_of(r, "cluster_recall")), fmt(mean_of(r, "sink_mass")), vv])
        md.append(md_table(["tokens", "T temporal", "C content", "S speculative", "top-k Jaccard",
                            "cluster recall", "sink mass", "verdict at this length"], rows) + "\n")
        # The check against the leaderboard.
        if args.leaderboard:
            table, best = leaderboard_check(args.leaderboard, args.lb_model or args.model, ds)
            md.append("### Check against the leaderboard\n")
            if not best:
                md.append(f"No leaderboard table of {args.lb_model or args.model} on {ds} in "
                          f"{', '.join(args.leaderboard)}: nothing to check.\n")
            else:
                lower = table["direction"] == "lower"
                # The table's context (stream: window; qa: length) picks the profiled length to check.
                proto = (table.get("settings") or {}).get("protocol", {})
                ctx = proto.get("window") or proto.get("length") or longest["protocol"]["window"]
                checked = min(rs, key=lambda r: abs(r["protocol"]["window"] - ctx))
                v = verdict(checked)[0]
                order = sorted(best.items(), key=lambda kv: kv[1]["value"], reverse=not lower)
                winner = order[0][0]
                rows = [[fam, r["label"], f"{r['value']:.4g}", f"{r.get('bytes_per_token') or 0:.0f}"] for fam, r in order]
                md.append(f"{table['protocol']} ({table['settings_text']}), ranked by {table['metric']} "
                          f"({'lower' if lower else 'higher'} is better); the best row of each family (rows "
                          f"stacked with a codec left out):\n")
                md.append(md_table(["family", "best method", table["metric"], "bytes/token"], rows) + "\n")
                md.append(f"The table's context is {ctx} tokens: checked against the profile at "
                          f"{checked['protocol']['window']} tokens, whose verdict is **{v}**.\n")
                missing = [f for f in FAMILIES if f not in best]
                if v.startswith("mixed"):
                    agree = f"The profile names no single family; the leaderboard's best family is {winner}."
                elif v == winner:
                    agree = f"**Agrees**: the profile predicts {v} and {winner} ranks best."
                else:
                    agree = f"**Disagrees**: the profile predicts {v}, {winner} ranks best."
                if missing:
                    agree += f" Families without a run in that table: {', '.join(missing)}."
                # The order of the families the table has: by capture in the profile, by rank in the table.
                caps = dict(zip(("temporal", "content", "speculative"), verdict(checked)[1]))
                by_profile = sorted(best, key=lambda f: -(caps[f] or 0))
                by_table = [f for f, _ in order]
                agree += (f" Order of the families in the table: by the profile's captures "
                          f"{' > '.join(f'{f} ({fmt(caps[f])})' for f in by_profile)}; by the table "
                          f"{' > '.join(by_table)}: {'the same' if by_profile == by_table else 'different'}.")
                md.append(agree + "\n")
        if args.why:
            md.append(args.why + "\n")
        # Means per length.
        md.append("### Means over layers x KV heads\n")
        rows = [[n, doc] + [fmt(mean_of(r, n), n) for r in rs] for n, doc in MEASURES]
        md.append(md_table(["measure", "what"] + [f"{r['protocol']['window']} tok" for r in rs], rows) + "\n")
        md.append(f"### Per layer at {longest['protocol']['window']} tokens (mean over KV heads)\n")
        layers = sorted({l for (n, l, h) in longest["metrics"] if l is not None})
        rows = []
        layer_verdicts = {}
        for l in layers:
            row, means = [str(l)], {}
            for n in PER_LAYER:
                vs = [v for (ll, h), v in grid_of(longest, n).items() if ll == l and v is not None]
                means[n] = sum(vs) / len(vs) if vs else None
                row.append(fmt(means[n], n))
            lv = verdict_of(means["temporal_capture"], means["content_capture"], means["speculative_capture"])[0]
            layer_verdicts.setdefault(lv, []).append(l)
            rows.append(row + [lv])
        md.append(md_table(["layer"] + PER_LAYER + ["verdict (rules 1-3)"], rows) + "\n")
        md.append("By layer: " + "; ".join(f"{v}: layer{'s' if len(ls) > 1 else ''} {', '.join(map(str, ls))}" for v, ls in sorted(layer_verdicts.items())) + ".\n")
        md.append("Heatmaps (layer x KV head) and recency curves by age: the HTML page beside this one.\n")
        hb.append((ds, rs))
    return md, hb


def markdown_to_html(md_lines):
    """A small converter for the page's own Markdown: headings, tables, code, paragraphs, **bold**."""
    out, in_table, in_code = [], False, False
    def inline(s):
        s = html.escape(s)
        parts = s.split("**")
        s = "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))
        parts = s.split("`")
        return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    for block in md_lines:
        for line in block.split("\n"):
            if line.startswith("<!--"):
                out.append(line)
                continue
            if line.startswith("```"):
                out.append("</pre>" if in_code else "<pre>")
                in_code = not in_code
                continue
            if in_code:
                out.append(html.escape(line))
                continue
            if line.startswith("|"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                if all(set(c) <= set("-:") for c in cells):
                    continue
                if not in_table:
                    out.append("<table>")
                    in_table = True
                    out.append("<tr>" + "".join(f"<th>{inline(c)}</th>" for c in cells) + "</tr>")
                else:
                    out.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in cells) + "</tr>")
                continue
            if in_table:
                out.append("</table>")
                in_table = False
            if line.startswith("#"):
                level = len(line) - len(line.lstrip("#"))
                out.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
            elif line.strip():
                out.append(f"<p>{inline(line)}</p>")
    if in_table:
        out.append("</table>")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="results database holding the profile runs")
    ap.add_argument("--model", required=True, help="the model as the run configs name it")
    ap.add_argument("--lb-model", help="the model as the leaderboard names it (default: --model)")
    ap.add_argument("--leaderboard", action="append", default=[], help="kvbench leaderboard --format json output (repeatable)")
    ap.add_argument("--command", action="append", default=[], help="a command that produced the runs (shown)")
    ap.add_argument("--note", default="", help="a sentence added to the provenance line (machine load)")
    ap.add_argument("--why", default="", help="a paragraph after the check: why it agrees or not")
    ap.add_argument("--out", help="Markdown page (default results/profile-MODEL.md); .html beside it")
    args = ap.parse_args()
    safe = args.model.replace(":", "-").replace("/", "-")
    out = args.out or f"results/profile-{safe}.md"
    md, per_ds = build(args)
    body = markdown_to_html(md)
    figs = []
    for ds, rs in per_ds:
        figs.append(f"<h2>Figures: {html.escape(ds)}</h2>")
        for r in rs:
            n = r["protocol"]["window"]
            figs.append(f"<h3>{n} tokens</h3><div>")
            figs.append(svg_recency(r, f"recency CDF by age, {n} tokens (lines: layers; black: mean)"))
            for name in HEATMAPS:
                vmax = 1.0 if name not in ("key_quant_err_2",) else None
                figs.append(svg_heatmap(grid_of(r, name), f"{name}, {n} tokens", vmax))
            figs.append("</div>")
    page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(f"profile: {args.model}") +
            "</title><style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}svg{margin:4px}</style></head><body>\n"
            + body + "\n" + "\n".join(figs) + "\n</body></html>\n")
    for path, text in ((out, "\n".join(md)), (os.path.splitext(out)[0] + ".html", page)):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        os.replace(tmp, path)
    print(out)


if __name__ == "__main__":
    main()
