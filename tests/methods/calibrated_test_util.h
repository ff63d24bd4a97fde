#pragma once
// What the tests of the calibrating methods share: the testbed model (a fresh object on request, so
// the registry's per-model memo is bypassed and the disk cache is what is tested), a cache built
// with its model, and a capture of the keys and queries the engine hands a store.

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "harness/engine/engine.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "methods/common/observed_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb::test {

inline std::string testbed_path() { return fixtures_dir() + "/../../models/kvb-testbed"; }

inline std::shared_ptr<Model> testbed(bool fresh = false) {
  static std::shared_ptr<Model> m = load_model(testbed_path());
  return fresh ? load_model(testbed_path()) : m;
}

inline std::unique_ptr<KvCache> make_with_model(const std::shared_ptr<Model>& m,
                                                const std::string& name,
                                                const nlohmann::json& params) {
  return MethodRegistry::instance().create(name, CacheContext{m->config, m->device, m->dtype, m},
                                           params);
}

// A prompt of `n` tokens: BOS then a fixed pseudo-random walk over the vocabulary.
inline std::vector<int64_t> walk_prompt(int64_t n, int64_t vocab) {
  std::vector<int64_t> p = {1};
  for (int64_t i = 1; i < n; ++i) p.push_back(3 + (i * 131 + (i * i) % 17) % (vocab - 3));
  return p;
}

// Records the post-RoPE keys and queries the engine hands a store, per layer in step order, by
// watching the store (methods/common/observed_kv_cache.h). The capture outlives the store.
class KeyCapture {
 public:
  explicit KeyCapture(int64_t layers) : k_(layers), q_(layers) {}
  std::unique_ptr<KvCache> watch(std::unique_ptr<KvCache> inner) {
    return std::make_unique<ObservedKvCache>(std::move(inner), [this](const LayerInput& in) {
      k_[in.layer].push_back(in.k->to(at::kFloat).clone());
      q_[in.layer].push_back(in.q->to(at::kFloat).clone());
    });
  }
  at::Tensor keys(int layer) const { return at::cat(k_[layer], 0); }     // [T, Hkv, D]
  at::Tensor queries(int layer) const { return at::cat(q_[layer], 0); }  // [T, Hq, D]

 private:
  std::vector<std::vector<at::Tensor>> k_, q_;
};

// The `keep` highest-scored positions of scores [T] (ties: the earlier position), ascending: what a
// per-head top-k store keeps.
inline std::vector<int32_t> top_positions(const at::Tensor& scores, int64_t keep) {
  const at::Tensor s = scores.to(at::kFloat).contiguous();
  const float* sp = s.data_ptr<float>();
  std::vector<int32_t> order(static_cast<size_t>(s.size(0)));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sp[a] > sp[b]; });
  order.resize(static_cast<size_t>(keep));
  std::sort(order.begin(), order.end());
  return order;
}

// Everything the forward hands a layer, in fp64: queries, keys, values and the residual stream
// entering it, concatenated over the steps.
class LayerCapture : public ObservedKvCache, public HiddenStateCache {
 public:
  LayerCapture(std::unique_ptr<KvCache> inner, int64_t layers)
      : ObservedKvCache(std::move(inner),
                        [this](const LayerInput& in) {
                          q_[in.layer].push_back(in.q->to(at::kDouble).clone());
                          k_[in.layer].push_back(in.k->to(at::kDouble).clone());
                          v_[in.layer].push_back(in.v->to(at::kDouble).clone());
                        }),
        q_(layers),
        k_(layers),
        v_(layers),
        x_(layers) {}
  void layer_hidden(int layer, const at::Tensor& hidden) override {
    x_[layer].push_back(hidden.to(at::kDouble).clone());
  }
  at::Tensor q(int l) const { return at::cat(q_[l], 0); }  // [T, Hq, D]
  at::Tensor k(int l) const { return at::cat(k_[l], 0); }  // [T, Hkv, D]
  at::Tensor v(int l) const { return at::cat(v_[l], 0); }  // [T, Hkv, D]
  at::Tensor x(int l) const { return at::cat(x_[l], 0); }  // [T, dim]

 private:
  std::vector<std::vector<at::Tensor>> q_, k_, v_, x_;
};

}  // namespace kvb::test
