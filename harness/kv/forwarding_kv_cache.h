#pragma once
// A store around another that passes every verb on: the base of wrappers that change one thing and
// leave the rest to the store they wrap (ObservedKvCache watches attend; kv_packet's wrapper adds
// how documents are cached; RecordingKvCache records a prefill). A wrapper overrides what it
// changes. Here, below both the harness's stores and the methods', so either can build on it.

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "harness/kv/kv_cache.h"

namespace kvb {

class ForwardingKvCache : public KvCache {
 public:
  explicit ForwardingKvCache(std::unique_ptr<KvCache> inner) : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name(); }
  void begin_step(const StepBatch& batch) override { inner_->begin_step(batch); }
  at::Tensor attend(const LayerInput& in) override { return inner_->attend(in); }
  void end_step(const StepBatch& batch) override { inner_->end_step(batch); }
  void end_prefill(int64_t seq_id) override { inner_->end_prefill(seq_id); }
  void release(int64_t seq_id) override { inner_->release(seq_id); }
  void fork(int64_t src_id, int64_t dst_id) override { inner_->fork(src_id, dst_id); }
  void truncate(int64_t seq_id, int64_t new_len) override { inner_->truncate(seq_id, new_len); }
  int64_t seq_len(int64_t seq_id) const override { return inner_->seq_len(seq_id); }
  Footprint footprint() const override { return inner_->footprint(); }
  std::map<std::string, double> counters() const override { return inner_->counters(); }
  bool serves_windows() const override { return inner_->serves_windows(); }

  const KvCache& inner() const { return *inner_; }

 protected:
  KvCache& wrapped() { return *inner_; }

 private:
  std::unique_ptr<KvCache> inner_;
};

}  // namespace kvb
