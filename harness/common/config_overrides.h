#pragma once
// The `--set a.b.c=value` grammar of `kvbench run` and `kvbench grid`. Torch-free, so that it can
// be fuzzed (tests/fuzz/fuzz_set_grammar.cpp) without LibTorch.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvb {

// "a.b.c" -> {"a", "b", "c"}. Throws kvb::Error starting with `where` for an empty component or
// more than kMaxKeyPathComponents of them (limits.h), before anything is built from the path.
std::vector<std::string> split_key_path(const std::string& key, const std::string& where);

// Applies "a.b.c=value" overrides (value parsed as JSON when it parses, else taken as a string).
void apply_overrides(nlohmann::json& config, const std::vector<std::string>& sets);

}  // namespace kvb
