// The ledger's simulated flag: full-size payload behind a small logical size is simulated; real
// metadata that eats the savings is not.

#include <gtest/gtest.h>

#include "harness/eval/ledger.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

TEST(Ledger, SimulatedMeansFullPayloadBehindASmallLogicalSize) {
  LedgerEntry e;
  e.baseline_bytes = 1000;
  e.fp.logical_bytes = 250;
  e.fp.device_payload_bytes = 1000;  // a mask over a full buffer
  EXPECT_TRUE(looks_simulated(e));
  e.fp.device_payload_bytes = 250;
  e.fp.device_metadata_bytes = 700;  // a sketch / buckets: physical, just costly
  EXPECT_FALSE(looks_simulated(e));
  e.fp.logical_bytes = 1000;  // nothing claimed
  e.fp.device_payload_bytes = 1000;
  EXPECT_FALSE(looks_simulated(e));
}

// NaN when absent (these tests check that a metric is left out).
double metric_or_nan(const std::vector<Metric>& ms, const std::string& name) {
  for (const auto& m : ms)
    if (m.name == name && !m.layer) return m.value;
  return NAN;
}

TEST(Ledger, SixteenBitBytesRescaleOnlyTheModelDtypeRows) {
  LedgerEntry e;
  e.tokens_seen = 100;
  e.baseline_bytes = 4000;        // fp32
  e.baseline_bytes_16bit = 2000;
  e.fp.device_payload_bytes = 1500;  // 1,000 bytes of fp32 rows + 500 of codes
  e.fp.model_dtype_device_bytes = 1000;
  e.fp.host_bytes = 400;  // fp32 rows on the host
  e.fp.model_dtype_host_bytes = 400;
  EXPECT_DOUBLE_EQ(physical_bytes_16bit(e), 1900 - 700);
  const auto m = ledger_metrics({e}, false);
  EXPECT_DOUBLE_EQ(metric_or_nan(m, "compression_ratio_16bit"), 2000.0 / 1200);
  EXPECT_DOUBLE_EQ(metric_or_nan(m, "device_compression_ratio_16bit"), 2000.0 / 1000);
  EXPECT_DOUBLE_EQ(metric_or_nan(m, "bytes_per_token_16bit"), 12.0);
  // Round trip through a sample row; a row from before the fields existed has no 16-bit figures.
  const LedgerEntry back = ledger_from_json(ledger_to_json(e));
  EXPECT_DOUBLE_EQ(physical_bytes_16bit(back), 1200);
  nlohmann::json old = ledger_to_json(e);
  old.erase("baseline_bytes_16bit");
  old.erase("model_dtype_device_bytes");
  EXPECT_LT(physical_bytes_16bit(ledger_from_json(old)), 0);
  EXPECT_TRUE(std::isnan(metric_or_nan(ledger_metrics({ledger_from_json(old)}, false), "compression_ratio_16bit")));
}

TEST(Ledger, SampleRowHoldsEveryFieldAndRefusesARowWithoutARequiredOne) {
  LedgerEntry e;
  int64_t next = 1;  // every field a different value, so that no two can be swapped unseen
  for (int64_t* x : {&e.tokens_seen, &e.baseline_bytes, &e.baseline_bytes_16bit,
                     &e.fp.device_payload_bytes, &e.fp.device_metadata_bytes,
                     &e.fp.device_index_bytes, &e.fp.device_reserved_bytes, &e.fp.host_bytes,
                     &e.fp.remote_bytes, &e.fp.logical_bytes, &e.fp.tokens_held,
                     &e.fp.model_dtype_device_bytes, &e.fp.model_dtype_host_bytes})
    *x = next++;
  const nlohmann::json j = ledger_to_json(e);
  EXPECT_EQ(j.size(), 13u);
  EXPECT_EQ(j.at("tokens_seen"), 1);
  EXPECT_EQ(j.at("model_dtype_host_bytes"), 13);
  EXPECT_EQ(ledger_to_json(ledger_from_json(j)), j);
  nlohmann::json old = j;
  old.erase("model_dtype_host_bytes");  // read as 0 from a row written before it existed
  EXPECT_EQ(ledger_from_json(old).fp.model_dtype_host_bytes, 0);
  nlohmann::json broken = j;
  broken.erase("host_bytes");
  EXPECT_ANY_THROW(ledger_from_json(broken));
}

// On the fp32 CPU path: the full cache is 1x at 16 bits as at 32; KIVI-2's codes and fp16 residual
// are fixed-width, so its ratio against a 16-bit baseline is half the fp32 one; SnapKV keeps dense
// rows, so its ratio barely moves.
TEST(Ledger, SixteenBitRatiosOnRealStores) {
  auto model = test::stories260k();
  std::string hash;
  auto w = stream_windows(model->tokenizer_path,
                          {{"dataset", "tinystories-valid-sample"}, {"window", 320}, {"stride", 0}, {"max_windows", 1}},
                          test::data_dir(), &hash);
  StreamOptions so;
  so.prefill_tokens = 256;
  auto ratios = [&](const std::string& method, const nlohmann::json& params) {
    const auto r = run_stream_sample(model, method, params, w.at(0).tokens, so);
    const auto m = ledger_metrics({ledger_from_json(ledger_to_json(r.ledger))}, false);
    return std::make_pair(metric_or_nan(m, "compression_ratio"), metric_or_nan(m, "compression_ratio_16bit"));
  };
  const auto full = ratios("full", nlohmann::json::object());
  EXPECT_NEAR(full.first, 1.0, 1e-9);
  EXPECT_NEAR(full.second, 1.0, 1e-9);
  const auto kivi = ratios("kivi", {{"preset", "kivi-2"}});
  EXPECT_GT(kivi.first, 2.0);
  EXPECT_NEAR(kivi.second, kivi.first / 2, 1e-9);
  const auto snap = ratios("snapkv", {{"budget", 0.25}});
  EXPECT_GT(snap.first, 2.0);
  // Its 4-byte entry indices do not halve: with stories260K's head_dim 8 they are 1/17 of an fp32
  // entry's bytes, 1/9 at 16 bits (measured 2.36x -> 2.23x).
  EXPECT_LT(snap.second, snap.first);
  EXPECT_GT(snap.second, 0.9 * snap.first);
}

}  // namespace
}  // namespace kvb
