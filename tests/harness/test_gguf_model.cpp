// GGUF models end to end on small files: stories260K.gguf gives the llama2.c checkpoint's weights and
// logits (the same weights, adjacent-pair RoPE); model specs that name a .gguf or a directory holding
// one load; bad tensors are refused naming the file and the tensor. SmolLM2's reference values are
// in test_gguf_smollm2_slow.cpp.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/engine/engine.h"
#include "tests/base/gguf_test_writer.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

const std::vector<int64_t> kStoriesSentence = {1,   385, 328, 432, 261, 280, 305, 330, 272,
                                               414, 444, 272, 277, 264, 261, 262, 415, 271,
                                               422, 410, 354, 422, 318, 264, 285, 265, 334,
                                               341, 334, 412, 433, 259, 276, 411, 426};

TEST(GgufModel, Stories260KGgufGivesTheLlama2cLogits) {
  auto bin = load_model(test::models_dir() + "/stories260K/stories260K.bin");
  auto gg = load_model(test::models_dir() + "/stories260K/stories260K.gguf");
  EXPECT_EQ(gg->config.format, "gguf");
  EXPECT_EQ(gg->config.name, "stories260K");
  EXPECT_EQ(gg->config.rope_style, RopeStyle::kInterleaved);
  EXPECT_TRUE(gg->config.add_bos);
  EXPECT_EQ(gg->tokenizer_path, gg->source);  // the vocabulary is in the file
  EXPECT_EQ(gg->config.parameter_count(), bin->config.parameter_count() + 512 * 64);  // own head
  // The same weights, bit for bit (the GGUF's output.weight is a copy of the tied embedding).
  EXPECT_TRUE(at::equal(gg->weights.embedding, bin->weights.embedding));
  EXPECT_TRUE(at::equal(gg->weights.lm_head, bin->weights.lm_head));
  for (size_t l = 0; l < 5; ++l) {
    EXPECT_TRUE(at::equal(gg->weights.layers[l].wqkv, bin->weights.layers[l].wqkv)) << l;
    EXPECT_TRUE(at::equal(gg->weights.layers[l].w13, bin->weights.layers[l].w13)) << l;
    EXPECT_TRUE(at::equal(gg->weights.layers[l].w2, bin->weights.layers[l].w2)) << l;
  }
  Engine eb(bin, make_default_kv(*bin)), eg(gg, make_default_kv(*gg));
  const auto rb = eb.score(kStoriesSentence), rg = eg.score(kStoriesSentence);
  EXPECT_EQ(rg.n(), 34);
  EXPECT_NEAR(rg.nll_sum, 54.4041, 5e-4);  // models/stories260K/README.md
  EXPECT_NEAR(rg.nll_sum, rb.nll_sum, 1e-6);
  EXPECT_EQ(test::greedy(gg, {1}, 64), test::greedy(bin, {1}, 64));
}

TEST(GgufModel, SpecsNamingAGgufOrADirectoryHoldingOne) {
  // The stories260K directory holds stories260K.bin and .gguf: the llama2.c checkpoint wins, as before.
  EXPECT_EQ(load_model(test::models_dir() + "/stories260K")->config.format, "llama2c");

  const std::string dir = test::make_temp_dir("gguf_specs");
  const std::string bytes = read_text_file(test::models_dir() + "/stories260K/stories260K.gguf");
  ASSERT_EQ(::mkdir((dir + "/one").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/two").c_str(), 0755), 0);
  for (const std::string& p : {dir + "/one/a.gguf", dir + "/two/a.gguf", dir + "/two/b.gguf"}) {
    std::ofstream(p, std::ios::binary) << bytes;
  }
  EXPECT_EQ(load_model(dir + "/one")->source, dir + "/one/a.gguf");
  try {
    load_model(dir + "/two");
    ADD_FAILURE() << "two .gguf files must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("several .gguf files (a.gguf, b.gguf): name one"),
              std::string::npos)
        << e.what();
  }
}

// A tiny llama GGUF (dim 32, 1 layer, zero weights); `bad` names a tensor given the wrong shape
// (`mode` "shape") or a type the reader knows but cannot dequantize ("type": Q8_1).
std::string tiny_gguf(const std::string& dir, const std::string& bad = "", const std::string& mode = "") {
  ptest::GgBuild b;
  b.str("general.architecture", "llama");
  b.u32("llama.embedding_length", 32);
  b.u32("llama.feed_forward_length", 32);
  b.u32("llama.block_count", 1);
  b.u32("llama.attention.head_count", 2);
  b.u32("llama.context_length", 64);
  b.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  b.u32("llama.vocab_size", 16);
  auto add = [&](const std::string& name, std::vector<uint64_t> dims) {
    uint32_t type = 0;
    if (name == bad && mode == "shape") dims.back() *= 2;
    const uint64_t rows = dims.size() == 2 ? dims[1] : 1;
    size_t nbytes = 4 * dims[0] * rows;
    if (name == bad && mode == "type") {
      type = 9;                          // Q8_1: 36 bytes per 32
      nbytes = dims[0] / 32 * 36 * rows;
    }
    b.tensors.push_back({name, dims, type, std::string(nbytes, '\0')});
  };
  add("token_embd.weight", {32, 16});
  add("output_norm.weight", {32});
  add("blk.0.attn_norm.weight", {32});
  add("blk.0.ffn_norm.weight", {32});
  for (const char* n : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                        "blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
                        "blk.0.ffn_down.weight"})
    add(n, {32, 32});
  const std::string path = dir + "/tiny-" + (bad.empty() ? "ok" : bad + "-" + mode) + ".gguf";
  std::ofstream(path, std::ios::binary) << b.bytes();
  return path;
}

TEST(GgufModel, TinyFilesLoadAndBadTensorsAreRefused) {
  const std::string dir = test::make_temp_dir("gguf_tiny");
  auto ok = load_model(tiny_gguf(dir));
  EXPECT_EQ(ok->config.dim, 32);
  EXPECT_EQ(ok->config.head_dim, 16);
  EXPECT_TRUE(ok->config.tied_embeddings);
  EXPECT_EQ(ok->weights.layers[0].wqkv.sizes(), (std::vector<int64_t>{96, 32}));
  struct Case {
    std::string tensor, mode, message;
  };
  for (const Case& c : std::vector<Case>{
           {"blk.0.attn_k.weight", "shape",
            "tensor 'blk.0.attn_k.weight' has shape [64, 32] but the metadata implies [32, 32]"},
           {"output_norm.weight", "shape",
            "tensor 'output_norm.weight' has shape [64] but the metadata implies [32]"},
           {"blk.0.ffn_down.weight", "type",
            "tensor 'blk.0.ffn_down.weight' is Q8_1, which cannot be dequantized"}}) {
    const std::string path = tiny_gguf(dir, c.tensor, c.mode);
    try {
      load_model(path);
      ADD_FAILURE() << c.tensor << " " << c.mode << ": not refused";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace kvb
