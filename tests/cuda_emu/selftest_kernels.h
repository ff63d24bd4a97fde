#pragma once
// The emulator self-test kernels (selftest_kernels.cu).
#include <cuda_runtime.h>

namespace kvb_emu_selftest {

__global__ void write_ids(int* out);
__global__ void block_and_warp_sums(const float* x, float* block_sum, float* warp_sum);
__global__ void neighbour_without_barrier(float* out);
__global__ void barrier_in_half_the_block(float* out);
__global__ void shuffle_in_half_a_warp(float* out);
__global__ void read_shared_unwritten(float* out);
__global__ void read_past_the_end(const float* x, float* out, int n);
__global__ void warp_primitives(int* scan, int* down_sum, unsigned* ballot, int* counter);

}  // namespace kvb_emu_selftest
