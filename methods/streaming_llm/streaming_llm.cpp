// streaming_llm: attention sinks + a recent window (Xiao et al., ICLR 2024). Before a step's tokens
// are appended the cache makes room (sinks + the newest budget - sinks - incoming entries), and
// after the step it trims to sinks + the newest budget - sinks, so a decode step attends over
// exactly `budget` tokens as in the official code. schedule=prefill cuts once at the end of the
// prompt instead (kvpress's StreamingLLMPress), so a question and its answer are never evicted. No scores: the protection (sinks + a recent
// window that is the whole rest of the budget) decides alone. Physical eviction through
// methods/common's store.

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

// Every entry alike: what is kept is what the protection keeps.
class NoScorer : public EntryScorer {
 public:
  EvictionPolicy::Needs needs() const override { return {}; }

 protected:
  float entry_score(const LayerView&, const HeadView&, int64_t) const override { return 0.f; }
};

ScoredMethod streaming_llm_method() {
  ScoredMethod m(
      "streaming_llm",
      "StreamingLLM: keep the first `sinks` tokens plus a recent window (prefill and decode)",
      "Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024 (arXiv "
      "2309.17453)");
  m.info.params = {
      int_param("sinks", 4, 0, 1 << 20, "attention-sink tokens kept at the start (never evicted)")};
  for (auto& spec : eviction_schedule_params()) m.info.params.push_back(spec);
  m.default_position_mode = "rerotated";
  m.any_allocator = false;
  m.parts = [](const nlohmann::json& p, const std::string& method, const Budget& b) {
    PolicyParts parts;
    parts.scorer = std::make_unique<NoScorer>();
    parts.protect.sinks = p.at("sinks").get<int64_t>();
    parts.protect.recent_fraction = 1.0;  // the recent window is the rest of the budget
    parts.allocator = make_uniform_allocator(b);
    EvictionPolicy::Schedule continuous;
    continuous.before_step = true;
    continuous.after_step = true;
    parts.schedule = parse_eviction_schedule(p, method, continuous);
    parts.settings = {{"setting.sinks", static_cast<double>(parts.protect.sinks)}};
    return parts;
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(streaming_llm, kvb::streaming_llm_method);
