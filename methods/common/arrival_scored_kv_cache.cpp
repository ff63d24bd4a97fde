#include "methods/common/arrival_scored_kv_cache.h"

#include <ATen/ATen.h>

#include <string>

#include "harness/common/internal_error.h"
#include "methods/common/eviction_select.h"
#include "methods/common/scored_method.h"

namespace kvb {
namespace {

class RecordedScorer : public TokenScorer {
 public:
  RecordedScorer(std::shared_ptr<const ArrivalScores*> slot, std::string name)
      : slot_(std::move(slot)), name_(std::move(name)) {}
  EvictionPolicy::Needs needs() const override { return {}; }
  bool score(const LayerView& v, std::vector<std::vector<float>>* scores) const override {
    KVB_ASSERT(*slot_ != nullptr, name_, "scored outside a sequence's end of prefill");
    const std::vector<float>& s = (**slot_)[v.layer];
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& out = (*scores)[h];
      out.resize(static_cast<size_t>(hv.len));
      for (int64_t j = 0; j < hv.len; ++j) {
        const size_t at = static_cast<size_t>(hv.idx[j]) * v.n_kv_heads + h;
        KVB_ASSERT(at < s.size(), name_, "no score for token ", hv.idx[j]);
        out[j] = s[at];
      }
    }
    return true;
  }

 private:
  std::shared_ptr<const ArrivalScores*> slot_;
  std::string name_;
};

}  // namespace

std::shared_ptr<const ArrivalScores*> make_arrival_slot() {
  return std::make_shared<const ArrivalScores*>(nullptr);
}

std::unique_ptr<TokenScorer> recorded_scorer(std::shared_ptr<const ArrivalScores*> slot,
                                             std::string name) {
  return std::make_unique<RecordedScorer>(std::move(slot), std::move(name));
}

PolicyParts recorded_score_parts(const nlohmann::json& p, const std::string& method,
                                 std::shared_ptr<const ArrivalScores*> slot) {
  const Budget budget = parse_budget(p, method);
  PolicyParts parts;
  parts.scorer = recorded_scorer(std::move(slot), method);
  parts.allocator = parse_allocator(p, budget);
  parts.schedule.end_prefill = true;
  return parts;
}

ArrivalScoredKvCache::ArrivalScoredKvCache(const CacheContext& ctx, Options o, PolicyParts parts,
                                           std::shared_ptr<const ArrivalScores*> slot)
    : EvictingKvCache(ctx, std::move(o), make_composed_policy(std::move(parts))),
      artifact_(ctx.calibration),
      slot_(std::move(slot)),
      L_(ctx.config.n_layers),
      H_(ctx.config.n_kv_heads) {}

std::map<std::string, double> ArrivalScoredKvCache::counters() const {
  std::map<std::string, double> m = EvictingKvCache::counters();
  if (artifact_) add_calibration_counters(*artifact_, &m);
  return m;
}

at::Tensor ArrivalScoredKvCache::attend(const LayerInput& in) {
  const at::Tensor s = arrival_scores(in).contiguous();  // [T, H]
  KVB_ASSERT(s.dim() == 2 && s.size(1) == H_ && s.scalar_type() == at::kFloat, "arrival scores",
             "scores of shape ", s.sizes(), " for ", H_, " KV heads");
  const float* sp = s.data_ptr<float>();
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

void ArrivalScoredKvCache::end_prefill(int64_t seq_id) {
  *slot_ = &table(seq_id);
  EvictingKvCache::end_prefill(seq_id);
  *slot_ = nullptr;
}

void ArrivalScoredKvCache::release(int64_t seq_id) {
  scores_.erase(seq_id);
  EvictingKvCache::release(seq_id);
}

void ArrivalScoredKvCache::fork(int64_t src_id, int64_t dst_id) {
  EvictingKvCache::fork(src_id, dst_id);
  scores_[dst_id] = table(src_id);
}

ArrivalScores& ArrivalScoredKvCache::table(int64_t seq_id) {
  ArrivalScores& t = scores_[seq_id];
  if (t.empty()) t.resize(static_cast<size_t>(L_));
  return t;
}

}  // namespace kvb
