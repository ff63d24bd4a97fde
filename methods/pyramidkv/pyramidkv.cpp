// pyramidkv: PyramidKV (Cai et al., arXiv 2406.02069). SnapKV scoring
// (methods/common/snap_scorer.h) with the pyramid allocator: per-layer budgets that decrease
// linearly from the bottom layer to the top (steepness beta) and average to the budget. The pyramid
// over another scorer is that scorer's method with allocator=pyramid (e.g. knorm
// allocator=pyramid).

#include "methods/common/scored_method.h"
#include "methods/common/snap_scorer.h"

namespace kvb {
namespace {

ScoredMethod pyramidkv_method() {
  ScoredMethod m(
      "pyramidkv", "PyramidKV: SnapKV scores with linearly decreasing per-layer budgets (beta)",
      "Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information "
      "Funneling, arXiv 2406.02069");
  m.info.params = snap_params(snap_presets("pyramidkv"), "official");
  m.info.params.push_back(
      float_param("beta", 20.0, 1.0, 1e6,
                  "pyramid steepness: the top layer keeps (budget - window) / beta prefix tokens"));
  m.info.caps.query_aware = true;
  m.any_allocator = false;
  m.parts = [](const nlohmann::json& p, const std::string& method, const Budget& b) {
    PolicyParts parts = snap_parts(parse_snap(p, method, snap_presets("pyramidkv")),
                                   p.at("compress_every").get<int64_t>());
    parts.allocator = make_pyramid_allocator(b, p.at("beta").get<double>());
    return parts;
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(pyramidkv, kvb::pyramidkv_method);
