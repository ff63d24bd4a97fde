// pyramidkv: PyramidKV (Cai et al., arXiv 2406.02069). SnapKV scoring with per-layer budgets that
// decrease linearly from the bottom layer to the top (steepness beta) and average to the budget.

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {
namespace {

const std::map<std::string, SnapSettings>& pyramidkv_presets() {
  static const std::map<std::string, SnapSettings> p = {
      // Zefan-Cai/KVCache-Factory PyramidKVCluster (the official code): window 8, max-pool 7.
      {"official", {8, 7, Pooling::kMax, GqaAgg::kMean}},
      // NVIDIA/kvpress PyramidKVPress: window 64, avg-pool 5.
      {"kvpress", {64, 5, Pooling::kAvg, GqaAgg::kMean}},
  };
  return p;
}

class PyramidKvPolicy : public EvictionPolicy {
 public:
  PyramidKvPolicy(Budget budget, SnapSettings s, double beta, int64_t every)
      : budget_(budget), s_(s), beta_(beta), every_(every) {}
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
    // n is the sequence length (the prompt at the end of prefill) for every layer, so that periodic
    // re-compression keeps one consistent pyramid (layers hold min(their budget, what they have)).
    const int64_t B = pyramid_layer_budget(budget_.per_head(v.total(), v.n_kv_heads), v.window,
                                           v.total(), beta_, v.layer, v.n_layers);
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
  std::map<std::string, double> settings() const override {
    auto c = snap_settings_counters(s_);
    c["setting.beta"] = beta_;
    return c;
  }

 private:
  Budget budget_;
  SnapSettings s_;
  double beta_;
  int64_t every_;
};

MethodInfo pyramidkv_info() {
  MethodInfo m;
  m.name = "pyramidkv";
  m.summary = "PyramidKV: SnapKV scores with linearly decreasing per-layer budgets (beta)";
  m.paper =
      "Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information "
      "Funneling, arXiv 2406.02069";
  m.params = budget_params(0.5, "ratio");
  for (auto& s : snap_params(pyramidkv_presets(), "official")) m.params.push_back(s);
  m.params.push_back(
      float_param("beta", 20.0, 1.0, 1e6,
                  "pyramid steepness: the top layer keeps (budget - window) / beta prefix tokens"));
  m.params.push_back(position_mode_param("absolute"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  m.caps.query_aware = true;
  return m;
}

std::unique_ptr<KvCache> make_pyramidkv(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<EvictingKvCache>(
      ctx, evicting_options(p, "pyramidkv", ctx.config.head_dim),
      std::make_unique<PyramidKvPolicy>(
          parse_budget(p, "pyramidkv"), parse_snap(p, "pyramidkv", pyramidkv_presets()),
          p.at("beta").get<double>(), p.at("compress_every").get<int64_t>()));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(pyramidkv, kvb::pyramidkv_info, kvb::make_pyramidkv);
