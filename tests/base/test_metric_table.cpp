// The metric table: complete, consistent, and lookups fail helpfully.

#include <gtest/gtest.h>

#include <iterator>
#include <set>
#include <string>

#include "harness/metrics/metric_table.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

TEST(MetricTable, EntriesAreWellFormed) {
  std::set<std::string_view> names;
  for (const MetricInfo& m : all_metrics()) {
    EXPECT_TRUE(names.insert(m.name).second) << "duplicate metric " << m.name;
    EXPECT_TRUE(m.direction == "higher" || m.direction == "lower") << m.name;
    EXPECT_FALSE(m.doc.empty()) << m.name;
    EXPECT_EQ(&metric_info(m.name), &m);
  }
}

TEST(MetricTable, HarnessMetricsArePresent) {
  struct Expected {
    const char* name;
    const char* unit;
    const char* direction;
  };
  const Expected expected[] = {
      {"nll", "nats/token", "lower"},
      {"ppl", "", "lower"},
      {"kl_mean", "nats", "lower"},
      {"kl_p50", "nats", "lower"},
      {"kl_p90", "nats", "lower"},
      {"kl_p99", "nats", "lower"},
      {"kl_max", "nats", "lower"},
      {"top1_agreement", "fraction", "higher"},
      {"mean_abs_dprob", "probability", "lower"},
      {"prefill_tok_s", "tokens/s", "higher"},
      {"decode_tok_s", "tokens/s", "higher"},
      {"ttft_ms", "ms", "lower"},
      {"tpot_ms", "ms", "lower"},
      {"physical_bytes", "bytes", "lower"},
      {"logical_bytes", "bytes", "lower"},
      {"baseline_bytes", "bytes", "lower"},
      {"compression_ratio", "x", "higher"},
      {"bytes_per_token", "bytes/token", "lower"},
      {"compression_ratio_16bit", "x", "higher"},
      {"bytes_per_token_16bit", "bytes/token", "lower"},
      {"peak_memory_bytes", "bytes", "lower"},
      {"serve_slo_attainment", "fraction", "higher"},
      {"serve_output_tok_s", "tokens/s", "higher"},
      {"serve_ttft_ms_p50", "ms", "lower"},
      {"serve_ttft_ms_p90", "ms", "lower"},
      {"serve_ttft_ms_p99", "ms", "lower"},
      {"serve_tpot_ms_p50", "ms", "lower"},
      {"serve_tpot_ms_p99", "ms", "lower"},
      {"serve_prefix_hit_rate", "fraction", "higher"},
      {"serve_mean_running", "requests", "higher"},
      {"serve_allocator_waste", "fraction", "lower"},
      {"serve_preemptions", "", "lower"},
      {"serve_load_imbalance", "x", "lower"},
  };
  for (const auto& e : expected) {
    ASSERT_TRUE(is_known_metric(e.name)) << e.name;
    EXPECT_EQ(metric_info(e.name).unit, e.unit) << e.name;
    EXPECT_EQ(metric_info(e.name).direction, e.direction) << e.name;
  }
  EXPECT_EQ(all_metrics().size(), 10u + std::size(expected));  // 10 text metrics
}

TEST(MetricTable, UnknownNameHints) {
  EXPECT_FALSE(is_known_metric("ttft"));
  test::expect_error([] { metric_info("ttft_sm"); },
                     {"unknown metric 'ttft_sm'", "did you mean 'ttft_ms'"});
  test::expect_error([] { metric_info("ttft"); }, {"unknown metric 'ttft'", "known: ", "ttft_ms"});
  test::expect_error([] { metric_info("zzzzzzzzzzzz"); }, {"unknown metric"});
}

TEST(MetricTable, IsBetterFollowsDirection) {
  EXPECT_TRUE(is_better(metric_info("qa_f1"), 0.6, 0.5));
  EXPECT_FALSE(is_better(metric_info("qa_f1"), 0.5, 0.5));
  EXPECT_TRUE(is_better(metric_info("ttft_ms"), 10.0, 12.0));
  EXPECT_FALSE(is_better(metric_info("ttft_ms"), 12.0, 10.0));
}

}  // namespace
}  // namespace kvb
