#pragma once
// Paired comparison of two runs (two configs in one database, or the same config in two databases,
// e.g. a grid run at two git commits): per-sample metrics over the samples both runs have (same
// index and key), the mean difference B - A with a paired bootstrap interval, and which metrics moved
// beyond it, read as an improvement or a regression by the metric's direction.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/store/results_db.h"

namespace kvb {

struct CompareOptions {
  uint64_t seed = 0;
  size_t n_resamples = 10000;
  double confidence = 0.95;
  double rel_tol = 0;  // a move must also exceed rel_tol x |A| to count
};

struct MetricMove {
  std::string name, unit;
  Direction direction = Direction::kNone;
  double a = 0, b = 0;               // run-level values over the common samples
  double diff = 0, lo = 0, hi = 0;   // B - A and its interval
  size_t n = 0;
  // "regression", "improvement", "changed" (no direction), "unchanged", "no_interval" (n < 2)
  std::string verdict;
};

struct RunComparison {
  RunRow a, b;
  size_t a_samples = 0, b_samples = 0, common = 0;
  std::vector<MetricMove> metrics;
  size_t regressions = 0, improvements = 0;
};

// A run by reference: a run id (all digits, fewer than 6 of them) or a config hash prefix (at least 4
// hex digits). Throws kvb::Error when none or several match.
RunRow find_run_ref(ResultsDb& db, const std::string& ref);

RunComparison compare_runs(ResultsDb& db_a, const RunRow& a, ResultsDb& db_b, const RunRow& b,
                           const CompareOptions& options);

std::string comparison_text(const RunComparison& c, const CompareOptions& options);
nlohmann::json comparison_json(const RunComparison& c);

}  // namespace kvb
