#include "harness/formats/model_family.h"

#include "harness/common/error.h"

namespace kvb {

namespace {

std::vector<ModelFamily> build_families() {
  std::vector<ModelFamily> out;

  ModelFamily llama;
  llama.hf_type = "llama";
  llama.gguf_arch = "llama";
  // llama.cpp's converter permutes Llama's q/k rows into Meta's adjacent-pair order (as llama2.c
  // has them); every other family keeps Hugging Face's rows and llama.cpp rotates halves.
  llama.gguf_rope_style = RopeStyle::kInterleaved;
  llama.config_class = "LlamaConfig";
  out.push_back(llama);

  // Mistral's GGUF files say "llama" (its own graph there is llama's), so it has no GGUF name.
  ModelFamily mistral;
  mistral.hf_type = "mistral";
  mistral.windows = WindowRule::kAllLayers;
  mistral.config_class = "MistralConfig";
  out.push_back(mistral);

  ModelFamily qwen2;
  qwen2.hf_type = qwen2.gguf_arch = "qwen2";
  qwen2.qkv_bias = true;
  qwen2.windows = WindowRule::kQwen;
  qwen2.config_class = "Qwen2Config";
  out.push_back(qwen2);

  ModelFamily qwen3;
  qwen3.hf_type = qwen3.gguf_arch = "qwen3";
  qwen3.head_dim = 128;
  qwen3.qk_norm = true;
  qwen3.windows = WindowRule::kQwen;
  qwen3.config_class = "Qwen3Config";
  out.push_back(qwen3);

  ModelFamily phi3;
  phi3.hf_type = phi3.gguf_arch = "phi3";
  phi3.rms_norm_eps = 1e-5;
  phi3.original_max_position_embeddings = 4096;
  phi3.fused_projections = true;
  phi3.windows = WindowRule::kAllLayers;
  phi3.config_class = "Phi3Config";
  out.push_back(phi3);

  ModelFamily gemma;
  gemma.hf_type = "gemma3_text";
  gemma.gguf_arch = "gemma3";
  gemma.activation_key = "hidden_activation";
  gemma.activation = "gelu_pytorch_tanh";
  gemma.head_dim = 256;
  gemma.max_position_embeddings = 131072;
  gemma.tie_word_embeddings = true;
  gemma.bos_token_id = 2;
  gemma.eos_token_ids = {1};
  gemma.gguf_bos_token_id = 2;
  gemma.gguf_eos_token_id = 1;
  gemma.qk_norm = true;
  gemma.windows = WindowRule::kPattern;
  gemma.gemma_block = true;
  gemma.config_class = "Gemma3TextConfig";
  out.push_back(gemma);
  return out;
}

std::string names(std::string ModelFamily::*field) {
  std::string s;
  for (const ModelFamily& f : model_families()) {
    if ((f.*field).empty()) continue;
    s += (s.empty() ? "" : ", ") + f.*field;
  }
  return s;
}

}  // namespace

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = build_families();
  return families;
}

const ModelFamily& family_of_hf_type(const std::string& model_type, const std::string& source) {
  for (const ModelFamily& f : model_families())
    if (f.hf_type == model_type) return f;
  KVB_FAIL(source, ": model_type '", model_type, "' is not supported (", names(&ModelFamily::hf_type),
           ")");
}

const ModelFamily& family_of_gguf_arch(const std::string& arch, const std::string& source) {
  for (const ModelFamily& f : model_families())
    if (!f.gguf_arch.empty() && f.gguf_arch == arch) return f;
  KVB_FAIL(source, ": general.architecture '", arch, "' is not supported (",
           names(&ModelFamily::gguf_arch), ")");
}

const ModelFamily& family_of(const ModelConfig& c) { return family_of_hf_type(c.arch, c.name); }

}  // namespace kvb
