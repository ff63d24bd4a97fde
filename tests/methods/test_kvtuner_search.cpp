// KVTuner's offline search (methods/kvtuner/kvtuner_search.h): Pareto pruning on hand-made points,
// NSGA-II against exhaustive enumeration on a synthetic problem, determinism under a seed, the
// clustering rule, the exact-trajectory local errors, and a short end-to-end search on stories260K
// whose artifact loads into the `kvtuner` method with the same per-layer bits.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <set>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "methods/kvtuner/kvtuner_search.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using namespace kvtuner;

TEST(KvTunerSearch, ParetoFrontOfHandMadePoints) {
  //                          0         1         2         3         4         5         6
  std::vector<Objectives> p = {{8, 0.1}, {6, 0.2}, {6, 0.5}, {4, 0.2}, {2, 3.0}, {4, 0.2}, {3, 0.9}};
  // 1 is dominated by 3 (fewer bits, same error), 2 by 1 and 3; 3 and 5 are equal: both kept.
  auto f = pareto_front(p);
  EXPECT_EQ(f, (std::vector<size_t>{4, 6, 3, 5, 0}));
  EXPECT_TRUE(pareto_front({}).empty());
  EXPECT_EQ(pareto_front({{1, 1}}), (std::vector<size_t>{0}));
}

TEST(KvTunerSearch, PrunesPairsPerLayerOnBitsAndError) {
  Profile prof;
  prof.pairs = candidate_pairs();  // KV8 K8V4 K8V2 K4V8 KV4 K4V2 K2V8 K2V4 KV2
  prof.at.assign(2, std::vector<PairStats>(9));
  // Layer 0: the paper's usual front {KV8, K8V4, KV4, K4V2, KV2}.
  const double e0[] = {0.001, 0.01, 0.2, 0.05, 0.06, 0.1, 0.5, 0.6, 0.9};
  // Layer 1: values insensitive: K8V2 (5 bits) has less error than KV4 (4 bits) and more than
  // K8V4 (6 bits), so it joins the front.
  const double e1[] = {0.001, 0.002, 0.003, 0.05, 0.06, 0.07, 0.5, 0.6, 0.9};
  for (int j = 0; j < 9; ++j) {
    prof.at[0][j].e_o = e0[j];
    prof.at[1][j].e_o = e1[j];
    prof.at[0][j].kl = e1[j];  // kl as the sensitivity: layer 0 then looks like layer 1
    prof.at[1][j].kl = e1[j];
  }
  auto c = prune_pairs(prof, "eo");
  EXPECT_EQ(c[0], (std::vector<int32_t>{8, 5, 4, 1, 0}));
  EXPECT_EQ(c[1], (std::vector<int32_t>{8, 5, 4, 2, 1, 0}));
  EXPECT_EQ(prune_pairs(prof, "kl")[0], c[1]);
}

TEST(KvTunerSearch, ClustersSplitByCandidateSetThenByErrorVectors) {
  Profile prof;
  prof.pairs = candidate_pairs();
  prof.at.assign(5, std::vector<PairStats>(9));
  const double base[] = {0.001, 0.01, 0.2, 0.05, 0.06, 0.1, 0.5, 0.6, 0.9};
  const double scale[] = {1.0, 1.1, 10.0, 1.05, 9.0};  // layers {0,1,3} alike, {2,4} alike
  for (int l = 0; l < 5; ++l)
    for (int j = 0; j < 9; ++j) prof.at[l][j].e_o = std::min(0.99, base[j] * scale[l]);
  std::vector<std::vector<int32_t>> cand(5, std::vector<int32_t>{8, 5, 4, 1, 0});
  auto g = cluster_layers(prof, cand, "eo", 0.15, 0);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].layers, (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(g[1].layers, (std::vector<int64_t>{2, 4}));
  // Threshold 0: every layer alone; a cap of 1 group merges everything of one split.
  EXPECT_EQ(cluster_layers(prof, cand, "eo", 0.0, 0).size(), 5u);
  EXPECT_EQ(cluster_layers(prof, cand, "eo", 0.0, 1).size(), 1u);
  // Different candidate sets never merge.
  cand[4] = {8, 5, 4, 2, 1, 0};
  g = cluster_layers(prof, cand, "eo", 100.0, 1);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].layers, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(g[1].layers, (std::vector<int64_t>{4}));
  EXPECT_EQ(g[1].candidates, cand[4]);
}

// A synthetic problem shaped like the real one: 5 genes of 5 choices (bits 2..8), an error that
// falls with bits, differs per gene and has an interaction term.
struct Synthetic {
  std::vector<int32_t> choices = {5, 5, 5, 5, 5};
  int64_t calls = 0;
  Objectives operator()(const Genome& g) {
    ++calls;
    static const double bits[] = {2, 3, 4, 6, 8};
    static const double w[] = {1.0, 3.0, 0.5, 2.0, 1.5};
    double b = 0, e = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      b += bits[g[i]];
      e += w[i] * std::pow(2.0, -bits[g[i]]);
    }
    e *= 1.0 + 0.3 * std::pow(2.0, -bits[g[0]] - bits[g[1]] + 4.0);
    return {b / 5.0, e};
  }
};

std::set<std::pair<double, double>> front_set(const SearchResult& r) {
  std::set<std::pair<double, double>> s;
  for (size_t i : r.front) s.insert({r.evaluated[i].f[0], r.evaluated[i].f[1]});
  return s;
}

TEST(KvTunerSearch, Nsga2FindsTheExhaustiveFront) {
  Synthetic a, b;
  ObjectiveFn fa = [&](const Genome& g) { return a(g); };
  ObjectiveFn fb = [&](const Genome& g) { return b(g); };
  SearchResult ex = exhaustive_search(a.choices, fa);
  EXPECT_EQ(ex.space, 3125);
  EXPECT_EQ(ex.evaluated.size(), 3125u);
  Nsga2Options o;
  o.population = 32;
  o.max_evaluations = 1200;
  o.seed = 7;
  SearchResult ns = nsga2_search(b.choices, fb, nullptr, o);
  EXPECT_LE(static_cast<int64_t>(ns.evaluated.size()), 1200);
  EXPECT_EQ(b.calls, static_cast<int64_t>(ns.evaluated.size()));  // no genome evaluated twice
  EXPECT_EQ(front_set(ns), front_set(ex));

  // With a constraint (bits <= 4): infeasible genomes are never evaluated.
  Synthetic c, d;
  ViolationFn viol = [](const Genome& g) {
    static const double bits[] = {2, 3, 4, 6, 8};
    double s = 0;
    for (int32_t x : g) s += bits[x];
    return s / 5.0 > 4.0 + 1e-9 ? s / 5.0 - 4.0 : 0.0;
  };
  SearchResult exc = exhaustive_search(c.choices, [&](const Genome& g) { return c(g); }, viol);
  EXPECT_EQ(static_cast<int64_t>(exc.evaluated.size()) + exc.infeasible_skipped, 3125);
  o.max_evaluations = 500;
  SearchResult nsc = nsga2_search(d.choices, [&](const Genome& g) { return d(g); }, viol, o);
  for (const auto& e : nsc.evaluated) EXPECT_LE(e.f[0], 4.0 + 1e-9);
  EXPECT_EQ(front_set(nsc), front_set(exc));
}

TEST(KvTunerSearch, Nsga2IsDeterministicUnderASeed) {
  auto run = [](uint64_t seed) {
    Synthetic s;
    Nsga2Options o;
    o.population = 16;
    o.max_evaluations = 200;
    o.seed = seed;
    return nsga2_search(s.choices, [&](const Genome& g) { return s(g); }, nullptr, o);
  };
  SearchResult a = run(3), b = run(3), c = run(4);
  ASSERT_EQ(a.evaluated.size(), b.evaluated.size());
  for (size_t i = 0; i < a.evaluated.size(); ++i) EXPECT_EQ(a.evaluated[i].genome, b.evaluated[i].genome);
  EXPECT_EQ(a.front, b.front);
  EXPECT_EQ(a.generations, b.generations);
  bool differs = a.evaluated.size() != c.evaluated.size();
  for (size_t i = 0; !differs && i < a.evaluated.size(); ++i)
    differs = a.evaluated[i].genome != c.evaluated[i].genome;
  EXPECT_TRUE(differs);
}

TEST(KvTunerSearch, LocalErrorsFollowTheExactTrajectory) {
  auto data = calibration_windows(*test::stories260k(), "tinystories-valid-sample", test::data_dir(), 48, 1, 2);
  int64_t probed = 0;
  auto kv8 = local_errors(test::stories260k(), data.windows, {8, 8}, "kivi", 1, 1, &probed);
  auto k2 = local_errors(test::stories260k(), data.windows, {2, 8}, "kivi", 1, 1, &probed);
  auto v2 = local_errors(test::stories260k(), data.windows, {8, 2}, "kivi", 1, 1, &probed);
  EXPECT_EQ(probed, 46);  // decode positions 1 .. 46 of a 48-token window
  for (size_t l = 0; l < 5; ++l) {
    // Every layer sees the full-precision trajectory, so an untouched tensor has the same error
    // whatever the other tensor's bits.
    EXPECT_EQ(k2[l].e_v, kv8[l].e_v) << l;
    EXPECT_EQ(v2[l].e_k, kv8[l].e_k) << l;
    EXPECT_GT(k2[l].e_k, 5 * kv8[l].e_k) << l;
    EXPECT_GT(v2[l].e_v, 5 * kv8[l].e_v) << l;
    EXPECT_GT(k2[l].tv, kv8[l].tv) << l;
    EXPECT_LT(kv8[l].e_o, 0.05) << l;
  }
}

// One tiny end-to-end search, shared by the tests below.
struct Tiny {
  nlohmann::json art;
  std::string dir, path;
  std::vector<std::string> files;
  double seconds = 0;
};
const Tiny& tiny() {
  static Tiny t = [] {
    Tiny t;
    const auto t0 = std::chrono::steady_clock::now();
    auto data = calibration_windows(*test::stories260k(), "tinystories-valid-sample", test::data_dir(), 40, 1, 30);
    SearchOptions o;
    o.budgets = {4, 3};
    o.search = "nsga2";
    o.trials = 12;
    o.population = 6;
    o.probe_every = 4;
    o.seed = 1;
    t.art = run_search(test::stories260k(), data, o);
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.dir = test::make_temp_dir("kvtuner_search");
    t.path = t.dir + "/art.json";
    t.files = write_artifact(t.art, t.path);
    return t;
  }();
  return t;
}

TEST(KvTunerSearch, EndToEndOnStories260K) {
  const Tiny& t = tiny();
  EXPECT_LT(t.seconds, 30.0);
  const auto& a = t.art;
  EXPECT_EQ(a["format"], "kvbench.kvtuner-search/1");
  ASSERT_EQ(a["profile"]["layers"].size(), 5u);
  for (const auto& row : a["profile"]["layers"]) {
    ASSERT_EQ(row["e_o"].size(), 9u);
    EXPECT_GT(row["e_o"][8].get<double>(), row["e_o"][0].get<double>());  // KV2 worse than KV8
    EXPECT_GT(row["kl"][8].get<double>(), row["kl"][0].get<double>());
    EXPECT_NE(std::find(row["pareto_pairs"].begin(), row["pareto_pairs"].end(), "KV2"),
              row["pareto_pairs"].end());  // the only 2-bit pair is always on the front
  }
  std::set<int64_t> seen;
  for (const auto& g : a["groups"])
    for (int64_t l : g["layers"]) EXPECT_TRUE(seen.insert(l).second);
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(a["search"]["method"], "nsga2");
  EXPECT_LE(a["search"]["evaluated"].get<int64_t>(), 12);
  // Pareto set: bits ascending, KL descending, all within the 4-bit search constraint.
  double prev_bits = 0, prev_kl = 1e300;
  for (const auto& p : a["pareto"]) {
    EXPECT_GE(p["equivalent_bits"].get<double>(), prev_bits);
    EXPECT_LE(p["equivalent_bits"].get<double>(), 4.0 + 1e-9);
    EXPECT_LT(p["kl_mean"].get<double>(), prev_kl);
    prev_bits = p["equivalent_bits"];
    prev_kl = p["kl_mean"];
  }
  ASSERT_EQ(a["selected"].size(), 2u);
  EXPECT_LE(a["selected"][0]["equivalent_bits"].get<double>(), 4.0 + 1e-9);
  EXPECT_LE(a["selected"][1]["equivalent_bits"].get<double>(), 3.0 + 1e-9);
  EXPECT_LE(a["selected"][0]["kl_mean"].get<double>(), a["selected"][1]["kl_mean"].get<double>());
  EXPECT_EQ(a["layers"], a["selected"][0]["layers"]);
  EXPECT_EQ(a["model"]["weights_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(a["data"]["skip_windows"], 30);
  EXPECT_EQ(a["uniform"].size(), 9u);
}

TEST(KvTunerSearch, ArtifactLoadsIntoTheKvtunerMethod) {
  const Tiny& t = tiny();
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device, test::stories260k()->dtype};
  ASSERT_EQ(t.files.size(), 2u);
  struct Case {
    std::string file;
    nlohmann::json layers;
  };
  for (const Case& c : {Case{t.path, t.art["selected"][0]["layers"]},
                        Case{t.files[0], t.art["selected"][0]["layers"]},
                        Case{t.files[1], t.art["selected"][1]["layers"]}}) {
    Engine e(test::stories260k(), MethodRegistry::instance().create("kvtuner", ctx, {{"config", c.file}}));
    const int64_t s = e.new_sequence();
    e.prefill({s}, {{1, 30, 40, 50, 60}});
    auto ctr = e.kv().counters();
    double eq = 0;
    for (int l = 0; l < 5; ++l) {
      const auto& p = c.layers[std::to_string(l)];
      EXPECT_EQ(ctr["layer" + std::to_string(l) + "_k_bits"], p["nbits_key"].get<double>()) << c.file;
      EXPECT_EQ(ctr["layer" + std::to_string(l) + "_v_bits"], p["nbits_value"].get<double>()) << c.file;
      eq += 0.5 * (p["nbits_key"].get<double>() + p["nbits_value"].get<double>());
    }
    EXPECT_DOUBLE_EQ(ctr["equivalent_bits"], eq / 5);
  }
}

TEST(KvTunerSearch, ABudgetBelowEverySearchedConfigGetsTheCheapestConfig) {
  auto data = calibration_windows(*test::stories260k(), "tinystories-valid-sample", test::data_dir(), 40, 1, 31);
  SearchOptions o;
  o.budgets = {4, 2};
  o.search = "nsga2";
  o.trials = 1;
  o.population = 4;
  o.probe_every = 8;
  auto a = run_search(test::stories260k(), data, o);
  ASSERT_EQ(a["selected"].size(), 2u);
  EXPECT_EQ(a["selected"][1]["pairs"], "KV2,KV2,KV2,KV2,KV2");
  EXPECT_EQ(a["search"]["evaluated"], 2);
}

TEST(KvTunerSearch, CliWritesTheArtifact) {
  const std::string dir = test::make_temp_dir("kvtuner_cli");
  auto r = test::run_kvbench("kvtuner-search -q --models-dir " + test::models_dir() +
                             " --data-dir " + test::data_dir() +
                             " --windows 1 --window-tokens 48 --skip-windows 5 --search auto"
                             " --probe-every 8 --budgets 3.5 --out " +
                             dir + "/a.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["selected"].size(), 1u);
  EXPECT_EQ(j["search"]["method"], "exhaustive");  // auto: 5 layers' pruned space is small
  EXPECT_TRUE(file_exists(dir + "/a.json"));
  EXPECT_TRUE(file_exists(dir + "/a.b3.5.json"));
  auto bad = test::run_kvbench("kvtuner-search --budgets 4,x --out " + dir + "/b.json");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("'x' is not a number"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kvb
