#include <algorithm>
#include <cmath>

#include "kvb/kernels/cpu_ops.h"
#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/detail/gemm.h"
#include "kvb/kernels/threads.h"

namespace kvb::kernels {

bool have_blas() { return KVB_HAVE_BLAS != 0; }

void rms_norm_f32(const float* x, const float* w, float* out, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    float ss = 0.f;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
  }
}

void linear_f32(const float* x, const float* w, const float* bias, float* y, int64_t rows,
                int64_t in, int64_t out, bool accumulate) {
  // Output channels in fixed slices of kSlice, the slices shared out over the OpenMP threads, each a
  // single-threaded GEMM (threads.h). The slicing does not depend on the thread count, so neither do
  // the bits (the BLAS picks its kernels and blocking by shape: one GEMM over all channels and one
  // over a part of them may round differently).
  constexpr int64_t kSlice = 256;
  const double macs = static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
  const int64_t slices = (out + kSlice - 1) / kSlice;
  const bool parallel = macs >= kMinParallelMacs && slices > 1 && cpu_threads() > 1;
  const float beta = accumulate ? 1.f : 0.f;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t o0 = s * kSlice, o1 = std::min(out, o0 + kSlice);
    if (rows == 1)
      detail::gemv_n(o1 - o0, in, w + o0 * in, in, x, beta, y + o0);
    else
      detail::gemm_nt(rows, o1 - o0, in, x, in, w + o0 * in, in, beta, y + o0, out);
    if (bias) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = o0; o < o1; ++o) y[r * out + o] += bias[o];
    }
  }
}

void rope_f32(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
              const float* cos, const float* sin, const int64_t* positions, bool interleaved) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + positions[t] * half;
    const float* s = sin + positions[t] * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * token_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        float* a = interleaved ? v + 2 * i : v + i;
        float* b = interleaved ? v + 2 * i + 1 : v + i + half;
        const float x0 = *a, x1 = *b;
        *a = x0 * c[i] - x1 * s[i];
        *b = x0 * s[i] + x1 * c[i];
      }
    }
  }
}

KVB_CPU_CLONES void silu_mul_f32(const float* gu, float* out, int64_t rows, int64_t F) {
  // exp_f32 (within 2 ulp of exp) rather than std::exp, a libm call per element: the loop vectorises.
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * F;
    const float* u = g + F;
    float* o = out + r * F;
    for (int64_t i = 0; i < F; ++i) o[i] = g[i] / (1.f + detail::exp_f32(-g[i])) * u[i];
  }
}

}  // namespace kvb::kernels
