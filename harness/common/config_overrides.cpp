#include "harness/common/config_overrides.h"

#include <algorithm>
#include <cstdint>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/limits.h"

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

// A key as messages show it: long ones cut (a path may be megabytes).
std::string shown_key(const std::string& key) {
  constexpr size_t kShown = 80;
  return key.size() <= kShown
             ? key
             : key.substr(0, kShown) + "... (" + std::to_string(key.size()) + " bytes)";
}

}  // namespace

std::vector<std::string> split_key_path(const std::string& key, const std::string& where) {
  const size_t n = static_cast<size_t>(std::count(key.begin(), key.end(), '.')) + 1;
  KVB_CHECK(n <= kMaxKeyPathComponents, where, ": the key '", shown_key(key), "' has ", n,
            " components, more than the ", kMaxKeyPathComponents, " levels a config may nest");
  std::vector<std::string> parts;
  parts.reserve(n);
  size_t start = 0;
  for (;;) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    KVB_CHECK(!parts.back().empty(), where, ": '", shown_key(key), "' has an empty component");
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

void apply_overrides(nlohmann::json& config, const std::vector<std::string>& sets) {
  for (const auto& s : sets) {
    const size_t bad = invalid_utf8_at(s);
    KVB_CHECK(bad == std::string::npos, "--set: argument is not valid UTF-8 (byte ", bad, ")");
    const auto eq = s.find('=');
    KVB_CHECK(eq != std::string::npos && eq > 0, "--set '", shown_key(s), "': expected key=value");
    const std::string key = s.substr(0, eq), text = s.substr(eq + 1);
    const std::vector<std::string> parts = split_key_path(key, "--set");
    nlohmann::json value;
    if (!parse_json_if_valid(text, "--set '" + shown_key(s) + "'", &value))
      value = text;  // bare words are strings: --set method.name=paged
    nlohmann::json* node = &config;
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string& part = parts[i];
      if (!node->is_object()) *node = nlohmann::json::object();
      if (i + 1 == parts.size()) {
        (*node)[part] = value;
        break;
      }
      // "method.params.x" on a config whose method is the string shorthand: expand it first.
      if (part == "method" && node == &config && config.contains("method") &&
          config["method"].is_string())
        config["method"] = {{"name", config["method"]}};
      node = &(*node)[part];
    }
  }
}

}  // namespace kvb
