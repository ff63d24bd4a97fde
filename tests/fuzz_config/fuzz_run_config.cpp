// libFuzzer target for run and grid configs, the path from a user's JSON to the runs it makes:
// parsing (depth-limited), `--set` overrides, resolution against the method and protocol registries
// (every built-in method and protocol is linked in), grid expansion with its exclusions,
// de-duplication and cell limit, the config hash and the dataset label. Input: a JSON document,
// then optionally a line "--" and one --set argument per line. A document with "base" or "axes" is
// a grid, anything else a run config. Every input must end in a result or a kvb::Error; anything
// else (an InternalError, a JSON library exception, a crash, a sanitizer report) is a finding.
// Model and data files are not looked up (the grid's check_inputs is off): the target reads no
// file.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/eval/grid.h"
#include "harness/eval/run_config.h"

namespace {

// A resolved config is what the store records and what later commands read back: resolving it
// again must succeed and change nothing.
void check_fixed_point(const nlohmann::json& resolved) {
  nlohmann::json again;
  try {
    again = kvb::resolve_run_config(resolved);
  } catch (const kvb::Error& e) {
    std::fprintf(stderr, "a resolved config does not resolve again: %s\n%s\n", e.what(),
                 resolved.dump().c_str());
    std::abort();
  }
  if (kvb::run_config_hash(again) != kvb::run_config_hash(resolved)) {
    std::fprintf(stderr, "resolving a resolved config changed it:\n%s\n%s\n",
                 resolved.dump().c_str(), again.dump().c_str());
    std::abort();
  }
}

void resolve_one(const nlohmann::json& raw, const std::vector<std::string>& sets) {
  nlohmann::json cfg = raw;
  kvb::apply_overrides(cfg, sets);
  const nlohmann::json resolved = kvb::resolve_run_config(cfg);
  check_fixed_point(resolved);
  (void)kvb::run_dataset_label(resolved);
}

void expand(const nlohmann::json& grid, const std::vector<std::string>& sets) {
  kvb::GridOptions options;
  options.check_inputs = false;
  options.sets = sets;
  options.default_name = "fuzz";
  // The cell limit's checks, at a scale where every input stays fast: a grid of the real limit
  // (100,000 cells) is legitimate and takes tens of seconds to plan under ASan.
  options.max_cells = 2000;
  const kvb::GridPlan plan = kvb::expand_grid(grid, options);
  size_t shard_total = 0;
  for (int64_t i = 0; i < 3; ++i) shard_total += kvb::shard_cells(plan.cells, {i, 3}).size();
  if (shard_total != plan.cells.size()) __builtin_trap();
  for (const auto& c : plan.cells) {
    (void)kvb::method_label(c.resolved["method"]);
    if (c.expected_samples < 0) __builtin_trap();
  }
  check_fixed_point(plan.cells.front().resolved);  // expand_grid refuses a grid of no cells
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t sep = in.find("\n--\n");
  std::vector<std::string> sets;
  if (sep != std::string::npos) {
    size_t start = sep + 4;
    while (start <= in.size()) {
      const size_t nl = in.find('\n', start);
      sets.push_back(in.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
      if (nl == std::string::npos) break;
      start = nl + 1;
    }
  }
  try {
    const nlohmann::json doc = kvb::parse_json(in.substr(0, sep), "<fuzz config>");
    if (doc.is_object() && (doc.contains("base") || doc.contains("axes"))) {
      expand(doc, sets);
    } else {
      resolve_one(doc, sets);
    }
  } catch (const kvb::Error&) {
    // The expected outcome of a bad config: one line naming the input.
  }
  return 0;
}
