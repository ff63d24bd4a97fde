#pragma once
// Scores a store computes in a pass of its own before the prompt is compressed (KVzip's context
// reconstruction, oracle_evict's hindsight), held per sequence until end_prefill, when the store's
// policy reads them through compressing(). Shared by the store and its policy (a shared_ptr each).

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "harness/common/error.h"
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

// What a method's own pass is: which protocols run it, for the error when a prefill ends without it
// ("method <method>: ... without the <pass>; only a protocol that <protocols> can run <method>"),
// and the name of its counters (<counter>_tokens, <counter>_passes).
struct PrePassInfo {
  std::string method;
  std::string pass;       // "hindsight pass"
  std::string protocols;  // "hands the continuation (stream, qa with mode=query_agnostic)"
  std::string counter;    // "hindsight"
};

// The policy side: selects once, at the end of the prefill, from the scores of the sequence being
// compressed alone (no attention, norms or window of the store's own). select_from() is the
// method's.
template <class Scores>
class PrePassPolicy : public EvictionPolicy {
 public:
  PrePassPolicy(std::shared_ptr<const PrePassScores<Scores>> scores, PrePassInfo need)
      : scores_(std::move(scores)), need_(std::move(need)) {}
  Needs needs() const override { return {}; }
  Schedule schedule() const override {
    Schedule s;
    s.end_prefill = true;
    return s;
  }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const final {
    const Scores* s = scores_->compressing();
    KVB_CHECK(s != nullptr, "method ", need_.method, ": a prefill ended without the ", need_.pass,
              "; only a protocol that ", need_.protocols, " can run ", need_.method);
    return select_from(*s, v, keep);
  }

 protected:
  virtual bool select_from(const Scores& scores, const LayerView& v,
                           std::vector<std::vector<int64_t>>* keep) const = 0;

 private:
  std::shared_ptr<const PrePassScores<Scores>> scores_;
  PrePassInfo need_;
};

}  // namespace kvb
