#pragma once
// fp16/bf16/fp32 cache rows gathered into a contiguous fp32 tile for tile_attention.h's products
// (the KIVI decode kernel's fp16 residual rows; the paged decode kernel widens its rows in
// registers instead, pool_rows.h). fp16 goes through the CPU's conversion instruction (F16C)
// when it has one, chosen once at run time; the conversion is exact, so the choice changes no
// number (a signalling NaN comes out quiet, still a NaN).
// Internal: not part of the kernel API.

#include <cstdint>

#include "kvb/kernels/decode_attention.h"

namespace kvb::kernels::detail {

// out[(h * n_rows + i) * n_cols + c] = element rows[i] + h * n_cols + c of base (dtype d) as
// fp32, for heads h < n_heads, i < n_rows, c < n_cols: each row's heads are read in memory order
// and sorted into one contiguous [n_rows, n_cols] tile per head.
void widen_rows(const void* base, KvDtype d, const int64_t* rows, int64_t n_rows, int64_t n_heads,
                int64_t n_cols, float* out);

}  // namespace kvb::kernels::detail
