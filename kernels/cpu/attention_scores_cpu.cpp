#include <algorithm>
#include <cmath>

#include "kvb/kernels/attention_scores.h"
#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/fast_exp.h"

namespace kvb::kernels {

KVB_CPU_CLONES void attention_prob_sums_f32(const float* q, int64_t q_stride, int64_t n, int64_t G,
                                            int64_t D, const float* k, int64_t len,
                                            const int64_t* vis, float scale, float* out,
                                            int64_t out_g_stride, float* scratch) {
  float* p = scratch;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t m = std::min(vis[i], len);
    if (m <= 0) continue;
    for (int64_t g = 0; g < G; ++g) {
      const float* qi = q + i * q_stride + g * D;
      float mx = -INFINITY;
      for (int64_t j = 0; j < m; ++j) {
        p[j] = detail::dot_f32(qi, k + j * D, D) * scale;
        mx = std::max(mx, p[j]);
      }
      const int mi = static_cast<int>(m);
      for (int j = 0; j < mi; ++j) p[j] = detail::exp_f32(p[j] - mx);  // vectorises
      float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      int64_t j = 0;
      for (; j + 8 <= m; j += 8)
        for (int t = 0; t < 8; ++t) lane[t] += p[j + t];
      for (; j < m; ++j) lane[0] += p[j];
      const float inv =
          1.f / (((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
      float* o = out + g * out_g_stride;
      for (j = 0; j < m; ++j) o[j] += p[j] * inv;
    }
  }
}

}  // namespace kvb::kernels
