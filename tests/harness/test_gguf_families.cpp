// GGUF checkpoints of the Qwen2, Qwen3, Phi-3 (also with LongRoPE's factor tensors), Gemma 3 and
// Llama (llama3 RoPE scaling as rope_freqs) architectures against Hugging Face transformers:
// tests/fixtures/gguf/<arch>/model.gguf is a tiny random-weight model converted with llama.cpp's
// rules (scripts/gguf-families-reference.py: its names, q/k permuted for llama only, Gemma's norms
// with the 1 added, BF16 matrices, the RoPE factor tensors), and kvbench must give the logits
// transformers computed for the same weights (max |diff| / max |ref| <= 1e-4 per prompt) and the
// same greedy tokens, on the fast CPU path and the generic LibTorch path, whole and chunked.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/engine/engine.h"
#include "harness/engine/transformer.h"
#include "harness/formats/safetensors.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using nlohmann::json;

std::string fixture_dir(const std::string& arch) { return test::fixtures_dir() + "/gguf/" + arch; }

struct Reference {
  json hf_config;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<at::Tensor> logits;  // [len, vocab] fp32 per prompt
  std::vector<int64_t> greedy;     // continuation of prompts[0]
};

Reference read_reference(const std::string& arch) {
  Reference r;
  const json j = json::parse(read_text_file(fixture_dir(arch) + "/reference.json"));
  r.hf_config = j.at("hf_config");
  r.prompts = j.at("prompts").get<std::vector<std::vector<int64_t>>>();
  r.greedy = j.at("greedy").get<std::vector<int64_t>>();
  SafetensorsFile f(fixture_dir(arch) + "/logits.safetensors");
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const StTensor& t = f.get("prompt." + std::to_string(i));
    r.logits.push_back(at::from_blob(const_cast<uint8_t*>(t.data), t.shape, at::kFloat).clone());
  }
  return r;
}

std::shared_ptr<Model> load_gguf_fixture(const std::string& arch) {
  LoadOptions o;
  o.dtype = "fp32";
  return load_model(fixture_dir(arch) + "/model.gguf", o);
}

at::Tensor prompt_logits(const std::shared_ptr<Model>& m, const std::vector<int64_t>& ids,
                         int64_t chunk = 512) {
  EngineOptions eo;
  eo.prefill_chunk = chunk;
  Engine e(m, make_default_kv(*m), eo);
  const int64_t s = e.new_sequence();
  std::vector<at::Tensor> rows;
  e.prefill({s}, {ids}, [&](const at::Tensor& l, int64_t) { rows.push_back(l.clone()); });
  return at::cat(rows);
}

double rel_err(const at::Tensor& got, const at::Tensor& ref) {
  EXPECT_EQ(got.sizes(), ref.sizes());
  if (got.sizes() != ref.sizes()) return 1e9;
  return (got - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

class GgufFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufFamily, LogitsAndGreedyMatchTransformers) {
  const std::string arch = GetParam();
  const Reference ref = read_reference(arch);
  auto m = load_gguf_fixture(arch);
  EXPECT_EQ(m->config.format, "gguf");
  EXPECT_EQ(m->config.arch, parse_hf_config(ref.hf_config.dump(), "hf_config").arch);
  // llama.cpp's converter permutes llama's q/k rows into adjacent pairs; the others keep Hugging
  // Face's order and rotate halves.
  EXPECT_EQ(m->config.rope_style,
            m->config.arch == "llama" ? RopeStyle::kInterleaved : RopeStyle::kHalf);
  double worst = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const double err = rel_err(prompt_logits(m, ref.prompts[i]), ref.logits[i]);
    worst = std::max(worst, err);
    EXPECT_LT(err, 1e-4) << arch << " prompt " << i;
    EXPECT_GT(ref.logits[i].std().item<double>(), 0.1);  // the reference is not degenerate
  }
  std::cout << "[" << arch << " gguf] max relative logit error vs transformers: " << worst << "\n";
  RecordProperty("max_rel_logit_err", std::to_string(worst));
  ASSERT_FALSE(ref.greedy.empty());
  EXPECT_EQ(test::greedy(m, ref.prompts[0], static_cast<int64_t>(ref.greedy.size())), ref.greedy);
}

TEST_P(GgufFamily, GenericPathAndChunkedPrefillAgree) {
  const std::string arch = GetParam();
  const Reference ref = read_reference(arch);
  auto m = load_gguf_fixture(arch);
  // Chunks of 5 and 1 cross Gemma's 6-token windows mid-chunk and one row at a time.
  for (int64_t chunk : {5, 1})
    EXPECT_LT(rel_err(prompt_logits(m, ref.prompts[0], chunk), ref.logits[0]), 1e-4)
        << arch << " prefill_chunk " << chunk;
  set_cpu_f32_fast_path(false);
  const double generic = rel_err(prompt_logits(m, ref.prompts[0]), ref.logits[0]);
  set_cpu_f32_fast_path(true);
  EXPECT_LT(generic, 1e-4) << arch << " generic path";
}

// The metadata gives the architecture transformers' config describes, field by field.
TEST_P(GgufFamily, ConfigIsTheHuggingFaceOne) {
  const std::string arch = GetParam();
  const Reference ref = read_reference(arch);
  const ModelConfig g = load_gguf_fixture(arch)->config;
  const ModelConfig h = parse_hf_config(ref.hf_config.dump(), arch + " reference.json hf_config");
  EXPECT_EQ(g.dim, h.dim);
  EXPECT_EQ(g.hidden_dim, h.hidden_dim);
  EXPECT_EQ(g.n_layers, h.n_layers);
  EXPECT_EQ(g.n_heads, h.n_heads);
  EXPECT_EQ(g.n_kv_heads, h.n_kv_heads);
  EXPECT_EQ(g.head_dim, h.head_dim);
  EXPECT_EQ(g.vocab_size, h.vocab_size);
  EXPECT_EQ(g.rope_theta, h.rope_theta);
  if (h.rope_scaling.type == "llama3") {
    // llama.cpp's converter stores llama3 scaling as per-frequency divisors (rope_freqs).
    EXPECT_EQ(g.rope_scaling.type, "factors");
  } else {
    EXPECT_EQ(g.rope_scaling.type, h.rope_scaling.type);
  }
  if (h.rope_scaling.type == "linear") EXPECT_EQ(g.rope_scaling.factor, h.rope_scaling.factor);
  // The frequencies themselves, each set: the GGUF's factors are float32.
  for (RopeFactors set : {RopeFactors::kShort, RopeFactors::kLong}) {
    const std::vector<double> gf = rope_inv_freq(g, set), hf = rope_inv_freq(h, set);
    ASSERT_EQ(gf.size(), hf.size());
    for (size_t i = 0; i < gf.size(); ++i) EXPECT_NEAR(gf[i] / hf[i], 1.0, 1e-6) << i;
  }
  EXPECT_NEAR(g.rope_scaling.attention_factor, h.rope_scaling.attention_factor, 1e-6);
  if (h.rope_scaling.switches())
    EXPECT_EQ(g.rope_scaling.original_max_position_embeddings,
              h.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(g.rope_local_theta, h.rope_local_theta);
  EXPECT_EQ(g.layer_windows, h.layer_windows);
  EXPECT_EQ(g.qkv_bias, h.qkv_bias);
  EXPECT_EQ(g.qk_norm, h.qk_norm);
  EXPECT_EQ(g.post_norms, h.post_norms);
  EXPECT_EQ(g.activation, h.activation);
  EXPECT_EQ(g.embed_scale, h.embed_scale);
  EXPECT_EQ(g.attn_scale(), h.attn_scale());
  EXPECT_EQ(g.final_logit_softcap, h.final_logit_softcap);
  EXPECT_EQ(g.tied_embeddings, h.tied_embeddings);
  EXPECT_EQ(g.bos_id, h.bos_id);
  EXPECT_EQ(g.eos_ids, h.eos_ids);
  if (arch == "gemma3") {
    // llama.cpp's default period of 6: five window layers, then a global one.
    EXPECT_EQ(g.layer_windows, (std::vector<int64_t>{6, 6, 6, 6, 6, 0}));
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufFamily,
                         ::testing::Values("qwen2", "qwen3", "phi3", "gemma3", "llama3",
                                           "phi3_longrope"),
                         [](const auto& info) { return info.param; });

// Llama 3.1's GGUF form of llama3 scaling: rope_freqs holds one divisor per frequency, and those
// give the frequencies the config.json path computes from the parameters: one kept, two blended,
// one divided by the factor (8).
TEST(GgufFamilies, RopeFreqsGiveTheLlama3Frequencies) {
  const ModelConfig g = load_gguf_fixture("llama3")->config;
  const ModelConfig h =
      parse_hf_config(read_reference("llama3").hf_config.dump(), "llama3 hf_config");
  ASSERT_EQ(h.rope_scaling.type, "llama3");
  ASSERT_EQ(g.rope_scaling.factors.size(), 4u);
  EXPECT_EQ(g.rope_scaling.factors[0], 1.0);
  EXPECT_GT(g.rope_scaling.factors[1], 1.0);
  EXPECT_LT(g.rope_scaling.factors[2], 8.0);
  EXPECT_GT(g.rope_scaling.factors[2], g.rope_scaling.factors[1]);
  EXPECT_EQ(g.rope_scaling.factors[3], 8.0);
  const std::vector<double> gf = rope_inv_freq(g), hf = rope_inv_freq(h);
  // The converter computes the divisors in float32 and stores them so: within 1e-6.
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(gf[i] / hf[i], 1.0, 1e-6) << i;
}

// Half of LongRoPE's pair, or a factor tensor under another name, is refused by name.
TEST(GgufFamilies, RefusesFactorTensorsTheGraphDoesNotRead) {
  auto rename = [](const std::string& fixture, const std::string& from, const std::string& to) {
    std::string bytes = read_text_file(fixture_dir(fixture) + "/model.gguf");
    const size_t at = bytes.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    bytes.replace(at, from.size(), to);
    const std::string path = test::make_temp_dir("gguf_factors") + "/" + fixture + ".gguf";
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };
  auto refused = [](const std::string& path, const std::string& what) {
    try {
      load_model(path);
      ADD_FAILURE() << "expected an error: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // Same-length renames keep the file valid.
  refused(rename("phi3_longrope", "rope_factors_long.weight", "rope_factors_lonX.weight"),
          "tensor 'rope_factors_long.weight' is missing: LongRoPE needs both factor sets");
  // A rope_freqs tensor renamed away: the loader reads no factors, and the stray tensor is refused
  // rather than left out of the computation.
  refused(rename("llama3", "rope_freqs.weight", "rope_freqX.weight"),
          "tensor 'rope_freqX.weight' is not part of the llama model");
}

// A tensor the mapping does not read is refused, naming the file and the tensor, rather than left
// out of the computation: the Qwen2 fixture with its output.weight renamed reads as a tied model
// holding a stray tensor.
TEST(GgufFamilies, RefusesATensorTheMappingDoesNotRead) {
  std::string bytes = read_text_file(fixture_dir("qwen2") + "/model.gguf");
  // The name as GGUF stores it, after its u64 length, so that attn_output.weight does not match.
  const std::string from = std::string("\x0d\0\0\0\0\0\0\0", 8) + "output.weight";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at + 8, 13, "outpux.weight");
  const std::string path = test::make_temp_dir("gguf_extra_tensor") + "/stray.gguf";
  {
    std::ofstream o(path, std::ios::binary);
    o << bytes;
  }
  try {
    load_model(path);
    FAIL() << "a GGUF holding a tensor kvbench does not read loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'outpux.weight' is not part of the qwen2 model"), std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace kvb
