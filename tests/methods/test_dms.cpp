// dms on the real stories260K: keep_all is the full cache; evict_all is a sliding window of
// `window` tokens per head; an adapter's per-head decisions make each KV head keep its own ragged
// set, with eviction delayed until a token leaves the window; `dms-train`'s trainer reaches its
// compression target and writes an adapter the method loads; bad adapters are refused by name.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "methods/dms/dms_adapter.h"
#include "methods/dms/dms_train.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(const nlohmann::json& params) {
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device,
                   test::stories260k()->dtype};
  return MethodRegistry::instance().create("dms", ctx, params);
}

std::vector<int64_t> prompt(int n) {
  std::vector<int64_t> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (i * 37) % 500);
  return p;
}

TEST(Dms, KeepAllIsTheFullCache) {
  auto m = test::stories260k();
  Engine full(
      m, MethodRegistry::instance().create("full", CacheContext{m->config, m->device, m->dtype},
                                           nlohmann::json::object()));
  Engine dms(m, make({{"decisions", "keep_all"}, {"window", 8}}));
  const int64_t a = full.new_sequence(), b = dms.new_sequence();
  at::Tensor x = full.prefill({a}, {prompt(90)}), y = dms.prefill({b}, {prompt(90)});
  EXPECT_LT((x - y).abs().max().item<double>(), 1e-4);
  for (int i = 0; i < 10; ++i) {
    x = full.decode({a}, {300 + i});
    y = dms.decode({b}, {300 + i});
    EXPECT_LT((x - y).abs().max().item<double>(), 1e-4) << i;
  }
  EXPECT_EQ(dms.kv().counters().at("realized_cr"), 1.0);
}

TEST(Dms, EvictAllKeepsTheWindowOfEachHead) {
  auto m = test::stories260k();
  const auto& c = m->config;
  Engine e(m, make({{"decisions", "evict_all"}, {"window", 8}}));
  const int64_t a = e.new_sequence();
  e.prefill({a}, {prompt(100)});
  for (int i = 0; i < 10; ++i) e.decode({a}, {300 + i});
  // 110 tokens: every head keeps positions 102..109.
  const Footprint f = e.kv().footprint();
  EXPECT_EQ(f.device_payload_bytes, c.n_layers * c.n_kv_heads * 8 * 2 * c.head_dim * 4);
  EXPECT_EQ(f.tokens_held, 110);
  EXPECT_NEAR(e.kv().counters().at("realized_cr"), 110.0 / 8, 1e-12);
}

TEST(Dms, AdapterDecisionsArePerHeadAndDelayed) {
  // Head 0 of every layer evicts every token (alpha = 100 * 1 - 5 > 0), heads 1-3 keep all.
  auto m = test::stories260k();
  const auto& c = m->config;
  dms::Adapter ad = dms::Adapter::fresh(c, 8);
  for (auto& b : ad.bias) b[0] = 1.0f;
  const std::string path = test::make_temp_dir("dms") + "/adapter.safetensors";
  ad.save(path);
  Engine e(m, make({{"adapter", path}}));
  const int64_t a = e.new_sequence();
  e.prefill({a}, {prompt(100)});
  for (int i = 0; i < 10; ++i) e.decode({a}, {300 + i});
  const Footprint f = e.kv().footprint();
  const int64_t entries = c.n_layers * (8 + (c.n_kv_heads - 1) * 110);
  EXPECT_EQ(f.device_payload_bytes, entries * 2 * c.head_dim * 4);
  EXPECT_EQ(f.device_index_bytes, entries * 4);
  const auto k = e.kv().counters();
  EXPECT_NEAR(k.at("realized_cr_head_max"), 110.0 / 8, 1e-12);
  EXPECT_EQ(k.at("realized_cr_head_min"), 1.0);
  EXPECT_EQ(k.at("window"), 8);  // from the adapter file
  // The same adapter, window overridden: head 0 keeps 20.
  Engine e2(m, make({{"adapter", path}, {"window", 20}}));
  const int64_t b = e2.new_sequence();
  e2.prefill({b}, {prompt(100)});
  EXPECT_NEAR(e2.kv().counters().at("realized_cr_head_max"), 100.0 / 20, 1e-12);
}

TEST(Dms, TrainerReachesItsTargetAndWritesAnAdapterTheMethodLoads) {
  auto m = test::stories260k();
  dms::TrainOptions o;
  o.recipe = test::fixtures_dir() + "/../../configs/models/kvb-testbed-cpu-retrieval-1k.json";
  o.out = test::make_temp_dir("dms-train") + "/adapter.safetensors";
  o.steps = 40;
  o.batch = 2;
  o.seq_len = 128;
  o.window = 16;
  o.target_cr = 2.0;
  o.ramp_fraction = 0.5;
  o.lr = 1e-3;
  o.log_every = 10;
  std::vector<std::string> lines;
  o.log = [&](const std::string& s) { lines.push_back(s); };
  const dms::TrainResult r = dms::train_adapter(m, o);
  EXPECT_EQ(r.steps, 40);
  // A line every log_every steps, each with the time so far and what is left.
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].rfind("step 10/40: KL ", 0), 0u) << lines[0];
  for (const auto& l : lines) EXPECT_NE(l.find(" elapsed, ETA "), std::string::npos) << l;
  EXPECT_EQ(lines[3].substr(lines[3].size() - 6), "ETA 0s") << lines[3];
  EXPECT_TRUE(std::isfinite(r.kl));
  EXPECT_GT(r.realized_frac, 0.35);  // the target is 0.5 once the ramp is done
  ASSERT_TRUE(std::filesystem::exists(o.out));
  const dms::Adapter back = dms::Adapter::load(o.out, m->config);
  EXPECT_EQ(back.window, 16);
  EXPECT_EQ(back.info.at("trained_steps"), "40");
  // Used by the method on unseen text: it evicts, and stays close to the full cache.
  StreamSampleResult s = run_stream_sample(m, "dms", {{"adapter", o.out}},
                                           test::story_windows(256, 1).at(0), StreamOptions{});
  EXPECT_GT(s.counters.at("realized_cr"), 1.3);
  double kl = 0;
  for (float v : s.kl) kl += v;
  EXPECT_LT(kl / static_cast<double>(s.kl.size()), 1.0);
}

TEST(Dms, RefusesMissingOrForeignAdaptersNamingThem) {
  auto expect_error = [&](const nlohmann::json& p, const std::string& want) {
    try {
      make(p);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error(nlohmann::json::object(), "dms.adapter");
  expect_error({{"adapter", "/nonexistent/adapter.safetensors"}},
               "/nonexistent/adapter.safetensors");
  expect_error({{"decisions", "keep_all"}}, "dms.window");
  // An adapter made for another shape.
  ModelConfig other = test::stories260k()->config;
  other.n_layers += 1;
  const std::string path = test::make_temp_dir("dms-bad") + "/adapter.safetensors";
  dms::Adapter::fresh(other, 8).save(path);
  expect_error({{"adapter", path}}, "layers");
}

}  // namespace
}  // namespace kvb
