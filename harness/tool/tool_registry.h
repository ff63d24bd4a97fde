#pragma once
// Tools: `kvbench` subcommands that belong to one method (a method's offline search, its adapter
// training). Each is defined in its method's folder and registered here at static-initialisation
// time, so that harness/cli, the layer above the methods, names no method: it asks this registry
// for the tools and adds one subcommand per tool. A plugin (--plugin lib.so) registers its tools the
// same way: kvbench loads the plugins named on the command line before it builds the subcommands
// (harness/cli/main.cpp), and the plugin's static initialisers run inside dlopen.
//
//   KVB_REGISTER_TOOL("kvtuner-search", "KVTuner offline search: ...", setup_kvtuner_search);
//
// where setup_kvtuner_search(CLI::App* sub) adds the subcommand's options and its callback. The
// callback reports a user's mistake with kvb::Error (exit 2), like every built-in subcommand.

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvb {

struct ToolInfo {
  std::string name;     // the subcommand: [a-z0-9-]+
  std::string summary;  // its one-line help
  std::function<void(CLI::App* sub)> setup;
  std::string origin;   // where it was registered from ("builtin", or "plugin:<path>")
};

class ToolRegistry {
 public:
  static ToolRegistry& instance();
  // Throws kvb::Error naming the tool on a malformed name, an empty summary or setup, or a name
  // already registered (a plugin's tool shadowing a built-in one is refused, not silently
  // ignored).
  void add(ToolInfo info);
  // Every tool, sorted by name (a stable help listing whatever the static-initialisation order).
  std::vector<const ToolInfo*> tools() const;
  // Adds one subcommand per tool to `app`, in tools() order.
  void add_subcommands(CLI::App& app) const;
  // Tags the tools not named in `before` with `origin` (after a plugin registered its tools).
  void set_origin_of_new(const std::vector<std::string>& before, const std::string& origin);
  std::vector<std::string> names() const;
  // Registrations run from static initialisers (KVB_REGISTER_TOOL), where nothing can catch an
  // exception: a failed one is kept here instead, and whoever loaded the code (main() for the
  // built-in tools, load_plugin for a plugin's) reports it. Returns and clears them.
  std::vector<std::string> take_registration_errors();
  void add_registration_error(std::string message);

 private:
  std::map<std::string, ToolInfo> tools_;
  std::vector<std::string> registration_errors_;
};

namespace detail {
struct ToolRegistrar {
  ToolRegistrar(const char* name, const char* summary, std::function<void(CLI::App*)> setup);
};
}  // namespace detail

}  // namespace kvb

#define KVB_TOOL_CONCAT_INNER(a, b) a##b
#define KVB_TOOL_CONCAT(a, b) KVB_TOOL_CONCAT_INNER(a, b)
// Registers a tool at static-initialisation time (one line at namespace scope in the tool's file).
#define KVB_REGISTER_TOOL(name, summary, setup_fn)                                       \
  static const ::kvb::detail::ToolRegistrar KVB_TOOL_CONCAT(kvb_tool_registrar_, __LINE__)( \
      name, summary, setup_fn)
