// The method contract with the baseline methods: registry vs method folders, equal logits with the
// engine's own KV path, exact ledger figures, reserved bytes of the static store.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "tests/methods/greedy_trace.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::shared_ptr<Model> stories() { return load_model(test::models_dir() + "/stories260K"); }

// The cache is built with its model, as a run builds it (a calibrating method calibrates on it).
std::unique_ptr<KvCache> make(const std::shared_ptr<Model>& m, const std::string& name,
                              nlohmann::json params = {}) {
  CacheContext ctx{m->config, m->device, m->dtype, m};
  return MethodRegistry::instance().create(name, ctx, params.is_null() ? nlohmann::json::object() : params);
}

TEST(Methods, RegistryHoldsExactlyTheMethodFolders) {
  std::vector<std::string> builtin;
  for (const auto& n : MethodRegistry::instance().names())
    if (MethodRegistry::instance().info(n).origin == "builtin") builtin.push_back(n);
  EXPECT_EQ(builtin, builtin_method_folders());
  EXPECT_GE(builtin.size(), 3u);
}

TEST(Methods, EveryMethodBuildsWithDefaultsAndRejectsUnknownParams) {
  auto m = stories();
  for (const auto& n : MethodRegistry::instance().names()) {
    auto kv = make(m, n, test::runnable_params(n));
    ASSERT_NE(kv, nullptr) << n;
    try {
      make(m, n, {{"no_such_param", 1}});
      ADD_FAILURE() << n << " accepted an unknown parameter";
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find("unknown parameter 'no_such_param'"), std::string::npos);
    }
  }
}

TEST(Methods, ParamErrorsNameKeyValueAndRange) {
  auto m = stories();
  try {
    make(m, "paged", {{"block_size", 0}});
    FAIL();
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("method paged.block_size: 0 is outside the allowed range"), std::string::npos) << e.what();
  }
  try {
    make(m, "paged", {{"block_sise", 8}});
    FAIL();
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'block_size'"), std::string::npos) << e.what();
  }
  try {
    MethodRegistry::instance().info("pagd");
    FAIL();
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'paged'"), std::string::npos) << e.what();
  }
}

// Prefill a 40-token prompt in chunks of 7, then decode 10 tokens; return every logit row.
at::Tensor trace(std::shared_ptr<Model> m, std::unique_ptr<KvCache> kv) {
  return test::greedy_trace(std::move(m), std::move(kv));
}

TEST(Methods, BaselinesGiveTheEngineDefaultLogits) {
  auto m = stories();
  at::Tensor ref = trace(m, make_default_kv(*m));
  // paged with its defaults is the engine's own store: bit-identical.
  EXPECT_TRUE(at::equal(trace(m, make(m, "paged")), ref));
  // Other layouts change only the order of the online-softmax sums (fp32 rounding, |logit| ~ 10).
  for (const char* name : {"full", "static"}) {
    at::Tensor got = trace(m, make(m, name));
    EXPECT_LT((got - ref).abs().max().item<double>(), 1e-4) << name;
  }
  at::Tensor p1 = trace(m, make(m, "paged", {{"block_size", 1}}));
  EXPECT_LT((p1 - ref).abs().max().item<double>(), 1e-4);
}

TEST(Methods, PagedLedgerIsExact) {
  auto m = stories();
  const auto& c = m->config;
  for (int64_t bs : {1, 16, 64}) {
    Engine e(m, make(m, "paged", {{"block_size", bs}, {"initial_blocks", 4}}));
    std::vector<int64_t> a(40, 300), b(23, 301);
    a[0] = b[0] = 1;
    int64_t s1 = e.new_sequence(), s2 = e.new_sequence();
    e.prefill({s1, s2}, {a, b});
    const int64_t blocks = (40 + bs - 1) / bs + (23 + bs - 1) / bs;
    Footprint f = e.kv().footprint();
    EXPECT_EQ(f.device_payload_bytes, blocks * bs * c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4) << bs;
    EXPECT_EQ(f.tokens_held, 63);
    EXPECT_EQ(f.logical_bytes, 63 * c.kv_bytes_per_token(4));
    EXPECT_EQ(f.device_index_bytes, blocks * 4);
    EXPECT_GE(f.device_reserved_bytes, 0);
  }
}

TEST(Methods, StaticReportsReservedButUnusedBytes) {
  auto m = stories();
  Engine e(m, make(m, "static", {{"max_seq_len", 100}}));
  int64_t s = e.new_sequence();
  e.prefill({s}, {std::vector<int64_t>(40, 300)});
  Footprint f = e.kv().footprint();
  const int64_t per_token = m->config.kv_bytes_per_token(4);
  EXPECT_EQ(f.device_payload_bytes, 40 * per_token);
  EXPECT_EQ(f.device_reserved_bytes, 60 * per_token);
  EXPECT_EQ(f.allocated_bytes(), 100 * per_token);
  // Past the reservation the static store refuses, naming the limit.
  int64_t s2 = e.new_sequence();
  try {
    e.prefill({s2}, {std::vector<int64_t>(101, 300)});
    FAIL();
  } catch (const kvb::Error& err) {
    EXPECT_NE(std::string(err.what()).find("max_seq_len reserves 100"), std::string::npos) << err.what();
  }
}

TEST(Methods, PagedForkHoldsFewerBlocksThanTwoCopies) {
  auto m = stories();
  std::vector<int64_t> prompt(64, 300);
  prompt[0] = 1;
  Engine shared(m, make(m, "paged", {{"block_size", 16}}));
  int64_t a = shared.new_sequence();
  shared.prefill({a}, {prompt});
  int64_t b = shared.fork(a);
  shared.decode({a, b}, {400, 401});
  Engine separate(m, make(m, "paged", {{"block_size", 16}}));
  int64_t x = separate.new_sequence(), y = separate.new_sequence();
  separate.prefill({x, y}, {prompt, prompt});
  separate.decode({x, y}, {400, 401});
  const int64_t forked = shared.kv().footprint().device_payload_bytes;
  const int64_t copies = separate.kv().footprint().device_payload_bytes;
  RecordProperty("fork_saving_bytes", std::to_string(copies - forked));
  EXPECT_EQ(copies, 10 * 16 * m->config.kv_bytes_per_token(4));  // 2 x ceil(65 / 16)
  EXPECT_EQ(forked, 6 * 16 * m->config.kv_bytes_per_token(4));   // 4 shared + 2 own tail blocks
}

}  // namespace
}  // namespace kvb
