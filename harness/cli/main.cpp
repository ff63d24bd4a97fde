// kvbench: the command-line entry point. Results go to stdout, logs to stderr; a user error prints one
// line and exits 2, an internal error exits 1 (harness/common/exit_status.h).

#include <CLI/CLI.hpp>

#include <cstring>
#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/exit_status.h"
#include "harness/engine/thread_policy.h"
#include "harness/kv/plugin.h"
#include "harness/store/build_info.h"
#include "harness/tool/tool_registry.h"

namespace {

// The plugins named before the subcommand (`kvbench --plugin a.so --plugin=b.so <subcommand> ...`),
// loaded before the subcommands exist so that a plugin's tools (KVB_REGISTER_TOOL) become
// subcommands like the built-in ones. Only the main command's own arguments are looked at: the
// first word that is neither an option nor --plugin's value is the subcommand.
void load_plugins_named_in(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strcmp(arg, "--plugin") == 0) {
      if (i + 1 < argc) kvb::load_plugin(argv[++i]);  // a missing value is CLI11's error to report
    } else if (std::strncmp(arg, "--plugin=", 9) == 0) {
      kvb::load_plugin(arg + 9);
    } else if (arg[0] != '-') {
      return;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  kvb::apply_thread_policy(0);  // one thread pool from the start; configs may set a count later
  CLI::App app{"kvbench: a benchmark and evaluation harness for KV-cache compression methods"};
  try {
    const auto broken = kvb::ToolRegistry::instance().take_registration_errors();
    KVB_ASSERT(broken.empty(), "tool_registry", "a built-in tool failed to register: ", broken.front());
    load_plugins_named_in(argc, argv);
    app.require_subcommand(1);
    app.set_version_flag("--version", "kvbench " + kvb::kvbench_version_string());
    kvb::cli::register_generate(app);
    kvb::cli::register_score(app);
    kvb::cli::register_inspect(app);
    kvb::cli::register_bench(app);
    kvb::cli::register_methods(app);
    kvb::cli::register_protocols(app);
    kvb::cli::register_run(app);
    kvb::cli::register_profile(app);
    kvb::cli::register_grid(app);
    kvb::cli::register_merge(app);
    kvb::cli::register_leaderboard(app);
    kvb::cli::register_compare(app);
    kvb::cli::register_reproduce(app);
    kvb::cli::register_show(app);
    kvb::cli::register_train(app);
    // The methods' tools (kvtuner-search, dms-train, packet-train, and any plugin's), by name.
    kvb::ToolRegistry::instance().add_subcommands(app);
    kvb::cli::register_tokenize(app);
    std::vector<std::string> plugins;  // loaded above; the option stays for --help and validation
    app.add_option("--plugin", plugins, "load KV methods, protocols and tools from a plugin shared library (repeatable)");
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (...) {
    return kvb::report_failure(std::current_exception(), "kvbench", std::cerr);
  }
  return 0;
}
