// The quantizer's definition (quantize.h): shape helpers and the scalar oracles.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvb/kernels/half.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels {

bool quant_bits_supported(int32_t bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 8; }

std::string group_quant_check(const GroupQuantShape& s) {
  if (!quant_bits_supported(s.bits))
    return "bits " + std::to_string(s.bits) + " not supported (2, 3, 4 or 8)";
  if (s.rows < 0 || s.cols < 0) return "negative size";
  if (s.group_size < 1) return "group_size must be >= 1";
  if (s.axis != QuantAxis::kRow && s.axis != QuantAxis::kColumn) return "unknown axis";
  return "";
}

int64_t packed_code_bytes(int64_t n, int32_t bits) { return (n * bits + 7) / 8; }

int64_t group_quant_meta_rows(const GroupQuantShape& s) {
  return s.axis == QuantAxis::kRow ? s.rows : (s.rows + s.group_size - 1) / s.group_size;
}
int64_t group_quant_meta_cols(const GroupQuantShape& s) {
  return s.axis == QuantAxis::kRow ? (s.cols + s.group_size - 1) / s.group_size : s.cols;
}
int64_t group_quant_num_groups(const GroupQuantShape& s) {
  return group_quant_meta_rows(s) * group_quant_meta_cols(s);
}
int64_t group_quant_code_bytes(const GroupQuantShape& s) {
  return packed_code_bytes(s.rows * s.cols, s.bits);
}
int64_t group_quant_meta_bytes(const GroupQuantShape& s) { return 4 * group_quant_num_groups(s); }

double group_quant_bits_per_element(const GroupQuantShape& s) {
  const int64_t n = s.rows * s.cols;
  if (n == 0) return 0.0;
  return 8.0 * static_cast<double>(group_quant_code_bytes(s) + group_quant_meta_bytes(s)) /
         static_cast<double>(n);
}

double effective_bits_per_element(int32_t bits, int64_t group_size) {
  return static_cast<double>(bits) + 32.0 / static_cast<double>(group_size);
}

void pack_codes_ref(const uint8_t* codes, int64_t n, int32_t bits, uint8_t* packed) {
  const int64_t nbytes = packed_code_bytes(n, bits);
  for (int64_t i = 0; i < nbytes; ++i) packed[i] = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int32_t j = 0; j < bits; ++j) {
      const int64_t bit = i * bits + j;
      if ((codes[i] >> j) & 1)
        packed[bit / 8] = static_cast<uint8_t>(packed[bit / 8] | (1u << (bit % 8)));
    }
}

void unpack_codes_ref(const uint8_t* packed, int64_t n, int32_t bits, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t c = 0;
    for (int32_t j = 0; j < bits; ++j) {
      const int64_t bit = i * bits + j;
      c |= static_cast<uint32_t>((packed[bit / 8] >> (bit % 8)) & 1) << j;
    }
    codes[i] = static_cast<uint8_t>(c);
  }
}

namespace {

// Group g's element list, one at a time: (row, col) of its k-th element.
struct GroupWalk {
  const GroupQuantShape& s;
  int64_t mr, mc;  // meta index
  int64_t size() const {
    const int64_t len = s.axis == QuantAxis::kRow ? s.cols : s.rows;
    const int64_t start = (s.axis == QuantAxis::kRow ? mc : mr) * s.group_size;
    return std::min(s.group_size, len - start);
  }
  int64_t row(int64_t k) const { return s.axis == QuantAxis::kRow ? mr : mr * s.group_size + k; }
  int64_t col(int64_t k) const { return s.axis == QuantAxis::kRow ? mc * s.group_size + k : mc; }
};

}  // namespace

void group_quantize_ref(const GroupQuantizeParams& p) {
  const GroupQuantShape& s = p.shape;
  const int64_t xs = p.x_stride ? p.x_stride : s.cols;
  const float qmax = static_cast<float>((1 << s.bits) - 1);
  std::vector<uint8_t> codes(static_cast<size_t>(s.rows * s.cols), 0);
  const int64_t MR = group_quant_meta_rows(s), MC = group_quant_meta_cols(s);
  for (int64_t mr = 0; mr < MR; ++mr)
    for (int64_t mc = 0; mc < MC; ++mc) {
      GroupWalk g{s, mr, mc};
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t k = 0; k < g.size(); ++k) {
        const float v = p.x[g.row(k) * xs + g.col(k)];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      const uint16_t mh = float_to_half_down(lo);
      const float m = half_to_float(mh);
      const uint16_t sh = float_to_half_up((hi - m) / qmax);
      const float sc = half_to_float(sh);
      const float inv = sc > 0.f ? 1.f / sc : 0.f;
      p.mins[mr * MC + mc] = mh;
      p.scales[mr * MC + mc] = sh;
      for (int64_t k = 0; k < g.size(); ++k) {
        const int64_t r = g.row(k), c = g.col(k);
        const float t = std::min(std::max((p.x[r * xs + c] - m) * inv, 0.f), qmax);
        codes[r * s.cols + c] = static_cast<uint8_t>(std::nearbyint(t));
      }
    }
  pack_codes_ref(codes.data(), s.rows * s.cols, s.bits, p.codes);
}

void group_dequantize_ref(const GroupDequantizeParams& p) {
  const GroupQuantShape& s = p.shape;
  const int64_t os = p.out_stride ? p.out_stride : s.cols;
  std::vector<uint8_t> codes(static_cast<size_t>(s.rows * s.cols));
  unpack_codes_ref(p.codes, s.rows * s.cols, s.bits, codes.data());
  const int64_t MC = group_quant_meta_cols(s);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) {
      const int64_t mi =
          s.axis == QuantAxis::kRow ? r * MC + c / s.group_size : (r / s.group_size) * MC + c;
      const float sc = half_to_float(p.scales[mi]), m = half_to_float(p.mins[mi]);
      p.out[r * os + c] = static_cast<float>(codes[r * s.cols + c]) * sc + m;
    }
}

}  // namespace kvb::kernels
