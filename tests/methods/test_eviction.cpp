// The token-eviction methods (streaming_llm, h2o, tova, snapkv, pyramidkv, adakv, knorm, keydiff,
// lagkv, cur, expected_attention, chunkkv) and their
// shared physical store (methods/common/evicting_kv_cache): selection rules on hand-built attention
// patterns with known kept sets, keep-everything = full logits, re-rotation, the exact ledger,
// counters, determinism, fork/truncate, and 256-token streams of stories260K. Then the parts they
// are composed of (protect, budget allocators) and combinations no paper ran (any scorer under any
// allocator).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/engine/transformer.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/probe_view.h"
#include "methods/common/budget_allocator.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"
#include "methods/common/protect.h"
#include "tests/methods/cache_driver.h"
#include "tests/methods/method_test_util.h"
#include "tests/methods/greedy_trace.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::Driver;
using test::rnd;
using test::tiny;

const std::vector<std::string> kEvictMethods = {
    "streaming_llm", "h2o", "tova", "snapkv", "pyramidkv", "adakv", "knorm", "keydiff", "lagkv",
    "cur", "expected_attention", "chunkkv"};
const std::vector<std::string> kPrefillMethods = {"snapkv",  "pyramidkv", "adakv",
                                                  "knorm",   "keydiff",   "lagkv",
                                                  "cur",     "expected_attention", "chunkkv"};

bool is_prefill_method(const std::string& n) {
  return std::find(kPrefillMethods.begin(), kPrefillMethods.end(), n) != kPrefillMethods.end();
}

CacheContext ctx_of(const Model& m) { return CacheContext{m.config, m.device, m.dtype}; }

std::unique_ptr<KvCache> make(const CacheContext& ctx, const std::string& name,
                              nlohmann::json params = nlohmann::json::object()) {
  return MethodRegistry::instance().create(name, ctx, params);
}

EvictingKvCache& evict(KvCache& kv) {
  auto* e = dynamic_cast<EvictingKvCache*>(&kv);
  if (e == nullptr) throw std::runtime_error(kv.name() + " is not an EvictingKvCache");
  return *e;
}

std::vector<int32_t> range_idx(std::initializer_list<std::pair<int32_t, int32_t>> spans) {
  std::vector<int32_t> v;
  for (auto [a, b] : spans)
    for (int32_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

// Prefill a 40-token prompt in chunks of 7, then decode 10 tokens; every logit row.
at::Tensor trace(std::unique_ptr<KvCache> kv, int64_t chunk = 7) {
  return test::greedy_trace(test::stories260k(), std::move(kv), chunk);
}

// Prefill `n` tokens of a fixed pseudo-text (chunked) into one sequence of `e`.
int64_t prefill_text(Engine& e, int64_t n) {
  std::vector<int64_t> t = {1};
  for (int64_t i = 1; i < n; ++i) t.push_back(3 + (i * 37 + i * i) % 500);
  int64_t s = e.new_sequence();
  e.prefill({s}, {t});
  return s;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// ---------------------------------------------------------------- selection building blocks

TEST(EvictSelect, TopKBreaksTiesTowardLowerSlotsAndReturnsAscending) {
  const std::vector<float> s = {0.5f, 2.f, 1.f, 2.f, -1.f, 1.f};
  EXPECT_EQ(top_k_slots(s.data(), {0, 1, 2, 3, 4, 5}, 3), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(top_k_slots(s.data(), {0, 2, 4, 5}, 2), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(top_k_slots(s.data(), {4, 0}, 5), (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(top_k_slots(s.data(), {0, 1}, 0).empty());
}

TEST(EvictSelect, PoolingAvgCountsThePaddingMaxIgnoresIt) {
  const std::vector<float> x = {1, 5, 2, 0, 3};
  std::vector<float> avg = pool1d(x.data(), 5, 3, Pooling::kAvg);
  std::vector<float> mx = pool1d(x.data(), 5, 3, Pooling::kMax);
  // Same as PyTorch avg_pool1d(k=3, padding=1, count_include_pad=True) and max_pool1d.
  at::Tensor t = at::tensor(x, at::kFloat).view({1, 1, 5});
  at::Tensor ra = at::avg_pool1d(t, {3}, {1}, {1}).flatten();
  at::Tensor rm = at::max_pool1d(t, {3}, {1}, {1}).flatten();
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(avg[i], ra[i].item<float>(), 1e-6) << i;
    EXPECT_EQ(mx[i], rm[i].item<float>()) << i;
  }
  EXPECT_FLOAT_EQ(avg[0], 2.f);  // (0 + 1 + 5) / 3
  EXPECT_EQ(mx, (std::vector<float>{5, 5, 5, 3, 3}));
}

TEST(EvictSelect, PyramidLayerBudgetsDecreaseLinearlyAndAverageTheBudget) {
  std::vector<int64_t> got;
  for (int l = 0; l < 5; ++l) got.push_back(pyramid_layer_budget(40, 8, 200, 20, l, 5));
  EXPECT_EQ(got, (std::vector<int64_t>{71, 56, 41, 26, 11}));
  got.clear();  // max clipped to n - w: min = 2 (avg - w) - max
  for (int l = 0; l < 5; ++l) got.push_back(pyramid_layer_budget(40, 8, 50, 20, l, 5));
  EXPECT_EQ(got, (std::vector<int64_t>{50, 45, 40, 35, 30}));
  EXPECT_EQ(pyramid_layer_budget(8, 8, 200, 20, 0, 5), 8);    // no prefix budget: uniform
  EXPECT_EQ(pyramid_layer_budget(40, 8, 20, 20, 3, 5), 40);   // infeasible: uniform fallback
  EXPECT_EQ(pyramid_layer_budget(40, 8, 200, 20, 0, 1), 40);  // one layer
}

TEST(EvictSelect, AdaptiveHeadBudgetsFollowTheGlobalTopKAboveAFloor) {
  const std::vector<std::vector<float>> s = {{9, 8, 7, 6}, {1, 0.5f, 0.2f, 0.1f}};
  EXPECT_EQ(adaptive_head_budgets(s, 4, 0.0), (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(adaptive_head_budgets(s, 4, 0.5), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(adaptive_head_budgets(s, 4, 1.0), (std::vector<int64_t>{2, 2}));
  // A head with fewer candidates than its share hands the rest to the others.
  const std::vector<std::vector<float>> c = {{9, 8}, {7, 6, 5, 4}};
  EXPECT_EQ(adaptive_head_budgets(c, 6, 1.0), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(adaptive_head_budgets(c, 99, 0.3), (std::vector<int64_t>{2, 4}));
  // Sums to the total whatever alpha.
  for (double a : {0.0, 0.2, 0.37, 0.5, 0.9, 1.0}) {
    auto b = adaptive_head_budgets({{3, 1, 4, 1, 5}, {9, 2, 6}, {5, 3, 5, 8, 9, 7}}, 7, a);
    EXPECT_EQ(b[0] + b[1] + b[2], 7) << a;
  }
}

TEST(EvictSelect, BudgetUnitsResolveToEntriesPerHeadAndLayer) {
  Budget r{0.25, BudgetUnit::kRatio};
  EXPECT_EQ(r.per_head(255, 4), 63);
  EXPECT_EQ(r.per_layer(255, 4), 252);
  EXPECT_EQ(r.per_head(2, 4), 1);  // never below one entry
  EXPECT_EQ((Budget{0.29, BudgetUnit::kRatio}.per_head(100, 4)), 29);
  Budget th{40, BudgetUnit::kTokensPerHead};
  EXPECT_EQ(th.per_head(1000, 4), 40);
  EXPECT_EQ(th.per_layer(1000, 4), 160);
  Budget tl{40, BudgetUnit::kTokensPerLayer};
  EXPECT_EQ(tl.per_head(1000, 4), 10);
  EXPECT_EQ(tl.per_layer(1000, 4), 40);
}

TEST(EvictParams, BudgetsPresetsAndKernelsAreValidated) {
  auto m = test::stories260k();
  auto expect_error = [&](const std::string& name, nlohmann::json p, const std::string& what) {
    try {
      make(ctx_of(*m), name, p);
      ADD_FAILURE() << name << " accepted " << p.dump();
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error("h2o", {{"budget", 1.5}}, "h2o.budget: 1.5 is not a valid kept ratio");
  expect_error("tova", {{"budget", 2.5}, {"budget_unit", "tokens_per_head"}},
               "wants an integer >= 1");
  expect_error("snapkv", {{"preset", "none"}},
               "snapkv.window: preset=none needs an explicit value");
  expect_error("pyramidkv", {{"kernel_size", 4}}, "pyramidkv.kernel_size: 4 must be odd");
  expect_error("streaming_llm", {{"position_mode", "relative"}}, "position_mode");
  // Every eviction method declares the budget pair and a position mode, and says it evicts.
  for (const auto& n : kEvictMethods) {
    const MethodInfo& info = MethodRegistry::instance().info(n);
    EXPECT_TRUE(info.caps.evicts) << n;
    EXPECT_FALSE(info.caps.simulated) << n;
    nlohmann::json r = MethodRegistry::instance().resolve(n, nlohmann::json::object());
    EXPECT_TRUE(r.contains("budget") && r.contains("budget_unit") && r.contains("position_mode"))
        << n;
  }
}

// ---------------------------------------------------------------- selection rules, hand-built

TEST(StreamingLlm, KeepsSinksAndTheRecentWindowBeforeAndAfterEveryStep) {
  ModelConfig c = tiny(1, 2, 1, 4);
  auto kv = make({c, c10::kCPU, c10::kFloat}, "streaming_llm",
                 {{"budget", 6},
                  {"budget_unit", "tokens_per_head"},
                  {"sinks", 2},
                  {"position_mode", "absolute"}});
  EvictingKvCache& e = evict(*kv);
  Driver d{kv.get(), 1};
  d.step(rnd({3, 2, 4}, 1), rnd({3, 1, 4}, 2), rnd({3, 1, 4}, 3), Phase::kPrefill);
  for (int t = 3; t < 20; ++t) {
    StepBatch b = d.make_batch(1, Phase::kDecode);
    kv->begin_step(b);
    if (t >= 6) {  // room made before the append: sinks + the newest 3, so the step sees 6 tokens
      EXPECT_EQ(e.kept_indices(0, 0, 0), range_idx({{0, 2}, {t - 3, t}})) << t;
    }
    d.attend_all(b, rnd({1, 2, 4}, 10 + t), rnd({1, 1, 4}, 40 + t), rnd({1, 1, 4}, 70 + t), {});
    kv->end_step(b);
    d.pos++;
    const int32_t seen = t + 1;
    if (seen > 6)
      EXPECT_EQ(e.kept_indices(0, 0, 0), range_idx({{0, 2}, {seen - 4, seen}})) << t;
    else
      EXPECT_EQ(e.kept_indices(0, 0, 0), range_idx({{0, seen}})) << t;
  }
  // A prefill chunk longer than the budget is trimmed to sinks + the last (budget - sinks).
  Driver d2{kv.get(), 1, 7};
  d2.step(rnd({10, 2, 4}, 5), rnd({10, 1, 4}, 6), rnd({10, 1, 4}, 7), Phase::kPrefill);
  EXPECT_EQ(e.kept_indices(7, 0, 0), range_idx({{0, 2}, {6, 10}}));
  EXPECT_EQ(kv->seq_len(7), 10);
}

// Reference attention of one token: q [Hq, D] over K, V [L, Hkv, D].
at::Tensor ref_attention(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V) {
  const int64_t Hq = q.size(0), Hkv = K.size(1), G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(1)));
  std::vector<at::Tensor> o;
  for (int64_t h = 0; h < Hq; ++h) {
    at::Tensor p = at::softmax(K.select(1, h / G).matmul(q[h]) * scale, 0);
    o.push_back(p.matmul(V.select(1, h / G)));
  }
  return at::stack(o);
}

// StreamingLLM with sinks 2 + budget 5 over 14 decode steps: kept keys sit at contiguous positions
// ending right before the query (rerotated) or keep their own rotation (absolute).
void check_streaming_positions(const std::string& mode) {
  ModelConfig c = tiny(1, 2, 1, 4);
  auto kv = make(
      {c, c10::kCPU, c10::kFloat}, "streaming_llm",
      {{"budget", 5}, {"budget_unit", "tokens_per_head"}, {"sinks", 2}, {"position_mode", mode}});
  at::Tensor cos, sin;
  compute_rope_tables(c, 64, &cos, &sin);
  const int64_t N = 14;
  at::Tensor q_pre = rnd({N, 2, 4}, 11), k_pre = rnd({N, 1, 4}, 12), v = rnd({N, 1, 4}, 13);
  auto rot = [&](const at::Tensor& x, std::vector<int64_t> pos) {
    at::Tensor p = at::tensor(pos, at::kLong);
    return apply_rope(x, cos.index_select(0, p), sin.index_select(0, p), c.rope_style);
  };
  Driver d{kv.get(), 1};
  std::vector<int64_t> kept;  // token indices held
  for (int64_t t = 0; t < N; ++t) {
    at::Tensor q = rot(q_pre.narrow(0, t, 1), {t});
    at::Tensor kr = rot(k_pre.narrow(0, t, 1), {t});
    at::Tensor out = d.step(q, kr, v.narrow(0, t, 1), t == 0 ? Phase::kPrefill : Phase::kDecode,
                            k_pre.narrow(0, t, 1));
    // Official StreamingLLM: sinks + the newest (budget - sinks - 1) old tokens + the new one.
    std::vector<int64_t> now;
    for (int64_t j : kept)
      if (j < 2) now.push_back(j);
    std::vector<int64_t> rest;
    for (int64_t j : kept)
      if (j >= 2) rest.push_back(j);
    const int64_t room = 5 - 1 - static_cast<int64_t>(now.size());
    for (size_t i = rest.size() > static_cast<size_t>(room) ? rest.size() - room : 0;
         i < rest.size(); ++i)
      now.push_back(rest[i]);
    now.push_back(t);
    std::vector<int64_t> pos;
    for (size_t i = 0; i < now.size(); ++i)
      pos.push_back(mode == "rerotated"
                        ? t - static_cast<int64_t>(now.size()) + 1 + static_cast<int64_t>(i)
                        : now[i]);
    at::Tensor idx = at::tensor(now, at::kLong);
    at::Tensor K = rot(k_pre.index_select(0, idx), pos);
    at::Tensor want = ref_attention(q[0], K, v.index_select(0, idx));
    EXPECT_LT(max_diff(out[0], want), 1e-5) << mode << " step " << t;
    kept = now;
  }
}

TEST(StreamingLlm, RerotatedKeysSitAtContiguousPositionsBeforeTheQuery) {
  check_streaming_positions("rerotated");
}
TEST(StreamingLlm, AbsoluteKeysKeepTheirOriginalRotation) { check_streaming_positions("absolute"); }

TEST(H2o, KeepsHeavyHittersAndTheRecentWindowNotTheOldestTokens) {
  // q = (2, 0); tokens 1 and 3 have key (10, 0), the rest (0, 0): tokens 1 and 3 take almost all
  // the attention from the step they arrive on. Budget 4 = 2 heavy + 2 recent.
  ModelConfig c = tiny(1, 1, 1, 2);
  for (int64_t sinks : {0, 1}) {
    auto kv = make({c, c10::kCPU, c10::kFloat}, "h2o",
                   {{"budget", 4},
                    {"budget_unit", "tokens_per_head"},
                    {"recent_fraction", 0.5},
                    {"sinks", sinks}});
    Driver d{kv.get(), 1};
    at::Tensor q = at::tensor({2.f, 0.f}).view({1, 1, 2});
    for (int t = 0; t < 12; ++t) {
      const float big = (t == 1 || t == 3) ? 10.f : 0.f;
      at::Tensor k = at::tensor({big, 0.f}).view({1, 1, 2});
      d.step(q, k, rnd({1, 1, 2}, 100 + t), t == 0 ? Phase::kPrefill : Phase::kDecode);
      EXPECT_LE(evict(*kv).kept_indices(0, 0, 0).size(), 4u);
    }
    // Without sinks the heavy hitters 1 and 3 survive; with one sink token 0 takes one heavy slot
    // and token 1 (more accumulated attention than 3) keeps the other.
    const std::vector<int32_t> want =
        sinks == 0 ? std::vector<int32_t>{1, 3, 10, 11} : std::vector<int32_t>{0, 1, 10, 11};
    EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), want) << "sinks " << sinks;
    EXPECT_EQ(kv->counters().at("evicted_entries"), 8);
  }
}

TEST(Tova, EvictsTheLowestLastRowAttentionAveragedOverAllHeads) {
  ModelConfig c = tiny(1, 4, 2, 4);
  auto kv = make({c, c10::kCPU, c10::kFloat}, "tova",
                 {{"budget", 4}, {"budget_unit", "tokens_per_head"}});
  EvictingKvCache& e = evict(*kv);
  Driver d{kv.get(), 1};
  at::Tensor q = rnd({10, 4, 4}, 21) * 2, k = rnd({10, 2, 4}, 22), v = rnd({10, 2, 4}, 23);
  d.step(q, k, v, Phase::kPrefill);
  auto ref_keep = [&](const at::Tensor& qrow, const at::Tensor& K, int64_t budget) {
    at::Tensor avg = at::zeros({K.size(0)});
    for (int64_t h = 0; h < 4; ++h)
      avg += at::softmax(K.select(1, h / 2).matmul(qrow[h]) / 2.0, 0) / 4.0;
    std::vector<int64_t> order(static_cast<size_t>(K.size(0)));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return avg[a].item<float>() > avg[b].item<float>(); });
    order.resize(static_cast<size_t>(budget));
    std::sort(order.begin(), order.end());
    return order;
  };
  // Prefill: one cut by the last prompt token's attention.
  std::vector<int64_t> want = ref_keep(q[9], k, 4);
  std::vector<int32_t> got = e.kept_indices(0, 0, 0);
  EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want);
  EXPECT_EQ(e.kept_indices(0, 0, 1), got);  // one set per layer
  // Decode: exactly one token leaves per step, the least attended by the new query.
  for (int t = 0; t < 4; ++t) {
    std::vector<int32_t> before = e.kept_indices(0, 0, 0);
    at::Tensor K = at::cat(
        {at::stack({e.kept_keys(0, 0, 0), e.kept_keys(0, 0, 1)}, 1), rnd({1, 2, 4}, 200 + t)});
    at::Tensor qn = rnd({1, 4, 4}, 300 + t) * 2;
    d.step(qn, K.narrow(0, 4, 1), rnd({1, 2, 4}, 400 + t));
    std::vector<int64_t> slots = ref_keep(qn[0], K, 4);
    std::vector<int32_t> expect;
    for (int64_t s : slots) expect.push_back(s < 4 ? before[s] : 10 + t);
    EXPECT_EQ(e.kept_indices(0, 0, 0), expect) << t;
    EXPECT_EQ(e.kept_indices(0, 0, 1), expect) << t;
  }
}

TEST(Tova, KeepCurrentNeverEvictsTheNewestToken) {
  ModelConfig c = tiny(1, 1, 1, 2);
  for (bool keep_current : {false, true}) {
    auto kv =
        make({c, c10::kCPU, c10::kFloat}, "tova",
             {{"budget", 3}, {"budget_unit", "tokens_per_head"}, {"keep_current", keep_current}});
    Driver d{kv.get(), 1};
    at::Tensor q = at::tensor({3.f, 0.f}).view({1, 1, 2});
    d.step(q.expand({3, 1, 2}).contiguous(),
           at::tensor({1.f, 0.f, 2.f, 0.f, 1.5f, 0.f}).view({3, 1, 2}), rnd({3, 1, 2}, 5),
           Phase::kPrefill);
    d.step(q, at::tensor({-5.f, 0.f}).view({1, 1, 2}), rnd({1, 1, 2}, 6));  // barely attended
    const std::vector<int32_t> want =
        keep_current ? std::vector<int32_t>{1, 2, 3} : std::vector<int32_t>{0, 1, 2};
    EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), want) << keep_current;
  }
}

// The SnapKV rule computed independently with LibTorch ops: window queries w over causal keys,
// softmax, summed over the window, pooled over the prefix, aggregated over the group, top-k.
std::vector<int32_t> snap_reference(const at::Tensor& q, const at::Tensor& k, int64_t h, int64_t w,
                                    int64_t kernel, const std::string& pool, const std::string& agg,
                                    int64_t budget) {
  const int64_t n = q.size(0), G = q.size(1) / k.size(1), P = n - w;
  at::Tensor K = k.select(1, h);  // [n, D]
  at::Tensor rows;
  for (int64_t g = 0; g < G; ++g) {
    at::Tensor sum = at::zeros({n});
    for (int64_t i = n - w; i < n; ++i) {
      at::Tensor s =
          K.narrow(0, 0, i + 1).matmul(q[i][h * G + g]) / std::sqrt(static_cast<double>(q.size(2)));
      sum.narrow(0, 0, i + 1).add_(at::softmax(s, 0));
    }
    at::Tensor pre = sum.narrow(0, 0, P).view({1, 1, P});
    at::Tensor pooled = pool == "max" ? at::max_pool1d(pre, {kernel}, {1}, {kernel / 2})
                                      : at::avg_pool1d(pre, {kernel}, {1}, {kernel / 2});
    pooled = pooled.flatten().unsqueeze(0);
    rows = rows.defined() ? at::cat({rows, pooled}) : pooled;
  }
  at::Tensor score = agg == "max" ? std::get<0>(rows.max(0)) : rows.mean(0);
  std::vector<int64_t> order(static_cast<size_t>(P));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return score[a].item<float>() > score[b].item<float>();
  });
  order.resize(static_cast<size_t>(budget - w));
  std::sort(order.begin(), order.end());
  std::vector<int32_t> out(order.begin(), order.end());
  for (int64_t i = n - w; i < n; ++i) out.push_back(static_cast<int32_t>(i));
  return out;
}

TEST(SnapKv, KeepsTheWindowAndThePooledTopPrefixPerKvHead) {
  ModelConfig c = tiny(1, 4, 2, 4);
  at::Tensor q = rnd({16, 4, 4}, 31) * 2, k = rnd({16, 2, 4}, 32), v = rnd({16, 2, 4}, 33);
  int checked_ragged = 0;
  for (const char* pool : {"avg", "max"}) {
    for (const char* agg : {"mean", "max"}) {
      auto kv = make({c, c10::kCPU, c10::kFloat}, "snapkv",
                     {{"budget", 8},
                      {"budget_unit", "tokens_per_head"},
                      {"preset", "none"},
                      {"window", 4},
                      {"kernel_size", 3},
                      {"pooling", pool},
                      {"gqa_agg", agg}});
      Driver d{kv.get(), 1};
      for (int64_t s = 0; s < 16; s += 5) {  // chunks of 5: the window spans two chunks
        const int64_t n = std::min<int64_t>(5, 16 - s);
        d.step(q.narrow(0, s, n), k.narrow(0, s, n), v.narrow(0, s, n), Phase::kPrefill);
      }
      EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0).size(), 16u);  // nothing before end_prefill
      kv->end_prefill(0);
      for (int64_t h = 0; h < 2; ++h)
        EXPECT_EQ(evict(*kv).kept_indices(0, 0, h), snap_reference(q, k, h, 4, 3, pool, agg, 8))
            << pool << " " << agg << " head " << h;
      checked_ragged += evict(*kv).kept_indices(0, 0, 0) != evict(*kv).kept_indices(0, 0, 1);
      // The window query buffer is freed once the prompt is compressed.
      EXPECT_EQ(kv->footprint().device_metadata_bytes, 0);
    }
  }
  EXPECT_GT(checked_ragged, 0);  // heads choose differently: selection is per KV head
}

TEST(SnapKv, PresetsResolveToTheDocumentedSettings) {
  auto m = test::stories260k();
  auto settings = [&](nlohmann::json p) { return make(ctx_of(*m), "snapkv", p)->counters(); };
  auto off = settings({{"preset", "official"}});
  EXPECT_EQ(off.at("setting.window"), 32);
  EXPECT_EQ(off.at("setting.kernel_size"), 5);
  EXPECT_EQ(off.at("setting.pooling_avg"), 1);
  auto lb = settings({{"preset", "longbench"}});
  EXPECT_EQ(lb.at("setting.kernel_size"), 7);
  EXPECT_EQ(lb.at("setting.pooling_max"), 1);
  auto kp = settings({{"preset", "kvpress"}});
  EXPECT_EQ(kp.at("setting.window"), 64);
  EXPECT_EQ(kp.at("setting.gqa_agg_max"), 0);
  auto over = settings({{"preset", "kvpress"}, {"window", 16}, {"gqa_agg", "max"}});
  EXPECT_EQ(over.at("setting.window"), 16);
  EXPECT_EQ(over.at("setting.gqa_agg_max"), 1);
  EXPECT_EQ(over.at("setting.kernel_size"), 5);
}

TEST(PyramidKv, LayerBudgetsFollowThePyramidOnStories) {
  auto m = test::stories260k();
  Engine e(m, make(ctx_of(*m), "pyramidkv", {{"budget", 40}, {"budget_unit", "tokens_per_head"}}));
  int64_t s = prefill_text(e, 200);
  EvictingKvCache& ev = evict(e.kv());
  const std::vector<size_t> want = {71, 56, 41, 26, 11};  // window 8 (official preset), beta 20
  for (int l = 0; l < 5; ++l)
    for (int64_t h = 0; h < 4; ++h)
      EXPECT_EQ(ev.kept_indices(s, l, h).size(), want[l]) << l << "/" << h;
  // The observation window (the last 8 tokens) is always kept.
  std::vector<int32_t> top = ev.kept_indices(s, 4, 2);
  EXPECT_EQ(std::vector<int32_t>(top.end() - 8, top.end()), range_idx({{192, 200}}));
}

TEST(AdaKv, HeadBudgetsAreRaggedAndSumToTheLayerBudget) {
  auto m = test::stories260k();
  Engine e(m, make(ctx_of(*m), "adakv", {{"budget", 40}, {"budget_unit", "tokens_per_head"}}));
  int64_t s = prefill_text(e, 200);
  EvictingKvCache& ev = evict(e.kv());
  int ragged_layers = 0;
  int64_t entries = 0;
  for (int l = 0; l < 5; ++l) {
    int64_t sum = 0, mn = 1 << 30, mx = 0;
    for (int64_t h = 0; h < 4; ++h) {
      const int64_t n = static_cast<int64_t>(ev.kept_indices(s, l, h).size());
      sum += n;
      mn = std::min(mn, n);
      mx = std::max(mx, n);
      // Floor: the window (32) + alpha (0.2) x the average prefix share (8).
      EXPECT_GE(n, 33) << l << "/" << h;
      EXPECT_LE(ev.capacity(s, l, h), (n + 1 + 15) / 16 * 16 + 16);
    }
    EXPECT_EQ(sum, 160) << l;
    ragged_layers += mn != mx;
    entries += sum;
  }
  EXPECT_GT(ragged_layers, 0);
  Footprint f = e.kv().footprint();
  EXPECT_EQ(f.device_payload_bytes, entries * 2 * 8 * 4);  // ragged heads, stored ragged
  EXPECT_EQ(f.device_index_bytes, entries * 4);
  auto cnt = e.kv().counters();
  bool spread = false;
  for (int l = 0; l < 5; ++l) {
    const std::string k = "kept_ratio.layer" + std::to_string(l);
    EXPECT_NEAR(cnt.at(k), 40.0 / 200.0, 1e-12);
    spread = spread || cnt.at(k + ".head_min") < cnt.at(k + ".head_max");
  }
  EXPECT_TRUE(spread);
  // pyramid=true: per-layer totals from the PyramidKV formula on the average head budget
  // (window 32: prefix 8, min 0, max 16, step 4), still split adaptively over the heads.
  Engine p(m, make(ctx_of(*m), "adakv",
                   {{"budget", 40}, {"budget_unit", "tokens_per_head"}, {"pyramid", true}}));
  int64_t ps = prefill_text(p, 200);
  const std::vector<int64_t> layer_budget = {48, 44, 40, 36, 32};
  for (int l = 0; l < 5; ++l) {
    int64_t sum = 0;
    for (int64_t h = 0; h < 4; ++h)
      sum += static_cast<int64_t>(evict(p.kv()).kept_indices(ps, l, h).size());
    EXPECT_EQ(sum, 4 * layer_budget[l]) << l;
  }
}

TEST(Knorm, KeepsTheLowestNormKeysPerKvHead) {
  ModelConfig c = tiny(1, 2, 2, 4);
  auto kv = make({c, c10::kCPU, c10::kFloat}, "knorm",
                 {{"budget", 4}, {"budget_unit", "tokens_per_head"}});
  // Keys of norms given per head (random directions).
  const std::vector<float> n0 = {5, 1, 7, 2, 9, 3, 8, 0.5f, 6, 4},
                           n1 = {1, 9, 2, 8, 3, 7, 4, 6, 5, 0.1f};
  at::Tensor dir = rnd({10, 2, 4}, 51);
  dir = dir / dir.norm(2, -1, true);
  at::Tensor norms = at::stack({at::tensor(n0), at::tensor(n1)}, 1).unsqueeze(2);
  Driver d{kv.get(), 1};
  d.step(rnd({10, 2, 4}, 52), dir * norms, rnd({10, 2, 4}, 53), Phase::kPrefill);
  kv->end_prefill(0);
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 0), (std::vector<int32_t>{1, 3, 5, 7}));
  EXPECT_EQ(evict(*kv).kept_indices(0, 0, 1), (std::vector<int32_t>{0, 2, 4, 9}));
}

// ---------------------------------------------------------------- whole methods on stories260K

TEST(EvictMethods, KeepEverythingReproducesFullLogits) {
  auto m = test::stories260k();
  at::Tensor ref = trace(make(ctx_of(*m), "full"));
  std::vector<std::pair<std::string, nlohmann::json>> runs;
  for (const auto& n : kEvictMethods)
    runs.push_back({n, {{"budget", 1.0}, {"budget_unit", "ratio"}}});
  runs.push_back({"streaming_llm", {{"budget", 1.0}, {"position_mode", "absolute"}}});
  runs.push_back(
      {"h2o", {{"budget", 1.0}, {"sinks", 4}, {"score", "mean"}, {"position_mode", "rerotated"}}});
  runs.push_back({"tova", {{"budget", 1.0}, {"keep_current", true}}});
  runs.push_back({"snapkv", {{"budget", 1.0}, {"preset", "kvpress"}, {"compress_every", 3}}});
  runs.push_back({"pyramidkv", {{"budget", 1.0}, {"preset", "kvpress"}, {"compress_every", 2}}});
  runs.push_back({"adakv", {{"budget", 1.0}, {"pyramid", true}, {"compress_every", 4}}});
  runs.push_back({"knorm", {{"budget", 1.0}, {"compress_every", 1}}});
  runs.push_back({"snapkv", {{"budget", 512}, {"budget_unit", "tokens_per_head"}}});
  runs.push_back({"tova", {{"budget", 4 * 512}, {"budget_unit", "tokens_per_layer"}}});
  for (const auto& [n, p] : runs) {
    auto kv = make(ctx_of(*m), n, p);
    at::Tensor got = trace(std::move(kv));
    EXPECT_LT(max_diff(got, ref), 1e-4) << n << " " << p.dump();
  }
}

TEST(EvictMethods, QuarterBudgetChangesTheLogits) {
  auto m = test::stories260k();
  at::Tensor ref = trace(make(ctx_of(*m), "full"));
  for (const auto& n : kEvictMethods) {
    at::Tensor got = trace(make(ctx_of(*m), n, {{"budget", 0.25}}));
    EXPECT_GT(max_diff(got, ref), 1e-3) << n;
  }
}

TEST(EvictMethods, DeterministicAcrossRuns) {
  auto m = test::stories260k();
  for (const auto& n : kEvictMethods) {
    nlohmann::json p = {{"budget", 0.3}};
    if (is_prefill_method(n)) p["compress_every"] = 3;
    at::Tensor a = trace(make(ctx_of(*m), n, p));
    at::Tensor b = trace(make(ctx_of(*m), n, p));
    EXPECT_TRUE(at::equal(a, b)) << n;
  }
}

// A test policy that asks for every signal and evicts by a fixed rule, recording what it saw.
struct SignalLog {
  std::vector<std::vector<float>> rows;
  std::vector<std::vector<int32_t>> kept;
};
class RecordingPolicy : public EvictionPolicy {
 public:
  explicit RecordingPolicy(SignalLog* log) : log_(log) {}
  Needs needs() const override {
    Needs n;
    n.accumulate = n.last_row = n.key_norm = true;
    n.window = 5;
    return n;
  }
  Schedule schedule() const override {
    Schedule s;
    s.after_step = true;
    s.end_prefill = true;
    return s;
  }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    bool changed = false;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      if (v.layer == 1) {
        log_->rows.emplace_back(hv.acc, hv.acc + hv.len);
        log_->rows.emplace_back(hv.key_norm, hv.key_norm + hv.len);
        if (hv.last) log_->rows.emplace_back(hv.last, hv.last + hv.len);
        if (hv.window) log_->rows.emplace_back(hv.window, hv.window + v.group * hv.len);
      }
      auto& k = (*keep)[h];
      k.clear();
      // Keep every third token (offset by head), plus the newest 4.
      for (int64_t j = 0; j < hv.len; ++j)
        if (hv.len <= 9 || j >= hv.len - 4 || (hv.idx[j] + h) % 3 == 0) k.push_back(j);
      changed = changed || static_cast<int64_t>(k.size()) < hv.len;
      if (v.layer == 1) log_->kept.emplace_back(hv.idx, hv.idx + hv.len);
    }
    return changed;
  }

 private:
  SignalLog* log_;
};

TEST(EvictStore, GenericPathMatchesTheCpuKernelPath) {
  auto m = test::stories260k();
  for (auto mode : {PositionMode::kAbsolute, PositionMode::kRerotated}) {
    SignalLog fast_log, gen_log;
    EvictingKvCache::Options o;
    o.position_mode = mode;
    at::Tensor fast = trace(std::make_unique<EvictingKvCache>(
        ctx_of(*m), o, std::make_unique<RecordingPolicy>(&fast_log)));
    o.force_generic = true;
    at::Tensor gen = trace(std::make_unique<EvictingKvCache>(
        ctx_of(*m), o, std::make_unique<RecordingPolicy>(&gen_log)));
    EXPECT_LT(max_diff(fast, gen), 1e-4);
    ASSERT_EQ(fast_log.rows.size(), gen_log.rows.size());
    ASSERT_GT(fast_log.rows.size(), 10u);
    for (size_t i = 0; i < fast_log.rows.size(); ++i) {
      ASSERT_EQ(fast_log.rows[i].size(), gen_log.rows[i].size()) << i;
      for (size_t j = 0; j < fast_log.rows[i].size(); ++j)
        EXPECT_NEAR(fast_log.rows[i][j], gen_log.rows[i][j], 1e-4) << i << "/" << j;
    }
    EXPECT_EQ(fast_log.kept, gen_log.kept);
  }
}

TEST(EvictStore, RerotationChangesNothingWithoutEvictionButSomethingWithIt) {
  auto m = test::stories260k();
  at::Tensor abs_q =
      trace(make(ctx_of(*m), "streaming_llm", {{"budget", 0.4}, {"position_mode", "absolute"}}));
  at::Tensor rot_q =
      trace(make(ctx_of(*m), "streaming_llm", {{"budget", 0.4}, {"position_mode", "rerotated"}}));
  EXPECT_GT(max_diff(abs_q, rot_q), 1e-4);
}

TEST(EvictLedger, QuarterBudgetHoldsAtMost30PercentOfFullAndIsExact) {
  auto m = test::stories260k();
  EngineOptions eo;
  eo.prefill_chunk = 64;
  Engine full(m, make(ctx_of(*m), "full"), eo);
  prefill_text(full, 255);
  const int64_t base = full.kv().footprint().physical_bytes();
  ASSERT_EQ(base, 255 * m->config.kv_bytes_per_token(4));
  for (const auto& n : kEvictMethods) {
    Engine e(m, make(ctx_of(*m), n, {{"budget", 0.25}}), eo);
    int64_t s = prefill_text(e, 255);
    EvictingKvCache& ev = evict(e.kv());
    Footprint f = e.kv().footprint();
    int64_t entries = 0, slack = 0;
    for (int l = 0; l < 5; ++l) {
      for (int64_t h = 0; h < 4; ++h) {
        const int64_t len = static_cast<int64_t>(ev.kept_indices(s, l, h).size());
        entries += len;
        slack += ev.capacity(s, l, h) - len;
        EXPECT_LE(ev.capacity(s, l, h), (len + 1 + 15) / 16 * 16 + 16)
            << n;  // compaction shrank it
      }
    }
    const int64_t per_entry_meta = n == "h2o" ? 4 : 0;
    EXPECT_EQ(f.device_payload_bytes, entries * 64) << n;
    EXPECT_EQ(f.device_index_bytes, entries * 4) << n;
    EXPECT_EQ(f.device_metadata_bytes, entries * per_entry_meta) << n;
    EXPECT_EQ(f.device_reserved_bytes, slack * (64 + 4 + per_entry_meta)) << n;
    EXPECT_EQ(f.logical_bytes, entries * 64) << n;
    EXPECT_EQ(f.tokens_held, entries / 20) << n;
    EXPECT_LE(f.physical_bytes(), 0.30 * static_cast<double>(base))
        << n << ": " << f.physical_bytes() << " of " << base;
    RecordProperty(n + "_physical_fraction",
                   std::to_string(static_cast<double>(f.physical_bytes()) / base));
    // The counters measure the same thing.
    auto c = e.kv().counters();
    EXPECT_NEAR(c.at("kept_ratio"), static_cast<double>(entries) / (255.0 * 20), 1e-12) << n;
    EXPECT_NEAR(c.at("evicted_entries"), 255.0 * 20 - static_cast<double>(entries), 1e-9) << n;
  }
}

TEST(EvictLedger, DecodeTimeMethodsStayUnderBudgetWhileStreaming) {
  auto m = test::stories260k();
  for (const char* n : {"streaming_llm", "h2o", "tova"}) {
    Engine e(m, make(ctx_of(*m), n, {{"budget", 0.25}}));
    int64_t s = e.new_sequence();
    e.prefill({s}, {{1}});
    for (int i = 1; i < 255; ++i) e.decode({s}, {3 + (i * 37 + i * i) % 500});
    Footprint f = e.kv().footprint();
    EXPECT_EQ(f.tokens_held, 63) << n;  // floor(0.25 x 255)
    EXPECT_LE(f.physical_bytes(), 0.30 * 255 * m->config.kv_bytes_per_token(4)) << n;
    EXPECT_LE(f.allocated_bytes(), 0.40 * 255 * m->config.kv_bytes_per_token(4)) << n;
  }
}

TEST(EvictStore, ForkIsIndependentAndTruncateDropsTheTail) {
  auto m = test::stories260k();
  Engine e(m,
           make(ctx_of(*m), "streaming_llm", {{"budget", 8}, {"budget_unit", "tokens_per_head"}}));
  int64_t a = prefill_text(e, 20);
  int64_t b = e.fork(a);
  at::Tensor la = e.decode({a}, {300});
  at::Tensor lb = e.decode({b}, {301});
  EXPECT_GT(max_diff(la, lb), 1e-3);
  EvictingKvCache& ev = evict(e.kv());
  EXPECT_EQ(ev.kept_indices(a, 0, 0), ev.kept_indices(b, 0, 0));  // same indices, different tokens
  EXPECT_GT(max_diff(ev.kept_values(a, 2, 1), ev.kept_values(b, 2, 1)), 0.0);
  e.release(b);
  EXPECT_EQ(e.kv().seq_len(a), 21);
  e.kv().truncate(a, 19);
  EXPECT_EQ(e.kv().seq_len(a), 19);
  EXPECT_EQ(ev.kept_indices(a, 3, 2), range_idx({{0, 4}, {17, 19}}));
  EXPECT_THROW(e.kv().truncate(a, 30), kvb::Error);
}

TEST(EvictStore, BatchedSequencesMatchSeparateRuns) {
  auto m = test::stories260k();
  std::vector<int64_t> a = {1}, b = {1};
  for (int i = 1; i < 50; ++i) a.push_back(3 + (i * 37) % 500);
  for (int i = 1; i < 23; ++i) b.push_back(5 + (i * 11) % 500);
  for (const auto& n : kEvictMethods) {
    nlohmann::json p = {{"budget", 0.3}};
    if (is_prefill_method(n)) p["compress_every"] = 2;
    EngineOptions eo;
    eo.prefill_chunk = 16;
    Engine together(m, make(ctx_of(*m), n, p), eo);
    int64_t sa = together.new_sequence(), sb = together.new_sequence();
    at::Tensor l = together.prefill({sa, sb}, {a, b});
    std::vector<at::Tensor> joint = {l};
    for (int t = 0; t < 5; ++t) joint.push_back(together.decode({sa, sb}, {300 + t, 400 + t}));
    for (int which = 0; which < 2; ++which) {
      Engine alone(m, make(ctx_of(*m), n, p), eo);
      int64_t s = alone.new_sequence();
      std::vector<at::Tensor> rows = {alone.prefill({s}, {which == 0 ? a : b})};
      for (int t = 0; t < 5; ++t) rows.push_back(alone.decode({s}, {(which == 0 ? 300 : 400) + t}));
      for (size_t i = 0; i < rows.size(); ++i)
        // Logits (magnitude ~10): BLAS blocks a batch differently from one row (1.2e-5 seen on an
        // AMD EPYC); a wrong kept set would move them by far more.
        EXPECT_LT(max_diff(rows[i][0], joint[i][which]), 5e-5)
            << n << " seq " << which << " step " << i;
      EXPECT_EQ(evict(alone.kv()).kept_indices(s, 3, 1),
                evict(together.kv()).kept_indices(which == 0 ? sa : sb, 3, 1))
          << n;
    }
  }
}

TEST(EvictStore, Bf16RunsThroughTheLibTorchPath) {
  LoadOptions lo;
  lo.dtype = "bf16";
  auto m = load_model(test::models_dir() + "/stories260K", lo);
  auto run = [&](std::unique_ptr<KvCache> kv) {
    Engine e(m, std::move(kv));
    int64_t s = prefill_text(e, 60);
    std::vector<at::Tensor> rows;
    for (int t = 0; t < 8; ++t) rows.push_back(e.decode({s}, {300 + t}).to(at::kFloat));
    return std::make_pair(at::cat(rows), e.kv().footprint());
  };
  auto [ref, ref_fp] = run(make(ctx_of(*m), "full"));
  for (const auto& n : kEvictMethods) {
    auto [all, fp_all] = run(make(ctx_of(*m), n, {{"budget", 1.0}}));
    // bf16 rounding in a different summation order: logits of magnitude ~20 have an ulp of 0.125.
    EXPECT_LT(max_diff(all, ref), 0.5) << n;
    EXPECT_GE((all.argmax(1) == ref.argmax(1)).sum().item<int64_t>(), 7) << n;
    EXPECT_EQ(fp_all.device_payload_bytes, 68 * 20 * 2 * 8 * 2) << n;  // bf16 entries
    nlohmann::json p = {{"budget", 0.25}};
    if (is_prefill_method(n)) p["compress_every"] = 4;
    auto [q, fp] = run(make(ctx_of(*m), n, p));
    EXPECT_TRUE(at::isfinite(q).all().item<bool>()) << n;
    EXPECT_GT(max_diff(q, ref), max_diff(all, ref)) << n;
    EXPECT_LT(fp.device_payload_bytes, 0.4 * fp_all.device_payload_bytes) << n;
  }
}

TEST(EvictStore, ProbeViewShowsKeptEntriesAsAttentionReadsThem) {
  auto m = test::stories260k();
  Engine full(m, make(ctx_of(*m), "full"));
  int64_t fs = prefill_text(full, 30);
  Engine rot(m,
             make(ctx_of(*m), "streaming_llm", {{"budget", 1.0}, {"position_mode", "rerotated"}}));
  int64_t rs = prefill_text(rot, 30);
  Engine h2o(m, make(ctx_of(*m), "h2o", {{"budget", 0.3}}));
  int64_t hs = prefill_text(h2o, 30);
  for (int l = 0; l < 5; ++l) {
    auto fv = probe_view_of(full.kv(), l, fs);
    auto rv = probe_view_of(rot.kv(), l, rs);
    auto hv = probe_view_of(h2o.kv(), l, hs);
    ASSERT_EQ(rv.size(), 4u);
    ASSERT_EQ(hv.size(), 4u);
    for (int64_t h = 0; h < 4; ++h) {
      if (!fv.empty()) {  // pre-RoPE storage re-rotated = the full cache's post-RoPE keys
        EXPECT_LT(max_diff(rv[h].k, fv[h].k), 1e-5) << l << "/" << h;
        EXPECT_TRUE(at::equal(rv[h].index, fv[h].index));
      }
      std::vector<int32_t> kept = evict(h2o.kv()).kept_indices(hs, l, h);
      EXPECT_EQ(hv[h].index.size(0), static_cast<int64_t>(kept.size()));
      EXPECT_EQ(hv[h].index[-1].item<int64_t>(), 29);
      EXPECT_TRUE(at::equal(hv[h].k, evict(h2o.kv()).kept_keys(hs, l, h)));
      EXPECT_TRUE(at::equal(hv[h].v, evict(h2o.kv()).kept_values(hs, l, h)));
    }
  }
}

// ---------------------------------------------------------------- composition: protect, allocators

// A layer of `heads` KV heads holding tokens 0 .. len - 1 each, seen = len.
struct HandLayer {
  std::vector<int32_t> idx;
  LayerView v;
  HandLayer(int64_t heads, int64_t len, int64_t window = 0, int n_layers = 1, int layer = 0) {
    idx.resize(static_cast<size_t>(len));
    std::iota(idx.begin(), idx.end(), 0);
    v.n_kv_heads = heads;
    v.seen = len;
    v.window = window;
    v.layer = layer;
    v.n_layers = n_layers;
    v.heads.resize(static_cast<size_t>(heads));
    for (auto& h : v.heads) {
      h.len = len;
      h.idx = idx.data();
    }
  }
};

TEST(EvictProtect, SinksRecentAndWindowAreKeptAndTheRestCompetes) {
  HandLayer l(1, 20, /*window=*/4);
  Protect p;
  p.sinks = 2;
  p.recent_fraction = 0.25;  // floor(0.25 x 12) = 3 recent entries before the window
  p.observation_window = true;
  HeadSplit s = split_head(p, l.v, l.v.heads[0], 12);
  std::vector<int64_t> want_kept = {0, 1, 13, 14, 15, 16, 17, 18, 19};
  EXPECT_EQ(s.kept, want_kept);
  std::vector<int64_t> want_cand(11);
  std::iota(want_cand.begin(), want_cand.end(), 2);
  EXPECT_EQ(s.candidates, want_cand);
  EXPECT_EQ(s.room, 12 - 9);
  // A budget smaller than sinks + window: the newest window entries that fit, nothing scored.
  HeadSplit t = split_head(p, l.v, l.v.heads[0], 5);
  EXPECT_EQ(t.kept, (std::vector<int64_t>{0, 1, 17, 18, 19}));
  EXPECT_EQ(t.room, 0);
}

TEST(EvictAllocator, UniformAndPyramidGiveEveryHeadOfALayerTheSameBudget) {
  Budget b{40, BudgetUnit::kTokensPerHead};
  Protect none;
  // Knorm-like scores (any order): the budgets, not the choice, are under test here.
  auto scores_for = [](const LayerView& v) {
    std::vector<std::vector<float>> s(static_cast<size_t>(v.n_kv_heads));
    for (int64_t h = 0; h < v.n_kv_heads; ++h)
      for (int64_t j = 0; j < v.heads[h].len; ++j) s[h].push_back(static_cast<float>((j * 7 + h) % 13));
    return s;
  };
  // Pyramid without a window: prefix 40, min 40 / 20 = 2, max 78, step (78 - 2) / 4 = 19.
  const std::vector<size_t> pyramid = {78, 59, 40, 21, 2};
  for (int layer = 0; layer < 5; ++layer) {
    HandLayer l(3, 200, 0, 5, layer);
    std::vector<std::vector<int64_t>> keep(3);
    ASSERT_TRUE(make_uniform_allocator(b)->keep(l.v, none, scores_for(l.v), &keep));
    for (const auto& k : keep) EXPECT_EQ(k.size(), 40u);
    ASSERT_TRUE(make_pyramid_allocator(b, 20.0)->keep(l.v, none, scores_for(l.v), &keep));
    for (const auto& k : keep) EXPECT_EQ(k.size(), pyramid[layer]) << layer;
  }
  // Within budget: nothing to do.
  HandLayer small(3, 30);
  EXPECT_FALSE(make_uniform_allocator(b)->over_budget(small.v));
}

TEST(EvictAllocator, HeadAdaptivePoolsTheLayerBudgetTowardTheBetterScoredHead) {
  HandLayer l(2, 10);
  std::vector<std::vector<float>> scores = {std::vector<float>(10, 0.f), std::vector<float>(10, 0.f)};
  for (int64_t j = 0; j < 10; ++j) {
    scores[0][j] = 1.0f + static_cast<float>(j);  // head 0 outscores head 1 everywhere
    scores[1][j] = 0.01f * static_cast<float>(j);
  }
  Budget b{8, BudgetUnit::kTokensPerLayer};
  auto ada = make_head_adaptive_allocator(b, 0.2, false, 20.0);
  ASSERT_TRUE(ada->over_budget(l.v));
  std::vector<std::vector<int64_t>> keep(2);
  ASSERT_TRUE(ada->keep(l.v, Protect{}, scores, &keep));
  // All 8 global top entries are head 0's: quota 0.8 + 0.8 x 8 = 7.2 and 0.8 -> 7 + 1 by remainder.
  EXPECT_EQ(keep[0], (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(keep[1], (std::vector<int64_t>{9}));
  // The same budget split evenly by the uniform allocator.
  std::vector<std::vector<int64_t>> even(2);
  ASSERT_TRUE(make_uniform_allocator(b)->keep(l.v, Protect{}, scores, &even));
  EXPECT_EQ(even[0].size(), 4u);
  EXPECT_EQ(even[1].size(), 4u);
}

// Kept entries per (layer, head) after `n` tokens of prefill text.
std::vector<std::vector<int64_t>> kept_counts(const std::string& name, const nlohmann::json& p,
                                              int64_t n = 200) {
  auto m = test::stories260k();
  Engine e(m, make(ctx_of(*m), name, p));
  int64_t s = prefill_text(e, n);
  std::vector<std::vector<int64_t>> out(5, std::vector<int64_t>(4));
  for (int l = 0; l < 5; ++l)
    for (int64_t h = 0; h < 4; ++h)
      out[l][h] = static_cast<int64_t>(evict(e.kv()).kept_indices(s, l, h).size());
  return out;
}

TEST(EvictCompose, AdaOverTovaKeepsEachLayersBudgetInUnequalHeads) {
  const auto counts = kept_counts("tova", {{"budget", 0.25}, {"allocator", "ada"}});
  int ragged = 0;
  for (int l = 0; l < 5; ++l) {
    const auto& c = counts[l];
    EXPECT_EQ(c[0] + c[1] + c[2] + c[3], 4 * 50) << l;  // per_layer(200) at 25%
    ragged += *std::min_element(c.begin(), c.end()) != *std::max_element(c.begin(), c.end());
  }
  EXPECT_GT(ragged, 0);
  // Plain TOVA keeps one token set per layer: equal heads.
  const auto plain = kept_counts("tova", {{"budget", 0.25}});
  for (int l = 0; l < 5; ++l)
    for (int64_t h = 0; h < 4; ++h) EXPECT_EQ(plain[l][h], 50);
}

TEST(EvictCompose, PyramidOverKnormAndAdaOverH2oRunAndHoldTheirBudgets) {
  const auto knorm = kept_counts(
      "knorm", {{"budget", 40}, {"budget_unit", "tokens_per_head"}, {"allocator", "pyramid"}});
  const std::vector<int64_t> pyramid = {78, 59, 40, 21, 2};  // no observation window: w = 0
  for (int l = 0; l < 5; ++l)
    for (int64_t h = 0; h < 4; ++h) EXPECT_EQ(knorm[l][h], pyramid[l]) << l << "/" << h;
  const auto h2o = kept_counts("h2o", {{"budget", 0.25}, {"allocator", "ada"}, {"sinks", 2}});
  for (int l = 0; l < 5; ++l)
    EXPECT_EQ(h2o[l][0] + h2o[l][1] + h2o[l][2] + h2o[l][3], 4 * 50) << l;
}

TEST(EvictCompose, SnapkvUnderEachAllocatorIsPyramidkvAndAdakv) {
  auto m = test::stories260k();
  auto kept = [&](const std::string& name, const nlohmann::json& p) {
    Engine e(m, make(ctx_of(*m), name, p));
    int64_t s = prefill_text(e, 200);
    std::vector<std::vector<int32_t>> out;
    for (int l = 0; l < 5; ++l)
      for (int64_t h = 0; h < 4; ++h) out.push_back(evict(e.kv()).kept_indices(s, l, h));
    return out;
  };
  const nlohmann::json budget = {{"budget", 40}, {"budget_unit", "tokens_per_head"}};
  // pyramidkv's official preset (window 8, max-pool 7) spelled out on snapkv.
  nlohmann::json pyr = budget;
  pyr.update({{"preset", "none"}, {"window", 8}, {"kernel_size", 7}, {"pooling", "max"},
              {"gqa_agg", "mean"}, {"allocator", "pyramid"}});
  EXPECT_EQ(kept("snapkv", pyr), kept("pyramidkv", budget));
  // adakv's (window 32, max-pool 7).
  nlohmann::json ada = pyr;
  ada.update({{"window", 32}, {"allocator", "ada_pyramid"}});
  nlohmann::json ada_ref = budget;
  ada_ref["pyramid"] = true;
  EXPECT_EQ(kept("snapkv", ada), kept("adakv", ada_ref));
  EXPECT_NE(kept("snapkv", ada), kept("snapkv", pyr));
}

TEST(EvictParams, AnUnknownAllocatorIsRefusedByName) {
  auto m = test::stories260k();
  try {
    make(ctx_of(*m), "h2o", {{"allocator", "pyramid_ada"}});
    FAIL() << "an unknown allocator was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("allocator"), std::string::npos) << e.what();
  }
  // The methods that are an allocator take none.
  EXPECT_THROW(make(ctx_of(*m), "adakv", {{"allocator", "uniform"}}), Error);
}

// ---------------------------------------------------------------- end to end

TEST(EvictStream, EveryMethodStreams256TokensOfTinyStories) {
  auto m = test::stories260k();
  nlohmann::json proto = {
      {"dataset", "tinystories-valid-sample"}, {"window", 256}, {"stride", 0}, {"max_windows", 1}};
  std::string hash;
  auto windows = stream_windows(m->tokenizer_path, proto, test::data_dir(), &hash);
  ASSERT_EQ(windows.size(), 1u);
  ASSERT_EQ(windows[0].tokens.size(), 256u);
  StreamOptions so;
  for (const auto& n : kEvictMethods) {
    nlohmann::json p = {{"budget", 0.25}};
    if (is_prefill_method(n)) p["compress_every"] = 16;
    StreamSampleResult r = run_stream_sample(m, n, p, windows[0].tokens, so);
    EXPECT_EQ(r.tokens, 255) << n;
    double kl = 0;
    for (float x : r.kl) {
      ASSERT_TRUE(std::isfinite(x)) << n;
      kl += x;
    }
    kl /= r.tokens;
    EXPECT_GT(kl, 1e-4) << n;  // a quarter of the cache is not free
    EXPECT_LT(kl, 2.0) << n;   // nor a broken model
    EXPECT_GT(r.top1_agree, r.tokens / 2) << n;
    const double kept = r.counters.at("kept_ratio");
    EXPECT_LE(kept, 0.25 + (is_prefill_method(n) ? 16.0 / 255 : 0.0) + 1e-9) << n;
    EXPECT_GT(kept, 0.2) << n;
    RecordProperty(n + "_kl_mean", std::to_string(kl));
  }
}

}  // namespace
}  // namespace kvb
