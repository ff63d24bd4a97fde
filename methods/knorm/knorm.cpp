// knorm: KnormPress (kvpress; Devoto et al., EMNLP 2024, "A Simple and Effective L2 Norm-Based
// Strategy for KV Cache Compression"). At the end of prefill every KV head keeps the `budget` keys
// with the LOWEST L2 norm (and their values). Norms are rotation-invariant, so pre/post-RoPE agree.

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {
namespace {

class KnormPolicy : public EvictionPolicy {
 public:
  KnormPolicy(Budget budget, int64_t every) : budget_(budget), every_(every) {}
  Needs needs() const override {
    Needs n;
    n.key_norm = true;
    return n;
  }
  Schedule schedule() const override {
    Schedule s;
    s.end_prefill = true;
    s.every_decode_steps = every_;
    return s;
  }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    const int64_t B = budget_.per_head(v.total(), v.n_kv_heads);
    bool changed = false;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      std::vector<int64_t> all(static_cast<size_t>(hv.len));
      std::vector<float> score(static_cast<size_t>(hv.len));
      for (int64_t j = 0; j < hv.len; ++j) {
        all[j] = j;
        score[j] = -hv.key_norm[j];
      }
      (*keep)[h] = top_k_slots(score.data(), all, B);
      changed = changed || static_cast<int64_t>((*keep)[h].size()) < hv.len;
    }
    return changed;
  }

 private:
  Budget budget_;
  int64_t every_;
};

MethodInfo knorm_info() {
  MethodInfo m;
  m.name = "knorm";
  m.summary =
      "KnormPress: keep the keys with the lowest L2 norm per KV head, at the end of prefill";
  m.paper =
      "Devoto et al., A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression, "
      "EMNLP 2024 (arXiv 2406.11430)";
  m.params = budget_params(0.5, "ratio");
  m.params.push_back(compress_every_param());
  m.params.push_back(position_mode_param("absolute"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  return m;
}

std::unique_ptr<KvCache> make_knorm(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<EvictingKvCache>(
      ctx, evicting_options(p, "knorm", ctx.config.head_dim),
      std::make_unique<KnormPolicy>(parse_budget(p, "knorm"),
                                    p.at("compress_every").get<int64_t>()));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(knorm, kvb::knorm_info, kvb::make_knorm);
