#include "harness/common/params.h"

#include <cmath>
#include <cstdint>

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
  }
  return "?";
}

namespace {

std::string range_str(const ParamSpec& s) {
  std::string lo = s.min ? nlohmann::json(*s.min).dump() : "-inf";
  std::string hi = s.max ? nlohmann::json(*s.max).dump() : "inf";
  return "[" + lo + ", " + hi + "]";
}

nlohmann::json check_value(const ParamSpec& s, const nlohmann::json& v, const std::string& where) {
  const std::string key = where + "." + s.name;
  switch (s.type) {
    case ParamType::kInt: {
      // 16 and 16.0 are both accepted as ints; 16.5 is not. A float must also fit int64 before the
      // cast (casting 1e300 is undefined behaviour, in practice INT64_MIN, which a range check with
      // no lower bound would then accept), and an unsigned above INT64_MAX would wrap negative.
      const bool whole_float = v.is_number_float() && std::isfinite(v.get<double>()) &&
                               std::floor(v.get<double>()) == v.get<double>();
      KVB_CHECK(v.is_number_integer() || whole_float, key, ": expected an integer, got ", v.dump());
      constexpr double kTwo63 = 9223372036854775808.0;  // 2^63, exactly representable
      const bool fits = v.is_number_unsigned()
                            ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                            : !whole_float || (v.get<double>() >= -kTwo63 && v.get<double>() < kTwo63);
      KVB_CHECK(fits, key, ": ", v.dump(), " does not fit a 64-bit integer; allowed range ",
                range_str(s));
      const int64_t x = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
      KVB_CHECK((!s.min || x >= *s.min) && (!s.max || x <= *s.max), key, ": ", x,
                " is outside the allowed range ", range_str(s));
      return x;
    }
    case ParamType::kFloat: {
      KVB_CHECK(v.is_number(), key, ": expected a number, got ", v.dump());
      const double x = v.get<double>();
      KVB_CHECK(std::isfinite(x), key, ": expected a finite number, got ", v.dump());
      KVB_CHECK((!s.min || x >= *s.min) && (!s.max || x <= *s.max), key, ": ", x,
                " is outside the allowed range ", range_str(s));
      return x;
    }
    case ParamType::kBool:
      KVB_CHECK(v.is_boolean(), key, ": expected true or false, got ", v.dump());
      return v;
    case ParamType::kString: {
      KVB_CHECK(v.is_string(), key, ": expected a string, got ", v.dump());
      const std::string x = v.get<std::string>();
      if (!s.choices.empty()) {
        bool ok = false;
        for (const auto& c : s.choices) ok = ok || c == x;
        KVB_CHECK(ok, key, ": '", x, "' is not one of ", join(s.choices, ", "),
                  did_you_mean(x, s.choices));
      }
      return x;
    }
  }
  return v;
}

}  // namespace

nlohmann::json resolve_params(const std::vector<ParamSpec>& specs, const nlohmann::json& given,
                              const std::string& where) {
  KVB_CHECK(given.is_null() || given.is_object(), where, ": expected an object of parameters, got ",
            given.dump());
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  if (given.is_object()) {
    for (auto it = given.begin(); it != given.end(); ++it) {
      bool known = false;
      for (const auto& n : names) known = known || n == it.key();
      KVB_CHECK(known, where, ": unknown parameter '", it.key(), "'", did_you_mean(it.key(), names),
                names.empty() ? "; it takes no parameters" : "; known: " + join(names, ", "));
    }
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& s : specs) {
    const bool have = given.is_object() && given.contains(s.name);
    out[s.name] = check_value(s, have ? given[s.name] : s.default_value, where);
  }
  return out;
}

ParamSpec int_param(std::string name, int64_t def, std::optional<double> min,
                    std::optional<double> max, std::string doc) {
  return {std::move(name), ParamType::kInt, def, min, max, {}, std::move(doc)};
}
ParamSpec float_param(std::string name, double def, std::optional<double> min,
                      std::optional<double> max, std::string doc) {
  return {std::move(name), ParamType::kFloat, def, min, max, {}, std::move(doc)};
}
ParamSpec bool_param(std::string name, bool def, std::string doc) {
  return {std::move(name), ParamType::kBool, def, {}, {}, {}, std::move(doc)};
}
ParamSpec string_param(std::string name, std::string def, std::vector<std::string> choices,
                       std::string doc) {
  return {std::move(name), ParamType::kString, def, {}, {}, std::move(choices), std::move(doc)};
}

nlohmann::json param_spec_json(const ParamSpec& s) {
  nlohmann::json j = {{"name", s.name}, {"type", param_type_name(s.type)}, {"default", s.default_value},
                      {"doc", s.doc}};
  if (s.min) j["min"] = *s.min;
  if (s.max) j["max"] = *s.max;
  if (!s.choices.empty()) j["choices"] = s.choices;
  return j;
}

}  // namespace kvb
