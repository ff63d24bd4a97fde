// `kvbench tokenize` end to end: ids as JSON for a tokenizer file or a model's tokenizer (found
// without loading weights), decoding --ids, --special, and bad input as one error line with exit
// code 2.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::run_kvbench;

std::string smollm2_json() { return test::models_dir() + "/smollm2-135m-instruct/tokenizer.json"; }

void expect_one_line_error(const test::CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  const size_t at = r.err.find("kvbench: error: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n', at), r.err.size() - 1) << r.err;
  for (const auto& n : needles)
    EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
}

TEST(CliTokenize, EncodesWithATokenizerJson) {
  auto r =
      run_kvbench("tokenize --tokenizer " + smollm2_json() + " --text 'The capital of France is'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json::parse("[504, 3575, 282, 4649, 314]"));
  EXPECT_EQ(j["kind"], "tokenizer.json:bpe-byte-level");
  // Specials written in the text are split out; --special adds nothing for SmolLM2 (no BOS rule).
  r = run_kvbench("tokenize --special --tokenizer " + smollm2_json() +
                  " --text '<|im_start|>user'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json::parse("[1, 4093]"));
}

TEST(CliTokenize, SpecialAddsTheTokenizersBos) {
  const std::string l3 = test::models_dir() + "/llama3-qwen2-tokenizers/llama3/tokenizer.json";
  auto r = run_kvbench("tokenize --special --tokenizer " + l3 + " --text ' Hello world'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json::parse("[128000, 22691, 1917]"));
}

TEST(CliTokenize, DecodesIds) {
  auto r = run_kvbench("tokenize --tokenizer " + smollm2_json() + " --ids '1 4093 198 504 3575 2'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], "<|im_start|>user\nThe capital<|im_end|>");
  r = run_kvbench("tokenize --skip-special --tokenizer " + smollm2_json() +
                  " --ids '1 4093 198 504 3575 2'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], "user\nThe capital");
}

TEST(CliTokenize, ModelsTokenizerWithoutLoadingWeights) {
  auto r = run_kvbench("tokenize --model stories260K --models-dir " + test::models_dir() +
                       " --text 'Once upon a time, there was a little girl named Lily.'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"],
            nlohmann::json::parse(
                "[403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426]"));
  EXPECT_EQ(j["kind"], "sentencepiece");
  EXPECT_NE(j["tokenizer"].get<std::string>().find("tok512.model"), std::string::npos);
  r = run_kvbench("tokenize --model " + test::models_dir() + "/stories260K-hf --ids '403 407'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], "Once upon");
}

TEST(CliTokenize, BadInputIsOneErrorLine) {
  const std::string dir = test::make_temp_dir("tok_cli");
  { std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "WordPiece"}})"; }
  expect_one_line_error(run_kvbench("tokenize --tokenizer " + dir + "/tokenizer.json --text hi"),
                        {dir + "/tokenizer.json", "model.type 'WordPiece'"});
  expect_one_line_error(run_kvbench("tokenize --tokenizer " + smollm2_json() + " --ids '1 x'"),
                        {"--ids", "'x'"});
  expect_one_line_error(run_kvbench("tokenize --tokenizer " + smollm2_json() + " --ids '49152'"),
                        {smollm2_json(), "token id 49152 is outside the vocabulary"});
  expect_one_line_error(run_kvbench("tokenize --text hi"), {"--model or --tokenizer"});
  expect_one_line_error(run_kvbench("tokenize --model synthetic:tiny --text hi"), {"no tokenizer"});
  expect_one_line_error(run_kvbench("tokenize --tokenizer /no/such/tokenizer.json --text hi"),
                        {"/no/such/tokenizer.json", "not found"});
}

}  // namespace
}  // namespace kvb
