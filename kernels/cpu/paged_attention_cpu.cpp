#include <algorithm>
#include <cmath>
#include <vector>

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/paged_attention.h"

namespace kvb::kernels {

namespace {

// One (token, kv head): the query group's heads share each K/V row read. Online softmax keeps one
// pass over the keys; scores for a page are computed first so the exp/rescale runs once per page.
// Compiled for AVX2 as well (cpu_clones.h); the same bits either way (std::exp, sums in order).
KVB_CPU_CLONES void attend_group(const PagedAttentionParams& p, int b, int64_t t, int kvh,
                                 float* scratch) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t page_stride = p.page_size * tok_stride;
  const int32_t* pages = p.page_indices + p.page_indptr[b];
  const int64_t n_keys = p.past_lens[b] + (t - p.q_indptr[b]) + 1;

  float* acc = scratch;                         // [group, hd]
  float* m = acc + group * hd;                  // [group]
  float* l = m + group;                         // [group]
  float* s = l + group;                         // [group, page_size]
  for (int g = 0; g < group; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  std::fill(acc, acc + group * hd, 0.f);
  const float* qbase = p.q + (t * p.num_qo_heads + kvh * group) * hd;

  for (int64_t j0 = 0; j0 < n_keys; j0 += p.page_size) {
    const int64_t n = std::min<int64_t>(p.page_size, n_keys - j0);
    const float* kpage = p.k_pages + pages[j0 / p.page_size] * page_stride + kvh * hd;
    const float* vpage = p.v_pages + pages[j0 / p.page_size] * page_stride + kvh * hd;
    for (int g = 0; g < group; ++g) {
      const float* q = qbase + g * hd;
      float* sg = s + g * p.page_size;
      float mx = m[g];
      for (int64_t j = 0; j < n; ++j) {
        const float* k = kpage + j * tok_stride;
        float dot = 0.f;
        for (int d = 0; d < hd; ++d) dot += q[d] * k[d];
        sg[j] = dot * p.sm_scale;
        mx = std::max(mx, sg[j]);
      }
      const float corr = std::exp(m[g] - mx);  // exp(-inf) = 0 on the first page
      float* a = acc + g * hd;
      for (int d = 0; d < hd; ++d) a[d] *= corr;
      float sum = l[g] * corr;
      for (int64_t j = 0; j < n; ++j) {
        sg[j] = std::exp(sg[j] - mx);
        sum += sg[j];
      }
      detail::accumulate_rows(a, sg, vpage, n, tok_stride, hd);
      m[g] = mx;
      l[g] = sum;
    }
  }
  float* obase = p.o + (t * p.num_qo_heads + kvh * group) * hd;
  for (int g = 0; g < group; ++g) {
    const float inv = 1.f / l[g];
    for (int d = 0; d < hd; ++d) obase[g * hd + d] = acc[g * hd + d] * inv;
  }
}

}  // namespace

void paged_attention_cpu(const PagedAttentionParams& p) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const size_t scratch_floats = static_cast<size_t>(group) * (p.head_dim + 2 + p.page_size);
  // Work items: (token, kv head). Tokens are found from items through the batch's q_indptr.
  const int64_t num_tokens = p.q_indptr[p.batch_size];
  std::vector<int32_t> token_seq(num_tokens);
  int64_t total_keys = 0;
  for (int b = 0; b < p.batch_size; ++b) {
    for (int64_t t = p.q_indptr[b]; t < p.q_indptr[b + 1]; ++t) {
      token_seq[t] = b;
      total_keys += p.past_lens[b] + (t - p.q_indptr[b]) + 1;
    }
  }
  const int64_t items = num_tokens * p.num_kv_heads;
  // Threads only pay off past a few hundred thousand multiply-adds (fork/join costs ~microseconds).
  const bool parallel = total_keys * p.num_qo_heads * p.head_dim > (1 << 18);
#pragma omp parallel if (parallel)
  {
    std::vector<float> scratch(scratch_floats);
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t t = it / p.num_kv_heads;
      attend_group(p, token_seq[t], t, static_cast<int>(it % p.num_kv_heads), scratch.data());
    }
  }
}

}  // namespace kvb::kernels
