#include "harness/formats/pre_tokenizer.h"

#include <algorithm>

#include "harness/formats/unicode_text.h"

namespace kvb {

namespace {

const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Character classes of one code-point sequence, computed once (ICU lookups are the cost).
struct Classified {
  std::vector<uint32_t> cp;
  std::vector<uint8_t> cls;  // kL, kN, kS or kO
  size_t n() const { return cp.size(); }
};
constexpr uint8_t kL = 1, kN = 2, kS = 3, kO = 4;  // letter, number, whitespace, other

bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

size_t run_of(const Classified& t, size_t i, uint8_t cls) {
  size_t j = i;
  while (j < t.n() && t.cls[j] == cls) ++j;
  return j - i;
}

// 's 't 're 've 'm 'll 'd at i: the match length or 0. Case-insensitive as (?i:...): Oniguruma's
// case folding also maps U+017F (long s) to s.
size_t contraction(const Classified& t, size_t i, bool ignore_case) {
  if (t.cp[i] != '\'' || i + 1 >= t.n()) return 0;
  auto is = [&](size_t k, char lower) {
    if (k >= t.n()) return false;
    const uint32_t c = t.cp[k];
    if (c == static_cast<uint32_t>(lower)) return true;
    if (!ignore_case) return false;
    return c == static_cast<uint32_t>(lower - 32) || (lower == 's' && c == 0x17F);
  };
  if (is(i + 1, 's') || is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd')) return 2;
  if ((is(i + 1, 'r') || is(i + 1, 'v')) && is(i + 2, 'e')) return 3;
  if (is(i + 1, 'l') && is(i + 2, 'l')) return 3;
  return 0;
}

// \s+(?!\S) then \s+ at i (i is whitespace): the greedy run backs off one character when a
// non-space follows it, so the last space joins the next word; a lone space before a word falls to
// the plain \s+.
size_t space_run(const Classified& t, size_t i) {
  const size_t w = run_of(t, i, kS);
  if (i + w == t.n() || w < 2) return w;
  return w - 1;
}

size_t match_gpt2(const Classified& t, size_t i) {
  if (size_t m = contraction(t, i, false)) return m;
  const bool sp = t.cp[i] == ' ' && i + 1 < t.n();
  for (uint8_t cls : {kL, kN, kO}) {  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
    if (sp && t.cls[i + 1] == cls) return 1 + run_of(t, i + 1, cls);
    if (t.cls[i] == cls) return run_of(t, i, cls);
  }
  return space_run(t, i);  // t.cls[i] == kS here
}

size_t match_llama3(const Classified& t, size_t i, bool digits_of_three) {
  if (size_t m = contraction(t, i, true)) return m;
  const uint32_t c = t.cp[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!is_crlf(c) && t.cls[i] != kL && t.cls[i] != kN && i + 1 < t.n() && t.cls[i + 1] == kL)
    return 1 + run_of(t, i + 1, kL);
  if (t.cls[i] == kL) return run_of(t, i, kL);
  // \p{N}{1,3} or \p{N}
  if (t.cls[i] == kN) {
    const size_t r = run_of(t, i, kN);
    return digits_of_three ? (r < 3 ? r : 3) : 1;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t j = i;
  if (c == ' ' && i + 1 < t.n() && t.cls[i + 1] == kO) ++j;
  if (t.cls[j] == kO) {
    j += run_of(t, j, kO);
    while (j < t.n() && is_crlf(t.cp[j])) ++j;
    return j - i;
  }
  // \s*[\r\n]+ : the whitespace run up to and including its last \r or \n
  const size_t w = run_of(t, i, kS);
  for (size_t k = i + w; k > i; --k)
    if (is_crlf(t.cp[k - 1])) return k - i;
  return space_run(t, i);  // \s+(?!\S) | \s+
}

void classify(const std::string& s, Classified* t, std::vector<size_t>* offsets) {
  utf8_decode(s, &t->cp, offsets);
  t->cls.resize(t->cp.size());
  for (size_t k = 0; k < t->cp.size(); ++k) {
    const uint32_t c = t->cp[k];
    t->cls[k] = uni_is_whitespace(c) ? kS : uni_is_letter(c) ? kL : uni_is_number(c) ? kN : kO;
  }
}

struct ByteTable {
  std::string chr[256];
  int byte_of[324];  // the table's code points are all below 324
  ByteTable() {
    for (int& b : byte_of) b = -1;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp =
          printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
      utf8_append(cp, &chr[b]);
      byte_of[cp] = b;
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

const char* const kMetaspace = "\xE2\x96\x81";

}  // namespace

bool split_regex_from_pattern(const std::string& pattern, SplitRegex* out) {
  if (pattern == kGpt2Pattern)
    *out = SplitRegex::kGpt2;
  else if (pattern == kLlama3Pattern)
    *out = SplitRegex::kLlama3;
  else if (pattern == kQwen2Pattern)
    *out = SplitRegex::kQwen2;
  else
    return false;
  return true;
}

void split_by_regex(SplitRegex re, const std::string& s, std::vector<std::string>* out) {
  Classified t;
  std::vector<size_t> off;
  classify(s, &t, &off);
  size_t gap = 0;  // start of text no match has covered yet
  for (size_t i = 0; i < t.n();) {
    size_t m = 0;
    switch (re) {
      case SplitRegex::kGpt2:
        m = match_gpt2(t, i);
        break;
      case SplitRegex::kLlama3:
        m = match_llama3(t, i, true);
        break;
      case SplitRegex::kQwen2:
        m = match_llama3(t, i, false);
        break;
    }
    if (m == 0) {
      ++i;
      continue;
    }
    if (gap < i) out->push_back(s.substr(off[gap], off[i] - off[gap]));
    out->push_back(s.substr(off[i], off[i + m] - off[i]));
    i += m;
    gap = i;
  }
  if (gap < t.n()) out->push_back(s.substr(off[gap]));
}

const std::string& byte_level_char(uint8_t b) { return byte_table().chr[b]; }

int byte_level_byte(uint32_t cp) { return cp < 324 ? byte_table().byte_of[cp] : -1; }

void pre_tokenize(const std::vector<PreTokenizerStep>& steps, bool first_segment,
                  std::vector<std::string>* pieces) {
  std::vector<std::string> next;
  for (const PreTokenizerStep& st : steps) {
    next.clear();
    for (size_t p = 0; p < pieces->size(); ++p) {
      const std::string& s = (*pieces)[p];
      switch (st.type) {
        case PreTokenizerStep::Type::kSplit:
          split_by_regex(st.regex, s, &next);
          break;
        case PreTokenizerStep::Type::kDigits: {
          Classified t;
          std::vector<size_t> off;
          utf8_decode(s, &t.cp, &off);
          size_t start = 0;
          for (size_t k = 0; k < t.cp.size(); ++k) {
            const bool num = uni_is_number(t.cp[k]);
            const bool prev_num = k > 0 && uni_is_number(t.cp[k - 1]);
            // A boundary before every digit (individual) or where digit-ness changes (runs).
            const bool cut = k > 0 && (num != prev_num || (num && st.individual_digits));
            if (cut) {
              next.push_back(s.substr(off[start], off[k] - off[start]));
              start = k;
            }
          }
          if (start < t.cp.size()) next.push_back(s.substr(off[start]));
          break;
        }
        case PreTokenizerStep::Type::kByteLevel: {
          // HF applies the prefix space to every piece that reaches this step.
          std::string src = st.add_prefix_space && !s.empty() && s[0] != ' ' ? " " + s : s;
          std::vector<std::string> parts;
          if (st.use_regex)
            split_by_regex(SplitRegex::kGpt2, src, &parts);
          else
            parts.push_back(std::move(src));
          for (const std::string& part : parts) {
            std::string mapped;
            mapped.reserve(part.size() * 2);
            for (unsigned char b : part) mapped += byte_level_char(b);
            next.push_back(std::move(mapped));
          }
          break;
        }
        case PreTokenizerStep::Type::kMetaspace: {
          std::string m;
          if (st.add_prefix_space && (!st.prefix_first_only || (first_segment && p == 0)) &&
              s.compare(0, 3, kMetaspace) != 0)
            m = kMetaspace;
          for (char c : s) {
            if (c == ' ')
              m += kMetaspace;
            else
              m += c;
          }
          next.push_back(std::move(m));
          break;
        }
      }
    }
    next.erase(
        std::remove_if(next.begin(), next.end(), [](const std::string& x) { return x.empty(); }),
        next.end());
    pieces->swap(next);
  }
}

}  // namespace kvb
