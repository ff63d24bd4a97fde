// The LibTorch adapter of the paged decode kernels (kernels/torch/paged_decode_torch.h): on the CPU
// against dense GQA attention over the same rows (fp32 oracle, partial last pages, shuffled page
// ids, lengths 1/54/97, groups 1/4), fp16/bf16 within their rounding; the refusals by name; and,
// on a machine with a CUDA LibTorch and a GPU, the CUDA launch against the CPU kernel (skipped
// elsewhere: no device).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "kernels/torch/paged_decode_torch.h"

namespace kvb::kernels {
namespace {

struct Case {
  at::Tensor q, k_pool, v_pool;  // fp32, CPU
  PagedDecodeTables tables;
};

// Sequences of the given lengths in shuffled pages of `page` tokens (a spare page at the end).
Case make_case(const std::vector<int32_t>& lens, int64_t hq, int64_t hkv, int64_t d, int64_t page,
               uint32_t seed) {
  Case c;
  int64_t pages = 1;
  for (int32_t n : lens) pages += (n + page - 1) / page;
  std::vector<int32_t> ids(static_cast<size_t>(pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.tables.page_indptr = {0};
  size_t next = 0;
  for (int32_t n : lens) {
    for (int64_t j = 0; j < (n + page - 1) / page; ++j) c.tables.page_indices.push_back(ids[next++]);
    c.tables.page_indptr.push_back(static_cast<int32_t>(c.tables.page_indices.size()));
    c.tables.kv_lens.push_back(n);
  }
  at::manual_seed(seed);
  c.q = at::randn({static_cast<int64_t>(lens.size()), hq, d});
  c.k_pool = at::randn({pages, page, hkv, d});
  c.v_pool = at::randn({pages, page, hkv, d});
  return c;
}

// Dense GQA attention of each sequence's one query over its rows, fp64.
at::Tensor dense_reference(const Case& c, float scale) {
  const int64_t B = c.q.size(0), hq = c.q.size(1), hkv = c.k_pool.size(2), d = c.q.size(2);
  const int64_t page = c.k_pool.size(1);
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> rows;
    for (int32_t j = 0; j < c.tables.kv_lens[b]; ++j)
      rows.push_back(c.tables.page_indices[c.tables.page_indptr[b] + j / page] * page + j % page);
    at::Tensor idx = at::tensor(rows, at::kLong);
    at::Tensor k = c.k_pool.view({-1, hkv, d}).index_select(0, idx).to(at::kDouble);
    at::Tensor v = c.v_pool.view({-1, hkv, d}).index_select(0, idx).to(at::kDouble);
    k = k.repeat_interleave(hq / hkv, 1);
    v = v.repeat_interleave(hq / hkv, 1);
    at::Tensor q = c.q[b].to(at::kDouble);                       // [hq, d]
    at::Tensor s = at::einsum("hd,jhd->hj", {q, k}) * scale;     // [hq, n]
    outs.push_back(at::einsum("hj,jhd->hd", {at::softmax(s, -1), v}));
  }
  return at::stack(outs);
}

TEST(PagedDecodeTorch, CpuMatchesDenseAttentionInEveryDtype) {
  for (int64_t hkv : {4, 1}) {
    Case c = make_case({1, 54, 97}, 4, hkv, 64, 16, static_cast<uint32_t>(10 + hkv));
    const at::Tensor ref = dense_reference(c, 0.125f);
    for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
      at::Tensor o = paged_decode_attention(c.q.to(dt), c.k_pool.to(dt), c.v_pool.to(dt),
                                            c.tables, 0.125f);
      ASSERT_EQ(o.scalar_type(), dt);
      ASSERT_EQ(o.sizes(), c.q.sizes());
      const double err = (o.to(at::kDouble) - ref).abs().max().item<double>();
      // fp32: accumulation order only; fp16 / bf16: the inputs' and output's rounding.
      const double tol = dt == at::kFloat ? 1e-5 : dt == at::kHalf ? 5e-3 : 4e-2;
      EXPECT_LT(err, tol) << c10::toString(dt) << " kv heads " << hkv;
    }
  }
}

TEST(PagedDecodeTorch, RefusesWhatNoKernelServes) {
  EXPECT_NE(paged_decode_supported(c10::Device("cpu"), at::kDouble, 64, 4, 2), "");
  EXPECT_NE(paged_decode_supported(c10::Device("cpu"), at::kFloat, 64, 3, 2), "");
  EXPECT_EQ(paged_decode_supported(c10::Device("cpu"), at::kBFloat16, 8, 8, 4), "");
  Case c = make_case({5}, 4, 2, 8, 4, 3);
  c.tables.kv_lens.push_back(3);  // tables for 2 sequences, batch of 1
  EXPECT_THROW(paged_decode_attention(c.q, c.k_pool, c.v_pool, c.tables, 1.f), kvb::InternalError);
}

TEST(PagedDecodeTorch, CudaMatchesTheCpuKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  const c10::Device cuda("cuda");
  for (int64_t d : {64, 128}) {
    for (int64_t hkv : {8, 2, 1}) {
      const std::string why = paged_decode_supported(cuda, at::kHalf, d, 8, hkv);
      ASSERT_EQ(why, "") << why;
      Case c = make_case({1, 54, 97, 2048}, 8, hkv, d, 16, static_cast<uint32_t>(d + hkv));
      for (auto dt : {at::kHalf, at::kBFloat16}) {
        at::Tensor q = c.q.to(dt), k = c.k_pool.to(dt), v = c.v_pool.to(dt);
        at::Tensor ref = paged_decode_attention(q, k, v, c.tables, 0.1f).to(at::kFloat);
        PagedDecodeTables t = c.tables;
        t.upload(cuda);
        at::Tensor o = paged_decode_attention(q.to(cuda), k.to(cuda), v.to(cuda), t, 0.1f);
        const double rel = ((o.cpu().to(at::kFloat) - ref).norm() / ref.norm()).item<double>();
        EXPECT_LT(rel, dt == at::kHalf ? 1e-3 : 1e-2) << c10::toString(dt) << " d " << d
                                                       << " kv heads " << hkv;
      }
    }
  }
}

}  // namespace
}  // namespace kvb::kernels
