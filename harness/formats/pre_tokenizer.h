#pragma once
// The pre-tokenizers of Hugging Face `tokenizers` that real BPE checkpoints use, over UTF-8 pieces:
// Split with the GPT-2 / Llama 3 / Qwen2 regexes (hand-written matchers over code points that
// follow the regexes' alternation and backtracking exactly), Digits, ByteLevel and Metaspace.
// Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include "harness/formats/tokenizer_spec.h"

namespace kvb {

// The SplitRegex whose exact pattern string is `pattern`; false when it is none of them.
bool split_regex_from_pattern(const std::string& pattern, SplitRegex* out);

// Splits valid UTF-8 `s` as the regex with SplitDelimiterBehavior::Isolated does: every match is a
// piece, and so is every run of text between matches. Empty pieces are not produced.
void split_by_regex(SplitRegex re, const std::string& s, std::vector<std::string>* out);

// GPT-2's byte-to-unicode table: the UTF-8 of the character byte b stands for.
const std::string& byte_level_char(uint8_t b);
// The byte a GPT-2 byte character stands for, or -1 (cp is a code point).
int byte_level_byte(uint32_t cp);

// Runs the steps in order; each step maps every piece to zero or more pieces. `pieces` holds valid
// UTF-8 on entry; after a ByteLevel step pieces are in the GPT-2 byte alphabet. `first_segment`:
// the segment starts the text (Metaspace's prepend_scheme "first").
void pre_tokenize(const std::vector<PreTokenizerStep>& steps, bool first_segment,
                  std::vector<std::string>* pieces);

}  // namespace kvb
