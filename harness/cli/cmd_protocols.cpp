// kvbench protocols: the registered protocols (built-in and from plugins), or one protocol's
// parameters, like `kvbench methods`.

#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/cli/registry_listing.h"
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
    std::vector<RegistryListing> all;
    for (const auto& n : r.names())
      all.push_back({n, r.info(n).summary, r.info(n).origin, protocol_info_json(r.info(n))});
    print_registry_listing(all, args->json);
  });
}

}  // namespace kvb::cli
