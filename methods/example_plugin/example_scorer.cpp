// example_scorer: the short path for a new eviction scorer, as an out-of-tree plugin. The whole
// method is the scorer below plus one registration line: the budget (ratio or tokens), position
// mode, codec stacking and every budget allocator (allocator=uniform | pyramid | ada | ada_pyramid)
// come with it from methods/common/scored_method.h. In-tree, the same file would end with
// KVB_REGISTER_SCORED_METHOD(example_scorer, example_scorer_method) instead of the plugin entry.
//
// The toy rule: keep the keys with the LARGEST L2 norm (KnormPress keeps the smallest), at the end
// of prefill. It is here to show the path, not as a method to benchmark.

#include "harness/kv/plugin.h"
#include "methods/common/scored_method.h"

namespace {

class LargestKeyNormScorer : public kvb::EntryScorer {
 public:
  kvb::EvictionPolicy::Needs needs() const override {
    kvb::EvictionPolicy::Needs n;
    n.key_norm = true;  // the store computes the norms of the kept keys for us
    return n;
  }

 protected:
  float entry_score(const kvb::LayerView&, const kvb::HeadView& head, int64_t j) const override {
    return head.key_norm[j];
  }
};

kvb::ScoredMethod example_scorer_method() {
  kvb::ScoredMethod m("example_scorer",
                      "example plugin scorer: keep the keys with the largest L2 norm", "");
  m.parts = [](const nlohmann::json&, const std::string&, const kvb::Budget&) {
    kvb::PolicyParts parts;
    parts.scorer = std::make_unique<LargestKeyNormScorer>();
    parts.schedule.end_prefill = true;
    return parts;
  };
  return m;
}

}  // namespace

KVB_PLUGIN_ENTRY(registry) { kvb::register_scored_method(*registry, example_scorer_method()); }
