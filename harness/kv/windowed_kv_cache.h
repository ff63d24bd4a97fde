#pragma once
// Sliding-window layers through the KV seam. A model with window layers (Gemma 3's local layers,
// Mistral's or Phi-3's sliding_window, Qwen's use_sliding_window) runs on a WindowedKvCache around
// the method's store: the window layers are kept here, each holding only the last window - 1 rows
// of a sequence between steps (physically: the ledger shows it), whatever the method; the method's
// store is built for the global layers only (ModelConfig::model_layers says which model layers they
// are), so its budget, codec or tiering applies to them, as kvpress does for Gemma 3. The full
// cache of such a model is its windowed footprint (ModelConfig::full_kv_bytes), and compression
// ratios are against it.
//
// MethodRegistry::create and make_default_kv wrap every store of such a model; the engine refuses a
// model with window layers on a store that does not apply them (KvCache::serves_windows).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/kv/document_reuse.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/lookahead.h"
#include "harness/kv/method.h"
#include "harness/kv/probe_view.h"
#include "harness/kv/question_aware.h"

namespace kvb {

class WindowedKvCache : public KvCache,
                        public QuestionAwareCache,
                        public LookaheadCache,
                        public HiddenStateCache,
                        public DocumentReuseCache,
                        public ProbedCache {
 public:
  // ctx: the whole model's context (config.layer_windows set). inner: the store of the global
  // layers, built for global_layer_context(ctx); null when the model has no global layer.
  WindowedKvCache(const CacheContext& ctx, std::unique_ptr<KvCache> inner);

  std::string name() const override;
  // Passed on to the global layers' store when it has the capability.
  void set_question_tokens(int64_t seq_id, int64_t question_tokens) override;
  void begin_step(const StepBatch& batch) override;
  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void end_prefill(int64_t seq_id) override;
  void release(int64_t seq_id) override;
  void fork(int64_t src_id, int64_t dst_id) override;
  // Exact only while a window layer still holds the rows the shorter sequence's window needs;
  // otherwise refused (they were dropped when they slid out).
  void truncate(int64_t seq_id, int64_t new_len) override;
  int64_t seq_len(int64_t seq_id) const override;
  Footprint footprint() const override;
  std::map<std::string, double> counters() const override;
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;
  bool serves_windows() const override { return true; }
  // The global layers' store's capabilities, passed on (layers renumbered).
  bool wants_lookahead() const override { return inner_ && wanting_lookahead(*inner_); }
  void set_lookahead_rows(const std::vector<uint8_t>& rows) override;
  void layer_hidden(int layer, const at::Tensor& hidden) override;
  const DocumentReuse* document_reuse() const override {
    return inner_ ? document_reuse_of(*inner_) : nullptr;
  }

  const KvCache* inner() const { return inner_.get(); }

 private:
  struct Rows {
    at::Tensor k;  // [n, num_kv_heads, head_dim], post-RoPE, model dtype
    at::Tensor v;  // [n, num_kv_heads, head_dim]
    int64_t n() const { return k.defined() ? k.size(0) : 0; }
  };

  CacheContext ctx_;
  std::unique_ptr<KvCache> inner_;
  std::vector<int64_t> inner_layer_;  // [n_layers]: the inner store's layer, -1 for a window layer
  std::vector<std::map<int64_t, Rows>> held_;  // [n_layers]: per window layer, per sequence
  std::map<int64_t, int64_t> len_;             // tokens each sequence has seen
  std::vector<uint8_t> lookahead_;             // the running step's lookahead rows
};

// The context a method's store gets when the model has window layers: the global layers only,
// renumbered, with config.model_layers naming them. Throws when there is none.
CacheContext global_layer_context(const CacheContext& ctx);

// Wraps `make(inner ctx)` in a WindowedKvCache when ctx's model has window layers (the inner store
// is built for the global layers; none when there are none and `needs_global` is false); otherwise
// returns make(ctx) as it is. `what` names the store in the error for a model without global
// layers.
std::unique_ptr<KvCache> make_window_aware(
    const CacheContext& ctx,
    const std::function<std::unique_ptr<KvCache>(const CacheContext&)>& make, bool needs_global,
    const std::string& what);

// Attention of one sequence's n new queries over its L >= n rows (the last n are the new ones),
// each query seeing only the last `window` rows up to itself.   q: [n, H, D]; k, v: [L, Hk, D].
at::Tensor attend_window(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         float sm_scale, int64_t window);

}  // namespace kvb
