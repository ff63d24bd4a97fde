// parse_hf_config / load_hf_config (harness/formats/model_config.h): a Hugging Face config.json read
// by its family's rules (harness/formats/model_family.h).

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/model_config.h"
#include "harness/formats/model_family.h"

namespace kvb {

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
void finish_longrope(const Reader& r, const ModelFamily& family, int64_t max_pos, RopeScaling* rs) {
  const int64_t top = r.has("original_max_position_embeddings")
                          ? r.int_at("original_max_position_embeddings")
                          : family.original_max_position_embeddings;
  const int64_t inner = rs->original_max_position_embeddings;
  KVB_CHECK(top <= 0 || inner <= 0 || top == inner, r.src, ": original_max_position_embeddings is ",
            top, r.has("original_max_position_embeddings") ? "" : " (" + family.config_class + "'s default)",
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


// The family a config.json names. The multimodal Gemma 3 is refused by name: its config holds the
// text model's inside a text_config, which is not this file's layout.
const ModelFamily& hf_family(const Reader& r) {
  const std::string model_type = r.str_opt("model_type", "llama");
  KVB_CHECK(model_type != "gemma3", r.src,
            ": model_type 'gemma3' is the multimodal Gemma 3 (a text_config inside a "
            "vision-language model), which is not supported; the text-only model_type "
            "'gemma3_text' is");
  return family_of_hf_type(model_type, r.src);
}

// Sizes, activation, norms: every field with the family's default where the file omits it.
void read_hf_shapes(const Reader& r, const ModelFamily& fam, ModelConfig* c) {
  const std::string act = r.str_opt(fam.activation_key.c_str(), fam.activation);
  if (act == "silu") {
    c->activation = Activation::kSilu;
  } else if (act == "gelu_pytorch_tanh") {
    c->activation = Activation::kGeluTanh;
  } else {
    KVB_FAIL(r.src, ": ", fam.activation_key, " '", act, "' is not supported (silu, gelu_pytorch_tanh)");
  }
  c->dim = r.int_req("hidden_size");
  c->hidden_dim = r.int_req("intermediate_size");
  c->n_layers = r.int_req("num_hidden_layers");
  c->n_heads = r.int_req("num_attention_heads");
  c->vocab_size = r.int_req("vocab_size");
  c->n_kv_heads = r.int_opt("num_key_value_heads", c->n_heads);
  KVB_CHECK(c->n_heads > 0, r.src, ": 'num_attention_heads' must be positive");
  c->head_dim = r.int_opt("head_dim", fam.head_dim > 0 ? fam.head_dim : c->dim / c->n_heads);
  c->max_seq_len = r.int_opt("max_position_embeddings", fam.max_position_embeddings);
  c->norm_eps = r.num_opt("rms_norm_eps", fam.rms_norm_eps);
  c->tied_embeddings = r.bool_opt("tie_word_embeddings", fam.tie_word_embeddings);
  c->rope_style = RopeStyle::kHalf;
}

// Special tokens and the stored weights' type.
void read_hf_tokens(const Reader& r, const ModelFamily& fam, ModelConfig* c) {
  c->bos_id = r.int_opt("bos_token_id", fam.bos_token_id);
  if (r.has("eos_token_id")) {
    const auto& e = r.j["eos_token_id"];
    c->eos_ids.clear();
    if (e.is_array()) {
      for (const auto& x : e) {
        KVB_CHECK(x.is_number_integer(), r.src, ": 'eos_token_id' entries must be integers");
        c->eos_ids.push_back(x.get<int64_t>());
      }
    } else {
      c->eos_ids.push_back(r.int_at("eos_token_id"));
    }
  } else {
    c->eos_ids = fam.eos_token_ids;
  }
  // transformers 5 writes `dtype`, 4 wrote `torch_dtype`.
  const std::string dt = r.str_opt("torch_dtype", r.str_opt("dtype", "float32"));
  c->weights_dtype = dt == "bfloat16" ? "BF16" : dt == "float16" ? "F16" : "F32";
}

// Projection biases and q/k norms. Qwen2's q/k/v always have biases; elsewhere attention_bias also
// puts a bias on o_proj (Llama, Qwen3, Gemma 3), which the engine does not have.
void read_hf_projections(const Reader& r, const ModelFamily& fam, ModelConfig* c) {
  if (fam.qkv_bias) {
    c->qkv_bias = true;
  } else {
    refuse_unless(r, "attention_bias", false, "a bias on the attention projections (o_proj too)");
  }
  refuse_unless(r, "mlp_bias", false, "a bias on the feed-forward projections");
  refuse_unless(r, "pretraining_tp", 1, "tensor-parallel slicing of the projections");
  c->qk_norm = fam.qk_norm;
}

// Gemma 3's RoPE: one per attention type, the global layers' scalable, the window layers' plain,
// in transformers 4's flat keys or transformers 5's rope_parameters map (a config holding both
// must agree).
void read_hf_rope_per_attention_type(const Reader& r, ModelConfig* c) {
  const std::string& source = r.src;
  const bool v5_rope = r.has("rope_parameters");
  RopeScaling local_scaling;
  double local_theta = 10000.0;
  c->rope_theta = 1000000.0;
  if (v5_rope) {
    const auto& rp = r.j["rope_parameters"];
    KVB_CHECK(rp.is_object(), source, ": 'rope_parameters' must be an object or null");
    for (auto it = rp.begin(); it != rp.end(); ++it) {
      KVB_CHECK(it.key() == "full_attention" || it.key() == "sliding_attention", source,
                ": 'rope_parameters' of gemma3_text must map full_attention and "
                "sliding_attention to RoPE parameters (found key '", it.key(), "')");
    }
    if (rp.contains("full_attention") && !rp["full_attention"].is_null())
      parse_rope_object(rp["full_attention"], source, "rope_parameters.full_attention",
                        &c->rope_scaling, &c->rope_theta);
    if (rp.contains("sliding_attention") && !rp["sliding_attention"].is_null())
      parse_rope_object(rp["sliding_attention"], source, "rope_parameters.sliding_attention",
                        &local_scaling, &local_theta);
  }
  if (r.has("rope_theta")) {
    const double t = r.num_opt("rope_theta", 0);
    KVB_CHECK(!v5_rope || t == c->rope_theta, source, ": 'rope_theta' (", t,
              ") disagrees with rope_parameters.full_attention.rope_theta (", c->rope_theta, ")");
    c->rope_theta = t;
  }
  if (r.has("rope_local_base_freq")) {
    const double t = r.num_opt("rope_local_base_freq", 0);
    KVB_CHECK(!v5_rope || t == local_theta, source, ": 'rope_local_base_freq' (", t,
              ") disagrees with rope_parameters.sliding_attention.rope_theta (", local_theta, ")");
    local_theta = t;
  }
  if (r.has("rope_scaling")) {
    KVB_CHECK(!v5_rope, source, ": both 'rope_scaling' and 'rope_parameters' are given; use one layout");
    parse_rope_object(r.j["rope_scaling"], source, "rope_scaling", &c->rope_scaling, nullptr);
  }
  KVB_CHECK(local_scaling.type == "none", source, ": RoPE scaling '", local_scaling.type,
            "' on the sliding-window layers is not supported (Gemma 3 scales the global layers)");
  KVB_CHECK(!c->rope_scaling.switches(), source, ": RoPE scaling '", c->rope_scaling.type,
            "' on gemma3_text is not supported");
  KVB_CHECK(local_theta > 0, source, ": 'rope_local_base_freq' must be positive");
  c->rope_local_theta = local_theta;
}

// Every other family's one RoPE, in either generation's layout.
void read_hf_rope(const Reader& r, const ModelFamily& fam, ModelConfig* c) {
  const std::string& source = r.src;
  c->rope_theta = 10000.0;
  if (r.has("rope_parameters")) {
    KVB_CHECK(!r.has("rope_scaling"), source,
              ": both 'rope_scaling' and 'rope_parameters' are given; use one layout");
    parse_rope_object(r.j["rope_parameters"], source, "rope_parameters", &c->rope_scaling, &c->rope_theta);
    if (r.has("rope_theta")) {
      const double t = r.num_opt("rope_theta", 0);
      KVB_CHECK(t == c->rope_theta, source, ": 'rope_theta' (", t,
                ") disagrees with rope_parameters.rope_theta (", c->rope_theta, ")");
    }
  } else {
    c->rope_theta = r.num_opt("rope_theta", 10000.0);
    if (r.has("rope_scaling"))
      parse_rope_object(r.j["rope_scaling"], source, "rope_scaling", &c->rope_scaling, nullptr);
  }
  if (c->rope_scaling.switches()) finish_longrope(r, fam, c->max_seq_len, &c->rope_scaling);
}

// Attention variants: Gemma 3's block, and what no family here computes.
void read_hf_attention_variants(const Reader& r, const ModelFamily& fam, ModelConfig* c) {
  const std::string& source = r.src;
  if (r.has("partial_rotary_factor")) {
    const double f = r.num_opt("partial_rotary_factor", 1.0);
    KVB_CHECK(f == 1.0, source, ": 'partial_rotary_factor' is ", f,
              ": partial rotary embeddings are not supported");
  }
  refuse_unless(r, "attn_logit_softcapping", nullptr, "softcapping of the attention scores");
  refuse_unless(r, "dual_chunk_attention_config", nullptr, "dual chunk attention");
  refuse_unless(r, "attention_chunk_size", nullptr, "chunked attention");
  refuse_unless(r, "use_bidirectional_attention", false, "bidirectional attention");
  if (fam.gemma_block) {
    c->post_norms = true;
    c->embed_scale = std::sqrt(static_cast<double>(c->dim));
    c->query_pre_attn_scalar = r.num_opt("query_pre_attn_scalar", 256.0);
    KVB_CHECK(c->query_pre_attn_scalar > 0, source, ": 'query_pre_attn_scalar' must be positive");
    c->final_logit_softcap = r.num_opt("final_logit_softcapping", 0.0);
    KVB_CHECK(c->final_logit_softcap >= 0, source, ": 'final_logit_softcapping' must be positive or null");
  } else {
    refuse_unless(r, "final_logit_softcapping", nullptr, "softcapping of the logits");
    refuse_unless(r, "query_pre_attn_scalar", nullptr, "a query scale other than 1/sqrt(head_dim)");
  }
}

// transformers 5's layer_types, authoritative where present.
std::vector<std::string> hf_layer_types(const Reader& r, int64_t n_layers) {
  std::vector<std::string> types;
  if (!r.has("layer_types")) return types;
  KVB_CHECK(r.j["layer_types"].is_array(), r.src, ": 'layer_types' must be a list");
  for (const auto& t : r.j["layer_types"]) {
    KVB_CHECK(t.is_string() && (t == "full_attention" || t == "sliding_attention"), r.src,
              ": 'layer_types' entry ", t.dump(), " is not supported (full_attention, sliding_attention)");
    types.push_back(t.get<std::string>());
  }
  KVB_CHECK(static_cast<int64_t>(types.size()) == n_layers, r.src, ": 'layer_types' has ",
            types.size(), " entries for ", n_layers, " layers");
  return types;
}

// Which layers slide and how far, by the family's rule (WindowRule); fills `types` where the file
// had no layer_types, and returns the window (0: none).
int64_t hf_window(const Reader& r, const ModelFamily& fam, int64_t n_layers, std::vector<std::string>* types) {
  int64_t window = 0;
  switch (fam.windows) {
    case WindowRule::kAllLayers:
      if (r.has("sliding_window")) {
        window = r.int_at("sliding_window");
        KVB_CHECK(window > 0, r.src, ": 'sliding_window' must be positive or null (got ", window, ")");
        if (types->empty()) types->assign(n_layers, "sliding_attention");
      }
      break;
    case WindowRule::kQwen:
      if (r.bool_opt("use_sliding_window", false)) {
        window = r.int_opt("sliding_window", 4096);
        if (types->empty()) {
          const int64_t from = r.int_opt("max_window_layers", 28);
          for (int64_t l = 0; l < n_layers; ++l)
            types->push_back(l >= from ? "sliding_attention" : "full_attention");
        }
      } else {
        types->clear();  // transformers ignores a listed sliding layer when use_sliding_window is off
      }
      break;
    case WindowRule::kPattern:
      window = r.int_opt("sliding_window", 4096);
      if (types->empty()) {
        const int64_t pattern = r.int_opt("sliding_window_pattern", 6);
        KVB_CHECK(pattern > 0, r.src, ": 'sliding_window_pattern' must be positive");
        for (int64_t l = 0; l < n_layers; ++l)
          types->push_back((l + 1) % pattern ? "sliding_attention" : "full_attention");
      }
      break;
    case WindowRule::kNone:
      // transformers has no window for such a family, so a window in its config would be ignored
      // there; refuse it rather than guess which computation was meant.
      refuse_unless(r, "sliding_window", nullptr, "a sliding window on a " + fam.hf_type + " model");
      KVB_CHECK(std::all_of(types->begin(), types->end(),
                            [](const std::string& t) { return t == "full_attention"; }),
                r.src, ": 'layer_types' lists sliding_attention layers, which a ", fam.hf_type,
                " model does not have");
      types->clear();
      break;
  }
  return window;
}

// Sliding windows: each family says where they apply (WindowRule).
void read_hf_windows(const Reader& r, const ModelFamily& fam, ModelConfig* c) {
  std::vector<std::string> types = hf_layer_types(r, c->n_layers);
  const int64_t window = hf_window(r, fam, c->n_layers, &types);
  const bool any_window = std::any_of(types.begin(), types.end(),
                                      [](const std::string& t) { return t == "sliding_attention"; });
  if (!any_window) return;
  KVB_CHECK(window > 0, r.src, ": 'sliding_window' must be positive where layers slide (got ", window, ")");
  for (const auto& t : types) c->layer_windows.push_back(t == "sliding_attention" ? window : 0);
}

}  // namespace

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  const nlohmann::json j = parse_json(json_text, source);
  KVB_CHECK(j.is_object(), source, ": expected a JSON object");
  const Reader r{j, source};
  const ModelFamily& fam = hf_family(r);
  ModelConfig c;
  c.format = "hf";
  c.arch = fam.hf_type;
  read_hf_shapes(r, fam, &c);
  read_hf_tokens(r, fam, &c);
  read_hf_projections(r, fam, &c);
  if (fam.gemma_block) {
    read_hf_rope_per_attention_type(r, &c);
  } else {
    read_hf_rope(r, fam, &c);
  }
  read_hf_attention_variants(r, fam, &c);
  read_hf_windows(r, fam, &c);
  c.validate(source);
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  KVB_CHECK(file_exists(path), path, ": config.json not found");
  return parse_hf_config(read_text_file(path), path);
}

}  // namespace kvb
