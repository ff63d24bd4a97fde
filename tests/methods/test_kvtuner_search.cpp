// KVTuner's offline search (methods/kvtuner/kvtuner_search.h): Pareto pruning on hand-made points,
// NSGA-II against exhaustive enumeration on a synthetic problem, determinism under a seed, the
// clustering rule, the exact-trajectory local errors, and a short end-to-end search on stories260K
// whose artifact loads into the `kvtuner` method with the same per-layer bits; on models with
// sliding-window layers, the search over the layers the method compresses.

#include <ATen/ATen.h>
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
  std::vector<Objectives> p = {{8, 0.1}, {6, 0.2}, {6, 0.5}, {4, 0.2},
                               {2, 3.0}, {4, 0.2}, {3, 0.9}};
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
  SearchResult exc = exhaustive_search(
      c.choices, [&](const Genome& g) { return c(g); }, viol);
  EXPECT_EQ(static_cast<int64_t>(exc.evaluated.size()) + exc.infeasible_skipped, 3125);
  o.max_evaluations = 500;
  SearchResult nsc = nsga2_search(
      d.choices, [&](const Genome& g) { return d(g); }, viol, o);
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
    return nsga2_search(
        s.choices, [&](const Genome& g) { return s(g); }, nullptr, o);
  };
  SearchResult a = run(3), b = run(3), c = run(4);
  ASSERT_EQ(a.evaluated.size(), b.evaluated.size());
  for (size_t i = 0; i < a.evaluated.size(); ++i)
    EXPECT_EQ(a.evaluated[i].genome, b.evaluated[i].genome);
  EXPECT_EQ(a.front, b.front);
  EXPECT_EQ(a.generations, b.generations);
  bool differs = a.evaluated.size() != c.evaluated.size();
  for (size_t i = 0; !differs && i < a.evaluated.size(); ++i)
    differs = a.evaluated[i].genome != c.evaluated[i].genome;
  EXPECT_TRUE(differs);
}

TEST(KvTunerSearch, LocalErrorsFollowTheExactTrajectory) {
  auto data = calibration_windows(*test::stories260k(), "tinystories-valid-sample",
                                  test::data_dir(), 48, 1, 2);
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
    auto data = calibration_windows(*test::stories260k(), "tinystories-valid-sample",
                                    test::data_dir(), 40, 1, 30);
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
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device,
                   test::stories260k()->dtype};
  ASSERT_EQ(t.files.size(), 2u);
  struct Case {
    std::string file;
    nlohmann::json layers;
  };
  for (const Case& c : {Case{t.path, t.art["selected"][0]["layers"]},
                        Case{t.files[0], t.art["selected"][0]["layers"]},
                        Case{t.files[1], t.art["selected"][1]["layers"]}}) {
    Engine e(test::stories260k(),
             MethodRegistry::instance().create("kvtuner", ctx, {{"config", c.file}}));
    const int64_t s = e.new_sequence();
    e.prefill({s}, {{1, 30, 40, 50, 60}});
    auto ctr = e.kv().counters();
    double eq = 0;
    for (int l = 0; l < 5; ++l) {
      const auto& p = c.layers[std::to_string(l)];
      EXPECT_EQ(ctr["layer" + std::to_string(l) + "_k_bits"], p["nbits_key"].get<double>())
          << c.file;
      EXPECT_EQ(ctr["layer" + std::to_string(l) + "_v_bits"], p["nbits_value"].get<double>())
          << c.file;
      eq += 0.5 * (p["nbits_key"].get<double>() + p["nbits_value"].get<double>());
    }
    EXPECT_DOUBLE_EQ(ctr["equivalent_bits"], eq / 5);
  }
}

TEST(KvTunerSearch, ABudgetBelowEverySearchedConfigGetsTheCheapestConfig) {
  auto data = calibration_windows(*test::stories260k(), "tinystories-valid-sample",
                                  test::data_dir(), 40, 1, 31);
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

// ---- models with sliding-window layers (the tiny random transformers fixtures, fp32)

std::shared_ptr<Model> window_fixture(const std::string& arch) {
  LoadOptions o;
  o.dtype = "fp32";
  return load_model(test::fixtures_dir() + "/hf/" + arch, o);
}

// Calibration windows for a fixture without a tokenizer: BOS, then a fixed spread of ids.
CalibrationData fixture_windows(int64_t n_windows, int64_t tokens, int64_t bos, int64_t vocab) {
  CalibrationData d;
  for (int64_t w = 0; w < n_windows; ++w) {
    std::vector<int64_t> t = {bos};
    for (int64_t i = 1; i < tokens; ++i) t.push_back(3 + (37 * i + 11 * w + i * i) % (vocab - 3));
    d.windows.push_back(t);
  }
  d.info = {{"corpus", "fixed ids"}};
  return d;
}

// Mean KL(full || kvtuner at `pairs`) over the calibration positions, computed here through the
// method registry and the engine as any run would (prefill BOS, decode the rest).
double kl_of_pairs(const std::shared_ptr<Model>& m, const CalibrationData& data,
                   const std::string& pairs) {
  CacheContext ctx{m->config, m->device, m->dtype};
  double sum = 0;
  int64_t n = 0;
  for (const auto& w : data.windows) {
    Engine full(m, MethodRegistry::instance().create("full", ctx, nlohmann::json::object()));
    Engine q(m, MethodRegistry::instance().create("kvtuner", ctx,
                                                  {{"pairs", pairs}, {"mode", "per_token"}}));
    const int64_t a = full.new_sequence(), b = q.new_sequence();
    auto step = [&](const at::Tensor& lf, const at::Tensor& lq) {
      const at::Tensor p = at::log_softmax(lf.to(at::kFloat), -1).to(at::kDouble);
      const at::Tensor r = at::log_softmax(lq.to(at::kFloat), -1).to(at::kDouble);
      sum += std::max(0.0, (p.exp() * (p - r)).sum().item<double>());
      ++n;
    };
    at::Tensor lf, lq;
    full.prefill({a}, {{w[0]}}, [&](const at::Tensor& l, int64_t) { lf = l.clone(); });
    q.prefill({b}, {{w[0]}}, [&](const at::Tensor& l, int64_t) { lq = l.clone(); });
    step(lf, lq);
    for (size_t i = 1; i + 1 < w.size(); ++i) step(full.decode({a}, {w[i]}), q.decode({b}, {w[i]}));
  }
  return sum / static_cast<double>(n);
}

// Gemma 3 (window layers 0 and 2 of window 6, global layers 1 and 3), windows of 24 tokens: the
// profile, the groups and every config cover the global layers only; the window layers get no
// pair; a global layer's end-to-end KL in the profile is the KL of a run that quantizes that layer;
// the pick loads into the kvtuner method and runs.
TEST(KvTunerSearch, SearchesOnlyTheGlobalLayersOfAModelWithWindowLayers) {
  auto m = window_fixture("gemma3");
  ASSERT_EQ(m->config.layer_windows, (std::vector<int64_t>{6, 0, 6, 0}));
  EXPECT_EQ(searched_layers(m->config), (std::vector<int64_t>{1, 3}));
  const CalibrationData data = fixture_windows(2, 24, 2, m->config.vocab_size);
  SearchOptions o;
  o.mode = "per_token";
  o.budgets = {4, 3};
  const nlohmann::json a = run_search(m, data, o);
  EXPECT_EQ(a["searched_layers"], nlohmann::json::array({1, 3}));
  EXPECT_EQ(a["window_layers"], nlohmann::json::array({0, 2}));
  EXPECT_EQ(a["model"]["n_layers"], 4);
  const auto& rows = a["profile"]["layers"];
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["model_layer"], 1);
  EXPECT_EQ(rows[1]["model_layer"], 3);
  EXPECT_EQ(a["profile"]["probed_positions_per_layer"], 2 * 22);
  for (const auto& row : rows) {
    EXPECT_GT(row["e_k"][8].get<double>(), row["e_k"][0].get<double>());  // KV2 worse than KV8
    EXPECT_GT(row["e_k"][0].get<double>(), 0.0);
    EXPECT_GT(row["kl"][8].get<double>(), row["kl"][0].get<double>());
  }
  // The profile's KL of a global layer at KV2 (every other global layer at KV8) is that run's.
  for (size_t i = 0; i < 2; ++i) {
    const std::string pairs = i == 0 ? "KV2,KV8" : "KV8,KV2";
    const double want = kl_of_pairs(m, data, pairs);
    EXPECT_NEAR(rows[i]["kl"][8].get<double>(), want, 1e-6 * want + 1e-12) << pairs;
  }
  std::set<int64_t> grouped;
  for (const auto& g : a["groups"])
    for (int64_t l : g["layers"]) grouped.insert(l);
  EXPECT_EQ(grouped, (std::set<int64_t>{0, 1}));  // the two searched layers
  ASSERT_EQ(a["layers"].size(), 2u);              // window layers get no pair
  for (const auto& s : a["selected"]) {
    const std::string p = s["pairs"];
    EXPECT_EQ(std::count(p.begin(), p.end(), ','), 1) << p;
  }
  const std::string dir = test::make_temp_dir("kvtuner_windows");
  write_artifact(a, dir + "/art.json");
  CacheContext ctx{m->config, m->device, m->dtype};
  Engine e(m, MethodRegistry::instance().create(
                  "kvtuner", ctx, {{"config", dir + "/art.json"}, {"mode", "per_token"}}));
  const int64_t s = e.new_sequence();
  e.prefill({s}, {data.windows[0]});
  EXPECT_EQ(e.kv().counters().at("window_layers"), 2);
}

// Mistral with sliding_window 6 on every layer: every layer is searched, within the window (6
// tokens: plain causal attention there); a calibration window past it is refused by name.
TEST(KvTunerSearch, ProfilesAnAllWindowModelWithinItsWindowOnly) {
  auto m = window_fixture("mistral_sw");
  EXPECT_EQ(searched_layers(m->config), (std::vector<int64_t>{0, 1}));
  int64_t probed = 0;
  const auto e = local_errors(m, fixture_windows(2, 6, 1, m->config.vocab_size).windows, {2, 2},
                              "per_token", 1, 1, &probed);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(probed, 2 * 4);
  for (const auto& s : e) EXPECT_GT(s.e_k, 0.0);
  try {
    local_errors(m, fixture_windows(1, 7, 1, m->config.vocab_size).windows, {2, 2}, "per_token", 1,
                 1, &probed);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("sliding window of 6 tokens on every layer"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--window-tokens 6 or fewer"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace kvb
