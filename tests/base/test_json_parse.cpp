// The depth-limited JSON parse every loader uses: documents at the limit parse, one level deeper is
// refused with the source named before anything recursive sees it, syntax errors name the source, and
// the loaders that take user files (run config, model config.json, JSONL lines, safetensors headers)
// refuse a deeply nested file with one line instead of overflowing the stack.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/jsonl.h"
#include "harness/formats/model_config.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;

std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(JsonParse, DepthLimitIsExact) {
  EXPECT_TRUE(parse_json(nested_arrays(kMaxJsonDepth), "doc").is_array());
  expect_kvb_error([] { parse_json(nested_arrays(kMaxJsonDepth + 1), "doc.json"); },
                   {"doc.json", "nested deeper than 128 levels"});
  // Objects count the same as arrays.
  std::string obj;
  for (int i = 0; i < kMaxJsonDepth + 1; ++i) obj += "{\"a\":";
  obj += "1" + std::string(kMaxJsonDepth + 1, '}');
  expect_kvb_error([&] { parse_json(obj, "obj.json"); }, {"obj.json", "nested deeper"});
  EXPECT_EQ(parse_json("[[1]]", "x", 2), nlohmann::json::parse("[[1]]"));
  expect_kvb_error([] { parse_json("[[[1]]]", "x", 2); }, {"x", "deeper than 2"});
}

TEST(JsonParse, HostileNestingIsRefusedWithoutRecursing) {
  // A million levels: the parse stops at the limit; nothing deep is built, destroyed or dumped.
  const std::string deep = nested_arrays(1000000);
  expect_kvb_error([&] { parse_json(deep, "hostile.json"); }, {"hostile.json", "nested deeper"});
  nlohmann::json out;
  expect_kvb_error([&] { parse_json_if_valid(deep, "--set 'x=...'", &out); },
                   {"--set 'x=...'", "nested deeper"});
}

TEST(JsonParse, SyntaxErrorsNameTheSourceOrReportInvalid) {
  expect_kvb_error([] { parse_json("{\"a\": ", "cfg.json"); },
                   {"cfg.json: not valid JSON: ", "parse error"});
  nlohmann::json out = 7;
  EXPECT_FALSE(parse_json_if_valid("paged", "--set", &out));
  EXPECT_EQ(out, 7);  // untouched on a syntax error
  EXPECT_TRUE(parse_json_if_valid("[1, 2]", "--set", &out));
  EXPECT_EQ(out, nlohmann::json::parse("[1, 2]"));
}

TEST(JsonParse, LoadersRefuseDeepNesting) {
  const std::string deep = "{\"x\": " + nested_arrays(200000) + "}";
  expect_kvb_error([&] { parse_hf_config(deep, "model/config.json"); },
                   {"model/config.json", "nested deeper"});
  const std::string dir = ptest::scratch_dir("deepjson");
  const std::string path = ptest::write_bytes(dir, "data.jsonl", "{\"a\": 1}\n" + deep + "\n");
  expect_kvb_error([&] { read_jsonl(path, {}, [](const nlohmann::json&, size_t) {}); },
                   {path + ":2", "nested deeper"});
}

// A FIFO given where a file is expected is refused at once (opening it would wait for a writer
// forever), and a text file over the cap is refused before it is read.
TEST(TextFiles, FifoAndOversizedFilesAreRefusedAtOnce) {
  const std::string dir = ptest::scratch_dir("fifo");
  const std::string fifo = dir + "/pipe.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_kvb_error([&] { read_text_file(fifo); }, {fifo, "not a regular file"});
  expect_kvb_error([&] { MappedFile m(fifo); }, {fifo, "not a regular file"});
  expect_kvb_error([&] { read_jsonl(fifo, {}, [](const nlohmann::json&, size_t) {}); },
                   {fifo, "not a regular file"});
  expect_kvb_error([&] { read_text_file(dir); }, {dir, "not a regular file"});
  const std::string big = ptest::write_bytes(dir, "big.txt", std::string(4096, 'x'));
  EXPECT_EQ(read_text_file(big).size(), 4096u);
  expect_kvb_error([&] { read_text_file(big, 4095); }, {big, "4096 bytes, more than the 4095"});
  expect_kvb_error([&] { read_text_file(dir + "/none.txt"); }, {dir + "/none.txt", "cannot open"});
}

}  // namespace
}  // namespace kvb
