// The LibTorch adapters' CUDA branches (kernels/torch, compiled a second time for this test with
// the CUDA emulator): CPU tensors sent down the CUDA branch (under the emulator device pointers are
// host pointers) must give what the host branch gives. This covers what the adapters themselves do
// for a GPU, which no CPU test otherwise reaches: the tables concatenated, uploaded and offset, the
// pool, ring, q and o pointers, the split plan and its workspace, the CUDA support checks.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/torch/adapter_util.h"
#include "kernels/torch/kivi_torch.h"
#include "kernels/torch/paged_decode_torch.h"

namespace kvb::kernels {
namespace {

const c10::Device kCpu(c10::kCPU);

// While alive, CPU tensors take the adapters' CUDA branch.
struct EmulatedCuda {
  EmulatedCuda() { emulated_cuda_on_cpu() = true; }
  ~EmulatedCuda() { emulated_cuda_on_cpu() = false; }
};

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).norm() / y.norm()).item<double>();
}

TEST(AdaptersEmu, PagedDecodeCudaBranchMatchesTheHostBranch) {
  const std::vector<int32_t> lens = {1, 54, 97, 2048};
  const int64_t hq = 8, page = 16;
  for (int64_t d : {64, 128})
    for (int64_t hkv : {8, 2, 1}) {
      PagedDecodeTables tables;
      int64_t pages = 1;
      for (int32_t n : lens) pages += (n + page - 1) / page;
      std::vector<int32_t> ids(static_cast<size_t>(pages));
      std::iota(ids.begin(), ids.end(), 0);
      std::mt19937 rng(static_cast<uint32_t>(d + hkv));
      std::shuffle(ids.begin(), ids.end(), rng);
      tables.page_indptr = {0};
      size_t next = 0;
      for (int32_t n : lens) {
        for (int64_t j = 0; j < (n + page - 1) / page; ++j)
          tables.page_indices.push_back(ids[next++]);
        tables.page_indptr.push_back(static_cast<int32_t>(tables.page_indices.size()));
        tables.kv_lens.push_back(n);
      }
      at::manual_seed(static_cast<uint64_t>(d * 10 + hkv));
      const at::Tensor q = at::randn({static_cast<int64_t>(lens.size()), hq, d});
      const at::Tensor k = at::randn({pages, page, hkv, d}), v = at::randn({pages, page, hkv, d});
      for (auto dt : {at::kHalf, at::kBFloat16}) {
        const at::Tensor qd = q.to(dt), kd = k.to(dt), vd = v.to(dt);
        const at::Tensor ref = paged_decode_attention(qd, kd, vd, tables, 0.1f);
        EmulatedCuda on;
        ASSERT_EQ(paged_decode_supported(kCpu, dt, d, hq, hkv), "");
        PagedDecodeTables t = tables;
        t.upload(kCpu);
        ASSERT_TRUE(t.device.defined()) << "the CUDA branch needs the uploaded tables";
        const at::Tensor o = paged_decode_attention(qd, kd, vd, t, 0.1f);
        EXPECT_LT(rel_err(o, ref), dt == at::kHalf ? 1e-3 : 1e-2)
            << c10::toString(dt) << " d " << d << " kv heads " << hkv;
      }
    }
  EmulatedCuda on;
  EXPECT_NE(paged_decode_supported(kCpu, at::kHalf, 96, 8, 2).find("head_dim 64 and 128"),
            std::string::npos);
  EXPECT_NE(paged_decode_supported(kCpu, at::kFloat, 64, 8, 2).find("fp16 or bf16"),
            std::string::npos);
  PagedDecodeTables not_uploaded;
  not_uploaded.page_indptr = {0, 1};
  not_uploaded.page_indices = {0};
  not_uploaded.kv_lens = {3};
  EXPECT_THROW(
      paged_decode_attention(at::zeros({1, 8, 64}, at::kHalf), at::zeros({1, 16, 2, 64}, at::kHalf),
                             at::zeros({1, 16, 2, 64}, at::kHalf), not_uploaded, 1.f),
      kvb::InternalError);
}

// One store: pools, rings and each sequence's pages.
struct KiviStore {
  KiviLayout l;
  KiviPools pools;
  at::Tensor k_ring, v_ring;
  std::vector<std::vector<int32_t>> pages;
  std::vector<int32_t> lens;
  KiviStore(const KiviLayout& layout, int64_t batch, int64_t num_pages, c10::ScalarType dt)
      : l(layout),
        pools(kivi_pools_empty(layout, num_pages, kCpu)),
        k_ring(at::zeros(
            {batch, kivi_residual_capacity(layout), layout.num_kv_heads, layout.head_dim}, dt)),
        v_ring(at::zeros_like(k_ring)),
        pages(batch),
        lens(batch, 0) {}
};

// The step tables for appending add[b] tokens; pages come from a shared counter.
KiviStepTables step_tables(KiviStore& s, const std::vector<int32_t>& add, int32_t* next_page) {
  KiviStepTables t;
  t.page_indptr = {0};
  t.new_indptr = {0};
  for (size_t b = 0; b < add.size(); ++b) {
    const int32_t after = s.lens[b] + add[b];
    while (static_cast<int64_t>(s.pages[b].size()) < kivi_pages_needed(s.l, after))
      s.pages[b].push_back((*next_page)++);
    t.page_indices.insert(t.page_indices.end(), s.pages[b].begin(), s.pages[b].end());
    t.page_indptr.push_back(static_cast<int32_t>(t.page_indices.size()));
    t.kv_lens_before.push_back(s.lens[b]);
    t.kv_lens_after.push_back(after);
    t.new_indptr.push_back(t.new_indptr.back() + add[b]);
  }
  // Never empty (a null pointer to the kernels), as the stores keep them.
  if (t.page_indices.empty()) t.page_indices.reserve(1);
  return t;
}

TEST(AdaptersEmu, KiviAppendAndDecodeCudaBranchMatchTheHostBranch) {
  for (int bits : {2, 4, 8}) {
    KiviLayout l;
    l.num_kv_heads = 2;
    l.head_dim = 64;
    l.page_size = 32;
    l.k_bits = l.v_bits = bits;
    l.v_group_size = 32;
    l.residual_length = 64;
    const int64_t hq = 8, batch = 2, num_pages = 40;
    KiviStore host(l, batch, num_pages, at::kHalf), emu(l, batch, num_pages, at::kHalf);
    int32_t next_host = 0, next_emu = 0;
    at::manual_seed(static_cast<uint64_t>(bits));
    double worst = 0, worst_tc = 0;
    for (int step = 0; step < 41; ++step) {
      const std::vector<int32_t> add =
          step == 0 ? std::vector<int32_t>{54, 300} : std::vector<int32_t>{1, 1};
      const int64_t rows = add[0] + add[1];
      const at::Tensor k_new = at::randn({rows, l.num_kv_heads, l.head_dim}).to(at::kHalf);
      const at::Tensor v_new = at::randn({rows, l.num_kv_heads, l.head_dim}).to(at::kHalf);
      const at::Tensor q = at::randn({batch, hq, l.head_dim}).to(at::kHalf);
      KiviStepTables th = step_tables(host, add, &next_host);
      KiviStepTables te = step_tables(emu, add, &next_emu);
      kivi_append(l, host.pools, host.k_ring, host.v_ring, k_new, v_new, th);
      const at::Tensor ref =
          kivi_decode_attention(q, l, host.pools, host.k_ring, host.v_ring, th, 0.125f);
      at::Tensor out, out_tc;
      {
        EmulatedCuda on;
        ASSERT_EQ(kivi_kernel_supported(kCpu, at::kHalf, l, hq), "");
        te.upload(kCpu);
        kivi_append(l, emu.pools, emu.k_ring, emu.v_ring, k_new, v_new, te);
        out = kivi_decode_attention(q, l, emu.pools, emu.k_ring, emu.v_ring, te, 0.125f);
        ASSERT_EQ(kivi_kernel_supported(kCpu, at::kHalf, l, hq, KiviCudaKernel::kTensorCores), "");
        out_tc = kivi_decode_attention(q, l, emu.pools, emu.k_ring, emu.v_ring, te, 0.125f,
                                       KiviCudaKernel::kTensorCores);
      }
      for (size_t b = 0; b < add.size(); ++b) host.lens[b] = emu.lens[b] = th.kv_lens_after[b];
      // The append is bit-exact; decode differs by summation order only.
      const std::string what = std::to_string(bits) + " bits, step " + std::to_string(step);
      ASSERT_TRUE(at::equal(host.pools.k_codes, emu.pools.k_codes)) << what;
      ASSERT_TRUE(at::equal(host.pools.k_scales, emu.pools.k_scales)) << what;
      ASSERT_TRUE(at::equal(host.pools.k_mins, emu.pools.k_mins)) << what;
      ASSERT_TRUE(at::equal(host.pools.v_codes, emu.pools.v_codes)) << what;
      ASSERT_TRUE(at::equal(host.pools.v_scales, emu.pools.v_scales)) << what;
      ASSERT_TRUE(at::equal(host.pools.v_mins, emu.pools.v_mins)) << what;
      ASSERT_TRUE(at::equal(host.k_ring, emu.k_ring)) << what;
      ASSERT_TRUE(at::equal(host.v_ring, emu.v_ring)) << what;
      worst = std::max(worst, rel_err(out, ref));
      worst_tc = std::max(worst_tc, rel_err(out_tc, ref));
    }
    EXPECT_LT(worst, 1e-3) << bits << " bits";
    EXPECT_LT(worst_tc, 1e-3) << bits << " bits, tensor cores";
  }
  EmulatedCuda on;
  KiviLayout odd;
  odd.num_kv_heads = 2;
  odd.head_dim = 96;
  odd.page_size = 32;
  odd.k_bits = odd.v_bits = 4;
  odd.v_group_size = 32;
  EXPECT_NE(kivi_kernel_supported(kCpu, at::kHalf, odd, 8).find("head_dim 64 and 128"),
            std::string::npos);
  odd.head_dim = 64;
  odd.v_group_size = 8;
  EXPECT_EQ(kivi_kernel_supported(kCpu, at::kHalf, odd, 8), "");
  EXPECT_NE(kivi_kernel_supported(kCpu, at::kHalf, odd, 8, KiviCudaKernel::kTensorCores)
                .find("tensor-core kernel needs"),
            std::string::npos);
}

}  // namespace
}  // namespace kvb::kernels
