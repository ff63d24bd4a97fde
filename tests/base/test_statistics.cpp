// Statistics: textbook values, and bootstrap intervals checked against independent computations.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "harness/metrics/portable_random.h"
#include "harness/metrics/statistics.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

using test::expect_error;

TEST(Statistics, MeanAndSampleStddev) {
  EXPECT_DOUBLE_EQ(mean({1, 2, 3, 4}), 2.5);
  // Sum of squared deviations from 5 is 32; sample variance 32/7.
  EXPECT_NEAR(stddev({2, 4, 4, 4, 5, 5, 7, 9}), std::sqrt(32.0 / 7.0), 1e-12);
  EXPECT_EQ(stddev({3}), 0.0);
  expect_error([] { mean({}); }, {"empty"});
  expect_error([] { mean({1, std::numeric_limits<double>::quiet_NaN()}); }, {"value 1", "finite"});
}

TEST(Statistics, PercentileLinearInterpolation) {
  // numpy.percentile([1, 2, 3, 4], [0, 10, 50, 90, 100]) = [1, 1.3, 2.5, 3.7, 4].
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 10), 1.3);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 37), 7.0);
  expect_error([] { percentile({1, 2}, 101); }, {"101", "[0, 100]"});
  expect_error([] { percentile({}, 50); }, {"empty"});
}

TEST(Statistics, Summary) {
  std::vector<double> v;
  for (int i = 10; i >= 0; --i) v.push_back(i);  // 0..10, reversed
  Summary s = summarize(v);
  EXPECT_EQ(s.n, 11u);
  EXPECT_DOUBLE_EQ(s.mean, 5.0);
  EXPECT_DOUBLE_EQ(s.min, 0.0);
  EXPECT_DOUBLE_EQ(s.max, 10.0);
  EXPECT_DOUBLE_EQ(s.median, 5.0);
  EXPECT_DOUBLE_EQ(s.p10, 1.0);
  EXPECT_DOUBLE_EQ(s.p90, 9.0);
  EXPECT_NEAR(s.stddev, std::sqrt(11.0), 1e-12);  // sum of squares 110 over 10
}

TEST(PortableRandom, UniformIndexIsUnbiasedAndInRange) {
  std::mt19937_64 rng(42);
  std::vector<int> counts(3, 0);
  const int draws = 30000;
  for (int i = 0; i < draws; ++i) ++counts[uniform_index(rng, 3)];
  for (int c : counts) EXPECT_NEAR(c, draws / 3, 400);  // sd ~ 82
  EXPECT_EQ(uniform_index(rng, 1), 0u);
  expect_error([&] { uniform_index(rng, 0); }, {"empty range"});
  for (int i = 0; i < 1000; ++i) {
    double u = uniform_unit(rng);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(Bootstrap, DeterministicUnderSeed) {
  std::vector<double> a = {0.9, 0.4, 0.7, 1.0, 0.3, 0.8, 0.65};
  std::vector<double> b = {0.8, 0.5, 0.7, 0.6, 0.1, 0.8, 0.60};
  BootstrapCi x = paired_bootstrap(a, b, 2000, 7);
  BootstrapCi y = paired_bootstrap(a, b, 2000, 7);
  EXPECT_EQ(x.lo, y.lo);  // bitwise: same seed, same interval
  EXPECT_EQ(x.hi, y.hi);
  BootstrapCi z = paired_bootstrap(a, b, 2000, 8);
  EXPECT_TRUE(z.lo != x.lo || z.hi != x.hi);
  EXPECT_EQ(x.n, 7u);
  EXPECT_EQ(x.n_resamples, 2000u);
  EXPECT_EQ(x.seed, 7u);
}

// Re-derives the documented procedure from scratch (another formula for 2^64 mod n, another
// percentile code path): the library must match it bit for bit, so the header's recipe is the
// truth.
TEST(Bootstrap, MatchesDocumentedProcedure) {
  std::vector<double> d = {0.25, -1.5, 3.0, 0.5, 2.0};
  const size_t n = d.size();
  const size_t resamples = 999;
  std::mt19937_64 rng(12345);
  const uint64_t rejected_below = (std::numeric_limits<uint64_t>::max() % n + 1) % n;  // 2^64 mod n
  std::vector<double> means;
  for (size_t r = 0; r < resamples; ++r) {
    double s = 0;
    for (size_t j = 0; j < n; ++j) {
      uint64_t x;
      do {
        x = rng();
      } while (x < rejected_below);
      s += d[x % n];
    }
    means.push_back(s / n);
  }
  std::sort(means.begin(), means.end());
  auto type7 = [&](double p) {
    double h = static_cast<double>(means.size() - 1) * p / 100.0;
    size_t k = static_cast<size_t>(h);
    return k + 1 < means.size() ? means[k] + (h - k) * (means[k + 1] - means[k]) : means[k];
  };
  BootstrapCi ci = bootstrap_mean_ci(d, resamples, 12345, 0.9);
  EXPECT_EQ(ci.lo, type7(100.0 * (1.0 - 0.9) / 2.0));
  EXPECT_EQ(ci.hi, type7(100.0 * (1.0 + 0.9) / 2.0));
  EXPECT_DOUBLE_EQ(ci.estimate, 0.85);
}

// For 5 pairs the bootstrap distribution of the mean difference is exactly the uniform distribution
// over all 5^5 index tuples: enumerate it, and check that the resampled 95% interval lands between
// the exact 1.5% and 3.5% (resp. 96.5% and 98.5%) quantiles. With 20000 resamples the
// empirical 2.5% point has a standard error of ~0.1 percentage points, so the margin is ~9 standard
// errors.
TEST(Bootstrap, FivePairsAgainstExhaustiveEnumeration) {
  std::vector<double> a = {3, 5, 9, 4, 20};
  std::vector<double> b = {2, 3, 5, -4, 4};  // differences 1, 2, 4, 8, 16
  std::vector<double> d = {1, 2, 4, 8, 16};
  std::vector<double> all;
  for (int i0 = 0; i0 < 5; ++i0)
    for (int i1 = 0; i1 < 5; ++i1)
      for (int i2 = 0; i2 < 5; ++i2)
        for (int i3 = 0; i3 < 5; ++i3)
          for (int i4 = 0; i4 < 5; ++i4) all.push_back((d[i0] + d[i1] + d[i2] + d[i3] + d[i4]) / 5);
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), 3125u);
  auto quantile = [&](double q) { return all[static_cast<size_t>(q * all.size())]; };

  BootstrapCi ci = paired_bootstrap(a, b, 20000, 2024);
  EXPECT_DOUBLE_EQ(ci.estimate, 31.0 / 5.0);
  EXPECT_GE(ci.lo, quantile(0.015));
  EXPECT_LE(ci.lo, quantile(0.035));
  EXPECT_GE(ci.hi, quantile(0.965));
  EXPECT_LE(ci.hi, quantile(0.985));
  EXPECT_LT(ci.lo, ci.estimate);
  EXPECT_GT(ci.hi, ci.estimate);
}

TEST(Bootstrap, AnalyticProperties) {
  std::vector<double> b = {0.25, 1.0, 2.0, 0.5, 4.0, 8.0};
  std::vector<double> a;
  for (double v : b) a.push_back(v + 0.5);  // exact in binary: every difference is exactly 0.5
  BootstrapCi same = paired_bootstrap(a, b, 500, 1);
  EXPECT_EQ(same.estimate, 0.5);
  EXPECT_EQ(same.lo, 0.5);  // zero width when all differences are equal
  EXPECT_EQ(same.hi, 0.5);

  std::vector<double> x = {0.9, 0.4, 0.7, 1.0, 0.3, 0.8, 0.65, 0.2};
  std::vector<double> y = {0.8, 0.5, 0.7, 0.6, 0.1, 0.8, 0.60, 0.4};
  BootstrapCi base = paired_bootstrap(x, y, 3000, 99);
  EXPECT_LE(base.lo, base.estimate);
  EXPECT_GE(base.hi, base.estimate);
  // Shifting b by c shifts the whole interval by -c (the same seed draws the same indices).
  const double c = 0.125;
  std::vector<double> y_shifted;
  for (double v : y) y_shifted.push_back(v + c);
  BootstrapCi shifted = paired_bootstrap(x, y_shifted, 3000, 99);
  EXPECT_NEAR(shifted.estimate, base.estimate - c, 1e-12);
  EXPECT_NEAR(shifted.lo, base.lo - c, 1e-12);
  EXPECT_NEAR(shifted.hi, base.hi - c, 1e-12);
  // A wider confidence level cannot give a narrower interval.
  BootstrapCi wide = paired_bootstrap(x, y, 3000, 99, 0.99);
  EXPECT_LE(wide.lo, base.lo);
  EXPECT_GE(wide.hi, base.hi);
  // The single-mean CI of a constant is that constant.
  BootstrapCi constant = bootstrap_mean_ci({2.5, 2.5, 2.5}, 100, 3);
  EXPECT_EQ(constant.lo, 2.5);
  EXPECT_EQ(constant.hi, 2.5);
}

TEST(Bootstrap, RejectsBadInput) {
  expect_error([] { paired_bootstrap({1, 2}, {1}); }, {"2 values against 1", "paired"});
  expect_error([] { paired_bootstrap({}, {}); }, {"empty"});
  expect_error([] { bootstrap_mean_ci({1, 2}, 0); }, {"n_resamples"});
  expect_error([] { bootstrap_mean_ci({1, 2}, 10, 0, 1.0); }, {"confidence"});
  expect_error(
      [] {
        bootstrap_mean_ci({1, std::numeric_limits<double>::infinity()});
      },
      {"not finite"});
}

}  // namespace
}  // namespace kvb
