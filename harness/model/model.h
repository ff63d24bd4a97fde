#pragma once
// A loaded Llama-family model (Llama, Mistral, Qwen2/2.5, Qwen3, Phi-3, Gemma 3 text): its config,
// its weights on one device in one dtype, and where its tokenizer is. Weights come from a Hugging Face directory, a llama2.c checkpoint, a GGUF file
// (dequantized) or a synthetic preset.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "harness/formats/model_config.h"

namespace kvb {

// Per-layer weights in the layout the engine wants: q/k/v fused into one matrix and gate/up into one,
// so a layer needs two fewer matmuls (per-op overhead dominates small models).
struct LayerWeights {
  at::Tensor attn_norm;  // [dim], fp32
  at::Tensor wqkv;       // [q_dim + 2 * kv_dim, dim], model dtype; rows q | k | v
  at::Tensor bqkv;       // [q_dim + 2 * kv_dim] or undefined (Qwen2-style bias)
  at::Tensor wo;         // [dim, q_dim]
  at::Tensor ffn_norm;   // [dim], fp32
  at::Tensor w13;        // [2 * hidden_dim, dim]; rows gate (w1) | up (w3)
  at::Tensor w2;         // [dim, hidden_dim]
  // Family-specific, undefined where the config does not have them (ModelConfig::qk_norm,
  // post_norms). Every norm weight is the multiplier itself: Gemma's (1 + w) is folded in at load.
  at::Tensor q_norm;          // [head_dim], fp32
  at::Tensor k_norm;          // [head_dim], fp32
  at::Tensor post_attn_norm;  // [dim], fp32: on the attention output before the residual add
  at::Tensor post_ffn_norm;   // [dim], fp32: on the feed-forward output before the residual add
};

struct ModelWeights {
  at::Tensor embedding;   // [vocab, dim]
  at::Tensor final_norm;  // [dim], fp32
  at::Tensor lm_head;     // [vocab, dim]; the same storage as embedding when tied
  std::vector<LayerWeights> layers;
  at::Tensor rope_cos;    // [max_pos, head_dim / 2], fp32 (LongRoPE: [2 * max_pos, ...], below)
  at::Tensor rope_sin;    // [max_pos, head_dim / 2], fp32
  // LongRoPE (ModelConfig::rope_scaling.switches()): rows [0, rope_long_row) of rope_cos/rope_sin
  // are the short factors' table and rows [rope_long_row, 2 * rope_long_row) the long factors',
  // so a token that rotates with the long set reads row position + rope_long_row. 0 otherwise.
  int64_t rope_long_row = 0;
  // Positions the RoPE tables cover.
  int64_t rope_positions() const {
    return rope_long_row > 0 ? rope_long_row : (rope_cos.defined() ? rope_cos.size(0) : 0);
  }
  // The window layers' tables where they rotate with their own base (ModelConfig::rope_local_theta);
  // undefined otherwise (every layer uses rope_cos/rope_sin).
  at::Tensor rope_cos_local;  // [max_pos, head_dim / 2], fp32
  at::Tensor rope_sin_local;  // [max_pos, head_dim / 2], fp32
  const at::Tensor& layer_cos(const ModelConfig& c, int64_t l) const {
    return rope_cos_local.defined() && c.is_window_layer(l) ? rope_cos_local : rope_cos;
  }
  const at::Tensor& layer_sin(const ModelConfig& c, int64_t l) const {
    return rope_sin_local.defined() && c.is_window_layer(l) ? rope_sin_local : rope_sin;
  }
};

struct LoadOptions {
  std::string device = "cpu";   // cpu | cuda | cuda:N
  std::string dtype = "fp32";   // fp32 | bf16 | fp16
  std::string models_dir;       // extra search directory (from --models-dir)
  uint64_t synthetic_seed = 0;  // weights seed for synthetic:<preset>
  int64_t rope_table_len = 0;   // positions to precompute (0: max(config, 8192)); grows on demand
};

// A string computed once, on first use, by whichever thread asks first. A copy starts empty: a
// model is copied to be changed (kvtuner-search clears a copy's sliding windows), so the copy's
// value is computed anew.
class LazyString {
 public:
  LazyString() = default;
  LazyString(const LazyString&) {}
  LazyString& operator=(const LazyString&);
  template <typename F>
  std::string get(F&& compute) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      value_ = compute();
      done_ = true;
    }
    return value_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::string value_;
  mutable bool done_ = false;
};

class Model {
 public:
  ModelConfig config;
  ModelWeights weights;
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
  std::string source;          // the resolved path or synthetic:<preset>
  std::string tokenizer_path;  // "" when the model has none (synthetic)

  // Makes sure the RoPE tables cover positions [0, n). Not thread-safe.
  void ensure_rope_len(int64_t n);
  int64_t weight_bytes() const;

  // What the model computes, as 16 hex digits: a FastHash (harness/common/fast_hash.h) of its
  // config (its name excluded), dtype and every weight tensor's shape and bytes. Caches derived
  // from the model are keyed by it, so a checkpoint replaced in place with other weights of the
  // same size misses them. Computed on the first call (a few tens of milliseconds per 500 MB,
  // CUDA tensors copied to the host) and remembered: the weights must not change after it.
  std::string content_hash() const;
  // The tokenizer file's FastHash ("" when the model has none), computed on the first call.
  std::string tokenizer_hash() const;

 private:
  LazyString content_hash_, tokenizer_hash_;
};

// Loads a model from a spec: a path (HF directory, llama2.c .bin, .gguf, or a directory holding one
// .bin or one .gguf), a name looked up in the models path (--models-dir, $KVBENCH_MODELS, ./models,
// the repository's models/, ../shared/models, the asset cache's models/: harness/common/asset_cache.h), or
// synthetic:<preset>. Throws kvb::Error naming the file (and tensor or key) on any defect.
std::shared_ptr<Model> load_model(const std::string& spec, const LoadOptions& opts = {});

// Where a model spec resolves to, without loading it (for error messages and `inspect`).
std::string resolve_model_path(const std::string& spec, const std::string& models_dir);
std::vector<std::string> model_search_dirs(const std::string& models_dir);
// The tokenizer file load_model would give the model `spec` (Model::tokenizer_path), found without
// reading weights; throws naming the model when it has none.
std::string resolve_tokenizer_path(const std::string& spec, const std::string& models_dir);

// The config load_model would give the model `spec` (shapes, declared context), read without its
// weights: config.json, the llama2.c header, the GGUF metadata or the synthetic preset.
ModelConfig read_model_config(const std::string& spec, const std::string& models_dir);

c10::Device parse_device(const std::string& s);
c10::ScalarType parse_dtype(const std::string& s);
std::string dtype_name(c10::ScalarType t);
int64_t dtype_bytes(c10::ScalarType t);

// Which of LongRoPE's two frequency sets a rotation uses; every other RoPE has one (kShort).
enum class RopeFactors { kShort, kLong };

// RoPE's per-pair angular frequencies for a config (head_dim / 2 of them), with its scaling
// applied: linear, llama3, per-frequency divisors (a GGUF's rope_freqs), or LongRoPE's `set`.
std::vector<double> rope_inv_freq(const ModelConfig& c, RopeFactors set);
// The same for a RoPE whose frequencies do not depend on the sequence length. A LongRoPE model is
// refused (kvb::Error naming it): code that rotates keys outside the engine (re-rotation, splicing,
// calibration) cannot know which set the engine rotated a sequence with.
std::vector<double> rope_inv_freq(const ModelConfig& c);
// RoPE tables for a config: cos/sin of pos * inv_freq[i], times LongRoPE's attention factor (as
// transformers scales them). The three-argument form refuses LongRoPE as rope_inv_freq(c) does.
void compute_rope_tables(const ModelConfig& c, int64_t n_pos, RopeFactors set, at::Tensor* cos,
                         at::Tensor* sin);
void compute_rope_tables(const ModelConfig& c, int64_t n_pos, at::Tensor* cos, at::Tensor* sin);
// Which set a sequence rotates with in an engine call that takes it to `length` tokens: LongRoPE's
// long factors above original_max_position_embeddings (transformers' choice per forward call),
// else the short ones.
RopeFactors rope_factors_for_length(const ModelConfig& c, int64_t length);
// The config the window layers rotate with: rope_local_theta and no scaling (Gemma 3).
ModelConfig local_rope_config(const ModelConfig& c);

}  // namespace kvb
