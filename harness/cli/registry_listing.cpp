#include "harness/cli/registry_listing.h"

#include <iostream>

namespace kvb::cli {

void print_registry_listing(const std::vector<RegistryListing>& entries, bool json) {
  if (json) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& e : entries) all.push_back(e.json);
    std::cout << all.dump(2) << "\n";
    return;
  }
  for (const auto& e : entries)
    std::cout << e.name << std::string(e.name.size() < 16 ? 16 - e.name.size() : 1, ' ') << e.summary
              << (e.origin == "builtin" ? "" : "  [" + e.origin + "]") << "\n";
}

}  // namespace kvb::cli
