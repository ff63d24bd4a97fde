"""The methods kvbench and kvpress both have, as (kvbench method + params, kvpress press) pairs.

One Pair per line of PAIRS; scripts/peer-kvpress.sh compares every pair token for token (the kept
token indices per layer and KV head at the end of the context prefill) and answer for answer (qa).
A pair is a function of the compression ratio r (the share kvpress removes): kvbench's ratio budget
is 1 - r (floor(budget x tokens) entries per KV head, kvpress's int(tokens x (1 - r))).

relation: what the comparison of kept sets is held to.
  equal     the definitions match: kept sets are identical up to ties and float rounding near the
            selection boundary (the agreement page counts both apart from real differences)
  nested    the selection scores match but the two budget rules differ (documented in `note`):
            per head, one kept set contains the other, each being a top-k of the same ordering
  channels  channel pruning: the zeroed key channels per KV head are compared (with kvpress's rule,
            and with kvpress's rule under kvbench's GQA aggregation where the note says they differ)
attn: the attention implementation transformers must run for the press (eager: the press reads
the attention weights the layer returns).
answers: whether the two qa answers are expected to be identical. False where kvbench's method also
evicts during the question and decode steps (its schedule), while a kvpress press compresses only
the context prefill: kept sets still match at the end of the context, answers may not.
"""

from dataclasses import dataclass
from typing import Callable

from calibrated_presses import artifact_dir, duo_attention_press, kvzap_press, qfilter_press
from kvzip_tokenizer import kvzip_press


@dataclass(frozen=True)
class Pair:
    name: str
    kvbench: Callable[[float], dict]  # r -> {"name": ..., "params": {...}}
    press: Callable  # (kvpress module, r) -> press
    relation: str = "equal"
    note: str = ""
    attn: str = "sdpa"
    answers: bool = True


def _m(name, **params):
    return {"name": name, "params": params}


PAIRS = [
    Pair("snapkv", lambda r: _m("snapkv", budget=1 - r, preset="kvpress"),
         lambda kp, r: kp.SnapKVPress(compression_ratio=r, window_size=64, kernel_size=5),
         note="Same definition (window 64, avg-pool 5 counting the padding, query heads averaged "
              "per KV head, window kept). kvpress averages the window queries' attention, kvbench "
              "sums it: the same order up to float rounding."),
    Pair("knorm", lambda r: _m("knorm", budget=1 - r),
         lambda kp, r: kp.KnormPress(compression_ratio=r),
         note="Same definition (keys with the lowest L2 norm per KV head). At layer 0 a key is a "
              "function of its token, rotated by its position, so a token the filler text repeats "
              "has the same norm at every position in exact arithmetic; the fp32 rotation and the "
              "norm's accumulation (kvbench: double, then fp32; kvpress: fp32) then decide which "
              "copies are kept (kvbench's exact ties go to the earlier token). Those are the tie and "
              "rounding differences below; keeping other copies (at other positions) changes what the "
              "question and the answer attend to, and so some answers."),
    Pair("streaming_llm",
         lambda r: _m("streaming_llm", budget=1 - r, sinks=4, position_mode="absolute",
                      schedule="prefill"),
         lambda kp, r: kp.StreamingLLMPress(compression_ratio=r, n_sink=4),
         note="Same definition: 4 sinks + the newest tokens, once at the end of the context "
              "(schedule=prefill; kvbench's default, continuous, keeps the budget through the "
              "question and every decode step as the paper does), keys at their original "
              "positions (position_mode=absolute: StreamingLLMPress does not re-rotate)."),
    Pair("tova", lambda r: _m("tova", budget=1 - r, keep_current=True, schedule="prefill"),
         lambda kp, r: kp.TOVAPress(compression_ratio=r),
         note="Same definition (last query's attention averaged over all heads, one kept set per "
              "layer, the newest token kept: keep_current), once at the end of the context "
              "(schedule=prefill; kvbench's default evicts after every step, as the paper)."),
    Pair("pyramidkv", lambda r: _m("pyramidkv", budget=1 - r, preset="kvpress", beta=20),
         lambda kp, r: kp.PyramidKVPress(compression_ratio=r, window_size=64, kernel_size=5,
                                         beta=20),
         relation="nested",
         note="Same SnapKV scores, different per-layer budgets. kvbench follows KVCache-Factory "
              "(the official code): with average budget B (window w included) the pyramid shares "
              "B - w, integer arithmetic, layer l keeps w + max - l ((max - min) / (L - 1)), "
              "min = (B - w) / beta; falls back to B when B <= w or min < 0. kvpress shares all of "
              "B: min = B / beta, max = 2B - min (capped at n - w), layer l keeps "
              "round(max - l (max - min) / (L - 1)), and falls back to round(n (1 - r)) unless "
              "n >= max >= min >= w (uncapped, min >= w needs n (1 - r) >= beta w: 1,280 tokens "
              "at beta 20 and window 64, so on the 1,024-token samples at r = 0.75 kvpress runs "
              "uniform SnapKV while kvbench runs its pyramid). Each layer's two kept sets are top-k of the same ordering, "
              "so the smaller is inside the larger."),
    Pair("adakv",
         lambda r: _m("adakv", budget=1 - r, window=64, kernel_size=5, pooling="avg",
                      gqa_agg="mean", floor_alpha=0.2),
         lambda kp, r: kp.AdaKVPress(kp.SnapKVPress(compression_ratio=r, window_size=64,
                                                    kernel_size=5), alpha_safeguard=0.2),
         relation="nested",
         note="Same SnapKV scores and layer budget (KV heads x n (1 - r)), different split over "
              "heads. kvbench follows the official Ada-KV: each head's prefix quota is alpha B / H "
              "+ (1 - alpha) n_h (n_h: the head's share of the layer's global top prefix "
              "entries), by largest remainder, plus the window. kvpress guarantees each head its "
              "own top int(alpha n (1 - r)) entries by score (window included, the window scoring "
              "highest) and takes the rest as the layer's global top. Per head both keep a top-k "
              "of the same ordering, so one kept set is inside the other. kvpress masks the "
              "pruned keys in attention (AdaKVPress stores every key); kvbench stores heads "
              "ragged."),
    Pair("think", lambda r: _m("think", budget=1.0, pruning_ratio=r),
         lambda kp, r: kp.ThinKPress(key_channel_compression_ratio=r, window_size=32),
         relation="channels",
         note="Channel pruning, no token eviction (budget 1): per KV head the floor(r D) key "
              "channels with the lowest query energy x mean_tokens(k_c^2) are zeroed (window 32, "
              "post-RoPE queries and keys) on both sides, but the query energy of a GQA group "
              "differs: ThinKPress averages the squares over the group's query heads, "
              "mean_g mean_t q_c^2; kvbench squares the group's mean query, mean_t (mean_g q_c)^2 "
              "(EvictingKvCache::flush_pending, the energy SparK's codec shares). The channels "
              "ThinKPress's rule zeroes with kvbench's aggregation, recomputed from kvpress's own "
              "tensors, are what kvbench zeroes. Other channels kept means other attention "
              "logits, so the answers differ."),
    Pair("h2o", lambda r: _m("h2o", budget=1 - r, score="mean", recent_fraction=0.0, sinks=0,
                             schedule="prefill"),
         lambda kp, r: kp.ObservedAttentionPress(compression_ratio=r),
         attn="eager",
         note="ObservedAttentionPress is H2O's score with no recent window at the end of the "
              "context: the attention each key received from every prompt query, divided by the "
              "number of queries that saw it, averaged over the query heads of its KV head "
              "(kvbench: score=mean, recent_fraction=0, summed over the group: the same order), "
              "once at the end of the context (schedule=prefill; kvbench's default evicts after "
              "every step, as the paper)."),
    Pair("keydiff", lambda r: _m("keydiff", budget=1 - r),
         lambda kp, r: kp.KeyDiffPress(compression_ratio=r),
         note="Same definition (keys least similar to the head's mean key kept)."),
    Pair("lagkv", lambda r: _m("lagkv", budget=1 - r, sinks=4, lag_size=128),
         lambda kp, r: kp.LagKVPress(compression_ratio=r, n_sink=4, lag_size=128),
         note="Same definition (partitions of lag_size scored against the next one's min/max). "
              "Without cross_scoring a score is the entry's rank inside its partition / lag_size, "
              "so every partition holds the same scores 0, 1/lag_size, ...: at the selection "
              "boundary the partitions tie exactly by construction, and which partitions' entries "
              "of the boundary rank are kept is the tie-break's choice (kvbench: the earlier "
              "tokens; torch.topk: its own order). Those are the tie differences below, and they "
              "change some answers."),
    Pair("cur", lambda r: _m("cur", budget=1 - r, sinks=4, leverage="kv_product", local_window=16),
         lambda kp, r: kp.CURPress(compression_ratio=r, num_sinks=4, leverage_type="kv_product",
                                   local_window_size=16),
         note="Same definition (key x value leverage, local approximation over 16 tokens)."),
    Pair("expected_attention", lambda r: _m("expected_attention", budget=1 - r),
         lambda kp, r: kp.ExpectedAttentionPress(compression_ratio=r),
         note="Same definition (expected attention of the next 512 positions' queries from the "
              "prompt's query statistics, covariance and value norms; the same scale on Llama)."),
    Pair("chunkkv", lambda r: _m("chunkkv", budget=1 - r, chunk_length=20, preset="kvpress"),
         lambda kp, r: kp.ChunkKVPress(kp.SnapKVPress(compression_ratio=r, window_size=64,
                                                      kernel_size=5), chunk_length=20),
         note="Same definition (SnapKV scores summed over the layer's heads, mean per chunk of 20, "
              "the top chunks kept by every head)."),
    Pair("kvzip", lambda r: _m("kvzip", budget=1 - r, n_sink=4, chunk_size=2048),
         lambda kp, r: kvzip_press(kp, r, plus=False),
         relation="nested",
         note="Same scores (the largest attention weight any reconstruction query of the KV head's "
              "group gives an entry, kvpress's repeat prompts and key subset; BOS the prefix on "
              "both sides, see scripts/peer/kvzip_tokenizer.py) and one ranking over every layer "
              "and head, the 4 sinks first, but the totals round differently: kvpress prunes "
              "int(L H n r) entries of the whole cache, kvbench keeps floor(n (1 - r)) per KV head times "
              "L H, so kvpress keeps up to L H - 1 more entries, the next ones of the same ranking: "
              "per head kvbench's set is inside kvpress's. kvpress masks the pruned keys in "
              "attention (its KVzip keeps every key); kvbench frees them."),
    Pair("kvzip_plus", lambda r: _m("kvzip", budget=1 - r, n_sink=4, chunk_size=2048, plus=True),
         lambda kp, r: kvzip_press(kp, r, plus=True),
         relation="nested",
         note="KVzip+ (kvzip_plus_normalization): as kvzip, each weight divided by the norm of its "
              "query's attention input and multiplied by the entry's norm through the query "
              "head's slice of W_O (kvbench computes the first from the residual stream: "
              "||x w|| / sqrt(mean(x^2) + eps))."),
    Pair("qfilters", lambda r: _m("qfilters", budget=1 - r, cache_dir=artifact_dir("qfilters")),
         lambda kp, r: qfilter_press(kp, r),
         note="Same definition at inference: the keys with the highest -(k . f) kept per KV "
              "head, k the post-RoPE key and f the head's filter. kvpress downloads the filters "
              "published for a list of models, none for this one; both sides use the filters "
              "kvbench calibrated on it (scripts/peer/calibrated_presses.py), so the pair checks "
              "the scoring and selection, not the calibration (which tests/methods/test_qfilters "
              "checks against a direct SVD)."),
    Pair("duo_attention",
         lambda r: _m("duo_attention", head_compression_ratio=r, sink_size=16, recent_size=64,
                      compress_every=0, calib_samples=8, cache_dir=artifact_dir("duo_attention")),
         lambda kp, r: duo_attention_press(kp, r, sink_size=16, recent_size=64),
         note="Same definition: the share r of KV heads with the lowest head scores stream "
              "(keep the first 16 and the newest 64 tokens), the others keep everything; r is "
              "the share of heads, not of entries. kvpress loads DuoAttention's published head "
              "patterns (none for this model) or scores heads on the fly from BookSum (a "
              "download); both sides use the head scores kvbench calibrated on the model "
              "(kvpress's on-the-fly rule, scripts/peer/calibrated_presses.py), with kvpress's "
              "own rule for which heads stream, cut once at the end of the context "
              "(compress_every=0; kvbench's default cuts again every decode step). kvpress masks "
              "the streaming heads' keys; kvbench frees them."),
    Pair("kvzap",
         lambda r: _m("kvzap", budget=1 - r, calib_samples=16, calib_tokens=256,
                      cache_dir=artifact_dir("kvzap")),
         lambda kp, r: kvzap_press(kp, r),
         note="Same definition at inference: per layer a linear map from the attention input "
              "(the layer's RMSNorm output) to one score per KV head, the top "
              "int(n (1 - r)) entries kept per head. kvpress downloads NVIDIA's trained "
              "surrogate, which does not exist for this model; both sides run the surrogate "
              "kvbench fitted on it (scripts/peer/calibrated_presses.py), so the pair checks the "
              "inference path (which hidden state, which map, which selection), not the "
              "training. At layer 0 the attention input is a function of the token alone, so "
              "every copy of a token the filler text repeats scores exactly the same: those are "
              "the tie differences below (kvbench's exact ties go to the earlier token, "
              "torch.topk's to its own order), and keeping other copies changes some answers."),
]

BY_NAME = {p.name: p for p in PAIRS}

# Methods kvbench and kvpress both have that no pair compares, with the reason (the page lists them).
NOT_PAIRED = {
    "finch": "FinchPress finds the question by a delimiter token it adds to the tokenizer and the "
             "model's embedding table (update_model_and_tokenizer), so its prompt is not the "
             "token ids kvbench runs, and it re-rotates the kept keys to new positions, so its kept "
             "rows are no rows of the input keys (what scripts/peer/kvpress_kept.py matches). "
             "kvbench's finch (question-aware SnapKV scoring over the question's own queries, "
             "qa mode=query_aware) is checked against a direct computation in "
             "tests/methods/test_leaderboard_scorers.cpp instead.",
    "dms": "kvpress's DMSPress is DMS's inference strategy only (evict whatever a wrapped scorer "
           "scores below a threshold, outside a sliding window, during prefill and decoding: how "
           "KVzap is deployed); the learned part of DMS, the model's own eviction decisions "
           "retrofitted by distillation, is what kvbench's dms runs (its adapters from "
           "`kvbench dms-train`), and kvpress has no counterpart to compare it with.",
}


def select(names):
    """PAIRS restricted to `names` (a comma-separated string or a list; empty: all), in table order."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    if not names:
        return list(PAIRS)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"kvpress_pairs: unknown pair(s) {unknown}; known: {sorted(BY_NAME)}")
    return [p for p in PAIRS if p.name in names]


def main(argv):
    """`names`: the pair names, one a line; `method NAME RATIO`: kvbench's method JSON of a pair."""
    import json
    if argv[:1] == ["names"]:
        print("\n".join(p.name for p in select(argv[1] if len(argv) > 1 else "")))
    elif argv[:1] == ["method"] and len(argv) == 3:
        print(json.dumps(BY_NAME[argv[1]].kvbench(float(argv[2]))))
    else:
        raise SystemExit("usage: kvpress_pairs.py names [PAIRS] | method NAME RATIO")


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
