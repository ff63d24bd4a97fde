// The CUDA virtual-memory KV arena (kernels/cuda/virtual_memory_cuda.h, vAttention's mechanism):
// pages committed on demand are physical memory the driver reports (cudaMemGetInfo) and are given
// back on decommit; misaligned or out-of-range commits are refused; and the unmodified decode
// kernel reads per-sequence contiguous slots of the arena (page table = one slot per sequence)
// exactly as the oracle reads the same rows from host memory. Without a device the arena must
// refuse with a reason, and the device tests skip.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "decode_test_util.h"
#include "kvb_cuda.cuh"
#include "virtual_memory_cuda.h"

namespace kvb::kernels {
namespace {

namespace kc = kvb::kernels::cuda;
using testing::nan_bits;
using testing::rel_err;

bool device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

TEST(CudaVirtualArena, RefusesWithAReasonWithoutADevice) {
  if (device_present()) GTEST_SKIP() << "a CUDA device is present";
  std::string error;
  EXPECT_EQ(kc::make_cuda_virtual_arena(0, size_t{64} << 20, size_t{2} << 20, &error), nullptr);
  EXPECT_FALSE(error.empty());
}

TEST(CudaVirtualArena, CommitsPagesOnDemandAndGivesThemBack) {
  if (!device_present()) GTEST_SKIP() << "no CUDA device";
  std::string error;
  const size_t g = kc::vmm_granularity_bytes(0, &error);
  ASSERT_GT(g, 0u) << error;
  // A page below the granularity is refused, naming it.
  EXPECT_EQ(kc::make_cuda_virtual_arena(0, 16 * g, g / 2, &error), nullptr);
  EXPECT_NE(error.find(std::to_string(g)), std::string::npos) << error;
  auto arena = kc::make_cuda_virtual_arena(0, 16 * g, g, &error);
  ASSERT_NE(arena, nullptr) << error;
  EXPECT_STREQ(arena->backend(), "cuda-vmm");
  EXPECT_EQ(arena->reserved_bytes(), 16 * g);
  EXPECT_EQ(arena->resident_bytes(0, 16 * g), 0);
  const size_t free0 = free_device_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(arena->commit(2 * g, 3 * g), "");
  const double commit_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(arena->resident_bytes(0, 16 * g), static_cast<int64_t>(3 * g));
  EXPECT_EQ(arena->resident_bytes(2 * g, g), static_cast<int64_t>(g));
  EXPECT_EQ(arena->resident_bytes(0, 2 * g), 0);
  EXPECT_GE(free0 - free_device_bytes(), 3 * g);  // the driver sees the physical pages
  ASSERT_EQ(arena->commit(2 * g, 3 * g), "");     // again: a no-op
  EXPECT_EQ(arena->resident_bytes(0, 16 * g), static_cast<int64_t>(3 * g));
  // The committed range is ordinary device memory.
  std::vector<uint8_t> in(3 * g), out(3 * g, 0);
  std::mt19937 rng(7);
  for (auto& b : in) b = static_cast<uint8_t>(rng());
  char* p = static_cast<char*>(arena->base()) + 2 * g;
  ASSERT_EQ(cudaMemcpy(p, in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), p, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(in, out);
  EXPECT_NE(arena->commit(g / 2, g), "");       // misaligned
  EXPECT_NE(arena->commit(15 * g, 2 * g), "");  // past the reservation
  ASSERT_EQ(arena->decommit(3 * g, g), "");     // one page from the middle
  EXPECT_EQ(arena->resident_bytes(0, 16 * g), static_cast<int64_t>(2 * g));
  ASSERT_EQ(arena->decommit(0, 16 * g), "");
  EXPECT_EQ(arena->resident_bytes(0, 16 * g), 0);
  EXPECT_LE(free0 - std::min(free0, free_device_bytes()), g);  // given back
  RecordProperty("commit_3_pages_us", std::to_string(commit_us));
  RecordProperty("granularity_bytes", std::to_string(g));
}

// vAttention's point: the KV of each sequence is one contiguous range (a slot of max_context
// tokens), so the dense decode kernel reads it with no block table - here the CSR "page list" is
// one slot index per sequence and the page is the whole slot.
TEST(CudaVirtualArena, DecodeKernelReadsContiguousSlotsUnmodified) {
  if (!device_present()) GTEST_SKIP() << "no CUDA device";
  std::string error;
  const size_t g = kc::vmm_granularity_bytes(0, &error);
  ASSERT_GT(g, 0u) << error;
  const KvDtype dt = KvDtype::kF16;
  const int hq = 32, hkv = 8, d = 128, slots = 3;
  const size_t row = static_cast<size_t>(hkv) * d * 2;
  const int slot_tokens = static_cast<int>(4 * g / row);     // 4 pages per slot
  const std::vector<int32_t> lens = {1, 1500, slot_tokens};  // one page, part of two, all four
  auto k_arena = kc::make_cuda_virtual_arena(0, slots * 4 * g, g, &error);
  auto v_arena = kc::make_cuda_virtual_arena(0, slots * 4 * g, g, &error);
  ASSERT_TRUE(k_arena && v_arena) << error;
  std::mt19937 rng(11);
  const size_t pool_elems = static_cast<size_t>(slots) * slot_tokens * hkv * d;
  std::vector<uint16_t> k = testing::random_bits(pool_elems, dt, rng);
  std::vector<uint16_t> v = testing::random_bits(pool_elems, dt, rng);
  for (int s = 0; s < slots; ++s) {
    const size_t bytes = (lens[s] * row + g - 1) / g * g;
    const size_t at = static_cast<size_t>(s) * 4 * g;
    ASSERT_EQ(k_arena->commit(at, bytes), "");
    ASSERT_EQ(v_arena->commit(at, bytes), "");
    const size_t used = lens[s] * row, first = static_cast<size_t>(s) * slot_tokens * hkv * d;
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(k_arena->base()) + at, k.data() + first, used,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(v_arena->base()) + at, v.data() + first, used,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  EXPECT_EQ(k_arena->resident_bytes(0, slots * 4 * g), static_cast<int64_t>((1 + 1 + 4) * g));
  std::vector<uint16_t> q = testing::random_bits(static_cast<size_t>(slots) * hq * d, dt, rng);
  const std::vector<int32_t> indptr = {0, 1, 2, 3}, indices = {0, 1, 2};
  DecodeAttentionParams p;
  p.dtype = dt;
  p.batch_size = slots;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  p.page_size = slot_tokens;
  p.sm_scale = 0.088f;
  p.max_scan_len = slot_tokens;
  std::vector<uint16_t> ref(q.size(), nan_bits(dt));
  p.q = q.data();
  p.o = ref.data();
  p.k_pages = k.data();
  p.v_pages = v.data();
  p.page_indptr = indptr.data();
  p.page_indices = indices.data();
  p.kv_lens = lens.data();
  ASSERT_EQ(decode_attention_check(p), "");
  decode_attention_ref(p);

  uint16_t *dq = nullptr, *dout = nullptr;
  int32_t* dtab = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dq), q.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dout), q.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dtab), 10 * sizeof(int32_t)), cudaSuccess);
  std::vector<int32_t> tab = indptr;
  tab.insert(tab.end(), indices.begin(), indices.end());
  tab.insert(tab.end(), lens.begin(), lens.end());
  ASSERT_EQ(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dtab, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dout, 0xff, q.size() * 2), cudaSuccess);
  p.q = dq;
  p.o = dout;
  p.k_pages = k_arena->base();
  p.v_pages = v_arena->base();
  p.page_indptr = dtab;
  p.page_indices = dtab + 4;
  p.kv_lens = dtab + 7;
  std::string why;
  ASSERT_TRUE(kc::decode_attention_supported(p, &why)) << why;
  const kc::DecodePlan plan = kc::decode_attention_plan(p);
  void* ws = nullptr;
  if (plan.workspace_bytes) ASSERT_EQ(cudaMalloc(&ws, plan.workspace_bytes), cudaSuccess);
  ASSERT_EQ(kc::decode_attention_cuda(p, plan, ws, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> out(q.size());
  ASSERT_EQ(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_LE(rel_err(out, ref, dt), 1e-3);
  cudaFree(dq);
  cudaFree(dout);
  cudaFree(dtab);
  if (ws) cudaFree(ws);
}

}  // namespace
}  // namespace kvb::kernels
