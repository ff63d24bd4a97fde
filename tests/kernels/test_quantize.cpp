// The group quantizer (kvb/kernels/quantize.h): fp16 conversions against c10::Half, the documented
// bit layout by hand, packing exact for every width and odd lengths with poisoned buffers, the
// round-trip error bound |x - x^| <= s/2 on random data and on data with outlier channels, cpu ==
// ref bit for bit, and the effective-bits arithmetic.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvb/kernels/half.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels {
namespace {

constexpr int kWidths[] = {2, 3, 4, 8};

TEST(QuantHalf, RoundToNearestMatchesC10AndDirectedRoundingBrackets) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.f,
                           -0.f,
                           1.f,
                           -1.f,
                           65504.f,
                           -65504.f,
                           65519.f,
                           65520.f,
                           1e-8f,
                           -1e-8f,
                           5.96e-8f,
                           2.98e-8f,
                           6.1035156e-05f,
                           6.1e-05f,
                           0.1f,
                           1.0009766f,
                           1.00048828125f /* exact tie */,
                           1.00146484375f /* tie to even up */};
  std::uniform_real_distribution<float> e(-30.f, 17.f), u(-1.f, 1.f);
  for (int i = 0; i < 200000; ++i) xs.push_back(u(rng) * std::exp2(e(rng)));
  for (float x : xs) {
    const uint16_t h = float_to_half(x);
    EXPECT_EQ(h, c10::Half(x).x) << x;
    EXPECT_EQ(half_to_float(h), static_cast<float>(c10::Half(h, c10::Half::from_bits()))) << x;
    if (std::abs(x) > 65504.f) continue;
    const uint16_t d = float_to_half_down(x), up = float_to_half_up(x);
    const float fd = half_to_float(d), fu = half_to_float(up);
    ASSERT_LE(fd, x) << x;
    ASSERT_GE(fu, x) << x;
    if (half_to_float(h) == x) {
      EXPECT_EQ(fd, x);
      EXPECT_EQ(fu, x);
    } else {  // adjacent fp16 values around x
      EXPECT_TRUE(half_to_float(detail::half_next_up(d)) == fu) << x;
    }
  }
  for (float x : xs) EXPECT_EQ(float_to_bf16(x), c10::BFloat16(x).x) << x;
}

TEST(QuantPack, DocumentedLayoutByHand) {
  const uint8_t c3[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  uint8_t out[4] = {0xee, 0xee, 0xee, 0xee};
  pack_codes_cpu(c3, 8, 3, out);
  EXPECT_EQ(out[0], 0xd1);
  EXPECT_EQ(out[1], 0x58);
  EXPECT_EQ(out[2], 0x1f);
  EXPECT_EQ(out[3], 0xee);  // untouched
  const uint8_t c2[5] = {1, 2, 3, 0, 3};
  pack_codes_cpu(c2, 5, 2, out);
  EXPECT_EQ(out[0], 0x39);
  EXPECT_EQ(out[1], 0x03);  // padding bits zero
  const uint8_t c4[3] = {0xa, 0x5, 0xf};
  pack_codes_ref(c4, 3, 4, out);
  EXPECT_EQ(out[0], 0x5a);
  EXPECT_EQ(out[1], 0x0f);
  // Three 3-bit codes: 9 bits, the third code straddles bytes 0 and 1.
  const uint8_t c33[3] = {7, 0, 5};
  pack_codes_ref(c33, 3, 3, out);
  EXPECT_EQ(out[0], 0x47);  // 7 | 5 << 6 (low two bits of 5 = 01)
  EXPECT_EQ(out[1], 0x01);  // high bit of 5
}

TEST(QuantPack, ExactForEveryWidthAndOddLengths) {
  std::mt19937 rng(11);
  for (int bits : kWidths)
    for (int64_t n : {1, 2, 3, 5, 7, 8, 9, 16, 33, 97, 1000}) {
      SCOPED_TRACE(testing::Message() << "bits " << bits << " n " << n);
      std::vector<uint8_t> codes(n);
      for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
      const int64_t nb = packed_code_bytes(n, bits);
      EXPECT_EQ(nb, (n * bits + 7) / 8);
      std::vector<uint8_t> pr(nb + 2, 0xa5), pc(nb + 2, 0x5a);  // poisoned, with guard bytes
      pack_codes_ref(codes.data(), n, bits, pr.data());
      pack_codes_cpu(codes.data(), n, bits, pc.data());
      EXPECT_EQ(pr[nb], 0xa5);
      EXPECT_EQ(pc[nb], 0x5a);
      EXPECT_EQ(0, std::memcmp(pr.data(), pc.data(), nb));
      // Padding bits of the last byte are zero.
      const int used = static_cast<int>((n * bits) % 8);
      if (used) {
        EXPECT_EQ(pc[nb - 1] >> used, 0);
      }
      std::vector<uint8_t> ur(n + 1, 0xfe), uc(n + 1, 0xfd);
      unpack_codes_ref(pc.data(), n, bits, ur.data());
      unpack_codes_cpu(pc.data(), n, bits, uc.data());
      EXPECT_EQ(std::vector<uint8_t>(ur.begin(), ur.begin() + n), codes);
      EXPECT_EQ(std::vector<uint8_t>(uc.begin(), uc.begin() + n), codes);
      EXPECT_EQ(ur[n], 0xfe);
      EXPECT_EQ(uc[n], 0xfd);
    }
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales, mins;
  std::vector<float> out;
};

// Quantizes x (row stride xs) with `cpu` or the oracle into poisoned buffers, checks the guards,
// and dequantizes with the same implementation into a poisoned output with row stride cols + 3.
Quantized run(const GroupQuantShape& s, const std::vector<float>& x, int64_t xs, bool cpu) {
  Quantized q;
  const int64_t nb = group_quant_code_bytes(s), ng = group_quant_num_groups(s);
  q.codes.assign(nb + 1, 0xcd);
  q.scales.assign(ng + 1, 0xffff);
  q.mins.assign(ng + 1, 0xffff);
  GroupQuantizeParams qp;
  qp.shape = s;
  qp.x = x.data();
  qp.x_stride = xs;
  qp.codes = q.codes.data();
  qp.scales = q.scales.data();
  qp.mins = q.mins.data();
  (cpu ? group_quantize_cpu : group_quantize_ref)(qp);
  EXPECT_EQ(q.codes[nb], 0xcd);
  EXPECT_EQ(q.scales[ng], 0xffff);
  EXPECT_EQ(q.mins[ng], 0xffff);
  const int64_t os = s.cols + 3;
  q.out.assign(s.rows * os, NAN);
  GroupDequantizeParams dp;
  dp.shape = s;
  dp.codes = q.codes.data();
  dp.scales = q.scales.data();
  dp.mins = q.mins.data();
  dp.out = q.out.data();
  dp.out_stride = os;
  (cpu ? group_dequantize_cpu : group_dequantize_ref)(dp);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) EXPECT_TRUE(std::isfinite(q.out[r * os + c]));
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = s.cols; c < os; ++c) EXPECT_TRUE(std::isnan(q.out[r * os + c]));
  return q;
}

std::vector<float> make_data(int64_t rows, int64_t xs, bool outliers, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(rows * xs);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < xs; ++c) {
      float v = nd(rng);
      // Outlier channels, as keys have: a few columns with large magnitude and offset.
      if (outliers && c % 7 == 3) v = 40.f * v + 25.f;
      x[r * xs + c] = v;
    }
  return x;
}

// Max over elements of |x - x^| / bound, bound = s/2 + fp32 slack.
double worst_ratio(const GroupQuantShape& s, const std::vector<float>& x, int64_t xs,
                   const Quantized& q, double* mean_abs) {
  const int64_t os = s.cols + 3, MC = group_quant_meta_cols(s);
  const float qmax = static_cast<float>((1 << s.bits) - 1);
  double worst = 0, sum = 0;
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) {
      const int64_t mi =
          s.axis == QuantAxis::kRow ? r * MC + c / s.group_size : (r / s.group_size) * MC + c;
      const double sc = half_to_float(q.scales[mi]), m = half_to_float(q.mins[mi]);
      const double xv = x[r * xs + c];
      const double err = std::abs(xv - q.out[r * os + c]);
      const double bound = sc / 2 + 1e-6 * (std::abs(xv) + std::abs(m) + qmax * sc) + 1e-30;
      worst = std::max(worst, err / bound);
      sum += err;
    }
  *mean_abs = sum / static_cast<double>(s.rows * s.cols);
  return worst;
}

TEST(QuantKernel, RoundTripWithinHalfAScaleAndCpuEqualsRefBitExactly) {
  std::mt19937 rng(3);
  struct Dims {
    int64_t rows, cols, group;
  };
  const Dims dims[] = {{1, 1, 1},    {1, 33, 8},   {7, 8, 8},      {33, 32, 32},
                       {97, 24, 32}, {64, 97, 16}, {32, 128, 128}, {5, 64, 7}};
  for (int bits : kWidths)
    for (auto axis : {QuantAxis::kRow, QuantAxis::kColumn})
      for (const auto& d : dims)
        for (bool outliers : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "bits " << bits << " axis " << static_cast<int>(axis) << " " << d.rows
                       << "x" << d.cols << " G " << d.group << (outliers ? " outliers" : ""));
          GroupQuantShape s{bits, d.rows, d.cols, d.group, axis};
          ASSERT_EQ(group_quant_check(s), "");
          const int64_t xs = d.cols + 5;  // strided input
          auto x = make_data(d.rows, xs, outliers, rng);
          Quantized ref = run(s, x, xs, false), cpu = run(s, x, xs, true);
          const int64_t nb = group_quant_code_bytes(s), ng = group_quant_num_groups(s);
          EXPECT_EQ(0, std::memcmp(ref.codes.data(), cpu.codes.data(), nb));
          EXPECT_EQ(0, std::memcmp(ref.scales.data(), cpu.scales.data(), ng * 2));
          EXPECT_EQ(0, std::memcmp(ref.mins.data(), cpu.mins.data(), ng * 2));
          ASSERT_EQ(ref.out.size(), cpu.out.size());
          for (size_t i = 0; i < ref.out.size(); ++i)
            if (!std::isnan(ref.out[i])) {
              ASSERT_EQ(float_bits(ref.out[i]), float_bits(cpu.out[i])) << i;
            }
          double mean_abs = 0;
          EXPECT_LE(worst_ratio(s, x, xs, cpu, &mean_abs), 1.0);
          // The scale is not wasteful: s is the fp16 just above (max - m) / qmax.
          const int64_t MC = group_quant_meta_cols(s);
          for (int64_t g = 0; g < ng; ++g) {
            float hi = -INFINITY;
            const int64_t mr = g / MC, mc = g % MC;
            for (int64_t r = 0; r < d.rows; ++r)
              for (int64_t c = 0; c < d.cols; ++c) {
                const bool in = axis == QuantAxis::kRow ? (r == mr && c / d.group == mc)
                                                        : (r / d.group == mr && c == mc);
                if (in) hi = std::max(hi, x[r * xs + c]);
              }
            const float m = half_to_float(cpu.mins[g]), sc = half_to_float(cpu.scales[g]);
            const float need = (hi - m) / static_cast<float>((1 << bits) - 1);
            EXPECT_GE(sc, need);
            EXPECT_LE(sc, need * (1 + 1.0 / 1024) + 6e-8);
          }
        }
}

TEST(QuantKernel, ErrorFallsWithBitsAndPerChannelWinsOnOutlierChannels) {
  std::mt19937 rng(5);
  const int64_t rows = 128, cols = 64, G = 32;
  auto x = make_data(rows, cols, true, rng);
  double prev = INFINITY;
  for (int bits : kWidths) {
    double row_err = 0, col_err = 0;
    GroupQuantShape sr{bits, rows, cols, G, QuantAxis::kRow},
        sc{bits, rows, cols, G, QuantAxis::kColumn};
    worst_ratio(sr, x, cols, run(sr, x, cols, true), &row_err);
    worst_ratio(sc, x, cols, run(sc, x, cols, true), &col_err);
    RecordProperty("bits" + std::to_string(bits) + "_row_err", std::to_string(row_err));
    RecordProperty("bits" + std::to_string(bits) + "_col_err", std::to_string(col_err));
    EXPECT_LT(col_err, row_err) << bits;  // outliers live in channels: group along tokens instead
    EXPECT_LT(col_err, prev) << bits;
    prev = col_err;
  }
}

TEST(QuantKernel, ConstantGroupsAreExactAndZeroScale) {
  GroupQuantShape s{2, 3, 8, 4, QuantAxis::kRow};
  std::vector<float> x(24, 0.375f);  // fp16-representable
  Quantized q = run(s, x, 8, true);
  for (int64_t g = 0; g < group_quant_num_groups(s); ++g) EXPECT_EQ(q.scales[g], 0);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(q.out[r * 11 + c], 0.375f);
}

TEST(QuantKernel, EffectiveBitsIncludeMetadataAndPadding) {
  EXPECT_DOUBLE_EQ(effective_bits_per_element(2, 32), 3.0);
  EXPECT_DOUBLE_EQ(effective_bits_per_element(4, 128), 4.25);
  EXPECT_DOUBLE_EQ(effective_bits_per_element(2, 8), 6.0);
  // Full groups, byte-aligned: exactly the nominal figure.
  EXPECT_DOUBLE_EQ(group_quant_bits_per_element({2, 32, 32, 32, QuantAxis::kColumn}), 3.0);
  EXPECT_DOUBLE_EQ(group_quant_bits_per_element({3, 1, 32, 8, QuantAxis::kRow}), 7.0);
  // 1 x 3 at 3 bits, group 8: 9 bits of codes -> 2 bytes, one group -> 4 bytes: 48 bits / 3.
  EXPECT_DOUBLE_EQ(group_quant_bits_per_element({3, 1, 3, 8, QuantAxis::kRow}), 16.0);
  EXPECT_EQ(group_quant_check({5, 1, 1, 1, QuantAxis::kRow}),
            "bits 5 not supported (2, 3, 4 or 8)");
  EXPECT_NE(group_quant_check({2, 1, 1, 0, QuantAxis::kRow}), "");
}

}  // namespace
}  // namespace kvb::kernels
