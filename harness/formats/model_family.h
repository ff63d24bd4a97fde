#pragma once
// A model family as kvbench reads it: its names (config.json's model_type, GGUF's
// general.architecture), the defaults its configuration class fills in where a file leaves a field
// out, and the switches that select the engine's per-family computation. Both config readers
// (parse_hf_config, gguf_model_config) and the weight loaders consult the one descriptor, so a
// family that differs from another only in config is one entry in model_family.cpp plus its fixture.
// Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include "harness/formats/model_config.h"

namespace kvb {

// Where a family's layers slide, as its configuration class decides.
enum class WindowRule {
  kNone,       // no window: one in the config is refused (transformers would ignore it)
  kAllLayers,  // sliding_window, when set, on every layer (Mistral, Phi-3)
  kQwen,       // only with use_sliding_window, from max_window_layers on (Qwen2/3)
  kPattern,    // every layer but each sliding_window_pattern-th (Gemma 3)
};

struct ModelFamily {
  std::string hf_type;    // config.json's model_type; ModelConfig::arch
  std::string gguf_arch;  // general.architecture of its GGUF files; "" when it has none of its own
  std::string config_class;  // transformers' configuration class, whose defaults are below

  // config.json: the configuration class's values for fields the file omits.
  std::string activation_key = "hidden_act";
  std::string activation = "silu";
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 1;
  std::vector<int64_t> eos_token_ids = {2};
  // Phi3Config always has a top-level original_max_position_embeddings (LongRoPE's switch point).
  int64_t original_max_position_embeddings = -1;

  // GGUF: llama.cpp's defaults, and how its converter stored the q/k rows.
  int64_t gguf_bos_token_id = 1;
  int64_t gguf_eos_token_id = 2;
  RopeStyle gguf_rope_style = RopeStyle::kHalf;

  // The computation.
  bool qkv_bias = false;  // q/k/v biases always (Qwen2); elsewhere attention_bias is refused
  bool qk_norm = false;   // RMSNorm on each head's q and k (Qwen3, Gemma 3)
  bool fused_projections = false;  // qkv_proj and gate_up_proj stored fused (Phi-3)
  WindowRule windows = WindowRule::kNone;
  // Gemma 3's block: GeGLU, RMSNorm by (1 + w), post-sublayer norms, embeddings scaled by
  // sqrt(hidden), a query scale of its own, logit softcapping, a RoPE per attention type.
  bool gemma_block = false;
};

// The families the engine computes, in the order errors list them.
const std::vector<ModelFamily>& model_families();
// The family of a config.json model_type / a GGUF general.architecture; throws kvb::Error naming
// `source` and the supported names when there is none.
const ModelFamily& family_of_hf_type(const std::string& model_type, const std::string& source);
const ModelFamily& family_of_gguf_arch(const std::string& arch, const std::string& source);
// The family of a parsed config (ModelConfig::arch): a llama2.c or synthetic model is llama's.
const ModelFamily& family_of(const ModelConfig& c);

}  // namespace kvb
