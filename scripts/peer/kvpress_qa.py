#!/usr/bin/env python3
"""The kvpress side of scripts/bench-vs-kvpress.sh and scripts/peer-kvpress.sh: one kvbench qa run,
replayed through kvpress.

Reads the samples of a finished `kvbench run` (qa protocol, synthetic source, no chat template) from
its results database and the generated task file kvbench cached beside it, and answers the same
samples with Hugging Face transformers + kvpress on the same model and thread count:

  ids      [BOS] + encode(context_prompt) for the context, encode(query_prompt) for the question,
           the tokenizer's SentencePiece model (no special tokens), checked equal to the ids of
           `kvbench tokenize` for every sample (written beforehand by --write-ids) before timing
  context  model.model(context_ids) inside `with press(model)` (kvpress pipeline's prefill; none: no
           press), so the press compresses the cache once at the end of the context prefill; the
           press is a pair of scripts/peer/kvpress_pairs.py (--press NAME, --compression-ratio),
           the model runs the attention implementation the pair names
  question question ids at positions context_length.. (as the pipeline), logits of the last one
  decode   greedy argmax, stops at EOS/BOS, after max_new_tokens tokens, or as soon as the decoded
           text holds "\n" (the prediction is cut there): kvbench's qa stop rule

The timed region per sample is the tokenization, context prefill, question and decode (kvbench's
`answer_s` also spans its tokenization and cache set-up). Writes one JSON file: per-sample times,
predictions and the kvbench prediction of the same sample.
"""

import argparse
import contextlib
import importlib.metadata
import glob
import json
import os
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# transformers' weight-loading progress bars would fill the logs, one per process.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import kvpress_kept  # noqa: E402
import kvpress_pairs  # noqa: E402


def load_run(db, run_id):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    cfg = json.loads(con.execute("SELECT config_json FROM runs WHERE id=?", (run_id,)).fetchone()[0])
    rows = con.execute(
        "SELECT sample_index, sample_key, output_json FROM samples WHERE run_id=? ORDER BY sample_index",
        (run_id,),
    ).fetchall()
    con.close()
    return cfg, [(i, k, json.loads(o)) for i, k, o in rows]


def load_tasks(db):
    """Generated synthetic task samples by content hash (kvbench caches them in <db dir>/cache/*/tasks)."""
    by_hash = {}
    root = os.path.dirname(os.path.abspath(db))
    for f in glob.glob(os.path.join(root, "cache", "**", "tasks", "*.json"), recursive=True):
        with open(f) as fh:
            for s in json.load(fh)["samples"]:
                by_hash[s["hash"]] = s
    return by_hash


def kvbench_ids(kvbench, model, text, cache):
    if text not in cache:
        out = subprocess.run(
            [kvbench, "tokenize", "--model", model, "--text", text],
            check=True, capture_output=True, text=True,
        ).stdout
        cache[text] = json.loads(out)["ids"]
    return cache[text]


def sample_texts(t):
    """kvbench's context_prompt() and query_prompt() of a generated task sample."""
    return t["preamble"] + t["context"] + t["postamble"], t["question"] + t["answer_prefix"]


def write_ids(a):
    _, rows = load_run(a.db, a.run_id)
    tasks = load_tasks(a.db)
    cache, out = {}, {}
    for _, key, _ in rows:
        ctx_text, q_text = sample_texts(tasks[key])
        out[key] = {"context": kvbench_ids(a.kvbench, a.model, ctx_text, cache),
                    "question": kvbench_ids(a.kvbench, a.model, q_text, cache)}
    with open(a.ids, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="kvbench results database holding the run")
    ap.add_argument("--run-id", type=int, required=True)
    ap.add_argument("--model", required=True, help="Hugging Face model directory (the run's model)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--press", choices=["none"] + [p.name for p in kvpress_pairs.PAIRS], default="none",
                    help="a pair of scripts/peer/kvpress_pairs.py (its kvpress press), or none")
    ap.add_argument("--compression-ratio", type=float, default=0.75)
    ap.add_argument("--kvbench", help="kvbench binary: with --write-ids, tokenize every sample with it")
    ap.add_argument("--ids", required=True, help="token ids per sample from `kvbench tokenize` (JSON)")
    ap.add_argument("--write-ids", action="store_true",
                    help="only write --ids (kvbench's ids of each sample's context and question), untimed")
    ap.add_argument("--out", help="result JSON")
    a = ap.parse_args()
    if a.write_ids:
        write_ids(a)
        return

    t_process = time.perf_counter()
    import torch  # noqa: E402  (imports are part of the process, timed by the caller)
    import sentencepiece as spm
    import transformers
    import kvpress
    from transformers import LlamaForCausalLM

    torch.set_num_threads(a.threads)
    cfg, rows = load_run(a.db, a.run_id)
    proto = cfg["protocol"]
    if proto.get("source") != "synthetic" or proto.get("mode", "query_agnostic") != "query_agnostic":
        sys.exit("kvpress_qa: only the synthetic, query-agnostic qa protocol is replayed")
    tasks = load_tasks(a.db)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(a.model, "tokenizer.model"))
    pair = None if a.press == "none" else kvpress_pairs.BY_NAME[a.press]
    attn = pair.attn if pair is not None else "sdpa"
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                             attn_implementation=attn).eval()
    mc = model.config
    bos = mc.bos_token_id
    eos = mc.eos_token_id if isinstance(mc.eos_token_id, list) else [mc.eos_token_id]
    stop_ids = set(eos) | {bos}
    press = None if pair is None else pair.press(kvpress, a.compression_ratio)

    # Same ids as kvbench: checked for every sample before timing.
    with open(a.ids) as f:
        kv_ids = json.load(f)
    samples = []
    for index, key, out in rows:
        t = tasks[key]
        ctx_text, q_text = sample_texts(t)
        kv_ctx = [bos] + kv_ids[key]["context"]
        if [bos] + sp.encode(ctx_text) != kv_ctx or sp.encode(q_text) != kv_ids[key]["question"] \
                or len(kv_ctx) != out["context_tokens"]:
            sys.exit(f"kvpress_qa: sample {index}: SentencePiece ids differ from kvbench's")
        max_new = proto.get("max_new_tokens", 0) or t["max_new_tokens"]
        samples.append((index, t, ctx_text, q_text, max_new, out))

    def answer(ctx_text, q_text, max_new):
        ctx = torch.tensor([[bos] + sp.encode(ctx_text)])
        q = torch.tensor([sp.encode(q_text)])
        cache = transformers.DynamicCache()
        with press(model) if press is not None else contextlib.nullcontext():
            model.model(input_ids=ctx, past_key_values=cache)
        t_ctx = time.perf_counter()
        n = ctx.shape[1]
        pos = torch.arange(n, n + q.shape[1]).unsqueeze(0)
        logits = model(input_ids=q, past_key_values=cache, position_ids=pos, logits_to_keep=1).logits
        p = n + q.shape[1]
        out_ids, text = [], ""
        for i in range(max_new):
            t = int(logits[0, -1].argmax())
            if t in stop_ids:
                break
            out_ids.append(t)
            text = sp.decode(out_ids)
            if "\n" in text:
                return text[: text.index("\n")], t_ctx, cache
            if i + 1 < max_new:
                logits = model(
                    input_ids=torch.tensor([[t]]), past_key_values=cache, position_ids=torch.tensor([[p]])
                ).logits
                p += 1
        return text, t_ctx, cache

    results = []
    t_loop = time.perf_counter()
    with torch.inference_mode():
        for index, t, ctx_text, q_text, max_new, out in samples:
            t0 = time.perf_counter()
            pred, t_ctx, cache = answer(ctx_text, q_text, max_new)
            t1 = time.perf_counter()
            item = out["items"][0]
            results.append({
                "index": index,
                "depth": t.get("depth"),
                "answers": t["answers"],
                "prediction": pred,
                "kvbench_prediction": item["prediction"],
                "kvbench_full_prediction": item["full_prediction"],
                "kept_tokens": int(cache.get_seq_length(0)),
                "sample_s": t1 - t0,
                "context_s": t_ctx - t0,
                "kvbench_sample_s": out["timing"].get("answer_s", -1.0),
                "kvbench_context_s": out["timing"]["context_s"],
                "kvbench_full_answer_s": out["timing"].get("full_answer_s", -1.0),
            })
    t_end = time.perf_counter()
    with open(a.out, "w") as f:
        json.dump({
            "press": a.press,
            "press_class": None if press is None else type(press).__name__,
            "press_params": None if press is None else kvpress_kept.press_params(press),
            "attn_implementation": attn,
            "threads": a.threads,
            "torch_threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "kvpress": importlib.metadata.version("kvpress"), "python": sys.version.split()[0]},
            "kvbench_config": cfg,
            "setup_s": t_loop - t_process,
            "loop_s": t_end - t_loop,
            "samples": results,
        }, f, indent=1)


if __name__ == "__main__":
    main()
