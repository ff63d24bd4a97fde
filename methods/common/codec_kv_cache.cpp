#include "methods/common/codec_kv_cache.h"

#include <ATen/ATen.h>

#include <cstring>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "harness/kv/rope_shift.h"

namespace kvb {

CodecKvCache::CodecKvCache(const CacheContext& ctx, std::shared_ptr<const KvCodec> codec,
                           std::string name, std::map<std::string, double> extra_counters)
    : ctx_(ctx),
      codec_(std::move(codec)),
      name_(std::move(name)),
      extra_counters_(std::move(extra_counters)) {
  KVB_CHECK(ctx_.device.is_cpu(), name_, ": the codec store runs on the CPU only so far (device ",
            ctx_.device.str(), " requested)");
  // Build one sequence's streams now so that a codec that cannot serve this model fails at
  // creation.
  new_seq();
}

CodecKvCache::Seq CodecKvCache::new_seq() const {
  const auto& c = ctx_.config;
  Seq s;
  for (int l = 0; l < c.n_layers; ++l) {
    s.k.push_back(codec_->make_stream(KvKind::kKey, l, c.kv_dim(), c.head_dim));
    s.v.push_back(codec_->make_stream(KvKind::kValue, l, c.kv_dim(), c.head_dim));
  }
  return s;
}

void CodecKvCache::begin_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const int64_t id = batch.seq_ids[b];
    auto it = seqs_.find(id);
    if (it == seqs_.end()) it = seqs_.emplace(id, new_seq()).first;
    KVB_ASSERT(it->second.len == batch.past_lens[b], name_, "sequence ", id, " holds ",
               it->second.len, " tokens but the step says ", batch.past_lens[b]);
  }
}

at::Tensor CodecKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const auto& c = ctx_.config;
  const int64_t W = c.kv_dim();
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    CodecStream& ks = *s.k[in.layer];
    CodecStream& vs = *s.v[in.layer];
    KVB_ASSERT(ks.rows() == s.len && vs.rows() == s.len, name_, "layer ", in.layer, " holds ",
               ks.rows(), "/", vs.rows(), " rows for a sequence of ", s.len);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b], L = s.len + n;
    at::Tensor kn = in.k->narrow(0, start, n).to(at::kFloat).contiguous();  // [n, Hkv, D]
    at::Tensor vn = in.v->narrow(0, start, n).to(at::kFloat).contiguous();
    k_scratch_.resize(static_cast<size_t>(L * W));
    v_scratch_.resize(static_cast<size_t>(L * W));
    scratch_peak_bytes_ = std::max<int64_t>(scratch_peak_bytes_, 2 * L * W * 4);
    ks.decode(k_scratch_.data());
    vs.decode(v_scratch_.data());
    std::memcpy(k_scratch_.data() + s.len * W, kn.data_ptr<float>(),
                static_cast<size_t>(n * W * 4));
    std::memcpy(v_scratch_.data() + s.len * W, vn.data_ptr<float>(),
                static_cast<size_t>(n * W * 4));
    auto opts = at::TensorOptions().dtype(at::kFloat);
    at::Tensor K = at::from_blob(k_scratch_.data(), {L, c.n_kv_heads, c.head_dim}, opts);
    at::Tensor V = at::from_blob(v_scratch_.data(), {L, c.n_kv_heads, c.head_dim}, opts);
    const at::Tensor q = in.q->narrow(0, start, n);
    if (q.scalar_type() != at::kFloat) {
      K = K.to(q.scalar_type());
      V = V.to(q.scalar_type());
    }
    outs.push_back(attend_dense(q, K, V, in.sm_scale));
    // Only now do the new rows enter the streams (and get encoded once due).
    ks.append(kn.data_ptr<float>(), n);
    vs.append(vn.data_ptr<float>(), n);
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

void CodecKvCache::end_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b)
    seqs_.at(batch.seq_ids[b]).len += batch.new_tokens(b);
}

void CodecKvCache::fork(int64_t src_id, int64_t dst_id) {
  KVB_ASSERT(seqs_.count(dst_id) == 0, name_, "fork target ", dst_id, " already exists");
  auto it = seqs_.find(src_id);
  KVB_ASSERT(it != seqs_.end(), name_, "unknown sequence ", src_id);
  Seq copy;
  copy.len = it->second.len;
  for (const auto& t : it->second.k) copy.k.push_back(t->clone());  // no sharing yet
  for (const auto& t : it->second.v) copy.v.push_back(t->clone());
  seqs_.emplace(dst_id, std::move(copy));
}

void CodecKvCache::splice(int64_t dst_id, const std::vector<SpliceSource>& sources) {
  KVB_ASSERT(seqs_.count(dst_id) == 0, name_, "splice target ", dst_id, " already exists");
  KVB_CHECK(!sources.empty(), name_, ": splice needs at least one source");
  for (const auto& src : sources)
    KVB_ASSERT(seqs_.count(src.seq_id), name_, "splice source ", src.seq_id, " is unknown");
  const auto& c = ctx_.config;
  const int64_t W = c.kv_dim();
  Seq dst = new_seq();
  std::vector<float> rows;
  for (const auto& src : sources) {
    const Seq& s = seqs_.at(src.seq_id);
    if (s.len == 0) continue;
    rows.resize(static_cast<size_t>(s.len * W));
    for (int l = 0; l < c.n_layers; ++l) {
      s.k[l]->decode(rows.data());
      at::Tensor k = at::from_blob(rows.data(), {s.len, c.n_kv_heads, c.head_dim}, at::kFloat);
      at::Tensor moved = rope_shift(k, c, src.shift).contiguous();
      dst.k[l]->append(moved.data_ptr<float>(), s.len);
      s.v[l]->decode(rows.data());
      dst.v[l]->append(rows.data(), s.len);
    }
    dst.len += s.len;
  }
  seqs_.emplace(dst_id, std::move(dst));
}

void CodecKvCache::truncate(int64_t seq_id, int64_t new_len) {
  auto it = seqs_.find(seq_id);
  KVB_ASSERT(it != seqs_.end(), name_, "unknown sequence ", seq_id);
  KVB_CHECK(new_len >= 0 && new_len <= it->second.len, name_, ": cannot truncate sequence ", seq_id,
            " of ", it->second.len, " tokens to ", new_len);
  for (auto& t : it->second.k) t->truncate(new_len);
  for (auto& t : it->second.v) t->truncate(new_len);
  it->second.len = new_len;
}

int64_t CodecKvCache::seq_len(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? 0 : it->second.len;
}

const CodecStream& CodecKvCache::stream(int64_t seq_id, int layer, KvKind kind) const {
  auto it = seqs_.find(seq_id);
  KVB_ASSERT(it != seqs_.end(), name_, "unknown sequence ", seq_id);
  return kind == KvKind::kKey ? *it->second.k.at(layer) : *it->second.v.at(layer);
}

CodecBytes CodecKvCache::bytes(KvKind kind) const {
  CodecBytes b;
  for (const auto& [id, s] : seqs_)
    for (const auto& t : kind == KvKind::kKey ? s.k : s.v) b += t->bytes();
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
  for (const auto& [id, s] : seqs_) f.tokens_held += s.len;
  f.model_dtype_device_bytes = 0;  // every row is the codec's (codes, or fp16/bf16 rows)
  f.logical_bytes = f.tokens_held * ctx_.config.kv_bytes_per_token(
                                        static_cast<int64_t>(c10::elementSize(ctx_.dtype)));
  return f;
}

std::map<std::string, double> CodecKvCache::counters() const {
  std::map<std::string, double> m = codec_->describe();
  for (const auto& [k, v] : extra_counters_) m[k] = v;
  const CodecBytes kb = bytes(KvKind::kKey), vb = bytes(KvKind::kValue);
  CodecBytes all = kb;
  all += vb;
  m["effective_bits_per_element"] = all.bits_per_element();
  m["k_effective_bits_per_element"] = kb.bits_per_element();
  m["v_effective_bits_per_element"] = vb.bits_per_element();
  m["encoded_bits_per_element"] = all.encoded_bits_per_element();
  m["full_precision_fraction"] =
      all.live_elems() ? static_cast<double>(all.full_elems) / static_cast<double>(all.live_elems())
                       : 0.0;
  m["scratch_bytes_peak"] = static_cast<double>(scratch_peak_bytes_);
  return m;
}

}  // namespace kvb
