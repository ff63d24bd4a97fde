#include "harness/metrics/statistics.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "harness/common/error.h"
#include "harness/metrics/portable_random.h"

namespace kvb {

namespace {

void check_sample(const std::vector<double>& values, const char* what) {
  KVB_CHECK(!values.empty(), what, ": empty sample");
  for (size_t i = 0; i < values.size(); ++i) {
    KVB_CHECK(std::isfinite(values[i]), what, ": value ", i, " is not finite (", values[i], ")");
  }
}

}  // namespace

double mean(const std::vector<double>& values) {
  check_sample(values, "mean");
  double s = 0.0;
  for (double v : values) s += v;
  return s / static_cast<double>(values.size());
}

double stddev(const std::vector<double>& values) {
  double m = mean(values);
  if (values.size() < 2) return 0.0;
  double ss = 0.0;
  for (double v : values) ss += (v - m) * (v - m);
  return std::sqrt(ss / static_cast<double>(values.size() - 1));
}

double percentile_sorted(const std::vector<double>& sorted, double p) {
  check_sample(sorted, "percentile");
  KVB_CHECK(p >= 0.0 && p <= 100.0, "percentile: p = ", p, " is outside [0, 100]");
  const double h = static_cast<double>(sorted.size() - 1) * p / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= sorted.size()) return sorted.back();
  const double frac = h - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return percentile_sorted(values, p);
}

Summary summarize(const std::vector<double>& values) {
  Summary s;
  s.n = values.size();
  s.mean = mean(values);
  s.stddev = stddev(values);
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  s.min = sorted.front();
  s.max = sorted.back();
  s.p10 = percentile_sorted(sorted, 10);
  s.median = percentile_sorted(sorted, 50);
  s.p90 = percentile_sorted(sorted, 90);
  return s;
}

BootstrapCi bootstrap_mean_ci(const std::vector<double>& values, size_t n_resamples, uint64_t seed,
                              double confidence) {
  check_sample(values, "bootstrap");
  KVB_CHECK(n_resamples >= 1, "bootstrap: n_resamples must be at least 1");
  KVB_CHECK(confidence > 0.0 && confidence < 1.0, "bootstrap: confidence ", confidence,
            " is outside (0, 1)");
  const size_t n = values.size();
  std::mt19937_64 rng(seed);
  std::vector<double> means(n_resamples);
  for (size_t r = 0; r < n_resamples; ++r) {
    double s = 0.0;
    for (size_t j = 0; j < n; ++j) s += values[uniform_index(rng, n)];
    means[r] = s / static_cast<double>(n);
  }
  std::sort(means.begin(), means.end());
  BootstrapCi ci;
  ci.estimate = mean(values);
  ci.lo = percentile_sorted(means, 100.0 * (1.0 - confidence) / 2.0);
  ci.hi = percentile_sorted(means, 100.0 * (1.0 + confidence) / 2.0);
  ci.confidence = confidence;
  ci.n = n;
  ci.n_resamples = n_resamples;
  ci.seed = seed;
  return ci;
}

BootstrapCi paired_bootstrap(const std::vector<double>& a, const std::vector<double>& b,
                             size_t n_resamples, uint64_t seed, double confidence) {
  KVB_CHECK(a.size() == b.size(), "paired bootstrap: ", a.size(), " values against ", b.size(),
            " (the samples must be paired)");
  check_sample(a, "paired bootstrap (a)");
  check_sample(b, "paired bootstrap (b)");
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return bootstrap_mean_ci(d, n_resamples, seed, confidence);
}

}  // namespace kvb
