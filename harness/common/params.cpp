#include "harness/common/params.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "harness/common/error.h"
#include "harness/common/strings.h"

namespace kvb {

const char* param_type_name(ParamType t) {
  switch (t) {
    case ParamType::kInt:
      return "int";
    case ParamType::kFloat:
      return "float";
    case ParamType::kBool:
      return "bool";
    case ParamType::kString:
      return "string";
    case ParamType::kStringList:
      return "string list";
    case ParamType::kSection:
      return "section";
  }
  return "?";
}

namespace {

// 4096 for a whole number (int bounds are stored as doubles; "4096.0" would read as a float),
// else the shortest JSON form.
std::string number_str(double x) {
  if (std::isfinite(x) && std::floor(x) == x && std::fabs(x) < 1e15)
    return std::to_string(static_cast<int64_t>(x));
  return nlohmann::json(x).dump();
}

std::string range_str(const ParamSpec& s) {
  std::string lo = s.min ? number_str(*s.min) : "-inf";
  std::string hi = s.max ? number_str(*s.max) : "inf";
  return (s.min_open ? "(" : "[") + lo + ", " + hi + (s.max_open ? ")" : "]");
}

bool in_range(const ParamSpec& s, double x) {
  const bool above = !s.min || (s.min_open ? x > *s.min : x >= *s.min);
  return above && (!s.max || (s.max_open ? x < *s.max : x <= *s.max));
}

// "<owner>.<name>", or "<file>: <name>" for an owner that is a file alone.
std::string param_key(const std::string& owner, const std::string& name) {
  return ends_with(owner, ": ") ? owner + name : owner + "." + name;
}

// The owner as an error's subject: "recipe.json" for "recipe.json: ".
std::string owner_subject(const std::string& owner) {
  return ends_with(owner, ": ") ? owner.substr(0, owner.size() - 2) : owner;
}

// What else besides the type's own values a parameter takes, for "expected ..." messages.
std::string extra_values(const ParamSpec& s) {
  std::string out;
  if (s.accepts_auto) out += " or \"auto\"";
  if (s.nullable) out += " or null";
  return out;
}

nlohmann::json check_value(const ParamSpec& s, const nlohmann::json& v, const std::string& owner) {
  const std::string key = param_key(owner, s.name);
  if (s.nullable && v.is_null()) return v;
  if (s.accepts_auto && v.is_string() && v.get<std::string>() == "auto") return v;
  switch (s.type) {
    case ParamType::kInt: {
      // 16 and 16.0 are both accepted as ints; 16.5 is not. A float must also fit int64 before the
      // cast (casting 1e300 is undefined behaviour, in practice INT64_MIN, which a range check with
      // no lower bound would then accept), and an unsigned above INT64_MAX would wrap negative.
      const bool whole_float = v.is_number_float() && std::isfinite(v.get<double>()) &&
                               std::floor(v.get<double>()) == v.get<double>();
      KVB_CHECK(v.is_number_integer() || whole_float, key, ": expected an integer", extra_values(s),
                ", got ", v.dump());
      constexpr double kTwo63 = 9223372036854775808.0;  // 2^63, exactly representable
      const bool fits =
          v.is_number_unsigned()
              ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
              : !whole_float || (v.get<double>() >= -kTwo63 && v.get<double>() < kTwo63);
      KVB_CHECK(fits, key, ": ", v.dump(), " does not fit a 64-bit integer; allowed range ",
                range_str(s));
      const int64_t x =
          v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
      KVB_CHECK(in_range(s, static_cast<double>(x)), key, ": ", x, " is outside the allowed range ",
                range_str(s));
      return x;
    }
    case ParamType::kFloat: {
      KVB_CHECK(v.is_number(), key, ": expected a number", extra_values(s), ", got ", v.dump());
      const double x = v.get<double>();
      KVB_CHECK(std::isfinite(x), key, ": expected a finite number, got ", v.dump());
      KVB_CHECK(in_range(s, x), key, ": ", x, " is outside the allowed range ", range_str(s));
      return x;
    }
    case ParamType::kBool:
      KVB_CHECK(v.is_boolean(), key, ": expected true or false", extra_values(s), ", got ",
                v.dump());
      return v;
    case ParamType::kString: {
      KVB_CHECK(v.is_string(), key, ": expected a string", extra_values(s), ", got ", v.dump());
      std::string x = v.get<std::string>();
      for (const auto& [alias, choice] : s.aliases)
        if (x == alias) x = choice;
      if (!s.choices.empty()) {
        bool ok = false;
        for (const auto& c : s.choices) ok = ok || c == x;
        KVB_CHECK(ok, key, ": '", x, "' is not one of ", join(s.choices, ", "),
                  s.accepts_auto ? ", auto" : "", did_you_mean(x, s.choices));
      }
      return x;
    }
    case ParamType::kStringList: {
      bool ok = v.is_array();
      for (size_t i = 0; ok && i < v.size(); ++i) ok = v[i].is_string();
      KVB_CHECK(ok, key, ": expected a list of strings", extra_values(s), ", got ", v.dump());
      return v;
    }
    case ParamType::kSection:
      KVB_CHECK(v.is_object() || v.is_array(), key, ": expected an object or a list of objects",
                extra_values(s), ", got ", v.dump());
      return v;
  }
  return v;
}

}  // namespace

nlohmann::json resolve_params(const std::vector<ParamSpec>& specs, const nlohmann::json& given,
                              const std::string& owner) {
  const std::string subject = owner_subject(owner);
  KVB_CHECK(given.is_null() || given.is_object(), subject,
            ": expected an object of parameters, got ", given.dump());
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  if (given.is_object()) {
    for (auto it = given.begin(); it != given.end(); ++it) {
      bool known = false;
      for (const auto& n : names) known = known || n == it.key();
      KVB_CHECK(known, subject, ": unknown parameter '", it.key(), "'",
                did_you_mean(it.key(), names),
                (names.empty() ? "; it takes no parameters" : "; known: " + join(names, ", ")).c_str());
    }
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& s : specs) {
    const bool have = given.is_object() && given.contains(s.name);
    if (!have && s.default_value.is_null() && !s.nullable) continue;  // no default: left out
    out[s.name] = check_value(s, have ? given[s.name] : s.default_value, owner);
  }
  return out;
}

bool param_is_auto(const nlohmann::json& resolved, const std::string& name) {
  const auto it = resolved.find(name);
  return it != resolved.end() && it->is_string() && it->get<std::string>() == "auto";
}

namespace {

// One item of a list, parsed whole as a number ("12x" and "1 " are not numbers; leading blanks
// are skipped, as every list parser before this one did, so "1, 4" stays valid).
bool parse_list_number(const std::string& item, bool integer, double* out) {
  if (item.find_first_not_of(" \t") == std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  if (integer) {
    const long long v = std::strtoll(item.c_str(), &end, 10);
    *out = static_cast<double>(v);
  } else {
    *out = std::strtod(item.c_str(), &end);
  }
  return errno == 0 && end && *end == '\0' && std::isfinite(*out);
}

std::vector<double> parse_number_list(std::string_view text, const std::string& key,
                                      const std::string& what, double min, double max, bool integer,
                                      bool unique) {
  std::vector<double> out;
  for (const std::string& item : split(text, ',')) {
    double v = 0;
    KVB_CHECK(parse_list_number(item, integer, &v) && v >= min && v <= max, key, ": '", item,
              "' is not a ", what, " in [", number_str(min), ", ", number_str(max),
              "] (a comma-separated list)");
    KVB_CHECK(!unique || std::find(out.begin(), out.end(), v) == out.end(), key, ": ",
              integer ? number_str(v) : item, " is given twice");
    out.push_back(v);
  }
  return out;
}

}  // namespace

std::vector<int64_t> parse_int_list(std::string_view text, const std::string& key,
                                    const std::string& what, int64_t min, int64_t max,
                                    bool unique) {
  std::vector<int64_t> out;
  for (double v : parse_number_list(text, key, what, static_cast<double>(min),
                                    static_cast<double>(max), true, unique))
    out.push_back(static_cast<int64_t>(v));
  return out;
}

std::vector<double> parse_float_list(std::string_view text, const std::string& key,
                                     const std::string& what, double min, double max) {
  return parse_number_list(text, key, what, min, max, false, false);
}

namespace {

ParamSpec make_spec(std::string name, ParamType type, nlohmann::json def, std::optional<double> min,
                    std::optional<double> max, std::vector<std::string> choices, std::string doc) {
  ParamSpec s;
  s.name = std::move(name);
  s.type = type;
  s.default_value = std::move(def);
  s.min = min;
  s.max = max;
  s.choices = std::move(choices);
  s.doc = std::move(doc);
  return s;
}

}  // namespace

ParamSpec int_param(std::string name, int64_t def, std::optional<double> min,
                    std::optional<double> max, std::string doc) {
  return make_spec(std::move(name), ParamType::kInt, def, min, max, {}, std::move(doc));
}
ParamSpec float_param(std::string name, double def, std::optional<double> min,
                      std::optional<double> max, std::string doc) {
  return make_spec(std::move(name), ParamType::kFloat, def, min, max, {}, std::move(doc));
}
ParamSpec bool_param(std::string name, bool def, std::string doc) {
  return make_spec(std::move(name), ParamType::kBool, def, {}, {}, {}, std::move(doc));
}
ParamSpec string_param(std::string name, std::string def, std::vector<std::string> choices,
                       std::string doc) {
  return make_spec(std::move(name), ParamType::kString, def, {}, {}, std::move(choices),
                   std::move(doc));
}

ParamSpec string_list_param(std::string name, std::vector<std::string> def, std::string doc) {
  return make_spec(std::move(name), ParamType::kStringList, def, {}, {}, {}, std::move(doc));
}

ParamSpec section_param(std::string name, std::string doc) {
  return make_spec(std::move(name), ParamType::kSection, nullptr, {}, {}, {}, std::move(doc));
}

nlohmann::json param_spec_json(const ParamSpec& s) {
  nlohmann::json j = {{"name", s.name},
                      {"type", param_type_name(s.type)},
                      {"default", s.default_value},
                      {"doc", s.doc}};
  if (s.min) j["min"] = *s.min;
  if (s.max) j["max"] = *s.max;
  if (!s.choices.empty()) j["choices"] = s.choices;
  // Only where used, so that listings of parameters without them are unchanged.
  if (s.min_open) j["min_open"] = true;
  if (s.max_open) j["max_open"] = true;
  if (s.accepts_auto) j["auto"] = true;
  if (s.nullable) j["nullable"] = true;
  if (!s.aliases.empty()) {
    nlohmann::json a = nlohmann::json::object();
    for (const auto& [alias, choice] : s.aliases) a[alias] = choice;
    j["aliases"] = a;
  }
  return j;
}

}  // namespace kvb
