// KVzap's surrogate from calibration text: KVzip+ targets from one repeat prefill per window, and a
// ridge fit per layer.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/engine/engine.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/hidden_state.h"
#include "harness/model/model.h"
#include "methods/common/observed_kv_cache.h"
#include "methods/kvzap/kvzap.h"

namespace kvb::kvzap {
namespace {

constexpr const char* kRepeatPrompt = "\n\nRepeat the previous context exactly.";  // KVzip's
// A KVzip+ score underflows to 0 where a row's softmax does; its log is held at log(kMinScore).
constexpr double kMinScore = 1e-30;

// What the forward hands each layer of one prefill step: queries, values and the residual stream.
class StepCapture : public ObservedKvCache, public HiddenStateCache {
 public:
  StepCapture(std::unique_ptr<KvCache> inner, int64_t layers)
      : ObservedKvCache(std::move(inner),
                        [this](const LayerInput& in) {
                          q[in.layer] = in.q->to(at::kCPU).to(at::kFloat).clone();
                          k[in.layer] = in.k->to(at::kCPU).to(at::kFloat).clone();
                          v[in.layer] = in.v->to(at::kCPU).to(at::kFloat).clone();
                          scale[in.layer] = in.sm_scale;
                        }),
        q(layers),
        k(layers),
        v(layers),
        x(layers),
        scale(layers) {}
  void layer_hidden(int layer, const at::Tensor& hidden) override {
    x[layer] = hidden.to(at::kCPU).to(at::kFloat).clone();
  }
  std::vector<at::Tensor> q, k, v, x;  // [T, Hq, D], [T, Hkv, D], [T, Hkv, D], [T, dim]
  std::vector<double> scale;
};

}  // namespace

at::Tensor attention_input(const Model& model, int64_t layer, const at::Tensor& x) {
  const at::Tensor xf = x.to(at::kCPU).to(at::kFloat);
  const at::Tensor w = model.weights.layers[layer].attn_norm.to(at::kCPU).to(at::kFloat);
  return xf / (xf.pow(2).mean({1}, /*keepdim=*/true) + model.config.norm_eps).sqrt() * w;
}

namespace {

std::vector<int64_t> repeat_prompt(const Tokenizer& tok) {
  std::vector<int64_t> ids = tok.encode(kRepeatPrompt);
  const std::vector<int64_t> close = tok.encode("\n");
  ids.insert(ids.end(), close.begin(), close.end());
  return ids;
}

}  // namespace

int64_t max_window_tokens(const Model& model) {
  if (model.config.max_seq_len <= 0) return std::numeric_limits<int64_t>::max();
  const int64_t prompt =
      static_cast<int64_t>(repeat_prompt(Tokenizer(model.tokenizer_path)).size());
  // A window of w tokens (BOS + w - 1 text) and its repeat take 2 w - 1 + prompt positions.
  return std::max<int64_t>(2, (model.config.max_seq_len + 1 - prompt) / 2);
}

Targets kvzip_plus_targets(const std::shared_ptr<Model>& model,
                           const std::vector<int64_t>& window) {
  const ModelConfig& c = model->config;
  KVB_CHECK(c.n_window_layers() == 0, "method kvzap: model ", model->source,
            " has sliding-window layers, which its calibration does not cover");
  const Tokenizer tok(model->tokenizer_path);
  const int64_t m = static_cast<int64_t>(window.size()) - 1;
  KVB_ASSERT(m > 0 && window[0] == c.bos_id, "kvzap", "a window is BOS and its text");
  std::vector<int64_t> ids = window;
  const std::vector<int64_t> prompt = repeat_prompt(tok);
  ids.insert(ids.end(), prompt.begin(), prompt.end());
  ids.insert(ids.end(), window.begin() + 1, window.end());
  const int64_t T = static_cast<int64_t>(ids.size()), r0 = T - m;
  KVB_CHECK(c.max_seq_len <= 0 || T <= c.max_seq_len, "method kvzap: a calibration window of ", m,
            " tokens needs ", T, " positions with its repeat, more than model ", model->source,
            "'s ", c.max_seq_len, "; lower calib_tokens");

  auto owned = std::make_unique<StepCapture>(make_default_kv(*model), c.n_layers);
  StepCapture* cap = owned.get();
  EngineOptions eo;
  eo.prefill_chunk = T;  // one step: every layer's capture is the whole sequence
  Engine e(model, std::move(owned), eo);
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {ids}, nullptr, /*call_end_prefill=*/false);

  const int64_t Hkv = c.n_kv_heads, G = c.group_size(), D = c.head_dim;
  // Row r of the repeat sees keys [0, r0 + r]: the causal mask over the columns.
  const at::Tensor cols = at::arange(r0 + m, at::kLong);
  const at::Tensor rows = at::arange(r0, r0 + m, at::kLong);
  const at::Tensor masked = cols.unsqueeze(0) > rows.unsqueeze(1);  // [m, r0 + m]
  Targets out;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const at::Tensor a = attention_input(*model, l, cap->x[l]);                     // [T, dim]
    const at::Tensor row_norm = a.narrow(0, r0, m).norm(2, {1}).unsqueeze(1);       // [m, 1]
    const at::Tensor wo = model->weights.layers[l].wo.to(at::kCPU).to(at::kFloat);  // [dim, Hq*D]
    at::Tensor y = at::empty({m, Hkv}, at::kFloat);
    for (int64_t h = 0; h < Hkv; ++h) {
      const at::Tensor keys = cap->k[l].select(1, h).narrow(0, 0, r0 + m);  // [r0 + m, D]
      const at::Tensor vals = cap->v[l].select(1, h).narrow(0, 1, m);       // the text's [m, D]
      at::Tensor best = at::zeros({m}, at::kFloat);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t j = h * G + g;
        const at::Tensor q = cap->q[l].select(1, j).narrow(0, r0, m);  // [m, D]
        const at::Tensor w =
            at::softmax((q.matmul(keys.t()) * cap->scale[l]).masked_fill(masked, -INFINITY), 1)
                .narrow(1, 1, m);  // [m rows, m text columns]
        const at::Tensor out_norm = vals.matmul(wo.narrow(1, j * D, D).t()).norm(2, {1});  // [m]
        best = at::maximum(best, std::get<0>((w / row_norm * out_norm.unsqueeze(0)).max(0)));
      }
      y.select(1, h).copy_(best.clamp_min(kMinScore).log());
    }
    out.x.push_back(a.narrow(0, 1, m).clone());
    out.y.push_back(y);
  }
  e.release(seq);
  return out;
}

Surrogate fit_surrogate(const std::shared_ptr<Model>& model, const CalibrationText& text,
                        double alpha) {
  const ModelConfig& c = model->config;
  const int64_t L = c.n_layers, dim = c.dim, Hkv = c.n_kv_heads;
  // Per layer: sum x, sum y, X^T X, X^T Y and the row count, fp64.
  at::Tensor sx = at::zeros({L, dim}, at::kDouble), sy = at::zeros({L, Hkv}, at::kDouble);
  at::Tensor xx = at::zeros({L, dim, dim}, at::kDouble), xy = at::zeros({L, dim, Hkv}, at::kDouble);
  double n = 0;
  for (const auto& window : calibration_windows(*model, text)) {
    const Targets t = kvzip_plus_targets(model, window);
    for (int64_t l = 0; l < L; ++l) {
      const at::Tensor X = t.x[l].to(at::kDouble), Y = t.y[l].to(at::kDouble);
      sx[l] += X.sum(0);
      sy[l] += Y.sum(0);
      xx[l] += X.t().matmul(X);
      xy[l] += X.t().matmul(Y);
    }
    n += static_cast<double>(t.x[0].size(0));
  }
  Surrogate s{at::empty({L, dim, Hkv}, at::kFloat), at::empty({L, Hkv}, at::kFloat)};
  const at::Tensor eye = at::eye(dim, at::kDouble);
  for (int64_t l = 0; l < L; ++l) {
    // Centred normal equations: (Xc^T Xc + alpha I) W = Xc^T Yc; b = mean(y) - mean(x) W.
    const at::Tensor mx = sx[l] / n, my = sy[l] / n;
    const at::Tensor cxx = xx[l] - n * at::outer(mx, mx), cxy = xy[l] - n * at::outer(mx, my);
    const at::Tensor W = at::linalg_solve(cxx + alpha * eye, cxy);  // [dim, Hkv]
    s.weight[l].copy_(W);
    s.bias[l].copy_(my - mx.matmul(W));
  }
  return s;
}

at::Tensor surrogate_scores(const Surrogate& s, int64_t layer, const at::Tensor& a) {
  return a.matmul(s.weight[layer]) + s.bias[layer];
}

}  // namespace kvb::kvzap
