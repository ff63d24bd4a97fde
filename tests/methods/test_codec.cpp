// The codec layer (methods/common/kv_codec.h) on its own, without a model: round trips within the
// quantizer's bound, exact byte accounting against the codec's closed form, the KIVI residual
// timeline, chunking independence, encoded units never rewritten, keep_rows/truncate without
// re-encoding, and parameter validation.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "kvb/kernels/half.h"
#include "methods/common/kv_codec.h"

namespace kvb {
namespace {

using kernels::QuantAxis;

std::vector<float> random_rows(int64_t n, int64_t width, uint32_t seed, bool outliers = true) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(n * width);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < width; ++c)
      x[r * width + c] = (outliers && c % 5 == 2) ? 12.f * nd(rng) + 6.f : nd(rng);
  return x;
}

std::vector<float> decode_all(const CodecStream& s) {
  std::vector<float> out(s.rows() * s.width() + 1, NAN);
  s.decode(out.data());
  EXPECT_TRUE(std::isnan(out.back())) << "decode wrote past rows() * width()";
  out.pop_back();
  return out;
}

float to_dtype(float x, RowDtype d) {
  if (d == RowDtype::kF16) return kernels::half_to_float(kernels::float_to_half(x));
  if (d == RowDtype::kBF16) return kernels::bf16_to_float(kernels::float_to_bf16(x));
  return x;
}

void expect_bytes_eq(const CodecBytes& got, const CodecBytes& want) {
  EXPECT_EQ(got.code_bytes, want.code_bytes);
  EXPECT_EQ(got.metadata_bytes, want.metadata_bytes);
  EXPECT_EQ(got.full_bytes, want.full_bytes);
  EXPECT_EQ(got.index_bytes, want.index_bytes);
  EXPECT_EQ(got.encoded_elems, want.encoded_elems);
  EXPECT_EQ(got.full_elems, want.full_elems);
  EXPECT_EQ(got.dead_elems, want.dead_elems);
}

// Max |x - x^| / (range of x's group / qmax) over encoded elements, a scale-free check of the
// bound; the exact per-group bound is the kernel test's business. Full-precision rows must be
// exact.
struct Spec {
  QuantSpec q;
  int64_t width, head_dim;
};

TEST(CodecStream, RoundTripBytesAndTimelineForEveryLayout) {
  const Spec specs[] = {
      {QuantCodec::kivi_key(2, 32, 128, RowDtype::kF16), 32, 8},
      {QuantCodec::kivi_key(3, 32, 64, RowDtype::kF32), 24, 8},
      {QuantCodec::kivi_key(4, 16, 0, RowDtype::kBF16), 64, 64},
      {QuantCodec::kivi_key(8, 32, 32, RowDtype::kF16), 128, 128},
      {QuantCodec::kivi_value(2, 8, 128, RowDtype::kF16), 32, 8},
      {QuantCodec::kivi_value(3, 8, 5, RowDtype::kF32), 8, 8},  // 24-bit rows
      {QuantCodec::per_token(3, 4, 0, RowDtype::kF16), 12, 4},  // 36-bit rows: per-row packing
      {QuantCodec::per_token(4, 64, 0, RowDtype::kF16), 128, 64},
      {QuantCodec::per_token(8, 32, 3, RowDtype::kBF16), 32, 32},
  };
  std::mt19937 rng(1);
  for (const auto& sp : specs) {
    const QuantSpec& q = sp.q;
    SCOPED_TRACE(testing::Message()
                 << "bits " << q.bits << " axis " << static_cast<int>(q.axis) << " G "
                 << q.group_size << " R " << q.residual << " width " << sp.width);
    QuantCodec codec("t", q, q);
    auto s = codec.make_stream(KvKind::kKey, 0, sp.width, sp.head_dim);
    const int64_t total = 300;
    auto x = random_rows(total, sp.width, 17);
    std::vector<std::vector<uint8_t>> units_before;
    int64_t n = 0;
    while (n < total) {
      const int64_t chunk = std::min<int64_t>(total - n, 1 + rng() % 40);
      s->append(x.data() + n * sp.width, chunk);
      n += chunk;
      ASSERT_EQ(s->rows(), n);
      // Bytes match the closed form after every append; nothing reserved is counted as live.
      expect_bytes_eq(s->bytes(), codec.expected_bytes(KvKind::kKey, 0, sp.width, n));
      // Units written before are never rewritten.
      auto units = s->encoded_units();
      ASSERT_GE(units.size(), units_before.size());
      for (size_t u = 0; u < units_before.size(); ++u) ASSERT_EQ(units[u], units_before[u]) << u;
      units_before = std::move(units);
    }
    // The KIVI timeline: per channel, floor(n / U) * U rows encoded; per token, n - R.
    const CodecBytes b = s->bytes();
    const int64_t unit = q.residual > 0 ? q.residual : q.group_size;
    const int64_t enc_rows = q.axis == QuantAxis::kColumn
                                 ? total / unit * unit
                                 : std::max<int64_t>(0, total - q.residual);
    EXPECT_EQ(b.encoded_elems, enc_rows * sp.width);
    EXPECT_EQ(
        units_before.size(),
        static_cast<size_t>(q.axis == QuantAxis::kColumn ? enc_rows / q.group_size : enc_rows));
    // Decode: full-precision rows exact (in their dtype), encoded rows within half a step of their
    // group's range (scale <= range / qmax * (1 + 2^-10) + tiny).
    auto out = decode_all(*s);
    const float qmax = static_cast<float>((1 << q.bits) - 1);
    for (int64_t r = 0; r < total; ++r)
      for (int64_t c = 0; c < sp.width; ++c) {
        const float xr = to_dtype(x[r * sp.width + c], q.residual == 0 && q.axis == QuantAxis::kRow
                                                           ? RowDtype::kF32
                                                           : q.residual_dtype);
        const float got = out[r * sp.width + c];
        if (r >= enc_rows) {
          ASSERT_EQ(got, xr) << r << "," << c;
          continue;
        }
        float lo = INFINITY, hi = -INFINITY;  // the element's group, in the encoder's input
        const int64_t G = q.group_size;
        for (int64_t k = 0; k < G; ++k) {
          const int64_t rr = q.axis == QuantAxis::kColumn ? r / G * G + k : r;
          const int64_t cc = q.axis == QuantAxis::kColumn ? c : c / G * G + k;
          const float v = to_dtype(
              x[rr * sp.width + cc],
              q.residual == 0 && q.axis == QuantAxis::kRow ? RowDtype::kF32 : q.residual_dtype);
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
        const float bound =
            0.5f * ((hi - lo) / qmax * (1.f + 1.f / 512) + 2e-3f * (std::abs(lo) + 1e-2f));
        ASSERT_LE(std::abs(got - xr), bound + 1e-6f) << r << "," << c;
      }
    // Measured encoded bits equal the declared b + 32/G when rows are byte-aligned.
    if ((q.axis == QuantAxis::kRow ? sp.width * q.bits : q.group_size * sp.width * q.bits) % 8 ==
        0) {
      EXPECT_DOUBLE_EQ(b.encoded_bits_per_element(), codec.declared_bits(KvKind::kKey, 0));
    }
  }
}

TEST(CodecStream, ChunkingDoesNotChangeTheEncoding) {
  for (const QuantSpec& q : {QuantCodec::kivi_key(2, 32, 128, RowDtype::kF16),
                             QuantCodec::kivi_value(2, 8, 128, RowDtype::kF16),
                             QuantCodec::per_token(3, 8, 0, RowDtype::kF16)}) {
    QuantCodec codec("t", q, q);
    auto a = codec.make_stream(KvKind::kKey, 0, 32, 8),
         b = codec.make_stream(KvKind::kKey, 0, 32, 8);
    auto x = random_rows(333, 32, 5);
    a->append(x.data(), 333);
    for (int64_t r = 0; r < 333; ++r) b->append(x.data() + r * 32, 1);
    EXPECT_EQ(a->encoded_units(), b->encoded_units());
    EXPECT_EQ(decode_all(*a), decode_all(*b));
  }
}

TEST(CodecStream, KeepRowsAndTruncateNeverReencode) {
  std::mt19937 rng(9);
  for (const QuantSpec& q : {QuantCodec::kivi_key(2, 32, 64, RowDtype::kF16),
                             QuantCodec::kivi_value(4, 8, 16, RowDtype::kF16),
                             QuantCodec::per_token(3, 4, 0, RowDtype::kF16)}) {
    SCOPED_TRACE(static_cast<int>(q.axis));
    QuantCodec codec("t", q, q);
    const int64_t W = 24, N = 230;
    auto s = codec.make_stream(KvKind::kValue, 0, W, 8);
    auto x = random_rows(N, W, 3);
    s->append(x.data(), N);
    const auto full = decode_all(*s);
    const CodecBytes before = s->bytes();
    // Keep a random subset, but drop one whole per-channel block (rows 32..63) entirely.
    std::vector<int64_t> idx;
    for (int64_t r = 0; r < N; ++r)
      if ((r < 32 || r >= 64) && rng() % 3 != 0) idx.push_back(r);
    auto t = s->clone();
    t->keep_rows(idx);
    ASSERT_EQ(t->rows(), static_cast<int64_t>(idx.size()));
    const auto kept = decode_all(*t);
    for (size_t i = 0; i < idx.size(); ++i)
      for (int64_t c = 0; c < W; ++c) ASSERT_EQ(kept[i * W + c], full[idx[i] * W + c]) << i;
    const CodecBytes after = t->bytes();
    EXPECT_LE(after.physical_bytes(), before.physical_bytes());
    EXPECT_EQ(after.live_elems(), static_cast<int64_t>(idx.size()) * W);
    if (q.axis == QuantAxis::kColumn) {
      EXPECT_GT(after.dead_elems, 0);   // partly kept blocks keep their codes ...
      EXPECT_GT(after.index_bytes, 0);  // ... and a live mask
      EXPECT_EQ(after.code_bytes, before.code_bytes - kernels::packed_code_bytes(32 * W, q.bits));
    } else {
      EXPECT_EQ(after.dead_elems, 0);
    }
    // Appending after keep_rows continues the same timeline; the original is untouched (clone).
    auto y = random_rows(70, W, 4);
    t->append(y.data(), 70);
    EXPECT_EQ(t->rows(), static_cast<int64_t>(idx.size()) + 70);
    EXPECT_EQ(decode_all(*s), full);
    // truncate = keep a prefix.
    auto u = s->clone();
    u->truncate(100);
    auto tr = decode_all(*u);
    EXPECT_EQ(tr, std::vector<float>(full.begin(), full.begin() + 100 * W));
    try {
      u->keep_rows({5, 3});
      FAIL();
    } catch (const kvb::InternalError& e) {  // only a store can pass indices: an invariant
      EXPECT_EQ(e.component(), "codec stream");
      EXPECT_NE(std::string(e.what()).find("ascending unique"), std::string::npos);
    }
  }
}

TEST(CodecPlain, StoresRowsAtItsDtypeAndCountsThem) {
  for (RowDtype d : {RowDtype::kF32, RowDtype::kF16, RowDtype::kBF16}) {
    auto codec = make_plain_codec(d);
    auto s = codec->make_stream(KvKind::kKey, 0, 16, 8);
    auto x = random_rows(37, 16, 2);
    s->append(x.data(), 20);
    s->append(x.data() + 20 * 16, 17);
    auto out = decode_all(*s);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], to_dtype(x[i], d));
    expect_bytes_eq(s->bytes(), codec->expected_bytes(KvKind::kKey, 0, 16, 37));
    EXPECT_DOUBLE_EQ(s->bytes().bits_per_element(), codec->declared_bits(KvKind::kKey, 0));
    s->keep_rows({0, 36});
    EXPECT_EQ(s->bytes().full_bytes, 2 * 16 * row_dtype_bytes(d));
  }
}

TEST(CodecQuant, ValidationNamesTheProblem) {
  auto expect_error = [](const QuantSpec& q, int64_t hd, const std::string& what) {
    QuantCodec c("kivi-test", q, q);
    try {
      c.make_stream(KvKind::kKey, 2, hd * 4, hd);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error(QuantCodec::kivi_key(2, 32, 100, RowDtype::kF16), 8,
               "not a multiple of the key group size 32");
  expect_error(QuantCodec::kivi_value(2, 32, 128, RowDtype::kF16), 8, "does not divide head_dim 8");
  expect_error(QuantCodec::per_token(5, 8, 0, RowDtype::kF16), 8, "5 bits not supported");
  EXPECT_EQ(adapt_channel_group(32, 8), 8);
  EXPECT_EQ(adapt_channel_group(32, 128), 32);
  EXPECT_EQ(adapt_channel_group(48, 64), 32);
  EXPECT_EQ(adapt_channel_group(7, 12), 6);
  EXPECT_EQ(parse_row_dtype("bf16"), RowDtype::kBF16);
  EXPECT_THROW(parse_row_dtype("fp8"), kvb::Error);
}

TEST(CodecQuant, PerLayerPairsAndDescription) {
  QuantCodec c("kvtuner-like", QuantCodec::kivi_key(4, 32, 32, RowDtype::kF16),
               QuantCodec::kivi_value(4, 8, 32, RowDtype::kF16));
  c.set_layer(1, QuantCodec::kivi_key(8, 32, 32, RowDtype::kF16),
              QuantCodec::kivi_value(2, 8, 32, RowDtype::kF16));
  EXPECT_EQ(c.spec(KvKind::kKey, 0).bits, 4);
  EXPECT_EQ(c.spec(KvKind::kKey, 1).bits, 8);
  EXPECT_EQ(c.spec(KvKind::kValue, 1).bits, 2);
  EXPECT_DOUBLE_EQ(c.declared_bits(KvKind::kKey, 1), 9.0);
  EXPECT_DOUBLE_EQ(c.declared_bits(KvKind::kValue, 1), 6.0);
  auto d = c.describe();
  EXPECT_EQ(d["k_group_size"], 32);
  EXPECT_EQ(d["v_group_size"], 8);
  EXPECT_EQ(d["k_per_channel"], 1);
  EXPECT_EQ(d["layer1_k_bits"], 8);
}

}  // namespace
}  // namespace kvb
