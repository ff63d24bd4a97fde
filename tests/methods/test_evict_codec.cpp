// Eviction x quantization stacked physically: an eviction method with codec=kivi-b / pertoken-b
// stores its kept entries through the codec (per KV head streams that evictions shrink without
// re-encoding). Checks: with nothing evicted the stack equals the `kivi` method; at 25% kept with
// 2-bit codes the footprint is the codec's exact bytes and far below eviction alone; the ledger's
// effective bits match the codec's declaration; every eviction method accepts every codec.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "methods/common/evicting_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

CacheContext ctx_of(const Model& m) { return CacheContext{m.config, m.device, m.dtype}; }

std::unique_ptr<KvCache> make(const std::string& name, nlohmann::json params) {
  return MethodRegistry::instance().create(name, ctx_of(*test::stories260k()), params);
}

// Every logit row of a 200-token prompt prefilled in chunks, then 20 greedy decode steps.
at::Tensor trace(std::unique_ptr<KvCache> kv, Engine** keep = nullptr, int64_t chunk = 64) {
  EngineOptions o;
  o.prefill_chunk = chunk;
  static std::unique_ptr<Engine> e;
  e = std::make_unique<Engine>(test::stories260k(), std::move(kv), o);
  std::vector<int64_t> prompt = {1};
  for (int i = 1; i < 200; ++i) prompt.push_back(3 + (i * 37 + i * i) % 500);
  int64_t s = e->new_sequence();
  std::vector<at::Tensor> rows;
  e->prefill({s}, {prompt}, [&](const at::Tensor& l, int64_t) { rows.push_back(l.clone()); });
  int64_t tok = rows.back()[rows.back().size(0) - 1].argmax().item<int64_t>();
  for (int i = 0; i < 20; ++i) {
    at::Tensor l = e->decode({s}, {tok});
    rows.push_back(l.clone());
    tok = l[0].argmax().item<int64_t>();
  }
  if (keep) *keep = e.get();
  return at::cat(rows);
}

TEST(EvictCodec, KeepEverythingWithKiviCodecEqualsTheKiviMethod) {
  for (int bits : {2, 4}) {
    at::Tensor stacked = trace(make("streaming_llm", {{"budget", 1.0}, {"position_mode", "absolute"},
                                                      {"codec", "kivi-" + std::to_string(bits)},
                                                      {"codec_residual", 32}}),
                               nullptr, 256);
    at::Tensor kivi = trace(make("kivi", {{"k_bits", bits}, {"v_bits", bits}, {"group_size", 32},
                                          {"residual_length", 32}}),
                            nullptr, 256);
    at::Tensor full = trace(make("full", nlohmann::json::object()), nullptr, 256);
    // One prefill chunk (both attend the prompt exactly, then encode it whole); the same codes
    // (per-channel key groups and per-token value groups never straddle heads) and a different
    // attention loop: equal up to float summation order.
    EXPECT_LT((stacked - kivi).abs().max().item<double>(), 2e-4) << bits;
    EXPECT_GT((stacked - full).abs().max().item<double>(), 1e-3) << bits << ": the codec did nothing";
  }
}

TEST(EvictCodec, QuarterBudgetWithTwoBitCodesStoresTheCodecsExactBytes) {
  Engine* e = nullptr;
  trace(make("snapkv", {{"budget", 0.25}}), &e);
  const Footprint plain = e->kv().footprint();
  trace(make("snapkv", {{"budget", 0.25}, {"codec", "kivi-2"}, {"codec_residual", 0}}), &e);
  const Footprint stacked = e->kv().footprint();
  auto& ev = dynamic_cast<EvictingKvCache&>(e->kv());
  // The same tokens are kept (SnapKV scores come from exact attention of the prompt)...
  EXPECT_EQ(stacked.tokens_held, plain.tokens_held);
  EXPECT_EQ(stacked.logical_bytes, plain.logical_bytes);
  // ...stored in 2-bit codes + fp16 scale/min: payload + metadata well under a quarter of fp32.
  const double ratio = static_cast<double>(stacked.device_payload_bytes + stacked.device_metadata_bytes) /
                       static_cast<double>(plain.device_payload_bytes);
  EXPECT_LT(ratio, 0.35) << ratio;
  // The counters agree with the footprint: effective bits = physical codec bytes x 8 / live elements.
  auto c = e->kv().counters();
  int64_t live = 0;
  for (int l = 0; l < 5; ++l)
    for (int64_t h = 0; h < 4; ++h) live += 2 * 8 * static_cast<int64_t>(ev.kept_indices(0, l, h).size());
  const int64_t index_from_masks = stacked.device_index_bytes - live / 16 * 4;  // minus int32 indices
  const double bits = 8.0 * static_cast<double>(stacked.device_payload_bytes +
                                                 stacked.device_metadata_bytes + index_from_masks) /
                      static_cast<double>(live);
  EXPECT_NEAR(c.at("effective_bits_per_element"), bits, 1e-9);
  EXPECT_LT(c.at("effective_bits_per_element"), 8.0);
  // Keys wait at fp16 until a 32-token per-channel group is complete.
  EXPECT_LT(c.at("full_precision_fraction"), 0.5);
  // Decoded keys are close to, not equal to, what the plain store keeps.
  at::Tensor k = ev.kept_keys(0, 2, 1);
  EXPECT_EQ(k.size(1), 8);
}

TEST(EvictCodec, EveryEvictionMethodTakesEveryCodec) {
  for (const char* m : {"streaming_llm", "h2o", "tova", "snapkv", "pyramidkv", "adakv", "knorm",
                        "keydiff", "lagkv", "cur", "expected_attention", "chunkkv"}) {
    for (const char* c : {"fp16", "bf16", "kivi-4", "pertoken-2", "pertoken-8"}) {
      Engine* e = nullptr;
      at::Tensor l = trace(make(m, {{"budget", 0.5}, {"codec", c}, {"codec_residual", 32}}), &e);
      EXPECT_TRUE(at::isfinite(l).all().item<bool>()) << m << " " << c;
      EXPECT_LT(e->kv().footprint().physical_bytes(), 200 * 2 * 5 * 32 * 4) << m << " " << c;
    }
  }
  try {
    make("h2o", {{"codec", "kivi-2"}, {"codec_residual", 30}});
    FAIL() << "codec_residual 30 accepted for kivi";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h2o.codec_residual"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb
