// kvbench: the command-line entry point. Results go to stdout, logs to stderr; a user error prints one
// line and exits 2, an internal error exits 1 (harness/common/exit_status.h).

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

// A standard stream closed by the caller (`kvbench ... >&-`) would let the next file kvbench opens
// take its descriptor, and results printed to "stdout" would land in that file (a baseline cache, a
// page). Each closed one gets /dev/null instead; stdout read-only, so that a write to it still fails
// and is reported below rather than vanishing.
void reserve_standard_descriptors() {
  const int modes[3] = {O_RDONLY, O_RDONLY, O_WRONLY};
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int got = ::open("/dev/null", modes[fd]);
    if (got != fd && got >= 0) ::close(got);  // lower ones were open: it took the lowest free one
  }
}

// Results go to stdout, so a failed write there (a full disk, a closed stream, a file size limit)
// is an error, never exit 0 with nothing written. Registered with atexit, so it runs on every normal
// exit, std::exit from a command included; _Exit keeps the other handlers from flushing again.
void check_stdout_at_exit() {
  std::cout.flush();
  const bool failed = std::cout.bad() || std::fflush(stdout) != 0 || std::ferror(stdout);
  if (!failed) return;
  // The failed write's errno is long overwritten by now. The reasons that matter last (a full disk,
  // a file size limit, a closed stream), so one more byte to the same descriptor fails with it again.
  errno = 0;
  const int err = ::write(STDOUT_FILENO, "\n", 1) < 0 ? errno : 0;
  std::fprintf(stderr, "kvbench: error: cannot write the results to standard output%s%s\n",
               err != 0 ? ": " : "", err != 0 ? std::strerror(err) : "");
  std::fflush(stderr);
  std::_Exit(kvb::kExitUserError);
}

}  // namespace

int main(int argc, char** argv) {
  reserve_standard_descriptors();
  std::atexit(check_stdout_at_exit);
  // Batch schedulers set a file size limit; past it the kernel sends SIGXFSZ, whose default action
  // kills the process with a core. Ignored, the write fails with EFBIG instead and takes the same
  // path as a full disk: one line naming the file, committed results kept.
  ::signal(SIGXFSZ, SIG_IGN);
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
