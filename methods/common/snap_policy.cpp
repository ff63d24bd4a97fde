#include "methods/common/snap_policy.h"

#include "harness/common/error.h"

namespace kvb {

namespace {

const std::map<std::string, SnapSettings>& presets_table() {
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

}  // namespace

const std::map<std::string, SnapSettings>& snapkv_presets() { return presets_table(); }

std::unique_ptr<EvictionPolicy> make_snap_policy(Budget budget, SnapSettings s, int64_t every) {
  return std::make_unique<SnapKvPolicy>(budget, s, every);
}

std::unique_ptr<KvCache> make_pruned_snap_cache(const CacheContext& ctx, const nlohmann::json& p,
                                                const std::string& method, ChannelPruneSpec spec) {
  KVB_CHECK(ctx.device.is_cpu() && ctx.dtype == at::kFloat, "method ", method,
            ": the pruned-key store runs on CPU fp32 (got device ", ctx.device.str(), ")");
  SnapSettings snap = parse_snap(p, method, snapkv_presets());
  spec.ratio = p.at("pruning_ratio").get<double>();
  spec.window = snap.window;
  spec.dtype = RowDtype::kF32;
  EvictingKvCache::Options o;
  o.name = method;
  o.codec = make_channel_prune_codec(spec);
  return std::make_unique<EvictingKvCache>(
      ctx, o, make_snap_policy(parse_budget(p, method), snap, p.at("compress_every").get<int64_t>()));
}

}  // namespace kvb
