#include <cmath>
#include <vector>

#include "kvb/kernels/paged_attention.h"

namespace kvb::kernels {

std::string paged_attention_check(const PagedAttentionParams& p) {
  if (!p.q || !p.o || !p.k_pages || !p.v_pages || !p.page_indptr || !p.page_indices ||
      !p.q_indptr || !p.past_lens)
    return "null pointer";
  if (p.batch_size < 0 || p.num_qo_heads <= 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 ||
      p.page_size <= 0)
    return "non-positive size";
  if (p.num_qo_heads % p.num_kv_heads != 0) return "num_qo_heads not a multiple of num_kv_heads";
  if (p.qo_token_stride != 0 && p.qo_token_stride < static_cast<int64_t>(p.num_qo_heads) * p.head_dim)
    return "qo_token_stride shorter than a token's heads";
  for (int b = 0; b < p.batch_size; ++b) {
    const int64_t n_new = p.q_indptr[b + 1] - p.q_indptr[b];
    const int64_t len = p.past_lens[b] + n_new;
    const int64_t pages = p.page_indptr[b + 1] - p.page_indptr[b];
    if (n_new < 0 || p.past_lens[b] < 0) return "negative length";
    if (pages * p.page_size < len) return "too few pages for sequence " + std::to_string(b);
  }
  return "";
}

void paged_attention_ref(const PagedAttentionParams& p) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int64_t hd = p.head_dim;
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t page_stride = p.page_size * tok_stride;
  for (int b = 0; b < p.batch_size; ++b) {
    const int32_t* pages = p.page_indices + p.page_indptr[b];
    for (int64_t t = p.q_indptr[b]; t < p.q_indptr[b + 1]; ++t) {
      const int64_t n_keys = p.past_lens[b] + (t - p.q_indptr[b]) + 1;
      for (int h = 0; h < p.num_qo_heads; ++h) {
        const int kvh = h / group;
        const float* q = p.q + t * p.qo_stride() + h * hd;
        std::vector<double> s(n_keys);
        double mx = -INFINITY;
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* k = p.k_pages + pages[j / p.page_size] * page_stride +
                           (j % p.page_size) * tok_stride + kvh * hd;
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[d];
          s[j] = dot * p.sm_scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        float* o = p.o + t * p.qo_stride() + h * hd;
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < n_keys; ++j) {
            const float* v = p.v_pages + pages[j / p.page_size] * page_stride +
                             (j % p.page_size) * tok_stride + kvh * hd;
            acc += s[j] * v[d];
          }
          o[d] = static_cast<float>(acc / sum);
        }
      }
    }
  }
}

}  // namespace kvb::kernels
