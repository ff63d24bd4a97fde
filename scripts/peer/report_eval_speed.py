#!/usr/bin/env python3
"""Writes results/eval-speed.md from what scripts/bench-vs-kvpress.sh measured (no hand-kept numbers)."""

import argparse
import datetime
import json
import sqlite3
import statistics

from common import cpu_peak_gflops, machine_lines


def iso(t):
    return datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)


def kvbench_side(db, run_id):
    """Per-sample kvbench rows: the method's own sample time (`timing.answer_s`; older binaries lack it,
    then the gap between consecutive stored samples, which also holds any paired full answers)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    started = con.execute("SELECT started_at FROM runs WHERE id=?", (run_id,)).fetchone()[0]
    rows = con.execute(
        "SELECT sample_index, output_json, created_at FROM samples WHERE run_id=? ORDER BY sample_index",
        (run_id,)).fetchall()
    metrics = dict(con.execute("SELECT name, value FROM metrics WHERE run_id=?", (run_id,)).fetchall())
    con.close()
    out, prev, exact = [], iso(started), True
    for index, j, created in rows:
        o = json.loads(j)
        t = o["timing"]
        s = t.get("answer_s", -1.0)
        if s < 0:
            exact = False
            s = (iso(created) - prev).total_seconds()
        prev = iso(created)
        out.append({"index": index, "sample_s": s, "full_answer_s": max(t.get("full_answer_s", 0.0), 0.0),
                    "prediction": o["items"][0]["prediction"],
                    "prefill_tokens": t.get("prefill_tokens", o.get("context_tokens", 0))})
    return out, exact, metrics


def accuracy(pred, answers):
    """RULER string_match_all, as kvbench scores the synthetic tasks: share of the answers found."""
    return sum(a.lower() in pred.lower() for a in answers) / len(answers)


def fmt_ms(s):
    return f"{1e3 * s:,.0f}"


def prefill_macs(cfg, n):
    """Multiply-adds of an n-token causal prefill of a Llama-architecture config (last row's logits only)."""
    d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    H, Hk = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or d // H
    F, V = cfg["intermediate_size"], cfg["vocab_size"]
    per_token = L * (d * (H + 2 * Hk) * hd + H * hd * d + 3 * d * F)
    attention = L * H * hd * 2 * n * (n + 1) / 2  # q.k and p.v over the causal triangle
    return n * per_token + attention + d * V


def limit_section(w, config_path, full):  # full: the full-cache pair (kvbench and kvpress rows)
    """What bounds the full-cache run: its context prefill, as arithmetic against the cores' peak."""
    with open(config_path) as f:
        cfg = json.load(f)
    m = full["metrics"]
    if "ttft_ms" not in m or "sample_ms" not in m:
        return
    n = statistics.fmean(r["prefill_tokens"] for r in full["kvb"])
    gflop = 2 * prefill_macs(cfg, n) * 1e-9
    rate = gflop / (m["ttft_ms"] * 1e-3)
    peak, mhz = cpu_peak_gflops()
    w("")
    w("## What limits it")
    w("")
    w(f"In the full-cache run the context and question prefill (`ttft_ms` {m['ttft_ms']:,.1f} ms) is "
      f"{100 * m['ttft_ms'] / m['sample_ms']:.0f}% of kvbench's {m['sample_ms']:,.1f} ms per sample. That "
      f"prefill is {gflop:.2f} GFLOP for {n:,.0f} tokens (matmuls and the causal attention of this config), "
      f"so it runs at {rate:,.0f} GFLOP/s"
      + (f", {100 * rate / peak:.0f}% of the cores' AVX2 FMA peak ({peak:,.0f} GFLOP/s: "
         f"{mhz:,.0f} MHz, the clock /proc/cpuinfo reports, x 32 flops per cycle per core)" if peak > 0 else "")
      + ".")
    kp_ms = 1e3 * statistics.fmean(r["sample_s"] for r in full["kvp"]["samples"])
    rest = m["sample_ms"] - m["ttft_ms"]
    budget = kp_ms / 2 - rest
    if budget > 0:
        need = gflop / (budget * 1e-3)
        w("")
        w(f"kvpress takes {kp_ms:,.1f} ms per sample over the same prefill, so a 2x lead leaves "
          f"{budget:,.1f} ms for it (the rest of kvbench's sample takes {rest:,.1f} ms): {need:,.0f} GFLOP/s"
          + (f", {100 * need / peak:.0f}% of that peak" if peak > 0 else "") + ".")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--label", action="append", required=True, help="method label, one per pair")
    ap.add_argument("--kvb-run", type=int, action="append", required=True)
    ap.add_argument("--kvb-wall", type=float, action="append", required=True)
    ap.add_argument("--kvp-json", action="append", required=True)
    ap.add_argument("--kvp-wall", type=float, action="append", required=True)
    ap.add_argument("--kvbench", required=True)
    ap.add_argument("--loadavg", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--model-name", default="kvb-testbed")
    ap.add_argument("--model-config", help="the model's config.json, for the prefill's arithmetic")
    ap.add_argument("--kvb-config", action="append", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    pairs = []
    for label, run, kwall, kjson, pwall, cfg in zip(a.label, a.kvb_run, a.kvb_wall, a.kvp_json, a.kvp_wall,
                                                   a.kvb_config):
        kvb, exact, metrics = kvbench_side(a.db, run)
        with open(kjson) as f:
            kvp = json.load(f)
        assert [r["index"] for r in kvb] == [r["index"] for r in kvp["samples"]]
        pairs.append({"label": label, "kvb": kvb, "exact": exact, "metrics": metrics, "kvb_wall": kwall,
                      "kvp": kvp, "kvp_wall": pwall, "config": cfg})
    versions = pairs[0]["kvp"]["versions"]

    L = []
    w = L.append
    w("# Eval speed: kvbench vs kvpress on the same qa samples")
    w("")
    w("Generated by `scripts/bench-vs-kvpress.sh`; every number below comes from that run.")
    w("")
    w("```")
    w(a.command)
    w("```")
    w("")
    w(f"kvbench runs the qa protocol (synthetic passkey, {a.samples} samples at 1,024 target tokens, "
      f"{a.model_name} fp32, greedy, {a.threads} threads) into a fresh results database; "
      "`scripts/peer/kvpress_qa.py` then answers the same samples with transformers + kvpress "
      "in the same process layout (one process per method):")
    w("")
    w("- **same ids**: [BOS] + SentencePiece(context prompt), then SentencePiece(question + answer "
      "prefix), checked equal to `kvbench tokenize`'s ids and to kvbench's stored context length for "
      "every sample before timing;")
    w("- **same computation**: the context is prefilled once (kvpress: `model.model(...)` inside "
      "`with press(model)`, as kvpress's pipeline does; the press compresses at the end of that "
      "prefill), the question is prefilled on top at the following absolute positions, and greedy "
      "decoding stops at EOS/BOS, after the task's `max_new_tokens`, or when the decoded text holds "
      "`\\n` (the prediction is cut there), kvbench's qa stop rule;")
    w("- **SnapKV on both sides**: kvbench `snapkv` with `budget` 0.25 and `preset` `kvpress` (window 64, "
      "avg-pool 5, mean over each GQA group) against kvpress `SnapKVPress(compression_ratio=0.75)` "
      "(window_size 64, kernel_size 5). Known differences: kvpress keeps `int(len * 0.25)` tokens per "
      "KV head, kvbench its own rounding of the same budget; kvbench prefills in 512-token chunks "
      "(the default `prefill_chunk`), kvpress in one call (same attention up to float rounding).")
    w("- **one computation per sample**: kvbench pairs every non-full answer with the full cache's "
      "answer and computes that pairing when its baseline cache lacks it. The per-sample time below "
      "is the method's own sample (`timing.answer_s`: context, question, answers); the paired "
      "full-cache answers are reported separately (`full_answer_ms`) and the whole-process time is "
      "given with and without them.")
    w("")
    w("Per-sample time: kvbench `timing.answer_s` (includes tokenizing the context and setting up the "
      "cache); kvpress the same span (SentencePiece encode, prefill, question, decode) around each "
      "sample. Whole process: wall time of the `kvbench run` / `python kvpress_qa.py` process "
      "(start-up, model load, kvbench also generates the task set; the kvpress process reads it).")
    if not all(p["exact"] for p in pairs):
        w("")
        w("**Note:** this kvbench binary does not record `timing.answer_s`; its per-sample times are the "
          "gaps between stored samples and include the paired full-cache answers.")
    w("")
    w("## Setup")
    w("")
    for line in machine_lines(a.kvbench, a.loadavg):
        w(line)
    w(f"- kvpress {versions['kvpress']}, transformers {versions['transformers']}, torch "
      f"{versions['torch']} (CPU, `torch.set_num_threads({a.threads})`), Python {versions['python']}")
    w("")
    w("## Summary")
    w("")
    w("| method | samples | kvbench ms/sample | kvpress ms/sample | kvbench speedup (kvpress / kvbench time) | kvbench paired full ms/sample "
      "| whole process kvbench s (without paired full) | whole process kvpress s | answers identical | "
      "accuracy kvbench | accuracy kvpress |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for p in pairs:
        kvb, kvp = p["kvb"], p["kvp"]["samples"]
        n = len(kvb)
        kb = statistics.fmean(r["sample_s"] for r in kvb)
        kp = statistics.fmean(r["sample_s"] for r in kvp)
        fa = statistics.fmean(r["full_answer_s"] for r in kvb)
        same = sum(x["prediction"] == y["prediction"] for x, y in zip(kvb, kvp))
        acc_b = statistics.fmean(accuracy(x["prediction"], y["answers"]) for x, y in zip(kvb, kvp))
        acc_p = statistics.fmean(accuracy(y["prediction"], y["answers"]) for y in kvp)
        wall_wo = p["kvb_wall"] - sum(r["full_answer_s"] for r in kvb)
        w(f"| {p['label']} | {n} | {fmt_ms(kb)} | {fmt_ms(kp)} | {kp / kb:.2f}x | {fmt_ms(fa)} | "
          f"{p['kvb_wall']:.1f} ({wall_wo:.1f}) | {p['kvp_wall']:.1f} | {same}/{n} | {acc_b:.2f} | {acc_p:.2f} |")
        p["ratio"], p["same"], p["n"] = kp / kb, same, n
        verdicts.append(kp / kb >= 2 and same == n)
    w("")
    w("Medians (ms/sample): " + "; ".join(
        f"{p['label']}: kvbench {fmt_ms(statistics.median(r['sample_s'] for r in p['kvb']))}, kvpress "
        f"{fmt_ms(statistics.median(r['sample_s'] for r in p['kvp']['samples']))}" for p in pairs) + ".")
    w("")
    w("**Target:** the qa eval at least 2x faster per sample than kvpress, with identical answers. "
      + ("**Met.**" if all(verdicts) else "**Not met**: " + "; ".join(
          f"{p['label']} {p['ratio']:.2f}x, {p['same']}/{p['n']} identical" for p in pairs) + "."))
    if a.model_config:
        limit_section(w, a.model_config, pairs[0])
    w("")
    w("## Configurations")
    w("")
    for p in pairs:
        w(f"- {p['label']}: kvbench `{p['config']}`; kvpress "
          + ("no press" if p["kvp"]["press"] == "none" else f"`SnapKVPress({', '.join(f'{k}={v}' for k, v in p['kvp']['press_params'].items())})`"))
    w("")
    w("## Per sample")
    w("")
    w("Times in ms; `=` where kvbench's and kvpress's predictions are the same string.")
    w("")
    head = "| sample | depth |"
    rule = "|---:|---:|"
    for p in pairs:
        head += f" {p['label']} kvbench | {p['label']} kvpress | {p['label']} answers |"
        rule += "---:|---:|---|"
    w(head)
    w(rule)
    for i in range(len(pairs[0]["kvb"])):
        y0 = pairs[0]["kvp"]["samples"][i]
        row = f"| {y0['index']} | {y0['depth'] if y0['depth'] is not None else ''} |"
        for p in pairs:
            x, y = p["kvb"][i], p["kvp"]["samples"][i]
            ans = "=" if x["prediction"] == y["prediction"] else f"`{x['prediction']}` vs `{y['prediction']}`"
            row += f" {fmt_ms(x['sample_s'])} | {fmt_ms(y['sample_s'])} | {ans} |"
        w(row)
    with open(a.out, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
