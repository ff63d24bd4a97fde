// The CPU kernels' AVX2 clones (cpu_clones.h) and their helpers: the vectorisable exp is within one
// ulp or two of a correctly rounded exp, accumulate_rows keeps each channel's row order, the fp32
// paged-attention kernel and the decode GEMV (whose clones this machine runs when it has AVX2)
// compute exactly the bits of the same arithmetic written as plain scalar code here (compiled for
// the baseline, so without FMA): no contraction into FMAs, no reordered sums; the F16C row
// conversion is exact.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "decode_test_util.h"
#include "kvb/kernels/cpu_ops.h"
#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/detail/gemm.h"
#include "kvb/kernels/detail/widen_rows.h"
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

// The decode path's arithmetic as plain scalar code: q scaled by sm_scale, keys in tiles of 256
// (across pages), dot products in eight fixed partial sums, per tile the max, exp_f32, the rescale
// and the weights summed in eight lanes, the weighted value rows added in order.
std::vector<float> paged_in_order(const PagedAttentionParams& p, const std::vector<float>& q,
                                  const std::vector<float>& k, const std::vector<float>& v,
                                  int64_t len) {
  const int group = p.num_qo_heads / p.num_kv_heads, hd = p.head_dim, ps = p.page_size;
  const int64_t tok = static_cast<int64_t>(p.num_kv_heads) * hd, tile = 256;
  auto row = [&](int64_t j) { return (p.page_indices[j / ps] * ps + j % ps) * tok; };
  std::vector<float> o(q.size());
  for (int kvh = 0; kvh < p.num_kv_heads; ++kvh)
    for (int g = 0; g < group; ++g) {
      std::vector<float> qh(hd), acc(hd, 0.f), s(tile);
      for (int d = 0; d < hd; ++d) qh[d] = q[(kvh * group + g) * hd + d] * p.sm_scale;
      float m = -INFINITY, l = 0.f;
      for (int64_t j0 = 0; j0 < len; j0 += tile) {
        const int64_t n = std::min(tile, len - j0);
        float mx = m;
        for (int64_t j = 0; j < n; ++j) {
          const float* kr = k.data() + row(j0 + j) + kvh * hd;
          // dot_f32's order: lane d % 8 sums its channels in order, then a fixed pairwise tree.
          // Channels past the last multiple of 8 go on into lane 0.
          float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          for (int d = 0; d < hd; ++d) lane[d < hd / 8 * 8 ? d % 8 : 0] += qh[d] * kr[d];
          s[j] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                 ((lane[4] + lane[5]) + (lane[6] + lane[7]));
          mx = std::max(mx, s[j]);
        }
        const float corr = detail::exp_f32(m - mx);
        for (int d = 0; d < hd; ++d) acc[d] *= corr;
        float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int64_t j = 0; j < n; ++j) s[j] = detail::exp_f32(s[j] - mx);
        const int64_t n8 = n / 8 * 8;
        for (int64_t j = 0; j < n8; ++j) lane[j % 8] += s[j];
        float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                    ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        for (int64_t j = n8; j < n; ++j) sum += s[j];
        for (int64_t j = 0; j < n; ++j) {
          const float* vr = v.data() + row(j0 + j) + kvh * hd;
          for (int d = 0; d < hd; ++d) acc[d] += s[j] * vr[d];
        }
        m = mx;
        l = l * corr + sum;
      }
      for (int d = 0; d < hd; ++d) o[(kvh * group + g) * hd + d] = acc[d] * (1.f / l);
    }
  return o;
}

// Every register-blocking path of tile_attention.h: groups of 4, 2 and 1 heads (7 = 4 + 2 + 1),
// row remainders, value-channel blocks of 16/32/64 and 8, channel tails (head_dim 20, 72), page
// sizes that do and do not divide the key tile.
TEST(CpuClones, PagedAttentionIsTheInOrderScalarArithmeticBitForBit) {
  struct Shape {
    int kv_heads, group, hd, ps;
    int64_t len;
  };
  uint32_t seed = 11;
  for (const Shape& sh :
       {Shape{2, 4, 64, 16, 301},  // two key tiles, the second ending in a partial page
        Shape{1, 7, 72, 7, 530}, Shape{3, 3, 20, 16, 97}, Shape{2, 1, 8, 5, 260},
        Shape{1, 2, 128, 300, 299}}) {
    const int kv_heads = sh.kv_heads, group = sh.group, hd = sh.hd, ps = sh.ps;
    const int64_t len = sh.len;
    const int pages = static_cast<int>((len + ps - 1) / ps);
    std::mt19937 rng(seed++);
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
    for (size_t i = 0; i < o.size(); ++i)
      ASSERT_EQ(o[i], want[i]) << "element " << i << ", group " << group << ", head_dim " << hd
                               << ", page " << ps;
  }
}

// The decode-time GEMV is dot_f32 per output row, bit for bit, in every row block (8, 4, 2, 1) and
// column tail; with beta 1 it adds onto y, with beta 0 it never reads y (NaN there stays out).
TEST(CpuClones, GemvIsDotF32PerRowBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t n : {1, 7, 8, 15, 37})
    for (int64_t k : {1, 7, 8, 20, 64, 172, 576}) {
      const int64_t ld = k + 3;
      std::vector<float> w(n * ld), x(k), y0(n), y(n);
      for (auto& v : w) v = nd(rng);
      for (auto& v : x) v = nd(rng);
      for (auto& v : y0) v = nd(rng);
      for (float beta : {0.f, 1.f}) {
        y = beta == 0.f ? std::vector<float>(n, NAN) : y0;
        detail::gemv_n(n, k, w.data(), ld, x.data(), beta, y.data());
        for (int64_t j = 0; j < n; ++j) {
          const float t = detail::dot_f32(w.data() + j * ld, x.data(), k);
          ASSERT_EQ(y[j], beta == 0.f ? t : beta * y0[j] + t)
              << "row " << j << " of " << n << ", k " << k << ", beta " << beta;
        }
      }
    }
}

// The batched-decode kernel is dot_f32 per output, bit for bit, for every tile remainder (rows and
// weight rows not multiples of 3), column tail and row stride; beta 1 adds onto c, beta 0 never
// reads it. So a row's outputs do not depend on the other rows in the batch.
TEST(CpuClones, GemmRowsIsDotF32PerOutputBitForBit) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t m : {1, 2, 3, 4, 5, 16, 17})
    for (int64_t n : {1, 2, 3, 7, 10})
      for (int64_t k : {1, 7, 8, 20, 172, 576}) {
        for (int64_t ldb : {k, k + 3}) {  // consecutive rows (prefetched) and strided ones
          const int64_t lda = k + 1, ldc = n + 2;
          std::vector<float> a(m * lda), b(n * ldb), c0(m * ldc), c(m * ldc);
          for (auto* v : {&a, &b, &c0})
            for (auto& f : *v) f = nd(rng);
          for (float beta : {0.f, 1.f}) {
            c = beta == 0.f ? std::vector<float>(c0.size(), NAN) : c0;
            detail::gemm_nt_rows(m, n, k, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                const float t = detail::dot_f32(b.data() + j * ldb, a.data() + i * lda, k);
                ASSERT_EQ(c[i * ldc + j], beta == 0.f ? t : beta * c0[i * ldc + j] + t)
                    << "output (" << i << ", " << j << ") of " << m << " x " << n << ", k " << k
                    << ", ldb " << ldb << ", beta " << beta;
              }
          }
        }
      }
}

// A batch of rows through linear_f32 (the tiled kernel up to its row limit of 16, the BLAS past
// it): each row's outputs are the same bits whichever batch it is in, up to the limit; past it,
// close.
TEST(CpuClones, LinearBatchRowsAreEachRowsDotProducts) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.f, 1.f);
  // 100 x 600: one thread; 576 x 600 (1.4 MB of weights): the threaded path.
  for (int64_t in : {100, 576})
    for (int64_t rows : {2, 5, 16, 17, 33}) {
      const int64_t out = 600;
      std::vector<float> w(out * in), bias(out);
      for (auto* v : {&w, &bias})
        for (auto& f : *v) f = nd(rng);
      std::vector<float> x(rows * in), y(rows * out);
      for (auto& f : x) f = nd(rng);
      linear_f32(x.data(), w.data(), bias.data(), y.data(), rows, in, out, false);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
          const float want = detail::dot_f32(w.data() + o * in, x.data() + r * in, in) + bias[o];
          if (rows <= 16)
            ASSERT_EQ(y[r * out + o], want) << "rows " << rows << ", row " << r << ", output " << o;
          else
            ASSERT_NEAR(y[r * out + o], want, 1e-3f * (1.f + std::fabs(want))) << "rows " << rows;
        }
    }
}

// The streaming GEMV's order as scalar code: eight accumulators over 8-column blocks in strides of
// 64, the column tail into lane 0 of the first, a pairwise tree over the accumulators, then the
// lanes as dot_f32's.
float stream_row_in_order(const float* w, const float* x, int64_t k) {
  float acc[8][8] = {};
  const int64_t k8 = k / 8 * 8;
  for (int64_t c = 0; c < k8; ++c) acc[(c / 8) % 8][c % 8] += w[c] * x[c];
  for (int64_t c = k8; c < k; ++c) acc[0][0] += w[c] * x[c];
  float lane[8];
  for (int l = 0; l < 8; ++l)
    lane[l] = ((acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l])) +
              ((acc[4][l] + acc[5][l]) + (acc[6][l] + acc[7][l]));
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

TEST(CpuClones, StreamingGemvIsItsInOrderSumBitForBit) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t k : {1, 7, 8, 20, 64, 72, 172, 576, 1536}) {
    const int64_t n = 11, ld = k + 5;
    std::vector<float> w(n * ld), x(k), y0(n), y(n);
    for (auto* v : {&w, &x, &y0})
      for (auto& f : *v) f = nd(rng);
    for (float beta : {0.f, 1.f}) {
      y = beta == 0.f ? std::vector<float>(n, NAN) : y0;
      detail::gemv_stream_n(n, k, w.data(), ld, x.data(), beta, y.data());
      for (int64_t j = 0; j < n; ++j) {
        const float t = stream_row_in_order(w.data() + j * ld, x.data(), k);
        ASSERT_EQ(y[j], beta == 0.f ? t : beta * y0[j] + t) << "row " << j << ", k " << k;
      }
    }
  }
}

// One activation row through linear_f32 (slices of 256 outputs, bias, accumulate) is the GEMV.
TEST(CpuClones, LinearOneRowIsTheGemv) {
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.f, 1.f);
  // 100 x 600: in cache, gemv_n; 576 x 600 (1.4 MB of weights): streamed, gemv_stream_n.
  for (int64_t in : {100, 576}) {
    const int64_t out = 600;
    std::vector<float> w(out * in), x(in), bias(out), y(out), want(out);
    for (auto* v : {&w, &x, &bias})
      for (auto& f : *v) f = nd(rng);
    for (bool accumulate : {false, true}) {
      for (int64_t o = 0; o < out; ++o) y[o] = want[o] = nd(rng);
      linear_f32(x.data(), w.data(), bias.data(), y.data(), 1, in, out, accumulate);
      for (int64_t o = 0; o < out; ++o) {
        const float t = in == 100 ? detail::dot_f32(w.data() + o * in, x.data(), in)
                                  : stream_row_in_order(w.data() + o * in, x.data(), in);
        ASSERT_EQ(y[o], (accumulate ? want[o] + t : t) + bias[o]) << "in " << in << " out " << o;
      }
    }
  }
}

// The paged fp16/bf16 decode kernel's arithmetic as plain scalar code, for sequences short enough
// to be one work item each: q widened and scaled by sm_scale; the scan in tiles of 32 positions
// (a tile holds fewer rows where a selected last page's dead slots are skipped); per tile the
// scores in dot_f32's order, the max, exp_f32, the rescale, the weights summed in eight lanes, the
// weighted value rows added in order; the output (0 + acc) / l, rounded to the cache's dtype.
std::vector<uint16_t> decode_in_order(const testing::PagedCache& c) {
  const DecodeAttentionParams p = c.params(nullptr);
  const int group = c.group, hd = c.head_dim, H = c.qo_heads();
  const int64_t tok = static_cast<int64_t>(c.kv_heads) * hd, tile = 32;
  auto elem = [&](const std::vector<uint16_t>& x, int64_t i) {
    return c.dtype == KvDtype::kBF16 ? bf16_to_float(x[i]) : half_to_float(x[i]);
  };
  std::vector<uint16_t> o(c.out_elems());
  for (int b = 0; b < c.batch(); ++b) {
    const int64_t scan = decode_scan_len(p, b), len = c.kv_lens[b];
    const int32_t* pages = c.page_indices.data() + c.page_indptr[b];
    // Each scan position's pool row, -1 for a dead slot.
    std::vector<int64_t> row(scan);
    for (int64_t j = 0; j < scan; ++j) {
      int64_t pos = j;
      if (c.gather == GatherMode::kTokens) pos = c.gather_indices[c.gather_indptr[b] + j];
      if (c.gather == GatherMode::kPages)
        pos = int64_t{c.gather_indices[c.gather_indptr[b] + j / c.page_size]} * c.page_size +
              j % c.page_size;
      row[j] = pos >= len ? -1 : (pages[pos / c.page_size] * c.page_size + pos % c.page_size) * tok;
    }
    for (int h = 0; h < H; ++h) {
      const int64_t off = static_cast<int64_t>(h / group) * hd;
      std::vector<float> q(hd), acc(hd, 0.f), s;
      for (int d = 0; d < hd; ++d) q[d] = elem(c.q, (int64_t{b} * H + h) * hd + d) * p.sm_scale;
      float m = -INFINITY, l = 0.f;
      for (int64_t j0 = 0; j0 < scan; j0 += tile) {
        std::vector<int64_t> rows;
        for (int64_t j = j0; j < std::min(scan, j0 + tile); ++j)
          if (row[j] >= 0) rows.push_back(row[j] + off);
        const int64_t n = static_cast<int64_t>(rows.size());
        if (n == 0) continue;
        s.assign(n, 0.f);
        float mx = m;
        for (int64_t i = 0; i < n; ++i) {
          float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          for (int d = 0; d < hd; ++d)
            lane[d < hd / 8 * 8 ? d % 8 : 0] += q[d] * elem(c.k, rows[i] + d);
          s[i] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                 ((lane[4] + lane[5]) + (lane[6] + lane[7]));
          mx = std::max(mx, s[i]);
        }
        const float corr = detail::exp_f32(m - mx);
        for (int d = 0; d < hd; ++d) acc[d] *= corr;
        for (int64_t i = 0; i < n; ++i) s[i] = detail::exp_f32(s[i] - mx);
        float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        const int64_t n8 = n / 8 * 8;
        for (int64_t i = 0; i < n8; ++i) lane[i % 8] += s[i];
        float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                    ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        for (int64_t i = n8; i < n; ++i) sum += s[i];
        for (int64_t i = 0; i < n; ++i)
          for (int d = 0; d < hd; ++d) acc[d] += s[i] * elem(c.v, rows[i] + d);
        m = mx;
        l = l * corr + sum;
      }
      const float inv = l > 0.f ? 1.f / l : 0.f;
      for (int d = 0; d < hd; ++d)
        o[(int64_t{b} * H + h) * hd + d] = testing::to_bits((0.f + acc[d]) * inv, c.dtype);
    }
  }
  return o;
}

// Every register-blocking path of tile_attention.h over the pages' fp16 and bf16 rows widened in
// registers: groups of 4, 2 and 1 heads (7 = 4 + 2 + 1), row remainders, value-channel blocks,
// channel tails (head_dim 20, 72), page sizes above and below the tile, dense, token- and
// page-gathered scans (the last with dead slots), an empty sequence.
TEST(CpuClones, PagedDecodeIsTheInOrderScalarArithmeticBitForBit) {
  struct Shape {
    int kv_heads, group, hd, ps;
    std::vector<int32_t> lens;
  };
  uint32_t seed = 21;
  for (const Shape& sh : {Shape{8, 4, 128, 16, {1000, 0, 77}}, Shape{2, 4, 64, 16, {301}},
                          Shape{1, 7, 72, 7, {530, 3}}, Shape{3, 3, 20, 16, {97}},
                          Shape{2, 1, 8, 5, {260}}, Shape{1, 2, 128, 300, {299, 1000}}})
    for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16})
      for (int mode = 0; mode < 3; ++mode) {
        std::mt19937 rng(seed++);
        auto c = testing::make_paged_cache(dt, sh.lens, sh.kv_heads, sh.group, sh.hd, sh.ps, rng);
        if (mode == 1) testing::set_token_gather(c, 0.5, rng);
        if (mode == 2) testing::set_page_gather(c, 0.5, rng);
        std::vector<uint16_t> o(c.out_elems(), testing::nan_bits(dt));
        decode_attention_cpu(c.params(o.data()));
        const std::vector<uint16_t> want = decode_in_order(c);
        for (size_t i = 0; i < o.size(); ++i)
          ASSERT_EQ(o[i], want[i])
              << "element " << i << ", group " << sh.group << ", head_dim " << sh.hd << ", page "
              << sh.ps << ", " << kv_dtype_name(dt) << ", gather " << mode;
      }
}

// widen_rows (F16C on a CPU that has it) is half.h's exact conversion on every fp16 bit pattern
// and bf16's (a NaN stays a NaN), with each row's heads sorted into per-head tiles.
TEST(CpuClones, WidenRowsIsExactAndSortsHeads) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  // 65536 elements as rows of 2 heads x 20 columns (a column tail past 16), rows read in reverse.
  const int64_t heads = 2, cols = 20, row_len = heads * cols, n_rows = 65536 / row_len;
  std::vector<int64_t> rows(n_rows);
  for (int64_t i = 0; i < n_rows; ++i) rows[i] = (n_rows - 1 - i) * row_len;
  for (KvDtype d : {KvDtype::kF16, KvDtype::kBF16}) {
    std::vector<float> out(static_cast<size_t>(n_rows * row_len));
    detail::widen_rows(all.data(), d, rows.data(), n_rows, heads, cols, out.data());
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n_rows; ++i)
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t bits = all[rows[i] + h * cols + c];
          const float want = d == KvDtype::kF16 ? half_to_float(bits) : bf16_to_float(bits);
          const float got = out[(h * n_rows + i) * cols + c];
          if (std::isnan(want))  // the conversion instruction quiets a signalling NaN
            ASSERT_TRUE(std::isnan(got)) << kv_dtype_name(d) << " bits " << bits;
          else
            ASSERT_EQ(float_bits(got), float_bits(want)) << kv_dtype_name(d) << " bits " << bits;
        }
  }
}

// The greedy sampler's argmax is std::max_element's answer: ties to the first, NaNs never chosen
// unless first, all -inf gives 0; every lane and tail position.
TEST(CpuClones, ArgmaxIsStdMaxElement) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> level(0, 5);  // few distinct values: many ties
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 2, 7, 8, 9, 16, 31, 512, 49152}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      for (auto& v : x) v = static_cast<float>(level(rng));
      if (trial % 5 == 1) x[rng() % n] = NAN;
      if (trial % 5 == 2) x[0] = NAN;
      if (trial % 5 == 3) std::fill(x.begin(), x.end(), -inf);
      if (trial % 5 == 4) x[rng() % n] = 9.f, x[rng() % n] = 9.f;
      ASSERT_EQ(argmax_f32(x.data(), n), std::max_element(x.begin(), x.end()) - x.begin())
          << "n " << n << " trial " << trial;
    }
  }
}

}  // namespace
}  // namespace kvb::kernels
