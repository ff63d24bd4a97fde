// kv_append.h: checks and the element-by-element oracle of the paged append.

#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/kv_append.h"

namespace kvb::kernels {

std::string paged_append_check(const PagedAppendParams& p) {
  if (!p.k_new || !p.v_new || !p.new_indptr || !p.kv_lens || !p.k_pages || !p.v_pages ||
      !p.page_indptr || !p.page_indices)
    return "null pointer";
  if (p.batch_size < 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 || p.page_size <= 0)
    return "non-positive size";
  if (p.page_indptr[0] != 0 || p.new_indptr[0] != 0) return "page_indptr[0] or new_indptr[0] != 0";
  for (int b = 0; b < p.batch_size; ++b) {
    const std::string seq = " (sequence " + std::to_string(b) + ")";
    const int64_t add = p.new_indptr[b + 1] - p.new_indptr[b];
    if (add < 0 || p.kv_lens[b] < 0) return "negative length" + seq;
    const int64_t pages = p.page_indptr[b + 1] - p.page_indptr[b];
    if (pages * p.page_size < p.kv_lens[b] + add)
      return "too few pages for the appended length" + seq;
  }
  return "";
}

void paged_append_ref(const PagedAppendParams& p) {
  const int64_t hd = p.head_dim, H = p.num_kv_heads;
  for (int b = 0; b < p.batch_size; ++b) {
    const int32_t* pages = p.page_indices + p.page_indptr[b];
    for (int64_t t = p.new_indptr[b]; t < p.new_indptr[b + 1]; ++t) {
      const int64_t j = p.kv_lens[b] + (t - p.new_indptr[b]);
      const int64_t dst_tok =
          static_cast<int64_t>(pages[j / p.page_size]) * p.page_size + j % p.page_size;
      for (int64_t i = 0; i < H * hd; ++i) {
        detail::store_elem(p.k_pages, p.dtype, dst_tok * H * hd + i,
                           detail::load_elem(p.k_new, p.src_dtype, t * H * hd + i));
        detail::store_elem(p.v_pages, p.dtype, dst_tok * H * hd + i,
                           detail::load_elem(p.v_new, p.src_dtype, t * H * hd + i));
      }
    }
  }
}

}  // namespace kvb::kernels
