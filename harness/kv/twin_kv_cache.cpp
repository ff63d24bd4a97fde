#include "harness/kv/twin_kv_cache.h"

namespace kvb {

TwinKvCache::TwinKvCache(std::unique_ptr<KvCache> method, std::unique_ptr<KvCache> exact,
                         int64_t every, int64_t first_decode_pos, bool follow_exact)
    : method_(std::move(method)),
      exact_(std::move(exact)),
      every_(every),
      first_(first_decode_pos),
      follow_exact_(follow_exact) {}

void TwinKvCache::begin_step(const StepBatch& b) {
  // The exact twin holds every token: its past length is the sequence's position count.
  xb_ = b;
  for (int64_t i = 0; i < xb_.batch_size(); ++i) xb_.past_lens[i] = exact_->seq_len(xb_.seq_ids[i]);
  method_->begin_step(b);
  exact_->begin_step(xb_);
  const int64_t pos = b.positions.back();
  sampling_ = b.phase == Phase::kDecode && pos >= first_ && (pos - first_) % every_ == 0;
}

at::Tensor TwinKvCache::attend(const LayerInput& in) {
  at::Tensor om = method_->attend(in);
  LayerInput xi = in;
  xi.batch = &xb_;
  at::Tensor ox = exact_->attend(xi);
  if (sampling_) on_layer(in, om, ox);
  return follow_exact_ ? ox : om;
}

void TwinKvCache::end_step(const StepBatch& b) {
  method_->end_step(b);
  exact_->end_step(xb_);
}

void TwinKvCache::end_prefill(int64_t seq) {
  method_->end_prefill(seq);
  exact_->end_prefill(seq);
}

void TwinKvCache::release(int64_t seq) {
  method_->release(seq);
  exact_->release(seq);
}

void TwinKvCache::fork(int64_t src, int64_t dst) {
  method_->fork(src, dst);
  exact_->fork(src, dst);
}

void TwinKvCache::truncate(int64_t seq, int64_t n) {
  method_->truncate(seq, n);
  exact_->truncate(seq, n);
}

}  // namespace kvb
