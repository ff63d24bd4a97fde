#include "harness/report/compare.h"

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/eval/grid.h"
#include "harness/report/leaderboard.h"
#include "harness/report/sample_stats.h"

namespace kvb {

namespace {

using json = nlohmann::json;

std::string describe(const RunRow& r) {
  std::string method = r.method;
  try {
    method = method_label(parse_json(r.config_json, "run config")["method"]);
  } catch (const std::exception&) {
  }
  return method + " · " + r.model + " · " + r.dataset + " · " + r.protocol;
}

std::string signed_value(double v) { return (v > 0 ? "+" : "") + format_value(v); }

}  // namespace

RunRow find_run_ref(ResultsDb& db, const std::string& ref) {
  KVB_CHECK(!ref.empty(), "run reference: empty");
  const bool digits = ref.find_first_not_of("0123456789") == std::string::npos;
  if (digits && ref.size() < 6) {
    auto r = db.find_run(std::stoll(ref));
    KVB_CHECK(r.has_value(), db.path(), ": no run with id ", ref);
    return *r;
  }
  KVB_CHECK(ref.size() >= 4 && ref.find_first_not_of("0123456789abcdef") == std::string::npos, "run reference '",
            ref, "': expected a run id or a config hash prefix (at least 4 lower-case hex digits)");
  std::vector<RunRow> hits;
  for (const auto& r : db.list_runs())
    if (r.config_hash.compare(0, ref.size(), ref) == 0) hits.push_back(r);
  KVB_CHECK(!hits.empty(), db.path(), ": no run whose config hash starts with ", ref);
  KVB_CHECK(hits.size() == 1, db.path(), ": config hash prefix ", ref, " is ambiguous (", hits.size(),
            " runs); give more digits");
  return hits[0];
}

RunComparison compare_runs(ResultsDb& db_a, const RunRow& a, ResultsDb& db_b, const RunRow& b,
                           const CompareOptions& o) {
  KVB_CHECK(a.protocol == b.protocol, "compare: run ", a.config_hash.substr(0, 12), " is ", a.protocol, " but ",
            b.config_hash.substr(0, 12), " is ", b.protocol, "; only runs of one protocol can be paired");
  RunComparison c;
  c.a = a;
  c.b = b;
  const RunSamples sa = extract_samples(a.protocol, db_a.samples(a.id));
  const RunSamples sb = extract_samples(b.protocol, db_b.samples(b.id));
  c.a_samples = sa.keys.size();
  c.b_samples = sb.keys.size();
  const std::vector<int64_t> common = common_samples(sa, sb);
  c.common = common.size();
  if (common.empty()) return c;
  for (const auto& def : sample_metric_defs(a.protocol)) {
    // B - A: paired_ratio_bootstrap computes first - second.
    PairedSums p = paired_sums(sb, sa, def, common);
    if (p.a_num.empty()) continue;
    MetricMove m;
    m.name = def.name;
    m.unit = def.unit;
    m.direction = def.direction;
    m.n = p.a_num.size();
    auto value = [&](const std::vector<double>& num, const std::vector<double>& den) {
      double n = 0, d = 0;
      for (size_t i = 0; i < num.size(); ++i) {
        n += num[i];
        d += den[i];
      }
      return def.exp_transform ? std::exp(n / d) : n / d;
    };
    m.b = value(p.a_num, p.a_den);
    m.a = value(p.b_num, p.b_den);
    BootstrapCi ci = paired_ratio_bootstrap(p, def.exp_transform, o.n_resamples, o.seed, o.confidence);
    m.diff = ci.estimate;
    m.lo = ci.lo;
    m.hi = ci.hi;
    const double tol = o.rel_tol * std::abs(m.a);
    if (m.n < 2) {
      m.verdict = "no_interval";
    } else if (m.lo > 0 && std::abs(m.diff) > tol) {
      m.verdict = m.direction == Direction::kHigher ? "improvement"
                  : m.direction == Direction::kLower ? "regression"
                                                     : "changed";
    } else if (m.hi < 0 && std::abs(m.diff) > tol) {
      m.verdict = m.direction == Direction::kHigher ? "regression"
                  : m.direction == Direction::kLower ? "improvement"
                                                     : "changed";
    } else {
      m.verdict = "unchanged";
    }
    if (m.verdict == "regression") c.regressions++;
    if (m.verdict == "improvement") c.improvements++;
    c.metrics.push_back(m);
  }
  return c;
}

std::string comparison_text(const RunComparison& c, const CompareOptions& o) {
  std::ostringstream s;
  s << "A: " << c.a.config_hash.substr(0, 12) << "  run " << c.a.id << "  " << describe(c.a) << "  ["
    << to_string(c.a.status) << "]\n";
  s << "B: " << c.b.config_hash.substr(0, 12) << "  run " << c.b.id << "  " << describe(c.b) << "  ["
    << to_string(c.b.status) << "]\n";
  s << "common samples: " << c.common << " (A has " << c.a_samples << ", B has " << c.b_samples
    << "; paired by index and key)";
  if (c.common == 0) {
    s << "\nnothing to compare: the runs share no samples\n";
    return s.str();
  }
  s << "; B − A with " << static_cast<int>(std::lround(o.confidence * 100)) << "% paired bootstrap CI ("
    << o.n_resamples << " resamples, seed " << o.seed << ")\n";
  s << std::left << std::setw(18) << "metric" << std::setw(13) << "unit" << std::right << std::setw(11) << "A"
    << std::setw(11) << "B" << std::setw(12) << "B − A" << "   " << std::left << std::setw(26) << "95% CI"
    << "verdict\n";
  for (const auto& m : c.metrics) {
    const std::string ci = m.verdict == "no_interval" ? "(n < 2)" : "[" + signed_value(m.lo) + ", " + signed_value(m.hi) + "]";
    std::string verdict = m.verdict == "regression" ? "REGRESSION" : m.verdict == "no_interval" ? "" : m.verdict;
    s << std::left << std::setw(18) << m.name << std::setw(13) << (m.unit.empty() ? "-" : m.unit) << std::right
      << std::setw(11) << format_value(m.a) << std::setw(11) << format_value(m.b) << std::setw(12)
      << signed_value(m.diff) << "   " << std::left << std::setw(26) << ci << verdict << "\n";
  }
  s << c.regressions << " regression(s), " << c.improvements << " improvement(s) beyond the interval\n";
  return s.str();
}

json comparison_json(const RunComparison& c) {
  json metrics = json::array();
  for (const auto& m : c.metrics)
    metrics.push_back({{"name", m.name},
                       {"unit", m.unit},
                       {"direction", to_string(m.direction)},
                       {"a", m.a},
                       {"b", m.b},
                       {"diff", m.diff},
                       {"lo", m.lo},
                       {"hi", m.hi},
                       {"n", m.n},
                       {"verdict", m.verdict}});
  return {{"a", {{"config_hash", c.a.config_hash}, {"run_id", c.a.id}, {"label", describe(c.a)}, {"status", to_string(c.a.status)}}},
          {"b", {{"config_hash", c.b.config_hash}, {"run_id", c.b.id}, {"label", describe(c.b)}, {"status", to_string(c.b.status)}}},
          {"a_samples", c.a_samples},
          {"b_samples", c.b_samples},
          {"common_samples", c.common},
          {"metrics", metrics},
          {"regressions", c.regressions},
          {"improvements", c.improvements}};
}

}  // namespace kvb
