// Gemma's GGUF SentencePiece vocabulary against Hugging Face (scripts/gemma-tokenizer-reference.py:
// HF `tokenizers` on the tokenizer.json transformers' GemmaConverter builds from the vocabulary,
// checked there against SentencePiece itself). Control tokens written in the text (<start_of_turn>,
// <end_of_turn>, <bos>, ...) are single tokens, user-defined runs of newlines and tabs are atomic,
// and the rest is SentencePiece BPE with byte fallback and no dummy prefix. The toy vocabulary in
// Gemma's layout is committed, so CI checks it everywhere; the real Gemma 3 270M GGUF (an optional
// asset) is checked on the same fuzz set where it has been fetched.

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/asset_cache.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/formats/chat_template.h"
#include "harness/formats/tokenizer.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using Ids = std::vector<int64_t>;
using nlohmann::json;

std::string fixture(const std::string& name) {
  return std::string(KVB_TEST_FIXTURES) + "/tokenizers/" + name;
}

// How many of the fixture's strings kvbench encodes to exactly the reference ids; the first few
// that differ are reported.
size_t agreeing(const Tokenizer& t, const json& fx) {
  const auto strings = fx.at("strings").get<std::vector<std::string>>();
  const auto ids = fx.at("ids").get<std::vector<Ids>>();
  EXPECT_EQ(strings.size(), ids.size());
  size_t ok = 0, reported = 0;
  for (size_t k = 0; k < strings.size() && k < ids.size(); ++k) {
    const Ids got = t.encode(strings[k]);
    if (got == ids[k]) {
      ++ok;
    } else if (reported++ < 5) {
      ADD_FAILURE() << "string " << k << " " << json(strings[k]).dump() << ": got "
                    << json(got).dump() << ", HF " << json(ids[k]).dump();
    }
  }
  return ok;
}

// One user turn in Gemma's chat format, as kvbench's qa protocol renders it (BOS, then the
// template's segments around the message, each encoded alone) against Hugging Face's ids for the
// whole rendered string
// (`<bos><start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n`, as
// apply_chat_template(tokenize=True) tokenizes it).
void expect_chat_turns_match(const Tokenizer& t, const json& fx) {
  const ChatTemplate g = resolve_chat_template("gemma", "", "test");
  ASSERT_TRUE(g.bos);
  ASSERT_FALSE(fx.at("chat").empty());
  for (const json& c : fx.at("chat")) {
    std::vector<int64_t> ids = {t.bos_id()};
    for (int64_t id : encode_segments(t, g.user_open())) ids.push_back(id);
    for (int64_t id : t.encode(c.at("message").get<std::string>())) ids.push_back(id);
    for (int64_t id : encode_segments(t, g.user_close())) ids.push_back(id);
    EXPECT_EQ(ids, c.at("ids").get<Ids>()) << c.at("rendered").dump();
    // And the rendered string as one text, specials matched: the same ids.
    EXPECT_EQ(t.encode(c.at("rendered").get<std::string>()), c.at("ids").get<Ids>());
  }
}

TEST(TokenizerGgufGemma, ToyVocabularyMatchesHuggingFace) {
  const json fx = json::parse(read_text_file(fixture("toy_gemma.json")));
  const Tokenizer t(fixture("toy_gemma.gguf"));
  ASSERT_EQ(t.vocab_size(), fx.at("vocab_size").get<int64_t>());
  const size_t ok = agreeing(t, fx);
  std::cout << "toy Gemma GGUF vs HF tokenizers: " << ok << "/" << fx.at("strings").size() << "\n";
  EXPECT_EQ(ok, fx.at("strings").size());

  // The cases the fixture is about, spelled out: a chat turn's control tokens are single tokens,
  // a near miss is text, newline runs are one user-defined piece each.
  const int64_t sot = t.piece_id("<start_of_turn>"), eot = t.piece_id("<end_of_turn>");
  const int64_t nl = t.piece_id("\n"), nl3 = t.piece_id("\n\n\n");
  ASSERT_GE(sot, 0);
  ASSERT_GE(eot, 0);
  const Ids turn = t.encode("<start_of_turn>user\nhi<end_of_turn>\n");
  ASSERT_GE(turn.size(), 4u);
  EXPECT_EQ(turn.front(), sot);
  EXPECT_EQ(turn[turn.size() - 2], eot);
  EXPECT_EQ(turn.back(), nl);
  EXPECT_EQ(t.encode("<bos>"), (Ids{t.bos_id()}));
  EXPECT_EQ(t.encode("<bos>", /*add_bos=*/true), (Ids{t.bos_id(), t.bos_id()}));
  const Ids near = t.encode("<start_of_turn");
  EXPECT_GT(near.size(), 1u);
  for (int64_t id : near) EXPECT_NE(id, sot);
  EXPECT_EQ(t.encode("\n\n\n"), (Ids{nl3}));
  expect_chat_turns_match(t, fx);
}

// The real Gemma 3 270M vocabulary (262,144 pieces), where the asset has been fetched.
TEST(TokenizerGgufGemma, Gemma3_270MMatchesHuggingFace) {
  const std::string path =
      kvb_asset_cache_dir() + "/models/gemma-3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf";
  if (!file_exists(path))
    GTEST_SKIP() << path << " not fetched (KVB_FETCH_GEMMA3=1 scripts/fetch-assets.sh)";
  const json fx = json::parse(read_text_file(fixture("gemma3_gguf.json")));
  EXPECT_EQ(sha256_file_hex(path), fx.at("sha256").get<std::string>());
  const Tokenizer t(path);
  EXPECT_EQ(t.vocab_size(), 262144);
  EXPECT_EQ(t.encode("<start_of_turn>"), (Ids{105}));
  EXPECT_EQ(t.encode("<end_of_turn>"), (Ids{106}));
  expect_chat_turns_match(t, fx);
  const size_t ok = agreeing(t, fx);
  std::cout << "Gemma 3 270M GGUF vs HF tokenizers: " << ok << "/" << fx.at("strings").size()
            << "\n";
  EXPECT_EQ(ok, fx.at("strings").size());
}

}  // namespace
}  // namespace kvb
