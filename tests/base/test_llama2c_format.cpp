// parse_llama2c_header: the real stories260K.bin header and layout, exact size checks in both
// directions, implausible header values, and the separate-classifier (negative vocab) variant.

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/llama2c_format.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;

// The 28-byte header (7 little-endian int32) followed by `data_bytes` zero bytes, in a buffer of
// exactly that size so that AddressSanitizer catches any read past it.
std::vector<uint8_t> checkpoint(const std::vector<int32_t>& h, size_t data_bytes) {
  std::vector<uint8_t> out(28 + data_bytes, 0);
  std::memcpy(out.data(), h.data(), 28);
  return out;
}

// Float count of a llama2.c checkpoint, written out independently of the parser.
size_t expected_floats(int64_t D, int64_t F, int64_t NL, int64_t H, int64_t KVH, int64_t V,
                       int64_t S, bool shared) {
  const int64_t HD = D / H, Q = H * HD, KV = KVH * HD;
  int64_t n = V * D                // token_embedding
              + NL * D             // rms_att
              + NL * Q * D         // wq
              + 2 * NL * KV * D    // wk, wv
              + NL * D * Q         // wo
              + NL * D             // rms_ffn
              + 3 * NL * F * D     // w1, w2, w3
              + D                  // rms_final
              + 2 * S * (HD / 2);  // freq_cis_real, freq_cis_imag
  if (!shared) n += V * D;         // wcls
  return static_cast<size_t>(n);
}

const Llama2cArray* find(const Llama2cLayout& L, const std::string& name) {
  for (const auto& a : L.arrays)
    if (a.name == name) return &a;
  return nullptr;
}

TEST(Llama2cFormat, RealStories260kHeader) {
  const std::string path = ptest::models_dir() + "/stories260K/stories260K.bin";
  ASSERT_TRUE(file_exists(path)) << path << " missing (run scripts/setup.sh)";
  MappedFile f(path);
  ASSERT_EQ(f.size(), 1056540u);
  const Llama2cLayout L = parse_llama2c_header(f.data(), f.size(), path);
  const ModelConfig& c = L.config;
  EXPECT_EQ(c.format, "llama2c");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(L.shared_classifier);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(c.weights_dtype, "F32");
  EXPECT_EQ(L.expected_bytes, 1056540u);
  EXPECT_EQ(L.expected_bytes, 28 + 4 * expected_floats(64, 172, 5, 8, 4, 512, 512, true));

  // The layout: llama2.c's order, contiguous, shapes [out][in] stacked over layers.
  const std::vector<std::string> order = {
      "token_embedding", "rms_att", "wq", "wk", "wv",        "wo",
      "rms_ffn",         "w1",      "w2", "w3", "rms_final", "freq_cis_real",
      "freq_cis_imag"};
  ASSERT_EQ(L.arrays.size(), order.size());
  size_t off = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(L.arrays[i].name, order[i]);
    EXPECT_EQ(L.arrays[i].offset_floats, off) << order[i];
    size_t n = 1;
    for (int64_t s : L.arrays[i].shape) n *= static_cast<size_t>(s);
    off += n;
  }
  EXPECT_EQ(28 + 4 * off, f.size());
  EXPECT_EQ(find(L, "token_embedding")->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(find(L, "wq")->shape, (std::vector<int64_t>{5, 64, 64}));
  EXPECT_EQ(find(L, "wk")->shape, (std::vector<int64_t>{5, 32, 64}));
  EXPECT_EQ(find(L, "wo")->shape, (std::vector<int64_t>{5, 64, 64}));
  EXPECT_EQ(find(L, "w1")->shape, (std::vector<int64_t>{5, 172, 64}));
  EXPECT_EQ(find(L, "w2")->shape, (std::vector<int64_t>{5, 64, 172}));
  EXPECT_EQ(find(L, "freq_cis_real")->shape, (std::vector<int64_t>{512, 4}));
  EXPECT_EQ(find(L, "wq")->offset_floats, 512u * 64 + 5 * 64);
  EXPECT_EQ(find(L, "wcls"), nullptr);
  // The RMSNorm weights of a trained model are not all zero: the offsets point at real data.
  float rms_final0;
  std::memcpy(&rms_final0, f.data() + 28 + 4 * find(L, "rms_final")->offset_floats, 4);
  EXPECT_NE(rms_final0, 0.f);
}

TEST(Llama2cFormat, TruncatedBelowHeader) {
  for (size_t n : {0, 1, 27}) {
    std::vector<uint8_t> buf(n, 1);
    expect_kvb_error([&] { parse_llama2c_header(buf.data(), buf.size(), "/m/t.bin"); },
                     {"/m/t.bin", "truncated llama2.c checkpoint (" + std::to_string(n) +
                                      " bytes; the 28-byte header is missing)"});
  }
}

TEST(Llama2cFormat, HeaderOnlyFileFromRealModel) {
  const std::string path = ptest::models_dir() + "/stories260K/stories260K.bin";
  ASSERT_TRUE(file_exists(path));
  MappedFile f(path);
  std::vector<uint8_t> head(f.data(), f.data() + 28);
  expect_kvb_error(
      [&] { parse_llama2c_header(head.data(), head.size(), "/m/head.bin"); },
      {"/m/head.bin", ": size 28 bytes does not match its header (1056540 bytes expected",
       "dim=64 layers=5 vocab=512, shared classifier)"});
}

TEST(Llama2cFormat, SizeMismatchNamesExpectedBytes) {
  const std::vector<int32_t> h = {64, 172, 5, 8, 4, 512, 512};
  const size_t want = 28 + 4 * expected_floats(64, 172, 5, 8, 4, 512, 512, true);
  ASSERT_EQ(want, 1056540u);
  auto ok = checkpoint(h, want - 28);
  EXPECT_EQ(parse_llama2c_header(ok.data(), ok.size(), "x").expected_bytes, want);
  for (long delta : {-4L, -1L, 1L, 4L, 131072L}) {
    auto buf = checkpoint(h, want - 28 + delta);
    SCOPED_TRACE(delta);
    expect_kvb_error([&] { parse_llama2c_header(buf.data(), buf.size(), "/m/s.bin"); },
                     {"/m/s.bin", ": size " + std::to_string(want + delta) + " bytes",
                      "(1056540 bytes expected"});
  }
}

TEST(Llama2cFormat, NegativeVocabMeansSeparateClassifier) {
  const std::vector<int32_t> h = {64, 172, 5, 8, 4, -512, 512};
  const size_t shared = 28 + 4 * expected_floats(64, 172, 5, 8, 4, 512, 512, true);
  const size_t separate = 28 + 4 * expected_floats(64, 172, 5, 8, 4, 512, 512, false);
  ASSERT_EQ(separate - shared, 4u * 512 * 64);
  auto buf = checkpoint(h, separate - 28);
  const Llama2cLayout L = parse_llama2c_header(buf.data(), buf.size(), "/m/sep.bin");
  EXPECT_FALSE(L.shared_classifier);
  EXPECT_FALSE(L.config.tied_embeddings);
  EXPECT_EQ(L.config.vocab_size, 512);
  EXPECT_EQ(L.expected_bytes, separate);
  ASSERT_EQ(L.arrays.back().name, "wcls");
  EXPECT_EQ(L.arrays.back().shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(L.arrays.back().offset_floats, (shared - 28) / 4);
  // The same header on a file without wcls is refused, naming the separate classifier.
  auto short_buf = checkpoint(h, shared - 28);
  expect_kvb_error(
      [&] { parse_llama2c_header(short_buf.data(), short_buf.size(), "/m/sep.bin"); },
      {"/m/sep.bin", "size " + std::to_string(shared) + " bytes",
       "(" + std::to_string(separate) + " bytes expected", "vocab=512, separate classifier)"});
}

TEST(Llama2cFormat, GqaAndMhaLayouts) {
  // MHA (kv heads == heads) and 4-way GQA give different wk/wv sizes.
  for (int32_t kvh : {8, 2}) {
    const std::vector<int32_t> h = {128, 256, 2, 8, kvh, 100, 64};
    const size_t want = 28 + 4 * expected_floats(128, 256, 2, 8, kvh, 100, 64, true);
    auto buf = checkpoint(h, want - 28);
    const Llama2cLayout L = parse_llama2c_header(buf.data(), buf.size(), "g");
    EXPECT_EQ(find(L, "wk")->shape, (std::vector<int64_t>{2, kvh * 16, 128}));
    EXPECT_EQ(L.config.group_size(), 8 / kvh);
    EXPECT_EQ(L.expected_bytes, want);
  }
}

TEST(Llama2cFormat, ImplausibleHeaderValues) {
  const std::vector<int32_t> good = {64, 172, 5, 8, 4, 512, 512};
  const char* names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                          "n_kv_heads", "vocab_size", "seq_len"};
  const int32_t bad_values[] = {0, -1, std::numeric_limits<int32_t>::min(),
                                std::numeric_limits<int32_t>::max(), 1 << 23};
  for (int field = 0; field < 7; ++field) {
    for (int32_t v : bad_values) {
      std::vector<int32_t> h = good;
      h[field] = v;
      if (field == 5 && v == -1) continue;  // -1 is a valid (separate-classifier) vocab of 1
      auto buf = checkpoint(h, 1056540 - 28);
      SCOPED_TRACE(std::string(names[field]) + " = " + std::to_string(v));
      expect_kvb_error(
          [&] { parse_llama2c_header(buf.data(), buf.size(), "/m/bad.bin"); },
          {"/m/bad.bin", std::string(": header field ") + names[field] + " = " + std::to_string(v) +
                             " is not plausible for a llama2.c checkpoint"});
    }
  }
  // Text where a header should be: "<!DOCTYPE html>..." reads as a huge dim.
  std::string html = "<!DOCTYPE html><html><head></head><body>";
  std::vector<uint8_t> hb(html.begin(), html.end());
  expect_kvb_error([&] { parse_llama2c_header(hb.data(), hb.size(), "/m/page.bin"); },
                   {"/m/page.bin", "header field dim = ", "is not plausible"});
}

TEST(Llama2cFormat, InconsistentHeaderValues) {
  std::vector<int32_t> h = {65, 172, 5, 8, 4, 512, 512};
  auto buf = checkpoint(h, 1000);
  expect_kvb_error([&] { parse_llama2c_header(buf.data(), buf.size(), "/m/i.bin"); },
                   {"/m/i.bin", ": dim 65 is not a multiple of n_heads 8"});
  h = {64, 172, 5, 8, 3, 512, 512};
  buf = checkpoint(h, 1000);
  expect_kvb_error(
      [&] { parse_llama2c_header(buf.data(), buf.size(), "/m/i.bin"); },
      {"/m/i.bin", "num_attention_heads (8) must be a multiple of num_key_value_heads (3)"});
  h = {24, 172, 5, 8, 4, 512, 512};  // head_dim 3 cannot be rotated in pairs
  buf = checkpoint(h, 1000);
  expect_kvb_error([&] { parse_llama2c_header(buf.data(), buf.size(), "/m/i.bin"); },
                   {"/m/i.bin", "head_dim (3) must be even for RoPE"});
  h = {64, 172, 5, 8, 4, 1, 512};  // vocab 1 cannot hold BOS = 1
  buf = checkpoint(h, 1000);
  expect_kvb_error([&] { parse_llama2c_header(buf.data(), buf.size(), "/m/i.bin"); },
                   {"/m/i.bin", "'bos_token_id' 1 is outside the vocabulary [0, 1)"});
}

TEST(Llama2cFormat, LargestPlausibleHeaderDoesNotOverflow) {
  // Every field at its bound: the size arithmetic must not wrap, so a small buffer is refused by
  // the size check (not accepted, not crashing).
  const std::vector<int32_t> h = {1 << 16, 1 << 18, 1024, 1024, 1024, -(1 << 21), 1 << 22};
  auto buf = checkpoint(h, 64);
  const std::string msg = expect_kvb_error(
      [&] { parse_llama2c_header(buf.data(), buf.size(), "/m/big.bin"); },
      {"/m/big.bin", "size 92 bytes does not match its header", "separate classifier"});
  const size_t want =
      28 + 4 * expected_floats(1 << 16, 1 << 18, 1024, 1024, 1024, 1 << 21, 1 << 22, false);
  EXPECT_NE(msg.find("(" + std::to_string(want) + " bytes expected"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kvb
