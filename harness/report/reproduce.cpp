#include "harness/report/reproduce.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/json_parse.h"
#include "harness/common/strings.h"
#include "harness/common/text_escape.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/run_config.h"
#include "harness/metrics/metric_table.h"
#include "harness/metrics/portable_random.h"
#include "harness/metrics/statistics.h"
#include "harness/report/sample_stats.h"

namespace kvb {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

void check_keys(const json& obj, const std::vector<std::string>& allowed,
                const std::string& where) {
  KVB_CHECK(obj.is_object(), where, ": expected a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it)
    KVB_CHECK(std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end(), where,
              ": unknown key '", it.key(), "'", did_you_mean(it.key(), allowed),
              "; allowed: ", join(allowed, ", "));
}

std::string get_string(const json& obj, const std::string& key, const std::string& where,
                       bool required) {
  if (!obj.contains(key)) {
    KVB_CHECK(!required, where, ": missing required key '", key, "'");
    return "";
  }
  KVB_CHECK(obj[key].is_string(), where, ".", key, ": expected a string");
  const std::string s = obj[key].get<std::string>();
  KVB_CHECK(!required || !s.empty(), where, ".", key, ": must not be empty");
  return s;
}

// The value at a dotted path of a resolved config ("method.params.budget"); null when absent.
const json* at_path(const json& config, const std::string& dotted) {
  const json* cur = &config;
  for (const std::string& part : split(dotted, '.')) {
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
  }
  return cur;
}

bool cell_matches(const GridCell& cell, const json& where) {
  for (auto it = where.begin(); it != where.end(); ++it) {
    const json* v = at_path(cell.resolved, it.key());
    // null picks the cells that do not set the key (a protocol keeps a later parameter out of a
    // config that does not give it, so that earlier runs keep their hashes).
    if (it.value().is_null()) {
      if (v != nullptr && !v->is_null()) return false;
    } else if (v == nullptr || *v != it.value()) {
      return false;
    }
  }
  return true;
}

struct GridCache {
  std::map<std::string, GridPlan> plans;  // by grid file path
};

ClaimSide load_side(const json& j, const std::string& where, const std::string& paper,
                    const std::string& scale, const ReproLoadOptions& options, GridCache& cache) {
  check_keys(j, {"grid", "where", "config"}, where);
  GridOptions go;
  go.models_dir = options.models_dir;
  go.data_dir = options.data_dir;
  go.check_inputs = options.check_inputs && scale == "cpu";
  ClaimSide side;
  if (j.contains("config")) {
    KVB_CHECK(
        !j.contains("grid") && !j.contains("where"), where,
        ": give either \"config\" (an inline run config) or \"grid\" with \"where\", not both");
    KVB_CHECK(j["config"].is_object(), where, ".config: expected a run config object");
    side.grid = "reproduce_" + paper;
    side.origin = "inline";
    try {
      GridPlan plan = expand_grid(json{{"name", side.grid}, {"base", j["config"]}}, go);
      KVB_ASSERT(plan.cells.size() == 1, "reproduce", "an inline config expands to one cell");
      side.cell = plan.cells[0];
      // A grid without axes labels its one cell "(base)"; name what it runs instead (the method as
      // the suite gives it, the model, the protocol and its task or dataset).
      const json& r = side.cell.resolved;
      const json& rp = r["protocol"];
      std::string proto = rp["name"].get<std::string>();
      const char* what =
          rp.contains("task") && rp["task"].is_string() && rp["name"] == "qa" ? "task" : "dataset";
      if (rp.contains(what) && rp[what].is_string()) proto += " " + rp[what].get<std::string>();
      for (const char* k : {"length", "window", "max_windows"})
        if (rp.contains(k) && rp[k].is_number()) proto += std::string(" ") + k + "=" + rp[k].dump();
      const json& raw_method = j["config"].contains("method") ? j["config"]["method"] : r["method"];
      side.cell.label =
          method_label(raw_method) + " on " + r["model"].get<std::string>() + ", " + proto;
    } catch (const Error& e) {
      throw Error(where + ".config: " + e.what());
    }
    return side;
  }
  const std::string grid = get_string(j, "grid", where, true);
  KVB_CHECK(
      j.contains("where") && j["where"].is_object() && !j["where"].empty(), where,
      ".where: expected a non-empty object {\"dotted.config.key\": value} picking one cell of "
      "grid '",
      grid, "'");
  KVB_CHECK(grid.find('/') == std::string::npos && grid.find("..") == std::string::npos, where,
            ".grid: a grid name (a file of ", options.grids_dir, "), not a path: '", grid, "'");
  const std::string path = options.grids_dir + "/" + grid + ".json";
  KVB_CHECK(fs::is_regular_file(path), where, ".grid: unknown grid '", grid, "' (no ", path, ")");
  auto it = cache.plans.find(path + (go.check_inputs ? "" : "#schema"));
  if (it == cache.plans.end()) {
    try {
      it =
          cache.plans.emplace(path + (go.check_inputs ? "" : "#schema"), load_grid(path, go)).first;
    } catch (const Error& e) {
      throw Error(where + ".grid '" + grid + "': " + e.what());
    }
  }
  const GridPlan& plan = it->second;
  std::vector<const GridCell*> hits;
  for (const GridCell& c : plan.cells)
    if (cell_matches(c, j["where"])) hits.push_back(&c);
  std::vector<std::string> labels;
  for (const GridCell* c : hits) labels.push_back("#" + std::to_string(c->index) + " " + c->label);
  KVB_CHECK(hits.size() == 1, where, ".where: picks ", hits.size(), " of grid '", grid, "''s ",
            plan.cells.size(), " cells; it must pick exactly one",
            hits.empty() ? std::string(" (check the keys: they are paths of the resolved config, "
                                       "e.g. method.params.budget, protocol.task)")
                         : ": " + join(labels, "; "));
  side.grid = plan.name;
  side.origin = path;
  side.cell = *hits[0];
  return side;
}

ClaimPredicate load_predicate(const json& j, const std::string& where) {
  check_keys(j,
             {"metric", "kind", "direction", "threshold", "min_samples", "confidence", "resamples",
              "seed"},
             where);
  ClaimPredicate p;
  p.metric = get_string(j, "metric", where, true);
  const bool counter = is_counter_metric(p.metric);
  if (counter) {
    const std::string name = p.metric.substr(kCounterPrefix.size());
    KVB_CHECK(!name.empty() && std::all_of(name.begin(), name.end(),
                                           [](char ch) {
                                             return std::isalnum(static_cast<unsigned char>(ch)) ||
                                                    ch == '_' || ch == '.';
                                           }),
              where, ".metric: '", p.metric,
              "': a counter metric is counter:<name>, the name as the method's counters() gives it "
              "([A-Za-z0-9_.]+)");
  }
  // A metric of the metric table, or a per-sample metric a protocol defines itself (qa: accuracy).
  std::vector<std::string> names;
  for (const auto& m : all_metrics()) names.emplace_back(m.name);
  const ProtocolRegistry& protocols = ProtocolRegistry::instance();
  for (const std::string& proto : protocols.names())
    for (const SampleMetricDef& d : protocols.report(proto).sample_metrics) names.push_back(d.name);
  KVB_CHECK(counter || std::find(names.begin(), names.end(), p.metric) != names.end(), where,
            ".metric: unknown metric '", p.metric, "'", did_you_mean(p.metric, names),
            " (or counter:<name> for a method counter)");
  const std::string kind = get_string(j, "kind", where, true);
  if (kind == "value")
    p.kind = ClaimKind::kValue;
  else if (kind == "difference")
    p.kind = ClaimKind::kDifference;
  else if (kind == "ratio")
    p.kind = ClaimKind::kRatio;
  else
    KVB_CHECK(false, where, ".kind: '", kind, "' is not one of value, difference, ratio");
  const std::string dir = get_string(j, "direction", where, true);
  if (dir == "greater")
    p.direction = ClaimDirection::kGreater;
  else if (dir == "less")
    p.direction = ClaimDirection::kLess;
  else
    KVB_CHECK(false, where, ".direction: '", dir, "' is not one of greater, less");
  KVB_CHECK(j.contains("threshold") && j["threshold"].is_number(), where,
            ".threshold: expected a number");
  p.threshold = j["threshold"].get<double>();
  KVB_CHECK(std::isfinite(p.threshold), where, ".threshold: must be finite");
  KVB_CHECK(p.kind != ClaimKind::kRatio || p.threshold > 0, where,
            ".threshold: a ratio's threshold must be > 0 (a ratio of non-negative metrics is never "
            "below 0, so the check could not fail)");
  // A fraction lies in [0, 1], so a value or difference of fractions has bounds a threshold beyond
  // which the check could not fail.
  std::string unit;
  if (is_known_metric(p.metric)) unit = std::string(metric_info(p.metric).unit);
  for (const std::string& proto : protocols.names())
    for (const SampleMetricDef& d : protocols.report(proto).sample_metrics)
      if (d.name == p.metric && unit.empty()) unit = d.unit;
  if (unit == "fraction" && p.kind != ClaimKind::kRatio) {
    const double lo = p.kind == ClaimKind::kValue ? 0.0 : -1.0;
    const bool can_fail =
        p.direction == ClaimDirection::kGreater ? p.threshold >= lo : p.threshold <= 1.0;
    KVB_CHECK(can_fail, where, ".threshold: ", p.metric, " is a fraction, so ", p.threshold,
              " is beyond its range and the check could not fail");
  }
  // A method's counter may be negative (a difference it reports), so only table metrics are known
  // to be non-negative.
  if (!counter && p.kind == ClaimKind::kValue && p.direction == ClaimDirection::kGreater)
    KVB_CHECK(p.threshold >= 0, where, ".threshold: ", p.metric,
              " is never negative, so 'greater than ", p.threshold, "' could not fail");
  if (j.contains("min_samples")) {
    KVB_CHECK(j["min_samples"].is_number_integer() && j["min_samples"].get<int64_t>() >= 2 &&
                  j["min_samples"].get<int64_t>() <= 1000000,
              where, ".min_samples: expected an integer in [2, 1000000]");
    p.min_samples = j["min_samples"].get<int64_t>();
  }
  if (j.contains("confidence")) {
    KVB_CHECK(j["confidence"].is_number() && j["confidence"].get<double>() >= 0.5 &&
                  j["confidence"].get<double>() < 1,
              where, ".confidence: expected a number in [0.5, 1)");
    p.confidence = j["confidence"].get<double>();
  }
  if (j.contains("resamples")) {
    KVB_CHECK(j["resamples"].is_number_integer() && j["resamples"].get<int64_t>() >= 100 &&
                  j["resamples"].get<int64_t>() <= 1000000,
              where, ".resamples: expected an integer in [100, 1000000]");
    p.resamples = j["resamples"].get<size_t>();
  }
  if (j.contains("seed")) {
    KVB_CHECK(j["seed"].is_number_unsigned(), where, ".seed: expected a non-negative integer");
    p.seed = j["seed"].get<uint64_t>();
  }
  return p;
}

Claim load_claim(const json& j, const std::string& where, const std::string& paper,
                 const ReproLoadOptions& options, GridCache& cache) {
  check_keys(j,
             {"id", "statement", "paper_value", "source", "scale", "not_runnable", "caveat", "a",
              "b", "predicate"},
             where);
  Claim c;
  c.id = get_string(j, "id", where, true);
  c.statement = get_string(j, "statement", where, true);
  c.paper_value = get_string(j, "paper_value", where, true);
  c.source = get_string(j, "source", where, true);
  c.caveat = get_string(j, "caveat", where, false);
  c.not_runnable = get_string(j, "not_runnable", where, false);
  if (j.contains("scale")) c.scale = get_string(j, "scale", where, true);
  KVB_CHECK(c.scale == "cpu" || c.scale == "gpu", where, ".scale: '", c.scale,
            "' is not one of cpu, gpu");
  if (!j.contains("predicate")) {
    KVB_CHECK(
        !c.not_runnable.empty(), where,
        ": missing required key 'predicate' (only a claim with \"not_runnable\" may go without)");
    KVB_CHECK(!j.contains("a") && !j.contains("b"), where,
              ": cells \"a\"/\"b\" without a \"predicate\" would test nothing");
    return c;
  }
  c.has_predicate = true;
  c.predicate = load_predicate(j["predicate"], where + ".predicate");
  KVB_CHECK(j.contains("a"), where, ": missing required key 'a' (the cell the predicate measures)");
  c.sides.push_back(load_side(j["a"], where + ".a", paper, c.scale, options, cache));
  if (c.predicate.kind == ClaimKind::kValue) {
    KVB_CHECK(!j.contains("b"), where, ".b: a \"value\" predicate measures one cell; drop \"b\"");
  } else {
    KVB_CHECK(j.contains("b"), where, ": missing required key 'b' (a ",
              c.predicate.kind == ClaimKind::kRatio ? "ratio" : "difference",
              " compares two cells)");
    c.sides.push_back(load_side(j["b"], where + ".b", paper, c.scale, options, cache));
    KVB_CHECK(c.sides[0].cell.config_hash != c.sides[1].cell.config_hash, where,
              ": \"a\" and \"b\" are the same run (", c.sides[0].cell.label,
              "): the check could not fail");
  }
  if (c.sides.size() == 2)
    KVB_CHECK(c.sides[0].cell.resolved["protocol"]["name"] ==
                  c.sides[1].cell.resolved["protocol"]["name"],
              where, ": \"a\" and \"b\" run different protocols; their samples do not pair");
  return c;
}

// Each sample's value of the method counter `metric` ("counter:<name>", read from the sample's
// "counters" object), as sums (value, 1) under the source name `metric`. A sample without the
// counter has no entry, so it does not pair.
RunSamples counter_samples(const std::vector<SampleRow>& rows, const std::string& metric) {
  const std::string name = metric.substr(kCounterPrefix.size());
  RunSamples out;
  for (const SampleRow& row : rows) {
    json j;
    if (!parse_json_if_valid(row.output_json, "sample output", &j) || !j.is_object()) continue;
    out.keys[row.index] = row.key;
    if (!j.contains("counters") || !j["counters"].is_object()) continue;
    const json& c = j["counters"];
    if (!c.contains(name) || !c[name].is_number()) continue;
    const double v = c[name].get<double>();
    if (std::isfinite(v)) out.sums[metric][row.index] = {v, 1.0};
  }
  return out;
}

// A run of the claim's side, or why there is none.
struct SideRun {
  std::optional<RunRow> run;
  std::string missing;
};

SideRun find_done_run(ResultsDb& db, const ClaimSide& side) {
  SideRun out;
  out.run = db.find_run_by_hash(side.cell.config_hash);
  if (!out.run)
    out.missing = "cell " + side.cell.label + " has not run";
  else if (out.run->status != RunStatus::kDone)
    out.missing = "cell " + side.cell.label + " is " + to_string(out.run->status) +
                  (out.run->error.empty() ? "" : " (" + out.run->error + ")");
  if (!out.missing.empty()) out.run.reset();
  return out;
}

std::optional<double> run_level_metric(ResultsDb& db, int64_t run_id, const std::string& name) {
  for (const Metric& m : db.metrics(run_id))
    if (m.name == name && !m.layer && !m.head) return m.value;
  return std::nullopt;
}

// The statistic of a claim from summed (num, den) of a and b: f(a) for a value, f(a) - f(b) for a
// difference, f(a) / f(b) for a ratio (f = identity or exp).
double claim_statistic(ClaimKind kind, bool exp_transform, double an, double ad, double bn,
                       double bd) {
  auto f = [&](double n, double d) { return exp_transform ? std::exp(n / d) : n / d; };
  const double a = f(an, ad);
  if (kind == ClaimKind::kValue) return a;
  const double b = f(bn, bd);
  return kind == ClaimKind::kDifference ? a - b : a / b;
}

// Bootstrap of claim_statistic over the pairs by the resampling rule of statistics.h: rng =
// mt19937_64(seed), each resample draws n indices with uniform_index, the interval is the
// percentile_sorted of the sorted statistics. For a difference this is paired_ratio_bootstrap.
BootstrapCi claim_bootstrap(const PairedSums& x, ClaimKind kind, bool exp_transform,
                            const ClaimPredicate& p) {
  if (kind == ClaimKind::kDifference)
    return paired_ratio_bootstrap(x, exp_transform, p.resamples, p.seed, p.confidence);
  const size_t n = x.a_num.size();
  auto sum = [](const std::vector<double>& v) {
    double s = 0;
    for (double e : v) s += e;
    return s;
  };
  const bool paired = kind != ClaimKind::kValue;
  BootstrapCi ci;
  ci.n = n;
  ci.n_resamples = p.resamples;
  ci.seed = p.seed;
  ci.confidence = p.confidence;
  ci.estimate = claim_statistic(kind, exp_transform, sum(x.a_num), sum(x.a_den),
                                paired ? sum(x.b_num) : 1, paired ? sum(x.b_den) : 1);
  std::mt19937_64 rng(p.seed);
  std::vector<double> stats(p.resamples);
  for (size_t r = 0; r < p.resamples; ++r) {
    double an = 0, ad = 0, bn = 0, bd = 0;
    for (size_t j = 0; j < n; ++j) {
      const size_t i = uniform_index(rng, n);
      an += x.a_num[i];
      ad += x.a_den[i];
      if (paired) {
        bn += x.b_num[i];
        bd += x.b_den[i];
      }
    }
    stats[r] = claim_statistic(kind, exp_transform, an, ad, paired ? bn : 1, paired ? bd : 1);
  }
  std::sort(stats.begin(), stats.end());
  ci.lo = percentile_sorted(stats, 100 * (1 - p.confidence) / 2);
  ci.hi = percentile_sorted(stats, 100 * (1 + p.confidence) / 2);
  return ci;
}

Verdict verdict_of(const ClaimPredicate& p, double lo, double hi) {
  if (p.direction == ClaimDirection::kGreater) {
    if (lo > p.threshold) return Verdict::kHolds;
    if (hi <= p.threshold) return Verdict::kDoesNotHold;
  } else {
    if (hi < p.threshold) return Verdict::kHolds;
    if (lo >= p.threshold) return Verdict::kDoesNotHold;
  }
  return Verdict::kInconclusive;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Seconds of cell time: whole seconds from 100 s on ("10190", not "1.019e+04").
std::string fmt_seconds(double s) {
  if (s < 100) return fmt(s);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", s);
  return buf;
}

std::string scale_note(const RunRow& run) {
  json cfg = json::parse(run.config_json, nullptr, false);
  std::string note = run.model + ", " + run.protocol + " on " + run.dataset;
  if (cfg.is_object() && cfg.contains("protocol")) {
    const json& p = cfg["protocol"];
    for (const char* k : {"length", "context", "window", "max_requests", "num_samples"})
      if (p.contains(k) && p[k].is_number()) note += std::string(", ") + k + " " + p[k].dump();
  }
  json prov = json::parse(run.provenance_json, nullptr, false);
  std::string device = cfg.is_object() && cfg.contains("device") && cfg["device"].is_string()
                           ? cfg["device"].get<std::string>()
                           : "";
  if (prov.is_object() && prov.contains("cpu_model") && prov["cpu_model"].is_string() &&
      !prov["cpu_model"].get<std::string>().empty())
    device += " (" + prov["cpu_model"].get<std::string>() + ")";
  if (cfg.is_object() && cfg.contains("threads") && cfg["threads"].is_number())
    device += ", " + cfg["threads"].dump() + " threads";
  if (!device.empty()) note += ", " + device;
  return note;
}

}  // namespace

bool is_counter_metric(const std::string& metric) {
  return metric.compare(0, kCounterPrefix.size(), kCounterPrefix) == 0;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kHolds:
      return "holds";
    case Verdict::kDoesNotHold:
      return "does not hold";
    case Verdict::kInconclusive:
      return "inconclusive";
    case Verdict::kNotRunnable:
      return "not runnable here";
  }
  return "?";
}

ReproSuite load_reproduce_suite(const std::string& path, const ReproLoadOptions& options) {
  ReproSuite s;
  s.path = path;
  s.paper = fs::path(path).stem().string();
  const json j = load_config_file(path);
  const std::string where = path;
  check_keys(j, {"paper", "title", "reference", "setting", "claims"}, where);
  const std::string paper = get_string(j, "paper", where, true);
  KVB_CHECK(paper == s.paper, where, ".paper: '", paper, "' must equal the file name's stem '",
            s.paper, "'");
  s.title = get_string(j, "title", where, true);
  s.reference = get_string(j, "reference", where, true);
  s.setting = get_string(j, "setting", where, true);
  KVB_CHECK(j.contains("claims") && j["claims"].is_array() && !j["claims"].empty(), where,
            ".claims: expected a non-empty list of claims");
  GridCache cache;
  std::set<std::string> ids;
  for (size_t i = 0; i < j["claims"].size(); ++i) {
    const std::string w = where + ": claims[" + std::to_string(i) + "]";
    s.claims.push_back(load_claim(j["claims"][i], w, s.paper, options, cache));
    KVB_CHECK(ids.insert(s.claims.back().id).second, w, ".id: '", s.claims.back().id,
              "' repeats an earlier claim's id");
  }
  return s;
}

std::vector<std::string> list_reproduce_suites(const std::string& suites_dir) {
  KVB_CHECK(fs::is_directory(suites_dir), suites_dir, ": no such suites directory");
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(suites_dir))
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool claim_runs_at(const Claim& claim, const std::string& scale) {
  if (!claim.has_predicate || !claim.not_runnable.empty()) return false;
  if (scale == "gpu-only") return claim.scale == "gpu";
  return claim.scale == "cpu" || scale == "gpu";
}

ClaimResult evaluate_claim(const Claim& claim, ResultsDb& db, const std::string& scale) {
  ClaimResult r;
  r.verdict = Verdict::kNotRunnable;
  if (!claim.not_runnable.empty()) {
    r.why = claim.not_runnable;
    return r;
  }
  if (!claim_runs_at(claim, scale)) {
    r.why =
        claim.scale == "cpu"
            ? "a CPU-size claim: --scale gpu-only runs and evaluates the GPU-size claims alone"
            : "needs a GPU: its cells are GPU-size (run with --scale gpu on a machine with one)";
    return r;
  }
  r.verdict = Verdict::kInconclusive;
  const ClaimPredicate& p = claim.predicate;
  std::vector<RunRow> runs;
  for (const ClaimSide& side : claim.sides) {
    SideRun sr = find_done_run(db, side);
    if (!sr.run) {
      r.why = sr.missing;
      return r;
    }
    runs.push_back(*sr.run);
    r.scale_notes.push_back(scale_note(*sr.run));
    r.cell_wall_s[sr.run->config_hash] = sr.run->wall_s.value_or(0);
  }
  const bool paired = runs.size() == 2;
  const std::string& protocol = runs[0].protocol;
  KVB_CHECK(!paired || runs[1].protocol == protocol, "claim '", claim.id,
            "': its cells run different protocols (", protocol, ", ", runs[1].protocol,
            "): their samples do not pair");
  const bool counter = is_counter_metric(p.metric);
  // A counter is a per-sample value (num = value, den = 1): its run value is the mean over samples.
  const SampleMetricDef counter_def{p.metric, "", Direction::kNone, "", false};
  const SampleMetricDef* def = counter ? &counter_def : find_sample_metric(protocol, p.metric);
  const bool deterministic =
      ProtocolRegistry::instance().has(protocol) &&
      !ProtocolRegistry::instance().report(protocol).exact_delta_note.empty();
  if (counter || (def != nullptr && !deterministic)) {
    auto samples_of = [&](const RunRow& run) {
      return counter ? counter_samples(db.samples(run.id), p.metric)
                     : extract_samples(protocol, db.samples(run.id));
    };
    const RunSamples sa = samples_of(runs[0]);
    const RunSamples sb = paired ? samples_of(runs[1]) : sa;
    std::vector<int64_t> idx = common_samples(sa, sb);
    PairedSums x = paired_sums(sa, sb, *def, idx);
    r.n = x.a_num.size();
    if (r.n == 0) {
      r.why = "no samples of " + p.metric + (paired ? " common to both cells" : " in the cell") +
              (counter ? " (no sample records the counter)" : "");
      return r;
    }
    if (p.kind == ClaimKind::kRatio && !def->exp_transform &&
        !(std::accumulate(x.b_num.begin(), x.b_num.end(), 0.0) > 0)) {
      // A ratio of sums whose denominator sums to 0 is undefined.
      r.why = "the ratio's denominator " + p.metric + " sums to 0 over the samples";
      return r;
    }
    const BootstrapCi ci = claim_bootstrap(x, p.kind, def->exp_transform, p);
    r.have_value = true;
    r.estimate = ci.estimate;
    r.lo = ci.lo;
    r.hi = ci.hi;
    const auto sum = [](const std::vector<double>& v) {
      return std::accumulate(v.begin(), v.end(), 0.0);
    };
    r.a_value =
        claim_statistic(ClaimKind::kValue, def->exp_transform, sum(x.a_num), sum(x.a_den), 1, 1);
    if (paired)
      r.b_value =
          claim_statistic(ClaimKind::kValue, def->exp_transform, sum(x.b_num), sum(x.b_den), 1, 1);
    // A counter that every sample records alike is a per-run quantity (KVTC's calibration error):
    // the samples do not vary, so no interval is claimed; the value is compared as it is.
    const auto constant = [](const std::vector<double>& v) {
      return std::all_of(v.begin(), v.end(), [&](double e) { return e == v.front(); });
    };
    if (counter && constant(x.a_num) && (!paired || constant(x.b_num))) {
      r.exact = true;
      r.verdict = verdict_of(p, r.estimate, r.estimate);
      r.why = "every sample records the same " + p.metric +
              " (a per-run quantity): the value is compared as it is, without an interval";
      return r;
    }
    if (static_cast<int64_t>(r.n) < p.min_samples) {
      r.why = std::to_string(r.n) + (paired ? " paired" : "") +
              " samples, fewer than the claim's minimum " + std::to_string(p.min_samples);
      return r;
    }
    r.verdict = verdict_of(p, r.lo, r.hi);
    r.why = "paired bootstrap over " + std::to_string(r.n) + " samples";
    if (r.verdict == Verdict::kInconclusive) r.why += "; the interval spans the threshold";
    return r;
  }
  // A run-level value: exact for a deterministic protocol, without an interval otherwise.
  std::vector<double> values;
  for (const RunRow& run : runs) {
    std::optional<double> v = run_level_metric(db, run.id, p.metric);
    if (!v || !std::isfinite(*v)) {
      r.why = "run " + run.config_hash.substr(0, 12) + " recorded no " + p.metric;
      return r;
    }
    values.push_back(*v);
  }
  r.a_value = values[0];
  r.b_value = paired ? values[1] : 0;
  if (p.kind == ClaimKind::kRatio && !(values[1] > 0)) {
    r.why = "the ratio's denominator " + p.metric + " is " + fmt(values[1]);
    return r;
  }
  r.have_value = true;
  r.n = 1;
  r.estimate = p.kind == ClaimKind::kValue        ? values[0]
               : p.kind == ClaimKind::kDifference ? values[0] - values[1]
                                                  : values[0] / values[1];
  r.lo = r.hi = r.estimate;
  if (!deterministic) {
    r.why = p.metric + " is one run-level value of a sampled protocol (" + protocol +
            "): no interval to judge it by";
    return r;
  }
  r.exact = true;
  r.verdict = verdict_of(p, r.estimate, r.estimate);
  r.why = "exact: one deterministic simulation per cell";
  return r;
}

GridSummary run_reproduce_cells(const ReproSuite& suite, ResultsDb& db,
                                const ReproRunOptions& options) {
  // Cells grouped by grid, in the order the claims name them, each once.
  std::vector<std::string> order;
  std::map<std::string, std::vector<GridCell>> by_grid;
  std::set<std::string> seen;
  for (const Claim& c : suite.claims) {
    if (!claim_runs_at(c, options.scale)) continue;
    for (const ClaimSide& s : c.sides) {
      if (!seen.insert(s.cell.config_hash).second) continue;
      if (!by_grid.count(s.grid)) order.push_back(s.grid);
      by_grid[s.grid].push_back(s.cell);
    }
  }
  GridSummary total;
  for (const std::string& g : order) {
    const GridSummary s = run_grid(g, by_grid[g], db, options.grid);
    total.cells.insert(total.cells.end(), s.cells.begin(), s.cells.end());
    total.ran += s.ran;
    total.skipped += s.skipped;
    total.failed += s.failed;
    total.not_reached += s.not_reached;
    total.held += s.held;
    total.wall_s += s.wall_s;
    total.disk_full = total.disk_full || s.disk_full;
    total.interrupted = total.interrupted || s.interrupted;
    if (total.interrupted || total.disk_full) break;
  }
  return total;
}

namespace {

std::string kind_text(const ClaimPredicate& p) {
  const std::string m = "`" + p.metric + "`";
  const std::string rel = p.direction == ClaimDirection::kGreater ? " > " : " < ";
  switch (p.kind) {
    case ClaimKind::kValue:
      return m + "(a)" + rel + fmt(p.threshold);
    case ClaimKind::kDifference:
      return m + "(a) − " + m + "(b)" + rel + fmt(p.threshold);
    case ClaimKind::kRatio:
      return m + "(a) / " + m + "(b)" + rel + fmt(p.threshold);
  }
  return "";
}

std::string ours_text(const ClaimResult& r) {
  if (!r.have_value) return "—";
  if (r.exact) return fmt(r.estimate) + " (exact)";
  if (r.n <= 1) return fmt(r.estimate) + " (no interval)";
  return fmt(r.estimate) + " [" + fmt(r.lo) + ", " + fmt(r.hi) + "] (n=" + std::to_string(r.n) +
         ")";
}

std::string md_cell(const std::string& s) { return markdown_cell(s); }

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct Counts {
  size_t holds = 0, not_hold = 0, inconclusive = 0, not_runnable = 0;
  std::map<std::string, double> cell_wall_s;  // each evaluated cell once
  double wall_s() const {
    double s = 0;
    for (const auto& [hash, w] : cell_wall_s) s += w;
    return s;
  }
};

Counts count(const SuiteReport& r) {
  Counts c;
  for (const ClaimResult& x : r.results) {
    c.cell_wall_s.insert(x.cell_wall_s.begin(), x.cell_wall_s.end());
    switch (x.verdict) {
      case Verdict::kHolds:
        ++c.holds;
        break;
      case Verdict::kDoesNotHold:
        ++c.not_hold;
        break;
      case Verdict::kInconclusive:
        ++c.inconclusive;
        break;
      case Verdict::kNotRunnable:
        ++c.not_runnable;
        break;
    }
  }
  return c;
}

std::string side_text(const ClaimSide& s) {
  return s.cell.label + " (" +
         (s.origin == "inline" ? std::string("inline cell") : "grid `" + s.grid + "`") +
         ", config " + s.cell.config_hash.substr(0, 12) + ")";
}

}  // namespace

std::string render_reproduce_markdown(const SuiteReport& report, const std::string& command) {
  const ReproSuite& s = *report.suite;
  KVB_ASSERT(report.results.size() == s.claims.size(), "reproduce", "one result per claim");
  std::ostringstream o;
  o << "# Reproducing " << s.title << "\n\n";
  o << "Generated by `" << command << "` from `" << s.path
    << "` and the results store; do not edit by hand.\n\n";
  o << "Paper: " << s.reference << ". Its setting: " << s.setting << "\n\n";
  const Counts c = count(report);
  o << "**" << s.claims.size() << " claims: " << c.holds << " hold, " << c.not_hold
    << " do not hold, " << c.inconclusive << " inconclusive, " << c.not_runnable
    << " not runnable here.** "
    << "Compute time of its " << c.cell_wall_s.size()
    << " evaluated cells as the store records it: " << fmt_seconds(c.wall_s()) << " s.\n\n";
  o << "| claim | paper's number | predicate | ours [95% CI] | verdict |\n|---|---|---|---|---|\n";
  for (size_t i = 0; i < s.claims.size(); ++i) {
    const Claim& cl = s.claims[i];
    const ClaimResult& r = report.results[i];
    o << "| " << md_cell(cl.id) << " | " << md_cell(cl.paper_value) << " (" << md_cell(cl.source)
      << ") | " << (cl.has_predicate ? md_cell(kind_text(cl.predicate)) : "—") << " | "
      << md_cell(ours_text(r)) << " | **" << verdict_name(r.verdict) << "** |\n";
  }
  o << "\n## Claims\n";
  for (size_t i = 0; i < s.claims.size(); ++i) {
    const Claim& cl = s.claims[i];
    const ClaimResult& r = report.results[i];
    o << "\n### " << cl.id << ": " << verdict_name(r.verdict) << "\n\n";
    o << "- Paper: " << cl.statement << " Quoted: " << cl.paper_value << " (" << cl.source
      << ").\n";
    if (cl.has_predicate) {
      o << "- Predicate: " << kind_text(cl.predicate) << " at "
        << fmt(cl.predicate.confidence * 100) << "% confidence, at least "
        << cl.predicate.min_samples << " samples.\n";
      o << "- a: " << side_text(cl.sides[0]) << "\n";
      if (cl.sides.size() > 1) o << "- b: " << side_text(cl.sides[1]) << "\n";
    }
    o << "- Ours: " << ours_text(r);
    if (r.have_value && cl.sides.size() > 1)
      o << " (a = " << fmt(r.a_value) << ", b = " << fmt(r.b_value) << ")";
    else if (r.have_value && !r.exact)
      o << " (a = " << fmt(r.a_value) << ")";
    o << "; " << r.why << ".\n";
    for (size_t k = 0; k < r.scale_notes.size(); ++k)
      o << "- Scale (" << (k == 0 ? "a" : "b") << "): " << r.scale_notes[k] << ".\n";
    if (!cl.caveat.empty()) o << "- How our setting differs: " << cl.caveat << "\n";
  }
  o << "\n## Commands\n\n```\n"
    << command << "\n```\n\n"
    << "`--evaluate-only` re-evaluates the stored runs without running cells; `--scale gpu` adds "
       "the "
       "GPU-size cells. The cells of a shipped grid are the same runs `kvbench grid -c "
       "configs/grids/<grid>.json` computes, so a store that has them skips them.\n";
  return o.str();
}

std::string render_reproduce_html(const SuiteReport& report, const std::string& command) {
  const ReproSuite& s = *report.suite;
  std::ostringstream o;
  o << "<!doctype html><html><head><meta charset=\"utf-8\"><title>Reproducing "
    << html_escape(s.title)
    << "</title><style>body{font-family:sans-serif;max-width:70em;margin:2em auto}"
    << "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em "
       ".5em;vertical-align:top}"
    << ".holds{background:#dfd}.does-not-hold{background:#fdd}.inconclusive{background:#ffd}"
    << ".not-runnable-here{background:#eee}</style></head><body>\n";
  o << "<h1>Reproducing " << html_escape(s.title) << "</h1>\n<p>" << html_escape(s.reference)
    << ". Setting: " << html_escape(s.setting) << "</p>\n";
  o << "<table><tr><th>claim</th><th>statement</th><th>paper's number</th><th>predicate</th>"
    << "<th>ours [95% CI]</th><th>verdict</th><th>scale</th><th>how our setting "
       "differs</th></tr>\n";
  for (size_t i = 0; i < s.claims.size(); ++i) {
    const Claim& cl = s.claims[i];
    const ClaimResult& r = report.results[i];
    std::string cls = verdict_name(r.verdict);
    std::replace(cls.begin(), cls.end(), ' ', '-');
    std::string scale;
    for (const auto& n : r.scale_notes) scale += html_escape(n) + "<br>";
    o << "<tr class=\"" << cls << "\"><td>" << html_escape(cl.id) << "</td><td>"
      << html_escape(cl.statement) << "</td><td>" << html_escape(cl.paper_value) << " ("
      << html_escape(cl.source) << ")</td><td>"
      << (cl.has_predicate ? html_escape(kind_text(cl.predicate)) : "—") << "</td><td>"
      << html_escape(ours_text(r)) << "</td><td><b>" << verdict_name(r.verdict) << "</b><br>"
      << html_escape(r.why) << "</td><td>" << scale << "</td><td>" << html_escape(cl.caveat)
      << "</td></tr>\n";
  }
  o << "</table>\n<p>Command: <code>" << html_escape(command) << "</code></p></body></html>\n";
  return o.str();
}

std::string render_reproduce_summary(const std::vector<SuiteReport>& reports,
                                     const std::string& link_dir) {
  std::ostringstream o;
  Counts total;
  size_t claims = 0;
  o << "| paper | claims | holds | does not hold | inconclusive | not runnable here | page |\n"
    << "|---|---|---|---|---|---|---|\n";
  for (const SuiteReport& r : reports) {
    const Counts c = count(r);
    claims += r.results.size();
    total.holds += c.holds;
    total.not_hold += c.not_hold;
    total.inconclusive += c.inconclusive;
    total.not_runnable += c.not_runnable;
    total.cell_wall_s.insert(c.cell_wall_s.begin(), c.cell_wall_s.end());
    o << "| " << md_cell(r.suite->title) << " | " << r.results.size() << " | " << c.holds << " | "
      << c.not_hold << " | " << c.inconclusive << " | " << c.not_runnable << " | ["
      << r.suite->paper << ".md](" << link_dir << r.suite->paper << ".md) |\n";
  }
  o << "| **all** | " << claims << " | " << total.holds << " | " << total.not_hold << " | "
    << total.inconclusive << " | " << total.not_runnable << " | |\n";
  o << "\n"
    << total.cell_wall_s.size() << " distinct cells evaluated; their compute time as the store "
    << "records it (one run each, whichever machine ran it): " << fmt_seconds(total.wall_s())
    << " s.\n";
  return o.str();
}

std::string replace_marked_block(const std::string& document, const std::string& block,
                                 const std::string& what) {
  const std::string begin = "<!-- reproduce-summary:begin -->";
  const std::string end = "<!-- reproduce-summary:end -->";
  const size_t b = document.find(begin);
  const size_t e = document.find(end);
  KVB_CHECK(b != std::string::npos && e != std::string::npos && b < e, what, ": no '", begin,
            "' ... '", end, "' block to rewrite");
  return document.substr(0, b + begin.size()) + "\n" + block + document.substr(e);
}

}  // namespace kvb
