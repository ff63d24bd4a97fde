#pragma once
// Scores a store computes in a pass of its own before the prompt is compressed (KVzip's context
// reconstruction, oracle_evict's hindsight), held per sequence until end_prefill, when the store's
// policy reads them through compressing(). Shared by the store and its policy (a shared_ptr each).

#include <cstdint>
#include <unordered_map>
#include <utility>

#include "methods/common/evicting_kv_cache.h"

namespace kvb {

template <class Scores>
class PrePassScores {
 public:
  void put(int64_t seq, Scores s) { pending_[seq] = std::move(s); }
  bool has(int64_t seq) const { return pending_.count(seq) > 0; }
  void drop(int64_t seq) { pending_.erase(seq); }

  // Runs compress(Scores&) with the sequence's scores as compressing(), then drops them, whether
  // it returns or throws. The sequence must have scores (has(seq)).
  template <class F>
  void compress_with(int64_t seq, F&& compress) {
    auto it = pending_.find(seq);
    compressing_ = &it->second;
    try {
      compress(it->second);
    } catch (...) {
      compressing_ = nullptr;
      pending_.erase(it);
      throw;
    }
    compressing_ = nullptr;
    pending_.erase(it);
  }

  // The scores of the sequence being compressed; null outside compress_with.
  const Scores* compressing() const { return compressing_; }

 private:
  std::unordered_map<int64_t, Scores> pending_;  // scored, not yet compressed
  const Scores* compressing_ = nullptr;
};

// The policy side: selects once, at the end of the prefill, from the scores alone (no attention,
// norms or window of the store's own). select() is the method's.
class PrePassPolicy : public EvictionPolicy {
 public:
  Needs needs() const override { return {}; }
  Schedule schedule() const override {
    Schedule s;
    s.end_prefill = true;
    return s;
  }
};

}  // namespace kvb
