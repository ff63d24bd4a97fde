#pragma once
// TwinKvCache: a method's cache and an exact twin (the paged cache; on a model with sliding-window
// layers, the paged cache inside a WindowedKvCache, as the method's is) that receive the SAME
// q/k/v at every layer (the twin with its own past lengths: it holds every token). At sampled
// decode positions a subclass sees both attention outputs (on_layer) and can read both stores. The
// engine continues with the method's output (the probe protocol: the method's own trajectory) or
// with the exact one (follow_exact; KVTuner's profiler: every layer's inputs are full precision, so
// one run measures each layer as if it alone were compressed).

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "harness/kv/hidden_state.h"
#include "harness/kv/kv_cache.h"
#include "harness/kv/paged_kv_cache.h"

namespace kvb {

class TwinKvCache : public KvCache, public HiddenStateCache {
 public:
  // Samples decode positions first_decode_pos, first_decode_pos + every, ...
  TwinKvCache(std::unique_ptr<KvCache> method, std::unique_ptr<KvCache> exact, int64_t every,
              int64_t first_decode_pos, bool follow_exact);

  void begin_step(const StepBatch& b) override;
  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& b) override;
  void end_prefill(int64_t seq) override;
  void release(int64_t seq) override;
  void fork(int64_t src, int64_t dst) override;
  void truncate(int64_t seq, int64_t n) override;
  int64_t seq_len(int64_t seq) const override { return method_->seq_len(seq); }
  Footprint footprint() const override { return method_->footprint(); }
  bool serves_windows() const override {
    return method_->serves_windows() && exact_->serves_windows();
  }
  // Passed on to the method's store when it reads hidden states (the exact twin does not).
  void layer_hidden(int layer, const at::Tensor& hidden) override {
    if (auto* h = dynamic_cast<HiddenStateCache*>(method_.get())) h->layer_hidden(layer, hidden);
  }

 protected:
  // Called at sampled positions, after both stores attended layer in.layer.
  virtual void on_layer(const LayerInput& in, const at::Tensor& method_out,
                        const at::Tensor& exact_out) = 0;
  KvCache& method() { return *method_; }
  const KvCache& method() const { return *method_; }
  KvCache& exact() { return *exact_; }
  const StepBatch& exact_batch() const { return xb_; }

 private:
  std::unique_ptr<KvCache> method_;
  std::unique_ptr<KvCache> exact_;
  int64_t every_, first_;
  bool follow_exact_;
  StepBatch xb_;
  bool sampling_ = false;
};

}  // namespace kvb
