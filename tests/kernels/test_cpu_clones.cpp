// The CPU kernels' AVX2 clones (cpu_clones.h) and their helpers: the vectorisable exp is within one
// ulp or two of a correctly rounded exp, accumulate_rows keeps each channel's row order, and the
// fp32 paged-attention kernel (whose clone this machine runs when it has AVX2) computes exactly the
// bits of the same arithmetic written as plain scalar code here (compiled for the
// baseline, so without FMA): no contraction into FMAs, no reordered sums.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/paged_attention.h"

namespace kvb::kernels {
namespace {

int64_t ulp_distance(float a, float b) {
  int32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return std::llabs(static_cast<int64_t>(x) - static_cast<int64_t>(y));
}

TEST(FastExp, WithinTwoUlpOfACorrectlyRoundedExp) {
  int64_t worst = 0;
  float worst_x = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0009765625f * 1.37f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t d = ulp_distance(detail::exp_f32(x), want);
    if (d > worst) worst = d, worst_x = x;
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-30.f, 0.f);  // softmax's shifted scores
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    ASSERT_LE(ulp_distance(detail::exp_f32(x), static_cast<float>(std::exp(double(x)))), 2) << x;
  }
}

TEST(FastExp, EdgeCases) {
  EXPECT_EQ(detail::exp_f32(0.f), 1.f);
  EXPECT_EQ(detail::exp_f32(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_EQ(detail::exp_f32(-100.f), 0.f);
  EXPECT_EQ(detail::exp_f32(89.f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(detail::exp_f32(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(detail::exp_f32(std::nanf(""))));
  EXPECT_GT(detail::exp_f32(-87.f), 0.f);
  EXPECT_FALSE(std::isinf(detail::exp_f32(88.f)));
}

TEST(CpuClones, AccumulateRowsKeepsEachChannelsRowOrder) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t hd : {8, 64, 72, 128}) {
    for (int64_t n : {1, 5, 64}) {
      const int64_t ld = hd + 3;  // rows a stride apart, as in a page
      std::vector<float> e(n), v(n * ld), a(hd), want(hd);
      for (auto& x : e) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      for (int64_t d = 0; d < hd; ++d) a[d] = want[d] = nd(rng);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < hd; ++d) want[d] += e[i] * v[i * ld + d];
      detail::accumulate_rows(a.data(), e.data(), v.data(), n, ld, hd);
      for (int64_t d = 0; d < hd; ++d)
        ASSERT_EQ(a[d], want[d]) << "hd " << hd << " n " << n << " channel " << d;
    }
  }
}

// attend_group's arithmetic as plain scalar code: per page, dot products in eight fixed partial sums,
// exp_f32, the rescale, the weights added row by row.
std::vector<float> paged_in_order(const PagedAttentionParams& p, const std::vector<float>& q,
                                  const std::vector<float>& k, const std::vector<float>& v,
                                  int64_t len) {
  const int group = p.num_qo_heads / p.num_kv_heads, hd = p.head_dim, ps = p.page_size;
  const int64_t tok = static_cast<int64_t>(p.num_kv_heads) * hd;
  std::vector<float> o(q.size());
  for (int kvh = 0; kvh < p.num_kv_heads; ++kvh)
    for (int g = 0; g < group; ++g) {
      const float* qh = q.data() + (kvh * group + g) * hd;
      std::vector<float> acc(hd, 0.f), s(ps);
      float m = -INFINITY, l = 0.f;
      for (int64_t j0 = 0; j0 < len; j0 += ps) {
        const int64_t n = std::min<int64_t>(ps, len - j0);
        const int64_t page = p.page_indices[j0 / ps];
        float mx = m;
        for (int64_t j = 0; j < n; ++j) {
          const float* kr = k.data() + (page * ps + j) * tok + kvh * hd;
          // dot_f32's order: lane d % 8 sums its channels in order, then a fixed pairwise tree.
          float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          for (int d = 0; d < hd; ++d) lane[d % 8] += qh[d] * kr[d];
          const float dot = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                            ((lane[4] + lane[5]) + (lane[6] + lane[7]));
          s[j] = dot * p.sm_scale;
          mx = std::max(mx, s[j]);
        }
        const float corr = detail::exp_f32(m - mx);
        for (int d = 0; d < hd; ++d) acc[d] *= corr;
        float sum = l * corr;
        for (int64_t j = 0; j < n; ++j) {
          const float w = detail::exp_f32(s[j] - mx);
          sum += w;
          const float* vr = v.data() + (page * ps + j) * tok + kvh * hd;
          for (int d = 0; d < hd; ++d) acc[d] += w * vr[d];
        }
        m = mx;
        l = sum;
      }
      for (int d = 0; d < hd; ++d) o[(kvh * group + g) * hd + d] = acc[d] * (1.f / l);
    }
  return o;
}

TEST(CpuClones, PagedAttentionIsTheInOrderScalarArithmeticBitForBit) {
  const int kv_heads = 2, group = 4, hd = 64, ps = 16;
  const int64_t len = 301;  // a partial last page
  const int pages = static_cast<int>((len + ps - 1) / ps);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(group * kv_heads * hd), k(static_cast<size_t>(pages) * ps * kv_heads * hd),
      v(k.size());
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = nd(rng);
  std::vector<int32_t> ids(pages);
  for (int i = 0; i < pages; ++i) ids[i] = pages - 1 - i;  // pages out of order
  const std::vector<int32_t> page_indptr = {0, pages};
  const std::vector<int64_t> q_indptr = {0, 1}, past = {len - 1};
  std::vector<float> o(q.size(), NAN);
  PagedAttentionParams p;
  p.q = q.data();
  p.k_pages = k.data();
  p.v_pages = v.data();
  p.page_indptr = page_indptr.data();
  p.page_indices = ids.data();
  p.q_indptr = q_indptr.data();
  p.past_lens = past.data();
  p.batch_size = 1;
  p.num_qo_heads = group * kv_heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = hd;
  p.page_size = ps;
  p.sm_scale = 0.125f;
  p.o = o.data();
  paged_attention_cpu(p);
  const std::vector<float> want = paged_in_order(p, q, k, v, len);
  for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(o[i], want[i]) << "element " << i;
}

}  // namespace
}  // namespace kvb::kernels
