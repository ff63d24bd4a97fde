// qfilters on kvb-testbed: each filter is the first right-singular vector of its KV head's
// calibration queries (checked against a direct SVD), unit norm, with a negative mean projection;
// at the end of prefill every KV head keeps exactly the budget's entries with the highest
// -(key . filter) of the engine's own post-RoPE keys, and the ledger's payload shrinks to them; the
// artifact is computed once and then read from its file.

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "harness/common/error.h"
#include "methods/common/calibration_text.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/tensor_artifact.h"
#include "methods/qfilters/qfilters.h"
#include "tests/methods/calibrated_test_util.h"

namespace kvb {
namespace {

CalibrationText small_text() {
  CalibrationText t;
  t.data_dir = test::data_dir();
  t.samples = 2;
  t.tokens = 128;
  return t;
}

TEST(QFilters, FiltersAreTheQueriesFirstSingularVectors) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  const CalibrationText t = small_text();
  const at::Tensor f = qfilters::calibrate_filters(m, t);
  ASSERT_EQ(f.sizes(), (std::vector<int64_t>{c.n_layers, c.n_kv_heads, c.head_dim}));
  // The same queries, gathered whole, through a direct SVD.
  const int64_t G = c.group_size();
  std::vector<std::vector<at::Tensor>> rows(static_cast<size_t>(c.n_layers * c.n_kv_heads));
  run_calibration_text(m, t, [&](int64_t, const LayerInput& in) {
    const int64_t T = in.q->size(0);
    at::Tensor q = in.q->to(at::kDouble).view({T, c.n_kv_heads, G, c.head_dim});
    for (int64_t h = 0; h < c.n_kv_heads; ++h)
      rows[in.layer * c.n_kv_heads + h].push_back(q.select(1, h).reshape({T * G, c.head_dim}));
  });
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const at::Tensor q = at::cat(rows[l * c.n_kv_heads + h], 0);
      const at::Tensor v = std::get<2>(at::linalg_svd(q, false)).select(0, 0);  // Vh[0]
      const at::Tensor fh = f[l][h].to(at::kDouble);
      EXPECT_NEAR(fh.norm().item<double>(), 1.0, 1e-5);
      EXPECT_GT(std::abs(at::dot(v, fh).item<double>()), 0.9999) << l << "/" << h;
      EXPECT_LT(at::matmul(q, fh).mean().item<double>(), 0.0) << l << "/" << h;
    }
}

TEST(QFilters, EachHeadKeepsItsTopFilterScoresAndFreesTheRest) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  const std::string dir = test::make_temp_dir("qfilters");
  const nlohmann::json p = {{"cache_dir", dir},
                            {"data_dir", test::data_dir()},
                            {"calib_samples", 2},
                            {"calib_tokens", 128},
                            {"budget", 0.25}};
  const int64_t before = tensor_artifacts_computed();
  auto art = MethodRegistry::instance().calibrate("qfilters", m, p);
  EXPECT_EQ(tensor_artifacts_computed(), before + 1);
  const at::Tensor f = dynamic_cast<const TensorArtifact&>(*art).get("filters");
  const int64_t T = 400, B = T / 4;
  const std::vector<int64_t> prompt = test::walk_prompt(T, c.vocab_size);
  // The keys the engine hands a store.
  test::KeyCapture capture(c.n_layers);
  test::KeyCapture* cap = &capture;
  {
    Engine full(m, cap->watch(test::make_with_model(m, "full", nlohmann::json::object())));
    full.prefill({full.new_sequence()}, {prompt});
    Engine e(m, test::make_with_model(m, "qfilters", p));
    const int64_t seq = e.new_sequence();
    e.prefill({seq}, {prompt});
    auto* ev = dynamic_cast<EvictingKvCache*>(&e.kv());
    ASSERT_NE(ev, nullptr);
    int64_t entries = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      const at::Tensor k = cap->keys(l);  // [T, Hkv, D]
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        const at::Tensor s = -at::matmul(k.select(1, h), f[l][h]);  // [T]
        const std::vector<int32_t> kept = ev->kept_indices(seq, l, h);
        EXPECT_EQ(kept, test::top_positions(s, B)) << l << "/" << h;
        entries += static_cast<int64_t>(kept.size());
      }
    }
    EXPECT_EQ(entries, c.n_layers * c.n_kv_heads * B);
    EXPECT_EQ(e.kv().footprint().device_payload_bytes, entries * 2 * c.head_dim * 4);
    EXPECT_EQ(e.kv().counters().at("calib_from_cache"), 0.0);
  }
  // A second model object: the artifact comes from the file.
  auto again = MethodRegistry::instance().calibrate("qfilters", test::testbed(true), p);
  EXPECT_EQ(tensor_artifacts_computed(), before + 1);
  EXPECT_TRUE(again->from_cache);
  EXPECT_TRUE(at::equal(dynamic_cast<const TensorArtifact&>(*again).get("filters"), f));
}

}  // namespace
}  // namespace kvb
