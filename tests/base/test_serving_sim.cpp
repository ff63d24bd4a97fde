// The serve protocol's torch-free parts: the footprint curve and the serving simulation (timings
// worked out by hand on a one-request trace; allocator capacity, preemption, rejection and prefix
// hits on small constructed traces; invariants and the effect of compression on the real Mooncake
// conversation trace).

#include <gtest/gtest.h>

#include <cmath>

#include "harness/common/mapped_file.h"
#include "harness/serve/serving_sim.h"
#include "tests/base/serving_test_util.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

// A paged decode step reads its block table too: 63 blocks of 16 tokens at 1,001-1,008 tokens, 4
// bytes each, per layer (the toy target counts as one layer): 252 bytes, 2.52e-7 ms at 1e12 B/s.
constexpr double kTableMs = 252e-9;
// With 4 layers: 1,008 bytes.
constexpr double kTable4Ms = 1008e-9;

using servetest::own_ids;
using servetest::request;
using servetest::toy_hardware;
using servetest::toy_target;
using servetest::trace_of;

TEST(FootprintCurve, InterpolatesAndExtrapolatesTheLastSegment) {
  // A saturating method (a budget of ~200 tokens at 10 bytes each) and a host tier.
  FootprintCurve c({{200, 2000, 100}, {100, 1000, 50}, {400, 2100, 400}});
  EXPECT_DOUBLE_EQ(c.device_bytes(0), 0);
  EXPECT_DOUBLE_EQ(c.device_bytes(50), 500);  // through (0, 0)
  EXPECT_DOUBLE_EQ(c.device_bytes(150), 1500);
  EXPECT_DOUBLE_EQ(c.device_bytes(300), 2050);
  EXPECT_DOUBLE_EQ(c.device_bytes(800), 2300);  // last slope 100 bytes / 200 tokens
  EXPECT_DOUBLE_EQ(c.host_bytes(800), 1000);
  EXPECT_FALSE(c.proportional_in_length());
  EXPECT_DOUBLE_EQ(c.device_bytes_per_token(), 2100.0 / 400);
  const FootprintCurve s = c.scaled(4);
  EXPECT_DOUBLE_EQ(s.device_bytes(300), 8200);
  // Quantization-like: proportional within 5% (metadata makes it not exact).
  FootprintCurve q({{128, 128 * 30.0 + 64, 0}, {512, 512 * 30.0 + 64, 0}});
  EXPECT_TRUE(q.proportional_in_length());
  EXPECT_NEAR(q.device_bytes(4096), 4096 * 30.0 + 64, 1e-6);
  EXPECT_THROW(FootprintCurve({}), Error);
  EXPECT_THROW(FootprintCurve({{0, 1, 0}}), Error);
  EXPECT_THROW(FootprintCurve({{10, -1, 0}}), Error);
  EXPECT_THROW(FootprintCurve({{10, 1, 0}, {10, 2, 0}}), Error);
  // Decode reads and host transfers: interpolated between points; the read fraction held at the
  // ends, host transfers extrapolated along the last segment.
  FootprintPoint a{100, 1000, 0, 0.5, 10}, b{300, 3000, 0, 0.25, 30};
  FootprintCurve r({a, b});
  EXPECT_DOUBLE_EQ(r.decode_read_bytes(200), 2000 * 0.375);
  EXPECT_DOUBLE_EQ(r.decode_read_bytes(50), 500 * 0.5);
  EXPECT_DOUBLE_EQ(r.decode_read_bytes(600), 6000 * 0.25);
  EXPECT_DOUBLE_EQ(r.h2d_bytes_per_token(200), 20);
  EXPECT_DOUBLE_EQ(r.h2d_bytes_per_token(500), 50);
  EXPECT_DOUBLE_EQ(r.scaled(2).h2d_bytes_per_token(200), 40);
}

TEST(ServingSim, OneRequestMatchesTheRooflineByHand) {
  const RequestTrace t = trace_of({request(0, 1000, 3, {1, 2})});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  const ServeResult r =
      simulate_serving(t, FootprintCurve::proportional(1000), toy_target(), toy_hardware(), cfg);
  ASSERT_EQ(r.completed, 1);
  EXPECT_EQ(r.iterations, 3);
  // Prefill: 1000 x 2e9 + 1e6 x 1000 x 500.5 FLOPs = 2.5005e12 -> 25.005 ms (compute-bound), + 0.5.
  EXPECT_NEAR(r.per_request[0].ttft_ms(), 25.505, 1e-9);
  // Decodes: (1e9 weights + 1.001e6 / 1.002e6 KV bytes + the block table) / 1e12 B/s -> 1.001001
  // / 1.001002 ms (+ kTableMs), + 0.5.
  const double d1 = 1.501001 + kTableMs, d2 = 1.501002 + kTableMs;
  EXPECT_NEAR(r.per_request[0].finish_ms, 25.505 + d1 + d2, 1e-9);
  EXPECT_NEAR(r.tpot_ms_p50, (d1 + d2) / 2, 1e-9);
  EXPECT_NEAR(r.memory_bound_fraction, (d1 + d2) / (25.505 + d1 + d2), 1e-9);
  EXPECT_NEAR(r.output_tok_s, 3 / (r.per_request[0].finish_ms / 1e3), 1e-6);
  EXPECT_DOUBLE_EQ(r.prefill_tokens, 1000);
  EXPECT_EQ(r.max_running, 1);
}

// Decode steps that read a quarter of the KV (read-time selection), or pull rows over PCIe
// (tiering).
TEST(ServingSim, DecodeReadsAndHostTransfersSetTheStepTime) {
  const RequestTrace t = trace_of({request(0, 1000, 3, {1, 2})});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e10;
  ServeTarget target = toy_target();
  target.weight_bytes = 1e6;  // small weights, so the KV read decides a decode step
  ServeHardware hw = toy_hardware();
  FootprintPoint p{1000, 1e9, 0};  // 1 MB per token: 1 GB at 1,000 tokens
  const ServeResult dense = simulate_serving(t, FootprintCurve({p}), target, hw, cfg);
  p.read_fraction = 0.25;
  const ServeResult sparse = simulate_serving(t, FootprintCurve({p}), target, hw, cfg);
  // Decode at 1,001 tokens: (1e6 + 1.001e9) bytes / 1e12 B/s = 1.002 ms; a quarter: 0.25125 ms.
  EXPECT_NEAR(dense.tpot_ms_p50, (1.002 + 0.5 + 1.003 + 0.5) / 2 + kTableMs, 1e-9);
  EXPECT_NEAR(sparse.tpot_ms_p50, (0.25125 + 0.5 + 0.25150 + 0.5) / 2 + kTableMs, 1e-9);
  EXPECT_NEAR(sparse.per_request[0].ttft_ms(), dense.per_request[0].ttft_ms(),
              1e-12);  // prefill reads all
  p.read_fraction = 1;
  p.h2d_bytes_per_token = 5e7;  // 50 MB per token at 1 GB/s: 50 ms, over the HBM time
  hw.h2d_gbps = 1;
  const ServeResult tiered = simulate_serving(t, FootprintCurve({p}), target, hw, cfg);
  EXPECT_NEAR(tiered.tpot_ms_p50, 50.5, 1e-9);
  EXPECT_GT(tiered.pcie_bound_fraction, 0.5);
  EXPECT_DOUBLE_EQ(dense.pcie_bound_fraction, 0);
  p.read_fraction = 1.5;
  EXPECT_THROW(FootprintCurve({p}), Error);
}

TEST(ServingSim, PrefixStoreHitsSkipPrefillAndCostALoad) {
  // B repeats A's prompt after A has finished.
  const RequestTrace t = trace_of({request(0, 1000, 1, {7, 8}), request(1000, 1000, 1, {7, 8})});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  const auto curve = FootprintCurve::proportional(1000);
  const ServeResult none = simulate_serving(t, curve, toy_target(), toy_hardware(), cfg);
  EXPECT_DOUBLE_EQ(none.prefix_hit_rate, 0);
  EXPECT_NEAR(none.per_request[1].ttft_ms(), 25.505, 1e-9);
  cfg.prefix_cache_bytes = -1;  // unlimited
  const ServeResult hit = simulate_serving(t, curve, toy_target(), toy_hardware(), cfg);
  // Both blocks hit; one token is still computed: 999 tokens loaded (999,000 bytes at 1 GB/s =
  // 0.999 ms), then one token against 999 past: (3e9 FLOPs; 1e9 + 1e6 bytes -> 1.001 ms) + 0.5.
  EXPECT_EQ(hit.per_request[1].hit_tokens, 999);
  EXPECT_NEAR(hit.per_request[1].ttft_ms(), 0.999 + 1.501, 1e-9);
  EXPECT_DOUBLE_EQ(hit.prefix_hit_rate, 999.0 / 2000);
  EXPECT_DOUBLE_EQ(hit.prefill_tokens, 1001);
  EXPECT_DOUBLE_EQ(hit.prefix_load_bytes, 999000);
  // A store too small for one block holds nothing.
  cfg.prefix_cache_bytes = 1000.0 * 512 - 1;
  EXPECT_EQ(simulate_serving(t, curve, toy_target(), toy_hardware(), cfg).per_request[1].hit_tokens,
            0);
  // Room for one uncompressed block: the prompt's two do not both stay; at half the bytes they do.
  cfg.prefix_cache_bytes = 1000.0 * 1024 - 1;
  EXPECT_LT(simulate_serving(t, curve, toy_target(), toy_hardware(), cfg).per_request[1].hit_tokens,
            999);
  EXPECT_EQ(
      simulate_serving(t, FootprintCurve::proportional(500), toy_target(), toy_hardware(), cfg)
          .per_request[1]
          .hit_tokens,
      999);
}

TEST(ServingSim, AllocatorsReserveWhatTheyClaim) {
  // Five requests at once; the model's max context is 10,000 tokens (1e7 bytes uncompressed).
  std::vector<TraceRequest> rs;
  for (int i = 0; i < 5; ++i) rs.push_back(request(0, 100, 50, own_ids(i, 100)));
  const RequestTrace t = trace_of(rs);
  ServeTarget target = toy_target();
  target.max_context = 10000;
  ServeConfig cfg;
  cfg.kv_pool_bytes = 2.5e7;
  const auto full = FootprintCurve::proportional(1000);
  auto run = [&](KvAllocator a, const FootprintCurve& c) {
    cfg.allocator = a;
    return simulate_serving(t, c, target, toy_hardware(), cfg);
  };
  const ServeResult max_full = run(KvAllocator::kContiguousMax, full);
  EXPECT_EQ(max_full.max_running, 2);  // 2.5e7 / 1e7
  EXPECT_EQ(max_full.completed, 5);
  EXPECT_GT(max_full.allocator_waste, 0.98);  // at most 150 of 10,000 reserved tokens live
  // 40% of the bytes per token: all five reservations fit (under the 1% admission watermark).
  EXPECT_EQ(run(KvAllocator::kContiguousMax, FootprintCurve::proportional(400)).max_running, 5);
  const ServeResult oracle = run(KvAllocator::kOracle, full);
  EXPECT_EQ(oracle.max_running, 5);
  EXPECT_GT(oracle.allocator_waste, 0.05);  // the output's room is reserved from the start
  const ServeResult pow2 = run(KvAllocator::kPow2, full);
  EXPECT_GT(pow2.allocator_waste, oracle.allocator_waste);  // 256 reserved for 150
  const ServeResult paged = run(KvAllocator::kPaged, full);
  EXPECT_EQ(paged.max_running, 5);
  EXPECT_LT(paged.allocator_waste, oracle.allocator_waste);
  EXPECT_LT(paged.allocator_waste, 15.0 / 100);  // under one block per request
  EXPECT_GT(paged.allocator_waste, 0);
  // Reservations limit concurrency, so the contiguous-max run takes longer.
  EXPECT_GT(max_full.duration_s, paged.duration_s);
}

TEST(ServingSim, PagedGrowthPreemptsTheLatestRequestWhichRecomputes) {
  // Room for 320 tokens (20 blocks); two requests of 100 + 200 outgrow it together.
  const RequestTrace t =
      trace_of({request(0, 100, 200, own_ids(0, 100)), request(0, 100, 200, own_ids(1, 100))});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 320 * 1000;
  const ServeResult r =
      simulate_serving(t, FootprintCurve::proportional(1000), toy_target(), toy_hardware(), cfg);
  EXPECT_EQ(r.completed, 2);
  EXPECT_GE(r.preemptions, 1);
  EXPECT_EQ(r.per_request[0].preemptions, 0);  // the earlier request keeps its blocks
  EXPECT_GE(r.per_request[1].preemptions, 1);
  EXPECT_GT(r.per_request[1].finish_ms, r.per_request[0].finish_ms);
  EXPECT_GT(r.prefill_tokens, 200);  // the recomputation
  EXPECT_LE(r.kv_utilization, 1.0);
  EXPECT_EQ(r.rejected, 0);
}

TEST(ServingSim, RejectsWhatCanNeverRun) {
  ServeTarget target = toy_target();
  target.max_context = 1000;
  const RequestTrace t = trace_of({request(0, 990, 20, own_ids(0, 990)),  // over the max context
                                   request(0, 500, 10, own_ids(1, 500)),  // over the pool
                                   request(0, 100, 10, own_ids(2, 100))});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 300 * 1000;
  const ServeResult r =
      simulate_serving(t, FootprintCurve::proportional(1000), target, toy_hardware(), cfg);
  EXPECT_EQ(r.rejected, 2);
  EXPECT_TRUE(r.per_request[0].rejected);
  EXPECT_TRUE(r.per_request[1].rejected);
  EXPECT_EQ(r.completed, 1);
  EXPECT_FALSE(r.per_request[2].rejected);
  EXPECT_DOUBLE_EQ(r.slo_attainment, 1.0 / 3);
}

TEST(ServingSim, TimeScaleCompressesArrivals) {
  const RequestTrace t =
      trace_of({request(0, 100, 2, own_ids(0, 100)), request(10000, 100, 2, own_ids(1, 100))});
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  cfg.time_scale = 0.5;
  const ServeResult r =
      simulate_serving(t, FootprintCurve::proportional(1000), toy_target(), toy_hardware(), cfg);
  EXPECT_DOUBLE_EQ(r.per_request[1].arrival_ms, 5000);
  EXPECT_GT(r.per_request[1].first_token_ms, 5000);
  cfg.time_scale = 0;
  EXPECT_THROW(
      simulate_serving(t, FootprintCurve::proportional(1000), toy_target(), toy_hardware(), cfg),
      Error);
}

// Three prompts asked twice each, far apart in time, on two instances with local prefix stores.
TEST(ServingSim, RoutersAndPrefixScopes) {
  std::vector<TraceRequest> rs;
  for (int round = 0; round < 2; ++round)
    for (int p = 0; p < 3; ++p)
      rs.push_back(request((round * 3 + p) * 10000, 1024, 2, {100 * (p + 1), 100 * (p + 1) + 1}));
  const RequestTrace t = trace_of(rs);
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  cfg.prefix_cache_bytes = -1;
  cfg.instances = 2;
  const auto curve = FootprintCurve::proportional(1000);
  auto run = [&](Router router, PrefixScope scope) {
    cfg.router = router;
    cfg.prefix_scope = scope;
    return simulate_serving(t, curve, toy_target(), toy_hardware(), cfg);
  };
  // Round robin alternates A0 B1 C0 | A1 B0 C1: every repeat lands where its prompt is not.
  const ServeResult rr = run(Router::kRoundRobin, PrefixScope::kLocal);
  EXPECT_EQ(rr.instance_requests, (std::vector<int64_t>{3, 3}));
  EXPECT_DOUBLE_EQ(rr.load_imbalance, 1.0);
  EXPECT_DOUBLE_EQ(rr.prefix_hit_rate, 0.0);
  // One store for both: every repeat hits (1,023 of its 1,024 tokens).
  EXPECT_DOUBLE_EQ(run(Router::kRoundRobin, PrefixScope::kGlobal).prefix_hit_rate,
                   3 * 1023.0 / (6 * 1024));
  // The prefix router sends each repeat to the instance holding its prompt: as good as global.
  const ServeResult px = run(Router::kPrefix, PrefixScope::kLocal);
  EXPECT_DOUBLE_EQ(px.prefix_hit_rate, 3 * 1023.0 / (6 * 1024));
  for (size_t i = 3; i < 6; ++i) EXPECT_EQ(px.per_request[i].hit_tokens, 1023) << i;
  // Least loaded ignores prefixes: with idle instances it always picks the first.
  const ServeResult ll = run(Router::kLeastLoaded, PrefixScope::kLocal);
  EXPECT_EQ(ll.instance_requests, (std::vector<int64_t>{6, 0}));
  EXPECT_DOUBLE_EQ(ll.load_imbalance, 2.0);
  cfg.instances = 0;
  EXPECT_THROW(run(Router::kRoundRobin, PrefixScope::kLocal), Error);
  EXPECT_THROW(parse_enum(kRouters, "prefix_aware", "router"), Error);
  EXPECT_THROW(parse_enum(kPrefixScopes, "pooled", "prefix_scope"), Error);
}

// Mooncake's conductor: A1 leaves its 4K-token prompt in instance 0's store; when A2 repeats it,
// instance 0 has a 60K-token prompt queued, so A2 goes to the idle instance 1 and fetches the
// prefix from instance 0's store over the network instead of recomputing it.
TEST(ServingSim, ConductorFetchesAPrefixFromAnotherInstance) {
  std::vector<int64_t> p8 = {1, 2, 3, 4, 5, 6, 7, 8};
  const RequestTrace t = trace_of({request(0, 4096, 2, p8),                       // A1 -> 0
                                   request(100000, 60000, 2, own_ids(7, 60000)),  // C -> 0
                                   request(100001, 4096, 2, p8)});                // A2 -> 1
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  cfg.prefix_cache_bytes = -1;
  cfg.instances = 2;
  cfg.router = Router::kConductor;
  ServeHardware hw = toy_hardware();
  hw.remote_gbps = 1;
  const auto curve = FootprintCurve::proportional(1000);
  const ServeResult r = simulate_serving(t, curve, toy_target(), hw, cfg);
  EXPECT_EQ(r.instance_requests, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(r.per_request[2].hit_tokens, 4095);
  EXPECT_DOUBLE_EQ(r.remote_fetch_bytes, 4095 * 1000.0);
  // Its first token: the 4.095 MB fetch at 1 GB/s (4.095 ms), then one token's step (1.501 ms:
  // 3.096e9 FLOPs -> 0.031 ms, under the 1e9 + 4.096e6 bytes -> 1.004 ms; + 0.5).
  EXPECT_NEAR(r.per_request[2].ttft_ms(), 4.095 + 1.004096 + 0.5, 1e-6);
  // Least loaded also picks the idle instance 1 but, with no fetch, recomputes the 4K prompt.
  cfg.router = Router::kLeastLoaded;
  const ServeResult ll = simulate_serving(t, curve, toy_target(), hw, cfg);
  EXPECT_EQ(ll.instance_requests, (std::vector<int64_t>{2, 1}));
  EXPECT_DOUBLE_EQ(ll.remote_fetch_bytes, 0);
  EXPECT_EQ(ll.per_request[2].hit_tokens, 0);
  EXPECT_GT(ll.per_request[2].ttft_ms(), 10 * r.per_request[2].ttft_ms());
  EXPECT_EQ(parse_enum(kRouters, "conductor", "router"), Router::kConductor);
}

// One prefill and one decode instance, a roomy pool.
ServeConfig pd_config() {
  ServeConfig cfg;
  cfg.kv_pool_bytes = 1e9;
  cfg.instances = 2;
  cfg.prefill_instances = 1;
  return cfg;
}

// P/D disaggregation: instance 0 prefills, hands the prompt's KV (1 MB at 1 GB/s: 1 ms) to instance
// 1, which decodes the remaining two tokens once it has landed.
TEST(ServingSim, PrefillDecodeDisaggregationSendsTheKvOver) {
  const RequestTrace t = trace_of({request(0, 1000, 3, {1, 2})});
  ServeConfig cfg = pd_config();
  ServeHardware hw = toy_hardware();
  hw.pd_gbps = 1;
  const ServeResult r =
      simulate_serving(t, FootprintCurve::proportional(1000), toy_target(), hw, cfg);
  ASSERT_EQ(r.completed, 1);
  EXPECT_EQ(r.instance_requests, (std::vector<int64_t>{1, 1}));
  EXPECT_DOUBLE_EQ(r.pd_transfer_bytes, 1e6);
  EXPECT_NEAR(r.per_request[0].ttft_ms(), 25.505, 1e-9);  // the first token is the prefill's
  EXPECT_NEAR(r.per_request[0].finish_ms, 25.505 + 1.0 + 1.501001 + 1.501002 + 2 * kTableMs, 1e-9);
  EXPECT_DOUBLE_EQ(r.prefill_tokens, 1000);
  cfg.prefill_instances = 2;  // nobody left to decode
  EXPECT_THROW(simulate_serving(t, FootprintCurve::proportional(1000), toy_target(), hw, cfg),
               Error);
}

// Layer-wise P/D: the KV leaves layer by layer while the prefill runs (0 .. 25.505 ms), so it lands
// when the last layer's share is through (the prefill's end + 1 ms / 4 layers), or, on a link too
// slow to keep up, when all bytes are through counted from the prefill's start.
TEST(ServingSim, LayerwisePrefillDecodeTransferOverlapsThePrefill) {
  const RequestTrace t = trace_of({request(0, 1000, 3, {1, 2})});
  ServeConfig cfg = pd_config();
  cfg.pd_layerwise = true;
  ServeTarget target = toy_target();
  target.layers = 4;
  ServeHardware hw = toy_hardware();
  hw.pd_gbps = 1;
  const auto curve = FootprintCurve::proportional(1000);
  ServeResult r = simulate_serving(t, curve, target, hw, cfg);
  ASSERT_EQ(r.completed, 1);
  EXPECT_NEAR(r.per_request[0].ttft_ms(), 25.505, 1e-9);
  const double decodes = 1.501001 + 1.501002 + 2 * kTable4Ms;
  EXPECT_NEAR(r.per_request[0].finish_ms, 25.505 + 0.25 + decodes, 1e-9);
  hw.pd_gbps = 0.01;  // 100 ms for the megabyte: the link, not the prefill, decides
  r = simulate_serving(t, curve, target, hw, cfg);
  EXPECT_NEAR(r.per_request[0].finish_ms, 100.0 + decodes, 1e-9);
  cfg.pd_layerwise = false;  // after the prefill: 25.505 + 100
  r = simulate_serving(t, curve, target, hw, cfg);
  EXPECT_NEAR(r.per_request[0].finish_ms, 125.505 + decodes, 1e-9);
}

// Two prompts finishing in the same iteration on one prefill instance share its link: the second
// megabyte leaves when the first has gone (1 ms each at 1 GB/s).
TEST(ServingSim, PrefillDecodeTransfersQueueOnThePrefillInstancesLink) {
  const RequestTrace t = trace_of({request(0, 1000, 2, {1, 2}), request(0, 1000, 2, {3, 4})});
  ServeConfig cfg = pd_config();
  ServeHardware hw = toy_hardware();
  hw.pd_gbps = 1;
  const ServeResult r =
      simulate_serving(t, FootprintCurve::proportional(1000), toy_target(), hw, cfg);
  ASSERT_EQ(r.completed, 2);
  const double t0 = r.per_request[0].first_token_ms, t1 = r.per_request[1].first_token_ms;
  EXPECT_DOUBLE_EQ(t0, t1);  // one prefill iteration for both
  // The first lands after 1 ms and decodes (1.501001 ms); the second lands 1 ms later, mid-step,
  // and decodes after it (without the queue both would land at 1 ms and decode together).
  EXPECT_NEAR(r.per_request[0].finish_ms - t0, 1.0 + 1.501001, 1e-6);
  EXPECT_NEAR(r.per_request[1].finish_ms - t0, 1.0 + 1.501001 + 1.501001, 1e-6);
}

TEST(ServingSim, ParsesAllocatorNames) {
  EXPECT_EQ(parse_enum(kKvAllocators, "pow2", "allocator"), KvAllocator::kPow2);
  EXPECT_STREQ(enum_name(kKvAllocators, parse_enum(kKvAllocators, "contiguous_max", "allocator")),
               "contiguous_max");
  try {
    parse_enum(kKvAllocators, "paget", "allocator");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paged"), std::string::npos) << e.what();
  }
}

// The real conversation trace at Llama-3.1-8B's bytes per token on a pool small enough that
// capacity binds: compression (a quarter of the bytes) runs more requests at once and, with the
// same prefix-store bytes, hits more often.
TEST(ServingSimMooncake, CompressionBuysConcurrencyAndPrefixHits) {
  const std::string path = test::data_dir() + "/mooncake-traces/conversation_trace.jsonl";
  if (!file_exists(path)) GTEST_SKIP() << "no trace at " << path;
  RequestTrace t = read_request_trace(path);
  t.requests.resize(400);
  ServeTarget target;
  target.name = "llama-3.1-8b";
  target.weight_bytes = 16.06e9;
  target.flops_per_token = 2 * 7.5e9;
  target.attn_flops_per_pair = 4.0 * 32 * 32 * 128;
  target.kv_bytes_per_token = 131072;
  target.max_context = 131072;
  ServeConfig cfg;
  cfg.kv_pool_bytes = 8.0 * (1ll << 30);
  cfg.prefix_cache_bytes = 16.0 * (1ll << 30);
  const ServeResult full =
      simulate_serving(t, FootprintCurve::proportional(131072), target, ServeHardware{}, cfg);
  const ServeResult q4 =
      simulate_serving(t, FootprintCurve::proportional(131072 / 4.0), target, ServeHardware{}, cfg);
  for (const ServeResult* r : {&full, &q4}) {
    EXPECT_EQ(r->completed + r->rejected, 400);
    EXPECT_LE(r->kv_utilization, 1.0);
    EXPECT_GT(r->prefix_hit_rate, 0);
    for (const auto& q : r->per_request)
      if (!q.rejected) {
        EXPECT_GE(q.ttft_ms(), 0);
        EXPECT_GE(q.finish_ms, q.first_token_ms);
      }
  }
  EXPECT_GT(q4.mean_running, 1.5 * full.mean_running);
  EXPECT_LT(q4.ttft_ms_p50, full.ttft_ms_p50);
  // Under this load queueing also moves the hit rate (a request that waits finds more of its
  // prefix stored), so compare the store's capacity at a twentieth of the load, where requests
  // rarely wait: a quarter of the bytes per block holds more blocks and hits more often.
  // The pool is large enough that no request is rejected (rejected requests would leave the
  // hit rate's denominator).
  cfg.time_scale = 20;
  cfg.kv_pool_bytes = 24.0 * (1ll << 30);
  cfg.prefix_cache_bytes = 128.0 * (1ll << 30);
  const ServeResult full_light =
      simulate_serving(t, FootprintCurve::proportional(131072), target, ServeHardware{}, cfg);
  const ServeResult q4_light =
      simulate_serving(t, FootprintCurve::proportional(131072 / 4.0), target, ServeHardware{}, cfg);
  EXPECT_EQ(full_light.rejected, 0);
  // 2,048 blocks of 64 MiB against 8,192 of 16 MiB (measured: 0.037 against 0.136, the latter
  // already the unlimited store's rate on these 400 requests).
  EXPECT_GT(q4_light.prefix_hit_rate, full_light.prefix_hit_rate + 0.05);
}

}  // namespace
}  // namespace kvb
