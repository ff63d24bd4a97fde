// GgufFile: the two real GGUF files in ../shared read back as their READMEs describe; every kind of
// defect in a hand-built file is refused with one line naming the file and the field; and every
// supported ggml type dequantizes to the same float32 bits as the PyPI `gguf` package (fixtures
// from scripts/gguf-reference.py: random blocks of each type, and real blocks of the SmolLM2 file).
// This binary runs under AddressSanitizer + UBSan.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/formats/gguf.h"
#include "tests/base/base_test_util.h"
#include "tests/base/gguf_test_writer.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;
using ptest::scratch_dir;
using ptest::write_bytes;
using ptest::GgBuild;
using ptest::GgTensor;
using ptest::put_str;
using ptest::put_u32;
using ptest::put_u64;
using ptest::pattern;

// A valid file with metadata of several kinds and four tensors of different types.
GgBuild valid_build() {
  GgBuild b;
  b.str("general.architecture", "llama");
  b.u32("llama.block_count", 2);
  b.f32("llama.rope.freq_base", 10000.f);
  b.boolean("tokenizer.ggml.add_bos_token", false);
  b.strings("tokenizer.ggml.tokens", {"<unk>", "a", ""});
  b.i32s("tokenizer.ggml.token_type", {2, 1, -1});
  b.f32s("tokenizer.ggml.scores", {0.f, -1.5f, 2.25f});
  std::string f32(32, '\0');
  for (int i = 0; i < 8; ++i) {
    const float v = 0.5f * static_cast<float>(i) - 1.f;
    std::memcpy(&f32[4 * static_cast<size_t>(i)], &v, 4);
  }
  b.tensors.push_back({"w.f32", {4, 2}, 0, f32});
  b.tensors.push_back({"w.f16", {6}, 1, pattern(12, 1)});
  b.tensors.push_back({"w.q8_0", {32, 2}, 8, pattern(68, 2)});
  b.tensors.push_back({"w.q4_k", {256}, 12, pattern(144, 3)});
  return b;
}

std::string write_build(const GgBuild& b, const std::string& name = "m.gguf") {
  return write_bytes(scratch_dir("gguf"), name, b.bytes());
}

// ---- valid files ----

TEST(GgufFile, HandBuiltFileReadsBackValueForValue) {
  const GgBuild b = valid_build();
  const std::string bytes = b.bytes();
  const std::string path = write_bytes(scratch_dir("gguf"), "m.gguf", bytes);
  GgufFile f(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.file_size(), bytes.size());
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.metadata().size(), 7u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_EQ(f.get("llama.block_count").type, 4u);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(f.get_float("llama.block_count"), 2.0);  // an integer widens
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens"), (std::vector<std::string>{"<unk>", "a", ""}));
  EXPECT_EQ(f.get_ints("tokenizer.ggml.token_type"), (std::vector<int64_t>{2, 1, -1}));
  EXPECT_EQ(f.get_floats("tokenizer.ggml.scores"), (std::vector<double>{0.0, -1.5, 2.25}));
  EXPECT_EQ(f.get("tokenizer.ggml.scores").elem_type, 6u);
  EXPECT_EQ(f.get_int_or("absent", 7), 7);
  EXPECT_EQ(f.get_string_or("absent", "x"), "x");
  EXPECT_TRUE(f.get_bool_or("absent", true));
  EXPECT_EQ(f.get_float_or("absent", 0.5), 0.5);
  EXPECT_EQ(f.get_int_or("llama.block_count", 7), 2);

  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "w.f32");  // file order
  const GgufTensor& t = f.tensor("w.f32");
  EXPECT_EQ(t.type, 0u);
  EXPECT_EQ(t.dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(t.numel(), 8);
  EXPECT_EQ(t.nbytes, 32u);
  EXPECT_EQ(t.offset, 0u);
  std::vector<float> out(8);
  gguf_dequantize(t, out.data());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], 0.5f * static_cast<float>(i) - 1.f) << i;
  // Pointers point at the bytes the writer put there: the data section, then each aligned offset.
  const GgufTensor& q = f.tensor("w.q8_0");
  EXPECT_EQ(q.nbytes, 68u);
  EXPECT_EQ(q.offset, 64u);  // f32 (32 bytes) then f16 (12 bytes, padded to 32)
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(q.data), q.nbytes), pattern(68, 2));
  const GgufTensor& k = f.tensor("w.q4_k");
  EXPECT_EQ(k.nbytes, 144u);
  EXPECT_EQ(f.data_offset() + k.offset + k.nbytes, bytes.size());
  EXPECT_TRUE(f.has_tensor("w.f16"));
  EXPECT_FALSE(f.has_tensor("nope"));
  expect_kvb_error([&] { f.tensor("nope"); }, {path, "missing tensor 'nope'"});

  // The same bytes from memory: the same content, errors name the source.
  GgufFile m(bytes, "<memory>");
  EXPECT_EQ(m.path(), "<memory>");
  EXPECT_EQ(m.tensors().size(), 4u);
  EXPECT_EQ(std::memcmp(m.tensor("w.q4_k").data, k.data, 144), 0);
  expect_kvb_error([&] { m.get_int("absent"); }, {"<memory>", "missing metadata key 'absent'"});
}

TEST(GgufFile, TypedGettersNameTheFileAndKey) {
  const std::string path = write_build(valid_build());
  GgufFile f(path);
  expect_kvb_error([&] { f.get_int("general.architecture"); },
                   {path, "metadata key 'general.architecture' is a string (string), not an integer"});
  expect_kvb_error([&] { f.get_string("llama.block_count"); },
                   {path, "'llama.block_count' is an integer (u32), not a string"});
  expect_kvb_error([&] { f.get_bool("llama.block_count"); }, {path, "not a bool"});
  expect_kvb_error([&] { f.get_float("general.architecture"); }, {path, "not a float"});
  expect_kvb_error([&] { f.get_strings("tokenizer.ggml.scores"); },
                   {path, "'tokenizer.ggml.scores' is an array of f32, not of strings"});
  expect_kvb_error([&] { f.get_floats("tokenizer.ggml.token_type"); },
                   {path, "is an array of i32, not of floats"});
  expect_kvb_error([&] { f.get_ints("tokenizer.ggml.tokens"); },
                   {path, "is an array of string, not of integers"});
  expect_kvb_error([&] { f.get_ints("llama.block_count"); }, {path, "not an array"});
  expect_kvb_error([&] { f.get_string_or("llama.block_count", "x"); }, {path, "not a string"});
  expect_kvb_error([&] { f.get("nope"); }, {path, "missing metadata key 'nope'"});
}

TEST(GgufFile, VersionTwoAndOtherAlignmentsAndAllValueTypes) {
  GgBuild b = valid_build();
  b.version = 2;
  b.alignment = 64;
  b.u32("general.alignment", 64);
  // One entry of every scalar type (u8 i8 u16 i16 u32 i32 f32 bool string - u64 i64 f64).
  b.raw("t.u8", 0, std::string(1, '\xff'));
  b.raw("t.i8", 1, std::string(1, '\xff'));
  b.raw("t.u16", 2, std::string("\xff\xff", 2));
  b.raw("t.i16", 3, std::string("\x00\x80", 2));
  b.raw("t.i32", 5, std::string("\xff\xff\xff\xff", 4));
  b.raw("t.u64", 10, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8));
  b.raw("t.i64", 11, std::string("\x00\x00\x00\x00\x00\x00\x00\x80", 8));
  const double d = -0.125;
  b.raw("t.f64", 12, std::string(reinterpret_cast<const char*>(&d), 8));
  std::string bools;
  put_u32(bools, 7);
  put_u64(bools, 3);
  bools += std::string("\x01\x00\x01", 3);
  b.raw("t.bools", 9, bools);
  std::string empty;
  put_u32(empty, 8);
  put_u64(empty, 0);
  b.raw("t.empty", 9, empty);
  const std::string path = write_build(b);
  GgufFile f(path);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  EXPECT_EQ(f.get_int("t.u8"), 255);
  EXPECT_EQ(f.get_int("t.i8"), -1);
  EXPECT_EQ(f.get_int("t.u16"), 65535);
  EXPECT_EQ(f.get_int("t.i16"), -32768);
  EXPECT_EQ(f.get_int("t.i32"), -1);
  EXPECT_EQ(f.get_int("t.u64"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("t.f64"), -0.125);
  EXPECT_EQ(f.get_ints("t.bools"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_TRUE(f.get_strings("t.empty").empty());
}

TEST(GgufFile, NoTensorsIsAValidFile) {
  GgBuild b;
  b.str("general.architecture", "llama");
  std::string bytes = b.bytes();
  GgufFile f(bytes, "<kv only>");
  EXPECT_TRUE(f.tensors().empty());
  GgBuild empty;
  GgufFile e(empty.bytes().substr(0, 24), "<header only>");  // no padding needed without tensors
  EXPECT_TRUE(e.metadata().empty());
}

// ---- the real files ----

TEST(GgufFile, SmolLM2Q4_1MatchesItsReadme) {
  const std::string path =
      ptest::models_dir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 33u);
  ASSERT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.file_size(), 98362432u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 64);
  EXPECT_EQ(f.get_int("llama.context_length"), 8192);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.get_float("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_strings("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens")[1], "<|im_start|>");
  std::map<std::string, int> by_type;
  size_t end = 0;
  for (const auto& t : f.tensors()) {
    ++by_type[ggml_type_name(t.type)];
    end = std::max<size_t>(end, f.data_offset() + t.offset + t.nbytes);
  }
  EXPECT_EQ(by_type["Q4_1"], 210);
  EXPECT_EQ(by_type["Q8_0"], 1);
  EXPECT_EQ(by_type["F32"], 61);
  EXPECT_EQ(end, f.file_size());  // the data ends exactly at the end of the file
  EXPECT_FALSE(f.has_tensor("output.weight"));  // tied embeddings
  const GgufTensor& e = f.tensor("token_embd.weight");
  EXPECT_EQ(e.type, 8u);
  EXPECT_EQ(e.shape(), (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(e.nbytes, 49152u * 18 * 34);
  EXPECT_EQ(f.tensor("blk.3.attn_k.weight").shape(), (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(f.tensor("blk.3.ffn_down.weight").shape(), (std::vector<int64_t>{576, 1536}));
  EXPECT_EQ(f.tensor("blk.3.ffn_down.weight").type, 3u);
  EXPECT_EQ(f.tensor("output_norm.weight").shape(), (std::vector<int64_t>{576}));
}

TEST(GgufFile, Stories260KTensorsAreTheLlama2cWeights) {
  const std::string dir = ptest::models_dir() + "/stories260K";
  GgufFile f(dir + "/stories260K.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 19u);
  ASSERT_EQ(f.tensors().size(), 48u);
  size_t end = 0;
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.type, 0u) << t.name;
    end = std::max<size_t>(end, f.data_offset() + t.offset + t.nbytes);
  }
  EXPECT_EQ(end, f.file_size());
  EXPECT_EQ(f.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(f.get_int("llama.context_length"), 2048);
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(f.get_floats("tokenizer.ggml.scores").size(), 512u);
  // Byte-identical to the llama2.c checkpoint's arrays (28-byte header, then float32 arrays in
  // order token_embedding [512][64], rms_att [5][64], ..., w2 [5][64][172] ...).
  const std::string bin = ptest::read_bytes(dir + "/stories260K.bin");
  const size_t emb = 28, rms_att = emb + 4 * 512 * 64;
  const size_t wq = rms_att + 4 * 5 * 64, wk = wq + 4 * 5 * 64 * 64, wv = wk + 4 * 5 * 32 * 64;
  const size_t wo = wv + 4 * 5 * 32 * 64, rms_ffn = wo + 4 * 5 * 64 * 64;
  const size_t w1 = rms_ffn + 4 * 5 * 64, w2 = w1 + 4 * 5 * 172 * 64;
  auto same = [&](const std::string& name, size_t at) {
    const GgufTensor& t = f.tensor(name);
    ASSERT_LE(at + t.nbytes, bin.size()) << name;
    EXPECT_EQ(std::memcmp(t.data, bin.data() + at, t.nbytes), 0) << name;
  };
  same("token_embd.weight", emb);
  same("blk.0.attn_norm.weight", rms_att);
  same("blk.4.attn_norm.weight", rms_att + 4 * 4 * 64);
  same("blk.1.ffn_down.weight", w2 + 4 * 64 * 172);
  same("blk.2.attn_v.weight", wv + 4 * 2 * 32 * 64);
  EXPECT_EQ(f.tensor("blk.1.ffn_down.weight").shape(), (std::vector<int64_t>{64, 172}));
}

// ---- defects: each names the file and the field ----

TEST(GgufFile, MissingFileNamesThePath) {
  const std::string dir = scratch_dir("gguf");
  expect_kvb_error([&] { GgufFile f(dir + "/absent.gguf"); }, {dir + "/absent.gguf", "cannot open"});
}

TEST(GgufFile, EveryTruncationIsRefused) {
  const std::string bytes = valid_build().bytes();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string msg = expect_kvb_error([&] { GgufFile f(bytes.substr(0, n), "<cut>"); },
                                             {"<cut>"});
    const bool named = msg.find("truncated GGUF file") != std::string::npos ||
                       msg.find("not a GGUF file") != std::string::npos ||
                       msg.find("beyond the end") != std::string::npos ||
                       msg.find("past the end of the file") != std::string::npos ||
                       msg.find("cannot fit") != std::string::npos ||
                       msg.find("bytes are left") != std::string::npos;
    EXPECT_TRUE(named) << n << ": " << msg;
    if (HasFailure()) break;
  }
  // Within the index, the message names the field being read.
  expect_kvb_error([&] { GgufFile f(bytes.substr(0, 10), "<cut>"); },
                   {"truncated GGUF file: tensor count needs 8 bytes at offset 8 but 2 are left"});
}

TEST(GgufFile, WrongMagicAndVersions) {
  std::string bytes = valid_build().bytes();
  bytes[3] = 'G';
  const std::string path = write_bytes(scratch_dir("gguf"), "magic.gguf", bytes);
  expect_kvb_error([&] { GgufFile f(path); }, {path, "not a GGUF file", "magic"});
  GgBuild b = valid_build();
  b.version = 1;
  const std::string v1 = write_build(b, "v1.gguf");
  expect_kvb_error([&] { GgufFile f(v1); }, {v1, "GGUF version 1 is not supported"});
  b.version = 4;
  const std::string v4 = write_build(b, "v4.gguf");
  expect_kvb_error([&] { GgufFile f(v4); }, {v4, "GGUF version 4 is not supported (2 or 3)"});
  b.version = 0;
  expect_kvb_error([&] { GgufFile f(b.bytes(), "<v0>"); }, {"<v0>", "version 0"});
}

TEST(GgufFile, AbsurdCountsAreRefusedBeforeAllocating) {
  GgBuild b = valid_build();
  b.n_tensors_override = int64_t{1} << 62;
  const std::string p1 = write_build(b, "nt.gguf");
  expect_kvb_error([&] { GgufFile f(p1); }, {p1, "tensor count 4611686018427387904 cannot fit"});
  b = valid_build();
  b.n_kv_override = std::numeric_limits<int64_t>::max();
  const std::string p2 = write_build(b, "nkv.gguf");
  expect_kvb_error([&] { GgufFile f(p2); }, {p2, "metadata count 9223372036854775807 cannot fit"});
  // A count that fits the file's size but not its content: the entries run out.
  b = valid_build();
  b.n_kv_override = 9;
  expect_kvb_error([&] { GgufFile f(b.bytes(), "<kv>"); }, {"<kv>", "metadata key"});
  b = valid_build();
  b.n_tensors_override = 5;
  expect_kvb_error([&] { GgufFile f(b.bytes(), "<nt>"); }, {"<nt>", "tensor '", "n_dims is"});

  // Arrays and strings whose lengths exceed the file.
  GgBuild a;
  std::string arr;
  put_u32(arr, 5);
  put_u64(arr, uint64_t{1} << 61);
  a.raw("big.array", 9, arr);
  expect_kvb_error([&] { GgufFile f(a.bytes(), "<arr>"); },
                   {"<arr>", "metadata key 'big.array': array of 2305843009213693952 i32 values",
                    "bytes are left"});
  GgBuild s;
  std::string str;
  put_u64(str, ~uint64_t{0});
  s.raw("big.string", 8, str);
  expect_kvb_error([&] { GgufFile f(s.bytes(), "<str>"); },
                   {"<str>", "metadata key 'big.string': string length 18446744073709551615",
                    "goes beyond the end of the file"});
  std::string key = "GGUF";
  put_u32(key, 3);
  put_u64(key, 0);
  put_u64(key, 1);
  put_u64(key, uint64_t{1} << 40);  // the first key's length
  key += std::string(20, 'k');
  expect_kvb_error([&] { GgufFile f(key, "<key>"); },
                   {"<key>", "metadata key #0: string length 1099511627776"});
  // A string array whose strings claim more than is there.
  GgBuild sa;
  std::string strs;
  put_u32(strs, 8);
  put_u64(strs, 2);
  put_str(strs, "ok");
  put_u64(strs, 1000);
  sa.raw("tokenizer.ggml.tokens", 9, strs);
  expect_kvb_error([&] { GgufFile f(sa.bytes(), "<strs>"); },
                   {"<strs>", "metadata key 'tokenizer.ggml.tokens'[1]: string length 1000"});
}

TEST(GgufFile, BadValueTypes) {
  GgBuild b;
  b.raw("bad.type", 13, "");
  expect_kvb_error([&] { GgufFile f(b.bytes(), "<vt>"); },
                   {"<vt>", "metadata key 'bad.type': unknown value type 13 (GGUF defines 0..12)"});
  GgBuild e;
  std::string arr;
  put_u32(arr, 99);
  put_u64(arr, 1);
  e.raw("bad.elem", 9, arr);
  expect_kvb_error([&] { GgufFile f(e.bytes(), "<et>"); },
                   {"<et>", "metadata key 'bad.elem': unknown array element type 99"});
  GgBuild n;
  std::string nested;
  put_u32(nested, 9);
  put_u64(nested, 1);
  put_u32(nested, 4);
  put_u64(nested, 0);
  n.raw("nested", 9, nested);
  expect_kvb_error([&] { GgufFile f(n.bytes(), "<nested>"); },
                   {"<nested>", "metadata key 'nested': nested arrays are not supported"});
  GgBuild bo;
  bo.raw("flag", 7, std::string(1, '\x02'));
  expect_kvb_error([&] { GgufFile f(bo.bytes(), "<bool>"); },
                   {"<bool>", "metadata key 'flag': bool value is 2 (must be 0 or 1)"});
  GgBuild u;
  u.raw("huge", 10, std::string(8, '\xff'));
  expect_kvb_error([&] { GgufFile f(u.bytes(), "<u64>"); },
                   {"<u64>", "metadata key 'huge': u64 value 18446744073709551615"});
  GgBuild d = valid_build();
  d.u32("llama.block_count", 3);
  expect_kvb_error([&] { GgufFile f(d.bytes(), "<dup>"); },
                   {"<dup>", "metadata key 'llama.block_count' appears twice"});
}

TEST(GgufFile, BadAlignment) {
  for (uint32_t a : {0u, 24u, 1u << 31}) {
    GgBuild b = valid_build();
    b.u32("general.alignment", a);
    expect_kvb_error([&] { GgufFile f(b.bytes(), "<align>"); },
                     {"<align>", "'general.alignment' is " + std::to_string(a),
                      "must be a power of two"});
  }
  GgBuild s = valid_build();
  s.str("general.alignment", "32");
  expect_kvb_error([&] { GgufFile f(s.bytes(), "<align>"); },
                   {"<align>", "'general.alignment' must be an integer (got a string)"});
}

TEST(GgufFile, BadTensorEntries) {
  auto expect_tensor_error = [](const std::function<void(GgTensor&)>& edit,
                                std::initializer_list<std::string> parts) {
    GgBuild b = valid_build();
    edit(b.tensors[2]);  // w.q8_0
    const std::string path = write_build(b);
    const std::string msg = expect_kvb_error([&] { GgufFile f(path); }, {path});
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " / " << p;
  };
  expect_tensor_error([](GgTensor& t) { t.type = 99; }, {"tensor 'w.q8_0': unknown ggml type 99"});
  expect_tensor_error([](GgTensor& t) { t.type = 4; }, {"tensor 'w.q8_0': unknown ggml type 4"});
  expect_tensor_error([](GgTensor& t) { t.dims = {32, 1, 1, 1, 2}; },
                      {"tensor 'w.q8_0': n_dims is 5 (must be 1..4)"});
  expect_tensor_error([](GgTensor& t) { t.dims = {}; }, {"tensor 'w.q8_0': n_dims is 0"});
  expect_tensor_error([](GgTensor& t) { t.dims = {32, 0}; },
                      {"tensor 'w.q8_0': dimension 1 is 0"});
  expect_tensor_error([](GgTensor& t) { t.dims = {32, uint64_t{1} << 40, uint64_t{1} << 40}; },
                      {"tensor 'w.q8_0': dimensions overflow the element count"});
  expect_tensor_error(
      [](GgTensor& t) {
        t.type = 0;
        t.dims = {uint64_t{1} << 31, uint64_t{1} << 31};
      },
      {"tensor 'w.q8_0': F32 x [2147483648, 2147483648] overflows a byte count"});
  expect_tensor_error([](GgTensor& t) { t.dims = {31, 2}; },
                      {"tensor 'w.q8_0': Q8_0 row length 31 is not a multiple of its block size 32"});
  // Sizes that fit the arithmetic but not the file.
  expect_tensor_error([](GgTensor& t) { t.dims = {32, 16}; },
                      {"tensor 'w.q8_0': Q8_0 x [32, 16] needs 544 bytes at data offset 64",
                       "past the end of the file"});
  expect_tensor_error([](GgTensor& t) { t.offset = int64_t{1} << 50; },
                      {"tensor 'w.q8_0'", "at data offset 1125899906842624", "past the end"});
  expect_tensor_error([](GgTensor& t) { t.offset = 68; },
                      {"tensor 'w.q8_0': offset 68 is not a multiple of general.alignment (32)"});
  expect_tensor_error([](GgTensor& t) { t.offset = 0; },
                      {"tensors 'w.f32' (bytes 0..32) and 'w.q8_0' (from 0) overlap"});
  GgBuild dup = valid_build();
  dup.tensors[3].name = "w.f16";
  expect_kvb_error([&] { GgufFile f(dup.bytes(), "<dup>"); },
                   {"<dup>", "tensor 'w.f16' appears twice"});
  // The data section itself beyond the end: an index whose padding is cut off.
  GgBuild pad = valid_build();
  std::string bytes = pad.bytes();
  GgufFile whole(bytes, "<whole>");
  expect_kvb_error([&] { GgufFile f(bytes.substr(0, whole.data_offset() - 1), "<pad>"); },
                   {"<pad>", "the data section (at offset", "starts beyond the end of the file"});
}

TEST(GgufFile, KnownButUnsupportedTypesParseAndRefuseToDequantize) {
  GgBuild b;
  b.tensors.push_back({"w.q2_k", {256}, 10, pattern(84, 4)});
  b.tensors.push_back({"w.iq4_xs", {512}, 23, pattern(272, 5)});
  GgufFile f(b.bytes(), "<types>");
  EXPECT_EQ(f.tensor("w.q2_k").nbytes, 84u);
  EXPECT_EQ(f.tensor("w.iq4_xs").nbytes, 272u);
  std::vector<float> out(512);
  expect_kvb_error([&] { gguf_dequantize(f.tensor("w.q2_k"), out.data()); },
                   {"<types>", "tensor 'w.q2_k' is Q2_K, which cannot be dequantized"});
  expect_kvb_error([&] { ggml_dequantize(23, f.tensor("w.iq4_xs").data, out.data(), 512); },
                   {"dequantizing ggml type IQ4_XS is not supported"});
  expect_kvb_error([&] { ggml_dequantize(8, f.tensor("w.q2_k").data, out.data(), 31); },
                   {"Q8_0: 31 elements is not a multiple of its block size 32"});
}

TEST(GgmlTypes, NamesBlockSizesAndRowBytes) {
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(ggml_type_name(30), "BF16");
  EXPECT_EQ(ggml_type_name(4), "type 4");
  EXPECT_EQ(ggml_block_size(0), 1);
  EXPECT_EQ(ggml_block_size(3), 32);
  EXPECT_EQ(ggml_block_size(14), 256);
  EXPECT_EQ(ggml_row_bytes(3, 576), 18u * 20);
  EXPECT_EQ(ggml_row_bytes(8, 576), 18u * 34);
  EXPECT_EQ(ggml_row_bytes(14, 512), 2u * 210);
  EXPECT_EQ(ggml_row_bytes(30, 3), 6u);
  expect_kvb_error([] { ggml_row_bytes(99, 32); }, {"unknown ggml type 99"});
  expect_kvb_error([] { ggml_row_bytes(12, 255); }, {"Q4_K: 255 elements", "block size 256"});
  for (uint32_t t : {0u, 1u, 30u, 2u, 3u, 6u, 7u, 8u, 12u, 13u, 14u})
    EXPECT_TRUE(ggml_type_supported(t)) << t;
  for (uint32_t t : {9u, 10u, 11u, 15u, 16u, 23u, 4u, 99u}) EXPECT_FALSE(ggml_type_supported(t)) << t;
}

// ---- dequantization against gguf-py ----

nlohmann::json load_fixture(const std::string& name) {
  return nlohmann::json::parse(ptest::read_bytes(std::string(KVB_TEST_FIXTURES) + "/gguf/" + name));
}

std::string unhex(const std::string& h) {
  std::string out(h.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(GgmlDequantize, EveryTypeMatchesGgufPyBitForBit) {
  const nlohmann::json j = load_fixture("quants.json");
  std::set<std::string> seen;
  for (const auto& e : j["types"]) {
    const std::string name = e["name"];
    const uint32_t type = e["type"];
    const int64_t n = e["n"];
    const std::string raw = unhex(e["hex"]);
    ASSERT_EQ(raw.size(), ggml_row_bytes(type, n)) << name;
    ASSERT_EQ(e["values"].size(), static_cast<size_t>(n)) << name;
    std::vector<float> out(static_cast<size_t>(n), -12345.f);
    ggml_dequantize(type, reinterpret_cast<const uint8_t*>(raw.data()), out.data(), n);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = e["values"][static_cast<size_t>(i)].get<float>();
      if (bits(out[i]) != bits(want) && bad++ < 5)
        ADD_FAILURE() << name << "[" << i << "]: " << out[i] << " vs gguf-py " << want;
    }
    EXPECT_EQ(bad, 0) << name;
    seen.insert(name);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                         "Q8_0", "Q4_K", "Q5_K", "Q6_K"}));
  EXPECT_EQ(j["made_by"]["gguf"], "0.19.0");
}

TEST(GgmlDequantize, RealSmolLM2BlocksMatchGgufPy) {
  const nlohmann::json j = load_fixture("smollm2_blocks.json");
  GgufFile f(ptest::models_dir() + "/" + j["file"].get<std::string>());
  ASSERT_GE(j["blocks"].size(), 6u);
  std::map<std::string, std::vector<float>> whole;  // full-tensor dequantization, once per tensor
  for (const auto& b : j["blocks"]) {
    const GgufTensor& t = f.tensor(b["tensor"].get<std::string>());
    EXPECT_EQ(ggml_type_name(t.type), b["type"].get<std::string>());
    const int64_t first = b["first_element"];
    const int64_t bs = ggml_block_size(t.type);
    std::vector<float> out(static_cast<size_t>(bs));
    ggml_dequantize(t.type, t.data + ggml_row_bytes(t.type, first), out.data(), bs);
    auto& all = whole[t.name];
    if (all.empty()) {
      all.resize(static_cast<size_t>(t.numel()));
      gguf_dequantize(t, all.data());
    }
    for (int64_t i = 0; i < bs; ++i) {
      const float want = b["values"][static_cast<size_t>(i)].get<float>();
      EXPECT_EQ(bits(out[i]), bits(want)) << t.name << "[" << first + i << "]";
      EXPECT_EQ(bits(all[static_cast<size_t>(first + i)]), bits(want)) << t.name;
    }
  }
  EXPECT_EQ(whole.size(), 3u);
}

}  // namespace
}  // namespace kvb
