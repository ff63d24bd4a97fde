#pragma once
// Attention of packed query tokens over a paged KV cache (prefill chunks and decode steps alike).
// Torch-free: raw pointers, explicit shapes. Token t of sequence b sits at cache index
// past_lens[b] + (t - q_indptr[b]) and attends causally to cache indices [0, that index].
//
// Layouts (NHD, FlashInfer's vocabulary):
//   q, o:  [num_tokens, num_qo_heads, head_dim], token rows qo_stride() floats apart
//   pages: [num_pages, page_size, num_kv_heads, head_dim]
//   page_indices[page_indptr[b] .. page_indptr[b+1]) are sequence b's pages, in order.

#include <cstdint>
#include <string>

namespace kvb::kernels {

struct PagedAttentionParams {
  const float* q = nullptr;             // [num_tokens, num_qo_heads, head_dim], fp32, host
  float* o = nullptr;                   // [num_tokens, num_qo_heads, head_dim], fp32, host
  const float* k_pages = nullptr;       // [num_pages, page_size, num_kv_heads, head_dim], fp32
  const float* v_pages = nullptr;       // same layout as k_pages
  const int32_t* page_indptr = nullptr; // [batch_size + 1]
  const int32_t* page_indices = nullptr;// [page_indptr[batch_size]]
  const int64_t* q_indptr = nullptr;    // [batch_size + 1], token offsets into q/o
  const int64_t* past_lens = nullptr;   // [batch_size], cache tokens before this step's tokens
  int32_t batch_size = 0;
  int32_t num_qo_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  float sm_scale = 1.0f;
  // Floats from one token's row to the next in q and o; 0: num_qo_heads * head_dim (packed). Larger
  // when q/o are one kv head's group within wider rows (a per-head cache attends head by head).
  int64_t qo_token_stride = 0;
  int64_t qo_stride() const {
    return qo_token_stride > 0 ? qo_token_stride : static_cast<int64_t>(num_qo_heads) * head_dim;
  }
};

// Empty string when supported, else the reason.
std::string paged_attention_check(const PagedAttentionParams& p);

// Scalar oracle: fp64 accumulation, two-pass softmax. Obviously correct, slow.
void paged_attention_ref(const PagedAttentionParams& p);

// Optimised CPU version: fp32, online softmax, one pass over K/V per (token, kv head) serving the
// whole query group, OpenMP over (token, kv head) when the work is large enough.
void paged_attention_cpu(const PagedAttentionParams& p);

}  // namespace kvb::kernels
