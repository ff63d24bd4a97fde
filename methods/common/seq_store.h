#pragma once
// A store whose per-sequence state is one copyable Seq kept in a SeqTable (seq_table.h): the verbs
// that are only bookkeeping are written here once -- a sequence is made at its first step (new_seq)
// and checked against every step's past length, the step's tokens are counted at its end, a fork is
// a copy, release drops it. A store implements attend, truncate, footprint and what it does besides
// (step_begins: room for the step's tokens, per-step state), and overrides a verb only where it
// does more than the bookkeeping. Helpers for the rest: probe_seq (the sequence a probe asks about)
// and fp32_footprint (the frame of an fp32 store's ledger).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/probe_view.h"
#include "methods/common/seq_table.h"

namespace kvb {

template <typename Seq, int64_t Seq::*Len = &Seq::len>
class SeqStore : public KvCache {
 public:
  explicit SeqStore(std::string name) : seqs_(std::move(name)) {}

  std::string name() const override { return seqs_.store(); }
  void begin_step(const StepBatch& batch) override {
    for (int64_t b = 0; b < batch.batch_size(); ++b)
      step_begins(seqs_.enter(batch, b, [&] { return new_seq(batch.seq_ids[b]); }), batch, b);
  }
  void end_step(const StepBatch& batch) override { seqs_.end_step(batch); }
  void release(int64_t seq_id) override { seqs_.release(seq_id); }
  void fork(int64_t src_id, int64_t dst_id) override { seqs_.fork(src_id, dst_id); }
  int64_t seq_len(int64_t seq_id) const override { return seqs_.len(seq_id); }

 protected:
  // The state of a sequence at its first step.
  virtual Seq new_seq(int64_t seq_id) = 0;
  // Sequence b of a starting step, made and checked.
  virtual void step_begins(Seq& s, const StepBatch& batch, int64_t b) {}
  // A probe_view (ProbedCache) answered from the sequence it asks about: snapshots(seq) for it,
  // nothing when the sequence is unknown or the layer out of range.
  template <typename Snapshots>
  std::vector<HeadSnapshot> probe_seq(int64_t seq_id, int layer, int64_t n_layers,
                                      Snapshots snapshots) const {
    const Seq* s = layer >= 0 && layer < n_layers ? seqs_.find(seq_id) : nullptr;
    return s ? snapshots(*s) : std::vector<HeadSnapshot>{};
  }

  // The footprint of a store that keeps fp32 rows (their model dtype bytes start at 0; fp32 is the
  // store's compute dtype): tokens held from the sequences' lengths, logical bytes at 4 bytes per
  // element, and held(seq, &f) adds what each sequence occupies.
  template <typename Held>
  Footprint fp32_footprint(const ModelConfig& c, Held held) const {
    Footprint f;
    f.model_dtype_device_bytes = 0;
    for (const auto& [id, s] : seqs_) {
      f.tokens_held += s.*Len;
      held(s, &f);
    }
    f.logical_bytes = f.tokens_held * c.kv_bytes_per_token(4);
    return f;
  }

  SeqTable<Seq, Len> seqs_;
};

}  // namespace kvb
