// gguf_model_config: the llama.* metadata of a GGUF file becomes a ModelConfig (format "gguf",
// adjacent-pair RoPE, tied embeddings without output.weight, add_bos from the tokenizer keys), and
// whatever the engine does not implement is refused naming the file and the key or tensor.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/formats/gguf.h"
#include "harness/formats/model_config.h"
#include "tests/base/base_test_util.h"
#include "tests/base/gguf_test_writer.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;
using ptest::GgBuild;
using ptest::GgTensor;

// The metadata of a tiny llama: dim 16, 2 heads of 8 (1 kv head), 10 tokens. `skip` leaves one key
// out; `extra` adds entries after the others.
GgBuild tiny_llama(const std::string& skip = "", void (*extra)(GgBuild&) = nullptr) {
  GgBuild b;
  auto u32 = [&](const std::string& k, uint32_t v) {
    if (k != skip) b.u32(k, v);
  };
  if (skip != "general.architecture") b.str("general.architecture", "llama");
  u32("llama.embedding_length", 16);
  u32("llama.feed_forward_length", 40);
  u32("llama.block_count", 2);
  u32("llama.attention.head_count", 2);
  u32("llama.attention.head_count_kv", 1);
  u32("llama.rope.dimension_count", 8);
  u32("llama.context_length", 128);
  if (skip != "llama.rope.freq_base") b.f32("llama.rope.freq_base", 5000.f);
  if (skip != "llama.attention.layer_norm_rms_epsilon")
    b.f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  if (skip != "tokenizer.ggml.tokens")
    b.strings("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"});
  u32("tokenizer.ggml.bos_token_id", 3);
  u32("tokenizer.ggml.eos_token_id", 4);
  if (extra) extra(b);
  b.tensors.push_back({"blk.0.attn_norm.weight", {16}, 0, std::string(64, '\0')});
  return b;
}

// The bytes of float32 values (a small F32 tensor's data).
std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

ModelConfig config_of(const GgBuild& b, const std::string& source = "<tiny>") {
  return gguf_model_config(GgufFile(b.bytes(), source));
}

TEST(GgufModelConfig, TinyLlamaMapsEveryKey) {
  const ModelConfig c = config_of(tiny_llama());
  EXPECT_EQ(c.format, "gguf");
  EXPECT_EQ(c.dim, 16);
  EXPECT_EQ(c.hidden_dim, 40);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 10);
  EXPECT_EQ(c.max_seq_len, 128);
  EXPECT_EQ(c.rope_theta, 5000.0);
  EXPECT_EQ(c.norm_eps, static_cast<double>(1e-6f));
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_TRUE(c.tied_embeddings);  // no output.weight
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.bos_id, 3);
  EXPECT_EQ(c.eos_ids, (std::vector<int64_t>{4}));
  EXPECT_TRUE(c.add_bos);  // absent: llama.cpp's default
  EXPECT_FALSE(c.to_json().contains("add_bos_token"));  // the default leaves the config JSON as it was

  const ModelConfig d = config_of(tiny_llama("", [](GgBuild& b) {
    b.boolean("tokenizer.ggml.add_bos_token", false);
    b.str("llama.rope.scaling.type", "linear");
    b.f32("llama.rope.scaling.factor", 4.f);
    b.u32("tokenizer.ggml.eot_token_id", 5);
    b.u32("llama.vocab_size", 10);
    b.tensors.push_back({"output.weight", {16, 10}, 0, std::string(640, '\0')});
  }));
  EXPECT_FALSE(d.add_bos);
  EXPECT_EQ(d.to_json()["add_bos_token"], false);
  EXPECT_EQ(d.rope_scaling.type, "linear");
  EXPECT_EQ(d.rope_scaling.factor, 4.0);
  EXPECT_EQ(d.eos_ids, (std::vector<int64_t>{4, 5}));
  EXPECT_FALSE(d.tied_embeddings);
  // Defaults: rope.freq_base 10000, head_count_kv = head_count.
  const ModelConfig e = config_of(tiny_llama("llama.rope.freq_base"));
  EXPECT_EQ(e.rope_theta, 10000.0);
  const ModelConfig f = config_of(tiny_llama("llama.attention.head_count_kv"));
  EXPECT_EQ(f.n_kv_heads, 2);
}

TEST(GgufModelConfig, RefusesWhatTheEngineDoesNotImplement) {
  GgBuild q = tiny_llama("general.architecture");
  q.str("general.architecture", "falcon");
  expect_kvb_error([&] { config_of(q); },
                   {"<tiny>", "general.architecture 'falcon' is not supported (llama, qwen2, "
                              "qwen3, phi3, gemma3)"});
  // Keys llama.cpp's llama graph does not read but which would change the model.
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.u32("llama.attention.sliding_window", 8);
                   })); },
                   {"<tiny>", "'llama.attention.sliding_window' is 8: llama.cpp's llama graph "
                              "has no sliding window"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.f32("llama.final_logit_softcapping", 30.f);
                   })); },
                   {"<tiny>", "'llama.final_logit_softcapping' is set"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.boolean("llama.attention.causal", false);
                   })); },
                   {"<tiny>", "'llama.attention.causal' is false"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.u32("llama.expert_count", 8);
                   })); },
                   {"<tiny>", "'llama.expert_count' is set"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.tensors.push_back({"blk.0.attn_q_norm.weight", {8}, 0, std::string(32, '\0')});
                   })); },
                   {"<tiny>", "tensor 'blk.0.attn_q_norm.weight': llama.cpp's llama graph has no "
                              "q/k norms"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.tensors.push_back({"output.bias", {10}, 0, std::string(40, '\0')});
                   })); },
                   {"<tiny>", "tensor 'output.bias'"});
  expect_kvb_error([&] { config_of(tiny_llama("general.architecture")); },
                   {"<tiny>", "missing metadata key 'general.architecture'"});
  for (const char* key : {"llama.embedding_length", "llama.feed_forward_length", "llama.block_count",
                          "llama.attention.head_count", "llama.context_length",
                          "llama.attention.layer_norm_rms_epsilon"}) {
    expect_kvb_error([&] { config_of(tiny_llama(key)); },
                     {"<tiny>", std::string("missing metadata key '") + key + "'"});
  }
  GgBuild rot = tiny_llama("llama.rope.dimension_count");
  rot.u32("llama.rope.dimension_count", 4);
  expect_kvb_error([&] { config_of(rot); },
                   {"<tiny>", "'llama.rope.dimension_count' is 4 but the head size is 8",
                    "partial rotary"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.str("llama.rope.scaling.type", "yarn");
                   })); },
                   {"<tiny>", "'llama.rope.scaling.type' is 'yarn', which is not supported"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.str("llama.rope.scaling.type", "linear");
                   })); },
                   {"<tiny>", "missing metadata key 'llama.rope.scaling.factor'"});
  // rope_freqs (Llama 3.1's llama3 scaling as llama.cpp stores it): one divisor per frequency,
  // each a positive number.
  expect_kvb_error(
      [&] {
        config_of(tiny_llama("", [](GgBuild& b) {
          b.tensors.push_back({"rope_freqs.weight", {4}, 0, std::string(16, '\0')});
        }));
      },
      {"<tiny>", "'rope_freqs' entry 0 (0) must be a positive finite number"});
  expect_kvb_error(
      [&] {
        config_of(tiny_llama("", [](GgBuild& b) {
          b.tensors.push_back({"rope_freqs.weight", {3}, 0, f32_bytes({1, 2, 4})});
        }));
      },
      {"<tiny>",
       "tensor 'rope_freqs.weight' has 3 entries, but RoPE rotates "
       "head_dim / 2 = 4"});
  expect_kvb_error(
      [&] {
        config_of(tiny_llama("", [](GgBuild& b) {
          b.tensors.push_back({"blk.0.rope_freqs.weight", {4}, 0, f32_bytes({1, 2, 4, 8})});
        }));
      },
      {"<tiny>", "'blk.0.rope_freqs.weight': per-layer RoPE frequency factors"});
  const ModelConfig rf = config_of(tiny_llama("", [](GgBuild& b) {
    b.tensors.push_back({"rope_freqs.weight", {4}, 0, f32_bytes({1, 1.5, 4, 8})});
  }));
  EXPECT_EQ(rf.rope_scaling.type, "factors");
  EXPECT_EQ(rf.rope_scaling.factors, (std::vector<double>{1, 1.5, 4, 8}));
  EXPECT_EQ(rf.to_json()["rope_scaling"]["factors"], nlohmann::json({1, 1.5, 4, 8}));
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.u32("llama.vocab_size", 11);
                   })); },
                   {"<tiny>", "'llama.vocab_size' (11) differs from the token list (10 tokens)"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.tensors.push_back({"blk.0.attn_output.bias", {16}, 0, std::string(64, '\0')});
                   })); },
                   {"<tiny>", "tensor 'blk.0.attn_output.bias': biases outside q/k/v"});
  expect_kvb_error([&] { config_of(tiny_llama("", [](GgBuild& b) {
                     b.u32("llama.attention.value_length", 6);
                   })); },
                   {"<tiny>", "'llama.attention.value_length' (6) differs from the key length (8)"});
  GgBuild wrong = tiny_llama("llama.block_count");
  wrong.str("llama.block_count", "two");
  expect_kvb_error([&] { config_of(wrong); },
                   {"<tiny>", "'llama.block_count' is a string (string), not an integer"});
  GgBuild bos = tiny_llama("tokenizer.ggml.bos_token_id");
  bos.u32("tokenizer.ggml.bos_token_id", 10);
  expect_kvb_error([&] { config_of(bos); }, {"<tiny>", "'bos_token_id' 10 is outside the vocabulary"});
}

// The metadata of a tiny Gemma 3 as llama.cpp's converter writes it: 8 layers, dim 16, 2 heads of
// 8. `extra` adds entries (a pattern, a 27B-like depth).
GgBuild tiny_gemma(void (*extra)(GgBuild&) = nullptr, uint32_t layers = 8) {
  GgBuild b;
  b.str("general.architecture", "gemma3");
  b.u32("gemma3.embedding_length", 16);
  b.u32("gemma3.feed_forward_length", 40);
  b.u32("gemma3.block_count", layers);
  b.u32("gemma3.attention.head_count", 2);
  b.u32("gemma3.attention.head_count_kv", 1);
  b.u32("gemma3.attention.key_length", 12);
  b.u32("gemma3.attention.value_length", 12);
  b.u32("gemma3.context_length", 128);
  b.f32("gemma3.rope.freq_base", 1e6f);
  b.f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  b.u32("gemma3.attention.sliding_window", 4);
  b.u32("gemma3.vocab_size", 10);
  if (extra) extra(b);
  b.tensors.push_back({"blk.0.attn_norm.weight", {16}, 0, std::string(64, '\0')});
  return b;
}

TEST(GgufModelConfig, Gemma3MapsLlamaCppsRules) {
  const ModelConfig c = config_of(tiny_gemma());
  EXPECT_EQ(c.arch, "gemma3_text");
  EXPECT_EQ(c.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(c.head_dim, 12);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.post_norms);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_DOUBLE_EQ(c.embed_scale, 4.0);  // sqrt(16)
  EXPECT_EQ(c.query_pre_attn_scalar, 12.0);  // llama.cpp: 1/sqrt(head_dim)
  EXPECT_EQ(c.final_logit_softcap, 0.0);
  EXPECT_EQ(c.bos_id, 2);  // Gemma's defaults where the tokenizer keys are absent
  EXPECT_EQ(c.eos_ids, (std::vector<int64_t>{1}));
  // No pattern key: llama.cpp's period 6, the sixth layer of each period global.
  EXPECT_EQ(c.layer_windows, (std::vector<int64_t>{4, 4, 4, 4, 4, 0, 4, 4}));
  EXPECT_EQ(c.rope_local_theta, 10000.0);  // llama.cpp's rope_freq_base_train_swa default
  EXPECT_EQ(c.rope_theta, 1e6);

  const ModelConfig d = config_of(tiny_gemma([](GgBuild& b) {
    b.u32("gemma3.attention.sliding_window_pattern", 2);
    b.f32("gemma3.rope.freq_base_swa", 5000.f);
    b.f32("gemma3.final_logit_softcapping", 30.f);
    b.str("gemma3.rope.scaling.type", "linear");
    b.f32("gemma3.rope.scaling.factor", 8.f);
  }));
  EXPECT_EQ(d.layer_windows, (std::vector<int64_t>{4, 0, 4, 0, 4, 0, 4, 0}));
  EXPECT_EQ(d.rope_local_theta, 5000.0);
  EXPECT_EQ(d.final_logit_softcap, 30.0);
  EXPECT_EQ(d.rope_scaling.type, "linear");
  // Per-layer flags, as an array of bools.
  const ModelConfig e = config_of(tiny_gemma([](GgBuild& b) {
    b.bools("gemma3.attention.sliding_window_pattern",
            {true, false, false, true, true, true, true, false});
  }));
  EXPECT_EQ(e.layer_windows, (std::vector<int64_t>{4, 0, 0, 4, 4, 4, 4, 0}));
  // Pattern 1: every layer global, so no window layers at all.
  const ModelConfig g = config_of(tiny_gemma([](GgBuild& b) {
    b.u32("gemma3.attention.sliding_window_pattern", 1);
  }));
  EXPECT_TRUE(g.layer_windows.empty());
  // The 62-layer 27B scales queries by hidden / heads, llama.cpp's rule for it.
  EXPECT_EQ(config_of(tiny_gemma(nullptr, 62)).query_pre_attn_scalar, 8.0);

  expect_kvb_error([&] { config_of(tiny_gemma([](GgBuild& b) {
                     b.bools("gemma3.attention.sliding_window_pattern", {true, false});
                   })); },
                   {"<tiny>", "'gemma3.attention.sliding_window_pattern' has 2 entries for 8 "
                              "layers"});
  expect_kvb_error([&] { config_of(tiny_gemma([](GgBuild& b) {
                     b.f32("gemma3.attn_logit_softcapping", 50.f);
                   })); },
                   {"<tiny>", "'gemma3.attn_logit_softcapping' is 50: softcapping of the "
                              "attention scores is not supported"});
  expect_kvb_error([&] { config_of(tiny_gemma([](GgBuild& b) {
                     b.str("gemma3.rope.scaling.type", "yarn");
                   })); },
                   {"<tiny>", "'gemma3.rope.scaling.type' is 'yarn', which is not supported"});
}

TEST(GgufModelConfig, QwenAndPhi3) {
  GgBuild q = tiny_llama("general.architecture");
  q.str("general.architecture", "qwen2");
  // tiny_llama's keys carry the llama. prefix; the qwen2 file needs its own.
  expect_kvb_error([&] { config_of(q); }, {"<tiny>", "missing metadata key 'qwen2."});

  auto tiny = [](const std::string& arch, void (*extra)(GgBuild&)) {
    GgBuild b;
    b.str("general.architecture", arch);
    const std::string p = arch + ".";
    b.u32(p + "embedding_length", 16);
    b.u32(p + "feed_forward_length", 40);
    b.u32(p + "block_count", 2);
    b.u32(p + "attention.head_count", 2);
    b.u32(p + "context_length", 64);
    b.f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
    b.u32(p + "vocab_size", 10);
    if (extra) extra(b);
    b.tensors.push_back({"blk.0.attn_q.bias", {16}, 0, std::string(64, '\0')});
    return b;
  };
  const ModelConfig a = config_of(tiny("qwen2", nullptr));
  EXPECT_EQ(a.arch, "qwen2");
  EXPECT_EQ(a.rope_style, RopeStyle::kHalf);  // no permutation: NeoX-style rotation
  EXPECT_TRUE(a.qkv_bias);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_TRUE(a.layer_windows.empty());
  EXPECT_TRUE(config_of(tiny("qwen3", nullptr)).qk_norm);
  expect_kvb_error([&] { config_of(tiny("qwen2", [](GgBuild& b) {
                     b.u32("qwen2.attention.sliding_window", 4096);
                   })); },
                   {"<tiny>", "'qwen2.attention.sliding_window' is 4096: llama.cpp's qwen2 graph "
                              "has no sliding window"});
  // Phi-3: the window on every layer, as transformers runs it; 0 (Phi-4) is none.
  const ModelConfig p = config_of(tiny("phi3", [](GgBuild& b) {
    b.u32("phi3.attention.sliding_window", 6);
  }));
  EXPECT_EQ(p.layer_windows, (std::vector<int64_t>{6, 6}));
  EXPECT_TRUE(config_of(tiny("phi3", [](GgBuild& b) {
                b.u32("phi3.attention.sliding_window", 0);
              })).layer_windows.empty());
  // LongRoPE (Phi-3 128K, Phi-3.5): both factor sets, the switch point and the attention factor.
  const ModelConfig lr = config_of(tiny("phi3", [](GgBuild& b) {
    b.u32("phi3.rope.scaling.original_context_length", 16);
    b.f32("phi3.rope.scaling.attn_factor", 1.25f);
    b.tensors.push_back({"rope_factors_long.weight", {4}, 0, f32_bytes({1, 2, 4, 8})});
    b.tensors.push_back({"rope_factors_short.weight", {4}, 0, f32_bytes({1, 1, 1.5, 2})});
  }));
  EXPECT_EQ(lr.rope_scaling.type, "longrope");
  EXPECT_EQ(lr.rope_scaling.factors, (std::vector<double>{1, 1, 1.5, 2}));
  EXPECT_EQ(lr.rope_scaling.long_factors, (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(lr.rope_scaling.original_max_position_embeddings, 16);
  EXPECT_EQ(lr.rope_scaling.attention_factor, 1.25);
  expect_kvb_error(
      [&] {
        config_of(tiny("phi3", [](GgBuild& b) {
          b.tensors.push_back({"rope_factors_long.weight", {4}, 0, f32_bytes({1, 2, 4, 8})});
        }));
      },
      {"<tiny>",
       "tensor 'rope_factors_short.weight' is missing: LongRoPE needs "
       "both factor sets"});
  expect_kvb_error(
      [&] {
        config_of(tiny("qwen2", [](GgBuild& b) {
          b.tensors.push_back({"rope_freqs.weight", {4}, 0, f32_bytes({1, 2, 4, 8})});
        }));
      },
      {"<tiny>",
       "tensor 'rope_freqs.weight' on qwen2: llama.cpp's qwen2 graph "
       "does not read it"});
  expect_kvb_error(
      [&] {
        config_of(tiny("qwen3", [](GgBuild& b) {
          b.tensors.push_back({"rope_factors_long.weight", {4}, 0, f32_bytes({1, 2, 4, 8})});
        }));
      },
      {"<tiny>", "on qwen3: llama.cpp's qwen3 graph does not read them"});
}

TEST(GgufModelConfig, RealFiles) {
  const std::string models = ptest::models_dir();
  const ModelConfig s = gguf_model_config(
      GgufFile(models + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"));
  EXPECT_EQ(s.dim, 576);
  EXPECT_EQ(s.hidden_dim, 1536);
  EXPECT_EQ(s.n_layers, 30);
  EXPECT_EQ(s.n_heads, 9);
  EXPECT_EQ(s.n_kv_heads, 3);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.vocab_size, 49152);
  EXPECT_EQ(s.max_seq_len, 8192);
  EXPECT_EQ(s.rope_theta, 100000.0);
  EXPECT_TRUE(s.tied_embeddings);
  EXPECT_FALSE(s.add_bos);
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(s.eos_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.weights_dtype, "Q4_1");
  EXPECT_EQ(s.parameter_count(), 134515008);  // the README's count

  const ModelConfig t = gguf_model_config(GgufFile(models + "/stories260K/stories260K.gguf"));
  EXPECT_EQ(t.dim, 64);
  EXPECT_EQ(t.hidden_dim, 172);
  EXPECT_EQ(t.n_layers, 5);
  EXPECT_EQ(t.n_heads, 8);
  EXPECT_EQ(t.n_kv_heads, 4);
  EXPECT_EQ(t.head_dim, 8);
  EXPECT_EQ(t.vocab_size, 512);
  EXPECT_EQ(t.max_seq_len, 2048);
  EXPECT_FALSE(t.tied_embeddings);  // the converter wrote output.weight
  EXPECT_TRUE(t.add_bos);
  EXPECT_EQ(t.bos_id, 1);
  EXPECT_EQ(t.weights_dtype, "F32");
}

}  // namespace
}  // namespace kvb
