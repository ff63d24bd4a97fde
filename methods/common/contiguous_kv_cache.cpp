#include "methods/common/contiguous_kv_cache.h"

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "harness/kv/rope_shift.h"
#include "methods/common/head_snapshots.h"

namespace kvb {

ContiguousKvCache::ContiguousKvCache(const CacheContext& ctx, Mode mode, int64_t reserve_tokens,
                                     std::string name)
    : SeqStore(std::move(name)), ctx_(ctx), mode_(mode), reserve_tokens_(reserve_tokens) {}

void ContiguousKvCache::reallocate(Seq& s, int64_t capacity) {
  const auto& c = ctx_.config;
  auto opts = at::TensorOptions().dtype(ctx_.dtype).device(ctx_.device);
  s.k.resize(c.n_layers);
  s.v.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (auto* t : {&s.k[l], &s.v[l]}) {
      at::Tensor fresh = at::empty({capacity, c.n_kv_heads, c.head_dim}, opts);
      if (s.len > 0) fresh.narrow(0, 0, s.len).copy_(t->narrow(0, 0, s.len));
      *t = fresh;
    }
  }
  s.capacity = capacity;
}

void ContiguousKvCache::step_begins(Seq& s, const StepBatch& batch, int64_t b) {
  const int64_t need = s.len + batch.new_tokens(b);
  s.in_flight = batch.new_tokens(b);
  if (mode_ == Mode::kReserve) {
    KVB_CHECK(need <= reserve_tokens_, name(), ": sequence ", batch.seq_ids[b], " needs ", need,
              " tokens but max_seq_len reserves ", reserve_tokens_);
    if (s.capacity == 0) reallocate(s, reserve_tokens_);
  } else if (need > s.capacity) {
    reallocate(s, std::max<int64_t>(need, std::max<int64_t>(16, 2 * s.capacity)));
  }
}

at::Tensor ContiguousKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b];
    s.k[in.layer].narrow(0, s.len, n).copy_(in.k->narrow(0, start, n));
    s.v[in.layer].narrow(0, s.len, n).copy_(in.v->narrow(0, start, n));
    outs.push_back(attend_dense(in.q->narrow(0, start, n), s.k[in.layer].narrow(0, 0, s.len + n),
                                s.v[in.layer].narrow(0, 0, s.len + n), in.sm_scale));
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

void ContiguousKvCache::end_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    s.len += batch.new_tokens(b);
    s.in_flight = 0;
  }
}

void ContiguousKvCache::fork(int64_t src_id, int64_t dst_id) {
  seqs_.fork(src_id, dst_id);
  Seq& copy = seqs_.at(dst_id);
  for (auto* tensors : {&copy.k, &copy.v})
    for (auto& t : *tensors) t = t.clone();  // dense: no sharing
}

void ContiguousKvCache::splice(int64_t dst_id, const std::vector<SpliceSource>& sources) {
  KVB_CHECK(!sources.empty(), name(), ": splice needs at least one source");
  int64_t total = 0;
  for (const auto& src : sources) {
    const Seq& s = seqs_.at(src.seq_id);
    KVB_ASSERT(s.in_flight == 0, name(), "splice source ", src.seq_id, " is mid-step");
    total += s.len;
  }
  Seq dst;
  if (mode_ == Mode::kReserve) {
    KVB_CHECK(total <= reserve_tokens_, name(), ": the spliced sequence needs ", total,
              " tokens but max_seq_len reserves ", reserve_tokens_);
    reallocate(dst, reserve_tokens_);
  } else {
    reallocate(dst, std::max<int64_t>(16, total));
  }
  for (int64_t l = 0; l < ctx_.config.n_layers; ++l) {
    int64_t at = 0;
    for (const auto& src : sources) {
      const Seq& s = seqs_.at(src.seq_id);
      if (s.len == 0) continue;
      dst.k[l]
          .narrow(0, at, s.len)
          .copy_(rope_shift(s.k[l].narrow(0, 0, s.len), ctx_.config, src.shift));
      dst.v[l].narrow(0, at, s.len).copy_(s.v[l].narrow(0, 0, s.len));
      at += s.len;
    }
  }
  dst.len = total;
  seqs_.add(dst_id, std::move(dst));
}

void ContiguousKvCache::truncate(int64_t seq_id, int64_t new_len) {
  seqs_.truncating(seq_id, new_len).len = new_len;
}

Footprint ContiguousKvCache::footprint() const {
  Footprint f;
  const int64_t per_token =
      ctx_.config.kv_bytes_per_token(static_cast<int64_t>(c10::elementSize(ctx_.dtype)));
  for (const auto& [id, s] : seqs_) {
    f.device_payload_bytes += s.len * per_token;
    f.device_reserved_bytes += (s.capacity - s.len) * per_token;
    f.tokens_held += s.len;
  }
  f.logical_bytes = f.tokens_held * per_token;
  f.model_dtype_device_bytes = f.device_payload_bytes;
  return f;
}

std::vector<HeadSnapshot> ContiguousKvCache::probe_view(int layer, int64_t seq_id) const {
  const Seq* found = seqs_.find(seq_id);
  if (!found) return {};
  const Seq& s = *found;
  const int64_t n = s.len + s.in_flight;  // the step's tokens once attend has written them
  at::Tensor k = s.k[layer].narrow(0, 0, n).to(at::kFloat);
  at::Tensor v = s.v[layer].narrow(0, 0, n).to(at::kFloat);
  return dense_head_snapshots(k, v);
}

}  // namespace kvb
