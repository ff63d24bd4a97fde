#pragma once
// kvbench's one parameter system: methods, protocols, synthetic tasks and training recipes declare
// their parameters once -- type, default, range or choices (enums from one name table), whether
// "auto" or null is a value, doc -- and user input is validated against them in one place, with one
// error style: "<owner>.<parameter>: <what is wrong>; <what is allowed>". Comma-separated list
// values go through parse_int_list / parse_float_list. Torch-free.

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "harness/common/enum_names.h"

namespace kvb {

enum class ParamType {
  kInt,
  kFloat,
  kBool,
  kString,
  kStringList,  // a JSON array of strings (a recipe's corpora)
  kSection,     // an object or an array of objects with a table of its own, resolved by the owner
};

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::kInt;
  // The value when the parameter is not given. null: no default -- the resolved object leaves the
  // parameter out (its owner decides, e.g. from other settings), unless `nullable`, where null is
  // the default value itself.
  nlohmann::json default_value;
  std::optional<double> min, max;    // inclusive, numbers only
  std::vector<std::string> choices;  // strings only; empty: any
  std::string doc;
  // Other spellings of a choice, resolved to the choice ({"essay", "corpus"}): the resolved value,
  // and so every hash, holds the choice only.
  std::vector<std::pair<std::string, std::string>> aliases;
  bool min_open = false;      // the range excludes min: (min, max]
  bool max_open = false;      // the range excludes max: [min, max)
  bool accepts_auto = false;  // the string "auto" is a value too (its owner resolves it later)
  bool nullable = false;      // null is a value too

  // Modifiers for schema tables: int_param(...).or_auto().
  ParamSpec or_auto() && {
    accepts_auto = true;
    return std::move(*this);
  }
  ParamSpec or_null() && {
    nullable = true;
    return std::move(*this);
  }
  ParamSpec above_min() && {
    min_open = true;
    return std::move(*this);
  }
  ParamSpec below_max() && {
    max_open = true;
    return std::move(*this);
  }
  ParamSpec with_aliases(std::vector<std::pair<std::string, std::string>> a) && {
    aliases = std::move(a);
    return std::move(*this);
  }
  // A parameter without a default (see default_value).
  ParamSpec unset_by_default() && {
    default_value = nullptr;
    return std::move(*this);
  }
};

const char* param_type_name(ParamType t);

// Validates `given` (a JSON object, or null for "all defaults") against `specs` and returns the
// full resolved object with defaults filled in. `owner` names whose parameters they are ("method
// snapkv", "task vt", "config.protocol", "recipe.json: optim"); an owner that is a file alone ends
// in ": " ("recipe.json: "), and its keys then read "recipe.json: seed". Unknown keys are errors
// with a nearest-name hint and the known names; type, range and choice errors name
// "<owner>.<key>", the value and what is allowed.
nlohmann::json resolve_params(const std::vector<ParamSpec>& specs, const nlohmann::json& given,
                              const std::string& owner);

// Convenience constructors for schema tables.
ParamSpec int_param(std::string name, int64_t def, std::optional<double> min,
                    std::optional<double> max, std::string doc);
ParamSpec float_param(std::string name, double def, std::optional<double> min,
                      std::optional<double> max, std::string doc);
ParamSpec bool_param(std::string name, bool def, std::string doc);
ParamSpec string_param(std::string name, std::string def, std::vector<std::string> choices,
                       std::string doc);
ParamSpec string_list_param(std::string name, std::vector<std::string> def, std::string doc);
// A nested section (a recipe's "optim"), left out when not given; its owner resolves it against its
// own table.
ParamSpec section_param(std::string name, std::string doc);

// The names of an enum's table, in table order.
template <typename E, std::size_t N>
std::vector<std::string> enum_choices(const EnumName<E> (&names)[N]) {
  std::vector<std::string> out;
  for (const auto& n : names) out.emplace_back(n.name);
  return out;
}

// A string parameter whose choices are an enum's name table (enum_names.h), so the schema, the
// parser and the printed name cannot disagree.
template <typename E, std::size_t N>
ParamSpec enum_param(std::string name, const EnumName<E> (&names)[N], E def, std::string doc) {
  return string_param(std::move(name), enum_name(names, def), enum_choices(names), std::move(doc));
}

// A resolved enum parameter read back as its value.
template <typename E, std::size_t N>
E param_enum(const nlohmann::json& resolved, const std::string& name,
             const EnumName<E> (&names)[N]) {
  return parse_enum(names, resolved.at(name).get<std::string>(), name.c_str());
}

// Whether a resolved parameter holds "auto" (a parameter declared or_auto()).
bool param_is_auto(const nlohmann::json& resolved, const std::string& name);

// Comma-separated list values ("512,2048"), item by item: each an integer (or number) in
// [min, max], else "<key>: '<item>' is not a <what> in [min, max] (a comma-separated list)".
// `unique`: an item given twice is an error too. Empty items ("", "1,,2") are errors.
std::vector<int64_t> parse_int_list(std::string_view text, const std::string& key,
                                    const std::string& what, int64_t min, int64_t max,
                                    bool unique = false);
std::vector<double> parse_float_list(std::string_view text, const std::string& key,
                                     const std::string& what, double min, double max);

nlohmann::json param_spec_json(const ParamSpec& s);

}  // namespace kvb
