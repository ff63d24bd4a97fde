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
// A model whose every layer is a window (Phi-3-mini-4k: 2047, Mistral-7B-v0.1: 4096) has no global
// layer for a method to compress: the window is the whole cache. There the method's store serves
// every layer (built for the model without its windows). A store that applies windows itself
// (KvCache::serves_windows: the quantization codecs' CodecKvCache, which attends within the window
// and keeps only the window's rows, encoded) gets each layer's window and runs at any length: the
// codec quantizes the window. Any other store (eviction, tiering, sparse attention) runs for as
// long as the windows do not bind: while a sequence holds at most `window` tokens, every query
// sees every earlier token, so the model is plain causal attention and the method compresses it as
// it would any model. A step that would take a sequence past the window is refused (kvb::Error
// naming the model, the window and the store): what the window hides from a query would have to
// leave the method's store too, and such a store's budget is over rows the window already bounds.
// The exact stores (full, paged, static) keep the window layers here as above, at any length.
//
// MethodRegistry::create and make_default_kv wrap every store of such a model; the engine refuses a
// model with window layers on a store that does not apply them (KvCache::serves_windows).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/kv/context_pass.h"
#include "harness/kv/document_reuse.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/lookahead.h"
#include "harness/kv/method.h"
#include "harness/kv/probe_view.h"
#include "harness/kv/question_aware.h"

namespace kvb {

class WindowedKvCache : public KvCache,
                        public QuestionAwareCache,
                        public ContextPassCache,
                        public LookaheadCache,
                        public HiddenStateCache,
                        public DocumentReuseCache,
                        public ProbedCache {
 public:
  // ctx: the whole model's context (config.layer_windows set). inner: the store of the global
  // layers, built for global_layer_context(ctx); null when the model has no global layer. Or, with
  // `inner_within_window` on a model whose every layer is a window: a store of every layer, built
  // for the model without windows, which serves them while no sequence passes the window, or at
  // any length when it applies windows itself (serves_windows).
  WindowedKvCache(const CacheContext& ctx, std::unique_ptr<KvCache> inner,
                  bool inner_within_window = false);

  std::string name() const override;
  // Passed on to the global layers' store when it has the capability (a store without the context
  // pass does nothing here and returns 0, so the protocol's end_prefill after it compresses as a
  // plain prefill would).
  void set_question_tokens(int64_t seq_id, int64_t question_tokens) override;
  int64_t run_context_pass(const ContextPass& pass) override;
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
  // > 0: inner_ serves every layer and sequences may hold at most this many tokens (the smallest
  // window); 0: the window layers are kept here.
  int64_t within_window_ = 0;
  bool inner_slides_ = false;  // within_window_ > 0 and inner_ applies each layer's window itself
  std::vector<int64_t> inner_layer_;  // [n_layers]: the inner store's layer, -1 for a window layer
  std::vector<std::map<int64_t, Rows>> held_;  // [n_layers]: per window layer, per sequence
  std::map<int64_t, int64_t> len_;             // tokens each sequence has seen
  std::vector<uint8_t> lookahead_;             // the running step's lookahead rows
};

// The context a method's store gets when the model has window layers: the global layers only,
// renumbered, with config.model_layers naming them. Throws when there is none.
CacheContext global_layer_context(const CacheContext& ctx);

// Wraps `make(inner ctx)` in a WindowedKvCache when ctx's model has window layers (the inner store
// is built for the global layers; on a model without global layers none when `needs_global` is
// false, else one of every layer that runs within the window); otherwise returns make(ctx) as it
// is. `what` names the store in errors.
std::unique_ptr<KvCache> make_window_aware(
    const CacheContext& ctx,
    const std::function<std::unique_ptr<KvCache>(const CacheContext&)>& make, bool needs_global,
    const std::string& what);

// Attention of one sequence's n new queries over its L >= n rows (the last n are the new ones),
// each query seeing only the last `window` rows up to itself.   q: [n, H, D]; k, v: [L, Hk, D].
at::Tensor attend_window(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         float sm_scale, int64_t window);

}  // namespace kvb
