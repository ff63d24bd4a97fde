#include "harness/formats/jsonl.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/strings.h"

namespace kvb {

namespace {

bool is_blank(std::string_view s) {
  for (char c : s) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') return false;
  }
  return true;
}

// A short rendering of a JSON value for error messages: long strings and containers are cut so that
// a bad 100 kB context does not flood the terminal.
std::string describe(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}

}  // namespace

JsonlStats read_jsonl(const std::string& path, const JsonlOptions& options,
                      const std::function<void(const nlohmann::json&, size_t)>& on_record) {
  check_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  KVB_CHECK(in.good(), path, ": cannot open: ", std::strerror(errno));
  JsonlStats stats;
  std::string line;
  while (std::getline(in, line)) {
    ++stats.lines;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (is_blank(line)) {
      ++stats.blank_lines;
      continue;
    }
    std::string where = path + ":" + std::to_string(stats.lines);
    try {
      // nlohmann's message says "parse error at line 1, column N": the column is the useful part.
      nlohmann::json record = parse_json(line, "record");
      KVB_CHECK(record.is_object(), "expected a JSON object, got ", describe(record));
      on_record(record, stats.lines);
      ++stats.records;
    } catch (const Error& e) {
      std::string message = where + ": " + e.what();
      if (!options.skip_bad_lines) throw Error(message);
      ++stats.bad_lines;
      if (stats.bad_line_errors.size() < JsonlStats::kMaxKeptErrors) {
        stats.bad_line_errors.push_back(std::move(message));
      }
    }
  }
  KVB_CHECK(!in.bad(), path, ": read error after line ", stats.lines, ": ", std::strerror(errno));
  return stats;
}

const nlohmann::json& json_require(const nlohmann::json& object, std::string_view field) {
  auto it = object.find(std::string(field));
  KVB_CHECK(it != object.end(), "missing field '", field, "'");
  return *it;
}

std::string json_string(const nlohmann::json& object, std::string_view field) {
  const nlohmann::json& v = json_require(object, field);
  KVB_CHECK(v.is_string(), "field '", field, "': expected a string, got ", describe(v));
  return v.get<std::string>();
}

int64_t json_int(const nlohmann::json& object, std::string_view field, int64_t min_value,
                 int64_t max_value) {
  const nlohmann::json& v = json_require(object, field);
  KVB_CHECK(v.is_number_integer(), "field '", field, "': expected an integer, got ", describe(v));
  // An unsigned value above INT64_MAX would wrap in get<int64_t>(); reject it as out of range.
  bool too_big = v.is_number_unsigned() &&
                 v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  int64_t x = too_big ? 0 : v.get<int64_t>();
  KVB_CHECK(!too_big && x >= min_value && x <= max_value, "field '", field, "': value ", v.dump(),
            " is outside [", min_value, ", ", max_value, "]");
  return x;
}

bool json_bool(const nlohmann::json& object, std::string_view field) {
  const nlohmann::json& v = json_require(object, field);
  KVB_CHECK(v.is_boolean(), "field '", field, "': expected true or false, got ", describe(v));
  return v.get<bool>();
}

std::vector<std::string> json_string_array(const nlohmann::json& object, std::string_view field) {
  const nlohmann::json& v = json_require(object, field);
  KVB_CHECK(v.is_array(), "field '", field, "': expected an array of strings, got ", describe(v));
  std::vector<std::string> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    KVB_CHECK(v[i].is_string(), "field '", field, "': expected an array of strings, element ", i,
              " is ", describe(v[i]));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

void json_check_keys(const nlohmann::json& object, const std::vector<std::string>& allowed,
                     std::string_view what) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool known = false;
    for (const auto& a : allowed) known = known || a == it.key();
    KVB_CHECK(known, what, ": unknown field '", it.key(), "'", did_you_mean(it.key(), allowed),
              "; allowed: ", join(allowed, ", "));
  }
}

}  // namespace kvb
