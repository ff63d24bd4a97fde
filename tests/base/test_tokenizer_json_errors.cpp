// Bad tokenizer.json files: every defect is a kvb::Error naming the file and the field, never a
// crash (this binary runs under ASan + UBSan). The base file is the script-built toy tokenizer
// (tests/fixtures/tokenizers/toy.json), mutated one field at a time, then byte by byte at random.

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/tokenizer.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using json = nlohmann::json;

json toy() {
  return json::parse(
      read_text_file(std::string(KVB_TEST_FIXTURES) + "/tokenizers/toy.json"))["tokenizer"];
}

// Writes `doc` as tokenizer.json, loads it, and expects a kvb::Error whose message names the file
// and contains `field`.
void expect_error(const std::string& text, const std::string& field) {
  const std::string dir = ptest::scratch_dir("tokjson_err");
  const std::string path = ptest::write_bytes(dir, "tokenizer.json", text);
  try {
    const Tokenizer tok(path);
    ADD_FAILURE() << "no error; expected one naming '" << field << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(field), std::string::npos) << "want '" << field << "' in: " << msg;
  }
}
void expect_error(const json& doc, const std::string& field) { expect_error(doc.dump(), field); }

TEST(TokenizerJsonErrors, TheToyLoads) {
  const std::string dir = ptest::scratch_dir("tokjson_ok");
  const Tokenizer tok(ptest::write_bytes(dir, "tokenizer.json", toy().dump()));
  EXPECT_EQ(tok.vocab_size(), 276);
}

TEST(TokenizerJsonErrors, UnknownComponents) {
  json d = toy();
  d["model"]["type"] = "Unigram";
  expect_error(d, "model.type 'Unigram'");
  d = toy();
  d["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}};
  expect_error(d, "pre_tokenizer.pretokenizers[0].type 'Whitespace'");
  d = toy();
  d["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "\\w+|[^\\w\\s]+"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  expect_error(d, "pre_tokenizer.pattern.Regex '\\w+|[^\\w\\s]+' is not one kvbench implements");
  d["pre_tokenizer"]["pattern"] = {{"String", " "}};
  expect_error(d, "pre_tokenizer.pattern: only a {\"Regex\": ...}");
  d = toy();
  d["normalizer"]["normalizers"][0]["type"] = "NFKC";
  expect_error(d, "normalizer.normalizers[0].type 'NFKC'");
  d = toy();
  d["decoder"] = {{"type", "WordPiece"}};
  expect_error(d, "decoder.type 'WordPiece'");
  d = toy();
  d["decoder"] = nullptr;
  expect_error(d, "decoder is null");
  d = toy();
  d["post_processor"] = {{"type", "Unknown"}};
  expect_error(d, "post_processor.type 'Unknown'");
  d = toy();
  d["model"]["dropout"] = 0.1;
  expect_error(d, "model.dropout");
  d = toy();
  d["model"]["continuing_subword_prefix"] = "##";
  expect_error(d, "model.continuing_subword_prefix");
}

// Each ByteLevel step maps every byte to a character of up to two bytes: chained, they double the
// text per step (30 of them: a gigabyte per input byte). A second one is refused naming the file
// and the step, and so is a sequence of more steps than any real file chains.
TEST(TokenizerJsonErrors, ChainedByteLevelAndEndlessSequencesAreRefused) {
  json d = toy();
  json& steps = d["pre_tokenizer"]["pretokenizers"];
  for (int k = 0; k < 30; ++k) steps.push_back(steps[1]);
  expect_error(d, "pre_tokenizer.pretokenizers[2]: a second ByteLevel pre-tokenizer");
  d = toy();
  json nested = d["pre_tokenizer"];  // a ByteLevel inside a nested Sequence counts too
  d["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {nested, nested}}};
  expect_error(d, "pre_tokenizer.pretokenizers[1].pretokenizers[1]: a second ByteLevel");
  d = toy();
  json digits = d["pre_tokenizer"]["pretokenizers"][0];
  for (int k = 0; k < 100; ++k) d["pre_tokenizer"]["pretokenizers"].push_back(digits);
  expect_error(d, "more than 64 pre-tokenizer steps");
}

TEST(TokenizerJsonErrors, BadVocabularyAndMerges) {
  json d = toy();
  d["model"].erase("merges");
  expect_error(d, "model.merges is missing");
  d = toy();
  d["model"]["merges"][0] = json::array({"zz-not-a-token", "t"});
  expect_error(d, "model.merges[0] ('zz-not-a-token' 't') names a token not in model.vocab");
  d = toy();
  d["model"]["merges"][1] = json::array({"a", "b"});  // "ab" is not a token
  expect_error(d, "model.merges[1] ('a' 'b') makes 'ab', which is not in model.vocab");
  d = toy();
  d["model"]["merges"][0] = "a b c";
  expect_error(d, "model.merges[0] 'a b c' is not two tokens separated by one space");
  d = toy();
  d["model"]["merges"][0] = 7;
  expect_error(d, "model.merges[0] is neither");
  d = toy();
  d["model"]["vocab"]["a"] = 99999;
  expect_error(d, "model.vocab['a'] = 99999 is outside [0, 270)");
  d = toy();
  d["model"]["vocab"]["a"] = 98;  // "b" has 98 too
  expect_error(d, "model.vocab: id 98 is given to two tokens");
  d = toy();
  d["model"]["vocab"]["a"] = -1;
  expect_error(d, "model.vocab['a'] = -1 is outside");
  d = toy();
  d["model"]["vocab"]["a"] = "x";
  expect_error(d, "model.vocab['a'] is not an integer id");
  d = toy();
  d["model"]["vocab"] = json::object();
  expect_error(d, "model.vocab is empty");
  // A token written twice: JSON keeps one key, so the ids no longer number the vocabulary densely.
  expect_error(
      std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "a": 1, "b": 2}, "merges": []}})"),
      "model.vocab['b'] = 2 is outside [0, 2)");
  d = toy();
  d["model"]["unk_token"] = "<nope>";
  expect_error(d, "model.unk_token '<nope>' is not in model.vocab");
}

TEST(TokenizerJsonErrors, BadAddedTokens) {
  json d = toy();
  d["added_tokens"][0]["id"] = int64_t{1} << 40;  // would be a terabyte table
  expect_error(d, "added_tokens[0].id = 1099511627776 is outside [0, 4194304)");
  d = toy();
  d["added_tokens"][0]["id"] = 1000;  // leaves 270 (its old id) and 276..999 without a token
  expect_error(d, "token id 270 has no token");
  d = toy();
  d["added_tokens"][0]["id"] = 3;  // vocab id 3 is another token
  expect_error(d, "added_tokens: id 3 is '<s>' but model.vocab has");
  d = toy();
  d["added_tokens"][1]["content"] = "<s>";
  expect_error(d, "added_tokens: '<s>' (id 271) duplicates token 270");
  d = toy();
  d["added_tokens"][0]["content"] = "";
  expect_error(d, "has empty content");
  d = toy();
  d["added_tokens"][0]["lstrip"] = "yes";
  expect_error(d, "added_tokens[0].lstrip is not a boolean");
  d = toy();
  d["post_processor"]["special_tokens"]["<s>"]["ids"] = json::array({1, 2});
  expect_error(d, "post_processor.special_tokens.<s>.ids must hold exactly one id");
}

TEST(TokenizerJsonErrors, NotJsonMissingAndSideFiles) {
  expect_error(std::string("{\"model\": {\"type\": \"BPE\""), "not valid JSON");
  expect_error(std::string("[]"), "the top level is not an object");
  expect_error(std::string("{}"), "(top level).model is missing");
  EXPECT_THROW(Tokenizer("/nonexistent/dir/tokenizer.json"), Error);
  const std::string dir = ptest::scratch_dir("tokjson_cfg");
  const std::string path = ptest::write_bytes(dir, "tokenizer.json", toy().dump());
  ptest::write_bytes(dir, "tokenizer_config.json", "{\"eos_token\": \"<missing>\"}");
  try {
    const Tokenizer tok(path);
    ADD_FAILURE() << "no error for an eos_token that is no token";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token '<missing>'"),
              std::string::npos)
        << e.what();
  }
  ptest::write_bytes(dir, "tokenizer_config.json",
                     "{\"eos_token\": {\"content\": \"<mask>\"}, \"chat_template\": \"{{ x }}\"}");
  const Tokenizer tok(path);
  EXPECT_EQ(tok.eos_id(), 271);
  EXPECT_EQ(tok.chat_template(), "{{ x }}");
  EXPECT_THROW(tok.decode({276}), Error);
  EXPECT_THROW(tok.piece(-1), Error);
}

// Random byte edits of a valid file: each load either succeeds (and then encodes and decodes
// without error) or throws kvb::Error; anything else (a crash, another exception type) fails.
TEST(TokenizerJsonErrors, FuzzCorruptFilesNeverCrash) {
  const std::string base = toy().dump();
  const std::string dir = ptest::scratch_dir("tokjson_fuzz");
  std::mt19937 rng(1234);
  int loaded = 0, refused = 0;
  for (int it = 0; it < 300; ++it) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[at] = static_cast<char>(rng() & 0xFF);
          break;
        case 1:
          s.erase(at, 1 + rng() % 8);
          break;
        default:
          s.insert(at, 1, "{}[]\",:0-9 \\"[rng() % 13]);
          break;
      }
    }
    const std::string path = ptest::write_bytes(dir, "tokenizer.json", s);
    try {
      const Tokenizer tok(path);
      const auto ids = tok.encode("Hello <mask> world 123 <s>the\n\n  café");
      (void)tok.decode(ids);
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_EQ(loaded + refused, 300);
  EXPECT_GT(refused, 100);  // most edits break the JSON or a field
}

}  // namespace
}  // namespace kvb
