// The SentencePiece-style tokenizer.json (Llama 2 / Mistral / TinyLlama repositories: Prepend +
// Replace normalizer, BPE with byte_fallback and fuse_unk, Replace/ByteFallback/Fuse/Strip
// decoder). No such file is in ../shared, so the test writes one from the real Llama 2
// tokenizer.model exactly as transformers' LlamaConverter does (vocab in id order; merges from
// SentencePieceExtractor: every split of a piece into two pieces, ordered by the piece's score),
// then compares the BPE backend with the SentencePiece backend on real text and with llama.cpp's
// llama-spm vectors (HF ids).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/tokenizer.h"
#include "harness/formats/unicode_text.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using Ids = std::vector<int64_t>;
using json = nlohmann::json;

std::string llama2_model() { return ptest::models_dir() + "/llama2-tokenizer/tokenizer.model"; }

// transformers' LlamaConverter output for `model_path`, as a tokenizer.json text.
std::string llama_converter_json(const std::string& model_path) {
  const SentencePieceModel sp(model_path);
  const int64_t n = sp.vocab_size();
  json vocab = json::object();
  std::unordered_map<std::string, int64_t> ids;  // SentencePieceModel::piece_id scans
  for (int64_t id = 0; id < n; ++id) {
    vocab[sp.piece(id)] = id;
    ids.emplace(sp.piece(id), id);
  }
  auto id_of = [&](const std::string& p) {
    auto it = ids.find(p);
    return it == ids.end() ? int64_t{-1} : it->second;
  };
  // SentencePieceExtractor.extract: for each piece (id order), its splits into two pieces sorted by
  // (left id, right id); all of them stably sorted by the piece's score, highest first.
  struct M {
    int64_t l, r;
    float score;
  };
  std::vector<M> merges;
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  for (int64_t id = 0; id < n; ++id) {
    const std::string& p = sp.piece(id);
    utf8_decode(p, &cps, &off);
    std::vector<M> local;
    for (size_t k = 1; k < cps.size(); ++k) {
      const int64_t l = id_of(p.substr(0, off[k])), r = id_of(p.substr(off[k]));
      if (l >= 0 && r >= 0) local.push_back({l, r, sp.score(id)});
    }
    std::sort(local.begin(), local.end(),
              [](const M& a, const M& b) { return std::tie(a.l, a.r) < std::tie(b.l, b.r); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const M& a, const M& b) { return a.score > b.score; });
  json jm = json::array();
  for (const M& m : merges) jm.push_back(sp.piece(m.l) + " " + sp.piece(m.r));
  json added = json::array();
  for (int64_t id : {sp.unk_id(), sp.bos_id(), sp.eos_id()})
    added.push_back({{"id", id},
                     {"content", sp.piece(id)},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const std::string sp_char = "\xE2\x96\x81";
  json doc = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", sp_char}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp_char}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens",
         {{"<s>", {{"id", "<s>"}, {"ids", {sp.bos_id()}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", sp_char}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", jm}}},
  };
  return doc.dump();
}

const Tokenizer& llama2_json_tok() {
  static const Tokenizer* tok = [] {
    const std::string dir = ptest::scratch_dir("llama2_json");
    return new Tokenizer(
        ptest::write_bytes(dir, "tokenizer.json", llama_converter_json(llama2_model())));
  }();
  return *tok;
}

std::vector<std::string> lines_of(const std::string& path, size_t n) {
  std::istringstream in(read_text_file(path));
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) all.push_back(l);
  std::vector<std::string> out;
  const size_t step = std::max<size_t>(1, all.size() / n);
  for (size_t i = 0; i < all.size() && out.size() < n; i += step) out.push_back(all[i]);
  return out;
}

std::string show(const Ids& ids) {
  std::string s;
  for (int64_t x : ids) s += std::to_string(x) + " ";
  return s;
}

TEST(TokenizerSpmJson, Llama2ConvertedMatchesSentencePieceOnRealText) {
  ASSERT_TRUE(file_exists(llama2_model())) << llama2_model() << " missing";
  const Tokenizer& hf = llama2_json_tok();
  const Tokenizer spm(llama2_model());
  EXPECT_EQ(hf.kind(), "tokenizer.json:bpe-sentencepiece");
  EXPECT_EQ(hf.vocab_size(), 32000);
  EXPECT_TRUE(hf.add_bos());
  EXPECT_EQ(hf.bos_id(), 1);
  EXPECT_EQ(hf.eos_id(), 2);
  EXPECT_EQ(hf.unk_id(), 0);
  std::vector<std::string> texts;
  const std::string data = ptest::data_dir();
  for (const char* f :
       {"/tinystories-valid-sample/tinystories_val.txt", "/gutenberg-long/moby_dick_pg2701.txt",
        "/gutenberg-long/war_and_peace_pg2600.txt"})
    for (auto& l : lines_of(data + f, 150)) texts.push_back(l);
  for (const char* t :
       {"naïve café — 東京 🙂", "emoji 👍🏽👨‍👩‍👧 flags 🇫🇷🇯🇵",
        "CJK 日本語のテキスト 中文 한국어", "digits 0123456789 and 3.14159",
        "symbols !@#$%^&*()_+-=[]{}|;:'\",.<>/?`~", "multiple   spaces   inside  words",
        "\ttab\tseparated", "a"})
    texts.push_back(t);
  size_t same = 0, round = 0;
  for (const std::string& t : texts) {
    const Ids a = hf.encode(t), b = spm.encode(t);
    if (a == b)
      ++same;
    else if (same + 3 > texts.size() - 10)
      ADD_FAILURE() << "'" << t << "'\n  json " << show(a) << "\n  spm  " << show(b);
    if (hf.decode(a) == t) ++round;
  }
  std::cout << "llama2 tokenizer.json (converted) vs SentencePiece backend: " << same << "/"
            << texts.size() << " identical, " << round << " decode round trips\n";
  EXPECT_EQ(same, texts.size());
  EXPECT_EQ(round, texts.size());
  EXPECT_GE(texts.size(), 400u);
}

TEST(TokenizerSpmJson, Llama2ConvertedMatchesLlamaCppSpmVectors) {
  const Tokenizer& hf = llama2_json_tok();
  const std::string base =
      ptest::models_dir() +
      "/llama3-qwen2-tokenizers/llama.cpp-vocab-tests/ggml-vocab-llama-spm.gguf";
  const std::string inp = read_text_file(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> strings;
  for (size_t pos = 0, at; (at = inp.find(sep, pos)) != std::string::npos; pos = at + sep.size())
    strings.push_back(inp.substr(pos, at - pos));
  std::istringstream out(read_text_file(base + ".out"));
  std::vector<Ids> want;
  for (std::string line; std::getline(out, line);) {
    std::istringstream ls(line);
    Ids ids;
    for (int64_t x; ls >> x;) ids.push_back(x);
    want.push_back(ids);
  }
  ASSERT_EQ(strings.size(), 46u);
  ASSERT_EQ(want.size(), 46u);
  const Tokenizer spm(llama2_model());
  size_t ok = 0, ok_spm = 0;
  for (size_t k = 0; k < strings.size(); ++k) {
    const Ids got = hf.encode(strings[k]);
    if (got == want[k])
      ++ok;
    else
      ADD_FAILURE() << k << " '" << strings[k] << "'\n  want " << show(want[k]) << "\n  got  "
                    << show(got);
    if (spm.encode(strings[k]) == want[k]) ++ok_spm;
  }
  std::cout << "llama2 tokenizer.json (converted) vs ggml-vocab-llama-spm: " << ok << "/46; "
            << "SentencePiece backend: " << ok_spm << "/46\n";
  EXPECT_EQ(ok, 46u);
  EXPECT_EQ(ok_spm, 46u);  // the SentencePiece backend agrees with HF's ids too
}

TEST(TokenizerSpmJson, DecoderChain) {
  const Tokenizer& hf = llama2_json_tok();
  // Prepend U+2581 per segment after a special; Strip removes the one leading space when decoding.
  EXPECT_EQ(hf.encode("<s>Hello"), (Ids{1, 15043}));
  EXPECT_EQ(hf.decode({1, 15043}), "<s> Hello");
  EXPECT_EQ(hf.decode({1, 15043}, /*skip_special=*/true), "Hello");
  EXPECT_EQ(hf.encode("Hello", true), (Ids{1, 15043}));
  // Byte fallback: a character outside the vocabulary is its UTF-8 bytes; half a character decodes
  // to U+FFFD per byte.
  const Ids llama = hf.encode("🦙");
  EXPECT_EQ(llama.size(), 5u);  // ▁ + four <0xXX>
  EXPECT_EQ(hf.decode(llama), "🦙");
  EXPECT_EQ(hf.decode({hf.piece_id("<0xF0>"), hf.piece_id("<0x9F>")}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace kvb
