// parse_hf_config / load_hf_config / ModelConfig::validate: the real stories260K-hf config parses
// to the right architecture, and every missing, mistyped, unsupported or inconsistent field is
// refused with one line naming the file and the key.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/model_config.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using nlohmann::json;
using ptest::expect_kvb_error;

const char* kSrc = "/models/x/config.json";

// A complete, valid Llama config to mutate one field at a time.
json base_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 256},
          {"intermediate_size", 688},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 2},
          {"vocab_size", 1000},
          {"max_position_embeddings", 1024},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 500000.0},
          {"tie_word_embeddings", false},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"hidden_act", "silu"},
          {"torch_dtype", "bfloat16"}};
}

ModelConfig parse(const json& j) { return parse_hf_config(j.dump(), kSrc); }

TEST(ModelConfig, RealStories260kHfConfig) {
  const std::string path = ptest::models_dir() + "/stories260K-hf/config.json";
  ASSERT_TRUE(file_exists(path)) << path << " missing (run scripts/setup.sh)";
  const ModelConfig c = load_hf_config(path);
  EXPECT_EQ(c.format, "hf");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.rope_style, RopeStyle::kHalf);
  EXPECT_STREQ(rope_style_name(c.rope_style), "half");
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(c.weights_dtype, "F32");
  EXPECT_EQ(c.q_dim(), 64);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(c.group_size(), 2);
  EXPECT_EQ(c.kv_bytes_per_token(2), 2 * 5 * 32 * 2);
  // 5 x (2*64 + 64*(64+64) + 64*64 + 3*64*172) + 512*64 + 64 (tied: one embedding matrix).
  EXPECT_EQ(c.parameter_count(), 5 * (128 + 64 * 128 + 4096 + 3 * 64 * 172) + 512 * 64 + 64);
  const json j = c.to_json();
  EXPECT_EQ(j["hidden_size"], 64);
  EXPECT_EQ(j["rope_style"], "half");
  EXPECT_EQ(j["rope_scaling"]["type"], "none");
  EXPECT_EQ(j["eos_token_id"], json::array({2}));
}

TEST(ModelConfig, BaseConfigFieldsAndDefaults) {
  ModelConfig c = parse(base_config());
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.hidden_dim, 688);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-6);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.weights_dtype, "BF16");

  // Optional fields fall back to the HF defaults.
  json j = base_config();
  for (const char* k : {"model_type", "num_key_value_heads", "max_position_embeddings",
                        "rms_norm_eps", "rope_theta", "tie_word_embeddings", "bos_token_id",
                        "eos_token_id", "hidden_act", "torch_dtype"})
    j.erase(k);
  c = parse(j);
  EXPECT_EQ(c.n_kv_heads, 8);  // MHA when absent
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(c.weights_dtype, "F32");

  // An explicit head_dim wins over hidden_size / heads; null counts as absent.
  j = base_config();
  j["head_dim"] = 64;
  j["rope_scaling"] = nullptr;
  c = parse(j);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_EQ(c.rope_scaling.type, "none");
  j["torch_dtype"] = "float16";
  EXPECT_EQ(parse(j).weights_dtype, "F16");
}

TEST(ModelConfig, MissingRequiredFieldNamesTheKey) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"}) {
    json j = base_config();
    j.erase(key);
    SCOPED_TRACE(key);
    expect_kvb_error([&] { parse(j); },
                     {kSrc, std::string(": missing required field '") + key + "'"});
    j[key] = nullptr;  // an explicit null is just as missing
    expect_kvb_error([&] { parse(j); },
                     {kSrc, std::string("missing required field '") + key + "'"});
  }
}

TEST(ModelConfig, WrongTypeNamesTheKey) {
  struct Case {
    const char* key;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"hidden_size", "256", "field 'hidden_size' must be an integer (got \"256\")"},
      {"hidden_size", 256.5, "field 'hidden_size' must be an integer (got 256.5)"},
      {"num_key_value_heads", true, "field 'num_key_value_heads' must be an integer (got true)"},
      {"max_position_embeddings", json::array({1}),
       "field 'max_position_embeddings' must be an integer"},
      {"rope_theta", "1e4", "field 'rope_theta' must be a number (got \"1e4\")"},
      {"rms_norm_eps", json::object(), "field 'rms_norm_eps' must be a number (got {})"},
      {"tie_word_embeddings", 1, "field 'tie_word_embeddings' must be true or false (got 1)"},
      {"model_type", 3, "field 'model_type' must be a string (got 3)"},
      {"hidden_act", false, "field 'hidden_act' must be a string"},
      {"bos_token_id", "1", "field 'bos_token_id' must be an integer"},
      {"eos_token_id", "2", "field 'eos_token_id' must be an integer"},
      {"eos_token_id", json::array({2, "x"}), "'eos_token_id' entries must be integers"},
      {"rope_scaling", "llama3", "'rope_scaling' must be an object or null"},
  };
  for (const Case& c : cases) {
    json j = base_config();
    j[c.key] = c.value;
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    expect_kvb_error([&] { parse(j); }, {kSrc, c.expect});
  }
}

TEST(ModelConfig, MalformedJson) {
  expect_kvb_error([&] { parse_hf_config("{\"hidden_size\": 64,", kSrc); },
                   {kSrc, ": not valid JSON: ", "parse error"});
  expect_kvb_error([&] { parse_hf_config("", kSrc); }, {kSrc, ": not valid JSON"});
  expect_kvb_error([&] { parse_hf_config("{'hidden_size': 64}", kSrc); }, {kSrc, "not valid JSON"});
  expect_kvb_error([&] { parse_hf_config("[1, 2]", kSrc); }, {kSrc, ": expected a JSON object"});
  expect_kvb_error([&] { parse_hf_config("\"llama\"", kSrc); }, {kSrc, "expected a JSON object"});
}

TEST(ModelConfig, HeadsNotMultipleOfKvHeads) {
  json j = base_config();
  j["num_key_value_heads"] = 3;
  expect_kvb_error([&] { parse(j); },
                   {kSrc, "num_attention_heads (8) must be a multiple of num_key_value_heads (3)"});
}

TEST(ModelConfig, NonPositiveAndOutOfRangeValues) {
  struct Case {
    const char* key;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"hidden_size", 0, "'hidden_size' must be positive (got 0)"},
      {"intermediate_size", -1, "'intermediate_size' must be positive (got -1)"},
      {"num_hidden_layers", 0, "'num_hidden_layers' must be positive (got 0)"},
      {"num_attention_heads", 0, "'num_attention_heads' must be positive"},
      {"num_key_value_heads", -2, "'num_key_value_heads' must be positive (got -2)"},
      {"vocab_size", 0, "'vocab_size' must be positive (got 0)"},
      {"max_position_embeddings", 0, "'max_position_embeddings' must be positive (got 0)"},
      {"head_dim", 0, "'head_dim' must be positive (got 0)"},
      {"head_dim", 31, "head_dim (31) must be even for RoPE"},
      {"rope_theta", 0.0, "'rope_theta' must be positive"},
      {"rms_norm_eps", 0.0, "'rms_norm_eps' must be in (0, 1)"},
      {"rms_norm_eps", 1.5, "'rms_norm_eps' must be in (0, 1)"},
      {"bos_token_id", 1000, "'bos_token_id' 1000 is outside the vocabulary [0, 1000)"},
      {"bos_token_id", -1, "'bos_token_id' -1 is outside the vocabulary [0, 1000)"},
      {"eos_token_id", json::array({2, 5000}),
       "'eos_token_id' 5000 is outside the vocabulary [0, 1000)"},
  };
  for (const Case& c : cases) {
    json j = base_config();
    j[c.key] = c.value;
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    expect_kvb_error([&] { parse(j); }, {kSrc, c.expect});
  }
  // hidden_size smaller than the head count derives head_dim 0.
  json j = base_config();
  j["hidden_size"] = 4;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'head_dim' must be positive (got 0)"});
}

TEST(ModelConfig, UnsupportedModelTypeActivationAndRopeScaling) {
  json j = base_config();
  j["model_type"] = "gpt2";
  expect_kvb_error([&] { parse(j); },
                   {kSrc, "model_type 'gpt2' is not supported (llama, mistral, qwen2, qwen3, "
                          "phi3, gemma3_text)"});
  j = base_config();
  j["hidden_act"] = "gelu";
  expect_kvb_error([&] { parse(j); },
                   {kSrc, "hidden_act 'gelu' is not supported (silu, gelu_pytorch_tanh)"});
  j = base_config();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  expect_kvb_error([&] { parse(j); },
                   {kSrc,
                    "'rope_scaling' has rope_type 'yarn', which is not supported "
                    "(default, linear, llama3, longrope / su)"});
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  expect_kvb_error([&] { parse(j); }, {kSrc, "'rope_scaling' has rope_type 'dynamic'"});
  j["rope_scaling"] = {{"rope_type", 3}};
  expect_kvb_error([&] { parse(j); }, {kSrc, "field 'rope_type' must be a string"});
  // mistral is accepted and parsed like llama.
  j = base_config();
  j["model_type"] = "mistral";
  EXPECT_EQ(parse(j).dim, 256);
}

TEST(ModelConfig, Llama3RopeScaling) {
  json j = base_config();
  j["rope_scaling"] = {{"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192},
                       {"rope_type", "llama3"}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  json out = c.to_json()["rope_scaling"];
  EXPECT_EQ(out["type"], "llama3");
  EXPECT_EQ(out["factor"], 8.0);
  EXPECT_EQ(out["original_max_position_embeddings"], 8192);

  // Non-default values, under the older "type" key.
  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 32},
                       {"low_freq_factor", 2},
                       {"high_freq_factor", 6.5},
                       {"original_max_position_embeddings", 4096}};
  c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 6.5);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);

  // Inconsistent llama3 parameters are refused.
  j["rope_scaling"]["high_freq_factor"] = 1.0;  // not above low_freq_factor 2
  expect_kvb_error([&] { parse(j); }, {kSrc, "'rope_scaling' (llama3) needs factor >= 1"});
  j["rope_scaling"]["high_freq_factor"] = 4.0;
  j["rope_scaling"]["original_max_position_embeddings"] = 8192.5;
  expect_kvb_error([&] { parse(j); },
                   {kSrc, "field 'original_max_position_embeddings' must be an integer"});

  // linear scaling keeps only the factor; "default" means none.
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  j["rope_scaling"]["factor"] = -1.0;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'rope_scaling.factor' must be positive"});
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse(j).rope_scaling.type, "none");
}

TEST(ModelConfig, Qwen2SetsQkvBias) {
  json j = base_config();
  j["model_type"] = "qwen2";
  j["architectures"] = {"Qwen2ForCausalLM"};
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.qkv_bias);
  // q, k, v biases: 256 + 2 * 64 per layer on top of the same model without them.
  j["model_type"] = "llama";
  const ModelConfig plain = parse(j);
  EXPECT_FALSE(plain.qkv_bias);
  EXPECT_EQ(c.parameter_count() - plain.parameter_count(), 4 * (256 + 2 * 64));
  // llama's attention_bias puts a bias on o_proj too, which the engine has not: refused by name
  // rather than run without it.
  j["attention_bias"] = true;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'attention_bias' is true", "o_proj"});
}

TEST(ModelConfig, EosTokenIdAsList) {
  json j = base_config();
  j["eos_token_id"] = {128001, 128008, 128009};
  j["vocab_size"] = 128256;
  EXPECT_EQ(parse(j).eos_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  j["eos_token_id"] = json::array();
  EXPECT_TRUE(parse(j).eos_ids.empty());
  j["eos_token_id"] = 7;
  EXPECT_EQ(parse(j).eos_ids, (std::vector<int64_t>{7}));
}

TEST(ModelConfig, LoadFromFileAndMissingFile) {
  const std::string dir = ptest::scratch_dir("cfg");
  const std::string path = ptest::write_bytes(dir, "config.json", base_config().dump(2));
  EXPECT_EQ(load_hf_config(path).vocab_size, 1000);
  const std::string missing = dir + "/nope/config.json";
  expect_kvb_error([&] { load_hf_config(missing); }, {missing, ": config.json not found"});
  // Errors from a loaded file name that file.
  json j = base_config();
  j.erase("vocab_size");
  const std::string bad = ptest::write_bytes(dir, "bad.json", j.dump());
  expect_kvb_error([&] { load_hf_config(bad); }, {bad, "missing required field 'vocab_size'"});
}

TEST(ModelConfig, ValidateDirectly) {
  ModelConfig c = parse(base_config());
  EXPECT_NO_THROW(c.validate("src"));
  c.n_kv_heads = 0;
  expect_kvb_error([&] { c.validate("synthetic:tiny"); },
                   {"synthetic:tiny", "'num_key_value_heads' must be positive (got 0)"});
  c = parse(base_config());
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 0.5;
  expect_kvb_error([&] { c.validate("src"); }, {"src", "(llama3) needs factor >= 1"});
}

}  // namespace
}  // namespace kvb

namespace kvb {
namespace {

// transformers 5 moves rope_theta and rope_scaling into rope_parameters. Both layouts of one
// model parse to the same config; the v5 one used to load with the default base and no scaling.
TEST(ModelConfigFamilies, BothRopeLayoutsGiveTheSameConfig) {
  json v4 = base_config();
  v4["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  json v5 = base_config();
  v5.erase("rope_theta");
  v5["rope_parameters"] = v4["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  const ModelConfig a = parse(v4), b = parse(v5);
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_DOUBLE_EQ(b.rope_theta, 500000.0);
  EXPECT_EQ(b.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(b.rope_scaling.factor, 8.0);
  // Unsupported types are refused in the v5 layout too, naming where.
  for (const char* t : {"yarn", "dynamic", "ntk"}) {
    json j = v5;
    j["rope_parameters"]["rope_type"] = t;
    SCOPED_TRACE(t);
    expect_kvb_error([&] { parse(j); },
                     {kSrc, std::string("'rope_parameters' has rope_type '") + t + "'"});
  }
  // longrope / su need their factor lists.
  for (const char* t : {"longrope", "su"}) {
    json j = v5;
    j["rope_parameters"]["rope_type"] = t;
    SCOPED_TRACE(t);
    expect_kvb_error([&] { parse(j); },
                     {kSrc, "'rope_parameters.short_factor' must be a list of numbers"});
  }
  json j = v5;
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  expect_kvb_error([&] { parse(j); },
                   {kSrc, "'rope_parameters.partial_rotary_factor' is 0.5", "partial rotary"});
  j = v5;
  j["rope_theta"] = 10000.0;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'rope_theta' (10000) disagrees"});
  j = v5;
  j["rope_scaling"] = v4["rope_scaling"];
  expect_kvb_error([&] { parse(j); }, {kSrc, "both 'rope_scaling' and 'rope_parameters'"});
}

TEST(ModelConfigFamilies, FamilyFieldsAndRefusals) {
  // Qwen3: q/k norms, head_dim 128 when absent, no biases.
  json j = base_config();
  j["model_type"] = "qwen3";
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.to_json()["model_type"], "qwen3");
  EXPECT_TRUE(c.layer_windows.empty());
  // Qwen's window applies only with use_sliding_window, from max_window_layers on.
  j["sliding_window"] = 64;
  EXPECT_TRUE(parse(j).layer_windows.empty());
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 2;
  EXPECT_EQ(parse(j).layer_windows, (std::vector<int64_t>{0, 0, 64, 64}));

  // Mistral: a window on every layer when set, none when null.
  j = base_config();
  j["model_type"] = "mistral";
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(parse(j).layer_windows.empty());
  j["sliding_window"] = 4096;
  c = parse(j);
  EXPECT_EQ(c.layer_windows, (std::vector<int64_t>(4, 4096)));
  EXPECT_EQ(c.n_window_layers(), 4);
  // Its full cache is the window: 4095 rows per layer at most.
  EXPECT_EQ(c.full_kv_bytes(100, 2), 2 * 4 * 100 * c.kv_dim() * 2);
  EXPECT_EQ(c.full_kv_bytes(10000, 2), 2 * 4 * 4095 * c.kv_dim() * 2);
  j["sliding_window"] = 0;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'sliding_window' must be positive"});
  // A window on a llama config is refused, not ignored.
  j = base_config();
  j["sliding_window"] = 4096;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'sliding_window' is 4096", "llama"});

  // Attention variants that are not implemented, each named.
  j = base_config();
  j["model_type"] = "gemma3_text";
  j["attn_logit_softcapping"] = 50.0;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'attn_logit_softcapping' is 50"});
  j.erase("attn_logit_softcapping");
  j["use_bidirectional_attention"] = true;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'use_bidirectional_attention' is true"});
  j = base_config();
  j["model_type"] = "qwen2";
  j["dual_chunk_attention_config"] = {{"chunk_size", 262144}};
  expect_kvb_error([&] { parse(j); }, {kSrc, "'dual_chunk_attention_config' is", "dual chunk"});
  j = base_config();
  j["final_logit_softcapping"] = 30.0;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'final_logit_softcapping' is 30"});
  j = base_config();
  j["mlp_bias"] = true;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'mlp_bias' is true"});
  j = base_config();
  j["model_type"] = "phi3";
  j["partial_rotary_factor"] = 0.75;
  expect_kvb_error([&] { parse(j); }, {kSrc, "'partial_rotary_factor' is 0.75"});
  j = base_config();
  j["model_type"] = "gemma3";
  expect_kvb_error([&] { parse(j); }, {kSrc, "model_type 'gemma3' is the multimodal", "gemma3_text"});
}

TEST(ModelConfigFamilies, Gemma3LayersRopeAndScales) {
  json j = base_config();
  j["model_type"] = "gemma3_text";
  j.erase("hidden_act");
  j.erase("tie_word_embeddings");
  j["head_dim"] = 32;
  j["num_hidden_layers"] = 12;
  j["sliding_window"] = 512;
  j["query_pre_attn_scalar"] = 64;
  j["rope_local_base_freq"] = 10000.0;
  j["rope_theta"] = 1000000.0;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  ModelConfig c = parse(j);  // transformers 4 layout, the default pattern of 6
  std::vector<int64_t> want;
  for (int l = 0; l < 12; ++l) want.push_back((l + 1) % 6 ? 512 : 0);
  EXPECT_EQ(c.layer_windows, want);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_TRUE(c.qk_norm && c.post_norms);
  EXPECT_DOUBLE_EQ(c.embed_scale, 16.0);
  EXPECT_DOUBLE_EQ(c.attn_scale(), 0.125);
  EXPECT_DOUBLE_EQ(c.rope_local_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_TRUE(c.tied_embeddings);  // Gemma's default
  // 2 global layers hold every token, 10 window layers 511 at most.
  EXPECT_EQ(c.full_kv_bytes(4096, 2), 2 * (2 * 4096 + 10 * 511) * c.kv_dim() * 2);

  // The same model in transformers 5's layout.
  json v5 = j;
  for (const char* k : {"rope_local_base_freq", "rope_theta", "rope_scaling"}) v5.erase(k);
  v5["layer_types"] = json::array();
  for (int l = 0; l < 12; ++l) v5["layer_types"].push_back((l + 1) % 6 ? "sliding_attention" : "full_attention");
  v5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  EXPECT_EQ(parse(v5).to_json(), c.to_json());
  v5["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  expect_kvb_error([&] { parse(v5); }, {kSrc, "on the sliding-window layers is not supported"});
  v5["rope_parameters"] = {{"rope_type", "default"}};
  expect_kvb_error([&] { parse(v5); }, {kSrc, "must map full_attention and sliding_attention"});
  v5.erase("rope_parameters");
  v5["layer_types"][0] = "chunked_attention";
  expect_kvb_error([&] { parse(v5); }, {kSrc, "'layer_types' entry \"chunked_attention\""});
  v5["layer_types"] = {"full_attention"};
  expect_kvb_error([&] { parse(v5); }, {kSrc, "'layer_types' has 1 entries for 12 layers"});
}

}  // namespace
}  // namespace kvb
