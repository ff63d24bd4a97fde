#pragma once
// Attention probabilities summed over a set of query rows: the score SnapKV-style methods rank keys
// by (the last `window` queries' attention to every kept key). Torch-free: raw pointers.

#include <cstdint>

namespace kvb::kernels {

// For n query rows i, each with G heads sharing one kv head (head g of row i at q + i * q_stride +
// g * D), over the first vis[i] of the len keys k [len, D] (vis[i] <= len; 0: the row adds nothing):
//   out[g * out_g_stride + j] += sum_i softmax_j(scale * q[i, g] . k[j])   for j < vis[i].
// scratch: len floats. fp32 throughout; an eight-lane dot and the kernels' exp_f32, so it is not the
// bits of a scalar loop (within 1e-5 relative of an fp64 one: test AttentionScores.*).
void attention_prob_sums_f32(const float* q, int64_t q_stride, int64_t n, int64_t G, int64_t D,
                             const float* k, int64_t len, const int64_t* vis, float scale,
                             float* out, int64_t out_g_stride, float* scratch);

}  // namespace kvb::kernels
