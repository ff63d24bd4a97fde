#include "harness/eval/protocol.h"

#include <cstdlib>

#include "harness/common/error.h"
#include "harness/common/params.h"
#include "harness/common/strings.h"
#include "harness/metrics/metric_table.h"

namespace kvb {

std::string Protocol::dataset_label(const nlohmann::json& protocol) const {
  return protocol.contains("dataset") ? protocol.at("dataset").get<std::string>() : "synthetic";
}

int64_t Protocol::expected_samples(const nlohmann::json&) const { return 1; }

void Protocol::check_inputs(const nlohmann::json&, const std::string&, const InputCheck&) const {}

void Protocol::check_model_inputs(const nlohmann::json&, const ModelFacts&, const std::string&,
                                  const InputCheck&) const {}

nlohmann::json Protocol::finish_config(const nlohmann::json&, nlohmann::json resolved) const {
  return resolved;
}

SampleMetricDef table_sample_metric(const std::string& name, const std::string& source,
                                    bool exp_transform) {
  const MetricInfo& m = metric_info(name);
  return {name, std::string(m.unit),
          m.direction == "higher" ? Direction::kHigher : Direction::kLower, source, exp_transform};
}

void Protocol::sample_sums(const nlohmann::json& sample, const SampleSumSink& put) const {
  task_sample_sums(sample, put);
}

std::vector<int64_t> protocol_int_list(const nlohmann::json& protocol, const std::string& key,
                                       const std::string& what, int64_t min, int64_t max) {
  return parse_int_list(protocol.at(key).get<std::string>(), "config.protocol." + key, what, min,
                        max);
}

double sample_number(const nlohmann::json& j, const char* key, double fallback) {
  if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  return fallback;
}

const std::vector<SampleMetricDef>& task_sample_metrics() {
  static const std::vector<SampleMetricDef> v = [] {
    std::vector<SampleMetricDef> out;
    for (const auto& m : all_metrics()) {
      if (m.unit != "fraction") continue;
      out.push_back({std::string(m.name), std::string(m.unit),
                     m.direction == "higher" ? Direction::kHigher : Direction::kLower, "", false});
    }
    return out;
  }();
  return v;
}

void task_sample_sums(const nlohmann::json& j, const SampleSumSink& put) {
  const nlohmann::json& scores = j.contains("scores") && j["scores"].is_object() ? j["scores"] : j;
  for (const auto& d : task_sample_metrics())
    if (scores.contains(d.name) && scores[d.name].is_number())
      put(d.name, scores[d.name].get<double>(), 1);
}

}  // namespace kvb
