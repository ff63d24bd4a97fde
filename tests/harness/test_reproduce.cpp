// kvbench reproduce: claim predicates evaluated on a hand-made results store (each verdict reached,
// and each one flipped by changing the data, so no check is one that cannot fail), the suite
// validation errors (named, before anything is written), and one real claim end to end on
// stories260K through the CLI (its cells run, a second call skips them).

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/common/error.h"
#include "harness/report/reproduce.h"
#include "harness/store/config_hash.h"
#include "tests/harness/grid_test_util.h"

namespace kvb {
namespace {

using gridtest::read_file;
using gridtest::write_file;
using json = nlohmann::json;
namespace fs = std::filesystem;

json qa_config(const json& method) {
  return {{"model", "stories260K"},
          {"threads", 1},
          {"method", method},
          {"protocol",
           {{"name", "qa"},
            {"dataset", "tinystories-valid-sample"},
            {"length", 256},
            {"num_samples", 1}}}};
}

json serve_config(const std::string& allocator) {
  return {{"model", "stories260K"},
          {"threads", 1},
          {"method", "full"},
          {"protocol", {{"name", "serve"}, {"max_requests", 100}, {"allocator", allocator}}}};
}

json claim(const std::string& id, const json& predicate, const json& a, const json& b = nullptr) {
  json c = {{"id", id},
            {"statement", "a statement"},
            {"paper_value", "1"},
            {"source", "Table 1"},
            {"predicate", predicate},
            {"a", {{"config", a}}}};
  if (!b.is_null()) c["b"] = {{"config", b}};
  return c;
}

json pred(const std::string& metric, const std::string& kind, const std::string& dir,
          double threshold) {
  return {{"metric", metric}, {"kind", kind}, {"direction", dir}, {"threshold", threshold}};
}

struct Scratch {
  std::string dir = test::make_temp_dir("reproduce");
  std::string grids = dir + "/grids";
  Scratch() { fs::create_directories(grids); }

  std::string write_suite(const std::string& paper, const json& claims) {
    const std::string path = dir + "/" + paper + ".json";
    write_file(path, json({{"paper", paper},
                           {"title", "A paper"},
                           {"reference", "arXiv 0000.00000"},
                           {"setting", "8B models on a GPU"},
                           {"claims", claims}})
                         .dump(2));
    return path;
  }
  ReproSuite load(const std::string& path) {
    ReproLoadOptions o;
    o.grids_dir = grids;
    o.models_dir = test::models_dir();
    o.check_inputs = false;
    return load_reproduce_suite(path, o);
  }
};

// A finished qa run for `side` whose samples score `scores` (one item each).
void add_qa_run(ResultsDb& db, const ClaimSide& side, const std::vector<double>& scores) {
  RunSpec spec;
  spec.config_json = canonical_json(side.cell.resolved);
  spec.config_hash = side.cell.config_hash;
  spec.method = side.cell.resolved["method"]["name"];
  spec.model = "stories260K";
  spec.dataset = "d";
  spec.protocol = "qa";
  const RunInfo info = db.begin_run(spec);
  for (size_t i = 0; i < scores.size(); ++i)
    db.add_sample(info.id, static_cast<int64_t>(i), "k" + std::to_string(i),
                  json({{"items", {{{"score", scores[i]}, {"full_score", 1.0}}}}}).dump());
  db.finish_run(info.id, {}, 1.0);
}

void add_serve_run(ResultsDb& db, const ClaimSide& side, double waste) {
  RunSpec spec;
  spec.config_json = canonical_json(side.cell.resolved);
  spec.config_hash = side.cell.config_hash;
  spec.method = "full";
  spec.model = "stories260K";
  spec.dataset = "trace";
  spec.protocol = "serve";
  const RunInfo info = db.begin_run(spec);
  db.finish_run(info.id, {Metric("serve_allocator_waste", waste, "fraction", Direction::kLower)},
                1.0);
}

std::vector<double> ones(size_t n) { return std::vector<double>(n, 1.0); }
std::vector<double> alternating(size_t n) {  // 1, 0, 1, 0, ...: mean 0.5
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (i % 2 == 0) ? 1.0 : 0.0;
  return v;
}

const json kSnap = {{"name", "snapkv"}, {"params", {{"budget", 0.5}}}};

TEST(Reproduce, DifferenceVerdictsFollowTheIntervalAndEachCanFail) {
  Scratch s;
  const ReproSuite suite = s.load(s.write_suite(
      "toy", json::array({claim("gain", pred("accuracy", "difference", "greater", 0.0),
                                qa_config(kSnap), qa_config("full")),
                          claim("big-gain", pred("accuracy", "difference", "greater", 0.9),
                                qa_config(kSnap), qa_config("full")),
                          claim("half-gain", pred("accuracy", "difference", "greater", 0.5),
                                qa_config(kSnap), qa_config("full"))})));
  ResultsDb db(s.dir + "/db.sqlite");
  // a: all 40 samples right; b: every other one. a - b = 0.5, its 95% interval about [0.35, 0.65].
  add_qa_run(db, suite.claims[0].sides[0], ones(40));
  add_qa_run(db, suite.claims[0].sides[1], alternating(40));
  const ClaimResult gain = evaluate_claim(suite.claims[0], db, "cpu");
  EXPECT_EQ(gain.verdict, Verdict::kHolds) << gain.why;
  EXPECT_DOUBLE_EQ(gain.estimate, 0.5);
  EXPECT_EQ(gain.n, 40u);
  EXPECT_GT(gain.lo, 0.25);
  EXPECT_LT(gain.hi, 0.75);
  EXPECT_DOUBLE_EQ(gain.a_value, 1.0);
  EXPECT_DOUBLE_EQ(gain.b_value, 0.5);
  const ClaimResult big = evaluate_claim(suite.claims[1], db, "cpu");
  EXPECT_EQ(big.verdict, Verdict::kDoesNotHold) << big.why;
  const ClaimResult half = evaluate_claim(suite.claims[2], db, "cpu");
  EXPECT_EQ(half.verdict, Verdict::kInconclusive) << half.why;
  EXPECT_NE(half.why.find("spans the threshold"), std::string::npos) << half.why;

  // The same "gain" claim on data where a is no better than b: it does not hold.
  Scratch s2;
  const ReproSuite suite2 = s2.load(s2.write_suite(
      "toy", json::array({claim("gain", pred("accuracy", "difference", "greater", 0.0),
                                qa_config(kSnap), qa_config("full"))})));
  ResultsDb db2(s2.dir + "/db.sqlite");
  add_qa_run(db2, suite2.claims[0].sides[0], alternating(40));
  add_qa_run(db2, suite2.claims[0].sides[1], ones(40));
  EXPECT_EQ(evaluate_claim(suite2.claims[0], db2, "cpu").verdict, Verdict::kDoesNotHold);
}

TEST(Reproduce, RatioAndValuePredicatesAndTheirDirections) {
  Scratch s;
  const ReproSuite suite = s.load(s.write_suite(
      "toy",
      json::array({claim("ratio-up", pred("accuracy", "ratio", "greater", 1.5), qa_config(kSnap),
                         qa_config("full")),
                   claim("ratio-down", pred("accuracy", "ratio", "less", 1.5), qa_config(kSnap),
                         qa_config("full")),
                   claim("value-high", pred("accuracy", "value", "greater", 0.9), qa_config(kSnap)),
                   claim("value-low", pred("accuracy", "value", "less", 0.9), qa_config(kSnap))})));
  ResultsDb db(s.dir + "/db.sqlite");
  add_qa_run(db, suite.claims[0].sides[0], ones(40));
  add_qa_run(db, suite.claims[0].sides[1], alternating(40));
  const ClaimResult up = evaluate_claim(suite.claims[0], db, "cpu");
  EXPECT_DOUBLE_EQ(up.estimate, 2.0);  // 1 / 0.5
  EXPECT_EQ(up.verdict, Verdict::kHolds) << up.why << " [" << up.lo << ", " << up.hi << "]";
  EXPECT_EQ(evaluate_claim(suite.claims[1], db, "cpu").verdict, Verdict::kDoesNotHold);
  EXPECT_EQ(evaluate_claim(suite.claims[2], db, "cpu").verdict, Verdict::kHolds);
  EXPECT_EQ(evaluate_claim(suite.claims[3], db, "cpu").verdict, Verdict::kDoesNotHold);
}

// A finished qa run whose sample i records the method counter `name` = values[i] (no counter when
// the value is NaN).
void add_counter_run(ResultsDb& db, const ClaimSide& side, const std::string& name,
                     const std::vector<double>& values) {
  RunSpec spec;
  spec.config_json = canonical_json(side.cell.resolved);
  spec.config_hash = side.cell.config_hash;
  spec.method = side.cell.resolved["method"]["name"];
  spec.model = "stories260K";
  spec.dataset = "d";
  spec.protocol = "qa";
  const RunInfo info = db.begin_run(spec);
  for (size_t i = 0; i < values.size(); ++i) {
    json out = {{"items", {{{"score", 1.0}, {"full_score", 1.0}}}}, {"counters", json::object()}};
    if (!std::isnan(values[i])) out["counters"][name] = values[i];
    db.add_sample(info.id, static_cast<int64_t>(i), "k" + std::to_string(i), out.dump());
  }
  db.finish_run(info.id, {}, 1.0);
}

TEST(Reproduce, CounterMetricsArePerSampleMeansAndEachVerdictCanFail) {
  Scratch s;
  const ReproSuite suite = s.load(s.write_suite(
      "toy",
      json::array({claim("recall-high", pred("counter:mass_recall", "value", "greater", 0.75),
                         qa_config(kSnap)),
                   claim("recall-higher", pred("counter:mass_recall", "value", "greater", 0.9),
                         qa_config(kSnap)),
                   claim("no-such-counter", pred("counter:other", "value", "less", 1.0),
                         qa_config(kSnap))})));
  ResultsDb db(s.dir + "/db.sqlite");
  // a's recall alternates 0.7 / 0.9 over 40 samples: mean 0.8, interval about [0.77, 0.83].
  std::vector<double> recall(40);
  for (size_t i = 0; i < recall.size(); ++i) recall[i] = i % 2 == 0 ? 0.7 : 0.9;
  add_counter_run(db, suite.claims[0].sides[0], "mass_recall", recall);
  const ClaimResult high = evaluate_claim(suite.claims[0], db, "cpu");
  EXPECT_EQ(high.verdict, Verdict::kHolds) << high.why;
  EXPECT_NEAR(high.estimate, 0.8, 1e-12);
  EXPECT_EQ(high.n, 40u);
  EXPECT_GT(high.lo, 0.75);
  EXPECT_LT(high.hi, 0.85);
  const ClaimResult higher = evaluate_claim(suite.claims[1], db, "cpu");
  EXPECT_EQ(higher.verdict, Verdict::kDoesNotHold) << higher.why;
  const ClaimResult none = evaluate_claim(suite.claims[2], db, "cpu");
  EXPECT_EQ(none.verdict, Verdict::kInconclusive);
  EXPECT_NE(none.why.find("no sample records the counter"), std::string::npos) << none.why;

  // Paired ratio of a counter: a streams 25 bytes a step against b's 100 (one sample of a lacks
  // the counter, so 39 pair up).
  std::vector<double> a(40, 25.0), b(40, 100.0);
  a[3] = NAN;
  a[10] = 35.0;  // some spread so that the interval is not a point
  const ReproSuite traffic = s.load(s.write_suite(
      "toy2",
      json::array({claim("traffic-cut", pred("counter:bytes_per_step", "ratio", "less", 0.3),
                         qa_config({{"name", "snapkv"}, {"params", {{"budget", 0.25}}}}),
                         qa_config("full")),
                   claim("traffic-cut-more", pred("counter:bytes_per_step", "ratio", "less", 0.2),
                         qa_config({{"name", "snapkv"}, {"params", {{"budget", 0.25}}}}),
                         qa_config("full"))})));
  add_counter_run(db, traffic.claims[0].sides[0], "bytes_per_step", a);
  add_counter_run(db, traffic.claims[0].sides[1], "bytes_per_step", b);
  const ClaimResult cut = evaluate_claim(traffic.claims[0], db, "cpu");
  EXPECT_EQ(cut.verdict, Verdict::kHolds) << cut.why;
  EXPECT_EQ(cut.n, 39u);
  EXPECT_NEAR(cut.estimate, (38 * 25.0 + 35.0) / (39 * 100.0), 1e-12);
  EXPECT_NEAR(cut.a_value, (38 * 25.0 + 35.0) / 39, 1e-9);
  EXPECT_NEAR(cut.b_value, 100.0, 1e-12);
  EXPECT_EQ(evaluate_claim(traffic.claims[1], db, "cpu").verdict, Verdict::kDoesNotHold);

  // A denominator that is 0 in every sample: no ratio is claimed.
  const ReproSuite zero = s.load(s.write_suite(
      "toy3",
      json::array({claim("zero", pred("counter:bytes_per_step", "ratio", "less", 0.3),
                         qa_config({{"name", "snapkv"}, {"params", {{"budget", 0.75}}}}),
                         qa_config({{"name", "snapkv"}, {"params", {{"budget", 0.6}}}}))})));
  const std::vector<double> bz(40, 0.0);
  add_counter_run(db, zero.claims[0].sides[0], "bytes_per_step", std::vector<double>(40, 25.0));
  add_counter_run(db, zero.claims[0].sides[1], "bytes_per_step", bz);
  const ClaimResult z = evaluate_claim(zero.claims[0], db, "cpu");
  EXPECT_EQ(z.verdict, Verdict::kInconclusive);
  EXPECT_NE(z.why.find("denominator"), std::string::npos) << z.why;

  // A counter every sample records alike (a per-run quantity such as a calibration error) is
  // compared as it is, with no interval claimed, and still fails on the other side.
  const json snap9 = {{"name", "snapkv"}, {"params", {{"budget", 0.9}}}};
  const ReproSuite per_run = s.load(s.write_suite(
      "toy4", json::array({claim("below", pred("counter:rel_mse_ratio", "value", "less", 1.0),
                                 qa_config(snap9)),
                           claim("below-half", pred("counter:rel_mse_ratio", "value", "less", 0.5),
                                 qa_config(snap9))})));
  add_counter_run(db, per_run.claims[0].sides[0], "rel_mse_ratio", std::vector<double>(12, 0.92));
  const ClaimResult below = evaluate_claim(per_run.claims[0], db, "cpu");
  EXPECT_EQ(below.verdict, Verdict::kHolds) << below.why;
  EXPECT_TRUE(below.exact);
  EXPECT_DOUBLE_EQ(below.estimate, 0.92);
  EXPECT_NE(below.why.find("per-run quantity"), std::string::npos) << below.why;
  EXPECT_EQ(evaluate_claim(per_run.claims[1], db, "cpu").verdict, Verdict::kDoesNotHold);
}

TEST(Reproduce, TooFewSamplesMissingRunsAndGpuCellsAreNeverVerdicts) {
  Scratch s;
  json few = claim("few", pred("accuracy", "difference", "greater", 0.0), qa_config(kSnap),
                   qa_config("full"));
  json gpu = few;
  gpu["id"] = "gpu";
  gpu["scale"] = "gpu";
  json absent = claim("absent", pred("accuracy", "value", "greater", 0.0),
                      qa_config({{"name", "snapkv"}, {"params", {{"budget", 0.25}}}}));
  const ReproSuite suite = s.load(s.write_suite("toy", json::array({few, gpu, absent})));
  ResultsDb db(s.dir + "/db.sqlite");
  // 5 pairs, all a right and b wrong: a clear difference, but fewer than the default minimum of 10.
  add_qa_run(db, suite.claims[0].sides[0], ones(5));
  add_qa_run(db, suite.claims[0].sides[1], std::vector<double>(5, 0.0));
  const ClaimResult r = evaluate_claim(suite.claims[0], db, "cpu");
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_NE(r.why.find("fewer than the claim's minimum 10"), std::string::npos) << r.why;
  EXPECT_EQ(evaluate_claim(suite.claims[1], db, "cpu").verdict, Verdict::kNotRunnable);
  // At --scale gpu the same stored runs are evaluated (and are too few there as well).
  EXPECT_EQ(evaluate_claim(suite.claims[1], db, "gpu").verdict, Verdict::kInconclusive);
  // --scale gpu-only (the device check) runs the GPU-size claims alone.
  EXPECT_TRUE(claim_runs_at(suite.claims[1], "gpu-only"));
  EXPECT_FALSE(claim_runs_at(suite.claims[0], "gpu-only"));
  EXPECT_TRUE(claim_runs_at(suite.claims[0], "gpu"));
  EXPECT_EQ(evaluate_claim(suite.claims[1], db, "gpu-only").verdict, Verdict::kInconclusive);
  const ClaimResult cpu_claim = evaluate_claim(suite.claims[0], db, "gpu-only");
  EXPECT_EQ(cpu_claim.verdict, Verdict::kNotRunnable);
  EXPECT_NE(cpu_claim.why.find("a CPU-size claim"), std::string::npos) << cpu_claim.why;
  const ClaimResult a = evaluate_claim(suite.claims[2], db, "cpu");
  EXPECT_EQ(a.verdict, Verdict::kInconclusive);
  EXPECT_NE(a.why.find("has not run"), std::string::npos) << a.why;
}

TEST(Reproduce, DeterministicProtocolValuesAreExact) {
  Scratch s;
  const ReproSuite suite = s.load(s.write_suite(
      "toy",
      json::array({claim("waste", pred("serve_allocator_waste", "value", "less", 0.04),
                         serve_config("paged")),
                   claim("more-waste", pred("serve_allocator_waste", "difference", "greater", 0.0),
                         serve_config("contiguous_max"), serve_config("paged"))})));
  ResultsDb db(s.dir + "/db.sqlite");
  add_serve_run(db, suite.claims[0].sides[0], 0.03);
  add_serve_run(db, suite.claims[1].sides[0], 0.02);
  const ClaimResult w = evaluate_claim(suite.claims[0], db, "cpu");
  EXPECT_EQ(w.verdict, Verdict::kHolds);
  EXPECT_TRUE(w.exact);
  EXPECT_DOUBLE_EQ(w.estimate, 0.03);
  // contiguous_max recorded less waste than paged here: the claim fails.
  const ClaimResult m = evaluate_claim(suite.claims[1], db, "cpu");
  EXPECT_EQ(m.verdict, Verdict::kDoesNotHold);
  EXPECT_NEAR(m.estimate, -0.01, 1e-12);

  SuiteReport report;
  report.suite = &suite;
  report.results = {w, m};
  // Cell times in whole seconds once they pass 100 s (not "1.02e+04").
  report.results[0].cell_wall_s = {{"cell-a", 10190.4}};
  report.results[1].cell_wall_s = {{"cell-b", 12.5}};
  const std::string md = render_reproduce_markdown(report, "kvbench reproduce toy");
  EXPECT_NE(md.find("as the store records it: 10203 s."), std::string::npos) << md;
  EXPECT_NE(render_reproduce_summary({report}).find("ran it): 10203 s."), std::string::npos);
  EXPECT_NE(md.find("| waste | 1 (Table 1) |"), std::string::npos) << md;
  EXPECT_NE(md.find("0.03 (exact)"), std::string::npos) << md;
  EXPECT_NE(md.find("**does not hold**"), std::string::npos) << md;
  const std::string summary = render_reproduce_summary({report});
  EXPECT_NE(summary.find("| A paper | 2 | 1 | 1 | 0 | 0 |"), std::string::npos) << summary;
  const std::string readme =
      "intro\n<!-- reproduce-summary:begin -->\nold\n<!-- reproduce-summary:end -->\nrest\n";
  const std::string updated = replace_marked_block(readme, summary, "README.md");
  EXPECT_EQ(updated.find("\nold\n"), std::string::npos);
  EXPECT_NE(updated.find(summary), std::string::npos);
  EXPECT_NE(updated.find("rest"), std::string::npos);
  EXPECT_THROW(replace_marked_block("no block", summary, "README.md"), Error);
}

void expect_suite_error(const json& claims, const std::string& needle,
                        const std::string& file_stem = "toy") {
  Scratch s;
  try {
    const std::string path = s.dir + "/" + file_stem + ".json";
    fs::rename(s.write_suite("toy", claims), path);
    s.load(path);
    ADD_FAILURE() << "no error; expected one mentioning: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Reproduce, SuiteErrorsAreNamed) {
  const json good = claim("c", pred("accuracy", "difference", "greater", 0.0), qa_config(kSnap),
                          qa_config("full"));
  json unknown_key = good;
  unknown_key["treshold"] = 1;
  expect_suite_error(json::array({unknown_key}), "claims[0]: unknown key 'treshold'");
  json bad_metric = good;
  bad_metric["predicate"]["metric"] = "acuracy";
  expect_suite_error(json::array({bad_metric}), "unknown metric 'acuracy'");
  json bad_kind = good;
  bad_kind["predicate"]["kind"] = "product";
  expect_suite_error(json::array({bad_kind}), ".kind: 'product' is not one of");
  json bad_method = good;
  bad_method["a"]["config"]["method"] = "snapkvv";
  expect_suite_error(json::array({bad_method}), "claims[0].a.config");
  json same = good;
  same["b"] = same["a"];
  expect_suite_error(json::array({same}), "the check could not fail");
  json ratio0 = good;
  ratio0["predicate"]["kind"] = "ratio";
  expect_suite_error(json::array({ratio0}), "a ratio's threshold must be > 0");
  json value_with_b = good;
  value_with_b["predicate"]["kind"] = "value";
  expect_suite_error(json::array({value_with_b}), "a \"value\" predicate measures one cell");
  json no_grid = good;
  no_grid["a"] = {{"grid", "nosuchgrid"}, {"where", {{"method.name", "full"}}}};
  expect_suite_error(json::array({no_grid}), "unknown grid 'nosuchgrid'");
  expect_suite_error(json::array({good, good}), "repeats an earlier claim's id");
  expect_suite_error(json::array({good}), "must equal the file name's stem", "other");
  json beyond = good;
  beyond["predicate"]["threshold"] = -1.5;
  expect_suite_error(json::array({beyond}), "is a fraction, so -1.5 is beyond its range");
  json negative_value = good;
  negative_value.erase("b");
  negative_value["predicate"]["kind"] = "value";
  negative_value["predicate"]["metric"] = "kl_mean";
  negative_value["predicate"]["threshold"] = -0.1;
  expect_suite_error(json::array({negative_value}), "is never negative");
  json no_counter = good;
  no_counter["predicate"]["metric"] = "counter:";
  expect_suite_error(json::array({no_counter}), "a counter metric is counter:<name>");
  json bad_counter = good;
  bad_counter["predicate"]["metric"] = "counter:a b";
  expect_suite_error(json::array({bad_counter}), "a counter metric is counter:<name>");
  json bare = good;
  bare.erase("predicate");
  expect_suite_error(json::array({bare}), "missing required key 'predicate'");
}

TEST(Reproduce, GridCellsArePickedByAFilterThatMustMatchExactlyOne) {
  Scratch s;
  write_file(
      s.grids + "/g.json",
      json({{"name", "g"},
            {"base", qa_config("full")},
            {"axes",
             {{"method", {"full", {{"name", "snapkv"}, {"params", {{"budget", {0.25, 0.5}}}}}}}}}})
          .dump());
  json c = claim("c", pred("accuracy", "difference", "greater", 0.0), nullptr);
  c["a"] = {{"grid", "g"}, {"where", {{"method.name", "snapkv"}, {"method.params.budget", 0.5}}}};
  c["b"] = {{"grid", "g"}, {"where", {{"method.name", "full"}}}};
  const ReproSuite suite = s.load(s.write_suite("toy", json::array({c})));
  EXPECT_EQ(suite.claims[0].sides[0].grid, "g");
  EXPECT_EQ(suite.claims[0].sides[0].cell.resolved["method"]["params"]["budget"], 0.5);
  c["a"]["where"].erase("method.params.budget");
  try {
    s.load(s.write_suite("toy", json::array({c})));
    ADD_FAILURE() << "a filter picking two cells was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("claims[0].a.where: picks 2 of grid 'g''s 3 cells"),
              std::string::npos)
        << e.what();
  }
}

// Every shipped suite validates (schema only: the models of GPU-size cells are not here), and every
// paper the suites cover has a page name of its own.
TEST(Reproduce, EveryShippedSuiteLoads) {
  const std::string root = gridtest::source_dir();
  ReproLoadOptions o;
  o.grids_dir = root + "/configs/grids";
  o.check_inputs = false;
  size_t claims = 0, runnable = 0;
  for (const std::string& path : list_reproduce_suites(root + "/configs/reproduce")) {
    SCOPED_TRACE(path);
    const ReproSuite suite = load_reproduce_suite(path, o);
    claims += suite.claims.size();
    for (const Claim& c : suite.claims) runnable += claim_runs_at(c, "cpu");
  }
  EXPECT_GE(runnable, 25u);
  EXPECT_GT(claims, runnable);
}

// The CLI writes nothing for a bad suite: no database, no report directory.
TEST(Reproduce, CliWritesNothingOnAConfigError) {
  Scratch s;
  json bad = claim("c", pred("acuracy", "difference", "greater", 0.0), qa_config(kSnap),
                   qa_config("full"));
  s.write_suite("toy", json::array({bad}));
  const std::string db = s.dir + "/out/db.sqlite", out = s.dir + "/out/reports";
  const test::CommandResult r =
      test::run_kvbench("reproduce --all --suites-dir " + s.dir + " --grids-dir " + s.grids +
                        " --db " + db + " --out-dir " + out + " --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("unknown metric 'acuracy'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(db));
  EXPECT_FALSE(fs::exists(out));
  const test::CommandResult u =
      test::run_kvbench("reproduce nosuch --suites-dir " + s.dir + " --db " + db);
  EXPECT_EQ(u.exit_code, 2);
  EXPECT_NE(u.err.find("unknown paper 'nosuch'"), std::string::npos) << u.err;
  EXPECT_FALSE(fs::exists(db));
}

// A claim whose cell only the method's store can refuse (a kept ratio of 7) is a config error of
// the suite, not an inconclusive claim: exit 2 naming the claim's side and the parameter, nothing
// written.
TEST(Reproduce, CliRefusesAStoreErrorOfACellBeforeAnything) {
  Scratch s;
  json stream = {{"model", "stories260K"},
                 {"threads", 1},
                 {"method", {{"name", "snapkv"}, {"params", {{"budget", 7}}}}},
                 {"protocol", {{"name", "stream"}, {"window", 64}, {"max_windows", 1}}}};
  json full = stream;
  full["method"] = "full";
  s.write_suite(
      "toy",
      json::array({claim("c", pred("kl_mean", "difference", "greater", 0.0), stream, full)}));
  const std::string db = s.dir + "/out/db.sqlite", out = s.dir + "/out/reports";
  const test::CommandResult r =
      test::run_kvbench("reproduce toy --suites-dir " + s.dir + " --grids-dir " + s.grids +
                        " --db " + db + " --out-dir " + out + " --models-dir " +
                        test::models_dir() + " --data-dir " + test::data_dir() + " --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("claims[0].a.config"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("method snapkv.budget: 7 is not a valid kept ratio"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(db));
  EXPECT_FALSE(fs::exists(out));
}

// The cheapest real claim: on stories260K, 2-bit KIVI drifts further from the full cache than
// 8-bit KIVI (KL over 10 TinyStories windows). Runs its two cells, evaluates, writes the page; a
// second call skips the finished cells.
TEST(Reproduce, EndToEndOnStories260K) {
  Scratch s;
  auto stream = [](int bits) {
    return json{{"model", "stories260K"},
                {"threads", 1},
                {"method",
                 {{"name", "kivi"},
                  {"params", {{"k_bits", bits}, {"v_bits", bits}, {"residual_length", 0}}}}},
                {"protocol",
                 {{"name", "stream"},
                  {"dataset", "tinystories-valid-sample"},
                  {"window", 96},
                  {"prefill_tokens", 64},
                  {"max_windows", 10}}}};
  };
  s.write_suite("toy", json::array({claim("bits", pred("kl_mean", "difference", "greater", 0.0),
                                          stream(2), stream(8))}));
  const std::string db = s.dir + "/db.sqlite", out = s.dir + "/reports";
  const std::string args = "reproduce toy --suites-dir " + s.dir + " --grids-dir " + s.grids +
                           " --db " + db + " --out-dir " + out + " --models-dir " +
                           test::models_dir() + " --data-dir " + test::data_dir();
  const test::CommandResult r = test::run_kvbench(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("toy/bits: holds"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("2 cells ran, 0 already done"), std::string::npos) << r.err;
  const std::string md = read_file(out + "/toy.md");
  EXPECT_NE(md.find("paired bootstrap over 10 samples"), std::string::npos) << md;
  EXPECT_TRUE(fs::exists(out + "/toy.html"));
  const test::CommandResult again = test::run_kvbench(args);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("0 cells ran, 2 already done"), std::string::npos) << again.err;
  EXPECT_NE(again.out.find("toy/bits: holds"), std::string::npos);
}

}  // namespace
}  // namespace kvb
