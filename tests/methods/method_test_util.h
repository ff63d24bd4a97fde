#pragma once
// Helpers shared by the method tests that drive a cache by hand: a tiny model config and seeded
// random tensors.

#include <ATen/ATen.h>

#include <cstdint>
#include <random>
#include <vector>

#include "harness/formats/model_config.h"

namespace kvb::test {

// A synthetic config with the given layers, query heads, KV heads and head_dim (HF RoPE style).
inline ModelConfig tiny(int64_t layers, int64_t hq, int64_t hkv, int64_t d) {
  ModelConfig c;
  c.name = "tiny";
  c.format = "synthetic";
  c.n_layers = layers;
  c.n_heads = hq;
  c.n_kv_heads = hkv;
  c.head_dim = d;
  c.dim = hq * d;
  c.hidden_dim = 8;
  c.vocab_size = 32;
  c.max_seq_len = 4096;
  c.rope_style = RopeStyle::kHalf;
  return c;
}

// Standard normal fp32 tensor of `shape` from std::mt19937(seed).
inline at::Tensor rnd(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(gen);
  return at::tensor(v, at::kFloat).view(shape);
}

}  // namespace kvb::test
