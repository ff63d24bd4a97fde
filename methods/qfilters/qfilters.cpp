// qfilters: Q-Filters (Godey et al., arXiv 2503.02812; kvpress QFilterPress). At the end of prefill
// every KV head keeps the budget's entries with the highest score -(k . f), k the entry's post-RoPE
// key and f the head's filter: the dominant direction of the head's queries, calibrated on the
// run's model (qfilter_calibration.cpp) where kvpress downloads precomputed filters. The scores are
// taken as keys arrive (the store's own rows are not the scorer's to read), kept per sequence by
// token index and handed to the scorer when the sequence's prefill ends. See README.md.

#include <ATen/ATen.h>

#include <unordered_map>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/model/model.h"
#include "methods/common/calibration_text.h"
#include "methods/common/composed_policy.h"
#include "methods/common/eviction_select.h"
#include "methods/common/scored_method.h"
#include "methods/common/tensor_artifact.h"
#include "methods/qfilters/qfilters.h"

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
  const nlohmann::json inputs = {{"artifact", "qfilters.filters/1"},
                                 {"model", model_content_hash(*model)},
                                 {"text", calibration_text_json(text)}};
  return cached_tensor_artifact(kName, inputs, text.cache_dir, [&] {
    return std::map<std::string, at::Tensor>{{"filters", qfilters::calibrate_filters(model, text)}};
  });
}

// Per layer, the filter scores of a sequence's tokens: [layer][token index * n_kv_heads + head].
using SeqScores = std::vector<std::vector<float>>;

// Reads the scores of the sequence whose prefill is ending (QFilterKvCache sets it).
class FilterScorer : public TokenScorer {
 public:
  explicit FilterScorer(std::shared_ptr<const SeqScores*> current) : current_(std::move(current)) {}
  EvictionPolicy::Needs needs() const override { return {}; }
  bool score(const LayerView& v, std::vector<std::vector<float>>* scores) const override {
    KVB_ASSERT(*current_ != nullptr, kName, "scored outside a sequence's end of prefill");
    const std::vector<float>& s = (**current_)[v.layer];
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& out = (*scores)[h];
      out.resize(static_cast<size_t>(hv.len));
      for (int64_t j = 0; j < hv.len; ++j) {
        const size_t at = static_cast<size_t>(hv.idx[j]) * v.n_kv_heads + h;
        KVB_ASSERT(at < s.size(), kName, "no score for token ", hv.idx[j]);
        out[j] = s[at];
      }
    }
    return true;
  }

 private:
  std::shared_ptr<const SeqScores*> current_;
};

class QFilterKvCache : public EvictingKvCache {
 public:
  QFilterKvCache(const CacheContext& ctx, Options o, PolicyParts parts, at::Tensor filters,
                 std::shared_ptr<const CalibrationArtifact> art,
                 std::shared_ptr<const SeqScores*> current)
      : EvictingKvCache(ctx, std::move(o), make_composed_policy(std::move(parts))),
        filters_(std::move(filters)),
        art_(std::move(art)),
        current_(std::move(current)),
        L_(ctx.config.n_layers),
        H_(ctx.config.n_kv_heads) {}
  at::Tensor attend(const LayerInput& in) override {
    // score[t, h] = -(k[t, h] . f[h]): the key as kvpress's cache holds it (post-RoPE).
    const at::Tensor s =
        -(in.k->to(at::kCPU).to(at::kFloat) * filters_[in.layer].unsqueeze(0)).sum(-1);  // [T, H]
    const float* sp = s.contiguous().data_ptr<float>();
    const StepBatch& b = *in.batch;
    for (int64_t i = 0; i < b.batch_size(); ++i) {
      std::vector<float>& dst = table(b.seq_ids[i])[in.layer];
      const int64_t first = b.past_lens[i], n = b.new_tokens(i);
      if (static_cast<int64_t>(dst.size()) < (first + n) * H_)
        dst.resize(static_cast<size_t>((first + n) * H_));
      std::copy(sp + b.q_indptr[i] * H_, sp + (b.q_indptr[i] + n) * H_, dst.begin() + first * H_);
    }
    return EvictingKvCache::attend(in);
  }
  void end_prefill(int64_t seq_id) override {
    *current_ = &table(seq_id);
    EvictingKvCache::end_prefill(seq_id);
    *current_ = nullptr;
  }
  void release(int64_t seq_id) override {
    scores_.erase(seq_id);
    EvictingKvCache::release(seq_id);
  }
  void fork(int64_t src_id, int64_t dst_id) override {
    EvictingKvCache::fork(src_id, dst_id);
    scores_[dst_id] = table(src_id);
  }
  // The filter scores of spliced sequences would have to move with their token indices.
  bool can_splice() const override { return false; }
  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m = EvictingKvCache::counters();
    m["calib_from_cache"] = art_->from_cache ? 1.0 : 0.0;
    m["calib_seconds"] = art_->seconds;
    m["calib_artifact_bytes"] = static_cast<double>(art_->file_bytes);
    return m;
  }

 private:
  SeqScores& table(int64_t seq_id) {
    SeqScores& t = scores_[seq_id];
    if (t.empty()) t.resize(static_cast<size_t>(L_));
    return t;
  }
  at::Tensor filters_;  // [layers, kv heads, head_dim] fp32 CPU
  std::shared_ptr<const CalibrationArtifact> art_;
  std::shared_ptr<const SeqScores*> current_;  // shared with the scorer
  std::unordered_map<int64_t, SeqScores> scores_;
  int64_t L_, H_;
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
  const Budget budget = parse_budget(p, kName);
  auto current = std::make_shared<const SeqScores*>(nullptr);
  PolicyParts parts;
  parts.scorer = std::make_unique<FilterScorer>(current);
  parts.allocator = parse_allocator(p, budget);
  parts.schedule.end_prefill = true;
  return std::make_unique<QFilterKvCache>(ctx, evicting_options(p, kName, c.head_dim),
                                          std::move(parts), f, ctx.calibration, current);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_CALIBRATED_METHOD(qfilters, kvb::qfilters_info, kvb::make_qfilters,
                               kvb::qfilters_calibrate);
