#pragma once
// A registry as `kvbench methods` and `kvbench protocols` list it: a JSON array of the entries, or one
// line each (name, summary, and the origin when not built in).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvb::cli {

struct RegistryListing {
  std::string name, summary, origin;
  nlohmann::json json;
};
void print_registry_listing(const std::vector<RegistryListing>& entries, bool json);

}  // namespace kvb::cli
