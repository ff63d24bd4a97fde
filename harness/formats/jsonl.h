#pragma once
// Strict JSON-lines reading shared by the dataset and trace readers: one JSON object a line, blank
// lines ignored, every error located as "FILE:LINE: ..." and naming the field, or (on request) bad
// lines skipped and counted so that a long file with a few broken rows can still be used knowingly.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

struct JsonlOptions {
  // false: the first bad line throws kvb::Error. true: bad lines are skipped and counted.
  bool skip_bad_lines = false;
};

struct JsonlStats {
  size_t lines = 0;        // physical lines in the file, blank ones included
  size_t records = 0;      // lines accepted by the record callback
  size_t blank_lines = 0;  // lines holding only whitespace
  size_t bad_lines = 0;    // lines skipped (only with skip_bad_lines)
  // "FILE:LINE: message" of the first kMaxKeptErrors skipped lines, so a report can show why.
  std::vector<std::string> bad_line_errors;
  static constexpr size_t kMaxKeptErrors = 20;
};

// Reads `path` line by line. Each non-blank line must parse as a JSON object; it is passed with its
// 1-based line number to `on_record`, which throws kvb::Error (without a location) for an invalid
// record. Errors are rethrown, or recorded when skipping, prefixed with "PATH:LINE: ". A trailing
// "\r" (CRLF files) is dropped. A file that cannot be opened always throws.
JsonlStats read_jsonl(
    const std::string& path, const JsonlOptions& options,
    const std::function<void(const nlohmann::json& record, size_t line)>& on_record);

// Field accessors for JSON objects. They throw kvb::Error naming the field and what was found, e.g.
// "field 'answers': expected an array of strings, element 2 is a number".
const nlohmann::json& json_require(const nlohmann::json& object, std::string_view field);
std::string json_string(const nlohmann::json& object, std::string_view field);
int64_t json_int(const nlohmann::json& object, std::string_view field,
                 int64_t min_value = std::numeric_limits<int64_t>::min(),
                 int64_t max_value = std::numeric_limits<int64_t>::max());
bool json_bool(const nlohmann::json& object, std::string_view field);
std::vector<std::string> json_string_array(const nlohmann::json& object, std::string_view field);
// Checks that every key of `object` is in `allowed`; an unknown key throws with a nearest-name
// hint.
void json_check_keys(const nlohmann::json& object, const std::vector<std::string>& allowed,
                     std::string_view what);

}  // namespace kvb
