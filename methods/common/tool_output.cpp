#include "methods/common/tool_output.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "harness/common/internal_error.h"

namespace kvb {

void add_quiet_flag(CLI::App* sub, bool* quiet) {
  sub->add_flag("--quiet,-q", *quiet, "no progress lines");
}

ProgressLog tool_progress(const std::string& tool, bool quiet) {
  if (quiet) return nullptr;
  return [tool](const std::string& line) { std::cerr << tool << ": " << line << "\n"; };
}

void print_tool_summary(const nlohmann::json& summary) { std::cout << summary.dump(2) << "\n"; }

void print_trained_adapter(const std::string& path, int64_t steps, nlohmann::json results) {
  KVB_ASSERT(results.is_object() && !results.contains("adapter") && !results.contains("steps"),
             "tool_output", "a trainer's results restate the adapter or its steps");
  results["adapter"] = path;
  results["steps"] = steps;
  print_tool_summary(results);
}

}  // namespace kvb
