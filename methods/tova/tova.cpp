// tova: Token Omission Via Attention (Oren et al., EMNLP 2024, "Transformers are Multi-State
// RNNs"). After every step, a layer over budget keeps the top-`budget` tokens by the step's last
// query's attention averaged over all query heads; all KV heads of the layer keep the same tokens.

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {
namespace {

class TovaPolicy : public EvictionPolicy {
 public:
  TovaPolicy(Budget budget, bool keep_current) : budget_(budget), keep_current_(keep_current) {}
  Needs needs() const override {
    Needs n;
    n.last_row = true;
    return n;
  }
  Schedule schedule() const override {
    Schedule s;
    s.after_step = true;
    return s;
  }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    const int64_t B = budget_.per_head(v.total(), v.n_kv_heads);
    const int64_t len = v.heads[0].len;
    if (len <= B) return false;
    std::vector<float> avg(static_cast<size_t>(len), 0.f);
    const float inv = 1.f / static_cast<float>(v.n_kv_heads * v.group);
    for (const HeadView& hv : v.heads) {
      // All heads hold the same tokens (TOVA keeps one set per layer).
      if (hv.last == nullptr || hv.len != len) return false;
      for (int64_t j = 0; j < len; ++j) avg[j] += hv.last[j] * inv;
    }
    std::vector<int64_t> cand;
    const int64_t n_cand = keep_current_ ? len - 1 : len;
    for (int64_t j = 0; j < n_cand; ++j) cand.push_back(j);
    std::vector<int64_t> k = top_k_slots(avg.data(), cand, keep_current_ ? B - 1 : B);
    if (keep_current_) k.push_back(len - 1);
    for (auto& kh : *keep) kh = k;
    return true;
  }

 private:
  Budget budget_;
  bool keep_current_;
};

MethodInfo tova_info() {
  MethodInfo m;
  m.name = "tova";
  m.summary =
      "TOVA: keep the tokens the last query attends to most (averaged over heads), every step";
  m.paper = "Oren et al., Transformers are Multi-State RNNs, EMNLP 2024 (arXiv 2401.06104)";
  m.params = budget_params(0.5, "ratio");
  m.params.push_back(
      bool_param("keep_current", false,
                 "never evict the newest token (kvpress); the official code may evict it"));
  m.params.push_back(position_mode_param("absolute"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  return m;
}

std::unique_ptr<KvCache> make_tova(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<EvictingKvCache>(
      ctx, evicting_options(p, "tova", ctx.config.head_dim),
      std::make_unique<TovaPolicy>(parse_budget(p, "tova"), p.at("keep_current").get<bool>()));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(tova, kvb::tova_info, kvb::make_tova);
