#pragma once
// An optional capability of a KvCache (found with dynamic_cast; a store that lacks it never gets
// such steps): speculative lookahead rows (SpeCache's speculative token). A store that wants them
// gets decode steps of [x_t, guess] per sequence, the guess being the engine's prediction of the
// token after x_t (the argmax of the previous lookahead row); it attends both rows and keeps only
// x_t's, so the sequence grows by one row and the positions advance by one. Its first decode step
// after a prompt or fork is preceded by a lookahead-only step [x_t] that makes the first guess.

#include <cstdint>
#include <vector>

#include "harness/kv/kv_cache.h"

namespace kvb {

class LookaheadCache {
 public:
  virtual ~LookaheadCache() = default;
  // Whether decode steps should carry a lookahead row (a store may decide by its parameters).
  virtual bool wants_lookahead() const = 0;
  // Before every step of a store that wants them: [batch] of the coming step, 1 where the
  // sequence's last new row is a lookahead row (attended, its KV not kept); empty: none.
  virtual void set_lookahead_rows(const std::vector<uint8_t>& rows) = 0;
};

// The store's lookahead capability when it wants lookahead rows, else null.
inline LookaheadCache* wanting_lookahead(KvCache& kv) {
  auto* l = dynamic_cast<LookaheadCache*>(&kv);
  return l && l->wants_lookahead() ? l : nullptr;
}
inline const LookaheadCache* wanting_lookahead(const KvCache& kv) {
  const auto* l = dynamic_cast<const LookaheadCache*>(&kv);
  return l && l->wants_lookahead() ? l : nullptr;
}

// The new rows of sequence b that the step keeps, given the rows set_lookahead_rows announced.
inline int64_t kept_rows(const StepBatch& batch, const std::vector<uint8_t>& lookahead, int64_t b) {
  return batch.new_tokens(b) - (!lookahead.empty() && lookahead[b] ? 1 : 0);
}

}  // namespace kvb
