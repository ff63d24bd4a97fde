#pragma once
// Asymmetric uniform group quantization with bit packing, for 2, 3, 4 and 8 bits (KIVI, KVTuner,
// SpeCache, TTKV: the primitive they all share). Torch-free: raw pointers, explicit shapes.
//
// Groups. A matrix x: [rows, cols] fp32 is cut into groups of `group_size` consecutive elements
// along one axis; the last group along the axis is shorter when the axis length is not a multiple
// of group_size.
//   QuantAxis::kRow     along a row: row r, columns [g*G, (g+1)*G). Per-token quantization
//                       (values, per-token keys): rows = tokens, cols = channels.
//   QuantAxis::kColumn  down a column: column c, rows [g*G, (g+1)*G). Per-channel quantization
//                       (KIVI keys: G consecutive tokens of one channel).
//
// Quantizer, per group (b bits, qmax = 2^b - 1), all arithmetic in fp32:
//   m  = float_to_half_down(min x)                 the stored minimum (fp16, rounded toward -inf)
//   s  = float_to_half_up((max x - m) / qmax)      the stored scale   (fp16, rounded toward +inf)
//   q  = nearbyint(clamp((x - m) * inv, 0, qmax))  inv = 1 / s in fp32, 0 when s == 0
//   x^ = q * s + m                                 (dequantize; s, m read back from fp16)
// Rounding m down and s up keeps the whole group inside the fp16 grid [m, m + qmax*s], so
//   |x - x^| <= s/2   (plus fp32 rounding, ~1e-7 relative)
// with no extra term for the fp16 rounding of the metadata. (KIVI rounds both to nearest; the error
// bound then gains |min - m| + qmax*|s_exact - s|.) Groups whose range exceeds fp16 (|x| > 65504)
// saturate and lose that bound.
//
// Metadata: scales and mins as fp16 bit patterns, row-major [meta_rows, meta_cols]:
//   kRow: [rows, ceil(cols / G)]        kColumn: [ceil(rows / G), cols]
// 32 bits per group, so the effective bits per element are b + 32/G (effective_bits_per_element()).
//
// Packing: codes form one little-endian bit stream in row-major element order (element (r, c) is
// code i = r*cols + c); code i occupies stream bits [i*b, (i+1)*b), and stream bit j is bit (j % 8)
// of byte j / 8. With b = 3 eight codes fill exactly three bytes and codes 2 and 5 of each eight
// straddle a byte boundary. ceil(rows*cols*b / 8) bytes; the unused high bits of the last byte are
// zero.

#include <cstdint>
#include <string>

namespace kvb::kernels {

enum class QuantAxis : int32_t { kRow = 0, kColumn = 1 };

struct GroupQuantShape {
  int32_t bits = 4;  // 2, 3, 4 or 8
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;  // elements per group along `axis`, >= 1
  QuantAxis axis = QuantAxis::kRow;
};

struct GroupQuantizeParams {
  GroupQuantShape shape;
  const float* x = nullptr;  // [rows, cols] fp32 host, row stride x_stride floats (0: cols)
  int64_t x_stride = 0;
  uint8_t* codes =
      nullptr;  // [group_quant_code_bytes(shape)], written in full (padding bits zeroed)
  uint16_t* scales = nullptr;  // [group_quant_num_groups(shape)] fp16 bits
  uint16_t* mins = nullptr;    // [group_quant_num_groups(shape)] fp16 bits
};

struct GroupDequantizeParams {
  GroupQuantShape shape;
  const uint8_t* codes = nullptr;  // as written by group_quantize_*
  const uint16_t* scales = nullptr;
  const uint16_t* mins = nullptr;
  float* out = nullptr;  // [rows, cols] fp32 host, row stride out_stride floats (0: cols)
  int64_t out_stride = 0;
};

bool quant_bits_supported(int32_t bits);  // 2, 3, 4, 8

// Empty string when the shape is supported, else the reason.
std::string group_quant_check(const GroupQuantShape& s);

// Bytes of n packed b-bit codes: ceil(n*b / 8).
int64_t packed_code_bytes(int64_t n, int32_t bits);
int64_t group_quant_meta_rows(const GroupQuantShape& s);
int64_t group_quant_meta_cols(const GroupQuantShape& s);
int64_t group_quant_num_groups(const GroupQuantShape& s);  // meta_rows * meta_cols
int64_t group_quant_code_bytes(const GroupQuantShape& s);  // packed_code_bytes(rows*cols, bits)
int64_t group_quant_meta_bytes(const GroupQuantShape& s);  // 4 bytes (scale + min) per group
// Exact storage of one quantized matrix, codes (with the last byte's padding) + metadata, in bits
// per element: 8 * (code_bytes + meta_bytes) / (rows * cols).
double group_quant_bits_per_element(const GroupQuantShape& s);
// The nominal figure for full groups and no padding: bits + 32 / group_size.
double effective_bits_per_element(int32_t bits, int64_t group_size);

// Bit packing of n codes (each < 2^bits) in the layout above. unpack reads ceil(n*b/8) bytes.
void pack_codes_ref(const uint8_t* codes, int64_t n, int32_t bits, uint8_t* packed);
void unpack_codes_ref(const uint8_t* packed, int64_t n, int32_t bits, uint8_t* codes);
void pack_codes_cpu(const uint8_t* codes, int64_t n, int32_t bits, uint8_t* packed);
void unpack_codes_cpu(const uint8_t* packed, int64_t n, int32_t bits, uint8_t* codes);

// Scalar oracles: one element at a time, bit by bit. Obviously correct, slow.
void group_quantize_ref(const GroupQuantizeParams& p);
void group_dequantize_ref(const GroupDequantizeParams& p);

// Optimised CPU versions: bit-identical to the oracles (codes, metadata and dequantized floats).
// Column groups are reduced row by row across all columns at once (vectorisable), packing works a
// byte (2/4/8 bits) or three bytes (3 bits) at a time.
void group_quantize_cpu(const GroupQuantizeParams& p);
void group_dequantize_cpu(const GroupDequantizeParams& p);

}  // namespace kvb::kernels
