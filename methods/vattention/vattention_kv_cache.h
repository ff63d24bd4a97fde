#pragma once
// vAttention's store: per layer, one virtual range for K and one for V, each reserved up front for
// max_batch sequence slots of max_context tokens and never moved; physical pages are committed as a
// slot's tokens need them and released when the sequence goes (or kept for the slot's next
// sequence: deferred reclamation). A sequence's KV is contiguous in virtual memory, so attention
// reads it through the dense kernels with no block table: prefill through attend_dense over the
// slot's rows, decode through the decode kernel with one "page" per sequence - its whole slot.
//
// The ledger asks the OS (mincore on the host, the driver's mapped allocations on CUDA) which bytes
// are resident, instead of trusting what the store believes it committed: a sequence of n tokens
// holds ceil(n x row_bytes / page) pages per layer and per K/V, the page-size fragmentation
// vAttention trades for contiguity.

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"
#include "harness/kv/probe_view.h"
#include "kernels/torch/paged_decode_torch.h"
#include "kvb/kernels/virtual_memory.h"
#include "methods/common/seq_store.h"

namespace kvb {

// One sequence: its slot, its length and the running step's new tokens (written by attend, for
// probe_view).
struct VAttentionSeq {
  int64_t slot = 0;
  int64_t len = 0;
  int64_t in_flight = 0;
};

class VAttentionKvCache : public SeqStore<VAttentionSeq>, public ProbedCache {
 public:
  struct Options {
    size_t page_bytes = size_t{64} << 10;
    int64_t max_batch = 16;   // sequence slots
    int64_t max_context = 0;  // tokens per slot; 0: the model's max_seq_len
    kernels::HugePages huge_pages = kernels::HugePages::kAuto;
    bool deferred_reclaim = false;  // keep a released slot's pages for its next sequence
    bool decode_kernel = true;      // decode steps through the decode kernel (else attend_dense)
  };
  VAttentionKvCache(const CacheContext& ctx, const Options& options);

  void begin_step(const StepBatch& batch) override;
  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void release(int64_t seq_id) override;
  void fork(int64_t src_id, int64_t dst_id) override;
  void truncate(int64_t seq_id, int64_t new_len) override;
  Footprint footprint() const override;
  std::map<std::string, double> counters() const override;
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;

  // The geometry, for tests and reports.
  int64_t row_bytes() const { return row_bytes_; }      // one token of one layer's K (or V)
  int64_t slot_tokens() const { return slot_tokens_; }  // a slot's capacity (>= max_context)
  size_t page_bytes() const { return options_.page_bytes; }
  // Bytes resident for one sequence, as the OS reports them, over all layers, K and V.
  int64_t resident_bytes_of(int64_t seq_id) const;

 private:
  using Seq = VAttentionSeq;
  Seq new_seq(int64_t seq_id) override;  // a slot of its own
  // Maps the pages the step's tokens need, before the step, as vAttention maps them before each
  // iteration.
  void step_begins(Seq& s, const StepBatch& batch, int64_t b) override;
  int64_t take_slot();
  void free_slot(int64_t slot);
  // Commits or releases pages so that `slot` holds exactly the pages `tokens` tokens need
  // (release only when `shrink`).
  void fit_pages(int64_t slot, int64_t tokens, bool shrink);
  int64_t pages_for(int64_t tokens) const;
  int64_t slot_resident(int64_t slot) const;
  at::Tensor slot_rows(const at::Tensor& pool, int64_t slot, int64_t n) const;

  CacheContext ctx_;
  Options options_;
  int64_t max_context_ = 0, row_bytes_ = 0, slot_tokens_ = 0;
  size_t slot_bytes_ = 0;
  std::vector<std::unique_ptr<kernels::VirtualArena>> k_arena_, v_arena_;  // [layers]
  std::vector<at::Tensor> k_pool_, v_pool_;  // [layers]: [max_batch, slot_tokens, Hkv, D] views
  std::vector<int64_t> slot_pages_;          // [max_batch]: pages committed per layer and K/V
  std::vector<uint8_t> slot_used_;           // [max_batch]
  // The decode step's slot list (one page per sequence), built in begin_step.
  kernels::PagedDecodeTables tables_;
  bool kernel_step_ = false;
  int64_t decode_steps_ = 0, kernel_decode_steps_ = 0;
};

}  // namespace kvb
