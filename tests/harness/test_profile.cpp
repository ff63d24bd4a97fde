// The profile protocol: each attention measure on a case computed by hand, the protocol end to end
// on stories260K, and the refusals of bad settings (a named error, no run row).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "harness/eval/attention_measures.h"
#include "harness/eval/profile.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/report/leaderboard.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

namespace am = attention_measures;

at::Tensor positions(int64_t n) { return at::arange(n, at::kLong); }

at::Tensor one_hot(int64_t n, int64_t at_row) {
  at::Tensor p = at::zeros({n}, at::kFloat);
  p[at_row] = 1.0f;
  return p;
}

TEST(AttentionMeasures, OneHotAttention) {
  // 20 rows, all mass on position 10: age 19 - 10 = 9.
  at::Tensor p = one_hot(20, 10), idx = positions(20);
  EXPECT_DOUBLE_EQ(am::mass_within_age(p, idx, 9), 0.0);   // ages 0..8 only
  EXPECT_DOUBLE_EQ(am::mass_within_age(p, idx, 10), 1.0);  // age 9 included
  EXPECT_DOUBLE_EQ(am::mass_within_age(p, idx, 16), 1.0);
  EXPECT_DOUBLE_EQ(am::sink_mass(p, idx, 4), 0.0);
  EXPECT_DOUBLE_EQ(am::sink_mass(one_hot(20, 3), idx, 4), 1.0);
  EXPECT_DOUBLE_EQ(am::entropy(p), 0.0);
  EXPECT_EQ(am::support_count(p, 0.9), 1);
  EXPECT_EQ(am::top_k_positions(p, idx, 1), std::vector<int64_t>{10});
  EXPECT_DOUBLE_EQ(am::mass_at(p, idx, {10}), 1.0);
  EXPECT_DOUBLE_EQ(am::mass_at(p, idx, {9, 11}), 0.0);
  // A window of 6 rows keeps positions 0..3 and 18, 19; the mass at 10 is outside it.
  EXPECT_DOUBLE_EQ(am::window_mass(p, idx, 6, 4), 0.0);
  EXPECT_DOUBLE_EQ(am::window_mass(one_hot(20, 18), idx, 6, 4), 1.0);
  // Rows that are not positions 0..n-1 (an evicting store): ages from the newest position held.
  at::Tensor sparse_idx = at::tensor(std::vector<int64_t>{0, 5, 40, 41}, at::kLong);
  EXPECT_DOUBLE_EQ(am::mass_within_age(one_hot(4, 2), sparse_idx, 1), 0.0);  // age 1
  EXPECT_DOUBLE_EQ(am::mass_within_age(one_hot(4, 2), sparse_idx, 2), 1.0);
}

TEST(AttentionMeasures, UniformAttention) {
  for (int64_t n : {1, 8, 10, 100}) {
    at::Tensor p = at::full({n}, 1.0f / n), idx = positions(n);
    EXPECT_NEAR(am::entropy(p), std::log(static_cast<double>(n)), 1e-5) << n;
    // 90% of n equal rows: ceil(0.9 n) of them.
    EXPECT_EQ(am::support_count(p, 0.9), static_cast<int64_t>(std::ceil(0.9 * n - 1e-9))) << n;
  }
  at::Tensor p = at::full({10}, 0.1f), idx = positions(10);
  EXPECT_NEAR(am::sink_mass(p, idx, 4), 0.4, 1e-6);
  EXPECT_NEAR(am::mass_within_age(p, idx, 3), 0.3, 1e-6);
  EXPECT_NEAR(am::window_mass(p, idx, 6, 4), 0.6, 1e-6);  // 4 sink + 2 recent
  EXPECT_NEAR(am::window_mass(p, idx, 3, 4), 0.3, 1e-6);  // all 3 rows go to the sink
  // Ties go to the lower rows.
  EXPECT_EQ(am::top_k_positions(p, idx, 3), (std::vector<int64_t>{0, 1, 2}));
  at::Tensor mask = idx >= 5;
  EXPECT_NEAR(am::top_k_mass_among(p, mask, 3), 0.3, 1e-6);
  EXPECT_NEAR(am::top_k_mass_among(p, mask, 30), 0.5, 1e-6);  // k clipped to the 5 rows
}

TEST(AttentionMeasures, TopKOverlapAndReuse) {
  at::Tensor p = at::softmax(at::randn({50}, at::TensorOptions().dtype(at::kFloat)), 0);
  const auto a = am::top_k_positions(p, positions(50), 7);
  EXPECT_EQ(a.size(), 7u);
  EXPECT_DOUBLE_EQ(am::jaccard(a, am::top_k_positions(p.clone(), positions(50), 7)),
                   1.0);  // same query
  EXPECT_DOUBLE_EQ(am::jaccard({1, 2, 3}, {2, 3, 4}), 0.5);
  EXPECT_DOUBLE_EQ(am::jaccard({1, 2}, {3, 4}), 0.0);
  EXPECT_DOUBLE_EQ(am::jaccard({}, {}), 1.0);

  am::TopKReuse reuse;
  auto r1 = reuse.observe(1, {1, 2});
  EXPECT_EQ(r1.fresh, 2);
  EXPECT_EQ(r1.reused, 0);
  auto r2 = reuse.observe(3, {2, 5});
  EXPECT_EQ(r2.fresh, 1);
  EXPECT_EQ(r2.reused, 1);
  EXPECT_DOUBLE_EQ(r2.distance_sum, 2.0);  // position 2: steps 1 -> 3
  auto r3 = reuse.observe(4, {1, 2, 5});
  EXPECT_EQ(r3.reused, 3);
  EXPECT_DOUBLE_EQ(r3.distance_sum, 3.0 + 1.0 + 1.0);  // 1: 1 -> 4; 2: 3 -> 4; 5: 3 -> 4
}

TEST(AttentionMeasures, ClusteredIndexScansTheClusterTheQueryPointsAt) {
  // Positions 0..3 near e0, 4..7 near e1 (d = 3): two clusters of 4.
  std::vector<float> rows = {1, 0, 0, 0.9f, 0.1f, 0, 1, 0.1f, 0,    0.95f, 0,     0.05f,
                             0, 1, 0, 0.1f, 0.9f, 0, 0, 1,    0.1f, 0.05f, 0.95f, 0};
  at::Tensor keys = at::tensor(rows, at::kFloat).reshape({8, 3});
  am::ClusteredKeyIndex index(keys, positions(8), 4, 5);
  EXPECT_EQ(index.clusters(), 2);
  at::Tensor q1 = at::tensor(std::vector<float>{0, 1, 0}, at::kFloat).reshape({1, 3});
  EXPECT_EQ(index.scan(q1, 0.5), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(index.scan(q1, 0.6).size(), 8u);  // past one cluster's share: both clusters
  // A later key near e0 joins the e0 cluster.
  index.add(at::tensor(std::vector<float>{0.9f, 0, 0}, at::kFloat), 8);
  at::Tensor q0 = at::tensor(std::vector<float>{1, 0, 0}, at::kFloat).reshape({1, 3});
  EXPECT_EQ(index.scan(q0, 0.1), (std::vector<int64_t>{0, 1, 2, 3, 8}));
}

TEST(AttentionMeasures, QuantizationErrorShrinksWithBitsAndVanishesOnTheGrid) {
  // Every per-token group of 4 holds 0, 1, 2, 3: the 2-bit grid itself, reconstructed exactly.
  at::Tensor grid = at::arange(4, at::kFloat).repeat({6, 1});  // [6, 4]
  EXPECT_TRUE(at::equal(am::quantize_dequantize(grid, 2, 4, kernels::QuantAxis::kRow), grid));
  at::Tensor x = at::randn({64, 16}, at::TensorOptions().dtype(at::kFloat));
  const double e4 =
      am::relative_error(am::quantize_dequantize(x, 4, 32, kernels::QuantAxis::kColumn), x);
  const double e2 =
      am::relative_error(am::quantize_dequantize(x, 2, 32, kernels::QuantAxis::kColumn), x);
  EXPECT_GT(e4, 0.0);
  EXPECT_GT(e2, 2 * e4);
  // Identical keys: uniform attention, the output is the values' mean.
  at::Tensor q = at::randn({2, 3}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor k = at::ones({5, 3}, at::kFloat),
             v = at::randn({5, 4}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor o = am::attention_output(q, k, v, 0.5);
  EXPECT_TRUE(at::allclose(o[0], v.mean(0), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(o[1], v.mean(0), 1e-5, 1e-6));
  EXPECT_DOUBLE_EQ(am::relative_error(o, o), 0.0);
}

std::string profile_config(const std::string& protocol_extra, const std::string& method = "full") {
  return "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": \"" + method +
         "\", \"protocol\": {\"name\": \"profile\", \"window\": 64, \"max_windows\": 1, "
         "\"decode_steps\": 4, \"top_k\": 8" +
         protocol_extra + "}}";
}

TEST(ProfileProtocol, RunsEndToEndWithEveryMeasurePerLayerAndHead) {
  std::string dir = test::make_temp_dir("profile");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  for (const std::string& extra :
       {std::string(""), std::string(", \"dataset\": \"random-tokens\"")}) {
    nlohmann::json cfg = resolve_run_config(nlohmann::json::parse(profile_config(extra)));
    RunOutcome o = execute_run(cfg, db, env);
    const auto& names = profile_measure_names();
    std::map<std::string, int> cells;
    std::set<int64_t> heads, layers;
    for (const auto& m : o.metrics) {
      ASSERT_NE(std::find(names.begin(), names.end(), m.name), names.end()) << m.name;
      ASSERT_EQ(m.layer.has_value(), m.head.has_value()) << m.name;
      if (!m.layer) continue;
      ++cells[m.name];
      layers.insert(*m.layer);
      heads.insert(*m.head);
      if (profile_measure_unit(m.name) == "fraction" &&
          m.name.find("quant_err") == std::string::npos) {
        EXPECT_GE(m.value, -1e-6) << m.name;
        EXPECT_LE(m.value, 1 + 1e-5) << m.name;
      }
      // 4 decode steps; the step-to-step measures start at the second.
      const bool from_second = m.name == "topk_jaccard" || m.name == "speculative_capture" ||
                               m.name == "topk_fresh_share" || m.name == "reuse_distance";
      if (m.name != "reuse_distance") {
        EXPECT_EQ(*m.n, from_second ? 3 : 4) << m.name;
      }
    }
    EXPECT_EQ(layers.size(), 5u) << extra;  // stories260K: 5 layers x 4 KV heads
    EXPECT_EQ(heads.size(), 4u) << extra;
    for (const auto& n : names) {
      if (n != "reuse_distance") {
        EXPECT_EQ(cells[n], 20) << n << extra;
      }
      EXPECT_FALSE(std::isnan(test::metric(o.metrics, n))) << n << extra;
    }
    // The window is 61..64 tokens long at the measured steps: everything is younger than 1024.
    EXPECT_NEAR(test::metric(o.metrics, "recency_1024"), 1.0, 1e-5);
    EXPECT_LE(test::metric(o.metrics, "recency_16"), test::metric(o.metrics, "recency_64") + 1e-9);
    EXPECT_LE(test::metric(o.metrics, "entropy"), std::log(64.0) + 1e-6);
    EXPECT_GT(test::metric(o.metrics, "key_quant_err_2"),
              test::metric(o.metrics, "key_quant_err_4"));
    EXPECT_GT(test::metric(o.metrics, "value_quant_err_2"),
              test::metric(o.metrics, "value_quant_err_4"));
    EXPECT_GT(test::metric(o.metrics, "value_quant_err_4"), 0.0);
    // The top-8 rows of 64 hold at least 8/64 of the mass and the captures are shares of it.
    EXPECT_GE(test::metric(o.metrics, "topk_mass"), 8.0 / 64 - 1e-6);
    // The run is stored: a second call skips it and reads the same metrics back.
    RunOutcome again = execute_run(cfg, db, env);
    EXPECT_TRUE(again.skipped);
    EXPECT_NEAR(test::metric(again.metrics, "entropy"), test::metric(o.metrics, "entropy"), 1e-12);
  }
  // The runs measure the workload, not a method: the leaderboard leaves them out.
  const Leaderboard lb = build_leaderboard(db, LeaderboardOptions{});
  for (const auto& t : lb.tables) EXPECT_NE(t.protocol, "profile");
  EXPECT_TRUE(lb.tables.empty());
}

TEST(ProfileProtocol, BadSettingsAreRefusedBeforeAnyRunRow) {
  std::string dir = test::make_temp_dir("profile-bad");
  struct Case {
    std::string config, needle;
  };
  std::vector<Case> cases = {
      {profile_config("", "h2o"), "config.method: the profile protocol measures the exact cache"},
      {profile_config(", \"decode_steps\": 64"), "config.protocol.decode_steps: 64"},
      {profile_config(", \"dataset\": \"no-such-corpus\""), "no-such-corpus"},
      {profile_config(", \"scan_share\": 0"), "scan_share"},
      {profile_config(", \"window\": 600"), "config.protocol.window: 600"},
      {"{\"model\": \"synthetic:tiny\", \"method\": \"full\", \"protocol\": {\"name\": "
       "\"profile\", \"window\": 32, "
       "\"decode_steps\": 4}}",
       "config.protocol.dataset: 'tinystories-valid-sample' is text and the model has no "
       "tokenizer"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string cfg = dir + "/c" + std::to_string(i) + ".json";
    std::ofstream(cfg) << cases[i].config;
    const std::string db = dir + "/db" + std::to_string(i) + ".sqlite";
    auto r =
        test::run_kvbench("run -q -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
    EXPECT_EQ(r.exit_code, 2) << cases[i].config << "\n" << r.err;
    EXPECT_NE(r.err.find(cases[i].needle), std::string::npos)
        << "want '" << cases[i].needle << "' in: " << r.err;
    if (std::ifstream(db).good()) {
      EXPECT_EQ(ResultsDb(db).list_runs().size(), 0u) << cases[i].config;
    }
  }
}

TEST(ProfileCli, RunsEachLengthAndRefusesBadLengths) {
  std::string dir = test::make_temp_dir("profile-cli");
  const std::string common = "profile -q -m " + test::models_dir() + "/stories260K --data-dir " +
                             test::data_dir() + " --samples 1 --decode-steps 3 --top-k 4";
  auto r = test::run_kvbench(common + " --db " + dir + "/db.sqlite --tokens 32,48 --out " + dir +
                             "/profile.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dir + "/profile.json");
  nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["protocol"]["window"], 32);
  EXPECT_EQ(j["runs"][1]["protocol"]["window"], 48);
  // 20 (layer, head) cells + the mean per measure (reuse_distance only where a top-k row recurred).
  EXPECT_GE(j["runs"][1]["metrics"].size(), (profile_measure_names().size() - 1) * 21);
  EXPECT_EQ(ResultsDb(dir + "/db.sqlite").list_runs().size(), 2u);
  for (const std::string bad : {"32,x", "2", "32,32", "", "32,"}) {
    auto e = test::run_kvbench(common + " --tokens '" + bad + "' --db " + dir + "/bad.sqlite");
    EXPECT_EQ(e.exit_code, 2) << bad << ": " << e.err;
    EXPECT_NE(e.err.find("--tokens"), std::string::npos) << e.err;
    EXPECT_FALSE(std::filesystem::exists(dir + "/bad.sqlite")) << bad;
  }
}

}  // namespace
}  // namespace kvb
