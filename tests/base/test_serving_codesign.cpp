// The serving simulation's vAttention allocator and its scheduling x memory co-design policies, on
// hand-made traces whose outcome can be worked out on paper: the vattention allocator's page-size
// fragmentation (every K and V buffer of every layer rounded up to its page) is exact, and larger
// pages run fewer requests at once; the paged allocator's decode reads its block table and pays
// the kernel slowdown; compress-instead-of-preempt finishes without preempting or recomputing;
// admission by predicted footprint avoids the preemptions vLLM's prompt rule runs into, and with
// compression admits more; a store of compressed prefix blocks hits more and hands out compressed
// KV; fixed tier latencies add to TTFT exactly.

#include <gtest/gtest.h>

#include <cmath>

#include "harness/common/error.h"
#include "harness/serve/serving_sim.h"
#include "tests/base/serving_test_util.h"

namespace kvb {
namespace {

using servetest::own_ids;
using servetest::request;
using servetest::toy_hardware;
using servetest::trace_of;

// The toy target with its layers counted (block tables and per-layer pages scale with them).
ServeTarget toy_target(int64_t layers = 2) {
  ServeTarget t = servetest::toy_target();
  t.layers = layers;
  return t;
}

const FootprintCurve kDense = FootprintCurve::proportional(1000);
const FootprintCurve kQuarter = FootprintCurve::proportional(250);  // a 4x method

TEST(ServingVAttention, PageFragmentationIsExact) {
  // One 1,000-token prompt and a single output token: one iteration holding 1e6 live bytes, 2
  // layers -> 4 buffers of 250,000 bytes each.
  const RequestTrace t = trace_of({request(0, 1000, 1, {1, 2})});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  cfg.allocator = KvAllocator::kVAttention;
  auto waste = [&](int64_t page) {
    cfg.page_bytes = page;
    return simulate_serving(t, kDense, toy_target(), toy_hardware(), cfg).allocator_waste;
  };
  // 4 KiB: 62 pages a buffer (253,952 bytes); 64 KiB: 4 pages; 2 MiB: 1 page.
  EXPECT_NEAR(waste(4096), (4 * 253952.0 - 1e6) / (4 * 253952.0), 1e-12);
  EXPECT_NEAR(waste(65536), (4 * 262144.0 - 1e6) / (4 * 262144.0), 1e-12);
  EXPECT_NEAR(waste(2 << 20), (4 * 2097152.0 - 1e6) / (4 * 2097152.0), 1e-12);
  // Paged blocks of 16 tokens for comparison: 1,008 tokens reserved.
  cfg.allocator = KvAllocator::kPaged;
  EXPECT_NEAR(simulate_serving(t, kDense, toy_target(), toy_hardware(), cfg).allocator_waste,
              8.0 / 1008, 1e-12);
}

TEST(ServingVAttention, LargerPagesRunFewerRequestsAtOnce) {
  std::vector<TraceRequest> rs;
  for (int i = 0; i < 5; ++i) rs.push_back(request(0, 100, 20, own_ids(i, 100)));
  const RequestTrace t = trace_of(rs);
  ServeConfig cfg;
  cfg.allocator = KvAllocator::kVAttention;
  cfg.kv_pool_bytes = 3 * 4 * 2097152.0 + 1e6;  // three requests' worth of 2 MiB pages
  cfg.page_bytes = 2 << 20;
  const ServeResult big = simulate_serving(t, kDense, toy_target(), toy_hardware(), cfg);
  cfg.page_bytes = 4096;
  const ServeResult small = simulate_serving(t, kDense, toy_target(), toy_hardware(), cfg);
  EXPECT_EQ(big.max_running, 3);
  EXPECT_EQ(small.max_running, 5);
  EXPECT_EQ(big.completed, 5);
  EXPECT_GT(big.allocator_waste, small.allocator_waste);
  EXPECT_GT(big.duration_s, small.duration_s);
}

TEST(ServingVAttention, PagedDecodeReadsItsBlockTableAndPaysTheKernelSlowdown) {
  const RequestTrace t = trace_of({request(0, 1000, 2, {1, 2})});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  ServeHardware hw = toy_hardware();
  auto tpot = [&](KvAllocator a) {
    cfg.allocator = a;
    return simulate_serving(t, kDense, toy_target(), hw, cfg).tpot_ms_p50;
  };
  // The decode at 1,001 tokens: 1e9 weights + 1.001e6 KV bytes; paged adds 63 blocks x 4 bytes x
  // 2 layers of block table.
  EXPECT_NEAR(tpot(KvAllocator::kVAttention), (1e9 + 1.001e6) / 1e9 + 0.5, 1e-12);
  EXPECT_NEAR(tpot(KvAllocator::kPaged), (1e9 + 1.001e6 + 504) / 1e9 + 0.5, 1e-12);
  hw.paged_attention_slowdown = 1.25;
  EXPECT_NEAR(tpot(KvAllocator::kPaged), (1e9 + 1.25 * 1.001e6 + 504) / 1e9 + 0.5, 1e-12);
  EXPECT_NEAR(tpot(KvAllocator::kVAttention), (1e9 + 1.001e6) / 1e9 + 0.5, 1e-12);
  hw.paged_attention_slowdown = 0.5;
  EXPECT_THROW(tpot(KvAllocator::kPaged), Error);
}

TEST(ServingCodesign, CompressInsteadOfPreemptFinishesWithoutRecomputing) {
  // Room for 320 uncompressed tokens; two requests of 100 + 200 outgrow it together (the paged
  // preemption case of test_serving_sim.cpp).
  const RequestTrace t =
      trace_of({request(0, 100, 200, own_ids(0, 100)), request(0, 100, 200, own_ids(1, 100))});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 320 * 1000;
  const ServeResult vllm = simulate_serving(t, kDense, toy_target(), toy_hardware(), cfg);
  ASSERT_GE(vllm.preemptions, 1);
  ASSERT_GT(vllm.prefill_tokens, 200);
  cfg.kv_policy = KvPolicy::kOnPressure;
  EXPECT_THROW(simulate_serving(t, kQuarter, toy_target(), toy_hardware(), cfg), Error);
  const ServeResult co = simulate_serving(t, kQuarter, toy_target(), toy_hardware(), cfg, &kDense);
  EXPECT_EQ(co.completed, 2);
  EXPECT_EQ(co.preemptions, 0);
  EXPECT_DOUBLE_EQ(co.prefill_tokens, 200);  // nothing recomputed
  EXPECT_GE(co.compressions, 1);
  EXPECT_LT(co.duration_s, vllm.duration_s);
  // Only part of the output came from compressed KV: the requests ran uncompressed until the
  // pool filled (at 160 tokens each, 60 generated).
  EXPECT_GT(co.compressed_token_fraction, 0);
  EXPECT_LT(co.compressed_token_fraction, 1);
  EXPECT_GT(co.compressed_request_fraction, 0);
  // The method stored from the first token: everything compressed, nothing preempted either.
  cfg.kv_policy = KvPolicy::kAlways;
  const ServeResult always = simulate_serving(t, kQuarter, toy_target(), toy_hardware(), cfg);
  EXPECT_EQ(always.preemptions, 0);
  EXPECT_DOUBLE_EQ(always.compressed_token_fraction, 1);
  EXPECT_LT(co.compressed_token_fraction, always.compressed_token_fraction);
  // With room to spare, on_pressure never compresses.
  cfg.kv_policy = KvPolicy::kOnPressure;
  cfg.kv_pool_bytes = 1e9;
  const ServeResult roomy =
      simulate_serving(t, kQuarter, toy_target(), toy_hardware(), cfg, &kDense);
  EXPECT_EQ(roomy.compressions, 0);
  EXPECT_DOUBLE_EQ(roomy.compressed_token_fraction, 0);
}

TEST(ServingCodesign, PredictedAdmissionAvoidsPreemptionsAndCompressionAdmitsMore) {
  // One request finishes first (the predictor learns outputs of 400), then four arrive at once.
  std::vector<TraceRequest> rs = {request(0, 100, 400, own_ids(0, 100))};
  for (int i = 1; i <= 4; ++i) rs.push_back(request(20000, 100, 400, own_ids(i, 100)));
  const RequestTrace t = trace_of(rs);
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1200 * 1000;  // 1,200 uncompressed tokens
  const ServeResult prompt = simulate_serving(t, kDense, toy_target(), toy_hardware(), cfg);
  EXPECT_EQ(prompt.max_running, 4);  // 4 prompts of 100 fit; their growth does not
  EXPECT_GE(prompt.preemptions, 1);
  cfg.admission = Admission::kPredicted;
  const ServeResult predicted = simulate_serving(t, kDense, toy_target(), toy_hardware(), cfg);
  EXPECT_EQ(predicted.preemptions, 0);
  EXPECT_EQ(predicted.max_running, 2);  // 2 x 500 predicted tokens fit, 3 do not
  EXPECT_EQ(predicted.completed, 5);
  // Counting on compression (4x under pressure), all four are admitted and none preempted.
  cfg.kv_policy = KvPolicy::kOnPressure;
  const ServeResult joint =
      simulate_serving(t, kQuarter, toy_target(), toy_hardware(), cfg, &kDense);
  EXPECT_EQ(joint.max_running, 4);
  EXPECT_EQ(joint.preemptions, 0);
  EXPECT_GE(joint.compressions, 2);
  EXPECT_LT(joint.duration_s, predicted.duration_s);
  EXPECT_LT(joint.ttft_ms_p90, predicted.ttft_ms_p90);
}

TEST(ServingCodesign, CompressedPrefixBlocksHitMoreAndHandOutCompressedKv) {
  // B repeats A's two-block prompt after A has finished; the store has room for one uncompressed
  // block, or four compressed ones.
  const RequestTrace t = trace_of({request(0, 1000, 4, {7, 8}), request(1000, 1000, 4, {7, 8})});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  cfg.kv_policy = KvPolicy::kOnPressure;
  cfg.prefix_cache_bytes = 1000.0 * 512 * 1.5;
  const ServeResult held =
      simulate_serving(t, kQuarter, toy_target(), toy_hardware(), cfg, &kDense);
  cfg.prefix_blocks = PrefixBlocks::kCompressed;
  const ServeResult comp =
      simulate_serving(t, kQuarter, toy_target(), toy_hardware(), cfg, &kDense);
  EXPECT_LT(held.per_request[1].hit_tokens, 999);
  EXPECT_EQ(comp.per_request[1].hit_tokens, 999);
  EXPECT_GT(comp.prefix_hit_rate, held.prefix_hit_rate);
  EXPECT_DOUBLE_EQ(held.compressed_request_fraction, 0);    // nothing ran compressed
  EXPECT_DOUBLE_EQ(comp.compressed_request_fraction, 0.5);  // B started from compressed blocks
  EXPECT_LT(comp.per_request[1].ttft_ms(), held.per_request[1].ttft_ms());
}

TEST(ServingCodesign, TierLatenciesAddToTheTimeToFirstToken) {
  const RequestTrace t = trace_of({request(0, 1000, 1, {7, 8}), request(1000, 1000, 1, {7, 8})});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  cfg.prefix_cache_bytes = -1;
  ServeHardware hw = toy_hardware();
  const double base = simulate_serving(t, kDense, toy_target(), hw, cfg).per_request[1].ttft_ms();
  hw.prefix_load_latency_ms = 0.75;
  EXPECT_NEAR(simulate_serving(t, kDense, toy_target(), hw, cfg).per_request[1].ttft_ms(),
              base + 0.75, 1e-9);
  // A request that loads nothing pays none.
  EXPECT_NEAR(simulate_serving(t, kDense, toy_target(), hw, cfg).per_request[0].ttft_ms(), 25.505,
              1e-9);
}

TEST(ServingCodesign, ParsesPolicyNames) {
  EXPECT_EQ(parse_enum(kKvPolicies, "on_pressure", "kv_policy"), KvPolicy::kOnPressure);
  EXPECT_EQ(parse_enum(kAdmissions, "predicted", "admission"), Admission::kPredicted);
  EXPECT_EQ(parse_enum(kPrefixBlocks, "compressed", "prefix_blocks"), PrefixBlocks::kCompressed);
  EXPECT_EQ(parse_enum(kKvAllocators, "vattention", "allocator"), KvAllocator::kVAttention);
  EXPECT_STREQ(enum_name(kKvAllocators, KvAllocator::kVAttention), "vattention");
  try {
    parse_enum(kKvPolicies, "on_presure", "kv_policy");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("on_pressure"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_enum(kAdmissions, "oracle", "admission"), Error);
  EXPECT_THROW(parse_enum(kPrefixBlocks, "dense", "prefix_blocks"), Error);
}

}  // namespace
}  // namespace kvb
