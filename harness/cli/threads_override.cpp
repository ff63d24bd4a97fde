// --threads N of `kvbench run` and `kvbench grid`: shorthand for `--set threads=N`. It edits the config
// exactly as that override does, so the thread count enters the config hash the same way (a run's
// thread count is part of what it measured: its throughput and wall times).

#include <optional>
#include <string>
#include <vector>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"

namespace kvb::cli {

void add_threads_override(CLI::App* sub, std::optional<int64_t>* threads) {
  sub->add_option_function<int64_t>(
      "--threads", [threads](const int64_t& n) { *threads = n; },
      "CPU threads (0: default); the same as --set threads=N, so it is part of the config hash");
}

void apply_threads_override(const std::optional<int64_t>& threads, std::vector<std::string>& sets) {
  if (!threads) return;
  for (const auto& s : sets)
    KVB_CHECK(s.rfind("threads=", 0) != 0, "--threads and --set ", s, " both set the thread count; give one");
  // Appended last, like any --set: the config file's own "threads" is overridden.
  sets.push_back("threads=" + std::to_string(*threads));
}

}  // namespace kvb::cli
