// Tokenizer backends for tokenizer.json (byte-level BPE: Llama 3, Qwen2, SmolLM2) against reference
// ids: llama.cpp's 46 vocab test strings (ids produced by HF `tokenizers`,
// add_special_tokens=False), SmolLM2's README/reference.json ids, and the fuzz fixture
// scripts/tokenizer-reference.py writes from HF `tokenizers` (tests/fixtures/tokenizers/). Decoding
// round trips; the facade's dispatch.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/tokenizer.h"
#include "harness/formats/unicode_text.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using Ids = std::vector<int64_t>;

std::string llama3_json() {
  return ptest::models_dir() + "/llama3-qwen2-tokenizers/llama3/tokenizer.json";
}
std::string qwen2_json() {
  return ptest::models_dir() + "/llama3-qwen2-tokenizers/qwen2/tokenizer.json";
}
std::string smollm2_json() { return ptest::models_dir() + "/smollm2-135m-instruct/tokenizer.json"; }
std::string vocab_tests(const std::string& name) {
  return ptest::models_dir() + "/llama3-qwen2-tokenizers/llama.cpp-vocab-tests/ggml-vocab-" + name;
}

// One parse per file per test binary: the Llama 3 file is 9 MB of JSON.
const Tokenizer& cached(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[path];
  if (!slot) slot = std::make_unique<Tokenizer>(path);
  return *slot;
}

// llama.cpp's test-tokenizer-0 format: strings each followed by "\n__ggml_vocab_test__\n"; one line
// of space-separated ids per string in the .out.
std::vector<std::string> read_inp(const std::string& path) {
  const std::string text = read_text_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t at; (at = text.find(sep, pos)) != std::string::npos; pos = at + sep.size())
    out.push_back(text.substr(pos, at - pos));
  return out;
}
std::vector<Ids> read_out(const std::string& path) {
  std::istringstream in(read_text_file(path));
  std::vector<Ids> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    Ids ids;
    for (int64_t x; ls >> x;) ids.push_back(x);
    out.push_back(ids);
  }
  return out;
}

std::string show(const Ids& ids) {
  std::string s;
  for (int64_t x : ids) s += std::to_string(x) + " ";
  return s;
}

// Exact matches of `tok` on llama.cpp's strings; reports each mismatch.
size_t agree_with_vocab_tests(const Tokenizer& tok, const std::string& name, size_t* total) {
  const auto inp = read_inp(vocab_tests(name + ".gguf.inp"));
  const auto out = read_out(vocab_tests(name + ".gguf.out"));
  EXPECT_EQ(inp.size(), 46u);
  EXPECT_EQ(out.size(), inp.size());
  size_t ok = 0;
  for (size_t k = 0; k < inp.size() && k < out.size(); ++k) {
    const Ids got = tok.encode(inp[k]);
    if (got == out[k])
      ++ok;
    else
      ADD_FAILURE() << name << " string " << k << " '" << inp[k] << "'\n  want " << show(out[k])
                    << "\n  got  " << show(got);
  }
  *total = inp.size();
  return ok;
}

TEST(TokenizerJson, Llama3MatchesLlamaCppVocabTests) {
  ASSERT_TRUE(file_exists(llama3_json())) << llama3_json() << " missing";
  const Tokenizer& tok = cached(llama3_json());
  size_t total = 0;
  const size_t ok = agree_with_vocab_tests(tok, "llama-bpe", &total);
  std::cout << "llama3 tokenizer.json vs ggml-vocab-llama-bpe: " << ok << "/" << total << "\n";
  EXPECT_EQ(ok, total);
  EXPECT_EQ(tok.encode(" Hello world"), (Ids{22691, 1917}));
}

TEST(TokenizerJson, Qwen2MatchesLlamaCppVocabTests) {
  ASSERT_TRUE(file_exists(qwen2_json())) << qwen2_json() << " missing";
  const Tokenizer& tok = cached(qwen2_json());
  size_t total = 0;
  const size_t ok = agree_with_vocab_tests(tok, "qwen2", &total);
  std::cout << "qwen2 tokenizer.json vs ggml-vocab-qwen2: " << ok << "/" << total << "\n";
  EXPECT_EQ(ok, total);
  EXPECT_EQ(tok.encode(" Hello world"), (Ids{21927, 1879}));
}

// THE FUZZ ORACLE: HF `tokenizers`' ids for 300 seeded strings (unicode blocks, whitespace runs,
// digits, code, CJK, emoji, combining marks for NFC, special tokens in the text), per tokenizer.
TEST(TokenizerJson, MatchesHfTokenizersOnFuzzFixture) {
  const auto fx = nlohmann::json::parse(
      read_text_file(std::string(KVB_TEST_FIXTURES) + "/tokenizers/fuzz.json"));
  const auto strings = fx["strings"].get<std::vector<std::string>>();
  ASSERT_GE(strings.size(), 300u);
  const std::map<std::string, std::string> paths = {
      {"llama3", llama3_json()}, {"qwen2", qwen2_json()}, {"smollm2", smollm2_json()}};
  for (const auto& [name, path] : paths) {
    ASSERT_TRUE(file_exists(path)) << path << " missing";
    const Tokenizer& tok = cached(path);
    const auto want = fx["ids"][name].get<std::vector<Ids>>();
    ASSERT_EQ(want.size(), strings.size());
    size_t ok = 0, round = 0;
    for (size_t k = 0; k < strings.size(); ++k) {
      const Ids got = tok.encode(strings[k]);
      if (got == want[k])
        ++ok;
      else if (ok + 5 > k)
        ADD_FAILURE() << name << " string " << k << " '" << strings[k] << "'\n  want "
                      << show(want[k]) << "\n  got  " << show(got);
      // Qwen2 normalizes to NFC, so its round trip gives the NFC form of the text.
      if (tok.decode(got) == (name == "qwen2" ? uni_nfc(strings[k]) : strings[k])) ++round;
    }
    std::cout << name << " vs HF tokenizers " << fx["tokenizers_version"].get<std::string>() << ": "
              << ok << "/" << strings.size() << " exact, " << round << " decode round trips\n";
    EXPECT_EQ(ok, strings.size()) << name;
    EXPECT_EQ(round, strings.size()) << name;
  }
}

// A small tokenizer.json built by the script (toy.json) with what the real files lack: lstrip,
// rstrip, single_word and normalized added tokens, Digits runs, ByteLevel with add_prefix_space and
// its own regex, [a, b] merges, a TemplateProcessing BOS; HF's ids, BOS ids and decoded text.
TEST(TokenizerJson, ToyTokenizersMatchHfTokenizers) {
  // toy.json: byte-level; toy_spm.json: SentencePiece-style (Prepend + Replace, byte fallback, a
  // normalized added token that tokenizers matches in its normalized form "\u2581<x>").
  for (const auto& [file, bos] :
       {std::pair<std::string, int64_t>{"toy.json", 270}, {"toy_spm.json", 1}}) {
    const auto fx = nlohmann::json::parse(
        read_text_file(std::string(KVB_TEST_FIXTURES) + "/tokenizers/" + file));
    const std::string dir = ptest::scratch_dir("toy_tok");
    const Tokenizer tok(ptest::write_bytes(dir, "tokenizer.json", fx["tokenizer"].dump()));
    EXPECT_TRUE(tok.add_bos());
    EXPECT_EQ(tok.bos_id(), bos);
    size_t ok = 0, n = 0;
    for (const auto& c : fx["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const Ids want = c["ids"].get<Ids>();
      const Ids got = tok.encode(text);
      const bool same = got == want && tok.encode(text, true) == c["ids_special"].get<Ids>() &&
                        tok.decode(want) == c["decoded"].get<std::string>();
      EXPECT_TRUE(same) << file << " '" << text << "'\n  want " << show(want) << "\n  got  "
                        << show(got) << "\n  decoded '" << tok.decode(want) << "' want '"
                        << c["decoded"].get<std::string>() << "'";
      ok += same;
      ++n;
    }
    std::cout << file << " vs HF tokenizers: " << ok << "/" << n << "\n";
    EXPECT_GE(n, 50u);
  }
}

TEST(TokenizerJson, SmolLM2ReferenceIds) {
  ASSERT_TRUE(file_exists(smollm2_json())) << smollm2_json() << " missing";
  const Tokenizer& tok = cached(smollm2_json());
  EXPECT_EQ(tok.encode("One day, a clever fox found a shiny key under the old oak tree."),
            (Ids{2705, 1194, 28, 253, 15355, 16438, 983, 253, 20581, 1646, 656, 260, 1573, 16033,
                 3187, 30}));
  EXPECT_EQ(tok.encode("The capital of France is"), (Ids{504, 3575, 282, 4649, 314}));
  // reference.json's ChatML prompt: the specials in the text become their ids.
  const auto ref = nlohmann::json::parse(
      read_text_file(ptest::models_dir() + "/smollm2-135m-instruct/reference.json"));
  const std::string prompt = ref["chat"]["prompt"].get<std::string>();
  const Ids want = ref["chat"]["prompt_ids"].get<Ids>();
  ASSERT_EQ(want.size(), 37u);
  EXPECT_EQ(tok.encode(prompt), want);
  EXPECT_EQ(tok.decode(want), prompt);
  // The generated continuations decode to the recorded text.
  EXPECT_EQ(tok.decode(ref["plain"]["out_ids"].get<Ids>()),
            ref["plain"]["text"].get<std::string>());
  EXPECT_EQ(tok.decode(ref["chat"]["out_ids"].get<Ids>()), ref["chat"]["text"].get<std::string>());
  EXPECT_EQ(tok.decode(ref["chat"]["out_ids"].get<Ids>(), /*skip_special=*/true),
            "The capital of France is Paris.");
}

TEST(TokenizerJson, SpecialsBosAndKinds) {
  const Tokenizer& l3 = cached(llama3_json());
  EXPECT_EQ(l3.kind(), "tokenizer.json:bpe-byte-level");
  EXPECT_EQ(l3.vocab_size(), 128256);
  EXPECT_TRUE(l3.add_bos());
  EXPECT_EQ(l3.bos_id(), 128000);
  EXPECT_EQ(l3.eos_id(), 128001);
  EXPECT_EQ(l3.unk_id(), -1);
  EXPECT_EQ(l3.special_ids().size(), 256u);
  EXPECT_TRUE(l3.is_special(128000));
  EXPECT_FALSE(l3.is_special(1917));
  EXPECT_EQ(l3.encode("Hi", /*add_special=*/true), (Ids{128000, 13347}));
  EXPECT_EQ(l3.encode("<|begin_of_text|>Hi"), (Ids{128000, 13347}));
  EXPECT_EQ(l3.piece(128001), "<|end_of_text|>");
  EXPECT_EQ(l3.piece_id("<|end_of_text|>"), 128001);
  EXPECT_EQ(l3.piece_id("\xC4\xA0world"), 1917);  // "Ġworld"
  EXPECT_EQ(l3.piece_id("no such token at all"), -1);
  EXPECT_THROW(l3.piece(128256), Error);
  EXPECT_THROW(l3.decode({-1}), Error);

  const Tokenizer& q = cached(qwen2_json());
  EXPECT_FALSE(q.add_bos());
  EXPECT_EQ(q.encode("Hi", true), q.encode("Hi"));
  EXPECT_EQ(q.special_ids(), (Ids{151643, 151644, 151645}));

  const Tokenizer& s = cached(smollm2_json());
  EXPECT_FALSE(s.add_bos());
  EXPECT_EQ(s.bos_id(), 1);  // config.json beside it: bos_token_id 1, eos_token_id 2
  EXPECT_EQ(s.eos_id(), 2);
  EXPECT_EQ(s.special_ids().size(), 17u);
}

TEST(TokenizerJson, DecodeRoundTrips) {
  const std::vector<std::string> texts = {
      "",
      " ",
      "Hello world",
      "  leading and trailing  ",
      "tabs\tand\nnew\r\nlines\n\n\n",
      "数字 12345 and ١٢٣ (Arabic-Indic)",
      "emoji 🦙🚀 and ZWJ 👩‍👩‍👧",
      "code: for (int i = 0; i < n; ++i) {}",
      "café naïve Ångström",
      "<|im_start|>user\nhi<|im_end|>",
      "'s 'S 'll 'LL don't I'M",
  };
  for (const std::string& path : {llama3_json(), qwen2_json(), smollm2_json()}) {
    const Tokenizer& tok = cached(path);
    for (const std::string& t : texts) EXPECT_EQ(tok.decode(tok.encode(t)), t) << path << ": " << t;
  }
}

TEST(TokenizerJson, InvalidUtf8BecomesReplacementCharacters) {
  // Defined behaviour: each byte that starts no valid UTF-8 character is U+FFFD (as the
  // SentencePiece backend and spm_encode do), so encoding invalid text equals encoding its
  // sanitized form.
  const Tokenizer& tok = cached(llama3_json());
  EXPECT_EQ(tok.encode("a\xFF"
                       "b\xC3"),
            tok.encode("a\xEF\xBF\xBD"
                       "b\xEF\xBF\xBD"));
  EXPECT_EQ(tok.decode(tok.encode("x\x80y")), "x\xEF\xBF\xBDy");
  // A byte token that is half of a character decodes lossily, one U+FFFD per maximal bad
  // subsequence.
  const Ids e = tok.encode("é");  // one token, bytes C3 A9
  ASSERT_EQ(e.size(), 1u);
  const Ids half = {tok.piece_id("\xC3\x83")};  // the GPT-2 character for byte C3
  EXPECT_EQ(tok.decode(half), "\xEF\xBF\xBD");
}

TEST(TokenizerJson, LongTextIsFast) {
  // 100 KB of a real book (Moby-Dick), cut at a line end, through each byte-level tokenizer.
  std::string text = read_text_file(ptest::data_dir() + "/gutenberg-long/moby_dick_pg2701.txt");
  text.resize(text.rfind('\n', 100000) + 1);
  for (const std::string& path : {llama3_json(), qwen2_json(), smollm2_json()}) {
    const Tokenizer& tok = cached(path);
    const auto t0 = std::chrono::steady_clock::now();
    const Ids ids = tok.encode(text);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cout << path << ": " << text.size() << " bytes -> " << ids.size() << " tokens in " << ms
              << " ms\n";
    EXPECT_LT(ms, 3000.0);  // under ASan+UBSan at -O1; a release build is several times faster
    EXPECT_GT(ids.size(), text.size() / 8);
    EXPECT_EQ(tok.decode(ids), text);
  }
}

}  // namespace
}  // namespace kvb
