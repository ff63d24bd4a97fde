// kvbench leaderboard and compare: the paired bootstrap against a worked example and against
// statistics.h, determinism under the seed, ranking at measured bytes per token with CIs of the
// difference to the full cache, Pareto frontiers, the simulated flag, throughput from perf runs, the
// four output formats, the HTML file rendered in headless Chromium, and compare's regression flags
// for two configs and for two databases.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <sqlite3.h>
#include <algorithm>

#include "harness/common/error.h"
#include "harness/eval/run_config.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "harness/metrics/statistics.h"
#include "harness/report/compare.h"
#include "harness/report/leaderboard.h"
#include "harness/report/sample_stats.h"
#include "harness/store/config_hash.h"
#include "tests/harness/grid_test_util.h"

namespace kvb {
namespace {

using gridtest::read_file;
using gridtest::write_file;
using json = nlohmann::json;

// ---------------------------------------------------------------- the bootstrap

TEST(Leaderboard, PairedBootstrapMatchesAWorkedExample) {
  // d = a - b = [0, 0, 0, 1]. A resample's mean is k/4 with k ~ Binomial(4, 1/4):
  // P(k=0) = 0.316 > 2.5%, so the 2.5th percentile is 0; P(k>=3) = 5.1% > 2.5% > P(k=4) = 0.39%,
  // so the 97.5th percentile is 0.75. The estimate is the plain difference of means, 0.25.
  PairedSums x;
  x.a_num = {0, 0, 0, 1};
  x.a_den = {1, 1, 1, 1};
  x.b_num = {0, 0, 0, 0};
  x.b_den = {1, 1, 1, 1};
  BootstrapCi ci = paired_ratio_bootstrap(x, false, 10000, 0);
  EXPECT_DOUBLE_EQ(ci.estimate, 0.25);
  EXPECT_DOUBLE_EQ(ci.lo, 0.0);
  EXPECT_DOUBLE_EQ(ci.hi, 0.75);
  EXPECT_EQ(ci.n, 4u);
  // Ratios of sums: 2 samples with 1 and 3 tokens, per-token sums 3 and 3 for A, 1 and 1 for B.
  // Estimate = 6/4 - 2/4 = 1; every resample is one of {(3/1 - 1/1), (3/3 - 1/3), (6/4 - 2/4)} =
  // {2, 2/3, 1} with probabilities 1/4, 1/4, 1/2, so the interval is [2/3, 2].
  PairedSums r;
  r.a_num = {3, 3};
  r.a_den = {1, 3};
  r.b_num = {1, 1};
  r.b_den = {1, 3};
  ci = paired_ratio_bootstrap(r, false, 10000, 5);
  EXPECT_DOUBLE_EQ(ci.estimate, 1.0);
  EXPECT_NEAR(ci.lo, 2.0 / 3.0, 1e-15);
  EXPECT_DOUBLE_EQ(ci.hi, 2.0);
  // exp transform (perplexity): the estimate is exp(mean A) - exp(mean B).
  ci = paired_ratio_bootstrap(r, true, 100, 5);
  EXPECT_NEAR(ci.estimate, std::exp(1.5) - std::exp(0.5), 1e-12);
}

TEST(Leaderboard, PairedBootstrapIsDeterministicAndAgreesWithStatistics) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> nd(0.3, 1.0);
  std::vector<double> a(37), b(37);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = nd(rng);
    b[i] = nd(rng) * 0.5;
  }
  PairedSums x;
  x.a_num = a;
  x.b_num = b;
  x.a_den.assign(a.size(), 1.0);
  x.b_den.assign(b.size(), 1.0);
  const BootstrapCi c1 = paired_ratio_bootstrap(x, false, 5000, 11);
  const BootstrapCi c2 = paired_ratio_bootstrap(x, false, 5000, 11);
  EXPECT_EQ(c1.lo, c2.lo);  // bit for bit
  EXPECT_EQ(c1.hi, c2.hi);
  const BootstrapCi ref = paired_bootstrap(a, b, 5000, 11);  // the same resampling rule
  EXPECT_NEAR(c1.estimate, ref.estimate, 1e-12);
  EXPECT_NEAR(c1.lo, ref.lo, 1e-12);
  EXPECT_NEAR(c1.hi, ref.hi, 1e-12);
  const BootstrapCi other = paired_ratio_bootstrap(x, false, 5000, 12);
  EXPECT_EQ(other.estimate, c1.estimate);
  EXPECT_NE(other.lo, c1.lo);
  EXPECT_THROW(paired_ratio_bootstrap(PairedSums{}, false, 10, 0), Error);
}

// ---------------------------------------------------------------- a synthetic results DB

json stream_cfg(const std::string& model, const json& method) {
  return {{"model", model},
          {"device", "cpu"},
          {"dtype", "fp32"},
          {"threads", 0},
          {"seed", 0},
          {"label", ""},
          {"method", method},
          {"protocol",
           {{"name", "stream"},
            {"dataset", "d"},
            {"window", 5},
            {"stride", 0},
            {"max_windows", 4},
            {"prefill_tokens", 1},
            {"prefill_chunk", 512}}}};
}

// One stream sample of 4 tokens: per-token KL `kl`, nll_sum, agreeing tokens, `bytes` of KV held.
json stream_sample(double kl, double nll_sum, int agree, int64_t bytes, int64_t host_bytes = 0) {
  return {{"tokens", 4},
          {"nll_sum", nll_sum},
          {"kl", {kl, kl, kl, kl}},
          {"top1_agree", agree},
          {"abs_dprob_sum", 0.0},
          {"baseline_from_cache", false},
          {"counters", json::object()},
          {"ledger",
           {{"tokens_seen", 4},
            {"baseline_bytes", 400},
            {"device_payload_bytes", bytes},
            {"device_metadata_bytes", 0},
            {"device_index_bytes", 0},
            {"device_reserved_bytes", 0},
            {"host_bytes", host_bytes},
            {"remote_bytes", 0},
            {"logical_bytes", bytes + host_bytes},
            {"tokens_held", 4}}}};
}

std::string add_stream_run(ResultsDb& db, const json& cfg, const std::vector<json>& samples, bool simulated = false) {
  RunSpec spec;
  spec.config_json = canonical_json(cfg);
  spec.config_hash = run_config_hash(cfg);
  spec.method = cfg["method"]["name"];
  spec.model = cfg["model"];
  spec.dataset = "d";
  spec.protocol = cfg["protocol"]["name"];
  spec.grid = "g";
  spec.simulated = simulated;
  RunInfo info = db.begin_run(spec);
  std::vector<StreamSampleResult> all;
  for (size_t i = 0; i < samples.size(); ++i) {
    db.add_sample(info.id, static_cast<int64_t>(i), "key" + std::to_string(i), samples[i].dump());
    all.push_back(StreamSampleResult::from_json(samples[i]));
  }
  db.finish_run(info.id, stream_metrics(all, simulated), 1.0);
  return spec.config_hash;
}

void add_perf_run(ResultsDb& db, const std::string& model, const json& method, double tok_s) {
  json cfg = stream_cfg(model, method);
  cfg["protocol"] = {{"name", "perf"}, {"context", 64}, {"decode_tokens", 8}, {"batch_sizes", "1"},
                     {"repeats", 1}, {"prefill_chunk", 512}};
  RunSpec spec;
  spec.config_json = canonical_json(cfg);
  spec.config_hash = run_config_hash(cfg);
  spec.method = method["name"];
  spec.model = model;
  spec.dataset = "synthetic";
  spec.protocol = "perf";
  RunInfo info = db.begin_run(spec);
  db.add_sample(info.id, 0, "batch=1", json({{"batch", 1}, {"decode_tok_s", tok_s}, {"physical_bytes", 64}, {"tokens_seen", 72}}).dump());
  db.finish_run(info.id, {Metric("decode_tok_s", tok_s, "tok/s", Direction::kHigher), Metric("bytes_per_token", 1.0, "bytes", Direction::kLower)}, 1.0);
}

struct Fixture {
  std::string dir, db;
  std::string full_hash, e50_hash, e25_hash, sim_hash;
};

// m: full (100 B/token, KL 0), evict(budget=0.5) (50 B/token, KL 0.1..0.4 by sample),
// evict(budget=0.25) (25 B/token, KL 0.5), quant (simulated: 100 B/token, KL 0.05) and a failed run;
// perf runs for full and evict(0.5). m2: two methods and no full run.
Fixture make_fixture() {
  Fixture f;
  f.dir = test::make_temp_dir("lb");
  f.db = f.dir + "/db.sqlite";
  ResultsDb db(f.db);
  auto samples = [](std::function<double(int)> kl, double nll, int agree, int64_t bytes) {
    std::vector<json> v;
    for (int i = 0; i < 4; ++i) v.push_back(stream_sample(kl(i), nll, agree, bytes));
    return v;
  };
  const json full = {{"name", "full"}, {"params", json::object()}};
  const json e50 = {{"name", "evict"}, {"params", {{"budget", 0.5}}}};
  const json e25 = {{"name", "evict"}, {"params", {{"budget", 0.25}}}};
  const json quant = {{"name", "quant"}, {"params", {{"bits", 2}}}};
  f.full_hash = add_stream_run(db, stream_cfg("m", full), samples([](int) { return 0.0; }, 4.0, 4, 400));
  f.e50_hash = add_stream_run(db, stream_cfg("m", e50), samples([](int i) { return 0.1 * (i + 1); }, 4.4, 3, 200));
  f.e25_hash = add_stream_run(db, stream_cfg("m", e25), samples([](int) { return 0.5; }, 4.8, 3, 100));
  f.sim_hash = add_stream_run(db, stream_cfg("m", quant), samples([](int) { return 0.05; }, 4.1, 4, 400), true);
  RunSpec bad;
  json bad_cfg = stream_cfg("m", json{{"name", "evict"}, {"params", {{"budget", 0.1}}}});
  bad.config_json = canonical_json(bad_cfg);
  bad.config_hash = run_config_hash(bad_cfg);
  bad.method = "evict";
  bad.model = "m";
  bad.dataset = "d";
  bad.protocol = "stream";
  db.fail_run(db.begin_run(bad).id, "evict: budget too small");
  add_perf_run(db, "m", full, 100.0);
  add_perf_run(db, "m", e50, 200.0);
  add_stream_run(db, stream_cfg("m2", e50), samples([](int) { return 0.2; }, 4.4, 3, 200));
  add_stream_run(db, stream_cfg("m2", e25), samples([](int) { return 0.3; }, 4.8, 3, 100));
  return f;
}

const LeaderTable& table_for(const Leaderboard& lb, const std::string& model, const std::string& protocol) {
  for (const auto& t : lb.tables)
    if (t.model == model && t.protocol == protocol) return t;
  throw std::runtime_error("no table " + model + "/" + protocol);
}

TEST(Leaderboard, RanksAtMeasuredBytesWithPairedCisFrontiersAndFlags) {
  Fixture f = make_fixture();
  ResultsDb db(f.db);
  LeaderboardOptions o;
  o.seed = 3;
  Leaderboard lb = build_leaderboard(db, o);
  ASSERT_EQ(lb.tables.size(), 3u);  // m stream, m2 stream, m perf (accuracy tables first)
  EXPECT_EQ(lb.tables[2].protocol, "perf");
  const LeaderTable& t = table_for(lb, "m", "stream");
  EXPECT_EQ(t.metric, "kl_mean");
  EXPECT_EQ(t.direction, Direction::kLower);
  EXPECT_EQ(t.baseline_hash, f.full_hash);
  EXPECT_EQ(t.baseline_samples, 4u);
  EXPECT_EQ(t.settings_text, "window=5, max_windows=4");
  ASSERT_EQ(t.rows.size(), 5u);
  std::vector<std::string> order;
  for (const auto& r : t.rows) order.push_back(r.label);
  EXPECT_EQ(order, (std::vector<std::string>{"full", "quant(bits=2)", "evict(budget=0.5)", "evict(budget=0.25)",
                                             "evict(budget=0.1)"}));
  const LeaderRow &full = t.rows[0], &sim = t.rows[1], &e50 = t.rows[2], &e25 = t.rows[3], &bad = t.rows[4];
  EXPECT_EQ(full.rank, 1);
  EXPECT_EQ(e25.rank, 4);
  EXPECT_EQ(bad.rank, 0);
  EXPECT_EQ(bad.status, "failed");
  EXPECT_EQ(bad.error, "evict: budget too small");
  // Measured bytes per token and compression from the runs' ledgers.
  EXPECT_DOUBLE_EQ(e50.bytes_per_token, 50.0);
  EXPECT_DOUBLE_EQ(e25.compression_ratio, 4.0);
  EXPECT_TRUE(sim.simulated);
  EXPECT_FALSE(e50.simulated);
  // Δ kl_mean vs full: the paired bootstrap over per-sample KL means 0.1..0.4.
  EXPECT_EQ(full.deltas.at("kl_mean").status, "baseline");
  const DeltaCi& d = e50.deltas.at("kl_mean");
  ASSERT_EQ(d.status, "ok");
  EXPECT_NEAR(d.estimate, 0.25, 1e-12);
  const BootstrapCi ref = paired_bootstrap({0.1, 0.2, 0.3, 0.4}, {0, 0, 0, 0}, 10000, 3);
  EXPECT_NEAR(d.lo, ref.lo, 1e-12);
  EXPECT_NEAR(d.hi, ref.hi, 1e-12);
  EXPECT_EQ(d.n, 4u);
  // ppl: exp(4.4/4) - exp(1) exactly, with a degenerate interval (every sample has the same nll).
  const DeltaCi& dp = e50.deltas.at("ppl");
  EXPECT_NEAR(dp.estimate, std::exp(1.1) - std::exp(1.0), 1e-12);
  EXPECT_NEAR(dp.lo, dp.estimate, 1e-12);
  // Pareto vs bytes/token: full, evict 0.5 and 0.25; the simulated quant (100 B/token, worse KL) is not.
  EXPECT_TRUE(full.pareto_memory);
  EXPECT_TRUE(e50.pareto_memory);
  EXPECT_TRUE(e25.pareto_memory);
  EXPECT_FALSE(sim.pareto_memory);
  // Throughput from the perf runs; frontier vs throughput among the rows that have it.
  EXPECT_TRUE(t.has_throughput);
  ASSERT_TRUE(e50.decode_tok_s.has_value());
  EXPECT_EQ(*e50.decode_tok_s, 200.0);
  EXPECT_FALSE(e25.decode_tok_s.has_value());
  EXPECT_TRUE(full.pareto_throughput);
  EXPECT_TRUE(e50.pareto_throughput);
  EXPECT_FALSE(e25.pareto_throughput);
  // No full run for m2: said so instead of a CI.
  const LeaderTable& t2 = table_for(lb, "m2", "stream");
  EXPECT_TRUE(t2.baseline_hash.empty());
  for (const auto& r : t2.rows) EXPECT_EQ(r.deltas.at("kl_mean").status, "no_baseline");
  // Filters and --metric.
  o.filter.model = "m2";
  EXPECT_EQ(build_leaderboard(db, o).tables.size(), 1u);
  o.filter.model = "";
  o.metric = "ppl";
  Leaderboard by_ppl = build_leaderboard(db, o);
  EXPECT_EQ(table_for(by_ppl, "m", "stream").metric, "ppl");
  EXPECT_EQ(table_for(by_ppl, "m", "stream").secondary, std::vector<std::string>{"kl_mean"});
  o.metric = "kl_meen";
  EXPECT_THROW(build_leaderboard(db, o), Error);
}

TEST(Leaderboard, TieringRowsShowTheDeviceRatioBesideTheTotal) {
  // A tiering method keeps 100 B on the device and a 400 B copy on the host: 0.8x over all tiers
  // (it holds more than the full cache), 4x on the device. Both numbers appear; a device-only row
  // shows one.
  const std::string dir = test::make_temp_dir("lb-tier");
  ResultsDb db(dir + "/db.sqlite");
  std::vector<json> full, tier;
  for (int i = 0; i < 4; ++i) {
    full.push_back(stream_sample(0.0, 4.0, 4, 400));
    tier.push_back(stream_sample(0.01, 4.1, 4, 100, 400));
  }
  add_stream_run(db, stream_cfg("m", {{"name", "full"}, {"params", json::object()}}), full);
  add_stream_run(db, stream_cfg("m", {{"name", "tier"}, {"params", json::object()}}), tier);
  LeaderboardOptions o;
  const Leaderboard lb = build_leaderboard(db, o);
  const LeaderTable& t = table_for(lb, "m", "stream");
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(t.rows[1].compression_ratio, 0.8);
  EXPECT_DOUBLE_EQ(t.rows[1].metrics.at("device_compression_ratio"), 4.0);
  const std::string md = leaderboard_markdown(lb);
  EXPECT_NE(md.find("| 0.80× (device 4.00×) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1.00× |"), std::string::npos) << md;
}

TEST(Leaderboard, FormatsAreCompleteAndDeterministicUnderTheSeed) {
  Fixture f = make_fixture();
  auto md = test::run_kvbench("leaderboard --db " + f.db + " --seed 3");
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_NE(md.out.find("### m · d · stream (window=5, max_windows=4)"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| 3 | evict(budget=0.5) | 50 | 2.00× | 0.2500 | +0.2500 ["), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| – | evict(budget=0.1) | **failed**: evict: budget too small |"), std::string::npos);
  EXPECT_NE(md.out.find("No full-cache run in this group"), std::string::npos);
  EXPECT_NE(md.out.find("| 2 | quant(bits=2) | 100 | 1.00× |"), std::string::npos);
  EXPECT_NE(md.out.find("| yes |"), std::string::npos);  // simulated
  auto md2 = test::run_kvbench("leaderboard --db " + f.db + " --seed 3");
  EXPECT_EQ(md.out, md2.out);

  auto j3 = test::run_kvbench("leaderboard -f json --db " + f.db + " --seed 3");
  auto j3b = test::run_kvbench("leaderboard -f json --db " + f.db + " --seed 3");
  auto j4 = test::run_kvbench("leaderboard -f json --db " + f.db + " --seed 4");
  ASSERT_EQ(j3.exit_code, 0) << j3.err;
  EXPECT_EQ(j3.out, j3b.out);
  json a = json::parse(j3.out), b = json::parse(j4.out);
  const json& ra = a["tables"][0]["rows"][2]["deltas"]["kl_mean"];
  const json& rb = b["tables"][0]["rows"][2]["deltas"]["kl_mean"];
  EXPECT_EQ(ra["estimate"], rb["estimate"]);  // the seed moves only the interval
  EXPECT_EQ(b["bootstrap"]["seed"], 4);
  EXPECT_EQ(a["bootstrap"]["seed"], 3);

  auto csv = test::run_kvbench("leaderboard -f csv --db " + f.db + " --protocol stream");
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 1 + 5 + 2);  // header + m + m2
  EXPECT_EQ(csv.out.rfind("model,dataset,protocol,settings,rank,method,label,config_hash", 0), 0u);

  auto bad = test::run_kvbench("leaderboard --db " + f.dir + "/missing.sqlite");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_FALSE(std::ifstream(f.dir + "/missing.sqlite").good());
  auto badm = test::run_kvbench("leaderboard --db " + f.db + " --metric kl_meen");
  EXPECT_EQ(badm.exit_code, 2);
  EXPECT_NE(badm.err.find("did you mean 'kl_mean'"), std::string::npos) << badm.err;
}

// ---------------------------------------------------------------- oracle rows and headroom

const LeaderRow& row_labelled(const LeaderTable& t, const std::string& label) {
  for (const auto& r : t.rows)
    if (r.label == label) return r;
  throw std::runtime_error("no row " + label);
}

TEST(LeaderboardHeadroom, OracleRowsAreMarkedUnrankedAndEachMethodGetsItsShareOfTheGain) {
  EXPECT_DOUBLE_EQ(headroom_value(0.2, 0.5, 0.1), 0.75);
  EXPECT_DOUBLE_EQ(headroom_value(0.8, 0.6, 1.0), 0.5);    // higher is better: the same formula
  EXPECT_TRUE(std::isnan(headroom_value(0.3, 0.4, 0.4)));  // oracle == floor
  EXPECT_TRUE(std::isnan(headroom_value(0.3, NAN, 0.1)));
  EXPECT_EQ(std::string(kHeadroomFloorMethod), "streaming_llm");

  const std::string dir = test::make_temp_dir("lb-headroom");
  const std::string path = dir + "/db.sqlite";
  {
    ResultsDb db(path);
    auto run = [&](const std::string& model, const std::string& name, json params, double kl,
                   int64_t bytes) {
      std::vector<json> v;
      for (int i = 0; i < 4; ++i) v.push_back(stream_sample(kl, 4.0 + kl, 4, bytes));
      add_stream_run(db, stream_cfg(model, {{"name", name}, {"params", params}}), v);
    };
    run("h", "full", json::object(), 0.0, 400);
    run("h", "streaming_llm", {{"budget", 0.25}}, 0.5, 100);
    run("h", "snapkv", {{"budget", 0.25}}, 0.2, 100);
    run("h", "oracle_topk", {{"budget", 0.25}}, 0.1, 100);  // the best oracle at 0.25
    run("h", "oracle_topk", {{"budget", 0.25}, {"gqa_agg", "mean"}}, 0.15, 100);
    run("h", "snapkv", {{"budget", 0.5}}, 0.05, 200);  // no oracle at 0.5
    run("h", "streaming_llm", {{"budget", 0.5}}, 0.3, 200);
    run("h", "snapkv", {{"budget", 25}, {"budget_unit", "tokens_per_head"}}, 0.3, 100);  // no floor
    // A group where the oracle does no better than the floor: nothing to share.
    run("h2", "streaming_llm", {{"budget", 0.25}}, 0.4, 100);
    run("h2", "oracle_topk", {{"budget", 0.25}}, 0.4, 100);
    run("h2", "snapkv", {{"budget", 0.25}}, 0.3, 100);
  }
  ResultsDb db(path);
  const Leaderboard lb = build_leaderboard(db, LeaderboardOptions{});
  const LeaderTable& t = table_for(lb, "h", "stream");
  ASSERT_EQ(t.rows.size(), 8u);
  const LeaderRow& snap = row_labelled(t, "snapkv(budget=0.25)");
  EXPECT_NEAR(snap.headroom, 0.75, 1e-6);  // KL is stored in fp32
  EXPECT_EQ(row_labelled(t, "streaming_llm(budget=0.25)").headroom, 0.0);
  EXPECT_FALSE(std::signbit(row_labelled(t, "streaming_llm(budget=0.25)").headroom));  // not "-0.00"
  EXPECT_TRUE(std::isnan(row_labelled(t, "snapkv(budget=0.5)").headroom));
  EXPECT_TRUE(
      std::isnan(row_labelled(t, "snapkv(budget=25, budget_unit=tokens_per_head)").headroom));
  EXPECT_TRUE(std::isnan(row_labelled(t, "full").headroom));
  // Oracle rows: flagged from the registry's caps, never ranked, off the Pareto frontier (the
  // oracle at 100 B/token would otherwise dominate snapkv at 0.25).
  int oracles = 0;
  std::vector<int> ranks;
  for (const auto& r : t.rows) {
    if (r.method == "oracle_topk") {
      ++oracles;
      EXPECT_TRUE(r.oracle);
      EXPECT_EQ(r.rank, 0);
      EXPECT_FALSE(r.pareto_memory);
      EXPECT_TRUE(std::isnan(r.headroom));
    } else {
      EXPECT_FALSE(r.oracle) << r.label;
      ranks.push_back(r.rank);
    }
  }
  EXPECT_EQ(oracles, 2);
  // streaming_llm(budget=0.5) and snapkv(budget=25 tokens) have the same KL on every sample: tied,
  // they share rank 4 (and the next row is 6th).
  EXPECT_EQ(ranks, (std::vector<int>{1, 2, 3, 4, 4, 6}));
  EXPECT_TRUE(row_labelled(t, "snapkv(budget=25, budget_unit=tokens_per_head)").tied_above ||
              row_labelled(t, "streaming_llm(budget=0.5)").tied_above);
  EXPECT_TRUE(snap.pareto_memory);
  const LeaderTable& t2 = table_for(lb, "h2", "stream");
  for (const auto& r : t2.rows) EXPECT_TRUE(std::isnan(r.headroom)) << r.label;

  // Every format carries the flag and the value.
  const std::string md = leaderboard_markdown(lb);
  EXPECT_NE(md.find(" headroom ↑ |"), std::string::npos) << md;
  EXPECT_NE(md.find("| oracle | oracle_topk |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0.75 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| n/a |"), std::string::npos) << md;
  const std::string csv = leaderboard_csv(lb);
  EXPECT_NE(csv.find(",oracle,headroom,"), std::string::npos);
  EXPECT_NE(csv.find(",0,0.75,"), std::string::npos) << csv;  // snapkv: not an oracle, 0.75
  const json j = leaderboard_json(lb);
  int json_oracles = 0;
  for (const auto& tj : j["tables"])
    for (const auto& r : tj["rows"]) {
      json_oracles += r["oracle"].get<bool>();
      if (r["label"] == snap.label && tj["model"] == "h") {
        EXPECT_NEAR(r["headroom"].get<double>(), 0.75, 1e-6);
      }
      if (r["oracle"].get<bool>()) {
        EXPECT_TRUE(r["rank"].is_null());
        EXPECT_TRUE(r["headroom"].is_null());
      }
    }
  EXPECT_EQ(json_oracles, 3);
  const std::string html = leaderboard_html(lb);
  EXPECT_NE(html.find("<th>headroom ↑</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>oracle</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>0.75</td>"), std::string::npos);
}

// Quantizers have no `budget`: their rows meet oracle_quant at the same KVTuner equivalent bits,
// with the pertoken row there as the floor.
// Ranks are what the data can separate: a row whose paired interval against the rank's first row
// holds 0 shares its rank ("=N" in every format); a row clearly worse gets its own.
TEST(Leaderboard, RowsTheIntervalsCannotSeparateShareARank) {
  const std::string dir = test::make_temp_dir("lb_ties");
  const std::string path = dir + "/db.sqlite";
  {
    ResultsDb db(path);
    auto run = [&](const std::string& name, double budget, const std::vector<double>& kls) {
      std::vector<json> v;
      for (double kl : kls) v.push_back(stream_sample(kl, 4.0 + kl, 4, 100));
      add_stream_run(db, stream_cfg("m", {{"name", name}, {"params", {{"budget", budget}}}}), v);
    };
    run("full", 0, {0, 0, 0, 0, 0, 0});
    run("snapkv", 0.25, {0.1, 0.2, 0.1, 0.2, 0.1, 0.2});
    run("knorm", 0.25, {0.2, 0.11, 0.2, 0.11, 0.2, 0.11});  // not separable from snapkv
    // Not separable from knorm, but worse than snapkv on every sample: no chained tie.
    run("cur", 0.25, {0.18, 0.24, 0.18, 0.24, 0.18, 0.24});
    run("streaming_llm", 0.25, {0.6, 0.7, 0.6, 0.7, 0.6, 0.7});  // worse on every sample
  }
  ResultsDb db(path);
  const Leaderboard lb = build_leaderboard(db, LeaderboardOptions{});
  const LeaderTable& t = table_for(lb, "m", "stream");
  std::vector<std::pair<std::string, int>> ranks;
  for (const auto& r : t.rows) ranks.push_back({r.method, r.rank});
  ASSERT_EQ(t.rows.size(), 5u);
  EXPECT_EQ(t.rows[0].rank, 1);  // full
  EXPECT_EQ(t.rows[1].method, "snapkv");  // worse than full on every sample
  EXPECT_FALSE(t.rows[1].tied_above);
  EXPECT_EQ(t.rows[1].rank, 2);
  EXPECT_EQ(t.rows[2].method, "knorm");
  EXPECT_TRUE(t.rows[2].tied_above);
  EXPECT_EQ(t.rows[2].rank, 2);
  EXPECT_EQ(t.rows[3].method, "cur");
  EXPECT_FALSE(t.rows[3].tied_above);
  EXPECT_EQ(t.rows[3].rank, 4);
  EXPECT_EQ(t.rows[4].method, "streaming_llm");
  EXPECT_FALSE(t.rows[4].tied_above);
  EXPECT_EQ(t.rows[4].rank, 5);
  const std::string md = leaderboard_markdown(lb);
  EXPECT_NE(md.find("| =2 | "), std::string::npos) << md;
  EXPECT_NE(md.find("=N: tied with the first row ranked N"), std::string::npos) << md;
}

TEST(LeaderboardHeadroom, QuantizersMatchTheQuantOracleAtTheSameEquivalentBits) {
  EXPECT_EQ(equivalent_bits_of("kvtuner", {{"pairs", "K4V2"}}), 3);
  EXPECT_EQ(equivalent_bits_of("kvtuner", {{"pairs", "KV8, K4V2,KV2,KV4"}}), 4.25);
  EXPECT_TRUE(std::isnan(equivalent_bits_of("kvtuner", {{"pairs", "K4"}})));
  EXPECT_TRUE(std::isnan(equivalent_bits_of("kvtuner", {{"pairs", "KV4"}, {"config", "c.json"}})));
  EXPECT_EQ(equivalent_bits_of("kivi", {{"preset", "kivi-4"}, {"k_bits", 2}, {"v_bits", 2}}), 4);
  EXPECT_EQ(equivalent_bits_of("kivi", {{"preset", "none"}, {"k_bits", 4}, {"v_bits", 2}}), 3);
  EXPECT_EQ(equivalent_bits_of("pertoken", {{"k_bits", 8}, {"v_bits", 4}}), 6);
  EXPECT_EQ(equivalent_bits_of("oracle_quant", {{"bits", 3.5}}), 3.5);
  EXPECT_TRUE(std::isnan(equivalent_bits_of("snapkv", {{"budget", 0.25}})));
  EXPECT_EQ(std::string(kHeadroomQuantFloorMethod), "pertoken");

  const std::string dir = test::make_temp_dir("lb-headroom-quant");
  const std::string path = dir + "/db.sqlite";
  {
    ResultsDb db(path);
    auto run = [&](const std::string& name, json params, double kl) {
      std::vector<json> v;
      for (int i = 0; i < 4; ++i) v.push_back(stream_sample(kl, 4.0 + kl, 4, 100));
      add_stream_run(db, stream_cfg("q", {{"name", name}, {"params", params}}), v);
    };
    run("full", json::object(), 0.0);
    run("pertoken", {{"k_bits", 4}, {"v_bits", 2}}, 0.5);
    run("kvtuner", {{"pairs", "K4V2"}}, 0.3);
    run("kivi", {{"preset", "none"}, {"k_bits", 4}, {"v_bits", 2}}, 0.25);
    run("oracle_quant", {{"bits", 3}}, 0.1);
    run("kvtuner", {{"pairs", "KV4"}}, 0.2);  // 4 bits: no oracle there
    run("streaming_llm", {{"budget", 0.25}}, 0.6);
  }
  ResultsDb db(path);
  const Leaderboard lb = build_leaderboard(db, LeaderboardOptions{});
  const LeaderTable& t = table_for(lb, "q", "stream");
  auto headroom = [&](const std::string& method, const std::string& needle) {
    for (const auto& r : t.rows)
      if (r.method == method && r.label.find(needle) != std::string::npos) return r.headroom;
    ADD_FAILURE() << "no row " << method << " " << needle;
    return static_cast<double>(NAN);
  };
  EXPECT_NEAR(headroom("kvtuner", "K4V2"), 0.5, 1e-6);  // (0.3 - 0.5) / (0.1 - 0.5)
  EXPECT_NEAR(headroom("kivi", "k_bits=4"), 0.625, 1e-6);
  EXPECT_EQ(headroom("pertoken", "v_bits=2"), 0.0);  // the floor
  EXPECT_TRUE(std::isnan(headroom("kvtuner", "KV4")));
  EXPECT_TRUE(std::isnan(headroom("streaming_llm", "0.25")));  // no oracle at that budget
  EXPECT_TRUE(std::isnan(headroom("oracle_quant", "3")));
}

// ---------------------------------------------------------------- curves

std::vector<CurvePoint> curve_points(const std::vector<std::pair<double, double>>& xy) {
  std::vector<CurvePoint> v;
  for (const auto& [x, y] : xy) {
    CurvePoint p;
    p.compression = x;
    p.value = y;
    v.push_back(p);
  }
  return v;
}

TEST(LeaderboardCurves, SummariesMatchAWorkedExample) {
  // Full cache 1.0 at 0; points (0.5, 0.8), (0.75, 0.4). Trapezoids: 0..0.5 -> 0.45, 0.5..0.75 -> 0.15.
  const auto pts = curve_points({{0.5, 0.8}, {0.75, 0.4}});
  EXPECT_NEAR(curve_auc(1.0, pts, 0.75), 0.6 / 0.75, 1e-12);
  EXPECT_NEAR(curve_auc(1.0, pts, 0.5), 0.45 / 0.5, 1e-12);
  // Clipped inside a segment: the score at 0.6 is interpolated (0.64).
  EXPECT_NEAR(curve_auc(1.0, pts, 0.6), (0.45 + 0.5 * (0.8 + 0.64) * 0.1) / 0.6, 1e-12);
  EXPECT_TRUE(std::isnan(curve_auc(1.0, pts, 0.9)));  // the curve stops short of the range
  EXPECT_TRUE(std::isnan(curve_auc(NAN, pts, 0.5)));  // no full cache
  EXPECT_TRUE(std::isnan(curve_auc(1.0, pts, 0.0)));
  // Largest compression within the tolerance, not the first one: scores need not fall monotonically.
  const auto bumpy = curve_points({{0.25, 0.995}, {0.5, 0.8}, {0.75, 0.99}});
  EXPECT_DOUBLE_EQ(max_compression_within(1.0, 0.01, true, bumpy), 0.75);
  EXPECT_TRUE(std::isnan(max_compression_within(1.0, 0.001, true, bumpy)));
  const auto kl = curve_points({{0.5, 0.05}, {0.75, 0.5}});  // lower is better
  EXPECT_DOUBLE_EQ(max_compression_within(0.0, 0.1, false, kl), 0.5);
}

// No sweep, no curve section: a table whose every method has one budget shows its points in the
// ranked table only (a single point has no range to summarise).
TEST(LeaderboardCurves, ATableWithoutASweepHasNoCurveSection) {
  const std::string dir = test::make_temp_dir("lb-nosweep");
  ResultsDb db(dir + "/db.sqlite");
  std::vector<json> full_s, e_s;
  for (int i = 0; i < 4; ++i) {
    full_s.push_back(stream_sample(0.0, 4.0, 4, 400));
    e_s.push_back(stream_sample(0.1, 4.4, 3, 200));
  }
  add_stream_run(db, stream_cfg("m", json{{"name", "full"}, {"params", json::object()}}), full_s);
  add_stream_run(db, stream_cfg("m", json{{"name", "evict"}, {"params", {{"budget", 0.5}}}}), e_s);
  const std::string md = leaderboard_markdown(build_leaderboard(db, LeaderboardOptions{}));
  EXPECT_NE(md.find("| evict(budget=0.5)"), std::string::npos) << md;
  EXPECT_EQ(md.find("vs measured compression"), std::string::npos) << md;
}

TEST(LeaderboardCurves, EveryFormatCarriesTheCurvesAndTheirSummaries) {
  Fixture f = make_fixture();
  ResultsDb db(f.db);
  LeaderboardOptions o;
  o.seed = 3;
  const Leaderboard lb = build_leaderboard(db, o);
  const LeaderTable& t = table_for(lb, "m", "stream");
  const LeaderCurves& lc = t.curves;
  EXPECT_DOUBLE_EQ(lc.reference_bytes, 100);
  EXPECT_DOUBLE_EQ(lc.full_value, 0);
  EXPECT_DOUBLE_EQ(lc.auc_range, 0.75);  // evict's largest compression; quant has one point and does not set it
  ASSERT_EQ(lc.curves.size(), 3u);       // full first, then by name; the failed run has no point
  EXPECT_EQ(lc.curves[0].name, "full");
  EXPECT_TRUE(lc.curves[0].baseline);
  const MethodCurve& evict = lc.curves[1];
  EXPECT_EQ(evict.name, "evict");
  ASSERT_EQ(evict.points.size(), 2u);
  EXPECT_DOUBLE_EQ(evict.points[0].budget, 0.5);
  EXPECT_DOUBLE_EQ(evict.points[0].compression, 0.5);  // 50 of the full cache's 100 bytes/token
  EXPECT_DOUBLE_EQ(evict.points[1].compression, 0.75);
  EXPECT_NEAR(evict.points[0].value, 0.25, 1e-7);  // the fixture's metrics are stored as float
  // (0,0) -> (0.5,0.25) -> (0.75,0.5): (0.0625 + 0.09375) / 0.75
  EXPECT_NEAR(evict.auc, 0.15625 / 0.75, 1e-7);
  EXPECT_TRUE(std::isnan(evict.max_compression_within_1pt));  // kl 0 at full: 1% of 0 tolerates nothing
  EXPECT_EQ(lc.curves[2].name, "quant");
  EXPECT_TRUE(lc.curves[2].simulated);
  EXPECT_TRUE(std::isnan(lc.curves[2].auc));  // one point at compression 0, short of the range
  EXPECT_TRUE(std::isnan(lc.curves[2].max_compression_within_1pt));  // kl 0.05 > 0
  EXPECT_EQ(evict.points[0].config.dump(), stream_cfg("m", json{{"name", "evict"}, {"params", {{"budget", 0.5}}}}).dump());
  EXPECT_NE(reproduce_command(evict.points[0].config).find("kvbench run -c run.json"), std::string::npos);
  // m2 has no full run: compression against each run's own uncompressed baseline, no summaries.
  const LeaderTable& t2 = table_for(lb, "m2", "stream");
  ASSERT_EQ(t2.curves.curves.size(), 1u);
  EXPECT_DOUBLE_EQ(t2.curves.curves[0].points[1].compression, 0.75);
  EXPECT_TRUE(std::isnan(t2.curves.curves[0].auc));

  const std::string md = leaderboard_markdown(lb);
  EXPECT_NE(md.find("#### kl_mean vs measured compression"), std::string::npos) << md;
  EXPECT_NE(md.find("| evict | 2 | – | 0.2083 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| evict | 0.5000 | 50.0% | 0.2500 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| evict | 0.2500 | 75.0% | 0.5000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| quant | 1 | – | – |"), std::string::npos) << md;

  const json j = leaderboard_json(lb);
  const json* jt = nullptr;
  for (const auto& x : j["tables"])
    if (x["model"] == "m" && x["protocol"] == "stream") jt = &x;
  ASSERT_NE(jt, nullptr);
  const json& jc = (*jt)["curves"];
  EXPECT_EQ(jc["auc_range"], 0.75);
  EXPECT_EQ(jc["curves"][1]["name"], "evict");
  EXPECT_NEAR(jc["curves"][1]["auc"].get<double>(), evict.auc, 1e-15);
  EXPECT_TRUE(jc["curves"][1]["max_compression_within_1pt"].is_null());
  EXPECT_EQ(jc["curves"][1]["points"][1]["measured_compression"], 0.75);
  EXPECT_EQ(jc["curves"][1]["points"][1]["config_hash"], f.e25_hash);

  // CSV: each row is one point of its curve, with the curve's summaries.
  const std::string csv = leaderboard_csv(lb);
  std::istringstream in(csv);
  std::string header, line;
  std::getline(in, header);
  // RFC 4180 fields: a quoted field may hold commas and doubled quotes (settings, labels).
  auto split = [](const std::string& l) {
    std::vector<std::string> v;
    std::string cur;
    bool quoted = false;
    for (size_t i = 0; i < l.size(); ++i) {
      const char c = l[i];
      if (quoted) {
        if (c == '"' && i + 1 < l.size() && l[i + 1] == '"') {
          cur += '"';
          ++i;
        } else if (c == '"') {
          quoted = false;
        } else {
          cur += c;
        }
      } else if (c == '"') {
        quoted = true;
      } else if (c == ',') {
        v.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    v.push_back(cur);
    return v;
  };
  const auto cols = split(header);
  auto col = [&](const std::string& n) { return std::find(cols.begin(), cols.end(), n) - cols.begin(); };
  size_t seen = 0;
  while (std::getline(in, line)) {
    if (line.find(f.e25_hash) == std::string::npos) continue;
    const auto v = split(line);
    ASSERT_EQ(v.size(), cols.size());
    EXPECT_EQ(v[col("curve")], "evict");
    EXPECT_EQ(v[col("budget")], "0.25");
    EXPECT_EQ(v[col("measured_compression")], "0.75");
    EXPECT_NEAR(std::stod(v[col("curve_auc")]), evict.auc, 1e-9);
    EXPECT_EQ(v[col("curve_auc_range")], "0.75");
    EXPECT_EQ(v[col("curve_max_compression_within_1pt")], "");
    ++seen;
  }
  EXPECT_EQ(seen, 1u);
}

// ---------------------------------------------------------------- HTML in headless Chromium

std::string find_chromium() {
  for (const char* c : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string cmd = std::string("command -v ") + c + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return c;
  }
  return "";
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

std::string between(const std::string& s, const std::string& open, const std::string& close, size_t from = 0) {
  const size_t a = s.find(open, from);
  if (a == std::string::npos) return "";
  const size_t b = s.find(close, a);
  return s.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

TEST(Leaderboard, HtmlRendersInHeadlessChromiumWithOnePointPerMethod) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (Debian package `chromium`, in scripts/setup.sh)";
  const std::string dir = test::make_temp_dir("lb_html");
  // A real grid: stream fidelity for several methods plus perf runs for throughput.
  std::string methods = R"("full", "static", {"name": "paged", "params": {"block_size": [4, 16]}})";
  for (const char* m : {"streaming_llm", "h2o"})
    if (MethodRegistry::instance().has(m))
      methods += std::string(R"(, {"name": ")") + m + R"(", "params": {"budget": [0.5, 0.25]}})";
  write_file(dir + "/grid.json", R"({"name": "html", "base": {"model": ")" + test::models_dir() +
                                     R"(/stories260K"}, "axes": {"method": [)" + methods + R"(],
      "protocol": [{"name": "stream", "dataset": "tinystories-valid-sample", "window": 64, "max_windows": 3, "prefill_tokens": 16},
                   {"name": "perf", "context": 32, "decode_tokens": 8, "repeats": 1}]}})");
  auto g = test::run_kvbench("grid -q -c " + dir + "/grid.json --db " + dir + "/db.sqlite --data-dir " + test::data_dir());
  ASSERT_EQ(g.exit_code, 0) << g.err;
  auto h = test::run_kvbench("leaderboard -f html --db " + dir + "/db.sqlite -o " + dir + "/leaderboard.html");
  ASSERT_EQ(h.exit_code, 0) << h.err;
  const std::string html = read_file(dir + "/leaderboard.html");
  // Self-contained: no scripts, no external references.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  std::string no_ns = html;
  const std::string ns = "xmlns=\"http://www.w3.org/2000/svg\"";
  for (size_t p = no_ns.find(ns); p != std::string::npos; p = no_ns.find(ns)) no_ns.erase(p, ns.size());
  EXPECT_EQ(no_ns.find("http://"), std::string::npos);
  EXPECT_EQ(no_ns.find("https://"), std::string::npos);
  json lb = json::parse(test::run_kvbench("leaderboard -f json --db " + dir + "/db.sqlite").out);

  const std::string shot = dir + "/leaderboard.png", dom = dir + "/dom.html";
  const std::string url = "file://" + dir + "/leaderboard.html";
  const std::string flags = " --headless --disable-gpu --no-sandbox --hide-scrollbars ";
  const std::string cmd1 = "timeout 120 " + chromium + flags + "--screenshot=" + shot +
                           " --window-size=1280,2000 " + url + " >" + dir + "/chromium.log 2>&1";
  const std::string cmd2 = "timeout 120 " + chromium + flags + "--dump-dom " + url + " >" + dom + " 2>>" + dir + "/chromium.log";
  ASSERT_EQ(std::system(cmd1.c_str()), 0) << read_file(dir + "/chromium.log");
  ASSERT_EQ(std::system(cmd2.c_str()), 0) << read_file(dir + "/chromium.log");
  std::printf("leaderboard screenshot: %s\n", shot.c_str());
  std::FILE* png = std::fopen(shot.c_str(), "rb");
  ASSERT_NE(png, nullptr);
  unsigned char sig[8] = {0};
  ASSERT_EQ(std::fread(sig, 1, 8, png), 8u);
  std::fseek(png, 0, SEEK_END);
  const long png_bytes = std::ftell(png);
  std::fclose(png);
  EXPECT_EQ(sig[1], 'P');
  EXPECT_EQ(sig[2], 'N');
  EXPECT_GT(png_bytes, 20000);  // a rendered page, not a blank one

  // Fits the page: a copy of the page with a probe script (the page itself has none) reports the
  // document's scroll width and every table, chart, heading, paragraph and command block whose right
  // edge passes the window's, at a desktop and a narrow width.
  {
    std::string probe = html;
    const std::string script =
        "<script>var o=[];document.querySelectorAll('table,svg,pre,h2,p,section').forEach(function(e){"
        "if(e.getBoundingClientRect().right>innerWidth+0.5)o.push(e.tagName+'.'+e.getAttribute('class'))});"
        "document.body.insertAdjacentHTML('beforeend','<div id=\"probe\">inner='+innerWidth+' scroll='+"
        "document.documentElement.scrollWidth+' over='+o.length+' ['+o.join(' ')+']</div>')</script>";
    probe.insert(probe.rfind("</body>"), script);
    write_file(dir + "/probe.html", probe);
    for (int width : {1400, 800}) {
      const std::string out = dir + "/probe" + std::to_string(width) + ".html";
      const std::string cmd = "timeout 120 " + chromium + flags + "--window-size=" + std::to_string(width) +
                              ",2000 --dump-dom file://" + dir + "/probe.html >" + out + " 2>>" + dir + "/chromium.log";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/chromium.log");
      const std::string pd = read_file(out);
      const size_t at = pd.rfind(  // after the script, whose own text holds the same tag
          "<div id=\"probe\">");
      ASSERT_NE(at, std::string::npos) << width;
      int inner = 0, scroll = 0, over = -1;
      ASSERT_EQ(std::sscanf(pd.c_str() + at, "<div id=\"probe\">inner=%d scroll=%d over=%d", &inner, &scroll, &over), 3)
          << pd.substr(at, 200);
      EXPECT_EQ(inner, width);
      EXPECT_LE(scroll, inner) << "horizontal overflow at " << width << " px: " << pd.substr(at, 300);
      EXPECT_EQ(over, 0) << pd.substr(at, 300);
    }
  }

  // The DOM Chromium built: per table, the rows and one point per method in each chart.
  const std::string d = read_file(dom);
  ASSERT_NE(d.find("kvbench leaderboard"), std::string::npos) << d.substr(0, 500);
  ASSERT_EQ(count(d, "<section class=\"board\""), lb["tables"].size());
  size_t from = 0;
  for (const auto& t : lb["tables"]) {
    const size_t start = d.find("<section class=\"board\"", from);
    const size_t end = d.find("</section>", start);
    const std::string sec = d.substr(start, end - start);
    from = end;
    size_t done = 0, with_tok_s = 0;
    for (const auto& r : t["rows"]) {
      done += r["status"] == "done";
      with_tok_s += !r["decode_tok_s"].is_null();
      std::string label;  // as the table writes it: a break opportunity after each "(" and ","
      for (char ch : r["label"].get<std::string>()) label += std::string(1, ch) + (ch == '(' || ch == ',' ? "<wbr>" : "");
      EXPECT_NE(sec.find(">" + label + "<"), std::string::npos) << r["label"];
    }
    EXPECT_EQ(count(sec, "<tr class=\"row"), t["rows"].size()) << t["protocol"];
    // The curves chart: one legend entry and polyline group per method other than the full cache, one
    // point per run, and the full cache's line; the summary table one row per curve (the full cache's too).
    const std::string curves = between(sec, "<svg class=\"chart chart-curves\"", "</svg>");
    size_t n_curves = 0, n_points = 0;
    for (const auto& c : t["curves"]["curves"]) {
      if (c["baseline"]) continue;
      ++n_curves;
      n_points += c["points"].size();
      EXPECT_NE(curves.find("data-name=\"" + c["name"].get<std::string>() + "\""), std::string::npos) << c["name"];
    }
    if (n_curves) {
      EXPECT_EQ(count(curves, "<g class=\"curve\""), n_curves) << t["protocol"];
      EXPECT_EQ(count(curves, "class=\"cpoint"), n_points) << t["protocol"];
      EXPECT_EQ(count(curves, "class=\"fullline\""), 2u);  // the line and its legend swatch
      EXPECT_EQ(count(sec, "<tr class=\"crow\""), t["curves"]["curves"].size());
    }
    if (t["protocol"] == "stream") {
      EXPECT_GE(n_curves, 2u);  // streaming_llm and h2o, two budgets each
    }
    const std::string mem = between(sec, "<svg class=\"chart chart-memory\"", "</svg>");
    ASSERT_FALSE(mem.empty()) << t["protocol"];
    EXPECT_EQ(count(mem, "<circle"), done) << t["protocol"];
    EXPECT_EQ(count(mem, "class=\"plabel\""), done);
    if (t["protocol"] == "stream") {
      EXPECT_GE(done, 4u);
      EXPECT_EQ(with_tok_s, done);  // every method has a perf run
      const std::string thr = between(sec, "<svg class=\"chart chart-throughput\"", "</svg>");
      EXPECT_EQ(count(thr, "<circle"), with_tok_s);
      EXPECT_NE(mem.find("class=\"frontier\""), std::string::npos);
    }
  }
}

// ---------------------------------------------------------------- compare

TEST(Compare, PairedComparisonFlagsRegressionsByDirection) {
  Fixture f = make_fixture();
  // A = evict(0.5) by hash prefix, B = evict(0.25) by run id: KL and nll up (regressions), fewer
  // bytes per token (an improvement).
  ResultsDb db(f.db);
  const int64_t b_id = db.find_run_by_hash(f.e25_hash)->id;
  auto r = test::run_kvbench("compare --json --db " + f.db + " " + f.e50_hash.substr(0, 8) + " " + std::to_string(b_id));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["common_samples"], 4);
  std::map<std::string, json> m;
  for (const auto& x : j["metrics"]) m[x["name"]] = x;
  EXPECT_EQ(m["kl_mean"]["verdict"], "regression");
  EXPECT_NEAR(m["kl_mean"]["diff"].get<double>(), 0.25, 1e-12);
  EXPECT_EQ(m["nll"]["verdict"], "regression");
  EXPECT_EQ(m["ppl"]["verdict"], "regression");
  EXPECT_EQ(m["top1_agreement"]["verdict"], "unchanged");
  EXPECT_EQ(m["bytes_per_token"]["verdict"], "improvement");
  EXPECT_DOUBLE_EQ(m["bytes_per_token"]["a"].get<double>(), 50.0);
  EXPECT_EQ(j["regressions"], 3);
  auto text = test::run_kvbench("compare --db " + f.db + " " + f.e50_hash.substr(0, 8) + " " + f.e25_hash.substr(0, 10));
  EXPECT_NE(text.out.find("REGRESSION"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("3 regression(s), 1 improvement(s)"), std::string::npos) << text.out;
  auto fail = test::run_kvbench("compare --fail-on-regression --db " + f.db + " " + f.e50_hash.substr(0, 8) + " " +
                                std::to_string(b_id));
  EXPECT_EQ(fail.exit_code, 3);
  // The same run against itself: nothing moves.
  auto same = test::run_kvbench("compare --json --fail-on-regression --db " + f.db + " " + f.e50_hash.substr(0, 6) +
                                " " + f.e50_hash.substr(0, 7));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  const json same_json = json::parse(same.out);  // held: the loop reads into it
  for (const auto& x : same_json["metrics"]) EXPECT_EQ(x["verdict"], "unchanged") << x;
  // Bad references: one clear line, exit 2.
  auto none = test::run_kvbench("compare --db " + f.db + " ffffffff 1");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("no run whose config hash starts with ffffffff"), std::string::npos) << none.err;
}

// A results DB with a garbled page: leaderboard and compare refuse it with one line naming the file
// and PRAGMA quick_check, instead of ranking whatever rows still read.
TEST(Leaderboard, DamagedDatabaseIsRefusedByQuickCheck) {
  Fixture f = make_fixture();
  {
    // Grow the file so that the damage lands in a sample page, then fold the WAL into the file.
    ResultsDb db(f.db);
    const json e10 = {{"name", "evict"}, {"params", {{"budget", 0.3}}}};
    std::vector<json> many;
    for (int i = 0; i < 400; ++i) many.push_back(stream_sample(0.01 * i, 4.0, 3, 100));
    add_stream_run(db, stream_cfg("m3", e10), many);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(f.db.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
  std::string bytes = read_file(f.db);
  const size_t page = 4096;
  ASSERT_GT(bytes.size(), 12 * page);
  for (size_t i = 8 * page; i < 8 * page + 64; ++i) bytes[i] = static_cast<char>(0xA5);
  write_file(f.db, bytes);
  auto lb = test::run_kvbench("leaderboard --db " + f.db);
  EXPECT_EQ(lb.exit_code, 2) << lb.out << lb.err;
  EXPECT_TRUE(lb.out.empty()) << lb.out;
  EXPECT_NE(lb.err.find(f.db + ": fails PRAGMA quick_check"), std::string::npos) << lb.err;
  EXPECT_EQ(std::count(lb.err.begin(), lb.err.end(), '\n'), 1) << lb.err;
  auto cmp = test::run_kvbench("compare --db-a " + f.db + " --db-b " + f.db);
  EXPECT_EQ(cmp.exit_code, 2) << cmp.out << cmp.err;
  EXPECT_NE(cmp.err.find("fails PRAGMA quick_check"), std::string::npos) << cmp.err;
}

TEST(Compare, TwoDatabasesMatchedByConfigHash) {
  // The "same grid at two commits" mode: B's evict(0.5) got worse on every sample; full is unchanged.
  const std::string dir = test::make_temp_dir("cmp2");
  const json full = {{"name", "full"}, {"params", json::object()}};
  const json e50 = {{"name", "evict"}, {"params", {{"budget", 0.5}}}};
  for (int side = 0; side < 2; ++side) {
    ResultsDb db(dir + (side ? "/b.sqlite" : "/a.sqlite"));
    std::vector<json> fs, es;
    for (int i = 0; i < 6; ++i) {
      fs.push_back(stream_sample(0.0, 4.0 + 0.1 * i, 4, 400));
      es.push_back(stream_sample(0.1 * (i + 1) + (side ? 0.05 : 0.0), 4.4 + 0.1 * i, 3, 200));
    }
    add_stream_run(db, stream_cfg("m", full), fs);
    add_stream_run(db, stream_cfg("m", e50), es);
    if (side == 0) add_stream_run(db, stream_cfg("only_a", full), fs);
  }
  auto r = test::run_kvbench("compare --db-a " + dir + "/a.sqlite --db-b " + dir + "/b.sqlite");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 runs compared by config hash (1 with moves, 1 metric regression(s)); 1 done only in A"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("REGRESSION kl_mean +0.0500"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("full · m · d · stream: 6 common samples; nothing moved beyond its CI"), std::string::npos)
      << r.out;
  auto j = test::run_kvbench("compare --json --fail-on-regression --db-a " + dir + "/a.sqlite --db-b " + dir + "/b.sqlite");
  EXPECT_EQ(j.exit_code, 3);
  EXPECT_EQ(json::parse(j.out)["compared"], 2);
}

// ---------------------------------------------------------------- merge

TEST(Merge, CombinesShardDatabasesAndRejectsMissingInputs) {
  const std::string dir = test::make_temp_dir("merge");
  const json full = {{"name", "full"}, {"params", json::object()}};
  const json e50 = {{"name", "evict"}, {"params", {{"budget", 0.5}}}};
  std::vector<json> fs(3, stream_sample(0.0, 4.0, 4, 400));
  std::string e50_hash;
  {
    ResultsDb a(dir + "/a.sqlite");  // evict finished here
    e50_hash = add_stream_run(a, stream_cfg("m", e50), std::vector<json>(3, stream_sample(0.2, 4.4, 3, 200)));
  }
  {
    ResultsDb b(dir + "/b.sqlite");  // full finished, evict interrupted after one sample
    add_stream_run(b, stream_cfg("m", full), fs);
    json cfg = stream_cfg("m", e50);
    RunSpec spec;
    spec.config_json = canonical_json(cfg);
    spec.config_hash = run_config_hash(cfg);
    spec.method = "evict";
    spec.model = "m";
    spec.dataset = "d";
    spec.protocol = "stream";
    spec.grid = "g";
    b.add_sample(b.begin_run(spec).id, 0, "key0", stream_sample(0.2, 4.4, 3, 200).dump());
  }
  auto r = test::run_kvbench("merge --json " + dir + "/out.sqlite " + dir + "/b.sqlite " + dir + "/a.sqlite");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["inputs"][0]["runs_added"], 2);
  EXPECT_EQ(j["inputs"][1]["runs_replaced"], 1);  // the finished run replaces the interrupted one
  EXPECT_EQ(j["runs"], 2);
  EXPECT_EQ(j["runs_done"], 2);
  ResultsDb out(dir + "/out.sqlite");
  auto run = out.find_run_by_hash(e50_hash);
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->status, RunStatus::kDone);
  EXPECT_EQ(out.sample_count(run->id), 3);
  auto text = test::run_kvbench("merge " + dir + "/out.sqlite " + dir + "/a.sqlite");
  EXPECT_NE(text.out.find("0 runs added, 0 replaced, 0 combined, 1 skipped"), std::string::npos) << text.out;
  auto bad = test::run_kvbench("merge " + dir + "/new.sqlite " + dir + "/a.sqlite " + dir + "/nope.sqlite");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("nope.sqlite: no such results database"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::ifstream(dir + "/new.sqlite").good());
}

}  // namespace
}  // namespace kvb
