#pragma once
// The per-sequence state of a store, keyed by the engine's sequence ids: made at a sequence's first
// step, checked against every step's past length, copied on fork. For stores whose state per
// sequence is one copyable value with a `len` member (tokens held).

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/kv_cache.h"

namespace kvb {

template <typename Seq>
class SeqTable {
 public:
  explicit SeqTable(std::string store) : store_(std::move(store)) {}

  // The step's new sequences get make(); every sequence must hold the step's past length.
  template <typename Make>
  void begin_step(const StepBatch& batch, Make make) {
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      const int64_t id = batch.seq_ids[b];
      auto it = map_.find(id);
      if (it == map_.end()) it = map_.emplace(id, make()).first;
      KVB_ASSERT(it->second.len == batch.past_lens[b], store_, "sequence ", id, " holds ",
                 it->second.len, " tokens but the step says ", batch.past_lens[b]);
    }
  }
  // Adds the step's kept new tokens to each sequence's length (a lookahead row is not kept).
  void end_step(const StepBatch& batch) {
    for (int64_t b = 0; b < batch.batch_size(); ++b)
      at(batch.seq_ids[b]).len += batch.kept_tokens(b);
  }

  Seq& at(int64_t id) {
    auto it = map_.find(id);
    KVB_ASSERT(it != map_.end(), store_, "unknown sequence ", id);
    return it->second;
  }
  const Seq& at(int64_t id) const {
    auto it = map_.find(id);
    KVB_ASSERT(it != map_.end(), store_, "unknown sequence ", id);
    return it->second;
  }
  int64_t len(int64_t id) const {
    auto it = map_.find(id);
    return it == map_.end() ? 0 : it->second.len;
  }
  void release(int64_t id) { map_.erase(id); }
  void fork(int64_t src, int64_t dst) {
    KVB_ASSERT(map_.count(dst) == 0, store_, "fork target ", dst, " already exists");
    Seq copy = at(src);
    map_.emplace(dst, std::move(copy));
  }
  // The sequence a truncation to new_len applies to, after checking new_len is in [0, len].
  Seq& truncating(int64_t id, int64_t new_len) {
    Seq& s = at(id);
    KVB_CHECK(new_len >= 0 && new_len <= s.len, store_, ": cannot truncate sequence ", id, " of ",
              s.len, " tokens to ", new_len);
    return s;
  }

  auto begin() const { return map_.begin(); }
  auto end() const { return map_.end(); }
  size_t size() const { return map_.size(); }

 private:
  std::string store_;
  std::unordered_map<int64_t, Seq> map_;
};

}  // namespace kvb
