// kvbench: the command-line entry point. Results go to stdout, logs to stderr; a user error prints one
// line and exits 2, an internal error exits 1.

#include <CLI/CLI.hpp>

#include <iostream>

#include "harness/engine/thread_policy.h"
#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/kv/plugin.h"

int main(int argc, char** argv) {
  kvb::apply_thread_policy(0);  // one thread pool from the start; configs may set a count later
  CLI::App app{"kvbench: a benchmark and evaluation harness for KV-cache compression methods"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kvbench ") + KVB_VERSION_STRING);
  kvb::cli::register_generate(app);
  kvb::cli::register_score(app);
  kvb::cli::register_inspect(app);
  kvb::cli::register_bench(app);
  kvb::cli::register_methods(app);
  kvb::cli::register_protocols(app);
  kvb::cli::register_run(app);
  kvb::cli::register_grid(app);
  kvb::cli::register_merge(app);
  kvb::cli::register_leaderboard(app);
  kvb::cli::register_compare(app);
  kvb::cli::register_train(app);
  kvb::cli::register_kvtuner_search(app);
  kvb::cli::register_dms_train(app);
  kvb::cli::register_packet_train(app);
  kvb::cli::register_tokenize(app);
  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins, "load KV methods and protocols from a plugin shared library (repeatable)")
      ->each([](const std::string& p) { kvb::load_plugin(p); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const kvb::Error& e) {
    std::cerr << "kvbench: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kvbench: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
