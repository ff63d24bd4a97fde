#pragma once
// The per-sequence state of a store, keyed by the engine's sequence ids: made at a sequence's first
// step, checked against every step's past length, copied on fork, checked on truncate. The stores
// keep their sequences here (through SeqStore, seq_store.h): the bookkeeping is written once.
// A Seq is one copyable value (a fork is its copy: members that share storage when copied, such as
// tensors, deep-copy in their own copy constructors or in the store's fork hook) whose member `Len`
// counts the tokens the sequence has appended.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/kv_cache.h"
#include "harness/kv/lookahead.h"

namespace kvb {

template <typename Seq, int64_t Seq::*Len = &Seq::len>
class SeqTable {
 public:
  explicit SeqTable(std::string store) : store_(std::move(store)) {}

  // The step's b-th sequence, made by make() at its first step; it must hold the step's past
  // length.
  template <typename Make>
  Seq& enter(const StepBatch& batch, int64_t b, Make make) {
    const int64_t id = batch.seq_ids[b];
    auto it = map_.find(id);
    if (it == map_.end()) it = map_.emplace(id, make()).first;
    KVB_ASSERT(it->second.*Len == batch.past_lens[b], store_, "sequence ", id, " holds ",
               it->second.*Len, " tokens but the step says ", batch.past_lens[b]);
    return it->second;
  }
  template <typename Make>
  void begin_step(const StepBatch& batch, Make make) {
    for (int64_t b = 0; b < batch.batch_size(); ++b) enter(batch, b, make);
  }
  // Adds the step's new tokens to each sequence's length; with `lookahead` (the rows a
  // LookaheadCache was told of), those it keeps: a lookahead row is attended, not kept.
  void end_step(const StepBatch& batch, const std::vector<uint8_t>& lookahead = {}) {
    for (int64_t b = 0; b < batch.batch_size(); ++b)
      at(batch.seq_ids[b]).*Len += kept_rows(batch, lookahead, b);
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
  // Null when the sequence is unknown (probes and end_prefill of a sequence never stepped).
  const Seq* find(int64_t id) const {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : &it->second;
  }
  Seq* find(int64_t id) {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : &it->second;
  }
  bool contains(int64_t id) const { return map_.count(id) != 0; }
  int64_t len(int64_t id) const {
    auto it = map_.find(id);
    return it == map_.end() ? 0 : it->second.*Len;
  }
  void release(int64_t id) { map_.erase(id); }
  // dst becomes a copy of src.
  void fork(int64_t src, int64_t dst) { add(dst, Seq(at(src)), "fork target "); }
  // A sequence made whole by the store (a splice's target).
  Seq& add(int64_t id, Seq s, const char* what = "splice target ") {
    KVB_ASSERT(map_.count(id) == 0, store_, what, id, " already exists");
    return map_.emplace(id, std::move(s)).first->second;
  }
  // The sequence a truncation to new_len applies to, after checking new_len is in [0, len].
  Seq& truncating(int64_t id, int64_t new_len) {
    Seq& s = at(id);
    KVB_CHECK(new_len >= 0 && new_len <= s.*Len, store_, ": cannot truncate sequence ", id, " of ",
              s.*Len, " tokens to ", new_len);
    return s;
  }

  auto begin() const { return map_.begin(); }
  auto end() const { return map_.end(); }
  size_t size() const { return map_.size(); }
  const std::string& store() const { return store_; }

 private:
  std::string store_;
  std::unordered_map<int64_t, Seq> map_;
};

}  // namespace kvb
