// kvzap: KVzap (Jegou et al., NVIDIA, arXiv 2601.07891; kvpress KVzapPress + kvzap/train.py). A
// small model per layer reads the layer's attention input and predicts, for every KV head, the
// log KVzip+ score of the token: what KVzip would learn from making the model repeat the context,
// without the repeat. At the end of prefill every KV head keeps the budget's entries with the
// highest predicted scores (kvpress's ScorerPress use of KVzapPress). The surrogate is trained on
// the run's model before the first sample (kvzap_surrogate.cpp: KVzip+ targets on calibration
// text, a ridge fit per layer), where kvpress downloads NVIDIA's trained models. See README.md.

#include "methods/kvzap/kvzap.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/hidden_state.h"
#include "harness/model/model.h"
#include "methods/common/arrival_scored_kv_cache.h"
#include "methods/common/calibration_text.h"
#include "methods/common/eviction_select.h"
#include "methods/common/scored_method.h"
#include "methods/common/tensor_artifact.h"

namespace kvb {
namespace {

constexpr const char* kName = "kvzap";

ScoredMethod kvzap_declaration() {
  ScoredMethod m(kName,
                 "KVzap: keep the entries a per-layer linear surrogate, trained on the run's "
                 "model to predict KVzip+ scores from the attention input, scores highest",
                 "Jegou et al., KVzap: Fast, Adaptive, and Faithful KV Cache Pruning, arXiv "
                 "2601.07891");
  m.info.params = calibration_text_params(kName, 16, 256);
  m.info.params.push_back(float_param("ridge_alpha", 1.0, 0.0, 1e12,
                                      "L2 penalty of the surrogate's ridge fit (sklearn's Ridge "
                                      "default, as kvpress's linear KVzap)"));
  m.info.caps.needs_calibration = true;
  return m;
}

MethodInfo kvzap_info() { return scored_method_info(kvzap_declaration()); }

std::shared_ptr<const CalibrationArtifact> kvzap_calibrate(const std::shared_ptr<Model>& model,
                                                           const nlohmann::json& p) {
  CalibrationText text = parse_calibration_text(p);
  // A window and its repeat share the context: the window is capped at half of it (as every
  // calibration caps calib_tokens at the context), and the key records the length used.
  text.tokens = std::min(text.tokens, kvzap::max_window_tokens(*model));
  const double alpha = p.at("ridge_alpha").get<double>();
  return cached_calibration_artifact(
      kName, "kvzap.linear/1", *model, text, {{"ridge_alpha", alpha}}, [&] {
        const kvzap::Surrogate s = kvzap::fit_surrogate(model, text, alpha);
        return std::map<std::string, at::Tensor>{{"weight", s.weight}, {"bias", s.bias}};
      });
}

class KvzapKvCache : public ArrivalScoredKvCache, public HiddenStateCache {
 public:
  KvzapKvCache(const CacheContext& ctx, Options o, PolicyParts parts, kvzap::Surrogate s,
               std::shared_ptr<const ArrivalScores*> slot)
      : ArrivalScoredKvCache(ctx, std::move(o), std::move(parts), std::move(slot)),
        model_(ctx.model),
        surrogate_(std::move(s)) {}

  void layer_hidden(int layer, const at::Tensor& hidden) override { hidden_ = {layer, hidden}; }

 protected:
  at::Tensor arrival_scores(const LayerInput& in) override {
    KVB_ASSERT(hidden_ && hidden_->first == in.layer, kName,
               "no hidden states handed over for layer ", in.layer);
    const at::Tensor a = kvzap::attention_input(*model_, in.layer, hidden_->second);
    hidden_.reset();  // the forward's buffer is only valid during this layer's call
    return kvzap::surrogate_scores(surrogate_, in.layer, a).contiguous();
  }

 private:
  std::shared_ptr<Model> model_;
  kvzap::Surrogate surrogate_;
  std::optional<std::pair<int, at::Tensor>> hidden_;  // (layer, [T, dim] residual stream)
};

std::unique_ptr<KvCache> make_kvzap(const CacheContext& ctx, const nlohmann::json& p) {
  const auto* art = dynamic_cast<const TensorArtifact*>(ctx.calibration.get());
  KVB_ASSERT(art != nullptr && ctx.model != nullptr, kName,
             "built without its calibration artifact or model");
  const ModelConfig& c = ctx.config;
  kvzap::Surrogate s{art->get("weight"), art->get("bias")};
  KVB_CHECK(s.weight.dim() == 3 && s.weight.size(0) == c.n_layers && s.weight.size(1) == c.dim &&
                s.weight.size(2) == c.n_kv_heads && s.bias.dim() == 2 &&
                s.bias.size(0) == c.n_layers && s.bias.size(1) == c.n_kv_heads,
            art->path, ": a surrogate of shape ", s.weight.sizes(), " / ", s.bias.sizes(),
            " for a model of ", c.n_layers, " layers x ", c.dim, " dims x ", c.n_kv_heads,
            " KV heads; delete it to recalibrate");
  auto slot = make_arrival_slot();
  return std::make_unique<KvzapKvCache>(ctx, evicting_options(p, kName, c.head_dim),
                                        recorded_score_parts(p, kName, slot), std::move(s), slot);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_CALIBRATED_METHOD(kvzap, kvb::kvzap_info, kvb::make_kvzap, kvb::kvzap_calibrate);
