// snapkv: SnapKV (Li et al., NeurIPS 2024). At the end of prefill the last `window` queries score
// every earlier token (softmax over all keys, summed over the window queries), the scores are
// pooled along the keys, the query heads of each GQA group are aggregated into their KV head (mean
// | max: recorded), and each KV head keeps its top (budget - window) prefix tokens plus the window
// itself. Selection and storage are per KV head (never repeated per query head). The scorer is
// methods/common/snap_scorer.h; `allocator` spreads the budget (uniform: the paper).

#include "methods/common/snap_scorer.h"

namespace kvb {
namespace {

ScoredMethod snapkv_method() {
  return snap_family_method(
      "snapkv",
      "SnapKV: observation-window attention, pooled, per-KV-head top-k at the end of prefill",
      "Li et al., SnapKV: LLM Knows What You are Looking for Before Generation, NeurIPS 2024 "
      "(arXiv 2404.14469)");
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(snapkv, kvb::snapkv_method);
