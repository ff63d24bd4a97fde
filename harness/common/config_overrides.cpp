#include "harness/common/config_overrides.h"

#include <cstdint>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"

namespace kvb {

namespace {

// Offset of the first byte that breaks UTF-8 (overlongs, surrogates and > U+10FFFF included), or
// npos. A bare-word value becomes a JSON string, and nlohmann refuses to dump invalid UTF-8 (found
// by fuzz_set_grammar: an uncaught type_error when the config was hashed or printed).
size_t invalid_utf8_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;  // truncated sequence
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    static const uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n + 1;
  }
  return std::string::npos;
}

}  // namespace

void apply_overrides(nlohmann::json& config, const std::vector<std::string>& sets) {
  for (const auto& s : sets) {
    const size_t bad = invalid_utf8_at(s);
    KVB_CHECK(bad == std::string::npos, "--set: argument is not valid UTF-8 (byte ", bad, ")");
    const auto eq = s.find('=');
    KVB_CHECK(eq != std::string::npos && eq > 0, "--set '", s, "': expected key=value");
    const std::string key = s.substr(0, eq), text = s.substr(eq + 1);
    nlohmann::json value;
    if (!parse_json_if_valid(text, "--set '" + s + "'", &value))
      value = text;  // bare words are strings: --set method.name=paged
    nlohmann::json* node = &config;
    size_t start = 0;
    for (;;) {
      const size_t dot = key.find('.', start);
      const std::string part = key.substr(start, dot - start);
      KVB_CHECK(!part.empty(), "--set '", s, "': empty key component");
      if (!node->is_object()) *node = nlohmann::json::object();
      if (dot == std::string::npos) {
        (*node)[part] = value;
        break;
      }
      // "method.params.x" on a config whose method is the string shorthand: expand it first.
      if (part == "method" && node == &config && config.contains("method") &&
          config["method"].is_string())
        config["method"] = {{"name", config["method"]}};
      node = &(*node)[part];
      start = dot + 1;
    }
  }
}

}  // namespace kvb
