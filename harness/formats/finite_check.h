#pragma once
// Finds the first NaN or Inf in a weight tensor's raw bytes, so that a damaged checkpoint is
// refused at load naming the tensor instead of producing NaN logits (or a silently wrong score)
// later. The test looks only at exponent bits (all ones means Inf or NaN), one pass over the source
// bytes with no conversion and no allocation. Torch-free.

#include <cstdint>

namespace kvb {

enum class FloatBits { kF32, kF16, kBF16 };

// Index of the first element of `n` in `data` that is NaN or +-Inf; -1 when all are finite.
// `data` needs no particular alignment.
int64_t first_nonfinite(const void* data, int64_t n, FloatBits bits);

}  // namespace kvb
