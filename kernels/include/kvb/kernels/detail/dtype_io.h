#pragma once
// Element loads and stores by KvDtype for the host kernels (ref/ and cpu/), through half.h so that
// every version rounds the same way (round to nearest even). Internal: not part of the kernel API.

#include <cstdint>

#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/half.h"

namespace kvb::kernels::detail {

inline float load_elem(const void* base, KvDtype d, int64_t i) {
  switch (d) {
    case KvDtype::kF16:
      return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case KvDtype::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case KvDtype::kF32:
      return static_cast<const float*>(base)[i];
  }
  return 0.f;
}

inline void store_elem(void* base, KvDtype d, int64_t i, float x) {
  switch (d) {
    case KvDtype::kF16:
      static_cast<uint16_t*>(base)[i] = float_to_half(x);
      return;
    case KvDtype::kBF16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(x);
      return;
    case KvDtype::kF32:
      static_cast<float*>(base)[i] = x;
      return;
  }
}

// fp16 to fp32 without branches (so that row loops vectorise), bit-identical to half_to_float:
// the exponent/mantissa bits shifted into place read as a float 2^-112 times the value (normal and
// subnormal halves alike), so one exact multiply by 2^112 rebiases; inf and NaN are selected apart.
inline float half_to_float_fast(uint16_t h) {
  const uint32_t em = h & 0x7fffu;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const float scaled = bits_float(em << 13) * 5.192296858534828e33f;  // 2^112
  const uint32_t finite = float_bits(scaled) | sign;
  const uint32_t special = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
  const uint32_t pick = 0u - static_cast<uint32_t>(em >= 0x7c00u);  // all ones for inf / NaN
  return bits_float((special & pick) | (finite & ~pick));
}

// Dot product with eight independent partial sums, so that the compiler can vectorise it without
// reassociation flags (a single accumulator is a serial chain of dependent adds).
inline float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[d + k] * b[d + k];
  for (; d < n; ++d) acc[0] += a[d] * b[d];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// a[d] += sum_i e[i] * v[i * ld + d] for d < hd: the value side of a softmax tile. Channels go 16 at
// a time with their sums held in registers across the rows (the row-by-row loop loads and stores
// a[] once per row), and each a[d] still adds its rows in order, so the bits are the row-by-row
// loop's.
inline void accumulate_rows(float* a, const float* e, const float* v, int64_t n, int64_t ld,
                            int64_t hd) {
  int64_t d0 = 0;
  for (; d0 + 16 <= hd; d0 += 16) {
    float t[16];
    for (int k = 0; k < 16; ++k) t[k] = a[d0 + k];
    for (int64_t i = 0; i < n; ++i) {
      const float ei = e[i];
      const float* vi = v + i * ld + d0;
      for (int k = 0; k < 16; ++k) t[k] += ei * vi[k];
    }
    for (int k = 0; k < 16; ++k) a[d0 + k] = t[k];
  }
  for (; d0 + 8 <= hd; d0 += 8) {  // head_dim 8 (stories260K) or a remainder of 8
    float t[8];
    for (int k = 0; k < 8; ++k) t[k] = a[d0 + k];
    for (int64_t i = 0; i < n; ++i) {
      const float ei = e[i];
      const float* vi = v + i * ld + d0;
      for (int k = 0; k < 8; ++k) t[k] += ei * vi[k];
    }
    for (int k = 0; k < 8; ++k) a[d0 + k] = t[k];
  }
  for (; d0 < hd; ++d0) {
    float t = a[d0];
    for (int64_t i = 0; i < n; ++i) t += e[i] * v[i * ld + d0];
    a[d0] = t;
  }
}

// n consecutive elements starting at element i into fp32.
inline void load_row(const void* base, KvDtype d, int64_t i, int64_t n, float* out) {
  if (d == KvDtype::kF32) {
    const float* s = static_cast<const float*>(base) + i;
    for (int64_t k = 0; k < n; ++k) out[k] = s[k];
  } else if (d == KvDtype::kBF16) {
    const uint16_t* s = static_cast<const uint16_t*>(base) + i;
    for (int64_t k = 0; k < n; ++k) out[k] = bf16_to_float(s[k]);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(base) + i;
    for (int64_t k = 0; k < n; ++k) out[k] = half_to_float_fast(s[k]);
  }
}

inline void store_row(void* base, KvDtype d, int64_t i, int64_t n, const float* x) {
  for (int64_t k = 0; k < n; ++k) store_elem(base, d, i + k, x[k]);
}

}  // namespace kvb::kernels::detail
