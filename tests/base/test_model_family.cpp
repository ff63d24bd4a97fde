// The model family descriptors (harness/formats/model_family.h), as a contract every family meets
// for free: a config.json giving only the required sizes reads with exactly the defaults its
// descriptor states, and the GGUF name maps back to the same family. A family added to
// model_family.cpp is covered here without a line of its own; its fixture checks the computation.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <set>

#include "harness/formats/model_config.h"
#include "harness/formats/model_family.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using nlohmann::json;

TEST(ModelFamilies, AMinimalConfigReadsWithTheDescriptorsDefaults) {
  ASSERT_GE(model_families().size(), 6u);
  for (const ModelFamily& f : model_families()) {
    SCOPED_TRACE(f.hf_type);
    const json j = {{"model_type", f.hf_type},   {"hidden_size", 64}, {"intermediate_size", 128},
                    {"num_hidden_layers", 2},    {"num_attention_heads", 4},
                    {"vocab_size", 32}};
    const ModelConfig c = parse_hf_config(j.dump(), "config.json");
    EXPECT_EQ(c.arch, f.hf_type);
    EXPECT_EQ(&family_of(c), &f);
    EXPECT_EQ(c.head_dim, f.head_dim > 0 ? f.head_dim : 16);
    EXPECT_EQ(c.max_seq_len, f.max_position_embeddings);
    EXPECT_EQ(c.norm_eps, f.rms_norm_eps);
    EXPECT_EQ(c.tied_embeddings, f.tie_word_embeddings);
    EXPECT_EQ(c.bos_id, f.bos_token_id);
    EXPECT_EQ(c.eos_ids, f.eos_token_ids);
    EXPECT_EQ(c.activation == Activation::kGeluTanh, f.activation == "gelu_pytorch_tanh");
    EXPECT_EQ(c.qkv_bias, f.qkv_bias);
    EXPECT_EQ(c.qk_norm, f.qk_norm);
    EXPECT_EQ(c.post_norms, f.gemma_block);
    EXPECT_EQ(c.layer_windows.empty(), f.windows != WindowRule::kPattern);
    EXPECT_FALSE(f.config_class.empty());
  }
}

TEST(ModelFamilies, NamesAreUniqueAndEveryGgufNameMapsBack) {
  std::set<std::string> hf, gguf;
  for (const ModelFamily& f : model_families()) {
    EXPECT_TRUE(hf.insert(f.hf_type).second) << f.hf_type;
    if (f.gguf_arch.empty()) continue;
    EXPECT_TRUE(gguf.insert(f.gguf_arch).second) << f.gguf_arch;
    EXPECT_EQ(family_of_gguf_arch(f.gguf_arch, "x.gguf").hf_type, f.hf_type);
  }
  ptest::expect_kvb_error([] { family_of_hf_type("gpt2", "config.json"); },
                          {"config.json", "model_type 'gpt2' is not supported (llama, mistral"});
  ptest::expect_kvb_error([] { family_of_gguf_arch("falcon", "x.gguf"); },
                          {"x.gguf", "general.architecture 'falcon' is not supported (llama, qwen2"});
}

}  // namespace
}  // namespace kvb
