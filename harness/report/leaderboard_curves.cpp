#include "harness/report/leaderboard_curves.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "harness/common/strings.h"
#include "harness/kv/baseline_method.h"
#include "harness/report/leaderboard.h"
#include "harness/report/sample_stats.h"
#include "harness/store/config_hash.h"

namespace kvb {

double metric_or_nan(const std::map<std::string, double>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? NAN : it->second;
}

namespace {

using json = nlohmann::json;

std::string param_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

const char* const kHeadroomFloorMethod = "streaming_llm";
const char* const kHeadroomQuantFloorMethod = "pertoken";

double equivalent_bits_of(const std::string& method, const json& p) {
  if (!p.is_object()) return NAN;
  auto num = [&](const char* k) {
    return p.contains(k) && p[k].is_number() ? p[k].get<double>() : NAN;
  };
  if (method == "oracle_quant") return num("bits");
  if (method == "pertoken") return 0.5 * (num("k_bits") + num("v_bits"));
  if (method == "kivi") {
    const std::string preset = p.value("preset", "none");
    if (preset == "kivi-2") return 2;
    if (preset == "kivi-4") return 4;
    return 0.5 * (num("k_bits") + num("v_bits"));
  }
  if (method != "kvtuner") return NAN;
  // "KV4" or "K4V2,KV8,...": the mean over the listed layers (one pair = every layer). A config
  // file's pairs are not in the params: NaN.
  if (!p.value("config", std::string()).empty() || !p.contains("pairs") || !p["pairs"].is_string())
    return NAN;
  const std::string pairs = p["pairs"];
  double sum = 0;
  int n = 0;
  for (size_t at = 0; at <= pairs.size(); ++n) {
    size_t end = pairs.find(',', at);
    if (end == std::string::npos) end = pairs.size();
    std::string t = pairs.substr(at, end - at);
    t.erase(0, t.find_first_not_of(' '));
    t.erase(t.find_last_not_of(' ') + 1);
    int k = 0, v = 0;
    char rest = 0;
    if (std::sscanf(t.c_str(), "KV%d%c", &k, &rest) == 1)
      v = k;
    else if (std::sscanf(t.c_str(), "K%dV%d%c", &k, &v, &rest) != 2)
      return NAN;
    sum += 0.5 * (k + v);
    at = end + 1;
  }
  return n ? sum / n : NAN;
}

double headroom_value(double value, double floor, double oracle) {
  if (!std::isfinite(value) || !std::isfinite(floor) || !std::isfinite(oracle) || oracle == floor)
    return NAN;
  const double h = (value - floor) / (oracle - floor);
  return h == 0 ? 0.0 : h;  // the floor's own row: 0, not -0 (lower-is-better divides by < 0)
}

namespace {

constexpr const char* kBitsUnit = "equivalent_bits";

// The row's budget as "value|unit": its numeric `budget`, else a quantizer's equivalent bits
// ("value|equivalent_bits"); "" for neither.
std::string budget_key(const LeaderRow& r) {
  char buf[40];
  if (!r.params.is_object() || !r.params.contains("budget") || !r.params["budget"].is_number()) {
    const double bits = equivalent_bits_of(r.method, r.params);
    if (!std::isfinite(bits)) return "";
    std::snprintf(buf, sizeof buf, "%.17g", bits);
    return std::string(buf) + "|" + kBitsUnit;
  }
  const json unit = r.params.value("budget_unit", json("ratio"));
  std::snprintf(buf, sizeof buf, "%.17g", r.params["budget"].get<double>());
  return std::string(buf) + "|" + param_text(unit);
}

// The floor's method at a budget key: pertoken at equivalent bits, else streaming_llm.
const char* floor_method(const std::string& key) {
  const std::string suffix = std::string("|") + kBitsUnit;
  const bool bits = key.size() > suffix.size() &&
                    key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
  return bits ? kHeadroomQuantFloorMethod : kHeadroomFloorMethod;
}

}  // namespace

void set_headroom(LeaderTable& t) {
  const bool higher = t.direction == Direction::kHigher;
  std::map<std::string, double> oracle, floor;  // by budget key
  for (const auto& r : t.rows) {
    const std::string key = budget_key(r);
    if (r.status != "done" || key.empty() || !std::isfinite(r.value)) continue;
    if (r.oracle) {
      auto [it, fresh] = oracle.emplace(key, r.value);
      if (!fresh && (higher ? r.value > it->second : r.value < it->second)) it->second = r.value;
    } else if (r.method == floor_method(key)) {
      auto [it, fresh] = floor.emplace(key, r.value);
      if (!fresh && (higher ? r.value < it->second : r.value > it->second)) it->second = r.value;
    }
  }
  for (auto& r : t.rows) {
    r.headroom = NAN;
    const std::string key = budget_key(r);
    if (r.status != "done" || r.oracle || key.empty()) continue;
    auto o = oracle.find(key);
    auto f = floor.find(key);
    if (o == oracle.end() || f == floor.end()) continue;
    r.headroom = headroom_value(r.value, f->second, o->second);
  }
}

double curve_auc(double full_value, const std::vector<CurvePoint>& points, double range) {
  if (!std::isfinite(full_value) || !(range > 0) || points.empty()) return NAN;
  std::vector<std::pair<double, double>> xy = {{0.0, full_value}};
  for (const auto& p : points) xy.push_back({p.compression, p.value});
  std::stable_sort(xy.begin(), xy.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (xy.back().first < range * (1 - 1e-12)) return NAN;  // the curve does not reach the range
  auto at = [](const std::pair<double, double>& a, const std::pair<double, double>& b, double x) {
    if (b.first == a.first) return b.second;
    return a.second + (b.second - a.second) * (x - a.first) / (b.first - a.first);
  };
  double area = 0;
  for (size_t i = 0; i + 1 < xy.size(); ++i) {
    const double x0 = std::max(xy[i].first, 0.0), x1 = std::min(xy[i + 1].first, range);
    if (x1 <= x0) continue;
    area += 0.5 * (at(xy[i], xy[i + 1], x0) + at(xy[i], xy[i + 1], x1)) * (x1 - x0);
  }
  return area / range;
}

double max_compression_within(double full_value, double tolerance, bool higher_is_better,
                              const std::vector<CurvePoint>& points) {
  if (!std::isfinite(full_value)) return NAN;
  double best = NAN;
  for (const auto& p : points) {
    const bool ok = higher_is_better ? p.value >= full_value - tolerance : p.value <= full_value + tolerance;
    if (ok && (!std::isfinite(best) || p.compression > best)) best = p.compression;
  }
  return best;
}

std::string reproduce_command(const json& config) {
  return "cat > run.json <<'EOF'\n" + canonical_json(config) + "\nEOF\nkvbench run -c run.json";
}

LeaderCurves build_curves(const LeaderTable& t) {
  const std::string reference_method = baseline_method();
  LeaderCurves lc;
  lc.reference_bytes = NAN;
  lc.full_value = NAN;
  for (const auto& r : t.rows)
    if (r.status == "done" && r.method == reference_method && std::isfinite(r.value)) {
      lc.reference_bytes = r.bytes_per_token;
      lc.full_value = r.value;
      break;
    }
  // The unit as the metric table or the stored metric gives it, else as the protocol's per-sample
  // definition does (qa stores accuracy without a unit; its samples define it as a fraction).
  std::string unit = t.unit;
  if (unit.empty())
    if (const SampleMetricDef* def = find_sample_metric(t.protocol, t.metric)) unit = def->unit;
  lc.fraction_metric = unit == "fraction";
  lc.tolerance = lc.fraction_metric ? 0.01 : std::isfinite(lc.full_value) ? 0.01 * std::abs(lc.full_value) : NAN;

  // One curve per method and its params other than `budget`, in the order of first appearance.
  std::map<std::string, size_t> index;
  for (const auto& r : t.rows) {
    if (r.status != "done" || !std::isfinite(r.value) || !std::isfinite(r.bytes_per_token)) continue;
    const double reference = std::isfinite(lc.reference_bytes) && lc.reference_bytes > 0
                                 ? lc.reference_bytes
                                 : r.bytes_per_token * r.compression_ratio;
    if (!std::isfinite(reference) || reference <= 0) continue;
    json fixed = r.params.is_object() ? r.params : json::object();
    CurvePoint p;
    p.budget = fixed.contains("budget") && fixed["budget"].is_number() ? fixed["budget"].get<double>() : NAN;
    fixed.erase("budget");
    p.compression = 1 - r.bytes_per_token / reference;
    p.value = r.value;
    p.label = r.label;
    p.config_hash = r.config_hash;
    p.run_id = r.run_id;
    p.config = r.config;
    const std::string key = r.method + "\n" + canonical_json(fixed);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, lc.curves.size()).first;
      MethodCurve c;
      c.method = r.method;
      c.params = fixed;
      c.baseline = r.method == reference_method;
      lc.curves.push_back(std::move(c));
    }
    MethodCurve& c = lc.curves[it->second];
    c.simulated = c.simulated || r.simulated;
    c.points.push_back(std::move(p));
  }

  // Names: the method, plus the fixed params that tell its curves apart.
  std::map<std::string, std::vector<MethodCurve*>> by_method;
  for (auto& c : lc.curves) by_method[c.method].push_back(&c);
  for (auto& [m, cs] : by_method) {
    std::set<std::string> keys;
    for (const MethodCurve* c : cs)
      for (auto it = c->params.begin(); it != c->params.end(); ++it) keys.insert(it.key());
    std::vector<std::string> differing;
    for (const auto& k : keys) {
      std::set<std::string> vals;
      for (const MethodCurve* c : cs) vals.insert(c->params.contains(k) ? c->params[k].dump() : "");
      if (vals.size() > 1) differing.push_back(k);
    }
    for (MethodCurve* c : cs) {
      std::vector<std::string> parts;
      for (const auto& k : differing)
        if (c->params.contains(k)) parts.push_back(k + "=" + param_text(c->params[k]));
      c->name = parts.empty() ? m : m + "(" + join(parts, ", ") + ")";
    }
  }
  std::stable_sort(lc.curves.begin(), lc.curves.end(), [](const MethodCurve& a, const MethodCurve& b) {
    if (a.baseline != b.baseline) return a.baseline;
    return a.name < b.name;
  });

  double range = INFINITY;
  bool any = false;
  for (auto& c : lc.curves) {
    std::stable_sort(c.points.begin(), c.points.end(),
                     [](const CurvePoint& a, const CurvePoint& b) { return a.compression < b.compression; });
    if (c.baseline || c.points.size() < 2) continue;
    any = true;
    range = std::min(range, c.points.back().compression);
  }
  lc.auc_range = any ? range : NAN;
  for (auto& c : lc.curves) {
    c.max_compression_within_1pt =
        max_compression_within(lc.full_value, lc.tolerance, t.direction == Direction::kHigher, c.points);
    c.auc = c.baseline ? (std::isfinite(lc.full_value) && lc.auc_range > 0 ? lc.full_value : NAN)
                       : curve_auc(lc.full_value, c.points, lc.auc_range);
  }
  return lc;
}

}  // namespace kvb
