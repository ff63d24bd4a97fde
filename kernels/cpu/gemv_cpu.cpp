// gemv_n (detail/gemm.h): one activation row against a row-major weight matrix, the decode-time
// matmul. Our own rather than the BLAS's sgemv: it is a stream over the weights (memory-bound on
// a large model; on a small one, OpenBLAS's per-call checks and beta scaling cost more than the
// products), so eight weight rows go at a time against one load of x, one accumulator each (eight
// independent add chains), their lane sums in one transpose-and-add (lane_sums8). Compiled for
// AVX2 as well as the baseline (cpu_clones.h), with the same bits in both; a row's sum does not
// depend on how the rows are split over threads.
//
// Order, per output j: t = dot_f32(w[j, :], x) bit for bit (lane c % 8 adds w[j, c] x[c] in order
// for c below the last multiple of 8, the rest go on into lane 0, the lanes are summed as a
// pairwise tree); then y = t (beta 0: y is not read) or beta * y + t.
//
// gemv_stream_n, for weights that come from memory rather than cache: one row at a time, a single
// sequential stream (eight rows at a time are eight interleaved streams, which the hardware
// prefetcher follows less well: about 1.5x slower on a SmolLM2 decode's weights). Its order per
// output: accumulator a (8 lanes) adds the 8-column blocks c with (c / 8) % 8 == a in order, the
// columns past the last multiple of 8 go on into lane 0 of accumulator 0, the accumulators are
// added as a pairwise tree ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), then the lanes as dot_f32's.

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/gemm.h"
#include "kvb/kernels/detail/simd8.h"

namespace kvb::kernels::detail {

namespace {

template <int NR>
KVB_SIMD_INLINE void gemv_rows(int64_t k, const float* b, int64_t ldb, const float* x, float beta,
                               float* y) {
  f32x8 acc[8] = {};
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t c = 0; c < k8; c += 8) {
    const f32x8 xv = load8(x + c);
    for (int r = 0; r < NR; ++r) acc[r] += load8(b + r * ldb + c) * xv;
  }
  for (int64_t c = k8; c < k; ++c)  // into lane 0; the other lanes add -0, which changes no float
    for (int r = 0; r < NR; ++r)
      acc[r] += f32x8{b[r * ldb + c] * x[c], -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f};
  float t[8];
  store8(t, lane_sums8(acc));
  for (int r = 0; r < NR; ++r) y[r] = beta == 0.f ? t[r] : beta * y[r] + t[r];
}

// One row, columns in strides of 64 over eight accumulators: a single sequential stream through
// the weights (rows are consecutive), which the hardware prefetcher follows best.
KVB_SIMD_INLINE float stream_row(int64_t k, const float* b, const float* x) {
  f32x8 acc[8] = {};
  const int64_t k8 = k & ~int64_t{7};
  int64_t c = 0;
  for (; c + 64 <= k8; c += 64)
    for (int a = 0; a < 8; ++a) acc[a] += load8(b + c + 8 * a) * load8(x + c + 8 * a);
  for (int a = 0; c < k8; c += 8, ++a) acc[a] += load8(b + c) * load8(x + c);
  for (; c < k; ++c) acc[0] += f32x8{b[c] * x[c], -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f};
  f32x8 sum[8] = {((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                  ((acc[4] + acc[5]) + (acc[6] + acc[7]))};
  float t[8];
  store8(t, lane_sums8(sum));
  return t[0];
}

}  // namespace

KVB_CPU_CLONES void gemv_stream_n(int64_t n, int64_t k, const float* b, int64_t ldb, const float* x,
                                  float beta, float* y) {
  for (int64_t j = 0; j < n; ++j) {
    const float t = stream_row(k, b + j * ldb, x);
    y[j] = beta == 0.f ? t : beta * y[j] + t;
  }
}

KVB_CPU_CLONES void gemv_n(int64_t n, int64_t k, const float* b, int64_t ldb, const float* x,
                           float beta, float* y) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) gemv_rows<8>(k, b + j * ldb, ldb, x, beta, y + j);
  if (n - j >= 4) {
    gemv_rows<4>(k, b + j * ldb, ldb, x, beta, y + j);
    j += 4;
  }
  if (n - j >= 2) {
    gemv_rows<2>(k, b + j * ldb, ldb, x, beta, y + j);
    j += 2;
  }
  if (n - j == 1) gemv_rows<1>(k, b + j * ldb, ldb, x, beta, y + j);
}

}  // namespace kvb::kernels::detail
