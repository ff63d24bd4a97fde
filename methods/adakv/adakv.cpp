// adakv: Ada-KV (Feng et al., NeurIPS 2025). SnapKV-style window scores (methods/common/
// snap_scorer.h) with the head-adaptive allocator: the layer's prefix budget is split over its KV
// heads adaptively: the global top entries across heads give each head a count n_h, and head h
// keeps round(alpha * B + (1 - alpha) * n_h) prefix tokens plus the window. Heads end up with
// different lengths; the store keeps them ragged (the official varlen layout), so the memory saved
// is real (kvpress's AdaKVPress only masks). Ada-KV over another scorer is that scorer's method
// with allocator=ada (e.g. tova allocator=ada), as kvpress's AdaKVPress(press).

#include "methods/common/snap_scorer.h"

namespace kvb {
namespace {

ScoredMethod adakv_method() {
  return snap_family_method(
      "adakv", "Ada-KV: head-adaptive budgets on SnapKV window scores, ragged per KV head",
      "Feng et al., Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation, NeurIPS "
      "2025 (arXiv 2407.11550)",
      {float_param("floor_alpha", 0.2, 0.0, 1.0,
                   "share of the average head budget every head is guaranteed (0.2: the "
                   "authors' advice for GQA models; README 0.5)"),
       bool_param("pyramid", false, "per-layer budgets from the PyramidKV formula"),
       float_param("beta", 20.0, 1.0, 1e6, "pyramid steepness (with pyramid=true)")},
      [](const nlohmann::json& p, const Budget& b) {
        return make_head_adaptive_allocator(b, p.at("floor_alpha").get<double>(),
                                            p.at("pyramid").get<bool>(),
                                            p.at("beta").get<double>());
      });
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(adakv, kvb::adakv_method);
