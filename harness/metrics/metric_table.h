#pragma once
// The one table of every metric kvbench reports: name, unit, direction and meaning. Leaderboards,
// plots and the results store read it instead of special-casing metric names.

#include <string_view>
#include <vector>

namespace kvb {

struct MetricInfo {
  std::string_view name;       // as stored in results, e.g. "ttft_ms"
  std::string_view unit;       // "fraction", "nats", "ms", "bytes", ...; "" for a pure number
  std::string_view direction;  // "higher" or "lower": which way is better
  std::string_view doc;        // one sentence: what is measured and how
};

// Every metric, text metrics first, in a fixed order (the order leaderboards list them in).
const std::vector<MetricInfo>& all_metrics();

// The entry for `name`; an unknown name throws kvb::Error with a nearest-name hint.
const MetricInfo& metric_info(std::string_view name);

bool is_known_metric(std::string_view name);

// True when value `a` is strictly better than `b` under the metric's direction.
bool is_better(const MetricInfo& info, double a, double b);

}  // namespace kvb
