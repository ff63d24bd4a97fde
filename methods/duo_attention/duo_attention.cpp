// duo_attention: DuoAttention (Xiao et al., ICLR 2025). Each KV head is a retrieval head, which
// keeps its whole cache, or a streaming head, which keeps the first sink_size tokens and the
// recent_size newest ones; which heads stream is decided once per model by a calibration step
// (duo_head_scores.cpp: kvpress's on-the-fly head scoring, cached by content hash), the
// head_compression_ratio lowest-scored heads streaming. Streaming heads are cut at the end of
// prefill and every compress_every decode steps, physically (ragged per KV head in the eviction
// store: the ledger shows the freed rows), where kvpress masks the keys. See README.md.

#include "methods/duo_attention/duo_attention.h"

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "methods/common/calibration_text.h"
#include "methods/common/composed_policy.h"
#include "methods/common/eviction_select.h"
#include "methods/common/method_listing.h"
#include "methods/common/tensor_artifact.h"

namespace kvb {
namespace {

constexpr const char* kName = "duo_attention";

MethodInfo duo_info() {
  MethodInfo m = method_listing(
      kName,
      "DuoAttention: retrieval heads keep everything, streaming heads keep sinks + a recent "
      "window; heads split by a calibration on the run's model",
      "Xiao et al., DuoAttention: Efficient Long-Context LLM Inference with Retrieval and "
      "Streaming Heads, ICLR 2025 (arXiv 2410.10819)",
      {float_param("head_compression_ratio", 0.5, 0.0, 1.0,
                   "share of the KV heads that stream (kvpress's name; its default 0 compresses "
                   "nothing)"),
       int_param("sink_size", 128, 0, 1 << 20, "first tokens a streaming head keeps"),
       int_param("recent_size", 256, 0, 1 << 20, "newest tokens a streaming head keeps"),
       int_param("compress_every", 1, 0, 1 << 20,
                 "decode steps between cuts of the streaming heads back to sinks + recent (0: "
                 "only at the end of prefill, as kvpress)"),
       int_param("calib_q_len", 500, 2, 1 << 20,
                 "positions of the synthetic mean-query/mean-key sequence the heads are scored on "
                 "(kvpress's q_len)")});
  for (auto& s : calibration_text_params(kName, 50, 512)) m.params.push_back(s);
  m.params.push_back(position_mode_param("absolute"));
  for (auto& s : codec_params()) m.params.push_back(s);
  m.target_check = codec_target_check;
  m.caps.evicts = true;
  m.caps.needs_calibration = true;
  return m;
}

std::shared_ptr<const CalibrationArtifact> duo_calibrate(const std::shared_ptr<Model>& model,
                                                         const nlohmann::json& p) {
  const CalibrationText text = parse_calibration_text(p);
  const int64_t q_len = p.at("calib_q_len").get<int64_t>();
  return cached_calibration_artifact(kName, "duo_attention.head_scores/1", *model, text,
                                     {{"q_len", q_len}}, [&] {
                                       return std::map<std::string, at::Tensor>{
                                           {"head_scores", duo::head_scores(model, text, q_len)}};
                                     });
}

// Streaming heads need no scores: what they keep is positional.
class NoScores : public TokenScorer {
 public:
  EvictionPolicy::Needs needs() const override { return {}; }
  bool score(const LayerView& v, std::vector<std::vector<float>>* scores) const override {
    for (int64_t h = 0; h < v.n_kv_heads; ++h)
      (*scores)[h].assign(static_cast<size_t>(v.heads[h].len), 0.f);
    return true;
  }
};

// Retrieval heads keep every entry; a streaming head keeps its protected sinks and recent window.
class DuoAllocator : public BudgetAllocator {
 public:
  DuoAllocator(std::vector<std::vector<uint8_t>> streaming, int64_t keep)
      : streaming_(std::move(streaming)), keep_(keep) {}
  bool over_budget(const LayerView& v) const override {
    for (int64_t h = 0; h < v.n_kv_heads; ++h)
      if (streaming_[v.layer][h] && v.heads[h].len > keep_) return true;
    return false;
  }
  bool keep(const LayerView& v, const Protect& protect,
            const std::vector<std::vector<float>>& scores,
            std::vector<std::vector<int64_t>>* keep) const override {
    bool changed = false;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& k = (*keep)[h];
      if (!streaming_[v.layer][h] || hv.len <= keep_) {
        k.resize(static_cast<size_t>(hv.len));
        for (int64_t j = 0; j < hv.len; ++j) k[j] = j;
        continue;
      }
      const HeadSplit s = split_head(protect, v, hv, keep_);
      k = merge_slots(top_k_slots(scores[h].data(), s.candidates, s.room), s.kept);
      changed = changed || static_cast<int64_t>(k.size()) < hv.len;
    }
    return changed;
  }

 private:
  std::vector<std::vector<uint8_t>> streaming_;  // [layer][kv head]
  int64_t keep_;
};

// The eviction store with the calibration's figures among its counters.
class DuoKvCache : public EvictingKvCache {
 public:
  DuoKvCache(const CacheContext& ctx, Options o, std::unique_ptr<EvictionPolicy> policy,
             std::shared_ptr<const CalibrationArtifact> art, int64_t streaming, double ratio)
      : EvictingKvCache(ctx, std::move(o), std::move(policy)),
        art_(std::move(art)),
        streaming_(streaming),
        ratio_(ratio) {}
  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m = EvictingKvCache::counters();
    m["streaming_heads"] = static_cast<double>(streaming_);
    m["setting.head_compression_ratio"] = ratio_;
    add_calibration_counters(*art_, &m);
    return m;
  }

 private:
  std::shared_ptr<const CalibrationArtifact> art_;
  int64_t streaming_;
  double ratio_;
};

std::unique_ptr<KvCache> make_duo(const CacheContext& ctx, const nlohmann::json& p) {
  const auto* art = dynamic_cast<const TensorArtifact*>(ctx.calibration.get());
  KVB_ASSERT(art != nullptr, kName, "built without its calibration artifact");
  const at::Tensor& scores = art->get("head_scores");
  const ModelConfig& c = ctx.config;
  KVB_CHECK(scores.dim() == 2 && scores.size(0) == c.n_layers && scores.size(1) == c.n_kv_heads,
            art->path, ": head_scores of shape ", scores.sizes(), " for a model of ", c.n_layers,
            " layers x ", c.n_kv_heads, " KV heads; delete it to recalibrate");
  const double ratio = p.at("head_compression_ratio").get<double>();
  auto streaming = duo::streaming_heads(scores, ratio);
  int64_t n_streaming = 0;
  for (const auto& l : streaming)
    for (uint8_t s : l) n_streaming += s;
  const int64_t sinks = p.at("sink_size").get<int64_t>(),
                recent = p.at("recent_size").get<int64_t>();
  PolicyParts parts;
  parts.scorer = std::make_unique<NoScores>();
  parts.protect.sinks = sinks;
  parts.protect.recent_tokens = recent;
  parts.allocator = std::make_unique<DuoAllocator>(std::move(streaming), sinks + recent);
  parts.schedule.end_prefill = true;
  parts.schedule.every_decode_steps = p.at("compress_every").get<int64_t>();
  parts.settings = {{"setting.sink_size", static_cast<double>(sinks)},
                    {"setting.recent_size", static_cast<double>(recent)}};
  return std::make_unique<DuoKvCache>(ctx, evicting_options(p, kName, c.head_dim),
                                      make_composed_policy(std::move(parts)), ctx.calibration,
                                      n_streaming, ratio);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_CALIBRATED_METHOD(duo_attention, kvb::duo_info, kvb::make_duo, kvb::duo_calibrate);
