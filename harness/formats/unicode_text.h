#pragma once
// UTF-8 and Unicode character properties for the tokenizers (pre_tokenizer.h, bpe_tokenizer.h).
//
// Why ICU (libicu-dev) rather than generated tables: the pre-tokenizer regexes of Llama 3, Qwen2
// and GPT-2 need the general categories L and N and White_Space, and Qwen2 normalizes to NFC;
// Hugging Face `tokenizers` takes these from the Unicode tables of its Rust crates, and ICU is the
// maintained implementation of the same tables (composition exclusions, canonical ordering
// included). Tables generated into the tree would be a few hundred KB of data to keep in step by
// hand; ICU is one Debian package. A mismatch between ICU's Unicode version and the reference's
// shows up as a fixture disagreement in tests/base/test_tokenizer_json.cpp, not silently.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvb {

// The length of the valid UTF-8 character at s[i] (shortest form, no surrogates, <= U+10FFFF), or 0
// when the byte starts no valid character.
size_t utf8_valid_len(const std::string& s, size_t i);
// Replaces every byte that starts no valid UTF-8 character with U+FFFD (one per byte).
std::string utf8_sanitize(const std::string& s);
// Lossy UTF-8 as Rust's String::from_utf8_lossy (and Python's errors="replace"): each maximal
// invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(const std::string& s);
// Decodes valid UTF-8 (as utf8_sanitize produces) to code points; offsets[k] is the byte offset of
// code point k, offsets.back() == s.size().
void utf8_decode(const std::string& s, std::vector<uint32_t>* cps, std::vector<size_t>* offsets);
void utf8_append(uint32_t cp, std::string* out);

bool uni_is_letter(uint32_t cp);      // \p{L}: Lu Ll Lt Lm Lo
bool uni_is_number(uint32_t cp);      // \p{N}: Nd Nl No (Rust char::is_numeric)
bool uni_is_whitespace(uint32_t cp);  // \s: White_Space (Rust char::is_whitespace)
bool uni_is_alnum(uint32_t cp);       // L or N (Rust char::is_alphanumeric)

// NFC of valid UTF-8.
std::string uni_nfc(const std::string& s);

}  // namespace kvb
