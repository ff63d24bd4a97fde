// Optimised CPU group quantizer (quantize.h): bit-identical to the oracles in ref/quantize_ref.cpp.
// Codes go through a scratch byte per element and are packed a byte (2/4/8 bits) or three bytes
// (3 bits: eight codes) at a time; column groups are reduced row by row across all columns.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/half.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels {

namespace {

// Packs k < 8 codes (or exactly 8) into the low k*bits bits of a word.
inline uint64_t gather_codes(const uint8_t* c, int64_t k, int32_t bits, uint32_t mask) {
  uint64_t w = 0;
  for (int64_t i = 0; i < k; ++i) w |= static_cast<uint64_t>(c[i] & mask) << (i * bits);
  return w;
}

// Round to nearest, ties to even, for 0 <= t < 2^23: adding 2^23 leaves no fraction bits, and fp32
// addition rounds to nearest even; identical to std::nearbyint in the default rounding mode.
inline float round_small(float t) {
  constexpr float kMagic = 8388608.0f;
  return (t + kMagic) - kMagic;
}

thread_local std::vector<uint8_t> tl_codes;

uint8_t* scratch_codes(int64_t n) {
  if (static_cast<int64_t>(tl_codes.size()) < n) tl_codes.resize(static_cast<size_t>(n));
  return tl_codes.data();
}

}  // namespace

void pack_codes_cpu(const uint8_t* codes, int64_t n, int32_t bits, uint8_t* packed) {
  const uint32_t mask = (1u << bits) - 1u;
  int64_t i = 0, o = 0;
  switch (bits) {
    case 8:
      std::memcpy(packed, codes, static_cast<size_t>(n));
      return;
    case 4:
      for (; i + 2 <= n; i += 2, ++o)
        packed[o] = static_cast<uint8_t>((codes[i] & 0xf) | ((codes[i + 1] & 0xf) << 4));
      break;
    case 2:
      for (; i + 4 <= n; i += 4, ++o)
        packed[o] = static_cast<uint8_t>((codes[i] & 3) | ((codes[i + 1] & 3) << 2) |
                                         ((codes[i + 2] & 3) << 4) | ((codes[i + 3] & 3) << 6));
      break;
    case 3:
      for (; i + 8 <= n; i += 8, o += 3) {
        const uint32_t w = static_cast<uint32_t>(gather_codes(codes + i, 8, 3, 7));
        packed[o] = static_cast<uint8_t>(w);
        packed[o + 1] = static_cast<uint8_t>(w >> 8);
        packed[o + 2] = static_cast<uint8_t>(w >> 16);
      }
      break;
    default:
      return;
  }
  // Tail: fewer codes than one packing unit, always starting on a byte boundary.
  if (i < n) {
    const uint64_t w = gather_codes(codes + i, n - i, bits, mask);
    const int64_t nb = packed_code_bytes(n - i, bits);
    for (int64_t b = 0; b < nb; ++b) packed[o + b] = static_cast<uint8_t>(w >> (8 * b));
  }
}

KVB_CPU_CLONES void unpack_codes_cpu(const uint8_t* packed, int64_t n, int32_t bits, uint8_t* codes) {
  const uint32_t mask = (1u << bits) - 1u;
  int64_t i = 0, o = 0;
  switch (bits) {
    case 8:
      std::memcpy(codes, packed, static_cast<size_t>(n));
      return;
    case 4:
      for (; i + 2 <= n; i += 2, ++o) {
        codes[i] = packed[o] & 0xf;
        codes[i + 1] = packed[o] >> 4;
      }
      break;
    case 2:
      for (; i + 4 <= n; i += 4, ++o) {
        const uint8_t b = packed[o];
        codes[i] = b & 3;
        codes[i + 1] = (b >> 2) & 3;
        codes[i + 2] = (b >> 4) & 3;
        codes[i + 3] = b >> 6;
      }
      break;
    case 3:
      for (; i + 8 <= n; i += 8, o += 3) {
        const uint32_t w = packed[o] | (packed[o + 1] << 8) | (packed[o + 2] << 16);
        for (int k = 0; k < 8; ++k) codes[i + k] = static_cast<uint8_t>((w >> (3 * k)) & 7);
      }
      break;
    default:
      return;
  }
  if (i < n) {
    const int64_t nb = packed_code_bytes(n - i, bits);
    uint64_t w = 0;
    for (int64_t b = 0; b < nb; ++b) w |= static_cast<uint64_t>(packed[o + b]) << (8 * b);
    for (int64_t k = 0; k < n - i; ++k)
      codes[i + k] = static_cast<uint8_t>((w >> (k * bits)) & mask);
  }
}

void group_quantize_cpu(const GroupQuantizeParams& p) {
  const GroupQuantShape& s = p.shape;
  const int64_t R = s.rows, C = s.cols, G = s.group_size;
  const int64_t xs = p.x_stride ? p.x_stride : C;
  const float qmax = static_cast<float>((1 << s.bits) - 1);
  uint8_t* codes = scratch_codes(R * C);
  if (s.axis == QuantAxis::kRow) {
    const int64_t MC = group_quant_meta_cols(s);
    for (int64_t r = 0; r < R; ++r) {
      const float* x = p.x + r * xs;
      uint8_t* q = codes + r * C;
      for (int64_t g = 0; g < MC; ++g) {
        const int64_t c0 = g * G, c1 = std::min(C, c0 + G);
        float lo = x[c0], hi = x[c0];
        for (int64_t c = c0 + 1; c < c1; ++c) {
          lo = std::min(lo, x[c]);
          hi = std::max(hi, x[c]);
        }
        const uint16_t mh = float_to_half_down(lo);
        const float m = half_to_float(mh);
        const uint16_t sh = float_to_half_up((hi - m) / qmax);
        const float sc = half_to_float(sh);
        const float inv = sc > 0.f ? 1.f / sc : 0.f;
        p.mins[r * MC + g] = mh;
        p.scales[r * MC + g] = sh;
        for (int64_t c = c0; c < c1; ++c) {
          const float t = std::min(std::max((x[c] - m) * inv, 0.f), qmax);
          q[c] = static_cast<uint8_t>(static_cast<int32_t>(round_small(t)));
        }
      }
    }
  } else {
    std::vector<float> lo(static_cast<size_t>(C)), hi(static_cast<size_t>(C)),
        mf(static_cast<size_t>(C)), inv(static_cast<size_t>(C));
    const int64_t MR = group_quant_meta_rows(s);
    for (int64_t g = 0; g < MR; ++g) {
      const int64_t r0 = g * G, r1 = std::min(R, r0 + G);
      std::copy(p.x + r0 * xs, p.x + r0 * xs + C, lo.begin());
      std::copy(p.x + r0 * xs, p.x + r0 * xs + C, hi.begin());
      for (int64_t r = r0 + 1; r < r1; ++r) {
        const float* x = p.x + r * xs;
        for (int64_t c = 0; c < C; ++c) {
          lo[c] = std::min(lo[c], x[c]);
          hi[c] = std::max(hi[c], x[c]);
        }
      }
      for (int64_t c = 0; c < C; ++c) {
        const uint16_t mh = float_to_half_down(lo[c]);
        mf[c] = half_to_float(mh);
        const uint16_t sh = float_to_half_up((hi[c] - mf[c]) / qmax);
        const float sc = half_to_float(sh);
        inv[c] = sc > 0.f ? 1.f / sc : 0.f;
        p.mins[g * C + c] = mh;
        p.scales[g * C + c] = sh;
      }
      for (int64_t r = r0; r < r1; ++r) {
        const float* x = p.x + r * xs;
        uint8_t* q = codes + r * C;
        for (int64_t c = 0; c < C; ++c) {
          const float t = std::min(std::max((x[c] - mf[c]) * inv[c], 0.f), qmax);
          q[c] = static_cast<uint8_t>(static_cast<int32_t>(round_small(t)));
        }
      }
    }
  }
  pack_codes_cpu(codes, R * C, s.bits, p.codes);
}

void group_dequantize_cpu(const GroupDequantizeParams& p) {
  const GroupQuantShape& s = p.shape;
  const int64_t R = s.rows, C = s.cols, G = s.group_size;
  const int64_t os = p.out_stride ? p.out_stride : C;
  uint8_t* codes = scratch_codes(R * C);
  unpack_codes_cpu(p.codes, R * C, s.bits, codes);
  if (s.axis == QuantAxis::kRow) {
    const int64_t MC = group_quant_meta_cols(s);
    for (int64_t r = 0; r < R; ++r) {
      const uint8_t* q = codes + r * C;
      float* out = p.out + r * os;
      for (int64_t g = 0; g < MC; ++g) {
        const int64_t c0 = g * G, c1 = std::min(C, c0 + G);
        const float sc = half_to_float(p.scales[r * MC + g]), m = half_to_float(p.mins[r * MC + g]);
        for (int64_t c = c0; c < c1; ++c) out[c] = static_cast<float>(q[c]) * sc + m;
      }
    }
  } else {
    std::vector<float> sf(static_cast<size_t>(C)), mf(static_cast<size_t>(C));
    const int64_t MR = group_quant_meta_rows(s);
    for (int64_t g = 0; g < MR; ++g) {
      for (int64_t c = 0; c < C; ++c) {
        sf[c] = half_to_float(p.scales[g * C + c]);
        mf[c] = half_to_float(p.mins[g * C + c]);
      }
      const int64_t r0 = g * G, r1 = std::min(R, r0 + G);
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* q = codes + r * C;
        float* out = p.out + r * os;
        for (int64_t c = 0; c < C; ++c) out[c] = static_cast<float>(q[c]) * sf[c] + mf[c];
      }
    }
  }
}

}  // namespace kvb::kernels
