// specache: SpeCache (Jie et al., ICML 2025, arXiv 2503.16163): a low-bit KIVI copy of the whole
// cache on the device, the full-precision copy in host memory, and at each decode step the top-k
// most-attended positions of every KV head swapped in exact from the host, predicted one step ahead
// so the transfer can overlap compute. Nothing is dropped.
//
// Here (see README.md): the low-bit copy is the KIVI codec (methods/common/kv_codec.h), the host
// copy fp16 rows in host memory (the ledger's host tier), and the top-k is chosen by a `predictor`:
//   speculative  the paper's: every decode step runs two rows, the real token and a speculative one
//                (the engine's guess of the next token, KvCache::wants_lookahead); the speculative
//                row's query picks the next step's top-k, and its KV is thrown away. The first
//                decode step after a prompt is preceded by a lookahead-only row (pre-decoding).
//   previous     the previous decode step's query (one step ahead without a speculative token)
//   oracle       the current query (a speculative token that is always right: the upper bound)
// Every decode step also scores the predicted and the true top-k when it can and records their
// overlap; with speculative tokens, how often the guess was the real next token.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "harness/common/error.h"
#include "harness/kv/attention.h"
#include "harness/kv/lookahead.h"
#include "harness/kv/method_registry.h"
#include "kvb/kernels/half.h"
#include "methods/common/kv_codec.h"
#include "methods/common/method_listing.h"
#include "methods/common/seq_store.h"

namespace kvb {
namespace {

enum class Predictor { kSpeculative, kPrevious, kOracle };
const EnumName<Predictor> kPredictors[] = {{Predictor::kSpeculative, "speculative"},
                                           {Predictor::kPrevious, "previous"},
                                           {Predictor::kOracle, "oracle"}};

struct SpecacheOptions {
  int32_t bits = 2;
  int64_t group = 64;
  int64_t residual = 64;
  int64_t top_k = 64;
  Predictor predictor = Predictor::kSpeculative;
};

// Top-k stored positions of one KV head for the query rows q[g] (g in the head's group), by the
// group-mean of softmax probabilities over the stored keys plus the current key (which is then
// left out). K: [len, W] fp32 rows; kcur: the current key row [W]. Ties go to the lower position.
std::vector<int64_t> top_positions(const float* q, int64_t group, const float* K, const float* kcur,
                                   int64_t len, int64_t W, int64_t head, int64_t D, float scale,
                                   int64_t k, std::vector<float>& logit, std::vector<float>& prob) {
  logit.resize(static_cast<size_t>(len + 1));
  prob.assign(static_cast<size_t>(len), 0.0f);
  for (int64_t g = 0; g < group; ++g) {
    const float* qg = q + g * D;
    float mx = -INFINITY;
    for (int64_t j = 0; j <= len; ++j) {
      const float* kj = (j < len ? K + j * W : kcur) + head * D;
      float s = 0;
      for (int64_t c = 0; c < D; ++c) s += qg[c] * kj[c];
      logit[j] = s * scale;
      mx = std::max(mx, logit[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j <= len; ++j) sum += std::exp(static_cast<double>(logit[j] - mx));
    for (int64_t j = 0; j < len; ++j)
      prob[j] += static_cast<float>(std::exp(static_cast<double>(logit[j] - mx)) / sum);
  }
  std::vector<int64_t> idx(static_cast<size_t>(len));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t kk = std::min(k, len);
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int64_t a, int64_t b) {
    return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
  });
  idx.resize(static_cast<size_t>(kk));
  std::sort(idx.begin(), idx.end());
  return idx;
}

struct SpecacheLayer {
  StreamBox k, v;                // the low-bit device copy
  std::vector<uint16_t> hk, hv;  // the host copy: fp16 rows [rows, kv_dim]
  std::vector<float> prev_q;     // the previous decode step's query rows [num_qo_heads * D]
};
struct SpecacheSeq {
  std::vector<SpecacheLayer> layers;
  int64_t len = 0;
  // Layer 0's pre-RoPE key of the last speculative row: it depends on the token alone, so the
  // next step's real row has the same key exactly when the guess was right.
  std::vector<float> guess_k;
};

class SpecacheKvCache : public SeqStore<SpecacheSeq>, public LookaheadCache {
 public:
  SpecacheKvCache(const CacheContext& ctx, SpecacheOptions o)
      : SeqStore("specache"), ctx_(ctx), o_(o) {
    const auto& c = ctx_.config;
    const int64_t cg = adapt_channel_group(o_.group, c.head_dim);
    codec_ = std::make_shared<QuantCodec>(
        "specache-" + std::to_string(o_.bits) + "bit",
        QuantCodec::kivi_key(o_.bits, o_.group, o_.residual, RowDtype::kF16),
        QuantCodec::kivi_value(o_.bits, cg, o_.residual, RowDtype::kF16));
    QuantCodec::validate(codec_->spec(KvKind::kKey, 0), c.head_dim, "method specache keys");
    QuantCodec::validate(codec_->spec(KvKind::kValue, 0), c.head_dim, "method specache values");
    channel_group_ = cg;
  }

  bool wants_lookahead() const override { return o_.predictor == Predictor::kSpeculative; }
  void set_lookahead_rows(const std::vector<uint8_t>& rows) override { lookahead_ = rows; }

  at::Tensor attend(const LayerInput& in) override {
    const StepBatch& batch = *in.batch;
    const auto& c = ctx_.config;
    const int64_t W = c.kv_dim(), D = c.head_dim, Hkv = c.n_kv_heads;
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      Layer& y = s.layers[in.layer];
      const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b], len = s.len, L = len + n;
      at::Tensor q = in.q->narrow(0, start, n);
      at::Tensor qf = q.to(at::kFloat).contiguous();
      at::Tensor kn = in.k->narrow(0, start, n).to(at::kFloat).contiguous();
      at::Tensor vn = in.v->narrow(0, start, n).to(at::kFloat).contiguous();
      k_scratch_.resize(static_cast<size_t>(L * W));
      v_scratch_.resize(static_cast<size_t>(L * W));
      y.k.p->decode(k_scratch_.data());
      y.v.p->decode(v_scratch_.data());
      std::memcpy(k_scratch_.data() + len * W, kn.data_ptr<float>(),
                  static_cast<size_t>(n * W * 4));
      std::memcpy(v_scratch_.data() + len * W, vn.data_ptr<float>(),
                  static_cast<size_t>(n * W * 4));
      const float* qp = qf.data_ptr<float>();
      const int64_t qrow = c.n_heads * D;
      const bool oracle = o_.predictor == Predictor::kOracle;
      if (!lookahead_.empty() && lookahead_[b]) {
        // A speculative decode step: [x_t, guess] (or the guess-making [x_t] alone). Both rows
        // read one mix, predicted by the last speculative query; only x_t's KV is kept.
        const int64_t real = n - 1;
        const float* pred = y.prev_q.empty() ? nullptr : y.prev_q.data();
        if (in.layer == 0 && real == 1) {
          ++decode_steps_;
          score_guess(s, in, start);
        }
        decode_swap_ = real == 1;  // the guess-making row alone is not a decoded token
        swap_in_exact(y, k_scratch_.data(), v_scratch_.data(), pred, qp, real == 1 ? pred : nullptr,
                      kn.data_ptr<float>(), len, in.sm_scale);
        decode_swap_ = false;
        outs.push_back(
            attend_dense_rows(q, k_scratch_.data(), v_scratch_.data(), L, Hkv, D, in.sm_scale));
        y.prev_q.assign(qp + (n - 1) * qrow, qp + n * qrow);
        y.k.p->append(kn.data_ptr<float>(), real);
        y.v.p->append(vn.data_ptr<float>(), real);
        append_host(y.hk, kn.data_ptr<float>(), real * W);
        append_host(y.hv, vn.data_ptr<float>(), real * W);
        continue;
      }
      if (len == 0) {  // a prompt from its start: exact, and no prediction for the next step
        y.prev_q.clear();
        outs.push_back(
            attend_dense_rows(q, k_scratch_.data(), v_scratch_.data(), L, Hkv, D, in.sm_scale));
      } else if (n == 1) {  // a decode step: swap in place, then attend
        const float* prev = y.prev_q.empty() ? nullptr : y.prev_q.data();
        if (in.layer == 0) ++decode_steps_;
        decode_swap_ = true;
        swap_in_exact(y, k_scratch_.data(), v_scratch_.data(), oracle ? qp : prev, qp, prev,
                      kn.data_ptr<float>(), len, in.sm_scale);
        decode_swap_ = false;
        outs.push_back(
            attend_dense_rows(q, k_scratch_.data(), v_scratch_.data(), L, Hkv, D, in.sm_scale));
      } else {
        // Several rows after a history (a later prompt chunk, a qa question): each row reads its
        // own mix, predicted by the row before it (the first by the last decode query, if any).
        std::vector<at::Tensor> rows;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t Li = len + i + 1;
          row_k_.assign(k_scratch_.begin(), k_scratch_.begin() + Li * W);
          row_v_.assign(v_scratch_.begin(), v_scratch_.begin() + Li * W);
          const float* prev =
              i > 0 ? qp + (i - 1) * qrow : (y.prev_q.empty() ? nullptr : y.prev_q.data());
          swap_in_exact(y, row_k_.data(), row_v_.data(), oracle ? qp + i * qrow : prev,
                        qp + i * qrow, prev, kn.data_ptr<float>() + i * W, len, in.sm_scale);
          rows.push_back(attend_dense_rows(q.narrow(0, i, 1), row_k_.data(), row_v_.data(), Li, Hkv,
                                           D, in.sm_scale));
        }
        outs.push_back(at::cat(rows, 0));
      }
      if (len > 0) y.prev_q.assign(qp + (n - 1) * qrow, qp + n * qrow);
      // The new rows enter both tiers: low-bit on the device, fp16 on the host.
      y.k.p->append(kn.data_ptr<float>(), n);
      y.v.p->append(vn.data_ptr<float>(), n);
      append_host(y.hk, kn.data_ptr<float>(), n * W);
      append_host(y.hv, vn.data_ptr<float>(), n * W);
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  }

  void end_step(const StepBatch& batch) override { seqs_.end_step(batch, lookahead_); }
  void truncate(int64_t seq_id, int64_t new_len) override {
    Seq& s = seqs_.truncating(seq_id, new_len);
    const auto keep = static_cast<size_t>(new_len * ctx_.config.kv_dim());
    for (auto& y : s.layers) {
      y.k.p->truncate(new_len);
      y.v.p->truncate(new_len);
      y.hk.resize(keep);
      y.hv.resize(keep);
      y.prev_q.clear();
    }
    s.guess_k.clear();
    s.len = new_len;
  }

  Footprint footprint() const override {
    const auto& c = ctx_.config;
    CodecBytes cb;
    Footprint f;
    const int64_t row_bytes = c.head_dim * 2;  // one fp16 row of one head
    for (const auto& [id, s] : seqs_) {
      for (const auto& y : s.layers) {
        cb += y.k.p->bytes();
        cb += y.v.p->bytes();
        f.host_bytes += static_cast<int64_t>((y.hk.size() + y.hv.size()) * sizeof(uint16_t));
      }
      // The device buffer of swapped-in exact rows: top_k K and V rows per layer and KV head.
      const int64_t used = std::min(o_.top_k, s.len);
      f.device_payload_bytes += c.n_layers * c.n_kv_heads * 2 * used * row_bytes;
      f.device_reserved_bytes += c.n_layers * c.n_kv_heads * 2 * (o_.top_k - used) * row_bytes;
      f.tokens_held += s.len;
    }
    f.device_payload_bytes += cb.payload_bytes();
    f.device_metadata_bytes = cb.metadata_bytes;
    f.device_index_bytes = cb.index_bytes;
    f.device_reserved_bytes += cb.reserved_bytes;
    f.model_dtype_device_bytes = 0;  // codes and fp16 rows (device buffer and host copy)
    f.logical_bytes =
        f.tokens_held * c.kv_bytes_per_token(static_cast<int64_t>(c10::elementSize(ctx_.dtype)));
    return f;
  }

  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m = codec_->describe();
    m["top_k"] = static_cast<double>(o_.top_k);
    m["predictor_oracle"] = o_.predictor == Predictor::kOracle ? 1 : 0;
    m["predictor_speculative"] = o_.predictor == Predictor::kSpeculative ? 1 : 0;
    if (guesses_ > 0) m["speculative_hit_rate"] = guess_hits_ / guesses_;
    m["v_group_size"] = static_cast<double>(channel_group_);
    m["swap_steps"] = swap_steps_;  // (layer, sequence) decode reads that swapped rows in
    m["lowbit_only_reads"] =
        lowbit_only_;  // ... that had no prediction (first step after a prompt)
    m["exact_rows_per_head_step"] = swap_heads_ > 0 ? swapped_rows_ / swap_heads_ : 0;
    m["host_to_device_bytes_per_step"] =
        decode_steps_ > 0 ? swapped_rows_ * 2 * ctx_.config.head_dim * 2 / decode_steps_ : 0;
    // The shared name (kv_cache.h) counts decode steps' swaps only: a later prompt chunk swaps
    // rows too, which host_to_device_bytes_per_step above folds in.
    m["decode_h2d_bytes_per_token"] =
        decode_steps_ > 0 ? decode_swapped_rows_ * 2 * ctx_.config.head_dim * 2 / decode_steps_ : 0;
    if (overlap_n_ > 0) m["predictor_overlap"] = overlap_sum_ / overlap_n_;
    CodecBytes cb;
    for (const auto& [id, s] : seqs_)
      for (const auto& y : s.layers) {
        cb += y.k.p->bytes();
        cb += y.v.p->bytes();
      }
    m["lowbit_bits_per_element"] = cb.bits_per_element();
    return m;
  }

 private:
  using Layer = SpecacheLayer;
  using Seq = SpecacheSeq;

  // At layer 0 of a speculative step: was the previous step's guess this step's real token? Then
  // keeps this step's guess row's key for the next comparison.
  void score_guess(Seq& s, const LayerInput& in, int64_t start) {
    const int64_t W = ctx_.config.kv_dim();
    at::Tensor k = in.k_pre_rope->narrow(0, start, 2).to(at::kFloat).contiguous();
    const float* real = k.data_ptr<float>();
    if (!s.guess_k.empty()) {
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < W; ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(real[i] - s.guess_k[i])));
        norm = std::max(norm, static_cast<double>(std::fabs(real[i])));
      }
      guess_hits_ += diff <= 1e-5 * std::max(1.0, norm) ? 1 : 0;
      guesses_ += 1;
    }
    s.guess_k.assign(real + W, real + 2 * W);
  }

  Seq new_seq(int64_t) override {
    const auto& c = ctx_.config;
    Seq s;
    s.layers.resize(static_cast<size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l) {
      s.layers[l].k.p = codec_->make_stream(KvKind::kKey, l, c.kv_dim(), c.head_dim);
      s.layers[l].v.p = codec_->make_stream(KvKind::kValue, l, c.kv_dim(), c.head_dim);
    }
    return s;
  }

  static void append_host(std::vector<uint16_t>& h, const float* x, int64_t count) {
    const size_t at = h.size();
    h.resize(at + static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) h[at + i] = kernels::float_to_half(x[i]);
  }

  // Overwrites, per KV head, the top-k of the `len` stored rows of kbuf / vbuf ([len.., W]) with
  // the host's exact rows; the top-k is chosen by the query rows `pred` ([Hq * D]; null: no
  // prediction, the low-bit rows stay). cur: the row's own query; prev: the one-step-old query
  // (null: none), whose top-k is compared with the current one's (predictor_overlap). kcur: the
  // row's key [W].
  void swap_in_exact(Layer& y, float* kbuf, float* vbuf, const float* pred, const float* cur,
                     const float* prev, const float* kcur, int64_t len, float scale) {
    const auto& c = ctx_.config;
    const int64_t W = c.kv_dim(), D = c.head_dim, Hkv = c.n_kv_heads, G = c.group_size();
    if (!pred) {
      ++lowbit_only_;
      return;
    }
    ++swap_steps_;
    for (int64_t h = 0; h < Hkv; ++h) {
      std::vector<int64_t> sel = top_positions(pred + h * G * D, G, kbuf, kcur, len, W, h, D, scale,
                                               o_.top_k, logit_, prob_);
      if (prev) {  // how well a one-step-old query predicts the current one's top-k
        std::vector<int64_t> a = top_positions(prev + h * G * D, G, kbuf, kcur, len, W, h, D, scale,
                                               o_.top_k, logit_, prob_);
        std::vector<int64_t> b = top_positions(cur + h * G * D, G, kbuf, kcur, len, W, h, D, scale,
                                               o_.top_k, logit_, prob_);
        std::vector<int64_t> both;
        std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
        overlap_sum_ += b.empty() ? 1.0 : static_cast<double>(both.size()) / b.size();
        overlap_n_ += 1;
      }
      for (int64_t j : sel)
        for (int64_t e = 0; e < D; ++e) {
          kbuf[j * W + h * D + e] = kernels::half_to_float(y.hk[j * W + h * D + e]);
          vbuf[j * W + h * D + e] = kernels::half_to_float(y.hv[j * W + h * D + e]);
        }
      swapped_rows_ += static_cast<double>(sel.size());
      if (decode_swap_) decode_swapped_rows_ += static_cast<double>(sel.size());
      swap_heads_ += 1;
    }
  }

  CacheContext ctx_;
  SpecacheOptions o_;
  std::shared_ptr<QuantCodec> codec_;
  int64_t channel_group_ = 0;
  std::vector<uint8_t> lookahead_;  // the running step's lookahead rows (set_lookahead_rows)
  std::vector<float> k_scratch_, v_scratch_, row_k_, row_v_, logit_, prob_;
  double swap_steps_ = 0, lowbit_only_ = 0, swapped_rows_ = 0, swap_heads_ = 0;
  double decode_steps_ = 0, overlap_sum_ = 0, overlap_n_ = 0, guess_hits_ = 0, guesses_ = 0;
  double decode_swapped_rows_ = 0;
  bool decode_swap_ = false;  // swap_in_exact runs for a decode step (not a prompt chunk)
};

MethodInfo specache_info() {
  MethodInfo m = method_listing(
      "specache",
      "SpeCache: low-bit KIVI copy on the device, fp16 copy on the host, top-k exact rows swapped "
      "in per decode step (predicted one step ahead)",
      "Jie et al., SpeCache: Speculative Key-Value Caching for Efficient Generation of LLMs, ICML "
      "2025 (arXiv 2503.16163)",
      {int_param("bits", 2, 2, 4,
                 "low-bit copy: 2, 3 or 4 bits (the paper: 1 or 2; 1 has no codec here)"),
       int_param(
           "group_size", 64, 1, 4096,
           "KIVI group: tokens per key group; channels per value group (adapted to head_dim)"),
       int_param(
           "residual_length", 64, 0, 1 << 20,
           "fp16 residual of the newest tokens in the low-bit copy (a multiple of group_size)"),
       int_param("top_k", 64, 1, 1 << 20, "exact rows swapped in per KV head and decode step"),
       enum_param("predictor", kPredictors, Predictor::kSpeculative,
                  "speculative: the paper's speculative token (each decode step also runs the "
                  "engine's guess of the next token; its query picks the next step's rows); "
                  "previous: the last decode step's query (no speculative token); oracle: the "
                  "current query (a speculative token that is always right)")});
  m.caps.quantizes = true;
  m.caps.tiers = true;
  m.caps.query_aware = true;
  m.caps.cpu_only = true;  // its codec store keeps rows on the host
  return m;
}

std::unique_ptr<KvCache> make_specache(const CacheContext& ctx, const nlohmann::json& p) {
  SpecacheOptions o;
  o.bits = p["bits"].get<int32_t>();
  o.group = p["group_size"].get<int64_t>();
  o.residual = p["residual_length"].get<int64_t>();
  o.top_k = p["top_k"].get<int64_t>();
  o.predictor = param_enum(p, "predictor", kPredictors);
  KVB_CHECK(o.residual % o.group == 0, "method specache.residual_length: ", o.residual,
            " is not a multiple of group_size ", o.group,
            " (keys are quantized per channel when the residual fills)");
  return std::make_unique<SpecacheKvCache>(ctx, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(specache, kvb::specache_info, kvb::make_specache);
