#include "harness/kv/windowed_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"

namespace kvb {

at::Tensor attend_window(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         float sm_scale, int64_t window) {
  const int64_t n = q.size(0), L = k.size(0);
  const int64_t past = L - n;
  // Every query sees every row up to itself when the last query's window reaches back to row 0:
  // plain causal attention (the decode case, where a layer holds window - 1 rows plus the new one).
  if (L <= window) return attend_dense(q, k, v, sm_scale);
  const int64_t H = q.size(1), D = q.size(2), Hk = k.size(1), G = H / Hk;
  at::Tensor K = k.permute({1, 0, 2});  // [Hk, L, D]
  at::Tensor V = v.permute({1, 0, 2});
  at::Tensor qh = q.reshape({n, Hk, G, D}).permute({1, 2, 0, 3}).reshape({Hk, G * n, D});
  at::Tensor s = at::bmm(qh.to(at::kFloat), K.to(at::kFloat).transpose(1, 2)).mul_(sm_scale);
  auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
  at::Tensor j = at::arange(L, opts).unsqueeze(0);           // [1, L]
  at::Tensor i = (at::arange(n, opts) + past).unsqueeze(1);  // [n, 1]
  at::Tensor hidden = (j > i).logical_or_(j <= i - window);  // [n, L]
  s.view({Hk, G, n, L}).masked_fill_(hidden, -std::numeric_limits<float>::infinity());
  at::Tensor pr = at::softmax(s, -1);
  at::Tensor o = at::bmm(pr, V.to(at::kFloat)).to(q.scalar_type());  // [Hk, G*n, D]
  return o.view({Hk, G, n, D}).permute({2, 0, 1, 3}).reshape({n, H, D});
}

CacheContext global_layer_context(const CacheContext& ctx) {
  const ModelConfig& c = ctx.config;
  CacheContext g = ctx;
  g.config.model_layers.clear();
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (!c.is_window_layer(l)) g.config.model_layers.push_back(l);
  KVB_CHECK(!g.config.model_layers.empty(), c.name, ": every layer is a sliding-window layer");
  g.config.n_layers = static_cast<int64_t>(g.config.model_layers.size());
  g.config.layer_windows.clear();
  return g;
}

std::unique_ptr<KvCache> make_window_aware(
    const CacheContext& ctx,
    const std::function<std::unique_ptr<KvCache>(const CacheContext&)>& make, bool needs_global,
    const std::string& what) {
  if (ctx.config.n_window_layers() == 0) return make(ctx);
  std::unique_ptr<KvCache> inner;
  if (ctx.config.n_window_layers() < ctx.config.n_layers) {
    inner = make(global_layer_context(ctx));
  } else if (needs_global) {
    // No global layer: the method's store takes every layer, as the model is while no sequence
    // passes the window (the class comment says why not beyond).
    CacheContext all = ctx;
    all.config.layer_windows.clear();
    return std::make_unique<WindowedKvCache>(ctx, make(all), /*inner_within_window=*/true);
  }
  return std::make_unique<WindowedKvCache>(ctx, std::move(inner));
}

void WindowedKvCache::set_question_tokens(int64_t seq_id, int64_t question_tokens) {
  if (auto* q = dynamic_cast<QuestionAwareCache*>(inner_.get()))
    q->set_question_tokens(seq_id, question_tokens);
}

int64_t WindowedKvCache::run_context_pass(const ContextPass& pass) {
  auto* c = dynamic_cast<ContextPassCache*>(inner_.get());
  return c ? c->run_context_pass(pass) : 0;
}

void WindowedKvCache::set_lookahead_rows(const std::vector<uint8_t>& rows) {
  lookahead_ = rows;
  if (LookaheadCache* l = inner_ ? wanting_lookahead(*inner_) : nullptr)
    l->set_lookahead_rows(rows);
}

void WindowedKvCache::layer_hidden(int layer, const at::Tensor& hidden) {
  auto* h = dynamic_cast<HiddenStateCache*>(inner_.get());
  if (h && inner_layer_.at(layer) >= 0)
    h->layer_hidden(static_cast<int>(inner_layer_[layer]), hidden);
}

WindowedKvCache::WindowedKvCache(const CacheContext& ctx, std::unique_ptr<KvCache> inner,
                                 bool inner_within_window)
    : ctx_(ctx), inner_(std::move(inner)) {
  const ModelConfig& c = ctx_.config;
  KVB_ASSERT(c.n_window_layers() > 0, "windowed_kv_cache", c.name, " has no window layers");
  const int64_t globals = c.n_layers - c.n_window_layers();
  inner_layer_.assign(c.n_layers, -1);
  held_.resize(c.n_layers);
  if (inner_within_window) {
    KVB_ASSERT(globals == 0 && inner_ != nullptr, "windowed_kv_cache",
               "a store within the window needs a model of window layers only, and the store");
    within_window_ = *std::min_element(c.layer_windows.begin(), c.layer_windows.end());
    inner_slides_ = inner_->serves_windows();
    for (int64_t l = 0; l < c.n_layers; ++l) inner_layer_[l] = l;
    return;
  }
  KVB_ASSERT((globals > 0) == (inner_ != nullptr), "windowed_kv_cache", c.name, " has ", globals,
             " global layers but ", inner_ ? "an" : "no", " inner store");
  int64_t g = 0;
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (!c.is_window_layer(l)) inner_layer_[l] = g++;
}

std::string WindowedKvCache::name() const {
  return inner_ ? inner_->name() : std::string("window");
}

void WindowedKvCache::begin_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const int64_t s = batch.seq_ids[b];
    auto it = len_.find(s);
    const int64_t have = it == len_.end() ? 0 : it->second;
    KVB_ASSERT(have == batch.past_lens[b], "windowed_kv_cache", "sequence ", s, " holds ", have,
               " tokens but the step says ", batch.past_lens[b]);
    // Within the window every query sees every earlier token; past it, it would not, and a store
    // that does not apply windows itself has no way to let rows go as the window does.
    KVB_CHECK(
        within_window_ == 0 || inner_slides_ || have + batch.new_tokens(b) <= within_window_,
        ctx_.config.name, ": a sequence reaches ", have + batch.new_tokens(b),
        " tokens, past the sliding window (", within_window_,
        ") that every layer of the model has; the method's store (", inner_->name(),
        ") compresses every layer and does not apply a sliding window, so it runs only while "
        "no sequence passes the window (the exact stores and the stores that apply the window "
        "themselves, the quantization codecs' codec store, run at any length)");
  }
  if (inner_) inner_->begin_step(batch);
}

at::Tensor WindowedKvCache::attend(const LayerInput& in) {
  const int64_t l = in.layer;
  KVB_ASSERT(l >= 0 && l < ctx_.config.n_layers, "windowed_kv_cache", "layer ", l, " out of range");
  if (inner_layer_[l] >= 0) {
    LayerInput g = in;
    g.layer = static_cast<int>(inner_layer_[l]);
    // A global layer's store sees no window; a store of every layer that applies windows itself
    // gets the layer's.
    g.window = inner_slides_ ? ctx_.config.layer_windows[l] : 0;
    return inner_->attend(g);
  }
  const int64_t W = ctx_.config.layer_windows[l];
  const StepBatch& batch = *in.batch;
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const int64_t s = batch.seq_ids[b];
    const int64_t start = batch.q_indptr[b], n = batch.new_tokens(b);
    Rows& r = held_[l][s];
    at::Tensor k_new = in.k->narrow(0, start, n), v_new = in.v->narrow(0, start, n);
    at::Tensor K = r.n() ? at::cat({r.k, k_new}) : k_new.contiguous();
    at::Tensor V = r.n() ? at::cat({r.v, v_new}) : v_new.contiguous();
    outs.push_back(attend_window(in.q->narrow(0, start, n), K, V, in.sm_scale, W));
    // Keep the rows the next query's window can reach: the last W - 1 of those kept (a lookahead
    // row is attended, not kept).
    const int64_t keep_total = r.n() + kept_rows(batch, lookahead_, b);
    const int64_t keep = std::min<int64_t>(keep_total, W - 1);
    r.k = K.narrow(0, keep_total - keep, keep).clone();
    r.v = V.narrow(0, keep_total - keep, keep).clone();
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs);
}

void WindowedKvCache::end_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b)
    len_[batch.seq_ids[b]] += kept_rows(batch, lookahead_, b);
  if (inner_) inner_->end_step(batch);
}

void WindowedKvCache::end_prefill(int64_t seq_id) {
  if (inner_) inner_->end_prefill(seq_id);
}

void WindowedKvCache::release(int64_t seq_id) {
  for (auto& m : held_) m.erase(seq_id);
  len_.erase(seq_id);
  if (inner_) inner_->release(seq_id);
}

void WindowedKvCache::fork(int64_t src_id, int64_t dst_id) {
  for (auto& m : held_) {
    auto it = m.find(src_id);
    if (it != m.end()) m[dst_id] = it->second;  // tensors are never written in place: shared
  }
  auto it = len_.find(src_id);
  len_[dst_id] = it == len_.end() ? 0 : it->second;
  if (inner_) inner_->fork(src_id, dst_id);
}

void WindowedKvCache::truncate(int64_t seq_id, int64_t new_len) {
  auto it = len_.find(seq_id);
  const int64_t len = it == len_.end() ? 0 : it->second;
  KVB_CHECK(new_len >= 0 && new_len <= len, "WindowedKvCache: cannot truncate sequence ", seq_id,
            " of ", len, " tokens to ", new_len);
  for (int64_t l = 0; l < ctx_.config.n_layers; ++l) {
    if (inner_layer_[l] >= 0) continue;
    auto h = held_[l].find(seq_id);
    if (h == held_[l].end()) continue;
    Rows& r = h->second;
    const int64_t drop = len - new_len;
    const int64_t need = std::min<int64_t>(new_len, ctx_.config.layer_windows[l] - 1);
    KVB_CHECK(r.n() - drop >= need, "WindowedKvCache: cannot truncate sequence ", seq_id, " to ",
              new_len, " tokens: window layer ", l, " no longer holds the rows its window needs");
    const int64_t keep = r.n() - drop;
    r.k = r.k.narrow(0, 0, keep).clone();
    r.v = r.v.narrow(0, 0, keep).clone();
  }
  len_[seq_id] = new_len;
  if (inner_) inner_->truncate(seq_id, new_len);
}

int64_t WindowedKvCache::seq_len(int64_t seq_id) const {
  if (inner_) return inner_->seq_len(seq_id);
  auto it = len_.find(seq_id);
  return it == len_.end() ? 0 : it->second;
}

Footprint WindowedKvCache::footprint() const {
  Footprint f = inner_ ? inner_->footprint() : Footprint{};
  int64_t window_bytes = 0;
  for (const auto& layer : held_)
    for (const auto& [s, r] : layer)
      if (r.n()) window_bytes += 2 * r.k.numel() * static_cast<int64_t>(r.k.element_size());
  // The window rows are dense, in the model dtype, on the device, and all live.
  f.device_payload_bytes += window_bytes;
  f.logical_bytes += window_bytes;
  if (inner_) {
    if (f.model_dtype_device_bytes >= 0) f.model_dtype_device_bytes += window_bytes;
  } else {
    f.model_dtype_device_bytes = window_bytes;
    for (const auto& [s, n] : len_) f.tokens_held += n;
  }
  return f;
}

std::map<std::string, double> WindowedKvCache::counters() const {
  std::map<std::string, double> c = inner_ ? inner_->counters() : std::map<std::string, double>{};
  int64_t rows = 0;
  for (const auto& layer : held_)
    for (const auto& [s, r] : layer) rows += r.n();
  c["window_layers"] = static_cast<double>(ctx_.config.n_window_layers());
  c["window_rows_held"] = static_cast<double>(rows);
  return c;
}

std::vector<HeadSnapshot> WindowedKvCache::probe_view(int layer, int64_t seq_id) const {
  KVB_ASSERT(layer >= 0 && layer < ctx_.config.n_layers, "windowed_kv_cache", "layer ", layer,
             " out of range");
  if (inner_layer_[layer] >= 0)
    return probe_view_of(*inner_, static_cast<int>(inner_layer_[layer]), seq_id);
  std::vector<HeadSnapshot> out;
  auto h = held_[layer].find(seq_id);
  if (h == held_[layer].end() || !h->second.n()) return out;
  const Rows& r = h->second;
  const int64_t len = len_.at(seq_id);
  at::Tensor index = at::arange(len - r.n(), len, at::TensorOptions().dtype(at::kLong));
  for (int64_t kh = 0; kh < r.k.size(1); ++kh) {
    HeadSnapshot s;
    s.k = r.k.select(1, kh).to(at::kCPU, at::kFloat);
    s.v = r.v.select(1, kh).to(at::kCPU, at::kFloat);
    s.index = index;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvb
