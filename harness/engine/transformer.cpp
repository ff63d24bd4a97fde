#include "harness/engine/transformer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace kvb {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor inv = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  return (xf * inv).mul_(weight).to(x.scalar_type());
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeStyle style) {
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor c = cos.unsqueeze(1);  // [T, 1, half]
  at::Tensor s = sin.unsqueeze(1);
  at::Tensor a, b;
  if (style == RopeStyle::kInterleaved) {
    at::Tensor pairs = xf.view({T, H, half, 2});
    a = pairs.select(3, 0);
    b = pairs.select(3, 1);
    return at::stack({a * c - b * s, a * s + b * c}, 3).view({T, H, D}).to(x.scalar_type());
  }
  a = xf.narrow(2, 0, half);
  b = xf.narrow(2, half, half);
  return at::cat({a * c - b * s, b * c + a * s}, 2).to(x.scalar_type());
}

at::Tensor transformer_forward(Model& model, KvCache& kv, const std::vector<int64_t>& tokens,
                               const StepBatch& batch, const std::vector<int64_t>& logit_rows) {
  const ModelConfig& c = model.config;
  const ModelWeights& w = model.weights;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim;
  const auto dev = model.device;
  int64_t max_pos = 0;
  for (int64_t p : batch.positions) max_pos = std::max(max_pos, p);
  model.ensure_rope_len(max_pos + 1);

  at::Tensor ids = at::tensor(tokens, at::kLong).to(dev);
  at::Tensor pos = at::tensor(batch.positions, at::kLong).to(dev);
  at::Tensor cos = w.rope_cos.index_select(0, pos);  // [T, head_dim / 2]
  at::Tensor sin = w.rope_sin.index_select(0, pos);
  at::Tensor x = w.embedding.index_select(0, ids);   // [T, dim]
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  kv.begin_step(batch);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    at::Tensor h = rms_norm(x, L.attn_norm, c.norm_eps);
    at::Tensor qkv = L.bqkv.defined() ? at::linear(h, L.wqkv, L.bqkv) : at::linear(h, L.wqkv);
    at::Tensor q = qkv.narrow(1, 0, Q).view({T, c.n_heads, c.head_dim});
    at::Tensor k = qkv.narrow(1, Q, KV).contiguous().view({T, c.n_kv_heads, c.head_dim});
    at::Tensor v = qkv.narrow(1, Q + KV, KV).contiguous().view({T, c.n_kv_heads, c.head_dim});
    at::Tensor q_rot = apply_rope(q, cos, sin, c.rope_style);
    at::Tensor k_rot = apply_rope(k, cos, sin, c.rope_style);
    LayerInput in;
    in.layer = static_cast<int>(l);
    in.q = &q_rot;
    in.k = &k_rot;
    in.k_pre_rope = &k;
    in.v = &v;
    in.batch = &batch;
    in.sm_scale = sm_scale;
    at::Tensor attn = kv.attend(in);  // [T, n_heads, head_dim]
    x = x + at::linear(attn.reshape({T, Q}), L.wo);
    h = rms_norm(x, L.ffn_norm, c.norm_eps);
    at::Tensor gu = at::linear(h, L.w13);  // [T, 2F]
    at::Tensor act = at::silu(gu.narrow(1, 0, F)).mul_(gu.narrow(1, F, F));
    x = x + at::linear(act, L.w2);
  }
  kv.end_step(batch);

  if (!logit_rows.empty() && static_cast<int64_t>(logit_rows.size()) != T) {
    x = x.index_select(0, at::tensor(logit_rows, at::kLong).to(dev));
  }
  x = rms_norm(x, w.final_norm, c.norm_eps);
  return at::linear(x, w.lm_head).to(at::kFloat);
}

}  // namespace kvb
