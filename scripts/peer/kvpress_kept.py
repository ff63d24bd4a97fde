#!/usr/bin/env python3
"""What a kvpress press keeps at the end of a context prefill, per layer and KV head (the kvpress side
of scripts/peer-kvpress.sh; the kvbench side is `kvbench kept-indices`).

kvpress keeps no indices: a press's compress() returns the kept keys and values (ScorerPress and its
subclasses gather the top-k rows; AdaKVPress keeps every row and records the pruned ones in
module.masked_key_indices; ThinKPress zeroes key channels in place). So the press's compress is
wrapped on the instance (the forward hook calls self.compress) and, per layer:
  tokens    kept = the rows of the returned keys, matched bitwise to the rows of a copy of the keys
            taken before compress (gather copies rows exactly; a row matching two positions is
            refused), or, for AdaKVPress, every position not in masked_key_indices;
  KVzip     KVzipPress scores in its own reconstruction passes and never calls compress: its
            compress_post (run when the `with press(model)` block ends) is wrapped instead, and
            kept = every position not in the masked_key_indices it leaves on each layer, with its
            score_val as the scores;
  channels  zero_key_channels = the channels zero in every returned key row and not before; for
            ThinKPress also zero_key_channels_group_mean, the channels its rule prunes when a GQA
            group's window queries are averaged before squaring (kvbench's aggregation)
The score() of the press (for AdaKVPress, of the press it wraps) is wrapped too and its scores are
written beside the kept indices, so that a differing kept set can be classified (exact tie, float
rounding near the boundary, real difference) without recomputing anything.

Input ids: {"prompts": [[id, ...], ...]}, each prefilled as given into a fresh DynamicCache with
model.model(...) inside `with press(model)`. Output (JSON, the format of `kvbench kept-indices` plus
"scores"): {"pair", "press", "press_params", "versions", "prompts": [{"n_tokens", "kept":
[layer][head][...], "zero_key_channels": ..., "scores": [layer][head][position] or null}]}.
"""

import argparse
import dataclasses
import importlib.metadata
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# transformers' weight-loading progress bars would fill the logs, one per process.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import kvpress_pairs  # noqa: E402


def press_params(press):
    """A press's dataclass fields, nested presses as {"press": name, ...}."""
    out = {}
    for f in dataclasses.fields(press):
        v = getattr(press, f.name)
        if dataclasses.is_dataclass(v):
            v = {"press": type(v).__name__, **press_params(v)}
        elif hasattr(v, "shape"):  # a tensor field (QFilterPress.q_filters): its shape
            v = f"tensor{list(v.shape)}"
        out[f.name] = v
    return out


def rows_to_indices(before, after):
    """Positions of the rows of `after` ([m, D]) in `before` ([n, D]), matched bitwise, ascending."""
    where = {}
    for i, row in enumerate(before.contiguous().numpy()):
        key = row.tobytes()
        if key in where:
            raise SystemExit("kvpress_kept: two positions hold the same key row; kept indices are "
                             "ambiguous")
        where[key] = i
    idx = []
    for row in after.contiguous().numpy():
        key = row.tobytes()
        if key not in where:
            raise SystemExit("kvpress_kept: a returned key row is no row of the input keys (the press "
                             "does not select rows)")
        idx.append(where[key])
    return sorted(idx)


def kept_outside_mask(masked, H, n):
    """Per KV head, the positions of n not in a press's masked_key_indices (batch, head, position)."""
    pruned = [set() for _ in range(H)]
    if masked is not None:
        _, heads, pos = masked
        for h, p in zip(heads.tolist(), pos.tolist()):
            pruned[h].add(p)
    return [[i for i in range(n) if i not in pruned[h]] for h in range(H)]


def think_group_mean_channels(press, module, keys, kwargs, torch):
    """ThinKPress's pruned channels with kvbench's aggregation of a GQA group's window queries: the
    group's queries averaged before squaring (mean_t (mean_g q)^2), where ThinKPress averages the
    squares (mean_g mean_t q^2); everything else as ThinKPress (its own window queries, post-RoPE,
    and keys). kvbench's store computes it so (EvictingKvCache::flush_pending); computed here on
    transformers' tensors, it checks kvbench's rule independently of kvbench."""
    q = press.compute_window_queries(module, kwargs["hidden_states"], kwargs["position_embeddings"])
    _, H, _, D = keys.shape
    qg = q.view(1, H, q.shape[1] // H, q.shape[2], D)  # [1, H, G, window, D]
    score = (qg.mean(2) ** 2).mean(2) * (keys ** 2).mean(2)  # [1, H, D]
    n = int(D * press.key_channel_compression_ratio)
    return [sorted(score[0, h].topk(n, largest=False).indices.tolist()) for h in range(H)]


def instrument(press, torch):
    """Wraps press.compress (and its scorer's score) to record, per layer index, what was kept."""
    record = {}
    scorer = press.press if hasattr(press, "press") and hasattr(press.press, "score") else press
    if hasattr(scorer, "score"):
        orig_score = scorer.score

        def score(module, *args, **kwargs):
            s = orig_score(module, *args, **kwargs)
            record.setdefault(module.layer_idx, {})["scores"] = s.detach().float().clone()
            return s
        object.__setattr__(scorer, "score", score)

    if hasattr(press, "compress_post"):  # KVzipPress: scores and masks after the context
        orig_post = press.compress_post

        def compress_post(model):
            for layer in model.model.layers:
                layer.self_attn.masked_key_indices = None
            orig_post(model)
            for layer in model.model.layers:
                module = layer.self_attn
                _, H, n = press.score_val[module.layer_idx].shape
                r = record.setdefault(module.layer_idx, {})
                r["kept"] = kept_outside_mask(module.masked_key_indices, H, n)
                r["zero_key_channels"] = [[] for _ in range(H)]
                r["scores"] = press.score_val[module.layer_idx].detach().float().clone()
        object.__setattr__(press, "compress_post", compress_post)
        return record

    orig_compress = press.compress

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        before = keys.detach().clone()
        module.masked_key_indices = None
        k2, v2 = orig_compress(module, hidden_states, keys, values, attentions, kwargs)
        r = record.setdefault(module.layer_idx, {})
        H, n = before.shape[1], before.shape[2]
        masked = getattr(module, "masked_key_indices", None)
        if masked is not None:
            r["kept"] = kept_outside_mask(masked, H, n)
        elif k2.shape[2] == n:  # nothing evicted (ThinKPress changes channels, not rows)
            r["kept"] = [list(range(n)) for _ in range(H)]
        else:
            r["kept"] = [rows_to_indices(before[0, h], k2[0, h]) for h in range(H)]
        if hasattr(press, "compute_window_queries") and hasattr(press, "key_channel_compression_ratio"):
            r["zero_key_channels_group_mean"] = think_group_mean_channels(
                press, module, before, kwargs, torch)
        zero_after = (k2[0] == 0).all(dim=1)  # [H, D]
        zero_before = (before[0] == 0).all(dim=1)
        r["zero_key_channels"] = [torch.nonzero(zero_after[h] & ~zero_before[h]).flatten().tolist()
                                  for h in range(H)]
        return k2, v2
    object.__setattr__(press, "compress", compress)
    return record


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--pair", required=True, help="a pair of scripts/peer/kvpress_pairs.py")
    ap.add_argument("--ratio", type=float, required=True, help="kvpress compression ratio")
    ap.add_argument("--ids", required=True, help='{"prompts": [[id, ...], ...]} (JSON)')
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-scores", action="store_true", help="leave the scores out (small fixtures)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch
    import transformers
    import kvpress
    from transformers import LlamaForCausalLM

    torch.set_num_threads(a.threads)
    pair = kvpress_pairs.BY_NAME[a.pair]
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation=pair.attn)
    model.eval()
    with open(a.ids) as f:
        prompts = json.load(f)
    prompts = prompts["prompts"] if isinstance(prompts, dict) else prompts
    out_prompts = []
    L = model.config.num_hidden_layers
    with torch.inference_mode():
        for ids in prompts:
            press = pair.press(kvpress, a.ratio)
            params = press_params(press)
            record = instrument(press, torch)
            cache = transformers.DynamicCache()
            with press(model):
                model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
            if sorted(record) != list(range(L)) or any("kept" not in record[l] for l in range(L)):
                raise SystemExit(f"kvpress_kept: {a.pair}: the press did not compress every layer")
            p = {"n_tokens": len(ids),
                 "kept": [record[l]["kept"] for l in range(L)],
                 "zero_key_channels": [record[l]["zero_key_channels"] for l in range(L)]}
            if "zero_key_channels_group_mean" in record[0]:
                p["zero_key_channels_group_mean"] = [record[l]["zero_key_channels_group_mean"]
                                                     for l in range(L)]
            if not a.no_scores:
                p["scores"] = [record[l]["scores"][0].tolist() if "scores" in record[l] else None
                               for l in range(L)]
            out_prompts.append(p)
    with open(a.out, "w") as f:
        json.dump({
            "pair": a.pair,
            "press": type(press).__name__,
            "press_params": params,
            "attn_implementation": pair.attn,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "kvpress": importlib.metadata.version("kvpress"),
                         "python": sys.version.split()[0]},
            "prompts": out_prompts,
        }, f)


if __name__ == "__main__":
    main()
