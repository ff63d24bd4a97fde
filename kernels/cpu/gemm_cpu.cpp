#include "kvb/kernels/detail/gemm.h"

#if KVB_HAVE_BLAS
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
#endif

namespace kvb::kernels::detail {

// BLAS is column-major: a row-major [m, n] matrix with row stride ld is the column-major [n, m]
// matrix with leading dimension ld, so each row-major product is computed transposed:
// c^T[n, m] = op(b)[n, k] . a^T[k, m], op(b) = b read as [n, k] (b_nk) or as [k, n].
namespace {

void gemm_rowmajor(bool b_nk, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
#if KVB_HAVE_BLAS
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  const float one = 1.f;
  sgemm_(b_nk ? "T" : "N", "N", &M, &N, &K, &one, b, &lb, a, &la, &beta, c, &lc);
#else
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) acc += a[i * lda + p] * (b_nk ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = beta == 0.f ? acc : beta * c[i * ldc + j] + acc;
    }
#endif
}

}  // namespace

void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_rowmajor(true, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_rowmajor(false, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace kvb::kernels::detail
