// attention_prob_sums_f32 against an fp64 two-pass softmax: window rows with their own visible
// prefixes (causal, and one row that sees nothing), GQA groups, head dims that are and are not
// multiples of 8, and sums added to what the output held.

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "kvb/kernels/attention_scores.h"

namespace kvb::kernels {
namespace {

TEST(AttentionScores, WindowProbabilitySumsMatchAnFp64Softmax) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto [G, D, len] : {std::array<int64_t, 3>{1, 64, 300}, {3, 64, 77}, {4, 12, 40}}) {
    const int64_t n = 9, H = G * 2, q_stride = H * D;  // q rows of a wider tensor: head group 1 of 2
    std::vector<float> q(n * q_stride), k(len * D), out(G * len), want(G * len);
    for (auto* v : {&q, &k})
      for (auto& x : *v) x = nd(rng);
    for (size_t i = 0; i < out.size(); ++i) out[i] = want[i] = 0.25f * static_cast<float>(i % 3);
    std::vector<int64_t> vis(n);
    for (int64_t i = 0; i < n; ++i) vis[i] = len - n + 1 + i;  // causal: the window's last rows
    vis[0] = 0;  // a row that sees no key adds nothing
    const float* qg = q.data() + G * D;  // the second kv head's group
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t g = 0; g < G; ++g) {
        if (vis[i] == 0) continue;
        std::vector<double> s(vis[i]);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < vis[i]; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += double(qg[i * q_stride + g * D + c]) * k[j * D + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j < vis[i]; ++j) want[g * len + j] += static_cast<float>(s[j] / sum);
      }
    std::vector<float> scratch(len);
    attention_prob_sums_f32(qg, q_stride, n, G, D, k.data(), len, vis.data(), scale, out.data(), len,
                            scratch.data());
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "G " << G << " D " << D << " at " << i;
  }
}

}  // namespace
}  // namespace kvb::kernels
