// dms: Dynamic Memory Sparsification (Łańcucki et al., NeurIPS 2025, arXiv 2506.05345): learned
// per-KV-head eviction with delayed eviction. An adapter (dms_adapter.h, trained by `kvbench
// dms-train`) gives every token one decision logit per KV head from the layer's hidden state; the
// logit at position t + 1 decides token t. A token stays visible to every query within `window`
// positions whatever its decision, and is physically dropped once it leaves the window if its
// decision says evict, so each KV head keeps its own ragged set: the window plus the older tokens
// it chose to keep.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h since LibTorch 2)

#include <algorithm>
#include <cstring>

#include "harness/common/error.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/method_registry.h"
#include "methods/common/method_listing.h"
#include "methods/common/seq_store.h"
#include "methods/dms/dms_adapter.h"

namespace kvb {
namespace {

enum class Decisions { kAdapter, kKeepAll, kEvictAll };

struct DmsHead {
  std::vector<int32_t> pos;    // token positions, ascending
  std::vector<uint8_t> evict;  // 1: its decision says evict (dropped once out of the window)
  std::vector<float> k, v;     // [entries, head_dim] fp32
};
struct DmsLayer {
  std::vector<DmsHead> heads;
};
struct DmsSeq {
  DmsSeq(int64_t n_layers, int64_t n_kv_heads)
      : layers(static_cast<size_t>(n_layers), DmsLayer{std::vector<DmsHead>(n_kv_heads)}) {}
  std::vector<DmsLayer> layers;
  int64_t len = 0;
};

class DmsKvCache : public SeqStore<DmsSeq>, public HiddenStateCache {
 public:
  DmsKvCache(const CacheContext& ctx, std::shared_ptr<const dms::Adapter> adapter, int64_t window,
             Decisions mode)
      : SeqStore("dms"), ctx_(ctx), adapter_(std::move(adapter)), window_(window), mode_(mode) {}

  void layer_hidden(int layer, const at::Tensor& hidden) override {
    hidden_ = hidden;
    hidden_layer_ = layer;
  }

  at::Tensor attend(const LayerInput& in) override {
    const StepBatch& batch = *in.batch;
    const auto& c = ctx_.config;
    const int64_t D = c.head_dim, Hkv = c.n_kv_heads, G = c.group_size();
    at::Tensor alpha;  // [T, Hkv]: evict when > 0
    if (mode_ == Decisions::kAdapter) {
      KVB_CHECK(hidden_.defined() && hidden_layer_ == in.layer,
                "dms: the engine passed no hidden state to layer ", in.layer);
      at::NoGradGuard ng;
      alpha = adapter_->alpha(in.layer, hidden_).contiguous();
      hidden_ = at::Tensor();  // the forward's buffer: used for this layer only
    }
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b], past = s.len;
      at::Tensor q = in.q->narrow(0, start, n).to(at::kFloat).contiguous();  // [n, Hq, D]
      at::Tensor kn = in.k->narrow(0, start, n).to(at::kFloat).contiguous();
      at::Tensor vn = in.v->narrow(0, start, n).to(at::kFloat).contiguous();
      at::Tensor out = at::empty({n, c.n_heads, D}, at::kFloat);
      for (int64_t h = 0; h < Hkv; ++h) {
        Head& hd = s.layers[in.layer].heads[h];
        const int64_t base = static_cast<int64_t>(hd.pos.size());
        for (int64_t i = 0; i < n; ++i) {
          hd.pos.push_back(static_cast<int32_t>(past + i));
          hd.evict.push_back(0);
          const float* kr = kn.data_ptr<float>() + (i * Hkv + h) * D;
          const float* vr = vn.data_ptr<float>() + (i * Hkv + h) * D;
          hd.k.insert(hd.k.end(), kr, kr + D);
          hd.v.insert(hd.v.end(), vr, vr + D);
          // Position past + i decides token past + i - 1 (the entry before it).
          if (base + i - 1 >= 0)
            hd.evict[base + i - 1] =
                decide(alpha.defined() ? alpha.data_ptr<float>() + (start + i) * Hkv + h : nullptr);
        }
        // Queries past .. past + n - 1 over the head's entries, with the delayed mask.
        const int64_t m = static_cast<int64_t>(hd.pos.size());
        auto f32 = at::TensorOptions().dtype(at::kFloat);
        at::Tensor K = at::from_blob(hd.k.data(), {m, D}, f32);
        at::Tensor V = at::from_blob(hd.v.data(), {m, D}, f32);
        at::Tensor pos = at::from_blob(hd.pos.data(), {m}, at::TensorOptions().dtype(at::kInt));
        at::Tensor ev = at::from_blob(hd.evict.data(), {m}, at::TensorOptions().dtype(at::kByte));
        at::Tensor qpos = at::arange(past, past + n, at::TensorOptions().dtype(at::kInt));
        at::Tensor dist = qpos.unsqueeze(1) - pos.unsqueeze(0);  // [n, m]
        at::Tensor hidden_mask =
            dist.lt(0).logical_or(ev.to(at::kBool).unsqueeze(0).logical_and(dist.gt(window_)));
        at::Tensor qh = q.narrow(1, h * G, G);                   // [n, G, D]
        at::Tensor sc = at::matmul(qh, K.t()).mul(in.sm_scale);  // [n, G, m]
        sc = sc.masked_fill(hidden_mask.unsqueeze(1), -std::numeric_limits<float>::infinity());
        out.narrow(1, h * G, G).copy_(at::matmul(at::softmax(sc, -1), V));  // [n, G, D]
      }
      outs.push_back(out.to(in.q->scalar_type()));
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  }

  void end_step(const StepBatch& batch) override {
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      s.len += batch.new_tokens(b);
      seen_ +=
          static_cast<double>(batch.new_tokens(b)) * ctx_.config.n_layers * ctx_.config.n_kv_heads;
      // Evict-decided tokens that every future query sees beyond the window leave for good.
      for (auto& y : s.layers)
        for (auto& hd : y.heads) drop(hd, s.len);
    }
  }

  void truncate(int64_t seq_id, int64_t new_len) override {
    Seq& s = seqs_.truncating(seq_id, new_len);
    const int64_t D = ctx_.config.head_dim;
    for (auto& y : s.layers)
      for (auto& hd : y.heads) {
        size_t keep = 0;
        while (keep < hd.pos.size() && hd.pos[keep] < new_len) ++keep;
        hd.pos.resize(keep);
        hd.evict.resize(keep);
        hd.k.resize(keep * D);
        hd.v.resize(keep * D);
        // The newest kept token's decision came from a position that is gone: pending again.
        if (keep > 0 && hd.pos[keep - 1] == new_len - 1) hd.evict[keep - 1] = 0;
      }
    s.len = new_len;
  }

  Footprint footprint() const override {
    const int64_t D = ctx_.config.head_dim;
    return fp32_footprint(ctx_.config, [D](const Seq& s, Footprint* f) {
      for (const auto& y : s.layers)
        for (const auto& hd : y.heads) {
          const auto m = static_cast<int64_t>(hd.pos.size());
          f->device_payload_bytes += 2 * m * D * 4;  // K and V rows, fp32
          f->model_dtype_device_bytes += 2 * m * D * 4;
          f->device_index_bytes += 4 * m;  // token positions
          f->device_metadata_bytes += m;   // decision flags
        }
    });
  }

  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m = {{"window", static_cast<double>(window_)}};
    double kept = 0, live_seen = 0, flagged = 0, decided = 0, cr_min = 1e30, cr_max = 0;
    for (const auto& [id, s] : seqs_)
      for (const auto& y : s.layers)
        for (const auto& hd : y.heads) {
          kept += static_cast<double>(hd.pos.size());
          live_seen += static_cast<double>(s.len);
          for (uint8_t e : hd.evict) flagged += e;
          decided += static_cast<double>(hd.pos.size());
          if (!hd.pos.empty()) {
            const double cr = static_cast<double>(s.len) / static_cast<double>(hd.pos.size());
            cr_min = std::min(cr_min, cr);
            cr_max = std::max(cr_max, cr);
          }
        }
    if (kept > 0) {
      m["realized_cr"] = live_seen / kept;  // tokens seen / kept, over heads and layers
      m["realized_cr_head_min"] = cr_min;
      m["realized_cr_head_max"] = cr_max;
      m["kept_flagged_fraction"] = flagged / decided;  // still in the window, decided to go
    }
    m["decisions_evict_fraction"] = decisions_ > 0 ? evict_decisions_ / decisions_ : 0;
    return m;
  }

 private:
  using Head = DmsHead;
  using Seq = DmsSeq;

  Seq new_seq(int64_t) override { return Seq(ctx_.config.n_layers, ctx_.config.n_kv_heads); }

  // a: the decision logit (adapter mode), else null.
  uint8_t decide(const float* a) {
    uint8_t e = 0;
    switch (mode_) {
      case Decisions::kKeepAll:
        e = 0;
        break;
      case Decisions::kEvictAll:
        e = 1;
        break;
      case Decisions::kAdapter:
        e = *a > 0.0f ? 1 : 0;
        break;
    }
    decisions_ += 1;
    evict_decisions_ += e;
    return e;
  }

  void drop(Head& hd, int64_t len) {
    const int64_t D = ctx_.config.head_dim;
    size_t w = 0;
    for (size_t r = 0; r < hd.pos.size(); ++r) {
      const bool gone = hd.evict[r] && len - hd.pos[r] > window_;
      if (gone) continue;
      if (w != r) {
        hd.pos[w] = hd.pos[r];
        hd.evict[w] = hd.evict[r];
        std::memmove(&hd.k[w * D], &hd.k[r * D], static_cast<size_t>(D) * sizeof(float));
        std::memmove(&hd.v[w * D], &hd.v[r * D], static_cast<size_t>(D) * sizeof(float));
      }
      ++w;
    }
    hd.pos.resize(w);
    hd.evict.resize(w);
    hd.k.resize(w * D);
    hd.v.resize(w * D);
  }

  CacheContext ctx_;
  std::shared_ptr<const dms::Adapter> adapter_;
  int64_t window_;
  Decisions mode_;
  at::Tensor hidden_;  // [T, dim]: the residual stream entering layer hidden_layer_ (layer_hidden)
  int hidden_layer_ = -1;
  double seen_ = 0, decisions_ = 0, evict_decisions_ = 0;
};

MethodInfo dms_info() {
  MethodInfo m = method_listing(
      "dms",
      "DMS: learned per-KV-head eviction decisions (an adapter on the hidden state) with delayed "
      "eviction: a token leaves only once it is out of the window",
      "Łańcucki et al., Inference-Time Hyper-Scaling with KV Cache Compression (Dynamic Memory "
      "Sparsification), NeurIPS 2025 (arXiv 2506.05345)",
      {string_param("adapter", "", {},
                    "the decision adapter from `kvbench dms-train` (safetensors); required with "
                    "decisions=adapter"),
       int_param("window", 0, 0, 1 << 24,
                 "delayed-eviction window w (0: the adapter's, which it was trained with)"),
       string_param(
           "decisions", "adapter", {"adapter", "keep_all", "evict_all"},
           "adapter: the learned decisions; keep_all: nothing evicted (the full cache); "
           "evict_all: every token evicted once out of the window (a plain sliding window)")});
  m.caps.evicts = true;
  m.caps.needs_calibration = true;
  m.caps.cpu_only = true;  // the adapter's decisions run in host fp32 code
  m.caps.fp32_only = true;
  return m;
}

std::unique_ptr<KvCache> make_dms(const CacheContext& ctx, const nlohmann::json& p) {
  const std::string path = p["adapter"];
  const std::string d = p["decisions"];
  const Decisions mode = d == "keep_all"    ? Decisions::kKeepAll
                         : d == "evict_all" ? Decisions::kEvictAll
                                            : Decisions::kAdapter;
  int64_t window = p["window"].get<int64_t>();
  std::shared_ptr<const dms::Adapter> adapter;
  if (mode == Decisions::kAdapter) {
    KVB_CHECK(!path.empty(),
              "method dms.adapter: no adapter given (train one with `kvbench dms-train`, or set "
              "decisions=keep_all / evict_all)");
    adapter = std::make_shared<dms::Adapter>(dms::Adapter::load(path, ctx.config));
    if (window == 0) window = adapter->window;
  }
  KVB_CHECK(window >= 1, "method dms.window: ", window,
            " (give a window of at least 1 token when no adapter sets it)");
  return std::make_unique<DmsKvCache>(ctx, adapter, window, mode);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(dms, kvb::dms_info, kvb::make_dms);
