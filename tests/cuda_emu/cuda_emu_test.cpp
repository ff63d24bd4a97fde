// The CUDA emulator itself: the thread hierarchy, barriers, shuffles and shared memory behave as on
// a GPU, and what a GPU would do wrongly or undefinedly (a divergent barrier, a read past an
// allocation, a read of shared memory never written) is caught, not silently run.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "selftest_kernels.h"

namespace {

using namespace kvb_emu_selftest;

std::vector<float> host(const float* d, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(CudaEmu, EveryThreadOfAGridRunsOnceWithItsOwnIndices) {
  const dim3 grid(3, 2, 2), block(4, 8, 2);
  const int n = 12 * 64;
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, n * sizeof(int)), cudaSuccess);
  KVB_LAUNCH(grid, block, 0, nullptr, write_ids)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> h(n);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < n; ++i) ASSERT_EQ(h[i], i + 1) << i;
  cudaFree(d);
}

TEST(CudaEmu, SharedMemoryBarriersAndShufflesCompute) {
  const int blocks = 3, threads = 256;
  std::vector<float> x(blocks * threads);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 2.f;
  float *dx, *dblock, *dwarp;
  cudaMalloc(reinterpret_cast<void**>(&dx), x.size() * 4);
  cudaMalloc(reinterpret_cast<void**>(&dblock), blocks * 4);
  cudaMalloc(reinterpret_cast<void**>(&dwarp), x.size() * 4);
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  KVB_LAUNCH(blocks, threads, 0, nullptr, block_and_warp_sums)(dx, dblock, dwarp);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto bs = host(dblock, blocks), ws = host(dwarp, x.size());
  for (int b = 0; b < blocks; ++b) {
    float want = 0.f;
    for (int t = 0; t < threads; ++t) want += x[b * threads + t];
    EXPECT_EQ(bs[b], want) << b;
    for (int w = 0; w < threads / 32; ++w) {
      float wsum = 0.f;
      for (int l = 0; l < 32; ++l) wsum += x[b * threads + w * 32 + l];
      for (int l = 0; l < 32; ++l) ASSERT_EQ(ws[b * threads + w * 32 + l], wsum) << b << " " << w;
    }
  }
  cudaFree(dx);
  cudaFree(dblock);
  cudaFree(dwarp);
}

// The threads of a block run in a shuffled order, so a missing barrier is caught by a result.
TEST(CudaEmu, AMissingBarrierShowsInTheResult) {
  float* d;
  cudaMalloc(reinterpret_cast<void**>(&d), 128 * 4);
  KVB_LAUNCH(1, 128, 0, nullptr, neighbour_without_barrier)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = host(d, 128);
  int stale = 0;
  for (int t = 0; t < 128; ++t) stale += h[t] != static_cast<float>((t + 1) % 128);
  EXPECT_GT(stale, 0) << "every neighbour had already written: thread order is not shuffled";
  cudaFree(d);
}

TEST(CudaEmu, DivergentBarriersAndShufflesFailTheLaunch) {
  float* d;
  cudaMalloc(reinterpret_cast<void**>(&d), 128 * 4);
  KVB_LAUNCH(2, 128, 0, nullptr, barrier_in_half_the_block)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // reported once
  KVB_LAUNCH(1, 128, 0, nullptr, shuffle_in_half_a_warp)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  cudaDeviceSynchronize();
  KVB_LAUNCH(1, 1025, 0, nullptr, write_ids)(reinterpret_cast<int*>(d));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  cudaFree(d);
}

TEST(CudaEmu, WarpShufflesVotesAndAtomics) {
  int *scan, *down, *counter;
  unsigned* ballot;
  cudaMalloc(reinterpret_cast<void**>(&scan), 64 * 4);
  cudaMalloc(reinterpret_cast<void**>(&down), 2 * 4);
  cudaMalloc(reinterpret_cast<void**>(&ballot), 2 * 4);
  cudaMalloc(reinterpret_cast<void**>(&counter), 4);
  cudaMemset(counter, 0, 4);
  KVB_LAUNCH(1, 64, 0, nullptr, warp_primitives)(scan, down, ballot, counter);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> h(64), d(2), c(1);
  std::vector<unsigned> b(2);
  cudaMemcpy(h.data(), scan, 64 * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(d.data(), down, 2 * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), ballot, 2 * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(c.data(), counter, 4, cudaMemcpyDeviceToHost);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(h[t], (t % 32) * (t % 32 + 1) / 2) << t;
  EXPECT_EQ(d, (std::vector<int>{496, 496}));
  unsigned want = 0;
  for (int l = 0; l < 32; l += 3) want |= 1u << l;
  EXPECT_EQ(b, (std::vector<unsigned>{want, want}));
  EXPECT_EQ(c[0], 64 * 2);
  for (void* p : {static_cast<void*>(scan), static_cast<void*>(down), static_cast<void*>(ballot),
                  static_cast<void*>(counter)})
    cudaFree(p);
}

TEST(CudaEmu, UnwrittenMemoryReadsAsNaN) {
  float* d;
  cudaMalloc(reinterpret_cast<void**>(&d), 32 * 4);
  EXPECT_TRUE(std::isnan(host(d, 1)[0])) << "fresh allocations are poisoned";
  KVB_LAUNCH(1, 32, 0, nullptr, read_shared_unwritten)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : host(d, 32)) EXPECT_TRUE(std::isnan(v)) << "shared memory is poisoned per block";
  cudaFree(d);
}

void launch_read_past_the_end() {
  float* x = nullptr;
  float* out = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&x), 100 * 4);
  cudaMalloc(reinterpret_cast<void**>(&out), 32 * 4);
  KVB_LAUNCH(1, 32, 0, nullptr, read_past_the_end)(x, out, 100);
}

TEST(CudaEmuDeathTest, AReadPastAnAllocationNamesTheKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_read_past_the_end(),
               "kernel read_past_the_end, block \\(0, 0, 0\\), thread \\([0-9]+, 0, 0\\)");
}

}  // namespace
