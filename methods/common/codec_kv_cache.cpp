#include "methods/common/codec_kv_cache.h"

#include <ATen/ATen.h>

#include <cstring>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "harness/kv/rope_shift.h"
#include "harness/kv/windowed_kv_cache.h"

namespace kvb {

CodecKvCache::CodecKvCache(const CacheContext& ctx, std::shared_ptr<const KvCodec> codec,
                           std::string name, std::map<std::string, double> extra_counters)
    : SeqStore(std::move(name)),
      ctx_(ctx),
      codec_(std::move(codec)),
      extra_counters_(std::move(extra_counters)) {
  KVB_CHECK(ctx_.device.is_cpu(), this->name(),
            ": the codec store runs on the CPU only so far (device ", ctx_.device.str(),
            " requested)");
  layer_window_.assign(static_cast<size_t>(ctx_.config.n_layers), 0);
  // Build one sequence's streams now so that a codec that cannot serve this model fails at
  // creation.
  CodecKvCache::new_seq(0);
}

CodecKvCache::Seq CodecKvCache::new_seq(int64_t) {
  const auto& c = ctx_.config;
  Seq s;
  for (int l = 0; l < c.n_layers; ++l) {
    s.k.emplace_back().p = codec_->make_stream(KvKind::kKey, l, c.kv_dim(), c.head_dim);
    s.v.emplace_back().p = codec_->make_stream(KvKind::kValue, l, c.kv_dim(), c.head_dim);
  }
  return s;
}

at::Tensor CodecKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const auto& c = ctx_.config;
  const int64_t W = c.kv_dim();
  const int64_t window = in.window;
  KVB_ASSERT(window >= 0, name(), "layer ", in.layer, " has window ", window);
  layer_window_.at(static_cast<size_t>(in.layer)) = window;
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    CodecStream& ks = *s.k[in.layer].p;
    CodecStream& vs = *s.v[in.layer].p;
    // Every row of the sequence, or (a window layer) its last window - 1 at most.
    const int64_t held = ks.rows();
    KVB_ASSERT(vs.rows() == held && (held == s.len || (window > 0 && held < s.len)), name(),
               "layer ", in.layer, " holds ", held, "/", vs.rows(), " rows for a sequence of ",
               s.len);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b], L = held + n;
    at::Tensor kn = in.k->narrow(0, start, n).to(at::kFloat).contiguous();  // [n, Hkv, D]
    at::Tensor vn = in.v->narrow(0, start, n).to(at::kFloat).contiguous();
    k_scratch_.resize(static_cast<size_t>(L * W));
    v_scratch_.resize(static_cast<size_t>(L * W));
    scratch_peak_bytes_ = std::max<int64_t>(scratch_peak_bytes_, 2 * L * W * 4);
    ks.decode(k_scratch_.data());
    vs.decode(v_scratch_.data());
    std::memcpy(k_scratch_.data() + held * W, kn.data_ptr<float>(), static_cast<size_t>(n * W * 4));
    std::memcpy(v_scratch_.data() + held * W, vn.data_ptr<float>(), static_cast<size_t>(n * W * 4));
    const at::Tensor q = in.q->narrow(0, start, n);
    if (window > 0 && L > window) {
      // Some query does not see some row: the window mask over the held rows and the new ones.
      const at::Tensor k_rows = at::from_blob(k_scratch_.data(), {L, c.n_kv_heads, c.head_dim});
      const at::Tensor v_rows = at::from_blob(v_scratch_.data(), {L, c.n_kv_heads, c.head_dim});
      outs.push_back(attend_window(q, k_rows, v_rows, in.sm_scale, window));
    } else {
      outs.push_back(attend_dense_rows(q, k_scratch_.data(), v_scratch_.data(), L, c.n_kv_heads,
                                       c.head_dim, in.sm_scale));
    }
    // Only now do the new rows enter the streams (and get encoded once due).
    ks.append(kn.data_ptr<float>(), n);
    vs.append(vn.data_ptr<float>(), n);
    // A window layer keeps the rows the next query's window reaches: the last window - 1.
    if (window > 0 && L > window - 1) {
      std::vector<int64_t> keep(static_cast<size_t>(window - 1));
      for (int64_t i = 0; i < window - 1; ++i) keep[static_cast<size_t>(i)] = L - (window - 1) + i;
      ks.keep_rows(keep);
      vs.keep_rows(keep);
    }
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

void CodecKvCache::splice(int64_t dst_id, const std::vector<SpliceSource>& sources) {
  KVB_CHECK(!sources.empty(), name(), ": splice needs at least one source");
  const auto& c = ctx_.config;
  const int64_t W = c.kv_dim();
  Seq dst = new_seq(dst_id);
  std::vector<float> rows;
  for (const auto& src : sources) {
    const Seq& s = seqs_.at(src.seq_id);
    if (s.len == 0) continue;
    for (int l = 0; l < c.n_layers; ++l)
      KVB_CHECK(s.k[l].p->rows() == s.len, name(), ": cannot splice sequence ", src.seq_id,
                ": its window layer ", l, " holds only the last ", s.k[l].p->rows(), " of its ",
                s.len, " tokens");
    rows.resize(static_cast<size_t>(s.len * W));
    for (int l = 0; l < c.n_layers; ++l) {
      s.k[l].p->decode(rows.data());
      at::Tensor k = at::from_blob(rows.data(), {s.len, c.n_kv_heads, c.head_dim}, at::kFloat);
      at::Tensor moved = rope_shift(k, c, src.shift).contiguous();
      dst.k[l].p->append(moved.data_ptr<float>(), s.len);
      s.v[l].p->decode(rows.data());
      dst.v[l].p->append(rows.data(), s.len);
    }
    dst.len += s.len;
  }
  seqs_.add(dst_id, std::move(dst));
}

void CodecKvCache::truncate(int64_t seq_id, int64_t new_len) {
  Seq& s = seqs_.truncating(seq_id, new_len);
  const int64_t drop = s.len - new_len;
  for (size_t l = 0; l < s.k.size(); ++l) {
    const int64_t held = s.k[l].p->rows();
    if (held == s.len) {
      s.k[l].p->truncate(new_len);
      s.v[l].p->truncate(new_len);
      continue;
    }
    // A window layer holds the sequence's last `held` rows: the shorter sequence's window needs
    // its last min(new_len, window - 1) of them.
    const int64_t keep = std::max<int64_t>(0, held - drop);
    const int64_t need = std::min<int64_t>(new_len, layer_window_[l] - 1);
    KVB_CHECK(keep >= need, name(), ": cannot truncate sequence ", seq_id, " to ", new_len,
              " tokens: window layer ", l, " no longer holds the rows its window needs");
    s.k[l].p->truncate(keep);
    s.v[l].p->truncate(keep);
  }
  s.len = new_len;
}

const CodecStream& CodecKvCache::stream(int64_t seq_id, int layer, KvKind kind) const {
  const Seq& s = seqs_.at(seq_id);
  return kind == KvKind::kKey ? *s.k.at(layer).p : *s.v.at(layer).p;
}

CodecBytes CodecKvCache::bytes(KvKind kind) const {
  CodecBytes b;
  for (const auto& [id, s] : seqs_)
    for (const auto& t : kind == KvKind::kKey ? s.k : s.v) b += t.p->bytes();
  return b;
}

Footprint CodecKvCache::footprint() const {
  CodecBytes b = bytes(KvKind::kKey);
  b += bytes(KvKind::kValue);
  Footprint f;
  f.device_payload_bytes = b.payload_bytes();
  f.device_metadata_bytes = b.metadata_bytes;
  f.device_index_bytes = b.index_bytes;
  f.device_reserved_bytes = b.reserved_bytes;
  f.model_dtype_device_bytes = 0;  // every row is the codec's (codes, or fp16/bf16 rows)
  // Logical: the rows held in the model dtype (a window layer holds its window only).
  const int64_t row_bytes =
      2 * ctx_.config.kv_dim() * static_cast<int64_t>(c10::elementSize(ctx_.dtype));
  for (const auto& [id, s] : seqs_) {
    f.tokens_held += s.len;
    for (const auto& k : s.k) f.logical_bytes += k.p->rows() * row_bytes;
  }
  return f;
}

std::map<std::string, double> CodecKvCache::counters() const {
  std::map<std::string, double> m = codec_->describe();
  for (const auto& [k, v] : extra_counters_) m[k] = v;
  const CodecBytes kb = bytes(KvKind::kKey), vb = bytes(KvKind::kValue);
  add_codec_bit_counters(kb, vb, &m);
  m["scratch_bytes_peak"] = static_cast<double>(scratch_peak_bytes_);
  return m;
}

}  // namespace kvb
