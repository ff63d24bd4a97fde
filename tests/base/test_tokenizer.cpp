// Tokenizer (our own SentencePiece BPE): the README reference encodings, THE ORACLE TEST against
// the real SentencePiece (`spm_encode`) on several hundred lines of real text plus edge cases for
// both real tokenizers and a hand-built model, decode round trips and byte fallback, and corrupt or
// unsupported model files refused with one line naming the path (never a crash: ASan + UBSan).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <tuple>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/tokenizer.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;
using ptest::read_bytes;
using ptest::scratch_dir;
using ptest::write_bytes;
using Ids = std::vector<int64_t>;

const char* kLily = "Once upon a time, there was a little girl named Lily.";

std::string tok512_path() { return ptest::models_dir() + "/stories260K/tok512.model"; }
std::string llama2_path() { return ptest::models_dir() + "/llama2-tokenizer/tokenizer.model"; }

// ---- a hand-built ModelProto (protobuf wire format), to test exactly one property at a time ----

std::string pb_varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
std::string pb_uint(int field, uint64_t v) {
  return pb_varint(uint64_t(field) << 3) + pb_varint(v);
}
std::string pb_bytes(int field, const std::string& s) {
  return pb_varint((uint64_t(field) << 3) | 2) + pb_varint(s.size()) + s;
}
std::string pb_float(int field, float f) {
  std::string raw(4, '\0');
  std::memcpy(raw.data(), &f, 4);
  return pb_varint((uint64_t(field) << 3) | 5) + raw;
}

enum PieceType {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct ToyPiece {
  std::string text;
  float score;
  int type;
};

struct ToyModel {
  std::vector<ToyPiece> pieces;
  int model_type = 2;  // BPE
  bool byte_fallback = true;
  std::string normalizer = "identity";
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;

  std::string serialize() const {
    std::string out;
    for (const auto& p : pieces)
      out += pb_bytes(1, pb_bytes(1, p.text) + pb_float(2, p.score) + pb_uint(3, p.type));
    out += pb_bytes(2, pb_uint(3, model_type) + pb_uint(35, byte_fallback ? 1 : 0));
    out += pb_bytes(3, pb_bytes(1, normalizer) + pb_uint(3, add_dummy_prefix ? 1 : 0) +
                           pb_uint(4, remove_extra_whitespaces ? 1 : 0));
    return out;
  }
};

const std::string kSp = "\xE2\x96\x81";  // U+2581

// <unk> <s> </s>, optionally the 256 byte pieces, then merges whose scores exercise the BPE order:
// "bc" beats "ab", "aa" ties with itself (leftmost wins), user-defined "xy" is atomic even though
// the normal piece "xyz" exists.
ToyModel toy_model(bool byte_fallback) {
  ToyModel m;
  m.byte_fallback = byte_fallback;
  m.pieces = {{"<unk>", 0, kUnknown}, {"<s>", 0, kControl}, {"</s>", 0, kControl}};
  if (byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      m.pieces.push_back({name, 0, kByte});
    }
  }
  m.pieces.push_back({"xy", 0, kUserDefined});
  const std::vector<std::pair<std::string, float>> normal = {
      {kSp, -1},        {"a", -2},    {"b", -3},   {"c", -4},         {"x", -5},
      {"y", -6},        {"z", -7},    {"bc", -8},  {"ab", -9},        {"aa", -10},
      {kSp + "a", -11}, {"xyz", -12}, {"yz", -13}, {kSp + "aa", -14}, {"\xC3\xA9", -15} /* é */};
  for (const auto& [t, s] : normal) m.pieces.push_back({t, s, kNormal});
  return m;
}

// ---- spm_encode oracle ----

bool have_spm_encode() { return std::system("command -v spm_encode >/dev/null 2>&1") == 0; }

// Encodes each line with the real SentencePiece; one id list per input line.
std::vector<Ids> spm_encode_lines(const std::string& model, const std::vector<std::string>& lines) {
  const std::string dir = scratch_dir("spm");
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  const std::string in = write_bytes(dir, "in.txt", text);
  const std::string out = dir + "/out.txt";
  const std::string cmd = "spm_encode --model='" + model + "' --output_format=id < '" + in +
                          "' > '" + out + "' 2> '" + dir + "/err.txt'";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << "\n" << read_bytes(dir + "/err.txt");
  std::vector<Ids> result;
  std::ifstream f(out);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    Ids ids;
    int64_t id;
    while (ss >> id) ids.push_back(id);
    result.push_back(ids);
  }
  EXPECT_EQ(result.size(), lines.size()) << "spm_encode output line count, " << cmd;
  return result;
}

std::string show(const Tokenizer& tok, const Ids& ids) {
  std::string s;
  for (int64_t id : ids) {
    s += std::to_string(id);
    if (id >= 0 && id < tok.vocab_size()) s += "(" + tok.piece(id) + ")";
    s += " ";
  }
  return s;
}

// Compares our encoding with spm_encode's on every line; returns the number of lines compared.
size_t compare_with_spm(const std::string& model_path, const Tokenizer& tok,
                        const std::vector<std::string>& lines, const std::string& label) {
  const std::vector<Ids> want = spm_encode_lines(model_path, lines);
  if (want.size() != lines.size()) return 0;
  size_t mismatches = 0;
  size_t tokens = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const Ids got = tok.encode(lines[i]);
    tokens += want[i].size();
    if (got != want[i]) {
      ++mismatches;
      if (mismatches <= 5) {
        ADD_FAILURE() << label << " line " << i << " differs from spm_encode\n  text: '" << lines[i]
                      << "'\n  spm:  " << show(tok, want[i]) << "\n  ours: " << show(tok, got);
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << label << ": " << mismatches << " of " << lines.size()
                            << " lines differ";
  std::cout << "[ oracle ] " << label << ": " << lines.size() << " lines, " << tokens
            << " tokens compared with spm_encode, " << mismatches << " mismatches\n";
  return lines.size();
}

// Decodes `ids` (one list per line) with the real `spm_decode` and compares with our decode.
size_t compare_decode_with_spm(const std::string& model_path, const Tokenizer& tok,
                               const std::vector<Ids>& ids, const std::string& label) {
  const std::string dir = scratch_dir("spmdec");
  std::string text;
  for (const auto& l : ids) {
    for (size_t i = 0; i < l.size(); ++i) text += (i ? " " : "") + std::to_string(l[i]);
    text += "\n";
  }
  const std::string in = write_bytes(dir, "ids.txt", text);
  const std::string out = dir + "/out.txt";
  const std::string cmd = "spm_decode --model='" + model_path + "' --input_format=id < '" + in +
                          "' > '" + out + "' 2> '" + dir + "/err.txt'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_bytes(dir + "/err.txt");
  std::ifstream f(out, std::ios::binary);
  std::vector<std::string> want;
  std::string line;
  while (std::getline(f, line)) want.push_back(line);
  EXPECT_EQ(want.size(), ids.size()) << "spm_decode output line count, " << cmd;
  if (want.size() != ids.size()) return 0;
  size_t mismatches = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string got = tok.decode(ids[i]);
    if (got != want[i] && ++mismatches <= 5)
      ADD_FAILURE() << label << " line " << i << ": spm_decode '" << want[i] << "', ours '" << got
                    << "'";
  }
  EXPECT_EQ(mismatches, 0u) << label << ": " << mismatches << " of " << ids.size() << " differ";
  std::cout << "[ oracle ] " << label << ": " << ids.size() << " id lists decoded, identical to "
            << "spm_decode: " << ids.size() - mismatches << "\n";
  return ids.size();
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path << " missing (run scripts/setup.sh)";
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(line);  // keeps a trailing '\r' (wikitext is CRLF)
  return out;
}

// `n` non-empty lines spread evenly over the file, plus up to `n_unicode` lines with non-ASCII
// bytes.
std::vector<std::string> sample_lines(const std::string& path, size_t n, size_t n_unicode) {
  std::vector<std::string> all;
  for (auto& l : read_lines(path))
    if (!l.empty() && l != "\r") all.push_back(std::move(l));
  std::vector<std::string> out;
  if (all.empty()) return out;
  const size_t step = std::max<size_t>(1, all.size() / n);
  for (size_t i = 0; i < all.size() && out.size() < n; i += step) out.push_back(all[i]);
  size_t u = 0;
  for (size_t i = 0; i < all.size() && u < n_unicode; ++i) {
    bool non_ascii = false;
    for (unsigned char c : all[i]) non_ascii |= c >= 0x80;
    if (non_ascii && i % step != 0) {
      out.push_back(all[i]);
      ++u;
    }
  }
  return out;
}

const std::vector<std::string>& edge_cases() {
  static const std::vector<std::string> k = {
      "",
      " ",
      "   ",
      "a",
      " leading space",
      "   three leading spaces",
      "trailing space ",
      "trailing spaces   ",
      "multiple   spaces   inside  words",
      "\ttab\tseparated\tvalues\t",
      "mixed \t whitespace \t\t here",
      "digits 0123456789 and 3.14159 and 1,000,000 and 2024-01-31",
      "12345678901234567890",
      "naïve café — 東京 🙂",
      "Ünïcödé ÀÉÎÕÜ ß ø å Ωμέγα",
      "emoji 👍🏽👨‍👩‍👧 flags 🇫🇷🇯🇵",
      "CJK 日本語のテキスト 中文 한국어",
      "Cyrillic Привет, мир! Arabic مرحبا Hebrew שלום",
      "symbols !@#$%^&*()_+-=[]{}|;:'\",.<>/?`~",
      "back\\slash and \"quotes\"",
      "carriage return at end\r",
      "no\u00a0break\u00a0space",
      "zero\u200bwidth\u200bspace",
      "<s> </s> <unk> literal control tokens",
      "<0x41> literal byte token text",
      "\xE2\x96\x81 literal U+2581 \xE2\x96\x81\xE2\x96\x81",
      "\x7f DEL and \x01\x02 control chars",
      "ALL CAPS SENTENCE. don't won't it's e.g. i.e. etc.",
      std::string(300, 'a'),
      "The quick brown fox jumps over the lazy dog.",
      "\xEF\xBF\xBD a literal replacement character",
  };
  return k;
}

// Malformed UTF-8: real SentencePiece replaces each bad byte with U+FFFD before encoding.
const std::vector<std::string>& invalid_utf8_cases() {
  static const std::vector<std::string> k = {
      "bad \xff\xfe bytes",
      "truncated caf\xc3",
      "overlong \xc0\x80 nul",
      "surrogate \xed\xa0\x80 half",
      "stray \x80 continuation",
      "\xf8\x88\x80\x80\x80 five-byte form",
      "beyond U+10FFFF \xf4\x90\x80\x80",
      "cut 4-byte \xf0\x9f\x99",
  };
  return k;
}

// ---- tests ----

TEST(Tokenizer, ReferenceEncodingsFromReadmes) {
  ASSERT_TRUE(file_exists(tok512_path())) << tok512_path() << " missing (run scripts/setup.sh)";
  ASSERT_TRUE(file_exists(llama2_path())) << llama2_path() << " missing (run scripts/setup.sh)";
  const Tokenizer t512(tok512_path());
  EXPECT_EQ(t512.encode(kLily),
            (Ids{403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426}));
  const Tokenizer llama(llama2_path());
  EXPECT_EQ(llama.encode(kLily),
            (Ids{9038, 2501, 263, 931, 29892, 727, 471, 263, 2217, 7826, 4257, 365, 2354, 29889}));
  EXPECT_EQ(t512.decode(t512.encode(kLily)), kLily);
  EXPECT_EQ(llama.decode(llama.encode(kLily)), kLily);
}

TEST(Tokenizer, VocabularyAndSpecialIds) {
  const Tokenizer t512(tok512_path());
  EXPECT_EQ(t512.vocab_size(), 512);
  EXPECT_EQ(t512.path(), tok512_path());
  const Tokenizer llama(llama2_path());
  EXPECT_EQ(llama.vocab_size(), 32000);
  for (const Tokenizer* t : {&t512, &llama}) {
    EXPECT_EQ(t->unk_id(), 0);
    EXPECT_EQ(t->bos_id(), 1);
    EXPECT_EQ(t->eos_id(), 2);
    EXPECT_EQ(t->piece(0), "<unk>");
    EXPECT_EQ(t->piece(1), "<s>");
    EXPECT_EQ(t->piece(2), "</s>");
    // Byte pieces follow the specials: <0x00> is id 3, <0x0A> id 13, <0xFF> id 258.
    EXPECT_EQ(t->piece_id("<0x00>"), 3);
    EXPECT_EQ(t->piece_id("<0x0A>"), 13);
    EXPECT_EQ(t->piece_id("<0xFF>"), 258);
    EXPECT_EQ(t->piece_id("no such piece"), -1);
  }
  EXPECT_EQ(llama.piece(9038), kSp + "Once");
  EXPECT_EQ(llama.piece_id(kSp + "Once"), 9038);
  expect_kvb_error([&] { t512.piece(512); },
                   {tok512_path(), "token id 512 is outside the vocabulary [0, 512)"});
  expect_kvb_error([&] { llama.piece(-1); },
                   {llama2_path(), "token id -1 is outside the vocabulary [0, 32000)"});
}

// THE ORACLE TEST: identical ids to the real SentencePiece, line by line, on real text.
TEST(Tokenizer, MatchesSpmEncodeOnRealTextAndEdgeCases) {
  if (!have_spm_encode())
    GTEST_SKIP() << "spm_encode not found (Debian package sentencepiece, installed by "
                    "scripts/setup.sh); the oracle comparison did not run";
  const std::string data = ptest::data_dir();
  std::vector<std::string> lines;
  for (const auto& [file, n, nu] : std::vector<std::tuple<std::string, size_t, size_t>>{
           {data + "/tinystories-valid-sample/tinystories_val.txt", 200, 60},
           {data + "/wikitext-2-raw/wiki.test.raw", 200, 80},
           {data + "/tinyshakespeare/input.txt", 250, 0}}) {
    auto s = sample_lines(file, n, nu);
    EXPECT_GE(s.size(), n) << file;
    lines.insert(lines.end(), s.begin(), s.end());
  }
  for (const auto& e : edge_cases()) lines.push_back(e);
  size_t total = 0;
  for (const std::string& model : {tok512_path(), llama2_path()}) {
    const Tokenizer t(model);
    total += compare_with_spm(model, t, lines, model);
    // And our decode of those ids equals spm_decode's.
    std::vector<Ids> ids;
    for (const auto& l : lines) ids.push_back(t.encode(l));
    compare_decode_with_spm(model, t, ids, model + " (decode)");
  }
  EXPECT_GE(total, 2 * 700u);
}

TEST(Tokenizer, MatchesSpmEncodeOnInvalidUtf8) {
  if (!have_spm_encode()) GTEST_SKIP() << "spm_encode not found; the oracle comparison did not run";
  const Tokenizer t512(tok512_path());
  compare_with_spm(tok512_path(), t512, invalid_utf8_cases(), "tok512.model invalid UTF-8");
  const Tokenizer llama(llama2_path());
  compare_with_spm(llama2_path(), llama, invalid_utf8_cases(), "llama2 invalid UTF-8");
}

// The hand-built model exercises merge order, ties, user-defined pieces, byte fallback and <unk>
// independently of the trained vocabularies; spm_encode must agree with it too.
TEST(Tokenizer, ToyModelMergeOrderAndSpecialPieces) {
  const std::string dir = scratch_dir("toytok");
  const std::string with_bytes = write_bytes(dir, "toy_bytes.model", toy_model(true).serialize());
  const std::string no_bytes = write_bytes(dir, "toy_unk.model", toy_model(false).serialize());
  const Tokenizer tb(with_bytes);
  const Tokenizer tu(no_bytes);
  auto id = [&](const Tokenizer& t, const std::string& p) {
    const int64_t i = t.piece_id(p);
    EXPECT_GE(i, 0) << p;
    return i;
  };
  // "abc": ▁ a b c -> "bc" (-8) beats "ab" (-9) and "▁a" (-11) -> ▁ a bc -> ▁a bc.
  EXPECT_EQ(tb.encode("abc"), (Ids{id(tb, kSp + "a"), id(tb, "bc")}));
  // "aaa": ▁ a a a -> "aa" ties at (a,a) twice, the leftmost wins -> ▁ aa a -> ▁aa a.
  EXPECT_EQ(tb.encode("aaa"), (Ids{id(tb, kSp + "aa"), id(tb, "a")}));
  // "xyz": the user-defined "xy" is one frozen symbol, never merged into "xyz".
  EXPECT_EQ(tb.encode("xyz"), (Ids{id(tb, kSp), id(tb, "xy"), id(tb, "z")}));
  // Unknown characters: byte fallback, or <unk> without it.
  EXPECT_EQ(tb.encode("q"), (Ids{id(tb, kSp), id(tb, "<0x71>")}));
  EXPECT_EQ(tu.encode("q"), (Ids{id(tu, kSp), 0}));
  // "▁a" "▁" <unk>: the unk surface is " ⁇ " (spm_decode gives the same "a  ⁇ ").
  EXPECT_EQ(tu.decode(tu.encode("a q")), "a  \xE2\x81\x87 ");
  // A run of unknown characters is one <unk>, as in spm_encode.
  EXPECT_EQ(tu.encode("qqq a"), (Ids{id(tu, kSp), 0, id(tu, kSp + "a")}));
  EXPECT_EQ(tb.encode("é"), (Ids{id(tb, kSp), id(tb, "\xC3\xA9")}));
  EXPECT_TRUE(tb.encode("").empty());
  EXPECT_TRUE(tb.encode("   ").empty());

  if (!have_spm_encode()) GTEST_SKIP() << "spm_encode not found; the oracle comparison did not run";
  std::vector<std::string> lines = {"abc",    "aaa",   "aaaa",    "aaaaa", "xyz",
                                    "xyzxyz", "axyzb", "q",       "a q",   "abcabc bca cab",
                                    "é",      "ééé",   "zz yy xx"};
  for (const auto& e : edge_cases()) lines.push_back(e);
  compare_with_spm(with_bytes, tb, lines, "toy model, byte fallback");
  compare_with_spm(no_bytes, tu, lines, "toy model, <unk>");
}

// Decoding crafted id sequences (leading control and space pieces, <unk> first, invalid and
// truncated byte runs, bytes mixed with text) gives exactly what spm_decode gives.
TEST(Tokenizer, DecodeMatchesSpmDecodeOnCraftedIds) {
  if (!have_spm_encode()) GTEST_SKIP() << "spm_decode not found; the oracle comparison did not run";
  const std::string dir = scratch_dir("toydec");
  const std::string toy_b = write_bytes(dir, "toy_bytes.model", toy_model(true).serialize());
  const std::string toy_u = write_bytes(dir, "toy_unk.model", toy_model(false).serialize());
  const std::vector<std::vector<std::string>> seqs = {
      {"<unk>"},
      {"<unk>", kSp + "a"},
      {kSp + "a", "<unk>", "<unk>"},
      {"<s>", kSp + "a", "</s>"},
      {kSp, kSp, kSp + "a"},
      {kSp, "<s>", kSp + "a"},
      {"<s>", "<s>", kSp},
      {kSp, "<0x20>", kSp + "a"},
      {"<0x20>", kSp + "a"},
      {"<0xE6>", "<0x9D>", "<0xB1>", kSp + "a"},
      {"<0xE6>", "<0x9D>"},
      {"<0xFF>", "<0xFE>", "a"},
      {"<0xC3>", "a", "<0xA9>"},
      {"<0xF0>", "<0x9F>", "<0x99>", "<0x82>"},
      {"<0xED>", "<0xA0>", "<0x80>"},
      {"<0xC0>", "<0x80>"},
      {"<0x41>", kSp + "a", "<0x09>"},  // (no <0x0A>: spm_decode output is line-based)
      {"a", kSp + "a", kSp},
      {},
  };
  for (const std::string& model : {tok512_path(), llama2_path(), toy_b, toy_u}) {
    const Tokenizer t(model);
    std::vector<Ids> lists;
    for (const auto& seq : seqs) {
      Ids ids;
      bool ok = true;
      for (const auto& p : seq) {
        const int64_t i = t.piece_id(p);
        ok &= i >= 0;
        ids.push_back(i);
      }
      if (ok) lists.push_back(ids);
    }
    EXPECT_GE(lists.size(), model == toy_u ? 8u : seqs.size() - 1) << model;
    compare_decode_with_spm(model, t, lists, model + " (crafted ids)");
  }
  // The invalid byte runs give U+FFFD per bad byte.
  const Tokenizer t512(tok512_path());
  EXPECT_EQ(t512.decode({t512.piece_id("<0xE6>"), t512.piece_id("<0x9D>"), t512.piece_id("a")}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");
}

TEST(Tokenizer, DecodeRoundTrips) {
  const Tokenizer t512(tok512_path());
  const Tokenizer llama(llama2_path());
  const std::vector<std::string> texts = {
      kLily,
      "Hello, world!",
      "digits 0123456789 and 3.14159",
      "naïve café — 東京 🙂",
      "emoji 👍🏽👨‍👩‍👧 and CJK 日本語",
      "Tabs\tinside\ttext",
      "Line one.\nLine two.",
      "x",
      "",
  };
  for (const auto& t : texts) {
    EXPECT_EQ(t512.decode(t512.encode(t)), t) << t;
    EXPECT_EQ(llama.decode(llama.encode(t)), t) << t;
  }
  // Every real line without leading, trailing or repeated spaces round-trips exactly.
  size_t n = 0;
  for (const auto& line :
       sample_lines(ptest::data_dir() + "/tinystories-valid-sample/tinystories_val.txt", 100, 20)) {
    if (line.find("  ") != std::string::npos || line.front() == ' ' || line.back() == ' ') continue;
    EXPECT_EQ(t512.decode(t512.encode(line)), line);
    EXPECT_EQ(llama.decode(llama.encode(line)), line);
    ++n;
  }
  EXPECT_GT(n, 80u);
  // The llama tokenizer keeps extra whitespace (remove_extra_whitespaces is off), so even that
  // round-trips; tok512 collapses it the way SentencePiece does.
  const std::string spaced = "  two leading,   three inside, two trailing  ";
  EXPECT_EQ(llama.decode(llama.encode(spaced)), spaced);
  EXPECT_EQ(t512.decode(t512.encode(spaced)), "two leading, three inside, two trailing");
}

TEST(Tokenizer, ByteFallbackDecodesToUtf8) {
  const Tokenizer t512(tok512_path());
  // tok512 has no piece for these characters: they become their UTF-8 bytes.
  const Ids ids = t512.encode("東京 🙂");
  const Ids want = {t512.piece_id(kSp),      t512.piece_id("<0xE6>"), t512.piece_id("<0x9D>"),
                    t512.piece_id("<0xB1>"), t512.piece_id("<0xE4>"), t512.piece_id("<0xBA>"),
                    t512.piece_id("<0xAC>"), t512.piece_id(kSp),      t512.piece_id("<0xF0>"),
                    t512.piece_id("<0x9F>"), t512.piece_id("<0x99>"), t512.piece_id("<0x82>")};
  EXPECT_EQ(ids, want);
  EXPECT_EQ(t512.decode(ids), "東京 🙂");
  // Byte tokens alone, with BOS/EOS around them (control pieces decode to nothing).
  const Ids emoji = {t512.bos_id(),           t512.piece_id("<0xF0>"), t512.piece_id("<0x9F>"),
                     t512.piece_id("<0x99>"), t512.piece_id("<0x82>"), t512.eos_id()};
  EXPECT_EQ(t512.decode(emoji), "\xF0\x9F\x99\x82");
  EXPECT_EQ(t512.decode({t512.piece_id("<0x41>"), t512.piece_id("<0x0A>")}), "A\n");
  // The leading dummy-prefix space is dropped only from the first piece.
  const Tokenizer llama(llama2_path());
  EXPECT_EQ(llama.decode({llama.bos_id(), 9038, 2501}), "Once upon");
  EXPECT_EQ(llama.decode({2501, 9038}), "upon Once");
  EXPECT_EQ(llama.decode({}), "");
}

TEST(Tokenizer, DecodeRejectsOutOfRangeIds) {
  const Tokenizer t512(tok512_path());
  expect_kvb_error(
      [&] {
        t512.decode({403, 512});
      },
      {tok512_path(), "token id 512 is outside the vocabulary [0, 512)"});
  expect_kvb_error([&] { t512.decode({-3}); },
                   {tok512_path(), "token id -3 is outside the vocabulary [0, 512)"});
  expect_kvb_error([&] { t512.decode({INT64_MAX}); }, {tok512_path(), "is outside the vocabulary"});
}

TEST(Tokenizer, MissingEmptyRandomAndTruncatedFiles) {
  const std::string dir = scratch_dir("badtok");
  const std::string missing = dir + "/tokenizer.model";
  expect_kvb_error([&] { Tokenizer t(missing); }, {missing, ": tokenizer file not found"});
  expect_kvb_error([&] { Tokenizer t(dir); }, {dir, ": tokenizer file not found"});

  const std::string empty = write_bytes(dir, "empty.model", "");
  expect_kvb_error([&] { Tokenizer t(empty); },
                   {empty, ": not a valid SentencePiece model (no pieces or no trainer spec)"});

  uint64_t rng = 12345;
  for (int seed = 0; seed < 20; ++seed) {
    std::string bytes(64 + 97 * seed, '\0');
    for (auto& c : bytes) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      c = static_cast<char>(rng >> 56);
    }
    const std::string p = write_bytes(dir, "random" + std::to_string(seed) + ".model", bytes);
    expect_kvb_error([&] { Tokenizer t(p); }, {p + ": "});
  }

  const std::string real = read_bytes(tok512_path());
  ASSERT_EQ(real.size(), 7522u);
  for (size_t n : {size_t{1}, size_t{2}, size_t{10}, size_t{100}, real.size() / 2, real.size() - 30,
                   real.size() - 1}) {
    const std::string p =
        write_bytes(dir, "trunc" + std::to_string(n) + ".model", real.substr(0, n));
    SCOPED_TRACE(n);
    expect_kvb_error([&] { Tokenizer t(p); }, {p, "not a valid SentencePiece model"});
  }

  // Other real files that are not a tokenizer.model.
  for (const std::string& other : {ptest::models_dir() + "/stories260K/tok512.bin",
                                   ptest::models_dir() + "/stories260K-hf/config.json"}) {
    expect_kvb_error([&] { Tokenizer t(other); }, {other + ": "});
  }
}

// Flipped and truncated bytes of the real tok512.model: either a tokenizer that can encode and
// decode, or kvb::Error naming the path; never a crash or a sanitizer report.
TEST(Tokenizer, FuzzCorruptModelNeverCrashes) {
  const std::string real = read_bytes(tok512_path());
  ASSERT_FALSE(real.empty());
  const std::string src = "/fuzz/tok512.model";
  uint64_t rng = 0xDEADBEEFCAFEF00Dull;
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int accepted = 0, refused = 0;
  for (int v = 0; v < 300; ++v) {
    std::string bytes = real;
    switch (v % 3) {
      case 0:
        bytes[next() % bytes.size()] ^= static_cast<char>(1u << (next() % 8));
        break;
      case 1:
        bytes.resize(next() % bytes.size());
        break;
      default:
        for (int k = 0; k < 4; ++k) bytes[next() % bytes.size()] = static_cast<char>(next());
    }
    try {
      const Tokenizer t(bytes, src);
      ++accepted;
      const Ids ids = t.encode("Once upon a time, 東京 🙂  there\twas");
      for (int64_t id : ids) {
        EXPECT_GE(id, 0);
        EXPECT_LT(id, t.vocab_size());
      }
      (void)t.decode(ids);
    } catch (const kvb::Error& e) {
      ++refused;
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(src + ": ", 0), 0u) << "variant " << v << ": " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(accepted + refused, 300);
  EXPECT_GT(refused, 50);
  std::cout << "[ fuzz ] tokenizer: " << accepted << " accepted, " << refused << " refused\n";
}

TEST(Tokenizer, UnsupportedOrMalformedModels) {
  const std::string src = "/m/toy.model";
  ToyModel m = toy_model(true);
  m.model_type = 1;  // UNIGRAM
  expect_kvb_error([&] { Tokenizer t(m.serialize(), src); },
                   {src, ": SentencePiece model type 1 is not supported (only BPE, type 2)"});
  m = toy_model(true);
  m.normalizer = "nmt_nfkc";
  expect_kvb_error(
      [&] { Tokenizer t(m.serialize(), src); },
      {src, ": SentencePiece normalizer 'nmt_nfkc' is not supported (only 'identity')"});
  m = toy_model(true);
  m.pieces.erase(m.pieces.begin());  // no <unk>
  expect_kvb_error([&] { Tokenizer t(m.serialize(), src); },
                   {src, ": SentencePiece model has no <unk> piece"});
  m = toy_model(true);
  m.pieces.erase(m.pieces.begin() + 3 + 0x41);  // drop <0x41>
  expect_kvb_error([&] { Tokenizer t(m.serialize(), src); },
                   {src, ": byte_fallback is on but piece <0x41> is missing"});
  for (const std::string bad : {"<0xZZ>", "<0x-1>", "<0x+F>x", "<0x4>", "<0x100>", "<0x-80>",
                                "<0x0a>", "<0x 1>", "<0x+1>"}) {
    m = toy_model(true);
    m.pieces[3 + 0x41].text = bad;  // also leaves <0x41> missing, but the malformed piece is first
    SCOPED_TRACE(bad);
    expect_kvb_error([&] { Tokenizer t(m.serialize(), src); },
                     {src, ": byte piece '" + bad + "' is malformed"});
  }
  m = toy_model(true);
  m.pieces[5].type = 9;
  expect_kvb_error([&] { Tokenizer t(m.serialize(), src); }, {src, ": piece 5 has unknown type 9"});
  // No trainer spec at all.
  std::string only_pieces = pb_bytes(1, pb_bytes(1, "<unk>") + pb_uint(3, kUnknown));
  expect_kvb_error([&] { Tokenizer t(only_pieces, src); },
                   {src, "not a valid SentencePiece model (no pieces or no trainer spec)"});
  // A length-delimited field that claims more bytes than there are.
  expect_kvb_error([&] { Tokenizer t(pb_varint((1 << 3) | 2) + pb_varint(1000) + "abc", src); },
                   {src, "length-delimited field runs past the end"});
  // Wire types 3/4 (groups) and 6/7 do not occur in a ModelProto.
  expect_kvb_error([&] { Tokenizer t(pb_varint((9 << 3) | 7), src); },
                   {src, "unknown wire type 7"});
  expect_kvb_error([&] { Tokenizer t(std::string(11, '\xff'), src); }, {src, "varint too long"});
  expect_kvb_error([&] { Tokenizer t(std::string("\x08\x80", 2), src); },
                   {src, "truncated varint"});
  expect_kvb_error([&] { Tokenizer t(pb_varint((9 << 3) | 5) + "ab", src); },
                   {src, "truncated fixed32"});
  expect_kvb_error([&] { Tokenizer t(pb_varint((9 << 3) | 1) + "abcd", src); },
                   {src, "truncated fixed64"});
  // Unknown fields of every valid wire type are skipped.
  const std::string extra = pb_uint(20, 7) + pb_varint((21 << 3) | 1) + std::string(8, 'x') +
                            pb_bytes(22, "skip me") + pb_varint((23 << 3) | 5) + "abcd";
  const Tokenizer t(toy_model(true).serialize() + extra, src);
  EXPECT_EQ(t.encode("abc").size(), 2u);
}

}  // namespace
}  // namespace kvb
