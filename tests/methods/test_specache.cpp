// specache on the real stories260K: with every row swapped in it is the full cache (fp16 host
// rows); swapped-in rows beat the plain low-bit copy, the speculative token beats the one-step-old
// query and the oracle beats both; a speculative step keeps only the real row; the ledger splits the device tier (codes + metadata + residual + the swap
// buffer) from the host copy exactly; fork; parameter errors.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/qa.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/lookahead.h"
#include "harness/kv/method_registry.h"
#include "methods/common/kv_codec.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(const std::string& name, const nlohmann::json& params) {
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device,
                   test::stories260k()->dtype};
  return MethodRegistry::instance().create(name, ctx, params);
}

TEST(Specache, EveryRowSwappedInIsTheFullCacheAtFp16) {
  EXPECT_LT(test::mean_story_kl("specache", {{"top_k", 100000}, {"predictor", "oracle"}}), 1e-5);
}

TEST(Specache, ALaterPromptChunkSwapsRowByRow) {
  // A question after a compressed context (qa): each of its rows reads its own mix. With every row
  // swapped in it matches the full cache; with a small top-k, the question's rows are counted as
  // swap reads (predicted by the row before) and beat the low-bit copy alone.
  auto m = test::stories260k();
  std::vector<int64_t> ctx = {1}, question;
  for (int i = 1; i < 150; ++i) ctx.push_back(3 + (i * 37) % 500);
  for (int i = 0; i < 12; ++i) question.push_back(20 + (i * 13) % 300);
  auto logits = [&](const std::string& method, const nlohmann::json& p,
                    std::map<std::string, double>* counters) {
    Engine e(m, make(method, p));
    const int64_t a = e.new_sequence();
    e.prefill({a}, {ctx});
    at::Tensor out = e.prefill({a}, {question}, nullptr, /*call_end_prefill=*/false);
    if (counters) *counters = e.kv().counters();
    return out;
  };
  std::map<std::string, double> all, few;
  at::Tensor full = logits("full", {}, nullptr);
  at::Tensor exact = logits("specache", {{"top_k", 100000}, {"predictor", "oracle"}}, &all);
  at::Tensor some = logits("specache", {{"top_k", 8}}, &few);
  at::Tensor lowbit = logits(
      "kivi", {{"k_bits", 2}, {"v_bits", 2}, {"group_size", 64}, {"residual_length", 64}}, nullptr);
  EXPECT_LT((exact - full).abs().max().item<double>(), 1e-2);
  EXPECT_EQ(all.at("swap_steps"), 12 * m->config.n_layers);
  // Row 0 has no earlier query (no decode yet): low-bit only; rows 1..11 are predicted.
  EXPECT_EQ(few.at("lowbit_only_reads"), m->config.n_layers);
  EXPECT_EQ(few.at("swap_steps"), 11 * m->config.n_layers);
  EXPECT_LT((some - full).abs().max().item<double>(), (lowbit - full).abs().max().item<double>());
}

TEST(Specache, SwappedRowsBeatTheLowBitCopyAndTheOracleBeatsTheOldQuery) {
  const double kivi = test::mean_story_kl(
      "kivi", {{"k_bits", 2}, {"v_bits", 2}, {"group_size", 64}, {"residual_length", 64}});
  std::map<std::string, double> cp, co, cs;
  const double prev = test::mean_story_kl("specache", {{"top_k", 16}, {"predictor", "previous"}}, 2, 1, &cp);
  const double spec = test::mean_story_kl("specache", {{"top_k", 16}}, 2, 1, &cs);
  const double oracle =
      test::mean_story_kl("specache", {{"top_k", 16}, {"predictor", "oracle"}}, 2, 1, &co);
  EXPECT_LT(prev, 0.5 * kivi) << "kivi " << kivi;
  EXPECT_LT(oracle, 0.5 * prev);
  // The speculative query is the next token's (at the right position, after the real token) when
  // the guess is right, and near it when not: between the old query and the oracle. The stream
  // protocol feeds the reference text, and each guess is conditioned on the one before it (the
  // paper's chain: the speculative row's argmax), so few guesses are exactly right (9% measured).
  EXPECT_LT(spec, prev);
  EXPECT_GT(spec, oracle);
  ASSERT_TRUE(cs.count("speculative_hit_rate"));
  EXPECT_GT(cs.at("speculative_hit_rate"), 0.02);
  EXPECT_LT(cs.at("speculative_hit_rate"), 0.95);
  EXPECT_GT(cs.at("predictor_overlap"), cp.at("predictor_overlap"));
  std::cerr << "speculative " << spec << ", hit rate " << cs.at("speculative_hit_rate")
            << ", overlap " << cs.at("predictor_overlap") << "\n";
  // The old query's top-16 overlaps the current one's, partly.
  ASSERT_TRUE(cp.count("predictor_overlap"));
  EXPECT_GT(cp.at("predictor_overlap"), 0.2);
  EXPECT_LT(cp.at("predictor_overlap"), 1.0);
  // 16 rows per head and step, fewer only while a window's first tokens are fewer than 16.
  EXPECT_GT(cp.at("exact_rows_per_head_step"), 15);
  EXPECT_LE(cp.at("exact_rows_per_head_step"), 16);
  std::cerr << "kivi " << kivi << ", previous " << prev << ", oracle " << oracle << ", overlap "
            << cp.at("predictor_overlap") << "\n";
  EXPECT_GT(co.at("swap_steps"), cp.at("swap_steps"));  // the oracle also swaps on the first step
}

TEST(Specache, LedgerSplitsTheDeviceTierFromTheHostCopy) {
  auto m = test::stories260k();
  const auto& c = m->config;
  Engine e(m, make("specache", {{"top_k", 16}, {"predictor", "previous"}}));
  int64_t a = e.new_sequence(), b = e.new_sequence();
  std::vector<int64_t> pa = {1}, pb = {1};
  for (int i = 1; i < 150; ++i) pa.push_back(3 + (i * 37) % 500);
  for (int i = 1; i < 40; ++i) pb.push_back(3 + (i * 11) % 500);
  e.prefill({a, b}, {pa, pb});
  for (int i = 0; i < 10; ++i) e.decode({a, b}, {300 + i, 400 + i});
  const Footprint f = e.kv().footprint();
  const int64_t tokens = 160 + 50;
  EXPECT_EQ(f.tokens_held, tokens);
  EXPECT_EQ(f.host_bytes, tokens * c.n_layers * 2 * c.kv_dim() * 2);  // fp16 K and V
  QuantCodec codec(
      "ref", QuantCodec::kivi_key(2, 64, 64, RowDtype::kF16),
      QuantCodec::kivi_value(2, adapt_channel_group(64, c.head_dim), 64, RowDtype::kF16));
  CodecBytes want;
  for (int64_t len : {160, 50})
    for (int l = 0; l < c.n_layers; ++l)
      for (KvKind k : {KvKind::kKey, KvKind::kValue})
        want += codec.expected_bytes(k, l, c.kv_dim(), len);
  const int64_t swap_buffer = 2 * c.n_layers * c.n_kv_heads * 2 * 16 * c.head_dim * 2;
  EXPECT_EQ(f.device_payload_bytes, want.payload_bytes() + swap_buffer);
  EXPECT_EQ(f.device_metadata_bytes, want.metadata_bytes);
  const auto counters = e.kv().counters();
  // The first decode step after the prompts had no prediction (per layer and sequence).
  EXPECT_EQ(counters.at("lowbit_only_reads"), 2 * c.n_layers);
  EXPECT_EQ(counters.at("swap_steps"), 9 * 2 * c.n_layers);
}

TEST(Specache, ASpeculativeStepKeepsOnlyTheRealRow) {
  auto m = test::stories260k();
  const auto& c = m->config;
  std::vector<int64_t> p = {1};
  for (int i = 1; i < 150; ++i) p.push_back(3 + (i * 37) % 500);
  Engine e(m, make("specache", {{"top_k", 16}}));
  ASSERT_NE(wanting_lookahead(e.kv()), nullptr);
  const int64_t a = e.new_sequence();
  e.prefill({a}, {p});
  for (int i = 0; i < 10; ++i) {
    at::Tensor l = e.decode({a}, {300 + i});
    EXPECT_EQ(l.size(0), 1);
  }
  EXPECT_EQ(e.kv().seq_len(a), 160);
  EXPECT_EQ(e.position(a), 160);
  EXPECT_EQ(e.kv().footprint().host_bytes, 160 * c.n_layers * 2 * c.kv_dim() * 2);
  const auto k = e.kv().counters();
  // Pre-decoding reads the low-bit copy alone; every real step after it is predicted.
  EXPECT_EQ(k.at("lowbit_only_reads"), c.n_layers);
  EXPECT_EQ(k.at("swap_steps"), 10 * c.n_layers);
  // The fed tokens are not what the model predicts: the guesses miss.
  EXPECT_LT(k.at("speculative_hit_rate"), 0.5);
  // Fed its own greedy tokens, every guess but the first is right.
  Engine g(m, make("specache", {{"top_k", 16}}));
  const int64_t s = g.new_sequence();
  at::Tensor l = g.prefill({s}, {p});
  for (int i = 0; i < 12; ++i) l = g.decode({s}, {l[0].argmax().item<int64_t>()});
  EXPECT_GT(g.kv().counters().at("speculative_hit_rate"), 0.85);
}

TEST(Specache, QaSamplesCarryTheStoresCounters) {
  // The qa protocol stores the method's counters with each sample, as stream does: here how often
  // SpeCache's guesses were right while it answered greedily.
  QaSample s;
  s.key = "k";
  s.context = "Tom had a red ball. He liked to play with the ball every day. One day the ball went up a tree.";
  s.items.push_back({"Tom had a red", {"ball"}, "exact_match", {}});
  s.max_new_tokens = 8;
  QaOptions o;
  Tokenizer tok(test::stories260k()->tokenizer_path);
  const QaSampleResult r = run_qa_sample(test::stories260k(), tok, "specache", nlohmann::json{{"top_k", 8}}, s, o);
  ASSERT_TRUE(r.counters.count("speculative_hit_rate"));
  EXPECT_GT(r.counters.at("speculative_hit_rate"), 0.5);
  EXPECT_EQ(QaSampleResult::from_json(r.to_json()).counters, r.counters);
}

TEST(Specache, ForkedBranchesContinueAlike) {
  auto m = test::stories260k();
  Engine e(m, make("specache", {{"top_k", 8}}));
  int64_t a = e.new_sequence();
  std::vector<int64_t> p = {1};
  for (int i = 1; i < 120; ++i) p.push_back(3 + (i * 29) % 500);
  e.prefill({a}, {p});
  e.decode({a}, {301});
  const int64_t f = e.fork(a);
  for (int i = 0; i < 5; ++i) {
    at::Tensor x = e.decode({a}, {310 + i}), y = e.decode({f}, {310 + i});
    EXPECT_TRUE(at::equal(x, y)) << i;
  }
}

TEST(Specache, RefusesBadParametersNamingThem) {
  auto expect_error = [&](const nlohmann::json& p, const std::string& want) {
    try {
      make("specache", p);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error({{"residual_length", 40}}, "residual_length");
  expect_error({{"bits", 8}}, "bits");
  expect_error({{"predictor", "psychic"}}, "predictor");
  expect_error({{"topk", 4}}, "topk");
}

}  // namespace
}  // namespace kvb
