#pragma once
// Exact attention of one sequence's new queries over keys/values a store has gathered for it. Stores
// that keep a sequence contiguously (or gather it) call this; paged stores use the paged kernels.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace kvb {

// q: [n, num_qo_heads, head_dim] (the sequence's new tokens, post-RoPE); k, v: [L, num_kv_heads,
// head_dim] with L >= n. Query i sits at cache index past + i (past = L - n) and sees keys
// j <= past + i. Returns [n, num_qo_heads, head_dim] in q's dtype. Softmax in fp32.
at::Tensor attend_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        float sm_scale);

// The same over rows a host store keeps at fp32: k, v: [rows, kv_heads, head_dim] fp32 host
// memory (read, not copied, when q is fp32; converted to q's dtype otherwise). q on the CPU.
at::Tensor attend_dense_rows(const at::Tensor& q, const float* k, const float* v, int64_t rows,
                             int64_t kv_heads, int64_t head_dim, float sm_scale);

// The CPU kernel behind both on raw fp32 rows, with its tiled prefill path: n query rows (qo_stride
// floats apart) of num_qo_heads heads over past + n contiguous key and value rows of num_kv_heads
// heads ([rows, num_kv_heads, head_dim], one page); o is written in q's layout.
void attend_rows_f32(const float* q, float* o, int64_t qo_stride, const float* k, const float* v,
                     int64_t past, int64_t n, int64_t num_qo_heads, int64_t num_kv_heads,
                     int64_t head_dim, float sm_scale);

}  // namespace kvb
