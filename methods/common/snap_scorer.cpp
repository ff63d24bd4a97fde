#include "methods/common/snap_scorer.h"

#include "harness/common/error.h"

namespace kvb {

namespace {

// Every SnapKV-family method's presets, by method.
const std::map<std::string, std::map<std::string, SnapSettings>>& presets_by_method() {
  static const std::map<std::string, std::map<std::string, SnapSettings>> t = {
      {"snapkv",
       {// FasterDecoding/SnapKV code defaults (window 32, avg-pool 5).
        {"official", {32, 5, Pooling::kAvg, GqaAgg::kMean}},
        // The official LongBench configs (window 32, max-pool 7).
        {"longbench", {32, 7, Pooling::kMax, GqaAgg::kMean}},
        // NVIDIA/kvpress SnapKVPress (window 64, avg-pool 5, query heads averaged per KV head).
        {"kvpress", {64, 5, Pooling::kAvg, GqaAgg::kMean}}}},
      {"pyramidkv",
       {// Zefan-Cai/KVCache-Factory PyramidKVCluster (the official code): window 8, max-pool 7.
        {"official", {8, 7, Pooling::kMax, GqaAgg::kMean}},
        // NVIDIA/kvpress PyramidKVPress: window 64, avg-pool 5.
        {"kvpress", {64, 5, Pooling::kAvg, GqaAgg::kMean}}}},
      {"adakv",
       {// FFY0/AdaKV adaptive_snapkv: window 32, max-pool 7, GQA scores averaged per KV head.
        {"official", {32, 7, Pooling::kMax, GqaAgg::kMean}}}},
  };
  return t;
}

class SnapScorer : public TokenScorer {
 public:
  explicit SnapScorer(SnapSettings s) : s_(s) {}
  EvictionPolicy::Needs needs() const override {
    return EvictionPolicy::Needs::only(&EvictionPolicy::Needs::window, s_.window);
  }
  bool score(const LayerView& v, std::vector<std::vector<float>>* scores) const override {
    if (v.window == 0) return false;  // no observation window collected (yet)
    for (int64_t h = 0; h < v.n_kv_heads; ++h)
      (*scores)[h] = snap_scores(v, v.heads[h], s_.pooling, s_.kernel, s_.agg).score;
    return true;
  }
  std::map<std::string, double> settings() const override { return snap_settings_counters(s_); }

 private:
  SnapSettings s_;
};

}  // namespace

const std::map<std::string, SnapSettings>& snap_presets(const std::string& method) {
  return presets_by_method().at(method);
}

const std::map<std::string, SnapSettings>& snapkv_presets() { return snap_presets("snapkv"); }

std::unique_ptr<TokenScorer> make_snap_scorer(SnapSettings s) {
  return std::make_unique<SnapScorer>(s);
}

ScoredMethod snap_family_method(std::string name, std::string summary, std::string paper) {
  ScoredMethod m(name, std::move(summary), std::move(paper));
  m.info.params = snap_params(snap_presets(name), "official");
  m.info.caps.query_aware = true;
  m.parts = [](const nlohmann::json& p, const std::string& method, const Budget&) {
    return snap_parts(parse_snap(p, method, snap_presets(method)),
                      p.at("compress_every").get<int64_t>());
  };
  return m;
}

ScoredMethod snap_family_method(std::string name, std::string summary, std::string paper,
                                std::vector<ParamSpec> allocator_params,
                                decltype(ScoredMethod::allocator) allocator) {
  ScoredMethod m = snap_family_method(std::move(name), std::move(summary), std::move(paper));
  for (auto& s : allocator_params) m.info.params.push_back(std::move(s));
  m.allocator = std::move(allocator);
  return m;
}

PolicyParts snap_parts(SnapSettings s, int64_t every) {
  PolicyParts parts;
  parts.scorer = make_snap_scorer(s);
  parts.protect.observation_window = true;
  parts.schedule.end_prefill = true;
  parts.schedule.every_decode_steps = every;
  return parts;
}

MethodInfo pruned_snap_info(std::string name, std::string summary, std::string paper,
                            const std::string& ratio_doc, const std::vector<ParamSpec>& own) {
  MethodInfo m;
  m.name = std::move(name);
  m.summary = std::move(summary);
  m.paper = std::move(paper);
  m.params = budget_params(1.0, "ratio");
  for (auto& s : snap_params(snapkv_presets(), "official")) m.params.push_back(s);
  m.params.push_back(float_param("pruning_ratio", 0.5, 0.0, 0.99, ratio_doc));
  for (const auto& s : own) m.params.push_back(s);
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  m.caps.quantizes = true;
  m.caps.query_aware = true;
  m.caps.cpu_only = true;  // the pruned-key store keeps fp32 rows on the host
  m.caps.fp32_only = true;
  return m;
}

std::unique_ptr<KvCache> make_pruned_snap_cache(const CacheContext& ctx, const nlohmann::json& p,
                                                const std::string& method, ChannelPruneSpec spec) {
  KVB_CHECK(ctx.device.is_cpu() && ctx.dtype == at::kFloat, "method ", method,
            ": the pruned-key store runs on CPU fp32 (got device ", ctx.device.str(), ")");
  SnapSettings snap = parse_snap(p, method, snapkv_presets());
  spec.ratio = p.at("pruning_ratio").get<double>();
  spec.window = snap.window;
  spec.dtype = RowDtype::kF32;
  const std::string inner = p.at("codec").get<std::string>();
  KVB_CHECK(inner.rfind("pertoken-", 0) != 0, "method ", method, ".codec: ", inner,
            " cannot store pruned keys (its channel groups span head_dim, a pruned key keeps fewer "
            "channels); use none, fp16, bf16 or kivi-*");
  spec.inner = parse_codec(p, method, ctx.config.head_dim);
  const Budget budget = parse_budget(p, method);
  PolicyParts parts = snap_parts(snap, p.at("compress_every").get<int64_t>());
  parts.allocator = make_uniform_allocator(budget);
  EvictingKvCache::Options o;
  o.name = method;
  o.codec = make_channel_prune_codec(spec);
  return std::make_unique<EvictingKvCache>(ctx, o, make_composed_policy(std::move(parts)));
}

}  // namespace kvb
