#pragma once
// The Llama-family forward over one step of packed tokens: embedding -> n_layers x (RMSNorm, fused
// q/k/v projection, RoPE, attention through the KV cache, o_proj, RMSNorm, SwiGLU) -> final norm -> head.

#include <ATen/core/Tensor.h>

#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/model/model.h"

namespace kvb {

// tokens: [T] ids in the batch's packed order. logit_rows: which of the T rows need logits (empty:
// all). Returns [rows, vocab] fp32 logits on the model's device. input_embeds: optional [T, dim]
// rows fed instead of the tokens' embeddings (soft tokens such as KV Packet's header and trailer;
// `tokens` then only counts the rows). call_lengths: optional [batch], the length each sequence
// reaches in the engine call this step belongs to (a chunked prefill's whole prompt; default: this
// step's last position + 1), which picks LongRoPE's frequency set as transformers picks it per
// forward call.
at::Tensor transformer_forward(Model& model, KvCache& kv, const std::vector<int64_t>& tokens,
                               const StepBatch& batch, const std::vector<int64_t>& logit_rows,
                               const at::Tensor* input_embeds = nullptr,
                               const std::vector<int64_t>* call_lengths = nullptr);

// Whether CPU fp32 steps take the raw-pointer fast path (default) or the generic LibTorch path; the
// two compute the same thing, and tests check that by running both. Not thread-safe.
void set_cpu_f32_fast_path(bool enabled);

// RMSNorm in fp32: x * rsqrt(mean(x^2) + eps) * weight, returned in x's dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotates x [T, heads, head_dim] by the per-token tables cos/sin [T, head_dim / 2] (fp32).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeStyle style);

}  // namespace kvb
