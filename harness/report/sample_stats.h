#pragma once
// Per-sample statistics read back from the results store's `samples` rows, and the paired bootstrap
// of a difference between two runs over their common samples. Used by the leaderboard and compare.
//
// A run-level metric is a ratio of sums over samples, value = f(sum num_i / sum den_i), with f the
// identity or exp (perplexity). That makes a resampled statistic exactly the metric the run stored:
// stream kl_mean = sum of per-token KL / tokens, nll = sum nll / tokens, ppl = exp(nll),
// top1_agreement = agreeing tokens / tokens, bytes_per_token = physical bytes / tokens seen; perf
// decode_tok_s and friends = the per-cell value (den 1), one cell per batch size.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/eval/protocol.h"  // SampleMetricDef
#include "harness/metrics/statistics.h"
#include "harness/store/results_db.h"

namespace kvb {

// The per-sample metrics a protocol's samples support, in display order (its report.sample_metrics;
// the task metrics for a protocol this process does not know).
const std::vector<SampleMetricDef>& sample_metric_defs(const std::string& protocol);
const SampleMetricDef* find_sample_metric(const std::string& protocol, const std::string& name);

struct SampleSums {
  double num = 0, den = 1;
};

// One run's samples: keys and, per source name, each sample's (num, den).
struct RunSamples {
  std::map<int64_t, std::string> keys;                          // sample index -> key
  std::map<std::string, std::map<int64_t, SampleSums>> sums;    // source -> index -> sums
};
RunSamples extract_samples(const std::string& protocol, const std::vector<SampleRow>& rows);

// The run-level value of `def` over the given sample indices (all when empty).
double sample_metric_value(const RunSamples& s, const SampleMetricDef& def);

// Indices present in both runs with equal keys (the pairs a paired comparison uses), ascending.
std::vector<int64_t> common_samples(const RunSamples& a, const RunSamples& b);

// Paired bootstrap of f(sum a.num / sum a.den) - f(sum b.num / sum b.den) over pairs i, resampling
// pair indices exactly as bootstrap_mean_ci does (statistics.h): rng = std::mt19937_64(seed); each
// resample draws n indices with uniform_index(rng, n) and sums both runs' num and den over them;
// the interval is the percentile_sorted of the sorted resampled differences at 100 (1 -+ c) / 2.
// With den = 1 and f = identity it equals paired_bootstrap(a, b) up to rounding. All vectors the
// same non-zero size; throws kvb::Error otherwise or on non-finite input.
struct PairedSums {
  std::vector<double> a_num, a_den, b_num, b_den;
};
BootstrapCi paired_ratio_bootstrap(const PairedSums& x, bool exp_transform, size_t n_resamples,
                                   uint64_t seed, double confidence = 0.95);

// The pairs of `def` over `indices` (from common_samples).
PairedSums paired_sums(const RunSamples& a, const RunSamples& b, const SampleMetricDef& def,
                       const std::vector<int64_t>& indices);

}  // namespace kvb
