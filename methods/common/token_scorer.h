#pragma once
// TokenScorer: the part of an eviction method that says how much each kept entry is worth. It
// declares the signals it reads (EvictionPolicy::Needs: accumulated attention, the last query row,
// observation-window attention, key norms) and turns a layer's view into one score per KV head per
// kept entry; higher scores are kept. Which entries are protected whatever their score (protect.h),
// how many each head may keep (budget_allocator.h) and when eviction runs
// (EvictionPolicy::Schedule) are separate parts, composed by composed_policy.h. Torch-free.

#include <map>
#include <string>
#include <vector>

#include "methods/common/evicting_kv_cache.h"

namespace kvb {

class TokenScorer {
 public:
  virtual ~TokenScorer() = default;
  virtual EvictionPolicy::Needs needs() const = 0;
  // Fills (*scores)[h] with head h's score of every slot ([heads[h].len] floats; entries the
  // protection keeps anyway may hold anything). Returns false when the signals it needs are not
  // there at this call (e.g. no observation window yet): the layer is then left as it is.
  virtual bool score(const LayerView& layer, std::vector<std::vector<float>>* scores) const = 0;
  // Effective settings reported with the counters (setting.<name>).
  virtual std::map<std::string, double> settings() const { return {}; }
};

// The common case: a score that depends on one entry alone (accumulated attention, a key norm).
class EntryScorer : public TokenScorer {
 public:
  bool score(const LayerView& layer, std::vector<std::vector<float>>* scores) const final {
    for (int64_t h = 0; h < layer.n_kv_heads; ++h) {
      const HeadView& head = layer.heads[h];
      std::vector<float>& s = (*scores)[h];
      s.resize(static_cast<size_t>(head.len));
      for (int64_t j = 0; j < head.len; ++j) s[j] = entry_score(layer, head, j);
    }
    return true;
  }

 protected:
  // The score of slot j of `head`.
  virtual float entry_score(const LayerView& layer, const HeadView& head, int64_t j) const = 0;
};

// A score computed head by head from the kept keys and values (Needs::kv, plus what needs() adds):
// score_head fills a head's scores ([head.len], zero-filled; never called for an empty head).
class KvHeadScorer : public TokenScorer {
 public:
  EvictionPolicy::Needs needs() const final {
    EvictionPolicy::Needs n = more_needs();
    n.kv = true;
    return n;
  }
  bool score(const LayerView& layer, std::vector<std::vector<float>>* scores) const final {
    for (int64_t h = 0; h < layer.n_kv_heads; ++h) {
      const HeadView& head = layer.heads[h];
      std::vector<float>& s = (*scores)[h];
      s.assign(static_cast<size_t>(head.len), 0.f);
      if (head.len == 0) continue;
      if (head.keys == nullptr || !score_head(layer, head, h, &s)) return false;
    }
    return true;
  }

 protected:
  virtual EvictionPolicy::Needs more_needs() const { return {}; }
  // Returns false when a signal it needs is not there at this call (the layer is left as it is).
  virtual bool score_head(const LayerView& layer, const HeadView& head, int64_t h,
                          std::vector<float>* scores) const = 0;
};

}  // namespace kvb
