// qfilters: Q-Filters (Godey et al., arXiv 2503.02812; kvpress QFilterPress). At the end of prefill
// every KV head keeps the budget's entries with the highest score -(k . f), k the entry's post-RoPE
// key and f the head's filter: the dominant direction of the head's queries, calibrated on the
// run's model (qfilter_calibration.cpp) where kvpress downloads precomputed filters. The scores are
// taken as keys arrive (ArrivalScoredKvCache). See README.md.

#include "methods/qfilters/qfilters.h"

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/model/model.h"
#include "methods/common/arrival_scored_kv_cache.h"
#include "methods/common/calibration_text.h"
#include "methods/common/composed_policy.h"
#include "methods/common/eviction_select.h"
#include "methods/common/scored_method.h"
#include "methods/common/tensor_artifact.h"

namespace kvb {
namespace {

constexpr const char* kName = "qfilters";

ScoredMethod qfilters_declaration() {
  ScoredMethod m(kName,
                 "Q-Filters: keep the keys with the highest -(key . filter) per KV head, filters "
                 "calibrated on the run's model's queries",
                 "Godey et al., Q-Filters: Leveraging QK Geometry for Efficient KV Cache "
                 "Compression, arXiv 2503.02812");
  m.info.params = calibration_text_params(kName, 16, 512);
  m.info.caps.needs_calibration = true;
  return m;
}

MethodInfo qfilters_info() { return scored_method_info(qfilters_declaration()); }

std::shared_ptr<const CalibrationArtifact> qfilters_calibrate(const std::shared_ptr<Model>& model,
                                                              const nlohmann::json& p) {
  const CalibrationText text = parse_calibration_text(p);
  return cached_calibration_artifact(kName, "qfilters.filters/1", *model, text,
                                     nlohmann::json::object(), [&] {
                                       return std::map<std::string, at::Tensor>{
                                           {"filters", qfilters::calibrate_filters(model, text)}};
                                     });
}

class QFilterKvCache : public ArrivalScoredKvCache {
 public:
  QFilterKvCache(const CacheContext& ctx, Options o, PolicyParts parts, at::Tensor filters,
                 std::shared_ptr<const ArrivalScores*> slot)
      : ArrivalScoredKvCache(ctx, std::move(o), std::move(parts), std::move(slot)),
        filters_(std::move(filters)) {}

 protected:
  // score[t, h] = -(k[t, h] . f[h]): the key as kvpress's cache holds it (post-RoPE).
  at::Tensor arrival_scores(const LayerInput& in) override {
    return -(in.k->to(at::kCPU).to(at::kFloat) * filters_[in.layer].unsqueeze(0)).sum(-1);
  }

 private:
  at::Tensor filters_;  // [layers, kv heads, head_dim] fp32 CPU
};

std::unique_ptr<KvCache> make_qfilters(const CacheContext& ctx, const nlohmann::json& p) {
  const auto* art = dynamic_cast<const TensorArtifact*>(ctx.calibration.get());
  KVB_ASSERT(art != nullptr, kName, "built without its calibration artifact");
  const at::Tensor& f = art->get("filters");
  const ModelConfig& c = ctx.config;
  KVB_CHECK(f.dim() == 3 && f.size(0) == c.n_layers && f.size(1) == c.n_kv_heads &&
                f.size(2) == c.head_dim,
            art->path, ": filters of shape ", f.sizes(), " for a model of ", c.n_layers,
            " layers x ", c.n_kv_heads, " KV heads x ", c.head_dim, "; delete it to recalibrate");
  auto slot = make_arrival_slot();
  return std::make_unique<QFilterKvCache>(ctx, evicting_options(p, kName, c.head_dim),
                                          recorded_score_parts(p, kName, slot), f, slot);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_CALIBRATED_METHOD(qfilters, kvb::qfilters_info, kvb::make_qfilters,
                               kvb::qfilters_calibrate);
