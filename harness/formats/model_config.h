#pragma once
// ModelConfig: the architecture of a Llama-family decoder (Llama 1-3, Mistral, Qwen2/2.5, Qwen3, Phi-3,
// Gemma 3 text), whatever file it came from (HF config.json, a llama2.c header, GGUF metadata, a
// synthetic preset). The families differ in a handful of per-model and per-layer fields here, not in
// forks of the forward. Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvb {

// How q/k rows pair up under RoPE. llama2.c / Meta weights rotate adjacent pairs (x[2i], x[2i+1]);
// Hugging Face Llama rotates halves (x[i], x[i + head_dim/2]) because its q/k rows are permuted.
enum class RopeStyle { kInterleaved, kHalf };

struct RopeScaling {
  // none | linear | llama3 | longrope | factors. `factors` is a GGUF's rope_freqs tensor:
  // llama.cpp's form of Llama 3.1's scaling, per-frequency divisors instead of the parameters.
  std::string type = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3; longrope: where it switches
  // Divisors of the base inverse frequencies, [head_dim / 2] each: longrope's short_factor (or a
  // GGUF's rope_freqs), and longrope's long_factor, which a sequence rotates with in an engine call
  // that takes it past original_max_position_embeddings tokens (transformers picks per forward
  // call).
  std::vector<double> factors;
  std::vector<double> long_factors;
  double attention_factor = 1.0;  // longrope: cos and sin multiplied by it (in both regimes)

  // Whether the frequencies depend on the sequence's length (longrope): rope_inv_freq then needs
  // to be told which set.
  bool switches() const { return type == "longrope"; }
};

// The feed-forward's gate activation: SiLU (SwiGLU) or GELU with the tanh approximation (GeGLU,
// Gemma's "gelu_pytorch_tanh").
enum class Activation { kSilu, kGeluTanh };

struct ModelConfig {
  std::string name;           // display name: directory name, file stem or synthetic:<preset>
  std::string format;         // hf | llama2c | gguf | synthetic
  int64_t dim = 0;            // hidden size
  int64_t hidden_dim = 0;     // FFN intermediate size
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;    // trained / declared context
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::kHalf;
  double norm_eps = 1e-5;
  bool tied_embeddings = false;
  bool qkv_bias = false;      // Qwen2-style q/k/v projection bias
  int64_t bos_id = 1;
  std::vector<int64_t> eos_ids = {2};
  // Whether a text gets bos_id in front (GGUF tokenizer.ggml.add_bos_token; SmolLM2 says no).
  bool add_bos = true;
  std::string weights_dtype = "F32";  // dtype the weights are stored in (GGUF: the matrices' type)

  // The family-specific fields. Their defaults are the Llama computation, and to_json writes them
  // only when they differ, so the configs (and run hashes) of Llama-family models stay as they were.
  std::string arch = "llama";  // llama | mistral | qwen2 | qwen3 | phi3 | gemma3_text
  Activation activation = Activation::kSilu;
  // Per-head RMSNorm of q and k (weights [head_dim]) before RoPE (Qwen3, Gemma 3).
  bool qk_norm = false;
  // RMSNorm of each sublayer's output before it joins the residual stream (Gemma 3's
  // post_attention_layernorm and post_feedforward_layernorm).
  bool post_norms = false;
  double embed_scale = 1.0;          // the embedding rows are multiplied by it (Gemma: sqrt(dim))
  double query_pre_attn_scalar = 0;  // > 0: attention scale 1/sqrt(it) instead of 1/sqrt(head_dim)
  double final_logit_softcap = 0;    // > 0: logits = cap * tanh(logits / cap)
  // Sliding-window attention per layer: empty (every layer global), or [n_layers] with 0 for a
  // global layer and W for a layer whose query at position p sees the keys at p - W + 1 .. p.
  std::vector<int64_t> layer_windows;
  // > 0: the window layers rotate with this base and no scaling, the global layers with rope_theta
  // and rope_scaling (Gemma 3's rope_local_base_freq). 0: every layer uses rope_theta.
  double rope_local_theta = 0;
  // A KV store's config for some of a model's layers: which model layer each of these n_layers is
  // (empty: all of them, in order). A model with window layers gets its method's store built for its
  // global layers only (renumbered 0..n-1; WindowedKvCache keeps the window layers), so a budget or a
  // per-layer plan applies to the global layers, as kvpress does for Gemma 3. Not part of to_json.
  std::vector<int64_t> model_layers;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t group_size() const { return n_heads / n_kv_heads; }
  // Uncompressed KV bytes per token (K and V, every layer) at `bytes_per_elem`.
  int64_t kv_bytes_per_token(int64_t bytes_per_elem) const {
    return 2 * n_layers * kv_dim() * bytes_per_elem;
  }
  bool is_window_layer(int64_t layer) const {
    return !layer_windows.empty() && layer_windows[layer] > 0;
  }
  int64_t n_window_layers() const;
  // Uncompressed KV bytes of one sequence of `tokens` tokens: a window layer holds at most
  // window - 1 past tokens between steps (the query's own row comes with the step), so this is the
  // footprint of the full cache of a model with window layers (compression ratios are against it).
  int64_t full_kv_bytes(int64_t tokens, int64_t bytes_per_elem) const;
  // The attention scale: 1/sqrt(query_pre_attn_scalar) where set, else 1/sqrt(head_dim).
  double attn_scale() const;
  int64_t parameter_count() const;
  // Throws kvb::Error naming `source` when a field is out of range or inconsistent.
  void validate(const std::string& source) const;
  nlohmann::json to_json() const;
};

// Parses a Hugging Face config.json (model_type llama, mistral, qwen2, qwen3, phi3, gemma3_text),
// in either layout: transformers 4's top-level rope_theta / rope_scaling (and Gemma 3's
// rope_local_base_freq) or transformers 5's rope_parameters. RoPE types: default, linear, llama3,
// longrope (and its first name, su). Throws kvb::Error naming the file and
// the key on any missing, mistyped or unsupported field, and on any field that changes the
// computation and is not implemented (a RoPE type, a window, an attention variant): never a silent
// fallback to something else.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);
ModelConfig load_hf_config(const std::string& path);

class GgufFile;
// The config of a GGUF model from its metadata (general.architecture llama, qwen2, qwen3, phi3 or
// gemma3: <arch>.* keys, read by llama.cpp's rules for that architecture) and its tensor index
// (tied embeddings when output.weight is absent, q/k biases where present, RoPE frequency factors
// from rope_freqs (llama) or rope_factors_short/long (phi3, LongRoPE)). Refuses what the engine
// does not implement (another architecture, partial rotary, YaRN, factor tensors a graph does not
// read, a window or softcapping where llama.cpp has none) naming the file and the key or tensor.
ModelConfig gguf_model_config(const GgufFile& f);

const char* rope_style_name(RopeStyle s);
const char* activation_name(Activation a);

}  // namespace kvb
