#include "methods/vattention/vattention_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "kernels/torch/virtual_arena_torch.h"
#include "methods/common/head_snapshots.h"

namespace kvb {

VAttentionKvCache::VAttentionKvCache(const CacheContext& ctx, const Options& options)
    : SeqStore("vattention"), ctx_(ctx), options_(options) {
  const ModelConfig& c = ctx_.config;
  max_context_ = options_.max_context > 0 ? options_.max_context : c.max_seq_len;
  KVB_CHECK(max_context_ >= 1, "vattention: max_context ", max_context_, " (must be >= 1)");
  KVB_CHECK(options_.max_batch >= 1, "vattention: max_batch ", options_.max_batch);
  row_bytes_ = c.n_kv_heads * c.head_dim * static_cast<int64_t>(c10::elementSize(ctx_.dtype));
  // A slot's capacity is rounded up until slots start on page boundaries, so that every slot's
  // pages are its own; the padding is address space only, never committed.
  const int64_t page = static_cast<int64_t>(options_.page_bytes);
  const int64_t unit = page / std::gcd(page, row_bytes_);  // tokens per page-aligned stride
  slot_tokens_ = (max_context_ + unit - 1) / unit * unit;
  slot_bytes_ = static_cast<size_t>(slot_tokens_ * row_bytes_);
  const size_t arena_bytes = slot_bytes_ * static_cast<size_t>(options_.max_batch);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (auto* arenas : {&k_arena_, &v_arena_}) {
      std::string error;
      auto a = kernels::make_virtual_arena(ctx_.device, arena_bytes, options_.page_bytes,
                                           options_.huge_pages, &error);
      KVB_CHECK(a != nullptr, "vattention: reserving ", arena_bytes, " bytes of address space (",
                options_.max_batch, " slots x ", slot_tokens_, " tokens) with ",
                options_.page_bytes, "-byte pages on ", ctx_.device.str(), ": ", error);
      arenas->push_back(std::move(a));
    }
    const std::vector<int64_t> shape = {options_.max_batch, slot_tokens_, c.n_kv_heads, c.head_dim};
    k_pool_.push_back(kernels::arena_view(*k_arena_[l], 0, shape, ctx_.dtype, ctx_.device));
    v_pool_.push_back(kernels::arena_view(*v_arena_[l], 0, shape, ctx_.dtype, ctx_.device));
  }
  slot_pages_.assign(static_cast<size_t>(options_.max_batch), 0);
  slot_used_.assign(static_cast<size_t>(options_.max_batch), 0);
}

int64_t VAttentionKvCache::pages_for(int64_t tokens) const {
  const int64_t page = static_cast<int64_t>(options_.page_bytes);
  return (tokens * row_bytes_ + page - 1) / page;
}

void VAttentionKvCache::fit_pages(int64_t slot, int64_t tokens, bool shrink) {
  const int64_t want = pages_for(tokens);
  int64_t& have = slot_pages_[static_cast<size_t>(slot)];
  if (want == have || (want < have && !shrink)) return;
  const size_t page = options_.page_bytes;
  const size_t base = static_cast<size_t>(slot) * slot_bytes_;
  const size_t lo = static_cast<size_t>(std::min(want, have)) * page;
  const size_t n = static_cast<size_t>(std::abs(want - have)) * page;
  for (size_t l = 0; l < k_arena_.size(); ++l) {
    for (auto* a : {k_arena_[l].get(), v_arena_[l].get()}) {
      const std::string why = want > have ? a->commit(base + lo, n) : a->decommit(base + lo, n);
      KVB_CHECK(why.empty(), "vattention: ", want > have ? "committing " : "releasing ", n,
                " bytes of slot ", slot, " (layer ", l, "): ", why);
    }
  }
  have = want;
}

int64_t VAttentionKvCache::take_slot() {
  // With deferred reclamation a free slot that still holds pages is taken first (its pages are
  // reused, vAttention's point); otherwise the lowest free slot.
  int64_t best = -1;
  for (int64_t s = 0; s < options_.max_batch; ++s) {
    if (slot_used_[static_cast<size_t>(s)]) continue;
    if (best < 0 || slot_pages_[static_cast<size_t>(s)] > slot_pages_[static_cast<size_t>(best)])
      best = s;
  }
  KVB_CHECK(best >= 0, "vattention: all max_batch=", options_.max_batch,
            " sequence slots are in use (raise max_batch)");
  slot_used_[static_cast<size_t>(best)] = 1;
  return best;
}

void VAttentionKvCache::free_slot(int64_t slot) {
  slot_used_[static_cast<size_t>(slot)] = 0;
  if (!options_.deferred_reclaim) fit_pages(slot, 0, /*shrink=*/true);
}

VAttentionKvCache::Seq VAttentionKvCache::new_seq(int64_t) { return Seq{take_slot(), 0, 0}; }

void VAttentionKvCache::step_begins(Seq& s, const StepBatch& batch, int64_t b) {
  const int64_t need = s.len + batch.new_tokens(b);
  KVB_CHECK(need <= max_context_, "vattention: sequence ", batch.seq_ids[b], " needs ", need,
            " tokens but max_context reserves ", max_context_);
  fit_pages(s.slot, need, /*shrink=*/false);
  s.in_flight = batch.new_tokens(b);
}

void VAttentionKvCache::begin_step(const StepBatch& batch) {
  kernel_step_ = false;
  SeqStore::begin_step(batch);
  bool all_single = batch.phase == Phase::kDecode;
  for (int64_t b = 0; b < batch.batch_size(); ++b)
    all_single = all_single && batch.new_tokens(b) == 1;
  if (!all_single || !options_.decode_kernel || batch.batch_size() == 0) return;
  const ModelConfig& c = ctx_.config;
  if (!kernels::paged_decode_supported(ctx_.device, ctx_.dtype, c.head_dim, c.n_heads, c.n_kv_heads)
           .empty())
    return;
  // One page per sequence: its slot, whose "page" is the whole contiguous range.
  tables_.page_indptr.resize(static_cast<size_t>(batch.batch_size()) + 1);
  tables_.page_indices.resize(static_cast<size_t>(batch.batch_size()));
  tables_.kv_lens.resize(static_cast<size_t>(batch.batch_size()));
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const Seq& s = seqs_.at(batch.seq_ids[b]);
    tables_.page_indptr[b] = static_cast<int32_t>(b);
    tables_.page_indices[b] = static_cast<int32_t>(s.slot);
    tables_.kv_lens[b] = static_cast<int32_t>(s.len + 1);
  }
  tables_.page_indptr.back() = static_cast<int32_t>(batch.batch_size());
  tables_.upload(ctx_.device);
  kernel_step_ = true;
}

at::Tensor VAttentionKvCache::slot_rows(const at::Tensor& pool, int64_t slot, int64_t n) const {
  return pool.select(0, slot).narrow(0, 0, n);
}

at::Tensor VAttentionKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const at::Tensor& kp = k_pool_[static_cast<size_t>(in.layer)];
  const at::Tensor& vp = v_pool_[static_cast<size_t>(in.layer)];
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const Seq& s = seqs_.at(batch.seq_ids[b]);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b];
    kp.select(0, s.slot).narrow(0, s.len, n).copy_(in.k->narrow(0, start, n));
    vp.select(0, s.slot).narrow(0, s.len, n).copy_(in.v->narrow(0, start, n));
  }
  if (kernel_step_) {
    // in.q: [batch, Hq, D], one token per sequence; the pools are the arena views.
    return kernels::paged_decode_attention(*in.q, kp, vp, tables_, in.sm_scale);
  }
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const Seq& s = seqs_.at(batch.seq_ids[b]);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b];
    outs.push_back(attend_dense(in.q->narrow(0, start, n), slot_rows(kp, s.slot, s.len + n),
                                slot_rows(vp, s.slot, s.len + n), in.sm_scale));
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

void VAttentionKvCache::end_step(const StepBatch& batch) {
  if (batch.phase == Phase::kDecode) {
    decode_steps_++;
    if (kernel_step_) kernel_decode_steps_++;
  }
  SeqStore::end_step(batch);
  for (int64_t b = 0; b < batch.batch_size(); ++b) seqs_.at(batch.seq_ids[b]).in_flight = 0;
  kernel_step_ = false;
}

void VAttentionKvCache::release(int64_t seq_id) {
  const Seq* s = seqs_.find(seq_id);
  if (!s) return;
  free_slot(s->slot);
  SeqStore::release(seq_id);
}

void VAttentionKvCache::fork(int64_t src_id, int64_t dst_id) {
  const Seq src = seqs_.at(src_id);
  // Contiguity has a price here: no block sharing, the copy gets its own slot and pages.
  Seq dst{take_slot(), src.len, 0};
  fit_pages(dst.slot, dst.len, /*shrink=*/false);
  for (size_t l = 0; l < k_pool_.size(); ++l) {
    slot_rows(k_pool_[l], dst.slot, dst.len).copy_(slot_rows(k_pool_[l], src.slot, src.len));
    slot_rows(v_pool_[l], dst.slot, dst.len).copy_(slot_rows(v_pool_[l], src.slot, src.len));
  }
  seqs_.add(dst_id, dst, "fork target ");
}

void VAttentionKvCache::truncate(int64_t seq_id, int64_t new_len) {
  Seq& s = seqs_.truncating(seq_id, new_len);
  s.len = new_len;
  if (!options_.deferred_reclaim) fit_pages(s.slot, new_len, /*shrink=*/true);
}

int64_t VAttentionKvCache::slot_resident(int64_t slot) const {
  const size_t base = static_cast<size_t>(slot) * slot_bytes_;
  int64_t total = 0;
  for (size_t l = 0; l < k_arena_.size(); ++l) {
    for (const auto* a : {k_arena_[l].get(), v_arena_[l].get()}) {
      const int64_t r = a->resident_bytes(base, slot_bytes_);
      KVB_ASSERT(r >= 0, "vattention", "the OS would not report residency of slot ", slot);
      total += r;
    }
  }
  return total;
}

int64_t VAttentionKvCache::resident_bytes_of(int64_t seq_id) const {
  const Seq* s = seqs_.find(seq_id);
  return s ? slot_resident(s->slot) : 0;
}

Footprint VAttentionKvCache::footprint() const {
  Footprint f;
  const int64_t per_token = 2 * row_bytes_ * static_cast<int64_t>(k_pool_.size());
  for (int64_t s = 0; s < options_.max_batch; ++s) {
    // Asked of the OS for every slot, used or not: a page the bookkeeping lost would show here.
    const int64_t resident = slot_resident(s);
    if (slot_used_[static_cast<size_t>(s)])
      f.device_payload_bytes += resident;
    else
      f.device_reserved_bytes += resident;  // deferred reclamation: pages kept for the next one
  }
  for (const auto& [id, s] : seqs_) f.tokens_held += s.len;
  // No block table: a decode step passes one slot index per sequence.
  f.device_index_bytes = static_cast<int64_t>(seqs_.size()) * 4;
  f.logical_bytes = f.tokens_held * per_token;
  f.model_dtype_device_bytes = f.device_payload_bytes;
  return f;
}

std::map<std::string, double> VAttentionKvCache::counters() const {
  int64_t committed_pages = 0, resident = 0, huge = 0, calls = 0;
  double seconds = 0;
  for (int64_t p : slot_pages_) committed_pages += p;
  for (size_t l = 0; l < k_arena_.size(); ++l) {
    for (const auto* a : {k_arena_[l].get(), v_arena_[l].get()}) {
      resident += a->resident_bytes(0, a->reserved_bytes());
      huge += a->huge_resident_bytes();
      calls += a->commit_calls();
      seconds += a->commit_seconds();
    }
  }
  const int64_t committed =
      committed_pages * 2 * static_cast<int64_t>(k_arena_.size() * options_.page_bytes);
  int64_t tokens = 0;
  for (const auto& [id, s] : seqs_) tokens += s.len;
  const double logical = static_cast<double>(tokens) * 2.0 * static_cast<double>(row_bytes_) *
                         static_cast<double>(k_arena_.size());
  return {{"page_bytes", static_cast<double>(options_.page_bytes)},
          {"slot_tokens", static_cast<double>(slot_tokens_)},
          {"virtual_reserved_bytes",
           static_cast<double>(2 * k_arena_.size() * slot_bytes_ * options_.max_batch)},
          {"committed_bytes", static_cast<double>(committed)},
          {"resident_bytes", static_cast<double>(resident)},
          {"huge_resident_bytes", static_cast<double>(huge)},
          {"fragmentation_bytes", static_cast<double>(resident) - logical},
          {"map_calls", static_cast<double>(calls)},
          {"map_ms", seconds * 1e3},
          {"kernel_decode_steps", static_cast<double>(kernel_decode_steps_)},
          {"decode_steps", static_cast<double>(decode_steps_)}};
}

std::vector<HeadSnapshot> VAttentionKvCache::probe_view(int layer, int64_t seq_id) const {
  return probe_seq(seq_id, layer, static_cast<int64_t>(k_pool_.size()), [&](const Seq& s) {
    const int64_t n = s.len + s.in_flight;
    // Copies: the snapshot must not alias arena pages a later release gives back.
    at::Tensor k = slot_rows(k_pool_[static_cast<size_t>(layer)], s.slot, n)
                       .to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    at::Tensor v = slot_rows(v_pool_[static_cast<size_t>(layer)], s.slot, n)
                       .to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    return dense_head_snapshots(k, v);
  });
}

}  // namespace kvb
