#pragma once
// A KV store that keeps each sequence's keys and values contiguously, per layer. Two policies share it:
//   grow     — capacity doubles as the sequence grows (`full`: the dense per-sequence baseline);
//   reserve  — the maximum length is reserved when a sequence starts (`static`: the Era-1 contiguous
//              preallocation whose waste PagedAttention measured).

#include <ATen/core/Tensor.h>

#include <unordered_map>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"

namespace kvb {

class ContiguousKvCache : public KvCache {
 public:
  enum class Mode { kGrow, kReserve };
  ContiguousKvCache(const CacheContext& ctx, Mode mode, int64_t reserve_tokens, std::string name);

  std::string name() const override { return name_; }
  void begin_step(const StepBatch& batch) override;
  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void release(int64_t seq_id) override { seqs_.erase(seq_id); }
  void fork(int64_t src_id, int64_t dst_id) override;
  void truncate(int64_t seq_id, int64_t new_len) override;
  int64_t seq_len(int64_t seq_id) const override;
  Footprint footprint() const override;
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;
  bool supports_splice() const override { return true; }
  void splice(int64_t dst_id, const std::vector<SpliceSource>& sources) override;

 private:
  struct Seq {
    std::vector<at::Tensor> k, v;  // per layer: [capacity, num_kv_heads, head_dim]
    int64_t len = 0;
    int64_t capacity = 0;
    int64_t in_flight = 0;  // the running step's new tokens (written by attend), for probe_view
  };
  void reallocate(Seq& s, int64_t capacity);

  CacheContext ctx_;
  Mode mode_;
  int64_t reserve_tokens_;
  std::string name_;
  std::unordered_map<int64_t, Seq> seqs_;
};

}  // namespace kvb
