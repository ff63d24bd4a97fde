// example_window: a complete out-of-tree method. Each sequence keeps only its `window` most recent
// tokens per layer (a sliding window without sinks); older tokens are dropped after every step and their
// memory is released (the buffers are reallocated at the kept size). Attention during a step is exact
// over what is kept plus the step's own tokens.

#include <ATen/ATen.h>

#include <unordered_map>

#include "harness/common/error.h"
#include "harness/kv/attention.h"
#include "harness/kv/plugin.h"

namespace {

class WindowCache : public kvb::KvCache {
 public:
  WindowCache(const kvb::CacheContext& ctx, int64_t window) : ctx_(ctx), window_(window) {}
  std::string name() const override { return "example_window"; }

  void begin_step(const kvb::StepBatch& batch) override {
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_[batch.seq_ids[b]];
      if (s.k.empty()) {
        s.k.resize(ctx_.config.n_layers);
        s.v.resize(ctx_.config.n_layers);
      }
    }
  }

  at::Tensor attend(const kvb::LayerInput& in) override {
    const kvb::StepBatch& batch = *in.batch;
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      const int64_t start = batch.q_indptr[b], n = batch.new_tokens(b);
      at::Tensor k_new = in.k->narrow(0, start, n), v_new = in.v->narrow(0, start, n);
      at::Tensor& K = s.k[in.layer];
      at::Tensor& V = s.v[in.layer];
      K = K.defined() ? at::cat({K, k_new}) : k_new.clone();
      V = V.defined() ? at::cat({V, v_new}) : v_new.clone();
      outs.push_back(kvb::attend_dense(in.q->narrow(0, start, n), K, V, in.sm_scale));
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs);
  }

  void end_step(const kvb::StepBatch& batch) override {
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      for (size_t l = 0; l < s.k.size(); ++l) {
        const int64_t len = s.k[l].size(0);
        if (len > window_) {  // evict: copy the window into a right-sized buffer
          s.k[l] = s.k[l].narrow(0, len - window_, window_).clone();
          s.v[l] = s.v[l].narrow(0, len - window_, window_).clone();
          s.evicted += len - window_;
        }
      }
    }
  }

  void release(int64_t id) override { seqs_.erase(id); }
  void fork(int64_t src, int64_t dst) override {
    Seq copy = seqs_.at(src);
    for (auto& t : copy.k) t = t.clone();
    for (auto& t : copy.v) t = t.clone();
    seqs_[dst] = copy;
  }
  void truncate(int64_t id, int64_t new_len) override {
    Seq& s = seqs_.at(id);
    KVB_CHECK(new_len <= seq_len(id), "example_window: cannot grow by truncating");
    for (size_t l = 0; l < s.k.size(); ++l) {
      s.k[l] = s.k[l].narrow(0, 0, new_len).clone();
      s.v[l] = s.v[l].narrow(0, 0, new_len).clone();
    }
  }
  int64_t seq_len(int64_t id) const override {
    auto it = seqs_.find(id);
    return it == seqs_.end() || it->second.k.empty() || !it->second.k[0].defined() ? 0 : it->second.k[0].size(0);
  }
  kvb::Footprint footprint() const override {
    kvb::Footprint f;
    const int64_t per_token = ctx_.config.kv_bytes_per_token(static_cast<int64_t>(c10::elementSize(ctx_.dtype)));
    for (const auto& [id, s] : seqs_) f.tokens_held += seq_len(id);
    f.device_payload_bytes = f.tokens_held * per_token;
    f.logical_bytes = f.device_payload_bytes;
    return f;
  }
  std::map<std::string, double> counters() const override {
    double evicted = 0;
    for (const auto& [id, s] : seqs_) evicted += static_cast<double>(s.evicted);
    return {{"tokens_evicted", evicted}};
  }

 private:
  struct Seq {
    std::vector<at::Tensor> k, v;  // per layer: [kept, num_kv_heads, head_dim]
    int64_t evicted = 0;
  };
  kvb::CacheContext ctx_;
  int64_t window_;
  std::unordered_map<int64_t, Seq> seqs_;
};

kvb::MethodInfo example_window_info() {
  kvb::MethodInfo m;
  m.name = "example_window";
  m.summary = "example plugin: keep the last `window` tokens of each sequence";
  m.params = {kvb::int_param("window", 64, 1, 1 << 24, "tokens kept per sequence")};
  m.caps.evicts = true;
  return m;
}

}  // namespace

std::unique_ptr<kvb::Protocol> example_prefill_bytes_protocol();  // example_prefill_bytes.cpp

KVB_PLUGIN_ENTRY(registry) {
  registry->add(example_window_info(), [](const kvb::CacheContext& ctx, const nlohmann::json& p) {
    return std::make_unique<WindowCache>(ctx, p["window"].get<int64_t>());
  });
  kvb::ProtocolRegistry::instance().add(example_prefill_bytes_protocol());
}
