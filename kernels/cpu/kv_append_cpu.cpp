// Paged append on the CPU (kv_append.h): one memcpy per token row when the dtypes match, else a
// converting copy through fp32 (the same rounding as the oracle).

#include <cstring>
#include <vector>

#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/kv_append.h"

namespace kvb::kernels {

void paged_append_cpu(const PagedAppendParams& p) {
  const int64_t row = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t sb = kv_dtype_bytes(p.src_dtype), db = kv_dtype_bytes(p.dtype);
  std::vector<float> tmp(static_cast<size_t>(row));
  for (int b = 0; b < p.batch_size; ++b) {
    const int32_t* pages = p.page_indices + p.page_indptr[b];
    for (int64_t t = p.new_indptr[b]; t < p.new_indptr[b + 1]; ++t) {
      const int64_t j = p.kv_lens[b] + (t - p.new_indptr[b]);
      const int64_t dst =
          (static_cast<int64_t>(pages[j / p.page_size]) * p.page_size + j % p.page_size) * row;
      for (int kv = 0; kv < 2; ++kv) {
        const void* src = kv ? p.v_new : p.k_new;
        void* pool = kv ? p.v_pages : p.k_pages;
        if (p.src_dtype == p.dtype) {
          std::memcpy(static_cast<uint8_t*>(pool) + dst * db,
                      static_cast<const uint8_t*>(src) + t * row * sb,
                      static_cast<size_t>(row * db));
        } else {
          detail::load_row(src, p.src_dtype, t * row, row, tmp.data());
          detail::store_row(pool, p.dtype, dst, row, tmp.data());
        }
      }
    }
  }
}

}  // namespace kvb::kernels
