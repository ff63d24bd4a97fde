// streaming_llm: attention sinks + a recent window (Xiao et al., ICLR 2024). Before a step's tokens
// are appended the cache makes room (sinks + the newest budget - sinks - incoming entries), and
// after the step it trims to sinks + the newest budget - sinks, so a decode step attends over
// exactly `budget` tokens as in the official code. Physical eviction through methods/common's
// store.

#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {
namespace {

class StreamingLlmPolicy : public EvictionPolicy {
 public:
  StreamingLlmPolicy(Budget budget, int64_t sinks) : budget_(budget), sinks_(sinks) {}
  Needs needs() const override { return {}; }
  Schedule schedule() const override {
    Schedule s;
    s.before_step = true;
    s.after_step = true;
    return s;
  }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    // The budget counts the incoming tokens (before a step) so the step attends over `budget`.
    const int64_t room = budget_.per_head(v.total(), v.n_kv_heads) - v.incoming;
    bool changed = false;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& k = (*keep)[h];
      k.clear();
      int64_t n_sinks = 0;  // sinks are the first `sinks` tokens; never evicted
      while (n_sinks < hv.len && hv.idx[n_sinks] < sinks_) k.push_back(n_sinks++);
      const int64_t recent = std::max<int64_t>(0, room - n_sinks);
      for (int64_t j = std::max(n_sinks, hv.len - recent); j < hv.len; ++j) k.push_back(j);
      changed = changed || static_cast<int64_t>(k.size()) < hv.len;
    }
    return changed;
  }
  std::map<std::string, double> settings() const override {
    return {{"setting.sinks", static_cast<double>(sinks_)}};
  }

 private:
  Budget budget_;
  int64_t sinks_;
};

MethodInfo streaming_llm_info() {
  MethodInfo m;
  m.name = "streaming_llm";
  m.summary =
      "StreamingLLM: keep the first `sinks` tokens plus a recent window (prefill and decode)";
  m.paper =
      "Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024 (arXiv "
      "2309.17453)";
  m.params = budget_params(0.5, "ratio");
  m.params.push_back(
      int_param("sinks", 4, 0, 1 << 20, "attention-sink tokens kept at the start (never evicted)"));
  m.params.push_back(position_mode_param("rerotated"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.caps.evicts = true;
  return m;
}

std::unique_ptr<KvCache> make_streaming_llm(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<EvictingKvCache>(
      ctx, evicting_options(p, "streaming_llm", ctx.config.head_dim),
      std::make_unique<StreamingLlmPolicy>(parse_budget(p, "streaming_llm"),
                                           p.at("sinks").get<int64_t>()));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(streaming_llm, kvb::streaming_llm_info, kvb::make_streaming_llm);
