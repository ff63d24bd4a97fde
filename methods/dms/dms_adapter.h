#pragma once
// DMS's eviction decisions (Łańcucki et al., NeurIPS 2025), the
// separate-adapter variant: per layer, alpha_t = scale * (RMSNorm(x_t; g) . W^T + b) + offset,
// one logit per KV head, from the residual stream x_t entering the layer (before its attention
// norm). alpha > 0 means "evict". The decision at position t + 1 decides token t (shifted by one);
// with delayed eviction a token stays visible to queries within `window` positions whatever its
// decision, and is dropped once it leaves the window if the decision says evict.
//
// File: safetensors with layers.L.norm [dim], layers.L.weight [n_kv_heads, dim], layers.L.bias
// [n_kv_heads] (fp32) and metadata {"kind": "dms-adapter", "window", "scale", "offset", "model",
// "dim", "n_layers", "n_kv_heads", "trained_steps", "target_cr"}.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "harness/formats/model_config.h"

namespace kvb::dms {

struct Adapter {
  int64_t window = 256;
  double scale = 100.0, offset = -5.0;
  double norm_eps = 1e-5;
  std::vector<at::Tensor> norm, weight, bias;  // per layer: [dim], [n_kv_heads, dim], [n_kv_heads]
  std::map<std::string, std::string> info;     // the file's other metadata

  // Fresh adapter for `c`: norm 1, weight 0, bias 0 (alpha = offset: every token kept, keep
  // probability sigmoid(5) = 0.993 in training).
  static Adapter fresh(const ModelConfig& c, int64_t window);
  // Throws kvb::Error naming the file and what does not fit `c`.
  static Adapter load(const std::string& path, const ModelConfig& c);
  void save(const std::string& path, const std::map<std::string, std::string>& extra = {}) const;

  // Decision logits alpha for x [..., dim] at `layer`: [..., n_kv_heads], fp32. Differentiable in
  // the adapter's tensors (training), used under NoGradGuard at inference.
  at::Tensor alpha(int64_t layer, const at::Tensor& x) const;
};

}  // namespace kvb::dms
