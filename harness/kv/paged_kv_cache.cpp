#include "harness/kv/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

#include <limits>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "kvb/kernels/paged_attention.h"

namespace kvb {

PagedKvCache::PagedKvCache(const ModelConfig& config, c10::Device device, c10::ScalarType dtype,
                           Options opts)
    : config_(config),
      device_(device),
      dtype_(dtype),
      block_size_(opts.block_size),
      decode_kernel_(opts.decode_kernel),
      opts_cuda_kernel_(opts.cuda_kernel) {
  KVB_CHECK(block_size_ >= 1 && block_size_ <= 4096, "paged KV: block_size ", block_size_,
            " is outside [1, 4096]");
  k_pool_.resize(config_.n_layers);
  v_pool_.resize(config_.n_layers);
  grow(std::max<int64_t>(1, opts.initial_blocks));
}

void PagedKvCache::grow(int64_t min_capacity) {
  int64_t cap = std::max<int64_t>(min_capacity, capacity_ * 2);
  auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    at::Tensor k = at::empty({cap, block_size_, config_.n_kv_heads, config_.head_dim}, opts);
    at::Tensor v = at::empty_like(k);
    if (capacity_ > 0) {
      k.narrow(0, 0, capacity_).copy_(k_pool_[l]);
      v.narrow(0, 0, capacity_).copy_(v_pool_[l]);
    }
    k_pool_[l] = k;
    v_pool_[l] = v;
  }
  refcount_.resize(cap, 0);
  for (int64_t b = cap - 1; b >= capacity_; --b) free_.push_back(static_cast<int32_t>(b));
  capacity_ = cap;
}

int32_t PagedKvCache::alloc_block() {
  if (free_.empty()) grow(capacity_ + 1);
  int32_t b = free_.back();
  free_.pop_back();
  refcount_[b] = 1;
  return b;
}

void PagedKvCache::unref_block(int32_t b) {
  if (--refcount_[b] == 0) free_.push_back(b);
}

void PagedKvCache::copy_block(int32_t src, int32_t dst) {
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    k_pool_[l][dst].copy_(k_pool_[l][src]);
    v_pool_[l][dst].copy_(v_pool_[l][src]);
  }
}

PagedKvCache::Seq& PagedKvCache::seq(int64_t id) {
  auto it = seqs_.find(id);
  KVB_ASSERT(it != seqs_.end(), "paged_kv_cache", "unknown sequence ", id);
  return it->second;
}

const PagedKvCache::Seq& PagedKvCache::seq(int64_t id) const {
  auto it = seqs_.find(id);
  KVB_ASSERT(it != seqs_.end(), "paged_kv_cache", "unknown sequence ", id);
  return it->second;
}

const std::vector<int32_t>& PagedKvCache::block_table(int64_t seq_id) const {
  return seq(seq_id).blocks;
}

void PagedKvCache::begin_step(const StepBatch& batch) {
  const int64_t B = batch.batch_size();
  std::vector<int64_t> slots;
  slots.reserve(batch.num_tokens());
  step_gather_.clear();
  step_page_indptr_.assign(1, 0);
  step_page_indices_.clear();
  // A decode step (one new token per sequence) off the CPU fp32 path goes through the decode
  // kernel when it supports the shapes; the others gather rows for LibTorch.
  bool decode_step = B > 0;
  for (int64_t b = 0; b < B; ++b) decode_step = decode_step && batch.new_tokens(b) == 1;
  step_kernel_decode_ = decode_kernel_ && decode_step &&
                        !(device_.is_cpu() && dtype_ == at::kFloat) &&
                        kernels::paged_decode_supported(device_, dtype_, config_.head_dim,
                                                        config_.n_heads, config_.n_kv_heads)
                            .empty();
  const bool want_gather = !(device_.is_cpu() && dtype_ == at::kFloat) && !step_kernel_decode_;
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = seqs_[batch.seq_ids[b]];  // a new id starts an empty sequence
    KVB_ASSERT(s.len == batch.past_lens[b], "paged_kv_cache", "sequence ", batch.seq_ids[b], " holds ",
               s.len, " tokens but the step says ", batch.past_lens[b]);
    const int64_t n_new = batch.new_tokens(b);
    s.in_flight = n_new;
    // Copy-on-write: the partial last block is shared with another branch; write into a copy.
    if (s.len % block_size_ != 0 && n_new > 0) {
      int32_t& last = s.blocks.back();
      if (refcount_[last] > 1) {
        int32_t fresh = alloc_block();
        copy_block(last, fresh);
        unref_block(last);
        last = fresh;
      }
    }
    const int64_t need = (s.len + n_new + block_size_ - 1) / block_size_;
    while (static_cast<int64_t>(s.blocks.size()) < need) s.blocks.push_back(alloc_block());
    for (int64_t i = 0; i < n_new; ++i) {
      const int64_t pos = s.len + i;
      slots.push_back(s.blocks[pos / block_size_] * block_size_ + pos % block_size_);
    }
    for (int32_t blk : s.blocks) step_page_indices_.push_back(blk);
    step_page_indptr_.push_back(static_cast<int32_t>(step_page_indices_.size()));
    if (want_gather) {
      const int64_t len = s.len + n_new;
      std::vector<int64_t> g(len);
      for (int64_t j = 0; j < len; ++j)
        g[j] = s.blocks[j / block_size_] * block_size_ + j % block_size_;
      step_gather_.push_back(at::tensor(g, at::kLong).to(device_));
    }
  }
  if (!(device_.is_cpu() && dtype_ == at::kFloat))
    step_slots_ = at::tensor(slots, at::kLong).to(device_);
  if (step_kernel_decode_) {
    step_decode_.page_indptr = step_page_indptr_;
    step_decode_.page_indices = step_page_indices_;
    step_decode_.kv_lens.resize(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      step_decode_.kv_lens[b] = static_cast<int32_t>(batch.past_lens[b] + 1);
    step_decode_.upload(device_);
  }
  step_slots_host_ = std::move(slots);
}

at::Tensor PagedKvCache::attend(const LayerInput& in) {
  const int l = in.layer;
  const int64_t H = config_.n_kv_heads, D = config_.head_dim;
  if (device_.is_cpu() && dtype_ == at::kFloat) {
    // Plain row copies: two index_copy_ dispatches would cost more than the copy on small models.
    const int64_t row = H * D;
    at::Tensor kc = in.k->contiguous(), vc = in.v->contiguous();
    const float* ks = kc.data_ptr<float>();
    const float* vs = vc.data_ptr<float>();
    float* kd = k_pool_[l].data_ptr<float>();
    float* vd = v_pool_[l].data_ptr<float>();
    for (size_t t = 0; t < step_slots_host_.size(); ++t) {
      std::copy(ks + t * row, ks + (t + 1) * row, kd + step_slots_host_[t] * row);
      std::copy(vs + t * row, vs + (t + 1) * row, vd + step_slots_host_[t] * row);
    }
    return attend_cpu_kernel(in);
  }
  at::Tensor kf = k_pool_[l].view({-1, H, D});
  at::Tensor vf = v_pool_[l].view({-1, H, D});
  kf.index_copy_(0, step_slots_, *in.k);
  vf.index_copy_(0, step_slots_, *in.v);
  if (step_kernel_decode_)
    return kernels::paged_decode_attention(*in.q, k_pool_[l], v_pool_[l], step_decode_, in.sm_scale,
                                           opts_cuda_kernel_);
  return attend_torch(in);
}

at::Tensor PagedKvCache::attend_cpu_kernel(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  at::Tensor q = in.q->contiguous();
  // (at::detail::empty_cpu rather than the dispatcher's empty_like: a few thousand instructions
  // less per layer, a noticeable share of a small model's decode step.)
  at::Tensor o = at::detail::empty_cpu(q.sizes(), at::kFloat);
  kernels::PagedAttentionParams p;
  p.q = q.data_ptr<float>();
  p.o = o.data_ptr<float>();
  p.k_pages = k_pool_[in.layer].data_ptr<float>();
  p.v_pages = v_pool_[in.layer].data_ptr<float>();
  p.page_indptr = step_page_indptr_.data();
  p.page_indices = step_page_indices_.data();
  p.q_indptr = batch.q_indptr.data();
  p.past_lens = batch.past_lens.data();
  p.batch_size = static_cast<int32_t>(batch.batch_size());
  p.num_qo_heads = static_cast<int32_t>(config_.n_heads);
  p.num_kv_heads = static_cast<int32_t>(config_.n_kv_heads);
  p.head_dim = static_cast<int32_t>(config_.head_dim);
  p.page_size = static_cast<int32_t>(block_size_);
  p.sm_scale = in.sm_scale;
  kernels::paged_attention_cpu(p);
  return o;
}

at::Tensor PagedKvCache::attend_torch(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const int64_t Hk = config_.n_kv_heads, D = config_.head_dim;
  at::Tensor kf = k_pool_[in.layer].view({-1, Hk, D});
  at::Tensor vf = v_pool_[in.layer].view({-1, Hk, D});
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    at::Tensor qb = in.q->narrow(0, batch.q_indptr[b], batch.new_tokens(b));
    outs.push_back(attend_dense(qb, kf.index_select(0, step_gather_[b]),
                                vf.index_select(0, step_gather_[b]), in.sm_scale));
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

void PagedKvCache::end_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seq(batch.seq_ids[b]);
    s.len += batch.new_tokens(b);
    s.in_flight = 0;
  }
}

void PagedKvCache::release(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second.blocks) unref_block(b);
  seqs_.erase(it);
}

void PagedKvCache::fork(int64_t src_id, int64_t dst_id) {
  KVB_ASSERT(seqs_.count(dst_id) == 0, "paged_kv_cache", "fork target ", dst_id, " already exists");
  Seq copy = seq(src_id);
  for (int32_t b : copy.blocks) ++refcount_[b];
  seqs_[dst_id] = std::move(copy);
}

void PagedKvCache::truncate(int64_t seq_id, int64_t new_len) {
  Seq& s = seq(seq_id);
  KVB_CHECK(new_len >= 0 && new_len <= s.len, "paged KV: cannot truncate sequence ", seq_id, " of ",
            s.len, " tokens to ", new_len);
  const int64_t need = (new_len + block_size_ - 1) / block_size_;
  while (static_cast<int64_t>(s.blocks.size()) > need) {
    unref_block(s.blocks.back());
    s.blocks.pop_back();
  }
  s.len = new_len;
}

int64_t PagedKvCache::seq_len(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? 0 : it->second.len;
}

int64_t PagedKvCache::blocks_in_use() const {
  return capacity_ - static_cast<int64_t>(free_.size());
}

Footprint PagedKvCache::footprint() const {
  Footprint f;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype_));
  const int64_t block_bytes = block_size_ * config_.n_layers * 2 * config_.kv_dim() * elem;
  f.device_payload_bytes = blocks_in_use() * block_bytes;
  f.device_reserved_bytes = static_cast<int64_t>(free_.size()) * block_bytes;
  for (const auto& [id, s] : seqs_) {
    f.device_index_bytes += static_cast<int64_t>(s.blocks.size() * sizeof(int32_t));
    f.tokens_held += s.len;
  }
  f.logical_bytes = f.tokens_held * config_.kv_bytes_per_token(elem);
  f.model_dtype_device_bytes = f.device_payload_bytes;
  return f;
}

at::Tensor PagedKvCache::gather(int layer, int64_t seq_id, bool keys) const {
  const Seq& s = seq(seq_id);
  const int64_t n = s.len + s.in_flight;
  std::vector<int64_t> g(n);
  for (int64_t j = 0; j < n; ++j) g[j] = s.blocks[j / block_size_] * block_size_ + j % block_size_;
  const at::Tensor& pool = keys ? k_pool_[layer] : v_pool_[layer];
  return pool.view({-1, config_.n_kv_heads, config_.head_dim})
      .index_select(0, at::tensor(g, at::kLong).to(device_));
}

}  // namespace kvb

namespace kvb {

std::vector<HeadSnapshot> PagedKvCache::probe_view(int layer, int64_t seq_id) const {
  at::Tensor k = gather(layer, seq_id, true).to(at::kFloat);  // [len, Hk, D]
  at::Tensor v = gather(layer, seq_id, false).to(at::kFloat);
  at::Tensor idx = at::arange(k.size(0), at::TensorOptions().dtype(at::kLong).device(k.device()));
  std::vector<HeadSnapshot> out;
  for (int64_t h = 0; h < config_.n_kv_heads; ++h)
    out.push_back({k.select(1, h).contiguous(), v.select(1, h).contiguous(), idx});
  return out;
}

}  // namespace kvb
