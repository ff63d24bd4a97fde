// SmolLM2-135M-Instruct Q4_1 (GGUF) reproduces its README's reference values, an independent numpy
// forward pass of the dequantized file: the sentence NLL without BOS, the greedy continuations of the
// plain and the chat prompt; through the engine and through the CLI. Slow: the model is 540 MB in
// fp32 and the CLI loads it three times (about 25 s here).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/engine/engine.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::string smollm2_dir() { return test::models_dir() + "/smollm2-135m-instruct"; }
std::string smollm2_gguf() { return smollm2_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

// SmolLM2 is 540 MB in fp32: load it once for the tests that need it.
std::shared_ptr<Model> smollm2() {
  static std::shared_ptr<Model> m = load_model(smollm2_gguf());
  return m;
}

nlohmann::json smollm2_reference() {
  return nlohmann::json::parse(read_text_file(smollm2_dir() + "/reference.json"));
}

TEST(GgufSmolLM2, ConfigAndWeights) {
  auto m = smollm2();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.format, "gguf");
  EXPECT_EQ(c.name, "SmolLM2-135M-Instruct.Q4_1");
  EXPECT_EQ(c.weights_dtype, "Q4_1");
  EXPECT_FALSE(c.add_bos);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.parameter_count(), 134515008);
  EXPECT_EQ(m->weights.lm_head.data_ptr(), m->weights.embedding.data_ptr());  // tied: one copy
  ASSERT_EQ(m->weights.layers.size(), 30u);
  EXPECT_EQ(m->weights.layers[0].wqkv.sizes(), (std::vector<int64_t>{576 + 2 * 192, 576}));
  EXPECT_EQ(m->weights.layers[0].w13.sizes(), (std::vector<int64_t>{2 * 1536, 576}));
  EXPECT_EQ(m->weight_bytes(), 134515008 * 4);
  // Row 2705 of the Q8_0 embedding, block 0, is in the gguf-py fixture (first element 2705 * 576).
  const auto j = nlohmann::json::parse(
      read_text_file(test::fixtures_dir() + "/gguf/smollm2_blocks.json"));
  int checked = 0;
  for (const auto& b : j["blocks"]) {
    if (b["tensor"] != "token_embd.weight") continue;
    const int64_t first = b["first_element"];
    const at::Tensor row = m->weights.embedding.view(-1).narrow(0, first, 32);
    for (int64_t i = 0; i < 32; ++i)
      EXPECT_EQ(row[i].item<float>(), b["values"][static_cast<size_t>(i)].get<float>()) << first + i;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(GgufSmolLM2, SentenceNllWithoutBos) {
  auto m = smollm2();
  const auto ref = smollm2_reference()["sentence"];
  const std::vector<int64_t> ids = ref["ids"];
  ASSERT_EQ(ids.size(), 16u);
  EXPECT_EQ(ids[0], 2705);  // no BOS
  Engine e(m, make_default_kv(*m));
  const auto r = e.score(ids);
  EXPECT_EQ(r.n(), 15);
  const double want = ref["sum_nll"];  // 56.478160937614206
  EXPECT_NEAR(r.nll_sum, want, 1e-3 * want);
  EXPECT_NEAR(r.ppl(), ref["ppl"].get<double>(), 1e-3 * ref["ppl"].get<double>());
  std::cout << "[ smollm2 ] sentence NLL " << r.nll_sum << " (reference " << want << ")\n";
}

TEST(GgufSmolLM2, GreedyContinuations) {
  auto m = smollm2();
  const auto ref = smollm2_reference();
  const std::vector<int64_t> prompt = ref["plain"]["prompt_ids"];
  const std::vector<int64_t> want = ref["plain"]["out_ids"];
  ASSERT_EQ(want.size(), 24u);
  const std::vector<int64_t> got = test::greedy(m, prompt, 24);
  size_t match = 0;
  while (match < got.size() && match < want.size() && got[match] == want[match]) ++match;
  std::cout << "[ smollm2 ] plain greedy: " << match << " of 24 tokens match the reference\n";
  // " Paris.\n\nThe answer is" is robust; later steps have top-2 gaps as small as 0.06 (README).
  EXPECT_GE(match, 8u);
  // The chat prompt: "The capital of France is Paris.<|im_end|>".
  const std::vector<int64_t> chat = ref["chat"]["prompt_ids"];
  EXPECT_EQ(chat.size(), 37u);
  const std::vector<int64_t> answer = test::greedy(m, chat, 16, m->config.eos_ids);
  EXPECT_EQ(answer, (std::vector<int64_t>{504, 3575, 282, 4649, 314, 7042, 30}));  // then EOS 2
}

TEST(GgufSmolLM2, DirectoryByNameInBf16) {
  // The SmolLM2 directory holds config.json and tokenizer.json but no safetensors: it is a GGUF
  // model directory, found by name in the models path.
  LoadOptions o;
  o.models_dir = test::models_dir();
  o.dtype = "bf16";
  auto m = load_model("smollm2-135m-instruct", o);
  EXPECT_EQ(m->source, smollm2_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(m->config.format, "gguf");
  EXPECT_EQ(m->dtype, at::kBFloat16);
  EXPECT_EQ(m->weights.layers[3].wqkv.scalar_type(), at::kBFloat16);
  EXPECT_EQ(m->weights.layers[3].attn_norm.scalar_type(), at::kFloat);  // norms stay fp32
}

TEST(GgufSmolLM2, CliInspectScoreAndGenerateWithIds) {
  const std::string gguf = smollm2_gguf();
  auto r = test::run_kvbench("inspect --model " + gguf);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["add_bos_token"], false);
  EXPECT_EQ(j["tokenizer"], gguf);
  EXPECT_EQ(j["parameter_count"], 134515008);
  EXPECT_EQ(j["weights_dtype"], "Q4_1");

  // Ids need no tokenizer: the reference sentence, as given (no BOS).
  const auto ref = smollm2_reference();
  std::string ids;
  for (int64_t id : ref["sentence"]["ids"]) ids += " " + std::to_string(id);
  r = test::run_kvbench("score --model " + gguf + " --ids" + ids);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["n"], 15);
  EXPECT_NEAR(s["nll"].get<double>(), ref["sentence"]["sum_nll"].get<double>(), 0.06);
  r = test::run_kvbench("generate --model " + gguf + " --ids 504 3575 282 4649 314 -n 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "7042 30\n");  // " Paris."
  r = test::run_kvbench("score --model " + gguf + " --ids 5 49152");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--ids: id 49152 is outside the vocabulary [0, 49152)"), std::string::npos)
      << r.err;

  // A broken file: exit 2 with one line naming it.
  const std::string dir = test::make_temp_dir("gguf_cli");
  const std::string bad = dir + "/cut.gguf";
  std::ofstream(bad, std::ios::binary)
      << read_text_file(test::models_dir() + "/stories260K/stories260K.gguf").substr(0, 5000);
  r = test::run_kvbench("inspect --model " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(bad + ": "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvb
