// pyramidkv: PyramidKV (Cai et al., arXiv 2406.02069). SnapKV scoring
// (methods/common/snap_scorer.h) with the pyramid allocator: per-layer budgets that decrease
// linearly from the bottom layer to the top (steepness beta) and average to the budget. The pyramid
// over another scorer is that scorer's method with allocator=pyramid (e.g. knorm
// allocator=pyramid).

#include "methods/common/snap_scorer.h"

namespace kvb {
namespace {

ScoredMethod pyramidkv_method() {
  return snap_family_method(
      "pyramidkv", "PyramidKV: SnapKV scores with linearly decreasing per-layer budgets (beta)",
      "Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information "
      "Funneling, arXiv 2406.02069",
      {float_param(
          "beta", 20.0, 1.0, 1e6,
          "pyramid steepness: the top layer keeps (budget - window) / beta prefix tokens")},
      [](const nlohmann::json& p, const Budget& b) {
        return make_pyramid_allocator(b, p.at("beta").get<double>());
      });
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(pyramidkv, kvb::pyramidkv_method);
