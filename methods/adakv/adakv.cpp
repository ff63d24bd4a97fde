// adakv: Ada-KV (Feng et al., NeurIPS 2025). SnapKV-style window scores; the layer's prefix budget
// is split over its KV heads adaptively: the global top entries across heads give each head a count
// n_h, and head h keeps round(alpha * B + (1 - alpha) * n_h) prefix tokens plus the window. Heads
// end up with different lengths; the store keeps them ragged (the official varlen layout), so the
// memory saved is real (kvpress's AdaKVPress only masks).

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {
namespace {

const std::map<std::string, SnapSettings>& adakv_presets() {
  static const std::map<std::string, SnapSettings> p = {
      // FFY0/AdaKV adaptive_snapkv: window 32, max-pool 7, GQA scores averaged per KV head.
      {"official", {32, 7, Pooling::kMax, GqaAgg::kMean}},
  };
  return p;
}

class AdaKvPolicy : public EvictionPolicy {
 public:
  AdaKvPolicy(Budget budget, SnapSettings s, double alpha, bool pyramid, double beta, int64_t every)
      : budget_(budget), s_(s), alpha_(alpha), pyramid_(pyramid), beta_(beta), every_(every) {}
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
    const int64_t H = v.n_kv_heads;
    int64_t total = budget_.per_layer(v.total(), H), held = 0;
    for (const HeadView& hv : v.heads) held += hv.len;
    if (pyramid_)
      total = H * pyramid_layer_budget(total / H, v.window, v.total(), beta_, v.layer, v.n_layers);
    if (held <= total) return false;
    std::vector<SnapScores> ss;
    std::vector<std::vector<float>> prefix_scores(static_cast<size_t>(H));
    std::vector<int64_t> win_keep(static_cast<size_t>(H));
    int64_t prefix_total = total;
    for (int64_t h = 0; h < H; ++h) {
      ss.push_back(snap_scores(v, v.heads[h], s_.pooling, s_.kernel, s_.agg));
      win_keep[h] = std::min<int64_t>(static_cast<int64_t>(ss[h].window.size()), total / H);
      prefix_total -= win_keep[h];
      for (int64_t j : ss[h].prefix) prefix_scores[h].push_back(ss[h].score[j]);
    }
    const std::vector<int64_t> b = adaptive_head_budgets(prefix_scores, prefix_total, alpha_);
    for (int64_t h = 0; h < H; ++h) {
      std::vector<int64_t> pre = top_k_slots(ss[h].score.data(), ss[h].prefix, b[h]);
      std::vector<int64_t> win(ss[h].window.end() - win_keep[h], ss[h].window.end());
      (*keep)[h] = merge_slots(std::move(pre), win);
    }
    return true;
  }
  std::map<std::string, double> settings() const override {
    auto c = snap_settings_counters(s_);
    c["setting.floor_alpha"] = alpha_;
    c["setting.pyramid"] = pyramid_ ? 1.0 : 0.0;
    return c;
  }

 private:
  Budget budget_;
  SnapSettings s_;
  double alpha_;
  bool pyramid_;
  double beta_;
  int64_t every_;
};

MethodInfo adakv_info() {
  MethodInfo m;
  m.name = "adakv";
  m.summary = "Ada-KV: head-adaptive budgets on SnapKV window scores, ragged per KV head";
  m.paper =
      "Feng et al., Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation, NeurIPS "
      "2025 (arXiv 2407.11550)";
  m.params = budget_params(0.5, "ratio");
  for (auto& s : snap_params(adakv_presets(), "official")) m.params.push_back(s);
  m.params.push_back(
      float_param("floor_alpha", 0.2, 0.0, 1.0,
                  "share of the average head budget every head is guaranteed (0.2: the "
                  "authors' advice for GQA models; README 0.5)"));
  m.params.push_back(bool_param("pyramid", false, "per-layer budgets from the PyramidKV formula"));
  m.params.push_back(float_param("beta", 20.0, 1.0, 1e6, "pyramid steepness (with pyramid=true)"));
  m.params.push_back(position_mode_param("absolute"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  m.caps.query_aware = true;
  return m;
}

std::unique_ptr<KvCache> make_adakv(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<EvictingKvCache>(
      ctx, evicting_options(p, "adakv", ctx.config.head_dim),
      std::make_unique<AdaKvPolicy>(
          parse_budget(p, "adakv"), parse_snap(p, "adakv", adakv_presets()),
          p.at("floor_alpha").get<double>(), p.at("pyramid").get<bool>(),
          p.at("beta").get<double>(), p.at("compress_every").get<int64_t>()));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(adakv, kvb::adakv_info, kvb::make_adakv);
