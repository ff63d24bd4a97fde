// kvbench protocols: the registered protocols (built-in and from plugins), or one protocol's
// parameters, like `kvbench methods`.

#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/eval/protocol_registry.h"

namespace kvb::cli {

void register_protocols(CLI::App& app) {
  struct Args {
    std::string name;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub =
      app.add_subcommand("protocols", "list the protocols, or show one protocol's parameters");
  sub->add_option("name", args->name, "a protocol name: print its parameters, defaults and docs");
  sub->add_flag("--json", args->json, "JSON output");
  sub->callback([args] {
    const auto& r = ProtocolRegistry::instance();
    if (!args->name.empty()) {
      const ProtocolInfo& p = r.info(args->name);
      if (args->json) {
        std::cout << protocol_info_json(p).dump(2) << "\n";
        return;
      }
      std::cout << p.name << ": " << p.summary << "\norigin: " << p.origin << "\nparameters:\n";
      print_param_specs(p.params);
      return;
    }
    if (args->json) {
      nlohmann::json all = nlohmann::json::array();
      for (const auto& n : r.names()) all.push_back(protocol_info_json(r.info(n)));
      std::cout << all.dump(2) << "\n";
      return;
    }
    for (const auto& n : r.names()) {
      const auto& p = r.info(n);
      std::cout << n << std::string(n.size() < 16 ? 16 - n.size() : 1, ' ') << p.summary
                << (p.origin == "builtin" ? "" : "  [" + p.origin + "]") << "\n";
    }
  });
}

}  // namespace kvb::cli
