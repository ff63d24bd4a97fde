#pragma once
// Row-major single-threaded fp32 GEMMs for the CPU kernels, on the linked BLAS (OpenBLAS on Debian)
// or a plain loop when none was linked, and a one-row GEMV of our own. Callers thread over their
// own work items (OpenMP); the BLAS itself is held to one thread (threads.h), so that one pool
// serves the whole forward pass.

#include <cstdint>

namespace kvb::kernels::detail {

// c[m, n] = a[m, k] . b[n, k]^T + beta * c.   Row strides lda, ldb, ldc (in floats).
void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc);

// c[m, n] = a[m, k] . b[k, n] + beta * c.   Row strides lda, ldb, ldc (in floats).
void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc);

// y[n] = b[n, k] . x[k] + beta * y (beta 0: y is not read): one row against a weight matrix. Our
// own loop (gemv_cpu.cpp), not the BLAS: a GEMM with one row would pack (copy) the whole of b on
// every call, and the BLAS's sgemv streams the weights slower than this on a large matrix and
// spends more on call overhead than on products on a small one.
void gemv_n(int64_t n, int64_t k, const float* b, int64_t ldb, const float* x, float beta, float* y);
// The same product for a weight matrix streamed from memory (larger than the caches): one row at a
// time, a single sequential stream; a different summation order (gemv_cpu.cpp).
// c[m, n] = a[m, k] . b[n, k]^T + beta * c for a few rows (a batched decode step): register tiles
// of 3 rows x 3 weight rows, each output gemv_n's dot product bit for bit (gemm_rows_cpu.cpp).
void gemm_nt_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float beta, float* c, int64_t ldc);
void gemv_stream_n(int64_t n, int64_t k, const float* b, int64_t ldb, const float* x, float beta,
                   float* y);

}  // namespace kvb::kernels::detail
