// h2o: Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023). Every entry accumulates the attention it
// receives from every query row (prefill chunks: the whole matrix; decode: one row), summed over
// the query heads of its GQA group: that sum is the score. After every step, each KV head over
// budget keeps its protected sinks, the most recent `recent` entries and the top heavy hitters by
// accumulated score; the rest is physically evicted (the official real-drop path, not the masking
// simulation).

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

class H2oScorer : public EntryScorer {
 public:
  explicit H2oScorer(bool normalize) : normalize_(normalize) {}
  EvictionPolicy::Needs needs() const override {
    return EvictionPolicy::Needs::only(&EvictionPolicy::Needs::accumulate, true);
  }

 protected:
  float entry_score(const LayerView& v, const HeadView& hv, int64_t j) const override {
    // ObservedAttention-style normalisation: divide by the queries that could see the entry.
    return normalize_ ? hv.acc[j] / static_cast<float>(v.total() - hv.idx[j]) : hv.acc[j];
  }

 private:
  bool normalize_;
};

ScoredMethod h2o_method() {
  ScoredMethod m(
      "h2o", "H2O: heavy hitters by accumulated attention + a recent window, evicted every step",
      "Zhang et al., H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs, NeurIPS "
      "2023 (arXiv 2306.14048)");
  m.default_budget = 0.2;
  m.info.params = {
      float_param("recent_fraction", 0.5, 0.0, 1.0,
                  "share of the budget for the most recent tokens (the rest: heavy hitters); "
                  "0.5 with budget 0.2 = the paper's heavy 10% + recent 10%"),
      int_param("sinks", 0, 0, 1 << 20, "first tokens always kept (the streaming demo uses 4)"),
      string_param("score", "sum", {"sum", "mean"},
                   "sum: raw accumulated attention (official); mean: divided by the number "
                   "of queries that saw the token (kvpress ObservedAttention)")};
  for (auto& spec : eviction_schedule_params()) m.info.params.push_back(spec);
  m.parts = [](const nlohmann::json& p, const std::string& method, const Budget&) {
    PolicyParts parts;
    parts.scorer = std::make_unique<H2oScorer>(p.at("score").get<std::string>() == "mean");
    parts.protect.sinks = p.at("sinks").get<int64_t>();
    parts.protect.recent_fraction = p.at("recent_fraction").get<double>();
    EvictionPolicy::Schedule continuous;
    continuous.after_step = true;
    parts.schedule = parse_eviction_schedule(p, method, continuous);
    parts.settings = {{"setting.recent_fraction", parts.protect.recent_fraction},
                      {"setting.sinks", static_cast<double>(parts.protect.sinks)}};
    return parts;
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(h2o, kvb::h2o_method);
