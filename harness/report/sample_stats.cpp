#include "harness/report/sample_stats.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/eval/protocol_registry.h"
#include "harness/metrics/metric_table.h"
#include "harness/metrics/portable_random.h"

namespace kvb {

using json = nlohmann::json;

const std::vector<SampleMetricDef>& sample_metric_defs(const std::string& protocol) {
  const std::vector<SampleMetricDef>& own = ProtocolRegistry::instance().report(protocol).sample_metrics;
  return own.empty() ? task_sample_metrics() : own;
}

const SampleMetricDef* find_sample_metric(const std::string& protocol, const std::string& name) {
  for (const auto& d : sample_metric_defs(protocol))
    if (d.name == name) return &d;
  return nullptr;
}

RunSamples extract_samples(const std::string& protocol, const std::vector<SampleRow>& rows) {
  const ProtocolRegistry& registry = ProtocolRegistry::instance();
  const Protocol* known = registry.has(protocol) ? &registry.get(protocol) : nullptr;
  RunSamples out;
  for (const auto& row : rows) {
    json j;
    // The store validates JSON; be lenient with foreign files (but never recurse into deep nesting).
    if (!parse_json_if_valid(row.output_json, "sample output", &j)) continue;
    out.keys[row.index] = row.key;
    auto put = [&](const std::string& name, double num, double den) {
      if (std::isfinite(num) && std::isfinite(den) && den > 0) out.sums[name][row.index] = {num, den};
    };
    if (known) known->sample_sums(j, put);
    else task_sample_sums(j, put);
    if (j.contains("ledger") && j["ledger"].is_object()) {
      const json& l = j["ledger"];
      const double phys = sample_number(l, "device_payload_bytes") + sample_number(l, "device_metadata_bytes") +
                          sample_number(l, "device_index_bytes") + sample_number(l, "host_bytes") +
                          sample_number(l, "remote_bytes");
      put("bytes_per_token", phys, sample_number(l, "tokens_seen"));
    }
  }
  return out;
}

double sample_metric_value(const RunSamples& s, const SampleMetricDef& def) {
  const std::string src = def.source.empty() ? def.name : def.source;
  auto it = s.sums.find(src);
  if (it == s.sums.end() || it->second.empty()) return NAN;
  double num = 0, den = 0;
  for (const auto& [i, x] : it->second) {
    num += x.num;
    den += x.den;
  }
  const double r = num / den;
  return def.exp_transform ? std::exp(r) : r;
}

std::vector<int64_t> common_samples(const RunSamples& a, const RunSamples& b) {
  std::vector<int64_t> out;
  for (const auto& [i, key] : a.keys) {
    auto it = b.keys.find(i);
    if (it != b.keys.end() && it->second == key) out.push_back(i);
  }
  return out;
}

PairedSums paired_sums(const RunSamples& a, const RunSamples& b, const SampleMetricDef& def,
                       const std::vector<int64_t>& indices) {
  const std::string src = def.source.empty() ? def.name : def.source;
  PairedSums p;
  auto ia = a.sums.find(src), ib = b.sums.find(src);
  if (ia == a.sums.end() || ib == b.sums.end()) return p;
  for (int64_t i : indices) {
    auto xa = ia->second.find(i), xb = ib->second.find(i);
    if (xa == ia->second.end() || xb == ib->second.end()) continue;
    p.a_num.push_back(xa->second.num);
    p.a_den.push_back(xa->second.den);
    p.b_num.push_back(xb->second.num);
    p.b_den.push_back(xb->second.den);
  }
  return p;
}

BootstrapCi paired_ratio_bootstrap(const PairedSums& x, bool exp_transform, size_t n_resamples,
                                   uint64_t seed, double confidence) {
  const size_t n = x.a_num.size();
  KVB_CHECK(n > 0, "paired bootstrap: no pairs");
  KVB_CHECK(x.a_den.size() == n && x.b_num.size() == n && x.b_den.size() == n,
            "paired bootstrap: unequal pair vectors");
  KVB_CHECK(n_resamples >= 1, "paired bootstrap: n_resamples must be at least 1");
  KVB_CHECK(confidence > 0.0 && confidence < 1.0, "paired bootstrap: confidence ", confidence,
            " is outside (0, 1)");
  for (size_t i = 0; i < n; ++i)
    KVB_CHECK(std::isfinite(x.a_num[i]) && std::isfinite(x.a_den[i]) && std::isfinite(x.b_num[i]) &&
                  std::isfinite(x.b_den[i]),
              "paired bootstrap: non-finite value at pair ", i);
  auto f = [&](double num, double den) {
    const double r = num / den;
    return exp_transform ? std::exp(r) : r;
  };
  double an = 0, ad = 0, bn = 0, bd = 0;
  for (size_t i = 0; i < n; ++i) {
    an += x.a_num[i];
    ad += x.a_den[i];
    bn += x.b_num[i];
    bd += x.b_den[i];
  }
  BootstrapCi ci;
  ci.estimate = f(an, ad) - f(bn, bd);
  std::mt19937_64 rng(seed);
  std::vector<double> stats(n_resamples);
  for (size_t r = 0; r < n_resamples; ++r) {
    double san = 0, sad = 0, sbn = 0, sbd = 0;
    for (size_t j = 0; j < n; ++j) {
      const size_t i = static_cast<size_t>(uniform_index(rng, n));
      san += x.a_num[i];
      sad += x.a_den[i];
      sbn += x.b_num[i];
      sbd += x.b_den[i];
    }
    stats[r] = f(san, sad) - f(sbn, sbd);
  }
  std::sort(stats.begin(), stats.end());
  ci.lo = percentile_sorted(stats, 100.0 * (1.0 - confidence) / 2.0);
  ci.hi = percentile_sorted(stats, 100.0 * (1.0 + confidence) / 2.0);
  ci.confidence = confidence;
  ci.n = n;
  ci.n_resamples = n_resamples;
  ci.seed = seed;
  return ci;
}

}  // namespace kvb
