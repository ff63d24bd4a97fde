// Bounds on user-given sizes and values, checked where they enter: integer parameters that are not
// 64-bit integers, thread counts, a config's declared context, non-finite weights, and a damaged
// results DB refused by its readers.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "harness/common/config_overrides.h"
#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/limits.h"
#include "harness/common/params.h"
#include "harness/formats/finite_check.h"
#include "harness/formats/model_config.h"
#include "harness/store/config_hash.h"
#include "harness/store/results_db.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using nlohmann::json;
using ptest::expect_kvb_error;

const std::vector<ParamSpec>& specs() {
  static const std::vector<ParamSpec> s = {
      int_param("block_size", 16, 1, 4096, "tokens per block"),
      int_param("offset", 0, std::nullopt, std::nullopt, "any")};
  return s;
}

TEST(IntParams, NonIntegersAndOutOfRangeFloatsNameTheKey) {
  expect_kvb_error(
      [] {
        resolve_params(specs(), json{{"block_size", 2.5}}, "method paged");
      },
      {"method paged.block_size", "expected an integer", "2.5"});
  // 1e300 is a whole float, but casting it to int64 is undefined (in practice INT64_MIN, which an
  // unbounded key would then accept): it must be refused as not fitting, naming the key.
  expect_kvb_error(
      [] {
        resolve_params(specs(), json{{"offset", 1e300}}, "method paged");
      },
      {"method paged.offset", "1e+300", "does not fit a 64-bit integer"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), json{{"block_size", 1e300}}, "method paged");
      },
      {"method paged.block_size", "does not fit a 64-bit integer", "allowed range"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), json{{"offset", -1e19}}, "m");
      },
      {"m.offset", "does not fit"});
  // An unsigned above INT64_MAX would wrap negative through get<int64_t>.
  expect_kvb_error(
      [] { resolve_params(specs(), json::parse(R"({"offset": 18446744073709551615})"), "m"); },
      {"m.offset", "18446744073709551615", "does not fit"});
  // What is in range still resolves, floats with integral values included.
  const json ok = resolve_params(specs(), json{{"block_size", 32.0}, {"offset", -9.0e18}}, "m");
  EXPECT_EQ(ok["block_size"].get<int64_t>(), 32);
  EXPECT_EQ(ok["offset"].get<int64_t>(), -9000000000000000000LL);
  const json big = resolve_params(specs(), json{{"offset", INT64_MAX}}, "m");
  EXPECT_EQ(big["offset"].get<int64_t>(), INT64_MAX);
}

TEST(ThreadCount, BoundedAndNamed) {
  check_thread_count(0, "--threads");
  check_thread_count(kMaxThreads, "--threads");
  expect_kvb_error([] { check_thread_count(kMaxThreads + 1, "--threads"); },
                   {"--threads", "1025 threads", "[0, 1024]"});
  expect_kvb_error([] { check_thread_count(-1, "--threads"); }, {"--threads", "-1"});
  expect_kvb_error([] { check_thread_count(0, "--threads-list", false); },
                   {"--threads-list", "[1, 1024]"});
}

std::string hf_config(const std::string& max_pos) {
  return R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32,
             "max_position_embeddings": )" +
         max_pos + "}";
}

TEST(ModelConfigBounds, DeclaredContextIsBounded) {
  EXPECT_EQ(parse_hf_config(hf_config("16777216"), "c.json").max_seq_len, kMaxContextTokens);
  expect_kvb_error([] { parse_hf_config(hf_config("16777217"), "c.json"); },
                   {"c.json", "'max_position_embeddings' 16777217", "supported maximum 16777216"});
  expect_kvb_error([] { parse_hf_config(hf_config("1099511627776"), "c.json"); },
                   {"c.json", "max_position_embeddings"});
}

TEST(FiniteCheck, FindsTheFirstNanOrInfInEachFormat) {
  std::vector<float> f(1000, 1.5f);
  EXPECT_EQ(first_nonfinite(f.data(), 1000, FloatBits::kF32), -1);
  f[700] = std::numeric_limits<float>::infinity();
  f[900] = std::nanf("");
  EXPECT_EQ(first_nonfinite(f.data(), 1000, FloatBits::kF32), 700);
  EXPECT_EQ(first_nonfinite(f.data(), 700, FloatBits::kF32), -1);  // n bounds the scan
  f[3] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(first_nonfinite(f.data(), 1000, FloatBits::kF32), 3);
  // Largest finite values are not flagged.
  std::vector<float> mx(300, std::numeric_limits<float>::max());
  EXPECT_EQ(first_nonfinite(mx.data(), 300, FloatBits::kF32), -1);
  // fp16: 0x7bff is 65504 (finite), 0x7c00 Inf, 0xfe00 a NaN; bf16: 0x7f7f finite, 0x7f80 Inf.
  std::vector<uint16_t> h(513, 0x7bff);
  EXPECT_EQ(first_nonfinite(h.data(), 513, FloatBits::kF16), -1);
  h[512] = 0xfe00;
  EXPECT_EQ(first_nonfinite(h.data(), 513, FloatBits::kF16), 512);
  std::vector<uint16_t> b(10, 0x7f7f);
  EXPECT_EQ(first_nonfinite(b.data(), 10, FloatBits::kBF16), -1);
  b[1] = 0x7f80;
  EXPECT_EQ(first_nonfinite(b.data(), 10, FloatBits::kBF16), 1);
  // Unaligned data (a safetensors tensor may start at any byte offset).
  std::vector<unsigned char> raw(4 * 5 + 1, 0);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(raw.data() + 1 + 4 * 4, &inf, 4);
  EXPECT_EQ(first_nonfinite(raw.data() + 1, 5, FloatBits::kF32), 4);
}

TEST(ResultsDbIntegrity, DamagedPagesFailQuickCheckNamingTheFile) {
  const std::string dir = ptest::scratch_dir("dbcheck");
  const std::string path = dir + "/r.sqlite";
  {
    ResultsDb db(path);
    // Enough sample rows to span many pages, so that damage can land in a data page.
    for (int r = 0; r < 4; ++r) {
      json config = {{"method", "m"}, {"variant", r}};
      RunSpec spec;
      spec.config_json = canonical_json(config);
      spec.config_hash = config_hash(config);
      spec.method = "m";
      spec.model = "x";
      spec.dataset = "d";
      spec.protocol = "stream";
      spec.provenance_json = "{}";
      const int64_t id = db.begin_run(spec).id;
      for (int i = 0; i < 200; ++i)
        db.add_sample(id, i, "k" + std::to_string(i),
                      json{{"text", std::string(200, 'a' + i % 26)}}.dump());
    }
    db.check_integrity();  // a sound file passes
  }
  // Fold the WAL into the file so that the damage below is what a reader sees.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  std::string bytes = ptest::read_bytes(path);
  const size_t page = 4096;
  ASSERT_GT(bytes.size(), 20 * page);
  // Garble a page in the middle of the sample table (not page 1: the schema must still read).
  for (size_t i = 10 * page; i < 10 * page + 64; ++i) bytes[i] = static_cast<char>(0xA5);
  ptest::write_bytes(dir, "r.sqlite", bytes);
  ResultsDb db(path);
  expect_kvb_error([&] { db.check_integrity(); }, {path, "fails PRAGMA quick_check", "damaged"});
}

// Found by fuzz_hf_config: a number too large for a double is nlohmann's out_of_range, not a
// parse_error, and escaped every loader as an internal error.
TEST(FuzzRegressions, NumberOverflowIsAKvbErrorNamingTheSource) {
  expect_kvb_error([] { parse_json(R"({"hidden_size": 1e4056})", "config.json"); },
                   {"config.json", "not valid JSON", "overflow"});
  expect_kvb_error([] { parse_hf_config(R"({"hidden_size": -1e400})", "c/config.json"); },
                   {"c/config.json", "not valid JSON"});
  json out;
  EXPECT_FALSE(parse_json_if_valid("1e400", "--set", &out));  // a bare word, as syntax errors are
}

// Found by fuzz_set_grammar: a bare-word value with invalid UTF-8 became a JSON string that
// nlohmann then refused to dump (an uncaught type_error when the config was hashed or printed).
TEST(FuzzRegressions, SetRefusesInvalidUtf8) {
  json config = json::object();
  expect_kvb_error([&] { apply_overrides(config, {"label=caf\xe9"}); },
                   {"--set", "not valid UTF-8", "byte 9"});
  expect_kvb_error([&] { apply_overrides(config, {"a\xc0\xaf=1"}); },
                   {"not valid UTF-8", "byte 1"});  // overlong
  expect_kvb_error([&] { apply_overrides(config, {"x=\xed\xa0\x80"}); },
                   {"not valid UTF-8"});  // surrogate
  expect_kvb_error([&] { apply_overrides(config, {"x=\xf0\x9f\x98"}); },
                   {"not valid UTF-8"});  // truncated
  apply_overrides(config, {"label=caf\xc3\xa9 \xf0\x9f\x98\x80", "method.params.budget=0.5"});
  EXPECT_EQ(config["label"], "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(config["method"]["params"]["budget"], 0.5);
  EXPECT_NO_THROW((void)config.dump());
}

// A dotted key nests the config one level per component: 100,000 of them overflowed the stack
// when the config was printed or freed. The bound is JSON's nesting depth, named in the message
// (with the key cut short).
TEST(KeyPaths, ComponentsAreBoundedByTheJsonDepth) {
  std::string deep = "protocol";
  for (int k = 0; k < 100000; ++k) deep += ".a";
  json config = json::object();
  const std::string msg =
      expect_kvb_error([&] { apply_overrides(config, {deep + "=1"}); },
                       {"--set: the key 'protocol.a.a", "100001 components", "more than the 128"});
  EXPECT_LT(msg.size(), 400u);
  EXPECT_TRUE(config.empty());
  expect_kvb_error([&] { split_key_path(deep, "grid.axes"); }, {"grid.axes: the key"});
  expect_kvb_error([&] { split_key_path("a..b", "grid.exclude[0]"); },
                   {"grid.exclude[0]: 'a..b' has an empty component"});
  std::string ok = "a";
  for (size_t k = 1; k < kMaxKeyPathComponents; ++k) ok += ".a";
  EXPECT_EQ(split_key_path(ok, "--set").size(), kMaxKeyPathComponents);
  apply_overrides(config, {ok + "=1"});
  EXPECT_NO_THROW((void)config.dump());
}

}  // namespace
}  // namespace kvb
