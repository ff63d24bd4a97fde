#include "harness/formats/model_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/limits.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/gguf.h"

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

namespace {

// Typed accessors that name the file and key in every error.
struct Reader {
  const nlohmann::json& j;
  const std::string& src;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t int_req(const char* key) const {
    KVB_CHECK(has(key), src, ": missing required field '", key, "'");
    return int_at(key);
  }
  int64_t int_at(const char* key) const {
    KVB_CHECK(j[key].is_number_integer(), src, ": field '", key, "' must be an integer (got ",
              j[key].dump(), ")");
    return j[key].get<int64_t>();
  }
  int64_t int_opt(const char* key, int64_t def) const { return has(key) ? int_at(key) : def; }
  double num_opt(const char* key, double def) const {
    if (!has(key)) return def;
    KVB_CHECK(j[key].is_number(), src, ": field '", key, "' must be a number (got ", j[key].dump(),
              ")");
    return j[key].get<double>();
  }
  bool bool_opt(const char* key, bool def) const {
    if (!has(key)) return def;
    KVB_CHECK(j[key].is_boolean(), src, ": field '", key, "' must be true or false (got ",
              j[key].dump(), ")");
    return j[key].get<bool>();
  }
  std::string str_opt(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    KVB_CHECK(j[key].is_string(), src, ": field '", key, "' must be a string (got ", j[key].dump(),
              ")");
    return j[key].get<std::string>();
  }
};

}  // namespace

namespace {

// A list of numbers under `key` of the object `s` (named `where` in errors).
std::vector<double> number_list(const nlohmann::json& s, const std::string& source,
                                const std::string& where, const char* key) {
  KVB_CHECK(s.contains(key) && s[key].is_array(), source, ": '", where, ".", key,
            "' must be a list of numbers");
  std::vector<double> out;
  for (const auto& x : s[key]) {
    KVB_CHECK(x.is_number(), source, ": '", where, ".", key, "' entries must be numbers (got ",
              x.dump(), ")");
    out.push_back(x.get<double>());
  }
  return out;
}

// One RoPE specification: transformers 4's rope_scaling object, or one of transformers 5's
// rope_parameters objects (which carry rope_theta too). `where` names the object in errors.
// Only the types the engine computes are accepted; any other (dynamic, yarn, ...) is refused by
// name, since running it as default RoPE would give silently wrong logits.
void parse_rope_object(const nlohmann::json& s, const std::string& source, const std::string& where,
                       RopeScaling* out, double* theta) {
  KVB_CHECK(s.is_object(), source, ": '", where, "' must be an object or null");
  Reader rs{s, source};
  const std::string type = rs.str_opt("rope_type", rs.str_opt("type", "default"));
  if (theta && rs.has("rope_theta")) {
    KVB_CHECK(s["rope_theta"].is_number(), source, ": field '", where,
              ".rope_theta' must be a number (got ", s["rope_theta"].dump(), ")");
    *theta = s["rope_theta"].get<double>();
  }
  if (rs.has("partial_rotary_factor")) {
    const double f = rs.num_opt("partial_rotary_factor", 1.0);
    KVB_CHECK(f == 1.0, source, ": '", where, ".partial_rotary_factor' is ", f,
              ": partial rotary embeddings are not supported");
  }
  if (type == "default") {
    out->type = "none";
  } else if (type == "longrope" || type == "su") {
    // "su" is what Phi-3-128K's first configs called it; transformers reads it as longrope. What
    // the object leaves out (factor, attention_factor, the switch point) is settled by
    // finish_longrope, which sees the whole config; NaN / -1 mark it absent here.
    out->type = "longrope";
    out->factors = number_list(s, source, where, "short_factor");
    out->long_factors = number_list(s, source, where, "long_factor");
    out->factor = rs.num_opt("factor", std::nan(""));
    out->attention_factor = rs.num_opt("attention_factor", std::nan(""));
    out->original_max_position_embeddings = rs.int_opt("original_max_position_embeddings", -1);
  } else if (type == "linear" || type == "llama3") {
    out->type = type;
    out->factor = rs.num_opt("factor", 1.0);
    if (type == "llama3") {
      out->low_freq_factor = rs.num_opt("low_freq_factor", 1.0);
      out->high_freq_factor = rs.num_opt("high_freq_factor", 4.0);
      out->original_max_position_embeddings = rs.int_opt("original_max_position_embeddings", 8192);
    }
  } else {
    KVB_FAIL(source, ": '", where, "' has rope_type '", type,
             "', which is not supported (default, linear, llama3, longrope / su)");
  }
}

// LongRoPE's switch point, factor and attention factor, settled as transformers 5 settles them
// (PreTrainedConfig.standardize_rope_params, _compute_longrope_parameters):
//   - the switch point is the top-level original_max_position_embeddings where the config has one
//     (Phi3Config always does: 4096 by default), else the RoPE object's, else
//     max_position_embeddings; a config whose two values disagree is refused rather than read as
//     transformers would silently read it;
//   - factor defaults to max_position_embeddings / the switch point, and the attention factor to
//     sqrt(1 + ln(factor) / ln(switch point)) (1 where factor <= 1).
void finish_longrope(const Reader& r, const std::string& model_type, int64_t max_pos,
                     RopeScaling* rs) {
  const int64_t top = r.has("original_max_position_embeddings")
                          ? r.int_at("original_max_position_embeddings")
                          : (model_type == "phi3" ? 4096 : -1);
  const int64_t inner = rs->original_max_position_embeddings;
  KVB_CHECK(top <= 0 || inner <= 0 || top == inner, r.src, ": original_max_position_embeddings is ",
            top, r.has("original_max_position_embeddings") ? "" : " (Phi3Config's default)",
            " at the top level but ", inner,
            " in the RoPE parameters; transformers would use the top-level one: make them agree");
  const int64_t orig = top > 0 ? top : inner > 0 ? inner : max_pos;
  KVB_CHECK(orig > 1, r.src, ": original_max_position_embeddings (", orig, ") must be above 1");
  rs->original_max_position_embeddings = orig;
  if (std::isnan(rs->factor)) rs->factor = static_cast<double>(max_pos) / static_cast<double>(orig);
  if (std::isnan(rs->attention_factor)) {
    rs->attention_factor =
        rs->factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(rs->factor) / std::log(static_cast<double>(orig)));
  }
}

// A key that must be absent, null or `allowed` (a field whose other values change the computation
// in a way the engine does not implement).
void refuse_unless(const Reader& r, const char* key, const nlohmann::json& allowed,
                   const std::string& what) {
  if (!r.has(key)) return;
  KVB_CHECK(r.j[key] == allowed, r.src, ": '", key, "' is ", r.j[key].dump(), ": ", what,
            " is not supported");
}

}  // namespace

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  const nlohmann::json j = parse_json(json_text, source);
  KVB_CHECK(j.is_object(), source, ": expected a JSON object");
  Reader r{j, source};

  const std::string model_type = r.str_opt("model_type", "llama");
  if (model_type == "gemma3") {
    KVB_FAIL(source, ": model_type 'gemma3' is the multimodal Gemma 3 (a text_config inside a "
             "vision-language model), which is not supported; the text-only model_type "
             "'gemma3_text' is");
  }
  KVB_CHECK(model_type == "llama" || model_type == "mistral" || model_type == "qwen2" ||
                model_type == "qwen3" || model_type == "phi3" || model_type == "gemma3_text",
            source, ": model_type '", model_type,
            "' is not supported (llama, mistral, qwen2, qwen3, phi3, gemma3_text)");
  const bool gemma = model_type == "gemma3_text";
  // Gemma names the activation hidden_activation; the others hidden_act.
  const char* act_key = gemma ? "hidden_activation" : "hidden_act";
  const std::string act = r.str_opt(act_key, gemma ? "gelu_pytorch_tanh" : "silu");

  ModelConfig c;
  c.format = "hf";
  c.arch = model_type;
  if (act == "silu") {
    c.activation = Activation::kSilu;
  } else if (act == "gelu_pytorch_tanh") {
    c.activation = Activation::kGeluTanh;
  } else {
    KVB_FAIL(source, ": ", act_key, " '", act, "' is not supported (silu, gelu_pytorch_tanh)");
  }
  c.dim = r.int_req("hidden_size");
  c.hidden_dim = r.int_req("intermediate_size");
  c.n_layers = r.int_req("num_hidden_layers");
  c.n_heads = r.int_req("num_attention_heads");
  c.vocab_size = r.int_req("vocab_size");
  c.n_kv_heads = r.int_opt("num_key_value_heads", c.n_heads);
  KVB_CHECK(c.n_heads > 0, source, ": 'num_attention_heads' must be positive");
  // The configuration classes' defaults where the file omits head_dim.
  const int64_t head_dim_default = model_type == "qwen3" ? 128
                                   : gemma               ? 256
                                   : (c.n_heads > 0 ? c.dim / c.n_heads : 0);
  c.head_dim = r.int_opt("head_dim", head_dim_default);
  c.max_seq_len = r.int_opt("max_position_embeddings", gemma ? 131072 : 2048);
  c.norm_eps = r.num_opt("rms_norm_eps", model_type == "phi3" ? 1e-5 : 1e-6);
  c.tied_embeddings = r.bool_opt("tie_word_embeddings", gemma);
  c.rope_style = RopeStyle::kHalf;
  c.bos_id = r.int_opt("bos_token_id", gemma ? 2 : 1);
  if (r.has("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    c.eos_ids.clear();
    if (e.is_array()) {
      for (const auto& x : e) {
        KVB_CHECK(x.is_number_integer(), source, ": 'eos_token_id' entries must be integers");
        c.eos_ids.push_back(x.get<int64_t>());
      }
    } else {
      c.eos_ids.push_back(r.int_at("eos_token_id"));
    }
  } else if (gemma) {
    c.eos_ids = {1};
  }
  // transformers 5 writes `dtype`, 4 wrote `torch_dtype`.
  const std::string dt = r.str_opt("torch_dtype", r.str_opt("dtype", "float32"));
  c.weights_dtype = dt == "bfloat16" ? "BF16" : dt == "float16" ? "F16" : "F32";

  // Projection biases: Qwen2's q/k/v always have them. Elsewhere attention_bias also puts a bias
  // on o_proj (Llama, Qwen3, Gemma 3), which the engine does not have.
  if (model_type == "qwen2") {
    c.qkv_bias = true;
  } else {
    refuse_unless(r, "attention_bias", false, "a bias on the attention projections (o_proj too)");
  }
  refuse_unless(r, "mlp_bias", false, "a bias on the feed-forward projections");
  refuse_unless(r, "pretraining_tp", 1, "tensor-parallel slicing of the projections");
  if (model_type == "qwen3" || gemma) c.qk_norm = true;

  // RoPE, in either generation's layout; a config holding both must agree.
  const bool v5_rope = r.has("rope_parameters");
  RopeScaling local_scaling;
  double local_theta = 10000.0;
  if (gemma) {
    c.rope_theta = 1000000.0;
    if (v5_rope) {
      const auto& rp = j["rope_parameters"];
      KVB_CHECK(rp.is_object(), source, ": 'rope_parameters' must be an object or null");
      // Gemma 3 keeps one RoPE per attention type; a flat object would be the other families'.
      for (auto it = rp.begin(); it != rp.end(); ++it) {
        KVB_CHECK(it.key() == "full_attention" || it.key() == "sliding_attention", source,
                  ": 'rope_parameters' of gemma3_text must map full_attention and "
                  "sliding_attention to RoPE parameters (found key '", it.key(), "')");
      }
      if (rp.contains("full_attention") && !rp["full_attention"].is_null())
        parse_rope_object(rp["full_attention"], source, "rope_parameters.full_attention",
                          &c.rope_scaling, &c.rope_theta);
      if (rp.contains("sliding_attention") && !rp["sliding_attention"].is_null())
        parse_rope_object(rp["sliding_attention"], source, "rope_parameters.sliding_attention",
                          &local_scaling, &local_theta);
    }
    if (r.has("rope_theta")) {
      const double t = r.num_opt("rope_theta", 0);
      KVB_CHECK(!v5_rope || t == c.rope_theta, source, ": 'rope_theta' (", t,
                ") disagrees with rope_parameters.full_attention.rope_theta (", c.rope_theta, ")");
      c.rope_theta = t;
    }
    if (r.has("rope_local_base_freq")) {
      const double t = r.num_opt("rope_local_base_freq", 0);
      KVB_CHECK(!v5_rope || t == local_theta, source, ": 'rope_local_base_freq' (", t,
                ") disagrees with rope_parameters.sliding_attention.rope_theta (", local_theta,
                ")");
      local_theta = t;
    }
    if (r.has("rope_scaling")) {
      KVB_CHECK(!v5_rope, source,
                ": both 'rope_scaling' and 'rope_parameters' are given; use one layout");
      parse_rope_object(j["rope_scaling"], source, "rope_scaling", &c.rope_scaling, nullptr);
    }
    KVB_CHECK(local_scaling.type == "none", source, ": RoPE scaling '", local_scaling.type,
              "' on the sliding-window layers is not supported (Gemma 3 scales the global layers)");
    KVB_CHECK(!c.rope_scaling.switches(), source, ": RoPE scaling '", c.rope_scaling.type,
              "' on gemma3_text is not supported");
    KVB_CHECK(local_theta > 0, source, ": 'rope_local_base_freq' must be positive");
    c.rope_local_theta = local_theta;
  } else {
    c.rope_theta = 10000.0;
    if (v5_rope) {
      KVB_CHECK(!r.has("rope_scaling"), source,
                ": both 'rope_scaling' and 'rope_parameters' are given; use one layout");
      parse_rope_object(j["rope_parameters"], source, "rope_parameters", &c.rope_scaling,
                        &c.rope_theta);
      if (r.has("rope_theta")) {
        const double t = r.num_opt("rope_theta", 0);
        KVB_CHECK(t == c.rope_theta, source, ": 'rope_theta' (", t,
                  ") disagrees with rope_parameters.rope_theta (", c.rope_theta, ")");
      }
    } else {
      c.rope_theta = r.num_opt("rope_theta", 10000.0);
      if (r.has("rope_scaling"))
        parse_rope_object(j["rope_scaling"], source, "rope_scaling", &c.rope_scaling, nullptr);
    }
    if (c.rope_scaling.switches()) finish_longrope(r, model_type, c.max_seq_len, &c.rope_scaling);
  }
  if (r.has("partial_rotary_factor")) {
    const double f = r.num_opt("partial_rotary_factor", 1.0);
    KVB_CHECK(f == 1.0, source, ": 'partial_rotary_factor' is ", f,
              ": partial rotary embeddings are not supported");
  }

  // Attention variants the engine does not compute.
  refuse_unless(r, "attn_logit_softcapping", nullptr, "softcapping of the attention scores");
  refuse_unless(r, "dual_chunk_attention_config", nullptr, "dual chunk attention");
  refuse_unless(r, "attention_chunk_size", nullptr, "chunked attention");
  refuse_unless(r, "use_bidirectional_attention", false, "bidirectional attention");
  if (gemma) {
    c.post_norms = true;
    c.embed_scale = std::sqrt(static_cast<double>(c.dim));
    c.query_pre_attn_scalar = r.num_opt("query_pre_attn_scalar", 256.0);
    KVB_CHECK(c.query_pre_attn_scalar > 0, source, ": 'query_pre_attn_scalar' must be positive");
    c.final_logit_softcap = r.num_opt("final_logit_softcapping", 0.0);
    KVB_CHECK(c.final_logit_softcap >= 0, source,
              ": 'final_logit_softcapping' must be positive or null");
  } else {
    refuse_unless(r, "final_logit_softcapping", nullptr, "softcapping of the logits");
    refuse_unless(r, "query_pre_attn_scalar", nullptr, "a query scale other than 1/sqrt(head_dim)");
  }

  // Sliding windows. Each family says where they apply: Mistral and Phi-3 on every layer when
  // sliding_window is set; Qwen2/3 only with use_sliding_window, on the layers from
  // max_window_layers on; Gemma 3 on the layers layer_types (or sliding_window_pattern) names.
  // transformers 5 writes layer_types for Qwen and Gemma; where present it is authoritative.
  std::vector<std::string> types;
  if (r.has("layer_types")) {
    KVB_CHECK(j["layer_types"].is_array(), source, ": 'layer_types' must be a list");
    for (const auto& t : j["layer_types"]) {
      KVB_CHECK(t.is_string() && (t == "full_attention" || t == "sliding_attention"), source,
                ": 'layer_types' entry ", t.dump(),
                " is not supported (full_attention, sliding_attention)");
      types.push_back(t.get<std::string>());
    }
    KVB_CHECK(static_cast<int64_t>(types.size()) == c.n_layers, source, ": 'layer_types' has ",
              types.size(), " entries for ", c.n_layers, " layers");
  }
  int64_t window = 0;
  if (model_type == "mistral" || model_type == "phi3") {
    if (r.has("sliding_window")) {
      window = r.int_at("sliding_window");
      KVB_CHECK(window > 0, r.src, ": 'sliding_window' must be positive or null (got ", window, ")");
      if (types.empty()) types.assign(c.n_layers, "sliding_attention");
    }
  } else if (model_type == "qwen2" || model_type == "qwen3") {
    const bool use = r.bool_opt("use_sliding_window", false);
    if (use) {
      window = r.int_opt("sliding_window", 4096);
      if (types.empty()) {
        const int64_t from = r.int_opt("max_window_layers", 28);
        for (int64_t l = 0; l < c.n_layers; ++l)
          types.push_back(l >= from ? "sliding_attention" : "full_attention");
      }
    } else {
      // transformers ignores a listed sliding layer when use_sliding_window is off.
      types.clear();
    }
  } else if (gemma) {
    window = r.int_opt("sliding_window", 4096);
    if (types.empty()) {
      const int64_t pattern = r.int_opt("sliding_window_pattern", 6);
      KVB_CHECK(pattern > 0, source, ": 'sliding_window_pattern' must be positive");
      for (int64_t l = 0; l < c.n_layers; ++l)
        types.push_back((l + 1) % pattern ? "sliding_attention" : "full_attention");
    }
  } else {
    // Llama: transformers has no window for it, so a window in its config would be ignored there;
    // refuse it rather than guess which computation was meant.
    refuse_unless(r, "sliding_window", nullptr, "a sliding window on a llama model");
    KVB_CHECK(types.empty() || std::all_of(types.begin(), types.end(),
                                           [](const std::string& t) { return t == "full_attention"; }),
              source, ": 'layer_types' lists sliding_attention layers, which a llama model does "
              "not have");
    types.clear();
  }
  bool any_window = false;
  for (const auto& t : types) any_window = any_window || t == "sliding_attention";
  if (any_window) {
    KVB_CHECK(window > 0, source, ": 'sliding_window' must be positive where layers slide (got ",
              window, ")");
    for (const auto& t : types) c.layer_windows.push_back(t == "sliding_attention" ? window : 0);
  }
  c.validate(source);
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  KVB_CHECK(file_exists(path), path, ": config.json not found");
  return parse_hf_config(read_text_file(path), path);
}

}  // namespace kvb

namespace kvb {

ModelConfig gguf_model_config(const GgufFile& f) {
  const std::string& src = f.path();
  const std::string arch = f.get_string("general.architecture");
  // The architectures whose llama.cpp graphs are the engine's forward (src/models/<arch>.cpp):
  // each is mapped key by key below, and checked against transformers on converted fixtures.
  KVB_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3" ||
                arch == "phi3",
            src, ": general.architecture '", arch,
            "' is not supported (llama, qwen2, qwen3, gemma3, phi3)");
  const bool gemma = arch == "gemma3";
  const std::string p = arch + ".";
  ModelConfig c;
  c.format = "gguf";
  // ModelConfig names the families by their Hugging Face model_type.
  if (arch != "llama") c.arch = gemma ? "gemma3_text" : arch;
  c.dim = f.get_int(p + "embedding_length");
  c.hidden_dim = f.get_int(p + "feed_forward_length");
  c.n_layers = f.get_int(p + "block_count");
  c.n_heads = f.get_int(p + "attention.head_count");
  c.n_kv_heads = f.get_int_or(p + "attention.head_count_kv", c.n_heads);
  KVB_CHECK(c.n_heads > 0, src, ": '", p, "attention.head_count' must be positive (got ", c.n_heads,
            ")");
  c.head_dim = f.get_int_or(p + "attention.key_length", c.dim / c.n_heads);
  const int64_t v_len = f.get_int_or(p + "attention.value_length", c.head_dim);
  KVB_CHECK(v_len == c.head_dim, src, ": '", p, "attention.value_length' (", v_len,
            ") differs from the key length (", c.head_dim, "); the engine needs one head size");
  const int64_t rot = f.get_int_or(p + "rope.dimension_count", c.head_dim);
  KVB_CHECK(rot == c.head_dim, src, ": '", p, "rope.dimension_count' is ", rot,
            " but the head size is ", c.head_dim, ": partial rotary embeddings are not supported");
  c.max_seq_len = f.get_int(p + "context_length");
  c.rope_theta = f.get_float_or(p + "rope.freq_base", 10000.0);
  c.norm_eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  // llama.cpp's converter permutes Llama's q/k rows into Meta's adjacent-pair order (as llama2.c
  // has them); Qwen2/3, Gemma 3 and Phi-3 keep Hugging Face's rows and llama.cpp rotates them
  // NeoX-style (halves), LLAMA_ROPE_TYPE_NEOX in llama_model_rope_type.
  c.rope_style = arch == "llama" ? RopeStyle::kInterleaved : RopeStyle::kHalf;
  KVB_CHECK(f.get_bool_or(p + "attention.causal", true), src, ": '", p,
            "attention.causal' is false: bidirectional attention is not supported");
  KVB_CHECK(f.get_int_or(p + "expert_count", 0) == 0, src, ": '", p,
            "expert_count' is set: mixture-of-experts layers are not supported");

  const std::string scaling = f.get_string_or(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = f.get_float(p + "rope.scaling.factor");
    KVB_CHECK(c.rope_scaling.factor > 0, src, ": '", p, "rope.scaling.factor' must be positive");
  } else if (scaling == "none") {
    // Older conversions give a linear factor alone.
    const double legacy = f.get_float_or(p + "rope.scale_linear", 1.0);
    if (legacy != 1.0) {
      KVB_CHECK(legacy > 0, src, ": '", p, "rope.scale_linear' must be positive");
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = legacy;
    }
  } else {
    KVB_FAIL(src, ": '", p, "rope.scaling.type' is '", scaling,
             "', which is not supported (none, linear)");
  }
  // Per-frequency divisors stored as tensors of head_dim / 2 floats. llama.cpp's llama graph
  // reads rope_freqs (the converter's form of Llama 3.1's llama3 scaling), its phi3 graph
  // rope_factors_short / rope_factors_long (LongRoPE: Phi-3 128K, Phi-3.5), no other graph
  // either; load_gguf takes them as read.
  auto factors = [&](const char* name) {
    const GgufTensor& t = f.tensor(name);
    KVB_CHECK(t.dims.size() == 1 && t.numel() == c.head_dim / 2, src, ": tensor '", name, "' has ",
              t.numel(), " entries, but RoPE rotates head_dim / 2 = ", c.head_dim / 2, " pairs");
    std::vector<float> v(static_cast<size_t>(t.numel()));
    gguf_dequantize(t, v.data());
    return std::vector<double>(v.begin(), v.end());
  };
  for (const char* t : {"blk.0.rope_freqs.weight", "blk.0.rope_factors_long.weight",
                        "blk.0.rope_factors_short.weight"}) {
    KVB_CHECK(!f.has_tensor(t), src, ": tensor '", t,
              "': per-layer RoPE frequency factors are not supported (llama.cpp reads one set)");
  }
  if (f.has_tensor("rope_freqs.weight")) {
    KVB_CHECK(arch == "llama", src, ": tensor 'rope_freqs.weight' on ", arch, ": llama.cpp's ",
              arch, " graph does not read it");
    KVB_CHECK(c.rope_scaling.type == "none", src, ": tensor 'rope_freqs.weight' together with '", p,
              "rope.scaling.type' ", c.rope_scaling.type, " is not supported");
    c.rope_scaling.type = "factors";
    c.rope_scaling.factors = factors("rope_freqs.weight");
  }
  const bool has_long = f.has_tensor("rope_factors_long.weight");
  if (has_long || f.has_tensor("rope_factors_short.weight")) {
    KVB_CHECK(arch == "phi3", src, ": tensors 'rope_factors_long/short.weight' on ", arch,
              ": llama.cpp's ", arch, " graph does not read them");
    KVB_CHECK(has_long && f.has_tensor("rope_factors_short.weight"), src, ": tensor '",
              has_long ? "rope_factors_short.weight" : "rope_factors_long.weight",
              "' is missing: LongRoPE needs both factor sets");
    KVB_CHECK(c.rope_scaling.type == "none", src, ": LongRoPE factors together with '", p,
              "rope.scaling.type' ", c.rope_scaling.type, " are not supported");
    // The converter writes the switch point and the attention factor it computed from the
    // config.json (convert_hf_to_gguf.py, Phi3MiniModel); llama.cpp's defaults where absent: the
    // training context (so the long factors never apply) and 1. Which set a sequence rotates with
    // follows transformers (per engine call, by the length it reaches), not llama.cpp's choice by
    // the context size it was started with, so the GGUF of a model computes what its Hugging Face
    // directory does.
    c.rope_scaling.type = "longrope";
    c.rope_scaling.factors = factors("rope_factors_short.weight");
    c.rope_scaling.long_factors = factors("rope_factors_long.weight");
    c.rope_scaling.original_max_position_embeddings =
        f.get_int_or(p + "rope.scaling.original_context_length", c.max_seq_len);
    c.rope_scaling.attention_factor = f.get_float_or(p + "rope.scaling.attn_factor", 1.0);
  }

  if (arch == "qwen3" || gemma) {
    // llama.cpp's qwen3 and gemma3 graphs require them; kvbench does too, so a file without them
    // is refused when the tensor is loaded rather than run as another model.
    c.qk_norm = true;
  } else {
    KVB_CHECK(!f.has_tensor("blk.0.attn_q_norm.weight"), src,
              ": tensor 'blk.0.attn_q_norm.weight': llama.cpp's ", arch,
              " graph has no q/k norms, so this file is not the model it says it is");
  }

  // Sliding windows. llama.cpp's qwen2, qwen3 and llama graphs have none, whatever the key says;
  // Gemma 3 slides on the layers its pattern names; Phi-3 (below) on every layer.
  const std::string window_key = p + "attention.sliding_window";
  const int64_t window = f.get_int_or(window_key, 0);
  KVB_CHECK(window >= 0, src, ": '", window_key, "' must not be negative (got ", window, ")");
  if (gemma) {
    c.activation = Activation::kGeluTanh;
    c.post_norms = true;
    c.embed_scale = std::sqrt(static_cast<double>(c.dim));
    // The file has no query_pre_attn_scalar: llama.cpp scales queries by 1/sqrt(head_dim), except
    // for the 62-layer 27B, whose scalar is hidden / heads (its config's 168). Mirror that rule.
    c.query_pre_attn_scalar = c.n_layers == 62 ? static_cast<double>(c.dim / c.n_heads)
                                               : static_cast<double>(c.head_dim);
    c.final_logit_softcap = f.get_float_or(p + "final_logit_softcapping", 0.0);
    KVB_CHECK(c.final_logit_softcap >= 0, src, ": '", p,
              "final_logit_softcapping' must not be negative");
    const double attn_cap = f.get_float_or(p + "attn_logit_softcapping", 0.0);
    KVB_CHECK(attn_cap == 0, src, ": '", p, "attn_logit_softcapping' is ", attn_cap,
              ": softcapping of the attention scores is not supported");
    if (window > 0) {
      // sliding_window_pattern: one flag per layer, or a period n whose last layer is global
      // (llama_hparams::set_swa_pattern; 6 when absent, 0 = every layer slides).
      std::vector<bool> slides(static_cast<size_t>(c.n_layers));
      const std::string pat_key = p + "attention.sliding_window_pattern";
      if (f.has(pat_key) && f.get(pat_key).kind == GgufValue::Kind::kArray) {
        const std::vector<int64_t>& flags = f.get_ints(pat_key);
        KVB_CHECK(static_cast<int64_t>(flags.size()) == c.n_layers, src, ": '", pat_key, "' has ",
                  flags.size(), " entries for ", c.n_layers, " layers");
        for (int64_t l = 0; l < c.n_layers; ++l) slides[l] = flags[l] != 0;
      } else {
        const int64_t n = f.get_int_or(pat_key, 6);
        KVB_CHECK(n >= 0, src, ": '", pat_key, "' must not be negative (got ", n, ")");
        for (int64_t l = 0; l < c.n_layers; ++l) slides[l] = n == 0 || l % n < n - 1;
      }
      bool any = false;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        c.layer_windows.push_back(slides[l] ? window : 0);
        any = any || slides[l];
      }
      if (!any) c.layer_windows.clear();
      // The window layers rotate with their own base and no scaling (llama.cpp's defaults: 10000,
      // scale 1).
      c.rope_local_theta = f.get_float_or(p + "rope.freq_base_swa", 10000.0);
      KVB_CHECK(c.rope_local_theta > 0, src, ": '", p, "rope.freq_base_swa' must be positive");
    }
  } else if (arch == "phi3") {
    // llama.cpp's phi3 loader switches the window off (it warns and sets n_swa 0); transformers
    // and kvbench's config.json path apply it on every layer, and the weights were trained so,
    // so the GGUF of a Phi-3 model gives the same computation as its Hugging Face directory.
    if (window > 0) c.layer_windows.assign(c.n_layers, window);
  } else {
    KVB_CHECK(window == 0, src, ": '", window_key, "' is ", window, ": llama.cpp's ", arch,
              " graph has no sliding window, so which computation is meant is unclear");
  }
  for (const char* k : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    KVB_CHECK(gemma || !f.has(p + k), src, ": '", p, k, "' is set: softcapping is not supported on ",
              arch);
  }

  if (f.has("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(f.get_strings("tokenizer.ggml.tokens").size());
    if (f.has(p + "vocab_size")) {
      const int64_t v = f.get_int(p + "vocab_size");
      KVB_CHECK(v == c.vocab_size, src, ": '", p, "vocab_size' (", v,
                ") differs from the token list (", c.vocab_size, " tokens)");
    }
  } else if (f.has(p + "vocab_size")) {
    c.vocab_size = f.get_int(p + "vocab_size");
  } else {
    const GgufTensor& e = f.tensor("token_embd.weight");
    KVB_CHECK(e.dims.size() == 2, src, ": tensor 'token_embd.weight' must be a matrix");
    c.vocab_size = e.dims[1];
  }
  c.tied_embeddings = !f.has_tensor("output.weight");
  // llama.cpp loads q/k/v biases for any of these architectures where the file has them (split or
  // fused with attn_qkv), nothing else.
  c.qkv_bias = f.has_tensor("blk.0.attn_q.bias") || f.has_tensor("blk.0.attn_qkv.bias");
  KVB_CHECK(!f.has_tensor("output.bias"), src,
            ": tensor 'output.bias': a bias on the output projection is not supported");
  for (const char* t : {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}) {
    KVB_CHECK(!f.has_tensor(std::string("blk.0.") + t), src, ": tensor 'blk.0.", t,
              "': biases outside q/k/v are not supported");
  }
  c.bos_id = f.get_int_or("tokenizer.ggml.bos_token_id", gemma ? 2 : 1);
  c.eos_ids = {f.get_int_or("tokenizer.ggml.eos_token_id", gemma ? 1 : 2)};
  if (f.has("tokenizer.ggml.eot_token_id")) {
    const int64_t eot = f.get_int("tokenizer.ggml.eot_token_id");
    if (eot != c.eos_ids[0]) c.eos_ids.push_back(eot);
  }
  // llama.cpp adds a BOS unless the file says not to.
  c.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", true);

  // The matrices' storage type: the most common type among the 2-D tensors.
  std::map<std::string, int> types;
  for (const GgufTensor& t : f.tensors())
    if (t.dims.size() == 2) ++types[ggml_type_name(t.type)];
  int best = 0;
  for (const auto& [name, n] : types)
    if (n > best) {
      best = n;
      c.weights_dtype = name;
    }
  c.validate(src);
  return c;
}

}  // namespace kvb
