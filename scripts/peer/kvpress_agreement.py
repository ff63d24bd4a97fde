#!/usr/bin/env python3
"""Compares what kvbench and kvpress keep and answer, pair by pair (scripts/peer/kvpress_pairs.py),
from the files scripts/peer-kvpress.sh wrote, and writes results/kvpress-agreement.md and the CI
fixtures (tests/fixtures/kvpress/<pair>.json). Standard library only (no torch).

Kept sets. For every prompt, layer and KV head, kvbench's kept token indices (`kvbench kept-indices`)
against kvpress's (scripts/peer/kvpress_kept.py). A differing set of an `equal` pair is classified
with kvpress's own scores s of that head (the entries kept by one side only, D):
  tie       every entry of D has the same score (exactly): only the tie-break differs. kvbench
            breaks ties toward the lower token index (top_k_slots), torch.topk on CPU by its own
            order (not documented)
  rounding  the scores of D lie within 1e-5 x max|s| of each other: the two implementations
            compute the score in a different float order (kvpress averages, kvbench sums), which
            can swap entries whose scores agree to the last bits
  real      anything else: a difference of definition, counted and shown
  documented  a `nested` pair's sets where one contains the other (their budget rules differ by
            definition), or a `channels` pair's zeroed key channels equal to those ThinKPress's rule
            zeroes with kvbench's GQA aggregation (computed by kvpress_kept.py on kvpress's tensors)

Fixtures: the short prompts' kvpress kept sets per pair, with kvbench's method + parameters, the
press and its parameters, versions, and every documented difference between the two sides (the
entries of a tie or rounding difference, exactly), so that tests/methods/test_kvpress_agreement.cpp
checks kvbench against them with no Python.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import kvpress_pairs  # noqa: E402

ROUNDING_REL = 1e-5


def load(path):
    with open(path) as f:
        return json.load(f)


def classify(kvp_set, kvb_set, scores):
    """'same', 'tie', 'rounding' or 'real' for one head (scores: kvpress's, or None)."""
    if kvp_set == kvb_set:
        return "same"
    if scores is None:
        return "real"
    d = sorted(kvp_set ^ kvb_set)
    vals = [scores[i] for i in d]
    if max(vals) == min(vals):
        return "tie"
    scale = max(abs(x) for x in scores) or 1.0
    if max(vals) - min(vals) <= ROUNDING_REL * scale:
        return "rounding"
    return "real"


def without_places(method):
    """A kvbench method ({"name", "params"}) without the parameters that only say where files live
    (a calibrated method's cache_dir / data_dir: the page and the fixtures do not depend on them)."""
    params = {k: v for k, v in method["params"].items() if k not in ("cache_dir", "data_dir")}
    return {**method, "params": params}


def compare_pair(pair, kvb, kvp):
    """Per-head verdicts and differences of one pair over the prompts of two kept-index files."""
    if len(kvb["prompts"]) != len(kvp["prompts"]):
        raise SystemExit(f"kvpress_agreement: {pair.name}: prompt counts differ")
    counts = {"same": 0, "tie": 0, "rounding": 0, "real": 0, "documented": 0, "heads": 0}
    diffs = []  # (prompt, layer, head, verdict, only_kvpress, only_kvbench, sizes)
    sizes = []  # (prompt, layer, [kvpress sizes], [kvbench sizes])
    for pi, (b, p) in enumerate(zip(kvb["prompts"], kvp["prompts"])):
        if b["n_tokens"] != p["n_tokens"]:
            raise SystemExit(f"kvpress_agreement: {pair.name}: prompt {pi} lengths differ")
        key = "zero_key_channels" if pair.relation == "channels" else "kept"
        for li, (bl, pl) in enumerate(zip(b[key], p[key])):
            sizes.append((pi, li, [len(x) for x in pl], [len(x) for x in bl]))
            for hi, (bh, ph) in enumerate(zip(bl, pl)):
                counts["heads"] += 1
                sb, sp = set(bh), set(ph)
                scores = None
                if pair.relation == "equal" and p.get("scores") and p["scores"][li] is not None:
                    scores = p["scores"][li][hi]
                v = classify(sp, sb, scores)
                if pair.relation == "nested" and v != "same":
                    v = "documented" if (sb <= sp or sp <= sb) else "real"
                if pair.relation == "channels" and v != "same" and "zero_key_channels_group_mean" in p:
                    v = "documented" if set(p["zero_key_channels_group_mean"][li][hi]) == sb else "real"
                counts[v] += 1
                if v != "same":
                    diffs.append((pi, li, hi, v, sorted(sp - sb), sorted(sb - sp)))
    return counts, diffs, sizes


def answers_agreement(path):
    r = load(path)
    s = r["samples"]
    same = sum(x["prediction"] == x["kvbench_prediction"] for x in s)
    return same, len(s), r


def short(idx, n=8):
    """A token-index list for the page: the first n, then how many in all."""
    return str(idx) if len(idx) <= n else f"[{', '.join(map(str, idx[:n]))}, ... ({len(idx)} in all)]"


def pct(a, n):
    return f"{100.0 * a / n:.1f}%" if n else "n/a"


def write_fixture(pair, ratio, model_name, prompts_ids, kvb, kvp, diffs, path):
    """The fixture of one pair: kvpress's kept sets on the short prompts and the documented
    differences (tie / rounding entries; a `real` one fails: it has no explanation)."""
    real = [d for d in diffs if d[3] == "real"]
    if real:
        # The page still gets written (it shows them); the missing fixture fails the C++ test.
        print(f"kvpress_agreement: {pair.name}: {len(real)} kept set(s) on the fixture prompts "
              "differ for no documented reason; no fixture written", file=sys.stderr)
        return False
    key = "zero_key_channels" if pair.relation == "channels" else "kept"
    out = {
        "model": model_name,
        "pair": pair.name,
        "relation": pair.relation,
        "note": pair.note,
        "compression_ratio": ratio,
        "kvbench_method": without_places(kvb["method"]),
        "press": kvp["press"],
        "press_params": kvp["press_params"],
        "attn_implementation": kvp["attn_implementation"],
        "versions": kvp["versions"],
        "prompts": [],
    }
    for pi, ids in enumerate(prompts_ids):
        entry = {"ids": ids, key: kvp["prompts"][pi][key]}
        if pair.relation == "channels":
            entry["zero_key_channels_group_mean"] = kvp["prompts"][pi]["zero_key_channels_group_mean"]
        if pair.relation == "equal":
            entry["differences"] = [
                {"layer": li, "head": hi, "why": v, "only_kvpress": a, "only_kvbench": b}
                for (p_, li, hi, v, a, b) in diffs if p_ == pi]
        out["prompts"].append(entry)
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    return True


def table_row(pair, ratio, press_text, counts, answers):
    n = counts["heads"]
    kept = f"{pct(counts['same'], n)} ({counts['same']}/{n})"
    ans = "—"
    if answers is not None:
        same, total, _ = answers
        ans = f"{pct(same, total)} ({same}/{total})" + ("" if pair.answers else " (may differ: schedule)")
    m = without_places(pair.kvbench(ratio))
    return (f"| {pair.name} | `{m['name']}` `{json.dumps(m['params'])}` | {press_text} | "
            f"{pair.relation} | {kept} | {counts['tie']} | {counts['rounding']} | {counts['documented']} | "
            f"{counts['real']} | {ans} |")


def press_text(kvp):
    def fmt(v):
        if isinstance(v, dict):
            inner = ", ".join(f"{k}={fmt(x)}" for k, x in v.items() if k != "press")
            return f"{v['press']}({inner})"
        return repr(v)
    return f"`{kvp['press']}({', '.join(f'{k}={fmt(v)}' for k, v in kvp['press_params'].items())})`"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="the directory scripts/peer-kvpress.sh wrote into")
    ap.add_argument("--pairs", default="", help="comma-separated pair names (default: all)")
    ap.add_argument("--ratio", type=float, required=True, help="compression ratio of the qa samples")
    ap.add_argument("--fixture-ratio", type=float, required=True)
    ap.add_argument("--fixture-dir", help="write tests/fixtures/kvpress/<pair>.json here")
    ap.add_argument("--model-name", required=True, help="the model as the fixtures name it")
    ap.add_argument("--kvbench", required=True)
    ap.add_argument("--command", required=True, help="the command line shown on the page")
    ap.add_argument("--loadavg", required=True)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    pairs = kvpress_pairs.select(a.pairs)
    # Before any fixture is written: the checkout as the run found it.
    machine = common.machine_lines(a.kvbench, a.loadavg)
    W = a.work

    rows, notes, fix_rows, versions = [], [], [], None
    for pair in pairs:
        kvb = load(f"{W}/kvb-kept-{pair.name}.json")
        kvp = load(f"{W}/kvp-kept-{pair.name}.json")
        versions = kvp["versions"]
        counts, diffs, sizes = compare_pair(pair, kvb, kvp)
        qa = f"{W}/kvp-qa-{pair.name}.json"
        answers = answers_agreement(qa) if os.path.exists(qa) else None
        rows.append(table_row(pair, a.ratio, press_text(kvp), counts, answers))
        lines = [f"**{pair.name}.** {pair.note}"]
        if pair.relation == "nested":
            by_layer = {}
            for _, li, ps, bs in sizes:
                by_layer.setdefault(li, (set(), set()))
                by_layer[li][0].add(sum(ps))
                by_layer[li][1].add(sum(bs))
            lines.append("Kept entries per layer (summed over KV heads; the values seen over the "
                         "samples), kvpress / kvbench: " + "; ".join(
                             f"layer {li}: {sorted(v[0])} / {sorted(v[1])}" for li, v in sorted(by_layer.items())) + ".")
        for v in ("tie", "rounding", "real"):
            ex = [d for d in diffs if d[3] == v][:2]
            if ex:
                lines.append(f"{v.capitalize()} differences ({counts[v]} heads), e.g. " + "; ".join(
                    f"sample {p}, layer {l}, head {h}: only kvpress {short(a_)}, only kvbench {short(b_)}"
                    for (p, l, h, _, a_, b_) in ex) + ".")
        if answers is not None:
            same, total, r = answers
            diff = [x for x in r["samples"] if x["prediction"] != x["kvbench_prediction"]][:2]
            if diff:
                lines.append("Answers that differ, e.g. " + "; ".join(
                    f"sample {x['index']}: kvpress {x['prediction']!r}, kvbench {x['kvbench_prediction']!r}"
                    for x in diff) + ".")
        notes.append(" ".join(lines))

        # Fixture prompts (short, at the fixture ratio).
        fb = load(f"{W}/fix-kvb-kept-{pair.name}.json")
        fp = load(f"{W}/fix-kvp-kept-{pair.name}.json")
        fcounts, fdiffs, _ = compare_pair(pair, fb, fp)
        fix_rows.append(f"| {pair.name} | {fcounts['heads']} | {fcounts['same']} | {fcounts['tie']} | "
                        f"{fcounts['rounding']} | {fcounts['documented']} | {fcounts['real']} |")
        if a.fixture_dir:
            ids = load(f"{W}/fixture-ids.json")["prompts"]
            write_fixture(pair, a.fixture_ratio, a.model_name, ids, fb, fp, fdiffs,
                          os.path.join(a.fixture_dir, f"{pair.name}.json"))

    w_lines = []
    w = w_lines.append
    w("# kvbench vs kvpress: the same kept tokens, method by method")
    w("")
    w("Generated by `scripts/peer-kvpress.sh` (every number below comes from that run; the pairs are "
      "`scripts/peer/kvpress_pairs.py`, one line each).")
    w("")
    w(f"- Command: `{a.command}`")
    w_lines.extend(machine)
    w(f"- kvpress {versions['kvpress']}, transformers {versions['transformers']}, torch "
      f"{versions['torch']}, Python {versions['python']} (PyPI pins of the script, in a venv outside "
      "the clone); fp32, CPU")
    w("")
    w("## What is compared")
    w("")
    w(f"{a.samples} synthetic passkey samples of the qa protocol at 1,024 tokens on "
      f"`{a.model_name}`, the same token ids on both sides (kvbench's tokenizer, checked equal to "
      f"SentencePiece's). Compression ratio {a.ratio} (kvbench budget {1 - a.ratio:g}).")
    w("")
    w("- **Kept token indices** at the end of the context prefill, per layer and KV head: "
      "`kvbench kept-indices` (the eviction store's `kept_indices`) against the indices kvpress's "
      "press selected (`scripts/peer/kvpress_kept.py` wraps the press's `compress` and matches the "
      "returned key rows to the input rows; Ada-KV: the complement of `masked_key_indices`). "
      "A differing set is classified with kvpress's scores: **tie** (the entries kept by one side "
      "only all score exactly the same: only the tie-break differs; kvbench keeps the lower token "
      "index, `torch.topk` its own order), **rounding** (their scores agree within 1e-5 of the "
      "largest score: the same score computed in another float order), **documented difference** "
      "(a nested pair's sets where one contains the other, their budget rules differing by "
      "definition; ThinK: the channels kvpress's rule zeroes when a GQA group's window queries are "
      "averaged before squaring, recomputed from kvpress's tensors), **real** (anything else).")
    w("- **Answers**: greedy answers of the qa samples, kvbench `run` against "
      "`scripts/peer/kvpress_qa.py` (context prefilled inside `with press(model)`, then the "
      "question, then greedy decode with kvbench's stop rule).")
    w("")
    w("## Agreement")
    w("")
    w("| pair | kvbench params | kvpress press | relation | identical kept sets | tie only | "
      "rounding only | documented difference | really differ | answers identical |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    w_lines.extend(rows)
    w("")
    w("## Why they differ where they do")
    w("")
    for n in notes:
        w(f"- {n}")
    w("")
    if kvpress_pairs.NOT_PAIRED:
        w("## Methods both have that are not compared, and why")
        w("")
        for name, why in kvpress_pairs.NOT_PAIRED.items():
            w(f"- **{name}.** {why}")
        w("")
    w("## CI fixtures")
    w("")
    w(f"`tests/fixtures/kvpress/<pair>.json`: kvpress's kept sets on two short prompts (the first "
      f"256 and 301 tokens of the first two samples) at compression ratio {a.fixture_ratio}, with "
      "every tie or rounding difference recorded entry by entry; "
      "`tests/methods/test_kvpress_agreement.cpp` runs kvbench on the same ids and checks them "
      "exactly (equal pairs: kvpress's set with the recorded differences applied; nested pairs: "
      "one set inside the other and each side's per-layer sizes by its own rule; channels: the "
      "channels recomputed with kvbench's GQA aggregation from kvpress's tensors).")
    w("")
    w("| pair | heads | identical | tie only | rounding only | documented difference | really differ |")
    w("|---|---|---|---|---|---|---|")
    w_lines.extend(fix_rows)
    with open(a.out, "w") as f:
        f.write("\n".join(w_lines) + "\n")


if __name__ == "__main__":
    main()
