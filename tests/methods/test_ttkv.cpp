// ttkv on the real stories260K: blocks leave the fast tier in order and the ledger puts them on
// the host (quantized) with a summary on the device; reading every slow block at 8 bits is close to
// the full cache, fewer blocks cost more and stream fewer bytes; the bound ranks blocks better than
// chance; fork; truncation stays in the fast tier; bad widths are refused.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "kvb/kernels/quantize.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(const nlohmann::json& params) {
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device,
                   test::stories260k()->dtype};
  return MethodRegistry::instance().create("ttkv", ctx, params);
}

// Blocks of 16, one sink block, two fast blocks: most of a 256-token window is in the slow tier.
double mean_kl(nlohmann::json params, std::map<std::string, double>* counters) {
  params["block_size"] = 16;
  params["fast_blocks"] = 2;
  return test::mean_story_kl("ttkv", params, 2, 128, counters);
}

TEST(Ttkv, OldBlocksMoveToTheHostQuantizedWithASummaryOnTheDevice) {
  auto m = test::stories260k();
  const auto& c = m->config;
  Engine e(m, make({{"block_size", 16},
                    {"sink_blocks", 1},
                    {"fast_blocks", 2},
                    {"k_bits", 8},
                    {"v_bits", 4}}));
  const int64_t a = e.new_sequence();
  std::vector<int64_t> p = {1};
  for (int i = 1; i < 100; ++i) p.push_back(3 + (i * 37) % 500);
  e.prefill({a}, {p});
  // 100 tokens = 6 complete blocks: the sink block, 3 demoted, the 2 newest fast, + 4 open tokens.
  auto counters = e.kv().counters();
  EXPECT_EQ(counters.at("slow_tokens"), 48);
  EXPECT_EQ(counters.at("fast_tokens"), 52);
  const Footprint f = e.kv().footprint();
  const int64_t W = c.kv_dim();
  EXPECT_EQ(f.device_payload_bytes, c.n_layers * 52 * 2 * W * 4);
  EXPECT_EQ(f.device_metadata_bytes, c.n_layers * 3 * 2 * W * 2);
  const kernels::GroupQuantShape ks{8, 16, W, 16, kernels::QuantAxis::kColumn};
  const kernels::GroupQuantShape vs{4, 16, W, 8, kernels::QuantAxis::kRow};  // 8 = head_dim
  const int64_t block = kernels::group_quant_code_bytes(ks) + kernels::group_quant_meta_bytes(ks) +
                        kernels::group_quant_code_bytes(vs) + kernels::group_quant_meta_bytes(vs);
  EXPECT_EQ(f.host_bytes, c.n_layers * 3 * block);
  // 16 decode steps complete one more block: one more demotion.
  for (int i = 0; i < 12; ++i) e.decode({a}, {300 + i});
  EXPECT_EQ(e.kv().counters().at("slow_tokens"), 64);
  EXPECT_EQ(e.kv().seq_len(a), 112);
}

TEST(Ttkv, EveryBlockAt8BitsIsNearlyFullAndFewerBlocksCostMoreButStreamLess) {
  std::map<std::string, double> all, one;
  const double kl_all = mean_kl({{"top_k_blocks", 100}, {"k_bits", 8}, {"v_bits", 8}}, &all);
  const double kl_one = mean_kl({{"top_k_blocks", 1}, {"k_bits", 8}, {"v_bits", 8}}, &one);
  std::cerr << "KL every block " << kl_all << ", one block " << kl_one << ", recall "
            << one.at("block_recall") << "\n";
  EXPECT_LT(kl_all, 1e-3);
  EXPECT_GT(kl_one, 3 * kl_all);
  EXPECT_GT(all.at("cross_tier_bytes_per_step"), 2 * one.at("cross_tier_bytes_per_step"));
  EXPECT_GT(one.at("cross_tier_bytes_per_step"), 0);
  // The min/max bound picks blocks holding more mass than one block's fair share.
  const double blocks = one.at("slow_tokens") / 16;
  EXPECT_GT(one.at("block_recall"), 1.5 / blocks);
  EXPECT_LE(one.at("block_recall"), 1.0 + 1e-9);
  EXPECT_EQ(all.count("block_recall"), 0u);  // every block read: nothing ranked
}

TEST(Ttkv, ForksContinueAlikeAndTruncationStaysInTheFastTier) {
  auto m = test::stories260k();
  Engine e(m, make({{"block_size", 16}, {"fast_blocks", 2}, {"top_k_blocks", 1}}));
  const int64_t a = e.new_sequence();
  std::vector<int64_t> p = {1};
  for (int i = 1; i < 90; ++i) p.push_back(3 + (i * 29) % 500);
  e.prefill({a}, {p});
  const int64_t f = e.fork(a);
  for (int i = 0; i < 4; ++i) {
    at::Tensor x = e.decode({a}, {310 + i}), y = e.decode({f}, {310 + i});
    EXPECT_TRUE(at::equal(x, y)) << i;
  }
  // 94 tokens: blocks 1..2 demoted (tokens 16..47), fast from 48.
  e.kv().truncate(f, 60);
  EXPECT_EQ(e.kv().seq_len(f), 60);
  at::Tensor after = e.decode({f}, {320});
  EXPECT_TRUE(after.isfinite().all().item<bool>());
  try {
    e.kv().truncate(a, 20);
    ADD_FAILURE() << "truncated into the slow tier";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("slow tier"), std::string::npos) << err.what();
  }
}

TEST(Ttkv, RefusesUnsupportedWidthsNamingThem) {
  try {
    make({{"k_bits", 5}});
    ADD_FAILURE() << "accepted k_bits 5";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_bits"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb
