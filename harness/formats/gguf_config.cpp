// gguf_model_config (harness/formats/model_config.h): a GGUF model's config from its metadata and
// tensor index, read by llama.cpp's rules for its architecture (harness/formats/model_family.h).

#include <algorithm>
#include <cmath>
#include <map>

#include "harness/common/error.h"
#include "harness/formats/gguf.h"
#include "harness/formats/model_config.h"
#include "harness/formats/model_family.h"

namespace kvb {

namespace {

// Sizes, context, norm and RoPE base; what the engine's single head size and causal attention
// require of them.
void read_gguf_shapes(const GgufFile& f, const ModelFamily& fam, ModelConfig* c) {
  const std::string& src = f.path();
  const std::string p = fam.gguf_arch + ".";
  c->dim = f.get_int(p + "embedding_length");
  c->hidden_dim = f.get_int(p + "feed_forward_length");
  c->n_layers = f.get_int(p + "block_count");
  c->n_heads = f.get_int(p + "attention.head_count");
  c->n_kv_heads = f.get_int_or(p + "attention.head_count_kv", c->n_heads);
  KVB_CHECK(c->n_heads > 0, src, ": '", p, "attention.head_count' must be positive (got ", c->n_heads, ")");
  c->head_dim = f.get_int_or(p + "attention.key_length", c->dim / c->n_heads);
  const int64_t v_len = f.get_int_or(p + "attention.value_length", c->head_dim);
  KVB_CHECK(v_len == c->head_dim, src, ": '", p, "attention.value_length' (", v_len,
            ") differs from the key length (", c->head_dim, "); the engine needs one head size");
  const int64_t rot = f.get_int_or(p + "rope.dimension_count", c->head_dim);
  KVB_CHECK(rot == c->head_dim, src, ": '", p, "rope.dimension_count' is ", rot, " but the head size is ",
            c->head_dim, ": partial rotary embeddings are not supported");
  c->max_seq_len = f.get_int(p + "context_length");
  c->rope_theta = f.get_float_or(p + "rope.freq_base", 10000.0);
  c->norm_eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  c->rope_style = fam.gguf_rope_style;
  KVB_CHECK(f.get_bool_or(p + "attention.causal", true), src, ": '", p,
            "attention.causal' is false: bidirectional attention is not supported");
  KVB_CHECK(f.get_int_or(p + "expert_count", 0) == 0, src, ": '", p,
            "expert_count' is set: mixture-of-experts layers are not supported");
}

// rope.scaling.type: linear (or an older conversion's lone linear factor); nothing else.
void read_gguf_rope_scaling(const GgufFile& f, const ModelFamily& fam, ModelConfig* c) {
  const std::string& src = f.path();
  const std::string p = fam.gguf_arch + ".";
  const std::string scaling = f.get_string_or(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    c->rope_scaling.type = "linear";
    c->rope_scaling.factor = f.get_float(p + "rope.scaling.factor");
    KVB_CHECK(c->rope_scaling.factor > 0, src, ": '", p, "rope.scaling.factor' must be positive");
  } else if (scaling == "none") {
    const double legacy = f.get_float_or(p + "rope.scale_linear", 1.0);
    if (legacy != 1.0) {
      KVB_CHECK(legacy > 0, src, ": '", p, "rope.scale_linear' must be positive");
      c->rope_scaling.type = "linear";
      c->rope_scaling.factor = legacy;
    }
  } else {
    KVB_FAIL(src, ": '", p, "rope.scaling.type' is '", scaling, "', which is not supported (none, linear)");
  }
}

// A per-frequency divisor tensor of head_dim / 2 floats.
std::vector<double> rope_factor_tensor(const GgufFile& f, const ModelConfig& c, const char* name) {
  const GgufTensor& t = f.tensor(name);
  KVB_CHECK(t.dims.size() == 1 && t.numel() == c.head_dim / 2, f.path(), ": tensor '", name, "' has ",
            t.numel(), " entries, but RoPE rotates head_dim / 2 = ", c.head_dim / 2, " pairs");
  std::vector<float> v(static_cast<size_t>(t.numel()));
  gguf_dequantize(t, v.data());
  return std::vector<double>(v.begin(), v.end());
}

// Per-frequency divisors stored as tensors. llama.cpp's llama graph reads rope_freqs (the
// converter's form of Llama 3.1's llama3 scaling), its phi3 graph rope_factors_short /
// rope_factors_long (LongRoPE: Phi-3 128K, Phi-3.5), no other graph either; load_gguf takes them
// as read.
void read_gguf_rope_factors(const GgufFile& f, const ModelFamily& fam, ModelConfig* c) {
  const std::string& src = f.path();
  const std::string& arch = fam.gguf_arch;
  const std::string p = arch + ".";
  for (const char* t : {"blk.0.rope_freqs.weight", "blk.0.rope_factors_long.weight",
                        "blk.0.rope_factors_short.weight"}) {
    KVB_CHECK(!f.has_tensor(t), src, ": tensor '", t,
              "': per-layer RoPE frequency factors are not supported (llama.cpp reads one set)");
  }
  if (f.has_tensor("rope_freqs.weight")) {
    KVB_CHECK(arch == "llama", src, ": tensor 'rope_freqs.weight' on ", arch, ": llama.cpp's ", arch,
              " graph does not read it");
    KVB_CHECK(c->rope_scaling.type == "none", src, ": tensor 'rope_freqs.weight' together with '", p,
              "rope.scaling.type' ", c->rope_scaling.type, " is not supported");
    c->rope_scaling.type = "factors";
    c->rope_scaling.factors = rope_factor_tensor(f, *c, "rope_freqs.weight");
  }
  const bool has_long = f.has_tensor("rope_factors_long.weight");
  if (!has_long && !f.has_tensor("rope_factors_short.weight")) return;
  KVB_CHECK(arch == "phi3", src, ": tensors 'rope_factors_long/short.weight' on ", arch, ": llama.cpp's ",
            arch, " graph does not read them");
  KVB_CHECK(has_long && f.has_tensor("rope_factors_short.weight"), src, ": tensor '",
            has_long ? "rope_factors_short.weight" : "rope_factors_long.weight",
            "' is missing: LongRoPE needs both factor sets");
  KVB_CHECK(c->rope_scaling.type == "none", src, ": LongRoPE factors together with '", p,
            "rope.scaling.type' ", c->rope_scaling.type, " are not supported");
  // The converter writes the switch point and the attention factor it computed from the
  // config.json (convert_hf_to_gguf.py, Phi3MiniModel); llama.cpp's defaults where absent: the
  // training context (so the long factors never apply) and 1. Which set a sequence rotates with
  // follows transformers (per engine call, by the length it reaches), not llama.cpp's choice by the
  // context size it was started with, so the GGUF of a model computes what its Hugging Face
  // directory does.
  c->rope_scaling.type = "longrope";
  c->rope_scaling.factors = rope_factor_tensor(f, *c, "rope_factors_short.weight");
  c->rope_scaling.long_factors = rope_factor_tensor(f, *c, "rope_factors_long.weight");
  c->rope_scaling.original_max_position_embeddings =
      f.get_int_or(p + "rope.scaling.original_context_length", c->max_seq_len);
  c->rope_scaling.attention_factor = f.get_float_or(p + "rope.scaling.attn_factor", 1.0);
}

// Gemma 3's block; `window` its sliding window (0: none), applied on the layers its pattern names.
void read_gguf_gemma_block(const GgufFile& f, const ModelFamily& fam, int64_t window, ModelConfig* c) {
  const std::string& src = f.path();
  const std::string p = fam.gguf_arch + ".";
  c->activation = Activation::kGeluTanh;
  c->post_norms = true;
  c->embed_scale = std::sqrt(static_cast<double>(c->dim));
  // The file has no query_pre_attn_scalar: llama.cpp scales queries by 1/sqrt(head_dim), except for
  // the 62-layer 27B, whose scalar is hidden / heads (its config's 168). Mirror that rule.
  c->query_pre_attn_scalar =
      c->n_layers == 62 ? static_cast<double>(c->dim / c->n_heads) : static_cast<double>(c->head_dim);
  c->final_logit_softcap = f.get_float_or(p + "final_logit_softcapping", 0.0);
  KVB_CHECK(c->final_logit_softcap >= 0, src, ": '", p, "final_logit_softcapping' must not be negative");
  const double attn_cap = f.get_float_or(p + "attn_logit_softcapping", 0.0);
  KVB_CHECK(attn_cap == 0, src, ": '", p, "attn_logit_softcapping' is ", attn_cap,
            ": softcapping of the attention scores is not supported");
  if (window == 0) return;
  // sliding_window_pattern: one flag per layer, or a period n whose last layer is global
  // (llama_hparams::set_swa_pattern; 6 when absent, 0 = every layer slides).
  std::vector<bool> slides(static_cast<size_t>(c->n_layers));
  const std::string pat_key = p + "attention.sliding_window_pattern";
  if (f.has(pat_key) && f.get(pat_key).kind == GgufValue::Kind::kArray) {
    const std::vector<int64_t>& flags = f.get_ints(pat_key);
    KVB_CHECK(static_cast<int64_t>(flags.size()) == c->n_layers, src, ": '", pat_key, "' has ",
              flags.size(), " entries for ", c->n_layers, " layers");
    for (int64_t l = 0; l < c->n_layers; ++l) slides[l] = flags[l] != 0;
  } else {
    const int64_t n = f.get_int_or(pat_key, 6);
    KVB_CHECK(n >= 0, src, ": '", pat_key, "' must not be negative (got ", n, ")");
    for (int64_t l = 0; l < c->n_layers; ++l) slides[l] = n == 0 || l % n < n - 1;
  }
  for (int64_t l = 0; l < c->n_layers; ++l) c->layer_windows.push_back(slides[l] ? window : 0);
  if (std::none_of(slides.begin(), slides.end(), [](bool s) { return s; })) c->layer_windows.clear();
  // The window layers rotate with their own base and no scaling (llama.cpp's defaults: 10000,
  // scale 1).
  c->rope_local_theta = f.get_float_or(p + "rope.freq_base_swa", 10000.0);
  KVB_CHECK(c->rope_local_theta > 0, src, ": '", p, "rope.freq_base_swa' must be positive");
}

// Q/K norms, the family's block and its sliding windows. llama.cpp's qwen2, qwen3 and llama graphs
// have no window, whatever the key says; Gemma 3 slides on the layers its pattern names; Phi-3 on
// every layer.
void read_gguf_attention(const GgufFile& f, const ModelFamily& fam, ModelConfig* c) {
  const std::string& src = f.path();
  const std::string& arch = fam.gguf_arch;
  const std::string p = arch + ".";
  if (fam.qk_norm) {
    // llama.cpp's qwen3 and gemma3 graphs require them; kvbench does too, so a file without them is
    // refused when the tensor is loaded rather than run as another model.
    c->qk_norm = true;
  } else {
    KVB_CHECK(!f.has_tensor("blk.0.attn_q_norm.weight"), src, ": tensor 'blk.0.attn_q_norm.weight': llama.cpp's ",
              arch, " graph has no q/k norms, so this file is not the model it says it is");
  }
  const std::string window_key = p + "attention.sliding_window";
  const int64_t window = f.get_int_or(window_key, 0);
  KVB_CHECK(window >= 0, src, ": '", window_key, "' must not be negative (got ", window, ")");
  if (fam.gemma_block) {
    read_gguf_gemma_block(f, fam, window, c);
  } else if (fam.windows == WindowRule::kAllLayers) {
    // llama.cpp's phi3 loader switches the window off (it warns and sets n_swa 0); transformers and
    // kvbench's config.json path apply it on every layer, and the weights were trained so, so the
    // GGUF of a Phi-3 model gives the same computation as its Hugging Face directory.
    if (window > 0) c->layer_windows.assign(c->n_layers, window);
  } else {
    KVB_CHECK(window == 0, src, ": '", window_key, "' is ", window, ": llama.cpp's ", arch,
              " graph has no sliding window, so which computation is meant is unclear");
  }
  for (const char* k : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    KVB_CHECK(fam.gemma_block || !f.has(p + k), src, ": '", p, k, "' is set: softcapping is not supported on ",
              arch);
  }
}

// The vocabulary size (the token list, else the key, else the embedding's rows), the head and the
// biases the graph reads.
void read_gguf_vocab_and_biases(const GgufFile& f, const ModelFamily& fam, ModelConfig* c) {
  const std::string& src = f.path();
  const std::string p = fam.gguf_arch + ".";
  if (f.has("tokenizer.ggml.tokens")) {
    c->vocab_size = static_cast<int64_t>(f.get_strings("tokenizer.ggml.tokens").size());
    if (f.has(p + "vocab_size")) {
      const int64_t v = f.get_int(p + "vocab_size");
      KVB_CHECK(v == c->vocab_size, src, ": '", p, "vocab_size' (", v, ") differs from the token list (",
                c->vocab_size, " tokens)");
    }
  } else if (f.has(p + "vocab_size")) {
    c->vocab_size = f.get_int(p + "vocab_size");
  } else {
    const GgufTensor& e = f.tensor("token_embd.weight");
    KVB_CHECK(e.dims.size() == 2, src, ": tensor 'token_embd.weight' must be a matrix");
    c->vocab_size = e.dims[1];
  }
  c->tied_embeddings = !f.has_tensor("output.weight");
  // llama.cpp loads q/k/v biases for any of these architectures where the file has them (split or
  // fused with attn_qkv), nothing else.
  c->qkv_bias = f.has_tensor("blk.0.attn_q.bias") || f.has_tensor("blk.0.attn_qkv.bias");
  KVB_CHECK(!f.has_tensor("output.bias"), src,
            ": tensor 'output.bias': a bias on the output projection is not supported");
  for (const char* t : {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}) {
    KVB_CHECK(!f.has_tensor(std::string("blk.0.") + t), src, ": tensor 'blk.0.", t,
              "': biases outside q/k/v are not supported");
  }
}

// Special tokens, llama.cpp's BOS rule and the matrices' storage type (the most common among the
// 2-D tensors).
void read_gguf_tokens_and_dtype(const GgufFile& f, const ModelFamily& fam, ModelConfig* c) {
  c->bos_id = f.get_int_or("tokenizer.ggml.bos_token_id", fam.gguf_bos_token_id);
  c->eos_ids = {f.get_int_or("tokenizer.ggml.eos_token_id", fam.gguf_eos_token_id)};
  if (f.has("tokenizer.ggml.eot_token_id")) {
    const int64_t eot = f.get_int("tokenizer.ggml.eot_token_id");
    if (eot != c->eos_ids[0]) c->eos_ids.push_back(eot);
  }
  c->add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", true);
  std::map<std::string, int> types;
  for (const GgufTensor& t : f.tensors())
    if (t.dims.size() == 2) ++types[ggml_type_name(t.type)];
  int best = 0;
  for (const auto& [name, n] : types)
    if (n > best) {
      best = n;
      c->weights_dtype = name;
    }
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
  // The architectures whose llama.cpp graphs are the engine's forward (src/models/<arch>.cpp): each
  // is mapped key by key here, and checked against transformers on converted fixtures.
  const ModelFamily& fam = family_of_gguf_arch(f.get_string("general.architecture"), f.path());
  ModelConfig c;
  c.format = "gguf";
  c.arch = fam.hf_type;  // ModelConfig names the families by their Hugging Face model_type
  read_gguf_shapes(f, fam, &c);
  read_gguf_rope_scaling(f, fam, &c);
  read_gguf_rope_factors(f, fam, &c);
  read_gguf_attention(f, fam, &c);
  read_gguf_vocab_and_biases(f, fam, &c);
  read_gguf_tokens_and_dtype(f, fam, &c);
  c.validate(f.path());
  return c;
}

}  // namespace kvb
