// gemm_nt_rows (detail/gemm.h): a few activation rows against a row-major weight matrix, the
// matmul of a batched decode step (one row per sequence). The BLAS packs (copies) its operands and
// blocks for large matrices; with 2 to 32 rows the packing of the weights is paid for a few rows
// only, and OpenBLAS reaches well under half of a core's peak there up to about 16 rows. This kernel instead holds a tile
// of MR rows x NR weight rows in MR * NR vector accumulators (3 x 3: 9 accumulators, 3 weight
// vectors, 1 row vector and the product: 14 of the 16 AVX registers; without FMA a product needs a
// register of its own, and 4 x 3 spills one accumulator), so that every weight vector loaded feeds
// MR products and every row vector NR, with the weights streamed once per call (the next block
// prefetched) and the rows read from the L1/L2 cache.
//
// Order, per output (i, j): the same as gemv_n's, dot_f32(w[j, :], x[i, :]) bit for bit (lane
// c % 8 adds w[j, c] x[i, c] in order for c below the last multiple of 8, the rest go on into lane
// 0, the lanes are summed as a pairwise tree); then c = t (beta 0: c is not read) or beta * c + t.
// So a row's outputs do not depend on the other rows, on the tiling or on the threads: a batch of
// sequences computes what each would alone through gemv_n. Compiled for AVX2 and the baseline with
// the same bits (cpu_clones.h).

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/gemm.h"
#include "kvb/kernels/detail/simd8.h"

namespace kvb::kernels::detail {

namespace {

constexpr int kMR = 3;  // activation rows per tile
constexpr int kNR = 3;  // weight rows per tile

// One tile: rows a[0..MR) x weight rows b[0..NR) -> c[MR, NR] (row stride ldc).
// pf: where the next block of weights starts (NR * k floats) to prefetch while this tile runs, or
// null.
template <int MR, int NR>
KVB_SIMD_INLINE void tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float beta, float* c, int64_t ldc, const float* pf) {
  f32x8 acc[16] = {};  // [MR * NR] used, the rest stay zero for the two lane_sums8 rounds
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t p = 0; p < k8; p += 8) {
    if (pf) {  // NR * 8 floats of the next block per step: the whole block over the tile
      __builtin_prefetch(pf + NR * p);
      __builtin_prefetch(pf + NR * p + 16);
    }
    f32x8 bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = load8(b + j * ldb + p);
    for (int i = 0; i < MR; ++i) {
      const f32x8 av = load8(a + i * lda + p);
      for (int j = 0; j < NR; ++j) acc[i * NR + j] += bv[j] * av;
    }
  }
  for (int64_t p = k8; p < k; ++p)  // into lane 0; the other lanes add -0, which changes no float
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j)
        acc[i * NR + j] +=
            f32x8{b[j * ldb + p] * a[i * lda + p], -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f};
  float t[16];
  store8(t, lane_sums8(acc));
  if (MR * NR > 8) store8(t + 8, lane_sums8(acc + 8));
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float& y = c[i * ldc + j];
      y = beta == 0.f ? t[i * NR + j] : beta * y + t[i * NR + j];
    }
}

// All rows against NR weight rows: full tiles of kMR rows, then the rows left.
template <int NR>
KVB_SIMD_INLINE void column_block(int64_t m, int64_t k, const float* a, int64_t lda, const float* b,
                                  int64_t ldb, float beta, float* c, int64_t ldc, const float* pf) {
  int64_t i = 0;
  for (; i + kMR <= m; i += kMR)
    tile<kMR, NR>(k, a + i * lda, lda, b, ldb, beta, c + i * ldc, ldc, i == 0 ? pf : nullptr);
  static_assert(kMR == 3, "the tail below covers 1 and 2 rows");
  switch (m - i) {
    case 2:
      tile<2, NR>(k, a + i * lda, lda, b, ldb, beta, c + i * ldc, ldc, i == 0 ? pf : nullptr);
      break;
    case 1:
      tile<1, NR>(k, a + i * lda, lda, b, ldb, beta, c + i * ldc, ldc, i == 0 ? pf : nullptr);
      break;
    default:
      break;
  }
}

}  // namespace

KVB_CPU_CLONES void gemm_nt_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Weight rows outermost: a block of kNR is loaded from memory once and stays in L1 while every
  // activation row passes it.
  static_assert(kNR == 3, "the tail below covers 1 and 2 weight rows");
  int64_t j = 0;
  for (; j + kNR <= n; j += kNR) {
    // The next block's weights are prefetched during this one's first tile when the rows are
    // consecutive (ldb == k: one contiguous stream); the later tiles read this block from L1.
    const float* next = ldb == k && j + 2 * kNR <= n ? b + (j + kNR) * ldb : nullptr;
    column_block<kNR>(m, k, a, lda, b + j * ldb, ldb, beta, c + j, ldc, next);
  }
  if (n - j == 2) column_block<2>(m, k, a, lda, b + j * ldb, ldb, beta, c + j, ldc, nullptr);
  if (n - j == 1) column_block<1>(m, k, a, lda, b + j * ldb, ldb, beta, c + j, ldc, nullptr);
}

}  // namespace kvb::kernels::detail
