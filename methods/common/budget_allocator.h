#pragma once
// BudgetAllocator: how many entries each KV head of a layer keeps, and which. It reads the budget
// (Budget: a ratio or a token count), applies the protection (protect.h) per head and fills the
// room that is left with the best-scored candidates (token_scorer.h).
//   uniform        every KV head of every layer keeps Budget::per_head entries (SnapKV, H2O, ...).
//   pyramid        per-layer budgets decreasing linearly from the bottom layer to the top and
//                  averaging to the budget (PyramidKV; pyramid_layer_budget in eviction_select.h);
//                  the heads of a layer share their layer's budget equally.
//   head-adaptive  Ada-KV: the layer's budget (Budget::per_layer, or the pyramid's layer budget x
//                  heads) is pooled over its KV heads; after each head's protected entries, the
//                  rest is split by the layer-wide top scores above a floor of floor_alpha x the
//                  average share (adaptive_head_budgets), so heads end up ragged.
// Before a step (Trigger::kBeforeStep) the incoming tokens are part of the budget: the layer is cut
// to leave room for them, so the step attends over the budget (StreamingLLM). Torch-free.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "methods/common/evicting_kv_cache.h"
#include "methods/common/protect.h"

namespace kvb {

class BudgetAllocator {
 public:
  virtual ~BudgetAllocator() = default;
  // Whether the layer holds more than its budget (when false nothing is scored or evicted).
  virtual bool over_budget(const LayerView& layer) const = 0;
  // Fills keep[h] with the slots head h keeps (protected and scored), ascending. Returns false
  // when nothing is evicted. scores[h] has one score per slot of head h.
  virtual bool keep(const LayerView& layer, const Protect& protect,
                    const std::vector<std::vector<float>>& scores,
                    std::vector<std::vector<int64_t>>* keep) const = 0;
  // Pools the budget over the heads of a layer (heads end up ragged, so a scorer that shares one
  // score across a layer's heads must score them apart).
  virtual bool pools_heads() const { return false; }
  virtual std::map<std::string, double> settings() const { return {}; }
};

std::unique_ptr<BudgetAllocator> make_uniform_allocator(Budget budget);
std::unique_ptr<BudgetAllocator> make_pyramid_allocator(Budget budget, double beta);
// pyramid: per-layer totals from the PyramidKV formula first (Ada-KV's pyramid option).
std::unique_ptr<BudgetAllocator> make_head_adaptive_allocator(Budget budget, double floor_alpha,
                                                              bool pyramid, double beta);

}  // namespace kvb
