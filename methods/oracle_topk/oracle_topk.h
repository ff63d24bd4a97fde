#pragma once
// oracle_topk: the read-time selection bound. Every token stays resident at full precision (the
// `full` store); at each decode step, per layer and KV head, the query attends exactly over the k
// rows with the highest true q . k logit (k from the budget), aggregated over the query heads of
// the GQA group by max (default) or mean. Quest, RetroInfer and SpeCache approximate this
// selection from page bounds, cluster centroids or a speculated query; the oracle scores every key
// exactly, which reads the whole key cache each step: a bound, not a deployable method.
// Prefill, and decode rows whose budget covers every visible token, attend densely through the
// `full` store's own kernel call, so budget >= 1 reproduces `full` bit for bit.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "methods/common/contiguous_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {

class OracleTopkKvCache : public ContiguousKvCache {
 public:
  struct Options {
    Budget budget;  // rows attended per decode step per KV head (ratio of the visible rows)
    GqaAgg gqa_agg = GqaAgg::kMax;
  };
  OracleTopkKvCache(const CacheContext& ctx, Options opts);

  at::Tensor attend(const LayerInput& in) override;
  std::map<std::string, double> counters() const override;

  // Rows one KV head attends for one decode query: the `k` best by `score` ([visible] fp32, the
  // group-aggregated logits), ties to the lower row, ascending. k >= visible: every row.
  static std::vector<int64_t> select_rows(const float* score, int64_t visible, int64_t k);

 private:
  // One decode query row (position `vis - 1`) over the first `vis` rows of K, V: [rows, Hkv, D].
  // q_row: [Hq, D]. Returns [Hq, D] in q's dtype.
  at::Tensor attend_top_rows(const at::Tensor& q_row, const at::Tensor& K, const at::Tensor& V,
                             int64_t vis, int64_t k, float sm_scale);

  Options opts_;
  int64_t Hq_, Hkv_, D_;
  // Per (decode query row, layer, KV head): rows attended and rows visible.
  double reads_ = 0, read_rows_ = 0, visible_rows_ = 0;
};

}  // namespace kvb
