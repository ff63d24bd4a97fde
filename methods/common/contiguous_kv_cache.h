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
#include "harness/kv/probe_view.h"
#include "harness/kv/splice.h"
#include "methods/common/seq_store.h"

namespace kvb {

struct ContiguousSeq {
  std::vector<at::Tensor> k, v;  // per layer: [capacity, num_kv_heads, head_dim]
  int64_t len = 0;
  int64_t capacity = 0;
  int64_t in_flight = 0;  // the running step's new tokens (written by attend), for probe_view
};

class ContiguousKvCache : public SeqStore<ContiguousSeq>, public ProbedCache, public SplicingCache {
 public:
  enum class Mode { kGrow, kReserve };
  ContiguousKvCache(const CacheContext& ctx, Mode mode, int64_t reserve_tokens, std::string name);

  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void fork(int64_t src_id, int64_t dst_id) override;  // dense: the copy owns its rows
  void truncate(int64_t seq_id, int64_t new_len) override;
  Footprint footprint() const override;
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;
  void splice(int64_t dst_id, const std::vector<SpliceSource>& sources) override;

 private:
  using Seq = ContiguousSeq;
  Seq new_seq(int64_t) override { return Seq(); }  // rows are allocated by the first step
  // Room for the step's tokens: the reservation, or growth by doubling.
  void step_begins(Seq& s, const StepBatch& batch, int64_t b) override;
  void reallocate(Seq& s, int64_t capacity);

  CacheContext ctx_;
  Mode mode_;
  int64_t reserve_tokens_;
};

}  // namespace kvb
