#!/usr/bin/env python3
"""The kvpress side of scripts/bench-grid-vs-kvpress.sh: a whole leaderboard grid (methods x compression
ratios x qa samples) through transformers + kvpress in ONE process, the model loaded once. That is
kvpress's best case: its pipeline runs one press per call, so a grid is one call per cell and sample,
each prefilling the context again, but nothing here reloads the model between cells.

Three steps, each a subcommand:

  plan  (system Python, no torch) the grid both sides run: every method of a leaderboard grid
        (--grid, e.g. configs/grids/kvpress_leaderboard_cpu.json) that kvpress has, as the pair of
        scripts/peer/kvpress_pairs.py defines it (kvbench's method with the press's definition), at
        the grid's budgets (kvpress compression ratio r = 1 - budget), on the grid's qa tasks at
        --length tokens with --samples per depth. Writes the kvbench grid JSON and a plan: the cells
        (label, pair, ratio, kvbench method), the methods skipped (no press) and, per method, where
        the pair's kvbench parameters differ from the leaderboard grid's.
  ids   (system Python, no torch) every sample's prompt ids as kvbench's qa protocol feeds them, read
        from the finished grid's database and task files: [BOS] + context (no chat template), or
        ChatML's system turn and user opener + context, then question + answer prefix (+ ChatML's
        turn close and assistant opener); every text piece tokenized by `kvbench tokenize`, and
        checked against the stored context length and the full cell's prefill length.
  run   (the kvpress venv) every cell of the plan over the samples of its kvbench run: the context
        prefilled with model.model(...) inside `with press(model)` (no press for `full`), the
        question at the following positions, greedy decoding with kvbench's qa stop rule (EOS/BOS,
        the task's max_new_tokens, or the first "\\n", cut there). Writes per-cell and per-sample
        times, kvpress's and kvbench's predictions, and the versions.

Methods whose press needs eager attention (h2o) switch the one loaded model's attention
implementation for their cells (no reload).
"""

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# transformers' weight-loading progress bars would fill the logs.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import kvpress_kept  # noqa: E402
import kvpress_pairs  # noqa: E402
from kvpress_qa import kvbench_ids, load_tasks, sample_texts  # noqa: E402

FULL = "full"


# ---------------------------------------------------------------------------------------------- plan

def pair_name(entry):
    """The pair of a leaderboard grid's method entry ("full" for the full cache)."""
    name = entry if isinstance(entry, str) else entry["name"]
    params = {} if isinstance(entry, str) else entry.get("params", {})
    if name == "snapkv" and params.get("allocator") == "ada":
        return "adakv"  # kvpress: AdaKVPress(SnapKVPress); kvbench's pair runs method adakv
    if name == "kvzip" and params.get("plus"):
        return "kvzip_plus"
    return name


def budgets_of(entry):
    """The kvbench budgets a leaderboard method entry lists (none for the full cache)."""
    b = entry.get("params", {}).get("budget", []) if isinstance(entry, dict) else []
    return b if isinstance(b, list) else [b]


def resolved_methods(kvbench, grid_path, scratch_db):
    """{(label, budget): resolved method} of a grid's cells, as kvbench resolves them (every default
    filled in): `kvbench grid --dry-run --json --schema-only`."""
    out = subprocess.run([kvbench, "grid", "-c", grid_path, "--dry-run", "--json", "--schema-only",
                          "--db", scratch_db], check=True, capture_output=True, text=True).stdout
    methods = {}
    for c in json.loads(out)["cells"]:
        m = c["config"]["method"]
        methods[(pair_name(m), m["params"].get("budget"))] = m
    return methods


def param_differences(lb, mine):
    """Where the pair's resolved kvbench method departs from the leaderboard grid's (budget and the
    artifact directory aside): {key: [leaderboard value, pair value]}; "method" when the names differ."""
    skip = ("budget", "cache_dir")
    keys = sorted((set(lb["params"]) | set(mine["params"])) - set(skip))
    diff = {k: [lb["params"].get(k, "-"), mine["params"].get(k, "-")] for k in keys
            if lb["params"].get(k) != mine["params"].get(k)}
    if lb["name"] != mine["name"]:
        diff["method"] = [lb["name"], mine["name"]]
    return diff


def plan_methods(grid, names, ratios):
    """(cells, skipped) for the grid's method axis, restricted to `names` (labels)."""
    cells, skipped = [], []
    for entry in grid["axes"]["method"]:
        label = pair_name(entry)
        if names and label not in names:
            continue
        if label == FULL:
            cells.append({"label": FULL, "pair": None, "ratio": 0.0, "method": FULL})
            continue
        pair = kvpress_pairs.BY_NAME.get(label)
        if pair is None:
            why = kvpress_pairs.NOT_PAIRED.get(label, "kvpress has no press for it")
            skipped.append({"label": label, "why": why})
            continue
        for b in budgets_of(entry):
            r = round(1.0 - b, 12)
            if ratios and r not in ratios:
                continue
            method = pair.kvbench(r)
            if abs(method["params"].get("budget", 1 - r) - b) > 1e-12:
                raise SystemExit(f"kvpress_grid: {label}: budget {b} does not round-trip through ratio {r}")
            cells.append({"label": label, "pair": pair.name, "ratio": r, "method": method})
    grid_ratios = {round(1.0 - b, 12) for e in grid["axes"]["method"] for b in budgets_of(e)}
    if set(ratios) - grid_ratios:
        raise SystemExit(f"kvpress_grid: ratios {sorted(set(ratios) - grid_ratios)} are not in the grid "
                         f"(its ratios: {sorted(grid_ratios)})")
    unknown = sorted(set(names) - {c["label"] for c in cells} - {s["label"] for s in skipped})
    if unknown:
        raise SystemExit(f"kvpress_grid: methods {unknown} are not in the grid "
                         f"(labels: {sorted({pair_name(e) for e in grid['axes']['method']})})")
    return cells, skipped


def plan_protocols(grid, length, samples, tasks, depths):
    """The grid's qa protocols (restricted to `tasks`) at `length` tokens, `samples` per depth."""
    protos = []
    for p in grid["axes"]["protocol"]:
        if tasks and p["task"] not in tasks:
            continue
        p = dict(p, length=length, num_samples=samples)
        if depths:
            p["depths"] = depths
        protos.append(p)
    if not protos:
        raise SystemExit(f"kvpress_grid: no protocol of the grid runs task(s) {tasks}")
    return protos


def grid_differences(kvbench, source_grid, my_grid, scratch_db):
    """Per method label, where the generated grid's resolved method departs from the source grid's."""
    lb, mine = (resolved_methods(kvbench, g, scratch_db) for g in (source_grid, my_grid))
    if os.path.exists(scratch_db):
        os.remove(scratch_db)
    differences = {}
    for key, m in mine.items():
        if key[0] != FULL:
            differences.setdefault(key[0], param_differences(lb[key], m))
    return differences


def whole_grid(grid):
    """The source grid's sizes, so that the report can say what a subset run left out."""
    methods, protos = grid["axes"]["method"], grid["axes"]["protocol"]
    return {"methods": sorted({pair_name(e) for e in methods}),
            "ratios": sorted({round(1 - b, 12) for e in methods for b in budgets_of(e)}),
            "tasks": [p["task"] for p in protos],
            "depths": sorted({p.get("depths", "") for p in protos}),
            "samples": sorted({p["num_samples"] for p in protos})}


def plan(a):
    with open(a.grid) as f:
        grid = json.load(f)
    names = [n for n in a.methods.split(",") if n]
    ratios = [float(r) for r in a.ratios.split(",") if r]
    tasks = [t for t in a.tasks.split(",") if t]
    cells, skipped = plan_methods(grid, names, ratios)
    protos = plan_protocols(grid, a.length, a.samples, tasks, a.depths)
    with open(a.out_grid, "w") as f:
        json.dump({
            "name": "grid_vs_kvpress",
            "description": f"Generated by scripts/bench-grid-vs-kvpress.sh from {a.grid}: its methods "
                           "that kvpress has, each with the parameters of its kvpress pair "
                           "(scripts/peer/kvpress_pairs.py), one explicit method per compression ratio.",
            "base": {"model": a.model, "threads": a.threads},
            "axes": {"method": [c["method"] for c in cells], "protocol": protos},
        }, f, indent=1)
    differences = grid_differences(a.kvbench, a.grid, a.out_grid, a.out_plan + ".dry-run.sqlite")
    with open(a.out_plan, "w") as f:
        json.dump({"source_grid": a.grid, "model": a.model, "length": a.length, "samples": a.samples,
                   "threads": a.threads, "cells": cells, "skipped": skipped, "differences": differences,
                   "protocols": protos, "whole": whole_grid(grid)}, f, indent=1)


# ----------------------------------------------------------------------------------------------- ids

def grid_rows(db):
    """Every (run id, method, params, protocol) and its sample rows, in run id order."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    runs = con.execute("SELECT id, config_json, status, error FROM runs ORDER BY id").fetchall()
    out = []
    for run_id, cfg, status, error in runs:
        rows = con.execute("SELECT sample_index, sample_key, output_json FROM samples WHERE run_id=? "
                           "ORDER BY sample_index", (run_id,)).fetchall()
        out.append({"id": run_id, "config": json.loads(cfg), "status": status, "error": error,
                    "rows": [(i, k, json.loads(o)) for i, k, o in rows]})
    con.close()
    return out


CHATML = re.compile(r"^chatml(?: \(system: '(.*)'\))?$", re.S)


def chat_segments(chat):
    """kvbench's (user_open, user_close) of a chat template description (output_json.chat_template),
    as (special, text) pieces (harness/formats/chat_template.cpp); None, None without a template."""
    if chat == "none":
        return None, None
    m = CHATML.match(chat)
    if not m:
        raise SystemExit(f"kvpress_grid: chat template '{chat}' is not replayed (none and chatml are)")
    opener = [(True, "<|im_start|>"), (False, "system\n" + m.group(1)), (True, "<|im_end|>"), (False, "\n")]
    opener = (opener if m.group(1) else []) + [(True, "<|im_start|>"), (False, "user\n")]
    close = [(True, "<|im_end|>"), (False, "\n"), (True, "<|im_start|>"), (False, "assistant\n")]
    return opener, close


def encode_segments(kvbench, model, segs, cache):
    ids = []
    for special, text in segs:
        t = kvbench_ids(kvbench, model, text, cache)
        if special and len(t) != 1:
            raise SystemExit(f"kvpress_grid: special token {text!r} is {len(t)} ids in kvbench's tokenizer")
        ids += t
    return ids


def model_facts(kvbench, model):
    out = subprocess.run([kvbench, "inspect", "--model", model], check=True, capture_output=True,
                         text=True).stdout
    j = json.loads(out)
    eos = j["eos_token_id"] if isinstance(j["eos_token_id"], list) else [j["eos_token_id"]]
    return j["bos_token_id"], eos, j.get("add_bos_token", True), j


def sample_prompt(a, task, chat, facts, cache):
    """One sample's ids as kvbench's qa protocol builds them (harness/eval/qa.cpp context_prompt and
    question_ids), and the prompt pieces around the context: (sample entry, pieces)."""
    bos, _, add_bos, _ = facts
    opener, close = chat_segments(chat)
    prefix = [bos] if (add_bos if opener is None else False) else []  # ChatML takes no BOS
    prefix += encode_segments(a.kvbench, a.model, opener or [], cache)
    close_ids = encode_segments(a.kvbench, a.model, close or [], cache)
    ctx_text, q_text = sample_texts(task)
    entry = {"context": prefix + kvbench_ids(a.kvbench, a.model, ctx_text, cache),
             "question": kvbench_ids(a.kvbench, a.model, q_text, cache) + close_ids,
             "max_new_tokens": task["max_new_tokens"], "depth": task.get("depth"),
             "answers": task["answers"]}
    return entry, {"chat": chat, "prefix": prefix, "turn_close": close_ids if close else None}


def write_ids(a):
    """ids.json: per sample key the context and question ids, plus the prompt pieces KVzip needs."""
    tasks = load_tasks(a.db)
    facts = model_facts(a.kvbench, a.model)
    cache, samples, pieces = {}, {}, None
    for run in grid_rows(a.db):
        # prefill_tokens = context + question, except where KVzip's reconstruction adds its own
        plain = run["config"]["method"]["name"] != "kvzip"
        for _, key, out in run["rows"]:
            if key not in samples:
                samples[key], pieces = sample_prompt(a, tasks[key], out["chat_template"], facts, cache)
            s = samples[key]
            if len(s["context"]) != out["context_tokens"]:
                raise SystemExit(f"kvpress_grid: sample {key[:12]}: {len(s['context'])} context ids, "
                                 f"kvbench prefilled {out['context_tokens']}")
            if plain and len(s["context"]) + len(s["question"]) != out["timing"]["prefill_tokens"]:
                raise SystemExit(f"kvpress_grid: sample {key[:12]}: the question's ids differ in length "
                                 "from kvbench's")
    with open(a.ids, "w") as f:
        json.dump({"bos": facts[0], "eos": facts[1], **pieces, "samples": samples}, f)


# ----------------------------------------------------------------------------------------------- run

def match_cell(cells, method):
    """The plan cell whose kvbench method a run's resolved method matches (its params a subset of the
    run's; the most specific wins)."""
    best, best_n = None, -1
    for c in cells:
        m = c["method"]
        if isinstance(m, str):
            m = {"name": m, "params": {}}
        if m["name"] != method["name"]:
            continue
        if all(method["params"].get(k) == v for k, v in m["params"].items()) and len(m["params"]) > best_n:
            best, best_n = c, len(m["params"])
    return best


class Text:
    """Decoding (token ids -> text) and text encoding with the model's own tokenizer: SentencePiece for
    a directory with tokenizer.model, transformers' tokenizer read from the GGUF otherwise."""

    def __init__(self, model_dir, gguf_file):
        if gguf_file is None:
            import sentencepiece as spm
            self.sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "tokenizer.model"))
            self.decode, self.encode = self.sp.decode, self.sp.encode
        else:
            from transformers import AutoTokenizer
            hf = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_file)
            self.decode = lambda ids: hf.decode(ids)
            self.encode = lambda text: hf.encode(text, add_special_tokens=False)


class PromptTokenizer:
    """What KVzipPress asks AutoTokenizer for, on a model kvbench prompts with a chat template: a
    "template" whose text before the user's content encodes to kvbench's prompt prefix (system turn +
    user opener) and whose text after it to kvbench's turn close, so that KVzipPress's own parsing
    reconstructs exactly kvbench's context body and closes its repeat prompt as kvbench does
    (scripts/peer/kvzip_tokenizer.py is the same for a model without a template)."""

    PREFIX, CLOSE = "\x00kvb-prefix\x00", "\x00kvb-close\x00"
    chat_template = PREFIX + "{text}" + CLOSE
    ids = None  # {"prefix": [...], "turn_close": [...]}, set before the press runs
    text = None  # Text

    @classmethod
    def from_pretrained(cls, *_, **__):
        return cls()

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **_):
        if tokenize or len(messages) != 1 or not add_generation_prompt:
            raise ValueError("PromptTokenizer: only one untokenized user turn")
        return self.chat_template.format(text=messages[0]["content"])

    def encode(self, text, return_tensors=None, add_special_tokens=False):
        ids = (self.ids["prefix"] if text == self.PREFIX else self.ids["turn_close"] if text == self.CLOSE
               else self.text.encode(text))
        if return_tensors == "pt":
            import torch
            return torch.tensor([ids], dtype=torch.long)
        return ids


def make_press(kvpress, cell, ids_meta, text):
    """The cell's press (None for the full cache); KVzip's tokenizer stand-in follows the prompt."""
    if cell["pair"] is None:
        return None
    press = kvpress_pairs.BY_NAME[cell["pair"]].press(kvpress, cell["ratio"])
    if cell["pair"].startswith("kvzip") and ids_meta.get("turn_close") is not None:
        import kvpress.presses.kvzip_press as module
        PromptTokenizer.ids, PromptTokenizer.text = ids_meta, text
        module.AutoTokenizer = PromptTokenizer
    return press


def answer(model, press, s, stop_ids, decode, torch, transformers):
    """One sample: (prediction, seconds in the context prefill, kept entries of layer 0)."""
    t0 = time.perf_counter()
    ctx = torch.tensor([s["context"]])
    q = torch.tensor([s["question"]])
    cache = transformers.DynamicCache()
    with press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=ctx, past_key_values=cache)
    t_ctx = time.perf_counter() - t0
    n = ctx.shape[1]
    pos = torch.arange(n, n + q.shape[1]).unsqueeze(0)
    logits = model(input_ids=q, past_key_values=cache, position_ids=pos, logits_to_keep=1).logits
    p = n + q.shape[1]
    out, text = [], ""
    for i in range(s["max_new_tokens"]):
        t = int(logits[0, -1].argmax())
        if t in stop_ids:
            break
        out.append(t)
        text = decode(out)
        if "\n" in text:
            text = text[: text.index("\n")]
            break
        if i + 1 < s["max_new_tokens"]:
            logits = model(input_ids=torch.tensor([[t]]), past_key_values=cache,
                           position_ids=torch.tensor([[p]])).logits
            p += 1
    return text, t_ctx, int(cache.get_seq_length(0))


def run_cell(model, kvpress, cell, run, ids, text, torch, transformers):
    """Every sample of one kvbench run through the cell's press; the cell's wall time includes the
    press's construction and the attention switch."""
    t0 = time.perf_counter()
    attn = "sdpa" if cell["pair"] is None else kvpress_pairs.BY_NAME[cell["pair"]].attn
    if model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)
    press = make_press(kvpress, cell, ids, text)
    stop_ids = set(ids["eos"]) | {ids["bos"]}
    samples = []
    for index, key, out in run["rows"]:
        s = ids["samples"][key]
        t1 = time.perf_counter()
        pred, ctx_s, kept = answer(model, press, s, stop_ids, text.decode, torch, transformers)
        item = out["items"][0]
        samples.append({"index": index, "key": key, "depth": s["depth"], "answers": s["answers"],
                        "prediction": pred, "kvbench_prediction": item["prediction"],
                        "kvbench_full_prediction": item["full_prediction"],
                        "sample_s": time.perf_counter() - t1, "context_s": ctx_s, "kept_tokens": kept})
    return {"label": cell["label"], "pair": cell["pair"], "ratio": cell["ratio"], "run_id": run["id"],
            "task": run["config"]["protocol"]["task"], "attn_implementation": attn,
            "press_class": None if press is None else type(press).__name__,
            "press_params": None if press is None else kvpress_kept.press_params(press),
            "cell_s": time.perf_counter() - t0, "samples": samples}


def load_model(a, torch):
    from transformers import LlamaForCausalLM
    kw = {"gguf_file": a.gguf_file} if a.gguf_file else {}
    return LlamaForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32, attn_implementation="sdpa",
                                            **kw).eval()


def run(a):
    t_process = time.perf_counter()
    import torch  # noqa: E402  (the imports are part of the process, timed by the caller)
    import transformers
    import kvpress

    torch.set_num_threads(a.threads)
    with open(a.plan) as f:
        cells = json.load(f)["cells"]
    with open(a.ids) as f:
        ids = json.load(f)
    model = load_model(a, torch)
    text = Text(a.model_dir, a.gguf_file)
    runs = [r for r in grid_rows(a.db) if r["status"] == "done"]
    out_cells, errors = [], []
    t_loop = time.perf_counter()
    with torch.inference_mode():
        for run_ in runs:
            cell = match_cell(cells, run_["config"]["method"])
            if cell is None:
                raise SystemExit(f"kvpress_grid: run {run_['id']} ({run_['config']['method']}) is in no plan cell")
            try:
                out_cells.append(run_cell(model, kvpress, cell, run_, ids, text, torch, transformers))
            except Exception as e:  # a press that fails is reported, the grid goes on
                errors.append({"label": cell["label"], "ratio": cell["ratio"], "run_id": run_["id"],
                               "error": f"{type(e).__name__}: {e}"})
                print(f"kvpress_grid: {cell['label']} r={cell['ratio']}: {errors[-1]['error']}", file=sys.stderr)
    t_end = time.perf_counter()
    with open(a.out, "w") as f:
        json.dump({
            "threads": a.threads, "torch_threads": torch.get_num_threads(),
            "model": a.model_dir if not a.gguf_file else os.path.join(a.model_dir, a.gguf_file),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "kvpress": importlib.metadata.version("kvpress"), "python": sys.version.split()[0]},
            "setup_s": t_loop - t_process, "loop_s": t_end - t_loop,
            "cells": out_cells, "errors": errors,
        }, f, indent=1)


# ---------------------------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="write the kvbench grid and the plan")
    p.add_argument("--grid", required=True, help="leaderboard grid JSON (its method and protocol axes)")
    p.add_argument("--model", required=True, help="the model as kvbench names it")
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--samples", type=int, required=True, help="samples per depth")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--methods", default="", help="comma-separated labels (full, snapkv, adakv, ...); all")
    p.add_argument("--ratios", default="", help="comma-separated kvpress ratios; the grid's")
    p.add_argument("--tasks", default="", help="comma-separated tasks; the grid's")
    p.add_argument("--depths", default="", help="needle depths; the grid's")
    p.add_argument("--kvbench", required=True, help="kvbench binary (resolves both grids' methods)")
    p.add_argument("--out-grid", required=True)
    p.add_argument("--out-plan", required=True)
    p = sub.add_parser("ids", help="write every sample's prompt ids (kvbench's)")
    p.add_argument("--db", required=True)
    p.add_argument("--kvbench", required=True)
    p.add_argument("--model", required=True, help="the model as kvbench names it")
    p.add_argument("--ids", required=True)
    p = sub.add_parser("run", help="the kvpress side over every cell (the venv's Python)")
    p.add_argument("--db", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--model-dir", required=True, help="Hugging Face model directory")
    p.add_argument("--gguf-file", help="a GGUF file in --model-dir to load instead of safetensors")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    {"plan": plan, "ids": write_ids, "run": run}[a.cmd](a)


if __name__ == "__main__":
    main()
