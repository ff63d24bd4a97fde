#include "harness/formats/unicode_text.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "harness/common/error.h"

namespace kvb {

size_t utf8_valid_len(const std::string& s, size_t i) {
  const size_t n = s.size() - i;
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  auto trail = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  auto valid_cp = [](uint32_t c) { return c < 0xD800 || (c >= 0xE000 && c <= 0x10FFFF); };
  if (b(0) < 0x80) return 1;
  if (n >= 2 && (b(0) & 0xE0) == 0xC0) {
    const uint32_t c = ((b(0) & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    return trail(1) && c >= 0x80 && valid_cp(c) ? 2 : 0;
  }
  if (n >= 3 && (b(0) & 0xF0) == 0xE0) {
    const uint32_t c = ((b(0) & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    return trail(1) && trail(2) && c >= 0x800 && valid_cp(c) ? 3 : 0;
  }
  if (n >= 4 && (b(0) & 0xF8) == 0xF0) {
    const uint32_t c =
        ((b(0) & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    return trail(1) && trail(2) && trail(3) && c >= 0x10000 && valid_cp(c) ? 4 : 0;
  }
  return 0;
}

std::string utf8_sanitize(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_valid_len(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, len);
      i += len;
    }
  }
  return out;
}

std::string utf8_lossy(const std::string& s) {
  // Unicode's "maximal subpart" rule (what Rust and Python implement): a lead byte followed by the
  // continuation bytes that could still complete it is one error; any other bad byte is one error.
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_valid_len(s, i);
    if (len != 0) {
      out.append(s, i, len);
      i += len;
      continue;
    }
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF)
      need = 1;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    size_t j = i + 1;
    for (size_t k = 0; k < need && j < s.size(); ++k, ++j) {
      const uint8_t c = static_cast<uint8_t>(s[j]);
      if (k == 0 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) break;
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

void utf8_decode(const std::string& s, std::vector<uint32_t>* cps, std::vector<size_t>* offsets) {
  cps->clear();
  offsets->clear();
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_valid_len(s, i);
    KVB_CHECK(len != 0, "utf8_decode: invalid UTF-8 at byte ", i, " (sanitize first)");
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    uint32_t c = len == 1 ? b0 : len == 2 ? (b0 & 0x1Fu) : len == 3 ? (b0 & 0x0Fu) : (b0 & 0x07u);
    for (size_t k = 1; k < len; ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3Fu);
    cps->push_back(c);
    offsets->push_back(i);
    i += len;
  }
  offsets->push_back(s.size());
}

void utf8_append(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool uni_is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  const int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER ||
         t == U_MODIFIER_LETTER || t == U_OTHER_LETTER;
}

bool uni_is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

bool uni_is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_isUWhiteSpace(static_cast<UChar32>(cp)) != 0;
}

bool uni_is_alnum(uint32_t cp) { return uni_is_letter(cp) || uni_is_number(cp); }

std::string uni_nfc(const std::string& s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return s;  // ASCII is always NFC; skip ICU's UTF-16 round trip
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  KVB_CHECK(U_SUCCESS(err) && nfc != nullptr, "ICU: NFC normalizer unavailable (", u_errorName(err),
            ")");
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (nfc->isNormalized(u, err) && U_SUCCESS(err)) return s;
  err = U_ZERO_ERROR;
  const icu::UnicodeString n = nfc->normalize(u, err);
  KVB_CHECK(U_SUCCESS(err), "ICU: NFC normalization failed (", u_errorName(err), ")");
  std::string out;
  n.toUTF8String(out);
  return out;
}

}  // namespace kvb
