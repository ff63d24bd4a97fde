#include "harness/engine/transformer.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

#include <cmath>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/hidden_state.h"
#include "kvb/kernels/cpu_ops.h"

namespace kvb {

namespace {

bool g_cpu_f32_fast_path = true;

// out[r, i] = gelu_tanh(gu[r, i]) * gu[r, F + i] (GeGLU), the tanh approximation as PyTorch's
// gelu(approximate="tanh") computes it.   gu: [rows, 2F]; out: [rows, F]
void gelu_tanh_mul_f32(const float* gu, float* out, int64_t rows, int64_t F) {
  constexpr float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
  constexpr float kKappa = 0.044715f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * F;
    const float* u = g + F;
    float* o = out + r * F;
    for (int64_t i = 0; i < F; ++i) {
      const float x = g[i];
      const float inner = kBeta * (x + kKappa * x * x * x);
      o[i] = 0.5f * x * (1.0f + std::tanh(inner)) * u[i];
    }
  }
}

// The attention scale: 1/sqrt(head_dim) computed in float (as it always was, so Llama-family
// logits stay bit-identical), or Gemma's query_pre_attn_scalar^-0.5.
float attention_scale(const ModelConfig& c) {
  return c.query_pre_attn_scalar > 0 ? static_cast<float>(c.attn_scale())
                                     : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
}

// The row of the global RoPE tables each token of the step reads: its position, or, on a LongRoPE
// model whose sequence rotates with the long factors in this engine call, position + the long
// table's first row (ModelWeights::rope_long_row).   [T]; the step's positions themselves (no copy)
// on any other model, else `*rows` filled.
const std::vector<int64_t>& rope_table_rows(const Model& model, const StepBatch& batch,
                                            const std::vector<int64_t>* call_lengths,
                                            std::vector<int64_t>* rows_out) {
  const int64_t offset = model.weights.rope_long_row;
  if (offset == 0) return batch.positions;
  std::vector<int64_t>& rows = *rows_out;
  rows = batch.positions;
  KVB_ASSERT(!call_lengths || static_cast<int64_t>(call_lengths->size()) == batch.batch_size(),
             "transformer", "call_lengths needs one entry per sequence");
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const int64_t first = batch.q_indptr[b], last = batch.q_indptr[b + 1];
    if (first == last) continue;
    const int64_t length = call_lengths ? (*call_lengths)[b] : batch.positions[last - 1] + 1;
    if (rope_factors_for_length(model.config, length) == RopeFactors::kLong)
      for (int64_t t = first; t < last; ++t) rows[t] += offset;
  }
  return rows;
}

// The CPU fp32 forward: the same computation as the generic path below, on raw pointers with BLAS
// matmuls and fused row loops, so that a decode step of a small model costs microseconds, not the
// ~30 LibTorch dispatches per layer of the generic path. The KV seam is unchanged: the cache gets
// the same tensors (views of this step's buffer, valid during the step: a store copies what it
// keeps) and returns the attention output.
at::Tensor forward_cpu_f32(Model& model, KvCache& kv, const std::vector<int64_t>& tokens,
                           const StepBatch& batch, const std::vector<int64_t>& logit_rows,
                           const at::Tensor* input_embeds, const std::vector<int64_t>& rope_rows) {
  namespace k = kernels;
  const ModelConfig& c = model.config;
  const ModelWeights& w = model.weights;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t D = c.dim, Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim, HD = c.head_dim;
  const int64_t QKV = Q + 2 * KV;
  const float eps = static_cast<float>(c.norm_eps);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::vector<int64_t> rows = logit_rows;
  if (rows.empty())
    for (int64_t t = 0; t < T; ++t) rows.push_back(t);
  const int64_t R = static_cast<int64_t>(rows.size());
  // One allocation for the step's activations: x | h | qkv | k_pre | v | act(2F) | ffn(F) | q | k |
  // normed (R x D), then a sublayer output buffer `post` (T x D) where the config norms it before
  // the add. (at::detail::empty_cpu: the dispatcher's at::empty costs a few thousand instructions,
  // a noticeable share of a small model's decode step.)
  const bool post = c.post_norms;
  at::Tensor buf = at::detail::empty_cpu(
      {T * (2 * D + QKV + 2 * KV + 3 * F + Q + KV + (post ? D : 0)) + R * D}, at::kFloat);
  float* x = buf.data_ptr<float>();
  float* h = x + T * D;
  float* qkv = h + T * D;
  float* k_pre = qkv + T * QKV;
  float* v = k_pre + T * KV;
  float* gu = v + T * KV;
  float* act = gu + T * 2 * F;
  float* q = act + T * F;
  float* kr = q + T * Q;
  float* normed = kr + T * KV;  // [R, D]
  float* sub = normed + R * D;  // [T, D] where post
  const float* emb = w.embedding.data_ptr<float>();
  if (input_embeds) {
    // Soft rows enter as given (the embedding scale belongs to the token lookup, as in HF).
    at::Tensor e = input_embeds->to(at::kCPU, at::kFloat).contiguous();
    std::copy(e.data_ptr<float>(), e.data_ptr<float>() + T * D, x);
  } else {
    for (int64_t t = 0; t < T; ++t) std::copy(emb + tokens[t] * D, emb + (tokens[t] + 1) * D, x + t * D);
    if (c.embed_scale != 1.0) {
      const float s = static_cast<float>(c.embed_scale);
      for (int64_t i = 0; i < T * D; ++i) x[i] *= s;
    }
  }
  at::Tensor q_t = at::from_blob(q, {T, c.n_heads, HD}, f32);
  at::Tensor k_t = at::from_blob(kr, {T, c.n_kv_heads, HD}, f32);
  at::Tensor kpre_t = at::from_blob(k_pre, {T, c.n_kv_heads, HD}, f32);
  at::Tensor v_t = at::from_blob(v, {T, c.n_kv_heads, HD}, f32);
  at::Tensor x_t = at::from_blob(x, {T, D}, f32);
  const bool inter = c.rope_style == RopeStyle::kInterleaved;
  const float sm_scale = attention_scale(c);

  kv.begin_step(batch);
  auto* hidden = dynamic_cast<HiddenStateCache*>(&kv);  // DMS reads the residual stream
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    k::rms_norm_f32(x, L.attn_norm.data_ptr<float>(), h, T, D, eps);
    k::linear_f32(h, L.wqkv.data_ptr<float>(),
                  L.bqkv.defined() ? L.bqkv.data_ptr<float>() : nullptr, qkv, T, D, QKV, false);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv + t * QKV;
      std::copy(row, row + Q, q + t * Q);
      std::copy(row + Q, row + Q + KV, kr + t * KV);
      std::copy(row + Q, row + Q + KV, k_pre + t * KV);
      std::copy(row + Q + KV, row + QKV, v + t * KV);
    }
    if (c.qk_norm) {
      // Per head, before RoPE; the pre-RoPE keys a method sees are the normed ones.
      k::rms_norm_f32(q, L.q_norm.data_ptr<float>(), q, T * c.n_heads, HD, eps);
      k::rms_norm_f32(kr, L.k_norm.data_ptr<float>(), kr, T * c.n_kv_heads, HD, eps);
      std::copy(kr, kr + T * KV, k_pre);
    }
    const at::Tensor& cos_t = w.layer_cos(c, l);
    const float* cos = cos_t.data_ptr<float>();
    const float* sin = w.layer_sin(c, l).data_ptr<float>();
    // The window layers' own tables (Gemma 3) are indexed by position; the global ones by row.
    const int64_t* rows = cos_t.is_same(w.rope_cos) ? rope_rows.data() : batch.positions.data();
    k::rope_f32(q, T, c.n_heads, HD, Q, cos, sin, rows, inter);
    k::rope_f32(kr, T, c.n_kv_heads, HD, KV, cos, sin, rows, inter);
    if (hidden) hidden->layer_hidden(static_cast<int>(l), x_t);  // before the layer's attend
    LayerInput in;
    in.layer = static_cast<int>(l);
    in.q = &q_t;
    in.k = &k_t;
    in.k_pre_rope = &kpre_t;
    in.v = &v_t;
    in.batch = &batch;
    in.sm_scale = sm_scale;
    in.window = c.is_window_layer(l) ? c.layer_windows[l] : 0;
    at::Tensor attn = kv.attend(in).contiguous();  // [T, n_heads, head_dim]
    if (post) {
      k::linear_f32(attn.data_ptr<float>(), L.wo.data_ptr<float>(), nullptr, sub, T, Q, D, false);
      k::rms_norm_f32(sub, L.post_attn_norm.data_ptr<float>(), sub, T, D, eps);
      for (int64_t i = 0; i < T * D; ++i) x[i] += sub[i];
    } else {
      k::linear_f32(attn.data_ptr<float>(), L.wo.data_ptr<float>(), nullptr, x, T, Q, D, true);
    }
    k::rms_norm_f32(x, L.ffn_norm.data_ptr<float>(), h, T, D, eps);
    k::linear_f32(h, L.w13.data_ptr<float>(), nullptr, gu, T, D, 2 * F, false);
    if (c.activation == Activation::kGeluTanh) {
      gelu_tanh_mul_f32(gu, act, T, F);
    } else {
      k::silu_mul_f32(gu, act, T, F);
    }
    if (post) {
      k::linear_f32(act, L.w2.data_ptr<float>(), nullptr, sub, T, F, D, false);
      k::rms_norm_f32(sub, L.post_ffn_norm.data_ptr<float>(), sub, T, D, eps);
      for (int64_t i = 0; i < T * D; ++i) x[i] += sub[i];
    } else {
      k::linear_f32(act, L.w2.data_ptr<float>(), nullptr, x, T, F, D, true);
    }
  }
  kv.end_step(batch);

  for (int64_t r = 0; r < R; ++r)
    k::rms_norm_f32(x + rows[r] * D, w.final_norm.data_ptr<float>(), normed + r * D, 1, D, eps);
  at::Tensor logits = at::detail::empty_cpu({R, c.vocab_size}, at::kFloat);
  k::linear_f32(normed, w.lm_head.data_ptr<float>(), nullptr, logits.data_ptr<float>(), R, D,
                c.vocab_size, false);
  if (c.final_logit_softcap > 0) {
    const float cap = static_cast<float>(c.final_logit_softcap);
    float* p = logits.data_ptr<float>();
    for (int64_t i = 0; i < R * c.vocab_size; ++i) p[i] = cap * std::tanh(p[i] / cap);
  }
  return logits;
}

}  // namespace

void set_cpu_f32_fast_path(bool enabled) { g_cpu_f32_fast_path = enabled; }

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
                               const StepBatch& batch, const std::vector<int64_t>& logit_rows,
                               const at::Tensor* input_embeds,
                               const std::vector<int64_t>* call_lengths) {
  const ModelConfig& c = model.config;
  const ModelWeights& w = model.weights;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim;
  const auto dev = model.device;
  int64_t max_pos = 0;
  for (int64_t p : batch.positions) max_pos = std::max(max_pos, p);
  model.ensure_rope_len(max_pos + 1);
  // A window layer must be served by a store that applies the window (WindowedKvCache, which
  // MethodRegistry::create and make_default_kv put around a method's store); any other would
  // attend to every token, silently not the model.
  KVB_CHECK(c.n_window_layers() == 0 || kv.serves_windows(), c.name, " has ",
            c.n_window_layers(), " sliding-window layers, but the KV store '", kv.name(),
            "' does not apply windows (wrap it in a WindowedKvCache)");
  if (input_embeds) {
    KVB_ASSERT(input_embeds->dim() == 2 && input_embeds->size(0) == T && input_embeds->size(1) == c.dim,
               "transformer", "input_embeds must be [", T, ", ", c.dim, "]");
  }
  std::vector<int64_t> long_rope_rows;
  const std::vector<int64_t>& rope_rows =
      rope_table_rows(model, batch, call_lengths, &long_rope_rows);
  if (g_cpu_f32_fast_path && dev.is_cpu() && model.dtype == at::kFloat) {
    return forward_cpu_f32(model, kv, tokens, batch, logit_rows, input_embeds, rope_rows);
  }

  at::Tensor pos = at::tensor(batch.positions, at::kLong).to(dev);
  at::Tensor rows = at::tensor(rope_rows, at::kLong).to(dev);
  at::Tensor cos = w.rope_cos.index_select(0, rows);  // [T, head_dim / 2]
  at::Tensor sin = w.rope_sin.index_select(0, rows);
  at::Tensor cos_local, sin_local;
  if (w.rope_cos_local.defined()) {
    cos_local = w.rope_cos_local.index_select(0, pos);
    sin_local = w.rope_sin_local.index_select(0, pos);
  }
  at::Tensor x = input_embeds  // [T, dim]
                     ? input_embeds->to(dev, model.dtype)
                     : w.embedding.index_select(0, at::tensor(tokens, at::kLong).to(dev));
  if (!input_embeds && c.embed_scale != 1.0) {
    // In the model dtype, as HF multiplies by the scale cast to the weights' dtype.
    x = x * at::scalar_tensor(c.embed_scale, x.options());
  }
  const float sm_scale = attention_scale(c);

  kv.begin_step(batch);
  auto* hidden = dynamic_cast<HiddenStateCache*>(&kv);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    at::Tensor h = rms_norm(x, L.attn_norm, c.norm_eps);
    at::Tensor qkv = L.bqkv.defined() ? at::linear(h, L.wqkv, L.bqkv) : at::linear(h, L.wqkv);
    at::Tensor q = qkv.narrow(1, 0, Q).view({T, c.n_heads, c.head_dim});
    at::Tensor k = qkv.narrow(1, Q, KV).contiguous().view({T, c.n_kv_heads, c.head_dim});
    at::Tensor v = qkv.narrow(1, Q + KV, KV).contiguous().view({T, c.n_kv_heads, c.head_dim});
    if (c.qk_norm) {
      q = rms_norm(q, L.q_norm, c.norm_eps);
      k = rms_norm(k, L.k_norm, c.norm_eps);
    }
    const bool local = cos_local.defined() && c.is_window_layer(l);
    at::Tensor q_rot = apply_rope(q, local ? cos_local : cos, local ? sin_local : sin, c.rope_style);
    at::Tensor k_rot = apply_rope(k, local ? cos_local : cos, local ? sin_local : sin, c.rope_style);
    if (hidden) hidden->layer_hidden(static_cast<int>(l), x);  // before the layer's attend
    LayerInput in;
    in.layer = static_cast<int>(l);
    in.q = &q_rot;
    in.k = &k_rot;
    in.k_pre_rope = &k;
    in.v = &v;
    in.batch = &batch;
    in.sm_scale = sm_scale;
    in.window = c.is_window_layer(l) ? c.layer_windows[l] : 0;
    at::Tensor attn = kv.attend(in);  // [T, n_heads, head_dim]
    at::Tensor o = at::linear(attn.reshape({T, Q}), L.wo);
    if (c.post_norms) o = rms_norm(o, L.post_attn_norm, c.norm_eps);
    x = x + o;
    h = rms_norm(x, L.ffn_norm, c.norm_eps);
    at::Tensor gu = at::linear(h, L.w13);  // [T, 2F]
    at::Tensor gate = c.activation == Activation::kGeluTanh ? at::gelu(gu.narrow(1, 0, F), "tanh")
                                                             : at::silu(gu.narrow(1, 0, F));
    at::Tensor act = gate.mul_(gu.narrow(1, F, F));
    at::Tensor f = at::linear(act, L.w2);
    if (c.post_norms) f = rms_norm(f, L.post_ffn_norm, c.norm_eps);
    x = x + f;
  }
  kv.end_step(batch);

  if (!logit_rows.empty() && static_cast<int64_t>(logit_rows.size()) != T) {
    x = x.index_select(0, at::tensor(logit_rows, at::kLong).to(dev));
  }
  x = rms_norm(x, w.final_norm, c.norm_eps);
  at::Tensor logits = at::linear(x, w.lm_head).to(at::kFloat);
  if (c.final_logit_softcap > 0)
    logits = at::tanh(logits / c.final_logit_softcap).mul_(c.final_logit_softcap);
  return logits;
}

}  // namespace kvb
