// oracle_topk (methods/oracle_topk): the row selection on hand-made scores, decode attention over
// exactly the top-k rows by the group's q.k against an independent LibTorch reference, budget >=
// every row = full logits bit for bit, the read fraction against a hand count, the bound beating
// Quest and SnapKV at the same budget on stories260K, and refused parameters.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "methods/oracle_topk/oracle_topk.h"
#include "tests/methods/cache_driver.h"
#include "tests/methods/method_test_util.h"
#include "tests/methods/greedy_trace.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::rnd;
using test::tiny;

CacheContext ctx_of(const Model& m) { return CacheContext{m.config, m.device, m.dtype}; }

std::unique_ptr<KvCache> make(const CacheContext& ctx, const std::string& name,
                              nlohmann::json params = nlohmann::json::object()) {
  return MethodRegistry::instance().create(name, ctx, params);
}

// Prefill a 40-token prompt in chunks of 7, then decode 10 tokens; every logit row.
at::Tensor trace(std::unique_ptr<KvCache> kv, std::map<std::string, double>* counters = nullptr) {
  return test::greedy_trace(test::stories260k(), std::move(kv), 7, counters);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(OracleTopkSelect, KeepsTheKBestRowsTiesToTheLowerRow) {
  const std::vector<float> s = {0.1f, 0.9f, 0.5f, 0.9f, -1.f};
  EXPECT_EQ(OracleTopkKvCache::select_rows(s.data(), 5, 1), (std::vector<int64_t>{1}));
  EXPECT_EQ(OracleTopkKvCache::select_rows(s.data(), 5, 2), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(OracleTopkKvCache::select_rows(s.data(), 5, 3), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(OracleTopkKvCache::select_rows(s.data(), 5, 5), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(OracleTopkKvCache::select_rows(s.data(), 5, 9), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

// Independent reference: per KV head, the group's logits q.k * scale aggregated by max or mean,
// the k best rows by a stable sort (ties to the lower row), softmax over those rows only.
// q: [Hq, D]; K, V: [rows, Hkv, D]. Returns [Hq, D].
at::Tensor topk_reference(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, int64_t k,
                          const std::string& agg) {
  const int64_t Hq = q.size(0), Hkv = K.size(1), D = q.size(1), G = Hq / Hkv, n = K.size(0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::Tensor out = at::empty({Hq, D});
  for (int64_t h = 0; h < Hkv; ++h) {
    at::Tensor logits = q.narrow(0, h * G, G).matmul(K.select(1, h).t()) * scale;  // [G, n]
    at::Tensor a = agg == "max" ? std::get<0>(logits.max(0)) : logits.mean(0);
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const float* av = a.data_ptr<float>();
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return av[x] > av[y]; });
    order.resize(static_cast<size_t>(std::min(k, n)));
    std::sort(order.begin(), order.end());
    at::Tensor idx = at::tensor(order, at::kLong);
    at::Tensor p = at::softmax(logits.index_select(1, idx), -1);
    out.narrow(0, h * G, G).copy_(p.matmul(V.select(1, h).index_select(0, idx)));
  }
  return out;
}

TEST(OracleTopkStore, DecodeAttendsExactlyOverTheTopKRowsOfEachKvHead) {
  ModelConfig c = tiny(2, 4, 2, 4);
  for (const char* agg : {"max", "mean"}) {
    auto kv = make(CacheContext{c, c10::kCPU, c10::kFloat}, "oracle_topk",
                   {{"budget", 5}, {"budget_unit", "tokens_per_head"}, {"gqa_agg", agg}});
    test::Driver d{kv.get(), 2};
    d.output_layer = -1;
    at::Tensor K = rnd({24, 2, 4}, 3) * 2, V = rnd({24, 2, 4}, 4);
    at::Tensor pre =
        d.step(rnd({16, 4, 4}, 5), K.narrow(0, 0, 16), V.narrow(0, 0, 16), Phase::kPrefill);
    EXPECT_TRUE(pre.defined());
    for (int64_t t = 16; t < 24; ++t) {
      at::Tensor q = rnd({1, 4, 4}, 70 + t) * 2;
      at::Tensor out = d.step(q, K.narrow(0, t, 1), V.narrow(0, t, 1), Phase::kDecode);
      at::Tensor want = topk_reference(q[0], K.narrow(0, 0, t + 1), V.narrow(0, 0, t + 1), 5, agg);
      EXPECT_LT(max_diff(out[0], want), 1e-5) << agg << " t " << t;
      // Not the dense answer: the selection matters at this budget.
      at::Tensor dense =
          topk_reference(q[0], K.narrow(0, 0, t + 1), V.narrow(0, 0, t + 1), 99, agg);
      EXPECT_GT(max_diff(out[0], dense), 1e-4) << agg << " t " << t;
    }
    // The whole cache stays resident.
    EXPECT_EQ(kv->footprint().tokens_held, 24);
  }
}

TEST(OracleTopkModel, BudgetCoveringEveryRowReproducesFullLogitsBitForBit) {
  auto m = test::stories260k();
  at::Tensor ref = trace(make(ctx_of(*m), "full"));
  for (nlohmann::json p : {nlohmann::json{{"budget", 1.0}},
                           nlohmann::json{{"budget", 50}, {"budget_unit", "tokens_per_head"}}}) {
    at::Tensor got = trace(make(ctx_of(*m), "oracle_topk", p));
    EXPECT_TRUE(at::equal(got, ref)) << p.dump() << " max diff " << max_diff(got, ref);
  }
}

TEST(OracleTopkModel, SmallBudgetChangesDecodeOnlyAndCountsTheReadFraction) {
  auto m = test::stories260k();
  at::Tensor ref = trace(make(ctx_of(*m), "full"));
  std::map<std::string, double> c;
  at::Tensor got = trace(
      make(ctx_of(*m), "oracle_topk", {{"budget", 8}, {"budget_unit", "tokens_per_head"}}), &c);
  EXPECT_TRUE(at::equal(got.narrow(0, 0, 40), ref.narrow(0, 0, 40)));  // prefill is dense
  EXPECT_GT(max_diff(got.narrow(0, 40, 10), ref.narrow(0, 40, 10)), 1e-3);
  // Decode step j (0..9) sees 41 + j rows and reads 8 of them, in every layer and KV head.
  EXPECT_EQ(c.at("decode_head_reads"), 10 * 5 * 4);
  EXPECT_NEAR(c.at("decode_read_fraction"), 80.0 / 455.0, 1e-12);
  EXPECT_NEAR(c.at("read_tokens_per_head_step"), 8.0, 1e-12);
  // The ledger is the full cache's: nothing is evicted.
  auto kv = make(ctx_of(*m), "oracle_topk", {{"budget", 0.1}});
  Engine e(m, std::move(kv), EngineOptions{});
  int64_t s = e.new_sequence();
  e.prefill({s}, {std::vector<int64_t>(30, 300)});
  for (int i = 0; i < 4; ++i) e.decode({s}, {301 + i});
  EXPECT_EQ(e.kv().footprint().device_payload_bytes, 34 * m->config.kv_bytes_per_token(4));
  EXPECT_EQ(e.kv().footprint().tokens_held, 34);
}

// The bound: reading the exact best rows is no worse than Quest's page bounds (every layer
// selecting, as the oracle does) or SnapKV's eviction at the same budget. Can fail: it compares
// measured KL on real text.
TEST(OracleTopkModel, NoWorseThanQuestAndSnapKvAtTheSameBudgetOnStories) {
  for (double budget : {0.1, 0.25}) {
    const nlohmann::json b = {{"budget", budget}};
    const double oracle = test::mean_story_kl("oracle_topk", b, 2, 128);
    nlohmann::json qp = b;
    qp["skip_layers"] = 0;
    const double quest = test::mean_story_kl("quest", qp, 2, 128);
    const double snap = test::mean_story_kl("snapkv", b, 2, 128);
    EXPECT_GT(oracle, 0.0) << budget;
    EXPECT_LE(oracle, quest) << budget;
    EXPECT_LE(oracle, snap) << budget;
  }
}

TEST(OracleTopkParams, UnknownAndInvalidParametersAreRefusedByName) {
  CacheContext ctx{tiny(1, 2, 1, 4), c10::kCPU, c10::kFloat};
  auto refused = [&](const nlohmann::json& p, const std::string& needle) {
    try {
      make(ctx, "oracle_topk", p);
      ADD_FAILURE() << p.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({{"budget", 0.0}}, "budget");
  refused({{"budget", 1.5}}, "budget");
  refused({{"budget", 2.5}, {"budget_unit", "tokens_per_head"}}, "budget");
  refused({{"gqa_agg", "min"}}, "gqa_agg");
  refused({{"lookahead", 4}}, "lookahead");
  EXPECT_TRUE(MethodRegistry::instance().info("oracle_topk").caps.oracle);
  EXPECT_FALSE(MethodRegistry::instance().info("quest").caps.oracle);
}

}  // namespace
}  // namespace kvb
