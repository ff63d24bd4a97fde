#pragma once
// An eviction store whose scores are computed as the keys arrive, from what the forward hands the
// layer (Q-Filters: the post-RoPE key against a calibrated filter; KVzap: a trained surrogate over
// the layer's input), then ranked when the sequence's prefill ends. The store's own rows are not
// the scorer's to read back (they may be quantized, and the layer's input is gone by then), so each
// step's scores are kept per sequence by token index and handed to the scorer at end_prefill.
// A method derives from it and says how one step's scores are computed (arrival_scores); the
// scorer of its PolicyParts is the one `recorded_scorer` returns.

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/kv/calibration.h"
#include "methods/common/composed_policy.h"
#include "methods/common/evicting_kv_cache.h"

namespace kvb {

// Per layer, the recorded scores of a sequence's tokens: [layer][token index * n_kv_heads + head].
using ArrivalScores = std::vector<std::vector<float>>;

class ArrivalScoredKvCache : public EvictingKvCache {
 public:
  // parts.scorer must come from recorded_scorer(slot) with this constructor's `slot`. The store's
  // scores come from its calibration artifact (ctx.calibration), whose counters it reports.
  ArrivalScoredKvCache(const CacheContext& ctx, Options o, PolicyParts parts,
                       std::shared_ptr<const ArrivalScores*> slot);

  std::map<std::string, double> counters() const override;

  at::Tensor attend(const LayerInput& in) override;
  void end_prefill(int64_t seq_id) override;
  void release(int64_t seq_id) override;
  void fork(int64_t src_id, int64_t dst_id) override;
  // The recorded scores of spliced sequences would have to move with their token indices.
  bool can_splice() const override { return false; }

 protected:
  // This layer call's scores, [T, n_kv_heads] fp32 CPU, one row per token of the step (rows in
  // the batch's q_indptr order).
  virtual at::Tensor arrival_scores(const LayerInput& in) = 0;

 private:
  ArrivalScores& table(int64_t seq_id);
  std::shared_ptr<const CalibrationArtifact> artifact_;
  std::shared_ptr<const ArrivalScores*> slot_;  // the sequence being compressed, for the scorer
  std::unordered_map<int64_t, ArrivalScores> scores_;
  int64_t L_, H_;
};

// The scorer that reads the slot's table at end_prefill (a method's `name` in its errors), and a
// fresh slot to share between it and the store.
std::shared_ptr<const ArrivalScores*> make_arrival_slot();
std::unique_ptr<TokenScorer> recorded_scorer(std::shared_ptr<const ArrivalScores*> slot,
                                             std::string name);

// The policy of a method that ranks its recorded scores once, at end_prefill: its budget and
// allocator from the resolved parameters `p` (errors name `method`), nothing protected.
PolicyParts recorded_score_parts(const nlohmann::json& p, const std::string& method,
                                 std::shared_ptr<const ArrivalScores*> slot);

}  // namespace kvb
