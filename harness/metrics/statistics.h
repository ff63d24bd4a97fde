#pragma once
// Honest statistics for comparing a method with the full cache: spread, percentiles and bootstrap
// confidence intervals that are bit-for-bit reproducible from a seed (see the resampling rule
// below). Empty inputs, non-finite values and out-of-range parameters throw kvb::Error: a NaN that
// silently reached a leaderboard would be worse than a failed run.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvb {

// Arithmetic mean, summed in input order.
double mean(const std::vector<double>& values);

// Sample standard deviation (divisor n - 1, Bessel-corrected); 0 for a single value.
double stddev(const std::vector<double>& values);

// Percentile p in [0, 100] by linear interpolation between closest ranks: with the values sorted
// ascending as x[0..n-1], h = (n - 1) p / 100, result = x[floor h] + (h - floor h)(x[floor h + 1] -
// x[floor h]). This is Hyndman & Fan type 7, numpy.percentile's default ("linear") and Excel's
// PERCENTILE.INC. percentile() sorts a copy; percentile_sorted() expects sorted input.
double percentile(std::vector<double> values, double p);
double percentile_sorted(const std::vector<double>& sorted, double p);

// The summary reported for timings (medians and the 10-90 spread rather than mean +- sd, since
// timing distributions are skewed by stragglers). Percentiles as percentile() above.
struct Summary {
  size_t n = 0;
  double mean = 0, stddev = 0, min = 0, p10 = 0, median = 0, p90 = 0, max = 0;
};
Summary summarize(const std::vector<double>& values);

// A point estimate with a bootstrap percentile confidence interval.
struct BootstrapCi {
  double estimate = 0;  // the statistic on the original sample
  double lo = 0;        // lower end of the interval
  double hi = 0;        // upper end
  double confidence = 0.95;
  size_t n = 0;  // sample size
  size_t n_resamples = 0;
  uint64_t seed = 0;
};

// Bootstrap percentile CI of the mean of `values`. The exact procedure, so that anyone can
// reproduce the interval from (values, n_resamples, seed, confidence):
//   rng = std::mt19937_64(seed)
//   for r in 0 .. n_resamples-1:
//     s = 0.0; for j in 0 .. n-1: s += values[uniform_index(rng, n)]   (portable_random.h)
//     means[r] = s / n
//   sort means ascending;
//   lo = percentile_sorted(means, 100 (1 - confidence) / 2), hi = percentile_sorted(means,
//   100 (1 + confidence) / 2)
// estimate = mean(values). n_resamples >= 1; confidence in (0, 1).
BootstrapCi bootstrap_mean_ci(const std::vector<double>& values, size_t n_resamples = 10000,
                              uint64_t seed = 0, double confidence = 0.95);

// Paired bootstrap of the mean difference a - b (e.g. a = a method's per-sample scores, b = the
// full cache's on the same samples). Resamples sample *indices*, keeping pairs together: exactly
// bootstrap_mean_ci over d_i = a_i - b_i, so the same seed gives the same interval. a and b must
// have the same, non-zero size.
BootstrapCi paired_bootstrap(const std::vector<double>& a, const std::vector<double>& b,
                             size_t n_resamples = 10000, uint64_t seed = 0,
                             double confidence = 0.95);

}  // namespace kvb
