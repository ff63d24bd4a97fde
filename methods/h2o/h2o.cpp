// h2o: Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023). Every entry accumulates the attention it
// receives from every query row (prefill chunks: the whole matrix; decode: one row), summed over
// the query heads of its GQA group. After every step, each KV head over budget keeps its protected
// sinks, the most recent `recent` entries and the top heavy hitters by accumulated score; the rest
// is physically evicted (the official real-drop path, not the masking simulation).

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {
namespace {

class H2oPolicy : public EvictionPolicy {
 public:
  H2oPolicy(Budget budget, double recent_fraction, int64_t sinks, bool normalize)
      : budget_(budget), recent_fraction_(recent_fraction), sinks_(sinks), normalize_(normalize) {}
  Needs needs() const override {
    Needs n;
    n.accumulate = true;
    return n;
  }
  Schedule schedule() const override {
    Schedule s;
    s.after_step = true;
    return s;
  }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    const int64_t B = budget_.per_head(v.total(), v.n_kv_heads);
    bool changed = false;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& k = (*keep)[h];
      k.clear();
      if (hv.len <= B) {
        for (int64_t j = 0; j < hv.len; ++j) k.push_back(j);
        continue;
      }
      int64_t n_sinks = 0;
      while (n_sinks < hv.len && hv.idx[n_sinks] < sinks_) k.push_back(n_sinks++);
      const int64_t rest = std::max<int64_t>(0, B - n_sinks);
      const int64_t recent = std::min<int64_t>(
          rest, static_cast<int64_t>(std::floor(recent_fraction_ * static_cast<double>(B) + 1e-9)));
      const int64_t heavy = rest - recent;
      const int64_t recent_from = std::max(n_sinks, hv.len - recent);
      std::vector<int64_t> cand;
      std::vector<float> score(static_cast<size_t>(hv.len));
      for (int64_t j = n_sinks; j < recent_from; ++j) {
        cand.push_back(j);
        // ObservedAttention-style normalisation: divide by the queries that could see the entry.
        score[j] = normalize_ ? hv.acc[j] / static_cast<float>(v.total() - hv.idx[j]) : hv.acc[j];
      }
      std::vector<int64_t> hh = top_k_slots(score.data(), cand, heavy);
      k.insert(k.end(), hh.begin(), hh.end());
      for (int64_t j = recent_from; j < hv.len; ++j) k.push_back(j);
      changed = changed || static_cast<int64_t>(k.size()) < hv.len;
    }
    return changed;
  }
  std::map<std::string, double> settings() const override {
    return {{"setting.recent_fraction", recent_fraction_},
            {"setting.sinks", static_cast<double>(sinks_)}};
  }

 private:
  Budget budget_;
  double recent_fraction_;
  int64_t sinks_;
  bool normalize_;
};

MethodInfo h2o_info() {
  MethodInfo m;
  m.name = "h2o";
  m.summary = "H2O: heavy hitters by accumulated attention + a recent window, evicted every step";
  m.paper =
      "Zhang et al., H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs, NeurIPS "
      "2023 (arXiv 2306.14048)";
  m.params = budget_params(0.2, "ratio");
  m.params.push_back(
      float_param("recent_fraction", 0.5, 0.0, 1.0,
                  "share of the budget for the most recent tokens (the rest: heavy hitters); "
                  "0.5 with budget 0.2 = the paper's heavy 10% + recent 10%"));
  m.params.push_back(
      int_param("sinks", 0, 0, 1 << 20, "first tokens always kept (the streaming demo uses 4)"));
  m.params.push_back(
      string_param("score", "sum", {"sum", "mean"},
                   "sum: raw accumulated attention (official); mean: divided by the number "
                   "of queries that saw the token (kvpress ObservedAttention)"));
  m.params.push_back(position_mode_param("absolute"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  return m;
}

std::unique_ptr<KvCache> make_h2o(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<EvictingKvCache>(
      ctx, evicting_options(p, "h2o", ctx.config.head_dim),
      std::make_unique<H2oPolicy>(parse_budget(p, "h2o"), p.at("recent_fraction").get<double>(),
                                  p.at("sinks").get<int64_t>(),
                                  p.at("score").get<std::string>() == "mean"));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(h2o, kvb::h2o_info, kvb::make_h2o);
