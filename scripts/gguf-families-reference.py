#!/usr/bin/env python3
"""Writes the GGUF family fixtures that tests/harness/test_gguf_families.cpp compares kvbench against.

For each GGUF architecture kvbench maps (qwen2, qwen3, phi3, gemma3; llama with llama3 RoPE scaling
stored as rope_freqs; phi3 with LongRoPE's factor tensors), a tiny random-weight model is built
with Hugging Face transformers from a config (no hub download), saved with save_pretrained and
reloaded, and its fp32 logits (eager attention) are recorded; the same
weights are then converted to GGUF here with gguf-py's GGUFWriter, following llama.cpp's converter
(convert_hf_to_gguf.py and its conversion/ modules) rule by rule:

  - tensor names from gguf-py's own TensorNameMap (qkv_proj -> attn_qkv, pre_feedforward_layernorm
    -> ffn_norm, post_attention_layernorm -> post_attention_norm on Gemma 3, ...);
  - q/k rows as Hugging Face has them, except llama's, which LlamaModel.permute turns into
    adjacent pairs; the others llama.cpp rotates NeoX-style (halves);
  - RoPE frequency factors as tensors: llama3 scaling as rope_freqs (LlamaModel.
    generate_extra_tensors), LongRoPE as rope_factors_short / rope_factors_long with
    rope.scaling.attn_factor and original_context_length (Phi3MiniModel);
  - Gemma 3's norm weights with the 1 of its (1 + w) RMSNorm added (Gemma3Model.norm_shift), every
    "*norm.weight" including q/k norms;
  - the metadata TextModel.set_gguf_parameters and the family's class write (Gemma 3: the global
    layers' rope.freq_base, rope.freq_base_swa of the sliding layers, linear rope.scaling,
    attention.sliding_window, final_logit_softcapping, no sliding_window_pattern, so llama.cpp's
    period of 6 applies; Phi-3: rope.dimension_count, sliding_window 0 for none);
  - matrices in BF16 (the converter's --outtype bf16; the weights are bf16-representable, so the
    GGUF holds the model that produced the logits exactly), 1-D tensors in F32 as the converter
    keeps them.

Gemma 3's GGUF has no query_pre_attn_scalar: llama.cpp scales queries by 1/sqrt(head_dim) (27B
aside), so the model here sets query_pre_attn_scalar = head_dim to be one a GGUF can describe; and
6 layers, so llama.cpp's default pattern (5 sliding, 1 global) applies.

Per architecture, tests/fixtures/gguf/<arch>/ gets model.gguf, reference.json (prompts, the greedy
continuation of the first, versions) and logits.safetensors (fp32 [len, vocab] per prompt,
"prompt.<i>"). The random weights follow scripts/hf-reference.py's rules (its randomize()).

CI has no Python torch: the C++ tests read only the committed fixtures. Regenerate with
  /root/kvb-venv/bin/python scripts/gguf-families-reference.py   (torch, transformers, gguf)
"""

import argparse
import importlib.metadata
import math
import importlib.util
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np
import torch
import transformers
import gguf
from gguf import GGMLQuantizationType as T
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("hf_reference", os.path.join(HERE, "hf-reference.py"))
hf_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_reference)
COMMON, VOCAB = hf_reference.COMMON, hf_reference.VOCAB

# arch (GGUF general.architecture) -> (transformers config class, kwargs, gguf MODEL_ARCH)
ARCHS = {
    # Qwen2.5: q/k/v biases, untied. llama.cpp's qwen2 and phi3 graphs need heads x head_dim =
    # hidden (their attn_output is hidden x hidden), so head_dim is 8 there.
    "qwen2": ("Qwen2Config",
              dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False, head_dim=8,
                   rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
              gguf.MODEL_ARCH.QWEN2),
    # Qwen3: q/k norms; heads x head_dim (64) != hidden (32), so key_length matters. Untied (as
    # Qwen3-8B): a tiny tied model only echoes its last token, which makes a weak greedy check.
    "qwen3": ("Qwen3Config",
              dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False,
                   rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
              gguf.MODEL_ARCH.QWEN3),
    # Phi-3: fused qkv_proj and gate_up_proj stay fused (attn_qkv, ffn_up of 2 x intermediate).
    "phi3": ("Phi3Config",
             dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=None,
                  head_dim=8, original_max_position_embeddings=256,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
             gguf.MODEL_ARCH.PHI3),
    # Gemma 3: 5 sliding layers (window 6, base 1e4) then a global one (1e6, linear x8), the
    # (1 + w) norms, post-sublayer norms, q/k norms, embedding scale, GeGLU, softcapping 5. Untied
    # (llama.cpp reads an output.weight where there is one): tied, the scaled embedding dominates
    # the residual stream of so small a model and greedy decoding only repeats its last token.
    "gemma3": ("Gemma3TextConfig",
               dict(COMMON, num_hidden_layers=6, tie_word_embeddings=False, sliding_window=6,
                    layer_types=["sliding_attention"] * 5 + ["full_attention"],
                    query_pre_attn_scalar=16, final_logit_softcapping=5.0, bos_token_id=2,
                    eos_token_id=1, hidden_activation="gelu_pytorch_tanh",
                    rope_parameters={
                        "full_attention": dict(rope_type="linear", factor=8.0,
                                               rope_theta=1000000.0),
                        "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                    }),
               gguf.MODEL_ARCH.GEMMA3),
    # (The two below come last, so that the fixtures above keep their seeds.)
    # Llama 3.1-style llama3 RoPE scaling, which llama.cpp's converter (LlamaModel.
    # generate_extra_tensors) stores as per-frequency divisors in rope_freqs.weight: head_dim 8 at
    # base 1e4 has wavelengths 6.3, 63, 628 and 6283, so with original_max_position_embeddings 1024
    # and high_freq_factor 32 one frequency is kept, two blend and one is divided by the factor.
    "llama3": ("LlamaConfig",
               dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False, head_dim=8,
                    max_position_embeddings=8192,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                         low_freq_factor=1.0, high_freq_factor=32.0,
                                         original_max_position_embeddings=1024)),
               gguf.MODEL_ARCH.LLAMA),
    # Phi-3 128K / 3.5 LongRoPE: rope_factors_short / rope_factors_long, the attention factor and
    # the switch point (16, between the prompts of 20 and 13) as Phi3MiniModel writes them.
    "phi3_longrope": ("Phi3Config",
                      dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False,
                           sliding_window=None, head_dim=8, original_max_position_embeddings=16,
                           rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                                short_factor=[1.0, 1.05, 1.15, 1.3],
                                                long_factor=[1.0, 1.8, 5.0, 12.0])),
                      gguf.MODEL_ARCH.PHI3),
}

PROMPT_LENS = [20, 13]
GREEDY_STEPS = 8


def llama_permute(w, n_head):
    """LlamaModel.permute: Hugging Face's q/k rows (RoPE on halves) into Meta's adjacent pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(rope, head_dim):
    """LlamaModel.generate_extra_tensors: llama3 scaling as per-frequency divisors (float32)."""
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(torch.tensor(out, dtype=torch.float32).numpy(), dtype=np.float32)


def write_gguf(fixture, model_arch, cfg, state, path):
    """The conversion: metadata and tensors as llama.cpp's converter writes them."""
    arch = gguf.MODEL_ARCH_NAMES[model_arch]
    w = gguf.GGUFWriter(path, arch)
    n_layers = cfg["num_hidden_layers"]
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg["rope_parameters"]
    full = rope.get("full_attention", rope)
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    w.add_rope_freq_base(full["rope_theta"])
    if "sliding_attention" in rope:
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    extra = {}
    if arch == "phi3":
        # Phi3MiniModel: rope_dims = partial_rotary_factor * hidden // heads, written always.
        w.add_rope_dimension_count(int(1.0 * cfg["hidden_size"]) // cfg["num_attention_heads"])
        orig = rope.get("original_max_position_embeddings", cfg["original_max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        if rope.get("long_factor"):
            # Phi3MiniModel.generate_extra_tensors: the attention factor from the context ratio,
            # both factor sets as F32 tensors.
            scale = cfg["max_position_embeddings"] / orig
            w.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
            extra["rope_factors_long.weight"] = np.asarray(rope["long_factor"], dtype=np.float32)
            extra["rope_factors_short.weight"] = np.asarray(rope["short_factor"], dtype=np.float32)
    if arch == "llama":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        w.add_rope_dimension_count(head_dim)
        if full.get("rope_type") == "llama3":
            extra["rope_freqs.weight"] = llama3_rope_factors(full, head_dim)
    if cfg.get("head_dim") is not None and arch != "phi3":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch == "gemma3":
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    tmap = gguf.get_tensor_name_map(model_arch, n_layers)
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"{arch}: no GGUF name for {name}")
        data = t.detach().float().numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            data = llama_permute(data, cfg["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            data = llama_permute(data, cfg["num_key_value_heads"])
        if arch == "gemma3" and name.endswith("norm.weight"):
            data = data + np.float32(1.0)  # Gemma3Model.norm_shift
        if data.ndim == 1:
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))
        else:
            q = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), T.BF16)
            w.add_tensor(new, q, raw_dtype=T.BF16)
    for name, data in extra.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build(arch, out_dir, seed):
    cls_name, kwargs, model_arch = ARCHS[arch]
    cfg = getattr(transformers, cls_name)(**kwargs)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                          dtype=torch.float32)
    hf_reference.randomize(model, arch, gen)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, attn_implementation="eager", dtype=torch.float32)
        model.eval()
        cfg_json = json.load(open(os.path.join(tmp, "config.json")))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}

    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    logits = {}
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            logits[f"prompt.{i}"] = model(torch.tensor([ids]), use_cache=False).logits[0].float()
        greedy = []
        ids = list(prompts[0])
        for _ in range(GREEDY_STEPS):
            nxt = int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
            greedy.append(nxt)
            ids.append(nxt)
    if len(set(greedy)) < 3:
        return None  # a continuation that repeats one token tests little: the caller tries again
    os.makedirs(out_dir, exist_ok=True)
    write_gguf(arch, model_arch, cfg_json, state, os.path.join(out_dir, "model.gguf"))
    save_file({k: v.contiguous() for k, v in logits.items()},
              os.path.join(out_dir, "logits.safetensors"))
    ref = {
        "arch": arch,
        "config_class": cls_name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "gguf_version": importlib.metadata.version("gguf"),
        "seed": seed,
        "hf_config": cfg_json,
        "prompts": prompts,
        "greedy_prompt": 0,
        "greedy": greedy,
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{arch}: seed {seed}, {sum(v.numel() for v in state.values())} parameters, "
          f"greedy {greedy}", file=sys.stderr)
    return greedy


# Gemma 3 270M (Q4_K_M GGUF, the optional asset of scripts/fetch-assets.sh): token-id prompts whose
# reference transformers computes from the same file (transformers dequantizes it with gguf-py and
# subtracts Gemma's 1 from the norms again), kept small: per position the argmax and the top logits.
# Token ids of whole-word pieces of the file's own vocabulary (<bos> "The capital of France is", and
# <bos> "Once upon a time, in a small village by the sea, there lived an old fisherman who"): the
# tokenizer transformers 5.2 builds from this GGUF splits words into short pieces ("▁c", "ap", ...),
# so its ids would be text the model never saw.
G270_PROMPTS = [
    [2, 818, 5279, 529, 7001, 563],
    [2, 14946, 3324, 496, 990, 236764, 528, 496, 1944, 9744, 684, 506, 5442, 236764, 993, 11742,
     614, 2255, 79539, 1015],
]
G270_TOP = 16
G270_GREEDY = 16


def gemma3_270m(path, out):
    d, name = os.path.split(os.path.abspath(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    ref = {"file": name, "sha256": None, "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "gguf_version": importlib.metadata.version("gguf"),
           "top": G270_TOP, "prompts": []}
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    ref["sha256"] = h.hexdigest()
    with torch.no_grad():
        for ids in G270_PROMPTS:
            logits = model(torch.tensor([ids]), use_cache=False).logits[0].float()
            top = logits.topk(G270_TOP, dim=-1)
            lp = torch.log_softmax(logits.double(), -1)
            nll = -sum(float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1))
            greedy, cur = [], list(ids)
            for _ in range(G270_GREEDY):
                nxt = int(model(torch.tensor([cur]), use_cache=False).logits[0, -1].argmax())
                greedy.append(nxt)
                cur.append(nxt)
            ref["prompts"].append({
                "ids": ids, "nll_sum": nll, "max_abs_logit": float(logits.abs().max()),
                "top_ids": top.indices.tolist(), "top_logits": top.values.tolist(),
                "greedy": greedy})
            print(f"gemma-3-270m: prompt of {len(ids)}: nll {nll:.5f}, greedy {greedy}",
                  file=sys.stderr)
    with open(out, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "fixtures", "gguf"))
    ap.add_argument("--only", nargs="*", help="architectures to write (default: all)")
    ap.add_argument("--gemma3-270m", metavar="GGUF",
                    help="write gemma3-270m.json from this Gemma 3 270M GGUF instead")
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    if args.gemma3_270m:
        gemma3_270m(args.gemma3_270m, os.path.join(args.out, "gemma3-270m.json"))
        return
    torch.set_num_threads(1)
    for i, arch in enumerate(ARCHS):
        if args.only and arch not in args.only:
            continue
        d = os.path.join(args.out, arch)
        shutil.rmtree(d, ignore_errors=True)
        # The first seed (in a fixed order) whose greedy continuation varies.
        for k in range(50):
            if build(arch, d, seed=2000 + i + 100 * k) is not None:
                break
        else:
            raise SystemExit(f"{arch}: no seed gave a varied greedy continuation")


if __name__ == "__main__":
    main()
