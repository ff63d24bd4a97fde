#pragma once
// Append of new K/V rows into a paged fp16/bf16/fp32 store (the layout of paged_attention.h and
// decode_attention.h), converting from the source dtype (round to nearest even). The quantizing
// append into the KIVI store is in kivi_cache.h. Torch-free, CUDA-free.

#include <cstdint>
#include <string>

#include "kvb/kernels/decode_attention.h"

namespace kvb::kernels {

struct PagedAppendParams {
  KvDtype src_dtype = KvDtype::kF16;      // of k_new, v_new: fp16, bf16 or fp32
  KvDtype dtype = KvDtype::kF16;          // of the pages: fp16, bf16 or fp32
  const void* k_new = nullptr;            // [num_new_tokens, num_kv_heads, head_dim], src_dtype
  const void* v_new = nullptr;            // [num_new_tokens, num_kv_heads, head_dim], src_dtype
  const int32_t* new_indptr = nullptr;    // [batch_size + 1], sequence b's rows of k_new / v_new
  const int32_t* kv_lens = nullptr;       // [batch_size], tokens in the store BEFORE the append
  void* k_pages = nullptr;                // [num_pages, page_size, num_kv_heads, head_dim], dtype
  void* v_pages = nullptr;                // same layout
  const int32_t* page_indptr = nullptr;   // [batch_size + 1], covering the store AFTER the append
  const int32_t* page_indices = nullptr;  // [page_indptr[batch_size]]
  int32_t batch_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
};

std::string paged_append_check(const PagedAppendParams& p);  // reads host-side arrays
void paged_append_ref(const PagedAppendParams& p);           // element by element through fp32
void paged_append_cpu(const PagedAppendParams& p);  // row copies (memcpy when dtypes match)

}  // namespace kvb::kernels
