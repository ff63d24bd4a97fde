#include "harness/model/synthetic_presets.h"

#include "harness/common/error.h"
#include "harness/common/strings.h"

namespace kvb {

namespace {

struct Preset {
  const char* name;
  int64_t dim, hidden, layers, heads, kv_heads, vocab, max_seq;
  double theta;
  bool llama3_scaling, qkv_bias, tied;
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
};

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
    c.head_dim = p.dim / p.heads;
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
    c.validate(c.name);
    return c;
  }
  KVB_FAIL("unknown synthetic preset '", preset, "'",
           did_you_mean(preset, synthetic_preset_names()), "; known: ",
           join(synthetic_preset_names(), ", "));
}

}  // namespace kvb
