// SafetensorsFile / SafetensorsSet: valid files (single and sharded) read back value for value, and
// every kind of defect is refused with one line naming the file, the tensor and the defect. A fuzz
// loop over flipped and truncated bytes checks that a corrupt file never crashes the reader (this
// binary runs under AddressSanitizer + UBSan).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <set>

#include "harness/common/error.h"
#include "harness/formats/safetensors.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;
using ptest::scratch_dir;
using ptest::st_build;
using ptest::st_bytes;
using ptest::st_serialize;
using ptest::st_serialize_raw;
using ptest::StBuild;
using ptest::StSpec;
using ptest::write_bytes;

float f32_at(const StTensor& t, size_t i) {
  float v;
  std::memcpy(&v, t.data + 4 * i, 4);  // the mapping need not be 4-aligned for us to read it
  return v;
}

const std::vector<StSpec> kSpecs = {
    {"model.embed_tokens.weight", "F32", {4, 3}},
    {"model.norm.weight", "BF16", {3}},
    {"lm_head.bias", "I64", {2}},
    {"mask", "BOOL", {5}},
    {"scalar", "F16", {}},
    {"empty", "U8", {0, 7}},
};

TEST(SafetensorsFile, ValidFileRoundTripsValuesThroughPointers) {
  const std::string dir = scratch_dir("st");
  const std::string path = write_bytes(dir, "model.safetensors", st_bytes(kSpecs));
  SafetensorsFile f(path);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), kSpecs.size());
  EXPECT_TRUE(f.metadata().empty());

  const StTensor& e = f.get("model.embed_tokens.weight");
  EXPECT_EQ(e.name, "model.embed_tokens.weight");
  EXPECT_EQ(e.dtype, StDtype::kF32);
  EXPECT_EQ(e.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(e.numel(), 12);
  EXPECT_EQ(e.nbytes, 48u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(f32_at(e, i), ptest::st_test_f32_value(0, i)) << i;

  const StTensor& n = f.get("model.norm.weight");
  EXPECT_EQ(n.dtype, StDtype::kBF16);
  EXPECT_EQ(n.nbytes, 6u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(n.data[2 * i], ptest::st_test_byte_value(1, i));
    EXPECT_EQ(n.data[2 * i + 1], ptest::st_test_byte_value(1, i));
  }
  // Tensors are laid out back to back: the BF16 one starts right after the 48 F32 bytes.
  EXPECT_EQ(n.data, e.data + 48);

  const StTensor& b = f.get("lm_head.bias");
  EXPECT_EQ(b.dtype, StDtype::kI64);
  EXPECT_EQ(b.nbytes, 16u);
  EXPECT_EQ(b.data[8], ptest::st_test_byte_value(2, 1));

  const StTensor& m = f.get("mask");
  EXPECT_EQ(m.dtype, StDtype::kBool);
  EXPECT_EQ(m.nbytes, 5u);
  EXPECT_EQ(m.data[4], ptest::st_test_byte_value(3, 4));

  const StTensor& s = f.get("scalar");  // shape [] is a scalar: one element
  EXPECT_EQ(s.dtype, StDtype::kF16);
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.nbytes, 2u);

  const StTensor& z = f.get("empty");
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.nbytes, 0u);
  EXPECT_EQ(z.shape, (std::vector<int64_t>{0, 7}));

  EXPECT_TRUE(f.has("mask"));
  EXPECT_FALSE(f.has("nope"));
  expect_kvb_error([&] { f.get("nope"); }, {path, "missing tensor 'nope'"});
}

TEST(SafetensorsFile, DtypeNamesAndSizes) {
  EXPECT_STREQ(st_dtype_name(StDtype::kBF16), "BF16");
  EXPECT_STREQ(st_dtype_name(StDtype::kBool), "BOOL");
  EXPECT_EQ(st_dtype_size(StDtype::kF32), 4u);
  EXPECT_EQ(st_dtype_size(StDtype::kF16), 2u);
  EXPECT_EQ(st_dtype_size(StDtype::kF64), 8u);
  EXPECT_EQ(st_dtype_size(StDtype::kI8), 1u);
  // Every dtype the reader accepts round-trips through a file with the right element size.
  const std::vector<std::pair<std::string, StDtype>> all = {
      {"F32", StDtype::kF32},  {"F16", StDtype::kF16}, {"BF16", StDtype::kBF16},
      {"F64", StDtype::kF64},  {"I64", StDtype::kI64}, {"I32", StDtype::kI32},
      {"I16", StDtype::kI16},  {"I8", StDtype::kI8},   {"U8", StDtype::kU8},
      {"BOOL", StDtype::kBool}};
  std::vector<StSpec> specs;
  for (const auto& [name, dt] : all) specs.push_back({"t_" + name, name, {3}});
  const std::string dir = scratch_dir("st");
  SafetensorsFile f(write_bytes(dir, "all.safetensors", st_bytes(specs)));
  for (const auto& [name, dt] : all) {
    const StTensor& t = f.get("t_" + name);
    EXPECT_EQ(t.dtype, dt) << name;
    EXPECT_EQ(t.nbytes, 3 * st_dtype_size(dt)) << name;
  }
}

TEST(SafetensorsFile, MetadataIsParsed) {
  const std::string dir = scratch_dir("st");
  const std::string path = write_bytes(
      dir, "m.safetensors", st_bytes({{"w", "F32", {2}}}, {{"format", "pt"}, {"author", "kvb"}}));
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("author"), "kvb");
  EXPECT_FALSE(f.has("__metadata__"));  // metadata is not a tensor
  EXPECT_EQ(f.tensors().size(), 1u);

  StBuild b = st_build({{"w", "F32", {2}}});
  b.header["__metadata__"] = {{"format", 3}};
  const std::string bad = write_bytes(dir, "badmeta.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile g(bad); },
                   {bad, "__metadata__ value 'format' is not a string"});
  b.header["__metadata__"] = nlohmann::json::array({1, 2});
  const std::string bad2 = write_bytes(dir, "badmeta2.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile g(bad2); }, {bad2, "__metadata__ is not an object"});
}

TEST(SafetensorsFile, EmptyHeaderObjectIsAValidFileWithNoTensors) {
  const std::string dir = scratch_dir("st");
  SafetensorsFile f(write_bytes(dir, "e.safetensors", st_serialize_raw("{}", "")));
  EXPECT_TRUE(f.tensors().empty());
}

TEST(SafetensorsFile, MissingFileNamesThePath) {
  const std::string dir = scratch_dir("st");
  const std::string path = dir + "/absent.safetensors";
  expect_kvb_error([&] { SafetensorsFile f(path); }, {path, "cannot open"});
  expect_kvb_error([&] { SafetensorsFile f(dir); }, {dir, "not a regular file"});
}

TEST(SafetensorsFile, TruncatedBelowEightBytes) {
  const std::string dir = scratch_dir("st");
  for (size_t n : {0, 1, 7}) {
    const std::string path = write_bytes(dir, "t" + std::to_string(n), std::string(n, '\x01'));
    expect_kvb_error([&] { SafetensorsFile f(path); },
                     {path, "truncated safetensors file (" + std::to_string(n) + " bytes;",
                      "8-byte header length is missing"});
  }
}

TEST(SafetensorsFile, HeaderLengthBeyondFile) {
  const std::string dir = scratch_dir("st");
  std::string bytes = st_bytes({{"w", "F32", {2}}});
  const size_t real = bytes.size();
  // Claim a header one byte longer than everything after the length field.
  const uint64_t n = real - 8 + 1;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  const std::string path = write_bytes(dir, "long.safetensors", bytes);
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, "header length " + std::to_string(n),
                    "goes beyond the end of the file (" + std::to_string(real) + " bytes)"});
  // All 0xff: 2^64-1, must not overflow into a "valid" length.
  for (int i = 0; i < 8; ++i) bytes[i] = '\xff';
  write_bytes(dir, "long.safetensors", bytes);
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, "header length 18446744073709551615", "goes beyond the end"});
  // Exactly 8 bytes with a zero length: an empty header is not JSON.
  const std::string p8 = write_bytes(dir, "zero.safetensors", std::string(8, '\0'));
  expect_kvb_error([&] { SafetensorsFile f(p8); }, {p8, "header: not valid JSON"});
}

TEST(SafetensorsFile, HeaderNotJson) {
  const std::string dir = scratch_dir("st");
  const std::string path =
      write_bytes(dir, "nj.safetensors", st_serialize_raw("{\"w\": {\"dtype\": \"F32\",", ""));
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, ": header: not valid JSON: ", "parse error"});
  const std::string p2 = write_bytes(dir, "nj2.safetensors", st_serialize_raw("\x01garbage\n", ""));
  expect_kvb_error([&] { SafetensorsFile f(p2); }, {p2, "header: not valid JSON"});
}

TEST(SafetensorsFile, HeaderNotAnObject) {
  const std::string dir = scratch_dir("st");
  for (const char* text : {"[1, 2, 3]", "\"F32\"", "42", "null"}) {
    const std::string path = write_bytes(dir, "no.safetensors", st_serialize_raw(text, ""));
    expect_kvb_error([&] { SafetensorsFile f(path); }, {path, ": header is not a JSON object"});
  }
}

// Each field of a tensor entry removed or mistyped in turn: the error names the tensor and the
// field.
TEST(SafetensorsFile, EntryMissingOrMistypedFields) {
  const std::string dir = scratch_dir("st");
  struct Case {
    const char* field;
    nlohmann::json value;  // null = remove the field
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"dtype", nullptr, "missing or non-string 'dtype'"},
      {"dtype", 4, "missing or non-string 'dtype'"},
      {"shape", nullptr, "missing or non-array 'shape'"},
      {"shape", "2,3", "missing or non-array 'shape'"},
      {"data_offsets", nullptr, "'data_offsets' must be [begin, end]"},
      {"data_offsets", nlohmann::json::array({0}), "'data_offsets' must be [begin, end]"},
      {"data_offsets", nlohmann::json::array({0, 8, 16}), "'data_offsets' must be [begin, end]"},
      {"data_offsets", 8, "'data_offsets' must be [begin, end]"},
  };
  for (const Case& c : cases) {
    StBuild b = st_build({{"a.weight", "F32", {2}}, {"b.weight", "F32", {2}}});
    if (c.value.is_null())
      b.header["b.weight"].erase(c.field);
    else
      b.header["b.weight"][c.field] = c.value;
    const std::string path = write_bytes(dir, "f.safetensors", st_serialize(b));
    SCOPED_TRACE(std::string(c.field) + " = " + c.value.dump());
    expect_kvb_error([&] { SafetensorsFile f(path); }, {path, "tensor 'b.weight'", c.expect});
  }
  StBuild b = st_build({{"a.weight", "F32", {2}}});
  b.header["a.weight"] = "F32";
  const std::string path = write_bytes(dir, "g.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, "tensor 'a.weight': entry is not an object"});
}

TEST(SafetensorsFile, UnknownDtype) {
  const std::string dir = scratch_dir("st");
  StBuild b = st_build({{"w", "F32", {2}}});
  b.header["w"]["dtype"] = "F8_E9";
  const std::string path = write_bytes(dir, "d.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); }, {path, "tensor 'w': unknown dtype 'F8_E9'"});
  b.header["w"]["dtype"] = "f32";  // dtype names are case-sensitive in the format
  write_bytes(dir, "d.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); }, {path, "tensor 'w': unknown dtype 'f32'"});
}

TEST(SafetensorsFile, DtypeTimesShapeMustEqualByteSpan) {
  const std::string dir = scratch_dir("st");
  // F32 [2, 3] = 24 bytes, but the entry claims only [2, 2].
  StBuild b = st_build({{"w", "F32", {2, 3}}, {"x", "U8", {4}}});
  b.header["w"]["shape"] = {2, 2};
  std::string path = write_bytes(dir, "s.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, "tensor 'w': F32 x [2,2] needs 16 bytes but data_offsets span 24"});
  // Same span, wrong dtype: F16 [2, 3] = 12 bytes.
  b = st_build({{"w", "F32", {2, 3}}});
  b.header["w"]["dtype"] = "F16";
  path = write_bytes(dir, "s2.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, "tensor 'w': F16 x [2,3] needs 12 bytes but data_offsets span 24"});
  // A shape whose element count overflows is refused, not wrapped around to a matching size.
  b = st_build({{"w", "F32", {2}}});
  b.header["w"]["shape"] = {uint64_t{1} << 40, uint64_t{1} << 40};
  path = write_bytes(dir, "s3.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); }, {path, "tensor 'w': shape overflows"});
}

TEST(SafetensorsFile, NegativeOrNonIntegerShapeEntries) {
  const std::string dir = scratch_dir("st");
  for (const nlohmann::json& shape : {nlohmann::json::array({-2}), nlohmann::json::array({2, -1}),
                                      nlohmann::json::array({2.0}), nlohmann::json::array({"2"})}) {
    StBuild b = st_build({{"w", "F32", {2}}});
    b.header["w"]["shape"] = shape;
    const std::string path = write_bytes(dir, "n.safetensors", st_serialize(b));
    SCOPED_TRACE(shape.dump());
    expect_kvb_error([&] { SafetensorsFile f(path); },
                     {path, "tensor 'w': shape entries must be non-negative integers"});
  }
}

TEST(SafetensorsFile, OffsetsOutOfRangeReversedOrNegative) {
  const std::string dir = scratch_dir("st");
  StBuild b = st_build({{"a", "F32", {2}}, {"b", "F32", {2}}});  // data section: 16 bytes
  b.header["b"]["data_offsets"] = {12, 20};
  std::string path = write_bytes(dir, "o.safetensors", st_serialize(b));
  expect_kvb_error(
      [&] { SafetensorsFile f(path); },
      {path, "tensor 'b': data_offsets [12, 20] are out of range (data section is 16 bytes)"});

  b = st_build({{"a", "F32", {2}}, {"b", "F32", {2}}});
  b.header["b"]["data_offsets"] = {16, 8};
  path = write_bytes(dir, "r.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, "tensor 'b': data_offsets [16, 8] are reversed"});

  b = st_build({{"a", "F32", {2}}});
  b.header["a"]["data_offsets"] = {-8, 0};
  path = write_bytes(dir, "neg.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); },
                   {path, "tensor 'a': data_offsets must be non-negative integers"});

  // Huge offsets whose difference is right must still be out of range (no wrap-around).
  b = st_build({{"a", "F32", {2}}});
  b.header["a"]["data_offsets"] = {UINT64_MAX - 8, UINT64_MAX};
  path = write_bytes(dir, "huge.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); }, {path, "tensor 'a':", "are out of range"});

  // The data section excludes the header: offsets are relative to its start, not to the file's.
  b = st_build({{"a", "F32", {2}}});
  const std::string ok = write_bytes(dir, "ok.safetensors", st_serialize(b));
  SafetensorsFile f(ok);
  EXPECT_EQ(f32_at(f.get("a"), 1), ptest::st_test_f32_value(0, 1));
}

TEST(SafetensorsFile, OverlappingTensors) {
  const std::string dir = scratch_dir("st");
  StBuild b =
      st_build({{"a", "F32", {4}}, {"b", "F32", {2}}, {"c", "F32", {2}}});  // 0-16, 16-24, 24-32
  b.header["c"]["data_offsets"] = {20, 28};  // overlaps b's last 4 bytes
  const std::string path = write_bytes(dir, "ov.safetensors", st_serialize(b));
  expect_kvb_error([&] { SafetensorsFile f(path); }, {path, "tensors 'b' and 'c' overlap"});
  // Two names for the same bytes.
  b = st_build({{"a", "F32", {4}}, {"b", "F32", {4}}});
  b.header["b"]["data_offsets"] = {0, 16};
  const std::string p2 = write_bytes(dir, "alias.safetensors", st_serialize(b));
  const std::string msg = expect_kvb_error([&] { SafetensorsFile f(p2); }, {p2, "overlap"});
  EXPECT_NE(msg.find("'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
}

TEST(SafetensorsFile, RealModelFileParses) {
  const std::string path = ptest::models_dir() + "/stories260K-hf/model.safetensors";
  ASSERT_TRUE(file_exists(path)) << path << " missing (run scripts/setup.sh)";
  SafetensorsFile f(path);
  const StTensor& emb = f.get("model.embed_tokens.weight");
  EXPECT_EQ(emb.shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(emb.dtype, StDtype::kF32);
  const StTensor& down = f.get("model.layers.4.mlp.down_proj.weight");
  EXPECT_EQ(down.shape, (std::vector<int64_t>{64, 172}));
  size_t total = 0;
  for (const auto& [name, t] : f.tensors()) total += t.nbytes;
  // 260K-parameter model, tied embeddings: all of it F32.
  EXPECT_GT(total, 1000000u);
  EXPECT_LT(total, 1045032u);
}

// ---- SafetensorsSet ----

// Writes a 2-shard model: shard 1 holds a, b; shard 2 holds c. Returns the directory.
std::string write_sharded(const std::string& tag, nlohmann::json* index_out = nullptr) {
  const std::string dir = scratch_dir(tag);
  write_bytes(dir, "model-00001-of-00002.safetensors",
              st_bytes({{"a", "F32", {2, 2}}, {"b", "F32", {3}}}));
  write_bytes(dir, "model-00002-of-00002.safetensors", st_bytes({{"c", "F32", {5}}}));
  nlohmann::json index = {{"metadata", {{"total_size", 48}}},
                          {"weight_map",
                           {{"a", "model-00001-of-00002.safetensors"},
                            {"b", "model-00001-of-00002.safetensors"},
                            {"c", "model-00002-of-00002.safetensors"}}}};
  write_bytes(dir, "model.safetensors.index.json", index.dump(2));
  if (index_out) *index_out = index;
  return dir;
}

TEST(SafetensorsSet, SingleFile) {
  const std::string dir = scratch_dir("sts");
  write_bytes(dir, "model.safetensors", st_bytes({{"x", "F32", {3}}, {"y", "I32", {1}}}));
  SafetensorsSet s(dir);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(s.files().size(), 1u);
  EXPECT_EQ(s.file_of("x"), dir + "/model.safetensors");
  EXPECT_EQ(f32_at(s.get("x"), 2), ptest::st_test_f32_value(0, 2));
  EXPECT_FALSE(s.has("z"));
  expect_kvb_error([&] { s.get("z"); }, {dir, "missing tensor 'z'"});
  expect_kvb_error([&] { s.file_of("z"); }, {dir, "missing tensor 'z'"});
}

TEST(SafetensorsSet, ShardedIndexWorks) {
  const std::string dir = write_sharded("sts");
  SafetensorsSet s(dir);
  EXPECT_EQ(s.files().size(), 2u);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s.file_of("a"), dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(s.file_of("b"), dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(s.file_of("c"), dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(s.get("a").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f32_at(s.get("b"), 2), ptest::st_test_f32_value(1, 2));
  // c is the first tensor of its own shard.
  EXPECT_EQ(f32_at(s.get("c"), 4), ptest::st_test_f32_value(0, 4));
  expect_kvb_error([&] { s.get("d"); }, {dir, "missing tensor 'd'"});
}

TEST(SafetensorsSet, IndexWinsOverSingleFile) {
  const std::string dir = write_sharded("sts");
  write_bytes(dir, "model.safetensors", st_bytes({{"only_in_single", "F32", {1}}}));
  SafetensorsSet s(dir);
  EXPECT_TRUE(s.has("c"));
  EXPECT_FALSE(s.has("only_in_single"));
}

TEST(SafetensorsSet, IndexNamingMissingShard) {
  nlohmann::json index;
  const std::string dir = write_sharded("sts", &index);
  index["weight_map"]["c"] = "model-00003-of-00002.safetensors";
  write_bytes(dir, "model.safetensors.index.json", index.dump());
  expect_kvb_error([&] { SafetensorsSet s(dir); },
                   {dir + "/model-00003-of-00002.safetensors", "cannot open"});
}

TEST(SafetensorsSet, IndexNamingTensorAbsentFromItsShard) {
  nlohmann::json index;
  const std::string dir = write_sharded("sts", &index);
  index["weight_map"]["c"] = "model-00001-of-00002.safetensors";  // c lives in shard 2
  write_bytes(dir, "model.safetensors.index.json", index.dump());
  expect_kvb_error([&] { SafetensorsSet s(dir); },
                   {dir + "/model-00001-of-00002.safetensors", "missing tensor 'c'",
                    "listed in " + dir + "/model.safetensors.index.json"});
}

TEST(SafetensorsSet, MalformedIndex) {
  const std::string dir = write_sharded("sts");
  const std::string index = dir + "/model.safetensors.index.json";
  write_bytes(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": ");
  expect_kvb_error([&] { SafetensorsSet s(dir); }, {index, ": not valid JSON: ", "parse error"});
  write_bytes(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
  expect_kvb_error([&] { SafetensorsSet s(dir); }, {index, "missing 'weight_map' object"});
  write_bytes(dir, "model.safetensors.index.json", "[]");
  expect_kvb_error([&] { SafetensorsSet s(dir); }, {index, "missing 'weight_map' object"});
  write_bytes(dir, "model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
  expect_kvb_error([&] { SafetensorsSet s(dir); }, {index, "weight_map['a'] is not a string"});
  write_bytes(dir, "model.safetensors.index.json",
              R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
  expect_kvb_error([&] { SafetensorsSet s(dir); },
                   {index, "shard name '../model-00001-of-00002.safetensors'",
                    "must be a file name in the model directory"});
}

TEST(SafetensorsSet, CorruptShardNamesTheShard) {
  const std::string dir = write_sharded("sts");
  write_bytes(dir, "model-00002-of-00002.safetensors", "short");
  expect_kvb_error([&] { SafetensorsSet s(dir); },
                   {dir + "/model-00002-of-00002.safetensors", "truncated safetensors file"});
}

TEST(SafetensorsSet, DirectoryWithNeitherFile) {
  const std::string dir = scratch_dir("sts");
  write_bytes(dir, "pytorch_model.bin", "not us");
  expect_kvb_error([&] { SafetensorsSet s(dir); },
                   {dir, ": no model.safetensors or model.safetensors.index.json"});
  expect_kvb_error([&] { SafetensorsSet s(dir + "/nonexistent"); },
                   {dir + "/nonexistent", "no model.safetensors"});
}

// ---- fuzz-ish robustness ----

// Flips and truncations of a valid file: the reader either accepts it (then every tensor it hands
// out lies inside the file) or throws kvb::Error naming the file. A crash, a sanitizer report or
// another exception type fails the test.
TEST(SafetensorsFile, FuzzFlipsAndTruncationsNeverCrash) {
  const std::string dir = scratch_dir("stfuzz");
  const std::string valid =
      st_bytes({{"tok.weight", "F32", {3, 2}}, {"norm", "BF16", {4}}, {"ids", "I64", {2}}},
               {{"format", "pt"}});
  const std::string path = dir + "/fuzz.safetensors";
  uint64_t rng = 0x9E3779B97F4A7C15ull;  // deterministic xorshift
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int accepted = 0, refused = 0;
  std::set<std::string> kinds;
  for (int v = 0; v < 300; ++v) {
    std::string bytes = valid;
    const int mode = v % 4;
    if (mode == 0) {  // flip one bit
      const size_t pos = next() % bytes.size();
      bytes[pos] = static_cast<char>(bytes[pos] ^ (1u << (next() % 8)));
    } else if (mode == 1) {  // set one byte to an interesting value
      static const char kVals[] = {'\0', '\xff', '"', '{', '}', '[', ']', ',', ':', '-', '9', '\n'};
      bytes[next() % bytes.size()] = kVals[next() % sizeof(kVals)];
    } else if (mode == 2) {  // truncate
      bytes.resize(next() % bytes.size());
    } else {  // several random bytes, including the length field
      for (int k = 0; k < 3; ++k) bytes[next() % bytes.size()] = static_cast<char>(next());
      if (v % 8 == 3) bytes[next() % 8] = static_cast<char>(next());
    }
    write_bytes(dir, "fuzz.safetensors", bytes);
    try {
      SafetensorsFile f(path);
      ++accepted;
      for (const auto& [name, t] : f.tensors()) {
        (void)name;
        if (t.nbytes == 0) continue;
        // Touch the first and last byte of every tensor: ASan reports any read outside the mapping.
        volatile uint8_t first = t.data[0], last = t.data[t.nbytes - 1];
        (void)first;
        (void)last;
      }
    } catch (const kvb::Error& e) {
      ++refused;
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path, 0), 0u) << "variant " << v << ": " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "variant " << v << ": " << msg;
      kinds.insert(msg.substr(path.size(), 30));
    }
  }
  EXPECT_EQ(accepted + refused, 300);
  EXPECT_GT(refused, 150) << "most corruptions must be detected";
  EXPECT_GT(kinds.size(), 4u) << "corruptions hit several different checks";
  std::cout << "[ fuzz ] safetensors: " << accepted << " accepted, " << refused << " refused, "
            << kinds.size() << " distinct error kinds\n";
}

}  // namespace
}  // namespace kvb
