#pragma once
// Text from inputs and results DBs as kvbench shows it: error messages (error.h) and the terminal
// output of the read commands. Control bytes are shown escaped, so that a name holding NUL, a
// newline or a terminal escape sequence neither cuts a message short, splits it, nor drives the
// terminal; and an input's text is bounded, so that a 10 MB name does not make a 10 MB message.
// Header-only and torch-free.

#include <cstddef>
#include <string>
#include <string_view>

namespace kvb {

// An input's text in a message is shown whole up to this many bytes; a longer one is cut to its
// first kShownInputHeadBytes with a marker saying how long it was.
constexpr size_t kMaxShownInputBytes = 300;
constexpr size_t kShownInputHeadBytes = 200;

// `s` with every C0 control byte, DEL and C1 control character (U+0080..U+009F, which some
// terminals obey like ESC [) written as an escape: \0, \t, \r, \n (only when `keep_newlines` is
// false: multi-line output keeps its lines), \xHH and \u00HH. Other bytes, UTF-8 included, are
// kept.
inline std::string escape_control_bytes(std::string_view s, bool keep_newlines = false) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n' && keep_newlines) {
      out += '\n';
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9F) {
      const auto c1 = static_cast<unsigned char>(s[++i]);
      out += "\\u00";
      out += kHex[c1 >> 4];
      out += kHex[c1 & 15];
    } else if (c >= 0x20 && c != 0x7F) {
      out += static_cast<char>(c);
    } else if (c == 0) {
      out += "\\0";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// `s` cut to about `head` bytes (never inside a UTF-8 character) with "... (N bytes in all)" when
// it is longer than `max_bytes`; else `s` itself. Control bytes are left to escape_control_bytes.
inline std::string bounded_text(std::string_view s, size_t max_bytes = kMaxShownInputBytes,
                                size_t head = kShownInputHeadBytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t cut = head < s.size() ? head : s.size();
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "... (" + std::to_string(s.size()) + " bytes in all)";
}

// Text from data in one cell of a Markdown table: '|' and '\\' escaped so the row keeps its cells,
// line breaks made spaces, '<', '>' and '&' written as HTML entities so that a renderer shows them
// instead of taking them for HTML, and other control bytes escaped.
inline std::string markdown_cell(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '|':
        out += "\\|";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
      case '\r':
        out += ' ';
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      default:
        out += c;
    }
  }
  return escape_control_bytes(out);
}

// Text bound for a terminal: control bytes escaped, lines kept.
inline std::string terminal_text(std::string_view s) { return escape_control_bytes(s, true); }

}  // namespace kvb
