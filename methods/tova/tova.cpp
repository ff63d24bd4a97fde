// tova: Token Omission Via Attention (Oren et al., EMNLP 2024, "Transformers are Multi-State
// RNNs"). After every step, a layer over budget keeps the top-`budget` tokens by the step's last
// query's attention averaged over all query heads; all KV heads of the layer keep the same tokens.
// Under a head-pooling allocator (allocator=ada) heads hold different tokens, so each KV head is
// scored by its own query group's mean instead.

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

class TovaScorer : public TokenScorer {
 public:
  explicit TovaScorer(bool heads_apart) : heads_apart_(heads_apart) {}
  EvictionPolicy::Needs needs() const override {
    return EvictionPolicy::Needs::only(&EvictionPolicy::Needs::last_row, true);
  }
  bool score(const LayerView& v, std::vector<std::vector<float>>* scores) const override {
    if (heads_apart_) {
      const float inv = 1.f / static_cast<float>(v.group);
      for (int64_t h = 0; h < v.n_kv_heads; ++h) {
        const HeadView& hv = v.heads[h];
        if (hv.last == nullptr) return false;
        auto& s = (*scores)[h];
        s.resize(static_cast<size_t>(hv.len));
        for (int64_t j = 0; j < hv.len; ++j) s[j] = hv.last[j] * inv;
      }
      return true;
    }
    const int64_t len = v.heads[0].len;
    std::vector<float> avg(static_cast<size_t>(len), 0.f);
    const float inv = 1.f / static_cast<float>(v.n_kv_heads * v.group);
    for (const HeadView& hv : v.heads) {
      // All heads hold the same tokens (TOVA keeps one set per layer).
      if (hv.last == nullptr || hv.len != len) return false;
      for (int64_t j = 0; j < len; ++j) avg[j] += hv.last[j] * inv;
    }
    for (auto& s : *scores) s = avg;
    return true;
  }

 private:
  bool heads_apart_;
};

ScoredMethod tova_method() {
  ScoredMethod m(
      "tova",
      "TOVA: keep the tokens the last query attends to most (averaged over heads), every step",
      "Oren et al., Transformers are Multi-State RNNs, EMNLP 2024 (arXiv 2401.06104)");
  m.info.params = {bool_param("keep_current", false,
                              "never evict the newest token (kvpress); the official code may "
                              "evict it")};
  for (auto& spec : eviction_schedule_params()) m.info.params.push_back(spec);
  m.parts = [](const nlohmann::json& p, const std::string& method, const Budget&) {
    PolicyParts parts;
    parts.scorer = std::make_unique<TovaScorer>(allocator_pools_heads(p));
    parts.protect.recent_tokens = p.at("keep_current").get<bool>() ? 1 : 0;
    EvictionPolicy::Schedule continuous;
    continuous.after_step = true;
    parts.schedule = parse_eviction_schedule(p, method, continuous);
    return parts;
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(tova, kvb::tova_method);
