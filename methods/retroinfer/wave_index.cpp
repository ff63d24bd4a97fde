#include "methods/retroinfer/wave_index.h"

#include <algorithm>
#include <cmath>

namespace kvb::retroinfer {

namespace {

// Spherical k-means of the centered, normalized rows x [n, D]; returns each row's cluster in
// [0, k). Empty clusters keep their previous direction.
std::vector<int32_t> spherical_kmeans(const std::vector<float>& x, int64_t n, int64_t D, int64_t k,
                                      int iters) {
  std::vector<float> c(static_cast<size_t>(k * D));
  for (int64_t j = 0; j < k; ++j) {  // evenly spaced rows as the initial directions
    const int64_t r = (2 * j + 1) * n / (2 * k);
    std::copy(x.begin() + r * D, x.begin() + (r + 1) * D, c.begin() + j * D);
  }
  std::vector<int32_t> assign(static_cast<size_t>(n), 0);
  std::vector<float> sum(static_cast<size_t>(k * D));
  for (int it = 0; it < iters; ++it) {
    bool changed = false;
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * D;
      float best = -INFINITY;
      int32_t arg = 0;
      for (int64_t j = 0; j < k; ++j) {
        const float* cj = c.data() + j * D;
        float s = 0;
        for (int64_t d = 0; d < D; ++d) s += xi[d] * cj[d];
        if (s > best) best = s, arg = static_cast<int32_t>(j);
      }
      changed = changed || assign[i] != arg;
      assign[i] = arg;
    }
    if (it > 0 && !changed) break;  // converged: the centroids would not move
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) sum[assign[i] * D + d] += x[i * D + d];
    for (int64_t j = 0; j < k; ++j) {
      double norm = 0;
      for (int64_t d = 0; d < D; ++d) norm += static_cast<double>(sum[j * D + d]) * sum[j * D + d];
      if (norm <= 0) continue;  // empty (or degenerate) cluster: keep its direction
      const float inv = static_cast<float>(1.0 / std::sqrt(norm));
      for (int64_t d = 0; d < D; ++d) c[j * D + d] = sum[j * D + d] * inv;
    }
  }
  return assign;
}

}  // namespace

std::vector<Cluster> build_clusters(const float* k, const float* v, int64_t stride, int64_t D,
                                    int64_t begin, int64_t end, const ClusterOptions& o) {
  std::vector<Cluster> out;
  const int64_t n = end - begin;
  if (n <= 0) return out;
  std::vector<double> mean(static_cast<size_t>(D), 0.0);
  for (int64_t t = begin; t < end; ++t)
    for (int64_t d = 0; d < D; ++d) mean[d] += k[t * stride + d];
  for (auto& m : mean) m /= static_cast<double>(n);
  const int64_t seg_len = std::max<int64_t>(1, o.segment);
  for (int64_t s0 = begin; s0 < end; s0 += seg_len) {
    const int64_t s1 = std::min(end, s0 + seg_len), m = s1 - s0;
    const int64_t kc = std::max<int64_t>(1, (m + o.cluster_size - 1) / o.cluster_size);
    std::vector<float> x(static_cast<size_t>(m * D));
    for (int64_t i = 0; i < m; ++i) {
      double norm = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double c = k[(s0 + i) * stride + d] - mean[d];
        x[i * D + d] = static_cast<float>(c);
        norm += c * c;
      }
      const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.0f;
      for (int64_t d = 0; d < D; ++d) x[i * D + d] *= inv;
    }
    const std::vector<int32_t> assign = spherical_kmeans(x, m, D, kc, o.iters);
    std::vector<Cluster> seg(static_cast<size_t>(kc));
    for (auto& c : seg) {
      c.centroid.assign(static_cast<size_t>(D), 0.0f);
      c.value_sum.assign(static_cast<size_t>(D), 0.0f);
    }
    for (int64_t i = 0; i < m; ++i) {
      Cluster& c = seg[assign[i]];
      const int64_t t = s0 + i;
      c.members.push_back(static_cast<int32_t>(t));
      for (int64_t d = 0; d < D; ++d) {
        c.centroid[d] += k[t * stride + d];
        c.value_sum[d] += v[t * stride + d];
      }
    }
    for (auto& c : seg) {
      if (c.members.empty()) continue;
      const float inv = 1.0f / static_cast<float>(c.members.size());
      for (auto& x : c.centroid) x *= inv;
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace kvb::retroinfer
