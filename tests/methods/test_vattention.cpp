// vattention (methods/vattention): the ledger's resident bytes are what mincore reports and track
// the tokens exactly - ceil(n x row_bytes / page) pages per layer, K and V - at 4 KiB and 64 KiB
// pages, through prefill, decode, fork, truncate and release (eager and deferred reclamation);
// the store's logits equal the full cache's bit for bit through attend_dense and closely through
// the decode kernel (several sequences of different lengths in one batch); bad settings and
// overflowing slots are refused with the parameter named.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "methods/vattention/vattention_kv_cache.h"
#include "tests/methods/cache_driver.h"
#include "tests/methods/method_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::rnd;
using test::tiny;

std::unique_ptr<KvCache> make(const CacheContext& ctx, const std::string& name,
                              nlohmann::json params = nlohmann::json::object()) {
  return MethodRegistry::instance().create(name, ctx, params);
}

VAttentionKvCache& as_va(KvCache& kv) { return dynamic_cast<VAttentionKvCache&>(kv); }

// Pages of `page` bytes one layer's K (or V) of n tokens needs, times the 2 x layers buffers.
int64_t expected_resident(int64_t n, int64_t row, int64_t page, int64_t layers) {
  return 2 * layers * ((n * row + page - 1) / page) * page;
}

TEST(VAttention, ResidentBytesTrackTokensPageByPage) {
  // 2 layers, 2 KV heads x 16 dims, fp32: 128 bytes per token per layer and K/V.
  const ModelConfig c = tiny(2, 4, 2, 16);
  const CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  for (int64_t kib : {4, 64}) {
    SCOPED_TRACE(kib);
    const int64_t page = kib * 1024;
    auto kv = make(ctx, "vattention", {{"page_kib", kib}, {"max_batch", 2}, {"max_context", 2048}});
    VAttentionKvCache& va = as_va(*kv);
    ASSERT_EQ(va.row_bytes(), 128);
    EXPECT_EQ(kv->footprint().physical_bytes(), 0);  // reserved, nothing committed
    test::Driver d{kv.get(), 2};
    // Prefill 33 tokens, then decode one at a time across page boundaries (32 tokens per 4 KiB).
    d.step(rnd({33, 4, 16}, 1), rnd({33, 2, 16}, 2), rnd({33, 2, 16}, 3), Phase::kPrefill);
    for (int64_t n = 33; n <= 70; ++n) {
      const Footprint f = kv->footprint();
      EXPECT_EQ(f.device_payload_bytes, expected_resident(n, 128, page, 2)) << n;
      EXPECT_EQ(va.resident_bytes_of(0), f.device_payload_bytes);
      EXPECT_EQ(f.tokens_held, n);
      EXPECT_EQ(f.logical_bytes, n * 2 * 2 * 128);
      EXPECT_EQ(f.device_reserved_bytes, 0);
      d.step(rnd({1, 4, 16}, 10 + n), rnd({1, 2, 16}, 200 + n), rnd({1, 2, 16}, 400 + n));
    }
    const auto counters = kv->counters();
    EXPECT_EQ(counters.at("page_bytes"), page);
    EXPECT_EQ(counters.at("resident_bytes"), counters.at("committed_bytes"));
    EXPECT_EQ(counters.at("fragmentation_bytes"),
              expected_resident(71, 128, page, 2) - 71 * 2 * 2 * 128);
    // Truncation gives the tail pages back; release gives everything back.
    kv->truncate(0, 20);
    EXPECT_EQ(kv->footprint().device_payload_bytes, expected_resident(20, 128, page, 2));
    kv->release(0);
    EXPECT_EQ(kv->footprint().allocated_bytes(), 0);
    EXPECT_EQ(kv->counters().at("resident_bytes"), 0);
  }
}

TEST(VAttention, DeferredReclamationKeepsPagesForTheSlotsNextSequence) {
  const ModelConfig c = tiny(2, 4, 2, 16);
  const CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto kv =
      make(ctx, "vattention",
           {{"page_kib", 4}, {"max_batch", 2}, {"max_context", 1024}, {"reclaim", "deferred"}});
  test::Driver d{kv.get(), 2};
  d.step(rnd({100, 4, 16}, 1), rnd({100, 2, 16}, 2), rnd({100, 2, 16}, 3), Phase::kPrefill);
  const int64_t held = expected_resident(100, 128, 4096, 2);
  EXPECT_EQ(kv->footprint().device_payload_bytes, held);
  kv->release(0);
  Footprint f = kv->footprint();
  EXPECT_EQ(f.device_payload_bytes, 0);
  EXPECT_EQ(f.device_reserved_bytes, held);  // still resident, waiting for the slot's next user
  // The next sequence takes that slot and needs no new pages for its first 100 tokens.
  const int64_t calls = static_cast<int64_t>(kv->counters().at("map_calls"));
  test::Driver d2{kv.get(), 2, /*seq=*/7};
  d2.step(rnd({50, 4, 16}, 4), rnd({50, 2, 16}, 5), rnd({50, 2, 16}, 6), Phase::kPrefill);
  EXPECT_EQ(static_cast<int64_t>(kv->counters().at("map_calls")), calls);
  f = kv->footprint();
  EXPECT_EQ(f.device_payload_bytes, held);
  EXPECT_EQ(f.device_reserved_bytes, 0);
}

TEST(VAttention, ForkCopiesIntoItsOwnSlotAndSlotsRunOut) {
  const ModelConfig c = tiny(2, 4, 2, 16);
  const CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto kv = make(ctx, "vattention", {{"page_kib", 4}, {"max_batch", 2}, {"max_context", 256}});
  test::Driver d{kv.get(), 2};
  const at::Tensor q = rnd({40, 4, 16}, 1), k = rnd({40, 2, 16}, 2), v = rnd({40, 2, 16}, 3);
  d.step(q, k, v, Phase::kPrefill);
  kv->fork(0, 1);
  EXPECT_EQ(kv->seq_len(1), 40);
  EXPECT_EQ(kv->footprint().device_payload_bytes, 2 * expected_resident(40, 128, 4096, 2));
  const auto a = probe_view_of(*kv, 1, 0), b = probe_view_of(*kv, 1, 1);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(at::equal(a[1].k, b[1].k));
  EXPECT_TRUE(at::equal(a[0].v, b[0].v));
  EXPECT_TRUE(at::equal(a[0].k, k.select(1, 0)));
  // Both slots taken: a third sequence is refused, naming max_batch.
  test::Driver d3{kv.get(), 2, /*seq=*/9};
  try {
    d3.step(rnd({1, 4, 16}, 4), rnd({1, 2, 16}, 5), rnd({1, 2, 16}, 6), Phase::kPrefill);
    ADD_FAILURE() << "a third sequence fit in two slots";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_batch=2"), std::string::npos) << e.what();
  }
  // A sequence longer than max_context is refused.
  test::Driver d0{kv.get(), 2};
  d0.pos = 40;
  EXPECT_THROW(
      d0.step(rnd({217, 4, 16}, 7), rnd({217, 2, 16}, 8), rnd({217, 2, 16}, 9), Phase::kPrefill),
      Error);
}

TEST(VAttention, RefusesPagesTheDeviceCannotMap) {
  const ModelConfig c = tiny(2, 4, 2, 16);
  const CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  for (const auto& [kib, want] :
       std::vector<std::pair<int64_t, std::string>>{{48, "power of two"}}) {
    try {
      make(ctx, "vattention", {{"page_kib", kib}});
      ADD_FAILURE() << "accepted page_kib " << kib;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("page_kib=" + std::to_string(kib)), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// Same logits as the full cache: bit for bit through attend_dense (the same rows, the same
// kernel), and within rounding through the decode kernel reading each sequence's slot whole.
TEST(VAttentionModel, LogitsMatchTheFullCache) {
  auto m = test::stories260k();
  const CacheContext ctx{m->config, m->device, m->dtype};
  std::vector<int64_t> a(90, 300), b(37, 301);
  a[0] = b[0] = 1;
  for (size_t i = 1; i < a.size(); ++i) a[i] = 250 + static_cast<int64_t>(i * 7 % 200);
  for (size_t i = 1; i < b.size(); ++i) b[i] = 260 + static_cast<int64_t>(i * 5 % 150);
  auto run = [&](const std::string& method, const nlohmann::json& p) {
    Engine e(m, make(ctx, method, p));
    const int64_t sa = e.new_sequence(), sb = e.new_sequence();
    std::vector<at::Tensor> out = {e.prefill({sa, sb}, {a, b})};
    for (int i = 0; i < 12; ++i) out.push_back(e.decode({sa, sb}, {310 + i, 320 + i}));
    if (method == "vattention") {
      const auto c = e.kv().counters();
      EXPECT_EQ(c.at("kernel_decode_steps"), p.at("decode_kernel").get<bool>() ? 12 : 0);
      EXPECT_EQ(c.at("decode_steps"), 12);
    }
    return at::stack(out);
  };
  const at::Tensor full = run("full", nlohmann::json::object());
  const at::Tensor dense = run("vattention", {{"page_kib", 4}, {"decode_kernel", false}});
  EXPECT_TRUE(at::equal(full, dense));
  const at::Tensor kernel = run("vattention", {{"page_kib", 64}, {"decode_kernel", true}});
  EXPECT_LT((kernel - full).abs().max().item<float>(), 1e-4f);
}

}  // namespace
}  // namespace kvb

namespace kvb {
namespace {

// On a GPU (scripts/device-check.sh runs it in the full build's kvb_tests): the same store over
// CUDA's virtual memory API - 2 MiB pages committed per layer and K/V as tokens arrive, the decode
// kernel reading each sequence's slot - gives the full cache's outputs, and its resident bytes are
// the pages the driver mapped. Smaller pages are refused on CUDA at config time.
TEST(VAttentionCuda, MatchesTheFullCacheOverCudaVirtualMemory) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  const ModelConfig c = test::tiny(2, 8, 2, 128);
  const CacheContext ctx{c, c10::Device("cuda"), at::kHalf};
  EXPECT_THROW(MethodRegistry::instance().create("vattention", ctx, {{"page_kib", 64}}), Error);
  auto va = MethodRegistry::instance().create(
      "vattention", ctx, {{"page_kib", 2048}, {"max_batch", 2}, {"max_context", 8192}});
  auto full = MethodRegistry::instance().create("full", ctx, nlohmann::json::object());
  const auto opts = at::TensorOptions().dtype(at::kHalf).device(c10::Device("cuda"));
  test::Driver dv{va.get(), 2}, df{full.get(), 2};
  const at::Tensor q = test::rnd({700, 8, 128}, 1).to(opts),
                   k = test::rnd({700, 2, 128}, 2).to(opts),
                   v = test::rnd({700, 2, 128}, 3).to(opts);
  dv.step(q, k, v, Phase::kPrefill);
  df.step(q, k, v, Phase::kPrefill);
  for (int i = 0; i < 4; ++i) {
    const at::Tensor qi = test::rnd({1, 8, 128}, 10 + i).to(opts),
                     ki = test::rnd({1, 2, 128}, 20 + i).to(opts),
                     vi = test::rnd({1, 2, 128}, 30 + i).to(opts);
    const at::Tensor a = dv.step(qi, ki, vi), b = df.step(qi, ki, vi);
    EXPECT_LT((a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<float>(), 2e-3f);
  }
  // 704 tokens x 512 bytes = 352 KiB: one 2 MiB page per layer and K/V.
  EXPECT_EQ(va->footprint().device_payload_bytes, 2 * 2 * (int64_t{2} << 20));
  EXPECT_EQ(va->counters().at("kernel_decode_steps"), 4);
  va->release(0);
  EXPECT_EQ(va->footprint().allocated_bytes(), 0);
}

}  // namespace
}  // namespace kvb
