// GGUF tokenizers (tokenizer_gguf.cpp): SmolLM2's GGUF vocabulary gives the ids its tokenizer.json
// gives (the HF fuzz fixture and the README ids); a "llama" vocabulary written from the Llama 2
// tokenizer.model encodes as the SentencePiece backend does; unknown models and pre-tokenizer names
// are refused naming the key.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/tokenizer.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using Ids = std::vector<int64_t>;

std::string smollm2_gguf() {
  return ptest::models_dir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// A metadata-only GGUF v3 file (no tensors), written by hand so one key can be wrong.
struct GgufWriter {
  std::string kv;
  uint64_t n = 0;
  static void u32(uint32_t v, std::string* o) { o->append(reinterpret_cast<const char*>(&v), 4); }
  static void u64(uint64_t v, std::string* o) { o->append(reinterpret_cast<const char*>(&v), 8); }
  static void str(const std::string& s, std::string* o) {
    u64(s.size(), o);
    *o += s;
  }
  void key(const std::string& k, uint32_t type) {
    str(k, &kv);
    u32(type, &kv);
    ++n;
  }
  void s(const std::string& k, const std::string& v) { key(k, 8), str(v, &kv); }
  void b(const std::string& k, bool v) { key(k, 7), kv += static_cast<char>(v ? 1 : 0); }
  void u(const std::string& k, uint32_t v) { key(k, 4), u32(v, &kv); }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    u32(8, &kv);
    u64(v.size(), &kv);
    for (const auto& x : v) str(x, &kv);
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9);
    u32(5, &kv);
    u64(v.size(), &kv);
    for (int32_t x : v) kv.append(reinterpret_cast<const char*>(&x), 4);
  }
  void f32s(const std::string& k, const std::vector<float>& v) {
    key(k, 9);
    u32(6, &kv);
    u64(v.size(), &kv);
    for (float x : v) kv.append(reinterpret_cast<const char*>(&x), 4);
  }
  std::string bytes() const {
    std::string o = "GGUF";
    u32(3, &o);
    u64(0, &o);
    u64(n, &o);
    return o + kv;
  }
};

void expect_error(const std::string& path, const std::string& field) {
  try {
    const Tokenizer tok(path);
    ADD_FAILURE() << "no error; expected one naming '" << field << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(field), std::string::npos) << "want '" << field << "' in: " << msg;
  }
}

TEST(TokenizerGguf, SmolLM2MatchesItsTokenizerJson) {
  ASSERT_TRUE(file_exists(smollm2_gguf())) << smollm2_gguf() << " missing";
  const Tokenizer g(smollm2_gguf());
  EXPECT_EQ(g.kind(), "gguf:bpe-byte-level");
  EXPECT_EQ(g.vocab_size(), 49152);
  EXPECT_FALSE(g.add_bos());
  EXPECT_EQ(g.bos_id(), 1);
  EXPECT_EQ(g.eos_id(), 2);
  EXPECT_EQ(g.special_ids().size(), 17u);
  EXPECT_EQ(g.chat_template().rfind("{% for message in messages %}", 0), 0u) << g.chat_template();
  EXPECT_EQ(g.encode("One day, a clever fox found a shiny key under the old oak tree."),
            (Ids{2705, 1194, 28, 253, 15355, 16438, 983, 253, 20581, 1646, 656, 260, 1573, 16033,
                 3187, 30}));
  const auto fx = nlohmann::json::parse(
      read_text_file(std::string(KVB_TEST_FIXTURES) + "/tokenizers/fuzz.json"));
  const auto strings = fx["strings"].get<std::vector<std::string>>();
  const auto want = fx["ids"]["smollm2"].get<std::vector<Ids>>();
  size_t ok = 0;
  for (size_t k = 0; k < strings.size(); ++k) ok += g.encode(strings[k]) == want[k];
  std::cout << "SmolLM2 GGUF vs HF tokenizers on the fuzz fixture: " << ok << "/" << strings.size()
            << "\n";
  EXPECT_EQ(ok, strings.size());
}

TEST(TokenizerGguf, LlamaVocabularyEncodesAsSentencePiece) {
  const std::string model = ptest::models_dir() + "/llama2-tokenizer/tokenizer.model";
  const SentencePieceModel sp(model);
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int64_t id = 0; id < sp.vocab_size(); ++id) {
    tokens.push_back(sp.piece(id));
    scores.push_back(sp.score(id));
    types.push_back(static_cast<int32_t>(sp.type(id)));
  }
  GgufWriter w;
  w.s("general.architecture", "llama");
  w.s("tokenizer.ggml.model", "llama");
  w.strings("tokenizer.ggml.tokens", tokens);
  w.f32s("tokenizer.ggml.scores", scores);
  w.i32s("tokenizer.ggml.token_type", types);
  w.u("tokenizer.ggml.bos_token_id", 1);
  w.u("tokenizer.ggml.eos_token_id", 2);
  w.u("tokenizer.ggml.unknown_token_id", 0);
  w.b("tokenizer.ggml.add_bos_token", true);
  w.s("tokenizer.chat_template", "{{ bos_token }}");
  const std::string dir = ptest::scratch_dir("tok_gguf");
  const Tokenizer g(ptest::write_bytes(dir, "llama.gguf", w.bytes()));
  const Tokenizer ref(model);
  EXPECT_EQ(g.kind(), "gguf:sentencepiece");
  EXPECT_TRUE(g.add_bos());
  EXPECT_EQ(g.chat_template(), "{{ bos_token }}");
  std::string book =
      read_text_file(ptest::data_dir() + "/tinystories-valid-sample/tinystories_val.txt");
  book.resize(std::min<size_t>(book.size(), 20000));
  for (const std::string& t :
       {book, std::string("  two leading spaces, naïve café 🦙"), std::string()})
    EXPECT_EQ(g.encode(t), ref.encode(t));
  EXPECT_EQ(g.encode("Hi", true), (Ids{1, 6324}));
}

// A Gemma-style "llama" vocabulary: <unk> is typed control, BOS/EOS are <bos>/<eos> at ids 2/1, and
// add_space_prefix is false. The unknown, BOS and EOS tokens come from the id keys (as llama.cpp
// takes them), and no dummy "▁" is prepended, so "Hi Hi" starts with "Hi", not "▁Hi".
TEST(TokenizerGguf, GemmaStyleVocabularyTakesSpecialIdsFromTheKeys) {
  auto gemma = [](uint32_t bos) {
    GgufWriter w;
    w.s("general.architecture", "gemma3");
    w.s("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>", "<unk>", "\xE2\x96\x81", "H",
                                        "i", "Hi", "\xE2\x96\x81H", "\xE2\x96\x81Hi"});
    w.f32s("tokenizer.ggml.scores", {0, 0, 0, 0, -10, -10, -10, -1, -2, -3});
    w.i32s("tokenizer.ggml.token_type", {3, 3, 3, 3, 1, 1, 1, 1, 1, 1});
    w.u("tokenizer.ggml.bos_token_id", bos);
    w.u("tokenizer.ggml.eos_token_id", 1);
    w.u("tokenizer.ggml.unknown_token_id", 3);
    w.u("tokenizer.ggml.padding_token_id", 0);
    w.b("tokenizer.ggml.add_bos_token", true);
    w.b("tokenizer.ggml.add_space_prefix", false);
    return w;
  };
  const std::string dir = ptest::scratch_dir("tok_gguf_gemma");
  const Tokenizer t(ptest::write_bytes(dir, "gemma.gguf", gemma(2).bytes()));
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.unk_id(), 3);
  EXPECT_EQ(t.encode("Hi Hi"), (Ids{7, 9}));
  EXPECT_EQ(t.encode("Hi Hi", true), (Ids{2, 7, 9}));
  EXPECT_EQ(t.encode("Hx"), (Ids{5, 3}));  // no byte pieces: an unknown character is <unk>
  EXPECT_EQ(t.decode({2, 7, 9, 1}, true), "Hi Hi");

  // BOS must be a control token, as llama.cpp's vocabulary types it.
  expect_error(ptest::write_bytes(dir, "bos.gguf", gemma(7).bytes()), "is not a control token");
}

TEST(TokenizerGguf, RefusesUnknownModelsAndPreTokenizers) {
  const std::string dir = ptest::scratch_dir("tok_gguf_bad");
  auto gpt2 = [](const std::string& pre) {
    GgufWriter w;
    w.s("tokenizer.ggml.model", "gpt2");
    if (!pre.empty()) w.s("tokenizer.ggml.pre", pre);
    w.strings("tokenizer.ggml.tokens", {"a", "b", "ab"});
    w.strings("tokenizer.ggml.merges", {"a b"});
    return w;
  };
  expect_error(ptest::write_bytes(dir, "default.gguf", gpt2("default").bytes()),
               "tokenizer.ggml.pre 'default' is not supported");
  expect_error(ptest::write_bytes(dir, "nopre.gguf", gpt2("").bytes()),
               "tokenizer.ggml.pre is missing");
  GgufWriter bert;
  bert.s("tokenizer.ggml.model", "bert");
  expect_error(ptest::write_bytes(dir, "bert.gguf", bert.bytes()), "tokenizer.ggml.model 'bert'");
  GgufWriter types = gpt2("smollm");
  types.i32s("tokenizer.ggml.token_type", {1, 1});
  expect_error(ptest::write_bytes(dir, "types.gguf", types.bytes()),
               "tokenizer.ggml.token_type has 2 entries for 3 tokens");
  GgufWriter merge;
  merge.s("tokenizer.ggml.model", "gpt2");
  merge.s("tokenizer.ggml.pre", "gpt-2");
  merge.strings("tokenizer.ggml.tokens", {"a", "b"});
  merge.strings("tokenizer.ggml.merges", {"a b"});
  expect_error(ptest::write_bytes(dir, "merge.gguf", merge.bytes()),
               "tokenizer.ggml.merges[0] ('a' 'b') makes 'ab'");
  GgufWriter ok = gpt2("smollm");
  const Tokenizer t(ptest::write_bytes(dir, "ok.gguf", ok.bytes()));
  EXPECT_EQ(t.encode("ab"), (Ids{2}));
  EXPECT_EQ(t.decode({2, 0}), "aba");
}

}  // namespace
}  // namespace kvb
