// oracle_topk: exact top-k read-time selection over a fully resident cache (see oracle_topk.h).

#include "methods/oracle_topk/oracle_topk.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "harness/kv/method_registry.h"

namespace kvb {

OracleTopkKvCache::OracleTopkKvCache(const CacheContext& ctx, Options opts)
    : ContiguousKvCache(ctx, Mode::kGrow, 0, "oracle_topk"),
      opts_(opts),
      Hq_(ctx.config.n_heads),
      Hkv_(ctx.config.n_kv_heads),
      D_(ctx.config.head_dim) {
  KVB_ASSERT(Hkv_ >= 1 && Hq_ % Hkv_ == 0, "oracle_topk", Hq_, " query heads over ", Hkv_,
             " KV heads");
}

std::vector<int64_t> OracleTopkKvCache::select_rows(const float* score, int64_t visible,
                                                    int64_t k) {
  std::vector<int64_t> all(static_cast<size_t>(visible));
  std::iota(all.begin(), all.end(), 0);
  if (k >= visible) return all;
  return top_k_slots(score, all, std::max<int64_t>(k, 1));
}

at::Tensor OracleTopkKvCache::attend_top_rows(const at::Tensor& q_row, const at::Tensor& K,
                                              const at::Tensor& V, int64_t vis, int64_t k,
                                              float sm_scale) {
  const int64_t G = Hq_ / Hkv_;
  at::Tensor q = q_row.to(at::kFloat).view({Hkv_, G, D_});                // [Hkv, G, D]
  at::Tensor Kh = K.narrow(0, 0, vis).to(at::kFloat).permute({1, 0, 2});  // [Hkv, vis, D]
  at::Tensor Vh = V.narrow(0, 0, vis).to(at::kFloat).permute({1, 0, 2});  // [Hkv, vis, D]
  at::Tensor logits = at::matmul(q, Kh.transpose(1, 2)).mul_(sm_scale);   // [Hkv, G, vis]
  at::Tensor agg = opts_.gqa_agg == GqaAgg::kMax ? std::get<0>(logits.max(1)) : logits.mean(1);
  at::Tensor score = agg.to(at::kCPU).contiguous();  // [Hkv, vis]
  std::vector<int64_t> picked;
  picked.reserve(static_cast<size_t>(Hkv_ * k));
  for (int64_t h = 0; h < Hkv_; ++h) {
    std::vector<int64_t> rows = select_rows(score.data_ptr<float>() + h * vis, vis, k);
    KVB_ASSERT(static_cast<int64_t>(rows.size()) == k, "oracle_topk", "selected ", rows.size(),
               " rows of ", vis, " for k ", k);
    picked.insert(picked.end(), rows.begin(), rows.end());
  }
  at::Tensor idx = at::tensor(picked, at::kLong).view({Hkv_, k}).to(K.device());  // [Hkv, k]
  at::Tensor sel = logits.gather(2, idx.unsqueeze(1).expand({Hkv_, G, k}));       // [Hkv, G, k]
  at::Tensor Vs = Vh.gather(1, idx.unsqueeze(2).expand({Hkv_, k, D_}));           // [Hkv, k, D]
  at::Tensor o = at::matmul(at::softmax(sel, -1), Vs);                            // [Hkv, G, D]
  return o.reshape({Hq_, D_}).to(q_row.scalar_type());
}

at::Tensor OracleTopkKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  if (batch.phase != Phase::kDecode) return ContiguousKvCache::attend(in);
  const int layer = in.layer;
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    ContiguousSeq& s = seqs_.at(batch.seq_ids[b]);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b];
    s.k[layer].narrow(0, s.len, n).copy_(in.k->narrow(0, start, n));
    s.v[layer].narrow(0, s.len, n).copy_(in.v->narrow(0, start, n));
    const at::Tensor K = s.k[layer].narrow(0, 0, s.len + n);  // [rows, Hkv, D]
    const at::Tensor V = s.v[layer].narrow(0, 0, s.len + n);
    bool dense = true;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t vis = s.len + i + 1;
      const int64_t k = std::min(vis, opts_.budget.per_head(vis, Hkv_));
      reads_ += static_cast<double>(Hkv_);
      read_rows_ += static_cast<double>(Hkv_ * k);
      visible_rows_ += static_cast<double>(Hkv_ * vis);
      dense = dense && k >= vis;
    }
    at::Tensor q = in.q->narrow(0, start, n);  // [n, Hq, D]
    if (dense) {
      outs.push_back(attend_dense(q, K, V, in.sm_scale));
      continue;
    }
    at::Tensor o = at::empty({n, Hq_, D_}, q.options());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t vis = s.len + i + 1;
      const int64_t k = std::min(vis, opts_.budget.per_head(vis, Hkv_));
      o[i].copy_(k >= vis ? attend_dense(q.narrow(0, i, 1), K.narrow(0, 0, vis),
                                         V.narrow(0, 0, vis), in.sm_scale)[0]
                          : attend_top_rows(q[i], K, V, vis, k, in.sm_scale));
    }
    outs.push_back(o);
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

std::map<std::string, double> OracleTopkKvCache::counters() const {
  std::map<std::string, double> c;
  c["setting.gqa_agg_max"] = opts_.gqa_agg == GqaAgg::kMax ? 1.0 : 0.0;
  c["decode_head_reads"] = reads_;
  if (reads_ > 0) {
    c["read_tokens_per_head_step"] = read_rows_ / reads_;
    c["read_fraction"] = read_rows_ / visible_rows_;
    // K/V rows attended against a dense read (the shared name, kv_cache.h). Scoring reads every
    // key, which no deployable selector can afford: that cost is what makes this an oracle.
    c["decode_read_fraction"] = read_rows_ / visible_rows_;
    c["scored_key_fraction"] = 1.0;
  }
  return c;
}

namespace {

MethodInfo oracle_topk_info() {
  MethodInfo m;
  m.name = "oracle_topk";
  m.summary =
      "oracle: keep every token; each decode step attends to the exact top-k rows by q.k per KV "
      "head (the bound Quest/RetroInfer/SpeCache approximate)";
  m.params = budget_params(0.25, "ratio");
  m.params[0].doc =
      "rows ATTENDED per decode step per KV head (nothing is evicted): a fraction of the rows "
      "visible to the query (budget_unit=ratio, (0, 1]) or a count (tokens_per_head; "
      "tokens_per_layer = per layer over its KV heads); at least 1; every row when the budget "
      "covers them (then bit-identical to full)";
  m.params.push_back(string_param(
      "gqa_agg", "max", {"max", "mean"},
      "GQA: one row set per KV head, ranked by the max (default) or mean of the group's query-head "
      "logits q.k"));
  m.caps.oracle = true;
  return m;
}

std::unique_ptr<KvCache> make_oracle_topk(const CacheContext& ctx, const nlohmann::json& p) {
  OracleTopkKvCache::Options o;
  o.budget = parse_budget(p, "oracle_topk");
  o.gqa_agg = param_enum(p, "gqa_agg", kGqaAggs);
  return std::make_unique<OracleTopkKvCache>(ctx, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(oracle_topk, kvb::oracle_topk_info, kvb::make_oracle_topk);
