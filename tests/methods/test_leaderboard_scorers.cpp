// The scorers of kvpress's leaderboard methods (keydiff, lagkv, cur, expected_attention, chunkkv)
// against references written here with tensor ops from the methods' definitions (kvpress's
// formulas), on hand-driven caches; the store's kept-key/value and query-statistics signals; and
// the eviction schedules (prefill-only vs continuous, compression every k decode steps).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/common/error.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/question_aware.h"
#include "harness/model/model.h"
#include "methods/common/evicting_kv_cache.h"
#include "tests/methods/cache_driver.h"
#include "tests/methods/method_test_util.h"

namespace kvb {
namespace {

using test::Driver;
using test::rnd;
using test::tiny;

std::unique_ptr<KvCache> make(const ModelConfig& c, const std::string& name,
                              const nlohmann::json& params) {
  return MethodRegistry::instance().create(name, CacheContext{c, c10::kCPU, c10::kFloat}, params);
}

EvictingKvCache& evict(KvCache& kv) { return dynamic_cast<EvictingKvCache&>(kv); }

// The slots of the k best scores (ties: the lower slot), ascending, plus `always`.
std::vector<int32_t> top_k(const at::Tensor& score, int64_t k, std::vector<int32_t> always = {}) {
  const at::Tensor s = score.to(at::kDouble).contiguous();
  const double* p = s.data_ptr<double>();
  std::vector<int32_t> order(static_cast<size_t>(s.numel()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  order.resize(static_cast<size_t>(k));
  order.insert(order.end(), always.begin(), always.end());
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> span(int32_t a, int32_t b) {
  std::vector<int32_t> v(static_cast<size_t>(b - a));
  std::iota(v.begin(), v.end(), a);
  return v;
}

// One prefill step of n tokens (keys given post-RoPE), then end_prefill.
void prefill(KvCache& kv, const ModelConfig& c, const at::Tensor& q, const at::Tensor& k,
             const at::Tensor& v) {
  Driver d{&kv, c.n_layers};
  d.step(q, k, v, Phase::kPrefill);
  kv.end_prefill(0);
}

TEST(KeyDiff, KeepsTheKeysLeastAlignedWithTheMeanKeyDirection) {
  const ModelConfig c = tiny(1, 2, 2, 8);
  auto kv = make(c, "keydiff", {{"budget", 10}, {"budget_unit", "tokens_per_head"}});
  const at::Tensor k = rnd({30, 2, 8}, 1) + 0.7;  // a shared direction, so the anchor means something
  prefill(*kv, c, rnd({30, 2, 8}, 2), k, rnd({30, 2, 8}, 3));
  for (int64_t h = 0; h < 2; ++h) {
    const at::Tensor kh = k.select(1, h).to(at::kDouble);
    const at::Tensor anchor = (kh / kh.norm(2, -1, true)).mean(0);
    const at::Tensor cos = at::matmul(kh, anchor) / (kh.norm(2, -1) * anchor.norm());
    EXPECT_EQ(evict(*kv).kept_indices(0, 0, h), top_k(-cos, 10)) << h;
  }
}

// kvpress's LagKV score of one head's partitions (keys and values [n, D]).
at::Tensor lag_reference(const at::Tensor& k, const at::Tensor& v, int64_t sinks, int64_t lag) {
  const int64_t n = k.size(0);
  const int64_t parts = (n - sinks) / lag;
  at::Tensor score = at::ones({n}, at::kDouble);
  auto spread = [&](const at::Tensor& x, int64_t first) {
    const at::Tensor cur = x.narrow(0, first, lag).to(at::kDouble);
    const at::Tensor ref = x.narrow(0, first + lag, lag).to(at::kDouble);
    const at::Tensor lo = std::get<0>(ref.min(0)), hi = std::get<0>(ref.max(0));
    return ((cur - lo) / (hi - lo)).std(-1, /*unbiased=*/true).softmax(-1);
  };
  for (int64_t p = 0; p + 1 < parts; ++p) {
    const int64_t first = sinks + p * lag;
    const at::Tensor s = (spread(k, first) + spread(v, first)) / 2;
    score.narrow(0, first, lag).copy_(s.argsort().argsort().to(at::kDouble) / lag);
  }
  return score;
}

TEST(LagKv, EachPartitionKeepsItsBestRankedRowsByTheNextPartitionsRange) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  // sinks 2, 4 partitions of 4 and 3 more: partitions 0-2 are scored (entries 2..13), the last
  // partition and the remainder (14..20) are the tail, kept like the sinks.
  auto kv = make(c, "lagkv",
                 {{"budget", 15}, {"budget_unit", "tokens_per_head"}, {"sinks", 2}, {"lag_size", 4}});
  const at::Tensor k = rnd({21, 1, 8}, 4), v = rnd({21, 1, 8}, 5);
  prefill(*kv, c, rnd({21, 2, 8}, 6), k, v);
  const at::Tensor ref = lag_reference(k.select(1, 0), v.select(1, 0), 2, 4);
  // 15 = 2 sinks + 7 tail + 6 of the 12 scored: each partition's two best ranks (0.75 and 0.5).
  const std::vector<int32_t> kept = evict(*kv).kept_indices(0, 0, 0);
  EXPECT_EQ(kept, top_k(ref, 15));
  for (int64_t p = 0; p < 3; ++p) {
    int64_t in_part = 0;
    for (int32_t j : kept) in_part += j >= 2 + 4 * p && j < 6 + 4 * p;
    EXPECT_EQ(in_part, 2) << p;
  }
}

TEST(LagKv, AShortSequencePrefersTheNewestEntries) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  auto kv = make(c, "lagkv",
                 {{"budget", 6}, {"budget_unit", "tokens_per_head"}, {"sinks", 2}, {"lag_size", 8}});
  prefill(*kv, c, rnd({12, 2, 8}, 7), rnd({12, 1, 8}, 8), rnd({12, 1, 8}, 9));
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), (std::vector<int32_t>{0, 1, 8, 9, 10, 11}));
}

TEST(Cur, KeepsTheLargestLocallyNormalisedKeyTimesValueLeverage) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  auto kv = make(c, "cur", {{"budget", 12}, {"budget_unit", "tokens_per_head"}});
  const at::Tensor k = rnd({40, 1, 8}, 10), v = rnd({40, 1, 8}, 11) * at::linspace(0.2, 2, 40).view({40, 1, 1});
  prefill(*kv, c, rnd({40, 2, 8}, 12), k, v);
  auto local = [](at::Tensor x) {  // windows of 16, the last one padded with zeros
    x = at::constant_pad_nd(x, {0, 8}).view({3, 16});
    return (x / x.sum(-1, true)).reshape({48}).narrow(0, 0, 40);
  };
  const at::Tensor k2 = local(k.select(1, 0).to(at::kDouble).pow(2).sum(-1));
  const at::Tensor v2 = local(v.select(1, 0).to(at::kDouble).pow(2).sum(-1));
  at::Tensor s = k2 * v2;
  s = s / s.sum();
  s.narrow(0, 0, 4).fill_(1.0);
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), top_k(s, 12));
}

TEST(ExpectedAttention, ScoresByTheGaussianOfFutureQueriesFromUnrotatedQueryStatistics) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  const int64_t n = 40, sinks = 4, future = 16, D = 8, half = 4;
  auto kv = make(c, "expected_attention",
                 {{"budget", 12}, {"budget_unit", "tokens_per_head"}, {"future_positions", future}});
  at::Tensor cos, sin;
  compute_rope_tables(c, n + future + 1, &cos, &sin);  // [rows, D / 2]
  // Pre-RoPE queries with a mean and a correlation, rotated to their positions as the engine does.
  const at::Tensor q_pre = rnd({n, 2, D}, 13) + at::linspace(-1, 1, D).view({1, 1, D});
  const at::Tensor cq = cos.narrow(0, 0, n).unsqueeze(1), sq = sin.narrow(0, 0, n).unsqueeze(1);
  const at::Tensor a = q_pre.narrow(2, 0, half), b = q_pre.narrow(2, half, half);
  const at::Tensor q = at::cat({a * cq - b * sq, b * cq + a * sq}, 2);
  const at::Tensor k = rnd({n, 1, D}, 14), v = rnd({n, 1, D}, 15);
  prefill(*kv, c, q, k, v);

  // R = mean over positions n .. n + future - 1 of cos I + sin P (kvpress's matrix form).
  at::Tensor P = at::zeros({D, D}, at::kDouble);
  P.narrow(0, half, half).narrow(1, 0, half).copy_(at::eye(half, at::kDouble));
  P.narrow(0, 0, half).narrow(1, half, half).copy_(-at::eye(half, at::kDouble));
  at::Tensor R = at::zeros({D, D}, at::kDouble);
  for (int64_t t = n; t < n + future; ++t) {
    const at::Tensor ct = at::cat({cos[t], cos[t]}).to(at::kDouble);
    const at::Tensor st = at::cat({sin[t], sin[t]}).to(at::kDouble);
    R += at::diag(ct) + st.unsqueeze(0) * P;
  }
  R /= static_cast<double>(future);
  const at::Tensor K = k.select(1, 0).narrow(0, sinks, n - sinks).to(at::kDouble);
  at::Tensor score = at::zeros({n - sinks}, at::kDouble);
  for (int64_t g = 0; g < 2; ++g) {
    const at::Tensor Q = q_pre.select(1, g).narrow(0, sinks, n - sinks).to(at::kDouble);
    const at::Tensor mu = Q.mean(0);
    const at::Tensor cov = at::matmul((Q - mu).t(), Q - mu) / static_cast<double>(n - sinks);
    const at::Tensor mu_r = at::matmul(R, mu), cov_r = at::matmul(R, at::matmul(cov, R.t()));
    const at::Tensor logit = at::matmul(K, mu_r) / std::sqrt(8.0) +
                             (at::matmul(K, cov_r) * K).sum(-1) / 8.0 / 2.0;
    score += logit.softmax(0) / 2.0;
  }
  score *= v.select(1, 0).narrow(0, sinks, n - sinks).to(at::kDouble).norm(2, -1);
  std::vector<int32_t> want = top_k(score, 12 - sinks);
  for (auto& j : want) j += sinks;
  want.insert(want.begin(), {0, 1, 2, 3});
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), want);
}

TEST(ExpectedAttention, QueryStatisticsAreLedgerMetadataUntilTheCompression) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  auto kv = make(c, "expected_attention", {{"budget", 12}, {"budget_unit", "tokens_per_head"}});
  Driver d{kv.get(), 1};
  d.step(rnd({30, 2, 8}, 16), rnd({30, 1, 8}, 17), rnd({30, 1, 8}, 18), Phase::kPrefill);
  // Sums [2, 8] and outer products [2, 8, 8] in fp64.
  const int64_t stats = (2 * 8 + 2 * 8 * 8) * 8;
  EXPECT_EQ(kv->footprint().device_metadata_bytes, stats);
  kv->end_prefill(0);
  EXPECT_EQ(kv->footprint().device_metadata_bytes, 0);
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0).size(), 12u);
}

// SnapKV's window-query attention of one KV head's keys (pooling none), summed over queries and
// the group's heads: the reference of the chunk scores.
at::Tensor snap_reference(const at::Tensor& q, const at::Tensor& k, int64_t head, int64_t window) {
  const int64_t n = k.size(0), D = k.size(2), G = q.size(1) / k.size(1);
  at::Tensor s = at::zeros({n}, at::kDouble);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = n - window; i < n; ++i) {
      const at::Tensor l = at::matmul(k.select(1, head).narrow(0, 0, i + 1).to(at::kDouble),
                                      q[i][head * G + g].to(at::kDouble)) /
                           std::sqrt(static_cast<double>(D));
      s.narrow(0, 0, i + 1) += l.softmax(0);
    }
  return s;
}

TEST(ChunkKv, EveryHeadKeepsTheSameWholeChunksTheWindowsFirst) {
  const ModelConfig c = tiny(1, 4, 2, 8);
  auto kv = make(c, "chunkkv",
                 {{"budget", 0.4}, {"chunk_length", 10}, {"window", 8}, {"kernel_size", 1},
                  {"pooling", "none"}});
  const at::Tensor q = rnd({50, 4, 8}, 19), k = rnd({50, 2, 8}, 20);
  prefill(*kv, c, q, k, rnd({50, 2, 8}, 21));
  // 5 chunks, floor(0.4 x 5) = 2 kept: the window's chunk (40..49) and the best other one by the
  // head-summed, chunk-averaged SnapKV scores.
  at::Tensor s = snap_reference(q, k, 0, 8) + snap_reference(q, k, 1, 8);
  const at::Tensor chunk = s.narrow(0, 0, 40).view({4, 10}).mean(-1);
  const int32_t best = static_cast<int32_t>(chunk.argmax().item<int64_t>());
  std::vector<int32_t> want = span(10 * best, 10 * best + 10);
  for (int32_t j = 40; j < 50; ++j) want.push_back(j);
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), want);
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 1), want);
}

TEST(Finch, TheQuestionsPositionWeightedAttentionPicksTheContextAndTheQuestionIsKept) {
  const ModelConfig c = tiny(1, 4, 2, 8);
  const int64_t n = 40, question = 6, budget = 16;
  auto kv = make(c, "finch",
                 {{"budget", budget}, {"budget_unit", "tokens_per_head"}, {"position_mode", "absolute"}});
  dynamic_cast<QuestionAwareCache&>(*kv).set_question_tokens(0, question);
  const at::Tensor q = rnd({n, 4, 8}, 110), k = rnd({n, 2, 8}, 111);
  prefill(*kv, c, q, k, rnd({n, 2, 8}, 112));
  for (int64_t h = 0; h < 2; ++h) {
    // kvpress FinchPress.score: the question queries' causal softmax over every key, the prefix
    // part weighted by the query's position, averaged over the question and the group.
    at::Tensor s = at::zeros({n - question}, at::kDouble);
    for (int64_t g = 0; g < 2; ++g)
      for (int64_t i = n - question; i < n; ++i) {
        const at::Tensor l = at::matmul(k.select(1, h).narrow(0, 0, i + 1).to(at::kDouble),
                                        q[i][h * 2 + g].to(at::kDouble)) /
                             std::sqrt(8.0);
        s += l.softmax(0).narrow(0, 0, n - question) * static_cast<double>(i);
      }
    EXPECT_EQ(evict(*kv).kept_indices(0, 0, h), top_k(s, budget - question, span(n - question, n)))
        << h;
  }
}

TEST(Finch, WithoutTheQuestionItIsRefused) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  auto kv = make(c, "finch", {{"budget", 8}, {"budget_unit", "tokens_per_head"}});
  Driver d{kv.get(), 1};
  d.step(rnd({20, 2, 8}, 113), rnd({20, 1, 8}, 114), rnd({20, 1, 8}, 115), Phase::kPrefill);
  EXPECT_THROW(kv->end_prefill(0), Error);
}

TEST(EvictSchedule, PrefillOnlyCompressesThePromptOnceAndThenKeepsEveryToken) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  for (const std::string m : {"streaming_llm", "h2o", "tova"}) {
    for (const std::string schedule : {"prefill", "continuous"}) {
      auto kv = make(c, m, {{"budget", 10}, {"budget_unit", "tokens_per_head"}, {"schedule", schedule}});
      Driver d{kv.get(), 1};
      d.step(rnd({18, 2, 8}, 22), rnd({18, 1, 8}, 23), rnd({18, 1, 8}, 24), Phase::kPrefill);
      d.step(rnd({12, 2, 8}, 25), rnd({12, 1, 8}, 26), rnd({12, 1, 8}, 27), Phase::kPrefill);
      if (schedule == "prefill") {
        EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0).size(), 30u) << m;
      }
      kv->end_prefill(0);
      EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0).size(), 10u) << m << " " << schedule;
      for (int i = 0; i < 5; ++i)
        d.step(rnd({1, 2, 8}, 30 + i), rnd({1, 1, 8}, 40 + i), rnd({1, 1, 8}, 50 + i));
      EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0).size(), schedule == "prefill" ? 15u : 10u)
          << m << " " << schedule;
    }
  }
}

TEST(EvictSchedule, TovaAtTheEndOfThePromptReadsThePromptsLastQuery) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  auto kv = make(c, "tova", {{"budget", 8}, {"budget_unit", "tokens_per_head"}, {"schedule", "prefill"}});
  const at::Tensor q = rnd({24, 2, 8}, 60), k = rnd({24, 1, 8}, 61);
  prefill(*kv, c, q, k, rnd({24, 1, 8}, 62));
  const at::Tensor l = at::matmul(q[23].to(at::kDouble), k.select(1, 0).t().to(at::kDouble)) /
                       std::sqrt(8.0);  // [2 heads, 24]
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), top_k(l.softmax(-1).mean(0), 8));
}

TEST(EvictSchedule, CompressEveryKDecodeStepsReturnsToTheTargetSize) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  for (const std::string m : {"keydiff", "lagkv", "cur", "expected_attention", "knorm"}) {
    auto kv = make(c, m, {{"budget", 10}, {"budget_unit", "tokens_per_head"}, {"compress_every", 4}});
    Driver d{kv.get(), 1};
    d.step(rnd({30, 2, 8}, 70), rnd({30, 1, 8}, 71), rnd({30, 1, 8}, 72), Phase::kPrefill);
    kv->end_prefill(0);
    EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0).size(), 10u) << m;
    for (int i = 1; i <= 8; ++i) {
      d.step(rnd({1, 2, 8}, 80 + i), rnd({1, 1, 8}, 90 + i), rnd({1, 1, 8}, 100 + i));
      EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0).size(), static_cast<size_t>(10 + i % 4)) << m << i;
    }
  }
}

TEST(EvictSchedule, CompressEveryWithoutAPrefillScheduleIsRefused) {
  const ModelConfig c = tiny(1, 2, 1, 8);
  for (const std::string m : {"streaming_llm", "h2o", "tova"})
    EXPECT_THROW(make(c, m, {{"budget", 0.5}, {"compress_every", 4}}), Error) << m;
  EXPECT_NO_THROW(make(c, "tova", {{"budget", 0.5}, {"schedule", "prefill"}, {"compress_every", 4}}));
}

}  // namespace
}  // namespace kvb
