#pragma once
// Exact attention of one query head over entries gathered from wherever a store keeps them (a
// head's kept rows, a store's selected pages, reconstructed or merged rows), on raw fp32 pointers.
// The stores that score, select or reconstruct entries themselves (the eviction store's scored
// path, KVReviver, Quest) attend through these, so the arithmetic is written once and in one order.
//
// The entries are given by callables: key(j) and value(j) return pointers to entry j's [head_dim]
// fp32 rows, so a store gathers without copying.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kvb {

// logit[j] = (q . k_j) * scale for j < n, the products summed in fp32 in channel order; returns the
// largest, -inf when n = 0. q: [head_dim]; logit: [n].
template <typename Key>
inline float key_logits_f32(const float* q, int64_t head_dim, float scale, int64_t n, Key key,
                            float* logit) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = key(j);
    float dot = 0.f;
    for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * kj[d];
    logit[j] = dot * scale;
    mx = std::max(mx, logit[j]);
  }
  return mx;
}

// fp32 throughout, in entry order: logit_j = (q . k_j) * scale (+ bias[j] for j < n_bias),
// p[j] = exp(logit_j - max) (left unnormalised in p), o = (sum_j p[j] v_j) * (1 / sum_j p[j]).
// Returns 1 / sum_j p[j], so a caller can read probabilities as p[j] * the result. m >= 1.
// q, o: [head_dim]; p: [m] scratch.
template <typename Key, typename Value>
inline float attend_entries_f32(const float* q, int64_t head_dim, float scale, int64_t m, Key key,
                                Value value, const float* bias, int64_t n_bias, float* p,
                                float* o) {
  float mx = key_logits_f32(q, head_dim, scale, m, key, p);
  if (n_bias > 0) {  // the bias moves the maximum: taken again over the biased logits
    for (int64_t j = 0; j < std::min(n_bias, m); ++j) p[j] += bias[j];
    mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < m; ++j) mx = std::max(mx, p[j]);
  }
  float sum = 0.f;
  for (int64_t j = 0; j < m; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  const float inv = 1.f / sum;
  std::fill(o, o + head_dim, 0.f);
  for (int64_t j = 0; j < m; ++j) {
    const float w = p[j];
    const float* vj = value(j);
    for (int64_t d = 0; d < head_dim; ++d) o[d] += w * vj[d];
  }
  for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
  return inv;
}

// The same with exponentials, sums and the weighted sum in fp64 (the tiering stores: TTKV,
// RetroInfer): logit_j = (q . k_j) * scale in fp32 for j < n_keys, the caller's logit[j] for the
// entries after them (summarised entries whose logit is no key product: RetroInfer's estimated
// clusters); o = sum_j p_j v_j w_j / sum_j p_j with p_j = exp(logit_j - max) in fp64 and
// w_j = value_scale(j). logit: [m] scratch whose entries from n_keys on are given.
template <typename Key, typename Value, typename ValueScale>
inline void attend_entries_f64(const float* q, int64_t head_dim, float scale, int64_t n_keys,
                               int64_t m, Key key, Value value, ValueScale value_scale,
                               float* logit, double* acc, float* o) {
  float mx = key_logits_f32(q, head_dim, scale, n_keys, key, logit);
  for (int64_t j = n_keys; j < m; ++j) mx = std::max(mx, logit[j]);
  double sum = 0;
  std::fill(acc, acc + head_dim, 0.0);
  for (int64_t j = 0; j < m; ++j) {
    const double p = std::exp(static_cast<double>(logit[j] - mx));
    sum += p;
    const float* vj = value(j);
    const double w = value_scale(j);
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * vj[d] * w;
  }
  for (int64_t d = 0; d < head_dim; ++d) o[d] = static_cast<float>(acc[d] / sum);
}

}  // namespace kvb
