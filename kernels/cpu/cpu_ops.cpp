#include <cmath>

#include "kvb/kernels/cpu_ops.h"

#if KVB_HAVE_BLAS
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
#endif

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
#if KVB_HAVE_BLAS
  // Row-major y[rows, out] is column-major y'[out, rows]: y' = w'^T x' with w' = w read column-major.
  const int m = static_cast<int>(out), n = static_cast<int>(rows), k = static_cast<int>(in);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  sgemm_("T", "N", &m, &n, &k, &alpha, w, &k, x, &k, &beta, y, &m);
#else
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      const float* wr = w + o * in;
      const float* xr = x + r * in;
      float acc = 0.f;
      for (int64_t i = 0; i < in; ++i) acc += wr[i] * xr[i];
      y[r * out + o] = accumulate ? y[r * out + o] + acc : acc;
    }
  }
#endif
  if (bias) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += bias[o];
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

void silu_mul_f32(const float* gu, float* out, int64_t rows, int64_t F) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * F;
    const float* u = g + F;
    float* o = out + r * F;
    for (int64_t i = 0; i < F; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace kvb::kernels
