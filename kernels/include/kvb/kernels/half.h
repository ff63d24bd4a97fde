#pragma once
// IEEE 754 binary16 (fp16) and bfloat16 conversions on raw bit patterns, torch-free, header-only so
// that the reference and the optimised kernels share one definition (their outputs must agree bit
// for bit).
//
//   float_to_half(x)       round to nearest, ties to even (as hardware); overflow -> inf
//   float_to_half_down(x)  the largest fp16 <= x (toward -inf), saturating at -65504 / +65504
//   float_to_half_up(x)    the smallest fp16 >= x (toward +inf), saturating at -65504 / +65504
//   half_to_float(h)       exact
//   float_to_bf16(x)       round to nearest, ties to even; NaN stays NaN
//   bf16_to_float(b)       exact

#include <cstdint>
#include <cstring>

namespace kvb::kernels {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t o;
  if (x >= 0x47800000u) {  // >= 65536 (or inf/nan): inf or nan
    o = x > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (x < 0x38800000u) {  // below 2^-14: subnormal or zero. Adding 0.5 aligns the 10
    // mantissa bits at the bottom of the float; fp32 addition rounds to nearest even.
    const float r = bits_float(x) + bits_float(126u << 23);
    o = static_cast<uint16_t>(float_bits(r) - (126u << 23));
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // rebias, round half down ...
    x += mant_odd;                                          // ... and ties to even
    o = static_cast<uint16_t>(x >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float m = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return sign ? -m : m;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

namespace detail {
// The next fp16 toward -inf / +inf of a finite h (the zeros step to the smallest subnormals).
inline uint16_t half_next_down(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001;
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}
inline uint16_t half_next_up(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x0001;
  return (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}
constexpr float kHalfMax = 65504.0f;
}  // namespace detail

inline uint16_t float_to_half_down(float f) {
  if (!(f < detail::kHalfMax)) return 0x7bff;  // >= max (and NaN): +65504
  if (f <= -detail::kHalfMax) return 0xfbff;   // -65504
  uint16_t h = float_to_half(f);
  if (half_to_float(h) > f) h = detail::half_next_down(h);
  return h;
}

inline uint16_t float_to_half_up(float f) {
  if (!(f > -detail::kHalfMax)) return 0xfbff;  // <= -max (and NaN): -65504
  if (f >= detail::kHalfMax) return 0x7bff;
  uint16_t h = float_to_half(f);
  if (half_to_float(h) < f) h = detail::half_next_up(h);
  return h;
}

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

}  // namespace kvb::kernels
