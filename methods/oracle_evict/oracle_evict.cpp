// oracle_evict: the eviction bound. After the prompt is prefilled, the store runs the run's own
// continuation (stream: the window's teacher-forced tokens; qa: each question and the full cache's
// answer to it) on forks of the sequence, i.e. on exact copies of the uncompressed cache, and
// records for every prompt row, per layer and KV head, its FUTURE attention mass: the softmax
// probability the continuation's queries give it under the full cache, summed over those queries
// and over the query heads of the KV head's GQA group (the total weight a dropped row would have
// carried). At the end of the prefill each KV head keeps its budget of prompt rows with the
// highest mass (ties: the earlier token), exactly where SnapKV-style methods compress; rows
// appended while decoding are kept. The store is EvictingKvCache, so evicted rows free memory.
// No deployable method knows the continuation: a bound on prefill-time eviction at that budget.

#include <ATen/ATen.h>

#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/hindsight.h"
#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"
#include "methods/common/pre_pass_kv_cache.h"

namespace kvb {
namespace {

// Future attention mass per [layer][kv head][prompt token].
using FutureMass = TokenScores;

const PrePassInfo kPass{"oracle_evict", "hindsight pass",
                        "hands the continuation (stream, qa with mode=query_agnostic)",
                        "hindsight"};

// Each KV head keeps its per-head budget of prompt rows by future mass (ties: the lower slot,
// which is the earlier token).
class OracleEvictPolicy : public PrePassPolicy<FutureMass> {
 public:
  OracleEvictPolicy(std::shared_ptr<const PrePassScores<FutureMass>> mass, Budget budget)
      : PrePassPolicy(std::move(mass), kPass), budget_(budget) {}

 protected:
  bool select_from(const FutureMass& fm, const LayerView& v,
                   std::vector<std::vector<int64_t>>* keep) const override {
    const int64_t k = budget_.per_head(v.seen, v.n_kv_heads);
    bool evicts = false;
    keep->assign(static_cast<size_t>(v.n_kv_heads), {});
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      const auto& mass = fm[v.layer][h];
      std::vector<float> score(static_cast<size_t>(hv.len));
      std::vector<int64_t> slots(static_cast<size_t>(hv.len));
      for (int64_t j = 0; j < hv.len; ++j) {
        const int64_t t = hv.idx[j];
        KVB_CHECK(t < static_cast<int64_t>(mass.size()), "method oracle_evict: token ", t,
                  " was not part of the prompt the hindsight pass scored");
        score[j] = mass[t];
        slots[j] = j;
      }
      (*keep)[h] = top_k_slots(score.data(), slots, k);
      evicts = evicts || k < hv.len;
    }
    return evicts;
  }

 private:
  Budget budget_;
};

// The running hindsight pass: its fork and where its future mass goes.
struct HindsightRun {
  int64_t fork;
  int64_t prompt;  // the prompt's length: fork rows at or past it are the continuation's own
  FutureMass* mass;
};

enum class Hindsight { kContinuation, kQuestion };
const EnumName<Hindsight> kHindsights[] = {{Hindsight::kContinuation, "continuation"},
                                           {Hindsight::kQuestion, "question"}};

class OracleEvictKvCache : public PrePassKvCache<FutureMass, HindsightRun>, public HindsightCache {
 public:
  OracleEvictKvCache(const CacheContext& ctx, Options opts, Hindsight hindsight, Budget budget,
                     std::shared_ptr<PrePassScores<FutureMass>> mass)
      : PrePassKvCache(ctx, std::move(opts), std::make_unique<OracleEvictPolicy>(mass, budget),
                       mass, kPass),
        hindsight_(hindsight) {}

  int64_t run_hindsight_pass(const HindsightPass& p) override {
    KVB_CHECK(p.engine != nullptr, "method oracle_evict: the hindsight pass needs the engine");
    KVB_CHECK(p.question_tokens.size() == p.continuations.size(),
              "method oracle_evict: ", p.continuations.size(), " continuations with ",
              p.question_tokens.size(), " question lengths");
    const int64_t n = seq_len(p.seq);
    FutureMass fm = zero_token_scores(n);
    int64_t fed = 0, question = 0;
    Engine& e = *p.engine;
    for (size_t c = 0; c < p.continuations.size(); ++c) {
      const auto& all = p.continuations[c];
      question += p.question_tokens[c];
      const int64_t len = hindsight_ == Hindsight::kQuestion
                              ? std::min<int64_t>(p.question_tokens[c], all.size())
                              : static_cast<int64_t>(all.size());
      if (len == 0) continue;
      run_pass(e, p.seq, std::vector<int64_t>(all.begin(), all.begin() + len), [&](int64_t fork) {
        return HindsightRun{fork, n, &fm};
      });
      fed += len;
    }
    KVB_CHECK(hindsight_ != Hindsight::kQuestion || question > 0,
              "method oracle_evict.hindsight: 'question' needs a protocol whose prompt is "
              "followed by a question (qa with mode=query_agnostic); this one hands none (use "
              "'continuation')");
    scored(p.seq, std::move(fm), fed);
    return fed;
  }

  std::map<std::string, double> counters() const override {
    auto c = PrePassKvCache::counters();
    c["setting.hindsight_question_only"] = hindsight_ == Hindsight::kQuestion ? 1.0 : 0.0;
    return c;
  }

 private:
  // The exact attention of this step's continuation queries over everything the fork holds (the
  // whole prompt, the continuation so far) and, causally, the step's own rows; summed over the
  // queries and the GQA group onto the prompt rows.
  void score_rows(const LayerInput& in, int64_t row0, int64_t rows) override {
    const HindsightRun& p = *pass_;
    const at::Tensor q = in.q->narrow(0, row0, rows).to(at::kCPU).to(at::kFloat);  // [rows, Hq, D]
    const at::Tensor k_new =
        in.k->narrow(0, row0, rows).to(at::kCPU).to(at::kFloat);  // [rows, Hkv, D]
    const std::vector<HeadSnapshot> held = probe_view(in.layer, p.fork);
    for (int64_t h = 0; h < n_kv_heads_; ++h) {
      const at::Tensor& idx = held[h].index.to(at::kCPU);
      const int64_t m = idx.size(0);
      const at::Tensor mass =
          fork_rows_attention(q, k_new, held[h].k.to(at::kCPU), h, group_, in.sm_scale)
              .narrow(2, 0, m)
              .sum(at::IntArrayRef{0, 1})
              .contiguous();  // [m]
      const at::Tensor tok = idx.contiguous();
      const float* w = mass.data_ptr<float>();
      const int64_t* t = tok.data_ptr<int64_t>();
      std::vector<float>& out = (*p.mass)[in.layer][h];
      for (int64_t j = 0; j < m; ++j)
        if (t[j] < p.prompt) out[t[j]] += w[j];
    }
  }

  Hindsight hindsight_;
};

MethodInfo oracle_evict_info() {
  MethodInfo info;
  info.name = "oracle_evict";
  info.summary =
      "oracle: at the end of the prompt each KV head keeps the rows the true continuation will "
      "attend to most (future attention mass under the full cache); a bound, not deployable";
  info.caps.evicts = true;
  info.caps.needs_hindsight = true;
  info.caps.oracle = true;
  info.params = budget_params(0.25, "ratio");
  info.params.push_back(enum_param(
      "hindsight", kHindsights, Hindsight::kContinuation,
      "what the future mass is measured on: the run's whole continuation (stream: the window's "
      "tokens after the prompt; qa: each question and the full cache's answer to it), or the "
      "questions alone (qa only: the best a query-aware method could do before answering)"));
  return info;
}

std::unique_ptr<KvCache> make_oracle_evict(const CacheContext& ctx, const nlohmann::json& p) {
  const Budget budget = parse_budget(p, "oracle_evict");
  const Hindsight h = param_enum(p, "hindsight", kHindsights);
  EvictingKvCache::Options o;
  o.name = "oracle_evict";
  o.position_mode = PositionMode::kAbsolute;
  return std::make_unique<OracleEvictKvCache>(ctx, o, h, budget,
                                              std::make_shared<PrePassScores<FutureMass>>());
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(oracle_evict, kvb::oracle_evict_info, kvb::make_oracle_evict);
