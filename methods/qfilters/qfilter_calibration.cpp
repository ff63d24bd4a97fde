// Q-Filters from calibration text: the dominant direction of each KV head's query group.

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/model/model.h"
#include "methods/qfilters/qfilters.h"

namespace kvb::qfilters {

at::Tensor calibrate_filters(const std::shared_ptr<Model>& model, const CalibrationText& text) {
  const ModelConfig& c = model->config;
  KVB_CHECK(c.n_window_layers() == 0, "method qfilters: model ", model->source,
            " has sliding-window layers, which its calibration does not cover");
  const int64_t L = c.n_layers, Hkv = c.n_kv_heads, D = c.head_dim, G = c.group_size();
  // Q^T Q and the summed query per (layer, KV head), fp64: the SVD's right vectors without holding
  // every query.
  at::Tensor gram = at::zeros({L, Hkv, D, D}, at::kDouble);
  at::Tensor sum = at::zeros({L, Hkv, D}, at::kDouble);
  run_calibration_text(model, text, [&](int64_t, const LayerInput& in) {
    const int64_t T = in.q->size(0);
    // [T, Hq, D] -> [Hkv, T * G, D]: the group's query heads are consecutive.
    at::Tensor q = in.q->to(at::kCPU).to(at::kDouble).view({T, Hkv, G, D}).permute({1, 0, 2, 3})
                       .reshape({Hkv, T * G, D});
    gram[in.layer] += at::matmul(q.transpose(1, 2), q);
    sum[in.layer] += q.sum(1);
  });
  at::Tensor filters = at::empty({L, Hkv, D}, at::kFloat);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t h = 0; h < Hkv; ++h) {
      // eigh: eigenvalues ascending, so the last column is the first right-singular vector.
      auto [evals, evecs] = at::linalg_eigh(gram[l][h]);
      at::Tensor v = evecs.select(1, D - 1).clone();
      // The queries' mean projection on the filter is made negative: a query's logit on a key
      // is about (q . u)(k . u) along the principal direction u, so with E[q . u] > 0 the keys
      // attended most have the largest k . u, and the score -(k . f) ranks them first only when
      // f = -u.
      if (at::dot(sum[l][h], v).item<double>() > 0) v = -v;
      filters[l][h] = v.to(at::kFloat);
    }
  }
  return filters;
}

}  // namespace kvb::qfilters
