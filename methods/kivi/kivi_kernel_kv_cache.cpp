#include "methods/kivi/kivi_kernel_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"

namespace kvb {

namespace {

constexpr int64_t kInitialPages = 16;
constexpr int64_t kInitialRings = 4;

at::Tensor grown(const at::Tensor& t, int64_t new_rows) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape[0] = new_rows;
  at::Tensor g = at::zeros(shape, t.options());
  if (t.size(0) > 0) g.narrow(0, 0, t.size(0)).copy_(t);
  return g;
}

at::Tensor long_tensor(const std::vector<int64_t>& v, const c10::Device& dev) {
  return at::tensor(v, at::kLong).to(dev);
}

}  // namespace

KiviKernelKvCache::KiviKernelKvCache(const CacheContext& ctx, const kernels::KiviLayout& layout,
                                     c10::ScalarType ring_dtype, std::string name,
                                     std::map<std::string, double> extra_counters,
                                     kernels::KiviCudaKernel cuda_kernel)
    : SeqStore(std::move(name)),
      ctx_(ctx),
      layout_(layout),
      ring_dtype_(ring_dtype),
      extra_counters_(std::move(extra_counters)),
      cuda_kernel_(cuda_kernel),
      U_(kernels::kivi_residual_capacity(layout)) {
  KVB_CHECK(
      layout_.num_kv_heads == ctx_.config.n_kv_heads && layout_.head_dim == ctx_.config.head_dim,
      this->name(), ": the KIVI layout's heads (", layout_.num_kv_heads, " x ", layout_.head_dim,
      ") do not match the model's (", ctx_.config.n_kv_heads, " x ", ctx_.config.head_dim, ")");
  const std::string why = kernels::kivi_kernel_supported(ctx_.device, ring_dtype_, layout_,
                                                         ctx_.config.n_heads, cuda_kernel_);
  KVB_CHECK(why.empty(), this->name(), ": the KIVI kernels cannot serve this configuration on ",
            ctx_.device.str(), ": ", why);
  page_capacity_ = kInitialPages;
  ring_capacity_ = kInitialRings;
  auto ropts = at::TensorOptions().dtype(ring_dtype_).device(ctx_.device);
  for (int l = 0; l < ctx_.config.n_layers; ++l) {
    pools_.push_back(kernels::kivi_pools_empty(layout_, page_capacity_, ctx_.device));
    k_ring_.push_back(
        at::zeros({ring_capacity_, U_, layout_.num_kv_heads, layout_.head_dim}, ropts));
    v_ring_.push_back(
        at::zeros({ring_capacity_, U_, layout_.num_kv_heads, layout_.head_dim}, ropts));
  }
  for (int64_t i = page_capacity_ - 1; i >= 0; --i) free_pages_.push_back(static_cast<int32_t>(i));
  refcount_.assign(static_cast<size_t>(page_capacity_), 0);
  for (int64_t i = ring_capacity_ - 1; i >= 0; --i) free_rings_.push_back(static_cast<int32_t>(i));
}

int32_t KiviKernelKvCache::alloc_page() {
  if (free_pages_.empty()) {
    const int64_t cap = page_capacity_ * 2;
    for (auto& p : pools_) {
      for (at::Tensor* t : {&p.k_codes, &p.k_scales, &p.k_mins, &p.v_codes, &p.v_scales, &p.v_mins})
        *t = grown(*t, cap);
    }
    for (int64_t i = cap - 1; i >= page_capacity_; --i)
      free_pages_.push_back(static_cast<int32_t>(i));
    page_capacity_ = cap;
    refcount_.resize(static_cast<size_t>(cap), 0);
  }
  const int32_t id = free_pages_.back();
  free_pages_.pop_back();
  refcount_[id] = 1;
  return id;
}

void KiviKernelKvCache::unref_page(int32_t id) {
  if (--refcount_[id] == 0) free_pages_.push_back(id);
}

void KiviKernelKvCache::own_touched_pages(Seq& s, int64_t before, int64_t after) {
  const int64_t P = layout_.page_size;
  // The append writes whole key pages for the key chunks that become due and value rows one by one.
  const int64_t kb = kernels::kivi_k_quant_len(layout_, before);
  const int64_t ka = kernels::kivi_k_quant_len(layout_, after);
  const int64_t vb = kernels::kivi_v_quant_len(layout_, before);
  const int64_t va = kernels::kivi_v_quant_len(layout_, after);
  std::vector<int64_t> touched;
  for (int64_t p = kb / P; p < ka / P; ++p) touched.push_back(p);
  for (int64_t p = vb / P; p < (va + P - 1) / P; ++p) touched.push_back(p);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (int64_t p : touched) {
    if (p >= static_cast<int64_t>(s.pages.size()) || refcount_[s.pages[p]] <= 1) continue;
    const int32_t old = s.pages[p], fresh = alloc_page();  // may grow (move) the pools
    for (auto& pool : pools_)
      for (at::Tensor* t : {&pool.k_codes, &pool.k_scales, &pool.k_mins, &pool.v_codes,
                            &pool.v_scales, &pool.v_mins})
        t->select(0, fresh).copy_(t->select(0, old));
    unref_page(old);
    s.pages[p] = fresh;
    ++cow_copies_;
  }
}

int32_t KiviKernelKvCache::alloc_ring_row() {
  if (free_rings_.empty()) {
    const int64_t cap = ring_capacity_ * 2;
    for (auto& r : k_ring_) r = grown(r, cap);
    for (auto& r : v_ring_) r = grown(r, cap);
    for (int64_t i = cap - 1; i >= ring_capacity_; --i)
      free_rings_.push_back(static_cast<int32_t>(i));
    ring_capacity_ = cap;
  }
  const int32_t id = free_rings_.back();
  free_rings_.pop_back();
  return id;
}

void KiviKernelKvCache::ensure_pages(Seq& s, int64_t n) {
  const auto need = static_cast<size_t>(kernels::kivi_pages_needed(layout_, n));
  while (s.pages.size() < need) s.pages.push_back(alloc_page());
}

void KiviKernelKvCache::free_pages_beyond(Seq& s, int64_t n) {
  const auto need = static_cast<size_t>(kernels::kivi_pages_needed(layout_, n));
  while (s.pages.size() > need) {
    unref_page(s.pages.back());
    s.pages.pop_back();
  }
}

KiviKernelKvCache::Seq KiviKernelKvCache::new_seq(int64_t) {
  Seq s;
  s.ring_row = alloc_ring_row();
  return s;
}

void KiviKernelKvCache::begin_step(const StepBatch& batch) {
  const int64_t B = batch.batch_size();
  SeqStore::begin_step(batch);  // new sequences first (a ring row each)
  kernels::KiviStepTables& t = step_tables_;
  t = kernels::KiviStepTables();
  t.page_indptr.push_back(0);
  t.new_indptr.push_back(0);
  step_decode_ = B > 0;
  step_ring_rows_.clear();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t id = batch.seq_ids[b];
    const int64_t n = batch.new_tokens(b), after = batch.past_lens[b] + n;
    if (n != 1) step_decode_ = false;
    // Pages shared with a fork are copied before this step writes them; then the pools grow. (Both
    // may move the pools; map elements stay where they are.)
    own_touched_pages(seqs_.at(id), batch.past_lens[b], after);
    ensure_pages(seqs_.at(id), after);
    const Seq& s = seqs_.at(id);
    t.page_indices.insert(t.page_indices.end(), s.pages.begin(), s.pages.end());
    t.page_indptr.push_back(static_cast<int32_t>(t.page_indices.size()));
    t.kv_lens_before.push_back(static_cast<int32_t>(batch.past_lens[b]));
    t.kv_lens_after.push_back(static_cast<int32_t>(after));
    t.new_indptr.push_back(static_cast<int32_t>(batch.q_indptr[b + 1]));
    step_ring_rows_.push_back(s.ring_row);
  }
  step_rings_consecutive_ = true;
  for (int64_t b = 1; b < B; ++b)
    if (step_ring_rows_[b] != step_ring_rows_[0] + b) step_rings_consecutive_ = false;
  if (!step_rings_consecutive_) step_ring_index_ = long_tensor(step_ring_rows_, ctx_.device);
  t.upload(ctx_.device);
}

std::pair<at::Tensor, at::Tensor> KiviKernelKvCache::step_rings(int layer) {
  const int64_t B = static_cast<int64_t>(step_ring_rows_.size());
  if (step_rings_consecutive_) {
    const int64_t row0 = B > 0 ? step_ring_rows_[0] : 0;
    return {k_ring_[layer].narrow(0, row0, B), v_ring_[layer].narrow(0, row0, B)};
  }
  return {k_ring_[layer].index_select(0, step_ring_index_),
          v_ring_[layer].index_select(0, step_ring_index_)};
}

void KiviKernelKvCache::put_rings(int layer, const at::Tensor& k, const at::Tensor& v) {
  if (step_rings_consecutive_) return;  // the kernels wrote through the view
  k_ring_[layer].index_copy_(0, step_ring_index_, k);
  v_ring_[layer].index_copy_(0, step_ring_index_, v);
}

at::Tensor KiviKernelKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const int l = in.layer;
  auto [kr, vr] = step_rings(l);
  at::Tensor kn = in.k->to(ring_dtype_).contiguous();
  at::Tensor vn = in.v->to(ring_dtype_).contiguous();
  if (step_decode_) {
    // Append first: the kernel reads the current token from the store (see the header).
    kernels::kivi_append(layout_, pools_[l], kr, vr, kn, vn, step_tables_);
    at::Tensor o = kernels::kivi_decode_attention(in.q->to(ring_dtype_), layout_, pools_[l], kr, vr,
                                                  step_tables_, in.sm_scale, cuda_kernel_);
    put_rings(l, kr, vr);
    return o.to(in.q->scalar_type());
  }
  // Several tokens per sequence: exact attention, then the rows enter the store.
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const int64_t start = batch.q_indptr[b], n = batch.new_tokens(b), past = batch.past_lens[b];
    const at::Tensor q = in.q->narrow(0, start, n);
    at::Tensor k = in.k->narrow(0, start, n), v = in.v->narrow(0, start, n);
    if (past > 0) {
      const Seq& s = seqs_.at(batch.seq_ids[b]);
      auto [K, V] = kernels::kivi_dequantize(layout_, pools_[l], k_ring_[l][s.ring_row],
                                             v_ring_[l][s.ring_row], s.pages, past);
      k = at::cat({K.to(q.scalar_type()), k.to(q.scalar_type())});
      v = at::cat({V.to(q.scalar_type()), v.to(q.scalar_type())});
      if (l == 0) ++dequantized_history_steps_;
    }
    outs.push_back(attend_dense(q, k, v, in.sm_scale));
  }
  kernels::kivi_append(layout_, pools_[l], kr, vr, kn, vn, step_tables_);
  put_rings(l, kr, vr);
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

void KiviKernelKvCache::end_step(const StepBatch& batch) {
  SeqStore::end_step(batch);
  if (batch.batch_size() > 0) ++(step_decode_ ? decode_kernel_steps_ : exact_steps_);
}

void KiviKernelKvCache::release(int64_t seq_id) {
  const Seq* s = seqs_.find(seq_id);
  if (!s) return;
  for (int32_t p : s->pages) unref_page(p);
  free_rings_.push_back(s->ring_row);
  SeqStore::release(seq_id);
}

void KiviKernelKvCache::fork(int64_t src_id, int64_t dst_id) {
  Seq d;
  d.len = seqs_.at(src_id).len;
  d.ring_row = alloc_ring_row();
  const Seq& s = seqs_.at(src_id);
  // Pages are shared (copy-on-write: own_touched_pages copies one before a step writes into it);
  // the residual ring is per sequence and copied.
  d.pages = s.pages;
  for (int32_t p : d.pages) ++refcount_[p];
  for (size_t l = 0; l < k_ring_.size(); ++l) {
    k_ring_[l][d.ring_row].copy_(k_ring_[l][s.ring_row]);
    v_ring_[l][d.ring_row].copy_(v_ring_[l][s.ring_row]);
  }
  seqs_.add(dst_id, std::move(d), "fork target ");
}

void KiviKernelKvCache::truncate(int64_t seq_id, int64_t new_len) {
  Seq& s = seqs_.truncating(seq_id, new_len);
  if (new_len == s.len) return;
  const int64_t kq = kernels::kivi_k_quant_len(layout_, new_len);
  const int64_t vq = kernels::kivi_v_quant_len(layout_, new_len);
  auto slots = [&](int64_t from) {
    std::vector<int64_t> v;
    for (int64_t j = from; j < new_len; ++j) v.push_back(j % U_);
    return long_tensor(v, ctx_.device);
  };
  const at::Tensor k_slots = slots(kq), v_slots = slots(vq);
  for (size_t l = 0; l < pools_.size(); ++l) {
    // Rows that were quantized but are residual at the new length come back dequantized; rows that
    // were residual already come back exactly (fp16/bf16 -> fp32 -> the same dtype).
    auto [K, V] = kernels::kivi_dequantize(layout_, pools_[l], k_ring_[l][s.ring_row],
                                           v_ring_[l][s.ring_row], s.pages, s.len);
    if (new_len > kq)
      k_ring_[l][s.ring_row].index_copy_(0, k_slots, K.narrow(0, kq, new_len - kq).to(ring_dtype_));
    if (new_len > vq)
      v_ring_[l][s.ring_row].index_copy_(0, v_slots, V.narrow(0, vq, new_len - vq).to(ring_dtype_));
  }
  free_pages_beyond(s, new_len);
  s.len = new_len;
}

std::pair<at::Tensor, at::Tensor> KiviKernelKvCache::dequantized(int layer, int64_t seq_id) const {
  const Seq& s = seqs_.at(seq_id);
  return kernels::kivi_dequantize(layout_, pools_.at(layer), k_ring_[layer][s.ring_row],
                                  v_ring_[layer][s.ring_row], s.pages, s.len);
}

Footprint KiviKernelKvCache::footprint() const {
  const int64_t L = ctx_.config.n_layers;
  const int64_t row_bytes =
      static_cast<int64_t>(layout_.num_kv_heads) * layout_.head_dim * c10::elementSize(ring_dtype_);
  const int64_t page_bytes =
      kernels::kivi_page_code_bytes(layout_) + kernels::kivi_page_meta_bytes(layout_);
  // Pages shared by forks are counted once; each sequence's page table is its own.
  const int64_t pages = page_capacity_ - static_cast<int64_t>(free_pages_.size());
  int64_t table_entries = 0, residual_rows = 0;
  Footprint f;
  for (const auto& [id, s] : seqs_) {
    table_entries += static_cast<int64_t>(s.pages.size());
    residual_rows += (s.len - kernels::kivi_k_quant_len(layout_, s.len)) +
                     (s.len - kernels::kivi_v_quant_len(layout_, s.len));
    f.tokens_held += s.len;
  }
  const int64_t rings = static_cast<int64_t>(seqs_.size());
  f.device_payload_bytes =
      L * (pages * kernels::kivi_page_code_bytes(layout_) + residual_rows * row_bytes);
  f.device_metadata_bytes = L * pages * kernels::kivi_page_meta_bytes(layout_);
  f.device_index_bytes = table_entries * 4 + rings * 4;  // page tables, ring rows (all layers)
  f.device_reserved_bytes = L * ((page_capacity_ - pages) * page_bytes +
                                 (ring_capacity_ * 2 * U_ - residual_rows) * row_bytes);
  f.logical_bytes = f.tokens_held * ctx_.config.kv_bytes_per_token(
                                        static_cast<int64_t>(c10::elementSize(ctx_.dtype)));
  f.model_dtype_device_bytes = 0;  // codes, scales and a residual in its own dtype
  return f;
}

std::map<std::string, double> KiviKernelKvCache::counters() const {
  std::map<std::string, double> m = extra_counters_;
  m["kernel_store"] = 1;
  m["k_bits"] = layout_.k_bits;
  m["v_bits"] = layout_.v_bits;
  m["k_group_size"] = layout_.page_size;
  m["v_group_size"] = layout_.v_group_size;
  m["residual_length"] = layout_.residual_length;
  m["decode_kernel_steps"] = static_cast<double>(decode_kernel_steps_);
  m["exact_steps"] = static_cast<double>(exact_steps_);
  m["dequantized_history_steps"] = static_cast<double>(dequantized_history_steps_);
  m["cow_page_copies"] = static_cast<double>(cow_copies_);
  const Footprint f = footprint();
  const double elems = static_cast<double>(f.tokens_held) * ctx_.config.n_layers * 2 *
                       static_cast<double>(ctx_.config.kv_dim());
  if (elems > 0)
    m["effective_bits_per_element"] =
        8.0 * static_cast<double>(f.device_payload_bytes + f.device_metadata_bytes) / elems;
  return m;
}

std::vector<HeadSnapshot> KiviKernelKvCache::probe_view(int layer, int64_t seq_id) const {
  auto [K, V] = dequantized(layer, seq_id);
  const int64_t n = K.size(0);
  at::Tensor index = at::arange(n, at::kLong);
  std::vector<HeadSnapshot> out;
  for (int64_t h = 0; h < layout_.num_kv_heads; ++h)
    out.push_back({K.select(1, h).to(at::kCPU).contiguous(),
                   V.select(1, h).to(at::kCPU).contiguous(), index});
  return out;
}

}  // namespace kvb
