// knorm: KnormPress (kvpress; Devoto et al., EMNLP 2024, "A Simple and Effective L2 Norm-Based
// Strategy for KV Cache Compression"). At the end of prefill every KV head keeps the `budget` keys
// with the LOWEST L2 norm (and their values): the score is minus the norm. Norms are
// rotation-invariant, so pre/post-RoPE agree.

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

class KnormScorer : public EntryScorer {
 public:
  EvictionPolicy::Needs needs() const override {
    return EvictionPolicy::Needs::only(&EvictionPolicy::Needs::key_norm, true);
  }

 protected:
  float entry_score(const LayerView&, const HeadView& hv, int64_t j) const override {
    return -hv.key_norm[j];
  }
};

ScoredMethod knorm_method() {
  return prompt_scored_method<KnormScorer>(
      "knorm",
      "KnormPress: keep the keys with the lowest L2 norm per KV head, at the end of prefill",
      "Devoto et al., A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression, "
      "EMNLP 2024 (arXiv 2406.11430)");
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(knorm, kvb::knorm_method);
