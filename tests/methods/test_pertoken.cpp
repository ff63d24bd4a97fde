// pertoken on stories260K: every token is encoded on arrival (no residual), the ledger equals the
// closed form and b + 32/head_dim bits, fidelity falls with bits, and a residual window stays
// exact.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "methods/common/codec_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(nlohmann::json params) {
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device, test::stories260k()->dtype};
  return MethodRegistry::instance().create("pertoken", ctx, params);
}

std::vector<int64_t> prompt(int64_t n) {
  std::vector<int64_t> p = {1};
  for (int64_t i = 1; i < n; ++i) p.push_back(3 + (i * 53) % 500);
  return p;
}

TEST(PerToken, LedgerIsExactAndEveryTokenIsEncoded) {
  const auto& c = test::stories260k()->config;
  for (int bits : {2, 3, 4, 8}) {
    Engine e(test::stories260k(), make({{"k_bits", bits}, {"v_bits", bits}}));
    int64_t s = e.new_sequence();
    e.prefill({s}, {prompt(37)});
    e.decode({s}, {9});
    auto& kv = dynamic_cast<CodecKvCache&>(e.kv());
    CodecBytes want;
    for (int l = 0; l < c.n_layers; ++l)
      for (KvKind k : {KvKind::kKey, KvKind::kValue})
        want += kv.codec().expected_bytes(k, l, c.kv_dim(), 38);
    Footprint f = kv.footprint();
    EXPECT_EQ(f.device_payload_bytes, want.payload_bytes());
    EXPECT_EQ(f.device_payload_bytes, want.code_bytes);  // no residual: codes only
    EXPECT_EQ(f.device_metadata_bytes, want.metadata_bytes);
    // One group per head and token (group = head_dim = 8): b + 4 bits per element, measured.
    auto ctr = kv.counters();
    EXPECT_DOUBLE_EQ(ctr["effective_bits_per_element"], bits + 32.0 / c.head_dim) << bits;
    EXPECT_DOUBLE_EQ(ctr["full_precision_fraction"], 0.0);
    EXPECT_EQ(ctr["k_group_size"], c.head_dim);
  }
}

TEST(PerToken, FidelityFallsWithBitsAndResidualIsExact) {
  // A prefill chunk attends itself exactly, so the quantized cache shows in the decode steps.
  auto trace = [](std::unique_ptr<KvCache> kv) {
    Engine e(test::stories260k(), std::move(kv));
    int64_t s = e.new_sequence();
    e.prefill({s}, {prompt(20)});
    std::vector<at::Tensor> rows;
    for (int i = 0; i < 40; ++i) rows.push_back(e.decode({s}, {3 + (i * 29) % 500}).clone());
    return at::cat(rows);
  };
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device, test::stories260k()->dtype};
  at::Tensor full = trace(MethodRegistry::instance().create("full", ctx, nlohmann::json::object()));
  double prev = 0;
  for (int bits : {8, 4, 2}) {
    at::Tensor t = trace(make({{"k_bits", bits}, {"v_bits", bits}}));
    const double err =
        (at::log_softmax(t, -1) - at::log_softmax(full, -1)).abs().mean().item<double>();
    RecordProperty("logprob_err_" + std::to_string(bits), std::to_string(err));
    EXPECT_GT(err, prev) << bits;
    prev = err;
  }
  // A residual as long as the sequence (fp32) leaves nothing encoded: the full cache's logits.
  at::Tensor r = trace(make({{"residual_length", 64}, {"residual_dtype", "fp32"}}));
  EXPECT_LT((r - full).abs().max().item<double>(), 1e-4);
}

}  // namespace
}  // namespace kvb
