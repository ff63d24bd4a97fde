#!/usr/bin/env python3
"""Writes results/serve-codesign.md: the scheduling x memory co-design grid (serve_codesign) joined with
the accuracy of each method at its budget (serve_codesign_accuracy, the main grid's qa cells), both read
from the results database.

    scripts/codesign-report.py [--db results/main.sqlite] [--kvbench build/kvbench]

For every trace and load it ranks the (method, policy) pairs by the share of requests that met both
objectives, shows TTFT/TPOT, preemptions and compressions, and charges each pair the accuracy its
compression costs: expected accuracy = full - (full - method) x the share of output tokens generated from
compressed KV (1 when the method stores every request; less when the scheduler compresses only under
pressure). Capacity under SLO is the highest of the swept loads at which at least 90% of the requests
meet both objectives. Every figure comes from the database; the script only joins and ranks them.
Standard library only (it reuses scripts/report.py's database reader).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (scripts/report.py)

ROOT = report.ROOT
SLO_CAPACITY = 0.9

POLICIES = [  # (kv_policy, admission, prefix_blocks) -> name, in the table's order
    (("always", "prompt", "as_held"), "vLLM rule (method on every request)"),
    (("always", "predicted", "as_held"), "predicted admission"),
    (("on_pressure", "prompt", "as_held"), "compress instead of preempt"),
    (("on_pressure", "predicted", "as_held"), "compress + predicted admission"),
    (("on_pressure", "predicted", "compressed"), "compress + predicted + compressed prefix blocks"),
]


def policy_of(flat):
    key = (flat.get("p.kv_policy", "always"), flat.get("p.admission", "prompt"),
           flat.get("p.prefix_blocks", "as_held"))
    for k, name in POLICIES:
        if k == key:
            return POLICIES.index((k, name)), name
    return len(POLICIES), "/".join(key)


def method_key(flat):
    params = {k[2:]: v for k, v in flat.items() if k.startswith("m.")}
    return flat["method"], json.dumps(params, sort_keys=True)


def method_label(flat):
    m, params = method_key(flat)
    p = json.loads(params)
    if m == "kivi":
        return p.get("preset", "kivi")
    if "budget" in p:
        return f"{m} {p['budget']:g}"
    return m


def load_of(flat):
    if flat.get("p.trace") == "generated":
        return "generated", float(flat.get("p.gen_rate_per_s", 1.0)), f"{flat.get('p.gen_rate_per_s')} req/s"
    ts = float(flat.get("p.time_scale", 1.0))
    # time_scale stretches arrivals: the offered load is the trace's rate / time_scale.
    return flat.get("p.trace", "conversation"), 1.0 / ts, f"1/{ts:g} of the real rate" if ts != 1 else "the real rate"


def metric(db, run, name):
    row = db.metric(run["id"], name)
    return None if row is None else row[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.path.join(ROOT, "results", "main.sqlite"))
    ap.add_argument("--kvbench", default=os.path.join(ROOT, "build", "kvbench"))
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "serve-codesign.md"))
    a = ap.parse_args()
    db = report.Db(a.db, a.kvbench)
    serve = db.select({"grid": "serve_codesign"})
    acc_runs = db.select({"grid": "serve_codesign_accuracy"})
    if not serve or not acc_runs:
        sys.exit(f"codesign-report: no finished runs of serve_codesign / serve_codesign_accuracy in {a.db}")
    expected = len(db.cells("serve_codesign")) + len(db.cells("serve_codesign_accuracy"))
    if len(serve) + len(acc_runs) != expected:
        sys.exit(f"codesign-report: {len(serve) + len(acc_runs)} of the {expected} cells have run; run the grids first")

    # Accuracy per method: the qa cells' accuracy, pooled over their samples.
    acc = {}
    for r in acc_runs:
        row = db.metric(r["id"], "accuracy")
        if row is None:
            continue
        value, n = row[0], row[1] or 1
        s = acc.setdefault(method_key(r["flat"]), [0.0, 0])
        s[0] += value * n
        s[1] += n
    acc = {k: v[0] / v[1] for k, v in acc.items() if v[1]}
    full_key = ("full", "{}")
    if full_key not in acc:
        sys.exit("codesign-report: no full-cache accuracy in serve_codesign_accuracy")
    acc_full = acc[full_key]

    rows = []
    for r in serve:
        f = r["flat"]
        trace, load, load_label = load_of(f)
        pi, pname = policy_of(f)
        mk = method_key(f)
        frac = metric(db, r, "serve_compressed_token_fraction") or 0.0
        if mk == full_key:
            frac = 0.0  # the full cache compresses nothing
        acc_m = acc.get(mk)
        expected_acc = None if acc_m is None else acc_full - (acc_full - acc_m) * frac
        rows.append({
            "trace": trace, "load": load, "load_label": load_label, "policy": pname, "pi": pi,
            "method": method_label(f), "is_full": mk == full_key,
            "slo": metric(db, r, "serve_slo_attainment"), "ttft50": metric(db, r, "serve_ttft_ms_p50"),
            "ttft90": metric(db, r, "serve_ttft_ms_p90"), "tpot50": metric(db, r, "serve_tpot_ms_p50"),
            "pre": metric(db, r, "serve_preemptions"), "comp": metric(db, r, "serve_compressions") or 0,
            "frac": frac, "acc": expected_acc, "running": metric(db, r, "serve_mean_running"),
        })

    out = []
    out.append("# Scheduling x memory co-design: policies that know the method\n")
    out.append("<!-- Generated by scripts/codesign-report.py from the results database; do not edit. -->\n")
    out.append("```sh\n./build/kvbench grid -c configs/grids/serve_codesign_accuracy.json --db results/main.sqlite\n"
               "./build/kvbench grid -c configs/grids/serve_codesign.json          --db results/main.sqlite\n"
               "scripts/codesign-report.py\n```\n")
    out.append("Runs: " + report.provenance(db, {"grid": "serve_codesign,serve_codesign_accuracy"}) + ".\n")
    out.append(
        "The batch scheduler and the KV memory manager are tuned apart in every serving system; the serve\n"
        "protocol has both in one simulation, so joint policies can be measured. One simulated H200 serves\n"
        "Llama-3.1-8B (100 GiB of KV); each method's footprint is measured on kvb-testbed and scaled. The\n"
        "policies (serve protocol parameters, `harness/serve/serving_sim.h`):\n\n"
        "- **vLLM rule**: the method stores every request; admission when the whole prompt fits with a 1%\n"
        "  watermark; recompute preemption of the latest request when the pool runs out. With the full\n"
        "  cache this is vLLM itself, the baseline.\n"
        "- **predicted admission** (`admission: predicted`): admit only when every running request's and\n"
        "  the new one's predicted final footprint fits (prompt + the mean output of the requests finished\n"
        "  so far), at the compressed size where the policy can compress.\n"
        "- **compress instead of preempt** (`kv_policy: on_pressure`): requests start uncompressed; when a\n"
        "  running request cannot grow, the scheduler applies the method to the running request it frees\n"
        "  most bytes from (its KV read and rewritten in that iteration) before preempting anyone.\n"
        "- **compressed prefix blocks** (`prefix_blocks: compressed`): the prefix store holds blocks\n"
        "  compressed (more fit); a hit hands its request compressed KV.\n\n"
        "**Accuracy cost.** Each method's accuracy at its budget is read from the database: the main grid's\n"
        "qa cells (passkey and needle-in-a-book at 1,024 tokens, 5 depths; grid serve_codesign_accuracy).\n"
        "A pair's expected accuracy is full - (full - method) x the share of output tokens generated from\n"
        "compressed KV (`serve_compressed_token_fraction`: 1 under the vLLM rule with a method, less when\n"
        "the scheduler compresses only under pressure). A request compressed half-way is charged for the\n"
        "tokens after the compression only, which flatters the policy when the damage is done to the\n"
        "prompt; the share of requests ever compressed is in the tables too.\n")
    out.append("Accuracy on the qa cells: " + ", ".join(
        f"{'full' if k == full_key else k[0] + ('' if k[1] == '{}' else ' ' + ','.join(f'{x}={y}' for x, y in json.loads(k[1]).items()))}"
        f" {v:.3f}" for k, v in sorted(acc.items())) + ".\n")
    out.append("Times are simulated (a roofline); scheduling, admissions, preemptions, compressions and hits\n"
               "are exact accounting. SLO: TTFT <= 5 s and TPOT <= 100 ms.\n")

    winners = []
    for trace in sorted({r["trace"] for r in rows}):
        out.append(f"\n## {'Mooncake conversation trace (3,000 requests)' if trace == 'conversation' else 'The main grid' + chr(39) + 's generated workload (1,000 requests, 16 shared prefixes)'}\n")
        loads = sorted({(r["load"], r["load_label"]) for r in rows if r["trace"] == trace})
        for load, label in loads:
            sel = [r for r in rows if r["trace"] == trace and r["load"] == load]
            sel.sort(key=lambda r: (-(r["slo"] or 0), r["ttft90"] or 0))
            out.append(f"\n### {label}\n")
            out.append("| method | policy | SLO met | TTFT p50 (s) | TTFT p90 (s) | TPOT p50 (ms) | running | preemptions | compressions | compressed tokens | expected accuracy |")
            out.append("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
            for r in sel:
                acc_s = "n/a" if r["acc"] is None else f"{r['acc']:.3f}"
                out.append(f"| {r['method']} | {r['policy']} | {r['slo']:.3f} | {r['ttft50'] / 1e3:.2f} | {r['ttft90'] / 1e3:.2f} | "
                           f"{r['tpot50']:.1f} | {r['running']:.1f} | {r['pre']:,.0f} | {r['comp']:,.0f} | {r['frac']:.3f} | {acc_s} |")
            base = next((r for r in sel if r["is_full"] and r["pi"] == 0), None)
            best = sel[0]
            # The best pair that costs at most one accuracy point.
            near = [r for r in sel if r["acc"] is not None and r["acc"] >= acc_full - 0.01]
            best_near = near[0] if near else None
            winners.append((trace, label, base, best, best_near))

        out.append("\n**Capacity under SLO** (the highest swept load at which >= 90% of requests meet both objectives):\n")
        out.append("| method | policy | capacity |")
        out.append("|---|---|---|")
        pairs = sorted({(r["method"], r["pi"], r["policy"]) for r in rows if r["trace"] == trace})
        for m, pi, pname in pairs:
            ok = [(r["load"], r["load_label"]) for r in rows
                  if r["trace"] == trace and r["method"] == m and r["pi"] == pi and (r["slo"] or 0) >= SLO_CAPACITY]
            cap = max(ok)[1] if ok else "below the lowest swept load"
            out.append(f"| {m} | {pname} | {cap} |")

    out.append("\n## Which joint policy wins where\n")
    for trace, label, base, best, near in winners:
        b = f"vLLM with the full cache meets the SLO for {base['slo']:.1%}" if base else "no vLLM baseline"
        line = (f"- **{trace}, {label}**: {b}; the best pair is {best['method']} with *{best['policy']}* "
                f"({best['slo']:.1%}, TTFT p90 {best['ttft90'] / 1e3:.2f} s, expected accuracy "
                f"{'n/a' if best['acc'] is None else format(best['acc'], '.3f')})")
        if near and near is not best:
            line += (f"; within one accuracy point of the full cache, {near['method']} with *{near['policy']}* "
                     f"({near['slo']:.1%}, expected accuracy {near['acc']:.3f})")
        out.append(line + ".")
    out.append("")
    with open(a.out, "w") as fh:
        fh.write("\n".join(out))
    print(f"wrote {os.path.relpath(a.out, ROOT)}")


if __name__ == "__main__":
    main()
