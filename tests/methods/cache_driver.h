#pragma once
// Drives a KvCache by hand, without a model: the same q/k/v for every layer of the config, one
// sequence, positions counted from 0. For the tests of stores and policies.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "harness/kv/kv_cache.h"

namespace kvb::test {

// Drives a cache by hand: the same q/k/v for every layer of the config.
struct Driver {
  KvCache* kv;
  int64_t n_layers;
  int64_t seq = 0;
  int64_t pos = 0;
  int64_t output_layer = 0;  // the layer whose output step() returns (-1: the last)
  StepBatch make_batch(int64_t n, Phase ph) const {
    StepBatch b;
    b.seq_ids = {seq};
    b.q_indptr = {0, n};
    b.past_lens = {kv->seq_len(seq)};
    for (int64_t i = 0; i < n; ++i) b.positions.push_back(pos + i);
    b.phase = ph;
    return b;
  }
  // q: [n, Hq, D]; k (post-RoPE), v, k_pre: [n, Hkv, D]. Returns output_layer's output (a copy).
  at::Tensor attend_all(const StepBatch& b, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& k_pre) {
    at::Tensor out;
    for (int64_t l = 0; l < n_layers; ++l) {
      LayerInput in;
      in.layer = static_cast<int>(l);
      in.q = &q;
      in.k = &k;
      in.k_pre_rope = k_pre.defined() ? &k_pre : &k;
      in.v = &v;
      in.batch = &b;
      in.sm_scale = 1.0f / std::sqrt(static_cast<float>(q.size(2)));
      at::Tensor o = kv->attend(in);
      if (l == (output_layer < 0 ? n_layers - 1 : output_layer)) out = o.clone();
    }
    return out;
  }
  at::Tensor step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  Phase ph = Phase::kDecode, const at::Tensor& k_pre = at::Tensor()) {
    StepBatch b = make_batch(q.size(0), ph);
    kv->begin_step(b);
    at::Tensor out = attend_all(b, q, k, v, k_pre);
    kv->end_step(b);
    pos += q.size(0);
    return out;
  }
};

}  // namespace kvb::test
