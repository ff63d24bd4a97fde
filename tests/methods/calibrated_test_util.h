#pragma once
// What the tests of the calibrating methods share: the testbed model (a fresh object on request, so
// the registry's per-model memo is bypassed and the disk cache is what is tested), a cache built
// with its model, and a capture of the keys the engine hands a store.

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
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

// Records the post-RoPE keys and queries of one sequence's prefill per layer while the full cache
// serves attention.
class KeyCapture : public KvCache {
 public:
  KeyCapture(std::unique_ptr<KvCache> in, int64_t layers) : in_(std::move(in)), k_(layers), q_(layers) {}
  std::string name() const override { return "key-capture"; }
  void begin_step(const StepBatch& b) override { in_->begin_step(b); }
  at::Tensor attend(const LayerInput& in) override {
    k_[in.layer].push_back(in.k->to(at::kFloat).clone());
    q_[in.layer].push_back(in.q->to(at::kFloat).clone());
    return in_->attend(in);
  }
  void end_step(const StepBatch& b) override { in_->end_step(b); }
  void release(int64_t s) override { in_->release(s); }
  void fork(int64_t a, int64_t b) override { in_->fork(a, b); }
  void truncate(int64_t s, int64_t n) override { in_->truncate(s, n); }
  int64_t seq_len(int64_t s) const override { return in_->seq_len(s); }
  Footprint footprint() const override { return in_->footprint(); }
  at::Tensor keys(int layer) const { return at::cat(k_[layer], 0); }     // [T, Hkv, D]
  at::Tensor queries(int layer) const { return at::cat(q_[layer], 0); }  // [T, Hq, D]

 private:
  std::unique_ptr<KvCache> in_;
  std::vector<std::vector<at::Tensor>> k_, q_;
};

}  // namespace kvb::test
