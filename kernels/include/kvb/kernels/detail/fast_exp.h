#pragma once
// exp for the CPU kernels' softmax: branch-free (clamps and selects), so that a loop over a tile's
// scores vectorises, where std::exp is a scalar libm call per score (at 32K tokens and a group of
// 4, a million calls per decode step and kv head set, most of the fp16 kernel's time once its loads
// run 8-wide). Cephes' expf: n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two so that n ln 2
// is exact), a degree-5 polynomial for exp(r) on [-ln2/2, ln2/2], times 2^n built in the exponent
// bits. Relative error <= 2 ulp against a correctly rounded exp (test: FastExp.*); exp(-inf) = 0,
// results below 2^-126 flush to 0 (softmax weights that small add nothing), x > 88 gives inf
// (exp(88.72) is the float limit; a softmax's shifted scores are <= 0), NaN stays NaN.

#include <cstdint>
#include <cstring>
#include <limits>

namespace kvb::kernels::detail {

inline float exp_f32(float x) {
  const float lo = -87.33654475f, hi = 88.f;  // 2^-126; above 88 the result is called inf
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const float n = (xc * 1.44269504088896341f + magic) - magic;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const int32_t e = static_cast<int32_t>(n) + 127;  // 1..254 after the clamps
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float y = p * scale;
  y = x < lo ? 0.f : y;  // below 2^-126 (and -inf)
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;  // NaN
}

}  // namespace kvb::kernels::detail
