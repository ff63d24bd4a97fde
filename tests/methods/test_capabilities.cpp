// The optional capabilities of a store (harness/kv/*.h, found with dynamic_cast): present on the
// stores that have them and absent on the others; passed on by the wrapping stores (WindowedKvCache
// with its layers renumbered, TwinKvCache, kv_packet's wrapper); used by the engine, which announces
// lookahead rows before each step and hands over each layer's hidden states before it attends.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "harness/engine/engine.h"
#include "harness/kv/document_reuse.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/lookahead.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/paged_kv_cache.h"
#include "harness/kv/probe_view.h"
#include "harness/kv/splice.h"
#include "harness/kv/twin_kv_cache.h"
#include "harness/kv/windowed_kv_cache.h"
#include "harness/model/model.h"
#include "methods/common/contiguous_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(const std::shared_ptr<Model>& m, const std::string& name,
                              const nlohmann::json& params = nlohmann::json::object()) {
  return MethodRegistry::instance().create(name, CacheContext{m->config, m->device, m->dtype},
                                           params);
}

// A dense store that records what it is handed through HiddenStateCache and which layers attend.
class RecordingStore : public ContiguousKvCache, public HiddenStateCache {
 public:
  explicit RecordingStore(const CacheContext& ctx)
      : ContiguousKvCache(ctx, Mode::kGrow, 0, "recording") {}
  void layer_hidden(int layer, const at::Tensor& hidden) override {
    hidden_layers.push_back(layer);
    hidden_rows.push_back(hidden.size(0));
  }
  at::Tensor attend(const LayerInput& in) override {
    attended_layers.push_back(in.layer);
    return ContiguousKvCache::attend(in);
  }
  std::vector<int> hidden_layers, attended_layers;
  std::vector<int64_t> hidden_rows;
};

// A twin that only runs both stores (its sampling hook does nothing).
class PlainTwin : public TwinKvCache {
 public:
  using TwinKvCache::TwinKvCache;
  std::string name() const override { return "plain-twin"; }

 protected:
  void on_layer(const LayerInput&, const at::Tensor&, const at::Tensor&) override {}
};

TEST(Capabilities, FoundOnTheStoresThatHaveThem) {
  const auto m = test::stories260k();
  struct Case {
    std::string method;
    nlohmann::json params;
    bool splices, probes, lookahead, hidden;
  };
  const std::vector<Case> cases = {
      {"full", nlohmann::json::object(), true, true, false, false},
      {"paged", nlohmann::json::object(), false, true, false, false},
      {"pertoken", nlohmann::json::object(), true, false, false, false},
      {"snapkv", {{"budget", 0.5}}, true, true, false, false},
      {"quest", nlohmann::json::object(), false, true, false, false},
      {"kvreviver", nlohmann::json::object(), false, true, false, false},
      {"specache", {{"predictor", "speculative"}}, false, false, true, false},
      {"specache", {{"predictor", "previous"}}, false, false, false, false},
      {"dms", {{"decisions", "keep_all"}, {"window", 8}}, false, false, false, true},
      {"ttkv", nlohmann::json::object(), false, false, false, false},
      {"kv_packet", {{"wrap", "none"}}, true, true, false, false},
  };
  for (const auto& c : cases) {
    auto kv = make(m, c.method, c.params);
    const std::string what = c.method + " " + c.params.dump();
    EXPECT_EQ(splicing(*kv) != nullptr, c.splices) << what;
    EXPECT_EQ(dynamic_cast<const ProbedCache*>(kv.get()) != nullptr, c.probes) << what;
    EXPECT_EQ(wanting_lookahead(*kv) != nullptr, c.lookahead) << what;
    EXPECT_EQ(dynamic_cast<HiddenStateCache*>(kv.get()) != nullptr, c.hidden) << what;
    EXPECT_EQ(document_reuse_of(*kv) != nullptr, c.method == "kv_packet") << what;
  }
}

TEST(Capabilities, KvPacketsWrapperPassesItsStoresOnes) {
  const auto m = test::stories260k();
  // kv_packet over the eviction store: the wrapper adds document reuse and passes splicing and
  // probing on to snapkv's store.
  auto kv = make(m, "kv_packet", {{"wrap", "none"}, {"inner", "snapkv"},
                                  {"inner_params", "{\"budget\": 0.5}"}});
  ASSERT_NE(document_reuse_of(*kv), nullptr);
  ASSERT_NE(splicing(*kv), nullptr);
  Engine e(m, std::move(kv));
  std::vector<int64_t> prompt = {1};
  for (int i = 0; i < 39; ++i) prompt.push_back(260 + (i * 13) % 250);
  const int64_t s = e.new_sequence();
  e.prefill({s}, {prompt});
  const std::vector<HeadSnapshot> view = probe_view_of(e.kv(), 0, s);
  ASSERT_EQ(static_cast<int64_t>(view.size()), m->config.n_kv_heads);
  // The budget of 0.5 holds: what the probe shows is what snapkv kept.
  EXPECT_EQ(view[0].index.size(0), 20);
}

TEST(Capabilities, TheEngineHandsEachLayerItsHiddenStateThroughTheWrappers) {
  const auto m = test::stories260k();
  const CacheContext ctx{m->config, m->device, m->dtype};
  std::vector<int64_t> prompt = {1, 300, 301, 302, 303};
  // Directly, and through a TwinKvCache (the probe protocol's wrapper): every layer, before it
  // attends, with the step's rows.
  for (bool twin : {false, true}) {
    auto store = std::make_unique<RecordingStore>(ctx);
    RecordingStore* rec = store.get();
    std::unique_ptr<KvCache> kv = std::move(store);
    if (twin)
      kv = std::make_unique<PlainTwin>(
          std::move(kv),
          std::make_unique<PagedKvCache>(ctx.config, ctx.device, ctx.dtype,
                                         PagedKvCache::Options{}),
          1, 0, false);
    Engine e(m, std::move(kv));
    const int64_t s = e.new_sequence();
    e.prefill({s}, {prompt});
    e.decode({s}, {304});
    const int64_t L = m->config.n_layers;
    ASSERT_EQ(static_cast<int64_t>(rec->hidden_layers.size()), 2 * L) << twin;
    EXPECT_EQ(rec->hidden_layers, rec->attended_layers) << twin;
    for (int64_t i = 0; i < 2 * L; ++i) {
      EXPECT_EQ(rec->hidden_layers[i], i % L);
      EXPECT_EQ(rec->hidden_rows[i], i < L ? 5 : 1);
    }
  }
}

TEST(Capabilities, WindowedStorePassesThemOnWithItsLayersRenumbered) {
  // Gemma 3's tiny fixture: layers 0 and 2 are sliding-window layers, 1 and 3 global, so the
  // method's store serves two layers, numbered 0 and 1.
  auto m = load_model(test::fixtures_dir() + "/hf/gemma3");
  ASSERT_EQ(m->config.layer_windows, (std::vector<int64_t>{6, 0, 6, 0}));
  const CacheContext ctx{m->config, m->device, m->dtype};
  auto inner = std::make_unique<RecordingStore>(global_layer_context(ctx));
  RecordingStore* rec = inner.get();
  Engine e(m, std::make_unique<WindowedKvCache>(ctx, std::move(inner)));
  const int64_t s = e.new_sequence();
  e.prefill({s}, {{1, 5, 6, 7}});
  EXPECT_EQ(rec->hidden_layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(rec->attended_layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(rec->hidden_rows, (std::vector<int64_t>{4, 4}));

  // Lookahead rows reach a store under the windowed one (SpeCache on the same model): the engine
  // then decodes [token, guess] pairs, and the windows keep only the real rows.
  auto spec = MethodRegistry::instance().create("specache", ctx, {{"predictor", "speculative"}});
  ASSERT_NE(wanting_lookahead(*spec), nullptr);
  Engine se(m, std::move(spec));
  const int64_t q = se.new_sequence();
  at::Tensor logits = se.prefill({q}, {{1, 5, 6, 7, 8, 9, 10}});
  int64_t tok = logits[0].argmax().item<int64_t>();
  for (int i = 0; i < 4; ++i) tok = se.decode({q}, {tok})[0].argmax().item<int64_t>();
  EXPECT_EQ(se.kv().seq_len(q), 11);
  const auto c = se.kv().counters();
  ASSERT_TRUE(c.count("speculative_hit_rate")) << "no guess was scored";
  EXPECT_GE(c.at("speculative_hit_rate"), 0.0);
}

}  // namespace
}  // namespace kvb
