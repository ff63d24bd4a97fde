// kvzap on kvb-testbed: the surrogate's targets are KVzip+ scores of one repeat prefill (checked
// against a direct fp64 computation), its input is the attention input the query projection reads,
// its ridge fit solves its own normal equations, it predicts held-out KVzip+ scores far better than
// chance, and at the end of prefill every KV head keeps exactly the budget's entries it scores
// highest, freeing the rest; the artifact is computed once and then read from its file.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/formats/tokenizer.h"
#include "methods/common/calibration_text.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/tensor_artifact.h"
#include "methods/kvzap/kvzap.h"
#include "tests/methods/calibrated_test_util.h"

namespace kvb {
namespace {

CalibrationText small_text(int64_t samples = 3, int64_t tokens = 96) {
  CalibrationText t;
  t.data_dir = test::data_dir();
  t.samples = samples;
  t.tokens = tokens;
  return t;
}

// The window's repeat sequence, built here from KVzip+'s description.
std::vector<int64_t> repeat_ids(const Tokenizer& tok, const std::vector<int64_t>& window) {
  std::vector<int64_t> ids = window;
  for (const auto& part :
       {tok.encode("\n\nRepeat the previous context exactly."), tok.encode("\n")})
    ids.insert(ids.end(), part.begin(), part.end());
  ids.insert(ids.end(), window.begin() + 1, window.end());
  return ids;
}

TEST(Kvzap, TargetsAreKvzipPlusScoresOfOneRepeatPass) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  const Tokenizer tok(m->tokenizer_path);
  const std::vector<int64_t> window = calibration_windows(*m, small_text(1, 40))[0];
  const int64_t n = static_cast<int64_t>(window.size()), text = n - 1;
  const kvzap::Targets t = kvzap::kvzip_plus_targets(m, window);
  ASSERT_EQ(static_cast<int64_t>(t.y.size()), c.n_layers);

  const std::vector<int64_t> ids = repeat_ids(tok, window);
  const int64_t T = static_cast<int64_t>(ids.size()), r0 = T - text;
  auto owned = std::make_unique<test::LayerCapture>(make_default_kv(*m), c.n_layers);
  test::LayerCapture* cap = owned.get();
  Engine e(m, std::move(owned));
  e.prefill({e.new_sequence()}, {ids}, nullptr, false);
  const int64_t G = c.group_size(), D = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int l = 0; l < c.n_layers; ++l) {
    const at::Tensor Q = cap->q(l), K = cap->k(l), V = cap->v(l), X = cap->x(l);
    const at::Tensor w_norm = m->weights.layers[l].attn_norm.to(at::kDouble);
    const at::Tensor wo = m->weights.layers[l].wo.to(at::kDouble);
    auto input = [&](int64_t row) {  // RMSNorm of the residual row, times the norm's weight
      const at::Tensor x = X[row];
      return x / (x.pow(2).mean() + c.norm_eps).sqrt() * w_norm;
    };
    for (int64_t i = 0; i < text; ++i)
      EXPECT_LT((t.x[l][i].to(at::kDouble) - input(1 + i)).abs().max().item<double>(), 1e-4);
    for (int64_t h = 0; h < c.n_kv_heads; ++h)
      for (int64_t tok_i = 0; tok_i < text; tok_i += 7) {
        const int64_t col = 1 + tok_i;
        double best = 0;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t j = h * G + g;
          const double out = wo.narrow(1, j * D, D).matmul(V[col][h]).norm().item<double>();
          for (int64_t r = r0; r < T; ++r) {
            const at::Tensor logits = K.narrow(0, 0, r + 1).select(1, h).matmul(Q[r][j]) * scale;
            const double w = at::softmax(logits, 0)[col].item<double>();
            best = std::max(best, w / input(r).norm().item<double>() * out);
          }
        }
        EXPECT_NEAR(t.y[l][tok_i][h].item<double>(), std::log(best), 1e-3)
            << "layer " << l << " head " << h << " token " << tok_i;
      }
  }
}

TEST(Kvzap, AttentionInputIsWhatTheQueryProjectionReads) {
  // RoPE keeps each head's norm, so ||(a W_q)_j|| must equal the norm of the engine's query j.
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  ASSERT_FALSE(m->weights.layers[0].bqkv.defined());
  const std::vector<int64_t> prompt = test::walk_prompt(48, c.vocab_size);
  auto owned = std::make_unique<test::LayerCapture>(make_default_kv(*m), c.n_layers);
  test::LayerCapture* cap = owned.get();
  Engine e(m, std::move(owned));
  e.prefill({e.new_sequence()}, {prompt}, nullptr, false);
  for (int l = 0; l < c.n_layers; ++l) {
    const at::Tensor a = kvzap::attention_input(*m, l, cap->x(l)).to(at::kDouble);
    const at::Tensor wq =
        m->weights.layers[l].wqkv.narrow(0, 0, c.n_heads * c.head_dim).to(at::kDouble);
    const at::Tensor q = a.matmul(wq.t()).view({-1, c.n_heads, c.head_dim});
    EXPECT_LT((q.norm(2, {2}) - cap->q(l).norm(2, {2})).abs().max().item<double>(), 1e-3)
        << "layer " << l;
  }
}

TEST(Kvzap, SurrogateSolvesItsRidgeEquationsAndPredictsHeldOutScores) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  const CalibrationText train = small_text(4, 128);
  const double alpha = 1.0;
  const kvzap::Surrogate s = kvzap::fit_surrogate(m, train, alpha);
  ASSERT_EQ(s.weight.sizes(), (std::vector<int64_t>{c.n_layers, c.dim, c.n_kv_heads}));
  // The normal equations on the same data: mean residual 0, X^T R = alpha W.
  std::vector<at::Tensor> xs(c.n_layers), ys(c.n_layers);
  for (const auto& w : calibration_windows(*m, train)) {
    const kvzap::Targets t = kvzap::kvzip_plus_targets(m, w);
    for (int l = 0; l < c.n_layers; ++l) {
      xs[l] = xs[l].defined() ? at::cat({xs[l], t.x[l]}) : t.x[l];
      ys[l] = ys[l].defined() ? at::cat({ys[l], t.y[l]}) : t.y[l];
    }
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const at::Tensor X = xs[l].to(at::kDouble), Y = ys[l].to(at::kDouble);
    const at::Tensor W = s.weight[l].to(at::kDouble), b = s.bias[l].to(at::kDouble);
    const at::Tensor R = Y - X.matmul(W) - b;
    EXPECT_LT(R.mean(0).abs().max().item<double>(), 1e-3) << "layer " << l;
    const double scale = X.t().matmul(Y).abs().max().item<double>();
    EXPECT_LT((X.t().matmul(R) - alpha * W).abs().max().item<double>(), 1e-3 * scale)
        << "layer " << l;
  }
  // Held-out windows (further into the corpus): the predicted log scores correlate with KVzip+'s.
  CalibrationText held = small_text(2, 128);
  held.skip_tokens = train.skip_tokens + 16 * 127;
  double sum_r = 0;
  int64_t heads = 0;
  for (const auto& w : calibration_windows(*m, held)) {
    const kvzap::Targets t = kvzap::kvzip_plus_targets(m, w);
    for (int l = 0; l < c.n_layers; ++l) {
      const at::Tensor pred = kvzap::surrogate_scores(s, l, t.x[l]);
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        const at::Tensor p = pred.select(1, h).to(at::kDouble),
                         y = t.y[l].select(1, h).to(at::kDouble);
        const at::Tensor pc = p - p.mean(), yc = y - y.mean();
        const double r =
            (pc * yc).sum().item<double>() / (pc.norm().item<double>() * yc.norm().item<double>());
        sum_r += r;
        ++heads;
      }
    }
  }
  // 0.61 when written (4 windows of 128 tokens to train on, 2 held out).
  RecordProperty("mean_pearson_r", std::to_string(sum_r / heads));
  EXPECT_GT(sum_r / heads, 0.5) << "mean Pearson r of predicted vs KVzip+ log scores";
}

TEST(Kvzap, EachHeadKeepsItsTopSurrogateScoresAndFreesTheRest) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  const std::string dir = test::make_temp_dir("kvzap");
  const nlohmann::json p = {{"cache_dir", dir},
                            {"data_dir", test::data_dir()},
                            {"calib_samples", 2},
                            {"calib_tokens", 96},
                            {"budget", 0.25}};
  const int64_t before = tensor_artifacts_computed();
  auto art = MethodRegistry::instance().calibrate("kvzap", m, p);
  EXPECT_EQ(tensor_artifacts_computed(), before + 1);
  const auto& ta = dynamic_cast<const TensorArtifact&>(*art);
  const kvzap::Surrogate s{ta.get("weight"), ta.get("bias")};
  const int64_t T = 400, B = T / 4;
  const std::vector<int64_t> prompt = test::walk_prompt(T, c.vocab_size);
  auto owned = std::make_unique<test::LayerCapture>(make_default_kv(*m), c.n_layers);
  test::LayerCapture* cap = owned.get();
  Engine full(m, std::move(owned));
  full.prefill({full.new_sequence()}, {prompt});
  Engine e(m, test::make_with_model(m, "kvzap", p));
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {prompt});
  auto* ev = dynamic_cast<EvictingKvCache*>(&e.kv());
  ASSERT_NE(ev, nullptr);
  int64_t entries = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const at::Tensor scores =
        kvzap::surrogate_scores(s, l, kvzap::attention_input(*m, l, cap->x(l))).contiguous();
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const std::vector<int32_t> kept = ev->kept_indices(seq, l, h);
      EXPECT_EQ(kept, test::top_positions(scores.select(1, h), B)) << l << "/" << h;
      entries += static_cast<int64_t>(kept.size());
    }
  }
  EXPECT_EQ(entries, c.n_layers * c.n_kv_heads * B);
  EXPECT_EQ(e.kv().footprint().device_payload_bytes, entries * 2 * c.head_dim * 4);
  EXPECT_EQ(e.kv().counters().at("calib_from_cache"), 0.0);
  auto again = MethodRegistry::instance().calibrate("kvzap", test::testbed(true), p);
  EXPECT_EQ(tensor_artifacts_computed(), before + 1);
  EXPECT_TRUE(again->from_cache);
  EXPECT_TRUE(at::equal(dynamic_cast<const TensorArtifact&>(*again).get("weight"), s.weight));
}

TEST(Kvzap, RefusesACalibrationWindowLongerThanHalfTheContext) {
  auto m = test::testbed();
  const std::vector<int64_t> window = calibration_windows(*m, small_text(1, 600))[0];
  try {
    kvzap::kvzip_plus_targets(m, window);
    FAIL() << "a 600-token window and its repeat fit a 1024-token model";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("lower calib_tokens"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kvb
