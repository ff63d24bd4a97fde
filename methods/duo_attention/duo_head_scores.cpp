// DuoAttention's head scores from calibration text (kvpress's on-the-fly scoring) and the split
// into streaming and retrieval heads.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/common/error.h"
#include "harness/engine/transformer.h"
#include "harness/model/model.h"
#include "methods/duo_attention/duo_attention.h"

namespace kvb::duo {

at::Tensor head_scores(const std::shared_ptr<Model>& model, const CalibrationText& text,
                       int64_t q_len) {
  const ModelConfig& c = model->config;
  KVB_CHECK(c.n_window_layers() == 0, "method duo_attention: model ", model->source,
            " has sliding-window layers, which its head scoring does not cover");
  const int64_t L = c.n_layers, Hq = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim,
                G = c.group_size();
  // RoPE tables long enough for the calibration sequences and the synthetic q_len positions.
  at::Tensor cos, sin;
  compute_rope_tables(c, std::max<int64_t>(q_len, text.tokens) + 1, &cos, &sin);
  at::Tensor scores = at::zeros({L, Hkv}, at::kDouble);
  // Per (sample, layer): the means of the sample's queries and keys (one prefill chunk holds the
  // whole sample, so each layer is seen once per sample).
  run_calibration_text(model, text, [&](int64_t, const LayerInput& in) {
    const auto& pos = in.batch->positions;
    at::Tensor p = at::tensor(pos, at::kLong);
    // Queries come post-RoPE: rotate each back by its own position (cos, -sin).
    at::Tensor q = apply_rope(in.q->to(at::kCPU).to(at::kFloat), cos.index_select(0, p),
                              -sin.index_select(0, p), c.rope_style);
    at::Tensor q_mean = q.mean(0);                                             // [Hq, D]
    at::Tensor k_mean = in.k_pre_rope->to(at::kCPU).to(at::kFloat).mean(0);    // [Hkv, D]
    // The mean query at the last position, the mean key at every position 0 .. q_len - 1.
    at::Tensor ql = apply_rope(q_mean.unsqueeze(0), cos.narrow(0, q_len - 1, 1),
                               sin.narrow(0, q_len - 1, 1), c.rope_style)[0];  // [Hq, D]
    at::Tensor ks = apply_rope(k_mean.unsqueeze(0).expand({q_len, Hkv, D}).contiguous(),
                               cos.narrow(0, 0, q_len), sin.narrow(0, 0, q_len),
                               c.rope_style);                                  // [q_len, Hkv, D]
    at::Tensor kq = ks.repeat_interleave(G, 1);                                // [q_len, Hq, D]
    at::Tensor logits = (kq * ql.unsqueeze(0)).sum(-1).t() / std::sqrt(static_cast<double>(D));
    at::Tensor attn = at::softmax(logits, -1);                                 // [Hq, q_len]
    at::Tensor area = at::cumsum(attn, 1).mean(1).view({Hkv, G}).mean(1);      // [Hkv]
    scores[in.layer] += area.to(at::kDouble) / static_cast<double>(text.samples);
  });
  return scores.to(at::kFloat);
}

std::vector<std::vector<uint8_t>> streaming_heads(const at::Tensor& scores, double ratio) {
  const int64_t L = scores.size(0), H = scores.size(1), n = L * H;
  const at::Tensor s = scores.to(at::kFloat).contiguous();
  const float* v = s.data_ptr<float>();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] < v[b]; });
  const int64_t pruned = static_cast<int64_t>(std::llround(ratio * static_cast<double>(n)));
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(L), std::vector<uint8_t>(H, 0));
  for (int64_t i = 0; i < pruned; ++i) out[order[i] / H][order[i] % H] = 1;
  return out;
}

}  // namespace kvb::duo
