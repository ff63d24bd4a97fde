#!/usr/bin/env python3
"""Writes the architecture fixtures that tests/harness/test_hf_families.cpp compares kvbench against.

The reference is Hugging Face transformers itself: for each family kvbench runs, a tiny random-weight
model is built from a config (no hub download), saved with save_pretrained, reloaded, and run in
fp32 with eager attention. Per architecture, tests/fixtures/hf/<arch>/ gets

  config.json         as transformers 5 writes it (rope_parameters, layer_types)
  config.v4.json      the same model in transformers 4's layout (top-level rope_theta / rope_scaling,
                      Gemma 3's rope_local_base_freq and sliding_window_pattern), where it differs
  model.safetensors   the weights, stored in bf16 (they are bf16-representable: the fp32 model that
                      produced the logits holds exactly these values), to keep the fixtures small
  reference.json      the prompts' token ids, the greedy continuation of the first prompt (argmax
                      of a full forward per step), and the transformers / torch versions
  logits.safetensors  fp32 logits [len, vocab] of every prompt position ("prompt.<i>")

The dimensions are tiny (hidden 32, 4 query heads of 16, 2 KV heads, vocab 128) but every
family-specific path runs: Llama 3 RoPE scaling, Qwen2.5 q/k/v biases, Qwen3 and Gemma 3 q/k norms,
Phi-3's fused projections, Mistral's and Gemma 3's sliding windows (prompts longer than the window),
Gemma 3's local RoPE base, (1 + w) norms, post-sublayer norms, embedding scale, GeGLU,
query_pre_attn_scalar and final logit softcapping.

With the models directory at hand (--models, default ../shared/models), it also writes
real/stories260K-hf.json: transformers' summed NLL, per-position argmax and last logits for the real
stories260K-hf checkpoint on the README sentence (the weights stay where they are).

CI has no Python torch: the C++ tests read only the committed fixtures. Regenerate with
  /root/kvb-torch/bin/python scripts/hf-reference.py [--out tests/fixtures/hf]
(needs torch, transformers and safetensors; the versions used are written to each reference.json
and to tests/fixtures/hf/README.md).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
import transformers
from safetensors.torch import save_file

VOCAB = 128
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

# arch name -> (transformers config class, its kwargs, transformers-4 layout of config.json or None)
ARCHS = {
    # Llama 3.2-style: llama3 frequency scaling, tied embeddings.
    "llama3": (
        "LlamaConfig",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=True,
             rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=64)),
        dict(rope_theta=500000.0,
             rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                               high_freq_factor=4.0, original_max_position_embeddings=64)),
    ),
    # Qwen2.5: q/k/v biases, untied.
    "qwen2": (
        "Qwen2Config",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False,
             rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        dict(rope_theta=1000000.0),
    ),
    # Qwen3: per-head q/k RMSNorm before RoPE, no biases; head_dim * heads != hidden_size.
    "qwen3": (
        "Qwen3Config",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=True,
             rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        dict(rope_theta=1000000.0),
    ),
    "mistral": (
        "MistralConfig",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=None,
             rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        dict(rope_theta=1000000.0),
    ),
    # Mistral with a window shorter than the prompts, so the window matters on every layer.
    "mistral_sw": (
        "MistralConfig",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=6,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        dict(rope_theta=10000.0),
    ),
    # Phi-3: fused qkv_proj and gate_up_proj.
    "phi3": (
        "Phi3Config",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=None,
             original_max_position_embeddings=256,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        dict(rope_theta=10000.0),
    ),
    # Gemma 3: sliding and global layers alternating (window 6, prompts of 20), each with its own
    # RoPE (local base 10000, global 1e6 with linear scaling 8), query_pre_attn_scalar != head_dim,
    # final logit softcapping.
    "gemma3": (
        "Gemma3TextConfig",
        dict(COMMON, num_hidden_layers=4, tie_word_embeddings=True, sliding_window=6,
             layer_types=["sliding_attention", "full_attention", "sliding_attention",
                          "full_attention"],
             query_pre_attn_scalar=24, final_logit_softcapping=5.0, bos_token_id=2, eos_token_id=1,
             hidden_activation="gelu_pytorch_tanh",
             rope_parameters={
                 "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
                 "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
             }),
        dict(rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window_pattern=2,
             rope_scaling=dict(rope_type="linear", factor=8.0)),
    ),
    # Phi-3 128K / Phi-3.5: LongRoPE (last, so that the other fixtures keep their seeds). The
    # switch point (original_max_position_embeddings 16) lies between the prompts (20: long
    # factors; 13: short), max_position_embeddings / 16 = 16 gives the attention factor sqrt(2);
    # heads x head_dim = hidden, as Phi3Config's factor check needs. The transformers 4 layout
    # names the type "su", as Phi-3-mini-128k's first config did.
    "phi3_longrope": (
        "Phi3Config",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=None,
             head_dim=8, original_max_position_embeddings=16,
             rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                  short_factor=[1.0, 1.05, 1.15, 1.3],
                                  long_factor=[1.0, 1.8, 5.0, 12.0])),
        dict(rope_theta=10000.0,
             rope_scaling=dict(type="su", short_factor=[1.0, 1.05, 1.15, 1.3],
                               long_factor=[1.0, 1.8, 5.0, 12.0])),
    ),
}

PROMPT_LENS = [20, 13]
GREEDY_STEPS = 8
# arch -> (prompt length, steps): a cached decode across LongRoPE's switch point, one token per
# forward call with the cache kept, as transformers' forward and kvpress's decoding loop run it.
# transformers' rotary embedding picks the factor set per call from the call's last position, so
# the steps past the switch rotate with the long factors while the cached keys keep the short
# ones. (generate() alone recomputes the whole cache at the crossing:
# Phi3ForCausalLM.prepare_inputs_for_generation.)
CACHED_DECODE = {"phi3_longrope": (14, 5)}


def randomize(model, arch, gen):
    """Weights that make the logits informative (HF's 0.02 init makes them nearly uniform at this
    size): N(0, 1/fan_in) matrices, N(0, 1) embeddings, norms near their identity, small biases;
    every value rounded to bf16 so that the bf16 file holds the fp32 model exactly."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed_tokens" in name:
                v = torch.randn(p.shape, generator=gen)
            elif p.dim() == 2:
                v = torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            elif "norm" in name:
                # Gemma's RMSNorm multiplies by (1 + w): identity at 0. The others at 1.
                base = 0.0 if arch == "gemma3" else 1.0
                v = base + 0.2 * torch.randn(p.shape, generator=gen)
            else:
                raise SystemExit(f"{arch}: no init rule for parameter {name} {tuple(p.shape)}")
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def build(arch, out_dir, seed):
    cls_name, kwargs, v4 = ARCHS[arch]
    cfg = getattr(transformers, cls_name)(**kwargs)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                          dtype=torch.float32)
    randomize(model, arch, gen)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        # Round trip through save_pretrained: the fixture is what transformers writes and reads.
        model.save_pretrained(tmp)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, attn_implementation="eager", dtype=torch.float32)
        model.eval()
        cfg_json = json.load(open(os.path.join(tmp, "config.json")))
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_json["dtype"] = "bfloat16"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
        f.write("\n")
    if v4 is not None:
        old = {k: v for k, v in cfg_json.items()
               if k not in ("rope_parameters", "layer_types", "_sliding_window_pattern")}
        old.update(v4)
        old["torch_dtype"] = old.pop("dtype")
        old["transformers_version"] = "4.57.0"
        with open(os.path.join(out_dir, "config.v4.json"), "w") as f:
            json.dump(old, f, indent=2, sort_keys=True)
            f.write("\n")

    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    logits = {}
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            out = model(torch.tensor([ids]), use_cache=False).logits[0].float()
            logits[f"prompt.{i}"] = out.contiguous()
        greedy = []
        ids = list(prompts[0])
        for _ in range(GREEDY_STEPS):
            nxt = int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
            greedy.append(nxt)
            ids.append(nxt)
    cached = None
    if arch in CACHED_DECODE:
        n, steps = CACHED_DECODE[arch]
        ids = torch.randint(3, VOCAB, (n,), generator=gen).tolist()
        fed, rows = [], []
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True)
            past = out.past_key_values
            for _ in range(steps):
                nxt = int(out.logits[0, -1].argmax())
                fed.append(nxt)
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                rows.append(out.logits[0, -1].float())
            # The same sequence in one forward (every position on the long factors): how far the
            # per-call switch is from a recomputation, so the test can tell them apart.
            full = model(torch.tensor([ids + fed]), use_cache=False).logits[0, n:].float()
        logits["decode"] = torch.stack(rows).contiguous()
        logits["decode.recomputed"] = full.contiguous()
        cached = {"prompt": ids, "tokens": fed}
    save_file(logits, os.path.join(out_dir, "logits.safetensors"))
    ref = {
        "arch": arch,
        "config_class": cls_name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "prompts": prompts,
        "greedy_prompt": 0,
        "greedy": greedy,
    }
    if cached is not None:
        ref["cached_decode"] = cached
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"{arch}: {sum(v.numel() for v in state.values())} parameters, "
          f"greedy {greedy}", file=sys.stderr)


# The real checkpoint the project has in Hugging Face form: the README sentence of
# tests/harness/test_reference_models.cpp (BOS + its SentencePiece ids).
STORIES_IDS = [1, 385, 328, 432, 261, 280, 305, 330, 272, 414, 444, 272, 277, 264, 261, 262, 415,
               271, 422, 410, 354, 422, 318, 264, 285, 265, 334, 341, 334, 412, 433, 259, 276, 411,
               426]


def real_checkpoint(models_dir, out_dir):
    """transformers' figures for stories260K-hf (the weights stay in the models directory): the
    summed NLL of the sentence, every position's argmax and the last position's logits."""
    path = os.path.join(models_dir, "stories260K-hf")
    if not os.path.isdir(path):
        print(f"skipping the real checkpoint: {path} not found", file=sys.stderr)
        return
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([STORIES_IDS]), use_cache=False).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    nll = -sum(float(lp[i, STORIES_IDS[i + 1]]) for i in range(len(STORIES_IDS) - 1))
    ref = {
        "model": "stories260K-hf",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "ids": STORIES_IDS,
        "nll_sum": nll,
        "argmax": [int(x) for x in logits.argmax(-1)],
        "last_logits": [float(x) for x in logits[-1].float()],
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "stories260K-hf.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    print(f"stories260K-hf: nll_sum {nll:.6f}", file=sys.stderr)


README = """# Hugging Face reference fixtures

Tiny random-weight models of each family kvbench runs, with the logits Hugging Face transformers
computes for them (fp32, eager attention). `tests/harness/test_hf_families.cpp` loads each directory
with kvbench and compares logits (max |diff| / max |ref| <= 1e-4 per prompt) and greedy tokens
(equal); it also parses `config.v4.json` (the transformers 4 layout of the same model) and checks it
gives the same architecture and logits.

Written by `scripts/hf-reference.py` with transformers {tv} and torch {pv} (CPU); the script's
docstring says what each file holds. Do not edit by hand: regenerate.

| fixture | family paths it exercises |
|---|---|
| llama3 | Llama 3.x: llama3 RoPE frequency scaling, tied embeddings |
| qwen2 | Qwen2 / Qwen2.5: q/k/v biases |
| qwen3 | Qwen3: per-head q/k RMSNorm before RoPE; heads x head_dim != hidden |
| mistral | Mistral without a window |
| mistral_sw | Mistral with sliding_window 6 on every layer (prompts of 13 and 20) |
| phi3 | Phi-3: fused qkv_proj and gate_up_proj |
| phi3_longrope | Phi-3 128K / 3.5: LongRoPE short and long factors on either side of original_max_position_embeddings 16 (prompts of 20 and 13), attention factor sqrt(2), a cached decode across the switch (logits "decode", and "decode.recomputed": the same positions in one forward); config.v4.json names the type "su" |
| real/stories260K-hf.json | transformers' NLL, argmax and last logits of the real stories260K-hf checkpoint (weights not committed: `../shared/models`) |
| gemma3 | Gemma 3 text: sliding (window 6, RoPE base 1e4) and global (1e6, linear x8) layers alternating, (1 + w) norms, post-attention/post-FFN norms, q/k norms, sqrt(hidden) embedding scale, GeGLU (tanh), query_pre_attn_scalar 24, final logit softcapping 5 |
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "hf"))
    ap.add_argument("--only", nargs="*", help="architectures to write (default: all)")
    ap.add_argument("--models", default=os.path.join(here, "..", "..", "shared", "models"),
                    help="where stories260K-hf is (its transformers figures go to real/)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    for i, arch in enumerate(ARCHS):
        if args.only and arch not in args.only:
            continue
        d = os.path.join(args.out, arch)
        shutil.rmtree(d, ignore_errors=True)
        build(arch, d, seed=1000 + i)
    if not args.only:
        real_checkpoint(args.models, os.path.join(args.out, "real"))
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(README.format(tv=transformers.__version__, pv=torch.__version__))


if __name__ == "__main__":
    main()
