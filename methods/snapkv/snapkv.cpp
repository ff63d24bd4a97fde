// snapkv: SnapKV (Li et al., NeurIPS 2024). At the end of prefill the last `window` queries score
// every earlier token (softmax over all keys, summed over the window queries), the scores are
// pooled along the keys, the query heads of each GQA group are aggregated into their KV head (mean
// | max: recorded), and each KV head keeps its top (budget - window) prefix tokens plus the window
// itself. Selection and storage are per KV head (never repeated per query head).

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"
#include "methods/common/snap_policy.h"

namespace kvb {
namespace {

MethodInfo snapkv_info() {
  MethodInfo m;
  m.name = "snapkv";
  m.summary =
      "SnapKV: observation-window attention, pooled, per-KV-head top-k at the end of prefill";
  m.paper =
      "Li et al., SnapKV: LLM Knows What You are Looking for Before Generation, NeurIPS 2024 "
      "(arXiv 2404.14469)";
  m.params = budget_params(0.5, "ratio");
  for (auto& s : snap_params(snapkv_presets(), "official")) m.params.push_back(s);
  m.params.push_back(position_mode_param("absolute"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  m.caps.query_aware = true;
  return m;
}

std::unique_ptr<KvCache> make_snapkv(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<EvictingKvCache>(
      ctx, evicting_options(p, "snapkv", ctx.config.head_dim),
      make_snap_policy(parse_budget(p, "snapkv"), parse_snap(p, "snapkv", snapkv_presets()),
                       p.at("compress_every").get<int64_t>()));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(snapkv, kvb::snapkv_info, kvb::make_snapkv);
