#include "harness/kv/attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "kvb/kernels/paged_attention.h"

namespace kvb {

void attend_rows_f32(const float* q, float* o, int64_t qo_stride, const float* k, const float* v,
                     int64_t past, int64_t n, int64_t num_qo_heads, int64_t num_kv_heads,
                     int64_t head_dim, float sm_scale) {
  const int32_t page_indptr[2] = {0, 1}, page = 0;
  const int64_t q_indptr[2] = {0, n};
  kernels::PagedAttentionParams p;
  p.q = q;
  p.o = o;
  p.qo_token_stride = qo_stride;
  p.k_pages = k;
  p.v_pages = v;
  p.page_indptr = page_indptr;
  p.page_indices = &page;
  p.q_indptr = q_indptr;
  p.past_lens = &past;
  p.batch_size = 1;
  p.num_qo_heads = static_cast<int32_t>(num_qo_heads);
  p.num_kv_heads = static_cast<int32_t>(num_kv_heads);
  p.head_dim = static_cast<int32_t>(head_dim);
  p.page_size = static_cast<int32_t>(std::max<int64_t>(past + n, 1));
  p.sm_scale = sm_scale;
  kernels::paged_attention_cpu(p);
}

at::Tensor attend_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        float sm_scale) {
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t L = k.size(0), Hk = k.size(1), G = H / Hk;
  const int64_t past = L - n;
  if (q.device().is_cpu() && q.scalar_type() == at::kFloat && k.is_contiguous() &&
      v.is_contiguous()) {
    // One sequence as one page of L tokens: the CPU kernel, no per-op dispatch.
    at::Tensor qc = q.contiguous();
    at::Tensor o = at::empty_like(qc);
    attend_rows_f32(qc.data_ptr<float>(), o.data_ptr<float>(), H * D, k.data_ptr<float>(),
                    v.data_ptr<float>(), past, n, H, Hk, D, sm_scale);
    return o;
  }
  at::Tensor K = k.permute({1, 0, 2});  // [Hk, L, D]
  at::Tensor V = v.permute({1, 0, 2});
  at::Tensor qh = q.view({n, Hk, G, D}).permute({1, 2, 0, 3}).reshape({Hk, G * n, D});
  at::Tensor s = at::bmm(qh, K.transpose(1, 2)).to(at::kFloat).mul_(sm_scale);  // [Hk, G*n, L]
  if (n > 1) {
    auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
    at::Tensor j = at::arange(L, opts);
    at::Tensor i = at::arange(n, opts) + past;
    at::Tensor mask = j.unsqueeze(0) > i.unsqueeze(1);  // [n, L]
    s.view({Hk, G, n, L}).masked_fill_(mask, -std::numeric_limits<float>::infinity());
  }
  at::Tensor pr = at::softmax(s, -1).to(q.scalar_type());
  at::Tensor o = at::bmm(pr, V);  // [Hk, G*n, D]
  return o.view({Hk, G, n, D}).permute({2, 0, 1, 3}).reshape({n, H, D});
}

at::Tensor attend_dense_rows(const at::Tensor& q, const float* k, const float* v, int64_t rows,
                             int64_t kv_heads, int64_t head_dim, float sm_scale) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor K = at::from_blob(const_cast<float*>(k), {rows, kv_heads, head_dim}, f32);
  at::Tensor V = at::from_blob(const_cast<float*>(v), {rows, kv_heads, head_dim}, f32);
  if (q.scalar_type() != at::kFloat) {
    K = K.to(q.scalar_type());
    V = V.to(q.scalar_type());
  }
  return attend_dense(q, K, V, sm_scale);
}

}  // namespace kvb
