#pragma once
// The store side of a method that scores the prompt in a pass of its own on a fork of the sequence
// before compressing it (KVzip's context reconstruction, oracle_evict's hindsight): an
// EvictingKvCache whose policy (PrePassPolicy) reads the scores at end_prefill. The pass runs
// through run_pass; while it runs, attend hands each layer's fork rows to score_rows, the method's
// measure, and the scores it fills are put() per sequence; end_prefill refuses a sequence without
// them (naming the pass and the protocols that run it) and drops them after compressing, release
// drops them too. The counters add the pass's tokens and passes.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/fork_pass.h"
#include "methods/common/pre_pass_scores.h"

namespace kvb {

// Scores per [layer][kv head][token index] of the prompt.
using TokenScores = std::vector<std::vector<std::vector<float>>>;

// Pass: what score_rows needs while a pass runs, with the fork's id as member `fork`.
template <class Scores, class Pass>
class PrePassKvCache : public EvictingKvCache {
 public:
  at::Tensor attend(const LayerInput& in) override {
    for_fork_rows(pass_, in, [&](int64_t row0, int64_t rows) { score_rows(in, row0, rows); });
    return EvictingKvCache::attend(in);
  }

  void end_prefill(int64_t seq_id) override {
    KVB_CHECK(scores_->has(seq_id), "method ", need_.method, ": sequence ", seq_id,
              " ended its prefill without the ", need_.pass, "; only a protocol that ",
              need_.protocols, " can run ", need_.method);
    scores_->compress_with(seq_id, [&](Scores& s) {
      prepare(seq_id, &s);
      EvictingKvCache::end_prefill(seq_id);
    });
  }

  void release(int64_t seq_id) override {
    scores_->drop(seq_id);
    EvictingKvCache::release(seq_id);
  }

  std::map<std::string, double> counters() const override {
    auto c = EvictingKvCache::counters();
    c[need_.counter + "_tokens"] = static_cast<double>(pass_tokens_);
    c[need_.counter + "_passes"] = static_cast<double>(passes_);
    return c;
  }

 protected:
  PrePassKvCache(const CacheContext& ctx, Options opts, std::unique_ptr<EvictionPolicy> policy,
                 std::shared_ptr<PrePassScores<Scores>> scores, PrePassInfo need)
      : EvictingKvCache(ctx, std::move(opts), std::move(policy)),
        scores_(std::move(scores)),
        need_(std::move(need)),
        n_layers_(ctx.config.n_layers),
        n_kv_heads_(ctx.config.n_kv_heads),
        group_(ctx.config.n_heads / ctx.config.n_kv_heads) {}

  // The method's measure of this layer call's fork rows [row0, row0 + rows) of the running pass
  // (pass_).
  virtual void score_rows(const LayerInput& in, int64_t row0, int64_t rows) = 0;
  // The sequence's scores just before its policy reads them (kvzip ranks them here).
  virtual void prepare(int64_t seq_id, Scores* scores) {}

  // Prefills `ids` on a fork of `seq` with make_pass(fork) as pass_ (see run_on_fork).
  template <class MakePass>
  void run_pass(Engine& engine, int64_t seq, const std::vector<int64_t>& ids,
                MakePass&& make_pass) {
    run_on_fork(engine, seq, ids, &pass_, std::forward<MakePass>(make_pass));
  }
  // Puts the scores of a sequence's pass, which prefilled `tokens` tokens in all.
  void scored(int64_t seq, Scores scores, int64_t tokens) {
    scores_->put(seq, std::move(scores));
    pass_tokens_ += tokens;
    ++passes_;
  }

  // Zeros over the cache's layers and KV heads for `tokens` prompt tokens.
  TokenScores zero_token_scores(int64_t tokens) const {
    return TokenScores(
        static_cast<size_t>(n_layers_),
        std::vector<std::vector<float>>(static_cast<size_t>(n_kv_heads_),
                                        std::vector<float>(static_cast<size_t>(tokens), 0.f)));
  }

  std::shared_ptr<PrePassScores<Scores>> scores_;
  PrePassInfo need_;
  const int64_t n_layers_, n_kv_heads_, group_;
  std::optional<Pass> pass_;

 private:
  int64_t pass_tokens_ = 0, passes_ = 0;
};

}  // namespace kvb
