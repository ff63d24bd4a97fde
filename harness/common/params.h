#pragma once
// Typed parameter schemas: every method (and protocol) declares its parameters once — type, default,
// range or choices, doc — and user input is validated against them in one place. Torch-free.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvb {

enum class ParamType { kInt, kFloat, kBool, kString };

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::kInt;
  nlohmann::json default_value;
  std::optional<double> min, max;     // inclusive, numbers only
  std::vector<std::string> choices;   // strings only; empty: any
  std::string doc;
};

const char* param_type_name(ParamType t);

// Validates `given` (a JSON object, or null for "all defaults") against `specs` and returns the full
// resolved object with defaults filled in. Unknown keys are errors with a nearest-name hint; type,
// range and choice errors name `where`, the key, the value and what is allowed.
nlohmann::json resolve_params(const std::vector<ParamSpec>& specs, const nlohmann::json& given,
                              const std::string& where);

// Convenience constructors for schema tables.
ParamSpec int_param(std::string name, int64_t def, std::optional<double> min,
                    std::optional<double> max, std::string doc);
ParamSpec float_param(std::string name, double def, std::optional<double> min,
                      std::optional<double> max, std::string doc);
ParamSpec bool_param(std::string name, bool def, std::string doc);
ParamSpec string_param(std::string name, std::string def, std::vector<std::string> choices,
                       std::string doc);

nlohmann::json param_spec_json(const ParamSpec& s);

}  // namespace kvb
