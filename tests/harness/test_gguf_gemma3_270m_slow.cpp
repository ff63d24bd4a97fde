// The real Gemma 3 270M (Q4_K_M GGUF, scripts/fetch-assets.sh's optional asset: KVB_FETCH_GEMMA3=1)
// against transformers loading the same file (tests/fixtures/gguf/gemma3-270m.json, written by
// scripts/gguf-families-reference.py --gemma3-270m): at every position of three prompts, the
// logits of transformers' top 16 tokens (relative to the largest |logit|), the argmax, the summed
// NLL, and 16 greedy tokens. Skipped where the asset has not been fetched (the weights are under
// Gemma's terms, so they are not in the repository). Slow: 270M parameters in fp32.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "harness/common/asset_cache.h"
#include "harness/common/mapped_file.h"
#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using nlohmann::json;

std::string gemma_path() {
  return kvb_asset_cache_dir() + "/models/gemma-3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf";
}

TEST(GgufGemma3_270M, MatchesTransformersOnTheSameFile) {
  if (!file_exists(gemma_path()))
    GTEST_SKIP() << gemma_path() << " not fetched (KVB_FETCH_GEMMA3=1 scripts/fetch-assets.sh)";
  const json ref =
      json::parse(read_text_file(test::fixtures_dir() + "/gguf/gemma3-270m.json"));
  LoadOptions o;
  o.dtype = "fp32";
  auto m = load_model(gemma_path(), o);
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.arch, "gemma3_text");
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.dim, 640);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.n_window_layers(), 15);  // 5 of every 6 slide
  double worst = 0;
  for (const json& p : ref.at("prompts")) {
    const std::vector<int64_t> ids = p.at("ids").get<std::vector<int64_t>>();
    Engine e(m, make_default_kv(*m));
    const int64_t s = e.new_sequence();
    std::vector<at::Tensor> rows;
    e.prefill({s}, {ids}, [&](const at::Tensor& l, int64_t) { rows.push_back(l.clone()); });
    const at::Tensor logits = at::cat(rows);  // [len, vocab]
    ASSERT_EQ(logits.size(0), static_cast<int64_t>(ids.size()));
    const double scale = p.at("max_abs_logit").get<double>();
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto top_ids = p.at("top_ids")[i].get<std::vector<int64_t>>();
      const auto top = p.at("top_logits")[i].get<std::vector<double>>();
      for (size_t k = 0; k < top_ids.size(); ++k) {
        const double got = logits[i][top_ids[k]].item<double>();
        worst = std::max(worst, std::abs(got - top[k]) / scale);
      }
      EXPECT_EQ(logits[i].argmax().item<int64_t>(), top_ids[0]) << "position " << i;
    }
    Engine es(m, make_default_kv(*m));
    EXPECT_NEAR(es.score(ids).nll_sum, p.at("nll_sum").get<double>(),
                1e-4 * static_cast<double>(ids.size()));
    EXPECT_EQ(test::greedy(m, ids, 16), p.at("greedy").get<std::vector<int64_t>>());
  }
  std::cout << "[ gemma-3-270m ] max relative logit error vs transformers (top 16): " << worst
            << "\n";
  RecordProperty("max_rel_logit_err", std::to_string(worst));
  EXPECT_LT(worst, 1e-4);
}

// The qa protocol end to end on the real model in Gemma's turn format (its GGUF has no template,
// so `auto` would be none): a passkey at 256 tokens, one depth, snapkv at half the context beside
// the full cache. The full cache answers it (results/gemma3-270m.md: 3 of 3 depths at 256), the
// sample records the template, and the ledger holds the windowed full cache's bytes.
TEST(GgufGemma3_270M, PasskeyInGemmasTurnFormat) {
  if (!file_exists(gemma_path()))
    GTEST_SKIP() << gemma_path() << " not fetched (KVB_FETCH_GEMMA3=1 scripts/fetch-assets.sh)";
  const std::string dir = test::make_temp_dir("gemma3_qa");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const json cfg =
      resolve_run_config({{"model", gemma_path()},
                          {"threads", 2},
                          {"method", {{"name", "snapkv"}, {"params", {{"budget", 0.5}}}}},
                          {"protocol",
                           {{"name", "qa"},
                            {"source", "synthetic"},
                            {"task", "passkey"},
                            {"length", 256},
                            {"num_samples", 1},
                            {"depths", "0.5"},
                            {"chat_template", "gemma"}}}});
  const RunOutcome o = execute_run(cfg, db, env);
  ASSERT_EQ(o.samples_total, 1);
  EXPECT_EQ(test::metric(o.metrics, "full_accuracy"), 1.0);
  EXPECT_GT(test::metric(o.metrics, "compression_ratio"), 1.0);
  const auto samples = db.samples(o.run_id);
  ASSERT_EQ(samples.size(), 1u);
  const json out = json::parse(samples[0].output_json);
  EXPECT_EQ(out.at("chat_template"), "gemma") << samples[0].output_json.substr(0, 400);
  std::cout << "[ gemma-3-270m ] passkey at 256 in Gemma's turn format: full "
            << test::metric(o.metrics, "full_accuracy") << ", snapkv 0.5 "
            << test::metric(o.metrics, "accuracy") << "\n";
}

}  // namespace
}  // namespace kvb
