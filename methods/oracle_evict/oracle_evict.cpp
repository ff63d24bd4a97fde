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
#include "methods/common/fork_pass.h"
#include "methods/common/pre_pass_scores.h"

namespace kvb {
namespace {

// Future attention mass per [layer][kv head][prompt token].
using FutureMass = std::vector<std::vector<std::vector<float>>>;

// What the store and its policy share: the budget and the mass of the sequence being compressed.
struct OracleEvictState {
  Budget budget;
  PrePassScores<FutureMass> mass;
};

// Each KV head keeps its per-head budget of prompt rows by future mass (ties: the lower slot,
// which is the earlier token).
class OracleEvictPolicy : public PrePassPolicy {
 public:
  explicit OracleEvictPolicy(std::shared_ptr<OracleEvictState> state) : state_(std::move(state)) {}
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    const FutureMass* fm = state_->mass.compressing();
    KVB_CHECK(fm != nullptr,
              "method oracle_evict: a prefill ended without the hindsight pass; "
              "only a protocol that hands the continuation (stream, qa with "
              "mode=query_agnostic) can run oracle_evict");
    const int64_t k = state_->budget.per_head(v.seen, v.n_kv_heads);
    bool evicts = false;
    keep->assign(static_cast<size_t>(v.n_kv_heads), {});
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      const auto& mass = (*fm)[v.layer][h];
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
  std::shared_ptr<OracleEvictState> state_;
};

enum class Hindsight { kContinuation, kQuestion };

class OracleEvictKvCache : public EvictingKvCache, public HindsightCache {
 public:
  OracleEvictKvCache(const CacheContext& ctx, Options opts, Hindsight hindsight,
                     std::shared_ptr<OracleEvictState> st)
      : EvictingKvCache(ctx, std::move(opts), std::make_unique<OracleEvictPolicy>(st)),
        hindsight_(hindsight),
        state_(std::move(st)),
        n_layers_(ctx.config.n_layers),
        n_kv_heads_(ctx.config.n_kv_heads),
        group_(ctx.config.n_heads / ctx.config.n_kv_heads) {}

  int64_t run_hindsight_pass(const HindsightPass& p) override {
    KVB_CHECK(p.engine != nullptr, "method oracle_evict: the hindsight pass needs the engine");
    KVB_CHECK(p.question_tokens.size() == p.continuations.size(),
              "method oracle_evict: ", p.continuations.size(), " continuations with ",
              p.question_tokens.size(), " question lengths");
    const int64_t n = seq_len(p.seq);
    FutureMass fm(static_cast<size_t>(n_layers_),
                  std::vector<std::vector<float>>(static_cast<size_t>(n_kv_heads_),
                                                  std::vector<float>(static_cast<size_t>(n), 0.f)));
    int64_t fed = 0, question = 0;
    Engine& e = *p.engine;
    for (size_t c = 0; c < p.continuations.size(); ++c) {
      const auto& all = p.continuations[c];
      question += p.question_tokens[c];
      const int64_t len = hindsight_ == Hindsight::kQuestion
                              ? std::min<int64_t>(p.question_tokens[c], all.size())
                              : static_cast<int64_t>(all.size());
      if (len == 0) continue;
      run_on_fork(e, p.seq, std::vector<int64_t>(all.begin(), all.begin() + len), &pass_,
                  [&](int64_t fork) { return Pass{fork, n, &fm}; });
      fed += len;
    }
    KVB_CHECK(hindsight_ != Hindsight::kQuestion || question > 0,
              "method oracle_evict.hindsight: 'question' needs a protocol whose prompt is "
              "followed by a question (qa with mode=query_agnostic); this one hands none (use "
              "'continuation')");
    state_->mass.put(p.seq, std::move(fm));
    hindsight_tokens_ += fed;
    ++passes_;
    return fed;
  }

  at::Tensor attend(const LayerInput& in) override {
    for_fork_rows(pass_, in, [&](int64_t row0, int64_t rows) { add_mass(in, row0, rows); });
    return EvictingKvCache::attend(in);
  }

  void end_prefill(int64_t seq_id) override {
    KVB_CHECK(state_->mass.has(seq_id), "method oracle_evict: sequence ", seq_id,
              " ended its prefill without the hindsight pass; only a protocol that hands the "
              "continuation (stream, qa with mode=query_agnostic) can run oracle_evict");
    state_->mass.compress_with(seq_id, [&](FutureMass&) { EvictingKvCache::end_prefill(seq_id); });
  }

  void release(int64_t seq_id) override {
    state_->mass.drop(seq_id);
    EvictingKvCache::release(seq_id);
  }

  std::map<std::string, double> counters() const override {
    auto c = EvictingKvCache::counters();
    c["hindsight_tokens"] = static_cast<double>(hindsight_tokens_);
    c["hindsight_passes"] = static_cast<double>(passes_);
    c["setting.hindsight_question_only"] = hindsight_ == Hindsight::kQuestion ? 1.0 : 0.0;
    return c;
  }

 private:
  struct Pass {
    int64_t fork;
    int64_t prompt;  // the prompt's length: fork rows at or past it are the continuation's own
    FutureMass* mass;
  };

  // The exact attention of this step's continuation queries over everything the fork holds (the
  // whole prompt, the continuation so far) and, causally, the step's own rows; summed over the
  // queries and the GQA group onto the prompt rows.
  void add_mass(const LayerInput& in, int64_t row0, int64_t rows) {
    const Pass& p = *pass_;
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
  std::shared_ptr<OracleEvictState> state_;
  int64_t n_layers_, n_kv_heads_, group_;
  std::optional<Pass> pass_;
  int64_t hindsight_tokens_ = 0;
  int64_t passes_ = 0;
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
  info.params.push_back(string_param(
      "hindsight", "continuation", {"continuation", "question"},
      "what the future mass is measured on: the run's whole continuation (stream: the window's "
      "tokens after the prompt; qa: each question and the full cache's answer to it), or the "
      "questions alone (qa only: the best a query-aware method could do before answering)"));
  return info;
}

std::unique_ptr<KvCache> make_oracle_evict(const CacheContext& ctx, const nlohmann::json& p) {
  auto st = std::make_shared<OracleEvictState>();
  st->budget = parse_budget(p, "oracle_evict");
  const Hindsight h = p.at("hindsight").get<std::string>() == "question" ? Hindsight::kQuestion
                                                                         : Hindsight::kContinuation;
  EvictingKvCache::Options o;
  o.name = "oracle_evict";
  o.position_mode = PositionMode::kAbsolute;
  return std::make_unique<OracleEvictKvCache>(ctx, o, h, std::move(st));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(oracle_evict, kvb::oracle_evict_info, kvb::make_oracle_evict);
