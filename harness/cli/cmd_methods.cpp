#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/cli/registry_listing.h"
#include "harness/kv/method_registry.h"

namespace kvb::cli {

void print_param_specs(const std::vector<ParamSpec>& params) {
  if (params.empty()) std::cout << "  (none)\n";
  for (const auto& p : params) {
    std::cout << "  " << p.name << " (" << param_type_name(p.type) << ", default " << p.default_value.dump();
    if (p.min || p.max)
      std::cout << ", range [" << (p.min ? nlohmann::json(*p.min).dump() : "-inf") << ", "
                << (p.max ? nlohmann::json(*p.max).dump() : "inf") << "]";
    if (!p.choices.empty()) std::cout << ", one of " << nlohmann::json(p.choices).dump();
    std::cout << ")\n      " << p.doc << "\n";
  }
}

void register_methods(CLI::App& app) {
  struct Args {
    std::string name;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("methods", "list the KV methods, or show one method's parameters");
  sub->add_option("name", args->name, "a method name: print its parameters, defaults and docs");
  sub->add_flag("--json", args->json, "JSON output");
  sub->callback([args] {
    const auto& r = MethodRegistry::instance();
    if (!args->name.empty()) {
      const MethodInfo& m = r.info(args->name);
      if (args->json) {
        std::cout << method_info_json(m).dump(2) << "\n";
        return;
      }
      std::cout << m.name << ": " << m.summary << "\n";
      if (!m.paper.empty()) std::cout << "paper: " << m.paper << "\n";
      std::cout << "origin: " << m.origin << "\nparameters:\n";
      print_param_specs(m.params);
      return;
    }
    std::vector<RegistryListing> all;
    for (const auto& n : r.names()) all.push_back({n, r.info(n).summary, r.info(n).origin, method_info_json(r.info(n))});
    print_registry_listing(all, args->json);
  });
}

}  // namespace kvb::cli
