#include "harness/formats/model_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "harness/common/error.h"
#include "harness/common/limits.h"

namespace kvb {

const char* rope_style_name(RopeStyle s) {
  switch (s) {
    case RopeStyle::kInterleaved:
      return "interleaved";
    case RopeStyle::kHalf:
      return "half";
  }
  return "?";
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGeluTanh:
      return "gelu_pytorch_tanh";
  }
  return "?";
}

int64_t ModelConfig::n_window_layers() const {
  int64_t n = 0;
  for (int64_t w : layer_windows) n += w > 0 ? 1 : 0;
  return n;
}

int64_t ModelConfig::full_kv_bytes(int64_t tokens, int64_t bytes_per_elem) const {
  int64_t rows = 0;
  for (int64_t l = 0; l < n_layers; ++l)
    rows += is_window_layer(l) ? std::min(tokens, layer_windows[l] - 1) : tokens;
  return 2 * rows * kv_dim() * bytes_per_elem;
}

double ModelConfig::attn_scale() const {
  return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                                   : static_cast<double>(head_dim));
}

int64_t ModelConfig::parameter_count() const {
  int64_t per_layer = 2 * dim                                   // norms
                      + dim * (q_dim() + 2 * kv_dim())          // q, k, v
                      + q_dim() * dim                           // o
                      + 3 * dim * hidden_dim;                   // gate, up, down
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (qk_norm) per_layer += 2 * head_dim;
  if (post_norms) per_layer += 2 * dim;
  int64_t total = n_layers * per_layer + vocab_size * dim + dim;
  if (!tied_embeddings) total += vocab_size * dim;
  return total;
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* key) {
    KVB_CHECK(v > 0, source, ": '", key, "' must be positive (got ", v, ")");
  };
  positive(dim, "hidden_size");
  positive(hidden_dim, "intermediate_size");
  positive(n_layers, "num_hidden_layers");
  positive(n_heads, "num_attention_heads");
  positive(n_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_seq_len, "max_position_embeddings");
  // Each size bounded far above any released model, and their products through the parameter
  // count (evaluated in double first), so that q_dim(), kv_bytes_per_token() and parameter_count()
  // cannot overflow int64 on a hostile config.
  auto at_most = [&](int64_t v, int64_t max, const char* key) {
    KVB_CHECK(v <= max, source, ": '", key, "' ", v, " is above the supported maximum ", max);
  };
  at_most(dim, int64_t{1} << 24, "hidden_size");
  at_most(hidden_dim, int64_t{1} << 24, "intermediate_size");
  at_most(vocab_size, int64_t{1} << 24, "vocab_size");
  at_most(n_layers, int64_t{1} << 16, "num_hidden_layers");
  at_most(n_heads, int64_t{1} << 16, "num_attention_heads");
  at_most(n_kv_heads, int64_t{1} << 16, "num_key_value_heads");
  at_most(head_dim, int64_t{1} << 16, "head_dim");
  {
    const double D = static_cast<double>(dim), Q = static_cast<double>(n_heads) * head_dim,
                 KV = static_cast<double>(n_kv_heads) * head_dim;
    const double per_layer = 2 * D + D * (Q + 2 * KV) + Q * D + 3 * D * hidden_dim + (Q + 2 * KV);
    const double params = n_layers * per_layer + 2.0 * vocab_size * D + D;
    KVB_CHECK(params <= 1e15, source, ": the sizes imply ", params,
              " parameters, above the supported 1e15");
  }
  // Bounded before anything is sized by it (RoPE tables, KV reservations); see kMaxContextTokens.
  KVB_CHECK(max_seq_len <= kMaxContextTokens, source, ": 'max_position_embeddings' ", max_seq_len,
            " is above the supported maximum ", kMaxContextTokens, " (2^24 tokens)");
  KVB_CHECK(n_heads % n_kv_heads == 0, source, ": num_attention_heads (", n_heads,
            ") must be a multiple of num_key_value_heads (", n_kv_heads, ")");
  KVB_CHECK(head_dim % 2 == 0, source, ": head_dim (", head_dim, ") must be even for RoPE");
  KVB_CHECK(rope_theta > 0, source, ": 'rope_theta' must be positive");
  KVB_CHECK(norm_eps > 0 && norm_eps < 1, source, ": 'rms_norm_eps' must be in (0, 1)");
  KVB_CHECK(bos_id >= 0 && bos_id < vocab_size, source, ": 'bos_token_id' ", bos_id,
            " is outside the vocabulary [0, ", vocab_size, ")");
  for (int64_t e : eos_ids)
    KVB_CHECK(e >= 0 && e < vocab_size, source, ": 'eos_token_id' ", e,
              " is outside the vocabulary [0, ", vocab_size, ")");
  if (!layer_windows.empty()) {
    KVB_CHECK(static_cast<int64_t>(layer_windows.size()) == n_layers, source, ": ",
              layer_windows.size(), " layer windows for ", n_layers, " layers");
    for (int64_t w : layer_windows)
      KVB_CHECK(w >= 0 && w <= kMaxContextTokens, source, ": 'sliding_window' ", w,
                " must be in [1, ", kMaxContextTokens, "]");
  }
  KVB_CHECK(rope_local_theta >= 0, source, ": 'rope_local_base_freq' must be positive");
  KVB_CHECK(embed_scale > 0, source, ": the embedding scale must be positive");
  KVB_CHECK(query_pre_attn_scalar >= 0, source, ": 'query_pre_attn_scalar' must be positive");
  KVB_CHECK(final_logit_softcap >= 0, source, ": 'final_logit_softcapping' must be positive");
  if (rope_scaling.type == "llama3") {
    KVB_CHECK(rope_scaling.factor >= 1 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
                  rope_scaling.original_max_position_embeddings > 0,
              source, ": 'rope_scaling' (llama3) needs factor >= 1, high_freq_factor > "
              "low_freq_factor and original_max_position_embeddings > 0");
  } else if (rope_scaling.type == "linear") {
    KVB_CHECK(rope_scaling.factor > 0, source, ": 'rope_scaling.factor' must be positive");
  }
  // Per-frequency divisors: one per rotated pair, each a positive finite number.
  auto check_factors = [&](const std::vector<double>& f, const char* key) {
    KVB_CHECK(static_cast<int64_t>(f.size()) == head_dim / 2, source, ": '", key, "' has ",
              f.size(), " entries, but RoPE rotates head_dim / 2 = ", head_dim / 2, " pairs");
    for (size_t i = 0; i < f.size(); ++i)
      KVB_CHECK(std::isfinite(f[i]) && f[i] > 0, source, ": '", key, "' entry ", i, " (", f[i],
                ") must be a positive finite number");
  };
  if (rope_scaling.type == "longrope") {
    check_factors(rope_scaling.factors, "rope_scaling.short_factor");
    check_factors(rope_scaling.long_factors, "rope_scaling.long_factor");
    KVB_CHECK(std::isfinite(rope_scaling.attention_factor) && rope_scaling.attention_factor > 0,
              source, ": 'rope_scaling.attention_factor' (", rope_scaling.attention_factor,
              ") must be a positive finite number");
    KVB_CHECK(rope_scaling.original_max_position_embeddings > 0, source,
              ": 'original_max_position_embeddings' must be positive for longrope");
  } else if (rope_scaling.type == "factors") {
    check_factors(rope_scaling.factors, "rope_freqs");
  } else {
    KVB_CHECK(rope_scaling.factors.empty() && rope_scaling.long_factors.empty(), source,
              ": per-frequency RoPE factors are given with scaling '", rope_scaling.type, "'");
  }
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json rs = {{"type", rope_scaling.type}};
  if (rope_scaling.type == "linear" || rope_scaling.type == "llama3")
    rs["factor"] = rope_scaling.factor;
  if (rope_scaling.type == "llama3") {
    rs["low_freq_factor"] = rope_scaling.low_freq_factor;
    rs["high_freq_factor"] = rope_scaling.high_freq_factor;
    rs["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
  } else if (rope_scaling.type == "longrope") {
    rs["short_factor"] = rope_scaling.factors;
    rs["long_factor"] = rope_scaling.long_factors;
    rs["attention_factor"] = rope_scaling.attention_factor;
    rs["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
  } else if (rope_scaling.type == "factors") {
    rs["factors"] = rope_scaling.factors;
  }
  nlohmann::json j = {{"name", name},
          {"format", format},
          {"hidden_size", dim},
          {"intermediate_size", hidden_dim},
          {"num_hidden_layers", n_layers},
          {"num_attention_heads", n_heads},
          {"num_key_value_heads", n_kv_heads},
          {"head_dim", head_dim},
          {"vocab_size", vocab_size},
          {"max_position_embeddings", max_seq_len},
          {"rope_theta", rope_theta},
          {"rope_scaling", rs},
          {"rope_style", rope_style_name(rope_style)},
          {"rms_norm_eps", norm_eps},
          {"tie_word_embeddings", tied_embeddings},
          {"qkv_bias", qkv_bias},
          {"bos_token_id", bos_id},
          {"eos_token_id", eos_ids},
          {"weights_dtype", weights_dtype}};
  // Only when false: the configs (and run hashes) of models that add a BOS stay as they were.
  if (!add_bos) j["add_bos_token"] = false;
  // The family fields, likewise only where they differ from the Llama computation.
  if (arch != "llama") j["model_type"] = arch;
  if (activation != Activation::kSilu) j["hidden_act"] = activation_name(activation);
  if (qk_norm) j["qk_norm"] = true;
  if (post_norms) j["post_norms"] = true;
  if (embed_scale != 1.0) j["embed_scale"] = embed_scale;
  if (query_pre_attn_scalar > 0) j["query_pre_attn_scalar"] = query_pre_attn_scalar;
  if (final_logit_softcap > 0) j["final_logit_softcapping"] = final_logit_softcap;
  if (!layer_windows.empty()) j["layer_windows"] = layer_windows;
  if (rope_local_theta > 0) j["rope_local_base_freq"] = rope_local_theta;
  return j;
}

}  // namespace kvb
