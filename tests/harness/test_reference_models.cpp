// The acceptance checks of the inference core against the real stories260K model in both formats:
// greedy text, sentence NLL, tokenizer ids, and identical logits across the two RoPE conventions.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/engine/engine.h"
#include "harness/formats/tokenizer.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

// llama2.c doc/stories260K.md, reproduced in models/stories260K/README.md: greedy from BOS, 256 steps.
const char* kGreedyReference =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She "
    "said, \"I want to play with your ball, but I can't find it.\"\n"
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to "
    "do.\"\n"
    "Lily didn't want to help her mom, so she said, \"I'm sorry, mom. I didn't know what to do.\" "
    "Her mom said, \"Don't worry, Lily. We can help you.";

const char* kSentence = "One day, a clever fox found a shiny key under the old oak tree.";
const std::vector<int64_t> kSentenceIds = {1,   385, 328, 432, 261, 280, 305, 330, 272, 414, 444, 272,
                                           277, 264, 261, 262, 415, 271, 422, 410, 354, 422, 318, 264,
                                           285, 265, 334, 341, 334, 412, 433, 259, 276, 411, 426};

std::string model_path(const std::string& name) { return test::models_dir() + "/" + name; }

std::shared_ptr<Model> load(const std::string& name, const std::string& dtype = "fp32") {
  LoadOptions o;
  o.dtype = dtype;
  return load_model(model_path(name), o);
}

class BothFormats : public ::testing::TestWithParam<std::string> {};

TEST_P(BothFormats, GreedyFromBosReproducesReferenceText) {
  auto m = load(GetParam());
  Tokenizer tok(m->tokenizer_path);
  Engine e(m, make_default_kv(*m));
  GenerateOptions g;
  g.max_new_tokens = 256;
  g.stop_ids = {m->config.bos_id, 2};
  auto r = e.generate({{m->config.bos_id}}, g);
  ASSERT_EQ(r.tokens[0].size(), 256u);
  EXPECT_EQ(tok.decode(r.tokens[0]), kGreedyReference);
}

TEST_P(BothFormats, SentenceNllMatchesReference) {
  auto m = load(GetParam());
  Tokenizer tok(m->tokenizer_path);
  std::vector<int64_t> ids = {m->config.bos_id};
  auto t = tok.encode(kSentence);
  ids.insert(ids.end(), t.begin(), t.end());
  EXPECT_EQ(ids, kSentenceIds);
  Engine e(m, make_default_kv(*m));
  auto r = e.score(ids);
  EXPECT_EQ(r.n(), 34);
  EXPECT_NEAR(r.nll_sum, 54.4041, 5e-4);
  EXPECT_NEAR(r.ppl(), 4.95364, 1e-4);
}

TEST_P(BothFormats, ChunkedPrefillGivesTheSameNll) {
  auto m = load(GetParam());
  double whole = 0;
  for (int64_t chunk : {512, 7, 1}) {
    EngineOptions o;
    o.prefill_chunk = chunk;
    Engine e(m, make_default_kv(*m, /*block_size=*/chunk == 7 ? 5 : 16), o);
    double nll = e.score(kSentenceIds).nll_sum;
    if (chunk == 512) whole = nll;
    EXPECT_NEAR(nll, whole, 1e-4) << "prefill_chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Stories260K, BothFormats,
                         ::testing::Values("stories260K", "stories260K-hf"));

TEST(ReferenceModels, TokenizerReproducesReadmeIds) {
  Tokenizer tok(model_path("stories260K/tok512.model"));
  EXPECT_EQ(tok.encode("Once upon a time, there was a little girl named Lily."),
            (std::vector<int64_t>{403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395,
                                  317, 426}));
}

TEST(ReferenceModels, BothFormatsGiveTheSameLogits) {
  auto a = load("stories260K");
  auto b = load("stories260K-hf");
  ASSERT_EQ(a->config.rope_style, RopeStyle::kInterleaved);
  ASSERT_EQ(b->config.rope_style, RopeStyle::kHalf);
  std::vector<at::Tensor> logits[2];
  int i = 0;
  for (auto m : {a, b}) {
    Engine e(m, make_default_kv(*m));
    int64_t s = e.new_sequence();
    std::vector<int64_t> input(kSentenceIds.begin(), kSentenceIds.end());
    e.prefill({s}, {input}, [&](const at::Tensor& l, int64_t) { logits[i].push_back(l.clone()); });
    ++i;
  }
  at::Tensor la = at::cat(logits[0]), lb = at::cat(logits[1]);
  ASSERT_EQ(la.sizes(), lb.sizes());
  const double max_diff = (la - lb).abs().max().item<double>();
  RecordProperty("max_abs_logit_diff", std::to_string(max_diff));
  EXPECT_LT(max_diff, 1e-4);
  EXPECT_GT(la.abs().max().item<double>(), 1.0);  // not a degenerate all-zero comparison
}

// bf16 on CPU runs; its KL to fp32 on the README sentence is reported (and sane).
TEST(ReferenceModels, Bf16OnCpuRunsAndStaysCloseToFp32) {
  auto f32 = load("stories260K-hf", "fp32");
  auto b16 = load("stories260K-hf", "bf16");
  at::Tensor lp[2];
  int i = 0;
  for (auto m : {f32, b16}) {
    Engine e(m, make_default_kv(*m));
    int64_t s = e.new_sequence();
    std::vector<int64_t> input(kSentenceIds.begin(), kSentenceIds.end() - 1);
    e.prefill({s}, {input}, [&](const at::Tensor& l, int64_t) {
      lp[i] = at::log_softmax(l.to(at::kDouble), -1);
    });
    ++i;
  }
  // KL(p_fp32 || p_bf16) per position, mean over the 34 predicted positions.
  at::Tensor kl = (lp[0].exp() * (lp[0] - lp[1])).sum(-1);
  const double mean_kl = kl.mean().item<double>();
  std::cout << "[bf16] mean KL(fp32 || bf16) over 34 positions = " << mean_kl
            << " nats, max = " << kl.max().item<double>() << "\n";
  RecordProperty("bf16_mean_kl", std::to_string(mean_kl));
  EXPECT_GT(mean_kl, 0.0);   // bf16 really ran at lower precision
  EXPECT_LT(mean_kl, 0.05);  // and is still the same model
}

}  // namespace
}  // namespace kvb
