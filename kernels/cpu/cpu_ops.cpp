#include "kvb/kernels/cpu_ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/detail/gemm.h"
#include "kvb/kernels/detail/simd8.h"
#include "kvb/kernels/threads.h"

namespace kvb::kernels {

bool have_blas() { return KVB_HAVE_BLAS != 0; }

void rms_norm_f32(const float* x, const float* w, float* out, int64_t rows, int64_t dim,
                  float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    float ss = 0.f;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
  }
}

// Up to this many rows, linear_f32 runs the register-tiled kernel rather than the BLAS, whose
// packing costs more than it saves on a few rows. Measured on one core against SmolLM2's 576 ->
// 1536 projection (scripts/bench-kernels.sh, results/kernels-cpu.md): the tiled kernel is 2.05x
// the BLAS at 2 rows, 1.08x at 16 and 0.96x at 32.
constexpr int64_t kMaxTiledRows = 16;

void linear_f32(const float* x, const float* w, const float* bias, float* y, int64_t rows,
                int64_t in, int64_t out, bool accumulate) {
  const double macs =
      static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
  const float beta = accumulate ? 1.f : 0.f;
  auto add_bias = [&](int64_t o0, int64_t o1) {
    if (bias)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = o0; o < o1; ++o) y[r * out + o] += bias[o];
  };
  // Products whose every output is a dot product of its own (gemv_cpu.cpp, gemm_rows_cpu.cpp): the
  // output channels split evenly over the threads (in multiples of 8, the GEMV's row block) without
  // changing a bit. part(o0, o1) computes outputs [o0, o1) of every row.
  auto split_outputs = [&](const auto& part) {
    const int threads = macs >= kMinParallelMacs && out >= 16 ? cpu_threads() : 1;
    if (threads <= 1) {  // an OpenMP region, even an inactive one, costs thousands of instructions
      part(int64_t{0}, out);
      add_bias(0, out);
      return;
    }
    const int64_t chunk = ((out + threads - 1) / threads + 7) / 8 * 8;
#pragma omp parallel num_threads(threads)
    {
      const int64_t o0 = std::min(out, omp_get_thread_num() * chunk),
                    o1 = std::min(out, o0 + chunk);
      if (o1 > o0) {
        part(o0, o1);
        add_bias(o0, o1);
      }
    }
  };
  if (rows == 1) {
    // One row: our GEMV. A matrix beyond the L2 cache is streamed row by row (gemv_stream_n); the
    // choice depends on the matrix alone, not on the threads.
    constexpr double kStreamBytes = 1 << 20;
    const auto gemv = 4.0 * macs >= kStreamBytes ? detail::gemv_stream_n : detail::gemv_n;
    split_outputs([&](int64_t o0, int64_t o1) {
      gemv(o1 - o0, in, w + o0 * in, in, x, beta, y + o0);
    });
    return;
  }
  if (rows <= kMaxTiledRows) {
    // A few rows (a batched decode step): the register-tiled kernel, each output gemv_n's dot
    // product.
    split_outputs([&](int64_t o0, int64_t o1) {
      detail::gemm_nt_rows(rows, o1 - o0, in, x, in, w + o0 * in, in, beta, y + o0, out);
    });
    return;
  }
  // Many rows: output channels in fixed slices of kSlice, the slices shared out over the OpenMP
  // threads, each a single-threaded GEMM (threads.h). The slicing does not depend on the thread
  // count, so neither do the bits (the BLAS picks its kernels and blocking by shape: one GEMM over
  // all channels and one over a part of them may round differently).
  constexpr int64_t kSlice = 256;
  const int64_t slices = (out + kSlice - 1) / kSlice;
  const bool parallel = macs >= kMinParallelMacs && slices > 1 && cpu_threads() > 1;
  auto slice = [&](int64_t s) {
    const int64_t o0 = s * kSlice, o1 = std::min(out, o0 + kSlice);
    detail::gemm_nt(rows, o1 - o0, in, x, in, w + o0 * in, in, beta, y + o0, out);
    add_bias(o0, o1);
  };
  if (!parallel) {
    for (int64_t s = 0; s < slices; ++s) slice(s);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slices; ++s) slice(s);
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
  // exp_f32 (within 2 ulp of exp) rather than std::exp, a libm call per element: the loop
  // vectorises.
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * F;
    const float* u = g + F;
    float* o = out + r * F;
    for (int64_t i = 0; i < F; ++i) o[i] = g[i] / (1.f + detail::exp_f32(-g[i])) * u[i];
  }
}

KVB_CPU_CLONES int64_t argmax_f32(const float* x, int64_t n) {
  // Lane k keeps the first maximum of x[k], x[k + 8], ... (strictly greater replaces), starting
  // from -inf at no index; the lanes' best values tie-break to the smallest index, which is the
  // first maximum overall. What std::max_element does differently only with NaNs and all -inf:
  // x[0] is its answer when nothing compares greater than x[0].
  if (!(x[0] == x[0])) return 0;  // NaN first
  float best[8];
  int32_t at[8];  // (32-bit, so that the lanes are one vector; longer rows go 2^30 at a time)
  int64_t base = 0, n8 = n & ~int64_t{7};
  float m = -INFINITY;
  int64_t idx = -1;
  for (; base < n8; base += int64_t{1} << 30) {
    const int32_t len = static_cast<int32_t>(std::min<int64_t>(n8 - base, int64_t{1} << 30));
    const float* xb = x + base;
    detail::f32x8 bv = detail::splat8(-INFINITY);
    detail::i32x8 av = {-1, -1, -1, -1, -1, -1, -1, -1}, iv = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int32_t i = 0; i < len; i += 8, iv += 8) {
      const detail::f32x8 xv = detail::load8(xb + i);
      const detail::i32x8 gt = xv > bv;
      bv = gt ? xv : bv;
      av = gt ? iv : av;
    }
    detail::store8(best, bv);
    std::memcpy(at, &av, sizeof at);
    for (int k = 0; k < 8; ++k)
      if (at[k] >= 0 && (best[k] > m || (best[k] == m && base + at[k] < idx)))
        m = best[k], idx = base + at[k];
  }
  for (int64_t i = n8; i < n; ++i)
    if (x[i] > m) m = x[i], idx = i;
  return idx < 0 ? 0 : idx;
}

}  // namespace kvb::kernels
