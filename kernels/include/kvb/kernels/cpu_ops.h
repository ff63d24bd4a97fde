#pragma once
// Row-wise fp32 building blocks of the Llama forward on the CPU, on raw pointers. The engine's CPU fp32
// path calls these directly: on a small model LibTorch's per-op dispatch (~4 us an op, ~30 ops a layer)
// costs more than the arithmetic, so the hot loop avoids it (the llama.cpp way).

#include <cstdint>

namespace kvb::kernels {

// True when a BLAS sgemm was linked in (else linear_f32 uses a plain loop).
bool have_blas();

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w.   x, out: [rows, dim]; w: [dim]
void rms_norm_f32(const float* x, const float* w, float* out, int64_t rows, int64_t dim, float eps);

// y = x . w^T (+ bias) (+ y when accumulate).   x: [rows, in]; w: [out, in]; bias: [out] or null;
// y: [rows, out].
void linear_f32(const float* x, const float* w, const float* bias, float* y, int64_t rows,
                int64_t in, int64_t out, bool accumulate);

// RoPE in place on x: [tokens, heads, head_dim] with row stride `token_stride` floats; tables
// cos/sin: [max_pos, head_dim / 2]; positions: [tokens]. interleaved: pairs (2i, 2i+1), else halves.
void rope_f32(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
              const float* cos, const float* sin, const int64_t* positions, bool interleaved);

// out[r, i] = silu(gu[r, i]) * gu[r, F + i].   gu: [rows, 2F]; out: [rows, F]
void silu_mul_f32(const float* gu, float* out, int64_t rows, int64_t F);

// The index std::max_element(x, x + n) returns (n >= 1): the first maximum; a NaN is never
// greater than anything, so it is returned only from x[0]. Eight lanes at a time.
int64_t argmax_f32(const float* x, int64_t n);

}  // namespace kvb::kernels
