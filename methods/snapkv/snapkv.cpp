// snapkv: SnapKV (Li et al., NeurIPS 2024). At the end of prefill the last `window` queries score
// every earlier token (softmax over all keys, summed over the window queries), the scores are
// pooled along the keys, the query heads of each GQA group are aggregated into their KV head (mean
// | max: recorded), and each KV head keeps its top (budget - window) prefix tokens plus the window
// itself. Selection and storage are per KV head (never repeated per query head).

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {
namespace {

const std::map<std::string, SnapSettings>& snapkv_presets() {
  static const std::map<std::string, SnapSettings> p = {
      // FasterDecoding/SnapKV code defaults (window 32, avg-pool 5).
      {"official", {32, 5, Pooling::kAvg, GqaAgg::kMean}},
      // The official LongBench configs (window 32, max-pool 7).
      {"longbench", {32, 7, Pooling::kMax, GqaAgg::kMean}},
      // NVIDIA/kvpress SnapKVPress (window 64, avg-pool 5, query heads averaged per KV head).
      {"kvpress", {64, 5, Pooling::kAvg, GqaAgg::kMean}},
  };
  return p;
}

class SnapKvPolicy : public EvictionPolicy {
 public:
  SnapKvPolicy(Budget budget, SnapSettings s, int64_t every)
      : budget_(budget), s_(s), every_(every) {}
  Needs needs() const override {
    Needs n;
    n.window = s_.window;
    return n;
  }
  Schedule schedule() const override {
    Schedule s;
    s.end_prefill = true;
    s.every_decode_steps = every_;
    return s;
  }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    if (v.window == 0) return false;
    const int64_t B = budget_.per_head(v.total(), v.n_kv_heads);
    bool changed = false;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& k = (*keep)[h];
      if (hv.len <= B) {
        k.resize(static_cast<size_t>(hv.len));
        for (int64_t j = 0; j < hv.len; ++j) k[j] = j;
        continue;
      }
      k = snap_keep(snap_scores(v, hv, s_.pooling, s_.kernel, s_.agg), B);
      changed = true;
    }
    return changed;
  }
  std::map<std::string, double> settings() const override { return snap_settings_counters(s_); }

 private:
  Budget budget_;
  SnapSettings s_;
  int64_t every_;
};

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
  EvictingKvCache::Options o;
  o.codec = parse_codec(p, "snapkv", ctx.config.head_dim);
  o.name = "snapkv";
  o.position_mode = parse_position_mode(p.at("position_mode").get<std::string>());
  return std::make_unique<EvictingKvCache>(
      ctx, o,
      std::make_unique<SnapKvPolicy>(parse_budget(p, "snapkv"),
                                     parse_snap(p, "snapkv", snapkv_presets()),
                                     p.at("compress_every").get<int64_t>()));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(snapkv, kvb::snapkv_info, kvb::make_snapkv);
