#pragma once
// Fast, exact token counting for the synthetic-task generators, which measure many candidate
// prompts while they search for the haystack size that hits a target length.
//
// Why it is exact: a SentencePiece BPE with a dummy prefix (Llama 1/2, llama2.c's tok*.model) turns
// every space into U+2581 at the start of the following word and never merges across a single one
// (no vocabulary piece has U+2581 after its first character, except pieces made only of U+2581,
// which need two spaces in a row). So encode(text).size() is the sum of encode(segment).size()
// over the segments between single spaces, and each distinct segment is encoded once and cached.
// A tokenizer for which that does not hold is caught by verify(), which switches the counter to
// whole-text encoding for good.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvb {

class Tokenizer;

class TokenCounter {
 public:
  explicit TokenCounter(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // Number of tokens of tokenizer.encode(text) (no BOS).
  int64_t count(std::string_view text);
  // tokenizer.encode(text).size(), always by a whole-text encoding. When it differs from count(),
  // the counter falls back to whole-text encoding from then on and verify() returns false.
  bool verify(const std::string& text, int64_t* exact_count);
  bool exact_mode() const { return exact_mode_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  const Tokenizer& tokenizer_;
  std::unordered_map<std::string, int32_t> cache_;  // segment -> token count (lookups only)
  bool exact_mode_ = false;
};

}  // namespace kvb
