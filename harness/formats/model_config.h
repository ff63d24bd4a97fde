#pragma once
// ModelConfig: the architecture of a Llama-family decoder, whatever file it came from (HF config.json,
// a llama2.c header, GGUF metadata, a synthetic preset). Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvb {

// How q/k rows pair up under RoPE. llama2.c / Meta weights rotate adjacent pairs (x[2i], x[2i+1]);
// Hugging Face Llama rotates halves (x[i], x[i + head_dim/2]) because its q/k rows are permuted.
enum class RopeStyle { kInterleaved, kHalf };

struct RopeScaling {
  std::string type = "none";  // none | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

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

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t group_size() const { return n_heads / n_kv_heads; }
  // Uncompressed KV bytes per token (K and V, every layer) at `bytes_per_elem`.
  int64_t kv_bytes_per_token(int64_t bytes_per_elem) const {
    return 2 * n_layers * kv_dim() * bytes_per_elem;
  }
  int64_t parameter_count() const;
  // Throws kvb::Error naming `source` when a field is out of range or inconsistent.
  void validate(const std::string& source) const;
  nlohmann::json to_json() const;
};

// Parses a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM).
// Throws kvb::Error naming the file and the key on any missing, mistyped or unsupported field.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);
ModelConfig load_hf_config(const std::string& path);

class GgufFile;
// The config of a GGUF model from its metadata (general.architecture "llama": llama.* keys) and its
// tensor index (tied embeddings when output.weight is absent). Refuses what the engine does not
// implement (another architecture, partial rotary, YaRN, llama3 frequency factors) naming the key.
ModelConfig gguf_model_config(const GgufFile& f);

const char* rope_style_name(RopeStyle s);

}  // namespace kvb
