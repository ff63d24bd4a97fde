#pragma once
// Protect: the entries of a KV head an eviction keeps whatever their score, and the budget that is
// left for the scored rest. Three kinds, all counted inside the head's budget:
//   sinks               the first `sinks` tokens of the sequence (StreamingLLM, H2O's sinks);
//   recent window       the newest floor(recent_fraction x budget) + recent_tokens entries before
//                       the observation window (H2O's recent share, StreamingLLM's window with
//                       recent_fraction 1, TOVA's keep_current as recent_tokens 1);
//   observation window  the entries whose token index falls in the observation window (the last
//                       LayerView::window tokens), newest first (SnapKV family). Window entries
//                       that do not fit are dropped, never scored against the prefix.
// Sinks come first and may exceed the budget (they are never evicted); the window and the recent
// entries take what is left, in that order. Torch-free.

#include <cstdint>
#include <vector>

#include "methods/common/evicting_kv_cache.h"

namespace kvb {

struct Protect {
  int64_t sinks = 0;                // tokens 0 .. sinks - 1
  double recent_fraction = 0.0;     // of the head's budget, floored
  int64_t recent_tokens = 0;        // on top of the fraction
  bool observation_window = false;  // the LayerView::window newest tokens
};

// One head under a budget: what is kept for sure and what competes on score for the room left.
struct HeadSplit {
  std::vector<int64_t> kept;        // protected slots, ascending
  std::vector<int64_t> candidates;  // slots that compete on score, ascending
  int64_t room = 0;                 // entries of the budget left for candidates (>= 0)
};

HeadSplit split_head(const Protect& protect, const LayerView& layer, const HeadView& head,
                     int64_t budget);

}  // namespace kvb
