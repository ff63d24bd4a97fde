// Kernels of the emulator's own tests (cuda_emu_test.cpp): valid CUDA, compiled only for the
// emulator, through the same source rewrite as kernels/cuda (emu_rewrite.cmake).
#include <cuda_runtime.h>

#include "selftest_kernels.h"

namespace kvb_emu_selftest {

// Every thread of a 3-D grid of 3-D blocks writes its global linear id once.
__global__ void write_ids(int* out) {
  const int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int n = blockDim.x * blockDim.y * blockDim.z;
  out[bx * n + tx] += bx * n + tx + 1;
}

// A block sum through shared memory (tree with barriers) and a warp sum through shuffles.
__global__ void block_and_warp_sums(const float* x, float* block_sum, float* warp_sum) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  const float v = x[blockIdx.x * blockDim.x + t];
  s[t] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) block_sum[blockIdx.x] = s[0];
  float w = v;
  for (int off = 16; off >= 1; off /= 2) w += __shfl_xor_sync(0xffffffffu, w, off);
  warp_sum[blockIdx.x * blockDim.x + t] = w;  // every lane holds its warp's sum
}

// Writes its neighbour's value without a barrier in between: only right by luck of thread order.
__global__ void neighbour_without_barrier(float* out) {
  __shared__ float s[128];
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  out[threadIdx.x] = s[(threadIdx.x + 1) % 128];
}

__global__ void barrier_in_half_the_block(float* out) {
  if (threadIdx.x < 64) __syncthreads();
  out[threadIdx.x] = 1.f;
}

__global__ void shuffle_in_half_a_warp(float* out) {
  float v = 1.f;
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void read_shared_unwritten(float* out) {
  __shared__ float s[32];
  out[threadIdx.x] = s[threadIdx.x];
}

__global__ void read_past_the_end(const float* x, float* out, int n) {
  out[threadIdx.x] = x[n + threadIdx.x];  // thread 0 reads the first float past the end
}

// Prefix sums of lane ids by __shfl_up_sync, a warp sum by __shfl_down_sync, votes and an atomic.
__global__ void warp_primitives(int* scan, int* down_sum, unsigned* ballot, int* counter) {
  const int lane = threadIdx.x % 32;
  int v = lane;
  for (int d = 1; d < 32; d *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  scan[threadIdx.x] = v;
  int s = lane;
  for (int d = 16; d >= 1; d /= 2) s += __shfl_down_sync(0xffffffffu, s, d);
  if (lane == 0) down_sum[threadIdx.x / 32] = s;
  const unsigned b = __ballot_sync(0xffffffffu, lane % 3 == 0);
  if (lane == 0) ballot[threadIdx.x / 32] = b;
  atomicAdd(counter, __any_sync(0xffffffffu, lane == 31) + __all_sync(0xffffffffu, lane < 32));
}

}  // namespace kvb_emu_selftest
