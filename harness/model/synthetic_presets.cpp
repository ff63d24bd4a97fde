#include "harness/model/synthetic_presets.h"

#include <cmath>

#include "harness/common/error.h"
#include "harness/common/strings.h"

namespace kvb {

namespace {

// Families whose computation differs from Llama's beyond the shapes (apply_family sets the fields).
enum class Family { kLlama, kQwen2, kQwen3, kPhi3, kGemma3 };

struct Preset {
  const char* name;
  int64_t dim, hidden, layers, heads, kv_heads, vocab, max_seq;
  double theta;
  bool llama3_scaling, qkv_bias, tied;
  Family family = Family::kLlama;
  int64_t head_dim = 0;  // 0: dim / heads
};

// Shapes from each model's published config.json.
constexpr Preset kPresets[] = {
    {"llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0, false, false, false},
    {"llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0, true, false, false},
    // Llama-3.1-8B: the same shapes with a 128K context (long serving traces need it).
    {"llama-3.1-8b", 4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, true, false, false},
    {"mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, 1000000.0, false, false, false},
    {"qwen2-7b", 3584, 18944, 28, 28, 4, 152064, 32768, 1000000.0, false, true, false},
    // Small shapes for CPU tests: the stories260K geometry, and a 1B-class and a tiny-but-head_dim-64.
    {"tiny", 64, 172, 5, 8, 4, 512, 512, 10000.0, false, false, true},
    {"small", 512, 1376, 8, 8, 4, 4096, 4096, 10000.0, false, false, true},
    {"llama-3.2-1b", 2048, 8192, 16, 32, 8, 128256, 131072, 500000.0, true, false, true},
    // Two layers of llama-3-8b: per-layer KV and attention cost of the real model, fits a CPU box.
    {"llama-3-8b-2l", 4096, 14336, 2, 32, 8, 128256, 8192, 500000.0, true, false, false},
    // The families papers evaluate on (kvpress's leaderboard: Qwen3-8B, Llama-3.1-8B above).
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 40960, 1000000.0, false, false, false,
     Family::kQwen3, 128},
    {"qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 32768, 1000000.0, false, true, false,
     Family::kQwen2},
    // Gemma 3's text decoders (the 4B/12B configs' text_config): 5 sliding layers of 1,024 per
    // global layer, head_dim 256, query_pre_attn_scalar 256, linear RoPE x8 on the global layers.
    {"gemma-3-4b", 2560, 10240, 34, 8, 4, 262208, 131072, 1000000.0, false, false, true,
     Family::kGemma3, 256},
    {"gemma-3-12b", 3840, 15360, 48, 16, 8, 262208, 131072, 1000000.0, false, false, true,
     Family::kGemma3, 256},
    // Phi-3-mini-4k: multi-head (32 KV heads), a 2,047-token window on every layer.
    {"phi-3-mini", 3072, 8192, 32, 32, 32, 32064, 4096, 10000.0, false, false, false,
     Family::kPhi3},
    // Fewer layers of the real shapes, for CPU perf runs: two of Qwen3-8B's, and one period of
    // Gemma-3-4B's (5 sliding, 1 global).
    {"qwen3-8b-2l", 4096, 12288, 2, 32, 8, 151936, 40960, 1000000.0, false, false, false,
     Family::kQwen3, 128},
    {"gemma-3-4b-6l", 2560, 10240, 6, 8, 4, 262208, 131072, 1000000.0, false, false, true,
     Family::kGemma3, 256},
};

// The fields each family's published config.json implies beyond the table's shapes.
void apply_family(const Preset& p, ModelConfig& c) {
  switch (p.family) {
    case Family::kLlama:
      return;
    case Family::kQwen2:
      c.arch = "qwen2";
      c.norm_eps = 1e-6;
      return;
    case Family::kQwen3:
      c.arch = "qwen3";
      c.qk_norm = true;
      c.norm_eps = 1e-6;
      return;
    case Family::kPhi3:
      c.arch = "phi3";
      c.layer_windows.assign(c.n_layers, 2047);
      return;
    case Family::kGemma3:
      c.arch = "gemma3_text";
      c.activation = Activation::kGeluTanh;
      c.qk_norm = true;
      c.post_norms = true;
      c.norm_eps = 1e-6;
      c.embed_scale = std::sqrt(static_cast<double>(c.dim));
      c.query_pre_attn_scalar = 256;
      c.rope_local_theta = 10000.0;
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = 8.0;
      for (int64_t l = 0; l < c.n_layers; ++l) c.layer_windows.push_back((l + 1) % 6 ? 1024 : 0);
      c.bos_id = 2;
      c.eos_ids = {1};
      return;
  }
}

}  // namespace

std::vector<std::string> synthetic_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.push_back(p.name);
  return out;
}

ModelConfig synthetic_preset(const std::string& preset) {
  for (const auto& p : kPresets) {
    if (preset != p.name) continue;
    ModelConfig c;
    c.name = "synthetic:" + preset;
    c.format = "synthetic";
    c.dim = p.dim;
    c.hidden_dim = p.hidden;
    c.n_layers = p.layers;
    c.n_heads = p.heads;
    c.n_kv_heads = p.kv_heads;
    c.head_dim = p.head_dim > 0 ? p.head_dim : p.dim / p.heads;
    c.vocab_size = p.vocab;
    c.max_seq_len = p.max_seq;
    c.rope_theta = p.theta;
    if (p.llama3_scaling) {
      c.rope_scaling.type = "llama3";
      c.rope_scaling.factor = 8.0;
      c.rope_scaling.low_freq_factor = 1.0;
      c.rope_scaling.high_freq_factor = 4.0;
      c.rope_scaling.original_max_position_embeddings = 8192;
    }
    c.rope_style = RopeStyle::kHalf;
    c.norm_eps = 1e-5;
    c.tied_embeddings = p.tied;
    c.qkv_bias = p.qkv_bias;
    c.bos_id = 1;
    c.eos_ids = {2};
    apply_family(p, c);
    c.validate(c.name);
    return c;
  }
  KVB_FAIL("unknown synthetic preset '", preset, "'",
           did_you_mean(preset, synthetic_preset_names()), "; known: ",
           join(synthetic_preset_names(), ", ").c_str());
}

}  // namespace kvb
